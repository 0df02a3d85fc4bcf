//! Which cloud is this? An explicit `[sources] cloud` wins; `auto` reads DMI
//! (`/sys/class/dmi/id/{sys_vendor,chassis_asset_tag,product_name,bios_vendor}` under
//! `host_root`), then probes each cloud's identity endpoint with a short timeout.

use std::path::Path;
use std::time::Duration;

use reqwest::Method;

use super::config::CloudChoice;
use super::http::Http;
use super::{aws, azure, gcp, oci, Cloud, SourcesConfig};

/// DMI strings that identify a cloud.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dmi {
    /// `sys_vendor`
    pub sys_vendor: String,
    /// `chassis_asset_tag`
    pub chassis_asset_tag: String,
    /// `product_name`
    pub product_name: String,
    /// `bios_vendor`
    pub bios_vendor: String,
}

/// Azure's fixed chassis asset tag.
pub const AZURE_ASSET_TAG: &str = "7783-7084-3265-9085-8269-3286-77";

impl Dmi {
    /// Reads the DMI files under `host_root` (missing files read as empty).
    pub fn read(host_root: &Path) -> Self {
        let read = |f: &str| {
            std::fs::read_to_string(host_root.join("sys/class/dmi/id").join(f))
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        Self {
            sys_vendor: read("sys_vendor"),
            chassis_asset_tag: read("chassis_asset_tag"),
            product_name: read("product_name"),
            bios_vendor: read("bios_vendor"),
        }
    }

    /// The cloud these strings identify, if any.
    pub fn cloud(&self) -> Option<Cloud> {
        if self.chassis_asset_tag == "OracleCloud.com" {
            Some(Cloud::Oci)
        } else if self.chassis_asset_tag == AZURE_ASSET_TAG {
            Some(Cloud::Azure)
        } else if self.sys_vendor == "Amazon EC2" || self.bios_vendor == "Amazon EC2" {
            Some(Cloud::Aws)
        } else if self.sys_vendor == "Google" || self.product_name == "Google Compute Engine" {
            Some(Cloud::Gcp)
        } else {
            None
        }
    }
}

/// The cloud to use: the explicit choice, nothing for `none`, or auto-detection.
pub async fn resolve(cfg: &SourcesConfig) -> Option<Cloud> {
    match cfg.cloud {
        CloudChoice::None => None,
        CloudChoice::Auto => {
            if let Some(c) = Dmi::read(&cfg.host_root).cloud() {
                tracing::info!(cloud = %c, "cloud detected from DMI");
                return Some(c);
            }
            let c = probe(&cfg.endpoint, cfg.detect_timeout).await;
            match c {
                Some(c) => {
                    tracing::info!(cloud = %c, "cloud detected by probing the metadata endpoint")
                }
                None => tracing::info!("no cloud metadata service found; metadata sources are off"),
            }
            c
        }
        explicit => explicit.cloud(),
    }
}

/// Probes every cloud's identity endpoint at `endpoint` concurrently; the first cloud (in
/// [`Cloud::ALL`] order) that answers 200 wins.
pub async fn probe(endpoint: &str, timeout: Duration) -> Option<Cloud> {
    let http = Http::new(endpoint, timeout).ok()?;
    let answers =
        futures::future::join_all(Cloud::ALL.into_iter().map(|c| probe_one(&http, c))).await;
    Cloud::ALL
        .into_iter()
        .zip(answers)
        .find_map(|(c, ok)| ok.then_some(c))
}

async fn probe_one(http: &Http, cloud: Cloud) -> bool {
    let req = match cloud {
        Cloud::Oci => http
            .request(Method::GET, "/opc/v2/instance/id")
            .header(oci::AUTH_HEADER.0, oci::AUTH_HEADER.1),
        Cloud::Aws => http
            .request(Method::PUT, aws::TOKEN_PATH)
            .header(aws::TTL_HEADER, "60"),
        Cloud::Azure => http
            .request(Method::GET, azure::COMPUTE_PATH)
            .header(azure::METADATA_HEADER.0, azure::METADATA_HEADER.1),
        Cloud::Gcp => http
            .request(Method::GET, &format!("{}instance/id", gcp::BASE))
            .header(gcp::FLAVOR_HEADER.0, gcp::FLAVOR_HEADER.1),
    };
    matches!(http.send(req, Duration::ZERO).await, Ok(r) if r.status == 200)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn dmi_from_files() {
        let dir = tempfile::tempdir().unwrap();
        let id = dir.path().join("sys/class/dmi/id");
        std::fs::create_dir_all(&id).unwrap();
        assert_eq!(Dmi::read(dir.path()).cloud(), None);
        std::fs::write(id.join("chassis_asset_tag"), "OracleCloud.com\n").unwrap();
        assert_eq!(Dmi::read(dir.path()).cloud(), Some(Cloud::Oci));
        std::fs::write(id.join("chassis_asset_tag"), format!("{AZURE_ASSET_TAG}\n")).unwrap();
        assert_eq!(Dmi::read(dir.path()).cloud(), Some(Cloud::Azure));
        std::fs::write(id.join("chassis_asset_tag"), "").unwrap();
        std::fs::write(id.join("sys_vendor"), "Amazon EC2\n").unwrap();
        assert_eq!(Dmi::read(dir.path()).cloud(), Some(Cloud::Aws));
        std::fs::write(id.join("sys_vendor"), "Google\n").unwrap();
        assert_eq!(Dmi::read(dir.path()).cloud(), Some(Cloud::Gcp));
    }
}

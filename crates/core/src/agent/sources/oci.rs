//! OCI Instance Metadata Service v2 (`/opc/v2/`, header `Authorization: Bearer Oracle`).
//!
//! Identity comes from `/opc/v2/instance/` and `metadata/oke-is-preemptible`. OCI documents no
//! IMDS endpoint for preemption or maintenance notices, so the poller is generic: it polls the
//! paths configured in `[[sources.oci.poll_paths]]` (none by default) and treats a non-empty
//! answer as a notice of the configured kind. The dependable OCI signals are the ACPI shutdown
//! (shutdown watcher) and OCI Events through the controller. `user_data` is never read into a
//! field, logged or reported.

use std::time::Duration;

use chrono::DateTime;
use futures::future::BoxFuture;
use reqwest::Method;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::config::OciPollPath;
use super::http::Http;
use super::{
    parse_json, parse_text, parse_time, Cloud, EventKind, EventSource, InstanceIdentity, Notice,
    NoticeTracker, ParseError, PollOutcome, SourceError, SourcesConfig,
};

/// The instance document.
pub const INSTANCE_PATH: &str = "/opc/v2/instance/";
/// `true` or `false` on KPO-launched nodes.
pub const PREEMPTIBLE_PATH: &str = "/opc/v2/instance/metadata/oke-is-preemptible";
/// Said once (log, `--once` report) when no signal paths are configured.
pub const NO_NOTICE_PATHS: &str = "OCI documents no IMDS preemption/maintenance endpoint and no \
    [[sources.oci.poll_paths]] are configured: OCI preemption is seen only by the shutdown watcher \
    (ACPI shutdown) and, later, OCI Events through the controller";
/// Header every v2 request must carry.
pub const AUTH_HEADER: (&str, &str) = ("Authorization", "Bearer Oracle");

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Instance {
    id: String,
    #[serde(default)]
    display_name: Option<String>,
    #[serde(default)]
    availability_domain: Option<String>,
    #[serde(default)]
    fault_domain: Option<String>,
    #[serde(default)]
    compartment_id: Option<String>,
    #[serde(default)]
    region: Option<String>,
    #[serde(default)]
    canonical_region_name: Option<String>,
    #[serde(default)]
    shape: Option<String>,
    #[serde(default)]
    time_created: Option<i64>,
    /// Only `oke-is-preemptible` is kept; every other key (notably `user_data`) is skipped.
    #[serde(default)]
    metadata: Option<OkeMetadata>,
}

#[derive(Deserialize)]
struct OkeMetadata {
    #[serde(default, rename = "oke-is-preemptible")]
    oke_is_preemptible: Option<String>,
}

fn preemptible_flag(v: &str) -> Result<bool, ParseError> {
    match v.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(ParseError::value("oci oke-is-preemptible", other)),
    }
}

/// Parses `/opc/v2/instance/`. The zone is the availability domain without its tenancy prefix
/// (`qIZq:PHX-AD-1` → `PHX-AD-1`); `timeCreated` is epoch milliseconds.
pub fn parse_identity(body: &[u8]) -> Result<InstanceIdentity, ParseError> {
    let i: Instance = parse_json("oci instance", body)?;
    if i.id.is_empty() {
        return Err(ParseError::value("oci instance id", ""));
    }
    let preemptible = match i.metadata.and_then(|m| m.oke_is_preemptible) {
        Some(v) => Some(preemptible_flag(&v)?),
        None => None,
    };
    Ok(InstanceIdentity {
        cloud: Some(Cloud::Oci),
        instance_id: i.id,
        name: i.display_name,
        region: i.canonical_region_name.or(i.region),
        zone: i
            .availability_domain
            .map(|ad| ad.rsplit(':').next().unwrap_or_default().to_string()),
        fault_domain: i.fault_domain,
        instance_type: i.shape,
        preemptible,
        compartment: i.compartment_id,
        created_at: i.time_created.and_then(DateTime::from_timestamp_millis),
    })
}

/// Parses the answer of a configured signal path. Empty, `false`, `none`, `null`, `{}` and
/// `[]` mean no notice; anything else is one notice of `kind`, identified by its content. A
/// JSON object's scalar fields become details; a `time`, `timeWindowStart` or `notBefore` field
/// becomes `not_before`.
pub fn parse_signal(body: &[u8], kind: &EventKind) -> Result<Vec<Notice>, ParseError> {
    const WHAT: &str = "oci signal";
    let text = parse_text(WHAT, body)?;
    if matches!(
        text.to_ascii_lowercase().as_str(),
        "" | "false" | "none" | "null" | "{}" | "[]"
    ) {
        return Ok(Vec::new());
    }
    let key = hex::encode(&Sha256::digest(text.as_bytes())[..12]);
    let mut n = Notice::new(key, kind.clone());
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(map)) => {
            for (k, v) in map.iter().take(12) {
                let v = match v {
                    serde_json::Value::String(s) => s.clone(),
                    serde_json::Value::Number(x) => x.to_string(),
                    serde_json::Value::Bool(b) => b.to_string(),
                    _ => continue,
                };
                if matches!(k.as_str(), "time" | "timeWindowStart" | "notBefore") {
                    n.not_before = Some(parse_time(WHAT, &v)?);
                }
                n.detail
                    .insert(crate::text::truncate(k, 40), crate::text::truncate(&v, 120));
            }
        }
        Ok(_) | Err(_) => {
            n.detail
                .insert("value".to_string(), crate::text::truncate(text, 120));
        }
    }
    Ok(vec![n])
}

/// The OCI IMDS v2 source.
#[derive(Debug)]
pub struct OciSource {
    http: Http,
    paths: Vec<OciPollPath>,
    tracker: NoticeTracker,
    told_no_paths: bool,
}

impl OciSource {
    /// A source reading `cfg.endpoint`.
    pub fn new(cfg: &SourcesConfig) -> Result<Self, SourceError> {
        Ok(Self {
            http: Http::new(&cfg.endpoint, cfg.request_timeout)?,
            paths: cfg.oci.poll_paths.clone(),
            tracker: NoticeTracker::new(Some(Cloud::Oci)),
            told_no_paths: false,
        })
    }

    async fn get(&self, path: &str) -> Result<super::http::Response, SourceError> {
        let req = self
            .http
            .request(Method::GET, path)
            .header(AUTH_HEADER.0, AUTH_HEADER.1);
        self.http.send(req, Duration::ZERO).await
    }

    async fn poll_paths(&mut self) -> PollOutcome {
        if self.paths.is_empty() && !self.told_no_paths {
            self.told_no_paths = true;
            tracing::info!("{NO_NOTICE_PATHS}");
        }
        let mut out = PollOutcome::default();
        for p in self.paths.clone() {
            let kind = EventKind::from(p.kind);
            let channel = format!("oci{}", p.path);
            let notices = self
                .get(&p.path)
                .await
                .and_then(|resp| resp.notices(|b| parse_signal(b, &kind)));
            self.tracker.record(&mut out, &channel, notices);
        }
        out
    }

    async fn read_identity(&mut self) -> Result<InstanceIdentity, SourceError> {
        let resp = self.get(INSTANCE_PATH).await?.require_ok()?;
        let mut id = parse_identity(&resp.body).map_err(|e| resp.parse_error(e))?;
        if id.preemptible.is_none() {
            let p = self.get(PREEMPTIBLE_PATH).await?;
            match p.status {
                200 => {
                    let text = parse_text("oci oke-is-preemptible", &p.body)
                        .map_err(|e| p.parse_error(e))?;
                    id.preemptible = Some(preemptible_flag(text).map_err(|e| p.parse_error(e))?);
                }
                404 => {}
                _ => return Err(p.unexpected()),
            }
        }
        Ok(id)
    }
}

impl EventSource for OciSource {
    fn name(&self) -> &'static str {
        "oci"
    }
    fn cloud(&self) -> Cloud {
        Cloud::Oci
    }
    fn poll(&mut self) -> BoxFuture<'_, PollOutcome> {
        Box::pin(self.poll_paths())
    }
    fn identity(&mut self) -> BoxFuture<'_, Result<InstanceIdentity, SourceError>> {
        Box::pin(self.read_identity())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const SAMPLE: &[u8] = br#"{
      "availabilityDomain": "qIZq:PHX-AD-1", "faultDomain": "FAULT-DOMAIN-2",
      "compartmentId": "ocid1.tenancy.oc1..aaaa", "displayName": "instance-20200320-1400",
      "id": "ocid1.instance.oc1.phx.anyhq", "image": "ocid1.image.oc1.phx.aaaa",
      "metadata": { "ssh_authorized_keys": "ssh-rsa AAA", "user_data": "IyEvYmlu", "oke-is-preemptible": "true" },
      "region": "phx", "canonicalRegionName": "us-phoenix-1", "shape": "VM.Standard2.1",
      "state": "Running", "timeCreated": 1584727285318,
      "agentConfig": { "monitoringDisabled": true }
    }"#;

    #[test]
    fn identity_sample() {
        let id = parse_identity(SAMPLE).unwrap();
        assert_eq!(id.zone.as_deref(), Some("PHX-AD-1"));
        assert_eq!(id.region.as_deref(), Some("us-phoenix-1"));
        assert_eq!(id.preemptible, Some(true));
        assert_eq!(id.created_at.unwrap().timestamp_millis(), 1584727285318);
        let json = serde_json::to_string(&id).unwrap();
        assert!(!json.contains("IyEvYmlu"), "user_data leaked: {json}");
    }

    #[test]
    fn signals() {
        assert!(parse_signal(b"  ", &EventKind::Preemption)
            .unwrap()
            .is_empty());
        assert!(parse_signal(b"{}", &EventKind::Preemption)
            .unwrap()
            .is_empty());
        let n = parse_signal(
            br#"{"action":"TERMINATE","time":"2026-01-01T00:02:00Z"}"#,
            &EventKind::Preemption,
        )
        .unwrap();
        assert_eq!(n.len(), 1);
        assert_eq!(n[0].detail["action"], "TERMINATE");
        assert!(n[0].not_before.is_some());
        assert!(parse_signal(br#"{"time":"soon"}"#, &EventKind::Preemption).is_err());
    }
}

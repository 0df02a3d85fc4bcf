//! `[sources]`: which cloud's metadata service to read, where, and how often.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Cloud, EventKind};
use crate::cfg_path;
use crate::config::Diagnostic;

/// `[sources]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SourcesConfig {
    /// `auto` (detect), `none` (no metadata source) or a cloud: `oci`, `aws`, `azure`, `gcp`.
    pub cloud: CloudChoice,
    /// Base URL of the metadata service (override for tests and emulators).
    pub endpoint: String,
    /// Pause between polls of polling sources (AWS, Azure, OCI).
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// Timeout of one request (long polls add their own wait to this).
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Timeout of each probe during cloud auto-detection.
    #[serde(with = "humantime_serde")]
    pub detect_timeout: Duration,
    /// Longest pause after repeated failures (backoff doubles from `poll_interval`, jittered).
    #[serde(with = "humantime_serde")]
    pub max_backoff: Duration,
    /// Root of the host filesystem for DMI reads (`/sys/class/dmi/id/...`), e.g. `/host`.
    pub host_root: PathBuf,
    /// OCI options.
    pub oci: OciConfig,
    /// AWS options.
    pub aws: AwsConfig,
    /// Azure options.
    pub azure: AzureConfig,
    /// GCP options.
    pub gcp: GcpConfig,
}

impl Default for SourcesConfig {
    fn default() -> Self {
        Self {
            cloud: CloudChoice::Auto,
            endpoint: "http://169.254.169.254".to_string(),
            poll_interval: Duration::from_secs(1),
            request_timeout: Duration::from_secs(2),
            detect_timeout: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            host_root: PathBuf::from("/"),
            oci: OciConfig::default(),
            aws: AwsConfig::default(),
            azure: AzureConfig::default(),
            gcp: GcpConfig::default(),
        }
    }
}

/// `[sources] cloud`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CloudChoice {
    /// Detect from DMI, then by probing each metadata service.
    Auto,
    /// Do not read any metadata service.
    None,
    /// OCI.
    Oci,
    /// AWS.
    Aws,
    /// Azure.
    Azure,
    /// GCP.
    Gcp,
}

impl CloudChoice {
    /// The explicit cloud, if one is configured.
    pub fn cloud(self) -> Option<Cloud> {
        match self {
            CloudChoice::Oci => Some(Cloud::Oci),
            CloudChoice::Aws => Some(Cloud::Aws),
            CloudChoice::Azure => Some(Cloud::Azure),
            CloudChoice::Gcp => Some(Cloud::Gcp),
            CloudChoice::Auto | CloudChoice::None => None,
        }
    }
}

/// `[sources.oci]`
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OciConfig {
    /// Paths polled for preemption/maintenance signals. OCI documents no such IMDS endpoint, so
    /// the default is empty: OCI preemption reaches the node as an ACPI shutdown (shutdown
    /// watcher) or through OCI Events via the controller.
    pub poll_paths: Vec<OciPollPath>,
}

/// `[[sources.oci.poll_paths]]`: a path whose non-empty answer is a notice.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OciPollPath {
    /// Path under the endpoint, starting with `/opc/v2/`.
    pub path: String,
    /// What a notice at this path announces: `preemption`, `termination`, `maintenance`, ...
    pub kind: NoticeKind,
}

/// The kinds a configured path may announce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NoticeKind {
    /// See [`EventKind::Preemption`].
    Preemption,
    /// See [`EventKind::Termination`].
    Termination,
    /// See [`EventKind::Maintenance`].
    Maintenance,
    /// See [`EventKind::Reboot`].
    Reboot,
}

impl From<NoticeKind> for EventKind {
    fn from(k: NoticeKind) -> Self {
        match k {
            NoticeKind::Preemption => EventKind::Preemption,
            NoticeKind::Termination => EventKind::Termination,
            NoticeKind::Maintenance => EventKind::Maintenance,
            NoticeKind::Reboot => EventKind::Reboot,
        }
    }
}

/// `[sources.aws]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AwsConfig {
    /// IMDSv2 session-token lifetime (1 s ..= 6 h); refreshed before it expires and on 401.
    #[serde(with = "humantime_serde")]
    pub token_ttl: Duration,
    /// How often the Spot interruption notice (`spot/instance-action`) is read; the rebalance
    /// recommendation and scheduled events are read at `[sources] poll_interval`. The notice is
    /// the one with a 2-minute deadline, and reading it is one small GET on a kept connection.
    #[serde(with = "humantime_serde")]
    pub spot_poll_interval: Duration,
}

impl Default for AwsConfig {
    fn default() -> Self {
        Self {
            token_ttl: Duration::from_secs(21600),
            spot_poll_interval: Duration::from_millis(100),
        }
    }
}

/// `[sources.azure]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AzureConfig {
    /// Scheduled Events API version.
    pub api_version: String,
    /// Only events whose `Resources` name this VM are reported; empty: the VM name from the
    /// instance metadata (an event with no resources listed applies to all).
    pub vm_name: String,
}

impl Default for AzureConfig {
    fn default() -> Self {
        Self {
            api_version: "2020-07-01".to_string(),
            vm_name: String::new(),
        }
    }
}

/// `[sources.gcp]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct GcpConfig {
    /// `timeout_sec` of each `wait_for_change` long poll.
    #[serde(with = "humantime_serde")]
    pub long_poll_timeout: Duration,
}

impl Default for GcpConfig {
    fn default() -> Self {
        Self {
            long_poll_timeout: Duration::from_secs(60),
        }
    }
}

/// The shortest `[sources.aws] spot_poll_interval` accepted.
pub const AWS_MIN_SPOT_POLL: Duration = Duration::from_millis(50);

/// The largest IMDSv2 token TTL AWS accepts.
pub const AWS_MAX_TOKEN_TTL: Duration = Duration::from_secs(21600);

impl SourcesConfig {
    /// Semantic checks of `[sources]`.
    pub fn validate(&self) -> Vec<Diagnostic> {
        let mut out = Vec::new();
        if !self.endpoint.starts_with("http://") {
            out.push(Diagnostic::error(
                cfg_path!["sources", "endpoint"],
                format!(
                    "`{}` must be a plain http:// URL, e.g. http://169.254.169.254 (metadata services are plain HTTP)",
                    self.endpoint
                ),
            ));
        } else if reqwest::Url::parse(&self.endpoint).is_err() {
            out.push(Diagnostic::error(
                cfg_path!["sources", "endpoint"],
                format!("`{}` is not a valid URL", self.endpoint),
            ));
        }
        for (key, d) in [
            ("poll_interval", self.poll_interval),
            ("request_timeout", self.request_timeout),
            ("detect_timeout", self.detect_timeout),
            ("max_backoff", self.max_backoff),
        ] {
            if d.is_zero() {
                out.push(Diagnostic::error(
                    cfg_path!["sources", key],
                    "must be greater than zero",
                ));
            }
        }
        if self.max_backoff < self.poll_interval {
            out.push(Diagnostic::warning(
                cfg_path!["sources", "max_backoff"],
                "is shorter than `poll_interval`; failures are retried at `poll_interval`",
            ));
        }
        if !self.host_root.is_absolute() {
            out.push(Diagnostic::error(
                cfg_path!["sources", "host_root"],
                "must be an absolute path",
            ));
        }
        let ttl = self.aws.token_ttl;
        if ttl < Duration::from_secs(1) || ttl > AWS_MAX_TOKEN_TTL || ttl.subsec_nanos() != 0 {
            out.push(Diagnostic::error(
                cfg_path!["sources", "aws", "token_ttl"],
                "must be whole seconds between 1s and 6h (AWS accepts 1..=21600)",
            ));
        }
        let spot = self.aws.spot_poll_interval;
        if spot < AWS_MIN_SPOT_POLL {
            out.push(Diagnostic::error(
                cfg_path!["sources", "aws", "spot_poll_interval"],
                "must be at least 50ms (IMDS is throttled per instance; more than 20 reads a second buys nothing on a 2-minute notice)",
            ));
        } else if spot > self.poll_interval {
            out.push(Diagnostic::warning(
                cfg_path!["sources", "aws", "spot_poll_interval"],
                "is longer than `poll_interval`; the Spot notice is read at `poll_interval`",
            ));
        }
        if self.azure.api_version.trim().is_empty() {
            out.push(Diagnostic::error(
                cfg_path!["sources", "azure", "api_version"],
                "must not be empty",
            ));
        }
        let lp = self.gcp.long_poll_timeout;
        if lp < Duration::from_secs(1) || lp > Duration::from_secs(3600) {
            out.push(Diagnostic::error(
                cfg_path!["sources", "gcp", "long_poll_timeout"],
                "must be between 1s and 1h",
            ));
        }
        for (i, p) in self.oci.poll_paths.iter().enumerate() {
            if !p.path.starts_with("/opc/v2/") || p.path.contains("..") || p.path.contains('?') {
                out.push(Diagnostic::error(
                    cfg_path!["sources", "oci", "poll_paths", i, "path"],
                    format!("`{}` must be a plain path under /opc/v2/ (IMDS v1 is disabled on current images)", p.path),
                ));
            }
            if p.path.contains("user_data") {
                out.push(Diagnostic::error(
                    cfg_path!["sources", "oci", "poll_paths", i, "path"],
                    "must not read user_data (it holds the bootstrap script and is never read or logged)",
                ));
            }
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        let d = SourcesConfig::default().validate();
        assert!(d.is_empty(), "{d:?}");
    }

    #[test]
    fn bad_values_are_errors_with_paths() {
        let cfg: SourcesConfig = toml::from_str(
            "endpoint = \"169.254.169.254\"\npoll_interval = \"0s\"\n[aws]\ntoken_ttl = \"7h\"\nspot_poll_interval = \"10ms\"\n[[oci.poll_paths]]\npath = \"/opc/v1/x\"\nkind = \"preemption\"\n",
        )
        .unwrap();
        let d = cfg.validate();
        let paths: Vec<String> = d
            .iter()
            .map(|d| crate::config::display_path(&d.path))
            .collect();
        assert!(paths.contains(&"sources.endpoint".to_string()), "{paths:?}");
        assert!(
            paths.contains(&"sources.poll_interval".to_string()),
            "{paths:?}"
        );
        assert!(
            paths.contains(&"sources.aws.token_ttl".to_string()),
            "{paths:?}"
        );
        assert!(
            paths.contains(&"sources.aws.spot_poll_interval".to_string()),
            "{paths:?}"
        );
        assert!(
            paths.contains(&"sources.oci.poll_paths[0].path".to_string()),
            "{paths:?}"
        );
    }

    #[test]
    fn a_spot_poll_slower_than_the_poll_interval_is_a_warning() {
        let cfg: SourcesConfig =
            toml::from_str("poll_interval = \"1s\"\n[aws]\nspot_poll_interval = \"2s\"\n").unwrap();
        let d = cfg.validate();
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(
            crate::config::display_path(&d[0].path),
            "sources.aws.spot_poll_interval"
        );
        assert_eq!(d[0].severity, crate::config::Severity::Warning, "{d:?}");
    }

    #[test]
    fn unknown_keys_are_refused() {
        assert!(toml::from_str::<SourcesConfig>("bogus = 1").is_err());
        assert!(toml::from_str::<SourcesConfig>("[gcp]\nbogus = 1").is_err());
    }
}

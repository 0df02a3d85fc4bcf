//! `[report]`: the reporter's configuration and its semantic checks.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cfg_path;
use crate::config::Diagnostic;

/// `[report]`: where and how the agent reports.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ReporterConfig {
    /// Controller base URL, e.g. `https://nodekeeper-controller.nodekeeper.svc:8443`.
    pub url: String,
    /// PEM CA certificate(s) the controller's certificate must chain to (required for https).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// The name the controller's certificate must carry (default: the host of `url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    /// The projected service-account token (audience `nodekeeper`).
    pub token_file: PathBuf,
    /// Report at least this often.
    #[serde(with = "humantime_serde")]
    pub heartbeat: Duration,
    /// Timeout of one request.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Close the connection to the controller after this long without a report. The default
    /// (1 s) is below the controller's `idle_timeout` (3 s) and the heartbeat, so no connection
    /// is held between heartbeats; longer than the heartbeat (with `[controller] http2`) keeps one
    /// open all the time, ~28 KiB of the controller's memory per node (docs/controller.md).
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Longest wait between retries while the controller is unreachable.
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
    /// Unacknowledged events kept (and persisted) at most; also applied to the queue loaded from
    /// the state directory (the oldest dropped first, with an error log and a report problem).
    pub max_queued_events: usize,
    /// Largest report body sent, in bytes: the controller's `[controller] max_report_bytes`
    /// (same default). A report carries at most 64 events, oldest first, and fewer when they
    /// would not fit, so a backlog always drains.
    pub max_report_bytes: usize,
}

/// The least `[report] max_report_bytes`: room for a report's fixed fields and conditions.
pub const MIN_REPORT_BYTES: usize = 16 * 1024;

impl Default for ReporterConfig {
    fn default() -> Self {
        ReporterConfig {
            url: "https://nodekeeper-controller.nodekeeper.svc:8443".into(),
            ca_file: Some("/var/run/secrets/nodekeeper/ca.crt".into()),
            server_name: None,
            token_file: "/var/run/secrets/nodekeeper/token".into(),
            heartbeat: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(1),
            backoff_max: Duration::from_secs(30),
            max_queued_events: 1000,
            max_report_bytes: 1 << 20,
        }
    }
}

impl ReporterConfig {
    /// `<url>/v1/reports`: where reports are POSTed.
    pub fn endpoint(&self) -> String {
        format!("{}/v1/reports", self.url.trim_end_matches('/'))
    }

    /// Semantic checks.
    pub fn validate(&self) -> Vec<Diagnostic> {
        let mut d = Vec::new();
        match reqwest::Url::parse(&self.url) {
            Ok(u) if u.scheme() == "https" && self.ca_file.is_none() => d.push(Diagnostic::error(
                cfg_path!["report", "ca_file"],
                "required for an https:// controller URL (the controller's CA is pinned)",
            )),
            Ok(u) if u.scheme() == "https" || u.scheme() == "http" => {}
            _ => d.push(Diagnostic::error(
                cfg_path!["report", "url"],
                format!("`{}` must be an https:// (or http://) URL", self.url),
            )),
        }
        for (k, v) in [
            ("heartbeat", self.heartbeat),
            ("timeout", self.timeout),
            ("idle_timeout", self.idle_timeout),
            ("backoff_max", self.backoff_max),
        ] {
            if v.is_zero() {
                d.push(Diagnostic::error(
                    cfg_path!["report", k],
                    "must be greater than zero",
                ));
            }
        }
        if self.max_report_bytes < MIN_REPORT_BYTES {
            d.push(Diagnostic::error(
                cfg_path!["report", "max_report_bytes"],
                format!("must be at least {MIN_REPORT_BYTES} (a report without events)"),
            ));
        }
        if self.max_queued_events == 0 {
            d.push(Diagnostic::error(
                cfg_path!["report", "max_queued_events"],
                "must be greater than zero",
            ));
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_requires_a_ca_for_https() {
        let c = ReporterConfig {
            ca_file: None,
            ..Default::default()
        };
        assert_eq!(c.validate().len(), 1);
        assert!(ReporterConfig::default().validate().is_empty());
    }
}

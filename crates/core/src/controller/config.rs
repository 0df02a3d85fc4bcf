//! `[controller]`: the controller's configuration (listen address, TLS, who may report, the
//! node-state layer, leader election, OCI Events ingestion), and the controller's part of the
//! configuration file ([`ControllerSections`]: `[controller]` with the policy's sections).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cfg_path;
use crate::config::Diagnostic;

pub use crate::config::Secret;
use crate::controller::policy::config::{
    BudgetsConfig, ControllerPolicyConfig, InterruptionConfig, RepairConfig,
};
use crate::controller::policy::PolicyConfig;

/// The sections the controller reads: `[controller]` (absent on nodes) and the policy's
/// `[repair]`, `[budgets]` and `[interruption]`. The file that composes them with the agent's
/// sections is `crate::config_file::Config`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ControllerSections {
    /// The controller (`nodekeeper controller`); absent on nodes.
    pub controller: Option<ControllerConfig>,
    /// Repair policies, escalation, short-circuit, startup timeout.
    pub repair: RepairConfig,
    /// Disruption budgets per node group.
    pub budgets: BudgetsConfig,
    /// Response to interruption notices.
    pub interruption: InterruptionConfig,
}

impl ControllerSections {
    /// Every check of the controller's sections.
    pub fn validate(&self) -> Vec<Diagnostic> {
        let mut diags: Vec<Diagnostic> =
            self.controller.iter().flat_map(|c| c.validate()).collect();
        diags.extend(self.policy().validate());
        diags
    }

    /// The policy: `[repair]`, `[budgets]`, `[interruption]` and `[controller] dry_run`.
    pub fn policy(&self) -> PolicyConfig {
        PolicyConfig::from_sections(
            &self.repair,
            &self.budgets,
            &self.interruption,
            &ControllerPolicyConfig {
                dry_run: self.controller.as_ref().is_some_and(|c| c.dry_run),
                provider_adds_capacity: self.controller.as_ref().is_some_and(|c| {
                    matches!(
                        c.provider,
                        crate::controller::act::provider::ProviderConfig::Karpenter
                    )
                }),
            },
        )
    }
}

/// `[controller]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ControllerConfig {
    /// Address the report API listens on.
    pub listen: String,
    /// PEM certificate chain for HTTPS (e.g. from a Secret or cert-manager).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key for HTTPS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key_file: Option<PathBuf>,
    /// Serve plain HTTP (only when set explicitly; tests and local demos).
    pub insecure_plain_http: bool,
    /// Decide as usual, but only log decisions and write Events/status: never cordon, evict,
    /// reboot or replace.
    pub dry_run: bool,
    /// How replacement nodes are requested (`[controller.provider]`, default `none`).
    pub provider: crate::controller::act::provider::ProviderConfig,
    /// Webhook notifications on the start, finish and failure of actions (`[[controller.notify]]`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notify: Vec<crate::controller::act::notify::NotifyConfig>,
    /// The only identity allowed to report: `system:serviceaccount:<ns>:<name>`.
    pub service_account: String,
    /// The audience the agents' projected tokens must carry.
    pub audience: String,
    /// Maximum number of cached TokenReview results.
    pub token_cache_size: usize,
    /// Upper bound on how long a TokenReview result is cached (shorter when the token expires sooner).
    #[serde(with = "humantime_serde")]
    pub token_cache_ttl: Duration,
    /// Largest accepted report body in bytes (larger: 413).
    pub max_report_bytes: usize,
    /// Open connections at most on the report API; further ones are closed right after `accept`.
    /// Agents close their connection between reports (HTTP/1.1, `idle_timeout`); with `http2` each
    /// keeps one open, and this must then exceed the number of nodes one replica may serve (all
    /// of them, when the other replica is down).
    pub max_connections: usize,
    /// Reports handled at once at most (token review, Node write, acknowledgement); a report past
    /// it is answered 503 with `Retry-After` at once, before its token is reviewed, and the agent
    /// retries after that (with jitter). Bounds the memory and the TokenReviews in flight when
    /// thousands of agents start together (docs/controller.md "Reports in flight"). Reports
    /// carrying notices have a second allowance of the same size past it.
    pub max_reports_in_flight: usize,
    /// A report-API connection without a request for this long is closed (HTTP/1.1; also the
    /// time a new connection has to send its first request head). Shorter than the agents'
    /// heartbeat, so agents do not hold a connection between reports: they reconnect, resuming
    /// their TLS session (docs/controller.md "Benchmark").
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Offer HTTP/2 on the report API (off: HTTP/1.1 only). With it, every agent holds one
    /// connection (pinged every 10 s): ~28 KiB of the controller's memory per node.
    pub http2: bool,
    /// Namespace of the leader-election Lease. (Events about Nodes are recorded in `default`,
    /// [`crate::controller::cluster::events::NODE_EVENT_NAMESPACE`]: the apiserver refuses them elsewhere.)
    pub namespace: String,
    /// Condition types starting with this prefix are owned by nodekeeper (written, restored, removed).
    pub condition_prefix: String,
    /// An agent silent longer than this gets its conditions set to `Unknown`.
    #[serde(with = "humantime_serde")]
    pub staleness: Duration,
    /// Rewrite unchanged conditions (to refresh `lastHeartbeatTime`) at most this often.
    #[serde(with = "humantime_serde")]
    pub heartbeat_write_interval: Duration,
    /// Labels agents may ask to remove from their own node (exact keys).
    pub label_removal_allow: Vec<String>,
    /// Let outbound requests reach loopback addresses (tests and local stand-ins only; off:
    /// refused): notification targets, the webhook provider, the OCI API endpoint, and the OCI
    /// subscription confirmation (then over `http://` too). Metadata, link-local and
    /// unspecified addresses are refused regardless.
    pub allow_loopback_destinations: bool,
    /// What one node's reports may ask (`[controller.report_limits]`).
    pub report_limits: crate::controller::state::limits::ReportLimits,
    /// Leader election.
    pub leader: LeaderConfig,
    /// OCI Events (Notifications HTTPS subscription) ingestion.
    pub oci_events: OciEventsConfig,
    /// The disruption engine (reconcile loop and actor).
    pub engine: EngineConfig,
    /// Each node's action history (`[controller.history]`).
    pub history: crate::controller::act::history::HistoryConfig,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            listen: "0.0.0.0:8443".into(),
            tls_cert_file: None,
            tls_key_file: None,
            insecure_plain_http: false,
            dry_run: false,
            provider: Default::default(),
            notify: Vec::new(),
            service_account: "system:serviceaccount:nodekeeper:nodekeeper-agent".into(),
            audience: "nodekeeper".into(),
            token_cache_size: 20_000,
            token_cache_ttl: Duration::from_secs(300),
            max_report_bytes: 1 << 20,
            max_connections: crate::serve::DEFAULT_MAX_CONNECTIONS,
            max_reports_in_flight: crate::controller::api::server::DEFAULT_MAX_REPORTS_IN_FLIGHT,
            idle_timeout: crate::serve::DEFAULT_IDLE_TIMEOUT,
            http2: false,
            namespace: "nodekeeper".into(),
            condition_prefix: crate::wire::OWNED_PREFIX.into(),
            staleness: Duration::from_secs(60),
            // Twice the kubelet's nodeStatusReportFrequency and NPD's heartbeat: the refresh only
            // ages `lastHeartbeatTime`. A silent agent turns `Unknown` after `staleness` (a write at
            // once) and a dead controller shows in its Lease, so readers lose nothing, and one write
            // per node every 10 min keeps nodekeeper's requests per node-hour below NPD's
            // (docs/comparison.md).
            heartbeat_write_interval: Duration::from_secs(600),
            label_removal_allow: Vec::new(),
            allow_loopback_destinations: false,
            report_limits: Default::default(),
            leader: LeaderConfig::default(),
            oci_events: OciEventsConfig::default(),
            engine: EngineConfig::default(),
            history: Default::default(),
        }
    }
}

/// What a drain does when its deadline passes with pods left (`[controller.engine] on_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DrainOnTimeout {
    /// Stop and report the blocker (the policy then escalates or holds).
    #[default]
    Fail,
    /// Delete the remaining pods, bypassing PDBs (grace clamped to the time left).
    ForceDelete,
}

impl DrainOnTimeout {
    /// The drain engine's setting.
    pub fn to_drain(self) -> crate::controller::act::drain::OnTimeout {
        match self {
            DrainOnTimeout::Fail => crate::controller::act::drain::OnTimeout::Fail,
            DrainOnTimeout::ForceDelete => crate::controller::act::drain::OnTimeout::ForceDelete,
        }
    }
}

/// `[controller.engine]`: the reconcile loop that runs the policy and executes its decisions
/// (only on the leader).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// Run the engine (off: the controller only records reports and notices).
    pub enabled: bool,
    /// Periodic reconcile even without changes (toleration expiries, windows opening).
    #[serde(with = "humantime_serde")]
    pub tick: Duration,
    /// A node or notice change triggers a reconcile after this quiet time (changes in between
    /// are coalesced).
    #[serde(with = "humantime_serde")]
    pub debounce: Duration,
    /// Nodes whose actions are executed at once (the Karpenter fence's writes: at most
    /// [`crate::controller::engine::fence_gate::FENCE_WRITES`], whatever this is).
    pub node_concurrency: usize,
    /// Evictions in flight per drained node.
    pub drain_concurrency: usize,
    /// Drains running at once (more wait for a slot, shown as running).
    pub max_parallel_drains: usize,
    /// At the drain deadline: `fail` or `force-delete`.
    pub on_timeout: DrainOnTimeout,
    /// After the pods, wait until no VolumeAttachment names the node.
    pub wait_volume_detach: bool,
    /// Run the notices' intake and the fast path after a notice, and write the node's cordon, on a
    /// thread and client of their own (`controller::engine::notice_thread`), not on the runtime that handles
    /// reports. On by default: at 5,000 nodes on the real control plane its runs ranked ahead of
    /// the shared runtime's (bench/results/2026-12-05-notice-apart.md).
    pub notice_lane: bool,
    /// Set Kubernetes 1.37's node lifecycle conditions (KEP-5683): `DrainInProgress` and
    /// `Drained` around each drain, `MaintenancePlanned`, `MaintenanceInProgress` and
    /// `GracefulNodeShutdownInProgress` from the node's notices (docs/drain.md).
    pub lifecycle_conditions: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            enabled: true,
            tick: Duration::from_secs(1),
            debounce: Duration::from_millis(20),
            node_concurrency: 16,
            drain_concurrency: 16,
            max_parallel_drains: 64,
            on_timeout: DrainOnTimeout::Fail,
            wait_volume_detach: true,
            notice_lane: true,
            lifecycle_conditions: true,
        }
    }
}

/// `[controller.leader]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LeaderConfig {
    /// Name of the coordination.k8s.io Lease.
    pub lease_name: String,
    /// This replica's identity (default: the host name plus a random suffix).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// How long a lease is valid without renewal: how long a crashed leader's replacement waits.
    #[serde(with = "humantime_serde")]
    pub lease_duration: Duration,
    /// How soon the holder retries a failed renewal, and a follower that cannot watch the
    /// Lease reads it again.
    #[serde(with = "humantime_serde")]
    pub retry_period: Duration,
    /// How often the holder renews while its renewals succeed (default:
    /// `lease_duration - 4 × retry_period`, at least `retry_period`: three retries fit
    /// before it steps down at `lease_duration - retry_period`).
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub renew_interval: Option<Duration>,
    /// Label this replica's own pod `nodekeeper.io/leader=true|false` with its leadership, for a
    /// Service that routes OCI Events deliveries to the leader only (the shipped manifests set it).
    pub pod_label: bool,
    /// The pod to label (default: the host name, which is the pod's name in Kubernetes), in
    /// `[controller] namespace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
}

impl Default for LeaderConfig {
    fn default() -> Self {
        LeaderConfig {
            lease_name: "nodekeeper-controller".into(),
            identity: None,
            lease_duration: Duration::from_secs(20),
            retry_period: Duration::from_secs(2),
            renew_interval: None,
            pod_label: false,
            pod_name: None,
        }
    }
}

impl LeaderConfig {
    /// How often the holder renews: `renew_interval`, or `lease_duration - 4 × retry_period`
    /// (at least `retry_period`). 12 s by default: 300 Lease writes an hour instead of the
    /// 1,800 of a renewal every `retry_period`.
    pub fn renew_interval(&self) -> Duration {
        self.renew_interval.unwrap_or_else(|| {
            self.lease_duration
                .saturating_sub(self.retry_period * 4)
                .max(self.retry_period)
        })
    }
}

/// `[controller.oci_events]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OciEventsConfig {
    /// Accept OCI Notifications deliveries.
    pub enabled: bool,
    /// URL path prefix; the secret token may follow as the last segment (`<path>/<token>`).
    pub path: String,
    /// The shared secret: the last URL path segment, or the password of HTTP Basic authentication
    /// (`https://<username>:<token>@host<path>`), the two forms an OCI Notifications HTTPS
    /// subscription can send. Required when enabled, unless `token_file` is set.
    pub token: Secret,
    /// A file holding the secret instead of `token` (a mounted Kubernetes Secret); read at start,
    /// surrounding whitespace trimmed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<std::path::PathBuf>,
    /// The user name of HTTP Basic authentication.
    pub username: String,
    /// A header that may carry the secret too: an extra for senders other than OCI Notifications
    /// (which sends no custom header). Off (unset) by default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// Confirm subscriptions by fetching the `ConfirmationURL` (off: only log it).
    pub confirm_subscriptions: bool,
}

impl Default for OciEventsConfig {
    fn default() -> Self {
        OciEventsConfig {
            enabled: false,
            path: "/v1/oci-events".into(),
            token: Secret::default(),
            token_file: None,
            username: "nodekeeper".into(),
            header: None,
            confirm_subscriptions: true,
        }
    }
}

impl ControllerConfig {
    /// Semantic checks.
    pub fn validate(&self) -> Vec<Diagnostic> {
        let mut d = self.provider.validate();
        d.extend(crate::controller::act::notify::validate(&self.notify));
        let err = |d: &mut Vec<Diagnostic>, p, m: &str| d.push(Diagnostic::error(p, m));
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            err(
                &mut d,
                cfg_path!["controller", "listen"],
                "must be an address such as 0.0.0.0:8443",
            );
        }
        let tls = (&self.tls_cert_file, &self.tls_key_file);
        match (self.insecure_plain_http, tls) {
            (false, (Some(_), Some(_))) | (true, (None, None)) => {}
            (true, _) => err(&mut d, cfg_path!["controller", "insecure_plain_http"],
                "plain HTTP and TLS files are both set: choose one"),
            (false, _) => err(&mut d, cfg_path!["controller", "tls_cert_file"],
                "tls_cert_file and tls_key_file are required (or set insecure_plain_http = true explicitly)"),
        }
        let sa = self.service_account.split(':').collect::<Vec<_>>();
        if sa.len() != 4
            || sa[0] != "system"
            || sa[1] != "serviceaccount"
            || sa[2].is_empty()
            || sa[3].is_empty()
        {
            err(
                &mut d,
                cfg_path!["controller", "service_account"],
                "must be system:serviceaccount:<namespace>:<name>",
            );
        }
        if self.audience.is_empty() {
            err(
                &mut d,
                cfg_path!["controller", "audience"],
                "must not be empty",
            );
        }
        if self.max_connections == 0 {
            err(
                &mut d,
                cfg_path!["controller", "max_connections"],
                "must be greater than zero",
            );
        }
        d.extend(self.report_limits.validate());
        d.extend(self.history.validate());
        if self.max_reports_in_flight == 0 {
            err(
                &mut d,
                cfg_path!["controller", "max_reports_in_flight"],
                "must be greater than zero",
            );
        }
        if self.idle_timeout.is_zero() {
            err(
                &mut d,
                cfg_path!["controller", "idle_timeout"],
                "must be greater than zero",
            );
        }
        if self.token_cache_size == 0 {
            err(
                &mut d,
                cfg_path!["controller", "token_cache_size"],
                "must be greater than zero",
            );
        }
        if self.staleness.is_zero() {
            err(
                &mut d,
                cfg_path!["controller", "staleness"],
                "must be greater than zero",
            );
        }
        d.extend(crate::config::k8s_value_error(
            cfg_path!["controller", "namespace"],
            "namespace name",
            &self.namespace,
            crate::k8s::validation::dns1123_label(&self.namespace),
        ));
        d.extend(crate::config::k8s_value_error(
            cfg_path!["controller", "leader", "lease_name"],
            "Lease name",
            &self.leader.lease_name,
            crate::k8s::validation::dns1123_subdomain(&self.leader.lease_name),
        ));
        for (i, key) in self.label_removal_allow.iter().enumerate() {
            d.extend(crate::config::k8s_value_error(
                cfg_path!["controller", "label_removal_allow", i],
                "label key",
                key,
                crate::k8s::validation::qualified_name(key),
            ));
        }
        if self.condition_prefix.is_empty() {
            err(&mut d, cfg_path!["controller", "condition_prefix"],
                "must not be empty (an empty prefix would claim every condition type, including Ready)");
        }
        let l = &self.leader;
        if l.retry_period.is_zero() || l.retry_period >= l.lease_duration {
            err(
                &mut d,
                cfg_path!["controller", "leader", "retry_period"],
                "must be greater than zero and shorter than lease_duration",
            );
        }
        if let Some(r) = l.renew_interval {
            if r.is_zero() || r + l.retry_period > l.lease_duration.saturating_sub(l.retry_period) {
                err(
                    &mut d,
                    cfg_path!["controller", "leader", "renew_interval"],
                    "must be greater than zero and leave a retry before the step-down: renew_interval + retry_period <= lease_duration - retry_period",
                );
            }
        }
        let e = &self.engine;
        for (k, zero) in [
            ("tick", e.tick.is_zero()),
            ("node_concurrency", e.node_concurrency == 0),
            ("drain_concurrency", e.drain_concurrency == 0),
            ("max_parallel_drains", e.max_parallel_drains == 0),
        ] {
            if zero {
                err(
                    &mut d,
                    cfg_path!["controller", "engine", k],
                    "must be greater than zero",
                );
            }
        }
        let oci = &self.oci_events;
        let at = |k: &str| cfg_path!["controller", "oci_events", k];
        match (&oci.token_file, oci.token.expose().is_empty()) {
            (Some(_), false) => err(
                &mut d,
                at("token_file"),
                "set `token` or `token_file`, not both",
            ),
            (None, _) if oci.enabled && oci.token.expose().len() < 16 => err(
                &mut d,
                at("token"),
                "must be at least 16 characters when oci_events is enabled (or set `token_file`)",
            ),
            _ => {}
        }
        if oci.enabled
            && (oci.username.is_empty() || oci.username.contains(':') || !oci.username.is_ascii())
        {
            err(
                &mut d,
                at("username"),
                "must be a non-empty ASCII name without `:` (HTTP Basic authentication)",
            );
        }
        if oci.header.as_deref().is_some_and(|h| {
            h.is_empty() || axum::http::HeaderName::from_bytes(h.as_bytes()).is_err()
        }) {
            err(&mut d, at("header"), "must be an HTTP header name");
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Env;
    use crate::config_file::Config;

    #[test]
    fn oci_events_credentials_are_validated_at_their_keys() {
        let load = |oci: &str| {
            let text = format!(
                "[controller]\nlisten = \"127.0.0.1:8443\"\ninsecure_plain_http = true\n\
                 service_account = \"system:serviceaccount:nodekeeper:nodekeeper-agent\"\n\
                 [controller.oci_events]\nenabled = true\n{oci}"
            );
            Config::load_str(std::path::Path::new("t.toml"), &text, &Env::default())
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert_eq!(load("token = \"0123456789abcdef\"\n"), Ok(()));
        assert_eq!(load("token_file = \"/etc/nk/token\"\n"), Ok(()));
        assert_eq!(
            load("token = \"0123456789abcdef\"\nheader = \"x-nodekeeper-token\"\n"),
            Ok(())
        );
        for (oci, key) in [
            ("token = \"short\"\n", "token"),
            ("", "token"),
            (
                "token = \"0123456789abcdef\"\ntoken_file = \"/t\"\n",
                "token_file",
            ),
            (
                "token = \"0123456789abcdef\"\nusername = \"a:b\"\n",
                "username",
            ),
            (
                "token = \"0123456789abcdef\"\nusername = \"\"\n",
                "username",
            ),
            (
                "token = \"0123456789abcdef\"\nheader = \"bad header\"\n",
                "header",
            ),
        ] {
            let err = load(oci).unwrap_err();
            assert!(err.contains(&format!("oci_events.{key}")), "{oci:?}: {err}");
        }
    }

    #[test]
    fn secrets_are_redacted_and_sections_validated() {
        let text = r#"
[controller]
listen = "127.0.0.1:8443"
insecure_plain_http = true
service_account = "system:serviceaccount:nodekeeper:nodekeeper-agent"
label_removal_allow = ["last-migration-failure"]
[controller.oci_events]
enabled = true
token = "very-secret-token-value"
[report]
url = "https://nodekeeper-controller.nodekeeper.svc:8443"
ca_file = "/ca.pem"
token_file = "/token"
"#;
        let l = Config::load_str(std::path::Path::new("t.toml"), text, &Env::default()).unwrap();
        let out = l.config.to_redacted_toml();
        assert!(!out.contains("very-secret-token-value"), "{out}");
        assert!(out.contains(crate::config::REDACTED), "{out}");
        assert_eq!(
            l.config
                .controller
                .controller
                .as_ref()
                .unwrap()
                .oci_events
                .token
                .expose(),
            "very-secret-token-value"
        );
        // Neither TLS files nor explicit plain HTTP: an error at the right key.
        let bad = "[controller]\nservice_account = \"x\"\n";
        let e = Config::load_str(std::path::Path::new("t.toml"), bad, &Env::default()).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("tls_cert_file") && msg.contains("service_account"),
            "{msg}"
        );
        // An agent config without the sections stays valid.
        assert!(Config::load_str(std::path::Path::new("t.toml"), "", &Env::default()).is_ok());
    }

    /// The holder's renewal interval: derived from the lease and the retry unless set; a set one
    /// must leave a retry before the step-down.
    #[test]
    fn leader_renew_interval_is_derived_or_validated() {
        use std::time::Duration;
        let load = |leader: &str| {
            let text = format!(
                "[controller]\nlisten = \"127.0.0.1:1\"\ninsecure_plain_http = true\n[controller.leader]\n{leader}"
            );
            Config::load_str(std::path::Path::new("t.toml"), &text, &Env::default())
                .map(|l| l.config.controller.controller.unwrap().leader)
                .map_err(|e| e.to_string())
        };
        let s = Duration::from_secs;
        let d = load("").unwrap();
        assert_eq!((d.lease_duration, d.retry_period), (s(20), s(2)));
        assert_eq!(d.renew_interval(), s(12), "20 s − 4 × 2 s");
        let short = load("lease_duration = \"3s\"\n").unwrap();
        assert_eq!(short.renew_interval(), s(2), "never below retry_period");
        let set = load("renew_interval = \"16s\"\n").unwrap();
        assert_eq!(set.renew_interval(), s(16));
        let msg = load("renew_interval = \"17s\"\n").unwrap_err();
        assert!(msg.contains("renew_interval"), "{msg}");
        let msg = load("renew_interval = \"0s\"\n").unwrap_err();
        assert!(msg.contains("renew_interval"), "{msg}");
    }

    #[test]
    fn engine_section_parses_and_validates_at_its_keys() {
        let text = r#"
[controller]
listen = "127.0.0.1:8443"
insecure_plain_http = true
[controller.engine]
tick = "500ms"
debounce = "0s"
on_timeout = "force-delete"
drain_concurrency = 4
"#;
        let l = Config::load_str(std::path::Path::new("t.toml"), text, &Env::default()).unwrap();
        let e = &l.config.controller.controller.as_ref().unwrap().engine;
        assert!(e.enabled);
        assert_eq!(e.tick, std::time::Duration::from_millis(500));
        assert_eq!(e.on_timeout, super::DrainOnTimeout::ForceDelete);
        assert_eq!(
            e.on_timeout.to_drain(),
            crate::controller::act::drain::OnTimeout::ForceDelete
        );
        assert_eq!(e.drain_concurrency, 4);
        let bad = "[controller]\nlisten = \"127.0.0.1:1\"\ninsecure_plain_http = true\n[controller.engine]\ntick = \"0s\"\nnode_concurrency = 0\n";
        let msg = Config::load_str(std::path::Path::new("t.toml"), bad, &Env::default())
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("tick") && msg.contains("node_concurrency"),
            "{msg}"
        );
        let unknown = "[controller]\nlisten = \"127.0.0.1:1\"\ninsecure_plain_http = true\n[controller.engine]\nticks = \"1s\"\n";
        assert!(
            Config::load_str(std::path::Path::new("t.toml"), unknown, &Env::default()).is_err()
        );
    }
}

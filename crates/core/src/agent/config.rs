//! The agent's part of the configuration file ([`AgentSections`]) and its own `[agent]` section.
//! Each other section is defined beside its component (`crio/config.rs`, `checks/config.rs`,
//! `labels/config.rs`, `sources/config.rs`, `reporter/config.rs`); `[node]` is shared
//! ([`crate::config::NodeConfig`]). The file that composes these with the controller's sections is
//! `crate::config_file::Config`.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::agent::checks::ChecksConfig;
use crate::agent::crio::CrioConfig;
use crate::agent::labels::LabelsConfig;
use crate::agent::reporter::ReporterConfig;
use crate::agent::sources::SourcesConfig;
use crate::cfg_path;
use crate::config::{ConfigError, Diagnostic, Env, Loaded, NodeConfig};

/// The sections the agent reads: `[node]`, `[crio]`, `[agent]`, `[checks]`, `[labels]`,
/// `[sources]` and `[report]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentSections {
    /// The node this agent runs on.
    pub node: NodeConfig,
    /// Post-bootstrap CRI-O configuration.
    pub crio: CrioConfig,
    /// The agent's own behaviour.
    pub agent: AgentConfig,
    /// Node health checks.
    pub checks: ChecksConfig,
    /// Migration-label rules.
    pub labels: LabelsConfig,
    /// Cloud metadata sources (preemption, maintenance and rebalance notices).
    pub sources: SourcesConfig,
    /// Reporting to the controller; absent: the agent does not report.
    pub report: Option<ReporterConfig>,
}

/// How the agent reads its configuration file again on a reload: the caller's whole-file loader
/// (it validates every section of the file, the controller's too in the full build), keeping the
/// agent's part.
pub type Load = fn(&Path, &Env) -> Result<Loaded<AgentSections>, ConfigError>;

impl AgentSections {
    /// The `NODEKEEPER_NODE_NAME` and `NODEKEEPER_CRIO_*` overrides.
    pub fn apply_env(&mut self, env: &Env) -> Vec<Diagnostic> {
        self.node.apply_env(env);
        self.crio.apply_env(env)
    }

    /// Every check of the agent's sections. Version-dependent CRI-O lints use `[crio] version`
    /// only: the running CRI-O's own answers (its version and live configuration, from its
    /// socket) are checked after each apply ([`crate::agent::crio::runtime`]).
    pub fn validate(&self) -> Vec<Diagnostic> {
        let mut diags = Vec::new();
        if self.agent.config_poll_interval.is_zero() {
            diags.push(Diagnostic::error(
                cfg_path!["agent", "config_poll_interval"],
                "must be greater than zero",
            ));
        }
        for (i, u) in self.agent.restart_units.iter().enumerate() {
            if !crate::wire::valid_unit(u) {
                diags.push(Diagnostic::error(
                    cfg_path!["agent", "restart_units", i],
                    format!("`{u}` is not a systemd service name (NAME.service)"),
                ));
            }
        }
        diags.extend(crate::agent::crio::lint::lint(
            &self.crio,
            self.crio.version.as_deref(),
        ));
        diags.extend(self.checks.validate());
        diags.extend(self.sources.validate());
        diags.extend(self.labels.validate());
        diags.extend(self.report.iter().flat_map(|r| r.validate()));
        diags
    }
}

/// `[agent]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// How often the agent checks whether its configuration file changed.
    #[serde(with = "humantime_serde")]
    pub config_poll_interval: Duration,
    /// Hold a systemd-logind delay inhibitor lock and report a node shutdown (how OCI
    /// preemption arrives on the node: an ACPI shutdown) before it happens.
    pub shutdown_watcher: bool,
    /// The longest the agent holds up a shutdown to deliver that report (logind's
    /// `InhibitDelayMaxSec` bounds it further).
    #[serde(with = "humantime_serde")]
    pub shutdown_max_delay: Duration,
    /// The systemd units the controller may ask this agent to restart (a repair's
    /// `restart-unit` step); the agent refuses any other, and says so in the command's result.
    pub restart_units: Vec<String>,
}

/// The units a repair may restart by default: the kubelet and the container runtime.
pub const DEFAULT_RESTART_UNITS: &[&str] = &["kubelet.service", "crio.service"];

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            config_poll_interval: Duration::from_secs(5),
            shutdown_watcher: true,
            shutdown_max_delay: Duration::from_secs(5),
            restart_units: DEFAULT_RESTART_UNITS
                .iter()
                .map(|u| u.to_string())
                .collect(),
        }
    }
}

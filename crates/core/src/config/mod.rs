//! Typed configuration: read once from a TOML file, overridden by documented `NODEKEEPER_*`
//! environment variables, validated, and printed without secrets.
//!
//! This is the only module that reads the process environment. Everything below it receives
//! plain values.
//!
//! Errors and warnings carry their place in the file (`FILE:LINE:COL: message`), including the
//! semantic checks that run after parsing: each [`Diagnostic`] names a key path, and the path is
//! located in the parsed document to find its line and column.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

mod diagnostic;
mod load;
mod secret;

use crate::agent::crio::config::CrioConfig;
use crate::cfg_path;
use crate::telemetry::LogFormat;
pub use diagnostic::{display_path, k8s_value_error, line_col, Diagnostic, PathSeg, Severity};
use load::{deserialize_all, locate, parse_document};
pub use secret::{serialize_redacted_url, Secret, REDACTED};

/// The whole configuration file. Every section has defaults, so an empty file is valid.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Logging.
    pub log: LogConfig,
    /// The node this agent runs on.
    pub node: NodeConfig,
    /// Post-bootstrap CRI-O configuration.
    pub crio: CrioConfig,
    /// The agent's own behaviour.
    pub agent: AgentConfig,
    /// Node health checks.
    pub checks: crate::agent::checks::ChecksConfig,
    /// Migration-label rules.
    pub labels: crate::agent::labels::LabelsConfig,
    /// Cloud metadata sources (preemption, maintenance and rebalance notices).
    pub sources: crate::agent::sources::SourcesConfig,
    /// The controller (`nodekeeper controller`); absent on nodes.
    #[cfg(feature = "controller")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controller: Option<crate::controller::config::ControllerConfig>,
    /// The agent build has no controller: its sections are accepted as they are, neither
    /// checked nor printed (the full build's `nodekeeper validate` checks them).
    #[cfg(not(feature = "controller"))]
    #[serde(skip_serializing)]
    pub controller: Option<toml::Value>,
    /// Reporting to the controller (agent); absent: the agent does not report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report: Option<crate::agent::reporter::ReporterConfig>,
    /// Repair policies, escalation, short-circuit, startup timeout (controller).
    #[cfg(feature = "controller")]
    pub repair: crate::controller::policy::config::RepairConfig,
    /// Disruption budgets per node group (controller).
    #[cfg(feature = "controller")]
    pub budgets: crate::controller::policy::config::BudgetsConfig,
    /// Response to interruption notices (controller).
    #[cfg(feature = "controller")]
    pub interruption: crate::controller::policy::config::InterruptionConfig,
    /// `[repair]` in the agent build: accepted, not checked, not printed.
    #[cfg(not(feature = "controller"))]
    #[serde(skip_serializing)]
    pub repair: Option<toml::Value>,
    /// `[budgets]` in the agent build: accepted, not checked, not printed.
    #[cfg(not(feature = "controller"))]
    #[serde(skip_serializing)]
    pub budgets: Option<toml::Value>,
    /// `[interruption]` in the agent build: accepted, not checked, not printed.
    #[cfg(not(feature = "controller"))]
    #[serde(skip_serializing)]
    pub interruption: Option<toml::Value>,
}

/// `[log]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` (default) or `json`.
    pub format: LogFormat,
    /// Targets and levels, e.g. `info` or `nodekeeper=debug,info`.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".to_string(),
        }
    }
}

/// `[node]`
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    /// The Kubernetes node name. In a DaemonSet set `NODEKEEPER_NODE_NAME` from `spec.nodeName`;
    /// empty means the host name.
    pub name: String,
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
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            config_poll_interval: Duration::from_secs(5),
            shutdown_watcher: true,
            shutdown_max_delay: Duration::from_secs(5),
        }
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file was read but is invalid; every finding is listed.
    #[error("{}", render_all(.path, .diagnostics))]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Errors (and the warnings found alongside them).
        diagnostics: Vec<Diagnostic>,
    },
}

fn render_all(path: &Path, diagnostics: &[Diagnostic]) -> String {
    diagnostics
        .iter()
        .map(|d| d.render(path))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A configuration that passed validation, with the warnings found on the way.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The effective configuration (file + environment overrides).
    pub config: Config,
    /// Warnings, located in the file.
    pub warnings: Vec<Diagnostic>,
    /// The file it came from.
    pub path: PathBuf,
}

/// A snapshot of the `NODEKEEPER_*` environment, taken once at start-up.
#[derive(Debug, Clone, Default)]
pub struct Env(BTreeMap<String, String>);

impl Env {
    /// Reads the process environment. The only place nodekeeper calls `std::env`.
    pub fn from_process() -> Self {
        Self(
            std::env::vars()
                .filter(|(k, _)| k.starts_with("NODEKEEPER_"))
                .collect(),
        )
    }
    /// An environment from explicit pairs (tests).
    pub fn from_pairs<I: IntoIterator<Item = (S, S)>, S: Into<String>>(pairs: I) -> Self {
        Self(
            pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
}

/// The documented environment overrides: (variable, key path it overrides).
pub const ENV_OVERRIDES: &[(&str, &str)] = &[
    ("NODEKEEPER_LOG_FORMAT", "log.format"),
    ("NODEKEEPER_LOG_LEVEL", "log.level"),
    ("NODEKEEPER_NODE_NAME", "node.name"),
    ("NODEKEEPER_CRIO_DROPIN_DIR", "crio.dropin_dir"),
    ("NODEKEEPER_CRIO_UNIT", "crio.unit"),
    ("NODEKEEPER_CRIO_RESTART_TIMEOUT", "crio.restart_timeout"),
    ("NODEKEEPER_CRIO_STATE_DIR", "crio.state_dir"),
    ("NODEKEEPER_CRIO_SOCKET", "crio.socket"),
    ("NODEKEEPER_CRIO_VERSION", "crio.version"),
];

/// The largest configuration file read: 1 MiB, what a ConfigMap holds.
pub const MAX_CONFIG_BYTES: usize = 1 << 20;

fn too_large(size: u64) -> Diagnostic {
    Diagnostic::error(
        Vec::new(),
        format!(
            "the file is {size} bytes; a configuration is at most {MAX_CONFIG_BYTES} bytes (1 MiB, \
             what a ConfigMap holds)"
        ),
    )
}

impl Config {
    /// Reads, parses, applies environment overrides, and validates `path`. Version-dependent CRI-O
    /// lints use `[crio] version` only: the running CRI-O's own answers (its version and live
    /// configuration, from its socket) are checked after each apply
    /// ([`crate::agent::crio::runtime`]).
    pub fn load(path: &Path, env: &Env) -> Result<Loaded, ConfigError> {
        let read_err = |source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        };
        // Refused before it is read: parsing a 17 MB file took 1.24 GB.
        let size = std::fs::metadata(path).map_err(read_err)?.len();
        if size > MAX_CONFIG_BYTES as u64 {
            return Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                diagnostics: vec![too_large(size)],
            });
        }
        let text = std::fs::read_to_string(path).map_err(read_err)?;
        Self::load_str(path, &text, env)
    }

    /// As [`Config::load`], from text already read.
    pub fn load_str(path: &Path, text: &str, env: &Env) -> Result<Loaded, ConfigError> {
        let invalid = |diagnostics| ConfigError::Invalid {
            path: path.to_path_buf(),
            diagnostics,
        };
        if text.len() > MAX_CONFIG_BYTES {
            let mut d = too_large(text.len() as u64);
            d.location = Some(line_col(text, MAX_CONFIG_BYTES));
            return Err(invalid(vec![d]));
        }
        let doc = match parse_document(text) {
            Ok(doc) => doc,
            Err(diags) => return Err(invalid(diags)),
        };
        let (parsed, mut diags) = deserialize_all::<Config>(text);
        let Some(mut config) = parsed else {
            return Err(invalid(diags));
        };
        diags.extend(config.apply_env(env));
        diags.extend(config.validate(config.crio.version.as_deref()));
        for d in &mut diags {
            if d.location.is_none() {
                d.location = locate(&doc, &d.path).map(|off| line_col(text, off));
            }
        }
        diags.sort_by_key(|d| (std::cmp::Reverse(d.severity), d.location));
        if diags.iter().any(|d| d.severity == Severity::Error) {
            return Err(invalid(diags));
        }
        Ok(Loaded {
            config,
            warnings: diags,
            path: path.to_path_buf(),
        })
    }

    /// Applies `NODEKEEPER_*` overrides; a bad value is an error naming the variable.
    fn apply_env(&mut self, env: &Env) -> Vec<Diagnostic> {
        let mut diags = Vec::new();
        let mut bad = |var: &str, msg: String| {
            diags.push(Diagnostic::error(
                Vec::new(),
                format!("environment variable {var}: {msg}"),
            ));
        };
        if let Some(v) = env.get("NODEKEEPER_LOG_FORMAT") {
            match v {
                "text" => self.log.format = LogFormat::Text,
                "json" => self.log.format = LogFormat::Json,
                other => bad(
                    "NODEKEEPER_LOG_FORMAT",
                    format!("expected `text` or `json`, got `{other}`"),
                ),
            }
        }
        if let Some(v) = env.get("NODEKEEPER_LOG_LEVEL") {
            self.log.level = v.to_string();
        }
        if let Some(v) = env.get("NODEKEEPER_NODE_NAME") {
            self.node.name = v.to_string();
        }
        if let Some(v) = env.get("NODEKEEPER_CRIO_DROPIN_DIR") {
            self.crio.dropin_dir = PathBuf::from(v);
        }
        if let Some(v) = env.get("NODEKEEPER_CRIO_UNIT") {
            self.crio.unit = v.to_string();
        }
        if let Some(v) = env.get("NODEKEEPER_CRIO_RESTART_TIMEOUT") {
            match humantime::parse_duration(v) {
                Ok(d) => self.crio.restart_timeout = d,
                Err(e) => bad(
                    "NODEKEEPER_CRIO_RESTART_TIMEOUT",
                    format!("`{v}` is not a duration: {e}"),
                ),
            }
        }
        if let Some(v) = env.get("NODEKEEPER_CRIO_STATE_DIR") {
            self.crio.state_dir = PathBuf::from(v);
        }
        if let Some(v) = env.get("NODEKEEPER_CRIO_SOCKET") {
            self.crio.socket = PathBuf::from(v);
        }
        if let Some(v) = env.get("NODEKEEPER_CRIO_VERSION") {
            self.crio.version = Some(v.to_string());
        }
        diags
    }

    /// Semantic checks after parsing. `crio_version` enables version-dependent lints.
    pub fn validate(&self, crio_version: Option<&str>) -> Vec<Diagnostic> {
        let mut diags = Vec::new();
        if crate::telemetry::parse_level(&self.log.level).is_err() {
            diags.push(Diagnostic::error(
                cfg_path!["log", "level"],
                format!(
                    "`{}` is not a valid log filter (e.g. `info`, `nodekeeper=debug,warn`)",
                    self.log.level
                ),
            ));
        }
        if self.agent.config_poll_interval.is_zero() {
            diags.push(Diagnostic::error(
                cfg_path!["agent", "config_poll_interval"],
                "must be greater than zero",
            ));
        }
        diags.extend(crate::agent::crio::lint::lint(&self.crio, crio_version));
        diags.extend(self.checks.validate());
        diags.extend(self.sources.validate());
        diags.extend(self.labels.validate());
        #[cfg(feature = "controller")]
        diags.extend(self.controller.iter().flat_map(|c| c.validate()));
        diags.extend(self.report.iter().flat_map(|r| r.validate()));
        #[cfg(feature = "controller")]
        diags.extend(self.policy().validate());
        diags
    }

    /// The policy: `[repair]`, `[budgets]`, `[interruption]` and `[controller] dry_run`.
    #[cfg(feature = "controller")]
    pub fn policy(&self) -> crate::controller::policy::PolicyConfig {
        use crate::controller::policy::config::ControllerPolicyConfig;
        crate::controller::policy::PolicyConfig::from_sections(
            &self.repair,
            &self.budgets,
            &self.interruption,
            &ControllerPolicyConfig {
                dry_run: self.controller.as_ref().is_some_and(|c| c.dry_run),
            },
        )
    }

    /// The effective configuration as TOML, with secrets redacted (none exist in these sections
    /// yet; later sections mark theirs with [`REDACTED`]).
    pub fn to_redacted_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_redacted_toml())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Loaded, ConfigError> {
        Config::load_str(Path::new("c.toml"), text, &Env::default())
    }

    fn errors(text: &str) -> Vec<String> {
        match load(text) {
            Err(ConfigError::Invalid { diagnostics, .. }) => diagnostics
                .iter()
                .map(|d| d.render(Path::new("c.toml")))
                .collect(),
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn empty_file_gives_defaults() {
        let l = load("").expect("valid");
        assert_eq!(l.config, Config::default());
        assert_eq!(
            l.config.crio.dropin_dir,
            PathBuf::from("/etc/crio/crio.conf.d")
        );
        assert_eq!(l.config.crio.restart_timeout, Duration::from_secs(90));
    }

    #[test]
    fn unknown_key_is_located() {
        let e = errors("[crio]\nunit = \"crio.service\"\nbogus = 1\n");
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("c.toml:3:1: error: unknown field `bogus`"),
            "{e:?}"
        );
    }

    #[test]
    fn every_type_error_and_unknown_key_is_reported() {
        let text = "[crio]\nunit = 5\nbogus = 1\n\n[nope]\nx = 1\n\n[log]\nformat = \"xml\"\n";
        let e = errors(text);
        assert_eq!(e.len(), 4, "{e:?}");
        assert!(e[0].starts_with("c.toml:2:8: error: invalid type"), "{e:?}");
        assert!(
            e[1].starts_with("c.toml:3:1: error: unknown field `bogus`"),
            "{e:?}"
        );
        assert!(
            e[2].starts_with("c.toml:5:2: error: unknown field `nope`"),
            "{e:?}"
        );
        assert!(
            e[3].starts_with("c.toml:9:10: error: unknown variant `xml`"),
            "{e:?}"
        );
    }

    #[test]
    fn syntax_errors_are_located() {
        let e = errors("[crio\nunit = 1\n");
        assert!(e[0].starts_with("c.toml:1:"), "{e:?}");
    }

    #[test]
    fn semantic_errors_are_all_reported_with_locations() {
        let text = "[crio]\n\n[[crio.dropin]]\nname = \"bad name\"\ncontent = \"\"\n\n[[crio.dropin]]\nname = \"ok.conf\"\n";
        let e = errors(text);
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(
            e.iter()
                .any(|l| l.starts_with("c.toml:4:8: error:") && l.contains("bad name")),
            "{e:?}"
        );
        assert!(
            e.iter().any(|l| l.starts_with("c.toml:7:1: error:")
                && l.contains("content")
                && l.contains("settings")),
            "{e:?}"
        );
    }

    #[test]
    fn env_overrides_apply_and_bad_values_fail() {
        let env = Env::from_pairs([
            ("NODEKEEPER_CRIO_UNIT", "x.service"),
            ("NODEKEEPER_LOG_FORMAT", "json"),
        ]);
        let l = Config::load_str(Path::new("c.toml"), "", &env).expect("valid");
        assert_eq!(l.config.crio.unit, "x.service");
        assert_eq!(l.config.log.format, LogFormat::Json);
        let env = Env::from_pairs([("NODEKEEPER_CRIO_RESTART_TIMEOUT", "soon")]);
        let err = Config::load_str(Path::new("c.toml"), "", &env).expect_err("invalid");
        assert!(
            err.to_string().contains("NODEKEEPER_CRIO_RESTART_TIMEOUT"),
            "{err}"
        );
    }

    #[test]
    fn the_crio_version_comes_from_the_config_only() {
        let gated = "[crio]\nversion = \"1.31.0\"\n[[crio.dropin]]\nname = \"a.conf\"\ncontent = \"[crio.image]\\nshort_name_mode = \\\"enforcing\\\"\\n\"\n";
        let l = Config::load_str(Path::new("c.toml"), gated, &Env::default()).expect("valid");
        assert!(
            l.warnings[0].message.contains("CRI-O 1.31 ignores it"),
            "{:?}",
            l.warnings
        );
        let unversioned = gated.replace("version = \"1.31.0\"\n", "");
        let l =
            Config::load_str(Path::new("c.toml"), &unversioned, &Env::default()).expect("valid");
        assert!(l.warnings.is_empty(), "{:?}", l.warnings);
    }

    #[test]
    fn line_col_counts_characters() {
        assert_eq!(line_col("a\nbé c", 5), (2, 3));
        assert_eq!(line_col("", 0), (1, 1));
    }

    /// Probe 6: every parse error is located, nesting included (a deep table header had none),
    /// and a text over 1 MiB is refused at the byte past the limit.
    #[test]
    fn deep_nesting_and_oversized_texts_are_refused_with_a_location() {
        let deep_header = format!(
            "[log]\nlevel = \"info\"\n[{}]\nb = 1\n",
            vec!["a"; 3000].join(".")
        );
        let deep_array = format!("x = {}{}\n", "[".repeat(3000), "]".repeat(3000));
        let deep_inline = format!("x = {}1{}\n", "{a = ".repeat(3000), "}".repeat(3000));
        for (name, text, line) in [
            ("header", deep_header, 3),
            ("array", deep_array, 1),
            ("inline", deep_inline, 1),
        ] {
            let e = errors(&text);
            assert!(!e.is_empty(), "{name}");
            for d in &e {
                assert!(d.starts_with(&format!("c.toml:{line}:")), "{name}: {d}");
            }
        }
        let big = format!("# {}\n", "x".repeat(MAX_CONFIG_BYTES));
        let e = errors(&big);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("c.toml:1:") && e[0].contains("at most 1048576 bytes"),
            "{e:?}"
        );
        // At the limit: read as usual.
        let fits = format!("# {}\n", "x".repeat(MAX_CONFIG_BYTES - 3));
        assert!(load(&fits).is_ok());
    }

    #[test]
    fn printed_config_round_trips() {
        let text = "[[crio.dropin]]\nname = \"10-a.conf\"\n[crio.dropin.settings.crio.runtime]\npids_limit = 4096\n";
        let l = load(text).expect("valid");
        let again = load(&l.config.to_redacted_toml()).expect("printed config is valid");
        assert_eq!(again.config, l.config);
    }
}

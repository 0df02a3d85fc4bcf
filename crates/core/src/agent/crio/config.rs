//! `[crio]`: the CRI-O drop-ins nodekeeper owns, and where CRI-O and its state live. Checked by
//! [`super::lint`], applied by [`super::apply`].

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{Diagnostic, Env};

/// `[crio]`: drop-ins nodekeeper owns in CRI-O's drop-in directory.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CrioConfig {
    /// CRI-O's drop-in directory; CRI-O loads every regular file in it.
    pub dropin_dir: PathBuf,
    /// The systemd unit restarted after a change.
    pub unit: String,
    /// How long a restart may take (job finished and unit active).
    #[serde(with = "humantime_serde")]
    pub restart_timeout: Duration,
    /// Where nodekeeper records which drop-ins it owns, and keeps temp files and backups.
    /// Must be on the same filesystem as `dropin_dir` for atomic renames.
    pub state_dir: PathBuf,
    /// CRI-O's socket: its CRI `Version` and its live configuration (`GET /config`) are read from
    /// it after each apply, to name drop-in keys the running CRI-O ignores.
    pub socket: PathBuf,
    /// The CRI-O version for the version-dependent lints of `validate` (the running CRI-O's own
    /// version and live configuration are checked after each apply, through `socket`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The drop-ins, in any order (CRI-O applies them in file-name order, last wins).
    #[serde(rename = "dropin")]
    pub dropins: Vec<DropIn>,
}

impl Default for CrioConfig {
    fn default() -> Self {
        Self {
            dropin_dir: PathBuf::from("/etc/crio/crio.conf.d"),
            unit: "crio.service".to_string(),
            restart_timeout: Duration::from_secs(90),
            state_dir: PathBuf::from("/var/lib/nodekeeper"),
            socket: PathBuf::from("/var/run/crio/crio.sock"),
            version: None,
            dropins: Vec::new(),
        }
    }
}

/// `[[crio.dropin]]`: one file; exactly one of `content` or `settings`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DropIn {
    /// File name, `^[0-9A-Za-z._-]+\.conf$`.
    pub name: String,
    /// Raw TOML text written as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// A TOML table rendered to TOML.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<toml::Table>,
    /// Take over an existing file of this name that nodekeeper did not create (e.g. one written
    /// by a `postBootstrapInitScript`). Its previous content is backed up for rollback. Without
    /// it, nodekeeper refuses to touch files it did not create.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adopt: bool,
}

impl CrioConfig {
    /// The `NODEKEEPER_CRIO_*` overrides; a bad value is an error naming the variable.
    pub fn apply_env(&mut self, env: &Env) -> Vec<Diagnostic> {
        let mut diags = Vec::new();
        if let Some(v) = env.get("NODEKEEPER_CRIO_DROPIN_DIR") {
            self.dropin_dir = PathBuf::from(v);
        }
        if let Some(v) = env.get("NODEKEEPER_CRIO_UNIT") {
            self.unit = v.to_string();
        }
        if let Some(v) = env.get("NODEKEEPER_CRIO_RESTART_TIMEOUT") {
            match humantime::parse_duration(v) {
                Ok(d) => self.restart_timeout = d,
                Err(e) => diags.push(Env::error(
                    "NODEKEEPER_CRIO_RESTART_TIMEOUT",
                    format!("`{v}` is not a duration: {e}"),
                )),
            }
        }
        if let Some(v) = env.get("NODEKEEPER_CRIO_STATE_DIR") {
            self.state_dir = PathBuf::from(v);
        }
        if let Some(v) = env.get("NODEKEEPER_CRIO_SOCKET") {
            self.socket = PathBuf::from(v);
        }
        if let Some(v) = env.get("NODEKEEPER_CRIO_VERSION") {
            self.version = Some(v.to_string());
        }
        diags
    }
}

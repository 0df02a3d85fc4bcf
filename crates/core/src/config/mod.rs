//! The configuration engine: a TOML document read once, overridden by documented `NODEKEEPER_*`
//! environment variables ([`Env`], the only reader of the process environment), validated, and
//! printed without secrets ([`Secret`]).
//!
//! Errors and warnings carry their place in the file (`FILE:LINE:COL: message`), including the
//! semantic checks that run after parsing: each [`Diagnostic`] names a key path, and the path is
//! located in the parsed document to find its line and column.
//!
//! Each component defines and validates its own sections beside its code; the document that
//! composes them ([`Document`]) is `crate::config_file::Config`. Here are only the engine and the
//! sections every component shares: `[log]` and `[node]`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod diagnostic;
mod env;
mod load;
mod secret;

use crate::cfg_path;
use crate::telemetry::LogFormat;
pub use diagnostic::{display_path, k8s_value_error, line_col, Diagnostic, PathSeg, Severity};
pub use env::Env;
use load::{deserialize_all, locate, parse_document};
pub use secret::{serialize_redacted_url, Secret, REDACTED};

/// A whole configuration file as [`load`] reads it: every section has defaults, so an empty file
/// is valid.
pub trait Document: serde::de::DeserializeOwned {
    /// Applies the `NODEKEEPER_*` overrides; a bad value is an error naming the variable.
    fn apply_env(&mut self, env: &Env) -> Vec<Diagnostic>;
    /// The semantic checks after parsing (and after the overrides).
    fn validate(&self) -> Vec<Diagnostic>;
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

impl LogConfig {
    /// `NODEKEEPER_LOG_FORMAT`, `NODEKEEPER_LOG_LEVEL`.
    pub fn apply_env(&mut self, env: &Env) -> Vec<Diagnostic> {
        let mut diags = Vec::new();
        if let Some(v) = env.get("NODEKEEPER_LOG_FORMAT") {
            match v {
                "text" => self.format = LogFormat::Text,
                "json" => self.format = LogFormat::Json,
                other => diags.push(Env::error(
                    "NODEKEEPER_LOG_FORMAT",
                    format!("expected `text` or `json`, got `{other}`"),
                )),
            }
        }
        if let Some(v) = env.get("NODEKEEPER_LOG_LEVEL") {
            self.level = v.to_string();
        }
        diags
    }

    /// `level` is a valid filter.
    pub fn validate(&self) -> Vec<Diagnostic> {
        if crate::telemetry::parse_level(&self.level).is_ok() {
            return Vec::new();
        }
        vec![Diagnostic::error(
            cfg_path!["log", "level"],
            format!(
                "`{}` is not a valid log filter (e.g. `info`, `nodekeeper=debug,warn`)",
                self.level
            ),
        )]
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

impl NodeConfig {
    /// `NODEKEEPER_NODE_NAME`.
    pub fn apply_env(&mut self, env: &Env) {
        if let Some(v) = env.get("NODEKEEPER_NODE_NAME") {
            self.name = v.to_string();
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
pub struct Loaded<T> {
    /// The effective configuration (file + environment overrides).
    pub config: T,
    /// Warnings, located in the file.
    pub warnings: Vec<Diagnostic>,
    /// The file it came from.
    pub path: PathBuf,
}

impl<T> Loaded<T> {
    /// The same load with `f` applied to the configuration (e.g. a component's part of it).
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Loaded<U> {
        Loaded {
            config: f(self.config),
            warnings: self.warnings,
            path: self.path,
        }
    }
}

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

/// Reads, parses, applies environment overrides, and validates `path` as a `T`; every error
/// is reported, located.
pub fn load<T: Document>(path: &Path, env: &Env) -> Result<Loaded<T>, ConfigError> {
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
    load_str(path, &text, env)
}

/// As [`load`], from text already read.
pub fn load_str<T: Document>(path: &Path, text: &str, env: &Env) -> Result<Loaded<T>, ConfigError> {
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
    let (parsed, mut diags) = deserialize_all::<T>(text);
    let Some(mut config) = parsed else {
        return Err(invalid(diags));
    };
    diags.extend(config.apply_env(env));
    diags.extend(config.validate());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_characters() {
        assert_eq!(line_col("a\nbé c", 5), (2, 3));
        assert_eq!(line_col("", 0), (1, 1));
    }
}

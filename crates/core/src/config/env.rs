//! The `NODEKEEPER_*` environment, read once at start-up: the only place nodekeeper calls
//! `std::env`. Each section's `apply_env` takes its overrides from here.

use std::collections::BTreeMap;

use super::Diagnostic;

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
    /// The value of `key`, when set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
    /// The error for a bad value of the variable `var`.
    pub fn error(var: &str, msg: String) -> Diagnostic {
        Diagnostic::error(Vec::new(), format!("environment variable {var}: {msg}"))
    }
}

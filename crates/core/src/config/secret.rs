//! Secrets in the configuration: read normally, never printed.

use serde::{Deserialize, Serialize};

/// What secrets are replaced with when a configuration is printed.
pub const REDACTED: &str = "<redacted>";

/// A secret string: deserialized normally, always printed as [`REDACTED`].
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// A secret holding `s`.
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    /// The secret value (compare it in constant time).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(REDACTED)
    }
}

impl Serialize for Secret {
    /// An unset (empty) secret prints as `""`: there is nothing to hide, and the user sees it is unset.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(if self.0.is_empty() { "" } else { REDACTED })
    }
}

/// Serializes a URL from the configuration as [`crate::http::redact_url`] prints it: webhook
/// URLs carry their secrets in userinfo, path or query (`nodekeeper validate` prints the config).
pub fn serialize_redacted_url<S: serde::Serializer>(url: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&crate::http::redact_url(url))
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Secret(s.to_string())
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Secret(s)
    }
}

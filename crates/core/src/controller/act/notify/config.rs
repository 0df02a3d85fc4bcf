//! `[[controller.notify]]`: one target's configuration, its defaults and its validation.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::template::parse_template;
use super::Phase;
use crate::cfg_path;
use crate::config::{Diagnostic, Secret};
use crate::controller::act::provider::check_http_url;

/// `[[controller.notify]]`: one webhook target.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NotifyConfig {
    /// `https://` (or `http://`) URL to POST to (printed redacted).
    #[serde(serialize_with = "crate::config::serialize_redacted_url")]
    pub url: String,
    /// A PEM CA file trusted besides the system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<std::path::PathBuf>,
    /// Which phases are sent (default: all three).
    #[serde(default = "all_phases")]
    pub events: Vec<Phase>,
    /// Body template with `{node}`, `{action}`, `{phase}`, `{result}`, `{reason}`,
    /// `{message}`, `{time}`, `{id}` placeholders (default: the JSON [`Payload`](super::Payload)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Content-Type of a templated body (default: `application/json` when the template looks
    /// like JSON (`{"...` or `[`), else `text/plain; charset=utf-8`). With a JSON type, values
    /// are JSON-escaped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// HMAC-SHA256 key for `X-Nodekeeper-Signature` (empty: unsigned); never printed.
    #[serde(default)]
    pub secret: Secret,
    /// Timeout of one attempt.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Attempts on 5xx / 429 / timeouts / connection errors before giving up.
    #[serde(default = "default_attempts")]
    pub max_attempts: u32,
    /// First retry delay (doubled each attempt, with jitter, capped at 30 s).
    #[serde(default = "default_backoff", with = "humantime_serde")]
    pub backoff: Duration,
    /// Notifications waiting at most; when full the oldest is dropped (and counted).
    #[serde(default = "default_queue")]
    pub queue_size: usize,
}

fn all_phases() -> Vec<Phase> {
    Phase::ALL.to_vec()
}
fn default_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_attempts() -> u32 {
    5
}
fn default_backoff() -> Duration {
    Duration::from_millis(500)
}
fn default_queue() -> usize {
    256
}

impl NotifyConfig {
    /// A target for `url` with the defaults.
    pub fn new(url: &str) -> Self {
        NotifyConfig {
            url: url.to_string(),
            ca_file: None,
            events: all_phases(),
            template: None,
            content_type: None,
            secret: Secret::default(),
            timeout: default_timeout(),
            max_attempts: default_attempts(),
            backoff: default_backoff(),
            queue_size: default_queue(),
        }
    }

    /// The Content-Type of the body.
    pub fn effective_content_type(&self) -> &str {
        match (&self.content_type, &self.template) {
            (Some(c), _) => c,
            (None, None) => "application/json",
            (None, Some(t)) if looks_like_json(t) => "application/json",
            (None, Some(_)) => "text/plain; charset=utf-8",
        }
    }
}

/// A template starting with `[`, or with `{` followed by `"` or `}` (a JSON object rather
/// than a leading placeholder such as `{node}`).
pub(super) fn looks_like_json(tpl: &str) -> bool {
    let t = tpl.trim_start();
    match t.strip_prefix('{') {
        Some(rest) => rest.trim_start().starts_with(['"', '}']),
        None => t.starts_with('['),
    }
}

/// Checks every `[[controller.notify]]` entry; paths are `controller.notify[i].<key>`.
pub fn validate(targets: &[NotifyConfig]) -> Vec<Diagnostic> {
    targets
        .iter()
        .enumerate()
        .flat_map(|(i, t)| validate_one(i, t))
        .collect()
}

fn validate_one(i: usize, t: &NotifyConfig) -> Vec<Diagnostic> {
    let at = |k: &str| cfg_path!["controller", "notify", i, k];
    let mut d = Vec::new();
    d.extend(check_http_url(&t.url, at("url")));
    if t.events.is_empty() {
        d.push(Diagnostic::error(
            at("events"),
            "must name at least one of started, finished, failed",
        ));
    }
    if let Some(Err(e)) = t.template.as_deref().map(parse_template) {
        d.push(Diagnostic::error(at("template"), e));
    }
    if t.content_type
        .as_deref()
        .is_some_and(|c| c.trim().is_empty())
    {
        d.push(Diagnostic::error(at("content_type"), "must not be empty"));
    }
    if t.timeout.is_zero() {
        d.push(Diagnostic::error(
            at("timeout"),
            "must be greater than zero",
        ));
    }
    if t.max_attempts == 0 {
        d.push(Diagnostic::error(at("max_attempts"), "must be at least 1"));
    }
    if t.queue_size == 0 {
        d.push(Diagnostic::error(at("queue_size"), "must be at least 1"));
    }
    d
}

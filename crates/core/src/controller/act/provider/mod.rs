//! Replacement providers: how nodekeeper asks for a new node when one must go.
//!
//! One trait, [`NodeProvider`], and one file per implementation:
//! - [`karpenter`]: deletes the node's NodeClaim and waits for a new Ready node of the same pool;
//! - [`webhook`]: POSTs an HMAC-signed JSON description to a URL, with retries;
//! - [`oci`]: terminates the node's OCI instance (Compute) or deletes it from its OKE node pool
//!   once nodekeeper's drain is over (`retire`), with OCI-signed requests, and waits for a new
//!   Ready node of the same pool;
//! - [`none`]: never replaces (cordon/drain only);
//! - [`fake`]: a recording fake for tests of the decision/actions code.
//!
//! Every request carries a `request_id` derived from node, reason and episode
//! ([`ReplacementRequest::new`]); asking twice with the same id never launches two replacements.

pub mod fake;
pub mod karpenter;
pub mod none;
pub mod oci;
pub mod oci_auth;
pub mod webhook;

use std::future::Future;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Node;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::cfg_path;
use crate::config::Diagnostic;

use crate::controller::policy::nodepool::POOL_LABEL;

/// What nodekeeper asks a provider to replace, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplacementRequest {
    /// Name of the node to replace.
    pub node: String,
    /// Node group (e.g. the `karpenter.sh/nodepool` label), if known.
    pub pool: Option<String>,
    /// `spec.providerID` of the node, if set.
    pub provider_id: Option<String>,
    /// Why: `interruption`, `repair`, `startup-timeout`, ...
    pub reason: String,
    /// Idempotency key: the same node, reason and episode give the same id.
    pub request_id: String,
    /// Asked before the node's drain (`[repair] prespin`): capacity for every pod on the node,
    /// even one its drain is evicting as the request is made. Left out of the webhook's body
    /// when false (it is never true for a webhook).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prespin: bool,
}

impl ReplacementRequest {
    /// A request whose `request_id` is derived from `node`, `reason` and `episode` (e.g. the
    /// time the condition or notice was first seen), so a restarted controller asks with the same id.
    pub fn new(node: &str, reason: &str, episode: &str) -> Self {
        Self {
            node: node.to_string(),
            pool: None,
            provider_id: None,
            reason: reason.to_string(),
            request_id: request_id(node, reason, episode),
            prespin: false,
        }
    }
}

/// Deterministic idempotency key: `nk-` + the first 24 hex digits of SHA-256(node, reason, episode).
pub fn request_id(node: &str, reason: &str, episode: &str) -> String {
    let mut h = Sha256::new();
    for part in [node, reason, episode] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    let digest = hex::encode(h.finalize());
    format!("nk-{}", &digest[..24])
}

/// Handle on an accepted replacement, to poll with [`NodeProvider::replacement_ready`].
/// Serializable so the controller can record it on the Node and resume after a restart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplacementTicket {
    /// Name of the provider that accepted it (`karpenter`, `webhook`, `oci`, `none`, `fake`).
    pub provider: String,
    /// The request's idempotency key.
    pub request_id: String,
    /// The node being replaced.
    pub node: String,
    /// The node's pool, if known.
    pub pool: Option<String>,
    /// Provider-specific reference (the NodeClaim name for karpenter, the instance OCID for oci).
    pub reference: Option<String>,
    /// Server time the replacement was requested (RFC 3339), when the provider knows it.
    pub requested_at: Option<String>,
    /// Nodes of the pool that existed at request time (never reported as the replacement).
    #[serde(default)]
    pub existing_nodes: Vec<String>,
}

/// Failure of a provider call.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// A Kubernetes API call failed.
    #[error("{provider}: {action} for node {node}: {source}")]
    Kube {
        /// Provider name.
        provider: &'static str,
        /// What was being done.
        action: &'static str,
        /// The node concerned.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The request cannot succeed as it stands (4xx, missing NodeClaim, ...); do not retry.
    #[error("{provider}: replacement of node {node} refused: {source}")]
    Permanent {
        /// Provider name.
        provider: &'static str,
        /// The node concerned.
        node: String,
        /// Why.
        #[source]
        source: CallError,
    },
    /// The request may succeed later (5xx, timeouts) but retries were exhausted.
    #[error("{provider}: replacement of node {node} failed after {attempts} attempts: {source}")]
    Transient {
        /// Provider name.
        provider: &'static str,
        /// The node concerned.
        node: String,
        /// Attempts made.
        attempts: u32,
        /// The last attempt's failure.
        #[source]
        source: CallError,
    },
    /// The provider could not be set up.
    #[error(transparent)]
    Setup(#[from] SetupError),
}

/// Why one call of a provider failed: the cause of a [`ProviderError::Permanent`] or
/// [`ProviderError::Transient`].
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The endpoint answered with an error status.
    #[error("{request} answered {status}: {body}")]
    Status {
        /// The request, e.g. `DELETE /20160918/instances/ocid1.instance.oc1..x`.
        request: String,
        /// The HTTP status code.
        status: u16,
        /// The start of the answer's body: the endpoint's own explanation, not an error value.
        body: String,
    },
    /// No answer: connection refused, TLS, timeout.
    #[error("{request}: {}", crate::telemetry::error_chain(.source))]
    Send {
        /// The request.
        request: String,
        /// Cause.
        #[source]
        source: reqwest::Error,
    },
    /// The request could not be made (its URL, its signature, its body).
    #[error("{what}: {}", crate::telemetry::error_chain(.source.as_ref()))]
    Prepare {
        /// What was being prepared, e.g. `signing DELETE /20160918/instances/x`.
        what: String,
        /// Cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The cluster or the configuration rules the request out, e.g. the node has no NodeClaim.
    #[error("{0}")]
    Ruled(String),
}

/// The provider could not be set up (e.g. the HTTP client could not be built). The message
/// carries the cause's whole chain (a TLS or reqwest error's own Display is only its first line).
#[derive(Debug, thiserror::Error)]
#[error("{provider}: setting up: {what}: {}", crate::telemetry::error_chain(.source.as_ref()))]
pub struct SetupError {
    /// Provider name.
    pub provider: &'static str,
    /// What was being set up, e.g. `reading key_file /etc/nodekeeper/oci.pem`.
    pub what: String,
    /// Cause.
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

impl ProviderError {
    /// Whether retrying the same request later is pointless.
    pub fn is_permanent(&self) -> bool {
        matches!(self, ProviderError::Permanent { .. })
    }
}

/// A way to get a replacement for a node.
pub trait NodeProvider: Send + Sync {
    /// Short name, used in tickets, logs and metrics labels.
    fn name(&self) -> &'static str;

    /// Asks for a replacement of `req.node`. Idempotent on `req.request_id`.
    fn request_replacement<'a>(
        &'a self,
        req: &'a ReplacementRequest,
    ) -> BoxFuture<'a, Result<ReplacementTicket, ProviderError>>;

    /// `Some(new node name)` once the replacement is Ready, `None` while it is not (yet).
    fn replacement_ready<'a>(
        &'a self,
        ticket: &'a ReplacementTicket,
    ) -> BoxFuture<'a, Result<Option<String>, ProviderError>>;

    /// Takes the old node away once nodekeeper's drain of it is over (completed, or its deadline
    /// passed). For `karpenter` (its request only adds capacity; the old NodeClaim is deleted
    /// here, so Karpenter's own drain finds nothing left to evict) and `oci` (TerminateInstance or
    /// DeleteNode here, so OCI stops no pod nodekeeper is still draining) this is the second half
    /// of a replacement; the others remove the old node when asked and do nothing here.
    /// Idempotent on `req.request_id`; called again after a failure or a controller restart.
    fn retire<'a>(
        &'a self,
        req: &'a ReplacementRequest,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        let _ = req;
        Box::pin(async { Ok(()) })
    }

    /// Gives up a replacement asked for before a drain that did not end in `replace` (the repair
    /// was released): the provider stops holding the new node for the old one's pods. Only
    /// `karpenter`'s request adds capacity before a drain; the others do nothing here.
    fn abandon<'a>(
        &'a self,
        req: &'a ReplacementRequest,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        let _ = req;
        Box::pin(async { Ok(()) })
    }
}

/// The error of a webhook URL that is not a plain `http://` URL (providers and notifications).
pub fn check_http_url(url: &str, path: Vec<crate::config::PathSeg>) -> Option<Diagnostic> {
    let parsed = reqwest::Url::parse(url);
    if let Ok(u) = &parsed {
        // Loopback stays allowed here (local receivers); metadata, link-local and unspecified
        // addresses never are (the clients refuse names resolving to them as well).
        if let Err(why) = crate::http::check_destination(u, true) {
            return Some(Diagnostic::error(
                path,
                format!("{why}: no webhook may be sent there"),
            ));
        }
    }
    match parsed {
        Ok(u) if u.scheme() == "https" => None,
        Ok(u) if u.scheme() == "http" && is_loopback(&u) => None,
        Ok(u) if u.scheme() == "http" => Some(Diagnostic::warning(
            path,
            format!(
                "plain `http://` to {}: the body (and its signature) crosses the network in the clear; use `https://`",
                u.host_str().unwrap_or_default()
            ),
        )),
        Ok(u) => Some(Diagnostic::error(
            path,
            format!(
                "scheme `{}` is not supported: `https://` (or `http://`)",
                u.scheme()
            ),
        )),
        Err(e) => Some(Diagnostic::error(
            path,
            // (not echoed: a mistyped webhook URL may still hold its secret)
            format!("not a URL: {e}"),
        )),
    }
}

fn is_loopback(u: &reqwest::Url) -> bool {
    let host = u.host_str().unwrap_or_default();
    host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|a| a.is_loopback())
}

/// Whether `n` has the condition `Ready=True`.
pub fn is_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The replacement `t` is waiting for, among `candidates` (the nodes of its pool): the first
/// **Ready** node that is not the old node, did not exist when the replacement was requested
/// (`t.existing_nodes`) and was created at or after `t.requested_at` (when known).
pub fn new_ready_node(
    candidates: impl IntoIterator<Item = Node>,
    t: &ReplacementTicket,
) -> Option<String> {
    let since = t
        .requested_at
        .as_deref()
        .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok());
    candidates
        .into_iter()
        .filter(is_ready)
        .filter(|n| {
            let created = n.metadata.creation_timestamp.as_ref().map(|c| c.0);
            match (since, created) {
                (Some(s), Some(c)) => c.as_second() >= s.timestamp(),
                _ => true,
            }
        })
        .filter_map(|n| n.metadata.name)
        .find(|name| *name != t.node && !t.existing_nodes.contains(name))
}

/// Delay before retry `n` (1-based): [`crate::backoff::delay`] from `base`, capped at 30 s.
pub fn backoff(base: Duration, n: u32) -> Duration {
    crate::backoff::delay(base, Duration::from_secs(30), n)
}

/// The outcome of one attempt of an HTTP provider call.
#[derive(Debug)]
pub enum Attempt<T> {
    /// Done (accepted, or nothing left to do).
    Done(T),
    /// Refused for good (4xx other than 429): not retried.
    Permanent(CallError),
    /// May succeed later (429, 5xx, timeouts, connection errors).
    Retry(CallError),
}

/// Calls `attempt(n)` for `n = 1..=max_attempts` (at least once), sleeping [`backoff`]`(base, n)`
/// between attempts that ask for a retry; maps the end to a [`ProviderError`] about `node`.
pub async fn with_retries<T, F, Fut>(
    provider: &'static str,
    node: &str,
    max_attempts: u32,
    base: Duration,
    mut attempt: F,
) -> Result<T, ProviderError>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Attempt<T>>,
{
    let max_attempts = max_attempts.max(1);
    let mut n = 1;
    loop {
        match attempt(n).await {
            Attempt::Done(v) => return Ok(v),
            Attempt::Permanent(source) => {
                return Err(ProviderError::Permanent {
                    provider,
                    node: node.to_string(),
                    source,
                })
            }
            Attempt::Retry(why) => {
                tracing::warn!(provider, node, attempt = n, error = %why, "provider attempt failed");
                if n == max_attempts {
                    return Err(ProviderError::Transient {
                        provider,
                        node: node.to_string(),
                        attempts: max_attempts,
                        source: why,
                    });
                }
            }
        }
        tokio::time::sleep(backoff(base, n)).await;
        n += 1;
    }
}

/// Which provider to use: `[controller.provider]` with
/// `kind = "karpenter" | "webhook" | "oci" | "none"`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum ProviderConfig {
    /// Delete the node's Karpenter NodeClaim.
    Karpenter,
    /// POST a signed JSON description to a URL.
    Webhook(WebhookConfig),
    /// Terminate the OCI instance, or delete it from its OKE node pool (signed OCI API calls).
    Oci(Box<oci::OciConfig>),
    /// Never replace.
    #[default]
    None,
}

/// Settings of the webhook provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// `https://` (or `http://`) URL to POST to (printed redacted).
    #[serde(serialize_with = "crate::config::serialize_redacted_url")]
    pub url: String,
    /// HMAC-SHA256 key for `X-Nodekeeper-Signature`; never logged.
    pub secret: crate::config::Secret,
    /// A PEM CA file trusted besides the system's roots (a private CA of the receiver).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<std::path::PathBuf>,
    /// Timeout of one attempt.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Attempts on 5xx / timeouts / connection errors before giving up.
    #[serde(default = "default_attempts")]
    pub max_attempts: u32,
    /// First retry delay (doubled each attempt, with jitter).
    #[serde(default = "default_backoff", with = "humantime_serde")]
    pub backoff: Duration,
}

pub(crate) fn default_timeout() -> Duration {
    Duration::from_secs(10)
}
pub(crate) fn default_attempts() -> u32 {
    5
}
pub(crate) fn default_backoff() -> Duration {
    Duration::from_millis(500)
}

impl ProviderConfig {
    /// Semantic checks; paths are relative to `[controller.provider]`.
    pub fn validate(&self) -> Vec<Diagnostic> {
        let w = match self {
            ProviderConfig::Webhook(w) => w,
            ProviderConfig::Oci(o) => return o.validate(),
            ProviderConfig::Karpenter | ProviderConfig::None => return Vec::new(),
        };
        let at = |k: &str| cfg_path!["controller", "provider", k];
        let mut d = Vec::new();
        d.extend(check_http_url(&w.url, at("url")));
        if w.secret.expose().is_empty() {
            d.push(Diagnostic::error(
                at("secret"),
                "must not be empty: requests are signed with it",
            ));
        }
        d.extend(check_retries(w.timeout, w.max_attempts));
        d
    }
}

/// The errors of a zero `timeout` or `max_attempts` (webhook and oci providers).
pub(crate) fn check_retries(timeout: Duration, max_attempts: u32) -> Vec<Diagnostic> {
    let at = |k: &str| cfg_path!["controller", "provider", k];
    let mut d = Vec::new();
    if timeout.is_zero() {
        d.push(Diagnostic::error(
            at("timeout"),
            "must be greater than zero",
        ));
    }
    if max_attempts == 0 {
        d.push(Diagnostic::error(at("max_attempts"), "must be at least 1"));
    }
    d
}

/// Builds the configured provider. `client` is used by the karpenter and oci providers (to read
/// nodes).
pub fn build(
    cfg: &ProviderConfig,
    client: kube::Client,
    allow_loopback: bool,
) -> Result<Box<dyn NodeProvider>, ProviderError> {
    Ok(match cfg {
        ProviderConfig::Karpenter => Box::new(karpenter::Karpenter::new(client)),
        ProviderConfig::Webhook(w) => Box::new(webhook::Webhook::new(w.clone(), allow_loopback)?),
        ProviderConfig::Oci(o) => {
            Box::new(oci::Oci::new(o.as_ref().clone(), client, allow_loopback)?)
        }
        ProviderConfig::None => Box::new(none::NoReplacement),
    })
}

//! The `webhook` provider: POSTs a JSON description of the replacement to a URL, signed with
//! HMAC-SHA256 (`X-Nodekeeper-Signature: sha256=<hex>` over the exact body bytes).
//!
//! 2xx = accepted; 4xx = permanent error; 5xx, timeouts and connection errors are retried with
//! jittered exponential backoff, up to `max_attempts`. The `request_id` travels in the body and in
//! the `Idempotency-Key` header so the receiver can de-duplicate; this process also never POSTs an
//! id it already got accepted. `https://` (system roots plus `ca_file`) or plain `http://`
//! (`validate` warns unless the host is loopback). The secret is never logged.
//! The receiver launches the node; readiness is not reported back by this provider
//! (`replacement_ready` answers `None`), the controller's startup timeout covers it.

use std::collections::BTreeMap;
use std::sync::Mutex;

use futures::future::BoxFuture;
use hmac::{Hmac, KeyInit, Mac};
use serde::Serialize;
use sha2::Sha256;

pub use super::backoff;
use super::{
    with_retries, Attempt, CallError, NodeProvider, ProviderError, ReplacementRequest,
    ReplacementTicket, SetupError, WebhookConfig,
};

/// Header carrying `sha256=<hex HMAC of the body>`.
pub const SIGNATURE_HEADER: &str = "X-Nodekeeper-Signature";

const NAME: &str = "webhook";

/// The JSON body POSTed to the webhook.
#[derive(Debug, Serialize)]
pub struct WebhookBody<'a> {
    /// Always `replace-node`.
    pub action: &'static str,
    /// The request as nodekeeper sees it.
    #[serde(flatten)]
    pub request: &'a ReplacementRequest,
}

/// `sha256=<hex>` HMAC-SHA256 of `body` under `secret`.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = match <Hmac<Sha256> as KeyInit>::new_from_slice(secret) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Replaces nodes by asking an external system over HTTP.
pub struct Webhook {
    cfg: WebhookConfig,
    http: reqwest::Client,
    accepted: Mutex<BTreeMap<String, ReplacementTicket>>,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("url", &crate::http::redact_url(&self.cfg.url))
            .field("secret", &"<redacted>")
            .finish()
    }
}

impl Webhook {
    /// A provider for `cfg`; its URL on loopback only with `allow_loopback`
    /// (`[controller] allow_loopback_destinations`).
    pub fn new(cfg: WebhookConfig, allow_loopback: bool) -> Result<Self, SetupError> {
        let setup = |source: Box<dyn std::error::Error + Send + Sync>| SetupError {
            provider: NAME,
            what: format!("building the HTTP client for {}", cfg.url),
            source,
        };
        if let Ok(url) = reqwest::Url::parse(&cfg.url) {
            crate::http::check_destination(&url, allow_loopback)
                .map_err(|why| setup(why.into()))?;
        }
        let http = crate::http::builder(cfg.ca_file.as_deref()).map_err(|e| setup(e.into()))?;
        // No redirect (a 3xx is the answer: the signed body is never re-sent to another
        // host); names resolving to metadata, link-local or unspecified addresses refused.
        let http = crate::http::guard(http, allow_loopback)
            .timeout(cfg.timeout)
            .build()
            .map_err(|e| setup(e.into()))?;
        Ok(Self {
            cfg,
            http,
            accepted: Mutex::new(BTreeMap::new()),
        })
    }

    fn accepted(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ReplacementTicket>> {
        crate::sync::lock(&self.accepted)
    }

    async fn attempt(&self, req: &ReplacementRequest, body: &[u8]) -> Attempt<()> {
        let res = self
            .http
            .post(&self.cfg.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(
                SIGNATURE_HEADER,
                sign(self.cfg.secret.expose().as_bytes(), body),
            )
            .header("Idempotency-Key", &req.request_id)
            .body(body.to_vec())
            .send()
            .await;
        let request = || format!("POST {}", crate::http::redact_url(&self.cfg.url));
        match res {
            Ok(r) if r.status().is_success() => Attempt::Done(()),
            Ok(r) => {
                let status = r.status().as_u16();
                let text = r.text().await.unwrap_or_default();
                let e = CallError::Status {
                    request: request(),
                    status,
                    body: trim(&text).to_string(),
                };
                if (400..500).contains(&status) && status != 429 {
                    Attempt::Permanent(e)
                } else {
                    Attempt::Retry(e)
                }
            }
            Err(source) => Attempt::Retry(CallError::Send {
                request: request(),
                // (reqwest's error names the URL: not in logs or Events)
                source: source.without_url(),
            }),
        }
    }

    async fn request(&self, req: &ReplacementRequest) -> Result<ReplacementTicket, ProviderError> {
        if let Some(t) = self.accepted().get(&req.request_id) {
            return Ok(t.clone());
        }
        let body = serde_json::to_vec(&WebhookBody {
            action: "replace-node",
            request: req,
        })
        .map_err(|e| ProviderError::Permanent {
            provider: NAME,
            node: req.node.clone(),
            source: CallError::Prepare {
                what: "encoding the request".into(),
                source: e.into(),
            },
        })?;
        with_retries(
            NAME,
            &req.node,
            self.cfg.max_attempts,
            self.cfg.backoff,
            |_| self.attempt(req, &body),
        )
        .await?;
        Ok(self.accept(req))
    }

    fn accept(&self, req: &ReplacementRequest) -> ReplacementTicket {
        tracing::info!(node = %req.node, request = %req.request_id, url = %crate::http::redact_url(&self.cfg.url), "webhook accepted the replacement");
        let t = ReplacementTicket {
            provider: NAME.into(),
            request_id: req.request_id.clone(),
            node: req.node.clone(),
            pool: req.pool.clone(),
            reference: Some(crate::http::redact_url(&self.cfg.url)),
            requested_at: Some(chrono::Utc::now().to_rfc3339()),
            existing_nodes: Vec::new(),
        };
        self.accepted().insert(req.request_id.clone(), t.clone());
        t
    }
}

pub(crate) fn trim(s: &str) -> &str {
    let end = s.char_indices().nth(200).map_or(s.len(), |(i, _)| i);
    &s[..end]
}

impl NodeProvider for Webhook {
    fn name(&self) -> &'static str {
        NAME
    }

    fn request_replacement<'a>(
        &'a self,
        req: &'a ReplacementRequest,
    ) -> BoxFuture<'a, Result<ReplacementTicket, ProviderError>> {
        Box::pin(self.request(req))
    }

    fn replacement_ready<'a>(
        &'a self,
        _ticket: &'a ReplacementTicket,
    ) -> BoxFuture<'a, Result<Option<String>, ProviderError>> {
        Box::pin(async { Ok(None) })
    }
}

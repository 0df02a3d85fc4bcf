//! How a notification leaves: one POST to a target. Delivery (order, retries, backoff) talks only
//! to a [`WebhookPost`]; [`http::HttpPost`] is the real one (reqwest over rustls, system roots plus
//! the target's `ca_file`), `fake.rs` a scripted one for the retry tests on tokio's paused clock.

#[cfg(test)]
pub(crate) mod fake;
pub mod http;

use futures::future::BoxFuture;

/// A failed exchange (connect, TLS, timeout): no status came back.
pub type TransportError = Box<dyn std::error::Error + Send + Sync>;

/// One POST of a rendered notification.
#[derive(Debug, Clone, Copy)]
pub struct PostRequest<'a> {
    /// The target URL.
    pub url: &'a str,
    /// `Content-Type`.
    pub content_type: &'a str,
    /// The `X-Nodekeeper-Event` header (the phase).
    pub event: &'a str,
    /// `Idempotency-Key` (the same on every retry).
    pub idempotency_key: &'a str,
    /// The HMAC signature header's value, when the target has a secret.
    pub signature: Option<&'a str>,
    /// The body.
    pub body: &'a [u8],
}

/// Sends one notification; answers the HTTP status, or a transport error.
pub trait WebhookPost: Send + Sync {
    /// One exchange.
    fn post<'a>(&'a self, req: PostRequest<'a>) -> BoxFuture<'a, Result<u16, TransportError>>;
}

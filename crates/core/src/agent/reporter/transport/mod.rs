//! How a report reaches the controller: one POST of an encoded report with a bearer token.
//! The reporter's loop (heartbeat, change limit, failure backoff) talks only to a
//! [`ReportTransport`]; [`http::HttpTransport`] is the real one (reqwest over rustls, pinned CA and
//! server name), `fake.rs` a scripted one for the loop's tests on tokio's paused clock (a real
//! exchange cannot run there: the clock jumps to the request timeout while bytes are in flight).

#[cfg(test)]
pub(crate) mod fake;
pub mod http;

use futures::future::BoxFuture;

/// A failed exchange (connect, TLS, timeout, body): the source of `ReporterError::Transport`.
pub type TransportError = Box<dyn std::error::Error + Send + Sync>;

/// The controller's answer to one POST.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// HTTP status code.
    pub status: u16,
    /// The response body.
    pub body: bytes::Bytes,
    /// `Retry-After` in seconds, when the answer carries one (a controller shedding load).
    pub retry_after: Option<std::time::Duration>,
    /// The `Warning` header's text, when the controller warns (e.g. a deprecated report version).
    pub warning: Option<String>,
}

/// A `Retry-After` header's delay: delta-seconds only (the controller sends nothing else; an
/// HTTP-date is ignored, as is anything unparsable).
pub fn retry_after(value: Option<&str>) -> Option<std::time::Duration> {
    value?
        .trim()
        .parse()
        .ok()
        .map(std::time::Duration::from_secs)
}

/// Sends one encoded report (`POST <url>/v1/reports`, JSON, `Authorization: Bearer <token>`).
pub trait ReportTransport: Send + Sync + std::fmt::Debug {
    /// One exchange; a transport error when no answer came.
    fn post<'a>(
        &'a self,
        token: &'a str,
        body: Vec<u8>,
    ) -> BoxFuture<'a, Result<Answer, TransportError>>;
}

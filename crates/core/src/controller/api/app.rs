//! The report API's shared state ([`App`]) and its body reading ([`read_body`]): the one limit and
//! deadline of every handler that reads a body, the report API's and the OCI Notifications
//! endpoint's.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::controller::api::auth::Authenticator;
use crate::controller::api::oci_events::OciEvents;
use crate::controller::state::nodestate::NodeStates;

/// Shared state of the handlers.
#[derive(Debug)]
pub struct App {
    /// Token validation.
    pub auth: Authenticator,
    /// Node state.
    pub states: Arc<NodeStates>,
    /// The Node cache is synced.
    pub ready: AtomicBool,
    /// This replica leads.
    pub leader: tokio::sync::watch::Receiver<bool>,
    /// OCI Events ingestion, when enabled.
    pub oci: Option<OciEvents>,
    /// The disruption engine's metrics (when it runs).
    pub engine: Option<Arc<crate::controller::metrics::EngineMetrics>>,
    /// The disruption engine (when it runs): OCI Events notices wait until it stored them.
    pub disruption: Option<Arc<crate::controller::engine::Engine>>,
    /// Webhook notifications (`[[controller.notify]]`), when configured.
    pub notifier: Option<Arc<crate::controller::act::notify::Notifier>>,
    /// Forbidden reports (another node).
    pub forbidden: AtomicU64,
    /// Unauthenticated requests.
    pub unauthenticated: AtomicU64,
    /// Permits for reports handled at once (`max_reports_in_flight`).
    pub in_flight: tokio::sync::Semaphore,
    /// A second allowance of the same size, for reports carrying notices past the first
    /// (`POST /v1/reports`: a notice is never turned away for the heartbeats in flight).
    pub notices_in_flight: tokio::sync::Semaphore,
    /// Reports answered 503 because `max_reports_in_flight` were being handled.
    pub shed: AtomicU64,
    /// Reports carrying notices handled past `max_reports_in_flight`, on the notices' allowance.
    pub notices_past_limit: AtomicU64,
    /// Open and refused connections of the report API (`/metrics`).
    pub connections: Arc<crate::serve::ConnectionStats>,
    /// Set when a task the controller cannot live without died: `/livez` then fails with it.
    pub dead: std::sync::OnceLock<String>,
    /// How late the process gets to run (`nodekeeper_scheduling_delay_seconds`).
    pub delay: Arc<crate::controller::cluster::delay::SchedulingDelay>,
    /// The largest body read (`max_report_bytes`): larger ones are answered 413.
    pub max_body: usize,
    /// Request bodies refused as too large (413) or too slow (408).
    pub bodies_refused: AtomicU64,
    /// Reports by report version, and those refused for theirs.
    pub versions: super::report_versions::ReportVersions,
}

/// How long a handler waits for a request body once it decided to read it (after
/// authentication and the permit): a caller holding a permit cannot keep it longer by sending
/// slowly. The agent's report (≤ `max_report_bytes`, 1 MiB by default) takes milliseconds.
pub const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Why a body was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyRefusal {
    /// Larger than the limit (its Content-Length, or the bytes sent): 413.
    TooLarge,
    /// Not complete within [`BODY_READ_TIMEOUT`]: 408.
    TooSlow,
    /// The connection failed or the framing was bad: 400.
    Broken,
}

impl BodyRefusal {
    /// The answer to the caller.
    pub fn response(self, limit: usize) -> Response {
        match self {
            BodyRefusal::TooLarge => err(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("body larger than {limit} bytes (max_report_bytes)"),
            ),
            BodyRefusal::TooSlow => err(
                StatusCode::REQUEST_TIMEOUT,
                format!("body not received within {} s", BODY_READ_TIMEOUT.as_secs()),
            ),
            BodyRefusal::Broken => err(StatusCode::BAD_REQUEST, "body could not be read"),
        }
    }
}

/// Refuses a body whose `Content-Length` is over `limit` from the headers alone.
pub fn declared_too_large(headers: &HeaderMap, limit: usize) -> Option<BodyRefusal> {
    let len = headers
        .get(axum::http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse::<u64>()
        .ok()?;
    (len > limit as u64).then_some(BodyRefusal::TooLarge)
}

/// Reads a body of at most `limit` bytes within `deadline`; stops reading at the first byte past
/// the limit.
pub async fn read_body(
    body: Body,
    limit: usize,
    deadline: std::time::Duration,
) -> Result<Bytes, BodyRefusal> {
    use http_body_util::BodyExt;
    let collect = http_body_util::Limited::new(body, limit).collect();
    match tokio::time::timeout(deadline, collect).await {
        Err(_) => Err(BodyRefusal::TooSlow),
        Ok(Ok(c)) => Ok(c.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(BodyRefusal::TooLarge),
        Ok(Err(_)) => Err(BodyRefusal::Broken),
    }
}

impl App {
    /// [`read_body`] with this API's limit; a refusal is counted and answered.
    pub async fn body(&self, body: Body) -> Result<Bytes, Response> {
        read_body(body, self.max_body, BODY_READ_TIMEOUT)
            .await
            .map_err(|r| self.refuse_body(r))
    }

    /// Counts and answers a refused body.
    pub fn refuse_body(&self, r: BodyRefusal) -> Response {
        self.bodies_refused.fetch_add(1, Ordering::Relaxed);
        r.response(self.max_body)
    }
}

/// A JSON error answer: `{"error": msg}` with `code`.
pub(crate) fn err(code: StatusCode, msg: impl Into<String>) -> Response {
    (code, Json(serde_json::json!({"error": msg.into()}))).into_response()
}

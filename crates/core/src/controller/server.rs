//! The report API: `POST /v1/reports`, `GET /livez`, `/readyz`, `/metrics`, and the OCI Events
//! endpoint, served by [`crate::serve`] over HTTPS (rustls, certificate and key from files) or,
//! when configured explicitly, plain HTTP.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use super::auth::{AuthError, Authenticator};
use super::metrics;
use super::nodestate::NodeStates;
use super::oci_events::OciEvents;

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
    pub engine: Option<Arc<super::metrics::EngineMetrics>>,
    /// The disruption engine (when it runs): OCI Events notices wait until it stored them.
    pub disruption: Option<Arc<super::engine::Engine>>,
    /// Webhook notifications (`[[controller.notify]]`), when configured.
    pub notifier: Option<Arc<super::notify::Notifier>>,
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
    pub delay: Arc<super::delay::SchedulingDelay>,
}

/// The router.
pub fn router(app: Arc<App>, max_body: usize) -> Router {
    let mut r = Router::new()
        .route("/v1/reports", post(report))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", {
            let registry = Arc::new(registry(&app));
            get(move || metrics(registry.clone()))
        });
    if let Some(oci) = &app.oci {
        let base = oci.path().trim_end_matches('/').to_string();
        r = r.route(&base, post(super::oci_events::handle)).route(
            &format!("{base}/{{token}}"),
            post(super::oci_events::handle_with_path_token),
        );
    }
    r.layer(DefaultBodyLimit::max(max_body)).with_state(app)
}

/// How long a report waits for its notices to be stored on the Node; those not stored by then
/// are left unacknowledged (the agent's request timeout is 5 s by default).
pub const REPORT_RECORD_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Default of `[controller] max_reports_in_flight`. A report whose token is cached takes a
/// millisecond or two, so a fleet's steady heartbeats stay far below it; the first reports of
/// thousands of agents starting together each wait for a TokenReview, and past this many they are
/// turned away at once (a few KiB each) instead of each holding a connection, its TLS state and a
/// pending review (≈ 85 KiB each at 5,000 nodes: docs/comparison.md).
pub const DEFAULT_MAX_REPORTS_IN_FLIGHT: usize = 256;

/// The `Retry-After` (seconds) of a report turned away by `max_reports_in_flight`. The agent waits
/// between one and two times this (its jitter), or its own backoff when longer (it doubles with
/// each failure), so a turned-away crowd spreads out and thins.
pub const REPORT_RETRY_AFTER_SECS: u64 = 2;

fn err(code: StatusCode, msg: impl Into<String>) -> Response {
    (code, Json(serde_json::json!({"error": msg.into()}))).into_response()
}

/// Whether a report's body carries notices (`events`), read without building them: a report past
/// `max_reports_in_flight` is turned away before its token is reviewed, unless it carries a
/// notice, which takes a permit of the notices' own allowance (as many again) instead. A body
/// that does not parse counts as carrying none (it is refused later, when it gets a permit).
fn carries_notices(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Peek {
        #[serde(default)]
        events: Vec<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Peek>(body).is_ok_and(|p| !p.events.is_empty())
}

async fn report(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    let received = tokio::time::Instant::now();
    let permit = match app.in_flight.try_acquire() {
        Ok(p) => Ok(p),
        Err(_) if carries_notices(&body) => app.notices_in_flight.try_acquire().inspect(|_| {
            app.notices_past_limit.fetch_add(1, Ordering::Relaxed);
        }),
        Err(e) => Err(e),
    };
    let Ok(_in_flight) = permit else {
        let shed = app.shed.fetch_add(1, Ordering::Relaxed) + 1;
        if shed.is_power_of_two() {
            tracing::warn!(
                shed,
                "max_reports_in_flight reports are being handled: answering 503 with Retry-After"
            );
        }
        let mut resp = err(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many reports in flight (max_reports_in_flight); retry after Retry-After",
        );
        resp.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from(REPORT_RETRY_AFTER_SECS),
        );
        return resp;
    };
    let authz = headers.get("authorization").and_then(|v| v.to_str().ok());
    let caller = match app.auth.authenticate(authz).await {
        Ok(c) => c,
        Err(e @ AuthError::Unauthenticated(_)) => {
            app.unauthenticated.fetch_add(1, Ordering::Relaxed);
            return err(StatusCode::UNAUTHORIZED, e.to_string());
        }
        Err(e @ AuthError::Forbidden(_)) => return err(StatusCode::FORBIDDEN, e.to_string()),
        Err(e @ AuthError::Upstream { .. }) => {
            return err(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
        }
    };
    let report = match crate::wire::parse_body(&body) {
        Ok(r) => r,
        Err(e) => return err(StatusCode::BAD_REQUEST, e.to_string()),
    };
    if report.node != caller.node {
        app.forbidden.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(caller_node = %caller.node, report_node = %report.node, pod = ?caller.pod,
            "rejected a report about another node");
        return err(
            StatusCode::FORBIDDEN,
            format!(
                "token is bound to node {}; a report about {} is not allowed",
                caller.node, report.node
            ),
        );
    }
    let events = report.events.clone();
    match app.states.handle(report, received).await {
        Ok(mut resp) => {
            if let Some(engine) = &app.disruption {
                // Acknowledged only once stored: a controller killed after the answer loses
                // nothing (the agent resends what is not acknowledged).
                let handled: Vec<_> = events
                    .into_iter()
                    .filter(|e| resp.acknowledged_events.contains(&e.id))
                    .collect();
                resp.acknowledged_events = engine
                    .recorded_ids(&caller.node, &handled, &app.leader, REPORT_RECORD_WAIT)
                    .await;
            }
            Json(resp).into_response()
        }
        Err(e) => err(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

async fn livez(State(app): State<Arc<App>>) -> Response {
    match app.dead.get() {
        None => "ok".into_response(),
        Some(why) => err(StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

async fn readyz(State(app): State<Arc<App>>) -> Response {
    if app.ready.load(Ordering::Relaxed) {
        "ok".into_response()
    } else {
        err(StatusCode::SERVICE_UNAVAILABLE, "node cache not synced yet")
    }
}

/// The controller's metrics registry: the report API's counters, then each component's
/// (notifier, engine) registered into it. `/metrics` encodes it.
pub fn registry(app: &Arc<App>) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ApiMetrics(app.clone())));
    app.delay.register(&mut registry);
    if let Some(n) = &app.notifier {
        n.register(&mut registry);
    }
    if let Some(m) = &app.engine {
        m.register(&mut registry);
    }
    registry
}

/// The report API's counters (kept as atomics by their owners), read at encode time.
struct ApiMetrics(Arc<App>);

impl std::fmt::Debug for ApiMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiMetrics")
    }
}

impl Collector for ApiMetrics {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let app = &self.0;
        let c = &app.states.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let counters = [
            (
                "nodekeeper_reports_total",
                "Reports accepted.",
                g(&c.reports),
            ),
            (
                "nodekeeper_report_replays_total",
                "Report replays ignored.",
                g(&c.replays),
            ),
            (
                "nodekeeper_reports_forbidden_total",
                "Reports refused: about another node than the token's.",
                g(&app.forbidden),
            ),
            (
                "nodekeeper_reports_unauthenticated_total",
                "Requests without a valid token.",
                g(&app.unauthenticated),
            ),
            (
                "nodekeeper_reports_shed_total",
                "Reports answered 503 with Retry-After because max_reports_in_flight were being handled.",
                g(&app.shed),
            ),
            (
                "nodekeeper_reports_notices_past_limit_total",
                "Reports carrying notices handled past max_reports_in_flight, on the notices' own allowance.",
                g(&app.notices_past_limit),
            ),
            (
                "nodekeeper_token_reviews_total",
                "TokenReviews sent to the API server.",
                g(&app.auth.reviews),
            ),
            (
                "nodekeeper_node_writes_total",
                "Node writes.",
                g(&c.node_writes),
            ),
            (
                "nodekeeper_node_write_failures_total",
                "Node writes that failed.",
                g(&c.write_failures),
            ),
            (
                "nodekeeper_node_events_total",
                "Events recorded about Nodes.",
                g(&c.node_events),
            ),
            (
                "nodekeeper_labels_removed_total",
                "Migration labels removed from Nodes.",
                g(&c.labels_removed),
            ),
            (
                "nodekeeper_nodes_marked_stale_total",
                "Nodes marked stale (agent not reporting).",
                g(&c.stale_marked),
            ),
        ];
        for (name, help, v) in counters {
            metrics::encode_counter(&mut enc, name, help, v)?;
        }
        let leader = i64::from(*app.leader.borrow());
        metrics::encode_gauge(
            &mut enc,
            "nodekeeper_leader",
            "1 while this replica leads.",
            leader,
        )?;
        let conns = &app.connections;
        metrics::encode_gauge(
            &mut enc,
            "nodekeeper_connections_open",
            "Connections of the report API open now.",
            g(&conns.open) as i64,
        )?;
        metrics::encode_gauge(
            &mut enc,
            "nodekeeper_connections_max",
            "The limit of open connections (max_connections).",
            g(&conns.max) as i64,
        )?;
        metrics::encode_counter(
            &mut enc,
            "nodekeeper_connections_refused_total",
            "Connections closed at accept because max_connections were open.",
            g(&conns.refused),
        )?;
        metrics::encode_counter(
            &mut enc,
            "nodekeeper_connections_accepted_total",
            "Connections accepted (with TLS: handshakes).",
            g(&conns.accepted),
        )?;
        metrics::encode_counter(
            &mut enc,
            "nodekeeper_tls_resumed_total",
            "TLS handshakes that resumed an earlier session.",
            g(&conns.resumed),
        )
    }
}

async fn metrics(registry: Arc<Registry>) -> Response {
    (
        [("content-type", metrics::CONTENT_TYPE)],
        metrics::encode(&registry),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::carries_notices;

    #[test]
    fn a_body_carries_notices_when_its_events_are_not_empty() {
        let cases: [(&[u8], bool); 6] = [
            (br#"{"version":1,"node":"n0","events":[{"id":"a"}]}"#, true),
            (br#"{"events":[{}, {}],"node":"n0"}"#, true),
            (br#"{"version":1,"node":"n0","events":[]}"#, false),
            (br#"{"version":1,"node":"n0"}"#, false),
            (br#"{"version":1,"events":"#, false),
            (b"not json", false),
        ];
        for (body, want) in cases {
            assert_eq!(
                carries_notices(body),
                want,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }
}

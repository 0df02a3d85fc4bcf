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

use super::auth::{AuthError, Authenticator};
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
    /// Open and refused connections of the report API (`/metrics`).
    pub connections: Arc<crate::serve::ConnectionStats>,
    /// Set when a task the controller cannot live without died: `/livez` then fails with it.
    pub dead: std::sync::OnceLock<String>,
}

/// The router.
pub fn router(app: Arc<App>, max_body: usize) -> Router {
    let mut r = Router::new()
        .route("/v1/reports", post(report))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics));
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

fn err(code: StatusCode, msg: impl Into<String>) -> Response {
    (code, Json(serde_json::json!({"error": msg.into()}))).into_response()
}

async fn report(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    let authz = headers.get("authorization").and_then(|v| v.to_str().ok());
    let caller = match app.auth.authenticate(authz).await {
        Ok(c) => c,
        Err(e @ AuthError::Unauthenticated(_)) => {
            app.unauthenticated.fetch_add(1, Ordering::Relaxed);
            return err(StatusCode::UNAUTHORIZED, e.to_string());
        }
        Err(e @ AuthError::Forbidden(_)) => return err(StatusCode::FORBIDDEN, e.to_string()),
        Err(e @ AuthError::Upstream(_)) => {
            return err(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
        }
    };
    let report = match crate::report::parse_body(&body) {
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
    match app.states.handle(report).await {
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

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let c = &app.states.counters;
    let g = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let leader = u8::from(*app.leader.borrow());
    let text = format!(
        "# TYPE nodekeeper_reports_total counter\nnodekeeper_reports_total {}\n\
         # TYPE nodekeeper_report_replays_total counter\nnodekeeper_report_replays_total {}\n\
         # TYPE nodekeeper_reports_forbidden_total counter\nnodekeeper_reports_forbidden_total {}\n\
         # TYPE nodekeeper_reports_unauthenticated_total counter\nnodekeeper_reports_unauthenticated_total {}\n\
         # TYPE nodekeeper_token_reviews_total counter\nnodekeeper_token_reviews_total {}\n\
         # TYPE nodekeeper_node_writes_total counter\nnodekeeper_node_writes_total {}\n\
         # TYPE nodekeeper_node_write_failures_total counter\nnodekeeper_node_write_failures_total {}\n\
         # TYPE nodekeeper_node_events_total counter\nnodekeeper_node_events_total {}\n\
         # TYPE nodekeeper_labels_removed_total counter\nnodekeeper_labels_removed_total {}\n\
         # TYPE nodekeeper_nodes_marked_stale_total counter\nnodekeeper_nodes_marked_stale_total {}\n\
         # TYPE nodekeeper_leader gauge\nnodekeeper_leader {leader}\n\
         # TYPE nodekeeper_connections_open gauge\nnodekeeper_connections_open {}\n\
         # TYPE nodekeeper_connections_max gauge\nnodekeeper_connections_max {}\n\
         # TYPE nodekeeper_connections_refused_total counter\nnodekeeper_connections_refused_total {}\n",
        g(&c.reports), g(&c.replays), g(&app.forbidden), g(&app.unauthenticated),
        g(&app.auth.reviews), g(&c.node_writes), g(&c.write_failures), g(&c.node_events),
        g(&c.labels_removed), g(&c.stale_marked),
        g(&app.connections.open), g(&app.connections.max), g(&app.connections.refused),
    );
    let mut text = text;
    if let Some(n) = &app.notifier {
        text.push_str(&n.metrics_text());
    }
    if let Some(m) = &app.engine {
        text.push_str(&m.render());
    }
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}

//! The report API: `POST /v1/reports`, `GET /livez`, `/readyz`, `/metrics`, and the OCI Events
//! endpoint, served by [`crate::serve`] over HTTPS (rustls, certificate and key from files) or,
//! when configured explicitly, plain HTTP.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use futures::future::Either;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use crate::controller::api::app::{declared_too_large, err, App};
use crate::controller::api::auth::AuthError;
use crate::controller::metrics;

/// The router. Its handlers read their bodies themselves ([`read_body`](super::app::read_body)), after the caller is
/// authenticated and holds a permit, so nothing is buffered for a caller that is refused.
pub fn router(app: Arc<App>) -> Router {
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
        r = r
            .route(
                &base,
                post(crate::controller::api::oci_events::handler::handle),
            )
            .route(
                &format!("{base}/{{token}}"),
                post(crate::controller::api::oci_events::handler::handle_with_path_token),
            );
    }
    r.with_state(app)
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

/// 503 with `Retry-After`: `max_reports_in_flight` reports are being handled.
fn shed(app: &App) -> Response {
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
    resp
}

fn auth_refusal(app: &App, e: AuthError) -> Response {
    match e {
        AuthError::Unauthenticated(_) => {
            app.unauthenticated.fetch_add(1, Ordering::Relaxed);
            err(StatusCode::UNAUTHORIZED, e.to_string())
        }
        AuthError::Forbidden(_) => err(StatusCode::FORBIDDEN, e.to_string()),
        AuthError::Upstream { .. } => err(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// `POST /v1/reports`. The order bounds what a caller costs before it is known: the headers
/// alone refuse a declared oversized body (413) and a request without a bearer token (401); a
/// token the cache knows authenticates at once; then a permit of `max_reports_in_flight` (else
/// 503) before a TokenReview or any byte of the body; the body is read last, with the limit and
/// [`BODY_READ_TIMEOUT`]. Past `max_reports_in_flight` a report may still carry a notice: it
/// takes a permit of the notices' allowance, and only then is its body read to see (so at most
/// 2 × `max_reports_in_flight` bodies are ever being read, whatever the connections).
async fn report(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let received = tokio::time::Instant::now();
    if let Some(r) = declared_too_large(&headers, app.max_body) {
        return app.refuse_body(r);
    }
    let authz = headers.get("authorization").and_then(|v| v.to_str().ok());
    let cached = match app.auth.cached(authz) {
        Ok(c) => c,
        Err(e) => return auth_refusal(&app, e),
    };
    let (_permit, body) = match app.in_flight.try_acquire() {
        Ok(p) => (p, Either::Left(body)),
        Err(_) => {
            let Ok(p) = app.notices_in_flight.try_acquire() else {
                return shed(&app);
            };
            let bytes = match app.body(body).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            if !carries_notices(&bytes) {
                return shed(&app);
            }
            app.notices_past_limit.fetch_add(1, Ordering::Relaxed);
            (p, Either::Right(bytes))
        }
    };
    let caller = match cached {
        Some(c) => c,
        None => match app.auth.authenticate(authz).await {
            Ok(c) => c,
            Err(e) => return auth_refusal(&app, e),
        },
    };
    let body = match body {
        Either::Right(b) => b,
        Either::Left(unread) => match app.body(unread).await {
            Ok(b) => b,
            Err(r) => return r,
        },
    };
    let (version, report) = match crate::wire::parse_versioned(&body) {
        Ok(r) => r,
        Err(e @ crate::wire::BodyError::Version(_)) => {
            app.versions.refused();
            return (
                StatusCode::BAD_REQUEST,
                Json(serde_json::json!({
                    "error": e.to_string(),
                    "accepted_versions": crate::wire::ACCEPTED_REPORT_VERSIONS,
                })),
            )
                .into_response();
        }
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
    if let Err(e) = app.states.check_limits(&report) {
        return (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({"error": e.to_string(), "limit": e.limit.as_str()})),
        )
            .into_response();
    }
    let deprecated = app
        .versions
        .taken(&report.node, version, &report.agent_version);
    let events = report.events.clone();
    if let Some(engine) = &app.disruption {
        engine.agent_reported(&report.node, &report.boot_id);
    }
    let answer = match app.states.handle(report, received).await {
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
    };
    with_warning(answer, deprecated)
}

/// `answer` with an RFC 9111 `Warning: 299 - "TEXT"` header (as kube-apiserver warns about a
/// deprecated API) when there is a warning.
fn with_warning(mut answer: Response, warning: Option<String>) -> Response {
    if let Some(text) = warning {
        let quoted = format!("299 - \"{}\"", text.replace(['"', '\\'], "'"));
        if let Ok(v) = axum::http::HeaderValue::from_str(&quoted) {
            answer.headers_mut().insert(axum::http::header::WARNING, v);
        }
    }
    answer
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
                "nodekeeper_oci_events_unauthorized_total",
                "OCI Events deliveries refused 401: no or a wrong secret (path segment, Basic authentication).",
                app.oci.as_ref().map_or(0, |o| g(&o.unauthorized)),
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
                "nodekeeper_request_bodies_refused_total",
                "Request bodies refused unread or cut: larger than max_report_bytes (413) or not received in time (408).",
                g(&app.bodies_refused),
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
                "nodekeeper_node_events_suppressed_total",
                "Events about Nodes not recorded: over the node's Event rate (events_burst, events_every).",
                g(&c.events_suppressed),
            ),
            (
                "nodekeeper_notices_deferred_total",
                "New notices not taken (nor acknowledged, so resent) over the node's notice rate (notices_burst, notices_every).",
                g(&c.notices_deferred),
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
        app.versions.encode(&mut enc)?;
        metrics::encode_family(
            &mut enc,
            metrics::counter_name("nodekeeper_reports_over_limit_total"),
            "Reports refused (400) over a [controller.report_limits] limit, by limit.",
            prometheus_client::metrics::MetricType::Counter,
            crate::controller::state::limits::Limit::ALL
                .iter()
                .zip(&c.over_limit)
                .map(|(l, n)| {
                    (
                        [("limit", l.as_str())],
                        prometheus_client::metrics::counter::ConstCounter::new(g(n)),
                    )
                }),
        )?;
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

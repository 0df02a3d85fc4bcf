//! The OCI Notifications endpoint's handlers: `POST <path>` and `POST <path>/<token>`, the
//! headers checked before the body is read, then the delivery parsed ([`super::parse`]) and its
//! notice stored through the engine.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::{confirm_subscription, parse, OciEvents, Refusal, CHALLENGE};
use crate::controller::api::app::{declared_too_large, App};

/// `POST <path>` (Basic authentication, or the opt-in header).
pub async fn handle(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let Some(oci) = &app.oci else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let authorized = oci.authorized(None, &headers);
    read_then_process(&app, oci, authorized, &headers, body).await
}

/// `POST <path>/<token>`.
pub async fn handle_with_path_token(
    State(app): State<Arc<App>>,
    Path(token): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Some(oci) = &app.oci else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let authorized = oci.authorized(Some(&token), &headers);
    read_then_process(&app, oci, authorized, &headers, body).await
}

/// The headers first (a declared oversized body: 413; a missing or wrong secret: 401), then the
/// body with the report API's limit and deadline: a caller without the secret costs O(headers).
async fn read_then_process(
    app: &App,
    oci: &OciEvents,
    authorized: bool,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    if let Some(r) = declared_too_large(headers, app.max_body) {
        return app.refuse_body(r);
    }
    if !authorized {
        oci.unauthorized
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // No body: nothing of the request is echoed to a caller without the secret.
        return (
            StatusCode::UNAUTHORIZED,
            [(axum::http::header::WWW_AUTHENTICATE, CHALLENGE)],
        )
            .into_response();
    }
    match app.body(body).await {
        Ok(b) => process(app, oci, headers, &b).await,
        Err(r) => r,
    }
}

async fn process(app: &App, oci: &OciEvents, headers: &HeaderMap, body: &[u8]) -> Response {
    let v: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(json!({"error": format!("body: not JSON: {e}"), "field": "body"})),
            )
                .into_response()
        }
    };
    let confirm = headers
        .get("x-oci-ns-confirmationurl")
        .and_then(|h| h.to_str().ok())
        .map(str::to_string)
        .or_else(|| {
            v.get("ConfirmationURL")
                .and_then(Value::as_str)
                .map(str::to_string)
        });
    if let Some(url) = confirm {
        return confirm_subscription(oci, &url).await;
    }
    let parsed = match parse(&v) {
        Ok(p) => p,
        Err(Refusal::Ignored(why)) => {
            return (StatusCode::OK, Json(json!({"ignored": why}))).into_response()
        }
        Err(r @ Refusal::Malformed { field, .. }) => {
            tracing::warn!(field, error = %r, "malformed OCI Events envelope");
            return (
                StatusCode::BAD_REQUEST,
                Json(json!({"error": r.to_string(), "field": field})),
            )
                .into_response();
        }
    };
    if !app.ready.load(std::sync::atomic::Ordering::Relaxed) {
        // The node cache is not filled yet (a controller just started): the event's Node may be
        // missing from it only for now. 503 makes OCI Notifications deliver it again.
        tracing::info!(instance = %parsed.instance, "OCI event before the node cache synced: retry later");
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [("retry-after", "1")],
            Json(json!({"error": "node cache not synced yet; retry"})),
        )
            .into_response();
    }
    let Some(node) = oci.node_for(&parsed.instance) else {
        if oci.first_unknown(&parsed.instance) {
            tracing::warn!(instance = %parsed.instance, "OCI event for an instance that is no Node (logged once per instance)");
        }
        return (
            StatusCode::OK,
            Json(json!({"ignored": format!("no node has providerID {}", parsed.instance)})),
        )
            .into_response();
    };
    let id = parsed.event.id.clone();
    let Some(engine) = &app.disruption else {
        // Without the disruption engine a notice only becomes an Event: nothing to wait for.
        let new = app.states.ingest_event(&node, parsed.event).await;
        tracing::info!(%node, id, new, "OCI event ingested");
        return Json(json!({"node": node, "id": id, "new": new})).into_response();
    };
    if !*app.leader.borrow() {
        // Only the leader writes; OCI Notifications retries (immediately, then with backoff),
        // and the Service spreads the retries over the replicas.
        return unavailable(
            &node,
            &id,
            &crate::controller::engine::NotRecorded::NotLeader,
        );
    }
    let ev = parsed.event.clone();
    let new = app.states.ingest_event(&node, parsed.event).await;
    if !new {
        // A redelivery: the notice may have been lost before it was stored (a failed write).
        engine.renotice(&node, &ev);
    }
    match engine
        .record_notice(&node, &ev, &app.leader, RECORD_TIMEOUT)
        .await
    {
        Ok(r) => {
            let recorded = r == crate::controller::engine::Recorded::OnNode;
            tracing::info!(%node, id, new, recorded, "OCI event ingested");
            Json(
                json!({"node": node, "id": id, "new": new, "recorded": recorded,
                "dry_run": r == crate::controller::engine::Recorded::DryRun}),
            )
            .into_response()
        }
        Err(e) => unavailable(&node, &id, &e),
    }
}

/// How long a delivery waits for its notice to be stored on the Node before a 503.
pub const RECORD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// 503 (OCI Notifications retries it) naming why the notice is not stored.
fn unavailable(node: &str, id: &str, why: &crate::controller::engine::NotRecorded) -> Response {
    tracing::warn!(node, id, error = %why, "OCI event not recorded: answering 503 for a retry");
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(axum::http::header::RETRY_AFTER, "1")],
        Json(json!({"error": format!("notice not recorded: {why}"), "node": node, "id": id})),
    )
        .into_response()
}

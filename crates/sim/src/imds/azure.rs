//! Azure IMDS Scheduled Events: every request needs `Metadata: true` and no `X-Forwarded-For`
//! (else 400) and an `api-version` query (else 400). `POST /metadata/scheduledevents` with
//! `{"StartRequests":[{"EventId":…}]}` approves events (400 if malformed).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use axum::Router;
use serde::Deserialize;

use super::{json, query_param, text, Pending, Shared};

/// The Scheduled Events endpoint, from Azure's documentation ("Azure Metadata Service: Scheduled
/// Events"); the emulator's own copy, never the agent's.
const EVENTS_PATH: &str = "/metadata/scheduledevents";

/// The emulated VM's name (events list it in `Resources`).
pub const VM_NAME: &str = "nodekeeper-vm";
/// The emulated VM's id.
pub const VM_ID: &str = "02aab8a4-74ef-476e-8182-f6d2ba4166a6";

pub(super) fn router() -> Router<Arc<Shared>> {
    Router::new().fallback(handle)
}

fn bad(msg: &str) -> Response {
    text(
        StatusCode::BAD_REQUEST,
        format!("{{\"error\":\"Bad request\",\"message\":\"{msg}\"}}\n"),
    )
}

async fn handle(
    State(s): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if headers.contains_key("x-forwarded-for") {
        return bad("Request contains X-Forwarded-For header");
    }
    if headers.get("metadata").and_then(|v| v.to_str().ok()) != Some("true") {
        return bad("Required metadata header not specified");
    }
    if query_param(&uri, "api-version").is_none_or(|v| v.is_empty()) {
        return bad("Required parameter 'api-version' is missing");
    }
    match (method, uri.path()) {
        (Method::GET, EVENTS_PATH) => events(&s),
        (Method::POST, EVENTS_PATH) => start_requests(&s, &body),
        (Method::GET, "/metadata/instance/compute") => json(&compute()),
        (Method::GET, "/metadata/instance") => {
            json(&serde_json::json!({ "compute": compute(), "network": {} }))
        }
        (Method::GET, _) => text(StatusCode::NOT_FOUND, "Not Found\n"),
        _ => text(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n"),
    }
}

fn compute() -> serde_json::Value {
    serde_json::json!({
        "name": VM_NAME, "vmId": VM_ID, "location": "westeurope", "zone": "1",
        "vmSize": "Standard_D2s_v5", "priority": "Spot", "evictionPolicy": "Delete",
        "osType": "Linux", "resourceGroupName": "nodekeeper-rg"
    })
}

fn event(p: &Pending, event_type: &str, duration: i64) -> serde_json::Value {
    serde_json::json!({
        "EventId": p.id,
        "EventType": event_type,
        "ResourceType": "VirtualMachine",
        "Resources": [VM_NAME],
        "EventStatus": if p.started { "Started" } else { "Scheduled" },
        "NotBefore": if p.started { String::new() } else { p.at.format("%a, %d %b %Y %H:%M:%S GMT").to_string() },
        "Description": "emulated event",
        "EventSource": "Platform",
        "DurationInSeconds": duration,
    })
}

fn events(s: &Shared) -> Response {
    let g = s.lock();
    let mut list = Vec::new();
    if let Some(p) = &g.preempt {
        list.push(event(p, "Preempt", -1));
    }
    if let Some(m) = &g.maintenance {
        list.push(event(m, &m.code, 9));
    }
    json(&serde_json::json!({ "DocumentIncarnation": g.incarnation, "Events": list }))
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct StartRequests {
    start_requests: Vec<StartRequest>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct StartRequest {
    event_id: String,
}

fn start_requests(s: &Shared, body: &[u8]) -> Response {
    let Ok(req) = serde_json::from_slice::<StartRequests>(body) else {
        return bad("Malformed StartRequests");
    };
    s.update(|i| {
        for r in req.start_requests {
            for p in [&mut i.preempt, &mut i.maintenance].into_iter().flatten() {
                if p.id == r.event_id {
                    p.started = true;
                }
            }
            i.acks.push(r.event_id);
        }
        i.incarnation += 1;
    });
    text(StatusCode::OK, "")
}

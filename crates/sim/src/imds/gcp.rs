//! GCP metadata server: every request needs `Metadata-Flavor: Google` and no `X-Forwarded-For`
//! (else 403); answers carry `Metadata-Flavor: Google` and an `ETag`. `?wait_for_change=true`
//! holds the request until the value's ETag differs from `last_etag` (or from the ETag at the
//! time of the request) or `timeout_sec` passes.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use sha2::{Digest, Sha256};

use super::{query_param, text, Shared};

/// The metadata server's root, from Google's documentation ("About VM metadata"); the
/// emulator's own copy, never the agent's.
const BASE: &str = "/computeMetadata/v1/";

/// The emulated instance id.
pub const INSTANCE_ID: &str = "4520031799277581759";

pub(super) fn router() -> Router<Arc<Shared>> {
    Router::new().fallback(handle)
}

fn value(s: &Shared, key: &str) -> Option<String> {
    let g = s.lock();
    Some(match key {
        "instance/preempted" => if g.preempt.is_some() { "TRUE" } else { "FALSE" }.to_string(),
        "instance/maintenance-event" => g
            .maintenance
            .as_ref()
            .map_or("NONE".to_string(), |m| m.code.clone()),
        "instance/id" => INSTANCE_ID.to_string(),
        "instance/name" => "nodekeeper-vm".to_string(),
        "instance/zone" => "projects/123456789/zones/us-central1-a".to_string(),
        "instance/machine-type" => "projects/123456789/machineTypes/e2-standard-4".to_string(),
        "instance/scheduling/preemptible" => "TRUE".to_string(),
        "instance/hostname" => "nodekeeper-vm.us-central1-a.c.project.internal".to_string(),
        _ => return None,
    })
}

fn etag(v: &str) -> String {
    hex::encode(&Sha256::digest(v.as_bytes())[..8])
}

fn answer(v: String) -> Response {
    let tag = etag(&v);
    (
        StatusCode::OK,
        [
            ("metadata-flavor", "Google"),
            ("etag", tag.as_str()),
            ("content-type", "application/text"),
        ],
        v,
    )
        .into_response()
}

async fn handle(
    State(s): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if headers.contains_key("x-forwarded-for")
        || headers.get("metadata-flavor").and_then(|v| v.to_str().ok()) != Some("Google")
    {
        return text(
            StatusCode::FORBIDDEN,
            "Forbidden: missing Metadata-Flavor: Google header\n",
        );
    }
    if method != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n");
    }
    let Some(key) = uri.path().strip_prefix(BASE) else {
        return text(StatusCode::NOT_FOUND, "Not Found\n");
    };
    let key = key.trim_end_matches('/').to_string();
    let mut changes = s.subscribe();
    let Some(mut v) = value(&s, &key) else {
        return text(StatusCode::NOT_FOUND, "Not Found\n");
    };
    if query_param(&uri, "wait_for_change").as_deref() != Some("true") {
        return answer(v);
    }
    let last = query_param(&uri, "last_etag").unwrap_or_else(|| etag(&v));
    let timeout = query_param(&uri, "timeout_sec")
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap_or(300)
        .clamp(1, 3600);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
    while etag(&v) == last {
        match tokio::time::timeout_at(deadline, changes.changed()).await {
            Ok(Ok(())) => v = value(&s, &key).unwrap_or_default(),
            Ok(Err(_)) | Err(_) => break,
        }
    }
    answer(v)
}

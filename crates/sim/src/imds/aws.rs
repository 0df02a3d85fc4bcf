//! AWS EC2 IMDS in IMDSv2-required mode: `PUT /latest/api/token` with
//! `X-aws-ec2-metadata-token-ttl-seconds` (1..=21600, else 400) returns a token, and the granted
//! TTL in the same header (NTH refuses a token answer without it); every GET needs a valid,
//! unexpired `X-aws-ec2-metadata-token` (else 401); requests with `X-Forwarded-For` are refused
//! (403). Notices are shaped as Amazon's EC2 metadata mock (AEMM) v1.13.0 serves them, the real
//! peer of the agent's AWS source (`tests/host/aemm_netns.rs`): scheduled events' times in the Go
//! layout `2 Jan 2006 15:04:05 GMT` (day not padded) with `NotBeforeDeadline`, IMDS's XHTML 404
//! page, and the legacy `spot/termination-time`. Where they differ is in `docs/sources.md`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use axum::Router;
use rand::Rng;

use super::{forwarded, json, text, Shared};

// The emulator's own copy of IMDS's paths and headers, from AWS's documentation ("Use IMDSv2",
// "Spot Instance interruption notices", "Rebalance recommendations", "Scheduled events",
// "Instance identity documents"), never the agent's constants: a wrong path in the agent must
// fail a test, not be mirrored here.
const TOKEN_PATH: &str = "/latest/api/token";
const TTL_HEADER: &str = "X-aws-ec2-metadata-token-ttl-seconds";
const TOKEN_HEADER: &str = "X-aws-ec2-metadata-token";
/// The Spot interruption notice.
pub const SPOT_PATH: &str = "/latest/meta-data/spot/instance-action";
const TERMINATION_TIME_PATH: &str = "/latest/meta-data/spot/termination-time";
const REBALANCE_PATH: &str = "/latest/meta-data/events/recommendations/rebalance";
/// Scheduled maintenance events.
pub const SCHEDULED_PATH: &str = "/latest/meta-data/events/maintenance/scheduled";
const LIFECYCLE_PATH: &str = "/latest/meta-data/instance-life-cycle";
const IDENTITY_PATH: &str = "/latest/dynamic/instance-identity/document";

/// The emulated instance.
pub const INSTANCE_ID: &str = "i-0123456789abcdef0";

pub(super) fn router() -> Router<Arc<Shared>> {
    Router::new().fallback(handle)
}

async fn handle(
    State(s): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if forwarded(&headers) {
        return text(StatusCode::FORBIDDEN, "Forbidden\n");
    }
    match (method, uri.path()) {
        (Method::PUT, TOKEN_PATH) => token(&s, &headers),
        (Method::GET, path) => match authorized(&s, &headers) {
            true => get(&s, path),
            false => text(StatusCode::UNAUTHORIZED, "Unauthorized\n"),
        },
        _ => text(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n"),
    }
}

fn token(s: &Shared, headers: &HeaderMap) -> Response {
    let ttl = headers
        .get(TTL_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let Some(ttl) = ttl.filter(|t| (1..=21600).contains(t)) else {
        return text(StatusCode::BAD_REQUEST, "Bad Request\n");
    };
    let mut raw = [0u8; 32];
    rand::rng().fill(&mut raw[..]);
    let tok = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, raw);
    s.update(|i| {
        let now = Instant::now();
        i.tokens.retain(|_, exp| *exp > now);
        i.tokens.insert(tok.clone(), now + Duration::from_secs(ttl));
    });
    let mut resp = text(StatusCode::OK, tok);
    resp.headers_mut()
        .insert(TTL_HEADER, axum::http::HeaderValue::from(ttl));
    resp
}

fn authorized(s: &Shared, headers: &HeaderMap) -> bool {
    let Some(tok) = headers.get(TOKEN_HEADER).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    s.lock()
        .tokens
        .get(tok)
        .is_some_and(|exp| *exp > Instant::now())
}

fn iso(t: chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// IMDS's 404 page (as AEMM serves it).
const NOT_FOUND_PAGE: &str = r#"<?xml version="1.0" encoding="iso-8859-1"?>
<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Transitional//EN"
	"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">
<html xmlns="http://www.w3.org/1999/xhtml" xml:lang="en" lang="en">
 <head>
  <title>404 - Not Found</title>
 </head>
 <body>
  <h1>404 - Not Found</h1>
 </body>
</html>
"#;

/// Scheduled events' time layout: Go's `2 Jan 2006 15:04:05 GMT`, the day of the month not
/// padded (AEMM; NTH parses with the same layout).
const EVENT_TIME: &str = "%-d %b %Y %H:%M:%S GMT";

fn get(s: &Shared, path: &str) -> Response {
    let g = s.lock();
    let not_found = || text(StatusCode::NOT_FOUND, NOT_FOUND_PAGE);
    match path {
        SPOT_PATH => match &g.preempt {
            Some(p) => json(&serde_json::json!({ "action": p.code, "time": iso(p.at) })),
            None => not_found(),
        },
        TERMINATION_TIME_PATH => match &g.preempt {
            Some(p) => text(StatusCode::OK, iso(p.at)),
            None => not_found(),
        },
        REBALANCE_PATH => match &g.rebalance {
            Some(p) => json(&serde_json::json!({ "noticeTime": iso(p.at) })),
            None => not_found(),
        },
        SCHEDULED_PATH => {
            let events: Vec<_> = g
                .maintenance
                .iter()
                .map(|m| {
                    let after = |h: i64| {
                        m.at.checked_add_signed(chrono::Duration::hours(h))
                            .unwrap_or(m.at)
                            .format(EVENT_TIME)
                            .to_string()
                    };
                    serde_json::json!({
                        "NotBefore": m.at.format(EVENT_TIME).to_string(),
                        "Code": m.code,
                        "Description": "scheduled maintenance (emulated)",
                        "EventId": format!("instance-event-{}", m.id),
                        "NotAfter": after(2),
                        "NotBeforeDeadline": after(1),
                        "State": if m.canceled { "canceled" } else { "active" },
                    })
                })
                .collect();
            json(&serde_json::Value::Array(events))
        }
        LIFECYCLE_PATH => text(StatusCode::OK, "spot"),
        "/latest/meta-data/instance-id" => text(StatusCode::OK, INSTANCE_ID),
        "/latest/meta-data/instance-type" => text(StatusCode::OK, "m5.large"),
        "/latest/meta-data/placement/availability-zone" => text(StatusCode::OK, "us-east-1a"),
        IDENTITY_PATH => json(&serde_json::json!({
            "accountId": "123456789012", "architecture": "x86_64", "availabilityZone": "us-east-1a",
            "imageId": "ami-0123456789abcdef0", "instanceId": INSTANCE_ID, "instanceType": "m5.large",
            "pendingTime": "2026-01-01T00:00:00Z", "privateIp": "10.0.0.10", "region": "us-east-1", "version": "2017-09-30"
        })),
        _ => not_found(),
    }
}

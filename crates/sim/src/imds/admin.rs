//! `/admin/`: inject notices, cancellations, latency and errors.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;

use super::{json, text, CancelWhat, Faults, Inner, Pending, Shared};
use nodekeeper_core::wire::Cloud;

pub(super) fn router() -> Router<Arc<Shared>> {
    Router::new()
        .route("/preempt", post(preempt_h))
        .route("/maintenance", post(maintenance_h))
        .route("/rebalance", post(rebalance_h))
        .route("/cancel", post(cancel_h))
        .route("/latency", post(latency_h))
        .route("/errors", post(errors_h))
        .route("/expire-tokens", post(expire_h))
        .route("/acks", get(acks_h))
}

fn body<T: for<'de> Deserialize<'de> + Default>(b: &Bytes) -> Result<T, String> {
    if b.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(b).map_err(|e| format!("bad admin request: {e}\n"))
}

fn pending(inner: &mut Inner, prefix: &str, after: Duration, code: String) -> Pending {
    let now = chrono::Utc::now();
    let at = chrono::Duration::from_std(after)
        .ok()
        .and_then(|d| now.checked_add_signed(d))
        .unwrap_or(now);
    Pending {
        id: Shared::next_id(inner, prefix),
        at,
        code,
        canceled: false,
        started: false,
    }
}

/// Sets a preemption notice.
pub(super) fn preempt(shared: &Shared, after: Duration) {
    shared.update(|i| {
        let code = match shared.cloud {
            Cloud::Aws => "terminate",
            Cloud::Azure => "Preempt",
            Cloud::Oci => "TERMINATE",
            Cloud::Gcp => "TRUE",
        };
        i.preempt = Some(pending(i, "preempt", after, code.to_string()));
        i.incarnation += 1;
    });
}

/// Sets a maintenance event.
pub(super) fn maintenance(shared: &Shared, after: Duration, code: &str) {
    let default = match shared.cloud {
        Cloud::Aws => "system-reboot",
        Cloud::Azure => "Reboot",
        Cloud::Oci => "REBOOT_MIGRATION",
        Cloud::Gcp => "MIGRATE_ON_HOST_MAINTENANCE",
    };
    let code = if code.is_empty() { default } else { code }.to_string();
    shared.update(|i| {
        i.maintenance = Some(pending(i, "maint", after, code));
        i.incarnation += 1;
    });
}

/// Sets a rebalance recommendation.
pub(super) fn rebalance(shared: &Shared) {
    shared.update(|i| {
        i.rebalance = Some(pending(i, "rebalance", Duration::ZERO, String::new()));
        i.incarnation += 1;
    });
}

/// Withdraws notices. AWS keeps a cancelled maintenance event listed as `canceled`.
pub(super) fn cancel(shared: &Shared, what: CancelWhat) {
    let aws = shared.cloud == Cloud::Aws;
    shared.update(|i| {
        if matches!(what, CancelWhat::Preempt | CancelWhat::All) {
            i.preempt = None;
        }
        if matches!(what, CancelWhat::Rebalance | CancelWhat::All) {
            i.rebalance = None;
        }
        if matches!(what, CancelWhat::Maintenance | CancelWhat::All) {
            match (&mut i.maintenance, aws) {
                (Some(m), true) => m.canceled = true,
                _ => i.maintenance = None,
            }
        }
        i.incarnation += 1;
    });
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct When {
    in_secs: u64,
    code: String,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Cancel {
    what: Option<CancelWhat>,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Latency {
    ms: u64,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Errors {
    status: Option<u16>,
    count: Option<u32>,
    garbage: bool,
}

fn ok() -> Response {
    text(StatusCode::OK, "ok\n")
}

async fn preempt_h(State(s): State<Arc<Shared>>, b: Bytes) -> Response {
    match body::<When>(&b) {
        Ok(w) => {
            preempt(
                &s,
                Duration::from_secs(if w.in_secs == 0 { 120 } else { w.in_secs }),
            );
            ok()
        }
        Err(msg) => text(StatusCode::BAD_REQUEST, msg),
    }
}

async fn maintenance_h(State(s): State<Arc<Shared>>, b: Bytes) -> Response {
    match body::<When>(&b) {
        Ok(w) => {
            maintenance(
                &s,
                Duration::from_secs(if w.in_secs == 0 { 600 } else { w.in_secs }),
                &w.code,
            );
            ok()
        }
        Err(msg) => text(StatusCode::BAD_REQUEST, msg),
    }
}

async fn rebalance_h(State(s): State<Arc<Shared>>) -> Response {
    rebalance(&s);
    ok()
}

async fn cancel_h(State(s): State<Arc<Shared>>, b: Bytes) -> Response {
    match body::<Cancel>(&b) {
        Ok(c) => {
            cancel(&s, c.what.unwrap_or(CancelWhat::All));
            ok()
        }
        Err(msg) => text(StatusCode::BAD_REQUEST, msg),
    }
}

async fn latency_h(State(s): State<Arc<Shared>>, b: Bytes) -> Response {
    match body::<Latency>(&b) {
        Ok(l) => {
            s.update(|i| i.latency = Duration::from_millis(l.ms));
            ok()
        }
        Err(msg) => text(StatusCode::BAD_REQUEST, msg),
    }
}

async fn errors_h(State(s): State<Arc<Shared>>, b: Bytes) -> Response {
    match body::<Errors>(&b) {
        Ok(e) => {
            let status = e.status.unwrap_or(503);
            if !(100..=599).contains(&status) {
                return text(StatusCode::BAD_REQUEST, "status must be 100..=599\n");
            }
            let f = Faults {
                status,
                garbage: e.garbage,
                remaining: e.count.unwrap_or(1),
            };
            s.update(|i| i.faults = f);
            ok()
        }
        Err(msg) => text(StatusCode::BAD_REQUEST, msg),
    }
}

async fn expire_h(State(s): State<Arc<Shared>>) -> Response {
    s.update(|i| i.tokens.clear());
    ok()
}

async fn acks_h(State(s): State<Arc<Shared>>) -> Response {
    let acks = s.lock().acks.clone();
    json(&serde_json::json!(acks))
}

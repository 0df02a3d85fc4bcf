//! Delivery: one task per target POSTs its queue in order, retrying with backoff.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::queue::{Queued, Target};
use super::template::body;
use super::EVENT_HEADER;
use crate::controller::provider::webhook::{backoff, sign, SIGNATURE_HEADER};

pub(super) async fn deliver_loop(t: Arc<Target>, stop: CancellationToken) {
    loop {
        let next = {
            let mut queue = t.queue();
            let next = queue.pop_front();
            if next.is_some() {
                t.counters.in_flight.store(1, Ordering::SeqCst);
            }
            next
        };
        match next {
            Some(q) => {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = deliver(&t, &q) => {}
                }
                t.counters.in_flight.store(0, Ordering::SeqCst);
            }
            None => tokio::select! {
                _ = stop.cancelled() => return,
                _ = t.wake.notified() => {}
            },
        }
    }
}

enum Attempt {
    Delivered,
    Permanent(String),
    Retry(String),
}

async fn attempt(t: &Target, q: &Queued, body: &[u8]) -> Attempt {
    let mut req = t
        .http
        .post(&t.cfg.url)
        .header(
            reqwest::header::CONTENT_TYPE,
            t.cfg.effective_content_type(),
        )
        .header(EVENT_HEADER, q.n.phase.name())
        .header("Idempotency-Key", &q.id);
    let secret = t.cfg.secret.expose();
    if !secret.is_empty() {
        req = req.header(SIGNATURE_HEADER, sign(secret.as_bytes(), body));
    }
    match req.body(body.to_vec()).send().await {
        Ok(r) if r.status().is_success() => Attempt::Delivered,
        Ok(r) if r.status().is_client_error() && r.status().as_u16() != 429 => {
            Attempt::Permanent(format!("{} answered {}", t.name, r.status()))
        }
        Ok(r) => Attempt::Retry(format!("{} answered {}", t.name, r.status())),
        Err(e) => Attempt::Retry(format!(
            "POST {}: {}",
            t.name,
            crate::telemetry::error_chain(&e.without_url())
        )),
    }
}

async fn deliver(t: &Target, q: &Queued) {
    let body = body(&t.cfg, t.pieces.as_deref(), q);
    let c = &t.counters;
    for n in 1..=t.cfg.max_attempts {
        match attempt(t, q, &body).await {
            Attempt::Delivered => {
                c.sent.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Attempt::Permanent(why) => {
                tracing::warn!(node = %q.n.node, action = %q.n.action, error = %why, "notification refused; not retried");
                c.failed.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Attempt::Retry(why) => {
                tracing::warn!(node = %q.n.node, action = %q.n.action, attempt = n, error = %why, "notification attempt failed");
            }
        }
        if n < t.cfg.max_attempts {
            c.retries.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(backoff(t.cfg.backoff, n)).await;
        }
    }
    c.failed.fetch_add(1, Ordering::Relaxed);
}

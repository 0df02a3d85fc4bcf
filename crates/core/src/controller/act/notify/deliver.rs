//! Delivery: one task per target POSTs its queue in order, retrying with backoff.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::post::PostRequest;
use super::queue::{Queued, Target};
use super::template::body;
use crate::controller::act::provider::webhook::{backoff, sign};

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
    let secret = t.cfg.secret.expose();
    let signature = (!secret.is_empty()).then(|| sign(secret.as_bytes(), body));
    let req = PostRequest {
        url: &t.cfg.url,
        content_type: t.cfg.effective_content_type(),
        event: q.n.phase.name(),
        idempotency_key: &q.id,
        signature: signature.as_deref(),
        body,
    };
    match t.http.post(req).await {
        Ok(s) if (200..300).contains(&s) => Attempt::Delivered,
        Ok(s) if (400..500).contains(&s) && s != 429 => {
            Attempt::Permanent(format!("{} answered {}", t.name, status_text(s)))
        }
        Ok(s) => Attempt::Retry(format!("{} answered {}", t.name, status_text(s))),
        Err(e) => Attempt::Retry(format!(
            "POST {}: {}",
            t.name,
            crate::telemetry::error_chain(e.as_ref())
        )),
    }
}

/// `503 Service Unavailable`, as reqwest's `StatusCode` prints it.
fn status_text(s: u16) -> String {
    reqwest::StatusCode::from_u16(s).map_or_else(|_| s.to_string(), |c| c.to_string())
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::super::post::fake::FakePost;
    use super::super::{Notification, NotifyConfig, Phase};
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn queued() -> Queued {
        Queued {
            n: Notification {
                node: "n1".into(),
                action: "drain".into(),
                phase: Phase::Finished,
                reason: "r".into(),
                message: "m".into(),
            },
            id: "id-1".into(),
            time: chrono::Utc::now(),
        }
    }

    /// A target with `max_attempts` and a 1 s backoff base, posting through a fake answering
    /// `script`; the POSTs' instants, from `t0`.
    async fn deliver_with(script: &[u16], max_attempts: u32) -> (Vec<Duration>, Arc<Target>) {
        let cfg: NotifyConfig = toml::from_str(&format!(
            "url = \"http://hooks.test/x\"\nmax_attempts = {max_attempts}\nbackoff = \"1s\""
        ))
        .unwrap();
        let fake = FakePost::new(script);
        let seen = fake.seen.clone();
        let t = Arc::new(Target::with_post("t".into(), &cfg, None, Box::new(fake)));
        let t0 = Instant::now();
        deliver(&t, &queued()).await;
        let seen = seen.lock().unwrap();
        assert!(seen.iter().all(|(_, k)| k == "id-1"), "one idempotency key");
        (seen.iter().map(|(at, _)| *at - t0).collect(), t)
    }

    fn counts(t: &Target) -> (u64, u64, u64) {
        let c = &t.counters;
        (
            c.sent.load(Ordering::SeqCst),
            c.retries.load(Ordering::SeqCst),
            c.failed.load(Ordering::SeqCst),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn retries_back_off_doubling_from_the_base_until_delivered() {
        // 503, a transport error, 429, then 200.
        let (at, t) = deliver_with(&[503, 0, 429, 200], 5).await;
        assert_eq!(at.len(), 4, "{at:?}");
        let gaps: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
        // before retry n: min(1 s · 2^(n−1), 30 s), jittered into [d/2, d]
        for (i, d) in [MS(1_000), MS(2_000), MS(4_000)].iter().enumerate() {
            assert!(
                gaps[i] >= *d / 2 && gaps[i] <= *d + MS(1),
                "gap {i}: {:?} for {d:?}",
                gaps[i]
            );
        }
        assert_eq!(counts(&t), (1, 3, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn it_gives_up_after_max_attempts_and_never_retries_a_4xx() {
        let (at, t) = deliver_with(&[500, 500, 500, 200], 3).await;
        assert_eq!(at.len(), 3, "max_attempts = 3: {at:?}");
        assert_eq!(counts(&t), (0, 2, 1));
        let (at, t) = deliver_with(&[400], 5).await;
        assert_eq!(at, vec![Duration::ZERO], "a 4xx is final");
        assert_eq!(counts(&t), (0, 0, 1));
    }
}

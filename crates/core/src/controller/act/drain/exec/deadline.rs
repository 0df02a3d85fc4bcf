//! The drain's clock: its deadline, how long one call may take, the wait between rounds, and
//! cancellation.

use std::time::Duration;

use tokio::time::Instant;

use super::Drainer;
use crate::controller::act::drain::{Blocker, DrainError, DrainProgress, DrainReport, OnTimeout};

impl<F: FnMut(&DrainProgress) + Send> Drainer<'_, F> {
    /// How long one call may take: `call_timeout`, cut at the deadline (at least 100 ms).
    pub(super) fn call_limit(&self, now: Instant) -> Duration {
        let to_deadline = self
            .opts
            .deadline
            .map(|d| d.saturating_duration_since(now))
            .unwrap_or(Duration::MAX);
        self.opts
            .call_timeout
            .min(to_deadline)
            .max(Duration::from_millis(100))
    }

    pub(super) fn past_deadline(&self, now: Instant) -> bool {
        self.opts.deadline.is_some_and(|d| now >= d)
    }

    /// Fails with `TimedOut` when the deadline (plus the force-delete settle time) has passed.
    pub(super) fn check_deadline(
        &self,
        blocker: Option<Blocker>,
        remaining: usize,
    ) -> Result<(), DrainError> {
        let Some(deadline) = self.opts.deadline else {
            return Ok(());
        };
        let limit = match self.opts.on_timeout {
            OnTimeout::Fail => deadline,
            OnTimeout::ForceDelete => deadline + self.opts.force_settle,
        };
        if Instant::now() < limit {
            return Ok(());
        }
        Err(DrainError::TimedOut {
            node: self.node().to_string(),
            waited: self.start.elapsed(),
            remaining: if remaining == usize::MAX {
                0
            } else {
                remaining
            },
            blocker: blocker.map(Box::new),
            report: Box::new(self.finished_report()),
        })
    }

    pub(super) fn finished_report(&self) -> DrainReport {
        let mut r = self.report.clone();
        r.elapsed_ms = self.elapsed_ms();
        r
    }

    pub(super) fn cancelled(&self, remaining: Option<usize>) -> DrainError {
        DrainError::Cancelled {
            node: self.node().to_string(),
            remaining: remaining.unwrap_or(0),
            report: Box::new(self.finished_report()),
        }
    }

    /// Sleeps `d` unless cancelled.
    pub(super) async fn sleep(&self, d: Duration) -> Result<(), DrainError> {
        tokio::select! {
            _ = self.cancel.cancelled() => Err(self.cancelled(None)),
            _ = tokio::time::sleep(d) => Ok(()),
        }
    }

    /// Waits `d`, or less when the node's pods change (`feed.rs`); cancellable.
    pub(super) async fn wait_change(&mut self, d: Duration) -> Result<(), DrainError> {
        let call_timeout = self.opts.call_timeout;
        let cancelled = tokio::select! {
            _ = self.cancel.cancelled() => true,
            _ = self.feed.wait(d, call_timeout) => false,
        };
        match cancelled {
            true => Err(self.cancelled(None)),
            false => Ok(()),
        }
    }

    /// The earliest of: the poll interval, the next retry (at least 5 ms away), the deadline.
    /// The 5 ms floor never carries the wait past the deadline: a retry due just before it
    /// would otherwise make the drain time out up to 5 ms late.
    pub(super) fn next_wake(&self, now: Instant) -> Duration {
        let mut wake = now + self.opts.poll_interval;
        for t in self.tracks.values() {
            if !t.accepted && t.next_try > now {
                wake = wake.min(t.next_try);
            }
        }
        let wait = wake
            .saturating_duration_since(now)
            .max(Duration::from_millis(5));
        match self.opts.deadline.filter(|d| *d > now) {
            Some(d) => wait.min(d - now),
            None => wait,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::{Arc, Mutex};

    use serde_json::json;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::controller::act::drain::exec::mock::{mock, status, EVICT, GET};
    use crate::controller::act::drain::BlockReason;
    use crate::controller::act::drain::{drain, DrainOptions};

    /// A cordoned node `n1` with one ReplicaSet pod (grace 10 s) whose eviction a PDB always
    /// refuses (429); deletions are accepted but the pod stays listed. Runs the drain with
    /// `opts` on paused time; returns its result and each request with its time.
    async fn refused_drain(
        opts: DrainOptions,
    ) -> (Result<DrainReport, DrainError>, Vec<(Duration, String)>) {
        let t0 = Instant::now();
        let log: Arc<Mutex<Vec<(Duration, String)>>> = Arc::default();
        let timed = log.clone();
        let pod = json!({"metadata": {"name": "web-1", "namespace": "shop", "uid": "u1",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web",
                    "uid": "rs1", "controller": true}]},
            "spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 10, "containers": []}});
        let (client, _) = mock(move |method, path| {
            timed
                .lock()
                .unwrap()
                .push((t0.elapsed(), format!("{method} {path}")));
            let list = |items: serde_json::Value| json!({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": items});
            match (method, path) {
                ("GET", "/api/v1/nodes/n1") => (
                    200,
                    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
                        "spec": {"unschedulable": true}}),
                ),
                ("GET", "/api/v1/pods") => (200, list(json!([pod.clone()]))),
                ("POST", EVICT) => (
                    429,
                    status(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        json!([]),
                    ),
                ),
                ("GET", "/apis/policy/v1/poddisruptionbudgets") => (200, list(json!([]))),
                ("DELETE", GET) => (200, pod.clone()),
                _ => (404, status(404, "NotFound", "no", json!([]))),
            }
        });
        let r = drain(client, &opts, CancellationToken::new(), |_| {}).await;
        let log = log.lock().unwrap().clone();
        (r, log)
    }

    fn opts(deadline: Duration, on_timeout: OnTimeout) -> DrainOptions {
        let mut o = DrainOptions::new("n1").with_timeout(deadline);
        o.on_timeout = on_timeout;
        o.wait_volume_detach = false;
        o
    }

    const S: fn(u64) -> Duration = Duration::from_secs;
    const MS: fn(u64) -> Duration = Duration::from_millis;

    /// `fail`: a drain blocked by a PDB times out at its deadline — not a poll later, not
    /// earlier — naming the pod left and the refusal, with evictions retried until then.
    #[tokio::test(start_paused = true)]
    async fn a_blocked_drain_times_out_exactly_at_its_deadline() {
        let (r, log) = refused_drain(opts(S(30), OnTimeout::Fail)).await;
        let Err(DrainError::TimedOut {
            waited,
            remaining,
            blocker,
            ..
        }) = r
        else {
            panic!("{r:?}")
        };
        assert!(waited >= S(30) && waited <= S(30) + MS(1), "{waited:?}");
        assert_eq!(remaining, 1);
        // no PDB is listed, so the 429 reads as throttling
        let b = blocker.unwrap();
        assert_eq!(
            (b.pod.as_str(), b.reason),
            ("shop/web-1", BlockReason::Throttled)
        );
        let evictions: Vec<Duration> = log
            .iter()
            .filter(|(_, r)| r == &format!("POST {EVICT}"))
            .map(|(t, _)| *t)
            .collect();
        // backoff 100 ms doubling to 10 s, jittered: at least 5 tries in 30 s, all before it
        assert!(evictions.len() >= 5, "{evictions:?}");
        assert!(evictions.iter().all(|t| *t < S(30)), "{evictions:?}");
        assert!(
            !log.iter().any(|(_, r)| r.starts_with("DELETE")),
            "fail never deletes"
        );
    }

    /// `force-delete`: the pod is deleted once its grace (10 s) no longer fits before the
    /// deadline (30 s), i.e. at the first round from 20 s; the drain then gives the deletion
    /// `force_settle` (5 s) and times out at 35 s (rounds are at most a poll interval apart).
    #[tokio::test(start_paused = true)]
    async fn force_delete_starts_when_the_grace_no_longer_fits_and_settles_after() {
        let (r, log) = refused_drain(opts(S(30), OnTimeout::ForceDelete)).await;
        let Err(DrainError::TimedOut { waited, .. }) = r else {
            panic!("{r:?}")
        };
        let poll = DrainOptions::new("n1").poll_interval;
        assert!(waited >= S(35) && waited <= S(35) + poll, "{waited:?}");
        let deletes: Vec<Duration> = log
            .iter()
            .filter(|(_, r)| r.starts_with("DELETE"))
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(deletes.len(), 1, "{deletes:?}");
        assert!(
            deletes[0] >= S(20) && deletes[0] <= S(20) + poll,
            "{deletes:?}"
        );
    }

    /// The wait between rounds: the poll interval, cut by a pod's next retry (at least 5 ms)
    /// and by the deadline; a call's limit: `call_timeout` cut at the deadline, at least
    /// 100 ms.
    #[tokio::test(start_paused = true)]
    async fn next_wake_and_call_limit_are_cut_at_the_deadline() {
        let (client, _) = mock(|_, _| (404, json!({})));
        let mut o = DrainOptions::new("n1").with_timeout(S(1));
        o.poll_interval = S(10);
        o.call_timeout = S(10);
        let d = Drainer::new(client, &o, CancellationToken::new(), |_: &DrainProgress| {});
        let now = Instant::now();
        assert_eq!(d.next_wake(now), S(1));
        assert_eq!(d.call_limit(now), S(1));
        assert_eq!(
            d.next_wake(now + MS(999)),
            MS(1),
            "the deadline, not the 5 ms floor"
        );
        assert_eq!(d.call_limit(now + MS(950)), MS(100));
        assert!(!d.past_deadline(now + MS(999)));
        assert!(d.past_deadline(now + S(1)));
        assert_eq!(
            d.next_wake(now + S(2)),
            S(10),
            "past the deadline: the poll interval"
        );
        let mut d = d;
        d.tracks.insert(
            "u1".into(),
            super::super::Track {
                attempts: 1,
                next_try: now + MS(2),
                accepted: false,
                forced: false,
                blocker: None,
            },
        );
        assert_eq!(
            d.next_wake(now),
            MS(5),
            "a retry due in 2 ms: the 5 ms floor"
        );
        d.tracks.get_mut("u1").unwrap().next_try = now + MS(998);
        assert_eq!(
            d.next_wake(now + MS(997)),
            MS(3),
            "a retry due before the deadline: the floor stops at the deadline"
        );
        assert!(d.check_deadline(None, 1).is_ok());
        tokio::time::advance(MS(999)).await;
        assert!(d.check_deadline(None, 1).is_ok());
        tokio::time::advance(MS(1)).await;
        assert!(matches!(
            d.check_deadline(None, 1),
            Err(DrainError::TimedOut { waited, remaining: 1, .. }) if waited == S(1)
        ));
    }
}

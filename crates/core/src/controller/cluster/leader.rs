//! Leader election with a `coordination.k8s.io/v1` Lease.
//!
//! Optimistic concurrency (resourceVersion on every replace) makes at most one replica win a
//! takeover. The holder renews every `renew_interval` (12 s by default, in a 20 s Lease) and
//! retries a failed renewal every `retry_period`; it steps down on its own when it could not
//! renew for `lease_duration - retry_period` (before anyone else may take over), and on shutdown it
//! releases the Lease (empty holder) so the other replica takes over at once instead of waiting
//! for expiry. The holder renews by writing the Lease it last wrote (its resourceVersion):
//! one request per renewal, not a read and a write; a conflict (someone else wrote it) falls back
//! to a read. A follower does not read the Lease every `retry_period` either: it watches it, and
//! reads it (to take it over) only when the holder released it, it was deleted, the watch ended,
//! or the Lease's `renewTime + leaseDurationSeconds` passed with no renewal seen (then it finds it
//! expired, by the same clock). A standby so costs a watch and a read every hour or so, not 1,800
//! reads an hour.
//!
//! Choice for two replicas: both serve reports (so a Service can route to either and a failover
//! loses nothing); only the leader writes to the API. A follower keeps each node's latest report
//! in memory and writes it when it becomes leader; it does not acknowledge events, so agents keep
//! resending them until the leader records them.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Lease-based election for one replica.
#[derive(Clone)]
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    /// The Lease as this replica last wrote it, while it holds it.
    written: Arc<Mutex<Option<Lease>>>,
    /// Another holder's Lease as last read, while following: its resourceVersion, and when it
    /// expires unless renewed (renewTime + leaseDurationSeconds, ms since the epoch).
    observed: Arc<Mutex<Option<(String, i64)>>>,
}

/// The election's clock (`[controller.leader]`).
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// How long the Lease is valid without renewal.
    pub lease: Duration,
    /// The pause after a failed attempt, and between a follower's reads when it cannot watch.
    pub retry: Duration,
    /// The holder's pause after a successful renewal.
    pub renew: Duration,
}

impl From<&crate::controller::config::LeaderConfig> for Timing {
    /// The timing `[controller.leader]` gives (the renewal interval derived when not set).
    fn from(c: &crate::controller::config::LeaderConfig) -> Self {
        Timing {
            lease: c.lease_duration,
            retry: c.retry_period,
            renew: c.renew_interval(),
        }
    }
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("name", &self.name)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl Elector {
    /// An elector for Lease `namespace/name` as `identity`.
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: &str,
        timing: Timing,
    ) -> Self {
        Elector {
            api: Api::namespaced(client, namespace),
            name: name.into(),
            identity: identity.into(),
            timing,
            written: Arc::default(),
            observed: Arc::default(),
        }
    }

    fn written(&self) -> std::sync::MutexGuard<'_, Option<Lease>> {
        crate::sync::lock(&self.written)
    }

    fn observed(&self) -> std::sync::MutexGuard<'_, Option<(String, i64)>> {
        crate::sync::lock(&self.observed)
    }

    /// Keeps `lease`, as the API server returned it, for the next renewal; true (held).
    fn hold(&self, lease: Lease) -> bool {
        *self.written() = Some(lease);
        true
    }

    /// This replica's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    fn spec(&self, transitions: i32, acquire: Option<MicroTime>) -> LeaseSpec {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.timing.lease.as_secs().max(1) as i32),
            acquire_time: Some(acquire.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// One attempt: true when this replica holds the Lease afterwards.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        self.observed().take();
        let held = self.written().take();
        if let Some(mut lease) = held {
            let spec = lease.spec.clone().unwrap_or_default();
            let transitions = spec.lease_transitions.unwrap_or(0);
            lease.spec = Some(self.spec(transitions, spec.acquire_time));
            match self
                .api
                .replace(&self.name, &PostParams::default(), &lease)
                .await
            {
                Ok(l) => return Ok(self.hold(l)),
                // Written by someone else since: read it.
                Err(e) if is_conflict(&e) => {}
                Err(e) => return Err(e),
            }
        }
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let l = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(0, None)),
            };
            return match self.api.create(&PostParams::default(), &l).await {
                Ok(l) => Ok(self.hold(l)),
                Err(e) if is_conflict(&e) => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let mine = holder == self.identity;
        let expired = expired(&spec, k8s_openapi::jiff::Timestamp::now());
        if !mine && !holder.is_empty() && !expired {
            if let (Some(rv), Some(at)) = (lease.metadata.resource_version.clone(), expiry(&spec)) {
                *self.observed() = Some((rv, at));
            }
            return Ok(false);
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!mine);
        let acquire = if mine {
            spec.acquire_time.clone()
        } else {
            None
        };
        lease.spec = Some(self.spec(transitions, acquire));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(l) => Ok(self.hold(l)),
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// A follower's pause before its next attempt. When the last attempt read another live
    /// holder, it watches the Lease from that read and returns when the holder releases it, the
    /// Lease is deleted, the Lease expires unrenewed (by the same clock `expired` reads), or the
    /// watch ends; otherwise (no such read, or the watch cannot open) it sleeps `retry_period`.
    pub async fn follower_wait(&self) {
        let seen = self.observed().take();
        let Some((rv, mut expires)) = seen else {
            return tokio::time::sleep(self.timing.retry).await;
        };
        // A watch that ends or breaks at once must not turn into a read per round trip.
        let not_before = Instant::now() + self.timing.retry;
        let wp = WatchParams::default()
            .fields(&format!("metadata.name={}", self.name))
            .timeout(crate::k8s::watch_timeout_secs());
        let mut events = match self.api.watch(&wp, &rv).await {
            Ok(s) => s.boxed(),
            Err(error) => {
                tracing::debug!(lease = %self.name, %error, "cannot watch the lease; reading it every retry_period");
                return tokio::time::sleep(self.timing.retry).await;
            }
        };
        loop {
            let left = expires.saturating_sub(k8s_openapi::jiff::Timestamp::now().as_millisecond());
            // Just past the expiry, so that the read finds it expired.
            let left = Duration::from_millis(u64::try_from(left).unwrap_or(0) + 10);
            match tokio::time::timeout(left, events.next()).await {
                Ok(Some(Ok(WatchEvent::Added(l) | WatchEvent::Modified(l)))) => {
                    let spec = l.spec.unwrap_or_default();
                    match (spec.holder_identity.as_deref(), expiry(&spec)) {
                        (Some(h), Some(at)) if !h.is_empty() && h != self.identity => expires = at,
                        // Released (or, oddly, ours, or without a renew time): read it.
                        _ => return,
                    }
                }
                Ok(Some(Ok(WatchEvent::Bookmark(_)))) => {}
                // Expired perhaps, or deleted: read it.
                Err(_) | Ok(Some(Ok(WatchEvent::Deleted(_)))) => return,
                // The watch ended or broke: read it, not sooner than `retry_period`.
                _ => return tokio::time::sleep_until(not_before).await,
            }
        }
    }

    /// Gives the Lease up if this replica holds it.
    pub async fn release(&self) -> Result<(), kube::Error> {
        self.written().take();
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await?;
        Ok(())
    }

    /// Runs the election until `cancel`, publishing leadership on `tx`; releases the Lease at the end.
    pub async fn run(self, tx: watch::Sender<bool>, cancel: CancellationToken) {
        elect(
            || self.try_acquire_or_renew(),
            || self.follower_wait(),
            self.timing,
            &tx,
            &cancel,
            (&self.name, &self.identity),
        )
        .await;
        let _ = tx.send(false);
        if let Err(e) = self.release().await {
            tracing::warn!(lease = %self.name, error = %e, "cannot release the lease");
        }
    }
}

/// When a Lease with this spec expires unless renewed (renewTime + leaseDurationSeconds, ms
/// since the epoch); `None` without either.
fn expiry(spec: &LeaseSpec) -> Option<i64> {
    match (&spec.renew_time, spec.lease_duration_seconds) {
        (Some(t), Some(d)) => Some(t.0.as_millisecond() + i64::from(d) * 1000),
        _ => None,
    }
}

/// Whether a Lease with this spec may be taken over at `now`: its holder did not renew within
/// `leaseDurationSeconds` (strictly: at exactly renew + duration it still holds), or it has no
/// renew time or duration.
fn expired(spec: &LeaseSpec, now: k8s_openapi::jiff::Timestamp) -> bool {
    expiry(spec).is_none_or(|at| at < now.as_millisecond())
}

/// The election loop of [`Elector::run`]: while leading, the next `attempt` `renew` after a
/// successful one and `retry` after a failed one; after `follower_wait` while not. A failed
/// attempt keeps the leadership while the last successful one is younger than
/// `lease - retry`.
async fn elect<F, Fut, E, W, WFut>(
    mut attempt: F,
    mut follower_wait: W,
    timing: Timing,
    tx: &watch::Sender<bool>,
    cancel: &CancellationToken,
    (name, identity): (&str, &str),
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, E>>,
    E: std::fmt::Display,
    W: FnMut() -> WFut,
    WFut: Future<Output = ()>,
{
    let grace = timing.lease.saturating_sub(timing.retry);
    let mut last_renew: Option<Instant> = None;
    loop {
        let (held, renewed) = match attempt().await {
            Ok(true) => {
                last_renew = Some(Instant::now());
                (true, true)
            }
            Ok(false) => (false, false),
            Err(e) => {
                tracing::warn!(lease = %name, error = %e, "lease renewal failed");
                (last_renew.is_some_and(|t| t.elapsed() < grace), false)
            }
        };
        if !held {
            last_renew = None;
        }
        let was = *tx.borrow();
        if was != held {
            tracing::info!(identity = %identity, leader = held, "leadership changed");
            let _ = tx.send(held);
        }
        let pause = async {
            match (held, renewed) {
                (true, true) => tokio::time::sleep(timing.renew).await,
                (true, false) => tokio::time::sleep(timing.retry).await,
                (false, _) => follower_wait().await,
            }
        };
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = pause => {}
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use k8s_openapi::jiff::Timestamp;

    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    /// Runs the loop over scripted attempt results (`None`: an API error); returns, per attempt,
    /// when it ran and the leadership published after it.
    async fn script(
        results: &[Option<bool>],
        retry: Duration,
        lease: Duration,
    ) -> Vec<(Duration, bool)> {
        let renew = retry;
        script_timed(
            results,
            Timing {
                lease,
                retry,
                renew,
            },
        )
        .await
    }

    /// [`script`] with a renewal interval of its own.
    async fn script_timed(results: &[Option<bool>], timing: Timing) -> Vec<(Duration, bool)> {
        let (tx, rx) = watch::channel(false);
        let cancel = CancellationToken::new();
        let t0 = Instant::now();
        let left: Arc<Mutex<VecDeque<Option<bool>>>> =
            Arc::new(Mutex::new(results.iter().copied().collect()));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let attempt = || {
            let next = left.lock().unwrap().pop_front().unwrap();
            let at = t0.elapsed();
            seen.lock().unwrap().push(at);
            if left.lock().unwrap().is_empty() {
                cancel.cancel();
            }
            async move { next.ok_or("apiserver unavailable") }
        };
        let leaders = Arc::new(Mutex::new(Vec::new()));
        // Every published change with its time (paused: the instant of the attempt).
        let watcher = {
            let (leaders, mut rx) = (leaders.clone(), rx);
            tokio::spawn(async move {
                while rx.changed().await.is_ok() {
                    let l = *rx.borrow_and_update();
                    leaders.lock().unwrap().push((t0.elapsed(), l));
                }
            })
        };
        let follow = || tokio::time::sleep(timing.retry);
        elect(attempt, follow, timing, &tx, &cancel, ("l", "me")).await;
        drop(tx);
        watcher.await.unwrap();
        let changes = leaders.lock().unwrap().clone();
        // Leadership after each attempt: the last change at or before it.
        let times = seen.lock().unwrap().clone();
        times
            .iter()
            .map(|&t| {
                let held = changes
                    .iter()
                    .rfind(|(c, _)| *c <= t)
                    .is_some_and(|(_, l)| *l);
                (t, held)
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn renews_every_retry_period_exactly() {
        let got = script(&[Some(true); 5], S(2), S(15)).await;
        let want: Vec<(Duration, bool)> = (0..5).map(|i| (S(2 * i), true)).collect();
        assert_eq!(got, want);
    }

    /// Renewal fails from t = 2 s: the leader keeps the lead while its last renewal is younger
    /// than lease − retry = 8 s, and steps down at the attempt at exactly 8 s (before anyone
    /// may take the Lease over at 10 s).
    #[tokio::test(start_paused = true)]
    async fn steps_down_when_unrenewed_for_lease_minus_retry() {
        let mut results = vec![Some(true)];
        results.extend([None; 5]);
        let got = script(&results, S(2), S(10)).await;
        let held: Vec<bool> = got.iter().map(|(_, l)| *l).collect();
        assert_eq!(got.last().unwrap().0, S(10));
        assert_eq!(held, [true, true, true, true, false, false]);
        // a finer grid: retry 1 s, lease 4.5 s → grace 3.5 s: held at 3 s, gone at 4 s
        let got = script(&results, S(1), Duration::from_millis(4_500)).await;
        let held: Vec<bool> = got.iter().map(|(_, l)| *l).collect();
        assert_eq!(held, [true, true, true, true, false, false]);
        let got = script(&results, S(1), Duration::from_millis(5_500)).await;
        let held: Vec<bool> = got.iter().map(|(_, l)| *l).collect();
        assert_eq!(held, [true, true, true, true, true, false]);
    }

    /// The shipped timing (lease 20 s, retry 2 s, renew 12 s): renewals 12 s apart while they
    /// succeed; after a failure, retries every 2 s, and the step-down at 18 s (lease − retry)
    /// after the last renewal, three retries later; a follower then reads every retry.
    #[tokio::test(start_paused = true)]
    async fn renews_every_renew_interval_and_retries_every_retry_period() {
        let timing = Timing {
            lease: S(20),
            retry: S(2),
            renew: S(12),
        };
        let got = script_timed(&[Some(true); 3], timing).await;
        assert_eq!(got, [(S(0), true), (S(12), true), (S(24), true)]);
        let mut results = vec![Some(true)];
        results.extend([None; 5]);
        let got = script_timed(&results, timing).await;
        let want = [
            (0, true),
            (12, true),
            (14, true),
            (16, true),
            (18, false),
            (20, false),
        ];
        assert_eq!(got, want.map(|(t, l)| (S(t), l)));
        // a failed renewal that then succeeds: back to the renew interval
        let got = script_timed(&[Some(true), None, Some(true), Some(true)], timing).await;
        let want = [(0, true), (12, true), (14, true), (26, true)];
        assert_eq!(got, want.map(|(t, l)| (S(t), l)));
    }

    /// Losing the Lease (another holder) drops the lead at once, and a later API error does not
    /// bring it back on the strength of the old renewal.
    #[tokio::test(start_paused = true)]
    async fn a_lost_lease_is_not_kept_through_later_errors() {
        let got = script(&[Some(true), Some(false), None, Some(true)], S(2), S(60)).await;
        let held: Vec<bool> = got.iter().map(|(_, l)| *l).collect();
        assert_eq!(held, [true, false, false, true]);
    }

    type Shared<T> = Arc<Mutex<T>>;

    fn timing() -> Timing {
        Timing {
            lease: S(15),
            retry: S(2),
            renew: S(2),
        }
    }

    /// An API server holding one Lease (resourceVersion checked on PUT); every request logged.
    fn lease_server() -> (
        kube::Client,
        Shared<Vec<String>>,
        Shared<Option<serde_json::Value>>,
    ) {
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let store: Arc<Mutex<Option<serde_json::Value>>> = Arc::default();
        let (l, st) = (log.clone(), store.clone());
        let svc = tower::service_fn(move |req: hyper::Request<kube::client::Body>| {
            let (l, st) = (l.clone(), st.clone());
            async move {
                use http_body_util::BodyExt;
                let method = req.method().to_string();
                l.lock().unwrap().push(method.clone());
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let mut cur = st.lock().unwrap();
                let (code, out) = match method.as_str() {
                    "GET" => match cur.clone() {
                        Some(v) => (200, v),
                        None => (
                            404,
                            serde_json::json!({"kind": "Status", "code": 404, "reason": "NotFound"}),
                        ),
                    },
                    _ => {
                        let mut v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                        let rv = |v: &serde_json::Value| {
                            v["metadata"]["resourceVersion"]
                                .as_str()
                                .map(str::to_string)
                        };
                        let stale = method == "PUT" && cur.as_ref().and_then(rv) != rv(&v);
                        if stale {
                            (
                                409,
                                serde_json::json!({"kind": "Status", "code": 409, "reason": "Conflict"}),
                            )
                        } else {
                            let next = cur
                                .as_ref()
                                .and_then(rv)
                                .map_or(1, |r| r.parse::<u64>().unwrap() + 1);
                            v["metadata"]["resourceVersion"] = serde_json::json!(next.to_string());
                            *cur = Some(v.clone());
                            (if method == "POST" { 201 } else { 200 }, v)
                        }
                    }
                };
                hyper::Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(serde_json::to_vec(&out).unwrap()))
            }
        });
        (kube::Client::new(svc, "default"), log, store)
    }

    /// The holder renews with one PUT of the Lease it wrote (no GET); when someone else wrote
    /// the Lease meanwhile, the PUT conflicts and the replica reads the Lease and steps aside.
    #[tokio::test]
    async fn the_holder_renews_with_one_write_and_reads_after_a_conflict() {
        let (client, log, store) = lease_server();
        let e = Elector::new(client, "nodekeeper", "nk", "me", timing());
        for _ in 0..4 {
            assert!(e.try_acquire_or_renew().await.unwrap());
        }
        assert_eq!(*log.lock().unwrap(), ["GET", "POST", "PUT", "PUT", "PUT"]);
        // Another replica took the Lease over (it expired, say).
        {
            let mut cur = store.lock().unwrap();
            let v = cur.as_mut().unwrap();
            v["spec"]["holderIdentity"] = serde_json::json!("other");
            v["spec"]["renewTime"] = serde_json::json!(
                chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
            );
            v["metadata"]["resourceVersion"] = serde_json::json!("99");
        }
        log.lock().unwrap().clear();
        assert!(!e.try_acquire_or_renew().await.unwrap());
        assert!(!e.try_acquire_or_renew().await.unwrap());
        assert_eq!(
            *log.lock().unwrap(),
            ["PUT", "GET", "GET"],
            "a conflict, then reads only"
        );
    }

    /// A follower whose watch of the Lease ends at once (here the server answers it with the
    /// Lease itself, which is no watch event) reads again only `retry_period` later, not in a
    /// loop of reads and watches.
    #[tokio::test(start_paused = true)]
    async fn a_follower_whose_watch_ends_at_once_waits_the_retry_period() {
        let (client, log, store) = lease_server();
        let other = Elector::new(client.clone(), "nodekeeper", "nk", "other", timing());
        assert!(other.try_acquire_or_renew().await.unwrap());
        let e = Elector::new(client, "nodekeeper", "nk", "me", timing());
        assert!(!e.try_acquire_or_renew().await.unwrap());
        assert!(store.lock().unwrap().is_some());
        log.lock().unwrap().clear();
        let t0 = Instant::now();
        e.follower_wait().await;
        assert_eq!(t0.elapsed(), S(2));
        assert_eq!(*log.lock().unwrap(), ["GET"], "one watch, no read");
    }

    #[test]
    fn a_lease_may_be_taken_over_only_after_renew_plus_duration() {
        let renew = 1_700_000_000_000i64;
        let spec = LeaseSpec {
            renew_time: Some(MicroTime(Timestamp::from_millisecond(renew).unwrap())),
            lease_duration_seconds: Some(15),
            ..Default::default()
        };
        let at = |ms: i64| Timestamp::from_millisecond(renew + ms).unwrap();
        assert!(!expired(&spec, at(0)));
        assert!(!expired(&spec, at(14_999)));
        assert!(
            !expired(&spec, at(15_000)),
            "at exactly the duration it still holds"
        );
        assert!(expired(&spec, at(15_001)));
        let no_renew = LeaseSpec {
            lease_duration_seconds: Some(15),
            ..Default::default()
        };
        assert!(expired(&no_renew, at(0)));
        let no_duration = LeaseSpec {
            renew_time: spec.renew_time.clone(),
            ..Default::default()
        };
        assert!(expired(&no_duration, at(0)));
    }
}

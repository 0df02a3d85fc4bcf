//! One drain task per node, run by the drain engine ([`super::drain`]) in the background.
//! Its progress (phase, blocking pod and PDB) is read back into the next
//! [`ClusterView`](crate::controller::policy::ClusterView) as the node's [`DrainView`].
//!
//! A task that ended stays visible (`Completed` / `Failed`) until the policy stops it or the node
//! goes away. A drain that failed on an API error disappears after a pause, so the next
//! reconcile starts it again. Tasks live in memory: after a controller restart the policy sees
//! `Idle` and starts the drain again (evictions are idempotent).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::Client;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::controller::act::drain::lifecycle::{self, DrainEdge};
use crate::controller::act::drain::{
    self, BlockReason, DrainError, DrainOptions, DrainProgress, DrainReport,
};
use crate::controller::act::history::{self, History};
use crate::controller::clock::Clock;
use crate::controller::config::EngineConfig;
use crate::controller::metrics::EngineMetrics;
use crate::controller::policy::view::{DrainPhase, DrainView, PodView};
use crate::sync::lock;

/// Pause before a drain that failed on an API error may be started again.
const RETRY_PAUSE: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
struct Shared {
    view: DrainView,
    report: Option<DrainReport>,
    last_pdb_blocker: Option<String>,
}

struct Task {
    cancel: CancellationToken,
    shared: Arc<Mutex<Shared>>,
}

/// The running (and finished) drains of the controller.
pub struct DrainTasks {
    client: Client,
    cfg: EngineConfig,
    clock: Arc<dyn Clock>,
    metrics: Arc<EngineMetrics>,
    wake: Arc<Notify>,
    slots: Arc<Semaphore>,
    tasks: Arc<Mutex<HashMap<String, Task>>>,
    /// Each node's action history: a drain's end is added to it.
    history: Option<History>,
}

/// What a drain task needs besides the node.
struct Run {
    client: Client,
    opts: DrainOptions,
    cancel: CancellationToken,
    shared: Arc<Mutex<Shared>>,
    metrics: Arc<EngineMetrics>,
    wake: Arc<Notify>,
    slots: Arc<Semaphore>,
    tasks: Arc<Mutex<HashMap<String, Task>>>,
    /// Why the drain runs (the lifecycle conditions' message).
    reason: String,
    /// `[controller.engine] lifecycle_conditions`.
    lifecycle: bool,
    history: Option<History>,
}

impl DrainTasks {
    /// Drains through `client` (build it with [`drain::client`]: no transparent 429 retries).
    /// `wake` is notified whenever a drain's view changes.
    pub fn new(
        client: Client,
        cfg: EngineConfig,
        clock: Arc<dyn Clock>,
        metrics: Arc<EngineMetrics>,
        wake: Arc<Notify>,
    ) -> Self {
        let slots = Arc::new(Semaphore::new(cfg.max_parallel_drains.max(1)));
        DrainTasks {
            client,
            cfg,
            clock,
            metrics,
            wake,
            slots,
            tasks: Arc::new(Mutex::new(HashMap::new())),
            history: None,
        }
    }

    /// The drains, adding each drain's end to the node's `history`.
    pub fn with_history(mut self, history: Option<History>) -> Self {
        self.history = history;
        self
    }

    /// The node's drain as the policy sees it (`Idle` when none).
    pub fn view(&self, node: &str) -> DrainView {
        lock(&self.tasks)
            .get(node)
            .map(|t| lock(&t.shared).view.clone())
            .unwrap_or_default()
    }

    /// The report of the node's finished drain (or the partial one of a failed drain).
    pub fn report(&self, node: &str) -> Option<DrainReport> {
        lock(&self.tasks)
            .get(node)
            .and_then(|t| lock(&t.shared).report.clone())
    }

    /// Starts draining `node` by `deadline` (simulated or wall time, per the clock) unless a
    /// drain of the node exists. True when a new drain started.
    pub fn start(&self, node: &str, deadline: DateTime<Utc>, reason: &str) -> bool {
        let mut tasks = lock(&self.tasks);
        if tasks.contains_key(node) {
            return false;
        }
        let left = (deadline - self.clock.now()).to_std().unwrap_or_default();
        let mut opts = DrainOptions::new(node);
        opts.deadline = Some(tokio::time::Instant::now() + self.clock.real(left));
        opts.on_timeout = self.cfg.on_timeout.to_drain();
        opts.concurrency = self.cfg.drain_concurrency;
        opts.wait_volume_detach = self.cfg.wait_volume_detach;
        opts.interruption = reason.starts_with("interruption:");
        opts.poll_interval = Duration::from_millis(100);
        let shared = Arc::new(Mutex::new(Shared {
            view: DrainView {
                phase: DrainPhase::Running,
                blocker: None,
            },
            ..Shared::default()
        }));
        let cancel = CancellationToken::new();
        tasks.insert(
            node.to_string(),
            Task {
                cancel: cancel.clone(),
                shared: shared.clone(),
            },
        );
        let run = Run {
            client: self.client.clone(),
            opts,
            cancel,
            shared,
            metrics: self.metrics.clone(),
            wake: self.wake.clone(),
            slots: self.slots.clone(),
            tasks: self.tasks.clone(),
            reason: reason.to_string(),
            lifecycle: self.cfg.lifecycle_conditions,
            history: self.history.clone(),
        };
        tracing::info!(node, reason, deadline = %deadline.to_rfc3339(), "drain started");
        tokio::spawn(run.go());
        true
    }

    /// Stops and forgets the node's drain (the node stays cordoned).
    /// Returns the phase the drain had (none: there was no drain).
    pub fn stop(&self, node: &str) -> Option<DrainPhase> {
        let t = lock(&self.tasks).remove(node)?;
        t.cancel.cancel();
        tracing::info!(node, "drain stopped");
        let phase = lock(&t.shared).view.phase;
        Some(phase)
    }

    /// Stops the drains of nodes for which `keep` is false (nodes that are gone).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        lock(&self.tasks).retain(|node, t| {
            let k = keep(node);
            if !k {
                t.cancel.cancel();
            }
            k
        });
    }

    /// Stops every drain (leadership lost, shutdown).
    pub fn stop_all(&self) {
        self.retain(|_| false);
    }

    /// Whether drains set the lifecycle conditions (`[controller.engine] lifecycle_conditions`).
    pub fn lifecycle_conditions(&self) -> bool {
        self.cfg.lifecycle_conditions
    }

    /// Node names with a drain task.
    pub fn nodes(&self) -> Vec<String> {
        lock(&self.tasks).keys().cloned().collect()
    }
}

impl Run {
    async fn go(self) {
        let Ok(_permit) = self.slots.clone().acquire_owned().await else {
            return;
        };
        self.metrics
            .drains_running
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (started, since) = (std::time::Instant::now(), Utc::now());
        let node = self.opts.node.clone();
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
            kube::Api::all(self.client.clone());
        let reason = self.reason.clone();
        if self.lifecycle {
            lifecycle::write_or_log(&nodes, &node, DrainEdge::Started, &reason).await;
        }
        let shared = self.shared.clone();
        let metrics = self.metrics.clone();
        let wake = self.wake.clone();
        let result = drain::drain(self.client, &self.opts, self.cancel, move |p| {
            on_progress(&shared, &metrics, &wake, p)
        })
        .await;
        self.metrics
            .drains_running
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        let took = started.elapsed();
        let error = result.as_ref().err().map(|e| e.to_string());
        let (label, phase, report) = match result {
            Ok(r) => ("completed", DrainPhase::Completed, Some(r)),
            Err(DrainError::TimedOut { report, .. }) => {
                ("failed", DrainPhase::Failed, Some(*report))
            }
            Err(DrainError::NodeNotFound { .. }) => ("failed", DrainPhase::Failed, None),
            Err(DrainError::Cancelled { report, .. }) => {
                ("cancelled", DrainPhase::Idle, Some(*report))
            }
            Err(e @ (DrainError::Api { .. } | DrainError::EvictionRefused { .. })) => {
                tracing::warn!(node, error = %e, "drain failed; retried");
                ("error", DrainPhase::Idle, None)
            }
        };
        self.metrics.drain_finished(label, took);
        if let Some(h) = &self.history {
            let error = error.filter(|_| report.is_none());
            let entry = history::of_drain(since, &reason, label, took, report.as_ref(), error);
            h.record(&node, entry);
        }
        if self.lifecycle {
            let edge = match label {
                "completed" => DrainEdge::Completed,
                "cancelled" => DrainEdge::Cancelled,
                "failed" if phase == DrainPhase::Failed => DrainEdge::TimedOut,
                _ => DrainEdge::Failed,
            };
            lifecycle::write_or_log(&nodes, &node, edge, &reason).await;
        }
        tracing::info!(
            node,
            result = label,
            took_ms = took.as_millis() as u64,
            "drain ended"
        );
        {
            let mut s = lock(&self.shared);
            s.view.phase = phase;
            if phase == DrainPhase::Completed {
                s.view.blocker = None;
            }
            s.report = report;
        }
        if phase == DrainPhase::Idle && label == "error" {
            // Forget it after a pause: the next reconcile starts it again.
            tokio::time::sleep(RETRY_PAUSE).await;
            let mut tasks = lock(&self.tasks);
            if tasks
                .get(&node)
                .is_some_and(|t| Arc::ptr_eq(&t.shared, &self.shared))
            {
                tasks.remove(&node);
            }
        }
        self.wake.notify_one();
    }
}

/// Feeds a progress report into the shared view; counts each new PDB refusal episode.
fn on_progress(shared: &Mutex<Shared>, metrics: &EngineMetrics, wake: &Notify, p: &DrainProgress) {
    let blocker = p
        .blocker
        .as_ref()
        .filter(|b| b.reason.is_policy() || b.reason == BlockReason::Throttled);
    let pod = blocker.map(|b| {
        let (ns, name) = b.pod.split_once('/').unwrap_or(("", b.pod.as_str()));
        PodView {
            namespace: ns.to_string(),
            name: name.to_string(),
            blocking_pdb: b.pdb.clone(),
            do_not_disrupt: b.reason == BlockReason::DoNotDisrupt,
        }
    });
    let mut s = lock(shared);
    let pdb_key = pod
        .as_ref()
        .filter(|p| p.blocking_pdb.is_some())
        .map(|p| format!("{}/{}", p.namespace, p.name));
    if pdb_key.is_some() && pdb_key != s.last_pdb_blocker {
        metrics
            .evictions_blocked_by_pdb
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    s.last_pdb_blocker = pdb_key;
    if s.view.blocker != pod {
        s.view.blocker = pod;
        drop(s);
        wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::clock::SystemClock;

    /// Drain tasks whose API server refuses everything (403): every drain fails on an API error.
    fn tasks() -> DrainTasks {
        let svc = tower::service_fn(|_req: hyper::Request<kube::client::Body>| async {
            let body = serde_json::json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                "reason": "Forbidden", "code": 403, "message": "forbidden"});
            hyper::Response::builder()
                .status(403)
                .header("content-type", "application/json")
                .body(kube::client::Body::from(
                    serde_json::to_vec(&body).unwrap_or_default(),
                ))
        });
        DrainTasks::new(
            Client::new(svc, "default"),
            EngineConfig::default(),
            Arc::new(SystemClock),
            Arc::new(EngineMetrics::default()),
            Arc::new(Notify::new()),
        )
    }

    /// Lets the spawned tasks run without moving the paused clock (a ready task keeps tokio from
    /// advancing it), until `done` holds.
    async fn run_until(what: &str, mut done: impl FnMut() -> bool) {
        for _ in 0..10_000 {
            if done() {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("{what}: not reached without time passing");
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_failed_on_an_api_error_is_forgotten_exactly_after_the_retry_pause() {
        let t = tasks();
        let deadline = Utc::now() + chrono::Duration::minutes(10);
        assert!(t.start("n1", deadline, "repair:Ready=False"));
        assert!(
            !t.start("n1", deadline, "repair:Ready=False"),
            "one drain per node"
        );
        run_until("the drain fails", || t.view("n1").phase == DrainPhase::Idle).await;
        assert_eq!(t.nodes(), vec!["n1".to_string()], "kept during the pause");
        tokio::time::advance(RETRY_PAUSE - Duration::from_millis(1)).await;
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            t.nodes(),
            vec!["n1".to_string()],
            "not before the pause is over"
        );
        assert!(
            !t.start("n1", deadline, "repair:Ready=False"),
            "not restarted yet"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        run_until("forgotten after the pause", || t.nodes().is_empty()).await;
        assert!(
            t.start("n1", deadline, "repair:Ready=False"),
            "started again"
        );
    }
}

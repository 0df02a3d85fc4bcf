//! The disruption engine: the reconcile loop of `nodekeeper controller` (only while leader).
//!
//! Each reconcile builds a [`ClusterView`] from the Node cache (plus the objects our own patches
//! returned, which may be newer), the current notices per node (from
//! [`NodeStates::subscribe_events`](crate::controller::state::nodestate::NodeStates::subscribe_events): agents and
//! OCI Events; a cancellation replaces the notice it withdraws) and the drain tasks; calls
//! [`decide_with_status`]; and hands each node's actions to the [`Actor`].
//!
//! Triggers: a node change the policy can see ([`NodeWake`](crate::controller::engine::wake::NodeWake)) or a notice (debounced by
//! `[controller.engine] debounce`), a drain's
//! progress, the moment the next repair toleration expires ([`next_expiry`]: a decision after
//! expiry does not wait for the tick), and a periodic tick (`tick`, default 1 s). All progress
//! is on the Nodes (see [`keys`]), so a restarted controller resumes
//! from the annotations:
//! the policy re-asserts cordons and taints, restarts interrupted drains, and never requests a
//! replacement twice (`replacement-requested` is stored before the provider is called;
//! [`REPLACEMENT_ACCEPTED`] after it accepted; in between, the same idempotency key is reused).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::Store;
use tokio::sync::{broadcast, watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::controller::act::actions::{Actor, REPLACEMENT_ACCEPTED};
use crate::controller::act::drain::tasks::DrainTasks;
use crate::controller::config::EngineConfig;
use crate::controller::engine::fence_gate::{FenceGate, FENCE_WRITES};
use crate::controller::metrics::{EngineMetrics, Wake};
use crate::controller::policy::fence::{fence_now, fence_only};
use crate::controller::policy::interruption::notice_recorded;
use crate::controller::policy::nodepool::POOL_LABEL;
use crate::controller::policy::repair::{next_expiry, Due};
use crate::controller::policy::view::{
    became_ready, keys, ConditionView, Notice, NoticeKind, TaintView,
};
use crate::controller::policy::{
    decide_groups, decide_interruption, decide_with_status, Action, ClusterView, Decision,
    NodeView, PolicyConfig,
};
use crate::wire::NodeEvent;

mod due;
mod fast_path;
mod fence;
use fence::FenceBy;
pub mod fence_gate;
mod lifecycle;
mod node_order;
pub mod notice_thread;
mod notices;
mod reconcile;
#[cfg(test)]
mod run_tests;
mod view;
pub mod wake;
#[cfg(test)]
mod wake_tests;

pub use crate::controller::clock::{Clock, SystemClock};
use crate::sync::lock;
use node_order::{NodeOrder, View};
pub use notices::{NotRecorded, Recorded};
use reconcile::by_node;
pub use view::node_view;
pub(crate) use view::time;

/// How long a withdrawn notice's cancellation is kept (so the policy sees it).
const KEEP_CANCELLED: Duration = Duration::from_secs(3600);

/// The engine.
pub struct Engine {
    cfg: EngineConfig,
    policy: PolicyConfig,
    clock: Arc<dyn Clock>,
    store: Store<Node>,
    /// The NodePool cache (`[budgets] source = "nodepool"`).
    nodepools: Option<Store<kube::core::DynamicObject>>,
    actor: Arc<Actor>,
    drains: Arc<DrainTasks>,
    /// Metrics (also rendered on `/metrics`).
    pub metrics: Arc<EngineMetrics>,
    notices: Mutex<HashMap<String, Vec<Notice>>>,
    /// The boot id of each node agent's last report (a shutdown notice belongs to the boot it
    /// came from: [`crate::controller::policy::lifecycle`]).
    agent_boots: Mutex<HashMap<String, String>>,
    /// Nodes seen Ready at least once by this process (a node that fails soon after its
    /// creation is still one that became Ready, whatever the transition-time heuristic says;
    /// young nodes also get [`keys::SEEN_READY`], which survives a restart).
    seen_ready: Mutex<std::collections::HashSet<String>>,
    wake: Arc<Notify>,
    /// Bumped after every reconcile and fast path (waiters re-read the Nodes).
    progress: watch::Sender<u64>,
    /// The one per-node serialisation of the engine's writes ([`NodeOrder`]: its invariants).
    order: NodeOrder,
    /// Paces the Karpenter fence's writes behind the engine's other Node writes ([`FenceGate`]:
    /// why, and the figures behind it).
    fence_gate: FenceGate,
    /// When the next repair toleration expires, and in which groups (the run loop wakes then,
    /// not at its next tick, and decides those groups first).
    next_due: Mutex<Option<Due>>,
    /// How long a reconcile takes, microseconds: the longest recent one (each reconcile lowers it
    /// by an eighth, unless it took longer), so that one quick reconcile does not hide the slow.
    reconcile_us: AtomicU64,
    /// The notice thread's runtime ([`crate::controller::engine::notice_thread`]), where the notices' intake and the fast path
    /// run (none: the engine's).
    notice_thread: crate::controller::engine::notice_thread::Home,
    /// The engine's own runtime, where what follows a fast path's own patch runs.
    home: crate::controller::engine::notice_thread::Home,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

/// A duration in whole microseconds (for log fields).
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// What the engine is built from.
pub struct EngineParts {
    /// `[controller.engine]`.
    pub cfg: EngineConfig,
    /// `[repair]`, `[budgets]`, `[interruption]`, `dry_run`.
    pub policy: PolicyConfig,
    /// Clock.
    pub clock: Arc<dyn Clock>,
    /// Node cache.
    pub store: Store<Node>,
    /// The NodePool cache, with `[budgets] source = "nodepool"` (see [`crate::controller::state::nodepools`]).
    pub nodepools: Option<Store<kube::core::DynamicObject>>,
    /// Actor.
    pub actor: Arc<Actor>,
    /// Drain tasks.
    pub drains: Arc<DrainTasks>,
    /// Metrics.
    pub metrics: Arc<EngineMetrics>,
    /// Notified on node changes and drain progress.
    pub wake: Arc<Notify>,
    /// The notice lane's runtime, where the fast path runs ([`crate::controller::engine::notice_thread`]; none: the engine's).
    pub lane: Option<tokio::runtime::Handle>,
}

impl Engine {
    /// An engine.
    pub fn new(p: EngineParts) -> Arc<Self> {
        Arc::new(Engine {
            cfg: p.cfg,
            policy: p.policy,
            clock: p.clock,
            store: p.store,
            nodepools: p.nodepools,
            actor: p.actor,
            drains: p.drains,
            metrics: p.metrics,
            notices: Mutex::new(HashMap::new()),
            agent_boots: Mutex::new(HashMap::new()),
            seen_ready: Mutex::new(Default::default()),
            wake: p.wake,
            progress: watch::channel(0).0,
            order: NodeOrder::default(),
            fence_gate: FenceGate::new(FENCE_WRITES),
            next_due: Mutex::new(None),
            reconcile_us: AtomicU64::default(),
            notice_thread: crate::controller::engine::notice_thread::Home::on(p.lane),
            home: crate::controller::engine::notice_thread::Home::here(),
        })
    }

    fn bump(&self) {
        self.progress.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The drain tasks (reports of finished drains, for tests and status).
    pub fn drains(&self) -> &Arc<DrainTasks> {
        &self.drains
    }

    /// Runs until `cancel`: reconciles while `leader` is true; collects notices from `events`
    /// (in their own task, so a notice is acted on during a long reconcile too).
    pub async fn run(
        self: Arc<Self>,
        mut leader: watch::Receiver<bool>,
        events: broadcast::Receiver<(String, NodeEvent)>,
        cancel: CancellationToken,
    ) {
        // On the notice lane: a notice handed over by a report's handler wakes the lane's thread
        // at once, not a task that waits for one of the shared runtime's workers.
        let mut notices = self.notice_thread.spawn(self.clone().take_notices(
            leader.clone(),
            events,
            cancel.clone(),
        ));
        // Budgets from NodePools: no decision before the NodePools are known (else a group would
        // briefly fall back to the configured budgets).
        if let Some(pools) = &self.nodepools {
            tokio::select! {
                _ = cancel.cancelled() => return,
                r = pools.wait_until_ready() => if r.is_err() {
                    tracing::error!("the NodePool cache was dropped");
                    return;
                },
            }
            tracing::info!(nodepools = pools.state().len(), "nodepool cache synced");
        }
        let mut tick = tokio::time::interval(self.cfg.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut was_leader = false;
        loop {
            let due = self.until_due();
            let cause = tokio::select! {
                _ = cancel.cancelled() => break,
                // The notice intake is part of the engine: if it ends, so does the engine (and a
                // panic there is the engine's, for the controller's supervisor to report).
                r = &mut notices => {
                    // On shutdown the intake ends with the cancel: that is no failure.
                    if cancel.is_cancelled() && matches!(&r, Ok(())) {
                        break;
                    }
                    self.drains.stop_all();
                    if let Err(e) = r {
                        if e.is_panic() {
                            std::panic::resume_unwind(e.into_panic());
                        }
                    }
                    tracing::error!("the engine's notice intake ended");
                    return;
                }
                _ = tick.tick() => Wake::Tick,
                _ = self.wake.notified() => Wake::Change,
                _ = leader.changed() => Wake::Leader,
                _ = async { tokio::time::sleep(due.unwrap_or_default()).await }, if due.is_some() => Wake::Due,
            };
            self.metrics.wake(cause);
            // The fast paths and provider calls that ended are taken out (a panic was logged).
            self.actor.background.reap();
            if cause == Wake::Change && !self.cfg.debounce.is_zero() {
                tokio::time::sleep(self.cfg.debounce).await;
            }
            let is_leader = *leader.borrow();
            if !is_leader {
                if was_leader {
                    tracing::info!("leadership lost: stopping drains");
                    self.drains.stop_all();
                }
                was_leader = false;
                continue;
            }
            was_leader = true;
            // Past the expiry, whatever woke the loop (a change may win the race with the timer):
            // the due groups first.
            let now = self.clock.now();
            let expired = lock(&self.next_due).take_if(|d| d.at <= now);
            if let Some(due) = expired {
                // A lifecycle condition's moment has no group to decide first.
                if !due.groups.is_empty() {
                    self.due_path(&due.groups).await;
                }
            } else if self.due_before_done() {
                // A reconcile started now would still be running at the expiry, and the due path
                // would wait for it: both run at the expiry instead.
                self.metrics.reconciles_held.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            self.reconcile().await;
        }
        self.drains.stop_all();
    }
}

/// How to run the engine inside [`crate::controller::start_with`].
pub struct EngineOptions {
    /// `[repair]`, `[budgets]`, `[interruption]`, `dry_run`.
    pub policy: PolicyConfig,
    /// Clock (default: wall time).
    pub clock: Arc<dyn Clock>,
    /// Replacement provider (default: built from `[controller.provider]`).
    pub provider: Option<Arc<dyn crate::controller::act::provider::NodeProvider>>,
    /// Client for drains, without kube's transparent 429 retry (default: the controller's).
    pub drain_client: Option<kube::Client>,
    /// Notification hook (see [`crate::controller::act::actions::Notifier`]).
    pub notifier: Option<Arc<dyn crate::controller::act::actions::Notifier>>,
    /// The notice lane ([`crate::controller::engine::notice_thread`]; default: none, the fast path runs on the caller's
    /// runtime and writes through the controller's client).
    pub lane: Option<crate::controller::engine::notice_thread::Lane>,
}

impl EngineOptions {
    /// Wall time, the configured provider, the controller's client, no notifications.
    pub fn new(policy: PolicyConfig) -> Self {
        EngineOptions {
            policy,
            clock: Arc::new(SystemClock),
            provider: None,
            drain_client: None,
            notifier: None,
            lane: None,
        }
    }
}

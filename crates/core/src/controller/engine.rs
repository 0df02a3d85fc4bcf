//! The disruption engine: the reconcile loop of `nodekeeper controller` (only while leader).
//!
//! Each reconcile builds a [`ClusterView`] from the Node cache (plus the objects our own patches
//! returned, which may be newer), the current notices per node (from
//! [`NodeStates::subscribe_events`](super::nodestate::NodeStates::subscribe_events): agents and
//! OCI Events; a cancellation replaces the notice it withdraws) and the drain tasks; calls
//! [`decide_with_status`]; and hands each node's actions to the [`Actor`].
//!
//! Triggers: a node change the policy can see ([`NodeWake`](super::wake::NodeWake)) or a notice (debounced by
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

use super::actions::{Actor, REPLACEMENT_ACCEPTED};
use super::config::EngineConfig;
use super::drain::tasks::DrainTasks;
use super::fence_gate::{FenceGate, FENCE_WRITES};
use super::metrics::{EngineMetrics, Wake};
use super::policy::fence::{fence_now, fence_only};
use super::policy::interruption::notice_recorded;
use super::policy::repair::{next_expiry, Due};
use super::policy::view::{became_ready, keys, ConditionView, Notice, NoticeKind, TaintView};
use super::policy::{
    decide_groups, decide_interruption, decide_with_status, Action, ClusterView, Decision,
    NodeView, PolicyConfig,
};
use super::provider::POOL_LABEL;
use crate::wire::NodeEvent;

/// The engine's notion of "now": wall time in production, simulated time against the sim.
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> DateTime<Utc>;
    /// The real duration of `d` of this clock's time (identity for wall time).
    fn real(&self, d: Duration) -> Duration {
        d
    }
}

/// Wall time.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// How long a withdrawn notice's cancellation is kept (so the policy sees it).
const KEEP_CANCELLED: Duration = Duration::from_secs(3600);

/// Converts a Kubernetes time.
pub(crate) fn time(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> DateTime<Utc> {
    DateTime::from_timestamp(t.0.as_second(), t.0.subsec_nanosecond().max(0) as u32)
        .unwrap_or_default()
}

/// A Node as the policy sees it (without notices, drain and pods).
pub fn node_view(n: &Node) -> Option<NodeView> {
    let name = n.metadata.name.clone()?;
    let created_at = n
        .metadata
        .creation_timestamp
        .as_ref()
        .map(time)
        .unwrap_or_default();
    let spec = n.spec.as_ref();
    let status = n.status.as_ref();
    let conditions: Vec<ConditionView> = status
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| {
            cs.iter()
                .map(|c| ConditionView {
                    type_: c.type_.clone(),
                    status: c.status.clone(),
                    last_transition_time: c
                        .last_transition_time
                        .as_ref()
                        .map(time)
                        .unwrap_or(created_at),
                })
                .collect()
        })
        .unwrap_or_default();
    let ready = conditions.iter().find(|c| c.type_ == "Ready");
    let annotations = n.metadata.annotations.clone().unwrap_or_default();
    let became_ready = became_ready(created_at, ready, &annotations);
    Some(NodeView {
        name,
        labels: n.metadata.labels.clone().unwrap_or_default(),
        annotations,
        created_at,
        deleting: n.metadata.deletion_timestamp.is_some(),
        unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
        taints: spec
            .and_then(|s| s.taints.as_ref())
            .map(|ts| {
                ts.iter()
                    .map(|t| TaintView {
                        key: t.key.clone(),
                        value: t.value.clone().unwrap_or_default(),
                        effect: t.effect.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        conditions,
        became_ready,
        boot_id: status
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.boot_id.clone())
            .filter(|b| !b.is_empty()),
        notices: Vec::new(),
        drain: Default::default(),
        pods: Vec::new(),
    })
}

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
    /// Nodes seen Ready at least once by this process (a node that fails soon after its
    /// creation is still one that became Ready, whatever the transition-time heuristic says;
    /// young nodes also get [`keys::SEEN_READY`], which survives a restart).
    seen_ready: Mutex<std::collections::HashSet<String>>,
    wake: Arc<Notify>,
    /// Bumped after every reconcile and fast path (waiters re-read the Nodes).
    progress: watch::Sender<u64>,
    /// One lane per node: the fast path and the reconcile never act on a node at once.
    lanes: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The fence's writes (fast paths' and reconciles'), at most [`FENCE_WRITES`] in flight,
    /// each started once no other Node write of the engine is in flight ([`FenceGate`]): a notice
    /// in a NodePool of hundreds of nodes fences them all, and a wave of notices in many NodePools
    /// would otherwise send thousands of PATCHes at once, filling the controller's API Priority
    /// and Fairness queue until kube-apiserver refuses its cordons too (429), and slowing the
    /// wave's cordons on a busy kube-apiserver.
    fence_gate: FenceGate,
    /// Per node, the [`Self::epoch`] at which the fast path last finished acting on it.
    touched: Mutex<HashMap<String, u64>>,
    epoch: AtomicU64,
    /// When the next repair toleration expires, and in which groups (the run loop wakes then,
    /// not at its next tick, and decides those groups first).
    next_due: Mutex<Option<Due>>,
    /// How long a reconcile takes, microseconds: the longest recent one (each reconcile lowers it
    /// by an eighth, unless it took longer), so that one quick reconcile does not hide the slow.
    reconcile_us: AtomicU64,
    /// The notice lane's runtime ([`super::lane`]), where the notices' intake and the fast path
    /// run (none: the engine's).
    lane: super::lane::Home,
    /// The engine's own runtime, where what follows a fast path's own patch runs.
    home: super::lane::Home,
}

/// What the fast path hands to [`Engine::after_notice`] once the node's own patch is answered.
struct AfterNotice {
    node: String,
    view: NodeView,
    actions: Vec<Action>,
    /// Where the actions after the own patch begin ([`Actor::write_leading`]).
    rest: usize,
    /// The own patch's result.
    first: Result<(), super::actions::ActionError>,
    now: DateTime<Utc>,
    /// The node's lane, held until its actions are done.
    guard: tokio::sync::OwnedMutexGuard<()>,
}

/// Why a notice could not be recorded on its Node.
#[derive(Debug, thiserror::Error)]
pub enum NotRecorded {
    /// This replica does not hold the Lease (only the leader writes).
    #[error("not the leader")]
    NotLeader,
    /// The Node is not in the cache.
    #[error("node {0} not found")]
    NoNode(String),
    /// Not recorded within the time allowed.
    #[error("not recorded on node {node} within {waited:?}")]
    Timeout {
        /// Node.
        node: String,
        /// How long it waited.
        waited: Duration,
    },
}

/// How a notice stands after [`Engine::record_notice`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// Stored on the Node (or superseded by what is stored, or asking for nothing).
    OnNode,
    /// `dry_run`: nothing is ever written; accepted in memory only.
    DryRun,
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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
    /// The NodePool cache, with `[budgets] source = "nodepool"` (see [`super::nodepools`]).
    pub nodepools: Option<Store<kube::core::DynamicObject>>,
    /// Actor.
    pub actor: Arc<Actor>,
    /// Drain tasks.
    pub drains: Arc<DrainTasks>,
    /// Metrics.
    pub metrics: Arc<EngineMetrics>,
    /// Notified on node changes and drain progress.
    pub wake: Arc<Notify>,
    /// The notice lane's runtime, where the fast path runs ([`super::lane`]; none: the engine's).
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
            seen_ready: Mutex::new(Default::default()),
            wake: p.wake,
            progress: watch::channel(0).0,
            lanes: Mutex::new(HashMap::new()),
            fence_gate: FenceGate::new(FENCE_WRITES),
            touched: Mutex::new(HashMap::new()),
            epoch: AtomicU64::new(0),
            next_due: Mutex::new(None),
            reconcile_us: AtomicU64::default(),
            lane: super::lane::Home::on(p.lane),
            home: super::lane::Home::here(),
        })
    }

    fn lane(&self, node: &str) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.lanes)
            .entry(node.to_string())
            .or_default()
            .clone()
    }

    fn bump(&self) {
        self.progress.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// One node as the policy sees it now (the cache or our fresher patch result, its notices,
    /// its drain), without building the whole cluster.
    pub fn node_now(&self, name: &str) -> Option<NodeView> {
        let cached = self
            .store
            .get(&kube::runtime::reflector::ObjectRef::<Node>::new(name))?;
        self.view_of(&cached)
    }

    /// One cached Node as the policy sees it: our fresher patch answer if there is one, with
    /// what only the engine knows ([`Self::complete`]).
    fn view_of(&self, cached: &Node) -> Option<NodeView> {
        let fresh = self.actor.fresher(cached);
        let mut v = node_view(fresh.as_deref().unwrap_or(cached))?;
        self.complete(&mut v);
        Some(v)
    }

    /// Adds what only the engine knows to a node built by [`node_view`].
    fn complete(&self, v: &mut NodeView) {
        v.notices = self.notices(&v.name);
        v.drain = self.drains.view(&v.name);
        let mut seen = lock(&self.seen_ready);
        if v.is_ready() && !seen.contains(&v.name) {
            seen.insert(v.name.clone());
        }
        v.became_ready |= seen.contains(&v.name);
    }

    /// The fast path after a notice: when the policy's decision for `node` does not depend on
    /// the rest of the cluster ([`decide_interruption`]: the interruption flow owns it and
    /// nothing waits for a budget), act on it now, without the whole [`ClusterView`]. The full
    /// reconcile that follows decides the same for this node (and, having read the node before
    /// this acted, skips it). Returns whether it acted. `spawned`: when its task was spawned
    /// (logged with `notice acted on`: how long it waited for a thread and the node's lane).
    ///
    /// Where it runs: spawned on the notice lane ([`super::lane`]), it decides there and writes
    /// the node's own patch (the taint, the cordon, the notice's annotation) through the lane's
    /// client ([`Actor::write_leading`]); the rest — the node's Events and drain, and the
    /// Karpenter fence — runs on the engine's runtime (`Engine::after_notice`).
    pub async fn fast_path(self: &Arc<Self>, node: &str, spawned: std::time::Instant) -> bool {
        let started = std::time::Instant::now();
        let guard = self.lane(node).lock_owned().await;
        let now = self.clock.now();
        let Some(v) = self.node_now(node) else {
            return false;
        };
        let Some(actions) = decide_interruption(&v, &self.policy, now) else {
            return false;
        };
        if actions.is_empty() {
            return false;
        }
        let dry_run = self.policy.controller.dry_run;
        let writing = std::time::Instant::now();
        let (rest, first) = {
            // The fence's writes give way to this one.
            let _urgent = self.fence_gate.urgent();
            self.actor.write_leading(node, &actions, dry_run).await
        };
        tracing::info!(
            node,
            ok = first.is_ok(),
            queued_us = micros(started - spawned),
            decided_us = micros(writing - started),
            took_ms = writing.elapsed().as_millis() as u64,
            "notice acted on"
        );
        let after = AfterNotice {
            node: node.to_string(),
            view: v,
            actions,
            rest,
            first,
            now,
            guard,
        };
        if let Err(e) = self.home.spawn(self.clone().after_notice(after)).await {
            tracing::warn!(node, error = %e, "fast path's follow-up failed; the next reconcile retries it");
        }
        true
    }

    /// The fast path after the node's own patch ([`Self::fast_path`]), on the engine's runtime:
    /// the node's Events and the rest of its actions (the drain), and beside them the Karpenter
    /// fence ([`fence_now`]) on the NodePool's other nodes, whose views are built now (a pass
    /// over the whole cache) — not a reconcile later, so that Karpenter starts no voluntary
    /// disruption there in between — each write giving way to the engine's other writes
    /// ([`FenceGate`]). A fenced node another task is writing right now (its lane is taken) is
    /// left to the reconcile, which fences it too.
    async fn after_notice(self: Arc<Self>, a: AfterNotice) {
        let AfterNotice {
            node,
            view,
            actions,
            rest,
            first,
            now,
            guard,
        } = a;
        let dry_run = self.policy.controller.dry_run;
        let own = async {
            let done = match first {
                Ok(()) => {
                    self.actor
                        .execute_rest(&node, &actions, rest, dry_run)
                        .await
                }
                Err(e) => Err(e),
            };
            if let Err(e) = done {
                tracing::warn!(error = %e, "fast path failed; retried by the next reconcile");
            }
            self.touch(&node);
            drop(guard);
            // Counted when the node's own actions are done, not after the fence's writes too.
            self.metrics.fast_paths.fetch_add(1, Ordering::Relaxed);
        };
        // Beside the node's Events and drain start: the fence waits for its own patch alone.
        let fences = async {
            let mut fence: BTreeMap<String, Vec<Action>> = BTreeMap::new();
            for (n, a) in fence_now(&self.pool_of(view), &node, &actions, now) {
                fence.entry(n).or_default().push(a);
            }
            let me = &self;
            futures::future::join_all(fence.into_iter().map(|(n, marks)| async move {
                if me.write_fence(&n, &marks, None).await {
                    me.touch(&n);
                }
            }))
            .await
        };
        tokio::join!(own, fences);
        self.bump();
    }

    /// Starts the fast path for `node` on the notice lane.
    fn spawn_fast_path(self: &Arc<Self>, node: String) {
        let (me, spawned) = (self.clone(), std::time::Instant::now());
        drop(self.lane.spawn(async move {
            me.fast_path(&node, spawned).await;
        }));
    }

    /// Counts `node` as acted on by a fast path now: a reconcile whose view predates this skips it.
    fn touch(&self, node: &str) {
        let done = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        lock(&self.touched).insert(node.to_string(), done);
    }

    /// Whether a fast path acted on `node` since `epoch` (a view of then is out of date there).
    fn acted_since(&self, node: &str, epoch: u64) -> bool {
        let since = lock(&self.touched).get(node).is_some_and(|t| *t > epoch);
        if since {
            tracing::debug!(
                node,
                "acted on by the fast path since this view; next round"
            );
        }
        since
    }

    /// Writes fence-only `marks` ([`fence_only`]) on `node` through the [`FenceGate`]: at most
    /// [`FENCE_WRITES`] in flight, each once the engine's other writes are answered; not when the
    /// node's lane is taken (another write of it in flight: the next reconcile fences it), a fast
    /// path acted on it since `epoch` (the reconcile's view), or the cached Node already carries
    /// them (a fast path and a reconcile deciding the same fence). Returns whether it wrote.
    async fn write_fence(&self, node: &str, marks: &[Action], epoch: Option<u64>) -> bool {
        let Some(_slot) = self.fence_gate.fence_slot().await else {
            return false;
        };
        let lane = self.lane(node);
        let Ok(_guard) = lane.try_lock() else {
            tracing::debug!(node, "being written; fenced next round");
            return false;
        };
        if epoch.is_some_and(|e| self.acted_since(node, e)) || self.carries(node, marks) {
            return false;
        }
        if let Err(e) = self
            .actor
            .execute(node, marks, self.policy.controller.dry_run)
            .await
        {
            tracing::warn!(error = %e, "fence failed; retried by the next reconcile");
        }
        true
    }

    /// Whether the cached `node` (or the engine's fresher answer for it) already has every
    /// annotation `actions` set or remove.
    fn carries(&self, node: &str, actions: &[Action]) -> bool {
        let Some(v) = self.node_now(node) else {
            return false;
        };
        actions.iter().all(|a| match a {
            Action::Annotate { key, value } => v.annotation(key) == value.as_deref(),
            _ => false,
        })
    }

    /// `v` and the other nodes of its Karpenter NodePool as the policy sees them now (only `v`
    /// when it has none).
    fn pool_of(&self, v: NodeView) -> Vec<NodeView> {
        let Some(pool) = v.labels.get(POOL_LABEL).cloned() else {
            return vec![v];
        };
        let mut out: Vec<NodeView> = self
            .store
            .state()
            .iter()
            .filter(|n| {
                n.metadata.name.as_deref() != Some(v.name.as_str())
                    && n.metadata.labels.as_ref().and_then(|l| l.get(POOL_LABEL)) == Some(&pool)
            })
            .filter_map(|n| self.view_of(n))
            .collect();
        out.push(v);
        out
    }

    /// Hands a notice to the engine and waits (at most `timeout`, while `leader` holds) until the
    /// Node stores it ([`notice_recorded`]: the interruption annotation, written in the same
    /// patch as its taint and cordon), so that a controller killed afterwards loses nothing.
    pub async fn record_notice(
        &self,
        node: &str,
        ev: &NodeEvent,
        leader: &watch::Receiver<bool>,
        timeout: Duration,
    ) -> Result<Recorded, NotRecorded> {
        if self.policy.controller.dry_run {
            return Ok(Recorded::DryRun);
        }
        let notice = Notice::from(ev);
        let mut progress = self.progress.subscribe();
        let end = tokio::time::Instant::now() + timeout;
        loop {
            if !*leader.borrow() {
                return Err(NotRecorded::NotLeader);
            }
            let v = self
                .node_now(node)
                .ok_or_else(|| NotRecorded::NoNode(node.to_string()))?;
            if notice_recorded(&v, &notice, &self.policy) {
                return Ok(Recorded::OnNode);
            }
            // Re-read after each reconcile or fast path, and now and then in any case.
            let step = tokio::time::Instant::now() + Duration::from_millis(100);
            let wait = tokio::time::timeout_at(step.min(end), progress.changed()).await;
            if tokio::time::Instant::now() >= end {
                return Err(NotRecorded::Timeout {
                    node: node.to_string(),
                    waited: timeout,
                });
            }
            if matches!(wait, Ok(Err(_))) {
                tokio::time::sleep_until(step).await;
            }
        }
    }

    /// The drain tasks (reports of finished drains, for tests and status).
    pub fn drains(&self) -> &Arc<DrainTasks> {
        &self.drains
    }

    /// Records a notice for `node` (a cancellation replaces the notice it withdraws); true when
    /// the engine did not hold it yet.
    pub fn add_notice(&self, node: &str, ev: &NodeEvent) -> bool {
        let n = Notice::from(ev);
        let mut all = lock(&self.notices);
        let list = all.entry(node.to_string()).or_default();
        if let NoticeKind::Cancelled { of } = &n.kind {
            list.retain(|x| &x.id != of);
        }
        let added = !list.iter().any(|x| x.id == n.id && x.kind == n.kind);
        if added {
            list.push(n);
        }
        drop(all);
        self.wake.notify_one();
        added
    }

    /// Hands a redelivered notice to the engine again (a notice not stored before a failed
    /// write, a lagging broadcast or a restart): when the engine did not hold it, it is added
    /// and the fast path started. Idempotent.
    pub fn renotice(self: &Arc<Self>, node: &str, ev: &NodeEvent) {
        if self.add_notice(node, ev) {
            self.spawn_fast_path(node.to_string());
        }
    }

    /// The ids of `events` (an agent's report) that `node` stores within `timeout`, waited for
    /// together ([`Self::record_notice`]; each handed to the engine again first): only these are
    /// acknowledged, so the agent resends the others until a leader stores them.
    pub async fn recorded_ids(
        self: &Arc<Self>,
        node: &str,
        events: &[NodeEvent],
        leader: &watch::Receiver<bool>,
        timeout: Duration,
    ) -> Vec<String> {
        let waits = events.iter().map(|ev| async move {
            self.renotice(node, ev);
            match self.record_notice(node, ev, leader, timeout).await {
                Ok(_) => Some(ev.id.clone()),
                Err(e) => {
                    tracing::debug!(node, id = %ev.id, error = %e,
                        "notice not acknowledged yet: the agent resends it");
                    None
                }
            }
        });
        futures::future::join_all(waits)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// The current notices of `node`.
    pub fn notices(&self, node: &str) -> Vec<Notice> {
        lock(&self.notices).get(node).cloned().unwrap_or_default()
    }

    /// Forgets notices of gone nodes and notices long past.
    fn prune_notices(&self, alive: &BTreeMap<String, ()>, now: DateTime<Utc>) {
        let keep_for =
            chrono::Duration::from_std(self.policy.interruption.release_after + KEEP_CANCELLED)
                .unwrap_or(chrono::Duration::MAX);
        let mut all = lock(&self.notices);
        all.retain(|node, _| alive.contains_key(node));
        for list in all.values_mut() {
            list.retain(|n| {
                let at = n.at.unwrap_or(n.detected_at).max(n.detected_at);
                at.checked_add_signed(keep_for).is_none_or(|end| end > now)
            });
        }
    }

    /// The cluster as of now.
    pub fn view(&self, now: DateTime<Utc>) -> ClusterView {
        let nodes: Vec<NodeView> = self
            .store
            .state()
            .iter()
            .filter_map(|n| self.view_of(n))
            .collect();
        let alive: BTreeMap<String, ()> = nodes.iter().map(|n| (n.name.clone(), ())).collect();
        self.prune_notices(&alive, now);
        self.drains.retain(|n| alive.contains_key(n));
        self.actor.retain(|n| alive.contains_key(n));
        lock(&self.seen_ready).retain(|n| alive.contains_key(n));
        lock(&self.lanes).retain(|n, _| alive.contains_key(n));
        lock(&self.touched).retain(|n, _| alive.contains_key(n));
        ClusterView {
            nodes,
            nodepools: self.nodepool_budgets(),
        }
    }

    /// The budgets of the cached NodePools (none without `[budgets] source = "nodepool"`).
    fn nodepool_budgets(&self) -> BTreeMap<String, super::policy::nodepool::PoolBudgets> {
        self.nodepools
            .as_ref()
            .map(super::nodepools::budgets)
            .unwrap_or_default()
    }

    /// One reconcile: decide and act. Returns the number of actions decided.
    pub async fn reconcile(self: &Arc<Self>) -> usize {
        let started = std::time::Instant::now();
        let now = self.clock.now();
        // Nodes the fast path acts on after this are skipped: this view predates them.
        let epoch = self.epoch.load(Ordering::SeqCst);
        // Building the view and deciding for every node is CPU-bound (a quarter of a second at
        // 5,000 nodes in a debug build): off the async workers, so that the fast path after a
        // notice, agent reports and the API are not queued behind it.
        let me = self.clone();
        let planned = tokio::task::spawn_blocking(move || {
            let view = me.view(now);
            let (decisions, groups) = decide_with_status(&view, &me.policy, now);
            *lock(&me.next_due) = next_expiry(&view, &me.policy, now);
            (view, decisions, groups)
        })
        .await;
        let (view, decisions, groups) = match planned {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, "reconcile failed; next round");
                return 0;
            }
        };
        self.metrics.set_groups(groups);
        let mut held: BTreeMap<&'static str, u64> = BTreeMap::new();
        for h in view.nodes.iter().filter_map(|n| n.record().held) {
            *held.entry(h.blocker.reason()).or_default() += 1;
        }
        self.metrics.set_held(held);
        let dry_run = self.policy.controller.dry_run;
        if !dry_run {
            self.retry_provider_calls(&view);
        }
        let count = decisions.len();
        let mut by_node = by_node(decisions);
        if !dry_run {
            // Persist "seen Ready" for young nodes (in the node's first patch of this round).
            for n in view.nodes.iter().filter(|n| n.needs_seen_ready(now)) {
                by_node.entry(n.name.clone()).or_default().insert(
                    0,
                    Action::Annotate {
                        key: keys::SEEN_READY.to_string(),
                        value: Some(now.to_rfc3339()),
                    },
                );
            }
        }
        self.act(by_node, epoch).await;
        self.bump();
        self.metrics.reconciles.fetch_add(1, Ordering::Relaxed);
        if count > 0 {
            self.metrics
                .reconciles_with_actions
                .fetch_add(1, Ordering::Relaxed);
        }
        let us = micros(started.elapsed());
        self.metrics.last_reconcile_us.store(us, Ordering::Relaxed);
        let _ = self
            .reconcile_us
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |was| {
                Some(us.max(was - was / 8))
            });
        count
    }

    /// Executes each node's actions (at most `node_concurrency` nodes at once), in the node's
    /// lane, skipping a node the fast path acted on since `epoch` (its view predates that); the
    /// nodes whose actions are only the fence's through [`Self::write_fence`].
    async fn act(&self, by_node: BTreeMap<String, Vec<Action>>, epoch: u64) {
        // The fence's writes apart, so that none of them holds a place the others wait for.
        let (fences, others): (Vec<_>, Vec<_>) =
            by_node.into_iter().partition(|(_, a)| fence_only(a));
        // Boxed: a stream's closure futures inside `join!` trip the compiler's `Send` inference
        // for the spawned engine (rust-lang/rust#110338).
        let others = futures::stream::iter(others)
            .for_each_concurrent(self.cfg.node_concurrency.max(1), |(node, actions)| {
                self.act_on(node, actions, epoch)
            })
            .boxed();
        let fences = futures::future::join_all(
            fences
                .into_iter()
                .map(|(node, marks)| self.fence_on(node, marks, epoch)),
        )
        .boxed();
        let ((), _) = tokio::join!(others, fences);
    }

    /// One node's actions in its lane (waiting for it), counted as a write the fence gives way to.
    async fn act_on(&self, node: String, actions: Vec<Action>, epoch: u64) {
        let lane = self.lane(&node);
        let _guard = lane.lock().await;
        if self.acted_since(&node, epoch) {
            return;
        }
        let _urgent = self.fence_gate.urgent();
        let dry_run = self.policy.controller.dry_run;
        if let Err(e) = self.actor.execute(&node, &actions, dry_run).await {
            tracing::warn!(error = %e, "action failed; retried by the next reconcile");
        }
    }

    /// A reconcile's fence-only actions on one node ([`Self::write_fence`]).
    async fn fence_on(&self, node: String, marks: Vec<Action>, epoch: u64) -> bool {
        self.write_fence(&node, &marks, Some(epoch)).await
    }

    /// The due path, when a repair toleration expires ([`Due`]): decides and acts on the groups
    /// of the nodes whose toleration ended, from a view of those groups alone
    /// ([`decide_groups`]: the same decision the full reconcile makes for them), so that the
    /// repair's cordon does not wait for a view of the whole cluster. The full reconcile follows
    /// at once. When those groups hold more than half the cluster (one group, or none labelled),
    /// it leaves them to that reconcile, which then costs hardly more. Returns the number of
    /// actions decided.
    pub async fn due_path(self: &Arc<Self>, groups: &BTreeSet<String>) -> usize {
        let epoch = self.epoch.load(Ordering::SeqCst);
        // Off the async workers, as the reconcile's view (up to half the cluster here).
        let me = self.clone();
        let wanted = groups.clone();
        let planned = tokio::task::spawn_blocking(move || me.decide_due(&wanted)).await;
        let decisions = match planned {
            Ok(Some(d)) => d,
            Ok(None) => return 0,
            Err(e) => {
                tracing::error!(error = %e, "due path failed; the reconcile decides");
                return 0;
            }
        };
        let count = decisions.len();
        self.act(by_node(decisions), epoch).await;
        self.metrics.due_paths.fetch_add(1, Ordering::Relaxed);
        self.bump();
        count
    }

    /// [`Self::due_path`]'s view and decision; `None` when `groups` hold more than half the nodes.
    fn decide_due(&self, groups: &BTreeSet<String>) -> Option<Vec<Decision>> {
        let now = self.clock.now();
        let group_by = &self.policy.budgets.group_by;
        let all = self.store.state();
        let members: Vec<&Arc<Node>> = all
            .iter()
            .filter(|n| {
                let group = n.metadata.labels.as_ref().and_then(|l| l.get(group_by));
                groups.contains(group.map_or("", String::as_str))
            })
            .collect();
        if members.len() * 2 > all.len() {
            return None;
        }
        let view = ClusterView {
            nodes: members
                .into_iter()
                .filter_map(|n| self.view_of(n))
                .collect(),
            nodepools: self.nodepool_budgets(),
        };
        let decisions = decide_groups(&view, &self.policy, now, groups);
        tracing::debug!(
            groups = groups.len(),
            nodes = view.nodes.len(),
            actions = decisions.len(),
            "repair toleration expired: deciding its groups"
        );
        Some(decisions)
    }

    /// Repeats the provider calls a restart or a failure may have lost, with the same idempotency
    /// key: replacements recorded as requested but not accepted (a crash between the annotation
    /// and the call, or a failed call), and nodes recorded as handed over that are not being
    /// deleted yet (the providers' `retire` is idempotent; the actor asks once per process).
    fn retry_provider_calls(&self, view: &ClusterView) {
        for n in &view.nodes {
            let Some(at) = n.annotation(keys::REPLACEMENT_REQUESTED) else {
                continue;
            };
            let retire = if !n.annotations.contains_key(REPLACEMENT_ACCEPTED) {
                false
            } else if n.annotations.contains_key(keys::RETIRE_REQUESTED) && !n.deleting {
                true
            } else {
                continue;
            };
            let id = format!("{}/{}", n.name, at);
            let reason = n
                .annotation(keys::REASON)
                .unwrap_or("replacement")
                .to_string();
            let (actor, node) = (self.actor.clone(), n.name.clone());
            tokio::spawn(async move {
                let done = if retire {
                    actor.retire(&node, &id, &reason).await
                } else {
                    actor.replace(&node, &id, &reason).await
                };
                if let Err(e) = done {
                    tracing::warn!(error = %e, retire, "provider call failed");
                }
            });
        }
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
        let mut notices = self.lane.spawn(self.clone().take_notices(
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
                self.due_path(&due.groups).await;
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

    /// Real time until the next repair toleration expires (plus a little, so that the clock has
    /// passed it on waking), if one is running.
    fn until_due(&self) -> Option<Duration> {
        let due = lock(&self.next_due).as_ref()?.at;
        Some(wake_after(self.clock.as_ref(), due))
    }

    /// Whether the next repair toleration expires before a reconcile started now would end: sooner
    /// than twice a recent reconcile's duration (`reconcile_us`: they vary with the API's load),
    /// and at most a tick away (so that holding delays the rest of the reconcile's work by a tick
    /// at most).
    fn due_before_done(&self) -> bool {
        let took = Duration::from_micros(self.reconcile_us.load(Ordering::Relaxed));
        let window = (took * 2).min(self.cfg.tick);
        self.until_due().is_some_and(|left| left < window)
    }

    /// Records each notice (waking the reconcile) and, while leading, runs the fast path for
    /// its node at once. Runs on the notice lane when there is one.
    async fn take_notices(
        self: Arc<Self>,
        leader: watch::Receiver<bool>,
        mut events: broadcast::Receiver<(String, NodeEvent)>,
        cancel: CancellationToken,
    ) {
        loop {
            let (node, ev) = tokio::select! {
                _ = cancel.cancelled() => return,
                ev = events.recv() => match ev {
                    Ok(x) => x,
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "engine missed node events");
                        self.wake.notify_one();
                        continue;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            };
            let _ = self.add_notice(&node, &ev);
            if *leader.borrow() {
                self.spawn_fast_path(node);
            }
        }
    }
}

/// Decisions as each node's actions, in order.
fn by_node(decisions: Vec<Decision>) -> BTreeMap<String, Vec<Action>> {
    let mut out: BTreeMap<String, Vec<Action>> = BTreeMap::new();
    for d in decisions {
        out.entry(d.node).or_default().push(d.action);
    }
    out
}

/// The real time from `clock`'s now until `due`, plus 5 ms so that the clock has passed `due` on
/// waking (5 ms when `due` is past).
fn wake_after(clock: &dyn Clock, due: DateTime<Utc>) -> Duration {
    let left = (due - clock.now()).to_std().unwrap_or_default();
    clock.real(left) + Duration::from_millis(5)
}

/// How to run the engine inside [`super::start_with`].
pub struct EngineOptions {
    /// `[repair]`, `[budgets]`, `[interruption]`, `dry_run`.
    pub policy: PolicyConfig,
    /// Clock (default: wall time).
    pub clock: Arc<dyn Clock>,
    /// Replacement provider (default: built from `[controller.provider]`).
    pub provider: Option<Arc<dyn super::provider::NodeProvider>>,
    /// Client for drains, without kube's transparent 429 retry (default: the controller's).
    pub drain_client: Option<kube::Client>,
    /// Notification hook (see [`super::actions::Notifier`]).
    pub notifier: Option<Arc<dyn super::actions::Notifier>>,
    /// The notice lane ([`super::lane`]; default: none, the fast path runs on the caller's
    /// runtime and writes through the controller's client).
    pub lane: Option<super::lane::Lane>,
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

#[cfg(test)]
mod wake_tests {
    use super::*;

    /// A clock on tokio's (paused) time, running `speed` times faster than real time.
    pub(super) struct Paused {
        pub(super) base: DateTime<Utc>,
        pub(super) t0: tokio::time::Instant,
        pub(super) speed: u32,
    }

    impl Clock for Paused {
        fn now(&self) -> DateTime<Utc> {
            let elapsed = self.t0.elapsed() * self.speed;
            self.base + chrono::Duration::from_std(elapsed).unwrap_or_default()
        }
        fn real(&self, d: Duration) -> Duration {
            d / self.speed
        }
    }

    fn clock(speed: u32) -> Paused {
        Paused {
            base: DateTime::from_timestamp(1_700_000_000, 0).unwrap_or_default(),
            t0: tokio::time::Instant::now(),
            speed,
        }
    }

    /// The run loop's toleration timer: sleeping [`wake_after`] wakes 5 ms of real time after
    /// the expiry (so the reconcile then sees `now > due` and starts the repair), not a tick
    /// later and not before; on a faster clock the wait is scaled down.
    #[tokio::test(start_paused = true)]
    async fn the_engine_wakes_just_after_the_toleration_expires() {
        for speed in [1u32, 10] {
            let c = clock(speed);
            let due = c.now() + chrono::Duration::seconds(300);
            let wait = wake_after(&c, due);
            assert_eq!(
                wait,
                Duration::from_secs(300) / speed + Duration::from_millis(5)
            );
            tokio::time::sleep_until(c.t0 + Duration::from_secs(299) / speed).await;
            assert!(c.now() < due, "one second before: not due");
            tokio::time::sleep_until(c.t0 + wait).await;
            let late = c.now() - due;
            assert!(late > chrono::Duration::zero(), "speed {speed}: {late:?}");
            assert_eq!(
                late,
                chrono::Duration::milliseconds(5 * i64::from(speed)),
                "speed {speed}"
            );
        }
        let c = clock(1);
        let past = c.now() - chrono::Duration::seconds(10);
        assert_eq!(
            wake_after(&c, past),
            Duration::from_millis(5),
            "past: at once"
        );
    }
}

/// The run loop's timers on paused time: an engine over an empty Node cache and an apiserver
/// that is never reached; reconciles are counted through [`EngineMetrics::reconciles`].
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod run_tests {
    use super::*;
    use crate::controller::nodestate::{NodeStateConfig, NodeStates};
    use crate::controller::{actions::ActorParts, events::Recorder, provider};

    const MS: fn(u64) -> Duration = Duration::from_millis;

    struct Running {
        engine: Arc<Engine>,
        leader: watch::Sender<bool>,
        cancel: CancellationToken,
        task: tokio::task::JoinHandle<()>,
        _events: broadcast::Sender<(String, NodeEvent)>,
    }

    impl Running {
        fn reconciles(&self) -> u64 {
            self.engine.metrics.reconciles.load(Ordering::Relaxed)
        }
        async fn stop(self) {
            self.cancel.cancel();
            self.task.await.unwrap();
        }
    }

    fn start(tick: Duration, debounce: Duration, leader: bool) -> Running {
        let svc = tower::service_fn(|_req: hyper::Request<kube::client::Body>| async {
            hyper::Response::builder()
                .status(404)
                .body(kube::client::Body::from(b"{}".to_vec()))
        });
        let client = kube::Client::new(svc, "default");
        let (store, _writer) = kube::runtime::reflector::store::<Node>();
        let cfg = EngineConfig {
            tick,
            debounce,
            ..EngineConfig::default()
        };
        let (leader_tx, leader_rx) = watch::channel(leader);
        let engine = engine(client, store, cfg, leader_rx.clone());
        let (events, events_rx) = broadcast::channel(8);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(engine.clone().run(leader_rx, events_rx, cancel.clone()));
        Running {
            engine,
            leader: leader_tx,
            cancel,
            task,
            _events: events,
        }
    }

    /// An engine as the controller builds it, over `client` and the Node cache `store`.
    fn engine(
        client: kube::Client,
        store: Store<Node>,
        cfg: EngineConfig,
        leader_rx: watch::Receiver<bool>,
    ) -> Arc<Engine> {
        engine_with(client, store, cfg, leader_rx, PolicyConfig::default())
    }

    /// [`engine`] with `policy`.
    fn engine_with(
        client: kube::Client,
        store: Store<Node>,
        cfg: EngineConfig,
        leader_rx: watch::Receiver<bool>,
        policy: PolicyConfig,
    ) -> Arc<Engine> {
        engine_at(
            client,
            store,
            cfg,
            leader_rx,
            policy,
            Arc::new(SystemClock),
            None,
        )
    }

    /// [`engine_with`] on `clock`, with the notice lane `lane`.
    fn engine_at(
        client: kube::Client,
        store: Store<Node>,
        cfg: EngineConfig,
        leader_rx: watch::Receiver<bool>,
        policy: PolicyConfig,
        clock: Arc<dyn Clock>,
        lane: Option<crate::controller::lane::Lane>,
    ) -> Arc<Engine> {
        let (metrics, wake) = (Arc::new(EngineMetrics::default()), Arc::new(Notify::new()));
        let drains = Arc::new(DrainTasks::new(
            client.clone(),
            cfg.clone(),
            clock.clone(),
            metrics.clone(),
            wake.clone(),
        ));
        let recorder = Recorder::new(client.clone(), "test", None);
        let states = NodeStates::new(
            NodeStateConfig::from(&crate::controller::config::ControllerConfig::default()),
            client.clone(),
            store.clone(),
            leader_rx,
            recorder.clone(),
        );
        let actor = Arc::new(Actor::new(ActorParts {
            client,
            urgent_client: lane.as_ref().map(|l| l.client.clone()),
            cache: store.clone(),
            recorder,
            provider: Arc::new(provider::none::NoReplacement),
            states,
            drains: drains.clone(),
            metrics: metrics.clone(),
            notifier: None,
        }));
        Engine::new(EngineParts {
            cfg,
            policy,
            clock,
            store,
            nodepools: None,
            actor,
            drains,
            metrics,
            wake,
            lane: lane.map(|l| l.handle),
        })
    }

    /// The API's answer to a PATCH of Node `name`.
    fn node_answer(name: &str) -> Result<hyper::Response<kube::client::Body>, hyper::http::Error> {
        let node = serde_json::json!({ "apiVersion": "v1", "kind": "Node",
            "metadata": { "name": name, "resourceVersion": "2" } });
        hyper::Response::builder()
            .status(200)
            .body(kube::client::Body::from(node.to_string().into_bytes()))
    }

    fn not_found() -> Result<hyper::Response<kube::client::Body>, hyper::http::Error> {
        hyper::Response::builder()
            .status(404)
            .body(kube::client::Body::from(b"{}".to_vec()))
    }

    /// A Ready node of the Karpenter NodePool `spot`, seen Ready long ago.
    fn pool_node(name: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "resourceVersion": "1",
                "creationTimestamp": "2026-12-01T00:00:00Z",
                "labels": { POOL_LABEL: "spot" },
                "annotations": { keys::SEEN_READY: "2026-12-01T00:01:00Z" } },
            "spec": { "providerID": format!("kwok://{name}") },
            "status": { "conditions": [{ "type": "Ready", "status": "True", "reason": "KubeletReady",
                "lastHeartbeatTime": "2026-12-01T00:01:00Z",
                "lastTransitionTime": "2026-12-01T00:01:00Z" }] }
        }))
        .unwrap()
    }

    /// The fast path after a preemption notice writes the Karpenter fence on the NodePool's other
    /// node as soon as the notice's own patch is answered — not beside it (the cordon never shares
    /// kube-apiserver with the fence's writes) nor a reconcile later — and counts both nodes as
    /// acted on (so a reconcile whose view predates them skips them).
    #[tokio::test(start_paused = true)]
    async fn the_fast_path_fences_the_nodepool_once_the_cordon_is_answered() {
        type Seen = Arc<Mutex<Vec<(String, tokio::time::Instant)>>>;
        let seen: Seen = Default::default();
        let log = seen.clone();
        let svc = tower::service_fn(move |req: hyper::Request<kube::client::Body>| {
            let log = log.clone();
            async move {
                let at = tokio::time::Instant::now();
                let path = req.uri().path().to_string();
                let Some(name) = path.strip_prefix("/api/v1/nodes/") else {
                    return not_found();
                };
                let name = name.to_string();
                lock(&log).push((format!("{} {name}", req.method()), at));
                if name == "p" {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                node_answer(&name)
            }
        });
        let client = kube::Client::new(svc, "default");
        let (store, mut writer) = kube::runtime::reflector::store::<Node>();
        for n in ["p", "q"] {
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(pool_node(n)));
        }
        let (_leader, leader_rx) = watch::channel(true);
        let engine = engine(client, store, EngineConfig::default(), leader_rx);
        let notice = preemption_notice();
        assert!(engine.add_notice("p", &notice));
        assert!(
            engine.fast_path("p", std::time::Instant::now()).await,
            "acted"
        );
        let seen = lock(&seen).clone();
        let at = |what: &str| {
            seen.iter()
                .find(|(w, _)| w == what)
                .map(|(_, at)| *at)
                .unwrap_or_else(|| panic!("no {what} in {seen:?}"))
        };
        assert_eq!(
            at("PATCH q"),
            at("PATCH p") + Duration::from_millis(300),
            "the fence was sent once the node's own patch was answered, not after its later steps: {seen:?}"
        );
        let touched = lock(&engine.touched).clone();
        assert!(
            touched.contains_key("p") && touched.contains_key("q"),
            "{touched:?}"
        );
    }

    /// With the notice lane, the fast path runs on the lane's thread and the notice's own patch
    /// goes through the lane's client; what follows (the node's Events and drain, the fence on
    /// the NodePool's other node) through the controller's client, on its runtime: no request of
    /// that client is sent from the lane.
    #[tokio::test]
    async fn on_the_notice_lane_the_cordon_goes_through_the_lanes_client() {
        type Seen = Arc<Mutex<Vec<(&'static str, String, Option<String>)>>>;
        let seen: Seen = Default::default();
        let api = |via: &'static str| {
            let log = seen.clone();
            tower::service_fn(move |req: hyper::Request<kube::client::Body>| {
                let log = log.clone();
                async move {
                    let path = req.uri().path().to_string();
                    let Some(name) = path.strip_prefix("/api/v1/nodes/") else {
                        return not_found();
                    };
                    let thread = std::thread::current().name().map(str::to_string);
                    lock(&log).push((via, format!("{} {name}", req.method()), thread));
                    node_answer(name)
                }
            })
        };
        let started = crate::controller::lane::NoticeLane::start(kube::Config::new(
            "https://127.0.0.1:1".parse().expect("a URI"),
        ))
        .await
        .expect("the lane");
        let handle = started.lane().handle;
        // Built on the lane's runtime, as the lane builds its own client.
        let lane_api = api("lane");
        let urgent = handle
            .spawn(async move { kube::Client::new(lane_api, "default") })
            .await
            .expect("the lane's client");
        let (store, mut writer) = kube::runtime::reflector::store::<Node>();
        for n in ["p", "q"] {
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(pool_node(n)));
        }
        let (_leader, leader_rx) = watch::channel(true);
        let engine = engine_at(
            kube::Client::new(api("shared"), "default"),
            store,
            EngineConfig::default(),
            leader_rx,
            PolicyConfig::default(),
            Arc::new(SystemClock),
            Some(crate::controller::lane::Lane {
                handle,
                client: urgent,
            }),
        );
        engine.renotice("p", &preemption_notice());
        let end = tokio::time::Instant::now() + Duration::from_secs(10);
        while !lock(&seen).iter().any(|(_, w, _)| w == "PATCH q") {
            assert!(
                tokio::time::Instant::now() < end,
                "no fence: {:?}",
                lock(&seen)
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let seen = lock(&seen).clone();
        let lane = "nodekeeper-notices".to_string();
        assert!(
            seen.contains(&("lane", "PATCH p".into(), Some(lane.clone()))),
            "the cordon through the lane's client, on its thread: {seen:?}"
        );
        assert!(
            seen.iter()
                .filter(|(via, _, _)| *via == "shared")
                .all(|(_, _, t)| t.as_ref() != Some(&lane)),
            "the fence, the Events and the drain through the controller's client, on its runtime: {seen:?}"
        );
        assert!(
            !seen
                .iter()
                .any(|(via, w, _)| *via == "lane" && w != "PATCH p"),
            "only the notice's own patch on the lane: {seen:?}"
        );
    }

    /// Notices in two NodePools of 7 nodes each, at once: their fence writes (12 nodes) are at
    /// most [`FENCE_WRITES`] in flight across both fast paths, none before the notified nodes'
    /// own patches are answered, every node is fenced, and each notified node's own patch is sent
    /// at once, never queued behind a fence.
    #[tokio::test(start_paused = true)]
    async fn the_fast_paths_fence_at_most_fence_writes_nodes_at_once() {
        let (client, seen) = counting_api(|n| !n.ends_with('0'), Duration::from_secs(1));
        let (store, mut writer) = kube::runtime::reflector::store::<Node>();
        for pool in ["a", "b"] {
            for i in 0..7 {
                let n = pool_node_in(&format!("{pool}{i}"), pool);
                writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(n));
            }
        }
        let (_leader, leader_rx) = watch::channel(true);
        let engine = engine(client, store, EngineConfig::default(), leader_rx);
        let notice = preemption_notice();
        let start = tokio::time::Instant::now();
        assert!(engine.add_notice("a0", &notice) && engine.add_notice("b0", &notice));
        let (a, b) = tokio::join!(
            engine.fast_path("a0", std::time::Instant::now()),
            engine.fast_path("b0", std::time::Instant::now())
        );
        assert!(a && b, "acted");
        let (sent, _, max) = lock(&seen).clone();
        assert!(
            max <= FENCE_WRITES,
            "{max} fence writes in flight at once: {sent:?}"
        );
        assert_eq!(max, FENCE_WRITES, "the fence used its permits: {sent:?}");
        let fences: Vec<_> = sent.iter().filter(|(n, _)| !n.ends_with('0')).collect();
        assert!(
            fences
                .iter()
                .all(|(_, at)| *at >= start + Duration::from_secs(1)),
            "no fence write before the own patches were answered: {sent:?}"
        );
        let fenced: BTreeSet<&str> = fences.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(fenced.len(), 12, "every other node fenced: {sent:?}");
        for own in ["a0", "b0"] {
            let at = sent.iter().find(|(n, _)| n == own).map(|(_, at)| *at);
            assert_eq!(
                at,
                Some(start),
                "{own}'s own patch was sent at once: {sent:?}"
            );
        }
    }

    /// A reconcile's round of one cordon and six fence-only nodes, with `node_concurrency` 2: the
    /// cordon is sent at once although the fenced nodes come first (no fence holds a place it waits
    /// for), the fence's writes wait until it is answered, at most [`FENCE_WRITES`] in flight.
    #[tokio::test(start_paused = true)]
    async fn a_reconciles_fence_writes_give_way_to_its_cordon() {
        let (client, seen) = counting_api(|n| n.starts_with('f'), Duration::from_millis(400));
        let (store, mut writer) = kube::runtime::reflector::store::<Node>();
        let names: Vec<String> = (0..6)
            .map(|i| format!("f{i}"))
            .chain(["z".into()])
            .collect();
        for n in &names {
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(pool_node(n)));
        }
        let (_leader, leader_rx) = watch::channel(true);
        let cfg = EngineConfig {
            node_concurrency: 2,
            ..EngineConfig::default()
        };
        let engine = engine(client, store, cfg, leader_rx);
        let mark = |key: &str, value: &str| Action::Annotate {
            key: key.into(),
            value: Some(value.into()),
        };
        let mut round: BTreeMap<String, Vec<Action>> = names[..6]
            .iter()
            .map(|n| {
                let marks = vec![
                    mark(
                        keys::DO_NOT_DISRUPT_BY,
                        crate::controller::policy::fence::FENCE,
                    ),
                    mark(keys::KARPENTER_DO_NOT_DISRUPT, "true"),
                ];
                (n.clone(), marks)
            })
            .collect();
        round.insert("z".into(), vec![Action::Cordon]);
        let start = tokio::time::Instant::now();
        engine.act(round, 0).await;
        let (sent, _, max) = lock(&seen).clone();
        let at = |n: &str| sent.iter().find(|(s, _)| s == n).map(|(_, at)| *at);
        assert_eq!(at("z"), Some(start), "the cordon at once: {sent:?}");
        for f in &names[..6] {
            let at = at(f).unwrap_or_else(|| panic!("{f} not fenced: {sent:?}"));
            assert!(
                at >= start + Duration::from_millis(400),
                "{f} before the cordon was answered: {sent:?}"
            );
        }
        assert_eq!(max, FENCE_WRITES, "{sent:?}");
    }

    /// The Node writes sent (node, when), and of those `is_fence` picks the most in flight at once.
    type Counted = Arc<Mutex<(Vec<(String, tokio::time::Instant)>, usize, usize)>>;

    /// An API that answers each Node PATCH after `delay`, recording it in [`Counted`].
    fn counting_api(is_fence: fn(&str) -> bool, delay: Duration) -> (kube::Client, Counted) {
        let seen: Counted = Default::default();
        let log = seen.clone();
        let svc = tower::service_fn(move |req: hyper::Request<kube::client::Body>| {
            let log = log.clone();
            async move {
                let path = req.uri().path().to_string();
                let Some(name) = path.strip_prefix("/api/v1/nodes/") else {
                    return not_found();
                };
                let name = name.to_string();
                let fence = is_fence(&name);
                {
                    let mut l = lock(&log);
                    l.0.push((name.clone(), tokio::time::Instant::now()));
                    if fence {
                        l.1 += 1;
                        l.2 = l.2.max(l.1);
                    }
                }
                tokio::time::sleep(delay).await;
                if fence {
                    lock(&log).1 -= 1;
                }
                node_answer(&name)
            }
        });
        (kube::Client::new(svc, "default"), seen)
    }

    /// A preemption notice seen now, 2 minutes before the reclaim.
    fn preemption_notice() -> NodeEvent {
        let now = Utc::now();
        NodeEvent {
            version: crate::wire::NODE_EVENT_VERSION,
            id: "ev1".into(),
            kind: crate::wire::EventKind::Preemption,
            cloud: None,
            source: "test".into(),
            not_before: Some(now + chrono::Duration::seconds(120)),
            deadline: None,
            detected_at: now,
            detail: Default::default(),
        }
    }

    /// `pool_node` in the NodePool `pool`.
    fn pool_node_in(name: &str, pool: &str) -> Node {
        let mut n = pool_node(name);
        n.metadata.labels = Some([(POOL_LABEL.to_string(), pool.to_string())].into());
        n
    }

    /// A client whose API answers every PATCH of a Node with that Node (and anything else with
    /// 404), and the `METHOD path` of each request it was sent.
    fn recording_client() -> (kube::Client, Arc<Mutex<Vec<String>>>) {
        let seen: Arc<Mutex<Vec<String>>> = Default::default();
        let log = seen.clone();
        let svc = tower::service_fn(move |req: hyper::Request<kube::client::Body>| {
            let log = log.clone();
            async move {
                let path = req.uri().path().to_string();
                lock(&log).push(format!("{} {path}", req.method()));
                match path.strip_prefix("/api/v1/nodes/") {
                    Some(name) => node_answer(name),
                    None => not_found(),
                }
            }
        });
        (kube::Client::new(svc, "default"), seen)
    }

    /// `pool_node` in `pool`, `Ready=False` since long before the repair toleration.
    fn failed_node(name: &str, pool: &str) -> Node {
        let mut n = pool_node_in(name, pool);
        if let Some(c) = n.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            c[0].status = "False".into();
        }
        n
    }

    /// When a repair toleration expires, the due path decides the due node's group from that
    /// group's nodes alone and writes the repair at once: the expired node of the due group is
    /// patched; an expired node of another group is left to the full reconcile; the groups'
    /// healthy nodes are read, not written. Groups holding most of the cluster are left to the
    /// full reconcile.
    #[tokio::test(start_paused = true)]
    async fn the_due_path_starts_the_expired_repair_of_its_group_only() {
        let (client, seen) = recording_client();
        let (store, mut writer) = kube::runtime::reflector::store::<Node>();
        let mut nodes = vec![
            failed_node("due", "spot"),
            failed_node("elsewhere", "other"),
        ];
        nodes.extend((0..9).map(|i| pool_node(&format!("spot-{i}"))));
        nodes.extend((0..9).map(|i| pool_node_in(&format!("other-{i}"), "other")));
        for n in nodes {
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(n));
        }
        let (_leader, leader_rx) = watch::channel(true);
        let mut policy = PolicyConfig::default();
        policy.repair.policy = vec![crate::controller::policy::config::RepairPolicy {
            condition_type: "Ready".into(),
            condition_status: "False".into(),
            toleration: Duration::from_secs(600),
        }];
        let engine = engine_with(client, store, EngineConfig::default(), leader_rx, policy);
        let decided = engine.due_path(&["spot".to_string()].into()).await;
        assert!(decided > 0, "the expired repair was decided");
        let requests = lock(&seen).clone();
        let patched: Vec<&String> = requests.iter().filter(|r| r.starts_with("PATCH")).collect();
        assert!(
            patched.iter().any(|r| r.ends_with("/nodes/due")),
            "the due node was written: {requests:?}"
        );
        assert!(
            patched.iter().all(|r| r.ends_with("/nodes/due")),
            "only the due node was written: {requests:?}"
        );
        assert_eq!(engine.metrics.due_paths.load(Ordering::Relaxed), 1);
        assert_eq!(engine.metrics.reconciles.load(Ordering::Relaxed), 0);
        // Groups holding most of the cluster are left to the full reconcile.
        let groups = ["spot".to_string(), "other".to_string()].into();
        assert_eq!(engine.due_path(&groups).await, 0);
        assert_eq!(engine.metrics.due_paths.load(Ordering::Relaxed), 1);
        assert!(
            !lock(&seen).iter().any(|r| r.ends_with("/nodes/elsewhere")),
            "{seen:?}"
        );
    }

    /// A reconcile that would still be running when a repair toleration expires is held until
    /// the expiry, where the due path runs first: with reconciles taking long (here set to 20 s,
    /// so the window is the 1 s tick), the tick half a second before the expiry starts
    /// nothing, and the expiry runs the due path (writing the due node) and then the reconcile.
    /// With reconciles as quick as they are here, the same tick reconciles.
    #[tokio::test(start_paused = true)]
    async fn a_reconcile_that_would_run_past_the_expiry_waits_for_it() {
        for slow in [true, false] {
            let (client, seen) = recording_client();
            let (store, mut writer) = kube::runtime::reflector::store::<Node>();
            // The due node's group is a third of the cluster (a due path is taken for no more
            // than half).
            let mut nodes = vec![failed_node("due", "spot"), pool_node("spot-0")];
            nodes.extend((0..4).map(|i| pool_node_in(&format!("other-{i}"), "other")));
            for n in nodes {
                writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(n));
            }
            // Ready=False since 00:01:00 (`failed_node`); the clock starts at 00:10:00, so a
            // toleration of 9 min 10.5 s expires 10.5 s after the start.
            let mut policy = PolicyConfig::default();
            policy.repair.policy = vec![crate::controller::policy::config::RepairPolicy {
                condition_type: "Ready".into(),
                condition_status: "False".into(),
                toleration: Duration::from_millis(550_500),
            }];
            let t0 = tokio::time::Instant::now();
            let clock = super::wake_tests::Paused {
                base: "2026-12-01T00:10:00Z".parse().unwrap(),
                t0,
                speed: 1,
            };
            let cfg = EngineConfig {
                tick: Duration::from_secs(1),
                ..EngineConfig::default()
            };
            let (leader, leader_rx) = watch::channel(true);
            let engine = engine_at(
                client,
                store,
                cfg,
                leader_rx.clone(),
                policy,
                Arc::new(clock),
                None,
            );
            let (_events, events_rx) = broadcast::channel(8);
            let cancel = CancellationToken::new();
            let task = tokio::spawn(engine.clone().run(leader_rx, events_rx, cancel.clone()));
            let m = &engine.metrics;
            tokio::time::sleep_until(t0 + MS(9_500)).await;
            assert_eq!(
                m.reconciles.load(Ordering::Relaxed),
                10,
                "the start and 9 ticks"
            );
            if slow {
                engine.reconcile_us.store(20_000_000, Ordering::Relaxed);
            }
            tokio::time::sleep_until(t0 + MS(10_400)).await;
            let (reconciles, held) = if slow { (10, 1) } else { (11, 0) };
            assert_eq!(
                m.reconciles.load(Ordering::Relaxed),
                reconciles,
                "slow {slow}"
            );
            assert_eq!(
                m.reconciles_held.load(Ordering::Relaxed),
                held,
                "slow {slow}"
            );
            assert!(
                !lock(&seen).iter().any(|r| r.starts_with("PATCH")),
                "{seen:?}"
            );
            // The due path and the reconcile run on blocking threads, in real time, while paused
            // time runs on: wait for them in 1 ms steps, before the next tick.
            while m.reconciles.load(Ordering::Relaxed) == reconciles
                && tokio::time::Instant::now() < t0 + MS(10_900)
            {
                tokio::time::sleep(MS(1)).await;
            }
            assert_eq!(m.due_paths.load(Ordering::Relaxed), 1, "slow {slow}");
            assert_eq!(
                m.reconciles.load(Ordering::Relaxed),
                reconciles + 1,
                "slow {slow}"
            );
            assert!(
                lock(&seen).iter().any(|r| r == "PATCH /api/v1/nodes/due"),
                "{seen:?}"
            );
            cancel.cancel();
            task.await.unwrap();
            drop(leader);
        }
    }

    /// One reconcile at start and one per tick (observed 1 ms after it: the reconcile runs
    /// on a blocking thread at the tick's instant).
    #[tokio::test(start_paused = true)]
    async fn the_leader_reconciles_once_per_tick() {
        let t0 = tokio::time::Instant::now();
        let r = start(Duration::from_secs(1), MS(20), true);
        for (at, want) in [(1, 1), (999, 1), (1_001, 2), (4_999, 5), (5_001, 6)] {
            tokio::time::sleep_until(t0 + MS(at)).await;
            assert_eq!(r.reconciles(), want, "at {at} ms");
        }
        let m = &r.engine.metrics;
        assert_eq!(
            m.wake_count(Wake::Tick),
            6,
            "each reconcile woken by its tick"
        );
        assert_eq!(m.wake_count(Wake::Change), 0);
        r.stop().await;
    }

    /// A change (wake) is reconciled after the debounce's quiet time. Changes during the quiet
    /// time leave one pending wake (a `Notify` permit), so three changes make two reconciles,
    /// the second one debounce later; then nothing until the next tick.
    #[tokio::test(start_paused = true)]
    async fn changes_are_debounced_and_coalesced() {
        let t0 = tokio::time::Instant::now();
        let r = start(Duration::from_secs(60), MS(20), true);
        tokio::time::sleep_until(t0 + MS(300)).await;
        assert_eq!(r.reconciles(), 1, "the start");
        for _ in 0..3 {
            r.engine.wake.notify_one();
            tokio::time::sleep(MS(5)).await;
        }
        for (at, want) in [
            (319, 1),
            (321, 2),
            (339, 2),
            (341, 3),
            (59_999, 3),
            (60_001, 4),
        ] {
            tokio::time::sleep_until(t0 + MS(at)).await;
            assert_eq!(r.reconciles(), want, "at {at} ms");
        }
        let m = &r.engine.metrics;
        assert_eq!(
            (m.wake_count(Wake::Tick), m.wake_count(Wake::Change)),
            (2, 2)
        );
        r.stop().await;
    }

    /// A follower never reconciles, whatever the ticks; leadership gained is acted on at once.
    #[tokio::test(start_paused = true)]
    async fn a_follower_does_not_reconcile_until_it_leads() {
        let t0 = tokio::time::Instant::now();
        let r = start(Duration::from_secs(1), MS(20), false);
        r.engine.wake.notify_one();
        tokio::time::sleep_until(t0 + MS(10_500)).await;
        assert_eq!(r.reconciles(), 0);
        r.leader.send(true).unwrap();
        tokio::time::sleep_until(t0 + MS(10_501)).await;
        assert_eq!(
            r.reconciles(),
            1,
            "on the leadership change, not at the next tick"
        );
        r.stop().await;
    }
}

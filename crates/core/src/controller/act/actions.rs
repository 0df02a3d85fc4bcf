//! The actor: executes one node's [`Action`]s in the order the policy gave them, idempotently.
//!
//! - Node changes (annotations, labels, cordon, taints, the `nodekeeper.io/blocked` annotation)
//!   are coalesced into one JSON merge patch per run of consecutive changes, so each patch is
//!   atomic and lands before any side effect that follows it. Taints are rewritten from the
//!   current object with its `resourceVersion` as a precondition (others' taints are kept; a
//!   conflict re-reads and retries).
//! - Side effects come after the patch that precedes them: drains ([`DrainTasks`]), reboots
//!   (queued for the node's agent), replacements (the provider, after the
//!   `replacement-requested` annotation is stored, never twice for one id).
//! - A hold also sets the `NodekeeperHeld` condition; removing `nodekeeper.io/blocked` sets it
//!   to `False`.
//! - Events go through the [`Recorder`] once the changes before them are stored.
//! - Dry-run decisions change nothing: they are logged, and their Events are recorded once per
//!   distinct message (`DryRun` prefix).
//! - Each batch a node's actions are carried out in is added to its history
//!   ([`super::history`]), with its outcome and duration, by `Actor::recorded` alone.
//!
//! A failed action stops that node's remaining actions; the next reconcile decides again from
//! what is stored and retries.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::{json, Map, Value};

use crate::controller::act::drain::lifecycle::{self, DrainEdge};
use crate::controller::act::drain::tasks::DrainTasks;
use crate::controller::act::history::{self, History};
use crate::controller::act::provider::{
    request_id, NodeProvider, ProviderError, ReplacementRequest,
};
use crate::controller::catalog::{Reason, NOT_HELD};
use crate::controller::cluster::events::{Recorder, Regarding};
use crate::controller::metrics::{ActionResult, EngineMetrics};
use crate::controller::policy::explain::{Held, CONDITION_TYPE};
use crate::controller::policy::nodepool::POOL_LABEL;
use crate::controller::policy::view::keys;
use crate::controller::policy::view::DrainPhase;
use crate::controller::policy::Action;
use crate::controller::state::nodestate::NodeStates;
use crate::sync::lock;
use crate::wire::AgentCommand;

pub use crate::controller::policy::view::keys::REPLACEMENT_ACCEPTED;

/// The provider request of replacement `id` (the node's `replacement-requested` time): one
/// request id for its request, its retirement and its abandonment.
fn provider_request(node: &str, id: &str, reason: &str) -> ReplacementRequest {
    let mut req = ReplacementRequest::new(node, reason, id);
    req.request_id = request_id(node, "replacement", id);
    req
}

/// Attempts of an abandonment ([`Actor::abandon`]) before it is given up (and Evented).
pub const ABANDON_ATTEMPTS: u32 = 5;

/// Field manager of the actor's patches.
pub const FIELD_MANAGER: &str = "nodekeeper-controller";

/// Why an action failed.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    /// A Kubernetes API call failed.
    #[error("node {node}: {action}: {source}")]
    Kube {
        /// Node.
        node: String,
        /// What was being done.
        action: &'static str,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// The replacement provider refused or failed.
    #[error("node {node}: replacement request {request_id}: {source}")]
    Provider {
        /// Node.
        node: String,
        /// Idempotency key.
        request_id: String,
        /// Cause.
        #[source]
        source: Box<ProviderError>,
    },
}

/// Start / finish / failure of an action, for notifications (webhooks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionNotice {
    /// Node.
    pub node: String,
    /// Action kind ([`kind`]).
    pub kind: &'static str,
    /// `started`, `finished` or `failed`.
    pub phase: &'static str,
    /// One line for people.
    pub message: String,
    /// The decision was a dry run.
    pub dry_run: bool,
}

/// Where notifications go: `notify::Notifier` (the `[[controller.notify]]` webhooks) implements it.
/// Called for every side-effect action (drain, reboot, replacement, hold) on start, finish and
/// failure. Must not block.
pub trait Notifier: Send + Sync {
    /// One notice.
    fn notify(&self, notice: &ActionNotice);
}

/// Stable metric label of an action.
pub fn kind(a: &Action) -> &'static str {
    match a {
        Action::Annotate { .. } => "annotate",
        Action::Cordon => "cordon",
        Action::Uncordon => "uncordon",
        Action::Taint { .. } => "taint",
        Action::Untaint { .. } => "untaint",
        Action::Label { .. } => "label",
        Action::StartDrain { .. } => "start_drain",
        Action::StopDrain => "stop_drain",
        Action::RequestReboot { .. } => "request_reboot",
        Action::RestartUnit { .. } => "restart_unit",
        Action::RequestReplacement { .. } => "request_replacement",
        Action::RetireNode { .. } => "retire_node",
        Action::AbandonReplacement { .. } => "abandon_replacement",
        Action::Hold(_) => "hold",
        Action::Event { .. } => "event",
    }
}

/// Node changes waiting to be written as one patch.
#[derive(Debug, Default)]
struct NodePatch {
    annotations: BTreeMap<String, Option<String>>,
    labels: BTreeMap<String, Option<String>>,
    unschedulable: Option<bool>,
    taints_add: Vec<Taint>,
    taints_remove: HashSet<String>,
    kinds: Vec<&'static str>,
    /// `Some(Some(held))`: set the condition; `Some(None)`: set it to False.
    condition: Option<Option<Held>>,
}

impl NodePatch {
    fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// Adds a node change; false when `a` is not one.
    fn add(&mut self, a: &Action) -> bool {
        match a {
            Action::Annotate { key, value } => {
                if key == keys::BLOCKED && value.is_none() {
                    self.condition = Some(None);
                }
                self.annotations.insert(key.clone(), value.clone());
            }
            Action::Cordon => self.unschedulable = Some(true),
            Action::Uncordon => self.unschedulable = Some(false),
            Action::Taint { key, value, effect } => {
                self.taints_remove.remove(key);
                self.taints_add.retain(|t| &t.key != key);
                self.taints_add.push(Taint {
                    key: key.clone(),
                    value: Some(value.clone()),
                    effect: effect.clone(),
                    time_added: None,
                });
            }
            Action::Untaint { key } => {
                self.taints_add.retain(|t| &t.key != key);
                self.taints_remove.insert(key.clone());
            }
            Action::Label { key, value } => {
                self.labels.insert(key.clone(), value.clone());
            }
            Action::Hold(h) => {
                self.annotations
                    .insert(keys::BLOCKED.to_string(), Some(h.encode()));
                self.condition = Some(Some(h.clone()));
            }
            _ => return false,
        }
        self.kinds.push(kind(a));
        true
    }

    fn touches_taints(&self) -> bool {
        !self.taints_add.is_empty() || !self.taints_remove.is_empty()
    }

    /// The merge patch; with taints, computed from `current` and conditioned on its version.
    fn body(&self, current: Option<&Node>) -> Value {
        let opt = |m: &BTreeMap<String, Option<String>>| -> Map<String, Value> {
            m.iter()
                .map(|(k, v)| (k.clone(), v.clone().map_or(Value::Null, Value::String)))
                .collect()
        };
        let mut meta = Map::new();
        if !self.annotations.is_empty() {
            meta.insert("annotations".into(), Value::Object(opt(&self.annotations)));
        }
        if !self.labels.is_empty() {
            meta.insert("labels".into(), Value::Object(opt(&self.labels)));
        }
        let mut spec = Map::new();
        if let Some(u) = self.unschedulable {
            spec.insert("unschedulable".into(), Value::Bool(u));
        }
        if let Some(node) = current.filter(|_| self.touches_taints()) {
            let mut taints: Vec<Taint> = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default();
            taints.retain(|t| !self.taints_remove.contains(&t.key));
            for t in &self.taints_add {
                if !taints
                    .iter()
                    .any(|x| x.key == t.key && x.effect == t.effect)
                {
                    taints.push(t.clone());
                }
            }
            spec.insert("taints".into(), json!(taints));
            if let Some(rv) = &node.metadata.resource_version {
                meta.insert("resourceVersion".into(), Value::String(rv.clone()));
            }
        }
        let mut body = Map::new();
        if !meta.is_empty() {
            body.insert("metadata".into(), Value::Object(meta));
        }
        if !spec.is_empty() {
            body.insert("spec".into(), Value::Object(spec));
        }
        Value::Object(body)
    }
}

/// Executes decisions against the API server.
pub struct Actor {
    nodes: Api<Node>,
    /// The fast path's own patch ([`Self::write_leading`]): through the notice lane's client
    /// ([`crate::controller::engine::notice_thread`]), else the same as `nodes`.
    urgent: Api<Node>,
    /// The Node watch cache: a taint patch is first computed from it (or from a fresher answer of
    /// ours, [`FreshNodes`](crate::controller::state::fresh::FreshNodes)).
    cache: Store<Node>,
    recorder: Recorder,
    provider: Arc<dyn NodeProvider>,
    states: Arc<NodeStates>,
    drains: Arc<DrainTasks>,
    metrics: Arc<EngineMetrics>,
    notifier: Option<Arc<dyn Notifier>>,
    /// Replacement request ids asked in this process (in flight or accepted).
    asked: Mutex<HashSet<String>>,
    /// The provider calls in flight (owned: reaped each engine tick, aborted with the actor).
    pub(crate) background: crate::controller::cluster::supervise::Background,
    /// Retire request ids handed to the provider in this process (in flight or done).
    retired: Mutex<HashSet<String>>,
    /// Dry-run Event messages already recorded, per node.
    dry_seen: Mutex<HashMap<String, HashSet<String>>>,
    /// Each node's action history (none: not recorded).
    history: Option<History>,
}

/// Everything the actor is built from.
pub struct ActorParts {
    /// Client for node patches.
    pub client: kube::Client,
    /// Client for the fast path's node patches (the notice lane's; default: `client`).
    pub urgent_client: Option<kube::Client>,
    /// The Node watch cache.
    pub cache: Store<Node>,
    /// Events.
    pub recorder: Recorder,
    /// Replacement provider.
    pub provider: Arc<dyn NodeProvider>,
    /// Agent commands (reboots).
    pub states: Arc<NodeStates>,
    /// Drain tasks.
    pub drains: Arc<DrainTasks>,
    /// Metrics.
    pub metrics: Arc<EngineMetrics>,
    /// Notification hook.
    pub notifier: Option<Arc<dyn Notifier>>,
}

impl Actor {
    /// An actor.
    pub fn new(p: ActorParts) -> Self {
        let nodes = Api::all(p.client);
        Actor {
            urgent: p.urgent_client.map_or_else(|| nodes.clone(), Api::all),
            nodes,
            cache: p.cache,
            recorder: p.recorder,
            provider: p.provider,
            states: p.states,
            drains: p.drains,
            metrics: p.metrics,
            notifier: p.notifier,
            asked: Mutex::new(HashSet::new()),
            background: Default::default(),
            retired: Mutex::new(HashSet::new()),
            dry_seen: Mutex::new(HashMap::new()),
            history: None,
        }
    }

    /// The actor, recording what it does into `history`.
    pub fn with_history(mut self, history: Option<History>) -> Self {
        self.history = history;
        self
    }

    /// Runs `batch` (the writes for `actions` on `node`) and adds it to the node's history:
    /// what it did, why, what drove it (the node as it stood before), its outcome and duration.
    /// The one place the history is fed from the actor; never delays or fails the batch.
    async fn recorded<T>(
        &self,
        node: &str,
        actions: &[Action],
        batch: impl std::future::Future<Output = Result<T, ActionError>>,
    ) -> Result<T, ActionError> {
        let Some(h) = &self.history else {
            return batch.await;
        };
        let before = self.known(node);
        let (time, started) = (chrono::Utc::now(), std::time::Instant::now());
        let result = batch.await;
        let error = result
            .as_ref()
            .err()
            .map(|e| crate::telemetry::error_chain(e));
        if let Some(e) =
            history::of_batch(actions, before.as_deref(), time, started.elapsed(), error)
        {
            h.record(node, e);
        }
        result
    }

    /// The object a write of ours returned, if it is newer than `cached` (see [`FreshNodes`](crate::controller::state::fresh::FreshNodes)).
    pub fn fresher(&self, cached: &Node) -> Option<Arc<Node>> {
        self.states.fresh().fresher(cached)
    }

    /// Writes lifecycle conditions on `node` ([`lifecycle::write_all`]), its answer kept as our
    /// freshest copy of the Node (the next decision sees the conditions as written).
    pub async fn write_conditions(
        &self,
        node: &str,
        conditions: &[crate::controller::policy::lifecycle::Condition],
    ) -> Result<(), kube::Error> {
        let n = lifecycle::write_all(&self.nodes, node, conditions).await?;
        self.states.fresh().record(n);
        Ok(())
    }

    /// The newest copy of `node` this process holds without asking the API: the watch cache or
    /// the answer to our last write of it, whichever is newer.
    fn known(&self, node: &str) -> Option<Arc<Node>> {
        let cached = self.cache.get(&ObjectRef::new(node))?;
        Some(self.fresher(&cached).unwrap_or(cached))
    }

    /// Forgets per-node memory of nodes that are gone.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.states.fresh().retain(&keep);
        lock(&self.dry_seen).retain(|n, _| keep(n));
    }

    fn notify(
        &self,
        node: &str,
        kind: &'static str,
        phase: &'static str,
        message: String,
        dry_run: bool,
    ) {
        if let Some(n) = &self.notifier {
            n.notify(&ActionNotice {
                node: node.to_string(),
                kind,
                phase,
                message,
                dry_run,
            });
        }
    }

    /// Executes `actions` on `node` in order; stops at the first failure.
    pub async fn execute(
        self: &Arc<Self>,
        node: &str,
        actions: &[Action],
        dry_run: bool,
    ) -> Result<(), ActionError> {
        if dry_run {
            for a in actions {
                self.dry(node, a).await;
            }
            return Ok(());
        }
        self.recorded(node, actions, self.carry_out(node, actions))
            .await
    }

    async fn carry_out(
        self: &Arc<Self>,
        node: &str,
        actions: &[Action],
    ) -> Result<(), ActionError> {
        let mut patch = NodePatch::default();
        let mut events = Vec::new();
        for a in actions {
            if patch.add(a) {
                continue;
            }
            if let Action::Event { .. } = a {
                events.push(a.clone());
                continue;
            }
            self.flush(&self.nodes, node, &mut patch).await?;
            self.publish(node, std::mem::take(&mut events)).await;
            self.side_effect(node, a).await?;
        }
        self.flush(&self.nodes, node, &mut patch).await?;
        self.publish(node, events).await;
        Ok(())
    }

    /// The fast path's first step: the node changes among `actions` before the first action that
    /// is neither a node change nor an Event, written as one patch through the urgent client (the
    /// notice lane's, [`crate::controller::engine::notice_thread`]). Returns where the rest begins, for
    /// [`Self::execute_rest`]; together they do what [`Self::execute`] does. Writes nothing with
    /// `dry_run` (the rest is then all of `actions`).
    pub async fn write_leading(
        &self,
        node: &str,
        actions: &[Action],
        dry_run: bool,
    ) -> (usize, Result<(), ActionError>) {
        if dry_run {
            return (0, Ok(()));
        }
        let mut patch = NodePatch::default();
        let rest = actions
            .iter()
            .position(|a| !patch.add(a) && !matches!(a, Action::Event { .. }))
            .unwrap_or(actions.len());
        let leading = &actions[..rest];
        let written = self.recorded(node, leading, self.flush(&self.urgent, node, &mut patch));
        (rest, written.await)
    }

    /// After [`Self::write_leading`] returned `rest`: the Events before `rest`, then the actions
    /// from `rest` on ([`Self::execute`]).
    pub async fn execute_rest(
        self: &Arc<Self>,
        node: &str,
        actions: &[Action],
        rest: usize,
        dry_run: bool,
    ) -> Result<(), ActionError> {
        let (leading, after) = actions.split_at(rest.min(actions.len()));
        if !dry_run {
            let events = leading
                .iter()
                .filter(|a| matches!(a, Action::Event { .. }))
                .cloned()
                .collect();
            self.publish(node, events).await;
        }
        self.execute(node, after, dry_run).await
    }

    async fn publish(&self, node: &str, events: Vec<Action>) {
        for e in events {
            if let Action::Event {
                type_,
                reason,
                message,
            } = e
            {
                self.recorder
                    .node_as(node, reason, type_, "Disrupt", &message)
                    .await;
                self.metrics.action("event", ActionResult::Ok);
            }
        }
    }

    /// Writes the pending node changes (and the hold condition) as one patch.
    async fn flush(
        &self,
        api: &Api<Node>,
        node: &str,
        patch: &mut NodePatch,
    ) -> Result<(), ActionError> {
        if patch.is_empty() {
            return Ok(());
        }
        let p = std::mem::take(patch);
        let started = std::time::Instant::now();
        let result = self.write(api, node, &p).await;
        if let Ok(rereads) = result {
            if p.unschedulable.is_some() || p.touches_taints() {
                // Scheduling changes are logged as they land (with the API's round trips): the
                // audit trail of the only writer of Node state, and the bench's notice → cordon bound.
                tracing::info!(
                    node,
                    changes = %p.kinds.join(","),
                    took_ms = started.elapsed().as_millis() as u64,
                    rereads,
                    "node written"
                );
            }
        }
        let r = if result.is_ok() {
            ActionResult::Ok
        } else {
            ActionResult::Error
        };
        for k in &p.kinds {
            self.metrics.action(k, r);
        }
        result?;
        if let Some(cond) = &p.condition {
            self.write_condition(node, cond.as_ref()).await?;
            if let Some(h) = cond {
                self.notify(node, "hold", "started", h.blocker.message(), false);
            }
        }
        Ok(())
    }

    /// Patches the node; returns how often it was re-read after a conflict.
    async fn write(&self, api: &Api<Node>, node: &str, p: &NodePatch) -> Result<u32, ActionError> {
        let kube_err = |source| ActionError::Kube {
            node: node.to_string(),
            action: "patch node",
            source,
        };
        let pp = PatchParams::default();
        for attempt in 0..4 {
            // A taint list is replaced whole, so the patch is computed from a copy of the Node and
            // conditioned on that copy's resourceVersion: first the copy this process holds (one
            // round trip: the cordon of a notice), after a conflict the API's own.
            let current = match p.touches_taints() {
                false => None,
                true => match self.known(node).filter(|_| attempt == 0) {
                    Some(n) if n.metadata.resource_version.is_some() => Some(n),
                    _ => Some(Arc::new(api.get(node).await.map_err(kube_err)?)),
                },
            };
            match api
                .patch(node, &pp, &Patch::Merge(&p.body(current.as_deref())))
                .await
            {
                Ok(n) => {
                    self.states.fresh().record(n);
                    return Ok(attempt);
                }
                Err(kube::Error::Api(s)) if s.code == 409 && attempt < 3 => {
                    self.metrics
                        .node_write_conflicts
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(node, attempt, "node changed since our copy: re-reading it");
                    continue;
                }
                Err(e) => return Err(kube_err(e)),
            }
        }
        unreachable_conflict(node)
    }

    async fn write_condition(&self, node: &str, held: Option<&Held>) -> Result<(), ActionError> {
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let item = match held {
            Some(h) => {
                let c = h.condition();
                json!({"type": c.type_, "status": c.status, "reason": c.reason, "message": c.message,
                    "lastTransitionTime": c.last_transition_time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                    "lastHeartbeatTime": now})
            }
            None => json!({"type": CONDITION_TYPE, "status": "False", "reason": NOT_HELD,
                "message": "nodekeeper is not holding this node back", "lastTransitionTime": now,
                "lastHeartbeatTime": now}),
        };
        let patch = json!({"status": {"conditions": [item]}});
        match self
            .nodes
            .patch_status(node, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
        {
            Ok(n) => {
                self.states.fresh().record(n);
                Ok(())
            }
            Err(source) => Err(ActionError::Kube {
                node: node.to_string(),
                action: "set NodekeeperHeld condition",
                source,
            }),
        }
    }

    async fn side_effect(self: &Arc<Self>, node: &str, a: &Action) -> Result<(), ActionError> {
        match a {
            Action::StartDrain { deadline, reason }
                if self.drains.start(node, *deadline, reason) =>
            {
                let msg = format!("{reason}: drain by {}", deadline.to_rfc3339());
                self.notify(node, "drain", "started", msg, false);
            }
            Action::StopDrain => {
                // A completed drain let go: the node is back in service, no longer `Drained`.
                let completed = self.drains.stop(node) == Some(DrainPhase::Completed);
                if completed && self.drains.lifecycle_conditions() {
                    let why = "the node is back in service";
                    lifecycle::write_or_log(&self.nodes, node, DrainEdge::Released, why).await;
                }
            }
            Action::RequestReboot { id, reason } => {
                let cmd = AgentCommand::Reboot {
                    id: id.clone(),
                    reason: reason.clone(),
                };
                self.states.queue_command(node, cmd).await;
                self.notify(node, "reboot", "started", reason.clone(), false);
            }
            Action::RestartUnit { id, unit, reason } => {
                let cmd = AgentCommand::RestartUnit {
                    id: id.clone(),
                    unit: unit.clone(),
                    reason: reason.clone(),
                };
                self.states.queue_command(node, cmd).await;
                let line = format!("{reason}: restart {unit}");
                self.notify(node, "restart_unit", "started", line, false);
            }
            Action::RequestReplacement {
                id,
                reason,
                prespin,
                ..
            } => {
                // The provider may retry for a while: in the background (errors are logged,
                // Evented and retried by the next reconcile).
                let (me, node, id, reason) =
                    (self.clone(), node.to_string(), id.clone(), reason.clone());
                let prespin = *prespin;
                self.background
                    .spawn("replacement request", None, async move {
                        if let Err(e) = me.replace(&node, &id, &reason, prespin).await {
                            tracing::warn!(error = %e, "replacement request failed");
                        }
                    });
            }
            Action::RetireNode { id, reason } => {
                let (me, node, id, reason) =
                    (self.clone(), node.to_string(), id.clone(), reason.clone());
                self.background.spawn("retire", None, async move {
                    if let Err(e) = me.retire(&node, &id, &reason).await {
                        tracing::warn!(error = %e, "retiring the node failed");
                    }
                });
            }
            Action::AbandonReplacement { id, reason } => {
                let (me, node, id, reason) =
                    (self.clone(), node.to_string(), id.clone(), reason.clone());
                self.background.spawn("abandon", None, async move {
                    if let Err(e) = me.abandon(&node, &id, &reason).await {
                        tracing::warn!(error = %e, "abandoning the replacement failed");
                    }
                });
            }
            _ => {}
        }
        self.metrics.action(kind(a), ActionResult::Ok);
        Ok(())
    }

    /// Asks the provider for a replacement (the `replacement-requested` annotation is stored
    /// already), once per id in this process; records acceptance on the node. `prespin`: asked
    /// before the node's drain ([`Action::RequestReplacement`]).
    pub async fn replace(
        &self,
        node: &str,
        id: &str,
        reason: &str,
        prespin: bool,
    ) -> Result<(), ActionError> {
        let mut req = provider_request(node, id, reason);
        req.prespin = prespin;
        if !lock(&self.asked).insert(req.request_id.clone()) {
            return Ok(());
        }
        let cached = self.nodes.get_opt(node).await.ok().flatten();
        req.pool = cached
            .as_ref()
            .and_then(|n| n.metadata.labels.as_ref()?.get(POOL_LABEL).cloned());
        req.provider_id = cached
            .as_ref()
            .and_then(|n| n.spec.as_ref()?.provider_id.clone());
        self.notify(node, "replacement", "started", reason.to_string(), false);
        let result = self.provider.request_replacement(&req).await;
        match result {
            Ok(ticket) => {
                self.metrics
                    .replacements
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::info!(node, request_id = %ticket.request_id, provider = ticket.provider, "replacement accepted");
                self.notify(
                    node,
                    "replacement",
                    "finished",
                    format!("accepted by {}", ticket.provider),
                    false,
                );
                let mut p = NodePatch::default();
                p.add(&Action::Annotate {
                    key: REPLACEMENT_ACCEPTED.to_string(),
                    value: Some(req.request_id.clone()),
                });
                self.write(&self.nodes, node, &p).await.map(|_| ())
            }
            Err(source) => {
                if !source.is_permanent() {
                    // Transient: asked again by the next reconcile.
                    lock(&self.asked).remove(&req.request_id);
                }
                let about = match cached.as_ref() {
                    Some(n) => Regarding::from(n),
                    None => Regarding::from(node),
                };
                let call = ("request_replacement", "replacement", "Replace");
                Err(self
                    .provider_failed(node, about, call, req.request_id, source)
                    .await)
            }
        }
    }

    /// Hands the drained node to the provider to be taken away (`retire-requested` is stored
    /// already), once per id in this process; a failure is logged, Evented and asked again by the
    /// engine's next pass.
    pub async fn retire(&self, node: &str, id: &str, reason: &str) -> Result<(), ActionError> {
        let req = provider_request(node, id, reason);
        if !lock(&self.retired).insert(req.request_id.clone()) {
            return Ok(());
        }
        match self.provider.retire(&req).await {
            Ok(()) => {
                tracing::info!(node, request_id = %req.request_id, provider = self.provider.name(), "node handed to the provider");
                self.notify(node, "retire_node", "finished", reason.to_string(), false);
                Ok(())
            }
            Err(source) => {
                lock(&self.retired).remove(&req.request_id);
                let call = ("retire_node", "retire_node", "Retire");
                let about = Regarding::from(node);
                Err(self
                    .provider_failed(node, about, call, req.request_id, source)
                    .await)
            }
        }
    }

    /// Tells the provider that a pre-spun replacement is no longer wanted (the repair ended
    /// without retiring the node; the node's annotations are cleared already, so nothing asks
    /// again later): retried here, up to [`ABANDON_ATTEMPTS`] times with backoff, since a
    /// failure leaves the new node held out of consolidation.
    pub async fn abandon(&self, node: &str, id: &str, reason: &str) -> Result<(), ActionError> {
        let req = provider_request(node, id, reason);
        lock(&self.asked).remove(&req.request_id);
        let mut attempt = 0;
        let result = loop {
            attempt += 1;
            match self.provider.abandon(&req).await {
                Err(e) if !e.is_permanent() && attempt < ABANDON_ATTEMPTS => {
                    tracing::warn!(node, attempt, error = %e, "abandoning the replacement failed; retrying");
                    let max = Duration::from_secs(30);
                    let base = Duration::from_secs(1);
                    tokio::time::sleep(crate::backoff::delay(base, max, attempt)).await;
                }
                done => break done,
            }
        };
        match result {
            Ok(()) => {
                tracing::info!(node, request_id = %req.request_id, provider = self.provider.name(), "replacement abandoned");
                Ok(())
            }
            Err(source) => {
                let call = ("abandon_replacement", "abandon_replacement", "Abandon");
                let about = Regarding::from(node);
                Err(self
                    .provider_failed(node, about, call, req.request_id, source)
                    .await)
            }
        }
    }

    /// A failed provider call: counted (`call.0`, the metric's action kind), notified (`call.1`),
    /// a `ReplacementFailed` Warning Event (action `call.2`) on the node; the error to return.
    async fn provider_failed(
        &self,
        node: &str,
        about: Regarding<'_>,
        call: (&'static str, &'static str, &'static str),
        request_id: String,
        source: ProviderError,
    ) -> ActionError {
        let (metric, notice, action) = call;
        self.metrics.action(metric, ActionResult::Error);
        self.notify(node, notice, "failed", source.to_string(), false);
        self.recorder
            .node(
                about,
                Reason::ReplacementFailed,
                action,
                &source.to_string(),
            )
            .await;
        ActionError::Provider {
            node: node.to_string(),
            request_id,
            source: Box::new(source),
        }
    }

    /// Dry run: log; record each distinct Event once.
    async fn dry(&self, node: &str, a: &Action) {
        self.metrics.action(kind(a), ActionResult::DryRun);
        let line = describe(a);
        let new = {
            let mut seen = lock(&self.dry_seen);
            let set = seen.entry(node.to_string()).or_default();
            if set.len() > 256 {
                set.clear();
            }
            set.insert(line.clone())
        };
        if !new {
            return;
        }
        tracing::info!(node, action = %line, "dry run: not executed");
        match a {
            Action::Event {
                type_,
                reason,
                message,
            } => {
                self.recorder
                    .node_as(
                        node,
                        *reason,
                        *type_,
                        "DryRun",
                        &format!("dry run: {message}"),
                    )
                    .await;
            }
            Action::Hold(h) => {
                self.recorder
                    .node(
                        node,
                        h.blocker.event_reason(),
                        "DryRun",
                        &format!("dry run: {}", h.blocker.message()),
                    )
                    .await;
            }
            Action::StartDrain { .. }
            | Action::RequestReboot { .. }
            | Action::RestartUnit { .. }
            | Action::RequestReplacement { .. }
            | Action::RetireNode { .. }
            | Action::AbandonReplacement { .. } => {
                self.notify(node, kind(a), "started", line, true);
            }
            _ => {}
        }
    }
}

fn unreachable_conflict<T>(node: &str) -> Result<T, ActionError> {
    Err(ActionError::Kube {
        node: node.to_string(),
        action: "patch node (conflicts)",
        source: kube::Error::Service("too many resourceVersion conflicts".into()),
    })
}

/// One line describing an action (logs, dry-run).
pub fn describe(a: &Action) -> String {
    match a {
        Action::Annotate {
            key,
            value: Some(v),
        } => format!("annotate {key}={v}"),
        Action::Annotate { key, value: None } => format!("remove annotation {key}"),
        Action::Cordon => "cordon".into(),
        Action::Uncordon => "uncordon".into(),
        Action::Taint { key, value, effect } => format!("taint {key}={value}:{effect}"),
        Action::Untaint { key } => format!("untaint {key}"),
        Action::Label {
            key,
            value: Some(v),
        } => format!("label {key}={v}"),
        Action::Label { key, value: None } => format!("remove label {key}"),
        Action::StartDrain { deadline, reason } => {
            format!("drain ({reason}) by {}", deadline.to_rfc3339())
        }
        Action::StopDrain => "stop drain".into(),
        Action::RequestReboot { reason, .. } => format!("request reboot ({reason})"),
        Action::RestartUnit { unit, reason, .. } => format!("restart unit {unit} ({reason})"),
        Action::RequestReplacement { reason, .. } => format!("request replacement ({reason})"),
        Action::RetireNode { reason, .. } => format!("retire node ({reason})"),
        Action::AbandonReplacement { reason, .. } => format!("abandon replacement ({reason})"),
        Action::Hold(h) => format!("hold: {}", h.blocker.message()),
        Action::Event {
            reason, message, ..
        } => format!("event {reason}: {message}"),
    }
}

//! The controller's pure decision core: `decide(&ClusterView, &PolicyConfig, now)` returns what
//! should happen to which node, with no I/O. An actor executes the decisions separately and
//! idempotently, applying each node's actions in order (annotations that record an intent come
//! before the action they describe, so a crash in between is resumed, never forgotten).
//!
//! - [`interruption`]: notices → taint + cordon + LB exclusion + drain before the deadline +
//!   immediate replacement; rebalance → cordon; cancellation → undo only what nodekeeper did.
//! - [`repair`]: condition policies (type, status, reason pattern) with tolerations, each with
//!   its escalation ladder (restart-unit → drain → reboot → replace, or `none`),
//!   short-circuit, flap guard, startup timeout.
//! - [`budget`]: per-group disruption budgets with cron windows in IANA time zones.
//! - [`fence`]: keeps Karpenter's voluntary disruptions out of a NodePool while nodekeeper
//!   disrupts a Ready node of it (which Karpenter's budgets cannot count).
//! - [`nodepool`]: budgets read from Karpenter NodePools (`[budgets] source = "nodepool"`).
//! - [`explain`]: the machine-readable "why held" status.
//! - [`view`]: the inputs and the annotation catalog.

pub mod budget;
pub mod config;
mod events;
pub mod explain;
pub mod fence;
pub mod interruption;
pub mod lifecycle;
pub mod nodepool;
pub mod repair;
pub mod view;

use std::borrow::Cow;
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

pub use config::PolicyConfig;
pub use view::{ClusterView, NodeView};

use crate::controller::catalog;
pub use crate::controller::catalog::EventType;
use crate::controller::policy::nodepool::POOL_LABEL;
use budget::{GroupBudgets, Origin, Reason};
use explain::{Blocker, Held};
use view::{keys, DrainPhase, Record, State};

/// One thing to do to one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The node.
    pub node: String,
    /// What to do.
    pub action: Action,
    /// `[controller] dry_run`: log it and write Events/status only.
    pub dry_run: bool,
}

/// An action on a node. The actor applies a node's actions in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Set (`Some`) or remove (`None`) an annotation of the catalog ([`view::keys`]).
    Annotate {
        /// Key.
        key: String,
        /// Value.
        value: Option<String>,
    },
    /// `spec.unschedulable = true`.
    Cordon,
    /// `spec.unschedulable = false` (only ever for a cordon nodekeeper recorded as its own).
    Uncordon,
    /// Add a taint.
    Taint {
        /// Key.
        key: String,
        /// Value.
        value: String,
        /// Effect.
        effect: String,
    },
    /// Remove the taint with this key.
    Untaint {
        /// Key.
        key: String,
    },
    /// Set (`Some`) or remove (`None`) a label (the LB exclusion label).
    Label {
        /// Key.
        key: String,
        /// Value.
        value: Option<String>,
    },
    /// Start (or resume) draining, finishing by `deadline`.
    StartDrain {
        /// Deadline.
        deadline: DateTime<Utc>,
        /// Why (`interruption:preemption`, `repair:Ready=False`).
        reason: String,
    },
    /// Stop a running drain.
    StopDrain,
    /// Ask the node's agent to reboot (verified by a boot id change).
    RequestReboot {
        /// Command id (deterministic).
        id: String,
        /// Why.
        reason: String,
    },
    /// Ask the node's agent to restart one systemd unit (a `restart-unit` step).
    RestartUnit {
        /// Command id (deterministic).
        id: String,
        /// The unit, e.g. `kubelet.service`.
        unit: String,
        /// Why.
        reason: String,
    },
    /// Hand the drained node to the replacement provider to be taken away (its drain is over).
    RetireNode {
        /// The replacement's idempotency key (the same as its `RequestReplacement`).
        id: String,
        /// Why.
        reason: String,
    },
    /// Ask the replacement provider for a new node.
    RequestReplacement {
        /// Idempotency key (deterministic).
        id: String,
        /// Why.
        reason: String,
        /// Value of `nodekeeper.io/startup-retries` for the new node.
        startup_retries: u32,
        /// Asked before the node's drain ([`RepairConfig::prespin`](config::RepairConfig::prespin)):
        /// capacity for every pod still on it, even those its drain is about to evict.
        prespin: bool,
    },
    /// Tell the replacement provider that a pre-spun replacement is no longer wanted (the repair
    /// ended without retiring the node): it stops holding the new node for the old one's pods.
    AbandonReplacement {
        /// The replacement's idempotency key (the same as its `RequestReplacement`).
        id: String,
        /// Why.
        reason: String,
    },
    /// Publish a hold: `nodekeeper.io/blocked` and the `NodekeeperHeld` condition.
    Hold(Held),
    /// Kubernetes Event on the node.
    Event {
        /// Type.
        type_: EventType,
        /// Reason.
        reason: catalog::Reason,
        /// Message.
        message: String,
    },
}

/// Decides what to do now. Pure: same inputs, same output.
pub fn decide(view: &ClusterView, cfg: &PolicyConfig, now: DateTime<Utc>) -> Vec<Decision> {
    decide_with_status(view, cfg, now).0
}

/// As [`decide`], with each group's figures (for metrics: budget allowed/used per group,
/// short-circuit state).
pub fn decide_with_status(
    view: &ClusterView,
    cfg: &PolicyConfig,
    now: DateTime<Utc>,
) -> (Vec<Decision>, Vec<GroupStatus>) {
    let (mut out, statuses) = decide_each_group(view, cfg, now, |_| true);
    let round = by_node(&out);
    out.extend(fence::fence(&view.nodes, &round, now));
    (decisions(out, cfg), statuses)
}

/// What [`decide`] decides for the nodes of `groups` (values of `budgets.group_by`, `""` for
/// nodes without the label), from a view that holds every node of those groups (and maybe
/// others): each group's decision reads only its own members and budgets. The engine calls it when a
/// repair toleration expires ([`repair::Due`]), so that the due repair starts without building
/// the whole cluster.
///
/// The Karpenter fence goes with it as far as these nodes show it: all of it when the groups are
/// the NodePools (`group_by` is the NodePool label, the default), else only the marks these
/// nodes' disruptions add — whether a mark is lifted depends on the NodePool's nodes in other
/// groups, which the next full reconcile decides (as [`fence::fence_now`] does for the notice fast
/// path).
pub fn decide_groups(
    view: &ClusterView,
    cfg: &PolicyConfig,
    now: DateTime<Utc>,
    groups: &std::collections::BTreeSet<String>,
) -> Vec<Decision> {
    let (mut out, _) = decide_each_group(view, cfg, now, |g| groups.contains(g));
    let round = by_node(&out);
    let member = |n: &NodeView| groups.contains(&group_of(n, cfg));
    // The engine's view holds these groups only: no copy then.
    let members: Cow<'_, [NodeView]> = if view.nodes.iter().all(member) {
        Cow::Borrowed(&view.nodes)
    } else {
        Cow::Owned(view.nodes.iter().filter(|n| member(n)).cloned().collect())
    };
    let whole_pools = cfg.budgets.group_by == POOL_LABEL;
    out.extend(
        fence::fence(&members, &round, now)
            .into_iter()
            .filter(|(_, a)| whole_pools || matches!(a, Action::Annotate { value: Some(_), .. })),
    );
    decisions(out, cfg)
}

/// Each group's decision (without the fence), for the groups `wanted` accepts, in name order.
fn decide_each_group(
    view: &ClusterView,
    cfg: &PolicyConfig,
    now: DateTime<Utc>,
    wanted: impl Fn(&str) -> bool,
) -> (Vec<(String, Action)>, Vec<GroupStatus>) {
    let mut nodes: Vec<&NodeView> = view.nodes.iter().collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let mut groups: BTreeMap<String, Vec<&NodeView>> = BTreeMap::new();
    for n in nodes {
        let group = group_of(n, cfg);
        if wanted(&group) {
            groups.entry(group).or_default().push(n);
        }
    }
    let mut out = Vec::new();
    let mut statuses = Vec::new();
    for (group, members) in &groups {
        let budgets = GroupBudgets::in_force(group, &cfg.budgets, &view.nodepools);
        let (actions, status) = decide_group(group, members, cfg, &budgets, now);
        out.extend(actions);
        statuses.push(status);
    }
    (out, statuses)
}

/// A round's actions by node.
fn by_node(out: &[(String, Action)]) -> BTreeMap<String, Vec<Action>> {
    let mut round: BTreeMap<String, Vec<Action>> = BTreeMap::new();
    for (node, action) in out {
        round.entry(node.clone()).or_default().push(action.clone());
    }
    round
}

fn decisions(out: Vec<(String, Action)>, cfg: &PolicyConfig) -> Vec<Decision> {
    let dry_run = cfg.controller.dry_run;
    out.into_iter()
        .map(|(node, action)| Decision {
            node,
            action,
            dry_run,
        })
        .collect()
}

/// `t + d`, saturating at the end of time (a huge configured duration never panics).
pub fn later(t: DateTime<Utc>, d: std::time::Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| t.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// `t - d`, saturating at the start of time.
pub(crate) fn earlier(t: DateTime<Utc>, d: std::time::Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| t.checked_sub_signed(d))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// A node's group: the value of `budgets.group_by`, or `""`.
pub fn group_of(node: &NodeView, cfg: &PolicyConfig) -> String {
    node.labels
        .get(&cfg.budgets.group_by)
        .cloned()
        .unwrap_or_default()
}

/// Actions accumulated for one node during a decision.
pub(crate) struct Plan<'a> {
    /// The node as the input shows it.
    pub(crate) node: &'a NodeView,
    /// The node with this decision's actions applied so far (what later actions build on):
    /// borrowed until the first action, so a round copies only the nodes it acts on.
    pub(crate) cur: Cow<'a, NodeView>,
    pub(crate) record: Record,
    pub(crate) actions: Vec<Action>,
    pub(crate) now: DateTime<Utc>,
    /// The node counts as disrupting after this decision.
    pub(crate) disrupting: bool,
    /// A gated start this decision may grant (filled by the first pass).
    pub(crate) candidate: Option<Candidate>,
    /// A hold chosen this decision.
    pub(crate) hold: Option<Blocker>,
}

/// A node waiting for a budget slot.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    pub(crate) reason: Reason,
    /// Earlier first.
    pub(crate) since: DateTime<Utc>,
    /// NotReady candidates are not counted against the budget they compete for.
    pub(crate) start: Start,
}

/// What a granted candidate starts.
#[derive(Debug, Clone)]
pub(crate) enum Start {
    Repair { why: String },
    Interruption { notice: view::Notice },
}

impl<'a> Plan<'a> {
    fn new(node: &'a NodeView, now: DateTime<Utc>) -> Self {
        let record = node.record();
        let disrupting =
            node.deleting || matches!(record.state, State::Interrupted | State::Repairing);
        Plan {
            node,
            cur: Cow::Borrowed(node),
            record,
            actions: Vec::new(),
            now,
            disrupting,
            candidate: None,
            hold: None,
        }
    }

    /// Appends an action and applies it to `cur`.
    pub(crate) fn push(&mut self, action: Action) {
        self.cur.to_mut().apply(&action);
        self.actions.push(action);
    }

    pub(crate) fn set(&mut self, key: &str, value: impl Into<String>) {
        let value = value.into();
        if self.cur.annotation(key) != Some(value.as_str()) {
            self.push(Action::Annotate {
                key: key.to_string(),
                value: Some(value),
            });
        }
    }

    pub(crate) fn clear(&mut self, key: &str) {
        if self.cur.annotations.contains_key(key) {
            self.push(Action::Annotate {
                key: key.to_string(),
                value: None,
            });
        }
    }

    pub(crate) fn now_str(&self) -> String {
        self.now.to_rfc3339()
    }

    /// Records the state, then cordons (recording ownership only if nodekeeper cordons).
    pub(crate) fn enter(&mut self, state: State, reason: &str) {
        if let Some(name) = state.name() {
            self.set(keys::STATE, name);
        }
        self.set(keys::STATE_SINCE, self.now_str());
        self.set(keys::REASON, reason);
        self.cordon();
        self.keep_karpenter_off();
        if state == State::Repairing {
            self.keep_karpenter_repair_off();
        }
        self.record.state = state;
        self.record.reason = Some(reason.to_string());
    }

    /// Cordons unless already unschedulable; the ownership record comes first.
    pub(crate) fn cordon(&mut self) {
        if !self.cur.unschedulable {
            self.set(keys::CORDONED_BY, keys::OWNER);
            self.push(Action::Cordon);
            self.record.cordoned_by_us = true;
        }
    }

    /// On a node of a Karpenter NodePool, puts `karpenter.sh/do-not-disrupt` (recording ownership
    /// first) so that Karpenter does not consolidate or drift it while nodekeeper acts on it.
    pub(crate) fn keep_karpenter_off(&mut self) {
        if !self.cur.labels.contains_key(POOL_LABEL) {
            return;
        }
        if self.cur.annotation(keys::KARPENTER_DO_NOT_DISRUPT) == Some("true") {
            // A fence mark becomes this node's own (lifted on release, not with the fence).
            if self.cur.annotation(keys::DO_NOT_DISRUPT_BY) == Some(fence::FENCE) {
                self.set(keys::DO_NOT_DISRUPT_BY, keys::OWNER);
                self.record.marked_by_us = true;
            }
            return;
        }
        self.set(keys::DO_NOT_DISRUPT_BY, keys::OWNER);
        self.set(keys::KARPENTER_DO_NOT_DISRUPT, "true");
        self.record.marked_by_us = true;
    }

    /// On a node of a Karpenter NodePool, puts `karpenter.sh/do-not-repair` (recording ownership
    /// first) so that Karpenter's NodeRepair (v1.15: a disruption method that ignores
    /// `do-not-disrupt`, `pkg/controllers/disruption/types.go`) does not repair the node
    /// nodekeeper is repairing: one drain, one replacement. An operator's mark is left alone.
    pub(crate) fn keep_karpenter_repair_off(&mut self) {
        if !self.cur.labels.contains_key(POOL_LABEL)
            || self.cur.annotation(keys::KARPENTER_DO_NOT_REPAIR) == Some("true")
        {
            return;
        }
        self.set(keys::DO_NOT_REPAIR_BY, keys::OWNER);
        self.set(keys::KARPENTER_DO_NOT_REPAIR, "true");
    }

    /// Once the provider accepted the replacement and `drain_over`, hands the node to the provider
    /// to be taken away (once: recorded in `retire-requested` before the action).
    pub(crate) fn retire_when(&mut self, drain_over: bool) {
        if !drain_over || !self.record.replacement_accepted || self.record.retire_requested {
            return;
        }
        let Some(at) = self.cur.annotation(keys::REPLACEMENT_REQUESTED) else {
            return;
        };
        let id = format!("{}/{}", self.cur.name, at);
        let reason = self
            .record
            .reason
            .clone()
            .unwrap_or_else(|| "replacement".into());
        self.set(keys::RETIRE_REQUESTED, self.now_str());
        self.push(Action::RetireNode { id, reason });
        self.record.retire_requested = true;
    }

    /// Adds the LB exclusion label unless present (recording ownership first).
    pub(crate) fn exclude_from_lb(&mut self, label: &str) {
        if label.is_empty() || self.cur.labels.contains_key(label) {
            return;
        }
        self.set(keys::LB_EXCLUDED_BY, keys::OWNER);
        self.push(Action::Label {
            key: label.to_string(),
            value: Some(keys::OWNER.to_string()),
        });
    }

    /// Undoes what nodekeeper did (never an admin cordon) and clears its state (keeping the
    /// handled notice's id, the replacement mark and the startup retries).
    pub(crate) fn release(&mut self, cfg: &PolicyConfig) {
        if self.cur.drain.phase != DrainPhase::Idle {
            self.push(Action::StopDrain);
        }
        let taint = &cfg.interruption.taint_key;
        if self.cur.has_taint(taint) {
            self.push(Action::Untaint { key: taint.clone() });
        }
        let label = &cfg.interruption.lb_exclude_label;
        if self.record.lb_excluded_by_us && self.cur.labels.contains_key(label) {
            self.push(Action::Label {
                key: label.clone(),
                value: None,
            });
        }
        if self.record.cordoned_by_us && self.cur.unschedulable {
            self.push(Action::Uncordon);
        }
        if self.record.marked_by_us {
            self.clear(keys::KARPENTER_DO_NOT_DISRUPT);
        }
        if self.cur.repair_marked_by_us() {
            self.clear(keys::KARPENTER_DO_NOT_REPAIR);
        }
        for k in [
            keys::STATE,
            keys::STATE_SINCE,
            keys::REASON,
            keys::REPAIR_STEP,
            keys::REPAIR_STEP_SINCE,
            keys::REBOOT_REQUESTED,
            keys::LB_EXCLUDED_BY,
            keys::CORDONED_BY,
            keys::DO_NOT_DISRUPT_BY,
            keys::DO_NOT_REPAIR_BY,
        ] {
            self.clear(k);
        }
        // The handled notice stays recorded (state idle) so that it is never handled twice.
        self.record = Record {
            notice: self.record.notice.clone(),
            replacement_requested: self.record.replacement_requested,
            replacement_accepted: self.record.replacement_accepted,
            retire_requested: self.record.retire_requested,
            startup_retries: self.record.startup_retries,
            held: self.record.held.clone(),
            ..Record::default()
        };
        self.disrupting = self.cur.deleting;
    }

    /// Requests a replacement unless one was requested already (recorded first).
    pub(crate) fn request_replacement(&mut self, reason: &str, startup_retries: u32) {
        self.ask_replacement(reason, startup_retries, false);
    }

    /// [`Self::request_replacement`], `prespin` when asked before the drain.
    pub(crate) fn ask_replacement(&mut self, reason: &str, startup_retries: u32, prespin: bool) {
        if self.record.replacement_requested.is_some() {
            return;
        }
        let at = self.now_str();
        // An acceptance left by an abandoned request's answer is not this request's.
        self.clear(keys::REPLACEMENT_ACCEPTED);
        self.record.replacement_accepted = false;
        self.set(keys::REPLACEMENT_REQUESTED, at.clone());
        // The Event before the call: the actor publishes it right after storing the record, so a
        // crash during the call (retried from the record, without a new Event) keeps it.
        self.push(events::replacement_requested(reason));
        self.push(Action::RequestReplacement {
            id: format!("{}/{}", self.cur.name, at),
            reason: reason.to_string(),
            startup_retries,
            prespin,
        });
        self.record.replacement_requested = Some(self.now);
    }

    /// Publishes `blocker` (keeping `since` when it is unchanged), with an Event on change.
    fn publish_hold(&mut self) {
        match (self.hold.take(), self.record.held.clone()) {
            (Some(b), Some(h)) if h.blocker == b => {}
            (Some(b), _) => {
                let held = Held {
                    blocker: b,
                    since: self.now,
                };
                self.push(events::held(&held.blocker));
                self.push(Action::Hold(held));
            }
            (None, Some(_)) => {
                self.clear(keys::BLOCKED);
                self.push(events::hold_released());
            }
            (None, None) => {}
        }
    }

    /// The last steps of every node's decision (cleanup, hold): its actions in order.
    fn finish(mut self, cfg: &PolicyConfig) -> Vec<Action> {
        self.cleanup_orphans(cfg);
        self.publish_hold();
        self.actions
    }

    /// Removes leftovers of nodekeeper's on a node it is not acting on.
    fn cleanup_orphans(&mut self, cfg: &PolicyConfig) {
        if self.record.state != State::Idle || !self.actions.is_empty() {
            return;
        }
        let leftover = self.record.cordoned_by_us
            || self.record.lb_excluded_by_us
            || self.cur.has_taint(&cfg.interruption.taint_key)
            || [
                keys::STATE_SINCE,
                keys::REASON,
                keys::REPAIR_STEP,
                keys::DO_NOT_REPAIR_BY,
            ]
            .iter()
            .any(|k| self.cur.annotations.contains_key(*k));
        if leftover {
            self.release(cfg);
            self.push(events::cleanup());
        }
    }
}

/// Per-group figures for metrics and `nodekeeper status` (labels: group and reason only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupStatus {
    /// Group name (`""`: nodes without the `group_by` label).
    pub group: String,
    /// Nodes in the group.
    pub total: usize,
    /// Nodes counted against the budget (disrupting, deleting, NotReady) after this decision.
    pub counted: usize,
    /// The repair budget's limit now (`None`: no budget active).
    pub repair_limit: Option<usize>,
    /// Nodes matching a repair policy.
    pub unhealthy: usize,
    /// Repairs are short-circuited.
    pub short_circuited: bool,
}

/// Decides for one group; also returns its figures.
fn decide_group(
    group: &str,
    members: &[&NodeView],
    cfg: &PolicyConfig,
    budgets: &GroupBudgets,
    now: DateTime<Utc>,
) -> (Vec<(String, Action)>, GroupStatus) {
    let repair_cfg = cfg.repair.for_group(group);
    let mut plans: Vec<Plan<'_>> = members.iter().map(|n| Plan::new(n, now)).collect();
    for p in &mut plans {
        if !interruption::step(p, cfg) {
            repair::step(p, cfg, &repair_cfg);
        }
    }
    let (unhealthy, short_circuited) = repair::short_circuit(group, &mut plans, &repair_cfg);
    let counted = grant(group, &mut plans, cfg, budgets, now);
    let status = GroupStatus {
        group: group.to_string(),
        total: plans.len(),
        counted,
        repair_limit: budgets.limit(Reason::Repair, plans.len(), now).max,
        unhealthy,
        short_circuited,
    };
    let mut out = Vec::new();
    for p in plans {
        let name = p.cur.name.clone();
        out.extend(p.finish(cfg).into_iter().map(|a| (name.clone(), a)));
    }
    (out, status)
}

/// The decision for one node, alone, when it does not depend on the rest of its group: the
/// interruption flow owns the node this round and starts nothing that waits for a budget
/// (interruptions are not gated, only counted; a rebalance configured to drain is gated and
/// gives `None`). Then it equals what [`decide`] gives that node in any cluster (the
/// short-circuit and the grants only touch budget candidates), so the engine can act on a fresh
/// notice without building the whole [`ClusterView`]. `None`: only [`decide`] can tell.
pub fn decide_interruption(
    node: &NodeView,
    cfg: &PolicyConfig,
    now: DateTime<Utc>,
) -> Option<Vec<Action>> {
    let mut p = Plan::new(node, now);
    if !interruption::step(&mut p, cfg) || p.candidate.is_some() {
        return None;
    }
    Some(p.finish(cfg))
}

/// Nodes counted against the group's budget: disrupting, deleting, chosen by Karpenter for
/// disruption (its [`view::KARPENTER_DISRUPTED_TAINT`]), or NotReady (except a NotReady node
/// waiting for its own repair: it competes for the slot instead, else a budget of 1 would never
/// let a failed node be repaired).
fn counted(plans: &[Plan<'_>]) -> usize {
    plans.iter().filter(|p| is_counted(p)).count()
}

/// Whether one node is counted against its group's budget (see [`counted`]).
fn is_counted(p: &Plan<'_>) -> bool {
    let repair_candidate = p
        .candidate
        .as_ref()
        .is_some_and(|c| c.reason == Reason::Repair);
    p.disrupting || p.cur.karpenter_disrupted() || (!p.cur.is_ready() && !repair_candidate)
}

/// Grants budget slots to candidates, earliest first; holds the rest, explained with the
/// count after every grant (so the explanation does not change once the grants are applied).
fn grant(
    group: &str,
    plans: &mut [Plan<'_>],
    cfg: &PolicyConfig,
    budgets: &GroupBudgets,
    now: DateTime<Utc>,
) -> usize {
    let total = plans.len();
    let mut order: Vec<usize> = (0..plans.len())
        .filter(|&i| plans[i].candidate.is_some())
        .collect();
    // Starts that no active budget gates (e.g. a reason no budget lists) happen whatever the
    // count: grant them first, so the gated ones see them counted. Then earliest first.
    order.sort_by_key(|&i| {
        let c = plans[i].candidate.as_ref();
        let gated = c.is_some_and(|c| budgets.limit(c.reason, total, now).max.is_some());
        (gated, c.map(|c| c.since), plans[i].node.name.clone())
    });
    let mut taken = counted(plans);
    let mut held = Vec::new();
    for i in order {
        // Counted already (e.g. NotReady and not waiting for repair, or tainted by Karpenter).
        let already = is_counted(&plans[i]);
        let Some(c) = plans[i].candidate.take() else {
            continue;
        };
        if budgets.allowed(c.reason, total, taken, now) == 0 {
            held.push((i, c.reason));
            continue;
        }
        let p = &mut plans[i];
        if !already {
            taken += 1;
        }
        match c.start {
            Start::Repair { why } => repair::start(p, cfg, &why),
            Start::Interruption { notice } => interruption::start(p, cfg, &notice),
        }
    }
    for (i, reason) in held {
        let limit = budgets.limit(reason, total, now);
        let Some(b) = limit.budget_index.and_then(|pos| budgets.entry(pos)) else {
            continue;
        };
        plans[i].hold = Some(match &b.origin {
            Origin::InvalidNodePool(e) => Blocker::NodePool {
                group: group.to_string(),
                nodepool: e.pool.clone(),
                problem: format!("{}: {}", e.path, e.problem),
            },
            origin => Blocker::Budget {
                group: group.to_string(),
                budget: b.index,
                nodes: b.budget.nodes.to_string(),
                disrupting: taken,
                total,
                opens_at: budgets.opens_at(reason, total, taken, now),
                timezone: b.budget.timezone.clone(),
                nodepool: match origin {
                    Origin::NodePool(name) => Some(name.clone()),
                    _ => None,
                },
            },
        });
    }
    taken
}

//! The decision core's inputs: plain Rust snapshots of the cluster (no kube types), built by
//! the controller from Nodes, Pods, the drain engine and agent reports; and the stable catalog
//! of Node annotations in which nodekeeper records its progress, read back on every decision so
//! that a restarted controller resumes exactly where it stopped.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::config::{LadderStep, RepairStep};
use super::Action;

/// Stable catalog of the Node annotations (and the label) nodekeeper writes. Changing a key
/// or a value format is a breaking change (see docs/policy.md).
pub mod keys {
    /// What nodekeeper is doing with the node: `interrupted`, `cordoned` (rebalance) or
    /// `repairing`. Absent: nothing.
    pub const STATE: &str = "nodekeeper.io/state";
    /// RFC 3339 time the current state began.
    pub const STATE_SINCE: &str = "nodekeeper.io/state-since";
    /// Why, human and machine readable: `repair:Ready=False`, `interruption:preemption`.
    pub const REASON: &str = "nodekeeper.io/reason";
    /// Current repair step: `restart-unit:UNIT`, `drain`, `reboot`, `replace` or `none`.
    pub const REPAIR_STEP: &str = "nodekeeper.io/repair-step";
    /// RFC 3339 time the current repair step began.
    pub const REPAIR_STEP_SINCE: &str = "nodekeeper.io/repair-step-since";
    /// `nodekeeper` when nodekeeper cordoned the node (and will uncordon it); absent when the
    /// node was already unschedulable (an admin cordon, never undone).
    pub const CORDONED_BY: &str = "nodekeeper.io/cordoned-by";
    /// `nodekeeper` when nodekeeper added the load-balancer exclusion label.
    pub const LB_EXCLUDED_BY: &str = "nodekeeper.io/lb-excluded-by";
    /// RFC 3339 time a replacement was requested; never requested twice.
    pub const REPLACEMENT_REQUESTED: &str = "nodekeeper.io/replacement-requested";
    /// The replacement request's idempotency key, written once the provider accepted it. A
    /// `replacement-requested` without it (a crash in between, or a failed call) is asked again
    /// with the same key.
    pub const REPLACEMENT_ACCEPTED: &str = "nodekeeper.io/replacement-accepted";
    /// RFC 3339 time nodekeeper handed the drained node to its provider to be taken away
    /// (`karpenter`: the old NodeClaim deleted once nodekeeper's drain was over).
    pub const RETIRE_REQUESTED: &str = "nodekeeper.io/retire-requested";
    /// `nodekeeper` when nodekeeper put Karpenter's `karpenter.sh/do-not-disrupt` on the node (and
    /// will remove it); absent when the node carried it already (never removed then).
    pub const DO_NOT_DISRUPT_BY: &str = "nodekeeper.io/do-not-disrupt-by";
    /// Karpenter's annotation keeping a node out of its voluntary disruptions (consolidation,
    /// drift) while nodekeeper acts on it. Karpenter's key, not nodekeeper's: not in [`ALL`].
    pub const KARPENTER_DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
    /// Karpenter's per-node repair veto (v1.15, `v1.DoNotRepairAnnotationKey`): `"true"` keeps
    /// every repair off the node. nodekeeper honours it as Karpenter does when an operator set
    /// it; nodekeeper itself puts it on a node of a NodePool only while it repairs that node
    /// (recorded in [`DO_NOT_REPAIR_BY`] first), the one mark that keeps Karpenter's own
    /// NodeRepair off it (Karpenter's repair ignores `do-not-disrupt`). Karpenter's key: not in
    /// [`ALL`].
    pub const KARPENTER_DO_NOT_REPAIR: &str = "karpenter.sh/do-not-repair";
    /// `nodekeeper` when nodekeeper put [`KARPENTER_DO_NOT_REPAIR`] on the node for its own repair
    /// (and will remove it): that mark is not a veto to nodekeeper. Absent when someone else put
    /// the annotation (a veto then, never removed).
    pub const DO_NOT_REPAIR_BY: &str = "nodekeeper.io/do-not-repair-by";
    /// nodekeeper's own per-node repair veto, the same for nodes of no Karpenter NodePool:
    /// `"true"` keeps every repair off the node. Set by operators, never by nodekeeper: not in
    /// [`ALL`].
    pub const DO_NOT_REPAIR: &str = "nodekeeper.io/do-not-repair";
    /// The repair vetoes, in the order a node carrying both is said to be held by.
    pub const REPAIR_VETOES: &[&str] = &[KARPENTER_DO_NOT_REPAIR, DO_NOT_REPAIR];
    /// The boot id when a reboot was requested; a different boot id proves the reboot.
    pub const REBOOT_REQUESTED: &str = "nodekeeper.io/reboot-requested";
    /// The notice being handled: `<kind>/<event id>/<RFC 3339 announced time>`.
    pub const INTERRUPTION: &str = "nodekeeper.io/interruption";
    /// How many times this node's predecessors failed to start and were replaced.
    pub const STARTUP_RETRIES: &str = "nodekeeper.io/startup-retries";
    /// Why nodekeeper is holding the node back: the JSON of [`super::super::explain::Held`].
    pub const BLOCKED: &str = "nodekeeper.io/blocked";
    /// RFC 3339 time nodekeeper first saw the node Ready; written only in the node's first
    /// minutes (see [`super::NodeView::needs_seen_ready`]), so that a node failing soon after its
    /// start is still repaired, not replaced as a failed launch, by a restarted controller.
    pub const SEEN_READY: &str = "nodekeeper.io/seen-ready";
    /// The value of `CORDONED_BY` / `LB_EXCLUDED_BY` and of the LB exclusion label.
    pub const OWNER: &str = "nodekeeper";
    /// Whether the policy reads the annotation `key`: nodekeeper's own (`nodekeeper.io/…`),
    /// [`KARPENTER_DO_NOT_DISRUPT`] and [`KARPENTER_DO_NOT_REPAIR`]. Other controllers'
    /// annotations (kube-controller-manager's `node.alpha.kubernetes.io/ttl`, a provider's)
    /// decide nothing.
    pub fn read_by_policy(key: &str) -> bool {
        key.starts_with("nodekeeper.io/")
            || key == KARPENTER_DO_NOT_DISRUPT
            || key == KARPENTER_DO_NOT_REPAIR
    }

    /// Every annotation above (for cleanup and docs).
    pub const ALL: &[&str] = &[
        STATE,
        STATE_SINCE,
        REASON,
        REPAIR_STEP,
        REPAIR_STEP_SINCE,
        CORDONED_BY,
        LB_EXCLUDED_BY,
        REPLACEMENT_REQUESTED,
        REPLACEMENT_ACCEPTED,
        RETIRE_REQUESTED,
        DO_NOT_DISRUPT_BY,
        DO_NOT_REPAIR_BY,
        REBOOT_REQUESTED,
        INTERRUPTION,
        STARTUP_RETRIES,
        BLOCKED,
        SEEN_READY,
    ];
}

/// The taint Karpenter puts on a node it has chosen to disrupt (effect `NoSchedule`), before it
/// deletes the node's NodeClaim: such a node counts against its group's budget.
pub const KARPENTER_DISRUPTED_TAINT: &str = "karpenter.sh/disrupted";

/// The taint Karpenter (v1.15) puts on a node its repair reboots in place (`RebootNode`), before
/// its drain (`pkg/controllers/nodeclaim/reboot`, `RebootingNoScheduleTaint`), and lifts after.
pub const KARPENTER_REBOOTING_TAINT: &str = "karpenter.sh/rebooting";

/// The cluster as the controller sees it at one instant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterView {
    /// Every Node.
    pub nodes: Vec<NodeView>,
    /// The Karpenter NodePools' budgets by NodePool name (read only with `[budgets] source =
    /// "nodepool"`; see [`super::nodepool`]).
    pub nodepools: BTreeMap<String, super::nodepool::PoolBudgets>,
}

/// A node condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionView {
    /// Type, e.g. `Ready`.
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// When the status last changed.
    pub last_transition_time: DateTime<Utc>,
    /// Why (the writer's CamelCase cause; `""` when none), for a policy's `reason` pattern.
    pub reason: String,
    /// Human-readable details.
    pub message: String,
    /// When its writer last confirmed it (`lastHeartbeatTime`), if it says.
    pub last_heartbeat_time: Option<DateTime<Utc>>,
}

/// A node taint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaintView {
    /// Key.
    pub key: String,
    /// Value.
    pub value: String,
    /// Effect (`NoSchedule`, ...).
    pub effect: String,
}

/// A pod on the node, as far as explanations need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The PodDisruptionBudget (`namespace/name`) that currently refuses its eviction.
    pub blocking_pdb: Option<String>,
    /// Carries `karpenter.sh/do-not-disrupt` or `nodekeeper.io/do-not-disrupt`.
    pub do_not_disrupt: bool,
}

/// Where the node's drain is (from the drain engine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DrainPhase {
    /// No drain running for this node (never started, or lost with a controller restart).
    #[default]
    Idle,
    /// Evicting.
    Running,
    /// Every pod that must leave is gone.
    Completed,
    /// Stopped at its deadline (`on_timeout = "fail"`) or failed.
    Failed,
}

/// The drain engine's report for a node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DrainView {
    /// Phase.
    pub phase: DrainPhase,
    /// The pod currently blocking it (with its PDB), if any.
    pub blocker: Option<PodView>,
}

/// A cloud notice for the node (from the agent's report or OCI Events).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// Deterministic event id.
    pub id: String,
    /// Kind.
    pub kind: NoticeKind,
    /// When the announced action happens (earliest known), if the notice says.
    pub at: Option<DateTime<Utc>>,
    /// When it was first seen.
    pub detected_at: DateTime<Utc>,
    /// When the announced window ends, if the notice gives a start and a later end (AWS's
    /// `NotAfter`): `at` is then its start.
    pub until: Option<DateTime<Utc>>,
    /// The boot id the node's agent last reported from when the engine took the notice (an
    /// on-node notice such as a shutdown belongs to that boot); none from OCI Events or before
    /// the agent's first report to this controller.
    pub boot_id: Option<String>,
}

/// Notice kinds (mirrors the agent's `EventKind`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum NoticeKind {
    /// Spot/preemptible reclaim.
    Preemption,
    /// Termination or stop.
    Termination,
    /// OS shutdown in progress.
    ShuttingDown,
    /// Host maintenance.
    Maintenance,
    /// Scheduled reboot.
    Reboot,
    /// Move to another host.
    Redeploy,
    /// Short pause.
    Freeze,
    /// Rebalance recommendation.
    Rebalance,
    /// The notice with this id was withdrawn.
    Cancelled {
        /// Id of the withdrawn notice.
        of: String,
    },
}

impl NoticeKind {
    /// Stable name (as in the agent's events).
    pub fn name(&self) -> &'static str {
        match self {
            NoticeKind::Preemption => "preemption",
            NoticeKind::Termination => "termination",
            NoticeKind::ShuttingDown => "shutting_down",
            NoticeKind::Maintenance => "maintenance",
            NoticeKind::Reboot => "reboot",
            NoticeKind::Redeploy => "redeploy",
            NoticeKind::Freeze => "freeze",
            NoticeKind::Rebalance => "rebalance",
            NoticeKind::Cancelled { .. } => "cancelled",
        }
    }
    /// Parses [`NoticeKind::name`] (not `cancelled`).
    pub fn from_name(s: &str) -> Option<Self> {
        Some(match s {
            "preemption" => NoticeKind::Preemption,
            "termination" => NoticeKind::Termination,
            "shutting_down" => NoticeKind::ShuttingDown,
            "maintenance" => NoticeKind::Maintenance,
            "reboot" => NoticeKind::Reboot,
            "redeploy" => NoticeKind::Redeploy,
            "freeze" => NoticeKind::Freeze,
            "rebalance" => NoticeKind::Rebalance,
            _ => return None,
        })
    }
}

impl From<&crate::wire::NodeEvent> for Notice {
    fn from(e: &crate::wire::NodeEvent) -> Self {
        use crate::wire::EventKind as K;
        let kind = match &e.kind {
            K::Preemption => NoticeKind::Preemption,
            K::Termination => NoticeKind::Termination,
            K::Maintenance => NoticeKind::Maintenance,
            K::Rebalance => NoticeKind::Rebalance,
            K::Reboot => NoticeKind::Reboot,
            K::Redeploy => NoticeKind::Redeploy,
            K::Freeze => NoticeKind::Freeze,
            K::ShuttingDown => NoticeKind::ShuttingDown,
            K::Cancelled { of } => NoticeKind::Cancelled { of: of.clone() },
        };
        let at = match (e.not_before, e.deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let until = e
            .not_before
            .zip(e.deadline)
            .and_then(|(a, b)| (b > a).then_some(b));
        Notice {
            id: e.id.clone(),
            kind,
            at,
            detected_at: e.detected_at,
            until,
            boot_id: None,
        }
    }
}

/// One Node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    /// Name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations (nodekeeper's progress among them, see [`keys`]).
    pub annotations: BTreeMap<String, String>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Has a deletion timestamp.
    pub deleting: bool,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// Taints.
    pub taints: Vec<TaintView>,
    /// Conditions.
    pub conditions: Vec<ConditionView>,
    /// Has been Ready at least once (see [`became_ready_heuristic`]).
    pub became_ready: bool,
    /// The kubelet's boot id (`status.nodeInfo.bootID`), when it reports one.
    pub boot_id: Option<String>,
    /// The boot id of the node agent's last report to this controller (none before it).
    pub agent_boot_id: Option<String>,
    /// Notices not yet handled or still current.
    pub notices: Vec<Notice>,
    /// The drain engine's state.
    pub drain: DrainView,
    /// Pods (optional; used to explain).
    pub pods: Vec<PodView>,
}

/// How long after its creation a node's Ready transition can be mistaken for its registration
/// by [`became_ready_heuristic`].
pub const REGISTRATION_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// `became_ready` from the Ready condition when nothing better is known: Ready now, or it
/// changed well after the node was created (kubelet registers with Ready=False, so a node
/// that never became Ready keeps a transition time close to its creation). A node that was
/// Ready and failed within [`REGISTRATION_WINDOW`] of its creation looks never Ready: hence
/// [`keys::SEEN_READY`].
pub fn became_ready_heuristic(created_at: DateTime<Utc>, ready: Option<&ConditionView>) -> bool {
    match ready {
        None => false,
        Some(c) if c.status == "True" => true,
        Some(c) => {
            let window = chrono::Duration::from_std(REGISTRATION_WINDOW).unwrap_or_default();
            c.last_transition_time - created_at > window
        }
    }
}

/// `became_ready` of a Node: [`keys::SEEN_READY`] recorded, or [`became_ready_heuristic`].
pub fn became_ready(
    created_at: DateTime<Utc>,
    ready: Option<&ConditionView>,
    annotations: &BTreeMap<String, String>,
) -> bool {
    annotations.contains_key(keys::SEEN_READY) || became_ready_heuristic(created_at, ready)
}

impl NodeView {
    /// A healthy, Ready node created at `created_at` (builder for tests and the sim).
    pub fn new(name: &str, created_at: DateTime<Utc>) -> Self {
        NodeView {
            name: name.to_string(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            created_at,
            deleting: false,
            unschedulable: false,
            taints: Vec::new(),
            conditions: vec![condition("Ready", "True", created_at)],
            became_ready: true,
            boot_id: Some("boot-0".into()),
            agent_boot_id: None,
            notices: Vec::new(),
            drain: DrainView::default(),
            pods: Vec::new(),
        }
    }

    /// The condition of `type_`.
    pub fn condition(&self, type_: &str) -> Option<&ConditionView> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// The ids of the notices withdrawn by a cancellation among its notices.
    pub fn withdrawn_notices(&self) -> Vec<&str> {
        self.notices
            .iter()
            .filter_map(|n| match &n.kind {
                NoticeKind::Cancelled { of } => Some(of.as_str()),
                _ => None,
            })
            .collect()
    }

    /// Ready=True.
    pub fn is_ready(&self) -> bool {
        self.condition("Ready").is_some_and(|c| c.status == "True")
    }

    /// Annotation value.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key).map(String::as_str)
    }

    /// The repair veto the node carries ([`keys::REPAIR_VETOES`] set to `"true"`, exactly as
    /// Karpenter compares it), if any; `karpenter.sh/do-not-repair` is none when nodekeeper put
    /// it for its own repair ([`keys::DO_NOT_REPAIR_BY`]).
    pub fn repair_veto(&self) -> Option<&'static str> {
        keys::REPAIR_VETOES.iter().copied().find(|k| {
            self.annotation(k) == Some("true")
                && !(*k == keys::KARPENTER_DO_NOT_REPAIR && self.repair_marked_by_us())
        })
    }

    /// nodekeeper put `karpenter.sh/do-not-repair` on the node for its own repair.
    pub fn repair_marked_by_us(&self) -> bool {
        self.annotation(keys::DO_NOT_REPAIR_BY) == Some(keys::OWNER)
    }

    /// Whether [`keys::SEEN_READY`] should be written now: the node is Ready, has no record of
    /// it yet and is younger than twice [`REGISTRATION_WINDOW`] (the window plus as much again
    /// for clock skew and the time to observe it). Only a failure within that window looks like
    /// "never Ready" to [`became_ready_heuristic`]; a node Ready after it fails later with a
    /// later transition time. So only new nodes are ever written, once each, and a controller
    /// starting on an existing cluster writes none.
    pub fn needs_seen_ready(&self, now: DateTime<Utc>) -> bool {
        self.is_ready()
            && !self.annotations.contains_key(keys::SEEN_READY)
            && now < super::later(self.created_at, 2 * REGISTRATION_WINDOW)
    }

    /// Has a taint with `key`.
    pub fn has_taint(&self, key: &str) -> bool {
        self.taints.iter().any(|t| t.key == key)
    }

    /// Karpenter has chosen to disrupt it: it carries [`KARPENTER_DISRUPTED_TAINT`], or
    /// [`KARPENTER_REBOOTING_TAINT`] for a reboot in place (any effect).
    pub fn karpenter_disrupted(&self) -> bool {
        self.has_taint(KARPENTER_DISRUPTED_TAINT) || self.has_taint(KARPENTER_REBOOTING_TAINT)
    }

    /// nodekeeper's recorded progress, parsed from the annotations.
    pub fn record(&self) -> Record {
        Record::from_annotations(&self.annotations)
    }

    /// Applies one action as the actor would on success (tests, simulations and dry-run
    /// previews use this to play decisions forward).
    pub fn apply(&mut self, action: &Action) {
        match action {
            Action::Annotate { key, value } => match value {
                Some(v) => {
                    self.annotations.insert(key.clone(), v.clone());
                }
                None => {
                    self.annotations.remove(key);
                }
            },
            Action::Cordon => self.unschedulable = true,
            Action::Uncordon => self.unschedulable = false,
            Action::Taint { key, value, effect } => {
                if !self.has_taint(key) {
                    self.taints.push(TaintView {
                        key: key.clone(),
                        value: value.clone(),
                        effect: effect.clone(),
                    });
                }
            }
            Action::Untaint { key } => self.taints.retain(|t| &t.key != key),
            Action::Label { key, value } => match value {
                Some(v) => {
                    self.labels.insert(key.clone(), v.clone());
                }
                None => {
                    self.labels.remove(key);
                }
            },
            Action::StartDrain { .. } => {
                if self.drain.phase == DrainPhase::Idle {
                    self.drain.phase = DrainPhase::Running;
                }
            }
            Action::StopDrain => self.drain = DrainView::default(),
            Action::Hold(h) => {
                self.annotations
                    .insert(keys::BLOCKED.to_string(), h.encode());
            }
            Action::RequestReboot { .. }
            | Action::RestartUnit { .. }
            | Action::RequestReplacement { .. }
            | Action::RetireNode { .. }
            | Action::AbandonReplacement { .. }
            | Action::Event { .. } => {}
        }
    }
}

/// nodekeeper's state of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum State {
    /// Not acting on it.
    #[default]
    Idle,
    /// Handling an interruption notice.
    Interrupted,
    /// Cordoned for a notice whose action is cordon only (e.g. rebalance).
    Cordoned,
    /// Repairing.
    Repairing,
}

impl State {
    /// Annotation value (`None` for idle).
    pub fn name(self) -> Option<&'static str> {
        match self {
            State::Idle => None,
            State::Interrupted => Some("interrupted"),
            State::Cordoned => Some("cordoned"),
            State::Repairing => Some("repairing"),
        }
    }
    fn parse(s: Option<&str>) -> Self {
        match s {
            Some("interrupted") => State::Interrupted,
            Some("cordoned") => State::Cordoned,
            Some("repairing") => State::Repairing,
            _ => State::Idle,
        }
    }
}

/// The interruption being handled, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedNotice {
    /// Kind.
    pub kind: NoticeKind,
    /// Event id.
    pub id: String,
    /// Announced time.
    pub at: DateTime<Utc>,
}

impl RecordedNotice {
    /// `kind/id/time` as stored in [`keys::INTERRUPTION`].
    pub fn encode(&self) -> String {
        format!("{}/{}/{}", self.kind.name(), self.id, self.at.to_rfc3339())
    }
    fn decode(s: &str) -> Option<Self> {
        let mut it = s.splitn(3, '/');
        let kind = NoticeKind::from_name(it.next()?)?;
        let id = it.next()?.to_string();
        let at = parse_time(it.next()?)?;
        Some(RecordedNotice { kind, id, at })
    }
}

/// nodekeeper's progress on a node, from its annotations (see [`keys`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Record {
    /// State.
    pub state: State,
    /// When the state began.
    pub since: Option<DateTime<Utc>>,
    /// Recorded reason.
    pub reason: Option<String>,
    /// Repair step.
    pub step: Option<RepairStep>,
    /// The unit of a `restart-unit` step.
    pub step_unit: Option<String>,
    /// When the step began.
    pub step_since: Option<DateTime<Utc>>,
    /// nodekeeper cordoned it.
    pub cordoned_by_us: bool,
    /// nodekeeper added the LB exclusion label.
    pub lb_excluded_by_us: bool,
    /// Replacement requested at.
    pub replacement_requested: Option<DateTime<Utc>>,
    /// The provider accepted the replacement request.
    pub replacement_accepted: bool,
    /// The node was handed to the provider to be taken away.
    pub retire_requested: bool,
    /// nodekeeper put `karpenter.sh/do-not-disrupt` on the node.
    pub marked_by_us: bool,
    /// Boot id at the reboot request.
    pub reboot_boot_id: Option<String>,
    /// The notice being handled.
    pub notice: Option<RecordedNotice>,
    /// Startup retries of this node's lineage.
    pub startup_retries: u32,
    /// The hold currently published, if any.
    pub held: Option<super::explain::Held>,
}

/// Parses an RFC 3339 time.
pub fn parse_time(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|d| d.with_timezone(&Utc))
}

impl Record {
    /// Parses the catalog keys; malformed values read as absent.
    pub fn from_annotations(a: &BTreeMap<String, String>) -> Self {
        let get = |k: &str| a.get(k).map(String::as_str);
        let step = get(keys::REPAIR_STEP).and_then(LadderStep::from_label);
        Record {
            state: State::parse(get(keys::STATE)),
            since: get(keys::STATE_SINCE).and_then(parse_time),
            reason: get(keys::REASON).map(str::to_string),
            step: step.as_ref().map(|s| s.step),
            step_unit: step.and_then(|s| s.unit),
            step_since: get(keys::REPAIR_STEP_SINCE).and_then(parse_time),
            cordoned_by_us: get(keys::CORDONED_BY) == Some(keys::OWNER),
            lb_excluded_by_us: get(keys::LB_EXCLUDED_BY) == Some(keys::OWNER),
            replacement_requested: get(keys::REPLACEMENT_REQUESTED).and_then(parse_time),
            replacement_accepted: get(keys::REPLACEMENT_ACCEPTED).is_some(),
            retire_requested: get(keys::RETIRE_REQUESTED).is_some(),
            marked_by_us: get(keys::DO_NOT_DISRUPT_BY) == Some(keys::OWNER),
            reboot_boot_id: get(keys::REBOOT_REQUESTED).map(str::to_string),
            notice: get(keys::INTERRUPTION).and_then(RecordedNotice::decode),
            startup_retries: get(keys::STARTUP_RETRIES)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            held: get(keys::BLOCKED).and_then(super::explain::Held::decode),
        }
    }
}

/// Convenience for a condition: `(type, status, since)`.
pub fn condition(type_: &str, status: &str, since: DateTime<Utc>) -> ConditionView {
    ConditionView {
        type_: type_.into(),
        status: status.into(),
        last_transition_time: since,
        reason: String::new(),
        message: String::new(),
        last_heartbeat_time: None,
    }
}

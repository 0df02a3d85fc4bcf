//! The catalog of every Kubernetes Event reason the controller records, with its type, and of the
//! node conditions it writes itself (docs/catalog.md, checked by `tests/unit_like/catalog.rs`).
//!
//! One home, as Karpenter's `pkg/events/reason.go`: the policy's Events ([`crate::controller::policy::Action::Event`]),
//! the hold Events (the [`crate::controller::policy::explain::Blocker`] reasons, which are also the `NodekeeperHeld`
//! condition's reasons), the report path's Events ([`crate::controller::state::nodestate`], [`crate::controller::state::labels`]) and the
//! actor's ([`crate::controller::act::actions`]) all name a [`Reason`], never a string. Reasons are stable: alerting
//! may match on them.
//!
//! Not in the catalog: the reasons of the agent's check events (`CheckEvent`). They come from the
//! user's kmsg rules and stay strings, made valid by [`crate::controller::cluster::events::sanitize_reason`], with
//! [`crate::controller::cluster::events::FALLBACK_CHECK_REASON`] when nothing usable is left.

use std::fmt;

/// Event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Normal.
    Normal,
    /// Warning.
    Warning,
}

impl EventType {
    /// `Normal` or `Warning`, as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

const NORMAL: &[EventType] = &[EventType::Normal];
const WARNING: &[EventType] = &[EventType::Warning];
const EITHER: &[EventType] = &[EventType::Normal, EventType::Warning];

/// Every Event reason the controller records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    // Report path: notices (one per node event id).
    /// A cloud announced preemption/termination of the node's instance (Warning).
    PreemptionNotice,
    /// Host maintenance, reboot, redeploy or freeze was announced (Warning).
    MaintenanceNotice,
    /// The platform recommends moving work off the instance (Normal).
    RebalanceRecommendation,
    /// The node's operating system is shutting down (Warning).
    NodeShuttingDown,
    /// An earlier notice was withdrawn (Normal).
    NoticeCancelled,
    // Report path: the agent, its reports and its requests.
    /// The agent stopped reporting; its conditions were set to Unknown (Warning).
    AgentSilent,
    /// A node's Events are being dropped over `[controller.report_limits] events_burst` /
    /// `events_every`; recorded once per stretch (Warning).
    EventsRateLimited,
    /// An allow-listed label was removed on the agent's request (Normal).
    LabelRemoved,
    /// An agent asked to remove a label that is not allow-listed (Warning).
    LabelRemovalDenied,
    /// The node's CRI-O refused the new drop-ins; the agent restored the previous ones (Warning).
    CrioConfigRolledBack,
    /// The agent could not apply the CRI-O drop-ins (nothing changed, or the rollback failed too) (Warning).
    CrioConfigFailed,
    /// The running CRI-O ignores drop-in keys, or holds other values (Warning).
    CrioConfigIgnored,
    // Disruption engine: the policy's Events.
    /// A repair began (Warning).
    RepairStarted,
    /// A repair escalated to the next step (Warning).
    RepairEscalated,
    /// The node became healthy for `healthy_delay`; the repair ended (Normal).
    RepairCancelled,
    /// An interruption notice is being handled: Normal when it is only recorded or cordons,
    /// Warning when its drain starts.
    InterruptionNotice,
    /// A notice was withdrawn; nodekeeper undid what it did (Normal).
    InterruptionCancelled,
    /// The node outlived its notice and is healthy; released (Normal).
    InterruptionReleased,
    /// A replacement was requested (Normal).
    ReplacementRequested,
    /// A reboot was requested (Normal).
    RebootRequested,
    /// The node's agent was asked to restart a systemd unit (a `restart-unit` step) (Normal).
    UnitRestartRequested,
    /// A node did not become Ready within `startup_timeout` (Warning).
    StartupTimeout,
    /// A leftover of nodekeeper's (cordon, taint, label) with no state was removed (Normal).
    NodekeeperCleanup,
    /// No longer held (Normal).
    HoldReleased,
    // Disruption engine: holds (also the `NodekeeperHeld` condition's reasons; see `HELD`).
    /// An eviction is refused by a PodDisruptionBudget (Warning).
    BlockedByPDB,
    /// A pod opts out of voluntary disruption (Warning).
    BlockedByDoNotDisrupt,
    /// An operator vetoed the node's repair: `karpenter.sh/do-not-repair` or
    /// `nodekeeper.io/do-not-repair` is `"true"` (Warning).
    BlockedByDoNotRepair,
    /// Karpenter is disrupting the node (`karpenter.sh/disrupted`, or `karpenter.sh/rebooting`
    /// for a reboot in place): nodekeeper stands back
    /// (Warning).
    BlockedByKarpenter,
    /// The group's disruption budget allows no more nodes now (Warning).
    BlockedByBudget,
    /// The group's NodePool has budgets Karpenter would refuse (Warning).
    BlockedByNodePool,
    /// Too many nodes of the group are unhealthy to start another repair (Warning).
    RepairShortCircuited,
    /// A drain missed its deadline (Warning).
    DeadlineExceeded,
    /// Replacement nodes kept failing to become Ready (Warning).
    StartupRetriesExhausted,
    /// A replacement was requested but the node is still here (Warning).
    ReplacementPending,
    /// The ladder's next step is a reboot or replace, and the condition is one nodekeeper
    /// cannot see clear (Warning).
    BlockedByUntrustedCondition,
    /// The repair policy's ladder says `none`: held for an operator (Warning).
    HeldByRepairPolicy,
    // Disruption engine: the actor's.
    /// The replacement provider refused or failed a call (Warning).
    ReplacementFailed,
    /// The node's agent refused or failed a command (restart-unit, reboot), or cannot run it
    /// (Warning).
    AgentCommandFailed,
}

impl Reason {
    /// Every reason, in the order of docs/catalog.md's table.
    pub const ALL: &'static [Reason] = &[
        Reason::PreemptionNotice,
        Reason::MaintenanceNotice,
        Reason::RebalanceRecommendation,
        Reason::NodeShuttingDown,
        Reason::NoticeCancelled,
        Reason::AgentSilent,
        Reason::EventsRateLimited,
        Reason::LabelRemoved,
        Reason::LabelRemovalDenied,
        Reason::CrioConfigRolledBack,
        Reason::CrioConfigFailed,
        Reason::CrioConfigIgnored,
        Reason::RepairStarted,
        Reason::RepairEscalated,
        Reason::RepairCancelled,
        Reason::InterruptionNotice,
        Reason::InterruptionCancelled,
        Reason::InterruptionReleased,
        Reason::ReplacementRequested,
        Reason::RebootRequested,
        Reason::UnitRestartRequested,
        Reason::StartupTimeout,
        Reason::NodekeeperCleanup,
        Reason::HoldReleased,
        Reason::BlockedByPDB,
        Reason::BlockedByDoNotDisrupt,
        Reason::BlockedByDoNotRepair,
        Reason::BlockedByKarpenter,
        Reason::BlockedByBudget,
        Reason::BlockedByNodePool,
        Reason::RepairShortCircuited,
        Reason::DeadlineExceeded,
        Reason::StartupRetriesExhausted,
        Reason::ReplacementPending,
        Reason::BlockedByUntrustedCondition,
        Reason::HeldByRepairPolicy,
        Reason::ReplacementFailed,
        Reason::AgentCommandFailed,
    ];

    /// The reasons of the `NodekeeperHeld` condition while `True` (one per blocker kind); each is
    /// also the reason of the Warning Event that announces the hold.
    pub const HELD: &'static [Reason] = &[
        Reason::BlockedByPDB,
        Reason::BlockedByDoNotDisrupt,
        Reason::BlockedByDoNotRepair,
        Reason::BlockedByKarpenter,
        Reason::BlockedByBudget,
        Reason::BlockedByNodePool,
        Reason::RepairShortCircuited,
        Reason::DeadlineExceeded,
        Reason::StartupRetriesExhausted,
        Reason::ReplacementPending,
        Reason::BlockedByUntrustedCondition,
        Reason::HeldByRepairPolicy,
    ];

    /// The CamelCase reason string.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::PreemptionNotice => "PreemptionNotice",
            Reason::MaintenanceNotice => "MaintenanceNotice",
            Reason::RebalanceRecommendation => "RebalanceRecommendation",
            Reason::NodeShuttingDown => "NodeShuttingDown",
            Reason::NoticeCancelled => "NoticeCancelled",
            Reason::AgentSilent => "AgentSilent",
            Reason::EventsRateLimited => "EventsRateLimited",
            Reason::LabelRemoved => "LabelRemoved",
            Reason::LabelRemovalDenied => "LabelRemovalDenied",
            Reason::CrioConfigRolledBack => "CrioConfigRolledBack",
            Reason::CrioConfigFailed => "CrioConfigFailed",
            Reason::CrioConfigIgnored => "CrioConfigIgnored",
            Reason::RepairStarted => "RepairStarted",
            Reason::RepairEscalated => "RepairEscalated",
            Reason::RepairCancelled => "RepairCancelled",
            Reason::InterruptionNotice => "InterruptionNotice",
            Reason::InterruptionCancelled => "InterruptionCancelled",
            Reason::InterruptionReleased => "InterruptionReleased",
            Reason::ReplacementRequested => "ReplacementRequested",
            Reason::RebootRequested => "RebootRequested",
            Reason::StartupTimeout => "StartupTimeout",
            Reason::NodekeeperCleanup => "NodekeeperCleanup",
            Reason::HoldReleased => "HoldReleased",
            Reason::BlockedByPDB => "BlockedByPDB",
            Reason::BlockedByDoNotDisrupt => "BlockedByDoNotDisrupt",
            Reason::BlockedByDoNotRepair => "BlockedByDoNotRepair",
            Reason::BlockedByKarpenter => "BlockedByKarpenter",
            Reason::BlockedByBudget => "BlockedByBudget",
            Reason::BlockedByNodePool => "BlockedByNodePool",
            Reason::RepairShortCircuited => "RepairShortCircuited",
            Reason::DeadlineExceeded => "DeadlineExceeded",
            Reason::StartupRetriesExhausted => "StartupRetriesExhausted",
            Reason::ReplacementPending => "ReplacementPending",
            Reason::ReplacementFailed => "ReplacementFailed",
            Reason::UnitRestartRequested => "UnitRestartRequested",
            Reason::BlockedByUntrustedCondition => "BlockedByUntrustedCondition",
            Reason::HeldByRepairPolicy => "HeldByRepairPolicy",
            Reason::AgentCommandFailed => "AgentCommandFailed",
        }
    }

    /// The types its Events have: one, but `Normal` and `Warning` for [`Reason::InterruptionNotice`]
    /// (Warning when the drain starts).
    pub fn event_types(self) -> &'static [EventType] {
        match self {
            Reason::InterruptionNotice => EITHER,
            Reason::RebalanceRecommendation
            | Reason::NoticeCancelled
            | Reason::LabelRemoved
            | Reason::RepairCancelled
            | Reason::InterruptionCancelled
            | Reason::InterruptionReleased
            | Reason::ReplacementRequested
            | Reason::RebootRequested
            | Reason::UnitRestartRequested
            | Reason::NodekeeperCleanup
            | Reason::HoldReleased => NORMAL,
            _ => WARNING,
        }
    }

    /// The type of its Events, for a reason with one (see [`Reason::event_types`]); `Warning` for
    /// [`Reason::InterruptionNotice`], whose callers name the type.
    pub fn event_type(self) -> EventType {
        let types = self.event_types();
        types[types.len() - 1]
    }

    /// The reason of the Event for a node event kind.
    pub fn for_kind(kind: &crate::wire::EventKind) -> Reason {
        use crate::wire::EventKind as K;
        match kind {
            K::Preemption | K::Termination => Reason::PreemptionNotice,
            K::Maintenance | K::Reboot | K::Redeploy | K::Freeze => Reason::MaintenanceNotice,
            K::Rebalance => Reason::RebalanceRecommendation,
            K::ShuttingDown => Reason::NodeShuttingDown,
            K::Cancelled { .. } => Reason::NoticeCancelled,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The node condition type of a hold, written by the engine only (agents can neither set nor
/// remove it): `True` with a [`Reason::HELD`] reason, `False` with [`NOT_HELD`].
pub const HELD_CONDITION: &str = "NodekeeperHeld";

/// The `NodekeeperHeld` condition's reason once released (`False`).
pub const NOT_HELD: &str = "NotHeld";

/// KEP-5683's node lifecycle condition (Kubernetes 1.37, gate `NodeLifecycleConditions`) that
/// nodekeeper sets while it drains a node (`[controller.engine] lifecycle_conditions`).
pub const DRAIN_IN_PROGRESS: &str = "DrainInProgress";

/// KEP-5683's condition that the node reached nodekeeper's drain criteria.
pub const DRAINED: &str = "Drained";

/// The reasons of [`DRAIN_IN_PROGRESS`] and [`DRAINED`].
pub const DRAIN_CONDITION_REASONS: [&str; 5] = [
    "DrainStarted",
    "DrainCompleted",
    "DrainTimedOut",
    "DrainStopped",
    "DrainFailed",
];

/// KEP-5683's condition that maintenance is expected: nodekeeper sets it from a scheduled host
/// maintenance notice until its window starts ([`crate::controller::policy::lifecycle`]).
pub const MAINTENANCE_PLANNED: &str = "MaintenancePlanned";

/// KEP-5683's condition that maintenance is under way: from the notice's window start to its end.
pub const MAINTENANCE_IN_PROGRESS: &str = "MaintenanceInProgress";

/// KEP-5683's condition that Graceful Node Shutdown is under way: from the agent's shutdown
/// watcher until the agent reports from a new boot.
pub const GRACEFUL_NODE_SHUTDOWN_IN_PROGRESS: &str = "GracefulNodeShutdownInProgress";

/// `True` reason of the maintenance conditions: the node is in, or before, a notice's window
/// (KEP-5683's own example).
pub const MAINTENANCE_WINDOW: &str = "MaintenanceWindow";
/// `False` reason of [`MAINTENANCE_PLANNED`] once the window started.
pub const MAINTENANCE_STARTED: &str = "MaintenanceStarted";
/// `False` reason of the maintenance conditions once the window ended.
pub const MAINTENANCE_ENDED: &str = "MaintenanceEnded";
/// `True` reason of [`GRACEFUL_NODE_SHUTDOWN_IN_PROGRESS`] (KEP-5683's own example).
pub const NODE_SHUTDOWN: &str = "NodeShutdown";
/// `False` reason of [`GRACEFUL_NODE_SHUTDOWN_IN_PROGRESS`] once the agent reports from a new boot.
pub const NODE_REBOOTED: &str = "NodeRebooted";
/// `False` reason when the notice was withdrawn (or is no longer known).
pub const NOTICE_WITHDRAWN: &str = "NoticeWithdrawn";

/// The reasons of [`MAINTENANCE_PLANNED`], [`MAINTENANCE_IN_PROGRESS`] and
/// [`GRACEFUL_NODE_SHUTDOWN_IN_PROGRESS`].
pub const NOTICE_CONDITION_REASONS: [&str; 6] = [
    MAINTENANCE_WINDOW,
    MAINTENANCE_STARTED,
    MAINTENANCE_ENDED,
    NODE_SHUTDOWN,
    NODE_REBOOTED,
    NOTICE_WITHDRAWN,
];

/// The reason of a nodekeeper condition the controller set to `Unknown` because the node's agent
/// stopped reporting (staleness).
pub const AGENT_NOT_REPORTING: &str = "AgentNotReporting";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_unique_valid_and_typed() {
        let mut seen = std::collections::BTreeSet::new();
        for r in Reason::ALL {
            assert!(seen.insert(r.as_str()), "{r:?} twice");
            assert_eq!(format!("{r:?}"), r.as_str());
            assert!(r.event_types().contains(&r.event_type()), "{r:?}");
        }
        for r in Reason::HELD {
            assert!(Reason::ALL.contains(r), "{r:?}");
            assert_eq!(r.event_types(), WARNING, "{r:?}");
        }
    }
}

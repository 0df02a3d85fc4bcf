//! The policy's Events: one constructor per Event, as Karpenter's `disruption/events`. Each names
//! its reason and type from the catalog ([`crate::controller::catalog`]) and words its note, so a
//! decision picks an Event, never a reason string or a type.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::config::LadderStep;
use super::explain::Blocker;
use super::view::NoticeKind;
use super::Action;
use crate::controller::catalog::{EventType, Reason};

fn event(type_: EventType, reason: Reason, message: String) -> Action {
    debug_assert!(
        reason.event_types().contains(&type_),
        "{reason:?} {type_:?}"
    );
    Action::Event {
        type_,
        reason,
        message,
    }
}

/// A node not Ready `timeout` after creation is replaced (`retry` of `max`).
pub(crate) fn startup_timeout(timeout: Duration, retry: u32, max: u32) -> Action {
    event(
        EventType::Warning,
        Reason::StartupTimeout,
        format!(
            "not Ready {} after creation; replacing it (retry {retry} of {max})",
            humantime::format_duration(timeout),
        ),
    )
}

/// A repair for `why` starts with step `first`.
pub(crate) fn repair_started(why: &str, first: &LadderStep) -> Action {
    event(
        EventType::Warning,
        Reason::RepairStarted,
        format!("{why}: repair started with step {}", first.label()),
    )
}

/// The repair step `from` is done or timed out; `next` starts.
pub(crate) fn repair_escalated(from: &LadderStep, next: &LadderStep) -> Action {
    event(
        EventType::Warning,
        Reason::RepairEscalated,
        format!(
            "repair step {} done or timed out; next: {}",
            from.label(),
            next.label()
        ),
    )
}

/// The repair for `why` asks the node's agent to restart the systemd unit `unit`.
pub(crate) fn unit_restart_requested(why: &str, unit: &str) -> Action {
    event(
        EventType::Normal,
        Reason::UnitRestartRequested,
        format!("{why}: restart of {unit} requested"),
    )
}

/// The node was healthy for `healthy_delay`: the repair ended.
pub(crate) fn repair_cancelled(healthy_delay: Duration) -> Action {
    event(
        EventType::Normal,
        Reason::RepairCancelled,
        format!(
            "healthy for {}: repair ended, node released",
            humantime::format_duration(healthy_delay)
        ),
    )
}

/// The repair for `why` asks the node's agent to reboot.
pub(crate) fn reboot_requested(why: &str) -> Action {
    event(
        EventType::Normal,
        Reason::RebootRequested,
        format!("{why}: reboot requested"),
    )
}

/// A notice for `at` that is already past: recorded, nothing done.
pub(crate) fn notice_past(kind: &NoticeKind, id: &str, at: DateTime<Utc>) -> Action {
    event(
        EventType::Normal,
        Reason::InterruptionNotice,
        format!(
            "{} notice {id} for {} is past: ignored",
            kind.name(),
            at.to_rfc3339()
        ),
    )
}

/// A notice whose configured action is an Event only.
pub(crate) fn notice_recorded(kind: &NoticeKind, id: &str, at: DateTime<Utc>) -> Action {
    event(
        EventType::Normal,
        Reason::InterruptionNotice,
        format!("{} notice {id} for {}", kind.name(), at.to_rfc3339()),
    )
}

/// A notice whose configured action is a cordon.
pub(crate) fn notice_cordoned(kind: &NoticeKind, id: &str) -> Action {
    event(
        EventType::Normal,
        Reason::InterruptionNotice,
        format!("{} notice {id}: cordoned", kind.name()),
    )
}

/// A notice for `at` whose drain starts, due by `deadline` (a Warning: pods are evicted).
pub(crate) fn notice_draining(
    kind: &NoticeKind,
    id: &str,
    at: DateTime<Utc>,
    deadline: DateTime<Utc>,
) -> Action {
    event(
        EventType::Warning,
        Reason::InterruptionNotice,
        format!(
            "{} notice {id} for {}: draining by {}",
            kind.name(),
            at.to_rfc3339(),
            deadline.to_rfc3339()
        ),
    )
}

/// The notice was withdrawn: what nodekeeper did is undone.
pub(crate) fn interruption_cancelled(kind: &NoticeKind, id: &str) -> Action {
    event(
        EventType::Normal,
        Reason::InterruptionCancelled,
        format!(
            "{} notice {id} withdrawn: undid nodekeeper's taint/cordon/label",
            kind.name()
        ),
    )
}

/// The node is still healthy `release_after` past its notice: released.
pub(crate) fn interruption_released(release_after: Duration, kind: &NoticeKind) -> Action {
    event(
        EventType::Normal,
        Reason::InterruptionReleased,
        format!(
            "node still healthy {} after its {} notice: released",
            humantime::format_duration(release_after),
            kind.name()
        ),
    )
}

/// A replacement is requested for `why`.
pub(crate) fn replacement_requested(why: &str) -> Action {
    event(
        EventType::Normal,
        Reason::ReplacementRequested,
        format!("replacement requested ({why})"),
    )
}

/// The node is held by `blocker` (the reason of its `NodekeeperHeld` condition too).
pub(crate) fn held(blocker: &Blocker) -> Action {
    event(
        EventType::Warning,
        blocker.event_reason(),
        blocker.message(),
    )
}

/// The node is no longer held.
pub(crate) fn hold_released() -> Action {
    event(
        EventType::Normal,
        Reason::HoldReleased,
        "no longer held".to_string(),
    )
}

/// Leftovers of a finished action (cordon, taint, label) were removed.
pub(crate) fn cleanup() -> Action {
    event(
        EventType::Normal,
        Reason::NodekeeperCleanup,
        "removed nodekeeper's leftover cordon/taint/label of a finished action".into(),
    )
}

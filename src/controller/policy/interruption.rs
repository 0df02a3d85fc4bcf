//! Interruption notices: preemption/termination/maintenance → taint + cordon + LB exclusion in
//! the same decision, a drain whose deadline is the announced time minus the safety margin,
//! and (for kinds that lose the instance) the replacement requested immediately. Rebalance →
//! cordon only by default. Cancellation → undo only what nodekeeper did (never an admin
//! cordon). Interruptions are not gated by budgets but are counted by them; a rebalance
//! configured to drain is gated (reason `rebalance`).

use chrono::{DateTime, Utc};

use super::budget::Reason;
use super::config::{InterruptionAction, PolicyConfig};
use super::explain::Blocker;
use super::view::{keys, DrainPhase, Notice, NoticeKind, RecordedNotice, State};
use super::{reasons, Action, Candidate, EventType, Plan, Start};

/// The configured action for a notice kind.
pub fn action_for(kind: &NoticeKind, cfg: &PolicyConfig) -> InterruptionAction {
    let a = &cfg.interruption.actions;
    match kind {
        NoticeKind::Preemption => a.preemption,
        NoticeKind::Termination => a.termination,
        NoticeKind::ShuttingDown => a.shutting_down,
        NoticeKind::Maintenance => a.maintenance,
        NoticeKind::Reboot => a.reboot,
        NoticeKind::Redeploy => a.redeploy,
        NoticeKind::Freeze => a.freeze,
        NoticeKind::Rebalance => a.rebalance,
        NoticeKind::Cancelled { .. } => InterruptionAction::Ignore,
    }
}

fn strength(a: InterruptionAction) -> u8 {
    match a {
        InterruptionAction::Ignore => 0,
        InterruptionAction::Event => 1,
        InterruptionAction::Cordon => 2,
        InterruptionAction::Drain => 3,
        InterruptionAction::DrainReplace => 4,
    }
}

/// The announced time of a notice (detection + `default_lead` when it has none).
pub fn announced_at(n: &Notice, cfg: &PolicyConfig) -> DateTime<Utc> {
    n.at.unwrap_or_else(|| n.detected_at + lead(cfg.interruption.default_lead))
}

/// The drain deadline for a notice announced for `at`.
pub fn drain_deadline(at: DateTime<Utc>, cfg: &PolicyConfig) -> DateTime<Utc> {
    at - lead(cfg.interruption.safety_margin)
}

fn lead(d: std::time::Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// Handles notices for one node; true when the interruption flow owns the node this round.
pub(crate) fn step(p: &mut Plan<'_>, cfg: &PolicyConfig) -> bool {
    if p.node.deleting {
        return false;
    }
    let cancelled: Vec<&str> = p
        .node
        .notices
        .iter()
        .filter_map(|n| match &n.kind {
            NoticeKind::Cancelled { of } => Some(of.as_str()),
            _ => None,
        })
        .collect();
    if let Some(rn) = p.record.notice.clone() {
        if cancelled.contains(&rn.id.as_str()) {
            cancel(p, cfg, &rn);
            return true;
        }
    }
    let target = p
        .node
        .notices
        .iter()
        .filter(|n| !matches!(n.kind, NoticeKind::Cancelled { .. }))
        .filter(|n| !cancelled.contains(&n.id.as_str()))
        .filter(|n| action_for(&n.kind, cfg) != InterruptionAction::Ignore)
        .max_by_key(|n| {
            (
                strength(action_for(&n.kind, cfg)),
                std::cmp::Reverse(announced_at(n, cfg)),
            )
        })
        .cloned();
    if let Some(n) = target.filter(|n| is_new(p, n, cfg)) {
        return begin(p, cfg, n);
    }
    match (p.record.state, p.record.notice.clone()) {
        (State::Interrupted | State::Cordoned, Some(rn)) => {
            resume(p, cfg, &rn);
            true
        }
        _ => false,
    }
}

/// Supersedes what is recorded: none recorded, or stronger, or as strong and sooner.
fn is_new(p: &Plan<'_>, n: &Notice, cfg: &PolicyConfig) -> bool {
    let Some(rn) = &p.record.notice else {
        return true;
    };
    if rn.id == n.id {
        return false;
    }
    let (a, b) = (
        strength(action_for(&n.kind, cfg)),
        strength(action_for(&rn.kind, cfg)),
    );
    a > b || (a == b && announced_at(n, cfg) < rn.at)
}

fn begin(p: &mut Plan<'_>, cfg: &PolicyConfig, n: Notice) -> bool {
    match action_for(&n.kind, cfg) {
        InterruptionAction::Ignore => false,
        InterruptionAction::Event => {
            let rn = recorded(&n, cfg);
            p.set(keys::INTERRUPTION, rn.encode());
            p.event(
                EventType::Normal,
                reasons::INTERRUPTION,
                format!(
                    "{} notice {} for {}",
                    n.kind.name(),
                    n.id,
                    rn.at.to_rfc3339()
                ),
            );
            false
        }
        InterruptionAction::Cordon => {
            let rn = recorded(&n, cfg);
            p.set(keys::INTERRUPTION, rn.encode());
            p.enter(State::Cordoned, &format!("interruption:{}", n.kind.name()));
            p.event(
                EventType::Normal,
                reasons::INTERRUPTION,
                format!("{} notice {}: cordoned", n.kind.name(), n.id),
            );
            true
        }
        InterruptionAction::Drain | InterruptionAction::DrainReplace => {
            if n.kind == NoticeKind::Rebalance {
                p.candidate = Some(Candidate {
                    reason: Reason::Rebalance,
                    since: n.detected_at,
                    start: Start::Interruption { notice: n },
                });
            } else {
                start(p, cfg, &n);
            }
            true
        }
    }
}

fn recorded(n: &Notice, cfg: &PolicyConfig) -> RecordedNotice {
    RecordedNotice {
        kind: n.kind.clone(),
        id: n.id.clone(),
        at: announced_at(n, cfg),
    }
}

/// Taint, cordon, LB exclusion, drain with deadline, replacement: all in this decision.
pub(crate) fn start(p: &mut Plan<'_>, cfg: &PolicyConfig, n: &Notice) {
    let rn = recorded(n, cfg);
    let why = format!("interruption:{}", n.kind.name());
    for k in [
        keys::REPAIR_STEP,
        keys::REPAIR_STEP_SINCE,
        keys::REBOOT_REQUESTED,
    ] {
        p.clear(k);
    }
    p.set(keys::INTERRUPTION, rn.encode());
    if !p.node.has_taint(&cfg.interruption.taint_key) {
        p.actions.push(taint(cfg, &n.kind));
    }
    p.enter(State::Interrupted, &why);
    p.exclude_from_lb(&cfg.interruption.lb_exclude_label);
    let deadline = drain_deadline(rn.at, cfg);
    p.actions.push(Action::StartDrain {
        deadline,
        reason: why.clone(),
    });
    p.event(
        EventType::Warning,
        reasons::INTERRUPTION,
        format!(
            "{} notice {} for {}: draining by {}",
            n.kind.name(),
            n.id,
            rn.at.to_rfc3339(),
            deadline.to_rfc3339()
        ),
    );
    if action_for(&n.kind, cfg) == InterruptionAction::DrainReplace {
        p.request_replacement(&why, 0);
    }
    p.record.notice = Some(rn);
    p.disrupting = true;
}

fn taint(cfg: &PolicyConfig, kind: &NoticeKind) -> Action {
    Action::Taint {
        key: cfg.interruption.taint_key.clone(),
        value: kind.name().to_string(),
        effect: cfg.interruption.taint_effect.as_str().to_string(),
    }
}

fn cancel(p: &mut Plan<'_>, cfg: &PolicyConfig, rn: &RecordedNotice) {
    let was_acting = p.record.state != State::Idle;
    p.release(cfg);
    if was_acting {
        p.event(
            EventType::Normal,
            reasons::INTERRUPTION_CANCELLED,
            format!(
                "{} notice {} withdrawn: undid nodekeeper's taint/cordon/label",
                rn.kind.name(),
                rn.id
            ),
        );
    }
}

/// Re-asserts an interruption in progress (after a restart too), or releases a node that
/// outlived its notice.
fn resume(p: &mut Plan<'_>, cfg: &PolicyConfig, rn: &RecordedNotice) {
    if p.record.cordoned_by_us && !p.node.unschedulable {
        p.actions.push(Action::Cordon);
    }
    if p.record.state == State::Cordoned {
        return;
    }
    let release_at = rn.at + lead(cfg.interruption.release_after);
    if p.now >= release_at && p.node.is_ready() {
        p.release(cfg);
        p.event(
            EventType::Normal,
            reasons::INTERRUPTION_RELEASED,
            format!(
                "node still healthy {} after its {} notice: released",
                humantime::format_duration(cfg.interruption.release_after),
                rn.kind.name()
            ),
        );
        return;
    }
    if !p.node.has_taint(&cfg.interruption.taint_key) {
        p.actions.push(taint(cfg, &rn.kind));
    }
    let deadline = drain_deadline(rn.at, cfg);
    match p.node.drain.phase {
        DrainPhase::Idle => p.actions.push(Action::StartDrain {
            deadline,
            reason: format!("interruption:{}", rn.kind.name()),
        }),
        DrainPhase::Completed => {}
        DrainPhase::Running | DrainPhase::Failed => {
            p.hold = drain_hold(p, Some(deadline));
        }
    }
    if action_for(&rn.kind, cfg) == InterruptionAction::DrainReplace {
        p.request_replacement(&format!("interruption:{}", rn.kind.name()), 0);
    }
}

/// The blocker of a running drain: past its deadline, or the pod (and PDB) refusing eviction.
pub(crate) fn drain_hold(p: &Plan<'_>, deadline: Option<DateTime<Utc>>) -> Option<Blocker> {
    if let Some(d) = deadline.filter(|d| p.now > *d) {
        return Some(Blocker::Deadline { deadline: d });
    }
    let pod = p.node.drain.blocker.as_ref()?;
    let name = format!("{}/{}", pod.namespace, pod.name);
    match &pod.blocking_pdb {
        Some(pdb) => Some(Blocker::Pdb {
            pod: name,
            pdb: pdb.clone(),
            deadline,
        }),
        None if pod.do_not_disrupt => Some(Blocker::DoNotDisrupt {
            pod: name,
            deadline,
        }),
        None => None,
    }
}

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
use super::view::{keys, DrainPhase, NodeView, Notice, NoticeKind, RecordedNotice, State};
use super::{earlier, events, later, Action, Candidate, Plan, Start};

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
    n.at.unwrap_or_else(|| later(n.detected_at, cfg.interruption.default_lead))
}

/// The drain deadline for a notice announced for `at`.
pub fn drain_deadline(at: DateTime<Utc>, cfg: &PolicyConfig) -> DateTime<Utc> {
    earlier(at, cfg.interruption.safety_margin)
}

/// Handles notices for one node; true when the interruption flow owns the node this round.
pub(crate) fn step(p: &mut Plan<'_>, cfg: &PolicyConfig) -> bool {
    if p.cur.deleting {
        return false;
    }
    let cancelled = p.node.withdrawn_notices();
    if let Some(rn) = p.record.notice.clone() {
        if cancelled.contains(&rn.id.as_str()) {
            if matches!(p.record.state, State::Interrupted | State::Cordoned) {
                cancel(p, cfg, &rn);
            }
            // Its id stays recorded; other notices are judged on their own.
            p.record.notice = None;
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
        (State::Interrupted | State::Cordoned, Some(rn)) => resume(p, cfg, &rn),
        _ => false,
    }
}

/// Supersedes what is recorded: none recorded, or stronger, or as strong and sooner.
fn is_new(p: &Plan<'_>, n: &Notice, cfg: &PolicyConfig) -> bool {
    p.record
        .notice
        .as_ref()
        .is_none_or(|rn| supersedes(n, rn, cfg))
}

/// `n` replaces the recorded notice `rn`: another id, and stronger, or as strong and sooner.
fn supersedes(n: &Notice, rn: &RecordedNotice, cfg: &PolicyConfig) -> bool {
    if rn.id == n.id {
        return false;
    }
    let (a, b) = (
        strength(action_for(&n.kind, cfg)),
        strength(action_for(&rn.kind, cfg)),
    );
    a > b || (a == b && announced_at(n, cfg) < rn.at)
}

/// Whether what `node` stores (its annotations, as read back after a restart) already accounts
/// for notice `n`, so that forgetting `n` loses nothing: the notice itself is recorded in
/// [`keys::INTERRUPTION`] (written in the same patch as the taint and cordon it causes); or the
/// recorded notice supersedes it; or it asks for nothing (`ignore`, a deleting node); for a
/// cancellation, the withdrawn notice is no longer being acted on. A notice whose start waits for
/// a budget (a rebalance configured to drain) is not recorded until it starts.
pub fn notice_recorded(node: &NodeView, n: &Notice, cfg: &PolicyConfig) -> bool {
    if node.deleting {
        return true;
    }
    let record = node.record();
    match &n.kind {
        NoticeKind::Cancelled { of } => {
            let acting = matches!(record.state, State::Interrupted | State::Cordoned);
            !(acting && record.notice.is_some_and(|rn| &rn.id == of))
        }
        kind if action_for(kind, cfg) == InterruptionAction::Ignore => true,
        _ => record
            .notice
            .is_some_and(|rn| rn.id == n.id || !supersedes(n, &rn, cfg)),
    }
}

fn begin(p: &mut Plan<'_>, cfg: &PolicyConfig, n: Notice) -> bool {
    let rn = recorded(&n, cfg, p.now);
    if p.now >= later(rn.at, cfg.interruption.release_after) {
        // Outlived already (a late or replayed notice): record it as handled, do nothing.
        p.set(keys::INTERRUPTION, rn.encode());
        p.push(events::notice_past(&n.kind, &n.id, rn.at));
        p.record.notice = Some(rn.clone());
        if matches!(p.record.state, State::Interrupted | State::Cordoned) {
            return resume(p, cfg, &rn);
        }
        return false;
    }
    match action_for(&n.kind, cfg) {
        InterruptionAction::Ignore => false,
        InterruptionAction::Event => {
            p.set(keys::INTERRUPTION, rn.encode());
            p.push(events::notice_recorded(&n.kind, &n.id, rn.at));
            false
        }
        InterruptionAction::Cordon if p.disrupting => {
            // A repair or interruption in progress already does more than a cordon.
            p.set(keys::INTERRUPTION, rn.encode());
            p.record.notice = Some(rn);
            false
        }
        InterruptionAction::Cordon => {
            p.set(keys::INTERRUPTION, rn.encode());
            p.enter(State::Cordoned, &format!("interruption:{}", n.kind.name()));
            p.push(events::notice_cordoned(&n.kind, &n.id));
            true
        }
        InterruptionAction::Drain | InterruptionAction::DrainReplace => {
            if n.kind == NoticeKind::Rebalance && !p.disrupting {
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

/// The notice as recorded when handling starts at `now`. A rebalance recommendation has no
/// time; when its (budget-gated) drain starts late, the lead counts from the start.
fn recorded(n: &Notice, cfg: &PolicyConfig, now: DateTime<Utc>) -> RecordedNotice {
    let at = match (n.at, &n.kind) {
        (None, NoticeKind::Rebalance) => {
            later(n.detected_at.max(now), cfg.interruption.default_lead)
        }
        _ => announced_at(n, cfg),
    };
    RecordedNotice {
        kind: n.kind.clone(),
        id: n.id.clone(),
        at,
    }
}

/// Taint, cordon, LB exclusion, drain with deadline, replacement: all in this decision.
pub(crate) fn start(p: &mut Plan<'_>, cfg: &PolicyConfig, n: &Notice) {
    let rn = recorded(n, cfg, p.now);
    let why = format!("interruption:{}", n.kind.name());
    for k in [
        keys::REPAIR_STEP,
        keys::REPAIR_STEP_SINCE,
        keys::REBOOT_REQUESTED,
    ] {
        p.clear(k);
    }
    p.set(keys::INTERRUPTION, rn.encode());
    if !p.cur.has_taint(&cfg.interruption.taint_key) {
        p.push(taint(cfg, &n.kind));
    }
    p.enter(State::Interrupted, &why);
    p.exclude_from_lb(&cfg.interruption.lb_exclude_label);
    let deadline = drain_deadline(rn.at, cfg);
    p.push(Action::StartDrain {
        deadline,
        reason: why.clone(),
    });
    if p.cur.drain.phase != DrainPhase::Completed {
        p.hold = drain_hold(p, Some(deadline));
    }
    p.push(events::notice_draining(&n.kind, &n.id, rn.at, deadline));
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
    p.release(cfg);
    {
        p.push(events::interruption_cancelled(&rn.kind, &rn.id));
    }
}

/// Re-asserts an interruption in progress (after a restart too), or releases a node that
/// outlived its notice (then false: the node is free for the repair flow).
fn resume(p: &mut Plan<'_>, cfg: &PolicyConfig, rn: &RecordedNotice) -> bool {
    if p.record.cordoned_by_us && !p.cur.unschedulable {
        p.push(Action::Cordon);
    }
    if p.record.state == State::Cordoned {
        return true;
    }
    // A rebalance recommendation has no end: only its cancellation (or the node's removal)
    // ends it.
    let release_at = later(rn.at, cfg.interruption.release_after);
    if p.now >= release_at && p.cur.is_ready() && rn.kind != NoticeKind::Rebalance {
        p.release(cfg);
        p.push(events::interruption_released(
            cfg.interruption.release_after,
            &rn.kind,
        ));
        return false;
    }
    if !p.cur.has_taint(&cfg.interruption.taint_key) {
        p.push(taint(cfg, &rn.kind));
    }
    let deadline = drain_deadline(rn.at, cfg);
    if p.cur.drain.phase == DrainPhase::Idle {
        p.push(Action::StartDrain {
            deadline,
            reason: format!("interruption:{}", rn.kind.name()),
        });
    }
    if p.cur.drain.phase != DrainPhase::Completed {
        p.hold = drain_hold(p, Some(deadline));
    }
    if action_for(&rn.kind, cfg) == InterruptionAction::DrainReplace {
        p.request_replacement(&format!("interruption:{}", rn.kind.name()), 0);
        // The old node goes once nodekeeper's drain is over: completed, or out of time.
        p.retire_when(p.cur.drain.phase == DrainPhase::Completed || p.now >= deadline);
    }
    true
}

/// The blocker of a running drain: past its deadline, or the pod (and PDB) refusing eviction.
pub(crate) fn drain_hold(p: &Plan<'_>, deadline: Option<DateTime<Utc>>) -> Option<Blocker> {
    if let Some(d) = deadline.filter(|d| p.now > *d) {
        return Some(Blocker::Deadline { deadline: d });
    }
    let pod = p.cur.drain.blocker.as_ref()?;
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

//! Repair: a node whose condition matches a policy for its toleration is repaired gracefully,
//! within the group's budget, escalating `drain` → `reboot` → `replace` on step timeouts. No
//! new repair starts while the group has more unhealthy nodes than `max_unhealthy`
//! (short-circuit). A node healthy again for `healthy_delay` ends its repair (flap guard). A
//! node never Ready within `startup_timeout` is replaced, at most `max_startup_retries` times
//! in a row, then held. A node annotated `karpenter.sh/do-not-repair` or
//! `nodekeeper.io/do-not-repair` (`"true"`) is never repaired: held instead, and a repair under
//! way is stopped and undone unless its replacement was already requested. A node Karpenter is
//! disrupting (`karpenter.sh/disrupted`) is left to Karpenter, and held with that reason.

use chrono::{DateTime, Utc};

use super::budget::Reason;
use super::config::{EffectiveRepair, PolicyConfig, RepairPolicy, RepairStep};
use super::explain::Blocker;
use super::interruption::drain_hold;
use super::view::{keys, DrainPhase, NodeView, State};
use super::{events, group_of, later, Action, Candidate, Plan, Start};

/// Health of a node against the repair policies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// No policy matches; `since` is the latest transition of a policy's condition.
    Healthy {
        /// Since when (unknown when no policy condition exists).
        since: Option<DateTime<Utc>>,
    },
    /// A policy matches.
    Unhealthy {
        /// `Type=Status`.
        why: String,
        /// The condition's last transition.
        since: DateTime<Utc>,
        /// `since + toleration` (the earliest over matching policies).
        expires: DateTime<Utc>,
    },
}

/// Evaluates `node` against `policies`.
pub fn evaluate(node: &NodeView, policies: &[RepairPolicy]) -> Health {
    let mut worst: Option<Health> = None;
    let mut healthy_since: Option<DateTime<Utc>> = None;
    for p in policies {
        let Some(c) = node.condition(&p.condition_type) else {
            continue;
        };
        if c.status != p.condition_status {
            healthy_since = healthy_since.max(Some(c.last_transition_time));
            continue;
        }
        let expires = later(c.last_transition_time, p.toleration);
        let earlier = match &worst {
            Some(Health::Unhealthy { expires: e, .. }) => expires < *e,
            _ => true,
        };
        if earlier {
            worst = Some(Health::Unhealthy {
                why: format!("{}={}", p.condition_type, p.condition_status),
                since: c.last_transition_time,
                expires,
            });
        }
    }
    worst.unwrap_or(Health::Healthy {
        since: healthy_since,
    })
}

/// When the engine is next due to decide a repair: the earliest moment after `now` at which a
/// repair toleration expires on an idle node that has been Ready (the moment `step` starts
/// seeing it as a candidate), and the groups of the nodes whose toleration expires then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// The expiry.
    pub at: DateTime<Utc>,
    /// The groups (values of `budgets.group_by`, `""` for none) with a node expiring at `at`: a
    /// repair's decision reads its own group only (budgets, short-circuit), so the engine can
    /// decide these groups at `at` without the whole cluster ([`super::decide_groups`]).
    pub groups: std::collections::BTreeSet<String>,
}

/// When a repair toleration next expires ([`Due`]), so that the engine decides then rather than
/// at its next tick; `None` when no toleration is running.
pub fn next_expiry(
    view: &super::ClusterView,
    cfg: &PolicyConfig,
    now: DateTime<Utc>,
) -> Option<Due> {
    let mut by_group: std::collections::HashMap<String, EffectiveRepair<'_>> = Default::default();
    let mut due: Option<Due> = None;
    for n in view
        .nodes
        .iter()
        .filter(|n| !n.deleting && n.became_ready && n.record().state == State::Idle)
    {
        let group = group_of(n, cfg);
        let eff = by_group
            .entry(group.clone())
            .or_insert_with_key(|g| cfg.repair.for_group(g));
        if !eff.enabled {
            continue;
        }
        let Health::Unhealthy { expires, .. } = evaluate(n, &eff.policies) else {
            continue;
        };
        if expires <= now {
            continue;
        }
        match &mut due {
            Some(d) if d.at < expires => {}
            Some(d) if d.at == expires => {
                d.groups.insert(group);
            }
            _ => {
                due = Some(Due {
                    at: expires,
                    groups: [group].into(),
                })
            }
        }
    }
    due
}

fn dur(d: std::time::Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// Repair handling of one node (after the interruption flow declined it).
pub(crate) fn step(p: &mut Plan<'_>, cfg: &PolicyConfig, eff: &EffectiveRepair<'_>) {
    if stands_back(p, cfg, eff) {
        return;
    }
    if p.cur.deleting {
        return;
    }
    if p.record.state == State::Repairing {
        if p.cur.repair_veto().is_none() || going_away(p, eff) {
            progress(p, cfg, eff);
            return;
        }
        // Vetoed mid-repair: stop it and undo what it did (drain, cordon, label, mark), then
        // decide as for any idle node (held by the veto if a repair would start now), so that
        // the next decision finds nothing more to do.
        p.release(cfg);
    }
    if p.record.state != State::Idle {
        return;
    }
    if !p.cur.became_ready {
        startup(p, cfg);
        return;
    }
    if !eff.enabled {
        return;
    }
    if let Health::Unhealthy { why, expires, .. } = evaluate(&p.cur, &eff.policies) {
        if expires <= p.now {
            // As Karpenter's: the veto is checked (and shown) once a repair would start.
            if let Some(veto) = p.cur.repair_veto() {
                p.hold = Some(vetoed(veto));
                return;
            }
            p.candidate = Some(Candidate {
                reason: Reason::Repair,
                since: expires,
                start: Start::Repair {
                    why: format!("repair:{why}"),
                },
            });
        }
    }
}

/// Karpenter chose the node first (its `karpenter.sh/disrupted` taint, written before it
/// pre-spins a replacement and deletes the NodeClaim: `pkg/controllers/disruption/queue.go`,
/// `markDisrupted`): nodekeeper stands back. A repair of its own that has not reached its
/// replacement is stopped and undone; a node a repair policy finds unhealthy (its toleration
/// expired or not) is held with [`Blocker::KarpenterDisrupting`] (kept while the node is deleted). A node past its own
/// replacement request is going away by nodekeeper's hand (the taint is then Karpenter's
/// termination of the NodeClaim nodekeeper deleted): not this case.
fn stands_back(p: &mut Plan<'_>, cfg: &PolicyConfig, eff: &EffectiveRepair<'_>) -> bool {
    if !p.cur.karpenter_disrupted() {
        return false;
    }
    match p.record.state {
        State::Repairing if !going_away(p, eff) && !p.cur.deleting => p.release(cfg),
        State::Idle => {}
        _ => return false,
    }
    // Said at once, not only once nodekeeper's toleration expires: Karpenter's repair may come
    // first, and the node may be gone by then.
    let unhealthy = eff.enabled
        && p.cur.became_ready
        && matches!(evaluate(&p.cur, &eff.policies), Health::Unhealthy { .. });
    if unhealthy {
        p.hold = Some(Blocker::KarpenterDisrupting);
    }
    true
}

/// The hold of a node whose repair `annotation` vetoes.
fn vetoed(annotation: &str) -> Blocker {
    Blocker::DoNotRepair {
        annotation: annotation.to_string(),
    }
}

/// Past the point of no return: the repair's replacement was asked for (its `replace` step, or a
/// failed launch), so the node is going away whatever a veto says.
fn going_away(p: &Plan<'_>, eff: &EffectiveRepair<'_>) -> bool {
    p.record.replacement_requested.is_some()
        && (p.record.reason.as_deref() == Some(STARTUP)
            || p.record.step.or(eff.steps.first().copied()) == Some(RepairStep::Replace))
}

/// Startup timeout: replace a node never Ready after `startup_timeout` (not budget-gated: it
/// runs nothing), at most `max_startup_retries` times in a row; a repair veto holds it.
fn startup(p: &mut Plan<'_>, cfg: &PolicyConfig) {
    let r = &cfg.repair;
    if r.startup_timeout.is_zero()
        || p.now < later(p.cur.created_at, r.startup_timeout)
        || p.record.replacement_requested.is_some()
    {
        return;
    }
    if let Some(veto) = p.cur.repair_veto() {
        p.hold = Some(vetoed(veto));
        return;
    }
    let retries = p.record.startup_retries;
    if retries >= r.max_startup_retries {
        p.hold = Some(Blocker::StartupRetries {
            retries,
            max: r.max_startup_retries,
        });
        return;
    }
    p.enter(State::Repairing, STARTUP);
    p.set(keys::REPAIR_STEP, RepairStep::Replace.name());
    p.set(keys::REPAIR_STEP_SINCE, p.now_str());
    p.push(events::startup_timeout(
        r.startup_timeout,
        retries + 1,
        r.max_startup_retries,
    ));
    p.request_replacement(STARTUP, retries + 1);
    p.disrupting = true;
}

/// Reason recorded for a startup-timeout replacement.
pub const STARTUP: &str = "repair:startup-timeout";

/// Starts a granted repair: state, cordon, LB exclusion, first step.
pub(crate) fn start(p: &mut Plan<'_>, cfg: &PolicyConfig, why: &str) {
    let group = group_of(&p.cur, cfg);
    let eff = cfg.repair.for_group(&group);
    let Some(&first) = eff.steps.first() else {
        return;
    };
    p.enter(State::Repairing, why);
    p.exclude_from_lb(&cfg.interruption.lb_exclude_label);
    p.push(events::repair_started(why, first));
    enter_step(p, cfg, first);
    p.disrupting = true;
}

fn enter_step(p: &mut Plan<'_>, cfg: &PolicyConfig, step: RepairStep) {
    p.set(keys::REPAIR_STEP, step.name());
    p.set(keys::REPAIR_STEP_SINCE, p.now_str());
    p.record.step = Some(step);
    p.record.step_since = Some(p.now);
    let why = p.record.reason.clone().unwrap_or_else(|| "repair".into());
    match step {
        RepairStep::Drain => p.push(Action::StartDrain {
            deadline: later(p.now, cfg.repair.drain_timeout),
            reason: why,
        }),
        RepairStep::Reboot => request_reboot(p, &why),
        RepairStep::Replace => {
            p.request_replacement(&why, 0);
            replacement_pending(p, cfg);
        }
    }
}

fn request_reboot(p: &mut Plan<'_>, why: &str) {
    let boot = p.cur.boot_id.clone().unwrap_or_else(|| "unknown".into());
    p.set(keys::REBOOT_REQUESTED, boot.clone());
    p.record.reboot_boot_id = Some(boot);
    p.push(Action::RequestReboot {
        id: format!("{}/reboot/{}", p.cur.name, p.now_str()),
        reason: why.to_string(),
    });
    p.push(events::reboot_requested(why));
}

/// Advances a repair in progress (also after a controller restart).
fn progress(p: &mut Plan<'_>, cfg: &PolicyConfig, eff: &EffectiveRepair<'_>) {
    if p.record.cordoned_by_us && !p.cur.unschedulable {
        p.push(Action::Cordon);
    }
    let drain_over = p.cur.drain.phase != DrainPhase::Running;
    if p.record.reason.as_deref() == Some(STARTUP) {
        p.request_replacement(STARTUP, p.record.startup_retries + 1);
        p.retire_when(drain_over);
        replacement_pending(p, cfg);
        return;
    }
    let step = p.record.step.or(eff.steps.first().copied());
    if step == Some(RepairStep::Replace) && p.record.replacement_requested.is_some() {
        // Past the point of no return: the node is going away.
        p.retire_when(drain_over);
        replacement_pending(p, cfg);
        return;
    }
    if let Health::Healthy { since } = evaluate(&p.cur, &eff.policies) {
        let delay = dur(cfg.repair.healthy_delay);
        if since.is_none_or(|s| p.now - s >= delay) {
            p.release(cfg);
            p.push(events::repair_cancelled(cfg.repair.healthy_delay));
        }
        return;
    }
    let since = p.record.step_since.or(p.record.since).unwrap_or(p.now);
    match step {
        Some(RepairStep::Drain) => drain_step(p, cfg, eff, since),
        Some(RepairStep::Reboot) => {
            if p.record.reboot_boot_id.is_none() {
                let why = p.record.reason.clone().unwrap_or_default();
                request_reboot(p, &why);
            } else if p.now >= later(since, cfg.repair.reboot_timeout) {
                advance(p, cfg, eff, RepairStep::Reboot);
            }
        }
        Some(RepairStep::Replace) => {
            let why = p.record.reason.clone().unwrap_or_default();
            p.request_replacement(&why, 0);
            replacement_pending(p, cfg);
        }
        None => {}
    }
}

/// Explains a requested replacement whose node is still here after `replace_timeout`.
fn replacement_pending(p: &mut Plan<'_>, cfg: &PolicyConfig) {
    if let Some(since) = p.record.replacement_requested {
        if p.now >= later(since, cfg.repair.replace_timeout) {
            p.hold = Some(Blocker::ReplacementPending {
                requested_at: since,
            });
        }
    }
}

fn drain_step(
    p: &mut Plan<'_>,
    cfg: &PolicyConfig,
    eff: &EffectiveRepair<'_>,
    since: DateTime<Utc>,
) {
    let deadline = later(since, cfg.repair.drain_timeout);
    let phase = p.cur.drain.phase;
    if phase == DrainPhase::Completed || p.now >= deadline {
        advance(p, cfg, eff, RepairStep::Drain);
        return;
    }
    if phase == DrainPhase::Idle {
        p.push(Action::StartDrain {
            deadline,
            reason: p.record.reason.clone().unwrap_or_default(),
        });
    }
    p.hold = drain_hold(p, Some(deadline));
}

fn advance(p: &mut Plan<'_>, cfg: &PolicyConfig, eff: &EffectiveRepair<'_>, from: RepairStep) {
    let Some(&next) = eff.steps.iter().find(|s| **s > from) else {
        return;
    };
    p.push(events::repair_escalated(from, next));
    enter_step(p, cfg, next);
}

/// Short-circuit: when more nodes of the group are unhealthy than `max_unhealthy`, pending
/// repairs are held instead of started. Returns the unhealthy count and whether it tripped.
pub(crate) fn short_circuit(
    group: &str,
    plans: &mut [Plan<'_>],
    eff: &EffectiveRepair<'_>,
) -> (usize, bool) {
    let total = plans.len();
    let unhealthy = plans
        .iter()
        .filter(|p| !p.cur.deleting)
        .filter(|p| matches!(evaluate(&p.cur, &eff.policies), Health::Unhealthy { .. }))
        .count();
    let threshold = eff.max_unhealthy.resolve(total, true);
    if unhealthy <= threshold {
        return (unhealthy, false);
    }
    for p in plans.iter_mut() {
        if p.candidate
            .as_ref()
            .is_some_and(|c| c.reason == Reason::Repair)
        {
            p.candidate = None;
            p.hold = Some(Blocker::ShortCircuit {
                group: group.to_string(),
                unhealthy,
                total,
                max_unhealthy: eff.max_unhealthy.to_string(),
            });
        }
    }
    (unhealthy, true)
}

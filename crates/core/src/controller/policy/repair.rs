//! Repair: a node whose condition matches a policy (type, status, and an optional anchored
//! reason pattern) for its toleration is repaired gracefully, within the group's budget, by the
//! policy's own ladder (`restart-unit:UNIT` → `drain` → `reboot` → `replace`, or `none`) or else
//! the group's `steps` (`drain` → `reboot` → `replace`), escalating on step timeouts; each step
//! is gated on the condition clearing, a reboot on a new boot id. Reboot and replace are taken only
//! for a condition nodekeeper can see clear ([`seen_clear`]) unless the policy opts in; another
//! component's condition with a stale heartbeat reads as Unknown ([`observed`]). No new repair
//! starts while the group has more unhealthy nodes than `max_unhealthy` (short-circuit). A node
//! healthy again for `healthy_delay` ends its repair (flap guard). A node never Ready within
//! `startup_timeout` is replaced, at most `max_startup_retries` times in a row, then held. A node
//! annotated `karpenter.sh/do-not-repair` or `nodekeeper.io/do-not-repair` (`"true"`) is never
//! repaired: held instead, and a repair under way is stopped and undone unless its replacement
//! was already requested. A node Karpenter is disrupting (`karpenter.sh/disrupted`) is left to
//! Karpenter, and held with that reason.

use chrono::{DateTime, Utc};

use super::budget::Reason;
use super::config::{
    seen_clear, EffectiveRepair, LadderStep, PolicyConfig, RepairPolicy, RepairStep,
};
use super::explain::Blocker;
use super::interruption::drain_hold;
use super::view::{keys, ConditionView, DrainPhase, NodeView, State};
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
        /// `Type=Status` (`Type=Status/Reason` for a policy with a `reason` pattern).
        why: String,
        /// The condition's last transition.
        since: DateTime<Utc>,
        /// `since + toleration` (the earliest over matching policies).
        expires: DateTime<Utc>,
        /// The index of the matching policy (of the earliest expiry) in the policies given.
        policy: usize,
    },
}

/// A condition's status counts as Unknown once its `lastHeartbeatTime` is older than `after`
/// at `now` (only for conditions nodekeeper cannot see clear, [`seen_clear`]).
#[derive(Debug, Clone, Copy)]
pub struct Staleness {
    /// The decision's time.
    pub now: DateTime<Utc>,
    /// `[repair] heartbeat_timeout`.
    pub after: std::time::Duration,
}

/// The reason a condition reads with once its heartbeat is stale (it counts as Unknown).
pub const STALE_REASON: &str = "HeartbeatStale";

/// What the policy reads of `c`: its status, reason and since when, or `Unknown` (reason
/// [`STALE_REASON`], since the heartbeat went stale) when its writer's heartbeat is older than
/// `stale.after` and the condition is not one nodekeeper sees clear.
pub fn observed(c: &ConditionView, stale: Option<Staleness>) -> (&str, &str, DateTime<Utc>) {
    if let (Some(s), Some(beat)) = (stale, c.last_heartbeat_time) {
        let stale_at = later(beat, s.after);
        if !seen_clear(&c.type_) && s.now >= stale_at {
            return (
                "Unknown",
                STALE_REASON,
                stale_at.max(c.last_transition_time),
            );
        }
    }
    (&c.status, &c.reason, c.last_transition_time)
}

/// Evaluates `node` against `policies` (every condition read as written; see [`health`]).
pub fn evaluate(node: &NodeView, policies: &[RepairPolicy]) -> Health {
    evaluate_at(node, policies, None)
}

/// The node's health as the policy reads it at `now`: [`evaluate_at`] with the group's
/// heartbeat timeout.
pub fn health(node: &NodeView, eff: &EffectiveRepair<'_>, now: DateTime<Utc>) -> Health {
    let stale = Staleness {
        now,
        after: eff.heartbeat_timeout,
    };
    evaluate_at(node, &eff.policies, Some(stale))
}

/// Evaluates `node` against `policies`, a condition with a stale heartbeat read as Unknown
/// ([`observed`]).
pub fn evaluate_at(node: &NodeView, policies: &[RepairPolicy], stale: Option<Staleness>) -> Health {
    let mut worst: Option<Health> = None;
    let mut healthy_since: Option<DateTime<Utc>> = None;
    for (i, p) in policies.iter().enumerate() {
        let Some(c) = node.condition(&p.condition_type) else {
            continue;
        };
        let (status, reason, transition) = observed(c, stale);
        if !p.matches(status, reason) {
            healthy_since = healthy_since.max(Some(transition));
            continue;
        }
        let expires = later(transition, p.toleration);
        let earlier = match &worst {
            Some(Health::Unhealthy { expires: e, .. }) => expires < *e,
            _ => true,
        };
        if earlier {
            let why = match &p.reason {
                Some(_) => format!("{}={status}/{reason}", p.condition_type),
                None => format!("{}={status}", p.condition_type),
            };
            worst = Some(Health::Unhealthy {
                why,
                since: transition,
                expires,
                policy: i,
            });
        }
    }
    worst.unwrap_or(Health::Healthy {
        since: healthy_since,
    })
}

/// The ladder of `policy` (its own steps, or the group's `steps`).
pub fn ladder(eff: &EffectiveRepair<'_>, policy: Option<&RepairPolicy>) -> Vec<LadderStep> {
    match policy.and_then(|p| p.steps.clone()) {
        Some(steps) => steps,
        None => eff.steps.iter().map(|s| LadderStep::of(*s)).collect(),
    }
}

/// The step after `from` in `ladder`: the next one, or (when `from` is not in it, e.g. after a
/// configuration change) the first of a later kind.
pub fn next_after<'l>(ladder: &'l [LadderStep], from: &LadderStep) -> Option<&'l LadderStep> {
    match ladder.iter().position(|s| s.same(from)) {
        Some(i) => ladder.get(i + 1),
        None => ladder.iter().find(|s| s.step > from.step),
    }
}

/// How long `step` may take before the next one starts.
pub fn timeout_of(step: &LadderStep, cfg: &PolicyConfig) -> std::time::Duration {
    let r = &cfg.repair;
    step.timeout.unwrap_or(match step.step {
        RepairStep::RestartUnit => r.restart_timeout,
        RepairStep::Drain => r.drain_timeout,
        RepairStep::Reboot => r.reboot_timeout,
        RepairStep::Replace | RepairStep::None => r.replace_timeout,
    })
}

/// Why `step` is not taken for `policy` (matched as `why`), if it is not: `none` holds, and a
/// destructive step holds for a condition nodekeeper cannot see clear.
fn refused(step: &LadderStep, policy: &RepairPolicy, why: &str) -> Option<Blocker> {
    if step.step == RepairStep::None {
        return Some(Blocker::RepairPolicy {
            condition: why.to_string(),
        });
    }
    (step.step.destructive() && !policy.trusted()).then(|| Blocker::UntrustedCondition {
        condition: policy.condition_type.clone(),
        step: step.label(),
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
        let Health::Unhealthy { expires, .. } = health(n, eff, now) else {
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
        release(p, cfg);
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
    if let Health::Unhealthy {
        why,
        expires,
        policy,
        ..
    } = health(&p.cur, eff, p.now)
    {
        if expires <= p.now {
            // As Karpenter's: the veto is checked (and shown) once a repair would start.
            if let Some(veto) = p.cur.repair_veto() {
                p.hold = Some(vetoed(veto));
                return;
            }
            // A ladder that starts with `none` (or a step its condition may not take) holds the
            // node without starting anything: no cordon, no budget slot.
            let policy = &eff.policies[policy];
            let steps = ladder(eff, Some(policy));
            let Some(first) = steps.first() else {
                return;
            };
            if let Some(b) = refused(first, policy, &why) {
                p.hold = Some(b);
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
        State::Repairing if !going_away(p, eff) && !p.cur.deleting => release(p, cfg),
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
    let policy = match health(&p.cur, &eff, p.now) {
        Health::Unhealthy { policy, .. } => eff.policies.get(policy),
        Health::Healthy { .. } => None,
    };
    let steps = ladder(&eff, policy);
    let Some(first) = steps.first() else {
        return;
    };
    p.enter(State::Repairing, why);
    p.exclude_from_lb(&cfg.interruption.lb_exclude_label);
    p.push(events::repair_started(why, first));
    enter_step(p, cfg, &steps, first);
    p.disrupting = true;
}

fn enter_step(p: &mut Plan<'_>, cfg: &PolicyConfig, steps: &[LadderStep], step: &LadderStep) {
    p.set(keys::REPAIR_STEP, step.label());
    p.set(keys::REPAIR_STEP_SINCE, p.now_str());
    p.record.step = Some(step.step);
    p.record.step_unit = step.unit.clone();
    p.record.step_since = Some(p.now);
    let why = p.record.reason.clone().unwrap_or_else(|| "repair".into());
    match step.step {
        RepairStep::RestartUnit => {
            let unit = step.unit.clone().unwrap_or_default();
            p.push(events::unit_restart_requested(&why, &unit));
            p.push(Action::RestartUnit {
                id: format!("{}/restart-unit/{unit}/{}", p.cur.name, p.now_str()),
                unit,
                reason: why,
            });
        }
        RepairStep::Drain => {
            if prespins(cfg, steps, step) {
                p.ask_replacement(&why, 0, true);
            }
            p.push(Action::StartDrain {
                deadline: later(p.now, timeout_of(step, cfg)),
                reason: why,
            })
        }
        RepairStep::Reboot => request_reboot(p, &why),
        RepairStep::Replace => {
            p.request_replacement(&why, 0);
            replacement_pending(p, cfg);
        }
        RepairStep::None => {
            p.hold = Some(Blocker::RepairPolicy {
                condition: why.strip_prefix("repair:").unwrap_or(&why).to_string(),
            })
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
    let health = health(&p.cur, eff, p.now);
    let policy = match &health {
        Health::Unhealthy { policy, .. } => eff.policies.get(*policy),
        Health::Healthy { .. } => None,
    };
    let steps = ladder(eff, policy);
    let Some(step) = current(&p.record, &steps) else {
        return;
    };
    if step.step == RepairStep::Replace && p.record.replacement_requested.is_some() {
        // Past the point of no return: the node is going away.
        p.retire_when(drain_over);
        replacement_pending(p, cfg);
        return;
    }
    let since = p.record.step_since.or(p.record.since).unwrap_or(p.now);
    let timed_out = p.now >= later(since, timeout_of(&step, cfg));
    let (policy, why) = match (health, policy) {
        (Health::Unhealthy { why, .. }, Some(policy)) => (policy, why),
        (Health::Healthy { since }, _) => {
            // A reboot counts only once the node shows a new boot id: a condition that clears
            // before it (or without it) does not end the repair until the step's timeout.
            if step.step == RepairStep::Reboot && !rebooted(p) && !timed_out {
                return;
            }
            let delay = dur(cfg.repair.healthy_delay);
            if since.is_none_or(|s| p.now - s >= delay) {
                release(p, cfg);
                p.push(events::repair_cancelled(cfg.repair.healthy_delay));
            }
            return;
        }
        _ => return,
    };
    match step.step {
        RepairStep::Drain => drain_step(p, cfg, &steps, policy, &why, &step, since),
        RepairStep::RestartUnit => {
            if timed_out {
                advance(p, cfg, &steps, policy, &why, &step);
            }
        }
        RepairStep::Reboot => {
            if p.record.reboot_boot_id.is_none() {
                let why = p.record.reason.clone().unwrap_or_default();
                request_reboot(p, &why);
            } else if timed_out {
                advance(p, cfg, &steps, policy, &why, &step);
            }
        }
        RepairStep::Replace => {
            let why = p.record.reason.clone().unwrap_or_default();
            p.request_replacement(&why, 0);
            replacement_pending(p, cfg);
        }
        RepairStep::None => {
            p.hold = Some(Blocker::RepairPolicy { condition: why });
        }
    }
}

/// The step the repair is on: as recorded (with its timeout from `steps` when it is there),
/// else the first of `steps`.
fn current(record: &super::view::Record, steps: &[LadderStep]) -> Option<LadderStep> {
    let Some(kind) = record.step else {
        return steps.first().cloned();
    };
    let recorded = LadderStep {
        step: kind,
        unit: record.step_unit.clone(),
        timeout: None,
    };
    Some(
        steps
            .iter()
            .find(|s| s.same(&recorded))
            .cloned()
            .unwrap_or(recorded),
    )
}

/// The requested reboot happened: the node shows a boot id other than the one recorded at the
/// request.
fn rebooted(p: &Plan<'_>) -> bool {
    match (&p.record.reboot_boot_id, &p.cur.boot_id) {
        (Some(before), Some(now)) => before != now,
        _ => false,
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
    steps: &[LadderStep],
    policy: &RepairPolicy,
    why: &str,
    step: &LadderStep,
    since: DateTime<Utc>,
) {
    let deadline = later(since, timeout_of(step, cfg));
    let phase = p.cur.drain.phase;
    if phase == DrainPhase::Completed || p.now >= deadline {
        advance(p, cfg, steps, policy, why, step);
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

/// Starts the step after `from`, unless it is refused ([`refused`]: then the repair stays on
/// `from`, held and explained).
fn advance(
    p: &mut Plan<'_>,
    cfg: &PolicyConfig,
    steps: &[LadderStep],
    policy: &RepairPolicy,
    why: &str,
    from: &LadderStep,
) {
    let Some(next) = next_after(steps, from) else {
        return;
    };
    if let Some(b) = refused(next, policy, why) {
        if next.step == RepairStep::None {
            // `none` is a step of its own: recorded, so that status shows the ladder ended.
            p.push(events::repair_escalated(from, next));
            enter_step(p, cfg, steps, next);
        }
        p.hold = Some(b);
        return;
    }
    p.push(events::repair_escalated(from, next));
    enter_step(p, cfg, steps, next);
}

/// A `drain` step that `replace` follows asks for the replacement as it starts, when the
/// provider's request only adds capacity ([`RepairConfig::prespin`](super::config::RepairConfig::prespin)).
fn prespins(cfg: &PolicyConfig, steps: &[LadderStep], drain: &LadderStep) -> bool {
    cfg.repair.prespin
        && cfg.controller.provider_adds_capacity
        && next_after(steps, drain).is_some_and(|s| s.step == RepairStep::Replace)
}

/// Ends a repair ([`Plan::release`]); a replacement pre-spun for its drain ([`prespins`]) that
/// the node was not handed over for is abandoned, its marks cleared, so that a later repair asks
/// anew.
fn release(p: &mut Plan<'_>, cfg: &PolicyConfig) {
    let prespun = p.record.state == State::Repairing
        && p.record.step == Some(RepairStep::Drain)
        && p.record.reason.as_deref() != Some(STARTUP)
        && !p.record.retire_requested;
    let at = p
        .cur
        .annotation(keys::REPLACEMENT_REQUESTED)
        .map(str::to_string)
        .filter(|_| prespun && p.record.replacement_requested.is_some());
    let reason = p.record.reason.clone();
    p.release(cfg);
    let Some(at) = at else {
        return;
    };
    p.clear(keys::REPLACEMENT_REQUESTED);
    p.clear(keys::REPLACEMENT_ACCEPTED);
    p.record.replacement_requested = None;
    p.record.replacement_accepted = false;
    p.push(Action::AbandonReplacement {
        id: format!("{}/{}", p.cur.name, at),
        reason: reason.unwrap_or_else(|| "repair".into()),
    });
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
        .filter(|p| matches!(health(&p.cur, eff, p.now), Health::Unhealthy { .. }))
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

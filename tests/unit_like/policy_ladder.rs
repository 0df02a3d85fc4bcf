//! Per-(condition, reason) repair policies and their escalation ladders: table tests (one rule
//! each: a restart that heals, a restart that does not and the reboot gated on a new boot id, the
//! reason pattern choosing the ladder, the conditions nodekeeper cannot see clear, `none`, stale
//! heartbeats, resuming mid-ladder) and a property test over random ladders, faults, boot ids,
//! drains and restarts.

use crate::support::policy as policy_support;

use std::time::Duration;

use chrono::{DateTime, Utc};
use nodekeeper_core::controller::policy::config::{
    LadderStep, ReasonPattern, RepairPolicy, RepairStep,
};
use nodekeeper_core::controller::policy::explain::{Blocker, Held};
use nodekeeper_core::controller::policy::repair::{health, Health, STALE_REASON};
use nodekeeper_core::controller::policy::view::{
    condition, keys, ClusterView, DrainPhase, NodeView,
};
use nodekeeper_core::controller::policy::{Action, PolicyConfig};
use policy_support::*;

/// A policy for `type_=status` tolerated 10 min, with `steps` (none: the global ones).
fn policy(type_: &str, status: &str, steps: Option<Vec<LadderStep>>) -> RepairPolicy {
    RepairPolicy {
        condition_type: type_.into(),
        condition_status: status.into(),
        toleration: Duration::from_secs(600),
        steps,
        ..Default::default()
    }
}

/// The AKS-like ladder: restart the kubelet, reboot, replace.
fn aks() -> Vec<LadderStep> {
    vec![
        LadderStep::restart("kubelet.service"),
        LadderStep::of(RepairStep::Reboot),
        LadderStep::of(RepairStep::Replace),
    ]
}

fn with(policies: Vec<RepairPolicy>) -> PolicyConfig {
    let mut c = PolicyConfig::default();
    c.repair.policy = policies;
    c
}

/// Five nodes; `a` has Ready=False since 20 min before `now`.
fn cluster(now: DateTime<Utc>) -> ClusterView {
    let mut n = node("a", "", now);
    ready(&mut n, "False", now - mins(20));
    view(vec![
        n,
        node("b", "", now),
        node("c", "", now),
        node("d", "", now),
        node("e", "", now),
    ])
}

fn restarts(a: &[Action]) -> Vec<String> {
    a.iter()
        .filter_map(|x| match x {
            Action::RestartUnit { unit, .. } => Some(unit.clone()),
            _ => None,
        })
        .collect()
}

fn is_reboot(a: &Action) -> bool {
    matches!(a, Action::RequestReboot { .. })
}

fn held(a: &[Action]) -> Option<Blocker> {
    a.iter().find_map(|x| match x {
        Action::Hold(Held { blocker, .. }) => Some(blocker.clone()),
        _ => None,
    })
}

/// Decides at `at` and applies it; returns `a`'s actions.
fn step(v: &mut ClusterView, c: &PolicyConfig, at: DateTime<Utc>) -> Vec<Action> {
    let ds = run(v, c, at);
    apply(v, &ds);
    of(&ds, "a")
}

#[test]
fn a_restart_that_clears_the_condition_ends_the_repair_without_a_reboot() {
    let now = monday();
    let c = with(vec![policy("Ready", "False", Some(aks()))]);
    let mut v = cluster(now);
    let a = step(&mut v, &c, now);
    assert_eq!(restarts(&a), ["kubelet.service"], "{a:#?}");
    assert!(has(&a, |x| matches!(x, Action::Cordon)));
    assert_eq!(
        get(&v, "a").annotation(keys::REPAIR_STEP),
        Some("restart-unit:kubelet.service")
    );
    // Deciding again at once asks nothing more.
    assert!(run(&v, &c, now).is_empty());
    // The kubelet comes back within restart_timeout (5 min): Ready for healthy_delay (2 min) ends it.
    ready(node_mut(&mut v, "a"), "True", now + mins(1));
    assert!(step(&mut v, &c, now + mins(2)).is_empty(), "flap guard");
    let a = step(&mut v, &c, now + mins(3) + chrono::Duration::seconds(1));
    assert!(has(&a, |x| matches!(x, Action::Uncordon)), "{a:#?}");
    assert!(!has(&a, is_reboot) && !has(&a, is_replacement));
    assert_eq!(state(get(&v, "a")), None);
    // Long after: nothing escalates.
    assert!(run(&v, &c, now + mins(30)).is_empty());
}

#[test]
fn a_restart_that_does_not_clear_escalates_to_a_reboot_gated_on_a_new_boot_id() {
    let now = monday();
    let c = with(vec![policy("Ready", "False", Some(aks()))]);
    let mut v = cluster(now);
    step(&mut v, &c, now);
    assert!(
        run(&v, &c, now + mins(4)).is_empty(),
        "restart_timeout runs"
    );
    let a = step(&mut v, &c, now + mins(5));
    assert!(has(&a, is_reboot), "{a:#?}");
    assert!(has(&a, |x| matches!(x, Action::Event { message, .. }
        if message.contains("restart-unit:kubelet.service done or timed out; next: reboot"))));
    assert_eq!(
        get(&v, "a").annotation(keys::REBOOT_REQUESTED),
        Some("boot-0")
    );
    // Ready before any reboot (same boot id): the repair goes on.
    ready(node_mut(&mut v, "a"), "True", now + mins(6));
    assert!(run(&v, &c, now + mins(9)).is_empty(), "no new boot id yet");
    assert_eq!(state(get(&v, "a")), Some("repairing"));
    // Rebooted and Ready: healthy_delay after the transition ends it; no replacement.
    node_mut(&mut v, "a").boot_id = Some("boot-1".into());
    ready(node_mut(&mut v, "a"), "True", now + mins(10));
    assert!(run(&v, &c, now + mins(11)).is_empty());
    let a = step(&mut v, &c, now + mins(12));
    assert!(has(&a, |x| matches!(x, Action::Uncordon)), "{a:#?}");
    assert!(!has(&a, is_replacement));
}

#[test]
fn a_reboot_without_a_new_boot_id_escalates_to_replace_at_its_timeout() {
    let now = monday();
    let c = with(vec![policy("Ready", "False", Some(aks()))]);
    let mut v = cluster(now);
    step(&mut v, &c, now);
    step(&mut v, &c, now + mins(5));
    // Still NotReady, same boot id, reboot_timeout (10 min) later: replace.
    assert!(run(&v, &c, now + mins(14)).is_empty());
    let a = step(&mut v, &c, now + mins(15));
    assert_eq!(count(&a, is_replacement), 1, "{a:#?}");
    // The condition cleared without a reboot but after the step's timeout: the flap guard applies.
    let mut v = cluster(now);
    step(&mut v, &c, now);
    step(&mut v, &c, now + mins(5));
    ready(node_mut(&mut v, "a"), "True", now + mins(6));
    let a = step(&mut v, &c, now + mins(15));
    assert!(has(&a, |x| matches!(x, Action::Uncordon)), "{a:#?}");
}

#[test]
fn the_reason_pattern_chooses_the_ladder_and_the_toleration() {
    let now = monday();
    let mut runtime = policy(
        "Ready",
        "False",
        Some(vec![
            LadderStep::restart("crio.service"),
            LadderStep::of(RepairStep::Replace),
        ]),
    );
    runtime.reason = Some(ReasonPattern::new("ContainerRuntime(Down|NotReady)").unwrap());
    runtime.toleration = Duration::from_secs(60);
    let other = policy("Ready", "False", None);
    let c = with(vec![runtime, other]);
    let at = |reason: &str, since| {
        let mut v = cluster(now);
        let a = node_mut(&mut v, "a");
        ready(a, "False", since);
        a.conditions[0].reason = reason.into();
        v
    };
    // The runtime's reason, 2 min: its own ladder (1 min toleration).
    let mut v = at("ContainerRuntimeDown", now - mins(2));
    let a = step(&mut v, &c, now);
    assert_eq!(restarts(&a), ["crio.service"], "{a:#?}");
    assert_eq!(
        get(&v, "a").annotation(keys::REASON),
        Some("repair:Ready=False/ContainerRuntimeDown")
    );
    // Anchored: a reason containing it is another reason; 2 min is within the other's 10 min.
    let v = at("NotContainerRuntimeDown", now - mins(2));
    assert!(run(&v, &c, now).is_empty());
    // Any other reason after 10 min: the global ladder (drain first).
    let mut v = at("KubeletNotReady", now - mins(11));
    let a = step(&mut v, &c, now);
    assert!(restarts(&a).is_empty());
    assert!(
        has(&a, |x| matches!(x, Action::StartDrain { .. })),
        "{a:#?}"
    );
    assert_eq!(
        get(&v, "a").annotation(keys::REASON),
        Some("repair:Ready=False")
    );
}

#[test]
fn a_condition_nodekeeper_cannot_see_clear_holds_before_a_destructive_step() {
    let now = monday();
    let fail = |v: &mut ClusterView| {
        node_mut(v, "a")
            .conditions
            .push(condition("KernelDeadlock", "True", now - mins(20)));
        ready(node_mut(v, "a"), "True", now - mins(60));
    };
    // The global ladder (drain → replace): drained, then held before the replacement.
    let c = with(vec![policy("KernelDeadlock", "True", None)]);
    let mut v = cluster(now);
    fail(&mut v);
    let a = step(&mut v, &c, now);
    assert!(
        has(&a, |x| matches!(x, Action::StartDrain { .. })),
        "{a:#?}"
    );
    finish_drain(&mut v, "a");
    let a = step(&mut v, &c, now + mins(1));
    assert!(!has(&a, is_replacement), "{a:#?}");
    assert_eq!(
        held(&a),
        Some(Blocker::UntrustedCondition {
            condition: "KernelDeadlock".into(),
            step: "replace".into()
        })
    );
    assert!(run(&v, &c, now + mins(2)).is_empty(), "held once");
    // Opted in: replaced.
    let mut trusting = c.clone();
    trusting.repair.policy[0].allow_destructive = true;
    let a = of(&run(&v, &trusting, now + mins(2)), "a");
    assert_eq!(count(&a, is_replacement), 1, "{a:#?}");
    // A ladder that starts with a reboot: held without starting (no cordon, no budget slot).
    let c = with(vec![policy(
        "KernelDeadlock",
        "True",
        Some(vec![LadderStep::of(RepairStep::Reboot)]),
    )]);
    let mut v = cluster(now);
    fail(&mut v);
    let a = step(&mut v, &c, now);
    assert!(
        !has(&a, |x| matches!(x, Action::Cordon) || is_reboot(x)),
        "{a:#?}"
    );
    assert!(matches!(
        held(&a),
        Some(Blocker::UntrustedCondition { step, .. }) if step == "reboot"
    ));
    assert_eq!(state(get(&v, "a")), None);
    // The agent's own conditions are trusted.
    let c = with(vec![policy(
        "NodekeeperKubelet",
        "False",
        Some(vec![LadderStep::of(RepairStep::Reboot)]),
    )]);
    let mut v = cluster(now);
    ready(node_mut(&mut v, "a"), "True", now - mins(60));
    node_mut(&mut v, "a")
        .conditions
        .push(condition("NodekeeperKubelet", "False", now - mins(20)));
    assert!(has(&step(&mut v, &c, now), is_reboot));
}

#[test]
fn none_holds_and_says_why_alone_or_at_the_end_of_a_ladder() {
    let now = monday();
    let c = with(vec![policy(
        "Ready",
        "False",
        Some(vec![LadderStep::of(RepairStep::None)]),
    )]);
    let mut v = cluster(now);
    let a = step(&mut v, &c, now);
    assert_eq!(
        held(&a),
        Some(Blocker::RepairPolicy {
            condition: "Ready=False".into()
        }),
        "{a:#?}"
    );
    assert!(!has(&a, |x| matches!(x, Action::Cordon)));
    assert!(run(&v, &c, now + mins(1)).is_empty());
    // restart-unit, then none: the restart, then held on `none` (still cordoned).
    let c = with(vec![policy(
        "Ready",
        "False",
        Some(vec![
            LadderStep::restart("kubelet.service"),
            LadderStep::of(RepairStep::None),
        ]),
    )]);
    let mut v = cluster(now);
    step(&mut v, &c, now);
    let a = step(&mut v, &c, now + mins(5));
    assert!(
        matches!(held(&a), Some(Blocker::RepairPolicy { .. })),
        "{a:#?}"
    );
    assert_eq!(get(&v, "a").annotation(keys::REPAIR_STEP), Some("none"));
    assert!(get(&v, "a").unschedulable);
    assert!(run(&v, &c, now + mins(30)).is_empty());
}

#[test]
fn a_stale_heartbeat_counts_as_unknown_not_as_the_fault() {
    let now = monday();
    let c = with(vec![
        policy("KernelDeadlock", "True", None),
        policy("KernelDeadlock", "Unknown", None),
    ]);
    let eff = c.repair.for_group("");
    let mut n = node("a", "", now);
    let mut kd = condition("KernelDeadlock", "True", now - mins(60));
    kd.last_heartbeat_time = Some(now - mins(11));
    n.conditions.push(kd);
    // 11 min without a heartbeat (heartbeat_timeout 10 min): Unknown since 1 min.
    match health(&n, &eff, now) {
        Health::Unhealthy {
            why, since, policy, ..
        } => {
            assert_eq!(why, "KernelDeadlock=Unknown");
            assert_eq!(since, now - mins(1));
            assert_eq!(policy, 1);
        }
        h => panic!("{h:?}"),
    }
    // Only the True policy: not a fault.
    let only_true = with(vec![policy("KernelDeadlock", "True", None)]);
    assert!(matches!(
        health(&n, &only_true.repair.for_group(""), now),
        Health::Healthy { .. }
    ));
    // A fresh heartbeat: the fault.
    n.conditions[1].last_heartbeat_time = Some(now - mins(1));
    assert!(matches!(
        health(&n, &only_true.repair.for_group(""), now),
        Health::Unhealthy { .. }
    ));
    // The kubelet's Ready is read as written, whatever its heartbeat (its Lease is watched).
    let mut r = node("r", "", now);
    ready(&mut r, "False", now - mins(60));
    r.conditions[0].last_heartbeat_time = Some(now - mins(600));
    let ready_false = with(vec![policy("Ready", "False", None)]);
    assert!(matches!(
        health(&r, &ready_false.repair.for_group(""), now),
        Health::Unhealthy { .. }
    ));
    assert_eq!(STALE_REASON, "HeartbeatStale");
}

#[test]
fn a_restarted_controller_resumes_mid_ladder_from_the_annotations() {
    let now = monday();
    let c = with(vec![policy(
        "Ready",
        "False",
        Some(vec![
            LadderStep::restart("kubelet.service"),
            LadderStep::restart("crio.service"),
            LadderStep::of(RepairStep::Replace),
        ]),
    )]);
    let mut v = cluster(now);
    step(&mut v, &c, now);
    let a = step(&mut v, &c, now + mins(5));
    assert_eq!(restarts(&a), ["crio.service"]);
    // A new controller (only the Node's annotations): the crio step is resumed, not repeated.
    let mut fresh: NodeView = get(&v, "a").clone();
    fresh.drain = Default::default();
    *node_mut(&mut v, "a") = fresh;
    assert!(run(&v, &c, now + mins(6)).is_empty());
    let a = step(&mut v, &c, now + mins(10));
    assert_eq!(count(&a, is_replacement), 1, "{a:#?}");
    assert!(restarts(&a).is_empty());
}

#[test]
fn a_step_timeout_of_its_own_overrides_the_global_one() {
    let now = monday();
    let mut kubelet = LadderStep::restart("kubelet.service");
    kubelet.timeout = Some(Duration::from_secs(60));
    let c = with(vec![policy(
        "Ready",
        "False",
        Some(vec![kubelet, LadderStep::of(RepairStep::Reboot)]),
    )]);
    let mut v = cluster(now);
    step(&mut v, &c, now);
    assert!(run(&v, &c, now + chrono::Duration::seconds(59)).is_empty());
    assert!(has(&step(&mut v, &c, now + mins(1)), is_reboot));
}

mod props {
    //! Random ladders (restart-unit of 1–2 units, drain, reboot, replace, none; trusted or not)
    //! played forward with random faults, recoveries, reboots (new boot ids), drains completing
    //! and controller restarts. After every step: deciding again is a no-op; no reboot or
    //! replacement for a condition nodekeeper cannot see clear unless its policy opts in; every
    //! restarted unit is one of the ladder's; the repair moves forward along its ladder only,
    //! never before a step's timeout (a drain may end earlier); a repair on a reboot step ends
    //! only after a new boot id or the step's timeout.

    use super::*;
    use proptest::prelude::*;

    fn ladder_of(mask: u8, units: u8) -> Vec<LadderStep> {
        let mut out = Vec::new();
        if units >= 1 {
            out.push(LadderStep::restart("kubelet.service"));
        }
        if units >= 2 {
            out.push(LadderStep::restart("crio.service"));
        }
        for (bit, s) in [
            RepairStep::Drain,
            RepairStep::Reboot,
            RepairStep::Replace,
            RepairStep::None,
        ]
        .into_iter()
        .enumerate()
        {
            if mask & (1 << bit) != 0 {
                out.push(LadderStep::of(s));
            }
        }
        if out.is_empty() {
            out.push(LadderStep::of(RepairStep::Replace));
        }
        out
    }

    fn position(ladder: &[LadderStep], n: &NodeView) -> Option<usize> {
        let label = n.annotation(keys::REPAIR_STEP)?;
        let s = LadderStep::from_label(label)?;
        ladder.iter().position(|l| l.same(&s))
    }

    proptest! {
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn ladders_escalate_in_order_and_only_as_allowed(
            mask in 0u8..16,
            units in 0u8..3,
            trusted_type in any::<bool>(),
            allow in any::<bool>(),
            moves in proptest::collection::vec((0u8..6, 1i64..8), 4..24),
        ) {
            let now0 = monday();
            let steps = ladder_of(mask, units);
            let type_ = if trusted_type { "Ready" } else { "KernelDeadlock" };
            let status = if trusted_type { "False" } else { "True" };
            let mut p = policy(type_, status, Some(steps.clone()));
            p.allow_destructive = allow;
            let c = with(vec![p.clone()]);
            let mut v = cluster(now0);
            if !trusted_type {
                ready(node_mut(&mut v, "a"), "True", now0 - mins(60));
                node_mut(&mut v, "a").conditions.push(condition(type_, status, now0 - mins(20)));
            }
            let mut now = now0;
            let mut boot = 0;
            for (what, minutes) in moves {
                let before = get(&v, "a").clone();
                let ds = run(&v, &c, now);
                let a = of(&ds, "a");
                // Only as allowed.
                if !p.trusted() {
                    prop_assert!(!has(&a, |x| is_reboot(x) || is_replacement(x)), "{a:#?}");
                }
                for u in restarts(&a) {
                    prop_assert!(steps.iter().any(|s| s.unit.as_deref() == Some(u.as_str())));
                }
                apply(&mut v, &ds);
                prop_assert!(run(&v, &c, now).is_empty(), "not idempotent at {now}");
                // Forward only, never before the step's timeout.
                let after = get(&v, "a");
                if let (Some(i), Some(j)) = (position(&steps, &before), position(&steps, after)) {
                    prop_assert!(i <= j, "went back from {i} to {j}");
                    if i < j && steps[i].step != RepairStep::Drain {
                        let since = before.record().step_since.unwrap();
                        let timeout = nodekeeper_core::controller::policy::repair::timeout_of(&steps[i], &c);
                        prop_assert!(now >= nodekeeper_core::controller::policy::later(since, timeout));
                    }
                }
                // A reboot ends only with a new boot id or at its timeout.
                let rec = before.record();
                if rec.step == Some(RepairStep::Reboot) && state(after).is_none() {
                    let proven = rec.reboot_boot_id.as_deref() != after.boot_id.as_deref();
                    let timeout = c.repair.reboot_timeout;
                    let late = now >= nodekeeper_core::controller::policy::later(rec.step_since.unwrap(), timeout);
                    prop_assert!(proven || late, "released a reboot step without a reboot");
                }
                // The world moves.
                let n = node_mut(&mut v, "a");
                match what {
                    0 => {
                        let c = n.conditions.iter_mut().find(|c| c.type_ == type_).unwrap();
                        c.status = if c.status == status { "Unknown".into() } else { status.into() };
                        c.last_transition_time = now;
                    }
                    1 => { boot += 1; n.boot_id = Some(format!("boot-{boot}")); }
                    2 if n.drain.phase == DrainPhase::Running => n.drain.phase = DrainPhase::Completed,
                    3 => n.drain = Default::default(),
                    _ => {}
                }
                now += mins(minutes);
            }
        }
    }
}

//! `[repair] prespin`: a `drain` step that `replace` follows asks for the replacement as the
//! drain starts (before it in the decision), only with a provider whose request adds capacity;
//! the `replace` step then only hands the drained node over; a repair released mid-drain abandons
//! the replacement (same id) and clears its marks, so that the next repair asks anew.

use crate::support::policy as policy_support;

use nodekeeper_core::controller::policy::config::{LadderStep, RepairStep};
use nodekeeper_core::controller::policy::view::{keys, ClusterView};
use nodekeeper_core::controller::policy::{Action, PolicyConfig};
use policy_support::*;

/// The shared Ready=False policy (drain → replace) with a provider that adds capacity.
fn karpenter() -> PolicyConfig {
    let mut c = cfg();
    c.controller.provider_adds_capacity = true;
    c
}

/// Five nodes; `a` has Ready=False since 20 min before `now`.
fn cluster(now: chrono::DateTime<chrono::Utc>) -> ClusterView {
    let mut n = node("a", "", now);
    ready(&mut n, "False", now - mins(20));
    let mut nodes = vec![n];
    nodes.extend(["b", "c", "d", "e"].map(|name| node(name, "", now)));
    view(nodes)
}

fn position(a: &[Action], f: impl Fn(&Action) -> bool) -> Option<usize> {
    a.iter().position(f)
}

fn prespun(a: &Action) -> bool {
    matches!(a, Action::RequestReplacement { prespin: true, .. })
}

fn request_id(a: &[Action]) -> Option<String> {
    a.iter().find_map(|x| match x {
        Action::RequestReplacement { id, .. } => Some(id.clone()),
        _ => None,
    })
}

#[test]
fn the_replacement_is_asked_for_before_the_drain_and_the_node_handed_over_after_it() {
    let now = monday();
    let c = karpenter();
    let mut v = cluster(now);
    let ds = run(&v, &c, now);
    apply(&mut v, &ds);
    let a = of(&ds, "a");
    let asked = position(&a, prespun).unwrap_or_else(|| panic!("no pre-spun request: {a:#?}"));
    let drain = position(&a, |x| matches!(x, Action::StartDrain { .. })).expect("a drain");
    assert!(asked < drain, "the request goes before the drain: {a:#?}");
    assert_eq!(count(&a, is_replacement), 1);
    let id = request_id(&a).unwrap();
    assert_eq!(get(&v, "a").annotation(keys::REPAIR_STEP), Some("drain"));

    // The provider accepts; the drain runs: nothing more is asked, nothing handed over.
    node_mut(&mut v, "a")
        .annotations
        .insert(keys::REPLACEMENT_ACCEPTED.into(), "nk-x".into());
    let a = of(&run(&v, &c, now + mins(1)), "a");
    assert!(!has(&a, is_replacement), "{a:#?}");
    assert!(
        !has(&a, |x| matches!(x, Action::RetireNode { .. })),
        "{a:#?}"
    );

    // The drain completes: on to `replace`, which asks nothing new and hands the node over with
    // the pre-spun request's id.
    finish_drain(&mut v, "a");
    let ds = run(&v, &c, now + mins(2));
    apply(&mut v, &ds);
    let a = of(&ds, "a");
    assert!(!has(&a, is_replacement), "{a:#?}");
    assert_eq!(get(&v, "a").annotation(keys::REPAIR_STEP), Some("replace"));
    let a = of(&run(&v, &c, now + mins(2)), "a");
    let retired = a.iter().find_map(|x| match x {
        Action::RetireNode { id, .. } => Some(id.clone()),
        _ => None,
    });
    assert_eq!(retired.as_ref(), Some(&id), "{a:#?}");
}

#[test]
fn no_prespin_without_a_provider_that_adds_capacity_or_when_switched_off() {
    let now = monday();
    let mut off = karpenter();
    off.repair.prespin = false;
    for (what, c) in [("webhook/oci/none", cfg()), ("prespin = false", off)] {
        let mut v = cluster(now);
        let ds = run(&v, &c, now);
        apply(&mut v, &ds);
        let a = of(&ds, "a");
        assert!(
            has(&a, |x| matches!(x, Action::StartDrain { .. })),
            "{what}"
        );
        assert!(!has(&a, is_replacement), "{what}: {a:#?}");
        // The replacement comes after the drain, as before.
        finish_drain(&mut v, "a");
        let ds = run(&v, &c, now + mins(1));
        let a = of(&ds, "a");
        assert!(
            has(&a, |x| matches!(
                x,
                Action::RequestReplacement { prespin: false, .. }
            )),
            "{what}: {a:#?}"
        );
    }
}

#[test]
fn only_a_drain_that_replace_follows_prespins() {
    let now = monday();
    let mut c = karpenter();
    c.repair.steps = vec![RepairStep::Drain, RepairStep::Reboot, RepairStep::Replace];
    let mut v = cluster(now);
    let a = of(&run(&v, &c, now), "a");
    assert!(has(&a, |x| matches!(x, Action::StartDrain { .. })));
    assert!(!has(&a, is_replacement), "{a:#?}");
    // A policy's own ladder counts, not the global steps.
    c.repair.steps = vec![RepairStep::Drain, RepairStep::Reboot];
    c.repair.policy[0].steps = Some(vec![
        LadderStep::of(RepairStep::Drain),
        LadderStep::of(RepairStep::Replace),
    ]);
    v = cluster(now);
    let a = of(&run(&v, &c, now), "a");
    assert!(has(&a, prespun), "{a:#?}");
}

#[test]
fn a_repair_released_mid_drain_abandons_its_replacement_and_the_next_asks_anew() {
    let now = monday();
    let c = karpenter();
    let mut v = cluster(now);
    let ds = run(&v, &c, now);
    apply(&mut v, &ds);
    let first = request_id(&of(&ds, "a")).expect("pre-spun");
    node_mut(&mut v, "a")
        .annotations
        .insert(keys::REPLACEMENT_ACCEPTED.into(), "nk-x".into());

    // Ready again; after healthy_delay (2 min) the repair ends.
    ready(node_mut(&mut v, "a"), "True", now + mins(1));
    let ds = run(&v, &c, now + mins(4));
    apply(&mut v, &ds);
    let a = of(&ds, "a");
    assert!(has(&a, |x| matches!(x, Action::Uncordon)), "{a:#?}");
    let abandoned = a.iter().find_map(|x| match x {
        Action::AbandonReplacement { id, .. } => Some(id.clone()),
        _ => None,
    });
    assert_eq!(abandoned.as_ref(), Some(&first), "{a:#?}");
    assert!(!has(&a, |x| matches!(x, Action::RetireNode { .. })));
    let n = get(&v, "a");
    assert_eq!(n.annotation(keys::REPLACEMENT_REQUESTED), None);
    assert_eq!(n.annotation(keys::REPLACEMENT_ACCEPTED), None);
    assert_eq!(state(n), None);
    // Nothing more once released.
    assert!(run(&v, &c, now + mins(5)).is_empty());

    // A new fault: the next repair pre-spins a replacement of its own.
    ready(node_mut(&mut v, "a"), "False", now + mins(6));
    let later = now + mins(17);
    let a = of(&run(&v, &c, later), "a");
    let second = request_id(&a).unwrap_or_else(|| panic!("asked anew: {a:#?}"));
    assert_ne!(second, first);
    assert!(has(&a, prespun));
}

#[test]
fn a_repair_released_after_its_replace_step_abandons_nothing() {
    let now = monday();
    let c = karpenter();
    let mut v = cluster(now);
    let ds = run(&v, &c, now);
    apply(&mut v, &ds);
    node_mut(&mut v, "a")
        .annotations
        .insert(keys::REPLACEMENT_ACCEPTED.into(), "nk-x".into());
    finish_drain(&mut v, "a");
    let ds = run(&v, &c, now + mins(1));
    apply(&mut v, &ds);
    assert_eq!(get(&v, "a").annotation(keys::REPAIR_STEP), Some("replace"));
    // Past the point of no return: healthy again changes nothing.
    ready(node_mut(&mut v, "a"), "True", now + mins(2));
    let a = of(&run(&v, &c, now + mins(10)), "a");
    assert!(
        !has(&a, |x| matches!(x, Action::AbandonReplacement { .. })),
        "{a:#?}"
    );
    assert!(!has(&a, |x| matches!(x, Action::Uncordon)), "{a:#?}");
}

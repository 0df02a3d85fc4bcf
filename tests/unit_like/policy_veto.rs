//! The per-node repair veto: `karpenter.sh/do-not-repair` (Karpenter v1.15's) and
//! `nodekeeper.io/do-not-repair`, each `"true"`, keep every repair off the node (no cordon, drain,
//! reboot or replacement), hold it with a `do_not_repair` blocker naming the annotation, stop a
//! repair under way unless its replacement was requested, and never stop an interruption.

use crate::support::policy as policy_support;

use nodekeeper_core::controller::catalog::{EventType, Reason};
use nodekeeper_core::controller::policy::config::RepairStep;
use nodekeeper_core::controller::policy::explain::{Blocker, Held};
use nodekeeper_core::controller::policy::view::{keys, DrainPhase, NodeView, NoticeKind};
use nodekeeper_core::controller::policy::Action;
use policy_support::*;

/// Any action a repair takes on the node itself.
fn is_repair_action(a: &Action) -> bool {
    matches!(
        a,
        Action::Cordon
            | Action::StartDrain { .. }
            | Action::RequestReboot { .. }
            | Action::RequestReplacement { .. }
            | Action::RetireNode { .. }
            | Action::Label { value: Some(_), .. }
            | Action::Taint { .. }
    ) || matches!(
        a,
        Action::Event {
            reason: Reason::RepairStarted,
            ..
        }
    )
}

fn hold_of(actions: &[Action]) -> Option<Blocker> {
    actions.iter().find_map(|a| match a {
        Action::Hold(Held { blocker, .. }) => Some(blocker.clone()),
        _ => None,
    })
}

fn veto(annotation: &str) -> Blocker {
    Blocker::DoNotRepair {
        annotation: annotation.to_string(),
    }
}

/// Node `a` NotReady for 11 min (past the 10 min toleration) among four healthy nodes.
fn failing(
    annotations: &[(&str, &str)],
) -> (
    nodekeeper_core::controller::policy::ClusterView,
    chrono::DateTime<chrono::Utc>,
) {
    let now = monday();
    let mut a = node("a", "pool", now);
    ready(&mut a, "False", now - mins(11));
    for (k, v) in annotations {
        a.annotations.insert(k.to_string(), v.to_string());
    }
    let others = ["b", "c", "d", "e"].map(|n| node(n, "pool", now));
    let mut nodes: Vec<NodeView> = vec![a];
    nodes.extend(others);
    (view(nodes), now)
}

/// A node's annotations, as (key, value) pairs.
type Annotations<'a> = &'a [(&'a str, &'a str)];

#[test]
fn which_annotations_veto_a_repair() {
    const K: &str = keys::KARPENTER_DO_NOT_REPAIR;
    const N: &str = keys::DO_NOT_REPAIR;
    // (the node's annotations, the veto expected: None = the repair starts)
    let table: &[(Annotations, Option<&str>)] = &[
        (&[], None),
        (&[(K, "true")], Some(K)),
        (&[(N, "true")], Some(N)),
        (&[(K, "true"), (N, "true")], Some(K)),
        (&[(K, "false"), (N, "true")], Some(N)),
        // Exactly "true", as Karpenter compares it (repair.go: `== "true"`).
        (&[(K, "false")], None),
        (&[(K, "True")], None),
        (&[(N, "")], None),
        // do-not-disrupt does not imply do-not-repair (Karpenter's types.go says the same).
        (&[(keys::KARPENTER_DO_NOT_DISRUPT, "true")], None),
        (&[("nodekeeper.io/do-not-disrupt", "true")], None),
    ];
    for (annotations, want) in table {
        let (v, now) = failing(annotations);
        let a = of(&run(&v, &cfg(), now), "a");
        match want {
            Some(key) => {
                assert!(
                    !has(&a, is_repair_action),
                    "{annotations:?}: vetoed, yet {a:#?}"
                );
                assert_eq!(hold_of(&a), Some(veto(key)), "{annotations:?}: {a:#?}");
                assert!(
                    has(&a, |x| matches!(
                        x,
                        Action::Event {
                            type_: EventType::Warning,
                            reason: Reason::BlockedByDoNotRepair,
                            message,
                        } if message.contains(key)
                    )),
                    "{annotations:?}: {a:#?}"
                );
            }
            None => {
                assert!(
                    has(&a, |x| matches!(x, Action::StartDrain { .. })),
                    "{annotations:?}: not vetoed, yet {a:#?}"
                );
                assert!(has(&a, |x| matches!(x, Action::Cordon)), "{a:#?}");
                assert_eq!(hold_of(&a), None, "{annotations:?}");
            }
        }
    }
}

#[test]
fn the_veto_shows_once_the_toleration_expires_holds_stably_and_lifts_with_the_annotation() {
    let now = monday();
    let mut a = node("a", "pool", now);
    ready(&mut a, "False", now - mins(9));
    a.annotations
        .insert(keys::DO_NOT_REPAIR.into(), "true".into());
    let mut v = view(vec![
        a,
        node("b", "pool", now),
        node("c", "pool", now),
        node("d", "pool", now),
    ]);
    // Within its toleration: nothing to veto yet.
    assert!(run(&v, &cfg(), now).is_empty());
    let t1 = now + mins(1);
    let ds = run(&v, &cfg(), t1);
    let a = of(&ds, "a");
    assert_eq!(hold_of(&a), Some(veto(keys::DO_NOT_REPAIR)), "{a:#?}");
    apply(&mut v, &ds);
    let blocked = get(&v, "a").annotation(keys::BLOCKED).unwrap();
    assert!(
        blocked.contains(r#""kind":"do_not_repair","annotation":"nodekeeper.io/do-not-repair""#),
        "{blocked}"
    );
    assert_eq!(state(get(&v, "a")), None, "a vetoed node gets no state");
    // Deciding again: nothing more (no second Event).
    assert!(run(&v, &cfg(), t1 + mins(5)).is_empty());
    // The operator lifts the veto: the repair starts and the hold goes.
    node_mut(&mut v, "a")
        .annotations
        .remove(keys::DO_NOT_REPAIR);
    let ds = run(&v, &cfg(), t1 + mins(6));
    let a = of(&ds, "a");
    assert!(
        has(&a, |x| matches!(x, Action::StartDrain { .. })),
        "{a:#?}"
    );
    assert!(has(
        &a,
        |x| matches!(x, Action::Annotate { key, value: None } if key == keys::BLOCKED)
    ));
    assert!(has(&a, |x| matches!(
        x,
        Action::Event {
            reason: Reason::HoldReleased,
            ..
        }
    )));
}

#[test]
fn a_veto_put_on_a_node_under_repair_stops_the_repair_and_undoes_it() {
    let mut c = cfg();
    c.repair.steps = vec![RepairStep::Drain, RepairStep::Reboot, RepairStep::Replace];
    let (mut v, now) = failing(&[]);
    let ds = run(&v, &c, now);
    apply(&mut v, &ds);
    assert_eq!(state(get(&v, "a")), Some("repairing"));
    assert_eq!(get(&v, "a").drain.phase, DrainPhase::Running);
    // The drain step timed out: the reboot is asked for; then the veto comes.
    let ds = run(&v, &c, now + mins(15));
    assert!(has(&of(&ds, "a"), |x| matches!(
        x,
        Action::RequestReboot { .. }
    )));
    apply(&mut v, &ds);
    // On a node of a NodePool under nodekeeper's repair, karpenter.sh/do-not-repair is already
    // there as nodekeeper's own mark (policy_karpenter_repair.rs): an operator vetoes with
    // nodekeeper's annotation.
    node_mut(&mut v, "a")
        .annotations
        .insert(keys::DO_NOT_REPAIR.into(), "true".into());
    let ds = run(&v, &c, now + mins(16));
    let a = of(&ds, "a");
    assert!(has(&a, |x| matches!(x, Action::Uncordon)), "{a:#?}");
    assert!(!has(&a, is_repair_action), "{a:#?}");
    assert_eq!(hold_of(&a), Some(veto(keys::DO_NOT_REPAIR)));
    apply(&mut v, &ds);
    let n = get(&v, "a");
    assert!(!n.unschedulable, "nodekeeper's cordon undone");
    for k in [
        keys::STATE,
        keys::REPAIR_STEP,
        keys::REBOOT_REQUESTED,
        keys::CORDONED_BY,
        keys::DO_NOT_DISRUPT_BY,
        keys::DO_NOT_REPAIR_BY,
        keys::KARPENTER_DO_NOT_REPAIR,
    ] {
        assert_eq!(n.annotation(k), None, "{k} left: {:?}", n.annotations);
    }
    assert_eq!(
        n.annotation(keys::KARPENTER_DO_NOT_DISRUPT),
        None,
        "nodekeeper's do-not-disrupt mark lifted"
    );
    // Long after, still NotReady: never escalated to a replacement.
    let ds = run(&v, &c, now + mins(60));
    assert!(ds.iter().all(|d| !is_repair_action(&d.action)), "{ds:#?}");
}

#[test]
fn a_veto_drain_in_progress_stops_the_drain() {
    let (mut v, now) = failing(&[]);
    let ds = run(&v, &cfg(), now);
    apply(&mut v, &ds);
    node_mut(&mut v, "a")
        .annotations
        .insert(keys::DO_NOT_REPAIR.into(), "true".into());
    let ds = run(&v, &cfg(), now + mins(1));
    let a = of(&ds, "a");
    assert!(has(&a, |x| matches!(x, Action::StopDrain)), "{a:#?}");
    apply(&mut v, &ds);
    assert_eq!(get(&v, "a").drain.phase, DrainPhase::Idle);
    assert!(
        run(&v, &cfg(), now + mins(2)).is_empty(),
        "fixpoint once held"
    );
}

#[test]
fn a_veto_after_the_replacement_was_requested_does_not_bring_the_node_back() {
    let mut c = cfg();
    c.repair.steps = vec![RepairStep::Replace];
    let (mut v, now) = failing(&[]);
    let ds = run(&v, &c, now);
    assert!(has(&of(&ds, "a"), is_replacement));
    apply(&mut v, &ds);
    node_mut(&mut v, "a")
        .annotations
        .insert(keys::DO_NOT_REPAIR.into(), "true".into());
    let ds = run(&v, &c, now + mins(1));
    let a = of(&ds, "a");
    assert!(!has(&a, |x| matches!(x, Action::Uncordon)), "{a:#?}");
    assert_eq!(hold_of(&a), None, "{a:#?}");
    assert_eq!(state(get(&v, "a")), Some("repairing"));
    assert_eq!(count(&a, is_replacement), 0, "never twice");
}

#[test]
fn a_vetoed_node_is_still_interrupted_by_a_preemption_notice() {
    let (mut v, now) = failing(&[(keys::KARPENTER_DO_NOT_REPAIR, "true")]);
    let ds = run(&v, &cfg(), now);
    apply(&mut v, &ds);
    assert_eq!(
        hold_of(&of(&ds, "a")),
        Some(veto(keys::KARPENTER_DO_NOT_REPAIR))
    );
    let at = now + mins(2);
    node_mut(&mut v, "a")
        .notices
        .push(notice("spot-1", NoticeKind::Preemption, Some(at), now));
    let ds = run(&v, &cfg(), now + chrono::Duration::seconds(5));
    let a = of(&ds, "a");
    assert!(has(&a, |x| matches!(x, Action::Cordon)), "{a:#?}");
    assert!(has(&a, |x| matches!(x, Action::Taint { .. })), "{a:#?}");
    assert!(
        has(
            &a,
            |x| matches!(x, Action::StartDrain { reason, .. } if reason == "interruption:preemption")
        ),
        "{a:#?}"
    );
    assert_eq!(count(&a, is_replacement), 1, "{a:#?}");
    assert!(has(
        &a,
        |x| matches!(x, Action::Annotate { key, value: None } if key == keys::BLOCKED)
    ));
}

#[test]
fn a_veto_holds_the_startup_timeout_replacement() {
    let now = monday();
    let mut n = node("new", "", now);
    n.created_at = now - mins(11);
    n.became_ready = false;
    let created = n.created_at;
    ready(&mut n, "False", created);
    n.annotations
        .insert(keys::DO_NOT_REPAIR.into(), "true".into());
    let ds = run(&view(vec![n]), &cfg(), now);
    let a = of(&ds, "new");
    assert!(!has(&a, is_repair_action), "{a:#?}");
    assert!(!has(&a, |x| matches!(
        x,
        Action::Event {
            reason: Reason::StartupTimeout,
            ..
        }
    )));
    assert_eq!(hold_of(&a), Some(veto(keys::DO_NOT_REPAIR)));
}

/// A vetoed NotReady node is still down capacity: it counts against its group's budget as any
/// NotReady node does, so with `nodes = "1"` a second failing node waits.
#[test]
fn a_vetoed_notready_node_still_counts_against_the_budget() {
    let mut c = cfg();
    c.repair.max_unhealthy = nodekeeper_core::controller::policy::config::Quantity::Percent(100);
    c.budgets.default = budgets(r#"[{ nodes = "1" }]"#);
    let (mut v, now) = failing(&[(keys::DO_NOT_REPAIR, "true")]);
    ready(node_mut(&mut v, "b"), "False", now - mins(11));
    let ds = run(&v, &c, now);
    assert_eq!(hold_of(&of(&ds, "a")), Some(veto(keys::DO_NOT_REPAIR)));
    assert!(
        matches!(
            hold_of(&of(&ds, "b")),
            Some(Blocker::Budget { disrupting: 1, .. })
        ),
        "{ds:#?}"
    );
}

/// Found by `policy_props`: a node healthy again (within `healthy_delay`) whose repair is then vetoed
/// is released without a hold, as an idle healthy node is, so that deciding again does nothing.
#[test]
fn a_veto_on_a_recovering_node_under_repair_releases_it_without_a_hold() {
    let (mut v, now) = failing(&[]);
    let ds = run(&v, &cfg(), now);
    apply(&mut v, &ds);
    assert_eq!(state(get(&v, "a")), Some("repairing"));
    ready(node_mut(&mut v, "a"), "True", now + mins(1));
    node_mut(&mut v, "a")
        .annotations
        .insert(keys::DO_NOT_REPAIR.into(), "true".into());
    let t = now + mins(2);
    let ds = run(&v, &cfg(), t);
    let a = of(&ds, "a");
    assert!(has(&a, |x| matches!(x, Action::Uncordon)), "{a:#?}");
    assert_eq!(
        hold_of(&a),
        None,
        "nothing to veto on a healthy node: {a:#?}"
    );
    apply(&mut v, &ds);
    assert_eq!(state(get(&v, "a")), None);
    assert!(run(&v, &cfg(), t).is_empty(), "fixpoint");
}

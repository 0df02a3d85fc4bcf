//! Repair beside Karpenter v1.15's NodeRepair: one side repairs a node, never both.
//! - nodekeeper first: its repair of a node of a NodePool puts `karpenter.sh/do-not-repair`
//!   (ownership `nodekeeper.io/do-not-repair-by: nodekeeper` first), the one mark Karpenter's
//!   repair honours (it ignores `do-not-disrupt`: `pkg/controllers/disruption/types.go`); that mark
//!   is no veto to nodekeeper, and it goes with the repair.
//! - Karpenter first: a node carrying `karpenter.sh/disrupted` (Karpenter's disruption queue taints
//!   the node it chose before it pre-spins the replacement: `queue.go`, `markDisrupted`) gets no
//!   repair of nodekeeper's, and is held `KarpenterDisrupting` as soon as a repair policy finds
//!   it unhealthy; a repair of nodekeeper's caught by the taint before its replacement is stopped.

use crate::support::policy as policy_support;

use nodekeeper_core::controller::catalog::{EventType, Reason};
use nodekeeper_core::controller::policy::config::RepairStep;
use nodekeeper_core::controller::policy::explain::{Blocker, Held};
use nodekeeper_core::controller::policy::view::{
    keys, ClusterView, DrainPhase, TaintView, KARPENTER_DISRUPTED_TAINT, KARPENTER_REBOOTING_TAINT,
};
use nodekeeper_core::controller::policy::Action;
use policy_support::*;

const K: &str = keys::KARPENTER_DO_NOT_REPAIR;
const BY: &str = keys::DO_NOT_REPAIR_BY;

fn hold_of(actions: &[Action]) -> Option<Blocker> {
    actions.iter().find_map(|a| match a {
        Action::Hold(Held { blocker, .. }) => Some(blocker.clone()),
        _ => None,
    })
}

fn starts_repair(a: &[Action]) -> bool {
    has(a, |x| {
        matches!(
            x,
            Action::Cordon
                | Action::StartDrain { .. }
                | Action::RequestReboot { .. }
                | Action::RequestReplacement { .. }
        )
    })
}

/// Writes `key` (to `value`, `None`: removes it), at this position among `a`.
fn annotates(a: &[Action], key: &str, value: Option<&str>) -> Option<usize> {
    a.iter().position(
        |x| matches!(x, Action::Annotate { key: k, value: v } if k == key && v.as_deref() == value),
    )
}

fn disrupted_taint() -> TaintView {
    TaintView {
        key: KARPENTER_DISRUPTED_TAINT.into(),
        value: String::new(),
        effect: "NoSchedule".into(),
    }
}

/// Node `a` of `group` NotReady for `minutes` (the toleration is 10 min) among four healthy ones.
fn failing(group: &str, minutes: i64) -> (ClusterView, chrono::DateTime<chrono::Utc>) {
    let now = monday();
    let mut a = node("a", group, now);
    ready(&mut a, "False", now - mins(minutes));
    let mut nodes = vec![a];
    nodes.extend(["b", "c", "d", "e"].map(|n| node(n, group, now)));
    (view(nodes), now)
}

#[test]
fn who_repairs_a_failing_node() {
    // (NodePool label, Karpenter's taint, the node's do-not-repair, its ownership record,
    //  minutes NotReady, or HEALTHY) → what nodekeeper does.
    const HEALTHY: i64 = -1;
    #[derive(Debug, PartialEq)]
    enum Want {
        /// Repairs, writing Karpenter's do-not-repair (ownership first).
        RepairMarked,
        /// Repairs, writing no do-not-repair (no NodePool: Karpenter does not repair it).
        RepairUnmarked,
        /// Repairs; the mark is there already, its own.
        RepairOwnMark,
        Held(Blocker),
        Nothing,
    }
    let veto = Blocker::DoNotRepair {
        annotation: K.into(),
    };
    type Row<'a> = (&'a str, bool, Option<&'a str>, Option<&'a str>, i64, Want);
    let table: &[Row] = &[
        ("pool", false, None, None, 11, Want::RepairMarked),
        ("", false, None, None, 11, Want::RepairUnmarked),
        // Karpenter chose it first: nodekeeper stands back and says why, its toleration expired
        // or not (Karpenter's may be the shorter); a healthy node Karpenter disrupts (drift,
        // consolidation) is none of the repair's business.
        (
            "pool",
            true,
            None,
            None,
            11,
            Want::Held(Blocker::KarpenterDisrupting),
        ),
        (
            "pool",
            true,
            None,
            None,
            9,
            Want::Held(Blocker::KarpenterDisrupting),
        ),
        ("pool", true, None, None, HEALTHY, Want::Nothing),
        // An operator's veto stays a veto; nodekeeper's own mark is none.
        (
            "pool",
            false,
            Some("true"),
            None,
            11,
            Want::Held(veto.clone()),
        ),
        (
            "pool",
            false,
            Some("true"),
            Some("fence"),
            11,
            Want::Held(veto),
        ),
        (
            "pool",
            false,
            Some("true"),
            Some("nodekeeper"),
            11,
            Want::RepairOwnMark,
        ),
        // Karpenter's taint wins over a veto: the node is going whatever nodekeeper says.
        (
            "pool",
            true,
            Some("true"),
            None,
            11,
            Want::Held(Blocker::KarpenterDisrupting),
        ),
    ];
    for (group, tainted, mark, by, minutes, want) in table {
        let (mut v, now) = failing(group, *minutes);
        let a = node_mut(&mut v, "a");
        if *minutes == HEALTHY {
            ready(a, "True", now - mins(60));
        }
        if *tainted {
            a.taints.push(disrupted_taint());
        }
        if let Some(m) = mark {
            a.annotations.insert(K.into(), m.to_string());
        }
        if let Some(b) = by {
            a.annotations.insert(BY.into(), b.to_string());
        }
        let acts = of(&run(&v, &cfg(), now), "a");
        let row = format!("{group:?} tainted={tainted} mark={mark:?} by={by:?} {minutes}m");
        match want {
            Want::RepairMarked => {
                assert!(starts_repair(&acts), "{row}: {acts:#?}");
                let by = annotates(&acts, BY, Some(keys::OWNER)).expect(&row);
                let mark = annotates(&acts, K, Some("true")).expect(&row);
                assert!(by < mark, "{row}: the ownership record first");
                let drain = acts
                    .iter()
                    .position(|x| matches!(x, Action::StartDrain { .. }))
                    .unwrap();
                assert!(mark < drain, "{row}: marked before the drain starts");
            }
            Want::RepairUnmarked | Want::RepairOwnMark => {
                assert!(starts_repair(&acts), "{row}: {acts:#?}");
                assert_eq!(annotates(&acts, K, Some("true")), None, "{row}: {acts:#?}");
                assert_eq!(hold_of(&acts), None, "{row}");
            }
            Want::Held(b) => {
                assert!(!starts_repair(&acts), "{row}: {acts:#?}");
                assert_eq!(hold_of(&acts).as_ref(), Some(b), "{row}: {acts:#?}");
                let reason = b.event_reason();
                assert!(
                    has(&acts, |x| matches!(
                        x,
                        Action::Event { type_: EventType::Warning, reason: r, .. } if *r == reason
                    )),
                    "{row}: {acts:#?}"
                );
            }
            Want::Nothing => assert!(acts.is_empty(), "{row}: {acts:#?}"),
        }
    }
}

#[test]
fn nodekeepers_mark_is_no_veto_to_itself_and_goes_with_the_repair() {
    let (mut v, now) = failing("pool", 11);
    let ds = run(&v, &cfg(), now);
    apply(&mut v, &ds);
    let a = get(&v, "a");
    assert_eq!(state(a), Some("repairing"));
    assert_eq!(a.annotation(K), Some("true"));
    assert_eq!(a.repair_veto(), None, "its own mark is no veto");
    // The repair goes on: its drain is not stopped, nothing is held.
    let ds = run(&v, &cfg(), now + mins(1));
    let acts = of(&ds, "a");
    assert!(!has(&acts, |x| matches!(x, Action::StopDrain)), "{acts:#?}");
    assert_eq!(hold_of(&acts), None);
    // The node recovers: the repair is released, and both annotations go (the mark first).
    ready(node_mut(&mut v, "a"), "True", now + mins(2));
    let ds = run(&v, &cfg(), now + mins(10));
    let acts = of(&ds, "a");
    let mark = annotates(&acts, K, None).expect("the mark lifted");
    let by = annotates(&acts, BY, None).expect("its record removed");
    assert!(mark < by, "{acts:#?}");
    apply(&mut v, &ds);
    assert_eq!(state(get(&v, "a")), None);
    assert!(run(&v, &cfg(), now + mins(11)).is_empty(), "fixpoint");
}

#[test]
fn an_operators_do_not_repair_is_kept_when_nodekeeper_releases() {
    let (mut v, now) = failing("pool", 11);
    node_mut(&mut v, "a")
        .annotations
        .insert(K.into(), "true".into());
    let ds = run(&v, &cfg(), now);
    apply(&mut v, &ds);
    ready(node_mut(&mut v, "a"), "True", now);
    for m in [1, 20] {
        let ds = run(&v, &cfg(), now + mins(m));
        apply(&mut v, &ds);
    }
    assert_eq!(get(&v, "a").annotation(K), Some("true"), "never removed");
}

#[test]
fn karpenter_choosing_the_node_mid_repair_stops_nodekeepers_drain_and_says_why() {
    let (mut v, now) = failing("pool", 11);
    let ds = run(&v, &cfg(), now);
    apply(&mut v, &ds);
    assert_eq!(get(&v, "a").drain.phase, DrainPhase::Running);
    // Karpenter picked it (before nodekeeper's mark reached its cache): its taint lands.
    node_mut(&mut v, "a").taints.push(disrupted_taint());
    let ds = run(&v, &cfg(), now + mins(1));
    let acts = of(&ds, "a");
    assert!(has(&acts, |x| matches!(x, Action::StopDrain)), "{acts:#?}");
    assert!(has(&acts, |x| matches!(x, Action::Uncordon)), "{acts:#?}");
    assert!(
        annotates(&acts, K, None).is_some(),
        "its do-not-repair lifted"
    );
    assert_eq!(hold_of(&acts), Some(Blocker::KarpenterDisrupting));
    assert!(!has(&acts, is_replacement), "no second replacement");
    apply(&mut v, &ds);
    assert_eq!(state(get(&v, "a")), None);
    // Karpenter deletes the node: the hold stays, nothing else happens.
    node_mut(&mut v, "a").deleting = true;
    assert!(run(&v, &cfg(), now + mins(2)).is_empty());
}

#[test]
fn the_taint_of_karpenters_termination_after_nodekeepers_own_retire_changes_nothing() {
    let mut c = cfg();
    c.repair.steps = vec![RepairStep::Drain, RepairStep::Replace];
    let (mut v, now) = failing("pool", 11);
    let ds = run(&v, &c, now);
    apply(&mut v, &ds);
    finish_drain(&mut v, "a");
    let ds = run(&v, &c, now + mins(1));
    assert!(has(&of(&ds, "a"), is_replacement));
    apply(&mut v, &ds);
    // Karpenter terminates the NodeClaim nodekeeper is handing over: its termination taints the node.
    node_mut(&mut v, "a").taints.push(disrupted_taint());
    let acts = of(&run(&v, &c, now + mins(2)), "a");
    assert!(!has(&acts, |x| matches!(x, Action::Uncordon)), "{acts:#?}");
    assert_eq!(hold_of(&acts), None, "{acts:#?}");
    assert_eq!(count(&acts, is_replacement), 0, "never twice");
    assert_eq!(
        Reason::BlockedByKarpenter.as_str(),
        Blocker::KarpenterDisrupting.reason()
    );
}

/// Karpenter's in-place reboot (`RebootNode`, v1.15) taints the node `karpenter.sh/rebooting`
/// before its drain: nodekeeper stands back as from `karpenter.sh/disrupted` (held and said, a
/// repair of its own stopped), counts it against the budget, and acts again once it is lifted.
#[test]
fn karpenters_reboot_in_place_is_stood_back_from_like_its_replacement() {
    let rebooting = TaintView {
        key: KARPENTER_REBOOTING_TAINT.into(),
        value: String::new(),
        effect: "NoSchedule".into(),
    };
    // Held, with the Event, once unhealthy; not a repair.
    let (mut v, now) = failing("pool", 11);
    node_mut(&mut v, "a").taints.push(rebooting.clone());
    let acts = of(&run(&v, &cfg(), now), "a");
    assert!(!starts_repair(&acts), "{acts:#?}");
    assert_eq!(hold_of(&acts), Some(Blocker::KarpenterDisrupting));
    // A repair of nodekeeper's own, still draining, is stopped when Karpenter starts rebooting.
    let (mut v, now) = failing("pool", 11);
    let ds = run(&v, &cfg(), now);
    apply(&mut v, &ds);
    assert!(starts_repair(&of(&ds, "a")));
    node_mut(&mut v, "a").taints.push(rebooting.clone());
    let acts = of(&run(&v, &cfg(), now + mins(1)), "a");
    assert!(has(&acts, |x| matches!(x, Action::StopDrain)), "{acts:#?}");
    assert!(has(&acts, |x| matches!(x, Action::Uncordon)), "{acts:#?}");
    // Counted against the budget (one node per group): another failing node waits.
    let (mut v, now) = failing("pool", 11);
    node_mut(&mut v, "a").taints.push(rebooting);
    ready(node_mut(&mut v, "b"), "False", now - mins(11));
    let mut c = cfg();
    c.budgets.default = budgets(r#"[{ nodes = "1" }]"#);
    c.repair.max_unhealthy = nodekeeper_core::controller::policy::config::Quantity::Percent(50);
    let acts = of(&run(&v, &c, now), "b");
    assert!(!starts_repair(&acts), "{acts:#?}");
    assert!(
        matches!(hold_of(&acts), Some(Blocker::Budget { .. })),
        "{acts:#?}"
    );
    // The reboot over (taint lifted) and still failing: nodekeeper's own repair may start.
    let (v, now) = failing("pool", 11);
    assert!(starts_repair(&of(&run(&v, &cfg(), now), "a")));
}

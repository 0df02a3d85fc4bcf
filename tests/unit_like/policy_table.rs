//! Table tests: one rule each (interruption, budgets with windows and time zones, repair
//! escalation, short-circuit, flap guard, startup timeout, explain, restart, dry-run).

use crate::support::policy as policy_support;

use nodekeeper_core::controller::catalog::{EventType, Reason};
use nodekeeper_core::controller::policy::config::{Quantity, RepairStep};
use nodekeeper_core::controller::policy::explain::{Blocker, Held};
use nodekeeper_core::controller::policy::view::{keys, DrainPhase, NoticeKind, PodView};
use nodekeeper_core::controller::policy::Action;
use policy_support::*;

#[test]
fn preemption_taints_cordons_excludes_drains_and_replaces_in_one_decision() {
    let now = monday();
    let mut n = node("a", "spot", now);
    let at = now + chrono::Duration::seconds(120);
    n.notices
        .push(notice("ev1", NoticeKind::Preemption, Some(at), now));
    let v = view(vec![n, node("b", "spot", now)]);
    let ds = run(&v, &cfg(), now);
    let a = of(&ds, "a");
    let pos = |f: &dyn Fn(&Action) -> bool| a.iter().position(f).unwrap();
    let taint = pos(
        &|x| matches!(x, Action::Taint { key, value, effect } if key == "nodekeeper.io/interruption" && value == "preemption" && effect == "NoSchedule"),
    );
    let cordon = pos(&|x| matches!(x, Action::Cordon));
    let owner = pos(
        &|x| matches!(x, Action::Annotate { key, value: Some(v) } if key == keys::CORDONED_BY && v == "nodekeeper"),
    );
    let label = pos(
        &|x| matches!(x, Action::Label { key, value: Some(_) } if key == "node.kubernetes.io/exclude-from-external-load-balancers"),
    );
    let drain = pos(
        &|x| matches!(x, Action::StartDrain { deadline, .. } if *deadline == at - chrono::Duration::seconds(15)),
    );
    let repl_mark = pos(
        &|x| matches!(x, Action::Annotate { key, value: Some(_) } if key == keys::REPLACEMENT_REQUESTED),
    );
    let repl = pos(&|x| is_replacement(x));
    assert!(
        owner < cordon,
        "ownership recorded before the cordon: {a:#?}"
    );
    assert!(repl_mark < repl, "replacement recorded before the request");
    assert!(taint < drain && cordon < drain && label < drain);
    // The NodePool's other node is only fenced from Karpenter's voluntary disruptions meanwhile.
    let b = of(&ds, "b");
    assert_eq!(b.len(), 2, "{ds:#?}");
    assert!(
        b.iter()
            .all(|x| matches!(x, Action::Annotate { key, value: Some(_) }
            if key == keys::DO_NOT_DISRUPT_BY || key == keys::KARPENTER_DO_NOT_DISRUPT)),
        "{ds:#?}"
    );
}

#[test]
fn notice_without_time_uses_default_lead() {
    let now = monday();
    let mut n = node("a", "", now);
    n.notices
        .push(notice("ev", NoticeKind::Termination, None, now));
    let ds = run(&view(vec![n]), &cfg(), now);
    let want = now + chrono::Duration::seconds(120 - 15);
    assert!(has(
        &of(&ds, "a"),
        |x| matches!(x, Action::StartDrain { deadline, .. } if *deadline == want)
    ));
}

#[test]
fn rebalance_cordons_only_and_cancellation_undoes_it() {
    let now = monday();
    let mut v = view(vec![node("a", "", now)]);
    node_mut(&mut v, "a")
        .notices
        .push(notice("rb", NoticeKind::Rebalance, None, now));
    let ds = run(&v, &cfg(), now);
    let a = of(&ds, "a");
    assert!(has(&a, |x| matches!(x, Action::Cordon)));
    assert!(!has(&a, |x| matches!(
        x,
        Action::Taint { .. } | Action::StartDrain { .. } | Action::Label { .. }
    )));
    assert!(!has(&a, is_replacement));
    apply(&mut v, &ds);
    assert_eq!(state(get(&v, "a")), Some("cordoned"));
    node_mut(&mut v, "a").notices.push(notice(
        "c",
        NoticeKind::Cancelled { of: "rb".into() },
        None,
        now + mins(1),
    ));
    let ds = run(&v, &cfg(), now + mins(1));
    assert!(has(&of(&ds, "a"), |x| matches!(x, Action::Uncordon)));
    apply(&mut v, &ds);
    let n = get(&v, "a");
    assert!(!n.unschedulable);
    // only the handled notice's id stays, so that it is never handled twice
    assert_eq!(n.annotations.len(), 1, "{:?}", n.annotations);
    assert!(n
        .annotation(keys::INTERRUPTION)
        .unwrap()
        .starts_with("rebalance/rb/"));
    assert!(run(&v, &cfg(), now + mins(2)).is_empty());
}

#[test]
fn cancellation_never_undoes_an_admin_cordon() {
    let now = monday();
    let mut n = node("a", "", now);
    n.unschedulable = true; // admin cordon, before the notice
    n.notices.push(notice(
        "ev",
        NoticeKind::Maintenance,
        Some(now + mins(30)),
        now,
    ));
    let mut v = view(vec![n]);
    let ds = run(&v, &cfg(), now);
    let a = of(&ds, "a");
    assert!(!has(&a, |x| matches!(x, Action::Cordon)));
    assert!(!has(
        &a,
        |x| matches!(x, Action::Annotate { key, .. } if key == keys::CORDONED_BY)
    ));
    assert!(has(&a, |x| matches!(x, Action::Taint { .. })));
    apply(&mut v, &ds);
    node_mut(&mut v, "a").notices.push(notice(
        "x",
        NoticeKind::Cancelled { of: "ev".into() },
        None,
        now,
    ));
    let ds = run(&v, &cfg(), now + mins(2));
    let a = of(&ds, "a");
    assert!(has(&a, |x| matches!(x, Action::Untaint { .. })));
    assert!(!has(&a, |x| matches!(x, Action::Uncordon)), "{a:#?}");
    apply(&mut v, &ds);
    assert!(get(&v, "a").unschedulable);
}

#[test]
fn interruptions_are_not_gated_but_counted() {
    let now = monday();
    let mut c = cfg();
    c.budgets.default = budgets(r#"[{ nodes = "1" }]"#);
    let mut a = node("a", "", now);
    a.notices.push(notice(
        "ev",
        NoticeKind::Preemption,
        Some(now + mins(2)),
        now,
    ));
    let mut b = node("b", "", now);
    ready(&mut b, "False", now - mins(11));
    let mut d = node("d", "", now);
    d.notices.push(notice(
        "ev2",
        NoticeKind::Termination,
        Some(now + mins(2)),
        now,
    ));
    let ds = run(&view(vec![a, b, d]), &c, now);
    // both interruptions proceed past a budget of 1 ...
    assert!(has(&of(&ds, "a"), |x| matches!(
        x,
        Action::StartDrain { .. }
    )));
    assert!(has(&of(&ds, "d"), |x| matches!(
        x,
        Action::StartDrain { .. }
    )));
    // ... and they use it up: the repair waits.
    let held = of(&ds, "b");
    assert!(
        has(&held, |x| matches!(
            x,
            Action::Hold(Held {
                blocker: Blocker::Budget { disrupting: 2, .. },
                ..
            })
        )),
        "{held:#?}"
    );
}

/// Nodes Karpenter has chosen to disrupt (taint `karpenter.sh/disrupted`) use up the budget
/// like nodekeeper's own disruptions: (tainted nodes, budget, repairs started, `disrupting`
/// in the blocker of the held one).
#[test]
fn karpenter_disrupted_taint_counts_against_the_budget() {
    use nodekeeper_core::controller::policy::view::{TaintView, KARPENTER_DISRUPTED_TAINT};
    let table: [(&[&str], &str, usize, Option<usize>); 5] = [
        (&[], r#"[{ nodes = "1" }]"#, 1, Some(1)),
        (&["c"], r#"[{ nodes = "1" }]"#, 0, Some(1)),
        (&["c"], r#"[{ nodes = "2" }]"#, 1, Some(2)),
        (&["c", "d"], r#"[{ nodes = "2" }]"#, 0, Some(2)),
        // 50% of 4 nodes = 2: one taken by Karpenter, one left for the earlier failure
        (&["d"], r#"[{ nodes = "50%" }]"#, 1, Some(2)),
    ];
    for (tainted, list, started, disrupting) in table {
        let now = monday();
        let mut c = cfg();
        c.repair.max_unhealthy = Quantity::Percent(100);
        c.budgets.default = budgets(list);
        let mut a = node("a", "", now);
        ready(&mut a, "False", now - mins(12));
        let mut b = node("b", "", now);
        ready(&mut b, "False", now - mins(11));
        let mut nodes = vec![a, b, node("c", "", now), node("d", "", now)];
        for n in nodes
            .iter_mut()
            .filter(|n| tainted.contains(&n.name.as_str()))
        {
            n.taints.push(TaintView {
                key: KARPENTER_DISRUPTED_TAINT.into(),
                value: String::new(),
                effect: "NoSchedule".into(),
            });
        }
        let ds = run(&view(nodes), &c, now);
        let starts = ["a", "b"]
            .iter()
            .filter(|n| has(&of(&ds, n), |x| matches!(x, Action::StartDrain { .. })))
            .count();
        assert_eq!(starts, started, "{tainted:?} {list}");
        let held = ds.iter().find_map(|d| match &d.action {
            Action::Hold(Held {
                blocker: Blocker::Budget { disrupting, .. },
                ..
            }) => Some(*disrupting),
            _ => None,
        });
        assert_eq!(held, disrupting, "{tainted:?} {list}");
    }
}

#[test]
fn repair_starts_at_toleration_expiry_not_before() {
    let now = monday();
    let mut n = node("a", "", now);
    ready(&mut n, "False", now - mins(9));
    let v = view(vec![
        n.clone(),
        node("b", "", now),
        node("c", "", now),
        node("d", "", now),
        node("e", "", now),
    ]);
    assert!(run(&v, &cfg(), now).is_empty());
    let later = now + mins(1);
    let ds = run(&v, &cfg(), later);
    let a = of(&ds, "a");
    assert!(has(&a, |x| matches!(x, Action::Cordon)));
    assert!(has(
        &a,
        |x| matches!(x, Action::StartDrain { deadline, .. } if *deadline == later + mins(15))
    ));
    assert!(
        !has(&a, is_replacement),
        "graceful first: drain before replace"
    );
}

#[test]
fn budget_one_holds_the_second_failing_node_until_the_first_finishes() {
    let now = monday();
    let mut c = cfg();
    c.repair.max_unhealthy = Quantity::Percent(100);
    c.budgets.default = budgets(r#"[{ nodes = "1" }]"#);
    let mut a = node("a", "", now);
    ready(&mut a, "False", now - mins(12));
    let mut b = node("b", "", now);
    ready(&mut b, "False", now - mins(11));
    let mut v = view(vec![a, b, node("c", "", now)]);
    let ds = run(&v, &c, now);
    assert!(
        has(&of(&ds, "a"), |x| matches!(x, Action::StartDrain { .. })),
        "earliest expiry first"
    );
    let hb = of(&ds, "b");
    let blocker = hb.iter().find_map(|x| match x {
        Action::Hold(h) => Some(h.blocker.clone()),
        _ => None,
    });
    assert_eq!(
        blocker,
        Some(Blocker::Budget {
            group: String::new(),
            budget: 0,
            nodes: "1".into(),
            disrupting: 1,
            total: 3,
            opens_at: None,
            timezone: None,
            nodepool: None,
        })
    );
    apply(&mut v, &ds);
    assert!(run(&v, &c, now).is_empty(), "fixpoint");
    // a drains, is replaced and disappears
    finish_drain(&mut v, "a");
    let ds = run(&v, &c, now + mins(1));
    assert!(has(&of(&ds, "a"), is_replacement));
    apply(&mut v, &ds);
    v.nodes.retain(|n| n.name != "a");
    let ds = run(&v, &c, now + mins(2));
    let hb = of(&ds, "b");
    assert!(
        has(&hb, |x| matches!(x, Action::StartDrain { .. })),
        "{hb:#?}"
    );
    assert!(has(
        &hb,
        |x| matches!(x, Action::Annotate { key, value: None } if key == keys::BLOCKED)
    ));
}

#[test]
fn window_closed_in_shanghai_but_open_in_utc_holds_and_says_when_it_opens() {
    // Repairs blocked 23:00–09:00 local time.
    let now = t("2026-11-30T16:00:00Z"); // 00:00 Tuesday in Shanghai
    let mut c = cfg();
    let mut n = node("a", "", now);
    ready(&mut n, "False", now - mins(30));
    let nodes = vec![
        n,
        node("b", "", now),
        node("c", "", now),
        node("d", "", now),
        node("e", "", now),
    ];
    c.budgets.default = budgets(
        r#"[{ nodes = "10%" }, { nodes = "0", schedule = "0 23 * * *", duration = "10h", timezone = "Asia/Shanghai", reasons = ["repair"] }]"#,
    );
    let ds = run(&view(nodes.clone()), &c, now);
    let a = of(&ds, "a");
    let held = a.iter().find_map(|x| match x {
        Action::Hold(h) => Some(h.clone()),
        _ => None,
    });
    let held = held.expect("held");
    match &held.blocker {
        Blocker::Budget {
            budget, opens_at, ..
        } => {
            assert_eq!(*budget, 1);
            assert_eq!(
                *opens_at,
                Some(t("2026-12-01T01:00:00Z")),
                "09:00 in Shanghai"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(
        held.blocker.message().contains("2026-12-01 09:00 CST"),
        "{}",
        held.blocker.message()
    );
    assert!(has(&a, |x| matches!(
        x,
        Action::Event {
            type_: EventType::Warning,
            reason: Reason::BlockedByBudget,
            ..
        }
    )));
    // the same budget read in UTC is not active at 16:00 UTC
    c.budgets.default[1].timezone = Some("UTC".into());
    let ds = run(&view(nodes), &c, now);
    assert!(has(&of(&ds, "a"), |x| matches!(
        x,
        Action::StartDrain { .. }
    )));
}

#[test]
fn per_reason_budget_does_not_gate_other_reasons() {
    let now = monday();
    let mut c = cfg();
    c.interruption.actions.rebalance =
        nodekeeper_core::controller::policy::config::InterruptionAction::Drain;
    c.budgets.default = budgets(r#"[{ nodes = "0", reasons = ["repair"] }]"#);
    let mut a = node("a", "", now);
    a.notices
        .push(notice("rb", NoticeKind::Rebalance, None, now));
    let mut b = node("b", "", now);
    ready(&mut b, "False", now - mins(20));
    let ds = run(
        &view(vec![
            a,
            b,
            node("c", "", now),
            node("d", "", now),
            node("e", "", now),
        ]),
        &c,
        now,
    );
    assert!(
        has(&of(&ds, "a"), |x| matches!(x, Action::StartDrain { .. })),
        "rebalance not limited by a repair-only budget"
    );
    assert!(has(&of(&ds, "b"), |x| matches!(x, Action::Hold(_))));
}

#[test]
fn short_circuit_holds_repairs_above_max_unhealthy() {
    let now = monday();
    let mk = |c: &nodekeeper_core::controller::policy::PolicyConfig| {
        let mut nodes: Vec<_> = (0..5).map(|i| node(&format!("n{i}"), "g", now)).collect();
        ready(&mut nodes[0], "False", now - mins(20));
        ready(&mut nodes[1], "False", now - mins(20));
        run(&view(nodes), c, now)
    };
    let mut c = cfg();
    c.budgets.default = budgets(r#"[{ nodes = "100%" }]"#);
    let ds = mk(&c); // 2 of 5 unhealthy > ceil(20% of 5) = 1
    for n in ["n0", "n1"] {
        let a = of(&ds, n);
        assert!(
            has(&a, |x| matches!(
                x,
                Action::Hold(Held {
                    blocker: Blocker::ShortCircuit {
                        unhealthy: 2,
                        total: 5,
                        ..
                    },
                    ..
                })
            )),
            "{a:#?}"
        );
        assert!(has(&a, |x| matches!(
            x,
            Action::Event {
                reason: Reason::RepairShortCircuited,
                ..
            }
        )));
        assert!(!has(&a, |x| matches!(x, Action::Cordon)));
    }
    c.repair.max_unhealthy = Quantity::Count(2);
    let ds = mk(&c);
    assert!(has(&of(&ds, "n0"), |x| matches!(x, Action::Cordon)));
    assert!(has(&of(&ds, "n1"), |x| matches!(x, Action::Cordon)));
}

#[test]
fn flap_guard_ends_a_repair_only_after_healthy_delay() {
    let now = monday();
    let mut n = node("a", "", now);
    ready(&mut n, "False", now - mins(20));
    let mut v = view(vec![
        n,
        node("b", "", now),
        node("c", "", now),
        node("d", "", now),
        node("e", "", now),
    ]);
    let ds = run(&v, &cfg(), now);
    apply(&mut v, &ds);
    assert_eq!(state(get(&v, "a")), Some("repairing"));
    ready(node_mut(&mut v, "a"), "True", now + mins(1));
    let ds = run(&v, &cfg(), now + mins(2));
    assert!(of(&ds, "a").is_empty(), "healthy only 1m < 2m: {ds:#?}");
    let ds = run(&v, &cfg(), now + mins(3));
    let a = of(&ds, "a");
    assert!(has(&a, |x| matches!(x, Action::StopDrain)));
    assert!(has(&a, |x| matches!(x, Action::Uncordon)));
    assert!(has(&a, |x| matches!(
        x,
        Action::Event {
            reason: Reason::RepairCancelled,
            ..
        }
    )));
    apply(&mut v, &ds);
    assert_eq!(state(get(&v, "a")), None);
    assert!(!get(&v, "a").unschedulable);
    assert!(!get(&v, "a")
        .labels
        .contains_key("node.kubernetes.io/exclude-from-external-load-balancers"));
}

#[test]
fn escalation_drain_reboot_replace_with_timeouts() {
    let now = monday();
    let mut c = cfg();
    c.repair.steps = vec![RepairStep::Drain, RepairStep::Reboot, RepairStep::Replace];
    let mut n = node("a", "", now);
    ready(&mut n, "False", now - mins(20));
    let mut v = view(vec![
        n,
        node("b", "", now),
        node("c", "", now),
        node("d", "", now),
        node("e", "", now),
    ]);
    let ds = run(&v, &c, now);
    apply(&mut v, &ds);
    // drain not finished, timeout not reached: nothing new
    assert!(run(&v, &c, now + mins(5)).is_empty());
    // drain timed out (15m) → reboot, with the boot id recorded
    let ds = run(&v, &c, now + mins(15));
    let a = of(&ds, "a");
    assert!(
        has(&a, |x| matches!(x, Action::RequestReboot { .. })),
        "{a:#?}"
    );
    assert!(has(
        &a,
        |x| matches!(x, Action::Annotate { key, value: Some(v) } if key == keys::REBOOT_REQUESTED && v == "boot-0")
    ));
    apply(&mut v, &ds);
    assert_eq!(get(&v, "a").annotation(keys::REPAIR_STEP), Some("reboot"));
    assert!(run(&v, &c, now + mins(16)).is_empty(), "no second reboot");
    // rebooted (new boot id) but still NotReady after reboot_timeout (10m) → replace
    node_mut(&mut v, "a").boot_id = Some("boot-1".into());
    let ds = run(&v, &c, now + mins(25));
    assert_eq!(count(&of(&ds, "a"), is_replacement), 1);
    apply(&mut v, &ds);
    let ds = run(&v, &c, now + mins(26));
    assert_eq!(count(&of(&ds, "a"), is_replacement), 0, "never twice");
    // still present long after: explained
    let ds = run(&v, &c, now + mins(25 + 31));
    assert!(has(&of(&ds, "a"), |x| matches!(
        x,
        Action::Hold(Held {
            blocker: Blocker::ReplacementPending { .. },
            ..
        })
    )));
}

#[test]
fn reboot_that_heals_ends_the_repair() {
    let now = monday();
    let mut c = cfg();
    c.repair.steps = vec![RepairStep::Reboot, RepairStep::Replace];
    let mut n = node("a", "", now);
    ready(&mut n, "False", now - mins(20));
    let mut v = view(vec![
        n,
        node("b", "", now),
        node("c", "", now),
        node("d", "", now),
        node("e", "", now),
    ]);
    let ds = run(&v, &c, now);
    assert!(has(&of(&ds, "a"), |x| matches!(
        x,
        Action::RequestReboot { .. }
    )));
    apply(&mut v, &ds);
    node_mut(&mut v, "a").boot_id = Some("boot-1".into());
    ready(node_mut(&mut v, "a"), "True", now + mins(3));
    let ds = run(&v, &c, now + mins(6));
    let a = of(&ds, "a");
    assert!(has(&a, |x| matches!(x, Action::Uncordon)), "{a:#?}");
    assert!(!has(&a, is_replacement));
}

#[test]
fn drain_blocked_by_pdb_is_explained_with_pod_and_pdb() {
    let now = monday();
    let mut n = node("a", "", now);
    ready(&mut n, "False", now - mins(20));
    let mut v = view(vec![
        n,
        node("b", "", now),
        node("c", "", now),
        node("d", "", now),
        node("e", "", now),
    ]);
    let ds = run(&v, &cfg(), now);
    apply(&mut v, &ds);
    let d = &mut node_mut(&mut v, "a").drain;
    d.phase = DrainPhase::Running;
    d.blocker = Some(PodView {
        namespace: "shop".into(),
        name: "web-0".into(),
        blocking_pdb: Some("shop/web".into()),
        do_not_disrupt: false,
    });
    let ds = run(&v, &cfg(), now + mins(1));
    let held = of(&ds, "a").into_iter().find_map(|x| match x {
        Action::Hold(h) => Some(h),
        _ => None,
    });
    let held = held.expect("held");
    assert_eq!(
        held.blocker,
        Blocker::Pdb {
            pod: "shop/web-0".into(),
            pdb: "shop/web".into(),
            deadline: Some(now + mins(15)),
        }
    );
    apply(&mut v, &ds);
    let back = Held::decode(get(&v, "a").annotation(keys::BLOCKED).unwrap()).unwrap();
    assert_eq!(back, held);
    assert!(
        run(&v, &cfg(), now + mins(2)).is_empty(),
        "same blocker: no new event"
    );
}

#[test]
fn startup_timeout_replaces_then_holds_after_max_retries() {
    let now = monday();
    let mut n = node("new", "", now);
    n.created_at = now - mins(11);
    n.became_ready = false;
    let created = n.created_at;
    ready(&mut n, "False", created);
    let ds = run(&view(vec![n.clone()]), &cfg(), now);
    let a = of(&ds, "new");
    assert!(
        has(&a, |x| matches!(
            x,
            Action::RequestReplacement {
                startup_retries: 1,
                ..
            }
        )),
        "{a:#?}"
    );
    assert!(has(&a, |x| matches!(
        x,
        Action::Event {
            reason: Reason::StartupTimeout,
            ..
        }
    )));
    // a node 9 minutes old is left alone (and not repaired by policy either)
    let mut young = n.clone();
    young.created_at = now - mins(9);
    assert!(run(&view(vec![young]), &cfg(), now).is_empty());
    // third retry exhausted
    n.annotations
        .insert(keys::STARTUP_RETRIES.into(), "3".into());
    let ds = run(&view(vec![n]), &cfg(), now);
    let a = of(&ds, "new");
    assert!(!has(&a, is_replacement));
    assert!(has(&a, |x| matches!(
        x,
        Action::Hold(Held {
            blocker: Blocker::StartupRetries { retries: 3, max: 3 },
            ..
        })
    )));
    assert!(has(&a, |x| matches!(
        x,
        Action::Event {
            type_: EventType::Warning,
            reason: Reason::StartupRetriesExhausted,
            ..
        }
    )));
}

#[test]
fn restarted_controller_resumes_without_repeating_the_replacement() {
    let now = monday();
    let mut n = node("a", "spot", now);
    n.notices.push(notice(
        "ev",
        NoticeKind::Preemption,
        Some(now + mins(2)),
        now,
    ));
    let mut v = view(vec![n]);
    let ds = run(&v, &cfg(), now);
    apply(&mut v, &ds);
    // the controller restarts: the drain engine's in-memory state is gone, the notice was acked
    let a = node_mut(&mut v, "a");
    a.drain.phase = DrainPhase::Idle;
    a.notices.clear();
    let ds = run(&v, &cfg(), now + chrono::Duration::seconds(20));
    let acts = of(&ds, "a");
    assert!(
        has(
            &acts,
            |x| matches!(x, Action::StartDrain { deadline, .. } if *deadline == now + mins(2) - chrono::Duration::seconds(15))
        ),
        "{acts:#?}"
    );
    assert!(!has(&acts, is_replacement));
    assert!(!has(&acts, |x| matches!(
        x,
        Action::Cordon | Action::Taint { .. }
    )));
}

#[test]
fn orphan_cordon_is_removed_but_admin_cordon_is_not() {
    let now = monday();
    let mut orphan = node("o", "", now);
    orphan.unschedulable = true;
    orphan
        .annotations
        .insert(keys::CORDONED_BY.into(), "nodekeeper".into());
    let mut admin = node("adm", "", now);
    admin.unschedulable = true;
    let ds = run(&view(vec![orphan, admin]), &cfg(), now);
    assert!(has(&of(&ds, "o"), |x| matches!(x, Action::Uncordon)));
    assert!(of(&ds, "adm").is_empty());
}

#[test]
fn interrupted_node_that_survives_is_released() {
    let now = monday();
    let mut n = node("a", "", now);
    n.notices.push(notice(
        "m",
        NoticeKind::Maintenance,
        Some(now + mins(5)),
        now,
    ));
    let mut v = view(vec![n]);
    let ds = run(&v, &cfg(), now);
    apply(&mut v, &ds);
    finish_drain(&mut v, "a");
    assert!(run(&v, &cfg(), now + mins(10)).is_empty());
    let ds = run(&v, &cfg(), now + mins(20));
    let a = of(&ds, "a");
    assert!(
        has(&a, |x| matches!(x, Action::Uncordon))
            && has(&a, |x| matches!(x, Action::Untaint { .. }))
    );
    assert!(has(&a, |x| matches!(
        x,
        Action::Event {
            reason: Reason::InterruptionReleased,
            ..
        }
    )));
}

#[test]
fn dry_run_produces_the_same_decisions_marked() {
    let now = monday();
    let mut a = node("a", "", now);
    a.notices.push(notice(
        "ev",
        NoticeKind::Preemption,
        Some(now + mins(2)),
        now,
    ));
    let mut b = node("b", "", now);
    ready(&mut b, "False", now - mins(20));
    let v = view(vec![a, b, node("c", "", now)]);
    let mut dry = cfg();
    dry.controller.dry_run = true;
    let real = run(&v, &cfg(), now);
    let sim = run(&v, &dry, now);
    assert!(!real.is_empty());
    assert!(real.iter().all(|d| !d.dry_run));
    assert!(sim.iter().all(|d| d.dry_run));
    let strip = |ds: Vec<nodekeeper_core::controller::policy::Decision>| -> Vec<_> {
        ds.into_iter().map(|d| (d.node, d.action)).collect()
    };
    assert_eq!(strip(real), strip(sim));
}

#[test]
fn group_status_reports_budget_use_and_short_circuit_per_group() {
    use nodekeeper_core::controller::policy::{decide_with_status, GroupStatus};
    let now = monday();
    let mut c = cfg();
    c.budgets.default = budgets(r#"[{ nodes = "1" }]"#);
    let mut nodes: Vec<_> = (0..5)
        .map(|i| node(&format!("s{i}"), "spot", now))
        .collect();
    ready(&mut nodes[0], "False", now - mins(20));
    ready(&mut nodes[1], "False", now - mins(20));
    let mut od = node("o0", "od", now);
    ready(&mut od, "False", now - mins(20));
    nodes.push(od);
    nodes.push(node("o1", "od", now));
    let (ds, st) = decide_with_status(&view(nodes), &c, now);
    assert_eq!(
        st,
        vec![
            GroupStatus {
                group: "od".into(),
                total: 2,
                counted: 1,
                repair_limit: Some(1),
                unhealthy: 1,
                short_circuited: false,
            },
            GroupStatus {
                group: "spot".into(),
                total: 5,
                // short-circuited NotReady nodes wait for no slot: counted
                counted: 2,
                repair_limit: Some(1),
                unhealthy: 2,
                short_circuited: true,
            },
        ]
    );
    assert!(has(&of(&ds, "o0"), |x| matches!(x, Action::Cordon)));
}

#[test]
fn absurd_durations_do_not_panic() {
    let now = monday();
    let mut c = cfg();
    c.repair.policy[0].toleration = std::time::Duration::from_secs(u64::MAX / 2);
    c.repair.drain_timeout = std::time::Duration::from_secs(u64::MAX / 2);
    c.interruption.safety_margin = std::time::Duration::from_secs(u64::MAX / 2);
    c.interruption.release_after = std::time::Duration::from_secs(u64::MAX / 2);
    let mut a = node("a", "", now);
    ready(&mut a, "False", now - mins(20));
    let mut b = node("b", "", now);
    b.notices
        .push(notice("e", NoticeKind::Preemption, Some(now), now));
    let ds = run(&view(vec![a, b]), &c, now);
    assert!(of(&ds, "a").is_empty(), "toleration never expires");
    assert!(has(&of(&ds, "b"), |x| matches!(
        x,
        Action::StartDrain { .. }
    )));
    let huge = budgets(r#"[{ nodes = "0", schedule = "@daily", duration = "100000y" }]"#);
    let mut c = cfg();
    c.budgets.default = huge.clone();
    let diags = c.validate();
    assert!(
        diags.iter().any(|d| d.message.contains("10 years")),
        "{diags:?}"
    );
}

#[test]
fn fast_path_decides_a_fresh_notice_alone_and_defers_what_a_budget_gates() {
    use nodekeeper_core::controller::policy::config::InterruptionAction;
    use nodekeeper_core::controller::policy::decide_interruption;
    let now = monday();
    let mut a = node("a", "spot", now);
    a.notices.push(notice(
        "ev1",
        NoticeKind::Preemption,
        Some(now + mins(2)),
        now,
    ));
    let v = view(vec![a.clone(), node("b", "spot", now)]);
    let fast = decide_interruption(&a, &cfg(), now).expect("a preemption is decided alone");
    assert_eq!(fast, of(&run(&v, &cfg(), now), "a"));
    assert!(
        has(&fast, |x| matches!(x, Action::Taint { .. }))
            && has(&fast, |x| matches!(x, Action::Cordon))
    );
    // Nothing to do for a node without notices; a rebalance drain waits for its budget.
    assert_eq!(
        decide_interruption(&node("b", "spot", now), &cfg(), now),
        None
    );
    let mut c = cfg();
    c.interruption.actions.rebalance = InterruptionAction::Drain;
    let mut r = node("r", "spot", now);
    r.notices
        .push(notice("ev2", NoticeKind::Rebalance, None, now));
    assert_eq!(decide_interruption(&r, &c, now), None);
}

#[test]
fn a_notice_counts_as_recorded_once_its_annotation_is_stored() {
    use nodekeeper_core::controller::policy::interruption::notice_recorded;
    let now = monday();
    let mut a = node("a", "spot", now);
    let pre = notice("ev1", NoticeKind::Preemption, Some(now + mins(5)), now);
    a.notices.push(pre.clone());
    let mut v = view(vec![a]);
    assert!(!notice_recorded(get(&v, "a"), &pre, &cfg()));
    let ds = run(&v, &cfg(), now);
    apply(&mut v, &ds);
    assert!(notice_recorded(get(&v, "a"), &pre, &cfg()));
    // A later, weaker notice is accounted for by the recorded one.
    let later = notice("ev2", NoticeKind::Maintenance, Some(now + mins(60)), now);
    assert!(notice_recorded(get(&v, "a"), &later, &cfg()));
    // A cancellation counts once nodekeeper let go of the node.
    let cancel = notice("ev3", NoticeKind::Cancelled { of: "ev1".into() }, None, now);
    assert!(!notice_recorded(get(&v, "a"), &cancel, &cfg()));
    v.nodes[0].notices.push(cancel.clone());
    let ds = run(&v, &cfg(), now);
    apply(&mut v, &ds);
    assert!(notice_recorded(get(&v, "a"), &cancel, &cfg()));
}

#[test]
fn seen_ready_is_written_for_young_ready_nodes_only_and_read_back() {
    use nodekeeper_core::controller::policy::view::{became_ready, condition};
    let now = monday();
    let mut young = node("y", "", now);
    young.created_at = now - chrono::Duration::seconds(30);
    assert!(young.needs_seen_ready(now));
    let old = node("o", "", now);
    assert!(!old.needs_seen_ready(now), "old nodes are never written");
    let mut failed = young.clone();
    ready(&mut failed, "False", now);
    assert!(!failed.needs_seen_ready(now), "only while Ready");
    // Ready=False 30 s after creation: never Ready by the heuristic, Ready once by the record.
    let c = condition("Ready", "False", now);
    assert!(!became_ready(
        young.created_at,
        Some(&c),
        &young.annotations
    ));
    young
        .annotations
        .insert(keys::SEEN_READY.into(), now.to_rfc3339());
    assert!(became_ready(young.created_at, Some(&c), &young.annotations));
    assert!(!young.needs_seen_ready(now), "written once");
}

#[test]
fn next_expiry_is_the_earliest_running_toleration_and_decide_starts_the_repair_then() {
    use nodekeeper_core::controller::policy::repair::next_expiry;
    let now = monday();
    let c = cfg(); // Ready=False for 10 minutes
    let mut a = node("a", "", now);
    ready(&mut a, "False", now - mins(3));
    let mut b = node("b", "", now);
    ready(&mut b, "False", now - mins(5));
    let mut expired = node("expired", "", now);
    ready(&mut expired, "False", now - mins(20));
    let mut repairing = node("repairing", "", now);
    ready(&mut repairing, "False", now - mins(9));
    repairing
        .annotations
        .insert(keys::STATE.into(), "repairing".into());
    let v = view(vec![
        a,
        b.clone(),
        expired,
        repairing,
        node("healthy", "", now),
    ]);
    let next = next_expiry(&v, &c, now).unwrap();
    let due = next.at;
    assert_eq!(due, now + mins(5), "b's toleration ends first");
    assert_eq!(next.groups, [String::new()].into(), "b's group (no label)");
    // (b among healthy nodes: no budget or short-circuit in the way.)
    let healthy = (0..4).map(|i| node(&format!("h{i}"), "", now));
    let alone = view(std::iter::once(b).chain(healthy).collect());
    assert_eq!(next_expiry(&alone, &c, now).map(|d| d.at), Some(due));
    let starts = |t| {
        has(&of(&run(&alone, &c, t), "b"), |x| {
            matches!(x, Action::Cordon)
        })
    };
    assert!(!starts(due - chrono::Duration::milliseconds(1)));
    assert!(starts(due), "no repair at the expiry next_expiry named");
    // Nothing running: no wake-up; repairs off: none either.
    assert_eq!(
        next_expiry(&view(vec![node("healthy", "", now)]), &c, now),
        None
    );
    let mut off = c.clone();
    off.repair.enabled = false;
    assert_eq!(next_expiry(&v, &off, now), None);
    // The groups due: every group with a node expiring at that moment, and no other.
    let failing = |name: &str, group: &str, for_mins: i64| {
        let mut n = node(name, group, now);
        ready(&mut n, "False", now - mins(for_mins));
        n
    };
    let pools = view(vec![
        failing("x", "pool-1", 5),
        failing("y", "pool-2", 5),
        failing("z", "pool-3", 4),
        node("w", "pool-4", now),
    ]);
    let next = next_expiry(&pools, &c, now).unwrap();
    assert_eq!(next.at, now + mins(5));
    assert_eq!(
        next.groups,
        ["pool-1".to_string(), "pool-2".to_string()].into()
    );
}

/// The provider accepted the replacement (what the actor writes after `request_replacement`).
fn accept_replacement(v: &mut nodekeeper_core::controller::policy::view::ClusterView, name: &str) {
    node_mut(v, name)
        .annotations
        .insert(keys::REPLACEMENT_ACCEPTED.into(), "nk-test".into());
}

fn is_retire(a: &Action) -> bool {
    matches!(a, Action::RetireNode { .. })
}

#[test]
fn preempted_node_is_retired_only_once_its_drain_is_over() {
    let now = monday();
    let mut n = node("a", "spot", now);
    let at = now + mins(2);
    n.notices
        .push(notice("ev1", NoticeKind::Preemption, Some(at), now));
    let mut v = view(vec![n]);
    let ds = run(&v, &cfg(), now);
    assert!(!has(&of(&ds, "a"), is_retire), "not at the request");
    apply(&mut v, &ds);
    node_mut(&mut v, "a").notices.clear();
    accept_replacement(&mut v, "a");
    // Accepted, drain still running: Karpenter must not drain it too.
    let ds = run(&v, &cfg(), now + chrono::Duration::seconds(10));
    assert!(!has(&of(&ds, "a"), is_retire), "{ds:#?}");
    // Drain completed: retired once, the record first.
    finish_drain(&mut v, "a");
    let later = now + chrono::Duration::seconds(20);
    let ds = run(&v, &cfg(), later);
    let acts = of(&ds, "a");
    let mark = acts
        .iter()
        .position(|x| matches!(x, Action::Annotate { key, value: Some(_) } if key == keys::RETIRE_REQUESTED))
        .expect("retire recorded");
    let retire = acts.iter().position(is_retire).expect("retired");
    assert!(mark < retire);
    let want = format!(
        "a/{}",
        get(&v, "a")
            .annotation(keys::REPLACEMENT_REQUESTED)
            .unwrap()
    );
    assert!(
        matches!(&acts[retire], Action::RetireNode { id, reason } if *id == want && reason == "interruption:preemption"),
        "{acts:#?}"
    );
    apply(&mut v, &ds);
    let ds = run(&v, &cfg(), later + chrono::Duration::seconds(5));
    assert!(!has(&of(&ds, "a"), is_retire), "never twice: {ds:#?}");
}

#[test]
fn preempted_node_whose_drain_overruns_its_deadline_is_retired_at_the_deadline() {
    let now = monday();
    let mut n = node("a", "spot", now);
    let at = now + mins(2);
    n.notices
        .push(notice("ev1", NoticeKind::Preemption, Some(at), now));
    let mut v = view(vec![n]);
    let ds = run(&v, &cfg(), now);
    apply(&mut v, &ds);
    node_mut(&mut v, "a").notices.clear();
    accept_replacement(&mut v, "a");
    let deadline = at - chrono::Duration::seconds(15);
    let ds = run(&v, &cfg(), deadline - chrono::Duration::seconds(1));
    assert!(!has(&of(&ds, "a"), is_retire));
    let ds = run(&v, &cfg(), deadline);
    assert!(has(&of(&ds, "a"), is_retire), "{ds:#?}");
}

#[test]
fn karpenter_node_is_marked_do_not_disrupt_while_nodekeeper_acts_and_unmarked_after() {
    let now = monday();
    // A node of a Karpenter NodePool gets the mark with its ownership record; a node outside
    // Karpenter does not.
    let mut k = node("k", "spot", now);
    k.notices
        .push(notice("r1", NoticeKind::Rebalance, None, now));
    let mut plain = node("p", "", now);
    plain
        .notices
        .push(notice("r2", NoticeKind::Rebalance, None, now));
    let mut v = view(vec![k, plain]);
    let ds = run(&v, &cfg(), now);
    let acts = of(&ds, "k");
    let owner = acts.iter().position(|x| matches!(x, Action::Annotate { key, value: Some(v) } if key == keys::DO_NOT_DISRUPT_BY && v == "nodekeeper"));
    let mark = acts.iter().position(|x| matches!(x, Action::Annotate { key, value: Some(v) } if key == keys::KARPENTER_DO_NOT_DISRUPT && v == "true"));
    assert!(
        owner.is_some() && mark.is_some() && owner < mark,
        "{acts:#?}"
    );
    assert!(!has(
        &of(&ds, "p"),
        |x| matches!(x, Action::Annotate { key, .. } if key == keys::KARPENTER_DO_NOT_DISRUPT)
    ));
    apply(&mut v, &ds);
    // The recommendation is withdrawn: the mark goes with the cordon.
    for (n, of) in [("k", "r1"), ("p", "r2")] {
        let n = node_mut(&mut v, n);
        n.notices = vec![notice(
            "c",
            NoticeKind::Cancelled { of: of.into() },
            None,
            now + mins(1),
        )];
    }
    let ds = run(&v, &cfg(), now + mins(1));
    apply(&mut v, &ds);
    let k = get(&v, "k");
    assert_eq!(
        k.annotation(keys::KARPENTER_DO_NOT_DISRUPT),
        None,
        "{ds:#?}"
    );
    assert_eq!(k.annotation(keys::DO_NOT_DISRUPT_BY), None);
    assert!(!k.unschedulable);
}

#[test]
fn a_do_not_disrupt_put_by_someone_else_is_never_removed() {
    let now = monday();
    let mut k = node("k", "spot", now);
    k.annotations
        .insert(keys::KARPENTER_DO_NOT_DISRUPT.into(), "true".into());
    k.notices
        .push(notice("r1", NoticeKind::Rebalance, None, now));
    let mut v = view(vec![k]);
    let ds = run(&v, &cfg(), now);
    assert!(
        !has(
            &of(&ds, "k"),
            |x| matches!(x, Action::Annotate { key, .. } if key == keys::DO_NOT_DISRUPT_BY || key == keys::KARPENTER_DO_NOT_DISRUPT)
        ),
        "{ds:#?}"
    );
    apply(&mut v, &ds);
    node_mut(&mut v, "k").notices = vec![notice(
        "c",
        NoticeKind::Cancelled { of: "r1".into() },
        None,
        now + mins(1),
    )];
    let ds = run(&v, &cfg(), now + mins(1));
    apply(&mut v, &ds);
    assert_eq!(
        get(&v, "k").annotation(keys::KARPENTER_DO_NOT_DISRUPT),
        Some("true"),
        "{ds:#?}"
    );
}

#[test]
fn repair_replace_step_retires_the_node_once_accepted_and_not_draining() {
    let now = monday();
    let mut c = cfg();
    c.repair.steps = vec![RepairStep::Replace];
    let mut n = node("a", "pool", now);
    ready(&mut n, "False", now - mins(11));
    let mut v = view(vec![n, node("b", "pool", now), node("c", "pool", now)]);
    let ds = run(&v, &c, now);
    assert!(has(&of(&ds, "a"), is_replacement), "{ds:#?}");
    assert!(!has(&of(&ds, "a"), is_retire));
    apply(&mut v, &ds);
    let ds = run(&v, &c, now + mins(1));
    assert!(
        !has(&of(&ds, "a"), is_retire),
        "not before the provider accepted"
    );
    accept_replacement(&mut v, "a");
    let ds = run(&v, &c, now + mins(2));
    assert_eq!(count(&of(&ds, "a"), is_retire), 1, "{ds:#?}");
}

/// A policy repairing `KernelDeadlock=True` after 10 min (the node stays Ready).
fn kernel_deadlock_cfg() -> nodekeeper_core::controller::policy::PolicyConfig {
    let mut c = cfg();
    c.repair.policy = nodekeeper_core::controller::policy::config::parse_kpo_repair_policies(
        r#"[{"conditionType":"KernelDeadlock","conditionStatus":"True","tolerationDuration":600000000000}]"#,
    )
    .unwrap();
    c.repair.max_unhealthy = Quantity::Percent(50);
    c.budgets.default = budgets(r#"[{ nodes = "100%" }]"#);
    c
}

fn ready_node(
    name: &str,
    pool: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> nodekeeper_core::controller::policy::view::NodeView {
    let mut n = node(name, pool, now);
    ready(&mut n, "True", now - chrono::Duration::days(1));
    n
}

fn mark_of(
    n: &nodekeeper_core::controller::policy::view::NodeView,
) -> (Option<&str>, Option<&str>) {
    (
        n.annotation(keys::KARPENTER_DO_NOT_DISRUPT),
        n.annotation(keys::DO_NOT_DISRUPT_BY),
    )
}

#[test]
fn a_voluntary_disruption_of_a_ready_node_fences_its_nodepool_until_it_ends() {
    let now = monday();
    let c = kernel_deadlock_cfg();
    let mut a = ready_node("a", "spot", now);
    a.conditions
        .push(nodekeeper_core::controller::policy::view::condition(
            "KernelDeadlock",
            "True",
            now - mins(11),
        ));
    let mut user = ready_node("u", "spot", now);
    user.annotations
        .insert(keys::KARPENTER_DO_NOT_DISRUPT.into(), "true".into());
    let mut v = view(vec![
        a,
        ready_node("b", "spot", now),
        user,
        ready_node("d", "other", now),
        ready_node("e", "", now),
    ]);
    let ds = run(&v, &c, now);
    apply(&mut v, &ds);
    assert_eq!(state(get(&v, "a")), Some("repairing"), "{ds:#?}");
    assert_eq!(
        mark_of(get(&v, "a")),
        (Some("true"), Some("nodekeeper")),
        "its own mark"
    );
    assert_eq!(
        mark_of(get(&v, "b")),
        (Some("true"), Some("fence")),
        "fenced"
    );
    assert_eq!(
        mark_of(get(&v, "u")),
        (Some("true"), None),
        "the user's mark untouched"
    );
    assert_eq!(mark_of(get(&v, "d")), (None, None), "another NodePool");
    assert_eq!(mark_of(get(&v, "e")), (None, None), "no NodePool");
    // Ownership before the mark, in one node's actions.
    let b = of(&ds, "b");
    let by = b
        .iter()
        .position(|x| matches!(x, Action::Annotate { key, .. } if key == keys::DO_NOT_DISRUPT_BY));
    let mark = b.iter().position(
        |x| matches!(x, Action::Annotate { key, .. } if key == keys::KARPENTER_DO_NOT_DISRUPT),
    );
    assert!(by < mark, "{b:#?}");
    // Stable: nothing more while it lasts.
    let ds = run(&v, &c, now + mins(1));
    assert!(of(&ds, "b").is_empty(), "{ds:#?}");
    // The condition clears: after the flap guard the repair ends, and every mark of nodekeeper goes.
    node_mut(&mut v, "a")
        .conditions
        .retain(|c| c.type_ != "KernelDeadlock");
    for t in [now + mins(2), now + mins(30)] {
        let ds = run(&v, &c, t);
        apply(&mut v, &ds);
    }
    assert_eq!(state(get(&v, "a")), None);
    assert_eq!(mark_of(get(&v, "a")), (None, None));
    assert_eq!(mark_of(get(&v, "b")), (None, None), "fence lifted");
    assert_eq!(
        mark_of(get(&v, "u")),
        (Some("true"), None),
        "the user's mark stays"
    );
}

/// Node `p` of NodePool `spot2`, Ready, with a preemption notice, beside `q`: the view after the
/// first round, and that round's decisions.
fn preempted_p_beside_q(
    now: chrono::DateTime<chrono::Utc>,
) -> (
    nodekeeper_core::controller::policy::view::ClusterView,
    Vec<nodekeeper_core::controller::policy::Decision>,
) {
    let mut p = ready_node("p", "spot2", now);
    p.notices.push(notice(
        "ev",
        NoticeKind::Preemption,
        Some(now + mins(2)),
        now,
    ));
    let mut v = view(vec![p, ready_node("q", "spot2", now)]);
    let ds = run(&v, &cfg(), now);
    apply(&mut v, &ds);
    (v, ds)
}

#[test]
fn no_fence_for_a_notready_repair_but_one_for_an_interruption_drain_of_a_ready_node() {
    let now = monday();
    // NotReady: Karpenter counts it already.
    let mut a = node("a", "spot", now);
    ready(&mut a, "False", now - mins(11));
    let mut v = view(vec![
        a,
        ready_node("b", "spot", now),
        ready_node("c", "spot", now),
    ]);
    let mut c = cfg();
    c.repair.max_unhealthy = Quantity::Percent(50);
    let ds = run(&v, &c, now);
    apply(&mut v, &ds);
    assert_eq!(state(get(&v, "a")), Some("repairing"));
    assert_eq!(mark_of(get(&v, "b")), (None, None), "{ds:#?}");
    // A preemption of a Ready node: gated by neither tool, but counted by both; Karpenter cannot see
    // it while the node stays Ready, so the NodePool is fenced for the drain.
    let (v, ds) = preempted_p_beside_q(now);
    assert_eq!(state(get(&v, "p")), Some("interrupted"));
    assert_eq!(mark_of(get(&v, "p")), (Some("true"), Some("nodekeeper")));
    assert_eq!(
        mark_of(get(&v, "q")),
        (Some("true"), Some("fence")),
        "{ds:#?}"
    );
}

/// Handed over, an interrupted node no longer needs its NodePool fenced (Karpenter counts it), but
/// the fence stays for `LIFT_HOLD` after the handover, so that the next notice in the NodePool (a
/// wave) finds the marks in place instead of writing them again; then it is lifted, once.
#[test]
fn the_fence_outlives_a_handover_by_the_lift_hold_then_goes() {
    use nodekeeper_core::controller::policy::fence::{fence_only, LIFT_HOLD};
    let now = monday();
    let (mut v, ds) = preempted_p_beside_q(now);
    assert_eq!(mark_of(get(&v, "q")), (Some("true"), Some("fence")));
    // The engine lets the fence's writes give way to the others' (controller::engine::fence_gate).
    assert!(fence_only(&of(&ds, "q")), "{ds:#?}");
    assert!(!fence_only(&of(&ds, "p")), "{ds:#?}");
    node_mut(&mut v, "p").notices.clear();
    accept_replacement(&mut v, "p");
    finish_drain(&mut v, "p");
    let handover = now + chrono::Duration::seconds(20);
    let ds = run(&v, &cfg(), handover);
    assert!(has(&of(&ds, "p"), is_retire), "{ds:#?}");
    apply(&mut v, &ds);
    assert!(of(&ds, "q").is_empty(), "held at the handover: {ds:#?}");
    let ds = run(
        &v,
        &cfg(),
        handover + LIFT_HOLD - chrono::Duration::seconds(1),
    );
    assert!(of(&ds, "q").is_empty(), "held: {ds:#?}");
    let ds = run(&v, &cfg(), handover + LIFT_HOLD);
    assert!(fence_only(&of(&ds, "q")), "the lift too: {ds:#?}");
    apply(&mut v, &ds);
    assert_eq!(
        mark_of(get(&v, "q")),
        (None, None),
        "lifted after the hold: {ds:#?}"
    );
    let ds = run(&v, &cfg(), handover + LIFT_HOLD + mins(1));
    assert!(of(&ds, "q").is_empty(), "once: {ds:#?}");
}

#[test]
fn a_fenced_node_that_nodekeeper_then_acts_on_takes_the_mark_as_its_own() {
    let now = monday();
    let mut n = ready_node("b", "spot", now);
    n.annotations
        .insert(keys::KARPENTER_DO_NOT_DISRUPT.into(), "true".into());
    n.annotations
        .insert(keys::DO_NOT_DISRUPT_BY.into(), "fence".into());
    n.notices.push(notice(
        "ev",
        NoticeKind::Preemption,
        Some(now + mins(2)),
        now,
    ));
    let mut v = view(vec![n]);
    let ds = run(&v, &cfg(), now);
    apply(&mut v, &ds);
    // Owned by the node's own action now: the fence (no longer needed) does not lift it.
    assert_eq!(
        mark_of(get(&v, "b")),
        (Some("true"), Some("nodekeeper")),
        "{ds:#?}"
    );
}

#[test]
fn the_fast_path_fences_the_nodepool_as_the_reconcile_does_and_never_lifts_a_mark() {
    use nodekeeper_core::controller::policy::decide_interruption;
    use nodekeeper_core::controller::policy::fence::fence_now;
    let now = monday();
    let mut p = ready_node("p", "spot", now);
    p.notices.push(notice(
        "ev",
        NoticeKind::Preemption,
        Some(now + mins(2)),
        now,
    ));
    let mut user = ready_node("u", "spot", now);
    user.annotations
        .insert(keys::KARPENTER_DO_NOT_DISRUPT.into(), "true".into());
    let pool = vec![p.clone(), ready_node("q", "spot", now), user];
    let actions = decide_interruption(&p, &cfg(), now).expect("decided alone");
    let fast = fence_now(&pool, "p", &actions, now);
    // The reconcile's fence for the same NodePool: the same marks, on the same nodes.
    let ds = run(&view(pool.clone()), &cfg(), now);
    assert_eq!(
        fast,
        vec![
            ("q".to_string(), of(&ds, "q")[0].clone()),
            ("q".to_string(), of(&ds, "q")[1].clone())
        ],
        "{ds:#?}"
    );
    assert!(of(&ds, "u").is_empty(), "the user's mark stands: {ds:#?}");
    // A NotReady node: Karpenter counts it itself, so no fence; and a fence mark left over in the
    // NodePool is the reconcile's to lift, not the fast path's.
    let mut down = p.clone();
    ready(&mut down, "False", now - mins(1));
    let mut stale = ready_node("s", "spot", now);
    stale
        .annotations
        .insert(keys::KARPENTER_DO_NOT_DISRUPT.into(), "true".into());
    stale
        .annotations
        .insert(keys::DO_NOT_DISRUPT_BY.into(), "fence".into());
    let actions = decide_interruption(&down, &cfg(), now).expect("decided alone");
    let ds = run(&view(vec![down.clone(), stale.clone()]), &cfg(), now);
    assert!(
        of(&ds, "s")
            .iter()
            .any(|a| matches!(a, Action::Annotate { value: None, .. })),
        "the reconcile lifts it: {ds:#?}"
    );
    assert_eq!(fence_now(&[down, stale], "p", &actions, now), vec![]);
}

//! Repairs through the engine on the simulated cluster: Ready=False for 600 s (scaled) on two
//! nodes of a group with budget `nodes = "1"` → the first is drained and replaced while the
//! second is held (naming the budget) until the first is gone; a window closed in
//! Asia/Shanghai but open in UTC holds; more than 20 % unhealthy short-circuits repairs.
//!
//! Sim only: a 600 s toleration and an Asia/Shanghai cron window need the sim's scaled clock; the
//! budget-of-one repair runs on both in `tests/e2e` (`repair`).
#![allow(clippy::unwrap_used)]

use crate::support::ctl;
use crate::support::engine as engine_support;

use std::time::Duration;

use chrono::Timelike;
use nodekeeper_core::controller::act::provider::ProviderConfig;
use nodekeeper_core::controller::policy::view::keys;
use nodekeeper_sim::apiserver::scenario::Scenario;

use engine_support::*;
use nodekeeper_core::agent::checks::ConditionStatus;

/// One pool `general` of `n` nodes; the default web Deployment (PDB) unless `bare`.
fn scenario(n: usize, bare: bool) -> Scenario {
    let mut s = Scenario::default_mixed();
    s.pools.truncate(1);
    s.pools[0].count = n;
    if bare {
        s.workloads.clear();
        s.daemonsets.clear();
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_of_one_holds_the_second_failed_node_until_the_first_is_replaced() {
    let mut l = loops();
    // At scale 100 a loop tick is 10 s simulated: keep the lifecycle loop from seeing gaps.
    l.node_monitor_grace = Duration::from_secs(3600);
    let c = cluster(100.0, scenario(4, false), l).await;
    wait_until(Duration::from_secs(20), "web pods running", || async {
        let mut n = 0;
        for i in 0..4 {
            n += running_on(&c, &format!("general-{i}")).await;
        }
        n >= 8
    })
    .await;
    let p = policy(
        r#"
[repair]
max_unhealthy = "50%"
[[repair.policy]]
condition_type = "Ready"
condition_status = "False"
toleration = "600s"
[budgets.groups]
general = [{ nodes = "1" }]
"#,
    );
    let mut cfg = controller_config("engine-b");
    cfg.provider = ProviderConfig::Karpenter;
    let ctl = controller(&c, &cfg, p, None).await;
    let engine = ctl.engine.clone().unwrap();
    age_nodes(&c, 90).await;
    pin_condition(&c, "general-0", "Ready", "False").await;
    pin_condition(&c, "general-1", "Ready", "False").await;
    let pinned_at = c.sim.store.clock.now();

    // The first repair starts after the toleration; the second node is held by the budget.
    wait_until(Duration::from_secs(20), "general-0 repairing", || async {
        annotation(&node(&c, "general-0").await, keys::STATE) == Some("repairing")
    })
    .await;
    assert!(c.sim.store.clock.now() - pinned_at >= chrono::Duration::seconds(600));
    wait_until(
        Duration::from_secs(5),
        "general-1 held by the budget",
        || async {
            let n = node(&c, "general-1").await;
            annotation(&n, keys::BLOCKED).is_some() && condition(&n, "NodekeeperHeld").is_some()
        },
    )
    .await;
    let b = node(&c, "general-1").await;
    let blocked = annotation(&b, keys::BLOCKED).unwrap();
    assert!(
        blocked.contains("\"kind\":\"budget\"") && blocked.contains("\"nodes\":\"1\""),
        "{blocked}"
    );
    let cond = condition(&b, "NodekeeperHeld").unwrap();
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_deref()),
        ("True", Some("BlockedByBudget"))
    );
    assert!(cond.message.unwrap().contains("group general"));
    assert!(!unschedulable(&b), "a held node is not cordoned");

    // While general-0 exists, general-1 never starts; then it does.
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let first = node_opt(&c, "general-0").await;
        let second = node(&c, "general-1").await;
        if first.is_none() {
            break;
        }
        assert_ne!(
            annotation(&second, keys::STATE),
            Some("repairing"),
            "budget of 1 exceeded: both nodes repairing"
        );
        assert!(
            tokio::time::Instant::now() < end,
            "general-0 never replaced"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_until(
        Duration::from_secs(5),
        "drain state of the gone node forgotten",
        || async { engine.drains().report("general-0").is_none() },
    )
    .await;
    wait_until(
        Duration::from_secs(30),
        "general-1 repaired and replaced",
        || async {
            node_opt(&c, "general-1").await.is_none_or(|n| {
                annotation(&n, keys::STATE) == Some("repairing")
                    && annotation(&n, keys::REPLACEMENT_REQUESTED).is_some()
            })
        },
    )
    .await;
    wait_until(
        Duration::from_secs(10),
        "two replacements accepted",
        || async {
            engine
                .metrics
                .replacements
                .load(std::sync::atomic::Ordering::Relaxed)
                == 2
        },
    )
    .await;
    let evs = events_about(&c, "general-1").await;
    assert!(evs.iter().any(|(r, _)| r == "BlockedByBudget"), "{evs:?}");
    assert!(evs.iter().any(|(r, _)| r == "RepairStarted"), "{evs:?}");
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_closed_in_shanghai_holds_and_the_same_window_in_utc_does_not() {
    let c = cluster(20.0, scenario(5, true), loops()).await;
    // A blocking window (nodes = "0") from the current Shanghai hour for 2 h: it covers now in
    // Asia/Shanghai; read in UTC it starts 8 h from now.
    let now = c.sim.store.clock.now();
    let shanghai_hour = (now.hour() + 8) % 24;
    let text = |tz: &str| {
        format!(
            r#"
[repair]
[[repair.policy]]
condition_type = "Ready"
condition_status = "False"
toleration = "10s"
[budgets]
budgets = [{{ nodes = "100%" }}, {{ nodes = "0", schedule = "0 {shanghai_hour} * * *", duration = "2h", timezone = "{tz}", reasons = ["repair"] }}]
"#
        )
    };
    let ctl = controller(
        &c,
        &controller_config("engine-w1"),
        policy(&text("Asia/Shanghai")),
        None,
    )
    .await;
    age_nodes(&c, 90).await;
    pin_condition(&c, "general-0", "Ready", "False").await;
    // (The hold's annotation and its condition are two writes: wait for both.)
    wait_until(Duration::from_secs(10), "held by the window", || async {
        let n = node(&c, "general-0").await;
        annotation(&n, keys::BLOCKED).is_some() && condition(&n, "NodekeeperHeld").is_some()
    })
    .await;
    let n = node(&c, "general-0").await;
    let blocked = annotation(&n, keys::BLOCKED).unwrap();
    assert!(
        blocked.contains("\"budget\":1") && blocked.contains("Asia/Shanghai"),
        "{blocked}"
    );
    assert!(blocked.contains("opens_at"), "{blocked}");
    assert_eq!(annotation(&n, keys::STATE), None);
    assert!(!unschedulable(&n));
    let msg = condition(&n, "NodekeeperHeld").unwrap().message.unwrap();
    assert!(
        msg.contains("window opens at") && msg.contains("CST"),
        "{msg}"
    );
    ctl.stop().await;

    // The same budget in UTC is not active now: the repair starts.
    let ctl = controller(
        &c,
        &controller_config("engine-w2"),
        policy(&text("UTC")),
        None,
    )
    .await;
    wait_until(Duration::from_secs(10), "repair started", || async {
        annotation(&node(&c, "general-0").await, keys::STATE) == Some("repairing")
    })
    .await;
    wait_until(Duration::from_secs(5), "hold lifted", || async {
        let n = node(&c, "general-0").await;
        annotation(&n, keys::BLOCKED).is_none()
            && condition(&n, "NodekeeperHeld").is_some_and(|c| c.status == "False")
    })
    .await;
    assert!(unschedulable(&node(&c, "general-0").await));
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_than_twenty_percent_unhealthy_short_circuits_repairs() {
    let c = cluster(20.0, scenario(5, true), loops()).await;
    let p = policy(
        r#"
[repair]
[[repair.policy]]
condition_type = "Ready"
condition_status = "False"
toleration = "10s"
[budgets]
budgets = [{ nodes = "100%" }]
"#,
    );
    let ctl = controller(&c, &controller_config("engine-s"), p, None).await;
    // 2 of 5 = 40 % > 20 % (max_unhealthy default).
    age_nodes(&c, 90).await;
    pin_condition(&c, "general-0", "Ready", "False").await;
    pin_condition(&c, "general-1", "Ready", "False").await;
    wait_until(
        Duration::from_secs(10),
        "both held by the short-circuit",
        || async {
            let a = node(&c, "general-0").await;
            let b = node(&c, "general-1").await;
            [a, b].iter().all(|n| {
                annotation(n, keys::BLOCKED)
                    .is_some_and(|b| b.contains("\"kind\":\"short_circuit\""))
            })
        },
    )
    .await;
    // More reconciles to (wrongly) start a repair.
    three_more_reconciles(&ctl).await;
    for n in ["general-0", "general-1"] {
        let n = node(&c, n).await;
        assert_eq!(annotation(&n, keys::STATE), None, "a repair started");
        assert!(!unschedulable(&n));
        let cond = condition(&n, "NodekeeperHeld").unwrap();
        assert_eq!(cond.reason.as_deref(), Some("RepairShortCircuited"));
        assert!(cond.message.unwrap().contains("2 of 5"));
    }
    let text = nodekeeper_core::http::client()
        .unwrap()
        .get(format!("http://{}/metrics", ctl.addr))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("nodekeeper_engine_repair_short_circuited{group=\"general\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("nodekeeper_engine_unhealthy_nodes{group=\"general\"} 2"),
        "{text}"
    );
    // An agent report (its own Nodekeeper* conditions, and a spoofed hold) neither removes
    // nor overrides the engine's NodekeeperHeld condition.
    let report = ctl::report(
        "general-0",
        1,
        &[
            ("NodekeeperDisk", ConditionStatus::False),
            ("NodekeeperHeld", ConditionStatus::False),
        ],
    );
    assert!(
        ctl.app
            .states
            .handle(report, tokio::time::Instant::now())
            .await
            .unwrap()
            .accepted
    );
    let n = node(&c, "general-0").await;
    assert_eq!(condition(&n, "NodekeeperDisk").unwrap().status, "False");
    let held = condition(&n, "NodekeeperHeld").unwrap();
    assert_eq!(
        (held.status.as_str(), held.reason.as_deref()),
        ("True", Some("RepairShortCircuited"))
    );
    // One node recovers: 1 of 5 is within the threshold, the other is repaired.
    pin_condition(&c, "general-1", "Ready", "True").await;
    wait_until(Duration::from_secs(10), "general-0 repairing", || async {
        annotation(&node(&c, "general-0").await, keys::STATE) == Some("repairing")
    })
    .await;
    ctl.stop().await;
}

/// A repair starts when its toleration ends, not at the engine's next tick: with a tick of an
/// hour, the node is repairing within moments of `lastTransitionTime` + 600 s (scale 100:
/// 6 s of real time; the engine's tick is real time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repair_starts_at_toleration_expiry_not_at_the_next_tick() {
    let mut l = loops();
    l.node_monitor_grace = Duration::from_secs(3600);
    let c = cluster(100.0, scenario(4, true), l).await;
    let p = policy(
        r#"
[repair]
max_unhealthy = "50%"
[[repair.policy]]
condition_type = "Ready"
condition_status = "False"
toleration = "600s"
"#,
    );
    let mut cfg = controller_config("engine-expiry");
    cfg.engine.tick = Duration::from_secs(3600);
    let ctl = controller(&c, &cfg, p, None).await;
    age_nodes(&c, 90).await;
    pin_condition(&c, "general-0", "Ready", "False").await;
    let since = condition(&node(&c, "general-0").await, "Ready")
        .unwrap()
        .last_transition_time
        .unwrap()
        .0
        .as_second();
    wait_until(Duration::from_secs(20), "general-0 repairing", || async {
        annotation(&node(&c, "general-0").await, keys::STATE) == Some("repairing")
    })
    .await;
    // Seen by a 50 ms poll (5 s simulated): at most 1.5 s real after the expiry.
    let late = c.sim.store.clock.now().timestamp() - (since + 600);
    assert!(
        (0..=150).contains(&late),
        "repair seen {late} s (simulated) after the toleration ended"
    );
    ctl.stop().await;
}

//! The engine on the default simulated cluster: a withdrawn notice undoes only what nodekeeper
//! did (an admin cordon stays), and dry-run changes nothing on Nodes but records Events.
//!
//! Sim only: needs the default sim scenario and its scaled clock; the cordon/taint/drain path runs
//! on both in `tests/e2e` (`events`, `preemption`).
#![allow(clippy::unwrap_used)]

use crate::support::engine as engine_support;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use nodekeeper_core::agent::sources::EventKind;
use nodekeeper_core::controller::act::provider::fake::FakeProvider;
use nodekeeper_core::controller::metrics::ActionResult;
use nodekeeper_core::controller::policy::view::keys;
use nodekeeper_core::controller::policy::PolicyConfig;
use nodekeeper_sim::apiserver::scenario::Scenario;

use engine_support::*;

const LB: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
const TAINT: &str = "nodekeeper.io/interruption";

async fn settled() -> nodekeeper_sim::apiserver::TestCluster {
    let c = cluster(20.0, Scenario::default_mixed(), loops()).await;
    wait_until(Duration::from_secs(20), "web pods running", || async {
        let mut n = 0;
        for node in ["general-0", "general-1", "general-2", "spot-0", "spot-1"] {
            n += running_on(&c, node).await;
        }
        n >= 9
    })
    .await;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_notice_never_uncordons_an_admin_cordon() {
    let c = settled().await;
    let nodes: Api<Node> = Api::all(c.client.clone());
    // An operator cordoned general-0 before any notice.
    nodes
        .patch(
            "general-0",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    // Someone else's taint on general-1: kept through taint and untaint.
    nodes
        .patch(
            "general-1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"taints": [
                {"key": "example.com/dedicated", "value": "batch", "effect": "NoSchedule"}]}})),
        )
        .await
        .unwrap();
    let fake = Arc::new(FakeProvider::new());
    let ctl = controller(
        &c,
        &controller_config("engine-c"),
        PolicyConfig::default(),
        Some(fake.clone()),
    )
    .await;
    let now = c.sim.store.clock.now();
    let at = Some(now + chrono::Duration::seconds(1200));
    for (node, id) in [("general-0", "m-0"), ("general-1", "m-1")] {
        let ev = notice(id, EventKind::Maintenance, at, now);
        assert!(ctl.app.states.ingest_event(node, ev).await);
    }
    wait_until(
        Duration::from_secs(10),
        "both nodes interrupted",
        || async {
            let a = node(&c, "general-0").await;
            let b = node(&c, "general-1").await;
            taint(&a, TAINT).is_some() && taint(&b, TAINT).is_some()
        },
    )
    .await;
    let a = node(&c, "general-0").await;
    let b = node(&c, "general-1").await;
    assert_eq!(
        annotation(&a, keys::CORDONED_BY),
        None,
        "admin cordon is not ours"
    );
    assert_eq!(annotation(&b, keys::CORDONED_BY), Some("nodekeeper"));
    assert!(unschedulable(&a) && unschedulable(&b));
    assert_eq!(label(&a, LB), Some("nodekeeper"));
    assert!(
        taint(&b, "example.com/dedicated").is_some(),
        "foreign taint clobbered"
    );

    let now = c.sim.store.clock.now();
    for (node, id) in [("general-0", "m-0"), ("general-1", "m-1")] {
        let ev = notice(
            &format!("{id}-cancel"),
            EventKind::Cancelled { of: id.into() },
            None,
            now,
        );
        assert!(ctl.app.states.ingest_event(node, ev).await);
    }
    wait_until(Duration::from_secs(10), "both notices undone", || async {
        let a = node(&c, "general-0").await;
        let b = node(&c, "general-1").await;
        taint(&a, TAINT).is_none()
            && taint(&b, TAINT).is_none()
            && annotation(&a, keys::STATE).is_none()
            && annotation(&b, keys::STATE).is_none()
    })
    .await;
    // Give the engine more reconciles to get it wrong.
    three_more_reconciles(&ctl).await;
    let a = node(&c, "general-0").await;
    let b = node(&c, "general-1").await;
    assert!(unschedulable(&a), "the admin cordon was undone");
    assert!(!unschedulable(&b), "nodekeeper's own cordon stayed");
    assert_eq!(label(&a, LB), None);
    assert_eq!(label(&b, LB), None);
    let kept = taint(&b, "example.com/dedicated").expect("foreign taint removed");
    assert_eq!(kept.value.as_deref(), Some("batch"));
    assert!(
        fake.requests().is_empty(),
        "maintenance drains, never replaces"
    );
    let evs = events_about(&c, "general-0").await;
    assert!(
        evs.iter().any(|(r, _)| r == "InterruptionCancelled"),
        "{evs:?}"
    );
    assert!(!ctl
        .engine
        .as_ref()
        .unwrap()
        .drains()
        .nodes()
        .contains(&"general-0".to_string()));
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_changes_nothing_but_records_events() {
    let c = settled().await;
    let fake = Arc::new(FakeProvider::new());
    let mut policy = PolicyConfig::default();
    policy.controller.dry_run = true;
    let ctl = controller(
        &c,
        &controller_config("engine-d"),
        policy,
        Some(fake.clone()),
    )
    .await;
    let before = node(&c, "spot-0").await;
    let pods_before = pods_on(&c, "spot-0").await.len();
    let now = c.sim.store.clock.now();
    let ev = notice(
        "dry-1",
        EventKind::Preemption,
        Some(now + chrono::Duration::seconds(120)),
        now,
    );
    assert!(ctl.app.states.ingest_event("spot-0", ev).await);
    wait_until(Duration::from_secs(10), "dry-run events", || async {
        events_about(&c, "spot-0")
            .await
            .iter()
            .any(|(r, n)| r == "InterruptionNotice" && n.starts_with("dry run:"))
    })
    .await;
    // Several reconciles later: still nothing on the Node, no eviction, no replacement.
    three_more_reconciles(&ctl).await;
    let after = node(&c, "spot-0").await;
    assert!(!unschedulable(&after));
    assert!(taint(&after, TAINT).is_none());
    assert_eq!(label(&after, LB), None);
    for k in keys::ALL {
        assert_eq!(annotation(&after, k), None, "{k} written in dry run");
    }
    assert_eq!(
        after.metadata.labels, before.metadata.labels,
        "labels changed in dry run"
    );
    assert_eq!(
        pods_on(&c, "spot-0").await.len(),
        pods_before,
        "pods evicted in dry run"
    );
    assert!(fake.requests().is_empty());
    let engine = ctl.engine.as_ref().unwrap();
    assert!(
        engine.drains().nodes().is_empty(),
        "a drain started in dry run"
    );
    let m = &engine.metrics;
    assert!(m.action_count("cordon", ActionResult::DryRun) >= 1);
    assert!(m.action_count("request_replacement", ActionResult::DryRun) >= 1);
    assert_eq!(m.action_count("cordon", ActionResult::Ok), 0);
    // Each distinct dry-run Event is recorded once, not every reconcile.
    let evs = events_about(&c, "spot-0").await;
    let notices = evs
        .iter()
        .filter(|(r, n)| r == "InterruptionNotice" && n.starts_with("dry run:"))
        .count();
    assert_eq!(notices, 1, "{evs:?}");
    assert!(
        evs.iter()
            .any(|(r, n)| r == "ReplacementRequested" && n.starts_with("dry run:")),
        "{evs:?}"
    );
    ctl.stop().await;
}

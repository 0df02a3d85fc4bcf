//! `[budgets] source = "nodepool"` through the engine on the simulated cluster (which serves
//! `karpenter.sh/v1` `nodepools`): a NodePool `general` with budget `nodes: "0"` holds the repair
//! of a failed node with a blocker naming the NodePool; a NodePool Karpenter would refuse
//! (`nodes: "150%"`) holds it with `BlockedByNodePool` naming the field; patched to `nodes: "1"`,
//! the repair starts. The controller reads the NodePools through its watch, nothing else.
//!
//! Sim only: the plain real cluster of `tests/e2e` has no Karpenter CRDs (the Karpenter cluster
//! has no nodekeeper manifests); there, `nodekeeper_controller_refuses_to_start_without_the_nodepool_crd`
//! (tests/e2e/nodepool.rs) checks the start-up refusal instead.
#![allow(clippy::unwrap_used)]

use crate::support::engine as engine_support;

use std::time::Duration;

use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use nodekeeper_core::controller::policy::view::keys;
use nodekeeper_core::controller::state::nodepools::nodepool_resource;
use nodekeeper_sim::apiserver::scenario::Scenario;
use serde_json::json;

use engine_support::*;

fn nodepools(c: &nodekeeper_sim::apiserver::TestCluster) -> Api<DynamicObject> {
    Api::all_with(c.client.clone(), &nodepool_resource())
}

async fn set_budgets(c: &nodekeeper_sim::apiserver::TestCluster, budgets: serde_json::Value) {
    nodepools(c)
        .patch(
            "general",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"disruption": {"budgets": budgets}}})),
        )
        .await
        .unwrap();
}

/// The `NodekeeperHeld` reason and the `nodekeeper.io/blocked` JSON of general-0.
async fn held(c: &nodekeeper_sim::apiserver::TestCluster) -> Option<(String, String)> {
    let n = node(c, "general-0").await;
    let blocked = annotation(&n, keys::BLOCKED)?.to_string();
    let cond = condition(&n, "NodekeeperHeld")?;
    (cond.status == "True").then(|| (cond.reason.unwrap_or_default(), blocked))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodepool_budget_holds_a_repair_until_the_nodepool_allows_it() {
    let mut l = loops();
    l.node_monitor_grace = Duration::from_secs(3600);
    let mut s = Scenario::default_mixed();
    s.pools.truncate(1);
    s.pools[0].count = 3;
    s.workloads.clear();
    s.daemonsets.clear();
    let c = cluster(100.0, s, l).await;
    let pool: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": "general"},
        "spec": {"disruption": {"consolidationPolicy": "WhenEmpty", "budgets": [{"nodes": "0"}]}},
    }))
    .unwrap();
    nodepools(&c)
        .create(&PostParams::default(), &pool)
        .await
        .unwrap();
    let p: nodekeeper_core::controller::policy::PolicyConfig = toml::from_str(
        r#"
[repair]
max_unhealthy = "100%"
[[repair.policy]]
condition_type = "Ready"
condition_status = "False"
toleration = "600s"
[budgets]
source = "nodepool"
"#,
    )
    .unwrap();
    // validate is offline: it only warns that the NodePool CRD is needed.
    let d = p.validate();
    assert_eq!(d.len(), 1, "{d:?}");
    assert!(d[0].message.contains("needs the NodePool CRD"), "{d:?}");
    let ctl = controller(&c, &controller_config("engine-np"), p, None).await;
    age_nodes(&c, 90).await;
    pin_condition(&c, "general-0", "Ready", "False").await;

    // nodes "0": held after the toleration, by the NodePool's budget #0.
    wait_until(
        Duration::from_secs(30),
        "general-0 held by the NodePool's budget",
        || async { held(&c).await.is_some_and(|(r, _)| r == "BlockedByBudget") },
    )
    .await;
    let (_, blocked) = held(&c).await.unwrap();
    assert!(
        blocked.contains(r#""kind":"budget""#)
            && blocked.contains(r#""budget":0"#)
            && blocked.contains(r#""nodes":"0""#)
            && blocked.contains(r#""nodepool":"general""#),
        "{blocked}"
    );
    let n = node(&c, "general-0").await;
    let msg = condition(&n, "NodekeeperHeld").unwrap().message.unwrap();
    assert!(msg.contains("of NodePool general"), "{msg}");
    assert_eq!(annotation(&n, keys::STATE), None, "not repairing");
    assert!(!unschedulable(&n));

    // A budget Karpenter's CRD would refuse: held, naming the NodePool and the field.
    set_budgets(&c, json!([{"nodes": "1"}, {"nodes": "150%"}])).await;
    wait_until(
        Duration::from_secs(10),
        "general-0 held by the invalid NodePool",
        || async {
            held(&c)
                .await
                .is_some_and(|(r, _)| r == "BlockedByNodePool")
        },
    )
    .await;
    let n = node(&c, "general-0").await;
    let msg = condition(&n, "NodekeeperHeld").unwrap().message.unwrap();
    assert!(
        msg.starts_with(
            r#"NodePool general: spec.disruption.budgets[1].nodes: "150%" does not match"#
        ),
        "{msg}"
    );
    assert_eq!(annotation(&n, keys::STATE), None, "not repairing");

    // nodes "1": the repair starts; the hold is released.
    set_budgets(&c, json!([{"nodes": "1"}])).await;
    wait_until(Duration::from_secs(10), "general-0 repairing", || async {
        annotation(&node(&c, "general-0").await, keys::STATE) == Some("repairing")
    })
    .await;
    wait_until(Duration::from_secs(10), "hold released", || async {
        annotation(&node(&c, "general-0").await, keys::BLOCKED).is_none()
    })
    .await;
    let evs = events_about(&c, "general-0").await;
    for reason in ["BlockedByBudget", "BlockedByNodePool", "RepairStarted"] {
        assert!(evs.iter().any(|(r, _)| r == reason), "{reason}: {evs:?}");
    }
    ctl.stop().await;
}

//! The karpenter provider against the simulated cluster with its Karpenter-like provisioner: the
//! request adds a NodeClaim of the same pool (a new Ready node appears beside the old one); the
//! retire deletes the old claim (the old node goes) and nothing else is launched.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};

use crate::support::wait;
use kube::api::{Api, ListParams};
use kube::core::DynamicObject;
use nodekeeper_core::controller::act::provider::karpenter::{
    nodeclaim_resource, twin_name, Karpenter, DO_NOT_DISRUPT, REPLACES_LABEL, REQUEST_ANNOTATION,
};
use nodekeeper_core::controller::act::provider::{NodeProvider, ProviderError, ReplacementRequest};
use nodekeeper_sim::apiserver::scenario::Scenario;
use nodekeeper_sim::apiserver::{SimOptions, TestCluster};

fn pool_of(n: &Node) -> Option<String> {
    n.metadata
        .labels
        .as_ref()?
        .get("karpenter.sh/nodepool")
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_a_nodeclaim_at_once_and_deletes_the_old_one_only_when_retired() {
    let opts = SimOptions {
        time_scale: 30.0,
        scenario: Scenario::default_mixed(),
        ..Default::default()
    };
    let c = TestCluster::start(opts).await.unwrap();
    let nodes: Api<Node> = Api::all(c.client.clone());
    let claims: Api<DynamicObject> = Api::all_with(c.client.clone(), &nodeclaim_resource());
    let before = nodes.list(&ListParams::default()).await.unwrap().items;
    // A node of a pool running a workload pod (not a DaemonSet's): the pods that must move are
    // what makes the provider add capacity.
    let pods: Api<Pod> = Api::all(c.client.clone());
    let node = wait::until(
        Duration::from_secs(20),
        "a pool node running a workload pod",
        || {
            let (pods, before) = (pods.clone(), before.clone());
            async move {
                let list = pods.list(&ListParams::default()).await.ok()?.items;
                before
                    .iter()
                    .filter(|n| pool_of(n).is_some())
                    .filter_map(|n| n.metadata.name.clone())
                    .find(|name| list.iter().any(|p| runs_workload_on(p, name)))
            }
        },
    )
    .await;
    let victim = before
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(node.as_str()))
        .unwrap();
    let pool = pool_of(victim).unwrap();
    let claims_before = claims
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .len();
    assert!(
        claims.get_opt(&node).await.unwrap().is_some(),
        "{node} has a NodeClaim"
    );

    let p = Karpenter::new(c.client.clone());
    let req = ReplacementRequest::new(&node, "repair", "2026-11-30T00:00:00Z");
    let t1 = p.request_replacement(&req).await.unwrap();
    assert_eq!(t1.provider, "karpenter");
    assert_eq!(t1.pool.as_deref(), Some(pool.as_str()));
    assert_eq!(t1.reference.as_deref(), Some(node.as_str()));
    assert!(t1.existing_nodes.contains(&node));
    // The old claim is annotated, not deleted: nodekeeper's drain is the only one.
    let old = claims.get(&node).await.unwrap();
    assert!(old.metadata.deletion_timestamp.is_none(), "old claim kept");
    assert_eq!(
        old.metadata.annotations.as_ref().unwrap()[REQUEST_ANNOTATION],
        req.request_id
    );
    // A claim of the same pool and spec, named after the request, kept off consolidation.
    let twin_name = twin_name(&node, &req.request_id);
    let twin = claims.get(&twin_name).await.unwrap();
    let labels = twin.metadata.labels.clone().unwrap();
    assert_eq!(labels["karpenter.sh/nodepool"], pool);
    assert_eq!(labels[REPLACES_LABEL], node);
    assert_eq!(
        twin.metadata.annotations.as_ref().unwrap()[DO_NOT_DISRUPT],
        "true"
    );
    assert_eq!(twin.data["spec"], old.data["spec"]);

    // Same id again, from this provider and from a fresh one (a restarted controller): one claim.
    let t2 = p.request_replacement(&req).await.unwrap();
    assert_eq!(t1, t2);
    let restarted = Karpenter::new(c.client.clone());
    let t3 = restarted.request_replacement(&req).await.unwrap();
    assert_eq!(t3.reference.as_deref(), Some(node.as_str()));
    let count = claims
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .len();
    assert_eq!(count, claims_before + 1, "one claim added");

    // The new node comes up while the old one is still there.
    let end = tokio::time::Instant::now() + Duration::from_secs(20);
    let new_node = loop {
        if let Some(n) = p.replacement_ready(&t1).await.unwrap() {
            break n;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "no replacement within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(new_node, twin_name);
    assert!(
        nodes.get_opt(&node).await.unwrap().is_some(),
        "old node still there"
    );
    let fresh = nodes.get(&new_node).await.unwrap();
    assert_eq!(pool_of(&fresh).as_deref(), Some(pool.as_str()));

    // Retired: the old claim goes (Karpenter terminates the node), the twin's mark is lifted, and no
    // other node is launched.
    p.retire(&req).await.unwrap();
    let end = tokio::time::Instant::now() + Duration::from_secs(20);
    while nodes.get_opt(&node).await.unwrap().is_some() {
        assert!(tokio::time::Instant::now() < end, "old node not removed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let twin = claims.get(&twin_name).await.unwrap();
    assert!(
        !twin
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(DO_NOT_DISRUPT),
        "mark lifted"
    );
    // Again from the restarted provider: its writes are awaited, so a claim it wrongly made is
    // listed now (and only a claim makes the stand-in launch a node).
    restarted.retire(&req).await.unwrap();
    let after = claims.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(after.len(), claims_before, "one claim gone, one new");
    let new_nodes: Vec<String> = nodes
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|n| !before.iter().any(|b| b.metadata.name == n.metadata.name))
        .filter_map(|n| n.metadata.name)
        .collect();
    assert_eq!(
        new_nodes,
        vec![twin_name],
        "exactly one replacement launched"
    );
}

/// `p` runs on `node` and is not a DaemonSet's.
fn runs_workload_on(p: &Pod, node: &str) -> bool {
    let on = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
    let daemon = p
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DaemonSet");
    on && !daemon
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_workload_gets_no_new_nodeclaim() {
    let c = TestCluster::start(SimOptions {
        scenario: Scenario::default_mixed(),
        ..Default::default()
    })
    .await
    .unwrap();
    let nodes: Api<Node> = Api::all(c.client.clone());
    let claims: Api<DynamicObject> = Api::all_with(c.client.clone(), &nodeclaim_resource());
    let pods: Api<Pod> = Api::all(c.client.clone());
    let node = nodes
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|n| pool_of(n).is_some())
        .and_then(|n| n.metadata.name)
        .unwrap();
    // Cordoned and its workload pods gone (as after a completed drain): only DaemonSet pods stay.
    let cordon = serde_json::json!({ "spec": { "unschedulable": true } });
    nodes
        .patch(
            &node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&cordon),
        )
        .await
        .unwrap();
    for p in pods.list(&ListParams::default()).await.unwrap().items {
        if runs_workload_on(&p, &node) {
            let ns = p.metadata.namespace.clone().unwrap();
            let api: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
            let _ = api
                .delete(p.metadata.name.as_deref().unwrap(), &Default::default())
                .await;
        }
    }
    let p = Karpenter::new(c.client.clone());
    let req = ReplacementRequest::new(&node, "repair", "e2");
    let before = claims
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .len();
    let t = p.request_replacement(&req).await.unwrap();
    assert_eq!(t.reference.as_deref(), Some(node.as_str()));
    assert!(claims
        .get_opt(&twin_name(&node, &req.request_id))
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        claims
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        before,
        "no NodeClaim added"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_nodeclaim_is_a_permanent_error() {
    let c = TestCluster::start(SimOptions {
        scenario: Scenario::default_mixed(),
        ..Default::default()
    })
    .await
    .unwrap();
    let p = Karpenter::new(c.client.clone());
    let err = p
        .request_replacement(&ReplacementRequest::new("no-such-node", "repair", "e1"))
        .await
        .unwrap_err();
    assert!(err.is_permanent(), "{err}");
    assert!(matches!(err, ProviderError::Permanent { .. }));
    assert!(err.to_string().contains("no-such-node"), "{err}");
}

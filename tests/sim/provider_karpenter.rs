//! The karpenter provider against the simulated cluster with its Karpenter-like provisioner:
//! deleting the NodeClaim removes the old node and a new Ready node of the same pool appears.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::core::DynamicObject;
use nodekeeper_core::controller::provider::karpenter::{
    nodeclaim_resource, Karpenter, REQUEST_ANNOTATION,
};
use nodekeeper_core::controller::provider::{NodeProvider, ProviderError, ReplacementRequest};
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
async fn deletes_the_nodeclaim_once_and_reports_the_new_node() {
    let opts = SimOptions {
        time_scale: 30.0,
        scenario: Scenario::default_mixed(),
        ..Default::default()
    };
    let c = TestCluster::start(opts).await.unwrap();
    let nodes: Api<Node> = Api::all(c.client.clone());
    let claims: Api<DynamicObject> = Api::all_with(c.client.clone(), &nodeclaim_resource());
    let before = nodes.list(&ListParams::default()).await.unwrap().items;
    let victim = before.iter().find(|n| pool_of(n).is_some()).unwrap();
    let node = victim.metadata.name.clone().unwrap();
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
    let claim = claims.get_opt(&node).await.unwrap();
    if let Some(claim) = &claim {
        assert!(
            claim.metadata.deletion_timestamp.is_some(),
            "claim is deleting"
        );
        assert_eq!(
            claim.metadata.annotations.as_ref().unwrap()[REQUEST_ANNOTATION],
            req.request_id
        );
    }
    assert_eq!(p.replacement_ready(&t1).await.unwrap(), None, "not yet");

    // Same id again, from this provider and from a fresh one (a restarted controller): one claim deleted.
    let t2 = p.request_replacement(&req).await.unwrap();
    assert_eq!(t1, t2);
    let restarted = Karpenter::new(c.client.clone());
    if claims.get_opt(&node).await.unwrap().is_some() {
        let t3 = restarted.request_replacement(&req).await.unwrap();
        assert_eq!(t3.reference.as_deref(), Some(node.as_str()));
    }

    // Old node removed, a new Ready node of the same pool reported.
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
    assert_ne!(new_node, node);
    assert!(
        nodes.get_opt(&node).await.unwrap().is_none(),
        "old node removed"
    );
    let fresh = nodes.get(&new_node).await.unwrap();
    assert_eq!(pool_of(&fresh).as_deref(), Some(pool.as_str()));
    assert!(!before
        .iter()
        .any(|n| n.metadata.name.as_deref() == Some(new_node.as_str())));

    // Exactly one claim was replaced: same count as before, one launched replacement.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = claims.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(after.len(), claims_before, "one claim gone, one new");
    assert!(after
        .iter()
        .all(|c| c.metadata.deletion_timestamp.is_none()));
    let new_pool_nodes = nodes
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|n| !before.iter().any(|b| b.metadata.name == n.metadata.name))
        .count();
    assert_eq!(new_pool_nodes, 1, "exactly one replacement launched");
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

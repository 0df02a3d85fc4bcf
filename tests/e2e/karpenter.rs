//! The real Karpenter (its KWOK provider, `scripts/k8s-cluster.sh up DIR --karpenter`) on a control plane of
//! its own, as its chart's RBAC: a Deployment whose pods fit no existing node → Karpenter creates a
//! NodeClaim and a KWOK Node, the Node becomes Ready and the pods are scheduled there; scaled to 0, the empty
//! node is consolidated away (NodeClaim and Node deleted). Real only: the sim has no Karpenter.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::json;

use crate::support::*;

const POOL: &str = "default";
const APP: &str = "karpenter-inflate";

fn nodeclaims(admin: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("karpenter.sh", "v1", "NodeClaim");
    Api::all_with(admin.clone(), &ApiResource::from_gvk(&gvk))
}

fn nodepools(admin: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("karpenter.sh", "v1", "NodePool");
    Api::all_with(admin.clone(), &ApiResource::from_gvk(&gvk))
}

/// `status.conditions[type].status == "True"` of a Karpenter object.
fn condition_true(o: &DynamicObject, type_: &str) -> bool {
    o.data["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == type_ && c["status"] == "True")
    })
}

/// The NodeClaims of the pool.
async fn pool_claims(api: &Api<DynamicObject>) -> Vec<DynamicObject> {
    api.list(&ListParams::default().labels(&format!("karpenter.sh/nodepool={POOL}")))
        .await
        .unwrap()
        .items
}

/// The Deployment's pods.
async fn app_pods(pods: &Api<Pod>) -> Vec<Pod> {
    pods.list(&ListParams::default().labels(&format!("app={APP}")))
        .await
        .unwrap()
        .items
}

fn running_on(p: &Pod) -> Option<&str> {
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    (phase == Some("Running")).then_some(())?;
    p.spec.as_ref()?.node_name.as_deref()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn karpenter_provisions_a_kwok_node_for_pending_pods_and_consolidates_it_when_empty() {
    init_tracing();
    let c = karpenter_cluster();
    let admin = c.admin().await;

    // The default KWOKNodeClass and the example NodePool (spot + on-demand, consolidation at once).
    let fixtures = repo().join("tests/fixtures/karpenter");
    let out = kubectl(
        c,
        &[
            "apply",
            "-f",
            fixtures.join("kwoknodeclass.yaml").to_str().unwrap(),
            "-f",
            fixtures.join("nodepool.yaml").to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "kubectl apply of the Karpenter fixtures"
    );
    let pools = nodepools(&admin);
    wait_until(Duration::from_secs(60), "NodePool default Ready", || {
        let pools = pools.clone();
        async move {
            pools
                .get(POOL)
                .await
                .is_ok_and(|p| condition_true(&p, "Ready"))
        }
    })
    .await;

    // One existing node too small for any of the pods (1 CPU; each pod asks 1500m).
    let mut small = kwok_node("karp-small", json!({}));
    let res = json!({ "cpu": "1", "memory": "4Gi", "pods": "110" });
    small.status.as_mut().unwrap().allocatable = serde_json::from_value(res.clone()).unwrap();
    small.status.as_mut().unwrap().capacity = serde_json::from_value(res).unwrap();
    let _nodes = c.create_nodes(&[small]).await;

    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), "default");
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": { "name": APP },
        "spec": {
            "replicas": 2,
            "selector": { "matchLabels": { "app": APP } },
            "template": {
                "metadata": { "labels": { "app": APP } },
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{
                        "name": "pause",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": { "requests": { "cpu": "1500m", "memory": "512Mi" } }
                    }]
                }
            }
        }
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();

    // Karpenter launches NodeClaims; their KWOK nodes become Ready and the scheduler places every pod there.
    let claims_api = nodeclaims(&admin);
    let nodes: Api<Node> = Api::all(admin.clone());
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let hosts: BTreeSet<String> = wait_for(
        Duration::from_secs(120),
        "both pods Running on nodes of NodePool default",
        || {
            let pods = pods.clone();
            async move {
                let ps = app_pods(&pods).await;
                let on: Vec<String> = ps.iter().filter_map(running_on).map(String::from).collect();
                (ps.len() == 2 && on.len() == 2).then(|| on.into_iter().collect())
            }
        },
    )
    .await;
    assert!(
        !hosts.contains("karp-small"),
        "a 1500m pod cannot run on the 1-CPU node: {hosts:?}"
    );
    let claims = wait_for(
        Duration::from_secs(60),
        "every NodeClaim of the pool Launched, Registered and Initialized",
        || {
            let api = claims_api.clone();
            async move {
                let cs = pool_claims(&api).await;
                let done = !cs.is_empty()
                    && cs.iter().all(|c| {
                        ["Launched", "Registered", "Initialized"]
                            .iter()
                            .all(|t| condition_true(c, t))
                    });
                done.then_some(cs)
            }
        },
    )
    .await;
    let mut claimed_nodes = BTreeSet::new();
    for claim in &claims {
        let name = claim.data["status"]["nodeName"]
            .as_str()
            .expect("an initialized NodeClaim names its node")
            .to_string();
        let node = nodes.get(&name).await.unwrap();
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let annotations = node.metadata.annotations.clone().unwrap_or_default();
        assert!(is_ready(&node), "node {name} is Ready");
        assert_eq!(
            node.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
            claim.data["status"]["providerID"].as_str(),
            "node {name} is the NodeClaim's instance"
        );
        assert!(
            node.spec
                .as_ref()
                .and_then(|s| s.provider_id.as_deref())
                .is_some_and(|p| p.starts_with("kwok://")),
            "a KWOK provider id"
        );
        assert_eq!(
            labels.get("karpenter.sh/nodepool").map(String::as_str),
            Some(POOL)
        );
        assert_eq!(
            labels.get("nodekeeper.test/pool").map(String::as_str),
            Some("karpenter"),
            "the NodePool template's label"
        );
        let capacity = labels.get("karpenter.sh/capacity-type").map(String::as_str);
        assert!(
            matches!(capacity, Some("spot" | "on-demand")),
            "capacity type {capacity:?}"
        );
        assert_eq!(
            annotations.get("kwok.x-k8s.io/node").map(String::as_str),
            Some("fake"),
            "the cluster's KWOK plays its kubelet"
        );
        let taints = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        assert!(
            !taints.iter().any(|t| t.key == "karpenter.sh/unregistered"),
            "Karpenter removed its unregistered taint from {name}: {taints:?}"
        );
        claimed_nodes.insert(name);
    }
    assert!(
        hosts.is_subset(&claimed_nodes),
        "the pods run on Karpenter's nodes: pods on {hosts:?}, NodeClaims' nodes {claimed_nodes:?}"
    );

    // Scaled to 0: the nodes are empty, and with consolidateAfter 0s Karpenter deletes NodeClaims and Nodes.
    deployments
        .patch(
            APP,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "replicas": 0 } })),
        )
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(180),
        "NodeClaims and nodes of NodePool default gone",
        || {
            let api = claims_api.clone();
            let nodes = nodes.clone();
            let claimed_nodes = claimed_nodes.clone();
            async move {
                if !pool_claims(&api).await.is_empty() {
                    return false;
                }
                for n in &claimed_nodes {
                    if nodes.get_opt(n).await.unwrap().is_some() {
                        return false;
                    }
                }
                true
            }
        },
    )
    .await;
    // The node Karpenter does not own stays.
    assert!(nodes.get_opt("karp-small").await.unwrap().is_some());
    let out = kubectl(c, &["delete", "deployment", APP, "--ignore-not-found"]);
    assert!(out.status.success());
}

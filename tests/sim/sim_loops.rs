//! The simulated control loops and the admin API, at a time scale of 20 (40 s of grace take 2 s).
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, EvictParams, ListParams};
use nodekeeper_sim::apiserver::scenario::Scenario;
use nodekeeper_sim::apiserver::{SimOptions, TestCluster};
use serde_json::{json, Value};

async fn fast_cluster() -> TestCluster {
    let opts = SimOptions {
        time_scale: 20.0,
        scenario: Scenario::default_mixed(),
        ..Default::default()
    };
    TestCluster::start(opts).await.unwrap()
}

async fn eventually<F, Fut>(what: &str, secs: u64, f: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = bool>,
{
    crate::support::wait::until(Duration::from_secs(secs), what, f).await
}

async fn admin(c: &TestCluster, method: &str, path: &str, body: Value) -> Value {
    let req = axum::http::Request::builder()
        .method(method)
        .uri(format!("/sim/v1/{path}"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).unwrap())
        .unwrap();
    c.client.request::<Value>(req).await.unwrap()
}

fn condition(n: &Node, t: &str) -> Option<String> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == t)
        .map(|c| c.status.clone())
}

async fn ready_web_pods(pods: &Api<Pod>) -> Vec<Pod> {
    pods.list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_cluster_converges() {
    let c = fast_cluster().await;
    let deploys: Api<Deployment> = Api::namespaced(c.client.clone(), "default");
    let ds: Api<DaemonSet> = Api::namespaced(c.client.clone(), "kube-system");
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), "kube-node-lease");
    eventually("web has 4 ready replicas", 15, || async {
        deploys
            .get("web")
            .await
            .unwrap()
            .status
            .and_then(|s| s.ready_replicas)
            == Some(4)
    })
    .await;
    eventually("node-exporter runs on all 5 nodes", 15, || async {
        ds.get("node-exporter")
            .await
            .unwrap()
            .status
            .map(|s| s.number_ready)
            == Some(5)
    })
    .await;
    eventually("5 node leases", 15, || async {
        leases
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len()
            == 5
    })
    .await;
    let pods: Api<Pod> = Api::all(c.client.clone());
    for p in pods.list(&ListParams::default()).await.unwrap() {
        assert!(
            p.spec.unwrap().node_name.is_some(),
            "every pod is scheduled"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missed_heartbeats_make_a_node_unknown_and_recover() {
    let c = fast_cluster().await;
    let nodes: Api<Node> = Api::all(c.client.clone());
    eventually("general-0 has a lease", 10, || async {
        c.sim
            .store
            .get(
                nodekeeper_sim::apiserver::resources::well_known::leases(),
                "kube-node-lease",
                "general-0",
            )
            .is_some()
    })
    .await;
    // Conditions the node-lifecycle controller does not own (nodekeeper's, NetworkUnavailable).
    let ours = json!({"type": "NodekeeperHeld", "status": "True", "reason": "BlockedByPDB",
        "message": "held", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
        "lastTransitionTime": "2026-01-01T00:00:00Z"});
    let net = json!({"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated",
        "message": "routes", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
        "lastTransitionTime": "2026-01-01T00:00:00Z"});
    nodes
        .patch_status(
            "general-0",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Strategic(json!({"status": {"conditions": [ours, net]}})),
        )
        .await
        .unwrap();
    admin(
        &c,
        "POST",
        "nodes/general-0/heartbeat",
        json!({"stopped": true}),
    )
    .await;
    eventually("general-0 Ready=Unknown", 10, || async {
        condition(&nodes.get("general-0").await.unwrap(), "Ready").as_deref() == Some("Unknown")
    })
    .await;
    let n = nodes.get("general-0").await.unwrap();
    // Only Ready, MemoryPressure, DiskPressure and PIDPressure turn Unknown (as the real
    // node-lifecycle controller); every other condition is exactly as it was.
    let conds = n.status.as_ref().unwrap().conditions.as_ref().unwrap();
    for c in conds {
        let want = match c.type_.as_str() {
            "Ready" | "MemoryPressure" | "DiskPressure" | "PIDPressure" => "Unknown",
            "NodekeeperHeld" => "True",
            _ => "False",
        };
        assert_eq!(c.status, want, "{c:?}");
    }
    let held = conds.iter().find(|c| c.type_ == "NodekeeperHeld").unwrap();
    assert_eq!(serde_json::to_value(held).unwrap(), ours);
    let nu = conds
        .iter()
        .find(|c| c.type_ == "NetworkUnavailable")
        .unwrap();
    assert_eq!(serde_json::to_value(nu).unwrap(), net);
    let taints = n.spec.unwrap().taints.unwrap();
    assert!(taints
        .iter()
        .any(|t| t.key == "node.kubernetes.io/unreachable" && t.effect == "NoSchedule"));
    assert_eq!(
        condition(&nodes.get("general-1").await.unwrap(), "Ready").as_deref(),
        Some("True"),
        "others stay Ready"
    );
    admin(
        &c,
        "POST",
        "nodes/general-0/heartbeat",
        json!({"stopped": false}),
    )
    .await;
    eventually(
        "general-0 Ready again without unreachable taints",
        10,
        || async {
            let n = nodes.get("general-0").await.unwrap();
            let tainted = n
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|ts| {
                    ts.iter()
                        .any(|t| t.key.starts_with("node.kubernetes.io/unreachable"))
                });
            condition(&n, "Ready").as_deref() == Some("True")
                && condition(&n, "MemoryPressure").as_deref() == Some("False")
                && condition(&n, "NodekeeperHeld").as_deref() == Some("True")
                && !tainted
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_nodeclaim_replaces_the_node() {
    let c = fast_cluster().await;
    let nodes: Api<Node> = Api::all(c.client.clone());
    let claims: Api<kube::api::DynamicObject> = Api::all_with(
        c.client.clone(),
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("karpenter.sh", "v1", "NodeClaim"),
            "nodeclaims",
        ),
    );
    claims
        .delete("spot-0", &DeleteParams::default())
        .await
        .unwrap();
    eventually("spot-0 removed", 10, || async {
        nodes.get_opt("spot-0").await.unwrap().is_none()
    })
    .await;
    assert!(
        claims.get_opt("spot-0").await.unwrap().is_none(),
        "claim released"
    );
    eventually("a replacement spot node", 10, || async {
        nodes
            .list(&ListParams::default().labels("karpenter.sh/nodepool=spot"))
            .await
            .unwrap()
            .items
            .len()
            == 2
    })
    .await;
    let spot = nodes
        .list(&ListParams::default().labels("karpenter.sh/capacity-type=spot"))
        .await
        .unwrap();
    assert!(spot
        .items
        .iter()
        .any(|n| n.metadata.name.as_deref() == Some("spot-r1")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_is_graceful_and_the_pdb_waits_for_the_replacement() {
    let c = fast_cluster().await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let pdbs: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(c.client.clone(), "default");
    // The eviction decides from the PDB's status, as on a real cluster: wait until the disruption
    // loop has counted the Ready pods, not only until they are Ready.
    let counted = || async {
        ready_web_pods(&pods).await.len() == 4
            && pdbs
                .get("web-pdb")
                .await
                .unwrap()
                .status
                .is_some_and(|s| s.current_healthy == 4)
    };
    eventually("4 ready web pods, counted by the PDB", 15, counted).await;
    let victims = ready_web_pods(&pods).await;
    let first = victims[0].metadata.name.clone().unwrap();
    let second = victims[1].metadata.name.clone().unwrap();
    pods.evict(&first, &EvictParams::default()).await.unwrap();
    let terminating = pods.get(&first).await.unwrap();
    assert!(
        terminating.metadata.deletion_timestamp.is_some(),
        "graceful: the pod terminates first"
    );
    // maxUnavailable 1: while the first one is terminating/replaced, the next eviction is refused.
    match pods.evict(&second, &EvictParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 429, "{}", s.message),
        other => panic!("expected 429, got {other:?}"),
    }
    eventually("first pod gone after its grace period", 10, || async {
        pods.get_opt(&first).await.unwrap().is_none()
    })
    .await;
    eventually("replacement ready, counted by the PDB", 15, counted).await;
    pods.evict(&second, &EvictParams::default()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_conditions_time_and_state() {
    let c = fast_cluster().await;
    let nodes: Api<Node> = Api::all(c.client.clone());
    admin(
        &c,
        "POST",
        "nodes/general-1/conditions",
        json!({"type": "Ready", "status": "False", "reason": "Test"}),
    )
    .await;
    admin(
        &c,
        "POST",
        "nodes/general-1/conditions",
        json!({"type": "KernelDeadlock", "status": "True"}),
    )
    .await;
    // Two heartbeats of general-1's kubelet (its Lease renewed twice): a whole pass of the kubelet
    // loop, which sets Ready=True unless pinned, ran after the pins.
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), "kube-node-lease");
    let renewed = || async {
        let l = leases.get_opt("general-1").await.unwrap();
        l.and_then(|l| l.spec).and_then(|s| s.renew_time)
    };
    let mut last = renewed().await;
    for beat in ["a heartbeat after the pins", "a second heartbeat"] {
        let seen = last.clone();
        last = crate::support::wait::until(Duration::from_secs(10), beat, || async {
            let now = renewed().await;
            (now != seen).then_some(now)
        })
        .await;
    }
    let n = nodes.get("general-1").await.unwrap();
    assert_eq!(
        condition(&n, "Ready").as_deref(),
        Some("False"),
        "the kubelet keeps a pinned condition"
    );
    assert_eq!(condition(&n, "KernelDeadlock").as_deref(), Some("True"));
    let before = admin(&c, "GET", "state", json!(null)).await;
    let t0 = chrono::DateTime::parse_from_rfc3339(before["now"].as_str().unwrap()).unwrap();
    admin(&c, "POST", "time/advance", json!({"seconds": 3600})).await;
    let after = admin(&c, "GET", "state", json!(null)).await;
    let t1 = chrono::DateTime::parse_from_rfc3339(after["now"].as_str().unwrap()).unwrap();
    assert!((t1 - t0).num_seconds() >= 3600);
    assert_eq!(after["objects"]["v1/nodes"].as_array().unwrap().len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_scenario_file_seeds_and_schedules() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/sim-scenario.toml");
    let scenario = Scenario::load(&path).unwrap();
    let opts = SimOptions {
        time_scale: 20.0,
        scenario,
        ..Default::default()
    };
    let c = TestCluster::start(opts).await.unwrap();
    let nodes: Api<Node> = Api::all(c.client.clone());
    assert_eq!(
        nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        6
    );
    let gpu = nodes.get("gpu-0").await.unwrap();
    assert_eq!(gpu.spec.unwrap().taints.unwrap()[0].key, "example.com/gpu");
    let ml: Api<Pod> = Api::namespaced(c.client.clone(), "ml");
    eventually("the train pod runs on the gpu node", 15, || async {
        let pods = ml
            .list(&ListParams::default().labels("app=train"))
            .await
            .unwrap()
            .items;
        pods.len() == 1
            && pods[0].spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("gpu-0")
    })
    .await;
    let web: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    eventually("web pods avoid the tainted gpu node", 15, || async {
        let pods = web
            .list(&ListParams::default().labels("app=web"))
            .await
            .unwrap()
            .items;
        pods.len() == 4
            && pods.iter().all(|p| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .is_some_and(|n| n != "gpu-0")
            })
    })
    .await;
    assert!(Scenario::load(std::path::Path::new("/nonexistent.toml")).is_err());
}

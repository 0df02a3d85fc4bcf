//! OCI Events notices survive a controller kill: the endpoint answers 2xx only once the notice
//! is stored on the Node (the interruption annotation, in the same patch as the taint and the
//! cordon), so a delivery answered 2xx is never lost; a replica that cannot store it (a
//! follower, or an API server refusing every write) answers 503 and OCI Notifications retries;
//! a redelivery is idempotent.
//!
//! Sim only: uses the sim's fault injection (an API server refusing every write); OCI Events
//! delivery runs on both in `tests/e2e` (`preemption::oci_events_…`).
#![allow(clippy::unwrap_used)]

use crate::support::engine as engine_support;

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use nodekeeper_core::controller::act::provider::fake::FakeProvider;
use nodekeeper_core::controller::config::ControllerConfig;
use nodekeeper_core::controller::policy::view::keys;
use nodekeeper_core::controller::policy::PolicyConfig;
use nodekeeper_core::controller::Running;
use nodekeeper_sim::apiserver::scenario::Scenario;
use nodekeeper_sim::apiserver::TestCluster;
use nodekeeper_sim::oci_events::{envelope, OciEventKind};

use engine_support::*;

const TOKEN: &str = "oci-notice-token-0123";
const TAINT: &str = "nodekeeper.io/interruption";

fn ocid(node: &str) -> String {
    format!("ocid1.instance.oc1.phx.{node}")
}

fn config(id: &str) -> ControllerConfig {
    let mut c = controller_config(id);
    c.oci_events.enabled = true;
    c.oci_events.token = TOKEN.into();
    c.oci_events.confirm_subscriptions = false;
    c
}

/// POSTs a preemption notice for `node` to `ctl`: (status, Retry-After, body).
async fn post(ctl: &Running, node: &str) -> (u16, Option<String>, serde_json::Value) {
    post_kind(ctl, node, OciEventKind::Preemption, "").await
}

/// POSTs the OCI event `kind` (maintenance window `window`) for `node` to `ctl`.
async fn post_kind(
    ctl: &Running,
    node: &str,
    kind: OciEventKind,
    window: &str,
) -> (u16, Option<String>, serde_json::Value) {
    let r = nodekeeper_core::http::client()
        .unwrap()
        .post(format!("http://{}/v1/oci-events/{TOKEN}", ctl.addr))
        .json(&envelope(kind, &ocid(node), window))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    (status, retry, r.json().await.unwrap_or_default())
}

async fn tainted(c: &TestCluster, name: &str) -> bool {
    let n = node(c, name).await;
    taint(&n, TAINT).is_some() && unschedulable(&n)
}

async fn faults(c: &TestCluster, spec: Option<serde_json::Value>) {
    let http = nodekeeper_core::http::client().unwrap();
    let url = c.admin_url("faults");
    let r = match spec {
        Some(s) => http.put(url).json(&s).send().await.unwrap(),
        None => http.delete(url).send().await.unwrap(),
    };
    assert!(r.status().is_success(), "{}", r.status());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oci_notice_is_answered_2xx_only_once_stored_on_the_node() {
    // Scale 1: the notice's times are wall-clock (OCI sends none; detection + default lead).
    let mut s = Scenario::default_mixed();
    s.workloads.clear();
    s.daemonsets.clear();
    let c = cluster(1.0, s, loops()).await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.client.clone());
    for n in ["spot-0", "spot-1"] {
        let p = serde_json::json!({"spec": {"providerID": format!("oci://{}", ocid(n))}});
        nodes
            .patch(n, &PatchParams::default(), &Patch::Merge(&p))
            .await
            .unwrap();
    }
    let fake = Arc::new(FakeProvider::new());
    let a = controller(
        &c,
        &config("engine-oci-a"),
        PolicyConfig::default(),
        Some(fake.clone()),
    )
    .await;
    let b = start_engine(
        &c,
        &config("engine-oci-b"),
        PolicyConfig::default(),
        Some(fake),
    )
    .await;
    wait_until(
        Duration::from_secs(10),
        "providerIDs in both caches",
        || async {
            let ready = |r: &Running| {
                r.app
                    .oci
                    .as_ref()
                    .unwrap()
                    .node_for(&ocid("spot-1"))
                    .is_some()
            };
            ready(&a) && ready(&b) && b.app.ready.load(std::sync::atomic::Ordering::Relaxed)
        },
    )
    .await;
    assert!(!*b.app.leader.borrow(), "b follows");

    // The leader answers 200 only after the taint, the cordon and the record are stored.
    let (status, _, body) = post(&a, "spot-0").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["recorded"], true, "{body}");
    let n = node(&c, "spot-0").await;
    assert!(
        taint(&n, TAINT).is_some(),
        "answered before the taint was stored"
    );
    assert!(unschedulable(&n), "answered before the cordon was stored");
    let id = body["id"].as_str().unwrap();
    let recorded = annotation(&n, keys::INTERRUPTION).unwrap();
    assert!(recorded.contains(id), "{recorded} does not name {id}");

    // A redelivery: 200 again, nothing new, the same record.
    let (status, _, again) = post(&a, "spot-0").await;
    assert_eq!(
        (status, &again["new"]),
        (200, &serde_json::json!(false)),
        "{again}"
    );
    assert_eq!(
        annotation(&node(&c, "spot-0").await, keys::INTERRUPTION),
        Some(recorded)
    );

    // A follower cannot store it: 503 with Retry-After, and it writes nothing.
    let (status, retry, body) = post(&b, "spot-1").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(retry.as_deref(), Some("1"));
    assert!(
        body["error"].as_str().unwrap().contains("not the leader"),
        "{body}"
    );

    // The leader cannot store it while the API server refuses every request: 503.
    faults(&c, Some(serde_json::json!({"errorRates": {"500": 1.0}}))).await;
    let (status, _, body) = post(&a, "spot-1").await;
    faults(&c, None).await;
    assert_eq!(status, 503, "{body}");

    // OCI Notifications retries: once a replica can store it, 200 and the node is tainted.
    let mut ok = false;
    for _ in 0..40 {
        let (sa, _, _) = post(&a, "spot-1").await;
        let (sb, _, _) = post(&b, "spot-1").await;
        if sa == 200 || sb == 200 {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(ok, "no replica stored the retried notice");
    assert!(tainted(&c, "spot-1").await);
    b.stop().await;
    a.stop().await;
}

/// The pod carrying `nodekeeper.io/leader=true`, as the `nodekeeper-controller-events` Service's
/// selector picks it (the sim runs no kube-proxy: the test routes as the Service would).
async fn events_endpoint(c: &TestCluster) -> Vec<String> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(c.client.clone(), "nodekeeper");
    pods.list(&kube::api::ListParams::default().labels("nodekeeper.io/leader=true"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leaders_pod_takes_deliveries_so_the_first_try_is_stored() {
    let mut s = Scenario::default_mixed();
    s.workloads.clear();
    s.daemonsets.clear();
    let c = cluster(1.0, s, loops()).await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.client.clone());
    for n in ["spot-0", "spot-1"] {
        let p = serde_json::json!({"spec": {"providerID": format!("oci://{}", ocid(n))}});
        nodes
            .patch(n, &PatchParams::default(), &Patch::Merge(&p))
            .await
            .unwrap();
    }
    // The two replicas' pods, as the Deployment would create them (2 replicas).
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(c.client.clone(), "nodekeeper");
    for name in ["nk-a", "nk-b"] {
        let pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "nodekeeper",
                         "labels": {"app.kubernetes.io/name": "nodekeeper-controller"}},
            "spec": {"containers": [{"name": "controller", "image": "nodekeeper"}]}}))
        .unwrap();
        pods.create(&kube::api::PostParams::default(), &pod)
            .await
            .unwrap();
    }
    let replica = |id: &str, pod: &str| {
        let mut cfg = config(id);
        cfg.leader.pod_label = true;
        cfg.leader.pod_name = Some(pod.into());
        cfg
    };
    let fake = Arc::new(FakeProvider::new());
    let a = controller(
        &c,
        &replica("engine-oci-a", "nk-a"),
        PolicyConfig::default(),
        Some(fake.clone()),
    )
    .await;
    let b = start_engine(
        &c,
        &replica("engine-oci-b", "nk-b"),
        PolicyConfig::default(),
        Some(fake),
    )
    .await;
    let label = |name: &'static str| {
        let pods = pods.clone();
        async move {
            pods.get(name)
                .await
                .unwrap()
                .metadata
                .labels
                .unwrap_or_default()
                .get("nodekeeper.io/leader")
                .cloned()
        }
    };
    wait_until(
        Duration::from_secs(10),
        "a labelled leader, b follower",
        || async {
            label("nk-a").await.as_deref() == Some("true")
                && label("nk-b").await.as_deref() == Some("false")
                && b.app.ready.load(std::sync::atomic::Ordering::Relaxed)
                && b.app
                    .oci
                    .as_ref()
                    .unwrap()
                    .node_for(&ocid("spot-1"))
                    .is_some()
        },
    )
    .await;
    assert!(*a.app.leader.borrow() && !*b.app.leader.borrow());
    assert_eq!(
        events_endpoint(&c).await,
        ["nk-a"],
        "only the leader behind the Service"
    );
    // Every delivery through the Service reaches the leader: stored at the first try.
    let (status, _, body) = post(&a, "spot-0").await;
    assert_eq!(
        (status, &body["recorded"]),
        (200, &serde_json::json!(true)),
        "{body}"
    );

    // Failover: a stops (releases the Lease); b leads and its pod takes the label.
    a.stop().await;
    wait_until(Duration::from_secs(10), "b labelled leader", || async {
        *b.app.leader.borrow() && label("nk-b").await.as_deref() == Some("true")
    })
    .await;
    assert_eq!(
        label("nk-a").await.as_deref(),
        Some("false"),
        "a stopping leader clears its label"
    );
    assert_eq!(events_endpoint(&c).await, ["nk-b"]);
    let (status, _, body) = post(&b, "spot-1").await;
    assert_eq!(
        (status, &body["recorded"]),
        (200, &serde_json::json!(true)),
        "{body}"
    );
    assert!(tainted(&c, "spot-1").await);
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_maintenance_begin_acts_at_once_and_its_end_undoes_it() {
    let mut s = Scenario::default_mixed();
    s.workloads.clear();
    s.daemonsets.clear();
    let c = cluster(1.0, s, loops()).await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.client.clone());
    let p = serde_json::json!({"spec": {"providerID": format!("oci://{}", ocid("spot-0"))}});
    nodes
        .patch("spot-0", &PatchParams::default(), &Patch::Merge(&p))
        .await
        .unwrap();
    let fake = Arc::new(FakeProvider::new());
    let a = controller(
        &c,
        &config("engine-oci-m"),
        PolicyConfig::default(),
        Some(fake.clone()),
    )
    .await;
    wait_until(
        Duration::from_secs(10),
        "providerID in the cache",
        || async {
            a.app
                .oci
                .as_ref()
                .unwrap()
                .node_for(&ocid("spot-0"))
                .is_some()
        },
    )
    .await;
    // The scheduled notice (window a day ahead) was missed: the begin alone is acted on now.
    let window = (chrono::Utc::now() + chrono::Duration::days(1)).to_rfc3339();
    let (status, _, body) = post_kind(&a, "spot-0", OciEventKind::MaintenanceBegin, &window).await;
    assert_eq!(
        (status, &body["recorded"]),
        (200, &serde_json::json!(true)),
        "{body}"
    );
    assert!(tainted(&c, "spot-0").await, "not acted on at the begin");
    // The scheduled notice arriving late is the same notice: nothing new.
    let (status, _, late) = post_kind(&a, "spot-0", OciEventKind::Maintenance, &window).await;
    assert_eq!(
        (status, &late["id"], &late["new"]),
        (200, &body["id"], &serde_json::json!(false)),
        "{late}"
    );
    // The end withdraws it: taint and nodekeeper's cordon undone.
    let (status, _, end) = post_kind(&a, "spot-0", OciEventKind::MaintenanceEnd, &window).await;
    assert_eq!(status, 200, "{end}");
    wait_until(Duration::from_secs(10), "the notice undone", || async {
        let n = node(&c, "spot-0").await;
        taint(&n, TAINT).is_none() && !unschedulable(&n)
    })
    .await;
    assert!(fake.requests().is_empty(), "maintenance never replaces");
    a.stop().await;
}

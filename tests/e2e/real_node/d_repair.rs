//! (d) The kubelet's CRI-O stops: the real kubelet reports Ready=False; the controller's repair
//! (the shipped `Ready=False` policy, toleration shortened) cordons and drains within a PDB; CRI-O
//! comes back, the evicted pod's container gets SIGTERM and its grace period, the node is uncordoned,
//! and `nodekeeper status` says what happened at each step.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use nodekeeper_core::controller::policy::view::keys;
use serde_json::json;

use super::{node_script, one_pod, path, real_node, RealNode, NODE};
use crate::drain::create_json;
use crate::support::*;

/// Each container marks its start, its SIGTERM and its end (2 s later) in a file of its own on the
/// node (a hostPath: the kubelet removes a deleted pod's logs).
pub const TRAP: &str =
    "m=/marks/$HOSTNAME; trap 'echo got SIGTERM >>$m; sleep 2; echo done >>$m; exit 0' TERM; \
     echo started >>$m; while true; do sleep 1; done";

/// A Deployment of `replicas` busybox pods that mark SIGTERM and take 2 s to stop ([`TRAP`]).
pub fn workload(ns: &str, name: &str, replicas: u32) -> serde_json::Value {
    let mut d = crate::drain::deployment(ns, name, NODE, replicas);
    let spec = &mut d["spec"]["template"]["spec"];
    spec["terminationGracePeriodSeconds"] = json!(20);
    spec["containers"] = json!([{
        "name": "app", "image": "localhost/nk-busybox:test", "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", TRAP],
        "volumeMounts": [{ "name": "marks", "mountPath": "/marks" }]
    }]);
    let marks = real_node().dir.join("marks").join(ns);
    spec["volumes"] = json!([{ "name": "marks",
        "hostPath": { "path": marks, "type": "DirectoryOrCreate" } }]);
    d
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub async fn wait_pods_ready(pods: &Api<Pod>, n: usize) {
    wait_until(
        Duration::from_secs(90),
        &format!("{n} pods Ready"),
        || async {
            let l = pods.list(&ListParams::default()).await.unwrap().items;
            l.len() == n && l.iter().all(ready)
        },
    )
    .await;
}

/// Waits until `NodekeeperContainerRuntimeUnreachable` has `status`: its (reason, message).
async fn wait_runtime(nodes: &Api<Node>, status: &str) -> (String, String) {
    wait_for(
        Duration::from_secs(90),
        &format!("NodekeeperContainerRuntimeUnreachable={status}"),
        || async {
            let node = nodes.get(NODE).await.ok()?;
            let c = node
                .status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "NodekeeperContainerRuntimeUnreachable")?;
            (c.status == status)
                .then(|| (c.reason.unwrap_or_default(), c.message.unwrap_or_default()))
        },
    )
    .await
}

/// The node's condition `Ready` status.
async fn node_ready(nodes: &Api<Node>) -> String {
    nodes
        .get(NODE)
        .await
        .ok()
        .and_then(|n| n.status?.conditions)
        .and_then(|cs| cs.into_iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status)
        .unwrap_or_default()
}

/// `nodekeeper status -o json` (the admin's kubeconfig: it lists Nodes, nothing else): the node's row.
pub fn status_row(n: &RealNode) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(["status", "-o", "json", "--kubeconfig"])
        .arg(&n.cluster.kubeconfig)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "nodekeeper status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["nodes"].as_array().cloned().unwrap_or_default();
    rows.into_iter()
        .find(|r| r["name"] == NODE)
        .unwrap_or_else(|| panic!("no row for {NODE}: {v}"))
}

/// The marks ([`TRAP`]) of the pods of namespace `ns` whose name starts with `app-`.
pub fn marks(n: &RealNode, ns: &str, app: &str) -> String {
    let mut out = String::new();
    for e in std::fs::read_dir(n.dir.join("marks").join(ns))
        .into_iter()
        .flatten()
        .flatten()
    {
        if e.file_name()
            .to_string_lossy()
            .starts_with(&format!("{app}-"))
        {
            out.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
        }
    }
    out
}

/// Starts the node's CRI-O again when dropped, unless it runs.
struct CrioBack(&'static RealNode);

impl Drop for CrioBack {
    fn drop(&mut self) {
        let pids = std::fs::read_to_string(self.0.dir.join("pids")).unwrap_or_default();
        if !pids.lines().any(|l| l.starts_with("crio ")) {
            node_script(&["crio", path(&self.0.dir), "start"]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_crio_stops_is_repaired_within_its_pdb_and_uncordoned() {
    init_tracing();
    let n = real_node();
    let _one = n.lock().await;
    const APP: &str = "rn-repair";
    let admin = n.cluster.admin().await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let _ = kubectl(n.cluster, &["create", "namespace", APP]);
    create_json(
        &admin,
        APP,
        &[
            workload(APP, "web", 2),
            workload(APP, "solo", 1),
            json!({ "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                    "metadata": { "name": "web", "namespace": APP },
                    "spec": { "minAvailable": 1, "selector": { "matchLabels": { "app": "web" } } } }),
        ],
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), APP);
    wait_pods_ready(&pods, 3).await;

    // CRI-O stops: its containers live on (conmon), the kubelet reports the runtime down. (Started
    // again when this test ends, however it ends: the next tests need the node.)
    let _restart = CrioBack(n);
    let running = (
        one_pod(n, "nodekeeper-agent").await,
        one_pod(n, "nodekeeper-controller").await,
    );
    node_script(&["crio", path(&n.dir), "stop"]);
    let stopped = tokio::time::Instant::now();
    wait_until(
        Duration::from_secs(90),
        "the kubelet reports Ready=False",
        || async { node_ready(&nodes).await == "False" },
    )
    .await;
    eprintln!("Ready=False {:?} after CRI-O stopped", stopped.elapsed());
    // The agent sees the runtime itself too (its socket, not a systemd unit: this CRI-O is none).
    let runtime = wait_runtime(&nodes, "True").await;
    assert!(
        runtime.0 == "RuntimeUnreachable" && runtime.1.contains("crio.sock"),
        "{runtime:?}"
    );

    // The repair: nodekeeper cordons and drains; the solo pod is evicted, the web PDB holds the
    // rest (at most one web pod may go while the other stays).
    wait_until(
        Duration::from_secs(90),
        "cordoned by nodekeeper, solo evicted",
        || async {
            let Ok(node) = nodes.get(NODE).await else {
                return false;
            };
            let cordoned = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
                && annotation(&node, keys::CORDONED_BY) == Some("nodekeeper");
            let solo = pods
                .list(&ListParams::default().labels("app=solo"))
                .await
                .unwrap()
                .items;
            cordoned && solo.iter().any(|p| p.metadata.deletion_timestamp.is_some())
        },
    )
    .await;
    let row = status_row(n);
    eprintln!("status while CRI-O is down: {row}");
    assert!(
        row["state"]
            .as_str()
            .is_some_and(|s| s.starts_with("repairing")),
        "{row}"
    );
    for _ in 0..20 {
        let web = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .unwrap()
            .items;
        let kept = web
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .count();
        assert!(
            kept >= 1,
            "both web pods evicted: the PDB (minAvailable 1) was not respected"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // CRI-O comes back: the evicted pod's container gets SIGTERM and takes its 2 s; healthy for
    // healthy_delay (20 s here), the repair ends and nodekeeper uncordons.
    node_script(&["crio", path(&n.dir), "start"]);
    wait_until(Duration::from_secs(90), "Ready=True again", || async {
        node_ready(&nodes).await == "True"
    })
    .await;
    let runtime = wait_runtime(&nodes, "False").await;
    assert!(
        runtime.0 == "RuntimeAnswers" && runtime.1.starts_with("cri-o "),
        "{runtime:?}"
    );
    // nodekeeper's own pods ran through the CRI-O restart: the same pods, not restarted, Ready again.
    wait_until(
        Duration::from_secs(60),
        "nodekeeper's pods Ready again",
        || async {
            one_pod(n, "nodekeeper-agent").await.3 && one_pod(n, "nodekeeper-controller").await.3
        },
    )
    .await;
    assert_eq!(
        (
            one_pod(n, "nodekeeper-agent").await,
            one_pod(n, "nodekeeper-controller").await
        ),
        running,
        "nodekeeper's pods changed or restarted across the CRI-O restart"
    );
    let solo = wait_for(
        Duration::from_secs(60),
        "the solo pod's SIGTERM and end",
        || async {
            let m = marks(n, APP, "solo");
            (m.contains("got SIGTERM") && m.contains("done")).then_some(m)
        },
    )
    .await;
    eprintln!("solo's marks:\n{solo}");
    let held = annotation(&nodes.get(NODE).await.unwrap(), keys::BLOCKED).map(str::to_string);
    eprintln!(
        "hold while the repair goes on: {held:?}; status: {}",
        status_row(n)
    );
    wait_until(
        Duration::from_secs(120),
        "uncordoned by nodekeeper",
        || async {
            nodes.get(NODE).await.is_ok_and(|node| {
                node.spec.as_ref().and_then(|s| s.unschedulable) != Some(true)
                    && annotation(&node, keys::CORDONED_BY).is_none()
            })
        },
    )
    .await;
    let row = status_row(n);
    eprintln!("status after: {row}");
    assert!(
        row["state"].as_str().is_some_and(|s| s.starts_with("idle")),
        "{row}"
    );
    let web = pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items;
    assert!(
        web.iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .count()
            >= 1,
        "the web PDB was not respected: {web:?}"
    );

    let _ = Api::<Namespace>::all(admin)
        .delete(APP, &DeleteParams::default())
        .await;
}

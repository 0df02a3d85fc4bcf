//! Migration-label rules against the API stand-in over HTTP with the real kube-rs client: the
//! label goes only when this node's Cilium pod is Ready, only from this node.
//!
//! Sim only: the label watch across the sim's dropped watches and compaction; the shipped rule runs
//! on both in `tests/e2e` (`labels`).

use crate::support::agent_proc;

use std::time::Duration;

use agent_proc::{Agent, NO_BUS};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use nodekeeper_core::agent::labels::{self, CleanupRule, LabelsConfig, PatchRemover, RemovalMode};
use nodekeeper_core::wire::LabelRemoval;
use nodekeeper_sim::apiserver::{SimOptions, TestCluster};
use tokio::sync::mpsc::Receiver;

fn node(name: &str) -> Node {
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "labels": { "last-migration-failure": "get_kubesvc_failure", "pool": "spot" } }
    }))
    .unwrap()
}

fn cilium(name: &str, node: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "namespace": "kube-system", "labels": { "k8s-app": "cilium" } },
        "spec": { "nodeName": node, "containers": [{ "name": "agent", "image": "cilium" }] }
    }))
    .unwrap()
}

async fn set_ready(pods: &Api<Pod>, name: &str, ready: bool) {
    let status = if ready { "True" } else { "False" };
    let patch = serde_json::json!({ "status": { "phase": "Running", "conditions": [{ "type": "Ready", "status": status }] } });
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

async fn labels_of(nodes: &Api<Node>, name: &str) -> Vec<String> {
    nodes
        .get(name)
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap_or_default()
        .into_keys()
        .collect()
}

/// The watch's next evaluation (10 s at most).
async fn recv(rx: &mut Receiver<Vec<LabelRemoval>>) -> Vec<LabelRemoval> {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("an evaluation within 10 s")
        .expect("the watch runs")
}

/// `labels::watch` of node `node` with the Cilium rule, removing directly.
fn watch_direct(
    cluster: &TestCluster,
    node: &str,
) -> (
    Receiver<Vec<LabelRemoval>>,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let cfg = LabelsConfig {
        mode: RemovalMode::Direct,
        cleanup: vec![CleanupRule {
            label: "last-migration-failure".into(),
            when_pod_ready: Some(labels::config::PodReady {
                namespace: "kube-system".into(),
                selector: "k8s-app=cilium".into(),
            }),
            when_condition: None,
        }],
    };
    let rules = labels::compile(&cfg).unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let stop = tokio_util::sync::CancellationToken::new();
    let remover = Some(PatchRemover::new(cluster.client.clone()));
    let task = tokio::spawn(labels::watch(
        cluster.client.clone(),
        node.into(),
        rules,
        remover,
        tx,
        stop.clone(),
    ));
    (rx, stop, task)
}

#[tokio::test]
async fn label_is_removed_once_cilium_on_this_node_is_ready() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("nodekeeper=debug,warn")
        .with_test_writer()
        .try_init();
    let cluster = TestCluster::start(SimOptions::bare()).await.unwrap();
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "kube-system");
    for n in ["n1", "n2"] {
        nodes
            .create(&PostParams::default(), &node(n))
            .await
            .unwrap();
    }
    pods.create(&PostParams::default(), &cilium("cilium-a", "n1"))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &cilium("cilium-b", "n2"))
        .await
        .unwrap();
    set_ready(&pods, "cilium-a", false).await;
    // The other node's Cilium is Ready: that must not count for n1.
    set_ready(&pods, "cilium-b", true).await;

    let (mut rx, stop, task) = watch_direct(&cluster, "n1");

    // First evaluation: nothing to remove yet (the watch removes only what an evaluation fires,
    // and the next one it sends, below, must be cilium-a's).
    let first = recv(&mut rx).await;
    assert!(first.is_empty(), "{first:?}");
    assert!(labels_of(&nodes, "n1")
        .await
        .contains(&"last-migration-failure".to_string()));

    set_ready(&pods, "cilium-a", true).await;
    let fired = recv(&mut rx).await;
    assert_eq!(fired.len(), 1);
    assert_eq!(fired[0].label, "last-migration-failure");
    assert!(
        fired[0].reason.contains("kube-system/cilium-a"),
        "{}",
        fired[0].reason
    );

    // The removal was carried out on n1 only (the watch then reports the label gone).
    let gone = recv(&mut rx).await;
    assert!(gone.is_empty(), "{gone:?}");
    assert_eq!(labels_of(&nodes, "n1").await, vec!["pool".to_string()]);
    assert!(labels_of(&nodes, "n2")
        .await
        .contains(&"last-migration-failure".to_string()));

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
}

/// The agent binary with a label rule in `report` mode: the removal appears in its node report
/// (for the controller), and the agent itself does not touch the Node.
#[tokio::test]
async fn agent_reports_the_removal_and_leaves_the_node_alone() {
    let cluster = TestCluster::start(SimOptions::bare()).await.unwrap();
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "kube-system");
    nodes
        .create(&PostParams::default(), &node("n1"))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &cilium("cilium-a", "n1"))
        .await
        .unwrap();
    set_ready(&pods, "cilium-a", true).await;

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig).unwrap();
    let cfg = dir.path().join("agent.toml");
    std::fs::write(
        &cfg,
        "[sources]\ncloud = \"none\"\n[agent]\nshutdown_watcher = false\n[checks]\ninterval = \"1h\"\n\
         [[labels.cleanup]]\nlabel = \"last-migration-failure\"\nwhen_pod_ready = { namespace = \"kube-system\", selector = \"k8s-app=cilium\" }\n",
    )
    .unwrap();
    let mut agent = Agent::start_with_env(
        &cfg,
        dir.path(),
        NO_BUS,
        &[
            ("KUBECONFIG", kubeconfig.as_os_str()),
            ("NODEKEEPER_NODE_NAME", "n1".as_ref()),
        ],
    );
    let report = agent
        .report_with(
            |r| {
                r["label_removals"]
                    .as_array()
                    .is_some_and(|a| !a.is_empty())
            },
            "a report with the removal",
            Duration::from_secs(20),
        )
        .await;
    assert_eq!(report["node"], "n1");
    assert_eq!(
        report["label_removals"][0]["label"],
        "last-migration-failure"
    );
    agent.terminate(Duration::from_secs(10)).await;
    assert!(
        labels_of(&nodes, "n1")
            .await
            .contains(&"last-migration-failure".to_string()),
        "report mode never writes the Node"
    );
}

/// A node that carries no rule label when the agent starts (its pods are then not watched) and gets
/// it later, its Cilium pod Ready all along: the label is removed once it appears (the pod watch
/// starts with it), and again when it comes back.
#[tokio::test]
async fn a_label_that_appears_later_is_removed_too() {
    let cluster = TestCluster::start(SimOptions::bare()).await.unwrap();
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "kube-system");
    let mut clean = node("n1");
    clean.metadata.labels = Some([("pool".to_string(), "spot".to_string())].into());
    nodes.create(&PostParams::default(), &clean).await.unwrap();
    pods.create(&PostParams::default(), &cilium("cilium-a", "n1"))
        .await
        .unwrap();
    set_ready(&pods, "cilium-a", true).await;
    let (mut rx, stop, task) = watch_direct(&cluster, "n1");
    let first = recv(&mut rx).await;
    assert!(first.is_empty(), "{first:?}");

    for round in 0..2 {
        let add = serde_json::json!({ "metadata": { "labels": { "last-migration-failure": "get_kubesvc_failure" } } });
        nodes
            .patch("n1", &PatchParams::default(), &Patch::Merge(&add))
            .await
            .unwrap();
        let fired = recv(&mut rx).await;
        assert_eq!(fired.len(), 1, "round {round}: {fired:?}");
        assert!(
            fired[0].reason.contains("kube-system/cilium-a"),
            "{fired:?}"
        );
        let gone = recv(&mut rx).await;
        assert!(gone.is_empty(), "round {round}: {gone:?}");
        assert_eq!(labels_of(&nodes, "n1").await, vec!["pool".to_string()]);
    }

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
}

//! (c) A drop-in added to the agent's ConfigMap and rolled out reaches a real crio.service through
//! the D-Bus socket the DaemonSet mounts: one restart, the live value; (g) a rolling update with the
//! same config applies nothing twice and loses no report.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::{agent_silent, last_sequence, real_node, unknown_conditions, RealNode};
use crate::shared::nspawn::{crio_starts_in, CRIO_JOURNAL};
use crate::support::*;

const DROPIN: &str = "[crio.runtime]\npids_limit = 4096\n";

fn starts(n: &RealNode) -> usize {
    crio_starts_in(&n.crio.exec_ok(&CRIO_JOURNAL))
}

fn main_pid(n: &RealNode) -> String {
    n.crio
        .exec_ok(&["systemctl", "show", "-P", "MainPID", "crio.service"])
        .trim()
        .to_string()
}

/// `pids_limit` in the live configuration of the nspawn node's CRI-O (`crio status config`); None
/// while it cannot answer.
fn live_pids_limit(n: &RealNode) -> Option<i64> {
    let out = std::process::Command::new(super::crio_bin().join("crio"))
        .args(["status", "--socket"])
        .arg(n.crio.crio_socket())
        .arg("config")
        .output()
        .unwrap();
    if !out.status.success() {
        return None; // (restarting: no socket for a moment)
    }
    let t: toml::Table = String::from_utf8_lossy(&out.stdout)
        .parse()
        .expect("crio status config is TOML");
    t.get("crio")?
        .get("runtime")?
        .get("pids_limit")?
        .as_integer()
}

/// `kubectl rollout restart` of the agent DaemonSet, then `rollout status` until it is done.
fn roll_agents(n: &RealNode) {
    let c = n.cluster;
    assert!(kubectl(
        c,
        &["-n", NS, "rollout", "restart", "daemonset/nodekeeper-agent"]
    )
    .status
    .success());
    let out = kubectl(
        c,
        &[
            "-n",
            NS,
            "rollout",
            "status",
            "daemonset/nodekeeper-agent",
            "--timeout=120s",
        ],
    );
    assert!(out.status.success(), "the DaemonSet did not roll out");
}

async fn agent_config(n: &RealNode) -> (Api<ConfigMap>, String) {
    let cms: Api<ConfigMap> = Api::namespaced(n.cluster.admin().await, NS);
    let cm = cms.get("nodekeeper-agent").await.unwrap();
    let text = cm.data.unwrap()["config.toml"].clone();
    (cms, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropin_rolled_out_restarts_the_real_crio_once_through_the_mounted_bus() {
    init_tracing();
    let n = real_node();
    let _one = n.lock().await;
    let (cms, text) = agent_config(n).await;
    let (starts0, pid0) = (starts(n), main_pid(n));
    let silent0 = agent_silent(n).await;
    assert_ne!(
        live_pids_limit(n),
        Some(4096),
        "already set before the test"
    );

    // The operator's change: one drop-in in the agent's ConfigMap, then a rollout.
    let with =
        format!("{text}\n[[crio.dropin]]\nname = \"20-pids.conf\"\ncontent = '''\n{DROPIN}'''\n");
    cms.patch(
        "nodekeeper-agent",
        &PatchParams::default(),
        &Patch::Merge(json!({ "data": { "config.toml": with } })),
    )
    .await
    .unwrap();
    roll_agents(n);

    wait_until(
        Duration::from_secs(60),
        "pids_limit = 4096 live",
        || async { live_pids_limit(n) == Some(4096) },
    )
    .await;
    // Exactly one restart: one more CRI-O start, a new main PID; the file is in the node's dir.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(starts(n), starts0 + 1, "CRI-O starts");
    assert_ne!(main_pid(n), pid0);
    let file = n.crio.dropin_dir().join("20-pids.conf");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), DROPIN);
    let logs = kubectl(
        n.cluster,
        &[
            "-n",
            NS,
            "logs",
            "-l",
            "app.kubernetes.io/name=nodekeeper-agent",
            "--tail=-1",
        ],
    );
    let logs = String::from_utf8_lossy(&logs.stdout);
    assert!(
        logs.contains("restarted after drop-in change"),
        "the agent pod's log:\n{logs}"
    );

    // (g) The same config rolled again: the new pod finds it applied (no write, no restart).
    let (mtime, starts1) = (
        std::fs::metadata(&file).unwrap().modified().unwrap(),
        starts(n),
    );
    let nodes: Api<Node> = Api::all(n.cluster.admin().await);
    let seq_before = last_sequence(&nodes).await;
    roll_agents(n);
    wait_until(
        Duration::from_secs(60),
        "a report from the new agent pod",
        || async { last_sequence(&nodes).await != seq_before },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        starts(n),
        starts1,
        "a rollout of the same config restarted CRI-O"
    );
    assert_eq!(
        std::fs::metadata(&file).unwrap().modified().unwrap(),
        mtime,
        "rewritten"
    );
    // Nothing left queued by the old pod: its persisted queue (on the /etc/crio hostPath) is empty.
    let queue = n
        .crio
        .dir()
        .join("root/etc/crio/nodekeeper-state/reporter-events.json");
    let q = std::fs::read_to_string(&queue).unwrap_or_default();
    assert!(!q.contains("\"id\""), "events left in the queue: {q}");
    // Across both rollouts the controller missed no report for longer than its staleness: no
    // new AgentSilent Event about the node, no condition of nodekeeper's turned Unknown.
    assert_eq!(
        agent_silent(n).await,
        silent0,
        "the controller saw the agent silent during a rollout"
    );
    let unknown = unknown_conditions(n).await;
    assert!(unknown.is_empty(), "{unknown:?}");

    // Back to the shipped config; the drop-in stays on the node (the agent never deletes one).
    cms.patch(
        "nodekeeper-agent",
        &PatchParams::default(),
        &Patch::Merge(json!({ "data": { "config.toml": text } })),
    )
    .await
    .unwrap();
    roll_agents(n);
    let _ = std::fs::remove_file(&file);
}

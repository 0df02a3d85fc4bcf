//! (f) A Spot interruption notice from Amazon's own metadata mock (AEMM, at 169.254.169.254 inside
//! the node's network namespace), found by the shipped agent's auto-detection: cordon and taint, a
//! drain of the node's real pods (SIGTERM, grace), a replacement request. Last in the module: the
//! node stays cordoned, as a node about to be reclaimed does (the module's lock is FIFO, and this
//! test starts last).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use nodekeeper_core::controller::policy::view::keys;

use super::d_repair::{marks, wait_pods_ready, workload};
use super::{node_script, path, real_node, NODE};
use crate::drain::create_json;
use crate::support::*;

fn aemm_bin() -> std::path::PathBuf {
    let out = std::process::Command::new(repo().join("scripts/setup-peers.sh"))
        .arg("aemm")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/setup-peers.sh aemm: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string();
    std::path::Path::new(&dir).join("ec2-metadata-mock")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_notice_from_aemm_cordons_drains_and_asks_for_a_replacement() {
    init_tracing();
    let n = real_node();
    let _one = n.lock().await;
    const APP: &str = "rn-notice";
    let admin = n.cluster.admin().await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let _ = kubectl(n.cluster, &["create", "namespace", APP]);
    create_json(&admin, APP, &[workload(APP, "web", 2)]).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), APP);
    wait_pods_ready(&pods, 2).await;
    let before = n.replacements.lock().unwrap().len();

    // AEMM in the node's namespace: its Spot notice 40 s after it starts (404 until then).
    let aemm = aemm_bin();
    node_script(&[
        "run",
        path(&n.dir),
        "aemm",
        "sh",
        "-c",
        "ip addr add 169.254.169.254/32 dev lo && exec \"$0\" \"$@\"",
        aemm.to_str().unwrap(),
        "spot",
        "-d",
        "40",
        "--imdsv2",
        "-n",
        "169.254.169.254",
        "-p",
        "80",
    ]);
    // The agent detects the cloud when it starts: a new pod (as after a node image with IMDS).
    assert!(kubectl(
        n.cluster,
        &["-n", NS, "rollout", "restart", "daemonset/nodekeeper-agent"]
    )
    .status
    .success());
    assert!(kubectl(
        n.cluster,
        &[
            "-n",
            NS,
            "rollout",
            "status",
            "daemonset/nodekeeper-agent",
            "--timeout=120s"
        ]
    )
    .status
    .success());

    let node = crate::preemption::wait_interrupted(&nodes, NODE, Duration::from_secs(120)).await;
    let notice = annotation(&node, keys::INTERRUPTION)
        .unwrap_or_default()
        .to_string();
    assert!(notice.starts_with("preemption/"), "{notice}");

    // The workload leaves the node.
    wait_until(Duration::from_secs(90), "the web pods drained", || async {
        pods.list(&ListParams::default().labels("app=web"))
            .await
            .unwrap()
            .items
            .iter()
            .all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(NODE))
    })
    .await;
    // Each container got SIGTERM and the 2 s it takes (within its grace period): its own marks.
    let marks = marks(n, APP, "web");
    assert_eq!(marks.matches("got SIGTERM").count(), 2, "{marks}");
    assert_eq!(marks.matches("done").count(), 2, "{marks}");

    wait_until(Duration::from_secs(60), "a replacement request", || async {
        n.replacements.lock().unwrap().len() > before
    })
    .await;
    let req = n.replacements.lock().unwrap()[before].clone();
    assert_eq!(req["node"], NODE, "{req}");
    assert_eq!(req["reason"], "interruption:preemption", "{req}");

    node_script(&["stop", path(&n.dir), "aemm"]);
    let _ = n.exec(&["ip", "addr", "del", "169.254.169.254/32", "dev", "lo"]);
    let _ = Api::<Namespace>::all(admin)
        .delete(APP, &DeleteParams::default())
        .await;
}

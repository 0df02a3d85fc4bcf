//! (b) The agent pod's checks read the host: every `Nodekeeper*` condition known, and a node disk
//! filled past the threshold turns `NodekeeperDiskPressure` True.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::api::Api;

use super::{real_node, RealNode, NODE};
use crate::support::*;

fn nodekeeper_conditions(node: &Node) -> Vec<NodeCondition> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.type_.starts_with("Nodekeeper"))
        .collect()
}

async fn condition(n: &RealNode, t: &str) -> Option<NodeCondition> {
    nodekeeper_conditions(&n.node().await)
        .into_iter()
        .find(|c| c.type_ == t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checks_read_the_host_and_a_full_disk_is_pressure() {
    init_tracing();
    let n = real_node();
    let _one = n.lock().await;
    let nodes: Api<Node> = Api::all(n.cluster.admin().await);
    wait_first_report(&nodes, NODE).await;

    // Every check's condition, none Unknown (the flap guard needs 3 rounds of 10 s to settle).
    let want = [
        "NodekeeperMemoryPressure",
        "NodekeeperDiskPressure",
        "NodekeeperInodePressure",
        "NodekeeperPIDPressure",
        "NodekeeperKernelDeadlock",
        "NodekeeperReadonlyFilesystem",
        "NodekeeperContainerRuntimeUnreachable",
    ];
    let conds = wait_for(
        Duration::from_secs(90),
        "every check's condition known",
        || async {
            let cs = nodekeeper_conditions(&n.node().await);
            let known = want
                .iter()
                .all(|w| cs.iter().any(|c| c.type_ == *w && c.status != "Unknown"));
            (known && cs.iter().all(|c| c.status != "Unknown")).then_some(cs)
        },
    )
    .await;
    for c in &conds {
        eprintln!(
            "{} {} {} {}",
            c.type_,
            c.status,
            c.reason.as_deref().unwrap_or(""),
            c.message.as_deref().unwrap_or("")
        );
        assert!(
            c.status == "True" || c.status == "False",
            "{}: {}",
            c.type_,
            c.status
        );
    }
    // The crio.service unit of the nspawn node, over the bus the DaemonSet mounts.
    assert!(
        conds.iter().any(|c| c.type_ != "NodekeeperPIDPressure"
            && c.message
                .as_deref()
                .is_some_and(|m| m.contains("crio.service"))),
        "no condition names crio.service: {conds:?}"
    );
    // The disk paths are the host's, seen through /host: the node's 32 MiB data disk by its size.
    let disk = n.disk.display().to_string();
    let dp = condition(n, "NodekeeperDiskPressure").await.unwrap();
    let msg = dp.message.clone().unwrap_or_default();
    assert_eq!(dp.status, "False", "{msg}");
    assert!(
        msg.contains(&format!("{disk}: ")) && msg.contains("of 32.0 MiB"),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("{}: ", n.env("KUBELET_ROOT"))),
        "{msg}"
    );

    // Fill the data disk to 2 MiB free, under the 4 MiB threshold.
    n.exec(&[
        "dd",
        "if=/dev/zero",
        &format!("of={disk}/fill"),
        "bs=1M",
        "count=30",
    ]);
    let full = wait_for(
        Duration::from_secs(90),
        "NodekeeperDiskPressure True",
        || async {
            condition(n, "NodekeeperDiskPressure")
                .await
                .filter(|c| c.status == "True")
        },
    )
    .await;
    assert_eq!(full.reason.as_deref(), Some("DiskSpaceLow"));
    assert!(
        full.message.as_deref().is_some_and(|m| m.contains(&disk)),
        "{full:?}"
    );

    n.exec(&["rm", &format!("{disk}/fill")]);
    wait_for(
        Duration::from_secs(90),
        "NodekeeperDiskPressure False again",
        || async {
            condition(n, "NodekeeperDiskPressure")
                .await
                .filter(|c| c.status == "False")
        },
    )
    .await;
}

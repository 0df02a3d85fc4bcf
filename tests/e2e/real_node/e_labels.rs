//! (e) The shipped migration-label rule on the real node: `last-migration-failure` goes once a
//! Cilium-like DaemonSet pod there turns Ready (its readiness probe), not before.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

use super::{real_node, NODE};
use crate::support::*;

const LABEL: &str = "last-migration-failure";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_migration_label_goes_once_the_cilium_like_pod_is_ready() {
    init_tracing();
    let n = real_node();
    let _one = n.lock().await;
    let admin = n.cluster.admin().await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let has_label = |node: &Node| {
        node.metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(LABEL))
    };
    nodes
        .patch(
            NODE,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { LABEL: "get_kubesvc_failure" } } })),
        )
        .await
        .unwrap();

    // Ready 20 s after it starts (its readiness probe), as Cilium's agent once its BPF is loaded.
    let ds = json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": { "name": "cilium-like", "namespace": "kube-system" },
        "spec": {
            "selector": { "matchLabels": { "k8s-app": "cilium" } },
            "template": {
                "metadata": { "labels": { "k8s-app": "cilium" } },
                "spec": {
                    "hostNetwork": true,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "agent", "image": "localhost/nk-busybox:test", "imagePullPolicy": "Never",
                        "command": ["/bin/sh", "-c", "sleep 20; touch /tmp/ready; exec sleep 3600"],
                        "readinessProbe": {
                            "exec": { "command": ["/bin/test", "-f", "/tmp/ready"] },
                            "periodSeconds": 1
                        }
                    }]
                }
            }
        }
    });
    crate::drain::create_json(&admin, "kube-system", &[ds]).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "kube-system");
    let (running_at, _) = wait_for(
        Duration::from_secs(60),
        "the cilium-like pod Running",
        || {
            let pods = pods.clone();
            async move {
                let p = pods
                    .list(&kube::api::ListParams::default().labels("k8s-app=cilium"))
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .next()?;
                (p.status.as_ref()?.phase.as_deref() == Some("Running"))
                    .then(|| (std::time::Instant::now(), p))
            }
        },
    )
    .await;
    // Running, not Ready: the label stays.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        has_label(&nodes.get(NODE).await.unwrap()),
        "removed before the pod was Ready"
    );

    wait_until(Duration::from_secs(90), "the label removed", || {
        let nodes = nodes.clone();
        async move { nodes.get(NODE).await.is_ok_and(|node| !has_label(&node)) }
    })
    .await;
    let took = running_at.elapsed();
    assert!(
        took >= Duration::from_secs(15),
        "removed {took:?} after Running: before Ready"
    );
    eprintln!("label removed {took:?} after the pod was Running (Ready at ~20 s)");

    let dss: Api<k8s_openapi::api::apps::v1::DaemonSet> = Api::namespaced(admin, "kube-system");
    dss.delete("cilium-like", &DeleteParams::default())
        .await
        .unwrap();
}

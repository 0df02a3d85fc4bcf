//! The migration-label rule on the real control plane, as shipped: the agent runs with the shipped
//! agent ConfigMap and the environment the shipped DaemonSet gives its pod on that node, with two
//! real tokens bound to that pod (one for the API, one with audience `nodekeeper` for the controller);
//! a Cilium-like DaemonSet pod on the node becomes Ready → the agent asks, the controller (shipped
//! config and RBAC) removes `last-migration-failure` from that node and no other.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use serde_json::json;

use crate::support::*;

const NODE: &str = "lm-0";
const OTHER: &str = "lm-1";
const LABEL: &str = "last-migration-failure";

fn has_label(n: &Node) -> bool {
    n.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(LABEL))
}

on_both!(the_shipped_rule_removes_the_label_once_cilium_on_that_node_is_ready);
async fn the_shipped_rule_removes_the_label_once_cilium_on_that_node_is_ready(c: &'static Cluster) {
    init_tracing();
    let _one_engine = c.exclusive().await;
    let admin = c.admin().await;
    let labels = |n: &str| json!({ LABEL: "get_kubesvc_failure", "kubernetes.io/hostname": n });
    let _nodes = c
        .create_nodes(&[
            kwok_node(NODE, labels(NODE)),
            kwok_node(OTHER, labels(OTHER)),
        ])
        .await;
    let dir = tempfile::tempdir().unwrap();
    let config = controller_toml(dir.path(), "labels", |_| {});
    let ctl = ControllerProc::start(c, &config, "labels").await;

    let mut agent = start_shipped_agent(c, &admin, NODE, dir.path(), ctl.addr.port(), |_| {}).await;

    // The agent reports (the controller writes its heartbeat condition); no Cilium yet: label stays.
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_first_report(&nodes, NODE).await;
    assert!(
        has_label(&nodes.get(NODE).await.unwrap()),
        "removed before Cilium was Ready"
    );

    // A Cilium-like DaemonSet on both nodes; KWOK makes its pods Ready.
    crate::drain::create_json(
        &admin,
        "kube-system",
        &[json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": { "name": "cilium-lm", "namespace": "kube-system" },
            "spec": {
                "selector": { "matchLabels": { "k8s-app": "cilium" } },
                "template": {
                    "metadata": { "labels": { "k8s-app": "cilium" } },
                    "spec": {
                        "nodeSelector": { LABEL: "get_kubesvc_failure" },
                        "tolerations": [{ "operator": "Exists" }],
                        "containers": [{ "name": "cilium-agent", "image": "registry.invalid/cilium:1" }]
                    }
                }
            }
        })],
    )
    .await;
    wait_until(
        Duration::from_secs(30),
        "label removed from lm-0",
        || async { !has_label(&nodes.get(NODE).await.unwrap()) },
    )
    .await;
    // No agent runs on lm-1: its label stays, although its Cilium pod is Ready too.
    assert!(
        has_label(&nodes.get(OTHER).await.unwrap()),
        "another node's label was removed"
    );

    // The label back on lm-0 (a second failed migration): the agent, which stopped watching the
    // pods when the label went, watches them again and the label goes again.
    nodes
        .patch(
            NODE,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({ "metadata": { "labels": { LABEL: "get_kubesvc_failure" } } }),
            ),
        )
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(30),
        "label removed from lm-0 again",
        || async { !has_label(&nodes.get(NODE).await.unwrap()) },
    )
    .await;

    agent.terminate(Duration::from_secs(10)).await;
    assert_eq!(
        ctl.forbidden_lines(),
        Vec::<String>::new(),
        "the controller hit a 403"
    );
    ctl.stop().await;
    let ds: Api<k8s_openapi::api::apps::v1::DaemonSet> =
        Api::namespaced(admin.clone(), "kube-system");
    let _ = ds.delete("cilium-lm", &Default::default()).await;
}

//! (a) The shipped pods run under the real kubelet, Ready with no restart, and use both projected
//! tokens: the agent's label watch and its reports.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;

use super::{one_pod, real_node, real_node_helm, RealNode, NODE};
use crate::support::*;

/// Audit records (JSON lines of the cluster's `--audit` log) by `user` that match `pred`.
pub(super) fn audit(
    n: &RealNode,
    user: &str,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(n.cluster.dir.join("logs/audit.log")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["user"]["username"] == user && pred(e))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kustomize_the_shipped_pods_run_ready_and_use_their_projected_tokens() {
    init_tracing();
    shipped_pods_run_and_use_their_tokens(real_node()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_the_chart_pods_run_ready_and_use_their_projected_tokens() {
    init_tracing();
    shipped_pods_run_and_use_their_tokens(real_node_helm()).await
}

async fn shipped_pods_run_and_use_their_tokens(n: &'static RealNode) {
    let _one = n.lock().await;
    let agent = one_pod(n, "nodekeeper-agent").await;
    let controller = one_pod(n, "nodekeeper-controller").await;
    assert!(
        agent.3 && controller.3,
        "not Ready: {agent:?} {controller:?}"
    );

    // The agent's label watch (its own Node's labels, for the Cilium rule) with the
    // kube-api-access token: the API server names the pod and the node the token is bound to.
    let agent_sa = "system:serviceaccount:nodekeeper:nodekeeper-agent";
    let watches = wait_for(
        Duration::from_secs(60),
        "the agent pod's label watch",
        || {
            let v = audit(n, agent_sa, |e| {
                e["verb"] == "watch"
                    && e["objectRef"]["resource"] == "nodes"
                    && e["objectRef"]["name"] == NODE
                    && e["user"]["extra"]["authentication.kubernetes.io/pod-name"][0]
                        == agent.0.as_str()
                    && e["user"]["extra"]["authentication.kubernetes.io/node-name"][0] == NODE
            });
            async move { (!v.is_empty()).then_some(v) }
        },
    )
    .await;
    eprintln!("agent pod's watch: {}", watches[0]);

    // The reports, with the controller-token (audience nodekeeper): the controller pod reviews it
    // and writes the agent's conditions on the Node.
    let nodes: Api<Node> = Api::all(n.cluster.admin().await);
    wait_first_report(&nodes, NODE).await;
    let reviews = audit(
        n,
        "system:serviceaccount:nodekeeper:nodekeeper-controller",
        |e| {
            e["objectRef"]["resource"] == "tokenreviews"
                && e["user"]["extra"]["authentication.kubernetes.io/pod-name"][0]
                    == controller.0.as_str()
        },
    );
    assert!(!reviews.is_empty(), "the controller pod reviewed no token");

    // The leader labels its own pod (the shipped Role allows it): the events Service, whose
    // selector that label is, has the controller pod as its endpoint.
    wait_until(
        Duration::from_secs(60),
        "nodekeeper-controller-events routes to the leader",
        || async {
            let out = kubectl(
                n.cluster,
                &[
                    "-n",
                    NS,
                    "get",
                    "endpointslices",
                    "-l",
                    "kubernetes.io/service-name=nodekeeper-controller-events",
                    "-o",
                    "jsonpath={.items[*].endpoints[*].targetRef.name}",
                ],
            );
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .any(|p| p == controller.0)
        },
    )
    .await;

    // No restart over 2 minutes (counted from the pods' start, here or in an earlier test).
    let pods: Api<Pod> = Api::namespaced(n.cluster.admin().await, NS);
    let started = pods
        .get(&agent.0)
        .await
        .unwrap()
        .status
        .unwrap()
        .start_time
        .unwrap()
        .0;
    let age = started
        .duration_until(k8s_openapi::jiff::Timestamp::now())
        .as_secs();
    if age < 120 {
        tokio::time::sleep(Duration::from_secs((120 - age) as u64)).await;
    }
    assert_eq!(
        one_pod(n, "nodekeeper-agent").await,
        agent,
        "the agent pod restarted or changed"
    );
    assert_eq!(
        one_pod(n, "nodekeeper-controller").await,
        controller,
        "the controller pod restarted or changed"
    );
    assert_eq!((agent.2, controller.2), (0, 0), "restarts");
}

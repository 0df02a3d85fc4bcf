//! Authorization through the pod binding: a token that carries no node name is tied to
//! its node by looking up the pod named in `authentication.kubernetes.io/pod-name` and taking its
//! `spec.nodeName`. Against `nodekeeper sim` over real TLS with sim-minted tokens.
//!
//! Sim only: tokens with a pod but no node name, as older kube-apiservers minted them (1.37 always
//! names the node); bound tokens run on both in `tests/e2e` (`identity`).

use crate::support::ctl;

use ctl::*;
use k8s_openapi::api::authentication::v1::TokenReview;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use nodekeeper_core::agent::checks::ConditionStatus::True;

/// A token bound to `pod` only: the sim's `node` field is left empty.
async fn pod_token(env: &Env, pod: &str) -> String {
    let body = serde_json::json!({"pod": pod, "node": "", "audiences": ["nodekeeper"],
        "namespace": "nodekeeper", "serviceAccount": "nodekeeper-agent", "expirationSeconds": 3600});
    let (code, bytes) = send(admin().post(env.cluster.admin_url("tokens")).json(&body))
        .await
        .unwrap();
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    v["token"].as_str().unwrap().to_string()
}

fn agent_pod(name: &str, node: Option<&str>) -> Pod {
    let mut spec = serde_json::json!({"containers": [{"name": "agent", "image": "nodekeeper"}]});
    if let Some(n) = node {
        spec["nodeName"] = n.into();
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "nodekeeper"}, "spec": spec}))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pod_bound_token_resolves_to_the_pods_node() {
    let env = Env::new(2).await;
    let pods: Api<Pod> = Api::namespaced(env.cluster.client.clone(), "nodekeeper");
    for (name, node) in [("agent-on-n1", Some("n1")), ("agent-pending", None::<&str>)] {
        pods.create(&PostParams::default(), &agent_pod(name, node))
            .await
            .unwrap();
    }
    let ctl = env.controller(&env.config(), true).await;
    let http = https(&env.ca, ctl.addr);
    let nodes = env.nodes();
    let token = pod_token(&env, "agent-on-n1").await;

    // The token names no node: the pod path is what is exercised here.
    let tr: TokenReview = serde_json::from_value(serde_json::json!({
        "spec": {"token": token, "audiences": ["nodekeeper"]}}))
    .unwrap();
    let review = Api::<TokenReview>::all(env.cluster.client.clone())
        .create(&PostParams::default(), &tr)
        .await
        .unwrap();
    let extra = review.status.unwrap().user.unwrap().extra.unwrap();
    assert_eq!(
        extra["authentication.kubernetes.io/pod-name"],
        ["agent-on-n1"]
    );
    assert!(
        !extra.contains_key("authentication.kubernetes.io/node-name"),
        "{extra:?}"
    );

    // A report about another node than the pod's: 403, that node untouched.
    let forged =
        serde_json::to_value(report("n0", 1, &[("NodekeeperDiskPressure", True)])).unwrap();
    let (code, body) = post(&http, ctl.addr, Some(&token), &forged).await;
    assert_eq!(code, 403, "{body}");
    assert!(conditions(&nodes, "n0").await.is_empty());

    // The pod's node: accepted and written.
    let own = serde_json::to_value(report("n1", 1, &[("NodekeeperDiskPressure", True)])).unwrap();
    let (code, body) = post(&http, ctl.addr, Some(&token), &own).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["accepted"], true);
    assert_eq!(
        conditions(&nodes, "n1").await["NodekeeperDiskPressure"].0,
        "True"
    );

    // A pod that does not exist, or is not scheduled yet: 403 for any node.
    for pod in ["agent-gone", "agent-pending"] {
        let t = pod_token(&env, pod).await;
        for node in ["n0", "n1"] {
            let r =
                serde_json::to_value(report(node, 2, &[("NodekeeperDiskPressure", True)])).unwrap();
            let (code, body) = post(&http, ctl.addr, Some(&t), &r).await;
            assert_eq!(code, 403, "{pod} → {node}: {body}");
        }
    }
    assert!(conditions(&nodes, "n0").await.is_empty());
    ctl.stop().await;
}

//! Least privilege, decided by the real authorizer and admission: the agent's identity may not write
//! any Node (RBAC); with its role widened by an operator, the shipped ValidatingAdmissionPolicy still
//! refuses every Node write of the agent (the controller alone writes Node state), another node's first.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::support::*;

fn label_patch() -> serde_json::Value {
    json!({ "metadata": { "labels": { "privilege-test": "x" } } })
}

async fn patch(api: &Api<Node>, node: &str) -> Result<Node, kube::Error> {
    api.patch(node, &PatchParams::default(), &Patch::Merge(&label_patch()))
        .await
}

fn code(r: &Result<Node, kube::Error>) -> u16 {
    match r {
        Ok(_) => 200,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_cannot_write_nodes_and_the_admission_policy_keeps_it_to_its_own() {
    init_tracing();
    let c = cluster();
    let admin = c.admin().await;
    let _nodes = c
        .create_nodes(&[kwok_node("pv-0", json!({})), kwok_node("pv-1", json!({}))])
        .await;
    let (pod, uid) = agent_pod_on(&admin, "pv-0").await;
    let token = sa_token(&admin, NS, AGENT_SA, None, Some((&pod, &uid))).await;
    let agent = c.client_with_token(&token).await;
    let nodes: Api<Node> = Api::all(agent.clone());

    // Reads its node as the label rule's watch does (list/watch, fieldSelector) …
    let own = nodes
        .list(&kube::api::ListParams::default().fields("metadata.name=pv-0"))
        .await
        .expect("the agent lists its node");
    assert_eq!(own.items.len(), 1);
    // … but every write is forbidden by RBAC.
    for n in ["pv-0", "pv-1"] {
        let r = patch(&nodes, n).await;
        assert_eq!(code(&r), 403, "agent patch of {n}: {r:?}");
    }
    let status = json!({ "status": { "conditions": [{ "type": "Fake", "status": "True" }] } });
    let r = nodes
        .patch_status("pv-0", &PatchParams::default(), &Patch::Strategic(&status))
        .await;
    assert_eq!(code(&r), 403, "agent status patch: {r:?}");

    // An operator widens the agent's role: the admission policy still limits it to its own node.
    // (Not while the rbac test checks the shipped grants on this shared cluster.)
    let _grants = SHIPPED_GRANTS.lock().await;
    crate::drain::apply(
        c,
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: privilege-test-widened-agent}
rules: [{apiGroups: [""], resources: [nodes], verbs: [patch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: privilege-test-widened-agent}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: privilege-test-widened-agent}
subjects: [{kind: ServiceAccount, name: nodekeeper-agent, namespace: nodekeeper}]
"#,
    );
    let other = wait_for(
        std::time::Duration::from_secs(10),
        "the widened role in force",
        || async {
            let r = patch(&nodes, "pv-1").await;
            // 403 from RBAC until the binding is seen; then the VAP's own 403 with its message.
            match &r {
                Err(kube::Error::Api(s)) if s.message.contains("may not write Nodes") => {
                    Some(s.clone())
                }
                _ => None,
            }
        },
    )
    .await;
    assert_eq!(other.code, 403, "{other:?}");
    let own = patch(&nodes, "pv-0").await;
    assert_eq!(code(&own), 403, "its own node, role widened: {own:?}");
    assert!(
        format!("{own:?}").contains("may not write Nodes"),
        "{own:?}"
    );
    let _ = kubectl(
        c,
        &[
            "delete",
            "clusterrolebinding,clusterrole",
            "privilege-test-widened-agent",
        ],
    );
}

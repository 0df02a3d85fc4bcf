//! The migration-label rule on the real control plane, as shipped: the agent runs with the shipped
//! agent ConfigMap and the environment the shipped DaemonSet gives its pod on that node, with two
//! real tokens bound to that pod (one for the API, one with audience `nodekeeper` for the controller);
//! a Cilium-like DaemonSet pod on the node becomes Ready → the agent asks, the controller (shipped
//! config and RBAC) removes `last-migration-failure` from that node and no other.

use std::ffi::OsString;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use serde_json::json;

use crate::support::*;

#[path = "../agent_proc/mod.rs"]
mod agent_proc;

const NODE: &str = "lm-0";
const OTHER: &str = "lm-1";
const LABEL: &str = "last-migration-failure";

/// The shipped agent ConfigMap's TOML with the controller's address, the test CA and token file, and
/// no cloud (these tests must not reach 169.254.169.254 from the host's namespace).
fn agent_toml(dir: &std::path::Path, port: u16) -> std::path::PathBuf {
    let yaml = std::fs::read_to_string(repo().join("manifests/12-agent-config.yaml")).unwrap();
    let cm: serde_json::Value = serde_yaml::from_str(&yaml).unwrap();
    let mut t: toml::Table = toml::from_str(cm["data"]["config.toml"].as_str().unwrap()).unwrap();
    let r = t["report"].as_table_mut().unwrap();
    r.insert("url".into(), format!("https://127.0.0.1:{port}").into());
    r.insert(
        "ca_file".into(),
        dir.join("ca.pem").display().to_string().into(),
    );
    r.insert(
        "token_file".into(),
        dir.join("token").display().to_string().into(),
    );
    r.insert("heartbeat".into(), "1s".into());
    t["sources"]
        .as_table_mut()
        .unwrap()
        .insert("cloud".into(), "none".into());
    let mut agent = toml::Table::new();
    agent.insert("shutdown_watcher".into(), false.into());
    t.insert("agent".into(), agent.into());
    let path = dir.join("agent.toml");
    std::fs::write(&path, toml::to_string(&t).unwrap()).unwrap();
    path
}

/// The environment the shipped DaemonSet gives its container on `node` (fieldRefs resolved).
fn daemonset_env(pod: &Pod, node: &str) -> Vec<(String, OsString)> {
    let spec = pod.spec.as_ref().unwrap();
    let c = spec.containers.iter().find(|c| c.name == "agent").unwrap();
    c.env
        .iter()
        .flatten()
        .map(|e| {
            let v = match (
                &e.value,
                e.value_from.as_ref().and_then(|f| f.field_ref.as_ref()),
            ) {
                (Some(v), _) => v.clone(),
                (None, Some(f)) if f.field_path == "spec.nodeName" => node.to_string(),
                (None, Some(f)) => panic!("unhandled fieldRef {}", f.field_path),
                (None, None) => panic!("unhandled env source for {}", e.name),
            };
            (e.name.clone(), OsString::from(v))
        })
        .collect()
}

fn has_label(n: &Node) -> bool {
    n.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(LABEL))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_rule_removes_the_label_once_cilium_on_that_node_is_ready() {
    init_tracing();
    let _one_engine = exclusive().await;
    let c = cluster();
    let admin = c.admin().await;
    let labels = |n: &str| json!({ LABEL: "get_kubesvc_failure", "kubernetes.io/hostname": n });
    let _nodes = create_nodes(
        &admin,
        &[
            kwok_node(NODE, labels(NODE)),
            kwok_node(OTHER, labels(OTHER)),
        ],
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = controller_toml(dir.path(), "labels", |_| {});
    let ctl = ControllerProc::start(c, &config, "labels").await;

    let (pod_name, uid) = agent_pod_on(&admin, NODE).await;
    let pod = Api::<Pod>::namespaced(admin.clone(), NS)
        .get(&pod_name)
        .await
        .unwrap();
    let report_token = sa_token(
        &admin,
        NS,
        AGENT_SA,
        Some(REPORT_AUDIENCE),
        Some((&pod_name, &uid)),
    )
    .await;
    std::fs::write(dir.path().join("token"), &report_token).unwrap();
    let api_token = sa_token(&admin, NS, AGENT_SA, None, Some((&pod_name, &uid))).await;
    let kubeconfig = dir.path().join("agent.kubeconfig");
    c.write_token_kubeconfig(&kubeconfig, &api_token);
    let cfg = agent_toml(dir.path(), ctl.addr.port());
    let mut env = daemonset_env(&pod, NODE);
    env.push(("KUBECONFIG".into(), kubeconfig.clone().into_os_string()));
    let env_refs: Vec<(&str, &std::ffi::OsStr)> = env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_os_str()))
        .collect();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let mut agent = agent_proc::Agent::start_with_env(&cfg, &root, agent_proc::NO_BUS, &env_refs);

    // The agent reports (the controller writes its heartbeat condition); no Cilium yet: label stays.
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_until(
        Duration::from_secs(30),
        "the agent's first report on lm-0",
        || async {
            crate::ctl::conditions(&nodes, NODE)
                .await
                .keys()
                .any(|k| k.starts_with("Nodekeeper"))
        },
    )
    .await;
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

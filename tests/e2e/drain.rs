//! `nodekeeper drain` and the real `kubectl drain`, side by side on the real API: two identical KWOK
//! nodes with 110 Deployment pods each, drained by an operator ServiceAccount that holds only what the
//! docs list for drain users (docs/drain.md "Permissions"). Then a run that a PodDisruptionBudget blocks:
//! the real disruption controller computes the budget, and the report names the pod and the PDB.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

use crate::support::*;

pub const TEST_NS: &str = "drain-test";

/// A namespace, a ServiceAccount `drain-operator` in it with the drain user's ClusterRole, and a
/// kubeconfig for it at DIR/operator.kubeconfig.
pub async fn operator_kubeconfig(
    c: &Cluster,
    admin: &kube::Client,
    ns: &str,
    dir: &Path,
) -> std::path::PathBuf {
    apply(
        c,
        &format!(
            r#"
apiVersion: v1
kind: Namespace
metadata: {{name: {ns}}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: drain-operator, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: drain-operator-{ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: nodekeeper-drain-operator}}
subjects: [{{kind: ServiceAccount, name: drain-operator, namespace: {ns}}}]
"#
        ),
    );
    let token = sa_token(admin, ns, "drain-operator", None, None).await;
    let path = dir.join("operator.kubeconfig");
    c.write_token_kubeconfig(&path, &token);
    path
}

/// `kubectl apply -f -` of `yaml` as the admin.
pub fn apply(c: &Cluster, yaml: &str) {
    let path = c.dir.join(format!(
        "apply-{}.yaml",
        std::process::id() as u128 + rand_suffix()
    ));
    std::fs::write(&path, yaml).unwrap();
    let out = kubectl(c, &["apply", "-f", path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "kubectl apply failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// A Deployment of `replicas` pods pinned to `node`, with labels app=NAME.
pub fn deployment(ns: &str, name: &str, node: &str, replicas: u32) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": name, "namespace": ns },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": {
                    "nodeSelector": { "kubernetes.io/hostname": node },
                    "tolerations": [{ "key": "kwok.x-k8s.io/node", "operator": "Exists" }],
                    "terminationGracePeriodSeconds": 2,
                    "containers": [{ "name": "app", "image": "registry.invalid/app:1" }]
                }
            }
        }
    })
}

pub async fn create_json(admin: &kube::Client, ns: &str, objs: &[serde_json::Value]) {
    use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
    for o in objs {
        let (group, version) = match o["apiVersion"].as_str().unwrap().split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (String::new(), o["apiVersion"].as_str().unwrap().to_string()),
        };
        let gvk = GroupVersionKind::gvk(&group, &version, o["kind"].as_str().unwrap());
        let ar = ApiResource::from_gvk(&gvk);
        let api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), ns, &ar);
        let obj: DynamicObject = serde_json::from_value(o.clone()).unwrap();
        api.create(&PostParams::default(), &obj).await.unwrap();
    }
}

/// Pods on `node` that are not the agent DaemonSet's, and how many of them are Running and Ready.
pub async fn workload_pods(admin: &kube::Client, node: &str) -> (usize, usize) {
    let pods: Api<Pod> = Api::all(admin.clone());
    let list = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .unwrap();
    let mine: Vec<_> = list
        .items
        .into_iter()
        .filter(|p| p.metadata.namespace.as_deref() != Some(NS))
        .collect();
    let ready = mine
        .iter()
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count();
    (mine.len(), ready)
}

/// Two nodes with 10 Deployments × 11 replicas each, all Ready.
async fn two_loaded_nodes(
    c: &'static Cluster,
    admin: &kube::Client,
    a: &str,
    b: &str,
) -> NodesGuard {
    let nodes = [a, b].map(|n| kwok_node(n, json!({ "kubernetes.io/hostname": n })));
    let guard = c.create_nodes(&nodes).await;
    for n in [a, b] {
        let objs: Vec<_> = (0..10)
            .map(|i| deployment(TEST_NS, &format!("{n}-app{i}"), n, 11))
            .collect();
        create_json(admin, TEST_NS, &objs).await;
    }
    for n in [a, b] {
        wait_until(
            Duration::from_secs(90),
            &format!("110 Ready pods on {n}"),
            || async move { workload_pods(admin, n).await == (110, 110) },
        )
        .await;
    }
    guard
}

fn run(cmd: &mut std::process::Command) -> (i32, String, String, Duration) {
    let t0 = Instant::now();
    let out = cmd.output().unwrap();
    let took = t0.elapsed();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    eprintln!("$ {cmd:?}\n{so}{se}(took {took:?})");
    (out.status.code().unwrap_or(-1), so, se, took)
}

fn nodekeeper_drain(kubeconfig: &Path, node: &str, extra: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"));
    c.args(["drain", node, "--kubeconfig"])
        .arg(kubeconfig)
        .args(extra)
        .env_remove("KUBECONFIG");
    c
}

on_both!(nodekeeper_drain_and_kubectl_drain_empty_identical_nodes);
async fn nodekeeper_drain_and_kubectl_drain_empty_identical_nodes(c: &'static Cluster) {
    init_tracing();
    let admin = c.admin().await;
    let dir = tempfile::tempdir().unwrap();
    let kc = operator_kubeconfig(c, &admin, TEST_NS, dir.path()).await;
    let _nodes = two_loaded_nodes(c, &admin, "dr-nk", "dr-kc").await;

    let (code, _, stderr, nk) = run(nodekeeper_drain(&kc, "dr-nk", &["--timeout", "120s"])
        .args(["--skip-volume-wait", "--report-node-conditions"]));
    assert_eq!(code, 0, "nodekeeper drain failed");
    assert!(!stderr.contains("warning"), "{stderr}");
    // Kubernetes 1.37's lifecycle conditions, written as the operator.
    let node: Node = Api::all(admin.clone()).get("dr-nk").await.unwrap();
    let status = |t: &str| {
        let c = condition(&node, t).unwrap_or_else(|| panic!("no {t}"));
        (c.status.clone(), c.reason.clone().unwrap_or_default())
    };
    assert_eq!(
        status("DrainInProgress"),
        ("False".into(), "DrainCompleted".into())
    );
    assert_eq!(status("Drained"), ("True".into(), "DrainCompleted".into()));
    let (code, _, _, kd) = run(std::process::Command::new(kubectl_bin())
        .arg("--kubeconfig")
        .arg(&kc)
        .args([
            "drain",
            "dr-kc",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=120s",
        ])
        .env("HOME", dir.path()));
    assert_eq!(code, 0, "kubectl drain failed");
    for n in ["dr-nk", "dr-kc"] {
        let (left, _) = workload_pods(&admin, n).await;
        assert_eq!(left, 0, "{n} still has workload pods");
    }
    eprintln!(
        "drain of 110 pods on the real API: nodekeeper {:.2} s, kubectl {:.2} s ({:.2}×)",
        nk.as_secs_f64(),
        kd.as_secs_f64(),
        nk.as_secs_f64() / kd.as_secs_f64()
    );
}

on_both!(a_drain_blocked_by_a_pdb_names_the_pod_and_the_budget);
async fn a_drain_blocked_by_a_pdb_names_the_pod_and_the_budget(c: &'static Cluster) {
    init_tracing();
    let admin = c.admin().await;
    let dir = tempfile::tempdir().unwrap();
    let ns = "drain-blocked";
    let kc = operator_kubeconfig(c, &admin, ns, dir.path()).await;
    let _nodes = c
        .create_nodes(&[kwok_node(
            "dr-blk",
            json!({ "kubernetes.io/hostname": "dr-blk" }),
        )])
        .await;
    create_json(
        &admin,
        ns,
        &[
            deployment(ns, "db", "dr-blk", 2),
            json!({
                "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": { "name": "db-pdb", "namespace": ns },
                "spec": { "minAvailable": 2, "selector": { "matchLabels": { "app": "db" } } }
            }),
        ],
    )
    .await;
    wait_until(Duration::from_secs(60), "2 Ready db pods", || async {
        workload_pods(&admin, "dr-blk").await == (2, 2)
    })
    .await;
    let (code, stdout, stderr, _) = run(&mut nodekeeper_drain(
        &kc,
        "dr-blk",
        &["--timeout", "8s", "-o", "json"],
    ));
    assert_eq!(code, 3, "expected exit 3 (blocked)");
    let v: serde_json::Value = serde_json::from_str(stdout.trim().lines().last().unwrap_or("{}"))
        .unwrap_or_else(|e| panic!("json report: {e}: {stdout} {stderr}"));
    assert_eq!(v["status"], "blocked", "{v}");
    assert_eq!(
        v["blocker"]["pdb"],
        format!("{ns}/db-pdb"),
        "the blocker names the PDB: {v}"
    );
    let pod = v["blocker"]["pod"].as_str().unwrap_or_default();
    assert!(
        pod.starts_with(&format!("{ns}/db-")),
        "the blocker names the pod: {v}"
    );
    let (left, _) = workload_pods(&admin, "dr-blk").await;
    assert_eq!(left, 2, "no pod may leave while the budget allows 0");
}

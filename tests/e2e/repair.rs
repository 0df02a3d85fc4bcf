//! Repair, on both backends: the kubelets of two nodes of one NodePool post Ready=False (the
//! node-lifecycle controller taints them not-ready); the shipped controller config with budget `nodes: "1"` repairs one and holds the other, and
//! `nodekeeper status` (the real binary, as a read-only operator) explains the hold. The repair starts on
//! the engine's due path (the NodePool decided alone when its toleration expires).

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use nodekeeper_core::controller::policy::view::keys;
use serde_json::json;

use crate::support::*;

const POOL: &str = "rp-pool";
const NODES: [&str; 4] = ["rp-0", "rp-1", "rp-2", "rp-3"];
/// A second NodePool as large, so that the repaired pool is at most half the cluster and the
/// engine decides it alone when its toleration expires (the due path).
const OTHER: [&str; 4] = ["rp-o0", "rp-o1", "rp-o2", "rp-o3"];

on_both!(budget_of_one_repairs_one_unknown_node_and_explains_the_other);
async fn budget_of_one_repairs_one_unknown_node_and_explains_the_other(c: &'static Cluster) {
    init_tracing();
    let _one_engine = c.exclusive().await;
    let admin = c.admin().await;
    let nodes: Vec<Node> = NODES
        .iter()
        .map(|n| (n, POOL))
        .chain(OTHER.iter().map(|n| (n, "rp-other")))
        .map(|(n, pool)| {
            kwok_node(
                n,
                json!({ "karpenter.sh/nodepool": pool, "kubernetes.io/hostname": n }),
            )
        })
        .collect();
    let _nodes = c.create_nodes(&nodes).await;

    let dir = tempfile::tempdir().unwrap();
    // The shipped policy ([repair] drain → replace, Ready=False, budgets nodes "1" per NodePool) with a
    // short toleration; half the pool may be unhealthy.
    let config = controller_toml(dir.path(), "repair", ready_false_repair);
    let ctl = ControllerProc::start(c, &config, "repair").await;
    let api: Api<Node> = Api::all(admin.clone());
    seen_ready(&api, &NODES[..2]).await;
    c.kubelet_reports_not_ready(NODES[0]).await;
    c.kubelet_reports_not_ready(NODES[1]).await;

    // One is repaired, the other held by the budget.
    let (repairing, held) = one_repairing_one_held(&api, NODES[0], NODES[1]).await;
    let ready = condition(&held, "Ready").unwrap();
    assert_eq!(ready.status, "False");
    let kcm_taint = held
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == "node.kubernetes.io/not-ready"));
    assert!(
        kcm_taint,
        "the node-lifecycle controller tainted the NotReady node"
    );
    assert!(unschedulable(&repairing), "the repaired node is cordoned");
    assert!(!unschedulable(&held), "a held node is not cordoned");
    let blocked = annotation(&held, keys::BLOCKED).unwrap();
    assert!(blocked.contains("\"kind\":\"budget\""), "{blocked}");
    let cond = condition(&held, "NodekeeperHeld").expect("NodekeeperHeld condition");
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_deref()),
        ("True", Some("BlockedByBudget"))
    );

    // Kubernetes 1.37's lifecycle conditions (KEP-5683) around the repair's drain: the node has no
    // pods, so the drain completes; the held node is not drained and carries neither.
    let repairing_name = repairing.metadata.name.clone().unwrap();
    let drained = wait_for(Duration::from_secs(30), "Drained=True", || {
        let (api, n) = (api.clone(), repairing_name.clone());
        async move {
            let node = api.get(&n).await.ok()?;
            condition(&node, "Drained")
                .is_some_and(|c| c.status == "True")
                .then_some(node)
        }
    })
    .await;
    let in_progress = condition(&drained, "DrainInProgress").expect("DrainInProgress written");
    assert_eq!(
        (in_progress.status.as_str(), in_progress.reason.as_deref()),
        ("False", Some("DrainCompleted"))
    );
    assert_eq!(
        condition(&drained, "Drained").unwrap().reason.as_deref(),
        Some("DrainCompleted")
    );
    let held_now = api
        .get(held.metadata.name.as_deref().unwrap())
        .await
        .unwrap();
    assert!(
        condition(&held_now, "DrainInProgress").is_none()
            && condition(&held_now, "Drained").is_none()
    );

    // `nodekeeper status` as an operator who may only list nodes.
    let text = status_rows(c, &admin, dir.path(), POOL).await;
    let held_name = held.metadata.name.as_deref().unwrap();
    let row = text
        .lines()
        .find(|l| l.starts_with(held_name))
        .expect("a row for the held node");
    assert!(row.contains("budget #0 nodes=1 of rp-pool"), "{row}");
    let row = text
        .lines()
        .find(|l| l.starts_with(repairing.metadata.name.as_deref().unwrap()))
        .unwrap();
    assert!(row.contains("repairing"), "{row}");

    // The repair started on the due path: its NodePool decided alone at the expiry.
    let https = crate::ctl::https(&dir.path().join("ca.pem"), ctl.addr);
    let (_, text) = crate::ctl::get(&https, ctl.addr, "/metrics").await.unwrap();
    assert!(
        metric(&text, "nodekeeper_engine_due_paths_total") >= 1.0,
        "no due path: {}",
        text.lines()
            .filter(|l| l.starts_with("nodekeeper_engine"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    assert_eq!(
        ctl.forbidden_lines(),
        Vec::<String>::new(),
        "the controller hit a 403"
    );
    ctl.stop().await;
}

/// The shipped `[repair]` with one policy, Ready=False tolerated 3 s, and half a group allowed
/// unhealthy (the repair scenarios' failing nodes are half their pool).
pub(crate) fn ready_false_repair(t: &mut toml::Table) {
    let r = t["repair"].as_table_mut().unwrap();
    r.insert("max_unhealthy".into(), "50%".into());
    r.insert(
        "policy".into(),
        toml::Value::Array(vec![toml::Value::Table(
            toml::from_str(
                r#"condition_type = "Ready"
condition_status = "False"
toleration = "3s""#,
            )
            .unwrap(),
        )]),
    );
}

/// Waits until one of `a` and `b` is being repaired and the other is held (its hold's annotation
/// and its NodekeeperHeld condition, two writes, both there): (repairing, held).
pub(crate) async fn one_repairing_one_held(api: &Api<Node>, a: &str, b: &str) -> (Node, Node) {
    wait_for(Duration::from_secs(60), "one repairing, one held", || {
        let api = api.clone();
        async move {
            let a = api.get(a).await.ok()?;
            let b = api.get(b).await.ok()?;
            let state = |n: &Node| annotation(n, keys::STATE).map(str::to_string);
            let held = |n: &Node| {
                annotation(n, keys::BLOCKED).is_some() && condition(n, "NodekeeperHeld").is_some()
            };
            match (state(&a).as_deref(), state(&b).as_deref()) {
                (Some("repairing"), _) if held(&b) => Some((a, b)),
                (_, Some("repairing")) if held(&a) => Some((b, a)),
                _ => None,
            }
        }
    })
    .await
}

/// Waits until the controller stamped each of `nodes` seen-ready (so that a later failure is a
/// repair, not a failed launch).
pub(crate) async fn seen_ready(api: &Api<Node>, nodes: &[&str]) {
    for n in nodes {
        wait_until(Duration::from_secs(20), &format!("{n} seen ready"), || {
            let api = api.clone();
            async move {
                api.get(n)
                    .await
                    .is_ok_and(|n| annotation(&n, keys::SEEN_READY).is_some())
            }
        })
        .await;
    }
}

/// `nodekeeper status -l karpenter.sh/nodepool=POOL` as an operator who may only list nodes.
pub(crate) async fn status_rows(
    c: &'static Cluster,
    admin: &kube::Client,
    dir: &std::path::Path,
    pool: &str,
) -> String {
    let token = status_reader_token(c, admin).await;
    let kc = dir.join("reader.kubeconfig");
    c.write_token_kubeconfig(&kc, &token);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(["status", "--kubeconfig"])
        .arg(&kc)
        .args(["-l", &format!("karpenter.sh/nodepool={pool}")])
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    eprintln!(
        "$ nodekeeper status\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "nodekeeper status failed");
    text
}

/// A ServiceAccount allowed only `nodes list` (what docs/status.md says `nodekeeper status` needs).
pub(crate) async fn status_reader_token(c: &Cluster, admin: &kube::Client) -> String {
    crate::drain::apply(
        c,
        r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: status-reader, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: nodekeeper-status-reader}
rules: [{apiGroups: [""], resources: [nodes], verbs: [list]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: nodekeeper-status-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: nodekeeper-status-reader}
subjects: [{kind: ServiceAccount, name: status-reader, namespace: default}]
"#,
    );
    sa_token(admin, "default", "status-reader", None, None).await
}

//! The per-node action history, on both backends: a node's kubelet posts Ready=False and the
//! shipped controller config (drain → replace; provider `none`) repairs it, with
//! `[controller.history] max_entries = 3`. The repair's start, its drain's end, the replacement
//! request and the hand-over to the provider are recorded in the node's history ConfigMap; the last
//! 3 are kept (the start is trimmed away, its `RepairStarted` Event proving it happened). The
//! controller restarts; the new leader sweeps the histories: the entries are still there, the
//! history of a node long gone is deleted, and `nodekeeper status NODE --history` (the real binary,
//! as an operator who may only get Nodes and that ConfigMap) prints them. The controller's writes
//! met no 403: the shipped RBAC suffices.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, DeleteParams};
use nodekeeper_core::controller::act::history::{self, store};
use nodekeeper_core::controller::status::explain::node_events;
use serde_json::json;

use crate::repair::{ready_false_repair, seen_ready};
use crate::support::*;

const POOL: &str = "hs-pool";
const NODES: [&str; 4] = ["hs-0", "hs-1", "hs-2", "hs-3"];
/// A node long gone, whose history only ages out.
const GONE: &str = "hs-gone";

/// `nodekeeper status NODE --history ARGS` as `kubeconfig`'s user: (exit code, stdout).
fn status_history(kubeconfig: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(["status", NODES[0], "--history", "--kubeconfig"])
        .arg(kubeconfig)
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!(
        "$ nodekeeper status {} --history {}\n{text}{}",
        NODES[0],
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// A ServiceAccount that may get Nodes and the histories of the controller's namespace, nothing
/// else (not even Events): `status NODE --history`'s least privilege.
async fn history_reader_token(c: &Cluster, admin: &kube::Client) -> String {
    crate::drain::apply(
        c,
        &format!(
            r#"
apiVersion: v1
kind: ServiceAccount
metadata: {{name: history-reader, namespace: default}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: nodekeeper-history-reader}}
rules: [{{apiGroups: [""], resources: [nodes], verbs: [get]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: nodekeeper-history-reader}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: nodekeeper-history-reader}}
subjects: [{{kind: ServiceAccount, name: history-reader, namespace: default}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: nodekeeper-history-reader, namespace: {NS}}}
rules: [{{apiGroups: [""], resources: [configmaps], verbs: [get]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: nodekeeper-history-reader, namespace: {NS}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: nodekeeper-history-reader}}
subjects: [{{kind: ServiceAccount, name: history-reader, namespace: default}}]
"#
        ),
    );
    sa_token(admin, "default", "history-reader", None, None).await
}

/// Whether the controller logged its sweep of the histories.
fn swept(ctl: &ControllerProc) -> bool {
    ctl.lines.lock().unwrap().iter().any(|l| {
        [l, &l["fields"]]
            .iter()
            .any(|f| f["message"] == "histories aged out")
    })
}

on_both!(a_repair_is_recorded_trimmed_and_outlives_a_restart);
async fn a_repair_is_recorded_trimmed_and_outlives_a_restart(c: &'static Cluster) {
    init_tracing();
    let _one_engine = c.exclusive().await;
    let admin = c.admin().await;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    // A history left by an earlier run of this test would survive its node: start without it.
    let _ = cms
        .delete(&store::name(NODES[0]), &DeleteParams::default())
        .await;
    let nodes: Vec<Node> = NODES
        .iter()
        .map(|n| {
            kwok_node(
                n,
                json!({ "karpenter.sh/nodepool": POOL, "kubernetes.io/hostname": n }),
            )
        })
        .collect();
    let _nodes = c.create_nodes(&nodes).await;

    let dir = tempfile::tempdir().unwrap();
    let config = controller_toml(dir.path(), "history", |t| {
        ready_false_repair(t);
        let c = t["controller"].as_table_mut().unwrap();
        c.insert(
            "history".into(),
            toml::Value::Table(toml::from_str("max_entries = 3").unwrap()),
        );
    });
    let ctl = ControllerProc::start(c, &config, "history").await;
    let api: Api<Node> = Api::all(admin.clone());
    seen_ready(&api, &NODES[..1]).await;
    c.kubelet_reports_not_ready(NODES[0]).await;

    // Start (drain), the drain's end, the replacement, the hand-over: the last three are kept.
    let histories = store::Histories::new(admin.clone(), NS);
    let kept = wait_for(
        Duration::from_secs(60),
        "the hand-over in the history",
        || {
            let h = histories.clone();
            async move {
                let v = h.read(NODES[0]).await.ok()?;
                v.last()
                    .is_some_and(|e| e.action == "retire_node")
                    .then_some(v)
            }
        },
    )
    .await;
    let actions: Vec<&str> = kept.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(
        actions,
        ["drain", "request_replacement", "retire_node"],
        "{kept:#?}"
    );
    let (drain, replace) = (&kept[0], &kept[1]);
    assert_eq!(drain.outcome, "completed", "{drain:?}");
    assert_eq!(drain.why.as_deref(), Some("repair:Ready=False"));
    assert!(
        drain
            .detail
            .as_deref()
            .is_some_and(|d| d.contains("removed")),
        "{drain:?}"
    );
    assert_eq!(
        (replace.outcome.as_str(), replace.step.as_deref()),
        ("ok", Some("replace")),
        "{replace:?}"
    );
    assert!(
        replace
            .inputs
            .iter()
            .any(|i| i.starts_with("Ready=False KubeletNotReady")),
        "what drove it: {replace:?}"
    );
    // The repair's start was recorded and trimmed away (max_entries = 3): its Event says it ran.
    wait_until(Duration::from_secs(20), "a RepairStarted Event", || async {
        node_events(admin.clone(), "test", NODES[0])
            .await
            .is_ok_and(|v| v.iter().any(|e| e.reason == "RepairStarted"))
    })
    .await;
    assert!(kept.iter().all(|e| e.action != "start_drain"), "{kept:#?}");
    assert_eq!(
        ctl.forbidden_lines(),
        Vec::<String>::new(),
        "the controller hit a 403"
    );
    ctl.stop().await;

    // Meanwhile, the history of a node long gone: its one entry is past max_age (30 days).
    let now = chrono::Utc::now();
    let old = history::Entry::new(now - chrono::TimeDelta::days(31), "cordon");
    let keep_all = history::entry::Limits {
        max_age: chrono::TimeDelta::days(365),
        ..history::HistoryConfig::default().limits()
    };
    histories
        .append(GONE, &[old], &keep_all, now)
        .await
        .unwrap();

    // A new controller: it sweeps the histories once it leads, keeps what is within max_age and
    // deletes the history left empty.
    let ctl = ControllerProc::start(c, &config, "history").await;
    wait_until(
        Duration::from_secs(30),
        "the new leader's sweep",
        || async { swept(&ctl) },
    )
    .await;
    assert_eq!(histories.read(NODES[0]).await.unwrap(), kept);
    let gone = cms.get_opt(&store::name(GONE)).await.unwrap();
    assert!(gone.is_none(), "an emptied history is deleted: {gone:?}");

    // `nodekeeper status NODE --history`, as an operator who may only read Nodes and histories.
    let token = history_reader_token(c, &admin).await;
    let kc = dir.path().join("history-reader.kubeconfig");
    c.write_token_kubeconfig(&kc, &token);
    let (code, text) = status_history(&kc, &[]);
    assert_eq!(code, Some(0));
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("WHEN") && lines[0].contains("DETAIL"),
        "{text}"
    );
    assert!(
        lines[1].contains("retire_node") && lines[2].contains("request_replacement"),
        "newest first: {text}"
    );
    assert!(lines[2].contains("repair:Ready=False"), "{text}");
    assert!(
        lines[3].contains("drain") && lines[3].contains("completed"),
        "{text}"
    );
    let (code, json) = status_history(&kc, &["-o", "json"]);
    assert_eq!(code, Some(0));
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(doc["node"], NODES[0]);
    assert_eq!(doc["history"][0]["action"], "retire_node");
    assert_eq!(doc["history"][2]["outcome"], "completed");
    assert_eq!(
        ctl.forbidden_lines(),
        Vec::<String>::new(),
        "the controller hit a 403"
    );
    ctl.stop().await;
}

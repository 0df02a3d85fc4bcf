//! `nodekeeper demo --snapshot`: what-if replay of a cluster export. The fixture
//! tests/fixtures/whatif/snapshot.json is real kubectl's `get nodes,pods,pdb -A -o json` of the
//! sim (scripts/whatif-snapshot.sh): six nodes in pools `spot` and `on-demand`, `web` (PDB
//! maxUnavailable 1), `api` (minAvailable 3) and `data/db` (2 replicas on on-demand-0 and
//! on-demand-1, PDB minAvailable 2: allows no disruption). The binary replays it with the demo's
//! policy (the OKE + KPO one: Ready=False 600 s, budget nodes "1" per pool, max_unhealthy 50%) in dry run.
//!
//! Sim only: replays a recorded fixture; a live export of either backend runs in `tests/e2e`
//! (`whatif`).
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/whatif/snapshot.json")
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn demo(args: &[&str]) -> Run {
    // output() reads stdout and stderr to the end: neither pipe can fill up.
    let out = Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .arg("demo")
        .args(args)
        .output()
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn verdict<'a>(report: &'a Value, node: &str) -> &'a Value {
    report["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["node"] == node)
        .unwrap_or_else(|| panic!("no verdict for {node}: {report}"))
}

fn reasons(v: &Value) -> Vec<&str> {
    v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["reason"].as_str().unwrap())
        .collect()
}

/// `Kind/namespace/name` → object, without resourceVersion.
fn objects(list: &Value) -> std::collections::BTreeMap<String, Value> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let mut o = o.clone();
            o["metadata"]
                .as_object_mut()
                .unwrap()
                .remove("resourceVersion");
            let ns = o["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let key = format!(
                "{}/{ns}/{}",
                o["kind"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap()
            );
            (key, o)
        })
        .collect()
}

fn conditions_without(node: &Value, type_: &str) -> Vec<Value> {
    node["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["type"] != type_)
        .cloned()
        .collect()
}

#[test]
fn replay_names_the_pdb_the_budget_and_the_interruption() {
    let dir = tempfile::tempdir().unwrap();
    let snap = fixture();
    let r = demo(&[
        "--snapshot",
        snap.to_str().unwrap(),
        "--what-if",
        "notready:on-demand-0",
        "--what-if",
        "notready:on-demand-1",
        "--what-if",
        "preemption:spot-2",
        "--dir",
        dir.path().to_str().unwrap(),
        "-o",
        "json",
    ]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let report: Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(report["version"], 1);
    assert_eq!(report["dry_run"], true);
    assert_eq!(report["what_if"][2]["event"], "preemption notice on spot-2");
    assert_eq!(report["objects"]["nodes"], 6);
    assert_eq!(report["objects"]["pods"], 34);
    assert_eq!(report["objects"]["pdbs"], 3);
    assert_eq!(report["after_seconds"], 601.0, "600 s toleration + 1 s");
    assert_eq!(report["changed"], serde_json::json!([]));

    // One of the two NotReady on-demand nodes is repaired; its drain would meet data/db-pdb.
    let (a, b) = (
        verdict(&report, "on-demand-0"),
        verdict(&report, "on-demand-1"),
    );
    let (repaired, held) = if a["decision"] == "repair:Ready=False" {
        (a, b)
    } else {
        (b, a)
    };
    assert_eq!(repaired["decision"], "repair:Ready=False", "{report:#}");
    assert_eq!(repaired["steps"], serde_json::json!(["cordon", "drain"]));
    let pdb = &repaired["blocker"];
    assert_eq!(pdb["kind"], "pdb", "{repaired:#}");
    assert_eq!(pdb["pdb"], "data/db-pdb");
    assert!(
        pdb["pod"].as_str().unwrap().starts_with("data/db-"),
        "{pdb}"
    );
    assert!(reasons(repaired).contains(&"RepairStarted"), "{repaired:#}");
    // The second is held by the budget nodes: "1" of its pool.
    assert_eq!(held["decision"], "held", "{report:#}");
    assert_eq!(held["steps"], serde_json::json!([]));
    let budget = &held["blocker"];
    assert_eq!(budget["kind"], "budget", "{held:#}");
    assert_eq!(budget["group"], "on-demand");
    assert_eq!(budget["nodes"], "1");
    assert!(reasons(held).contains(&"BlockedByBudget"), "{held:#}");
    assert!(held["events"][0]["note"]
        .as_str()
        .unwrap()
        .starts_with("dry run: "));

    // The preemption: taint + cordon + drain + immediate replacement; web tolerates everything
    // (so it stays), nothing blocks.
    let spot = verdict(&report, "spot-2");
    assert_eq!(spot["decision"], "interruption:preemption", "{spot:#}");
    assert_eq!(
        spot["steps"],
        serde_json::json!(["taint", "cordon", "drain", "replace"])
    );
    assert_eq!(spot["blocker"], Value::Null);
    assert!(reasons(spot).contains(&"ReplacementRequested"), "{spot:#}");
    for n in ["on-demand-2", "spot-0", "spot-1"] {
        let v = verdict(&report, n);
        assert_eq!(
            (v["decision"].as_str(), v["blocker"].is_null()),
            (Some("none"), true),
            "{v:#}"
        );
        assert_eq!(v["events"], serde_json::json!([]), "{v:#}");
    }

    // Independently of the replay's own check: the objects at the end are the snapshot's, but
    // for the two injected Ready=False conditions.
    let before = objects(&serde_json::from_str(&std::fs::read_to_string(&snap).unwrap()).unwrap());
    let after = objects(
        &serde_json::from_str(&std::fs::read_to_string(dir.path().join("after.json")).unwrap())
            .unwrap(),
    );
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>()
    );
    for (k, was) in &before {
        let now = &after[k];
        if k == "Node//on-demand-0" || k == "Node//on-demand-1" {
            assert_eq!(now["metadata"], was["metadata"], "{k}");
            assert_eq!(
                now["spec"], was["spec"],
                "{k}: cordoned or tainted in dry run"
            );
            assert_eq!(
                conditions_without(now, "Ready"),
                conditions_without(was, "Ready"),
                "{k}"
            );
            let ready = now["status"]["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["type"] == "Ready")
                .unwrap();
            assert_eq!(ready["status"], "False", "{k}");
        } else {
            assert_eq!(now, was, "{k} changed by the dry run");
        }
    }
}

#[test]
fn yaml_with_two_lists_short_circuits_a_whole_pool() {
    // The same export as YAML, nodes and the rest in two documents (`kubectl get nodes -o yaml;
    // echo ---; kubectl get pods,pdb -A -o yaml`).
    let list: Value = serde_json::from_str(&std::fs::read_to_string(fixture()).unwrap()).unwrap();
    let (nodes, rest): (Vec<Value>, Vec<Value>) = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .cloned()
        .partition(|o| o["kind"] == "Node");
    let doc = |items: Vec<Value>| {
        serde_yaml::to_string(
            &serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}),
        )
        .unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("cluster.yaml");
    std::fs::write(&f, format!("{}---\n{}", doc(nodes), doc(rest))).unwrap();
    let r = demo(&[
        "--snapshot",
        f.to_str().unwrap(),
        "--what-if",
        "notready:pool=spot",
    ]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    // Text output: the timeline, then the table.
    assert!(
        r.stdout
            .contains("6 nodes, 34 pods, 3 PodDisruptionBudgets"),
        "{}",
        r.stdout
    );
    let table: Vec<&str> = r
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("NODE"))
        .collect();
    for n in ["spot-0", "spot-1", "spot-2"] {
        let row = table
            .iter()
            .find(|l| l.starts_with(n))
            .unwrap_or_else(|| panic!("{}", r.stdout));
        assert!(row.contains("held"), "{row}");
        assert!(
            row.contains(
                "repair short-circuited: 3 of 3 nodes of group spot unhealthy (max_unhealthy 50%)"
            ),
            "{row}"
        );
    }
    let od = table.iter().find(|l| l.starts_with("on-demand-0")).unwrap();
    assert!(od.contains(" none "), "{od}");
    assert!(
        r.stdout.contains("RepairShortCircuited"),
        "the dry-run Events in the timeline:\n{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("objects of the snapshot are unchanged"),
        "{}",
        r.stdout
    );
}

#[test]
fn bad_snapshots_are_named_with_file_and_line_or_item() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let node = r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n-0"}}"#;
    let cases = [
        (
            write(
                "broken.json",
                "{\"kind\": \"List\",\n \"items\": [\n  {\"kind\": \"Node\",}\n]}\n",
            ),
            "broken.json:3:",
        ),
        (
            write("node.json", node),
            "node.json: list 1: kind Node: expected a List",
        ),
        (
            write(
                "svc.json",
                &format!(
                    r#"{{"kind":"List","items":[{node},{{"kind":"Service","metadata":{{"name":"s","namespace":"default"}}}}]}}"#
                ),
            ),
            "svc.json: list 1 item 2 (Service default/s): kind Service is not replayed",
        ),
        (
            write(
                "orphan.json",
                &format!(
                    r#"{{"kind":"List","items":[{node},{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"p","namespace":"default"}},"spec":{{"nodeName":"n-9","containers":[{{"name":"c"}}]}}}}]}}"#
                ),
            ),
            "orphan.json: Pod default/p: spec.nodeName \"n-9\" is not a Node of the snapshot",
        ),
        (
            write(
                "broken.yaml",
                "kind: List\nitems:\n  - kind: Node\n    metadata: {name: [\n",
            ),
            "broken.yaml:",
        ),
    ];
    for (file, want) in &cases {
        let r = demo(&["--snapshot", file]);
        assert_eq!(r.code, 2, "{file}: {}", r.stderr);
        assert!(
            r.stderr.contains(want),
            "{file}: want {want:?} in\n{}",
            r.stderr
        );
    }
    // A what-if naming no node of the snapshot, and one that does not parse.
    let snap = fixture();
    let r = demo(&[
        "--snapshot",
        snap.to_str().unwrap(),
        "--what-if",
        "notready:on-demand-9",
    ]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("no node \"on-demand-9\" in the snapshot"),
        "{}",
        r.stderr
    );
    let r = demo(&[
        "--snapshot",
        snap.to_str().unwrap(),
        "--what-if",
        "explode:spot-0",
    ]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("unknown event \"explode\""),
        "{}",
        r.stderr
    );
}

/// A fresh export by the real kubectl (not the committed fixture): the format the replay reads
/// is the one kubectl writes today. The whole on-demand pool NotReady is short-circuited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_kubectl_export_replays() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, ListParams};
    use nodekeeper_sim::apiserver::scenario::Scenario;
    use nodekeeper_sim::apiserver::TestCluster;

    let kubectl = crate::support::kubectl_bin();
    let toml = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/whatif/cluster.toml");
    let opts = nodekeeper_sim::demo::cluster::sim_options(Scenario::load(&toml).unwrap());
    let cluster = TestCluster::start(opts).await.unwrap();
    let pods: Api<Pod> = Api::all(cluster.client.clone());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let list = pods.list(&ListParams::default()).await.unwrap();
        let running = list
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        if running == 34 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{running} of 34 pods Running"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig).unwrap();
    let out = Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["get", "nodes,pods,pdb", "-A", "-o", "json"])
        .env("HOME", dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let snap = dir.path().join("export.json");
    std::fs::write(&snap, &out.stdout).unwrap();
    drop(cluster);

    let r = demo(&[
        "--snapshot",
        snap.to_str().unwrap(),
        "--what-if",
        "notready:pool=on-demand",
        "-o",
        "json",
    ]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let report: Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(report["objects"]["pods"], 34);
    assert_eq!(report["what_if"][0]["nodes"].as_array().unwrap().len(), 3);
    for n in ["on-demand-0", "on-demand-1", "on-demand-2"] {
        let v = verdict(&report, n);
        assert_eq!(v["decision"], "held", "{v:#}");
        assert_eq!(v["blocker"]["kind"], "short_circuit", "{v:#}");
        assert_eq!(v["blocker"]["unhealthy"], 3, "{v:#}");
    }
    assert_eq!(verdict(&report, "spot-0")["decision"], "none");
    assert_eq!(report["changed"], serde_json::json!([]));
}

/// A pod bound to a node that is not in the snapshot (the node was deleted while the export ran; the
/// pod garbage collector removes such pods) is left out of the replay and listed, not an error, as
/// long as the export holds the other pods' nodes.
#[test]
fn pods_of_a_node_deleted_during_the_export_are_left_out_and_listed() {
    let dir = tempfile::tempdir().unwrap();
    let node = r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n-0"},"status":{"conditions":[{"type":"Ready","status":"True"}]}}"#;
    let pod = |name: &str, node: &str| {
        format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"default"}},"spec":{{"nodeName":"{node}","containers":[{{"name":"c"}}]}},"status":{{"phase":"Running"}}}}"#
        )
    };
    let file = dir.path().join("churn.json");
    std::fs::write(
        &file,
        format!(
            r#"{{"kind":"List","items":[{node},{},{}]}}"#,
            pod("kept", "n-0"),
            pod("orphan", "gone-1")
        ),
    )
    .unwrap();
    let r = demo(&["--snapshot", file.to_str().unwrap(), "-o", "json"]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let report: Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(report["objects"]["pods"], 1, "{report:#}");
    assert_eq!(report["left_out"], serde_json::json!(["default/orphan"]));
}

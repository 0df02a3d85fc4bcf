//! `nodekeeper demo --snapshot` on an export of the real cluster (`kubectl get nodes,pods,pdb -A -o
//! json`): the forecast reads the PDBs' own status, as the real Eviction API does. A bare pod under
//! `maxUnavailable: 1` looks evictable to pod arithmetic, but the disruption controller gives it 0
//! disruptions (no controller owns it), and the forecast says so; a Deployment's PDB with room does
//! not block.

use std::time::Duration;

use serde_json::{json, Value};

use crate::drain::{apply, create_json, deployment, workload_pods};
use crate::support::*;

const NODE: &str = "wf-0";
const APP: &str = "whatif";

on_both!(a_snapshot_forecast_uses_the_pdb_status_the_disruption_controller_wrote);
async fn a_snapshot_forecast_uses_the_pdb_status_the_disruption_controller_wrote(
    c: &'static Cluster,
) {
    init_tracing();
    let admin = c.admin().await;
    let _nodes = c
        .create_nodes(&[kwok_node(
            NODE,
            json!({ "kubernetes.io/hostname": NODE, "karpenter.sh/nodepool": "wf-pool" }),
        )])
        .await;
    apply(
        c,
        &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {APP}}}\n"),
    );
    let bare = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "bare", "namespace": APP, "labels": { "app": "bare" } },
        "spec": { "nodeName": NODE, "containers": [{ "name": "app", "image": "registry.invalid/app:1" }] }
    });
    let pdb = |name: &str, mut spec: Value| {
        spec["selector"] = json!({ "matchLabels": { "app": name } });
        json!({ "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": { "name": name, "namespace": APP }, "spec": spec })
    };
    create_json(
        &admin,
        APP,
        &[
            deployment(APP, "web", NODE, 3),
            pdb("web", json!({ "maxUnavailable": 1 })),
            bare,
            pdb("bare", json!({ "maxUnavailable": 1 })),
        ],
    )
    .await;
    wait_until(Duration::from_secs(60), "4 Ready pods", || async {
        workload_pods(&admin, NODE).await == (4, 4)
    })
    .await;
    // The disruption controller has processed both budgets.
    let status = wait_for(Duration::from_secs(30), "PDB status", || async {
        let out = kubectl(c, &["-n", APP, "get", "pdb", "-o", "json"]);
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        let items = v["items"].as_array()?.clone();
        let by = |n: &str| items.iter().find(|p| p["metadata"]["name"] == n).cloned();
        let (web, bare) = (by("web")?, by("bare")?);
        let done = |p: &Value| p["status"]["observedGeneration"] == p["metadata"]["generation"];
        (done(&web) && done(&bare) && web["status"]["disruptionsAllowed"] == 1)
            .then_some((web, bare))
    })
    .await;
    assert_eq!(
        status.1["status"]["disruptionsAllowed"], 0,
        "a bare pod's PDB: {:#}",
        status.1["status"]
    );

    let out = kubectl(c, &["get", "nodes,pods,pdb", "-A", "-o", "json"]);
    assert!(out.status.success());
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("snapshot.json");
    std::fs::write(&snap, &out.stdout).unwrap();
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(["demo", "--snapshot"])
        .arg(&snap)
        .args(["--what-if", &format!("preemption:{NODE}"), "--dir"])
        .arg(dir.path())
        .args(["-o", "json"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&run.stderr));
    assert_eq!(run.status.code(), Some(0));
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    let v = report["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["node"] == NODE)
        .cloned()
        .expect("a verdict for wf-0");
    assert_eq!(v["blocker"]["kind"], "pdb", "{v:#}");
    assert_eq!(v["blocker"]["pdb"], format!("{APP}/bare"), "{v:#}");
    assert_eq!(v["blocker"]["pod"], format!("{APP}/bare"), "{v:#}");
}

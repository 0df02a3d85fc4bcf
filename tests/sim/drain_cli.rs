//! `nodekeeper drain` end to end: the real binary against the sim through a kubeconfig the sim writes.
//!
//! Sim only: exit codes for fault cases the sim injects; the binary against both runs in
//! `tests/e2e` (`drain`).
#![allow(clippy::unwrap_used)]

use crate::support::drain as drain_support;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use drain_support::*;
use nodekeeper_sim::apiserver::resources::well_known;
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;
use tokio::process::Command;

fn nodekeeper(kubeconfig: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nodekeeper"));
    c.arg("drain")
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    c
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn run(kubeconfig: &Path, args: &[&str]) -> Out {
    let o = nodekeeper(kubeconfig, args).output().await.unwrap();
    let out = Out {
        code: o.status.code().unwrap(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    };
    eprintln!(
        "$ nodekeeper drain {}\n{}{}",
        args.join(" "),
        out.stdout,
        out.stderr
    );
    out
}

fn blocked_node(c: &Cluster, n: &str) {
    node(c, n);
    pod(&format!("db-{n}-0"), &format!("db-{n}")).on(c, n);
    pod(&format!("db-{n}-1"), &format!("db-{n}")).on(c, n);
    pod(&format!("web-{n}"), "web").on(c, n);
    pdb(
        c,
        &format!("db-{n}-pdb"),
        &format!("db-{n}"),
        json!({"minAvailable": 2}),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_cli_end_to_end() {
    let c = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    c.write_kubeconfig(&kc).unwrap();

    // Live: the blocker (pod and PDB) is printed while the drain runs; the drain finishes once the PDB allows.
    blocked_node(&c, "n1");
    let mut child = nodekeeper(&kc, &["n1", "--timeout", "60s"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut text = String::new();
    let blocked_line = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(l) = lines.next_line().await.unwrap() {
            text.push_str(&l);
            text.push('\n');
            if l.contains("blocked: pod default/db-n1-") {
                return l;
            }
        }
        panic!("no blocker line in {text}");
    })
    .await
    .unwrap();
    assert!(
        blocked_line.contains("PodDisruptionBudget default/db-n1-pdb"),
        "{blocked_line}"
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "still running while blocked"
    );
    c.sim
        .store
        .txn(|t| {
            t.delete(
                well_known::pdbs(),
                "default",
                "db-n1-pdb",
                &Default::default(),
            )
        })
        .unwrap();
    while let Some(l) = lines.next_line().await.unwrap() {
        text.push_str(&l);
        text.push('\n');
    }
    let status = child.wait().await.unwrap();
    assert_eq!(status.code(), Some(0), "{text}");
    assert!(text.contains("drained node n1: 3 pod(s) evicted"), "{text}");
    assert!(text.contains("cordoning node n1"), "{text}");
    assert!(pods_on(&c, "n1").is_empty());

    // Timed out while a PDB holds a pod: exit 3, the blocker named (JSON and text).
    blocked_node(&c, "n2");
    let o = run(&kc, &["n2", "--timeout", "1s", "-o", "json"]).await;
    assert_eq!(o.code, 3);
    let lines: Vec<Value> = o
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last = lines.last().unwrap();
    assert_eq!(last["event"], "result");
    assert_eq!(last["status"], "blocked");
    assert_eq!(last["exit_code"], 3);
    assert_eq!(last["blocker"]["pdb"], "default/db-n2-pdb");
    assert_eq!(last["blocker"]["reason"], "pod-disruption-budget");
    assert!(last["blocker"]["pod"]
        .as_str()
        .unwrap()
        .starts_with("default/db-n2-"));
    assert!(lines[..lines.len() - 1]
        .iter()
        .all(|l| l["event"] == "progress"));
    assert!(lines
        .iter()
        .any(|l| l["blocker"]["pdb"] == "default/db-n2-pdb" && l["event"] == "progress"));
    let o = run(&kc, &["n2", "--timeout", "1s"]).await;
    assert_eq!(o.code, 3);
    assert!(
        o.stderr.contains("error: drain of node n2 timed out")
            && o.stderr.contains("default/db-n2-pdb"),
        "{}",
        o.stderr
    );

    // force-delete at the deadline drains it (exit 0).
    let o = run(
        &kc,
        &[
            "n2",
            "--timeout",
            "1s",
            "--on-timeout",
            "force-delete",
            "-o",
            "json",
        ],
    )
    .await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    let last: Value = serde_json::from_str(o.stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["status"], "drained");
    let forced = last["report"]["removed"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["forced"] == true)
        .count();
    assert_eq!(forced, 2);
    assert!(pods_on(&c, "n2").is_empty());

    // Dry run: lists, changes nothing.
    blocked_node(&c, "n3");
    let rv = c.sim.store.resource_version();
    let o = run(&kc, &["n3", "--dry-run"]).await;
    assert_eq!(o.code, 0);
    assert!(
        o.stdout
            .contains("would evict default/web-n3 [tier non-critical]"),
        "{}",
        o.stdout
    );
    assert_eq!(c.sim.store.resource_version(), rv);
    assert!(!unschedulable(&c, "n3"));

    // Timed out for another reason (a volume still attached): exit 4.
    node(&c, "n4");
    create(
        &c,
        volumeattachments(),
        "",
        json!({"metadata": {"name": "csi-9"},
        "spec": {"attacher": "x", "nodeName": "n4", "source": {"persistentVolumeName": "pv-9"}}}),
    );
    let o = run(&kc, &["n4", "--timeout", "1s"]).await;
    assert_eq!(o.code, 4, "{}", o.stderr);
    assert!(o.stderr.contains("VolumeAttachment csi-9"), "{}", o.stderr);
    let o = run(&kc, &["n4", "--timeout", "1s", "--skip-volume-wait"]).await;
    assert_eq!(o.code, 0);

    // Errors and usage.
    let o = run(&kc, &["nope"]).await;
    assert_eq!(o.code, 1);
    assert!(o.stderr.contains("node nope not found"), "{}", o.stderr);
    let o = run(&kc, &["n3", "--on-timeout", "bogus"]).await;
    assert_eq!(o.code, 2);
    let o = run(&kc, &["n3", "--timeout", "soon"]).await;
    assert_eq!(o.code, 2);
    let o = run(&dir.path().join("missing"), &["n3"]).await;
    assert_eq!(o.code, 1);
    assert!(o.stderr.contains("kubeconfig"), "{}", o.stderr);
}

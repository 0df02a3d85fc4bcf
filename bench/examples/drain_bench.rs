//! Drain of a 110-pod node, side by side on one sim: `nodekeeper drain` vs the real
//! `kubectl drain --ignore-daemonsets --delete-emptydir-data`, each on its own identical node, in one run.
//! Not a timed test: run it with `bench/drain.sh` and record the figures in docs/drain.md.
//!
//! ```text
//! cargo run --release --example drain_bench -- --kubectl .cache/venv/bin/kubectl \
//!     --nodekeeper target/release/nodekeeper [--runs 5] [--termination-ms 0]
//! ```
//! Each node: 80 ReplicaSet pods, 10 more behind a PDB that does not block (maxUnavailable 100%),
//! 6 DaemonSet pods, 4 critical pods, 3 critical DaemonSet pods, 4 DaemonSet pods tolerating every
//! taint, 2 mirror pods, 1 Succeeded pod. `--termination-ms M`: a stand-in kubelet finishes each
//! evicted pod's termination M ms after the eviction (0: pods vanish when evicted).

#![allow(clippy::unwrap_used)] // a benchmark binary, not controller code

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use nodekeeper_sim::apiserver::resources::well_known;
use nodekeeper_sim::apiserver::scenario::running_status;
use nodekeeper_sim::apiserver::store::WriteTarget;
use nodekeeper_sim::apiserver::{Sim, SimOptions, TestCluster};
use serde_json::{json, Value};

#[derive(Parser)]
struct Args {
    /// The real kubectl.
    #[arg(long)]
    kubectl: PathBuf,
    /// The nodekeeper binary (release build).
    #[arg(long)]
    nodekeeper: PathBuf,
    /// Runs (each on fresh nodes).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Simulated pod termination time in ms (0: pods vanish at eviction).
    #[arg(long, default_value_t = 0)]
    termination_ms: u64,
    /// Print each command's stderr.
    #[arg(long)]
    verbose: bool,
}

const FINALIZER: &str = "bench.nodekeeper.io/kubelet";

fn create(
    sim: &Sim,
    res: &'static nodekeeper_sim::apiserver::resources::ResourceDef,
    ns: &str,
    obj: Value,
) -> Value {
    sim.store
        .txn(|t| t.create(res, ns, obj))
        .map(|o| (*o).clone())
        .unwrap()
}

struct P<'a> {
    name: String,
    ns: &'a str,
    app: &'a str,
    owner: (&'a str, &'a str),
    critical: bool,
    tolerate_all: bool,
    mirror: bool,
    phase: &'a str,
}

fn pod(
    sim: &Sim,
    node: &str,
    p: P<'_>,
    finalizer: bool,
    owners: &std::collections::HashMap<String, String>,
) {
    let now = sim.store.clock.stamp();
    let mut spec = json!({"nodeName": node, "containers": [{"name": "main", "image": "sim/x:1"}],
        "terminationGracePeriodSeconds": 30});
    if p.critical {
        spec["priorityClassName"] = json!("system-node-critical");
    }
    if p.tolerate_all {
        spec["tolerations"] = json!([{"operator": "Exists"}]);
    }
    let (kind, owner) = p.owner;
    let uid = owners
        .get(owner)
        .cloned()
        .unwrap_or_else(|| format!("uid-{owner}"));
    let mut meta = json!({"name": p.name, "labels": {"app": p.app},
        "ownerReferences": [{"apiVersion": if kind == "Node" { "v1" } else { "apps/v1" }, "kind": kind,
            "name": owner, "uid": uid, "controller": true}]});
    if p.mirror {
        meta["annotations"] = json!({"kubernetes.io/config.mirror": "abc"});
    }
    if finalizer && p.phase == "Running" {
        meta["finalizers"] = json!([FINALIZER]);
    }
    let status = if p.phase == "Running" {
        running_status(&now)
    } else {
        json!({"phase": p.phase})
    };
    create(
        sim,
        well_known::pods(),
        p.ns,
        json!({"metadata": meta, "spec": spec, "status": status}),
    );
}

/// One 110-pod node (103 drainable by nodekeeper; kubectl leaves the 13 DaemonSet pods).
fn node(sim: &Sim, n: &str, finalizer: bool, owners: &std::collections::HashMap<String, String>) {
    create(
        sim,
        well_known::nodes(),
        "",
        json!({"metadata": {"name": n, "labels": {"kubernetes.io/hostname": n}}, "spec": {}}),
    );
    // (count, prefix, namespace, owner kind, owner name, critical, tolerate all, mirror, phase)
    let table = [
        (
            80,
            "filler",
            "default",
            "ReplicaSet",
            "filler",
            false,
            false,
            false,
            "Running",
        ),
        (
            10,
            "web",
            "default",
            "ReplicaSet",
            "web",
            false,
            false,
            false,
            "Running",
        ),
        (
            6,
            "logs",
            "kube-system",
            "DaemonSet",
            "logs",
            false,
            false,
            false,
            "Running",
        ),
        (
            4,
            "coredns",
            "kube-system",
            "ReplicaSet",
            "coredns",
            true,
            false,
            false,
            "Running",
        ),
        (
            3,
            "cni",
            "kube-system",
            "DaemonSet",
            "cni",
            true,
            false,
            false,
            "Running",
        ),
        (
            4,
            "exporter",
            "kube-system",
            "DaemonSet",
            "exporter",
            false,
            true,
            false,
            "Running",
        ),
        (
            2,
            "static",
            "kube-system",
            "Node",
            n,
            false,
            false,
            true,
            "Running",
        ),
        (
            1,
            "job",
            "default",
            "ReplicaSet",
            "job",
            false,
            false,
            false,
            "Succeeded",
        ),
    ];
    for (count, prefix, ns, kind, owner, critical, tolerate_all, mirror, phase) in table {
        for i in 0..count {
            let p = P {
                name: format!("{prefix}-{n}-{i}"),
                ns,
                app: prefix,
                owner: (kind, owner),
                critical,
                tolerate_all,
                mirror,
                phase,
            };
            pod(sim, n, p, finalizer, owners);
        }
    }
}

/// Finishes terminations `delay` after the deletion was requested.
fn kubelet(sim: Arc<Sim>, delay: Duration) {
    tokio::spawn(async move {
        let mut seen: std::collections::HashMap<String, Instant> = Default::default();
        loop {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let pods = sim.store.txn(|t| t.list(well_known::pods(), None));
            for p in pods {
                if p["metadata"].get("deletionTimestamp").is_none()
                    || p["metadata"].get("finalizers").is_none()
                {
                    continue;
                }
                let uid = p["metadata"]["uid"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let since = *seen.entry(uid).or_insert_with(Instant::now);
                if since.elapsed() < delay {
                    continue;
                }
                let ns = p["metadata"]["namespace"].as_str().unwrap().to_string();
                let name = p["metadata"]["name"].as_str().unwrap().to_string();
                let mut np: Value = (*p).clone();
                np["metadata"].as_object_mut().unwrap().remove("finalizers");
                let _ = sim
                    .store
                    .txn(|t| t.update(well_known::pods(), &ns, &name, np, WriteTarget::Main));
            }
        }
    });
}

fn pods_on(sim: &Sim, n: &str) -> usize {
    sim.store
        .txn(|t| t.list(well_known::pods(), None))
        .iter()
        .filter(|p| p.pointer("/spec/nodeName").and_then(Value::as_str) == Some(n))
        .count()
}

fn time(cmd: &mut Command) -> Duration {
    let t = Instant::now();
    let out = cmd.output().unwrap();
    let d = t.elapsed();
    if std::env::args().any(|a| a == "--verbose") {
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    }
    assert!(
        out.status.success(),
        "{:?} failed: {}{}",
        cmd,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    d
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    let c = TestCluster::start(SimOptions::bare()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    c.write_kubeconfig(&kc).unwrap();
    if c.sim
        .store
        .get(well_known::namespaces(), "", "kube-system")
        .is_none()
    {
        create(
            &c.sim,
            well_known::namespaces(),
            "",
            json!({"metadata": {"name": "kube-system"}}),
        );
    }
    let mut owners = std::collections::HashMap::new();
    for ds in ["logs", "cni", "exporter"] {
        let d = create(
            &c.sim,
            well_known::daemonsets(),
            "kube-system",
            json!({"metadata": {"name": ds},
            "spec": {"selector": {"matchLabels": {"app": ds}}, "template": {"metadata": {"labels": {"app": ds}},
            "spec": {"containers": [{"name": "main", "image": "sim/x:1"}]}}}}),
        );
        owners.insert(
            ds.to_string(),
            d["metadata"]["uid"].as_str().unwrap().to_string(),
        );
    }
    create(
        &c.sim,
        well_known::pdbs(),
        "default",
        json!({"metadata": {"name": "web-pdb"},
        "spec": {"maxUnavailable": "100%", "selector": {"matchLabels": {"app": "web"}}}}),
    );
    let finalizer = args.termination_ms > 0;
    if finalizer {
        kubelet(c.sim.clone(), Duration::from_millis(args.termination_ms));
    }
    println!(
        "nodekeeper drain vs kubectl drain: 110-pod node, {} run(s), pod termination {} ms",
        args.runs, args.termination_ms
    );
    let (mut nk, mut kk) = (Vec::new(), Vec::new());
    for run in 0..args.runs {
        let (a, b) = (format!("nk-{run}"), format!("kubectl-{run}"));
        node(&c.sim, &a, finalizer, &owners);
        node(&c.sim, &b, finalizer, &owners);
        let (sim, kc2) = (c.sim.clone(), kc.clone());
        let (nkbin, kbin) = (args.nodekeeper.clone(), args.kubectl.clone());
        let (a2, b2) = (a.clone(), b.clone());
        // Alternate which goes first.
        let (tn, tk) = tokio::task::spawn_blocking(move || {
            let mut n = Command::new(&nkbin);
            n.args(["drain", &a2, "--kubeconfig"])
                .arg(&kc2)
                .args(["--timeout", "5m"]);
            let mut k = Command::new(&kbin);
            k.arg("--kubeconfig")
                .arg(&kc2)
                .args([
                    "drain",
                    &b2,
                    "--ignore-daemonsets",
                    "--delete-emptydir-data",
                    "--timeout",
                    "5m",
                ])
                .env("HOME", kc2.parent().unwrap());
            if run % 2 == 0 {
                let tn = time(&mut n);
                (tn, time(&mut k))
            } else {
                let tk = time(&mut k);
                (time(&mut n), tk)
            }
        })
        .await
        .unwrap();
        let (left_a, left_b) = (pods_on(&sim, &a), pods_on(&sim, &b));
        println!("run {run}: nodekeeper {:>7.1} ms ({left_a} pods left)   kubectl {:>7.1} ms ({left_b} pods left)   ratio {:.3}",
            tn.as_secs_f64() * 1e3, tk.as_secs_f64() * 1e3, tn.as_secs_f64() / tk.as_secs_f64());
        assert_eq!(left_a, 7, "nodekeeper leaves the 4 tolerating DaemonSet pods, 2 mirror pods and the Succeeded pod");
        assert_eq!(
            left_b, 15,
            "kubectl leaves all 13 DaemonSet pods and the 2 mirror pods (it deletes the Succeeded pod)"
        );
        nk.push(tn);
        kk.push(tk);
    }
    let (mn, mk) = (median(nk.clone()), median(kk.clone()));
    println!(
        "median: nodekeeper {:.1} ms (min {:.1}), kubectl {:.1} ms (min {:.1}), ratio {:.3}",
        mn.as_secs_f64() * 1e3,
        nk.iter().min().unwrap().as_secs_f64() * 1e3,
        mk.as_secs_f64() * 1e3,
        kk.iter().min().unwrap().as_secs_f64() * 1e3,
        mn.as_secs_f64() / mk.as_secs_f64()
    );
}

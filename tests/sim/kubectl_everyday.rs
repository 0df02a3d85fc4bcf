//! The same everyday kubectl session (tests/kubectl/everyday.sh: get, describe, label, annotate,
//! taint, cordon/uncordon, drain, create namespace/deployment/configmap, create -f and apply -f with
//! validation, explain, delete, get events) against `nodekeeper sim apiserver` and against a real
//! control plane (scripts/k8s-cluster.sh: kube-apiserver, controller-manager, scheduler, KWOK), run
//! side by side; every step's exit code and facts must be the same on both.
//!
//! Needs the real kubectl (scripts/setup-kubectl.sh) and the control plane binaries
//! (scripts/setup-k8s.sh, built on first use by scripts/k8s-cluster.sh); a missing prerequisite or a
//! cluster that does not start fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

use crate::support::kubectl_bin;

/// `nodekeeper sim apiserver` (the real binary), killed on drop.
struct Sim(Child);

impl Sim {
    fn start(dir: &Path) -> Sim {
        let mut child = Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
            .args(["sim", "apiserver", "--listen", "127.0.0.1:0", "--empty"])
            // Pods' 30 s termination grace passes in 3 s; the kubelet and scheduler keep up.
            .args(["--time-scale", "10", "--kubeconfig-out"])
            .arg(dir.join("kubeconfig"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nodekeeper sim apiserver");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.contains("listening on"), "sim apiserver said {line:?}");
        Sim(child)
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A real control plane from scripts/k8s-cluster.sh, stopped on drop (and by its watcher when this
/// process exits).
struct Real(PathBuf);

impl Real {
    fn start(dir: &Path) -> Real {
        crate::support::k8s_cluster_up(
            dir,
            &["--owner-pid".into(), std::process::id().to_string()],
        );
        Real(dir.to_path_buf())
    }
}

impl Drop for Real {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("scripts/k8s-cluster.sh"))
            .arg("down")
            .arg(&self.0)
            .output();
    }
}

/// Runs tests/kubectl/everyday.sh against `kubeconfig`; returns its step lines and its log.
fn everyday(name: &str, kubeconfig: &Path, home: &Path) -> (Vec<String>, String) {
    let log = home.join("everyday.log");
    let mut child = Command::new(repo().join("tests/kubectl/everyday.sh"))
        .arg(kubeconfig)
        .env("KUBECTL", kubectl_bin())
        .env("HOME", home)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("run tests/kubectl/everyday.sh");
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > Duration::from_secs(420) {
            let _ = child.kill();
            panic!(
                "everyday.sh on {name} still running after 420 s; log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    assert!(status.success(), "everyday.sh on {name}: {status}");
    eprintln!(
        "everyday.sh on {name}: {:.1} s\n{out}",
        started.elapsed().as_secs_f64()
    );
    (
        out.lines().map(str::to_string).collect(),
        std::fs::read_to_string(&log).unwrap_or_default(),
    )
}

fn by_step(lines: &[String]) -> BTreeMap<String, String> {
    lines
        .iter()
        .map(|l| {
            let (step, rest) = l.split_once(' ').unwrap_or((l, ""));
            (step.to_string(), rest.to_string())
        })
        .collect()
}

/// The part of a log about one step: from the previous step's `== ` line to this one's.
fn excerpt<'a>(log: &'a str, step: &str) -> &'a str {
    let Some(end) = log.find(&format!("== {step} ")) else {
        return "";
    };
    let start = log[..end].rfind("\n== ").map_or(0, |i| i + 1);
    let end = log[end..].find('\n').map_or(log.len(), |i| end + i);
    &log[start..end]
}

#[test]
fn everyday_kubectl_on_sim_and_real_cluster() {
    kubectl_bin();
    let dir = tempfile::tempdir().unwrap();
    let (sim_dir, real_dir) = (dir.path().join("sim"), dir.path().join("real"));
    std::fs::create_dir_all(&sim_dir).unwrap();
    let _sim = Sim::start(&sim_dir);
    let _real = Real::start(&real_dir);

    let sim_kc = sim_dir.join("kubeconfig");
    let real_kc = real_dir.join("kubeconfig");
    let sim_home = sim_dir.clone();
    let real_home = real_dir.join("home");
    std::fs::create_dir_all(&real_home).unwrap();
    let on_sim = std::thread::spawn(move || everyday("the sim", &sim_kc, &sim_home));
    let (real, real_log) = everyday("the real cluster", &real_kc, &real_home);
    let (sim, sim_log) = on_sim.join().unwrap();

    // The real cluster is the reference; these facts must hold there (or the session itself is broken).
    let r = by_step(&real);
    for (step, want) in [
        ("create-namespace", "exit=0 says=yes phase=Active"),
        ("create-deployment", "exit=0 says=yes replicas=4 port=80"),
        ("create-configmap", "exit=0 says=yes mode=demo level=2"),
        ("create-invalid", "exit=1 unknown=yes stored="),
        ("apply-changed", "configured=3"),
        ("cordon", "exit=0 unschedulable=true"),
        (
            "drain",
            "evicting=yes drained=yes had_pods=yes left=0 unschedulable=true",
        ),
        ("rescheduled", "exit=0 all=yes on_a=0"),
        ("get-events", "exit=0 scheduled=yes created=yes scaled=yes"),
        ("delete-namespace", "exit=0 says=yes gone=yes"),
    ] {
        let got = r.get(step).map(String::as_str).unwrap_or("<missing>");
        assert!(
            got.contains(want),
            "real cluster, step {step}: {got:?} lacks {want:?}\n{real_log}"
        );
    }

    let s = by_step(&sim);
    assert_eq!(
        r.keys().collect::<Vec<_>>(),
        s.keys().collect::<Vec<_>>(),
        "the same steps ran"
    );
    let mut diffs = Vec::new();
    for line in &real {
        let step = line.split(' ').next().unwrap_or_default();
        if s.get(step) != r.get(step) {
            diffs.push(format!(
                "step {step}:\n  real: {}\n  sim:  {}\n--- real log ---\n{}\n--- sim log ---\n{}",
                r[step],
                s.get(step).map(String::as_str).unwrap_or("<missing>"),
                excerpt(&real_log, step),
                excerpt(&sim_log, step),
            ));
        }
    }
    assert!(
        diffs.is_empty(),
        "{} of {} steps differ between the sim and the real cluster:\n{}",
        diffs.len(),
        real.len(),
        diffs.join("\n\n")
    );
}

//! `scripts/demo.sh --real`: the demo's scenario on a control plane of its own (started, given the
//! shipped manifests and stopped by the script), nodekeeper as its ServiceAccounts; every outcome of
//! the summary must happen, and nothing the script started may be left running.

use std::process::Command;

use crate::support::repo;

#[test]
fn demo_real_plays_the_whole_scenario_and_stops_its_cluster() {
    let out = Command::new("bash")
        .arg(repo().join("scripts/demo.sh"))
        .args(["--real", "--step-timeout", "60s"])
        .env("NODEKEEPER_DEMO_BIN", env!("CARGO_BIN_EXE_nodekeeper"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("$ scripts/demo.sh --real\n{stdout}{stderr}");
    assert!(out.status.success(), "exit {:?}", out.status.code());
    assert!(
        stdout.contains("nodekeeper demo: kube-apiserver v1.37.2 at https://127.0.0.1:"),
        "it ran on the real API server"
    );
    let summary = stdout
        .lines()
        .find(|l| l.ends_with("expected outcomes happened"))
        .expect("a summary line");
    let (done, all) = summary
        .split_whitespace()
        .next()
        .and_then(|f| f.split_once('/'))
        .unwrap();
    assert_eq!(done, all, "{summary}");
    assert!(all.parse::<u32>().unwrap() >= 14, "{summary}");
    assert!(
        stdout.contains("webhook → cloud stand-in"),
        "replacements went through the webhook provider"
    );

    // The cluster was stopped: every PID it recorded is gone (or a zombie, not yet reaped by PID 1).
    let work = stderr
        .lines()
        .find_map(|l| l.strip_prefix("work directory (cluster logs, agent configs and logs): "))
        .expect("the work directory is named");
    let pids = std::fs::read_to_string(std::path::Path::new(work).join("cluster/pids.stopped"))
        .expect("`down` ran");
    for line in pids.lines() {
        let mut f = line.split_whitespace();
        let (name, pid) = (f.next().unwrap(), f.next().unwrap());
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let fields: Vec<&str> = stat.split_whitespace().collect();
        let running = fields.len() > 21 && fields[2] != "Z" && Some(fields[21]) == f.next();
        assert!(!running, "{name} (pid {pid}) still runs");
    }
    let _ = std::fs::remove_dir_all(work);
}

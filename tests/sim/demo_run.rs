//! `nodekeeper demo` end to end: the real binary starts the sim, one agent process per node and
//! the controller, plays the scenario and exits 0 only if every expected outcome happened.

use std::process::Command;

#[test]
fn demo_plays_the_whole_loop_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(["demo", "--step-timeout", "60s", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    // Every phase happened, in order, with the controller's own Events in the timeline.
    let pos = |s: &str| {
        stdout
            .find(s)
            .unwrap_or_else(|| panic!("`{s}` missing:\n{stdout}"))
    };
    // (Events and the script's own checks of one phase may interleave; phases may not.)
    let phases = [
        vec!["LabelRemoved", "✔ CRI-O drop-in applied"],
        vec![
            "InterruptionNotice",
            "ReplacementRequested",
            "✔ tainted + cordoned",
        ],
        vec!["✔ replacement Ready"],
        vec![
            "RepairStarted",
            "BlockedByBudget",
            "✔ second node held by the budget",
        ],
        vec!["✔ held node repaired after the first"],
    ];
    for w in phases.windows(2) {
        for a in &w[0] {
            for b in &w[1] {
                assert!(pos(a) < pos(b), "`{a}` before `{b}`:\n{stdout}");
            }
        }
    }
    // The summary counts every outcome as happened.
    let line = stdout
        .lines()
        .find(|l| l.ends_with("expected outcomes happened"))
        .unwrap();
    let (n, m) = line.split_once(' ').unwrap().0.split_once('/').unwrap();
    assert_eq!(n, m, "{line}");
    assert!(m.parse::<u32>().unwrap() >= 10, "{line}");
    assert!(!stdout.contains("✘"), "{stdout}");
    // Agent logs are kept in the work dir given with --dir.
    assert!(dir.path().join("nodes/spot-1/agent.log").exists());
}

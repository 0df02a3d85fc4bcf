//! The shutdown watcher (`host::logind`) against a real systemd-logind in a systemd-nspawn
//! container: `systemctl poweroff` inside the container must reach the watcher before the container
//! is gone, and the delay lock must hold the shutdown until delivery or the maximum delay.
//!
//! logind records the PID of whoever takes an inhibitor lock, so the watcher runs in a child
//! process inside the container's PID namespace (the test binary itself, re-executed with
//! `helper_shutdown_watcher`); it reports what it sees on stdout, one line per signal.
#![allow(clippy::unwrap_used)]

use crate::support as common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::nspawn::NspawnNode;
use nodekeeper_core::agent::host::logind::{
    Login1ManagerProxy, ShutdownSignal, ShutdownWatcher, WatcherOptions,
};
use nodekeeper_core::agent::host::systemd::{Systemd, UnitManager};

/// Run in a child process (inside the container's PID namespace) by the tests below.
/// Env: NK_BUS (bus address), NK_MAX_DELAY_MS, NK_ACK_AFTER_MS (absent: never acknowledge).
#[tokio::test]
#[ignore = "helper: run in a child process by the logind tests of this file"]
async fn helper_shutdown_watcher() {
    let Ok(bus) = std::env::var("NK_BUS") else {
        eprintln!(
            "helper_shutdown_watcher: a helper, only meaningful when run by its parent tests"
        );
        return;
    };
    let max_delay =
        Duration::from_millis(std::env::var("NK_MAX_DELAY_MS").unwrap().parse().unwrap());
    let ack_after: Option<u64> = std::env::var("NK_ACK_AFTER_MS")
        .ok()
        .map(|v| v.parse().unwrap());
    let options = WatcherOptions {
        max_delay,
        ..WatcherOptions::default()
    };
    let watcher = ShutdownWatcher::connect_address(&bus, options)
        .await
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let run = tokio::spawn(watcher.run(tx));
    let mut held = Vec::new();
    while let Some(signal) = rx.recv().await {
        match signal {
            ShutdownSignal::Inhibiting { delay } => println!("NK inhibiting {}", delay.as_millis()),
            ShutdownSignal::ShuttingDown { delivered, .. } => {
                println!("NK shutting-down");
                match ack_after {
                    Some(ms) => {
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                            println!("NK acknowledging");
                            delivered.done();
                        });
                    }
                    None => held.push(delivered),
                }
            }
            ShutdownSignal::Released { delivered } => println!("NK released {delivered}"),
            ShutdownSignal::Cancelled => println!("NK cancelled"),
        }
    }
    println!("NK watcher ended: {:?}", run.await);
}

/// The helper process and the lines it printed, with their arrival times.
struct Helper {
    child: Child,
    lines: mpsc::Receiver<(Instant, String)>,
    seen: Vec<String>,
}

impl Helper {
    fn start(node: &NspawnNode, max_delay_ms: u64, ack_after_ms: Option<u64>) -> Helper {
        let mut cmd = node.pidns_command(&std::env::current_exe().unwrap());
        cmd.args([
            "--exact",
            crate::support::test_name(module_path!(), "helper_shutdown_watcher").as_str(),
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("NK_BUS", node.bus_address())
        .env("NK_MAX_DELAY_MS", max_delay_ms.to_string())
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
        if let Some(ms) = ack_after_ms {
            cmd.env("NK_ACK_AFTER_MS", ms.to_string());
        }
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // libtest may print "test helper_shutdown_watcher ... " on the same line.
                if let Some(at) = line.find("NK ") {
                    if tx
                        .send((Instant::now(), line[at + 3..].to_string()))
                        .is_err()
                    {
                        return;
                    }
                }
            }
        });
        Helper {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Wait for the next line starting with `prefix` (other lines are kept in `seen`).
    fn expect(&mut self, prefix: &str, within: Duration) -> (Instant, String) {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((at, line)) => {
                    self.seen.push(line.clone());
                    if line.starts_with(prefix) {
                        return (at, line);
                    }
                }
                Err(e) => panic!(
                    "no {prefix:?} line within {within:?} ({e}); seen {:?}",
                    self.seen
                ),
            }
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        common::nspawn::kill_tree(self.child.id());
        let _ = self.child.wait();
    }
}

async fn our_locks(node: &NspawnNode) -> Vec<(String, String, String, String, u32, u32)> {
    let systemd = Systemd::connect_address(&node.bus_address()).await.unwrap();
    let logind = Login1ManagerProxy::new(systemd.connection()).await.unwrap();
    let all = logind.list_inhibitors().await.unwrap();
    all.into_iter().filter(|l| l.1 == "nodekeeper").collect()
}

fn poweroff(node: &NspawnNode) -> Instant {
    let at = Instant::now();
    node.exec_ok(&["systemctl", "poweroff"]);
    at
}

#[tokio::test]
#[ignore = "needs root (systemd-nspawn)"]
async fn poweroff_is_announced_at_once_and_waits_for_delivery() {
    let Some(mut node) = NspawnNode::boot("logind").await else {
        return;
    };
    let mut helper = Helper::start(&node, 10_000, Some(2_000));
    let (_, line) = helper.expect("inhibiting", Duration::from_secs(15));
    // Configured 10 s, bounded by logind's default InhibitDelayMaxUSec of 5 s.
    assert_eq!(line, "inhibiting 5000");
    let locks = our_locks(&node).await;
    assert_eq!(locks.len(), 1, "{locks:?}");
    assert_eq!(
        (locks[0].0.as_str(), locks[0].3.as_str()),
        ("shutdown", "delay")
    );

    let requested = poweroff(&node);
    let (announced, _) = helper.expect("shutting-down", Duration::from_secs(3));
    assert!(
        announced.duration_since(requested) < Duration::from_secs(1),
        "announced late"
    );
    assert!(
        node.is_running(),
        "container gone before the announcement was handled"
    );

    // The delay is honoured: 1.2 s later systemd has not even begun to stop units.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(node.is_running());
    let systemd = Systemd::connect_address(&node.bus_address()).await.unwrap();
    assert_eq!(systemd.system_state().await.unwrap(), "running");
    assert_eq!(
        systemd.status("crio.service").await.unwrap().active_state,
        "active"
    );

    let (released, line) = helper.expect("released", Duration::from_secs(5));
    assert_eq!(line, "released true");
    let held = released.duration_since(announced);
    assert!(
        held >= Duration::from_millis(1900) && held < Duration::from_millis(4000),
        "held {held:?}"
    );
    assert!(
        node.wait_exit(Duration::from_secs(20)).is_some(),
        "no power-off after the lock was released"
    );
}

#[tokio::test]
#[ignore = "needs root (systemd-nspawn)"]
async fn an_unacknowledged_shutdown_is_released_at_the_configured_max_delay() {
    let Some(mut node) = NspawnNode::boot("logind-max").await else {
        return;
    };
    let mut helper = Helper::start(&node, 1_000, None);
    assert_eq!(
        helper.expect("inhibiting", Duration::from_secs(15)).1,
        "inhibiting 1000"
    );
    poweroff(&node);
    let (announced, _) = helper.expect("shutting-down", Duration::from_secs(3));
    let (released, line) = helper.expect("released", Duration::from_secs(5));
    assert_eq!(line, "released false");
    let held = released.duration_since(announced);
    assert!(
        held >= Duration::from_millis(950) && held < Duration::from_millis(2500),
        "held {held:?}"
    );
    assert!(
        node.wait_exit(Duration::from_secs(20)).is_some(),
        "no power-off after the lock was released"
    );
}

#[tokio::test]
#[ignore = "needs root (systemd-nspawn)"]
async fn the_delay_is_bounded_by_loginds_inhibit_delay_max() {
    let Some(mut node) = NspawnNode::boot("logind-bound").await else {
        return;
    };
    node.exec_ok(&["mkdir", "-p", "/etc/systemd/logind.conf.d"]);
    node.exec_ok(&[
        "sh",
        "-c",
        "printf '[Login]\\nInhibitDelayMaxSec=2\\n' > /etc/systemd/logind.conf.d/nk.conf",
    ]);
    node.exec_ok(&["systemctl", "restart", "systemd-logind"]);
    let mut helper = Helper::start(&node, 30_000, None);
    assert_eq!(
        helper.expect("inhibiting", Duration::from_secs(15)).1,
        "inhibiting 2000"
    );
    poweroff(&node);
    let (announced, _) = helper.expect("shutting-down", Duration::from_secs(3));
    let (released, line) = helper.expect("released", Duration::from_secs(6));
    assert_eq!(line, "released false");
    let held = released.duration_since(announced);
    assert!(
        held >= Duration::from_millis(1900) && held < Duration::from_millis(3500),
        "held {held:?}"
    );
    assert!(node.wait_exit(Duration::from_secs(20)).is_some());
}

#[tokio::test]
#[ignore = "needs root (systemd-nspawn)"]
async fn a_cancelled_shutdown_retakes_the_lock() {
    let Some(mut node) = NspawnNode::boot("logind-cancel").await else {
        return;
    };
    let mut helper = Helper::start(&node, 5_000, Some(1_500));
    helper.expect("inhibiting", Duration::from_secs(15));
    poweroff(&node);
    helper.expect("shutting-down", Duration::from_secs(3));
    // Masking poweroff.target while the shutdown is delayed makes logind's StartUnit fail once the
    // lock is released: logind then announces PrepareForShutdown(false), as for any shutdown that
    // does not happen.
    node.exec_ok(&["systemctl", "mask", "--runtime", "poweroff.target"]);
    assert_eq!(
        helper.expect("released", Duration::from_secs(3)).1,
        "released true"
    );
    // Lock re-taken first, then the cancellation reported.
    assert_eq!(
        helper.expect("inhibiting", Duration::from_secs(5)).1,
        "inhibiting 5000"
    );
    helper.expect("cancelled", Duration::from_secs(1));
    assert_eq!(our_locks(&node).await.len(), 1, "lock not re-taken");
    assert!(node.is_running());

    // The re-taken lock works for the next, real shutdown.
    node.exec_ok(&["systemctl", "unmask", "--runtime", "poweroff.target"]);
    poweroff(&node);
    helper.expect("shutting-down", Duration::from_secs(3));
    assert_eq!(
        helper.expect("released", Duration::from_secs(3)).1,
        "released true"
    );
    assert!(node.wait_exit(Duration::from_secs(20)).is_some());
}

//! `nodekeeper agent`: reload on SIGHUP and on file change, keep running on a bad new config,
//! stop cleanly on SIGTERM. (CRI-O restarts through the agent against real systemd are in
//! tests/crio_apply_systemd.rs.)

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

struct Agent {
    child: Child,
    lines: mpsc::Receiver<serde_json::Value>,
}

impl Agent {
    fn start(config: &std::path::Path, root: &std::path::Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
            .args(["agent", "--config"])
            .arg(config)
            .arg("--root")
            .arg(root)
            .env("NODEKEEPER_LOG_FORMAT", "json")
            .env("NODEKEEPER_LOG_LEVEL", "debug")
            .env(
                "DBUS_SYSTEM_BUS_ADDRESS",
                "unix:path=/nonexistent/nodekeeper-test-bus",
            )
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let v = serde_json::from_str(&line)
                    .unwrap_or_else(|_| panic!("log line is not JSON: {line}"));
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        Self { child, lines: rx }
    }

    /// Waits for a log line whose message contains `needle`; returns it.
    fn expect(&self, needle: &str) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(v) if v["message"].as_str().is_some_and(|m| m.contains(needle)) => return v,
                Ok(_) => {}
                Err(_) => panic!("no log line containing {needle:?} within 10 s"),
            }
        }
    }

    fn signal(&self, s: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), s).unwrap();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Tests never reach a metadata service from the host namespace: no cloud, no auto-detection.
const BASE: &str = "[sources]\ncloud = \"none\"\n[agent]\nconfig_poll_interval = \"100ms\"\nshutdown_watcher = false\n";

#[test]
fn reloads_keeps_running_on_bad_config_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("etc/crio/crio.conf.d")).unwrap();
    let cfg = dir.path().join("agent.toml");
    std::fs::write(&cfg, BASE).unwrap();
    let mut agent = Agent::start(&cfg, &root);
    agent.expect("agent starting");

    agent.signal(Signal::SIGHUP);
    agent.expect("SIGHUP: reloading configuration");

    // A change that needs a restart, with no bus: the apply fails, nothing is written, the agent goes on.
    std::fs::write(
        &cfg,
        format!("{BASE}[[crio.dropin]]\nname = \"a.conf\"\ncontent = \"[crio.runtime]\\npids_limit = 1\\n\"\n"),
    )
    .unwrap();
    agent.expect("configuration file changed");
    let failed = agent.expect("CRI-O apply failed");
    assert!(
        failed["error"]
            .as_str()
            .unwrap()
            .contains("cannot connect to the system D-Bus"),
        "{failed}"
    );
    assert_eq!(
        std::fs::read_dir(root.join("etc/crio/crio.conf.d"))
            .unwrap()
            .count(),
        0
    );

    std::fs::write(
        &cfg,
        "[agent]\nconfig_poll_interval = \"100ms\"\nbogus = 1\n",
    )
    .unwrap();
    let invalid = agent.expect("new configuration is invalid");
    assert!(
        invalid["error"]
            .as_str()
            .unwrap()
            .contains("unknown field `bogus`"),
        "{invalid}"
    );

    agent.signal(Signal::SIGTERM);
    agent.expect("agent stopped");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(status) = agent.child.try_wait().unwrap() {
            assert_eq!(status.code(), Some(0));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "agent did not exit within 5 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn invalid_config_at_start_is_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agent.toml");
    std::fs::write(&cfg, "[crio]\nrestart_timeout = \"never\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(["agent", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:2:19: error:", cfg.display())),
        "{err}"
    );
}

#[test]
fn a_closed_stderr_does_not_crash_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agent.toml");
    std::fs::write(&cfg, BASE).unwrap();
    let mut agent = Agent::start(&cfg, dir.path());
    agent.expect("agent starting");
    // Close our end of its stderr: every later log line hits EPIPE.
    drop(std::mem::replace(&mut agent.lines, mpsc::channel().1));
    std::thread::sleep(Duration::from_millis(300));
    agent.signal(Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(status) = agent.child.try_wait().unwrap() {
            assert_eq!(status.code(), Some(0), "exit status with a closed stderr");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "agent did not exit within 5 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

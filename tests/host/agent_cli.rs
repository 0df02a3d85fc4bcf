//! `nodekeeper agent`: reload on SIGHUP and on file change, keep running on a bad new config,
//! stop cleanly on SIGTERM. (CRI-O restarts through the agent against real systemd are in
//! tests/host/crio_apply_systemd.rs.)

use crate::support::agent_proc;

use std::process::Command;
use std::time::Duration;

use agent_proc::{Agent, NO_BUS};
use nix::sys::signal::Signal;

const WITHIN: Duration = Duration::from_secs(10);

/// Tests never reach a metadata service from the host namespace: no cloud, no auto-detection.
const BASE: &str = "[sources]\ncloud = \"none\"\n[agent]\nconfig_poll_interval = \"100ms\"\nshutdown_watcher = false\n";

#[tokio::test]
async fn reloads_keeps_running_on_bad_config_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("etc/crio/crio.conf.d")).unwrap();
    let cfg = dir.path().join("agent.toml");
    std::fs::write(&cfg, BASE).unwrap();
    let mut agent = Agent::start(&cfg, &root, NO_BUS);
    agent.expect("agent starting", WITHIN).await;

    agent.signal(Signal::SIGHUP);
    agent
        .expect("SIGHUP: reloading configuration", WITHIN)
        .await;

    // A change that needs a restart, with no bus: the apply fails, nothing is written, the agent goes on.
    std::fs::write(
        &cfg,
        format!("{BASE}[[crio.dropin]]\nname = \"a.conf\"\ncontent = \"[crio.runtime]\\npids_limit = 1\\n\"\n"),
    )
    .unwrap();
    agent.expect("configuration file changed", WITHIN).await;
    let failed = agent.expect("CRI-O apply failed", WITHIN).await;
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
    let invalid = agent.expect("new configuration is invalid", WITHIN).await;
    assert!(
        invalid["error"]
            .as_str()
            .unwrap()
            .contains("unknown field `bogus`"),
        "{invalid}"
    );

    agent.terminate(Duration::from_secs(5)).await;
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

#[tokio::test]
async fn a_closed_stderr_does_not_crash_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agent.toml");
    std::fs::write(&cfg, BASE).unwrap();
    let mut agent = Agent::start(&cfg, dir.path(), NO_BUS);
    agent.expect("agent starting", WITHIN).await;
    // Close our end of its stderr: every later log line hits EPIPE.
    agent.close_stderr().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    agent.signal(Signal::SIGTERM);
    let status = agent.exited(Duration::from_secs(5)).await;
    assert_eq!(status.code(), Some(0), "exit status with a closed stderr");
}

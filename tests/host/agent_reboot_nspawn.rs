//! The controller's `reboot {id, reason}` command end to end against real systemd in a
//! systemd-nspawn container:
//!
//! 1. the agent (the real binary, on the host, talking to the container's system bus and reading
//!    the container's boot id through `/proc/<pid1>/root`) reports to an in-process controller
//!    over TLS with a sim-minted token;
//! 2. the controller queues `reboot`; the agent persists the id, then starts `reboot.target` over
//!    D-Bus; the container's systemd reaches `reboot.target` and systemd-nspawn exits with 133
//!    ("the container asked for a reboot"); the result `ok` reaches the controller;
//! 3. the node comes back the way `systemd-nspawn@.service` brings it back after 133 (a new
//!    systemd-nspawn on the same rootfs; nspawn gives every boot a new random boot id), the agent
//!    restarts with the same state directory and reports the NEW boot id;
//! 4. the controller sends the same command id again (as a controller that never got the result
//!    would): the restarted agent does not run it (the container stays up), because the id was
//!    persisted before the first run, and answers it as already run, so the controller stops
//!    resending it.
//!
//! Not proven here: a reboot of a real kernel (the container's "reboot" ends its PID namespace;
//! the host keeps running), and the restart is done by this test, not by a service manager.

use crate::support as common;
use crate::support::agent_proc;
use crate::support::ctl;

use std::path::Path;
use std::time::Duration;

use agent_proc::{report_toml, Agent};
use common::nspawn::NspawnNode;
use ctl::*;
use nodekeeper_core::agent::host::systemd::Systemd;
use nodekeeper_core::wire::AgentCommand;

const NODE: &str = "n0";

/// The agent's configuration, with `agent_extra` lines in `[agent]`.
fn agent_toml(env: &Env, port: u16, host_root: &Path, agent_extra: &str) -> String {
    format!(
        r#"[node]
name = "{NODE}"
[sources]
cloud = "none"
[agent]
shutdown_watcher = false
{agent_extra}
[checks]
interval = "1s"
host_root = "{host_root}"
[checks.disk]
enabled = false
[checks.pids]
enabled = false
[checks.kmsg]
enabled = false
[checks.systemd]
enabled = false
{report}"#,
        host_root = host_root.display(),
        report = report_toml(
            port,
            &env.ca,
            SERVER_NAME,
            &env.dir.path().join("token"),
            "300ms"
        ),
    )
}

/// Boots a container and starts an agent for it (host process on the container's bus).
async fn boot_with_agent(
    name: &str,
    env: &Env,
    port: u16,
    work: &Path,
) -> Option<(NspawnNode, Agent, String)> {
    boot_with_agent_extra(name, env, port, work, "").await
}

/// [`boot_with_agent`] with `agent_extra` lines in the agent's `[agent]`.
async fn boot_with_agent_extra(
    name: &str,
    env: &Env,
    port: u16,
    work: &Path,
    agent_extra: &str,
) -> Option<(NspawnNode, Agent, String)> {
    let node = NspawnNode::boot(name).await?;
    let boot_id = node
        .exec_ok(&["cat", "/proc/sys/kernel/random/boot_id"])
        .trim()
        .to_string();
    let host_root = Path::new("/proc")
        .join(node.leader_pid().to_string())
        .join("root");
    let config = work.join(format!("{name}.toml"));
    std::fs::write(&config, agent_toml(env, port, &host_root, agent_extra)).unwrap();
    // The same --root (so the same state_dir) for every boot: it is the node's persistent disk.
    let agent = Agent::start(&config, &work.join("root"), &node.bus_address());
    Some((node, agent, boot_id))
}

/// The cluster, the agent's token file, a leading controller on loopback, and the node's
/// persistent disk (the agent's `--root`, kept across boots).
async fn controller_and_disk() -> (Env, nodekeeper_core::controller::Running, tempfile::TempDir) {
    let env = Env::new(1).await;
    std::fs::write(
        env.dir.path().join("token"),
        env.token(NODE, "nodekeeper").await,
    )
    .unwrap();
    let mut cfg = env.config();
    cfg.listen = "127.0.0.1:0".into();
    let ctl = env.controller(&cfg, true).await;
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(work.path().join("root/etc/crio/crio.conf.d")).unwrap();
    (env, ctl, work)
}

fn reboot(id: &str) -> AgentCommand {
    AgentCommand::Reboot {
        id: id.into(),
        reason: "kernel update".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs root (systemd-nspawn)"]
async fn reboot_command_runs_once_through_systemd_and_the_new_boot_is_reported() {
    let (env, ctl, work) = controller_and_disk().await;
    let port = ctl.addr.port();

    // Boot 1: the agent reports the container's boot id.
    let Some((mut node1, mut agent1, boot1)) =
        boot_with_agent("nk-reboot-1", &env, port, work.path()).await
    else {
        return;
    };
    let host_boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_ne!(boot1, host_boot.trim(), "nspawn virtualizes the boot id");
    let r = agent1
        .report_with(
            |r| r["node"] == NODE,
            "a first report",
            Duration::from_secs(20),
        )
        .await;
    assert_eq!(r["boot_id"], boot1.as_str());

    // The controller asks for a reboot: executed over D-Bus, observed by the container's systemd.
    ctl.app.states.queue_command(NODE, reboot("reboot-1")).await;
    let ran = agent1
        .expect(
            "rebooting on the controller's request",
            Duration::from_secs(10),
        )
        .await;
    assert_eq!(ran["id"], "reboot-1");
    let exit = tokio::task::block_in_place(|| node1.wait_exit(Duration::from_secs(30)))
        .expect("the container did not go down after the reboot command");
    assert_eq!(
        exit.code(),
        Some(133),
        "systemd-nspawn's exit code for a reboot requested by the container"
    );
    let log = std::fs::read_to_string(node1.dir().join("nspawn.log")).unwrap();
    assert!(log.contains("reboot.target"), "{log}");
    assert!(log.contains("Rebooting."), "{log}");
    let persisted = std::fs::read_to_string(
        work.path()
            .join("root/var/lib/nodekeeper/reporter-commands.json"),
    )
    .unwrap();
    assert!(persisted.contains("\"reboot-1\""), "{persisted}");
    // The result reaches the controller (which stops sending the command).
    let r = agent1
        .report_with(
            |r| {
                r["command_results"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|c| c["id"] == "reboot-1"))
            },
            "the reboot result",
            Duration::from_secs(10),
        )
        .await;
    let result = &r["command_results"][0];
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(result["message"], "reboot.target started");
    agent1.terminate(Duration::from_secs(10)).await;
    drop(node1);

    // Boot 2: the agent starts again and reports the new boot id.
    let (node2, mut agent2, boot2) = boot_with_agent("nk-reboot-2", &env, port, work.path())
        .await
        .unwrap();
    assert_ne!(boot2, boot1);
    let r = agent2
        .report_with(
            |r| r["node"] == NODE,
            "a report after the boot",
            Duration::from_secs(20),
        )
        .await;
    assert_eq!(r["boot_id"], boot2.as_str(), "the new boot id is reported");

    // The same command again (e.g. a controller that never saw the result): not run twice.
    ctl.app.states.queue_command(NODE, reboot("reboot-1")).await;
    let skipped = agent2
        .expect("command already executed", Duration::from_secs(10))
        .await;
    assert_eq!(skipped["id"], "reboot-1");
    // It answers it ("already run") in its next report, so the controller stops sending it.
    common::wait::until(
        Duration::from_secs(10),
        "the controller holds no command for the node",
        || async { ctl.app.states.pending_commands(NODE).await.is_empty() },
    )
    .await;
    assert!(
        agent2
            .drain_matching("rebooting on the controller's request")
            .is_empty(),
        "the reboot ran twice"
    );
    let state = Systemd::connect_address(&node2.bus_address())
        .await
        .unwrap()
        .system_state()
        .await
        .unwrap();
    assert_eq!(state, "running", "the container stays up");
    agent2.terminate(Duration::from_secs(10)).await;
    drop(node2);
    ctl.stop().await;
}

/// The controller's `restart_unit` command (a repair's `restart-unit` step) against real systemd
/// in a container: a unit of the agent's `[agent] restart_units` is restarted over D-Bus (a new
/// main PID, the result `ok`); another unit is refused without touching it, and the refusal is
/// the command's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs root (systemd-nspawn)"]
async fn restart_unit_command_restarts_only_allow_listed_units_through_systemd() {
    let (env, ctl, work) = controller_and_disk().await;
    let Some((node, mut agent, _)) = boot_with_agent_extra(
        "nk-restart-1",
        &env,
        ctl.addr.port(),
        work.path(),
        r#"restart_units = ["nk-kubelet.service"]"#,
    )
    .await
    else {
        return;
    };
    // Two long-running services: the allow-listed stand-in kubelet and another one.
    for unit in ["nk-kubelet", "nk-other"] {
        let body = "[Service]\nExecStart=/bin/sleep infinity\n";
        node.exec_ok(&[
            "sh",
            "-c",
            &format!("printf '{body}' > /etc/systemd/system/{unit}.service"),
        ]);
    }
    node.exec_ok(&["systemctl", "daemon-reload"]);
    node.exec_ok(&[
        "systemctl",
        "start",
        "nk-kubelet.service",
        "nk-other.service",
    ]);
    let pid = |unit: &str| node.exec_ok(&["systemctl", "show", "-p", "MainPID", "--value", unit]);
    let (kubelet_before, other_before) = (pid("nk-kubelet.service"), pid("nk-other.service"));
    // The agent lists the command type, so the controller sends it.
    let r = agent
        .report_with(
            |r| r["node"] == NODE,
            "a first report",
            Duration::from_secs(20),
        )
        .await;
    assert!(
        r["command_types"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t == "restart_unit")),
        "{r}"
    );

    let restart = |id: &str, unit: &str| AgentCommand::RestartUnit {
        id: id.into(),
        unit: unit.into(),
        reason: "repair:Ready=False".into(),
    };
    ctl.app
        .states
        .queue_command(NODE, restart("restart-1", "nk-kubelet.service"))
        .await;
    ctl.app
        .states
        .queue_command(NODE, restart("restart-2", "nk-other.service"))
        .await;
    let result = |r: &serde_json::Value, id: &str| {
        r["command_results"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["id"] == id).cloned())
    };
    let r = agent
        .report_with(
            |r| result(r, "restart-1").is_some() && result(r, "restart-2").is_some(),
            "both results",
            Duration::from_secs(30),
        )
        .await;
    let ok = result(&r, "restart-1").unwrap();
    assert_eq!(ok["ok"], true, "{ok}");
    assert!(
        ok["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("nk-kubelet.service restarted")),
        "{ok}"
    );
    let refused = result(&r, "restart-2").unwrap();
    assert_eq!(refused["ok"], false, "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .is_some_and(|m| m.contains("refused")
                && m.contains("not in this agent's [agent] restart_units")),
        "{refused}"
    );
    let kubelet_after = pid("nk-kubelet.service");
    assert_ne!(kubelet_after, kubelet_before, "restarted: a new main PID");
    assert_ne!(kubelet_after.trim(), "0", "and running");
    assert_eq!(
        pid("nk-other.service"),
        other_before,
        "the refused unit untouched"
    );
    agent.terminate(Duration::from_secs(10)).await;
    drop(node);
    ctl.stop().await;
}

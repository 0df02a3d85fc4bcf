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

fn agent_toml(env: &Env, port: u16, host_root: &Path) -> String {
    format!(
        r#"[node]
name = "{NODE}"
[sources]
cloud = "none"
[agent]
shutdown_watcher = false
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
    let node = NspawnNode::boot(name).await?;
    let boot_id = node
        .exec_ok(&["cat", "/proc/sys/kernel/random/boot_id"])
        .trim()
        .to_string();
    let host_root = Path::new("/proc")
        .join(node.leader_pid().to_string())
        .join("root");
    let config = work.join(format!("{name}.toml"));
    std::fs::write(&config, agent_toml(env, port, &host_root)).unwrap();
    // The same --root (so the same state_dir) for every boot: it is the node's persistent disk.
    let agent = Agent::start(&config, &work.join("root"), &node.bus_address());
    Some((node, agent, boot_id))
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
    let env = Env::new(1).await;
    std::fs::write(
        env.dir.path().join("token"),
        env.token(NODE, "nodekeeper").await,
    )
    .unwrap();
    let mut cfg = env.config();
    cfg.listen = "127.0.0.1:0".into();
    let ctl = env.controller(&cfg, true).await;
    let port = ctl.addr.port();
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(work.path().join("root/etc/crio/crio.conf.d")).unwrap();

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

//! End to end: the real agent binary (`nodekeeper agent --config ...`) reports to a controller
//! started in-process against `nodekeeper sim`, over real TLS (pinned CA + server name) with a
//! sim-minted service-account token file. A failing disk check shows up as the Node condition in
//! the sim, a fixed one flips it back after a config reload, and SIGTERM ends the agent cleanly.
//!
//! The agent never probes a metadata service (`[sources] cloud = "none"`) and gets no system bus.
//!
//! Sim only: the agent's checks and reload with sim-minted tokens; the shipped agent as its
//! DaemonSet's pod runs on both in `tests/e2e` (`labels`).

use crate::support::agent_proc;
use crate::support::ctl;
use crate::support::wait;

use std::path::Path;
use std::time::Duration;

use agent_proc::{report_toml, Agent, NO_BUS};
use ctl::*;

/// An agent config reporting to `port`: only the disk check, on `disk` with a free-space
/// threshold of `min_free_percent`, one round every 200 ms, no flap delay.
fn agent_toml(env: &Env, port: u16, disk: &Path, min_free_percent: f64) -> String {
    format!(
        r#"[node]
name = "n0"
[sources]
cloud = "none"
[agent]
shutdown_watcher = false
config_poll_interval = "100ms"
[checks]
interval = "200ms"
[checks.memory]
enabled = false
[checks.pids]
enabled = false
[checks.kmsg]
enabled = false
[checks.systemd]
enabled = false
[checks.disk]
paths = ["{disk}"]
min_free_percent = {min_free_percent:.1}
min_free_inodes_percent = 0.0
flap = {{ count = 1 }}
{report}"#,
        disk = disk.display(),
        report = report_toml(
            port,
            &env.ca,
            SERVER_NAME,
            &env.dir.path().join("token"),
            "500ms"
        ),
    )
}

async fn wait_disk_condition(env: &Env, status: &str) -> (String, String) {
    let what = format!("NodekeeperDiskPressure={status}");
    wait::until(Duration::from_secs(15), what, || async {
        let c = conditions(&env.nodes(), "n0").await;
        match c.get("NodekeeperDiskPressure") {
            Some(x) if x.0 == status => Ok((x.0.clone(), x.1.clone())),
            _ => Err(c),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agent_binary_reports_conditions_over_tls_and_stops_on_sigterm() {
    let env = Env::new(1).await;
    std::fs::write(
        env.dir.path().join("token"),
        env.token("n0", "nodekeeper").await + "\n",
    )
    .unwrap();
    let mut cfg = env.config();
    cfg.listen = "127.0.0.1:0".into();
    let ctl = env.controller(&cfg, true).await;
    let port = ctl.addr.port();

    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    std::fs::create_dir_all(root.join("etc/crio/crio.conf.d")).unwrap();
    let disk = work.path().join("disk");
    std::fs::create_dir_all(&disk).unwrap();
    let config = work.path().join("agent.toml");
    // No file system is 100 % free: the check fails.
    std::fs::write(&config, agent_toml(&env, port, &disk, 100.0)).unwrap();

    let mut agent = Agent::start(&config, &root, NO_BUS);
    agent
        .expect("agent starting", Duration::from_secs(10))
        .await;
    let (_, reason) = wait_disk_condition(&env, "True").await;
    assert!(!reason.is_empty());
    assert!(
        ctl.app
            .states
            .counters
            .node_writes
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );

    // The threshold is fixed on the fly: the reload reaches the Node through the controller.
    std::fs::write(&config, agent_toml(&env, port, &disk, 0.1)).unwrap();
    agent
        .expect("configuration file changed", Duration::from_secs(10))
        .await;
    wait_disk_condition(&env, "False").await;

    // SIGTERM: the agent stops within seconds, exit code 0, the event queue persisted.
    agent.terminate(Duration::from_secs(10)).await;
    let queue = root.join("var/lib/nodekeeper/reporter-events.json");
    assert_eq!(std::fs::read_to_string(&queue).unwrap(), "[]");
    ctl.stop().await;
}

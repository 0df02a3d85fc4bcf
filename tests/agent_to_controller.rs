//! End to end: the real agent binary (`nodekeeper agent --config ...`) reports to a controller
//! started in-process against `nodekeeper sim`, over real TLS (pinned CA + server name) with a
//! sim-minted service-account token file. A failing disk check shows up as the Node condition in
//! the sim, a fixed one flips it back after a config reload, and SIGTERM ends the agent cleanly.
//!
//! The agent never probes a metadata service (`[sources] cloud = "none"`) and gets no system bus.

mod ctl;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use ctl::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

/// The agent process; its stderr (JSON logs) is drained continuously by a task, so a chatty agent
/// can never block on a full pipe.
struct Agent {
    child: tokio::process::Child,
    lines: mpsc::UnboundedReceiver<serde_json::Value>,
}

impl Agent {
    fn start(config: &Path, root: &Path) -> Agent {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
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
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let v = serde_json::from_str(&line)
                    .unwrap_or_else(|_| serde_json::json!({"message": line}));
                // Keep draining even when nobody listens any more.
                let _ = tx.send(v);
            }
        });
        Agent { child, lines: rx }
    }

    /// Waits for a log line whose message contains `needle`.
    async fn expect(&mut self, needle: &str, within: Duration) -> serde_json::Value {
        let end = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(end, self.lines.recv()).await {
                Ok(Some(v)) if v["message"].as_str().is_some_and(|m| m.contains(needle)) => {
                    return v
                }
                Ok(Some(_)) => {}
                Ok(None) => panic!("agent exited before logging {needle:?}"),
                Err(_) => panic!("no log line containing {needle:?} within {within:?}"),
            }
        }
    }
}

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
[report]
url = "https://127.0.0.1:{port}"
ca_file = "{ca}"
server_name = "{SERVER_NAME}"
token_file = "{token}"
heartbeat = "500ms"
timeout = "2s"
backoff_max = "500ms"
"#,
        disk = disk.display(),
        ca = env.ca.display(),
        token = env.dir.path().join("token").display(),
    )
}

async fn wait_disk_condition(env: &Env, status: &str) -> (String, String) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let c = conditions(&env.nodes(), "n0").await;
        if let Some(x) = c.get("NodekeeperDiskPressure") {
            if x.0 == status {
                return (x.0.clone(), x.1.clone());
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "NodekeeperDiskPressure never became {status}: {c:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    cfg.listen = format!("127.0.0.1:{port}");
    let ctl = env.controller(&cfg, true).await;

    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    std::fs::create_dir_all(root.join("etc/crio/crio.conf.d")).unwrap();
    let disk = work.path().join("disk");
    std::fs::create_dir_all(&disk).unwrap();
    let config = work.path().join("agent.toml");
    // No file system is 100 % free: the check fails.
    std::fs::write(&config, agent_toml(&env, port, &disk, 100.0)).unwrap();

    let mut agent = Agent::start(&config, &root);
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
    let pid = Pid::from_raw(agent.child.id().unwrap() as i32);
    kill(pid, Signal::SIGTERM).unwrap();
    agent.expect("agent stopped", Duration::from_secs(10)).await;
    let status = tokio::time::timeout(Duration::from_secs(5), agent.child.wait())
        .await
        .expect("agent did not exit within 5 s of SIGTERM")
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let queue = root.join("var/lib/nodekeeper/reporter-events.json");
    assert_eq!(std::fs::read_to_string(&queue).unwrap(), "[]");
    ctl.stop().await;
}

//! The real agent binary as a child process of a test, with its JSON logs drained continuously
//! (an undrained stderr pipe blocks the agent in `write(2)`, after which it never sees SIGTERM),
//! and the configuration pieces the agent tests share.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

/// A system bus address that does not exist: the agent runs without D-Bus.
pub const NO_BUS: &str = "unix:path=/nonexistent/nodekeeper-test-bus";

/// A running `nodekeeper agent`; killed on drop.
pub struct Agent {
    pub child: tokio::process::Child,
    lines: mpsc::UnboundedReceiver<serde_json::Value>,
    reader: tokio::task::JoinHandle<()>,
}

impl Agent {
    /// Starts `nodekeeper agent --config CONFIG --root ROOT` with debug JSON logs and the given
    /// system bus address ([`NO_BUS`]: no bus), without `KUBECONFIG`.
    pub fn start(config: &Path, root: &Path, bus: &str) -> Agent {
        Agent::start_with_env(config, root, bus, &[])
    }

    /// As [`Agent::start`], with extra environment variables.
    pub fn start_with_env(config: &Path, root: &Path, bus: &str, env: &[(&str, &OsStr)]) -> Agent {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
            .args(["agent", "--config"])
            .arg(config)
            .arg("--root")
            .arg(root)
            .env("NODEKEEPER_LOG_FORMAT", "json")
            .env("NODEKEEPER_LOG_LEVEL", "debug")
            .env("DBUS_SYSTEM_BUS_ADDRESS", bus)
            .env_remove("KUBECONFIG")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        let reader = tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let v = serde_json::from_str(&line)
                    .unwrap_or_else(|_| serde_json::json!({"message": line}));
                // Keep draining even when nobody listens any more.
                let _ = tx.send(v);
            }
        });
        Agent {
            child,
            lines: rx,
            reader,
        }
    }

    /// Sends `signal` to the agent.
    pub fn signal(&self, signal: Signal) {
        let pid = Pid::from_raw(self.child.id().unwrap() as i32);
        kill(pid, signal).unwrap();
    }

    /// Closes the read end of the agent's stderr: every later log line hits EPIPE.
    pub async fn close_stderr(&mut self) {
        self.reader.abort();
        let _ = (&mut self.reader).await;
    }

    /// Waits for the agent to exit within `within`.
    pub async fn exited(&mut self, within: Duration) -> ExitStatus {
        tokio::time::timeout(within, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("agent did not exit within {within:?}"))
            .unwrap()
    }

    /// Waits for a log line whose message contains `needle`.
    pub async fn expect(&mut self, needle: &str, within: Duration) -> serde_json::Value {
        self.expect_with(
            |v| v["message"].as_str().is_some_and(|m| m.contains(needle)),
            needle,
            within,
        )
        .await
    }

    /// Waits for a log line matching `pred` (`what` names it in the panic message).
    pub async fn expect_with(
        &mut self,
        pred: impl Fn(&serde_json::Value) -> bool,
        what: &str,
        within: Duration,
    ) -> serde_json::Value {
        let end = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(end, self.lines.recv()).await {
                Ok(Some(v)) if pred(&v) => return v,
                Ok(Some(_)) => {}
                Ok(None) => panic!("agent exited before logging {what:?}"),
                Err(_) => panic!("no log line {what:?} within {within:?}"),
            }
        }
    }

    /// Waits for the next full report (debug log) matching `pred`; returns the parsed report.
    pub async fn report_with(
        &mut self,
        pred: impl Fn(&serde_json::Value) -> bool,
        what: &str,
        within: Duration,
    ) -> serde_json::Value {
        let line = self
            .expect_with(
                |v| {
                    v["message"] == "node report (full)"
                        && v["report"]
                            .as_str()
                            .and_then(|r| serde_json::from_str(r).ok())
                            .is_some_and(|r| pred(&r))
                },
                what,
                within,
            )
            .await;
        serde_json::from_str(line["report"].as_str().unwrap()).unwrap()
    }

    /// Log lines received so far (without waiting) whose message contains `needle`.
    pub fn drain_matching(&mut self, needle: &str) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        while let Ok(v) = self.lines.try_recv() {
            if v["message"].as_str().is_some_and(|m| m.contains(needle)) {
                out.push(v);
            }
        }
        out
    }

    /// SIGTERM, then waits for "agent stopped" and exit code 0 within `within`.
    pub async fn terminate(&mut self, within: Duration) {
        self.signal(Signal::SIGTERM);
        self.expect("agent stopped", within).await;
        assert_eq!(self.exited(within).await.code(), Some(0));
    }
}

/// `[report]` to a controller on `https://127.0.0.1:PORT` with the test CA pinned to
/// `server_name`, a token file, and fast retries.
pub fn report_toml(
    port: u16,
    ca: &Path,
    server_name: &str,
    token: &Path,
    heartbeat: &str,
) -> String {
    format!(
        r#"[report]
url = "https://127.0.0.1:{port}"
ca_file = "{ca}"
server_name = "{server_name}"
token_file = "{token}"
heartbeat = "{heartbeat}"
timeout = "2s"
backoff_max = "500ms"
"#,
        ca = ca.display(),
        token = token.display(),
    )
}

//! The demo's agents: one real `nodekeeper agent` process per node (like the DaemonSet), each
//! with its own metadata emulator on loopback (OCI unless [`Agents::with_source`] says
//! otherwise), tokens for its node ([`Credentials`]: minted by the sim, or TokenRequest tokens
//! bound to the DaemonSet's pod on a real cluster), and a throw-away state directory. New
//! nodes get an agent as they appear; removed nodes lose theirs. `bench/examples/notice_bench.rs`
//! uses the same supervisor with each cloud.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::sync::Mutex;

use crate::apiserver::auth::TokenRequest;
use crate::apiserver::Sim;
use crate::imds::ImdsEmulator;
use nodekeeper_core::wire::Cloud;

/// The agents' service account (the controller requires it).
pub const SERVICE_ACCOUNT: &str = "system:serviceaccount:nodekeeper:nodekeeper-agent";

/// Errors starting an agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The node's tokens could not be had.
    #[error("node {node}: credentials: {message}")]
    Credentials {
        /// Node.
        node: String,
        /// What failed.
        message: String,
    },
    /// A file of the node's directory.
    #[error("node {node}: {path}: {source}")]
    Io {
        /// Node.
        node: String,
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
}

/// The files an agent authenticates with.
#[derive(Debug, Clone)]
pub struct AgentCredentials {
    /// `[report] token_file`: the token the controller verifies (audience `nodekeeper`).
    pub token_file: PathBuf,
    /// `KUBECONFIG` of the agent's own API calls (the label watch).
    pub kubeconfig: PathBuf,
}

/// Where agents' credentials come from.
pub trait Credentials: Send + Sync {
    /// Writes `node`'s credentials into `dir` (the node's own directory).
    fn issue<'a>(
        &'a self,
        node: &'a str,
        dir: &'a Path,
    ) -> futures::future::BoxFuture<'a, Result<AgentCredentials, String>>;
}

/// Tokens minted by the sim for the node, and the sim's kubeconfig.
pub struct SimCredentials {
    sim: Arc<Sim>,
    kubeconfig: PathBuf,
}

impl SimCredentials {
    /// Credentials from `sim`, whose kubeconfig is at `kubeconfig`.
    pub fn new(sim: Arc<Sim>, kubeconfig: PathBuf) -> Self {
        SimCredentials { sim, kubeconfig }
    }
}

impl Credentials for SimCredentials {
    fn issue<'a>(
        &'a self,
        node: &'a str,
        dir: &'a Path,
    ) -> futures::future::BoxFuture<'a, Result<AgentCredentials, String>> {
        Box::pin(async move {
            let (token, _) = self.sim.tokens.mint(
                &self.sim.store.clock,
                TokenRequest {
                    pod: format!("nodekeeper-agent-{node}"),
                    node: node.into(),
                    audiences: vec!["nodekeeper".into()],
                    namespace: "nodekeeper".into(),
                    service_account: "nodekeeper-agent".into(),
                    expiration_seconds: 24 * 3600,
                    pod_uid: String::new(),
                },
            );
            let token_file = dir.join("token");
            std::fs::write(&token_file, token)
                .map_err(|e| format!("{}: {e}", token_file.display()))?;
            Ok(AgentCredentials {
                token_file,
                kubeconfig: self.kubeconfig.clone(),
            })
        })
    }
}

/// One node's agent.
pub struct NodeAgent {
    /// Its metadata emulator (the demo injects notices into it).
    pub imds: ImdsEmulator,
    child: Child,
}

/// Every agent of the demo.
pub struct Agents {
    exe: PathBuf,
    dir: PathBuf,
    controller_url: String,
    credentials: Arc<dyn Credentials>,
    cloud: Cloud,
    poll_interval: Duration,
    running: Mutex<BTreeMap<String, NodeAgent>>,
}

impl Agents {
    /// A supervisor starting `exe agent` processes with files under `dir` (OCI metadata polled
    /// every 500 ms).
    pub fn new(
        exe: PathBuf,
        dir: PathBuf,
        controller_url: String,
        credentials: Arc<dyn Credentials>,
    ) -> Self {
        Agents {
            exe,
            dir,
            controller_url,
            credentials,
            cloud: Cloud::Oci,
            poll_interval: Duration::from_millis(500),
            running: Mutex::new(BTreeMap::new()),
        }
    }

    /// Agents reading `cloud`'s metadata (each from its own emulator of that cloud), polled
    /// every `poll_interval` (GCP long-polls instead).
    pub fn with_source(mut self, cloud: Cloud, poll_interval: Duration) -> Self {
        self.cloud = cloud;
        self.poll_interval = poll_interval;
        self
    }

    /// Metadata requests `node`'s emulator has served (None: no agent for `node`).
    pub async fn metadata_requests(&self, node: &str) -> Option<u64> {
        self.running
            .lock()
            .await
            .get(node)
            .map(|a| a.imds.requests())
    }

    /// Makes the set of agents match `nodes`: starts missing ones, stops those of gone nodes.
    /// Returns the nodes whose agent was started.
    pub async fn sync(&self, nodes: &[String]) -> Result<Vec<String>, AgentError> {
        let mut running = self.running.lock().await;
        let gone: Vec<String> = running
            .keys()
            .filter(|n| !nodes.contains(n))
            .cloned()
            .collect();
        for n in gone {
            if let Some(mut a) = running.remove(&n) {
                stop(&mut a.child).await;
            }
        }
        let mut started = Vec::new();
        for n in nodes {
            if !running.contains_key(n) {
                running.insert(n.clone(), self.start(n).await?);
                started.push(n.clone());
            }
        }
        Ok(started)
    }

    /// Announces a preemption to `node`'s agent, happening `after` from now.
    pub async fn preempt(&self, node: &str, after: Duration) -> bool {
        match self.running.lock().await.get(node) {
            Some(a) => {
                a.imds.preempt(after);
                true
            }
            None => false,
        }
    }

    /// Stops every agent (SIGTERM, then SIGKILL after 5 s).
    pub async fn stop_all(&self) {
        let mut running = self.running.lock().await;
        for (_, mut a) in std::mem::take(&mut *running) {
            stop(&mut a.child).await;
        }
    }

    async fn start(&self, node: &str) -> Result<NodeAgent, AgentError> {
        let io = |path: &Path| {
            let node = node.to_string();
            let path = path.to_path_buf();
            move |source| AgentError::Io { node, path, source }
        };
        let imds = ImdsEmulator::start(self.cloud, ([127, 0, 0, 1], 0).into())
            .await
            .map_err(io(Path::new("<metadata emulator>")))?;
        let ndir = self.dir.join("nodes").join(node);
        std::fs::create_dir_all(&ndir).map_err(io(&ndir))?;
        let creds = self
            .credentials
            .issue(node, &ndir)
            .await
            .map_err(|message| AgentError::Credentials {
                node: node.to_string(),
                message,
            })?;
        let cfg = ndir.join("agent.toml");
        let source = Source {
            cloud: self.cloud,
            endpoint: &imds.url(),
            poll_interval: self.poll_interval,
        };
        let text = agent_toml(
            node,
            &source,
            &self.controller_url,
            &creds.token_file,
            &ndir,
        );
        std::fs::write(&cfg, text).map_err(io(&cfg))?;
        let log = ndir.join("agent.log");
        let out = std::fs::File::create(&log).map_err(io(&log))?;
        let err = out.try_clone().map_err(io(&log))?;
        let child = Command::new(&self.exe)
            .arg("agent")
            .arg("--config")
            .arg(&cfg)
            .env_clear()
            .env("KUBECONFIG", &creds.kubeconfig)
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(io(&self.exe))?;
        Ok(NodeAgent { imds, child })
    }
}

async fn stop(child: &mut Child) {
    if let Some(pid) = child.id() {
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        if tokio::time::timeout(Duration::from_secs(5), child.wait())
            .await
            .is_ok()
        {
            return;
        }
    }
    let _ = child.kill().await;
}

/// Where an agent reads its metadata.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// Which cloud's API.
    pub cloud: Cloud,
    /// The emulator's base URL.
    pub endpoint: &'a str,
    /// `[sources] poll_interval`.
    pub poll_interval: Duration,
}

/// The agent configuration of one demo node: metadata from its emulator (for OCI with the
/// emulator's preemption path polled), reports to the controller over loopback, the migration
/// label rule OKE users run after a Cilium migration, host checks that touch nothing (no systemd, no kernel log, no
/// logind: the demo runs on your machine, not on a node).
pub fn agent_toml(
    node: &str,
    source: &Source<'_>,
    controller_url: &str,
    token_file: &Path,
    dir: &Path,
) -> String {
    format!(
        r#"[log]
format = "json"
level = "info"

[node]
name = "{node}"

[crio]
state_dir = "{dir}/state"
dropin_dir = "{dir}/crio.conf.d"

[agent]
shutdown_watcher = false
config_poll_interval = "60s"

[sources]
cloud = "{cloud}"
endpoint = "{endpoint}"
poll_interval = "{poll}ms"

[[sources.oci.poll_paths]]
path = "{preempt}"
kind = "preemption"

[checks]
interval = "5s"
[checks.kmsg]
enabled = false
[checks.systemd]
enabled = false
[checks.disk]
paths = ["{dir}"]

[labels]
mode = "report"
[[labels.cleanup]]
label = "{label}"
when_pod_ready = {{ namespace = "kube-system", selector = "app=cilium" }}

[report]
url = "{controller_url}"
token_file = "{token}"
heartbeat = "5s"
"#,
        dir = dir.display(),
        cloud = source.cloud,
        endpoint = source.endpoint,
        poll = source.poll_interval.as_millis(),
        preempt = crate::imds::oci::PREEMPT_PATH,
        label = super::cluster::MIGRATION_LABEL,
        token = token_file.display(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_config_validates_without_warnings() {
        for cloud in [Cloud::Oci, Cloud::Aws, Cloud::Azure, Cloud::Gcp] {
            let source = Source {
                cloud,
                endpoint: "http://127.0.0.1:1",
                poll_interval: Duration::from_millis(500),
            };
            let text = agent_toml(
                "spot-0",
                &source,
                "http://127.0.0.1:2",
                Path::new("/tmp/t"),
                Path::new("/tmp/d"),
            );
            let loaded = nodekeeper_core::config_file::Config::load_str(
                Path::new("agent.toml"),
                &text,
                &nodekeeper_core::config::Env::default(),
            )
            .unwrap();
            assert!(loaded.warnings.is_empty(), "{cloud}: {:?}", loaded.warnings);
            assert_eq!(loaded.config.agent.node.name, "spot-0");
            assert!(loaded.config.agent.report.is_some());
            assert_eq!(
                loaded.config.agent.sources.poll_interval,
                Duration::from_millis(500)
            );
        }
    }
}

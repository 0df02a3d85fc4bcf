//! The agent pod's view of a node without a kubelet: a root directory holding only the agent binary (and the
//! shared libraries a test build links: the image is `FROM scratch`, so nothing else, no `/var/run → /run`
//! link), with the DaemonSet's volumes bound at the manifest's mount paths in a private mount namespace, the
//! container's environment from the manifest, and a network namespace of its own. Each hostPath of the
//! manifest maps to the test node's side of it ([`node_side`]); a hostPath this module does not know fails
//! the test, so a new mount is never silently left out.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::nspawn::NspawnNode;

const DAEMONSET: &str = "manifests/11-agent-daemonset.yaml";
const CONFIGMAP: &str = "manifests/12-agent-config.yaml";
const NODE_NAME: &str = "test-node";

/// One bind mount: the test's directory and where the pod sees it.
struct Bind {
    source: PathBuf,
    target: String,
    read_only: bool,
}

pub struct PodRoot {
    dir: PathBuf,
    config_path: String,
    binds: Vec<Bind>,
    env: Vec<(String, String)>,
}

/// Where the test node keeps what the node's `host_path` holds.
fn node_side(node: &NspawnNode, host_path: &str) -> PathBuf {
    match host_path {
        "/run/dbus" => node.dir().join("dbus"),
        "/etc/crio" => node.root().join("etc/crio"),
        "/var/run/crio" => node.root().join("var/run/crio"),
        "/" => node.root(),
        "/dev/kmsg" => PathBuf::from("/dev/kmsg"),
        other => panic!("{DAEMONSET}: hostPath {other} has no place in the test node (tests/support/pod_root.rs)"),
    }
}

impl PodRoot {
    /// The agent DaemonSet's pod on `node`, in `parent/pod`.
    pub fn agent(parent: &Path, node: &NspawnNode) -> PodRoot {
        let repo = super::repo();
        let ds: DaemonSet =
            serde_yaml::from_str(&std::fs::read_to_string(repo.join(DAEMONSET)).unwrap()).unwrap();
        let pod = ds.spec.unwrap().template.spec.unwrap();
        let c = &pod.containers[0];
        let volumes = pod.volumes.unwrap_or_default();
        let mut binds = Vec::new();
        let mut config_path = None;
        for m in c.volume_mounts.iter().flatten() {
            let v = volumes.iter().find(|v| v.name == m.name).unwrap();
            if let Some(hp) = &v.host_path {
                binds.push(Bind {
                    source: node_side(node, &hp.path),
                    target: m.mount_path.clone(),
                    read_only: m.read_only == Some(true),
                });
            } else if v.config_map.is_some() {
                config_path = Some(format!("{}/config.toml", m.mount_path));
            }
            // Projected tokens: no kubelet fills them; the agent runs without (its reports are degraded).
        }
        let mut env = Vec::new();
        for e in c.env.iter().flatten() {
            match (&e.value, &e.value_from) {
                (Some(v), _) => env.push((e.name.clone(), v.clone())),
                (None, Some(from)) => {
                    let field = from.field_ref.as_ref().map(|f| f.field_path.as_str());
                    assert_eq!(field, Some("spec.nodeName"), "{DAEMONSET}: env {}", e.name);
                    env.push((e.name.clone(), NODE_NAME.to_string()));
                }
                (None, None) => env.push((e.name.clone(), String::new())),
            }
        }
        let dir = parent.join("pod");
        std::fs::create_dir_all(&dir).unwrap();
        PodRoot {
            dir,
            config_path: config_path.expect("the DaemonSet mounts its ConfigMap"),
            binds,
            env,
        }
    }

    /// The shipped agent config (the ConfigMap's `config.toml`).
    pub fn shipped_config(&self) -> String {
        let cm: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(super::repo().join(CONFIGMAP)).unwrap())
                .unwrap();
        cm["data"]["config.toml"].as_str().unwrap().to_string()
    }

    /// The DaemonSet's environment variable `name`.
    pub fn env(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Starts `nodekeeper agent` in the pod with `config` as its ConfigMap.
    pub fn spawn_agent(&self, config: &str) -> Agent {
        let bin = env!("CARGO_BIN_EXE_nodekeeper");
        copy_with_libraries(bin, &self.dir);
        let cfg = self.dir.join(self.config_path.trim_start_matches('/'));
        std::fs::create_dir_all(cfg.parent().unwrap()).unwrap();
        std::fs::write(&cfg, config).unwrap();
        let mut script = String::from("set -e\n");
        for b in &self.binds {
            let target = self.dir.join(b.target.trim_start_matches('/'));
            if b.source.is_dir() {
                std::fs::create_dir_all(&b.source).unwrap();
                std::fs::create_dir_all(&target).unwrap();
            } else {
                std::fs::create_dir_all(target.parent().unwrap()).unwrap();
                std::fs::write(&target, b"").unwrap();
            }
            script.push_str(&format!(
                "mount --rbind '{}' '{}'\n",
                b.source.display(),
                target.display()
            ));
            if b.read_only {
                script.push_str(&format!(
                    "mount -o remount,bind,ro '{}'\n",
                    target.display()
                ));
            }
        }
        script.push_str(&format!(
            "exec chroot '{}' /nodekeeper agent --config '{}'\n",
            self.dir.display(),
            self.config_path
        ));
        let log = self.dir.parent().unwrap().join("agent.log");
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new("unshare")
            .args(["--mount", "--net", "--propagation", "private", "sh", "-c"])
            .arg(&script)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        Agent { child, log }
    }
}

/// `bin` and every library `ldd` names, at the same paths under `root`.
fn copy_with_libraries(bin: &str, root: &Path) {
    std::fs::copy(bin, root.join("nodekeeper")).unwrap();
    let out = Command::new("ldd").arg(bin).output().unwrap();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let path = line
            .split_whitespace()
            .find(|w| w.starts_with('/'))
            .map(PathBuf::from);
        if let Some(p) = path {
            let to = root.join(p.strip_prefix("/").unwrap());
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(&p, &to).unwrap_or_else(|e| panic!("copy {}: {e}", p.display()));
        }
    }
}

/// The running agent; stopped (SIGTERM, then SIGKILL) on drop.
pub struct Agent {
    child: Child,
    log: PathBuf,
}

impl Agent {
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, wait up to 10 s, and the whole log.
    pub fn stop(&mut self) -> String {
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.log()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

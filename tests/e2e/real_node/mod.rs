//! nodekeeper as it ships, on a real node: a kubelet v1.37 and kube-proxy over a real CRI-O
//! (`scripts/k8s-node.sh`), joined to a control plane of its own (`scripts/k8s-cluster.sh`), running
//! the agent DaemonSet and the controller Deployment as pods from the images of
//! `scripts/build-image.sh`, installed with `kubectl apply -k` (an overlay of `manifests/`) or the Helm
//! chart. Each patch is where this machine differs from a cluster, and is listed in [`PATCHES`].
//!
//! One node serves the module's tests (the Helm test has a node and cluster of its own), one test
//! at a time ([`RealNode::lock`], a FIFO lock): they stop CRI-O, restart it, fill a disk and roll
//! the DaemonSet, and each leaves the node as it found it, except `f_notice`, which leaves it
//! cordoned as a reclaimed node is: libtest starts tests in name order, so it queues last.
#![allow(dead_code)]

mod a_pods;
mod b_disk;
mod c_crio;
mod d_repair;
mod e_labels;
mod f_notice;
mod g_upgrade;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use nodekeeper_core::controller::cluster::events::NODE_EVENT_NAMESPACE;

use crate::packaging_support::relative;
use crate::shared::nspawn::NspawnNode;
use crate::support::*;

/// The node's name (the kubelet's `--hostname-override`, its certificate's `system:node:` user).
pub const NODE: &str = "nk-real";

/// What the test install changes of the shipped manifests, and why; each is a patch of the overlay
/// (`kustomization.yaml` in the cluster's directory) or a Helm value.
pub const PATCHES: &[&str] = &[
    "the controller Deployment has 1 replica: one schedulable node, and its anti-affinity puts replicas on different nodes",
    "the DaemonSet's D-Bus, /etc/crio and /var/run/crio hostPaths are an nspawn node's, whose systemd runs a real crio.service: this machine's PID 1 is not systemd",
    "the runtime check's socket is the kubelet's CRI-O socket, under the node's directory (a production node's is /run/crio/crio.sock, which here is the nspawn node's CRI-O)",
    "the agent's disk paths add this node's kubelet root, CRI-O storage and a small data disk (under the node's directory), with a threshold in bytes (4 MiB free) so that this machine's own disk level decides nothing, and its unit list is crio.service: here the kubelet is no systemd unit",
];

/// The real node and its cluster.
pub struct RealNode {
    pub cluster: &'static Cluster,
    /// `scripts/k8s-node.sh up`'s directory: `env`, `logs/`, the kubelet's root, CRI-O's files.
    pub dir: PathBuf,
    pub env: BTreeMap<String, String>,
    /// The CRI-O the agent pod restarts (the DaemonSet's bus and /etc/crio point at it).
    pub crio: &'static NspawnNode,
    /// The node's data disk: a tmpfs in the node's mount namespace, at this host path.
    pub disk: PathBuf,
    /// What the controller's webhook provider asked to replace (its receiver listens on the host's
    /// end of the node's link, as a replacer outside the cluster would).
    pub replacements: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
    replacer_url: String,
    /// The images `scripts/build-image.sh` built: (its reference, the manifests' reference).
    images: Vec<(String, String)>,
    /// What the Helm node's install saw, upgrading from the previous chart version.
    pub upgrade: OnceLock<g_upgrade::Upgrade>,
    serial: tokio::sync::Mutex<()>,
}

/// How nodekeeper was installed on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Install {
    /// `kubectl apply -k` of an overlay of `manifests/`.
    Kustomize,
    /// The Helm chart (`packaging/helm/nodekeeper`), with real Helm.
    Helm,
}

type Fixture = OnceLock<Result<&'static RealNode, String>>;
static KUSTOMIZE: Fixture = OnceLock::new();
static HELM: Fixture = OnceLock::new();

/// The node, with nodekeeper installed from the manifests and Ready; started on first use, stopped
/// when the test process exits. A failure to start fails every test that asks, with its cause.
pub fn real_node() -> &'static RealNode {
    fixture(&KUSTOMIZE, Install::Kustomize)
}

/// Another node and cluster, with nodekeeper installed from the Helm chart.
pub fn real_node_helm() -> &'static RealNode {
    fixture(&HELM, Install::Helm)
}

fn fixture(cell: &'static Fixture, how: Install) -> &'static RealNode {
    let r = cell.get_or_init(|| {
        // Booting the nspawn node is async and this may run inside a test's runtime: a thread.
        std::thread::spawn(move || std::panic::catch_unwind(|| start(how)).map_err(panic_text))
            .join()
            .unwrap_or_else(|e| Err(panic_text(e)))
    });
    match r {
        Ok(n) => n,
        Err(e) => panic!("the real node ({how:?}) did not start: {e}"),
    }
}

fn panic_text(e: Box<dyn std::any::Any + Send>) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panicked".into())
}

fn start(how: Install) -> &'static RealNode {
    let pid = std::process::id();
    let tag = match how {
        Install::Kustomize => "kustomize",
        Install::Helm => "helm",
    };
    let base = std::env::temp_dir().join(format!("nodekeeper-realnode-{tag}-{pid}"));
    let _ = std::fs::remove_dir_all(&base);
    // The kubelet renews its Lease every 10 s: the default grace of the test clusters (8 s) would
    // flap the node (docs/dev/testing.md "The real node").
    let cdir = base.join("cluster");
    let out = Command::new(repo().join("scripts/k8s-cluster.sh"))
        .arg("up")
        .arg(&cdir)
        .args(["--owner-pid", &pid.to_string(), "--audit"])
        .env("K8S_NODE_MONITOR_GRACE", "40s")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "k8s-cluster.sh up: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cluster = Box::leak(Box::new(real_cluster_at(&cdir)));

    let dir = base.join("node");
    // Two test processes on one machine get different links (10.213.N.0/24).
    let index = 20 + pid % 200 + u32::from(how == Install::Helm) * 21;
    node_script(&[
        "up",
        path(&dir),
        path(&cdir),
        "--name",
        NODE,
        "--index",
        &index.to_string(),
        "--owner-pid",
        &pid.to_string(),
    ]);
    let env = read_env(&dir.join("env"));

    // The images as scripts/build-image.sh builds them (scripts/setup.sh built them before the tests;
    // one build at a time: both fixtures start at once), under the manifests' own references.
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let out = {
        let _one = BUILD.lock().unwrap_or_else(|e| e.into_inner());
        Command::new(repo().join("scripts/build-image.sh"))
            .output()
            .unwrap()
    };
    assert!(
        out.status.success(),
        "scripts/build-image.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let built = String::from_utf8_lossy(&out.stdout).into_owned();
    let field = |k: &str| {
        built
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap_or_else(|| panic!("build-image.sh printed no {k}: {built}"))
            .to_string()
    };
    let images = vec![
        (field("agent_image="), shipped_image("nodekeeper-agent")),
        (field("image="), shipped_image("nodekeeper-controller")),
    ];
    for (from, to) in &images {
        node_script(&["load", path(&dir), from, to]);
    }

    // (start() runs on a thread of its own: a runtime may be built here.)
    let crio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(NspawnNode::boot_crio(tag))
        .keep_until_exit();

    let disk = dir.join("disk");
    std::fs::create_dir_all(&disk).unwrap();
    node_script(&[
        "exec",
        path(&dir),
        "mount",
        "-t",
        "tmpfs",
        "-o",
        "size=32m",
        "nk-disk",
        path(&disk),
    ]);

    let (replacer_url, replacements) = replacer(&env["HOST_IP"]);
    let node: &'static RealNode = Box::leak(Box::new(RealNode {
        cluster,
        dir,
        env,
        crio,
        disk,
        replacements,
        replacer_url,
        images,
        upgrade: OnceLock::new(),
        serial: tokio::sync::Mutex::const_new(()),
    }));
    match how {
        Install::Kustomize => node.install_kustomize(),
        Install::Helm => node.install_helm(),
    }
    node
}

/// A webhook replacer on `ip` ([`crate::failover::webhook_receiver_on`]) on a runtime of its own: it
/// outlives the test that started the node. (Its URL, the requests it took.)
fn replacer(
    ip: &str,
) -> (
    String,
    std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
) {
    let (tx, rx) = std::sync::mpsc::channel();
    let ip = ip.to_string();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let _ = tx.send(crate::failover::webhook_receiver_on(&ip).await);
            std::future::pending::<()>().await
        });
    });
    rx.recv().expect("the replacer started")
}

/// `image:` of the shipped manifest whose Deployment or DaemonSet is `name`.
fn shipped_image(name: &str) -> String {
    let file = match name {
        "nodekeeper-agent" => "manifests/11-agent-daemonset.yaml",
        _ => "manifests/22-controller-deployment.yaml",
    };
    let text = std::fs::read_to_string(repo().join(file)).unwrap();
    text.lines()
        .find_map(|l| l.trim().strip_prefix("image: "))
        .unwrap_or_else(|| panic!("{file} names no image"))
        .to_string()
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

fn read_env(p: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `scripts/k8s-node.sh ARGS…`; fails the test with its output when it fails.
pub fn node_script(args: &[&str]) -> String {
    let out = Command::new(repo().join("scripts/k8s-node.sh"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "k8s-node.sh {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl RealNode {
    /// One test at a time on the node.
    pub async fn lock(&'static self) -> tokio::sync::MutexGuard<'static, ()> {
        self.serial.lock().await
    }

    /// The host path of the node's `path` (e.g. the kubelet's root) as the agent pod names it: its
    /// host root is mounted at /host.
    pub fn env(&self, key: &str) -> &str {
        self.env
            .get(key)
            .unwrap_or_else(|| panic!("no {key} in the node's env"))
    }

    /// Runs `argv` in the node's mount and network namespaces.
    pub fn exec(&self, argv: &[&str]) -> String {
        let mut args = vec!["exec", path(&self.dir)];
        args.extend_from_slice(argv);
        node_script(&args)
    }

    /// The shipped agent config with this node's patches ([`PATCHES`]).
    fn agent_toml(&self) -> String {
        // The report URL stays the shipped Service name: the node has cluster DNS.
        let shipped = config_block(&repo().join("manifests/12-agent-config.yaml"));
        assert!(shipped.contains("url = \"https://nodekeeper-controller.nodekeeper.svc:8443\""));
        let runtime = "[checks.runtime]\nenabled = true\n";
        assert!(shipped.contains(runtime), "the shipped runtime check moved");
        let shipped = shipped.replace(
            runtime,
            &format!("{runtime}socket = \"{}\"\n", self.env("CRIO_SOCKET")),
        );
        format!(
            "{shipped}\n# Test patches (tests/e2e/real_node/mod.rs PATCHES)\n[checks.disk]\n\
             paths = [\"/\", \"{}\", \"{}\", \"{}\"]\nmin_free_bytes = \"4MiB\"\nmin_free_percent = 0.0\n\n[[checks.systemd.unit]]\nname = \"crio.service\"\n\
             condition_type = \"NodekeeperContainerRuntimeUnhealthy\"\n",
            self.env("KUBELET_ROOT"),
            self.env("CRIO_ROOT"),
            path(&self.disk),
        )
    }

    /// The shipped controller config, acting (dry_run off), repairing after 20 s of Ready=False and
    /// ending a repair after 20 s healthy, with a webhook replacer (the operator's choices, not
    /// patches).
    fn controller_toml(&self) -> String {
        let shipped = config_block(&repo().join("manifests/21-controller-config.yaml"));
        let acting = shipped.replace("dry_run = true", "dry_run = false");
        let fast = acting.replace("toleration = \"10m\"", "toleration = \"20s\"");
        assert_ne!(fast, acting, "the shipped repair policy's toleration moved");
        let fast = fast.replacen("[repair]\n", "[repair]\nhealthy_delay = \"20s\"\n", 1);
        format!(
            "{fast}\n[controller.provider]\nkind = \"webhook\"\nurl = \"{}\"\nsecret = \"nodekeeper-test-webhook-secret\"\n",
            self.replacer_url
        )
    }

    /// The overlay: `resources` the shipped `manifests/` directory, and the patches of [`PATCHES`].
    fn kustomization(&self) -> String {
        let dir = self.cluster.dir.join("kustomize");
        std::fs::create_dir_all(&dir).unwrap();
        let rel = relative(&dir, &repo().join("manifests"));
        let indent = |s: &str| {
            s.lines()
                .map(|l| format!("          {l}\n"))
                .collect::<String>()
        };
        let crio = self.crio.dir();
        let (agent, controller) = (self.agent_toml(), self.controller_toml());
        for (name, text) in [("agent.toml", &agent), ("controller.toml", &controller)] {
            let f = dir.join(name);
            std::fs::write(&f, text).unwrap();
            let out = Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
                .args(["validate", "--config"])
                .arg(&f)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "the patched {name} is invalid: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        format!(
            r#"apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: ["{rel}"]
patches:
  - patch: |-
      apiVersion: apps/v1
      kind: Deployment
      metadata: {{name: nodekeeper-controller, namespace: nodekeeper}}
      spec: {{replicas: 1}}
  - patch: |-
      apiVersion: apps/v1
      kind: DaemonSet
      metadata: {{name: nodekeeper-agent, namespace: nodekeeper}}
      spec:
        template:
          spec:
            volumes:
              - {{name: dbus, hostPath: {{path: {dbus}}}}}
              - {{name: crio-config, hostPath: {{path: {etc}}}}}
              - {{name: crio-run, hostPath: {{path: {run}}}}}
  - patch: |-
      apiVersion: v1
      kind: ConfigMap
      metadata: {{name: nodekeeper-agent, namespace: nodekeeper}}
      data:
        config.toml: |
{agent}  - patch: |-
      apiVersion: v1
      kind: ConfigMap
      metadata: {{name: nodekeeper-controller, namespace: nodekeeper}}
      data:
        config.toml: |
{controller}"#,
            dbus = crio.join("dbus").display(),
            etc = crio.join("root/etc/crio").display(),
            run = crio.join("root/var/run/crio").display(),
            agent = indent(&agent),
            controller = indent(&controller),
        )
    }

    /// `kubectl apply -k` of the overlay, the controller's serving certificate and its CA (as
    /// docs/install.md says: a Secret and a ConfigMap), then waits until both pods are Ready.
    fn install_kustomize(&self) {
        let dir = self.cluster.dir.join("kustomize");
        let k = self.kustomization();
        std::fs::write(dir.join("kustomization.yaml"), k).unwrap();
        let out = kubectl(self.cluster, &["apply", "-k", path(&dir)]);
        assert!(out.status.success(), "kubectl apply -k failed");
        self.controller_tls();
        self.wait_ready(Duration::from_secs(120));
    }

    /// The previous chart version with real Helm, values for this node ([`PATCHES`]), then
    /// `helm upgrade` to the chart in the tree ([`g_upgrade::from_previous`], what it saw kept for
    /// its test).
    fn install_helm(&'static self) {
        let (version, chart) = g_upgrade::previous_chart(&self.cluster.dir);
        self.load_images_as(g_upgrade::PREVIOUS_TAG);
        self.helm("install", &chart, &g_upgrade::previous_values(self));
        self.controller_tls();
        self.wait_ready(Duration::from_secs(120));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let seen = rt.block_on(g_upgrade::from_previous(self, version));
        self.upgrade.set(seen).expect("upgraded once");
    }

    /// This node's Helm values ([`PATCHES`]), the controller acting as in
    /// [`Self::controller_toml`] but without a replacer.
    pub fn helm_values(&self) -> serde_json::Value {
        let crio = self.crio.dir();
        serde_json::json!({
            "controller": { "replicas": 1, "config": { "controller": { "dry_run": false } } },
            "agent": {
                "hostPaths": {
                    "crioDir": crio.join("root/etc/crio"),
                    "crioRun": crio.join("root/var/run/crio"),
                    "dbus": crio.join("dbus"),
                },
                "config": { "checks": {
                    "disk": { "paths": ["/", self.env("KUBELET_ROOT"), self.env("CRIO_ROOT"), path(&self.disk)],
                              "min_free_bytes": "4MiB", "min_free_percent": 0.0 },
                    "systemd": { "unit": [{ "name": "crio.service",
                                            "condition_type": "NodekeeperContainerRuntimeUnhealthy" }] },
                    "runtime": { "socket": self.env("CRIO_SOCKET") }
                } }
            }
        })
    }

    /// `helm install|upgrade` of `chart` as release `nodekeeper` with `values`, by real Helm.
    pub fn helm(&self, op: &str, chart: &Path, values: &serde_json::Value) {
        let dir = self.cluster.dir.join("helm");
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join(format!("values-{op}.json"));
        std::fs::write(&f, serde_json::to_vec_pretty(values).unwrap()).unwrap();
        let out = Command::new(repo().join(".cache/venv/bin/python"))
            .arg(repo().join("tests/fixtures/real-node/helm.py"))
            .arg(op)
            .arg(&self.cluster.kubeconfig)
            .arg(chart)
            .args(["nodekeeper", NS])
            .arg(&f)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "helm {op} {}: {}{}",
            chart.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Loads the built images into the node's CRI-O also under tag `tag` of the manifests'
    /// repositories.
    pub fn load_images_as(&self, tag: &str) {
        for (from, to) in &self.images {
            let repo = to.rsplit_once(':').map_or(to.as_str(), |(r, _)| r);
            node_script(&["load", path(&self.dir), from, &format!("{repo}:{tag}")]);
        }
    }

    /// A CA and a serving certificate for `nodekeeper-controller.nodekeeper.svc`, as cert-manager
    /// would issue: Secret `nodekeeper-controller-tls`, ConfigMap `nodekeeper-controller-ca`.
    fn controller_tls(&self) {
        let dir = self.cluster.dir.join("controller-tls");
        std::fs::create_dir_all(&dir).unwrap();
        let script = r#"set -e; cd "$1"
openssl ecparam -name prime256v1 -genkey -noout -out ca.key
openssl req -x509 -new -key ca.key -subj /CN=nodekeeper-test-issuer -days 2 -out ca.crt \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign
openssl ecparam -name prime256v1 -genkey -noout -out tls.key
openssl req -new -key tls.key -subj /CN=nodekeeper-controller -out tls.csr
printf 'subjectAltName=DNS:nodekeeper-controller.nodekeeper.svc\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n' >tls.ext
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile tls.ext -out tls.crt"#;
        let out = Command::new("sh")
            .args(["-c", script, "tls"])
            .arg(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openssl: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (crt, key, ca) = (dir.join("tls.crt"), dir.join("tls.key"), dir.join("ca.crt"));
        let ok = kubectl(
            self.cluster,
            &[
                "-n",
                NS,
                "create",
                "secret",
                "tls",
                "nodekeeper-controller-tls",
                &format!("--cert={}", path(&crt)),
                &format!("--key={}", path(&key)),
            ],
        );
        assert!(ok.status.success());
        let ok = kubectl(
            self.cluster,
            &[
                "-n",
                NS,
                "create",
                "configmap",
                "nodekeeper-controller-ca",
                &format!("--from-file=ca.crt={}", path(&ca)),
            ],
        );
        assert!(ok.status.success());
    }

    /// Waits until the agent DaemonSet and the controller Deployment are rolled out: their pods
    /// Running and Ready.
    pub fn wait_ready(&self, within: Duration) {
        let timeout = format!("--timeout={}s", within.as_secs());
        for what in [
            "daemonset/nodekeeper-agent",
            "deployment/nodekeeper-controller",
        ] {
            let out = kubectl(
                self.cluster,
                &["-n", NS, "rollout", "status", what, &timeout],
            );
            if !out.status.success() {
                let _ = kubectl(self.cluster, &["-n", NS, "describe", "pods"]);
                for app in ["nodekeeper-agent", "nodekeeper-controller"] {
                    let l = format!("app.kubernetes.io/name={app}");
                    let _ = kubectl(self.cluster, &["-n", NS, "logs", "-l", &l, "--tail=20"]);
                    let _ = kubectl(
                        self.cluster,
                        &["-n", NS, "logs", "-l", &l, "--tail=20", "-p"],
                    );
                }
                panic!("{what} was not rolled out within {within:?}");
            }
        }
    }

    /// The pods of namespace nodekeeper labelled `app.kubernetes.io/name=APP`.
    pub async fn pods(&self, app: &str) -> Vec<Pod> {
        let api: Api<Pod> = Api::namespaced(self.cluster.admin().await, NS);
        api.list(&ListParams::default().labels(&format!("app.kubernetes.io/name={app}")))
            .await
            .unwrap()
            .items
    }

    pub async fn node(&self) -> Node {
        let api: Api<Node> = Api::all(self.cluster.admin().await);
        api.get(NODE).await.unwrap()
    }
}

/// (name, uid, restarts, Ready) of a pod.
pub fn summary(p: &Pod) -> (String, String, i32, bool) {
    let st = p.status.as_ref();
    let restarts = st
        .and_then(|s| s.container_statuses.as_ref())
        .map(|cs| cs.iter().map(|c| c.restart_count).sum())
        .unwrap_or(0);
    let ready = st
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    (
        p.metadata.name.clone().unwrap_or_default(),
        p.metadata.uid.clone().unwrap_or_default(),
        restarts,
        ready,
    )
}

pub async fn one_pod(n: &RealNode, app: &str) -> (String, String, i32, bool) {
    let pods = n.pods(app).await;
    let live: Vec<_> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    assert_eq!(live.len(), 1, "{app}: want one pod, have {}", live.len());
    summary(live[0])
}

/// The TOML under `config.toml: |` of a shipped ConfigMap.
fn config_block(file: &Path) -> String {
    let text = std::fs::read_to_string(file).unwrap();
    let mut out = String::new();
    let mut on = false;
    for l in text.lines() {
        if on {
            out.push_str(l.strip_prefix("    ").unwrap_or(l));
            out.push('\n');
        } else if l.trim() == "config.toml: |" {
            on = true;
        }
    }
    assert!(on, "{} has no config.toml", file.display());
    out
}

/// The real CRI-O's binaries (scripts/setup-crio.sh, run by scripts/setup.sh).
pub fn crio_bin() -> PathBuf {
    let out = Command::new(repo().join("scripts/setup-crio.sh"))
        .arg("--print")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the real CRI-O is not built: run scripts/setup-crio.sh"
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// How many AgentSilent Events the controller recorded about the node.
pub async fn agent_silent(n: &RealNode) -> usize {
    let events: Api<Event> = Api::namespaced(n.cluster.admin().await, NODE_EVENT_NAMESPACE);
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(NODE))
        .filter(|e| e.reason.as_deref() == Some("AgentSilent"))
        .count()
}

/// The Node annotation or condition that changes with each report the controller takes.
pub async fn last_sequence(nodes: &Api<Node>) -> String {
    let n = nodes.get(NODE).await.unwrap();
    n.status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.type_.starts_with("Nodekeeper"))
        .filter_map(|c| c.last_heartbeat_time.map(|t| t.0.to_string()))
        .max()
        .unwrap_or_default()
}

/// nodekeeper's conditions on the node that are Unknown.
pub async fn unknown_conditions(n: &RealNode) -> Vec<k8s_openapi::api::core::v1::NodeCondition> {
    let node = n.node().await;
    node.status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.type_.starts_with("Nodekeeper") && c.status == "Unknown")
        .collect()
}

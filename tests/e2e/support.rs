//! The two clusters of the `e2e` test binary, behind one interface ([`Cluster`]): the real control
//! plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, KWOK, built from Go modules by
//! scripts/setup-k8s.sh and started by `scripts/k8s-cluster.sh up`) and the sim (`nodekeeper sim
//! apiserver --tls`, the demo's cluster, with its kubelet, scheduler and workload loops at real time).
//! One of each per test process, started on first use and stopped when the process exits; every
//! scenario written with [`on_both!`] runs on each (`NAME::sim`, `NAME::real`).
//!
//! The shipped manifests (`kubectl kustomize manifests/`) are installed once into each, minus the
//! controller Deployment (the tests run the controller as a process of their own). nodekeeper's code in
//! these tests authenticates only with ServiceAccount tokens minted by TokenRequest, never as
//! `system:masters`: the harness's admin credential sets up the cluster and reads results. (The sim
//! stores RBAC objects and the admission policy but enforces neither: the tests of those are real-only.)
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

pub const NS: &str = "nodekeeper";
pub const CONTROLLER_SA: &str = "nodekeeper-controller";
pub const AGENT_SA: &str = "nodekeeper-agent";
/// Held by a test that changes what the shipped ServiceAccounts may do (the privilege test widens
/// the agent's role for a while) and by one that checks it (rbac): they share one cluster, and the
/// check would see the other's temporary grant.
pub static SHIPPED_GRANTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
/// The audience the shipped configs name for agent → controller tokens.
pub const REPORT_AUDIENCE: &str = "nodekeeper";

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub use crate::shared::kubectl_bin;

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "nodekeeper=info,warn".into()),
        )
        .try_init();
}

/// Which API server a [`Cluster`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `nodekeeper sim apiserver`: the sim's loops play kubelets, scheduler and workload controllers.
    Sim,
    /// kube-apiserver with kube-controller-manager, kube-scheduler and KWOK.
    Real,
}

/// A running cluster: where its files are (`dir/kubeconfig` is the admin's, `dir/pki/ca.crt` its CA).
pub struct Cluster {
    pub backend: Backend,
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub server: String,
    pub ca_pem: Vec<u8>,
}

/// Runs the scenario `async fn NAME(c: &'static Cluster)` once on each backend, as the tests
/// `NAME::sim` and `NAME::real`.
macro_rules! on_both {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sim() {
                super::$name($crate::support::sim()).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn real() {
                super::$name($crate::support::cluster()).await
            }
        }
    };
}

static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
static SIM: OnceLock<Result<Cluster, String>> = OnceLock::new();
static KARPENTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
static KARPENTER_REPAIR: OnceLock<Result<Cluster, String>> = OnceLock::new();

/// One try per process: the other tests fail with the same message instead of retrying. A failure
/// to start is a test failure naming the component and its log, never a skip.
fn once(
    cell: &'static OnceLock<Result<Cluster, String>>,
    start: fn() -> Cluster,
) -> &'static Cluster {
    let c = cell.get_or_init(|| {
        std::panic::catch_unwind(start).map_err(|e| {
            e.downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "the cluster did not start".into())
        })
    });
    match c {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    }
}

/// The process's real control plane, started (and the manifests installed) on first use.
pub fn cluster() -> &'static Cluster {
    once(&CLUSTER, start_cluster)
}

/// The process's sim, started (and the manifests installed) on first use.
pub fn sim() -> &'static Cluster {
    once(&SIM, start_sim)
}

/// A real control plane of its own with Karpenter's KWOK provider beside it (`scripts/k8s-cluster.sh up
/// DIR --karpenter`), started on first use, with nodekeeper's manifests. Separate from [`cluster()`], so
/// Karpenter never provisions for the pending pods of other tests and their engines never see its
/// nodes; only the tests that ask for it pay its start.
pub fn karpenter_cluster() -> &'static Cluster {
    once(&KARPENTER, || {
        let c = up_real("nodekeeper-karpenter", &["--karpenter"]);
        install_manifests(&c);
        c
    })
}

/// [`karpenter_cluster`] with Karpenter's NodeRepair on (`--karpenter-feature-gates NodeRepair=true`)
/// for the cooperation tests (`karpenter_repair.rs`): a control plane of its own, so that Karpenter's
/// repair never acts on the other Karpenter tests' nodes.
pub fn karpenter_repair_cluster() -> &'static Cluster {
    once(&KARPENTER_REPAIR, || {
        let c = up_real(
            "nodekeeper-karpenter-repair",
            &[
                "--karpenter",
                "--karpenter-feature-gates",
                "NodeRepair=true",
            ],
        );
        install_manifests(&c);
        c
    })
}

fn start_cluster() -> Cluster {
    let c = up_real("nodekeeper-real", &[]);
    install_manifests(&c);
    c
}

/// `scripts/k8s-cluster.sh up $TMPDIR/PREFIX-<pid> EXTRA…`, stopped when this process exits. (The
/// script starts a component again on new ports when one picked for it was taken meanwhile.)
fn up_real(prefix: &str, extra: &[&str]) -> Cluster {
    let dir = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut args: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
    // NODEKEEPER_REAL_KEEP=1 leaves the cluster running after the tests, for a look with kubectl
    // (`scripts/k8s-cluster.sh down DIR` stops it); otherwise it stops when this process exits.
    if std::env::var_os("NODEKEEPER_REAL_KEEP").is_none() {
        args.extend(["--owner-pid".into(), std::process::id().to_string()]);
    }
    crate::shared::k8s_cluster_up(&dir, &args);
    real_cluster_at(&dir)
}

/// The `scripts/k8s-cluster.sh up` cluster in `dir`.
pub fn real_cluster_at(dir: &Path) -> Cluster {
    let ports = std::fs::read_to_string(dir.join("ports")).unwrap();
    let api = ports
        .lines()
        .find_map(|l| l.strip_prefix("kube-apiserver="))
        .expect("kube-apiserver port");
    Cluster {
        backend: Backend::Real,
        kubeconfig: dir.join("kubeconfig"),
        server: format!("https://127.0.0.1:{api}"),
        ca_pem: std::fs::read(dir.join("pki/ca.crt")).unwrap(),
        dir: dir.to_path_buf(),
    }
}

/// `nodekeeper sim apiserver --tls`, which exits once this test process is gone (`--owner-pid`).
fn start_sim() -> Cluster {
    use std::io::BufRead;
    let dir = std::env::temp_dir().join(format!("nodekeeper-sim-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("pki")).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    let log = std::fs::File::create(dir.join("sim.log")).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nodekeeper"));
    cmd.args([
        "sim",
        "apiserver",
        "--tls",
        "--empty",
        "--listen",
        "127.0.0.1:0",
    ])
    .arg("--owner-pid")
    .arg(std::process::id().to_string())
    .arg("--kubeconfig-out")
    .arg(&kubeconfig)
    .env("NODEKEEPER_LOG_LEVEL", "warn")
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::piped())
    .stderr(log);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("sim-owner".into())
        .spawn(move || {
            let mut child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => {
                    let _ = tx.send(Err(format!("cannot start nodekeeper sim apiserver: {e}")));
                    return;
                }
            };
            let stdout = child.stdout.take().unwrap();
            let mut lines = std::io::BufReader::new(stdout).lines();
            let url = lines.find_map(|l| {
                l.ok()?
                    .strip_prefix("nodekeeper sim apiserver listening on ")
                    .map(str::to_string)
            });
            let _ = tx.send(
                url.ok_or_else(|| "nodekeeper sim apiserver exited before listening".to_string()),
            );
            // Keep reading: a full pipe would block the sim.
            for _ in lines {}
            let _ = child.wait();
        })
        .unwrap();
    let server = rx
        .recv()
        .unwrap()
        .unwrap_or_else(|e| panic!("{e} (log: {})", dir.join("sim.log").display()));
    let kc = Kubeconfig::read_from(&kubeconfig).unwrap();
    let ca_b64 = kc.clusters[0]
        .cluster
        .as_ref()
        .and_then(|c| c.certificate_authority_data.clone())
        .expect("the sim's kubeconfig names its CA");
    use base64::Engine;
    let ca_pem = base64::engine::general_purpose::STANDARD
        .decode(ca_b64)
        .unwrap();
    std::fs::write(dir.join("pki/ca.crt"), &ca_pem).unwrap();
    let c = Cluster {
        backend: Backend::Sim,
        kubeconfig,
        server,
        ca_pem,
        dir,
    };
    install_manifests(&c);
    c
}

/// The shipped manifests (`scripts/k8s-cluster.sh install`: `kubectl kustomize manifests/` without the
/// controller Deployment, which the tests run themselves; no Prometheus Operator object is in it), and
/// the drain operator's ClusterRole (docs/drain.md), once: tests applying it at the same time would race
/// (`kubectl apply` creates when it reads nothing; the second create is AlreadyExists).
fn install_manifests(c: &Cluster) {
    let out = Command::new(repo().join("scripts/k8s-cluster.sh"))
        .arg("install")
        .arg(&c.dir)
        .arg(repo().join("tests/fixtures/drain-operator-role.yaml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "installing the shipped manifests failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs the real kubectl as the admin; prints the command and its output.
pub fn kubectl(c: &Cluster, args: &[&str]) -> std::process::Output {
    let out = Command::new(kubectl_bin())
        .arg("--kubeconfig")
        .arg(&c.kubeconfig)
        .args(args)
        .env("HOME", &c.dir)
        .output()
        .unwrap();
    eprintln!(
        "$ kubectl {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

impl Cluster {
    /// A client with the harness's admin certificate (setup and reading results only).
    pub async fn admin(&self) -> kube::Client {
        let kc = Kubeconfig::read_from(&self.kubeconfig).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .unwrap();
        kube::Client::try_from(cfg).unwrap()
    }

    /// A kubeconfig at `path` that authenticates with `token` (a ServiceAccount's).
    pub fn write_token_kubeconfig(&self, path: &Path, token: &str) {
        let ca = self.dir.join("pki/ca.crt");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: real\n  cluster:\n    server: {}\n    certificate-authority: {}\n\
             users:\n- name: sa\n  user:\n    token: {token}\ncontexts:\n- name: real\n  context: {{cluster: real, user: sa}}\n\
             current-context: real\n",
            self.server,
            ca.display()
        );
        std::fs::write(path, text).unwrap();
    }

    /// A client that authenticates with `token`.
    pub async fn client_with_token(&self, token: &str) -> kube::Client {
        let path = self
            .dir
            .join(format!("token-{}.kubeconfig", short_hash(token)));
        self.write_token_kubeconfig(&path, token);
        let kc = Kubeconfig::read_from(&path).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .unwrap();
        kube::Client::try_from(cfg).unwrap()
    }
}

fn short_hash(s: &str) -> String {
    use sha2::Digest;
    hex::encode(&sha2::Sha256::digest(s.as_bytes())[..6])
}

/// A token for ServiceAccount `ns/sa` from the TokenRequest API: `audience` None = the API server's
/// own; `bound_pod` = (name, uid) binds it to that pod (and so to the pod's node).
pub async fn sa_token(
    admin: &kube::Client,
    ns: &str,
    sa: &str,
    audience: Option<&str>,
    bound_pod: Option<(&str, &str)>,
) -> String {
    let mut spec = serde_json::json!({ "expirationSeconds": 3600 });
    if let Some(a) = audience {
        spec["audiences"] = serde_json::json!([a]);
    }
    if let Some((name, uid)) = bound_pod {
        spec["boundObjectRef"] =
            serde_json::json!({ "kind": "Pod", "apiVersion": "v1", "name": name, "uid": uid });
    }
    let body = serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec
    });
    let req = http::Request::post(format!(
        "/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token"
    ))
    .header("content-type", "application/json")
    .body(serde_json::to_vec(&body).unwrap())
    .unwrap();
    let resp: serde_json::Value = admin.request(req).await.expect("TokenRequest");
    resp["status"]["token"].as_str().expect("token").to_string()
}

/// A client as the shipped controller ServiceAccount.
pub async fn controller_client(c: &Cluster) -> kube::Client {
    let admin = c.admin().await;
    let token = sa_token(&admin, NS, CONTROLLER_SA, None, None).await;
    c.client_with_token(&token).await
}

/// A KWOK node: the annotation makes KWOK play its kubelet (Ready, heartbeats, pods Running).
pub fn kwok_node(name: &str, labels: serde_json::Value) -> Node {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": { "kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0" }
        },
        "spec": { "providerID": format!("kwok://{name}") },
        "status": {
            "allocatable": { "cpu": "32", "memory": "256Gi", "pods": "250" },
            "capacity": { "cpu": "32", "memory": "256Gi", "pods": "250" }
        }
    }))
    .unwrap()
}

/// Deletes its nodes when dropped (the test passed or panicked), so no engine of a later test acts on
/// them. Deleting a Node lets the pod garbage collector remove its pods.
#[must_use = "the nodes are deleted when this is dropped"]
pub struct NodesGuard(Vec<String>, &'static Cluster);

impl Drop for NodesGuard {
    fn drop(&mut self) {
        let mut args = vec!["delete", "node", "--wait=false", "--ignore-not-found"];
        args.extend(self.0.iter().map(String::as_str));
        let _ = kubectl(self.1, &args);
    }
}

impl Cluster {
    /// Creates the nodes (KWOK's on the real cluster; the sim's kubelets play every node) and waits
    /// until each is Ready; they are deleted when the guard drops.
    pub async fn create_nodes(&'static self, nodes: &[Node]) -> NodesGuard {
        let api: Api<Node> = Api::all(self.admin().await);
        for n in nodes {
            api.create(&PostParams::default(), n).await.unwrap();
        }
        for n in nodes {
            let name = n.metadata.name.clone().unwrap();
            wait_until(
                Duration::from_secs(30),
                &format!("node {name} Ready"),
                || {
                    let api = api.clone();
                    let name = name.clone();
                    async move { api.get(&name).await.map(|n| is_ready(&n)).unwrap_or(false) }
                },
            )
            .await;
        }
        NodesGuard(
            nodes
                .iter()
                .filter_map(|n| n.metadata.name.clone())
                .collect(),
            self,
        )
    }

    /// The node's kubelet posts Ready=False (its container runtime is down), as a real kubelet does.
    ///
    /// Real: the label `nodekeeper.test/kubelet` keeps KWOK from re-initializing the node to Ready
    /// (the stages of scripts/setup-k8s.sh), then the status is patched; kube-controller-manager then
    /// taints it `node.kubernetes.io/not-ready`. (A dead kubelet, Ready=Unknown, cannot be had per node:
    /// KWOK 0.8.0 keeps renewing the Lease of every node it ever managed.) Sim: its admin hook pins the
    /// condition, so its kubelet loop keeps posting it.
    pub async fn kubelet_reports_not_ready(&self, node: &str) {
        self.kubelet_reports(
            node,
            "False",
            "KubeletNotReady",
            "container runtime network not ready: NetworkReady=false",
        )
        .await;
    }

    /// The node's kubelet posts Ready=`status` with `reason` and `message`, as
    /// [`Self::kubelet_reports_not_ready`] does (which is this with `False`); with `True`, a kubelet
    /// that recovered (the node stays out of KWOK's hands, the sim's condition stays pinned).
    pub async fn kubelet_reports(&self, node: &str, status: &str, reason: &str, message: &str) {
        let admin = self.admin().await;
        match self.backend {
            Backend::Sim => {
                let body = serde_json::json!({"type": "Ready", "status": status, "reason": reason,
                    "message": message});
                let req = http::Request::post(format!("/sim/v1/nodes/{node}/conditions"))
                    .header("content-type", "application/json")
                    .body(serde_json::to_vec(&body).unwrap())
                    .unwrap();
                let _: serde_json::Value =
                    admin.request(req).await.expect("the sim's condition hook");
            }
            Backend::Real => {
                let api: Api<Node> = Api::all(admin);
                let label = serde_json::json!({ "metadata": { "labels": { "nodekeeper.test/kubelet": "not-ready" } } });
                api.patch(
                    node,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&label),
                )
                .await
                .unwrap();
                let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                let status = serde_json::json!({ "status": { "conditions": [{
                    "type": "Ready", "status": status, "reason": reason, "message": message,
                    "lastHeartbeatTime": now, "lastTransitionTime": now
                }] } });
                api.patch_status(
                    node,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Strategic(&status),
                )
                .await
                .unwrap();
            }
        }
    }

    /// The node's kubelet reports the kernel boot id `id` (`status.nodeInfo.bootID`), as after a
    /// reboot.
    pub async fn kubelet_reports_boot_id(&self, node: &str, id: &str) {
        let api: Api<Node> = Api::all(self.admin().await);
        let status = serde_json::json!({ "status": { "nodeInfo": { "bootID": id } } });
        api.patch_status(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&status),
        )
        .await
        .unwrap();
    }

    /// Tests whose controller runs the disruption engine act on every Node of their cluster: they
    /// take this lock, so one engine runs at a time per cluster, and delete their nodes when done.
    pub async fn exclusive(&self) -> tokio::sync::MutexGuard<'static, ()> {
        static REAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        static SIM: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        match self.backend {
            Backend::Real => REAL.lock().await,
            Backend::Sim => SIM.lock().await,
        }
    }

    pub fn is_real(&self) -> bool {
        self.backend == Backend::Real
    }
}

pub fn is_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The shipped agent DaemonSet's pod on `node` once it exists: (name, uid).
pub async fn agent_pod_on(admin: &kube::Client, node: &str) -> (String, String) {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let lp = ListParams::default()
        .labels("app.kubernetes.io/name=nodekeeper-agent")
        .fields(&format!("spec.nodeName={node}"));
    wait_for(
        Duration::from_secs(30),
        &format!("agent pod on {node}"),
        || {
            let (pods, lp) = (pods.clone(), lp.clone());
            async move {
                let list = pods.list(&lp).await.ok()?;
                let p = list
                    .items
                    .into_iter()
                    .find(|p| p.metadata.deletion_timestamp.is_none())?;
                Some((p.metadata.name?, p.metadata.uid?))
            }
        },
    )
    .await
}

/// Polls `f` every 100 ms until it returns Some; panics naming `what` after `timeout`.
pub async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls `f` every 100 ms until it is true; panics naming `what` after `timeout`.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + timeout;
    loop {
        if f().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The shipped controller ConfigMap's `config.toml` (manifests/21-controller-config.yaml) as TOML.
pub fn shipped_controller_toml() -> toml::Table {
    let yaml = std::fs::read_to_string(repo().join("manifests/21-controller-config.yaml")).unwrap();
    let cm: serde_json::Value = serde_yaml::from_str(&yaml).unwrap();
    toml::from_str(cm["data"]["config.toml"].as_str().unwrap()).unwrap()
}

/// The shipped controller config made to run here: loopback with test TLS material (`dir`), a short
/// lease, `dry_run = false`, then `edit` applied.
pub fn controller_toml(dir: &Path, identity: &str, edit: impl FnOnce(&mut toml::Table)) -> PathBuf {
    let (_, cert, key) = crate::ctl::write_certs(dir);
    let mut t = shipped_controller_toml();
    let c = t["controller"].as_table_mut().unwrap();
    c.insert("listen".into(), "127.0.0.1:0".into());
    c.insert("tls_cert_file".into(), cert.display().to_string().into());
    c.insert("tls_key_file".into(), key.display().to_string().into());
    c.insert("dry_run".into(), false.into());
    let mut leader = toml::Table::new();
    leader.insert("lease_duration".into(), "3s".into());
    leader.insert("retry_period".into(), "300ms".into());
    leader.insert("identity".into(), identity.into());
    // A Lease per test: controllers of different tests never contend.
    leader.insert("lease_name".into(), format!("nodekeeper-{identity}").into());
    c.insert("leader".into(), leader.into());
    edit(&mut t);
    let path = dir.join(format!("controller-{identity}.toml"));
    std::fs::write(&path, toml::to_string(&t).unwrap()).unwrap();
    path
}

pub fn rand_id() -> String {
    format!("{:08x}", rand::random::<u32>())
}

/// `nodekeeper controller` as a process, authenticated as the shipped controller ServiceAccount
/// (a TokenRequest token in its kubeconfig). Its JSON log lines are kept for assertions.
pub struct ControllerProc {
    pub child: tokio::process::Child,
    pub addr: std::net::SocketAddr,
    pub lines: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
}

impl ControllerProc {
    pub async fn start(c: &Cluster, config: &Path, identity: &str) -> ControllerProc {
        use tokio::io::AsyncBufReadExt;
        let admin = c.admin().await;
        let token = sa_token(&admin, NS, CONTROLLER_SA, None, None).await;
        let kubeconfig = config.with_extension(format!("{identity}.kubeconfig"));
        c.write_token_kubeconfig(&kubeconfig, &token);
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
            .args(["controller", "--config"])
            .arg(config)
            .env("KUBECONFIG", &kubeconfig)
            .env("NODEKEEPER_LOG_FORMAT", "json")
            .env("NODEKEEPER_LOG_LEVEL", "info")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let keep = lines.clone();
        let who = identity.to_string();
        tokio::spawn(async move {
            let mut r = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = r.next_line().await {
                eprintln!("[{who}] {line}");
                let v = serde_json::from_str(&line)
                    .unwrap_or_else(|_| serde_json::json!({ "message": line }));
                let _ = tx.send(v.clone());
                keep.lock().unwrap().push(v);
            }
        });
        let addr = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(v) = rx.recv().await {
                if v.to_string().contains("controller listening") {
                    let a = v["fields"]["addr"]
                        .as_str()
                        .or(v["addr"].as_str())
                        .map(str::to_string);
                    if let Some(a) = a {
                        return a.parse().unwrap();
                    }
                }
            }
            panic!("the controller exited before listening");
        })
        .await
        .expect("controller listening within 30 s");
        ControllerProc { child, addr, lines }
    }

    /// Index of the controller's first log line saying `message` about `node` (JSON lines put the
    /// fields at the top level or under `fields`).
    pub fn position(&self, message: &str, node: &str) -> Option<usize> {
        self.lines.lock().unwrap().iter().position(|l| {
            [l, &l["fields"]]
                .iter()
                .any(|f| f["message"] == message && f["node"].as_str() == Some(node))
        })
    }

    /// Every log line about `node`, one per line (for a failure message).
    pub fn about(&self, node: &str) -> String {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| {
                [l, &l["fields"]]
                    .iter()
                    .any(|f| f["node"].as_str() == Some(node))
            })
            .map(|l| format!("{l}\n"))
            .collect()
    }

    /// Log lines that tell of a 403 from the API server (a missing permission).
    pub fn forbidden_lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .map(|v| v.to_string())
            .filter(|l| {
                l.contains("code: 403")
                    || l.contains("\"code\":403")
                    || l.to_lowercase().contains("forbidden")
            })
            .collect()
    }

    /// SIGTERM, then wait (the Lease is released on the way out).
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let _ = tokio::time::timeout(Duration::from_secs(15), self.child.wait()).await;
    }
}

/// The node carries a taint with `key` (any effect).
pub fn has_taint(n: &Node, key: &str) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == key))
}

pub fn annotation<'a>(n: &'a Node, key: &str) -> Option<&'a str> {
    n.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

pub fn condition(n: &Node, type_: &str) -> Option<k8s_openapi::api::core::v1::NodeCondition> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .cloned()
}

pub fn unschedulable(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// The value of an unlabelled Prometheus sample `name` in a text exposition (0 when absent).
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The shipped agent ConfigMap's TOML with the controller's address, the test CA and token file, and
/// no cloud (these tests must not reach 169.254.169.254 from the host's namespace).
pub fn agent_toml(dir: &Path, port: u16, edit: impl FnOnce(&mut toml::Table)) -> PathBuf {
    let yaml = std::fs::read_to_string(repo().join("manifests/12-agent-config.yaml")).unwrap();
    let cm: serde_json::Value = serde_yaml::from_str(&yaml).unwrap();
    let mut t: toml::Table = toml::from_str(cm["data"]["config.toml"].as_str().unwrap()).unwrap();
    let r = t["report"].as_table_mut().unwrap();
    r.insert("url".into(), format!("https://127.0.0.1:{port}").into());
    r.insert(
        "ca_file".into(),
        dir.join("ca.pem").display().to_string().into(),
    );
    r.insert(
        "token_file".into(),
        dir.join("token").display().to_string().into(),
    );
    r.insert("heartbeat".into(), "1s".into());
    t["sources"]
        .as_table_mut()
        .unwrap()
        .insert("cloud".into(), "none".into());
    let mut agent = toml::Table::new();
    agent.insert("shutdown_watcher".into(), false.into());
    t.insert("agent".into(), agent.into());
    edit(&mut t);
    let path = dir.join("agent.toml");
    std::fs::write(&path, toml::to_string(&t).unwrap()).unwrap();
    path
}

/// The environment the shipped DaemonSet gives its container on `node` (fieldRefs resolved).
pub fn daemonset_env(pod: &Pod, node: &str) -> Vec<(String, std::ffi::OsString)> {
    let spec = pod.spec.as_ref().unwrap();
    let c = spec.containers.iter().find(|c| c.name == "agent").unwrap();
    c.env
        .iter()
        .flatten()
        .map(|e| {
            let v = match (
                &e.value,
                e.value_from.as_ref().and_then(|f| f.field_ref.as_ref()),
            ) {
                (Some(v), _) => v.clone(),
                (None, Some(f)) if f.field_path == "spec.nodeName" => node.to_string(),
                (None, Some(f)) => panic!("unhandled fieldRef {}", f.field_path),
                (None, None) => panic!("unhandled env source for {}", e.name),
            };
            (e.name.clone(), std::ffi::OsString::from(v))
        })
        .collect()
}

/// `nodekeeper agent` as the shipped DaemonSet runs it on `node`: the shipped agent config (edited by
/// `edit`), the pod's environment, and two tokens bound to the DaemonSet's pod there: audience
/// `nodekeeper` for the controller (token file), the API server's for the label watch (KUBECONFIG).
pub async fn start_shipped_agent(
    c: &Cluster,
    admin: &kube::Client,
    node: &str,
    dir: &Path,
    controller_port: u16,
    edit: impl FnOnce(&mut toml::Table),
) -> crate::agent_proc::Agent {
    let (pod_name, uid) = agent_pod_on(admin, node).await;
    let pod = Api::<Pod>::namespaced(admin.clone(), NS)
        .get(&pod_name)
        .await
        .unwrap();
    let report_token = sa_token(
        admin,
        NS,
        AGENT_SA,
        Some(REPORT_AUDIENCE),
        Some((&pod_name, &uid)),
    )
    .await;
    std::fs::write(dir.join("token"), &report_token).unwrap();
    let api_token = sa_token(admin, NS, AGENT_SA, None, Some((&pod_name, &uid))).await;
    let kubeconfig = dir.join("agent.kubeconfig");
    c.write_token_kubeconfig(&kubeconfig, &api_token);
    let cfg = agent_toml(dir, controller_port, edit);
    let mut env = daemonset_env(&pod, node);
    env.push(("KUBECONFIG".into(), kubeconfig.into_os_string()));
    let env_refs: Vec<(&str, &std::ffi::OsStr)> = env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_os_str()))
        .collect();
    let root = dir.join("root");
    std::fs::create_dir_all(&root).unwrap();
    crate::agent_proc::Agent::start_with_env(&cfg, &root, crate::agent_proc::NO_BUS, &env_refs)
}

/// Who holds the Lease `name` of the release namespace now.
pub async fn lease_holder(admin: &kube::Client, name: &str) -> Option<String> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(admin.clone(), NS);
    leases
        .get_opt(name)
        .await
        .ok()
        .flatten()?
        .spec?
        .holder_identity
}

/// Waits until `identity` holds the Lease `name`.
pub async fn wait_leading(admin: &kube::Client, name: &str, identity: &str) {
    wait_until(
        Duration::from_secs(20),
        &format!("{identity} holds Lease {name}"),
        || async { lease_holder(admin, name).await.as_deref() == Some(identity) },
    )
    .await;
}

/// `[controller.provider]` = the webhook provider posting to `url` (a loopback receiver of the test),
/// with `[controller] allow_loopback_destinations` (outbound URLs on loopback are refused otherwise).
pub fn webhook_provider(t: &mut toml::Table, url: &str) {
    let mut p = toml::Table::new();
    p.insert("kind".into(), "webhook".into());
    p.insert("url".into(), url.into());
    p.insert("secret".into(), "nodekeeper-test-webhook-secret".into());
    let c = t["controller"].as_table_mut().unwrap();
    c.insert("provider".into(), p.into());
    c.insert("allow_loopback_destinations".into(), true.into());
}

/// Waits until the controller wrote the first of the agent's conditions on `node` (its first report).
pub async fn wait_first_report(nodes: &Api<Node>, node: &str) {
    wait_until(
        Duration::from_secs(30),
        &format!("the agent's first report on {node}"),
        || async {
            crate::ctl::conditions(nodes, node)
                .await
                .keys()
                .any(|k| k.starts_with("Nodekeeper"))
        },
    )
    .await;
}

/// A scenario that reports as one node's agent: the KWOK node `node` (in NodePool `pool`), a
/// controller with the shipped config as `identity`, and the agent's report token and HTTPS client.
pub struct ReportingNode {
    /// Deletes the node when dropped.
    pub nodes: NodesGuard,
    /// The controller's config, CA and kubeconfig.
    pub dir: tempfile::TempDir,
    /// The controller.
    pub ctl: ControllerProc,
    /// The agent's report token.
    pub token: String,
    /// A client that trusts the controller's CA.
    pub https: reqwest::Client,
}

impl Cluster {
    /// [`ReportingNode`] on this cluster.
    pub async fn reporting_node(
        &'static self,
        admin: &kube::Client,
        node: &str,
        pool: &str,
        identity: &str,
    ) -> ReportingNode {
        let nodes = self
            .create_nodes(&[kwok_node(
                node,
                serde_json::json!({ "karpenter.sh/nodepool": pool, "kubernetes.io/hostname": node }),
            )])
            .await;
        let dir = tempfile::tempdir().unwrap();
        let config = controller_toml(dir.path(), identity, |_| {});
        let ctl = ControllerProc::start(self, &config, identity).await;
        let token = agent_report_token(admin, node).await;
        let https = crate::ctl::https(&dir.path().join("ca.pem"), ctl.addr);
        ReportingNode {
            nodes,
            dir,
            ctl,
            token,
            https,
        }
    }
}

impl ReportingNode {
    /// [`report_until`] as this node's agent.
    pub async fn report_until(
        &self,
        report: &nodekeeper_core::wire::NodeReport,
        accepted: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        report_until(&self.https, self.ctl.addr, &self.token, report, accepted).await
    }
}

/// POSTs `report` to the controller at `addr` with `token`: (status, body).
pub async fn post_report(
    https: &reqwest::Client,
    addr: std::net::SocketAddr,
    token: &str,
    report: &nodekeeper_core::wire::NodeReport,
) -> (u16, serde_json::Value) {
    crate::ctl::post(
        https,
        addr,
        Some(token),
        &serde_json::to_value(report).unwrap(),
    )
    .await
}

/// A token for the controller's report API as the agent on `node` holds it: the agent ServiceAccount,
/// audience `nodekeeper`, bound to the shipped DaemonSet's pod there.
pub async fn agent_report_token(admin: &kube::Client, node: &str) -> String {
    let (pod, uid) = agent_pod_on(admin, node).await;
    sa_token(
        admin,
        NS,
        AGENT_SA,
        Some(REPORT_AUDIENCE),
        Some((&pod, &uid)),
    )
    .await
}

/// Sends `report` until the controller answers 200 and `accepted(answer)`, each time with the next
/// sequence number, as the agent does (the same sequence again is a replay the controller ignores; a
/// follower, or a leader whose own flag has not yet followed its Lease write, answers 503).
pub async fn report_until(
    https: &reqwest::Client,
    addr: std::net::SocketAddr,
    token: &str,
    report: &nodekeeper_core::wire::NodeReport,
    accepted: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let sequence = std::sync::atomic::AtomicU64::new(report.sequence);
    wait_for(Duration::from_secs(30), "the report taken", || {
        let mut r = report.clone();
        r.sequence = sequence.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let accepted = &accepted;
        async move {
            let (code, resp) = post_report(https, addr, token, &r).await;
            eprintln!("report {}: {code} {resp}", r.sequence);
            (code == 200 && accepted(&resp)).then_some(resp)
        }
    })
    .await
}

/// The field `key` of one of the controller's JSON log lines, at the top level or under `fields`
/// (`Null` when it has none).
pub fn log_field<'a>(line: &'a serde_json::Value, key: &str) -> &'a serde_json::Value {
    [line, &line["fields"]]
        .into_iter()
        .map(|f| &f[key])
        .find(|v| !v.is_null())
        .unwrap_or(&serde_json::Value::Null)
}

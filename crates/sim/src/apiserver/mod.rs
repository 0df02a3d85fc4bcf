//! Kubernetes API stand-in and cluster simulator (`nodekeeper sim apiserver`).
//!
//! Layout: [`store`] (objects, resourceVersion, indexes, watch fan-out), [`selectors`] (in `nodekeeper_core::k8s`), [`patch`],
//! [`resources`] (resource table and discovery), [`handlers`] (HTTP), [`eviction`] (PDB math), [`auth`]
//! (tokens, TokenReview), [`admin`] (`/sim/v1/`), [`loops`] (simulated kubelet, scheduler, controllers),
//! [`scenario`] (cluster seeding), [`openapi`] (`/openapi/v3`) and [`validation`] (`fieldValidation`),
//! [`protobuf`] (kubectl's protobuf request bodies). See docs/dev/sim.md.

pub mod admin;
pub mod auth;
pub mod clock;
mod defaults;
pub mod error;
mod events;
pub mod eviction;
pub mod handlers;
pub mod loops;
pub mod object;
pub mod openapi;
pub mod patch;
pub mod protobuf;
pub mod resources;
pub mod scenario;
pub use nodekeeper_core::k8s::selectors;
pub mod store;
mod table;
pub mod tls;
pub mod validate;
pub mod validation;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use axum::http::Uri;
use base64::Engine;
use tokio_util::sync::CancellationToken;

use self::admin::{Faults, NodeControls};
use self::auth::Tokens;
use self::clock::SimClock;
use self::loops::LoopOptions;
use self::store::{Store, StoreOptions};

/// Errors of starting or talking to the sim.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address.
        addr: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The kubeconfig could not be written.
    #[error("cannot write kubeconfig {path}: {source}")]
    Kubeconfig {
        /// Path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A URL is not valid.
    #[error("invalid server URL {url:?}: {why}")]
    Url {
        /// URL.
        url: String,
        /// Why.
        why: String,
    },
    /// A kube client error.
    #[error("kube client for {url}: {source}")]
    Client {
        /// Server URL.
        url: String,
        /// Cause.
        source: kube::Error,
    },
    /// The scenario is invalid.
    #[error(transparent)]
    Scenario(#[from] scenario::ScenarioError),
    /// TLS material could not be generated.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
}

/// Everything configurable about a simulated cluster.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Simulated seconds per real second.
    pub time_scale: f64,
    /// Store tunables.
    pub store: StoreOptions,
    /// Control loops.
    pub loops: LoopOptions,
    /// Objects to seed.
    pub scenario: scenario::Scenario,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            time_scale: 1.0,
            store: StoreOptions::default(),
            loops: LoopOptions::default(),
            scenario: scenario::Scenario::empty(),
        }
    }
}

impl SimOptions {
    /// A bare API server: no loops, no seeded objects, pods deleted at once.
    pub fn bare() -> Self {
        SimOptions {
            loops: LoopOptions::none(),
            ..Default::default()
        }
    }
}

/// The shared state of a running sim.
#[derive(Debug)]
pub struct Sim {
    /// Object store.
    pub store: Arc<Store>,
    /// Minted tokens.
    pub tokens: Tokens,
    /// Injected faults.
    pub faults: Faults,
    /// Per-node heartbeat switches and pinned conditions.
    pub nodes: NodeControls,
    /// Options the sim was started with.
    pub opts: SimOptions,
    epoch: tokio::sync::watch::Sender<u64>,
    addr: OnceLock<String>,
}

impl Sim {
    /// A new sim (store seeded from the scenario); loops are started by [`serve`].
    pub fn new(mut opts: SimOptions) -> Result<Arc<Self>, SimError> {
        opts.store.graceful_pod_deletion = opts.loops.kubelet;
        let clock = Arc::new(SimClock::new(opts.time_scale));
        let store = Store::new(clock, opts.store.clone());
        let (epoch, _) = tokio::sync::watch::channel(0);
        let sim = Arc::new(Sim {
            store,
            tokens: Tokens::default(),
            faults: Faults::default(),
            nodes: NodeControls::default(),
            opts,
            epoch,
            addr: OnceLock::new(),
        });
        scenario::seed(&sim)?;
        Ok(sim)
    }

    /// `host:port` the server listens on.
    pub fn server_addr(&self) -> String {
        self.addr.get().cloned().unwrap_or_default()
    }

    /// Ends every open watch (clients must resume).
    pub fn drop_watches(&self) {
        self.epoch.send_modify(|e| *e += 1);
    }

    /// A receiver that changes when watches are dropped.
    pub fn watch_epoch(&self) -> tokio::sync::watch::Receiver<u64> {
        self.epoch.subscribe()
    }
}

/// The HTTP router: admin API plus the Kubernetes API.
pub fn router(sim: Arc<Sim>) -> axum::Router {
    admin::router().fallback(handlers::api).with_state(sim)
}

/// Binds `listen`, starts the control loops and serves plain HTTP until `cancel`; returns the bound address.
pub async fn serve(
    sim: Arc<Sim>,
    listen: &str,
    cancel: CancellationToken,
) -> Result<SocketAddr, SimError> {
    serve_with(sim, listen, None, cancel).await
}

/// Like [`serve`], over TLS when `tls` is set.
pub async fn serve_with(
    sim: Arc<Sim>,
    listen: &str,
    tls: Option<Arc<rustls::ServerConfig>>,
    cancel: CancellationToken,
) -> Result<SocketAddr, SimError> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| SimError::Bind {
            addr: listen.to_string(),
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| SimError::Bind {
        addr: listen.to_string(),
        source,
    })?;
    let _ = sim.addr.set(addr.to_string());
    loops::spawn(sim.clone(), cancel.clone());
    let app = router(sim);
    // The one server (`nodekeeper_core::serve`), plain or TLS: HTTP/1.1 and HTTP/2 (prior
    // knowledge on plain HTTP), watches unbounded, open connections dropped at once on `cancel`.
    tokio::spawn(nodekeeper_core::serve::serve(
        listener,
        app,
        tls,
        nodekeeper_core::serve::ServeLimits::streaming(),
        Default::default(),
        cancel,
    ));
    Ok(addr)
}

/// Writes a kubeconfig pointing at `url` (accepted by kubectl and `kube::Client::try_default()`).
pub fn write_kubeconfig(path: &Path, url: &str) -> Result<(), SimError> {
    write_kubeconfig_with_ca(path, url, None)
}

/// Writes a kubeconfig pointing at `url`, trusting the CA `ca_pem` (PEM) when given.
pub fn write_kubeconfig_with_ca(
    path: &Path,
    url: &str,
    ca_pem: Option<&str>,
) -> Result<(), SimError> {
    let ca = ca_pem
        .map(|pem| {
            let b64 = base64::engine::general_purpose::STANDARD.encode(pem);
            format!("    certificate-authority-data: {b64}\n")
        })
        .unwrap_or_default();
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: nodekeeper-sim\n  cluster:\n    server: {url}\n{ca}\
         contexts:\n- name: nodekeeper-sim\n  context:\n    cluster: nodekeeper-sim\n    user: nodekeeper-sim\n    namespace: default\n\
         current-context: nodekeeper-sim\nusers:\n- name: nodekeeper-sim\n  user:\n    token: nodekeeper-sim-admin\npreferences: {{}}\n"
    );
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| SimError::Kubeconfig {
            path: path.to_path_buf(),
            source,
        })?;
    }
    std::fs::write(path, text).map_err(|source| SimError::Kubeconfig {
        path: path.to_path_buf(),
        source,
    })
}

/// A kube client for a plain-HTTP sim URL.
///
/// kube 5 clients retry 429/503/504 by default (up to 15 times, backoff up to 1000 s), which turns a
/// PDB-refused eviction into minutes of waiting; this client has that retry layer off so tests see
/// the server's answer at once.
pub fn client_for(url: &str) -> Result<kube::Client, SimError> {
    client_trusting(url, None)
}

/// Like [`client_for`], trusting the CA certificate `ca_der` (DER) for an `https://` URL.
pub fn client_trusting(url: &str, ca_der: Option<&[u8]>) -> Result<kube::Client, SimError> {
    // kube-rs' rustls needs a process-wide provider; a second install is a harmless no-op error.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let uri: Uri = url
        .parse()
        .map_err(|e: axum::http::uri::InvalidUri| SimError::Url {
            url: url.into(),
            why: e.to_string(),
        })?;
    let mut cfg = kube::Config::new(uri);
    cfg.default_namespace = "default".into();
    cfg.default_retry = false;
    cfg.root_cert = ca_der.map(|c| vec![c.to_vec()]);
    kube::Client::try_from(cfg).map_err(|source| SimError::Client {
        url: url.into(),
        source,
    })
}

/// An in-process simulated cluster for tests: started on a free loopback port, stopped on drop.
pub struct TestCluster {
    /// Base URL, e.g. `http://127.0.0.1:41234`.
    pub url: String,
    /// A kube client talking to it.
    pub client: kube::Client,
    /// The sim itself (store, tokens, faults, node switches).
    pub sim: Arc<Sim>,
    /// The generated CA and server certificate when serving over TLS.
    pub tls: Option<tls::SimTls>,
    cancel: CancellationToken,
}

impl TestCluster {
    /// Starts a cluster with `opts` (plain HTTP).
    pub async fn start(opts: SimOptions) -> Result<Self, SimError> {
        Self::start_with(opts, None).await
    }

    /// Starts a cluster with `opts` over TLS with a freshly generated CA.
    pub async fn start_tls(opts: SimOptions) -> Result<Self, SimError> {
        Self::start_with(opts, Some(tls::SimTls::generate()?)).await
    }

    async fn start_with(opts: SimOptions, tls: Option<tls::SimTls>) -> Result<Self, SimError> {
        let sim = Sim::new(opts)?;
        let cancel = CancellationToken::new();
        let server = tls.as_ref().map(|t| t.server.clone());
        let addr = serve_with(sim.clone(), "127.0.0.1:0", server, cancel.clone()).await?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{addr}");
        let client = client_trusting(&url, tls.as_ref().map(|t| t.ca_der.as_slice()))?;
        Ok(TestCluster {
            url,
            client,
            sim,
            tls,
            cancel,
        })
    }

    /// URL of an admin endpoint, e.g. `admin_url("faults")`.
    pub fn admin_url(&self, path: &str) -> String {
        format!("{}/sim/v1/{}", self.url, path.trim_start_matches('/'))
    }

    /// Writes a kubeconfig for this cluster (with the CA when it serves TLS).
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), SimError> {
        let ca = self.tls.as_ref().map(|t| t.ca_pem.as_str());
        write_kubeconfig_with_ca(path, &self.url, ca)
    }
}

impl std::fmt::Debug for TestCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCluster")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Arguments of `nodekeeper sim apiserver` (parsed, with their defaults, by the binary's `cli::sim`).
#[derive(Debug, Clone)]
pub struct ApiserverArgs {
    /// Address to listen on (plain HTTP unless --tls; use port 0 for a free port).
    pub listen: String,
    /// Serve HTTPS with a freshly generated self-signed CA and a server certificate for
    /// 127.0.0.1/localhost/::1; the kubeconfig written by --kubeconfig-out trusts that CA.
    pub tls: bool,
    /// Write a kubeconfig for the server to this path.
    pub kubeconfig_out: Option<PathBuf>,
    /// Scenario TOML (node pools, workloads, PDBs, DaemonSets); default: a small mixed cluster.
    pub scenario: Option<PathBuf>,
    /// Scale mode: this many nodes (one pool) instead of the scenario.
    pub nodes: Option<usize>,
    /// Scale mode: pods per node.
    pub pods_per_node: usize,
    /// Simulated seconds per real second.
    pub time_scale: f64,
    /// Start no control loops (a bare API server).
    pub no_loops: bool,
    /// Start empty (no default scenario).
    pub empty: bool,
    /// Exit once the process with this PID is gone (a test harness that owns this server).
    pub owner_pid: Option<i32>,
}

/// `nodekeeper sim apiserver`: serves until `shutdown` (the process's token, cancelled by
/// SIGTERM/SIGINT) is cancelled or the owner process is gone.
pub async fn run_apiserver(
    args: ApiserverArgs,
    shutdown: CancellationToken,
) -> Result<u8, Box<dyn std::error::Error + Send + Sync>> {
    let scenario = match (&args.scenario, args.nodes, args.empty) {
        (Some(path), _, _) => scenario::Scenario::load(path)?,
        (None, Some(n), _) => scenario::Scenario::scale(n, args.pods_per_node),
        (None, None, true) => scenario::Scenario::empty(),
        (None, None, false) => scenario::Scenario::default_mixed(),
    };
    let loops = if args.no_loops {
        LoopOptions::none()
    } else {
        LoopOptions::default()
    };
    let opts = SimOptions {
        time_scale: args.time_scale,
        loops,
        scenario,
        ..Default::default()
    };
    let sim = Sim::new(opts)?;
    let cancel = shutdown.child_token();
    let tls = args.tls.then(tls::SimTls::generate).transpose()?;
    let server = tls.as_ref().map(|t| t.server.clone());
    let addr = serve_with(sim.clone(), &args.listen, server, cancel.clone()).await?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let url = format!("{scheme}://{addr}");
    if let Some(path) = &args.kubeconfig_out {
        write_kubeconfig_with_ca(path, &url, tls.as_ref().map(|t| t.ca_pem.as_str()))?;
    }
    println!("nodekeeper sim apiserver listening on {url}");
    tracing::info!(%url, nodes = sim.store.count(resources::well_known::nodes()),
        pods = sim.store.count(resources::well_known::pods()), "sim apiserver ready");
    let owner_gone = async {
        match args.owner_pid {
            // Signal 0 checks that the process exists without signalling it.
            Some(pid) => {
                while nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok() {
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
                tracing::info!(pid, "owner process gone; stopping");
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = owner_gone => {}
    }
    cancel.cancel();
    Ok(0)
}

/// Arguments of `nodekeeper sim token` (parsed, with their defaults, by the binary's `cli::sim`).
#[derive(Debug, Clone)]
pub struct TokenArgs {
    /// Pod the token is bound to.
    pub pod: String,
    /// Node the token is bound to.
    pub node: String,
    /// Audience (repeatable).
    pub audiences: Vec<String>,
    /// Namespace of the pod.
    pub namespace: String,
    /// Service account name.
    pub service_account: String,
    /// Lifetime in simulated seconds.
    pub expiration_seconds: i64,
    /// URL of the running sim apiserver (the token is minted by its admin API).
    pub server: String,
}

/// `nodekeeper sim token`: asks the running sim to mint a token and prints it.
pub async fn run_token(args: TokenArgs) -> Result<u8, Box<dyn std::error::Error + Send + Sync>> {
    let client = client_for(&args.server)?;
    let body = auth::TokenRequest {
        pod: args.pod,
        node: args.node,
        audiences: args.audiences,
        namespace: args.namespace,
        service_account: args.service_account,
        expiration_seconds: args.expiration_seconds,
        pod_uid: String::new(),
    };
    let req = axum::http::Request::post("/sim/v1/tokens")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body)?)?;
    let out: serde_json::Value = client
        .request(req)
        .await
        .map_err(|source| SimError::Client {
            url: args.server.clone(),
            source,
        })?;
    let token = out
        .get("token")
        .and_then(serde_json::Value::as_str)
        .ok_or("the sim answered without a token")?;
    println!("{token}");
    Ok(0)
}

//! The central controller (`nodekeeper controller`): receives agent reports over HTTPS, checks
//! who sends them, and is the only writer of Node state. See docs/controller.md.
//!
//! Layout: [`config`] (`[controller]`), [`server`] (HTTP API), [`auth`] (TokenReview + node
//! binding), [`nodestate`] (conditions, staleness, events), [`labels`] (allow-listed label
//! removal), [`oci_events`] (OCI Notifications), [`leader`] (Lease election), [`events`]
//! (Kubernetes Event reasons).

pub mod auth;
pub mod config;
pub mod drain;
pub mod events;
pub mod labels;
pub mod leader;
pub mod nodestate;
pub mod notify;
pub mod oci_events;
pub mod policy;
pub mod provider;
pub mod server;
pub mod status;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::Api;
use rand::Rng;
use tokio_util::sync::CancellationToken;

use self::config::ControllerConfig;
use self::nodestate::{NodeStateConfig, NodeStates};
use self::server::App;

/// Errors starting the controller.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// The configuration file has no `[controller]` section.
    #[error("{path}: no [controller] section")]
    NoSection {
        /// File.
        path: String,
    },
    /// No Kubernetes client.
    #[error("kubernetes client: {0}")]
    Client(#[from] kube::Error),
    /// Server start.
    #[error(transparent)]
    Server(#[from] server::ServerError),
}

/// A started controller.
#[derive(Debug)]
pub struct Running {
    /// Where the report API listens.
    pub addr: SocketAddr,
    /// Handler state (node state, counters).
    pub app: Arc<App>,
    /// Cancel to stop everything (the Lease is released).
    pub cancel: CancellationToken,
    /// Finishes after the Lease was released.
    pub election: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops the controller and waits for the Lease release.
    pub async fn stop(self) {
        self.cancel.cancel();
        let _ = self.election.await;
    }
}

fn identity(cfg: &ControllerConfig) -> String {
    cfg.leader.identity.clone().unwrap_or_else(|| {
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "controller".into());
        format!("{host}-{:06x}", rand::rng().random::<u32>() & 0xff_ffff)
    })
}

/// Starts every part of the controller with `client`.
pub async fn start(
    client: kube::Client,
    cfg: &ControllerConfig,
) -> Result<Running, ControllerError> {
    let cancel = CancellationToken::new();
    let id = identity(cfg);
    let (store, writer) = reflector::store::<Node>();
    let nodes: Api<Node> = Api::all(client.clone());
    let stream = reflector(
        writer,
        watcher(nodes, watcher::Config::default()).default_backoff(),
    )
    .applied_objects();
    let c1 = cancel.clone();
    tokio::spawn(async move {
        let mut s = std::pin::pin!(stream);
        loop {
            tokio::select! {
                _ = c1.cancelled() => return,
                item = s.next() => match item {
                    Some(Err(e)) => tracing::warn!(error = %e, "node watch error"),
                    Some(Ok(_)) => {}
                    None => return,
                },
            }
        }
    });
    let (leader_tx, leader_rx) = tokio::sync::watch::channel(false);
    let elector = leader::Elector::new(
        client.clone(),
        &cfg.namespace,
        &cfg.leader.lease_name,
        &id,
        cfg.leader.lease_duration,
        cfg.leader.retry_period,
    );
    let election = tokio::spawn(elector.run(leader_tx, cancel.clone()));
    let recorder = events::Recorder::new(client.clone(), &cfg.namespace, &id);
    let states = NodeStates::new(
        NodeStateConfig {
            prefix: cfg.condition_prefix.clone(),
            staleness: cfg.staleness,
            heartbeat_write_interval: cfg.heartbeat_write_interval,
            label_allow: cfg.label_removal_allow.clone(),
        },
        client.clone(),
        store.clone(),
        leader_rx.clone(),
        recorder,
    );
    let period = (cfg.staleness / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
    tokio::spawn(states.clone().run_maintenance(period, cancel.clone()));
    let oci = cfg
        .oci_events
        .enabled
        .then(|| oci_events::OciEvents::new(cfg.oci_events.clone(), store.clone()));
    let app = Arc::new(App {
        auth: auth::Authenticator::new(
            client,
            &cfg.service_account,
            &cfg.audience,
            cfg.token_cache_size,
            cfg.token_cache_ttl,
        ),
        states,
        ready: AtomicBool::new(false),
        leader: leader_rx,
        oci,
        forbidden: Default::default(),
        unauthenticated: Default::default(),
    });
    let a2 = app.clone();
    tokio::spawn(async move {
        if store.wait_until_ready().await.is_ok() {
            a2.ready.store(true, std::sync::atomic::Ordering::Relaxed);
            tracing::info!(nodes = store.state().len(), "node cache synced");
        }
    });
    let tls = match (
        &cfg.tls_cert_file,
        &cfg.tls_key_file,
        cfg.insecure_plain_http,
    ) {
        (Some(c), Some(k), false) => Some(server::tls_config(c, k)?),
        _ => None,
    };
    let router = server::router(app.clone(), cfg.max_report_bytes);
    let addr = server::serve(&cfg.listen, router, tls, cancel.clone()).await?;
    tracing::info!(%addr, identity = %id, "controller listening");
    Ok(Running {
        addr,
        app,
        cancel,
        election,
    })
}

/// `nodekeeper controller --config FILE`: runs until SIGTERM/SIGINT, then releases the Lease.
pub fn run(path: &Path, env: &crate::config::Env) -> u8 {
    let loaded = match crate::cli::load_config(path, env) {
        Ok(l) => l,
        Err(code) => return code,
    };
    crate::telemetry::init(loaded.config.log.format, &loaded.config.log.level);
    let Some(cfg) = loaded.config.controller.clone() else {
        eprintln!(
            "error: {}",
            ControllerError::NoSection {
                path: path.display().to_string()
            }
        );
        return crate::cli::EXIT_INVALID;
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return crate::cli::EXIT_FAILURE;
        }
    };
    rt.block_on(async move {
        let result: Result<(), Box<dyn std::error::Error + Send + Sync>> = async {
            let mut signals = crate::shutdown::install()?;
            let client = kube::Client::try_default()
                .await
                .map_err(ControllerError::Client)?;
            let running = start(client, &cfg).await?;
            while !*signals.shutdown.borrow() {
                if signals.shutdown.changed().await.is_err() {
                    break;
                }
            }
            tracing::info!("stopping: releasing the lease");
            running.stop().await;
            Ok(())
        }
        .await;
        match result {
            Ok(()) => crate::cli::EXIT_OK,
            Err(e) => {
                eprintln!("error: {e}");
                crate::cli::EXIT_FAILURE
            }
        }
    })
}

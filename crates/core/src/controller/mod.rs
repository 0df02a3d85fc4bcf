//! The central controller (`nodekeeper controller`): receives agent reports over HTTPS, checks
//! who sends them, and is the only writer of Node state. See docs/controller.md.
//!
//! Layout, by layer (docs/dev/architecture.md):
//! - [`api`]: what agents and OCI Notifications call (server, auth, report limits, OCI events);
//! - [`state`]: what the controller knows of each node (report conditions, labels, NodePools,
//!   which changes wake the engine);
//! - [`engine`]: the disruption engine (reconcile, fast path, due path, fence), leader only, deciding
//!   through the pure [`policy`];
//! - [`act`]: how decisions reach the cluster (the actor, drains, replacement providers,
//!   notifications);
//! - [`cluster`]: the replica in its cluster (Lease election, supervised tasks, the Event catalog);
//! - [`config`] (`[controller]`), [`metrics`] (the one registry), [`clock`], [`status`] (the CLI's
//!   view).

pub mod act;
pub mod api;
pub mod catalog;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod engine;
pub mod metrics;
pub mod policy;
pub mod state;
pub mod status;

use std::net::SocketAddr;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::Api;
use rand::Rng;
use tokio_util::sync::CancellationToken;

use self::act::{actions, drain, notify, provider};
use self::api::app::App;
use self::api::{auth, oci_events, server};
use self::cluster::{delay, events, leader, leader_pod, supervise};
use self::config::ControllerConfig;
use self::engine::{notice_thread, wake};
use self::state::nodepools;
use self::state::nodestate::{NodeStateConfig, NodeStates};

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
    /// No client configuration (neither `$KUBECONFIG`, `~/.kube/config` nor in-cluster), or no
    /// client for it: from the one builder, [`crate::k8s::client`].
    #[error("kubernetes client: {0}")]
    Kubeconfig(#[from] crate::k8s::client::ClientError),
    /// Server start.
    #[error(transparent)]
    Server(#[from] crate::serve::ServeError),
    /// The replacement provider could not be built.
    #[error(transparent)]
    Provider(#[from] provider::ProviderError),
    /// The notification targets could not be set up.
    #[error(transparent)]
    Notify(#[from] notify::NotifyError),
    /// `[budgets] source = "nodepool"` without Karpenter's NodePools (CRD not served, or not
    /// readable).
    #[error(transparent)]
    NodePools(#[from] nodepools::NodePoolsError),
    /// The notice lane could not be started.
    #[error(transparent)]
    Lane(#[from] notice_thread::LaneError),
    /// The OCI Events secret file could not be read.
    #[error(transparent)]
    OciEvents(#[from] oci_events::SecretFileError),
    /// A supervised task ended or panicked (the Lease was released).
    #[error(transparent)]
    TaskDied(supervise::TaskDied),
}

/// A started controller.
#[derive(Debug)]
pub struct Running {
    /// Where the report API listens.
    pub addr: SocketAddr,
    /// Handler state (node state, counters).
    pub app: Arc<App>,
    /// Cancel to stop everything (the Lease is released): a child of the shutdown token it was
    /// started under ([`start_under`]), or a root of its own.
    pub cancel: CancellationToken,
    /// Finishes after the Lease was released (taken once it ended).
    election: Option<tokio::task::JoinHandle<()>>,
    /// The disruption engine, when started with one.
    pub engine: Option<Arc<engine::Engine>>,
    /// The node watch, node maintenance, engine and report server, supervised.
    tasks: supervise::Tasks,
}

impl Running {
    /// Waits until a task the controller cannot live without ends (the leader election among
    /// them), marks `/livez` failed with it and returns it. Pending while all run; meant to be
    /// raced against the shutdown signal, then followed by [`Running::stop`].
    pub async fn failed(&mut self) -> supervise::TaskDied {
        let died = match self.election.as_mut() {
            Some(election) => tokio::select! {
                died = self.tasks.first_exit() => died,
                r = election => supervise::TaskDied {
                    task: "leader election",
                    how: match r {
                        Ok(()) => "returned".into(),
                        Err(e) if e.is_panic() => format!("panicked: {}", supervise::panic_message(e.into_panic())),
                        Err(_) => "was cancelled".into(),
                    },
                },
            },
            None => self.tasks.first_exit().await,
        };
        if died.task == "leader election" {
            self.election = None;
        }
        let _ = self.app.dead.set(died.to_string());
        died
    }

    /// Stops the controller: every task ends (drains stop), and the Lease is released.
    pub async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(e) = &self.engine {
            e.drains().stop_all();
        }
        self.tasks.drain(Duration::from_secs(5)).await;
        if let Some(election) = self.election.take() {
            let _ = election.await;
        }
    }
}

fn identity(cfg: &ControllerConfig) -> String {
    cfg.leader.identity.clone().unwrap_or_else(|| {
        format!(
            "{}-{:06x}",
            host_name(),
            rand::rng().random::<u32>() & 0xff_ffff
        )
    })
}

/// The host name: a pod's name in Kubernetes.
fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "controller".into())
}

/// Starts every part of the controller with `client`, without the disruption engine.
pub async fn start(
    client: kube::Client,
    cfg: &ControllerConfig,
) -> Result<Running, ControllerError> {
    start_with(client, cfg, None).await
}

/// Starts every part of the controller with `client`, and the disruption engine when `engine`
/// is given and `[controller.engine] enabled` (it acts only while this replica leads).
pub async fn start_with(
    client: kube::Client,
    cfg: &ControllerConfig,
    engine: Option<engine::EngineOptions>,
) -> Result<Running, ControllerError> {
    start_under(&CancellationToken::new(), client, cfg, engine).await
}

/// [`start_with`] under `shutdown`: every task runs on a child of it (one token tree), so
/// cancelling `shutdown` stops them all; [`Running::stop`] still waits for them and for the
/// Lease's release.
pub async fn start_under(
    shutdown: &CancellationToken,
    client: kube::Client,
    cfg: &ControllerConfig,
    engine: Option<engine::EngineOptions>,
) -> Result<Running, ControllerError> {
    let cancel = shutdown.child_token();
    let wake = Arc::new(tokio::sync::Notify::new());
    let id = identity(cfg);
    let (store, writer) = reflector::store::<Node>();
    let nodes: Api<Node> = Api::all(client.clone());
    // managedFields are half of a kubelet-written Node's JSON and nothing here reads them (no
    // Node is ever PUT back from the cache): at 5,000 KWOK Nodes, 14 MB of their JSON.
    let stream = reflector(
        writer,
        watcher(
            nodes,
            watcher::Config::default().timeout(crate::k8s::watch_timeout_secs()),
        )
        .default_backoff()
        .modify(|n| n.metadata.managed_fields = None),
    );
    let wake_filter = match &engine {
        Some(o) => wake::NodeWake::for_policy(&o.policy),
        None => wake::NodeWake::default(),
    };
    let mut tasks = supervise::Tasks::default();
    let c1 = cancel.clone();
    let w1 = wake.clone();
    tasks.spawn("node watch", async move {
        let mut s = std::pin::pin!(stream);
        let mut filter = wake_filter;
        loop {
            tokio::select! {
                _ = c1.cancelled() => return,
                item = s.next() => match item {
                    Some(Err(e)) => tracing::warn!(error = %e, "node watch error"),
                    Some(Ok(ev)) => {
                        if let watcher::Event::Delete(n) = &ev {
                            // Whoever removed it (nodekeeper's hand-over, Karpenter, an operator),
                            // the log says when it went.
                            tracing::info!(node = n.metadata.name.as_deref().unwrap_or_default(), "node left the cluster");
                        }
                        if filter.wakes(&ev) {
                            w1.notify_one();
                        }
                    }
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
        leader::Timing::from(&cfg.leader),
    );
    let election = tokio::spawn(elector.run(leader_tx, cancel.clone()));
    if cfg.leader.pod_label {
        let pod = cfg.leader.pod_name.clone().unwrap_or_else(host_name);
        tasks.spawn(
            "leader pod label",
            leader_pod::run(
                Api::namespaced(client.clone(), &cfg.namespace),
                pod,
                leader_rx.clone(),
                cfg.leader.retry_period,
                cancel.clone(),
            ),
        );
    }
    let recorder = events::Recorder::new(client.clone(), &id, Some(store.clone()));
    let states = NodeStates::new(
        NodeStateConfig::from(cfg),
        client.clone(),
        store.clone(),
        leader_rx.clone(),
        recorder.clone(),
    );
    let period = NodeStates::maintenance_period(cfg.staleness);
    tasks.spawn(
        "node maintenance",
        states.clone().run_maintenance(period, cancel.clone()),
    );
    let oci = cfg
        .oci_events
        .enabled
        .then(|| {
            oci_events::OciEvents::new(
                cfg.oci_events.clone(),
                store.clone(),
                cfg.allow_loopback_destinations,
            )
        })
        .transpose()?;
    let notifier = match cfg.notify.is_empty() {
        true => None,
        false => Some(Arc::new(notify::Notifier::start(
            &cfg.notify,
            cfg.allow_loopback_destinations,
        )?)),
    };
    let engine = match engine.filter(|_| cfg.engine.enabled) {
        Some(mut opts) => {
            let nodepools = match opts.policy.budgets.source {
                policy::config::BudgetsSource::NodePool => Some(
                    nodepools::watch(client.clone(), &mut tasks, cancel.clone(), wake.clone())
                        .await?,
                ),
                policy::config::BudgetsSource::Config => None,
            };
            if opts.notifier.is_none() {
                opts.notifier = notifier.clone().map(|n| n as Arc<dyn actions::Notifier>);
            }
            let parts = EngineStart {
                client: client.clone(),
                cfg,
                store: store.clone(),
                recorder: recorder.clone(),
                states: states.clone(),
                wake: wake.clone(),
                nodepools,
            };
            let (e, history) = parts.build(opts)?;
            if let Some(writer) = history {
                tasks.spawn(
                    "history writer",
                    writer.run(leader_rx.clone(), cancel.clone()),
                );
            }
            let events = states.subscribe_events();
            tasks.spawn(
                "engine",
                e.clone().run(leader_rx.clone(), events, cancel.clone()),
            );
            Some(e)
        }
        None => None,
    };
    let mut authenticator = auth::Authenticator::new(
        client.clone(),
        &cfg.service_account,
        &cfg.audience,
        cfg.token_cache_size,
        cfg.token_cache_ttl,
    );
    // The agents' pods (in their service account's namespace): a token bound to one is cached
    // for its life while that pod lives.
    if let Some(ns) = auth::service_account_namespace(&cfg.service_account) {
        let live = Arc::new(auth::LivePods::default());
        tasks.spawn(
            "agent pod watch",
            live.clone().run(client, ns.to_string(), cancel.clone()),
        );
        authenticator = authenticator.with_live_pods(live);
    }
    let delay = delay::SchedulingDelay::new();
    delay.start(cancel.clone());
    let app = Arc::new(App {
        auth: authenticator,
        states: states.clone(),
        ready: AtomicBool::new(false),
        leader: leader_rx,
        oci,
        engine: engine.as_ref().map(|e| e.metrics.clone()),
        disruption: engine.clone(),
        notifier,
        forbidden: Default::default(),
        unauthenticated: Default::default(),
        in_flight: tokio::sync::Semaphore::new(cfg.max_reports_in_flight),
        notices_in_flight: tokio::sync::Semaphore::new(cfg.max_reports_in_flight),
        shed: Default::default(),
        notices_past_limit: Default::default(),
        connections: Default::default(),
        dead: Default::default(),
        delay,
        max_body: cfg.max_report_bytes,
        bodies_refused: Default::default(),
        versions: Default::default(),
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
        (Some(c), Some(k), false) => Some(crate::serve::tls_config(c, k)?),
        _ => None,
    };
    let router = server::router(app.clone());
    let limits = crate::serve::ServeLimits {
        max_connections: cfg.max_connections,
        header_read_timeout: Some(cfg.idle_timeout),
        http2: cfg.http2,
        ..crate::serve::ServeLimits::default()
    };
    match crate::serve::raise_open_files_limit() {
        // a margin for the API server's watches, the Lease and the process's own files
        Ok(n) if n < cfg.max_connections as u64 + 256 => tracing::warn!(
            open_files = n,
            max_connections = cfg.max_connections,
            "the open-files limit is below max_connections: new agent connections will fail \
             before the connection limit is reached (raise LimitNOFILE / the container's nofile)"
        ),
        Ok(n) => tracing::debug!(open_files = n, "open-files limit"),
        Err(e) => tracing::warn!(error = %e, "cannot read or raise the open-files limit"),
    }
    let (addr, serving) = crate::serve::bind(
        &cfg.listen,
        router,
        tls,
        limits,
        app.connections.clone(),
        cancel.clone(),
    )
    .await?;
    tasks.spawn("report server", serving);
    tracing::info!(%addr, identity = %id, "controller listening");
    Ok(Running {
        addr,
        app,
        cancel,
        election: Some(election),
        engine,
        tasks,
    })
}

/// What the engine shares with the rest of the controller.
struct EngineStart<'a> {
    client: kube::Client,
    cfg: &'a ControllerConfig,
    store: reflector::Store<Node>,
    recorder: events::Recorder,
    states: Arc<NodeStates>,
    wake: Arc<tokio::sync::Notify>,
    nodepools: Option<reflector::Store<kube::core::DynamicObject>>,
}

impl EngineStart<'_> {
    /// The engine, and the writer of the node histories its actor and drains record into (none
    /// with `[controller.history] enabled = false`).
    fn build(
        self,
        opts: engine::EngineOptions,
    ) -> Result<(Arc<engine::Engine>, Option<act::history::Writer>), ControllerError> {
        let provider: Arc<dyn provider::NodeProvider> = match opts.provider {
            Some(p) => p,
            None => Arc::from(provider::build(
                &self.cfg.provider,
                self.client.clone(),
                self.cfg.allow_loopback_destinations,
            )?),
        };
        let metrics = Arc::new(metrics::EngineMetrics::default());
        let (history, writer) = match self.cfg.history.enabled {
            true => {
                let (h, w) = act::history::channel(
                    self.client.clone(),
                    &self.cfg.namespace,
                    self.cfg.history.clone(),
                    metrics.clone(),
                );
                (Some(h), Some(w))
            }
            false => (None, None),
        };
        let drains = Arc::new(
            drain::tasks::DrainTasks::new(
                opts.drain_client.unwrap_or_else(|| self.client.clone()),
                self.cfg.engine.clone(),
                opts.clock.clone(),
                metrics.clone(),
                self.wake.clone(),
            )
            .with_history(history.clone()),
        );
        let actor = Arc::new(
            actions::Actor::new(actions::ActorParts {
                urgent_client: opts.lane.as_ref().map(|l| l.client.clone()),
                client: self.client,
                cache: self.store.clone(),
                recorder: self.recorder,
                provider,
                states: self.states,
                drains: drains.clone(),
                metrics: metrics.clone(),
                notifier: opts.notifier,
            })
            .with_history(history),
        );
        let engine = engine::Engine::new(engine::EngineParts {
            cfg: self.cfg.engine.clone(),
            policy: opts.policy,
            clock: opts.clock,
            store: self.store,
            nodepools: self.nodepools,
            actor,
            drains,
            metrics,
            wake: self.wake,
            lane: opts.lane.map(|l| l.handle),
        });
        Ok((engine, writer))
    }
}

/// `nodekeeper controller`: runs until `shutdown` (the process's root token, cancelled by
/// SIGTERM/SIGINT) is cancelled, then releases the Lease. Returns an error when it cannot start,
/// or when a supervised task died (the Lease is released first).
pub async fn run(
    cfg: ControllerConfig,
    policy: policy::PolicyConfig,
    shutdown: CancellationToken,
) -> Result<(), ControllerError> {
    // What kube-rs infers: `$KUBECONFIG` or `~/.kube/config`, else in-cluster.
    let kcfg = crate::k8s::client::config(None, None, "controller").await?;
    let client = crate::k8s::client::client(kcfg.clone())?;
    let mut opts = engine::EngineOptions::new(policy);
    // Drains handle 429 themselves (a PDB refusal must be seen, not retried for minutes).
    opts.drain_client = Some(drain::client(kcfg.clone()).map_err(ControllerError::Client)?);
    // Stopped when `run` returns, after the engine.
    let lane = match cfg.engine.notice_lane {
        true => Some(notice_thread::NoticeLane::start(kcfg).await?),
        false => None,
    };
    opts.lane = lane.as_ref().map(notice_thread::NoticeLane::lane);
    let mut running = start_under(&shutdown, client, &cfg, Some(opts)).await?;
    // The tasks run on children of `shutdown`: once it is cancelled they end, and that is a
    // stop, not a death (hence `biased`, and the check after a task's end).
    let died = tokio::select! {
        biased;
        _ = shutdown.cancelled() => None,
        died = running.failed() => Some(died).filter(|_| !shutdown.is_cancelled()),
    };
    match died {
        None => {
            tracing::info!("stopping: releasing the lease");
            running.stop().await;
            Ok(())
        }
        Some(died) => {
            tracing::error!(task = died.task, how = %died.how, "a controller task died: releasing the lease and exiting");
            running.stop().await;
            Err(ControllerError::TaskDied(died))
        }
    }
}

//! The node agent: one `select!` loop over health-check ticks, metadata-source events, the
//! shutdown watcher, configuration reloads (SIGHUP or a changed file) and termination signals.
//! Everything it learns goes into one [`state::AgentState`], published as versioned
//! [`NodeReport`]s on change.
//!
//! - [`crio`]: CRI-O drop-ins (applied at start and on every reload);
//! - [`checks`]: node health checks; [`sources`]: cloud metadata notices;
//! - [`host`]: systemd and logind over D-Bus; [`state`]: the report assembly.

pub mod checks;
pub mod config;
pub mod crio;
pub mod fsops;
pub mod host;
pub mod labels;
pub mod once;
pub mod reporter;
pub mod sources;
pub mod state;

use std::path::{Path, PathBuf};

use chrono::Utc;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::agent::checks::Checks;
use crate::agent::config::{AgentSections, Load};
use crate::agent::crio::apply::{self, ApplyOptions};
use crate::agent::host::logind::{Delivered, ShutdownSignal, ShutdownWatcher, WatcherOptions};
use crate::agent::host::systemd::Systemd;
use crate::agent::sources::driver::SourceMessage;
use crate::agent::state::AgentState;
use crate::config::{Env, Loaded};
use crate::shutdown::{CancellationToken, Signals};
use crate::wire::{EventKind, InstanceIdentity, NodeEvent, NodeReport};

/// Options of `nodekeeper agent`.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// Prefix for every host path of the CRI-O apply (tests, demo).
    pub root: Option<PathBuf>,
    /// Reads the configuration file again on a reload (the whole file, keeping the agent's part).
    pub load: Load,
}

/// What the background tasks tell the loop.
#[derive(Debug)]
enum Input {
    Source(SourceMessage),
    Identity(InstanceIdentity),
    Shutdown(ShutdownSignal),
    Labels(Vec<crate::wire::LabelRemoval>),
    Command(crate::wire::AgentCommand),
    CommandResult(crate::wire::CommandResult),
}

/// Runs the agent until a termination signal.
pub async fn run(
    loaded: Loaded<AgentSections>,
    env: Env,
    opts: AgentOptions,
    mut signals: Signals,
) {
    let shutdown = signals.shutdown.clone();
    let path = loaded.path.clone();
    let mut config = loaded.config;
    let mut fingerprint = file_fingerprint(&path);
    let mut st = AgentState::new(node_name(&config), instance_id(), boot_id(&config));
    tracing::info!(config = %path.display(), version = crate::VERSION, "agent starting");
    let (in_tx, mut in_rx) = mpsc::channel(256);
    let mut tasks = Tasks::spawn(&config, in_tx.clone(), &shutdown);
    let mut checks = Checks::from_config(&config.checks);
    apply_crio(&config, &opts, &mut st).await;
    let mut ticks = Ticks::new(&config);
    let mut events: Vec<NodeEvent> = Vec::new();
    let mut held: Vec<Delivered> = Vec::new();
    let mut sink = Sink::start(&config, &opts, in_tx.clone(), &shutdown);
    loop {
        let reload = tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(()) = signals.reload.recv() => {
                // Fingerprint first: an edit made after this log line is then always noticed.
                fingerprint = file_fingerprint(&path);
                tracing::info!("SIGHUP: reloading configuration");
                true
            }
            _ = ticks.file.tick() => {
                let now = file_fingerprint(&path);
                let changed = now != fingerprint;
                if changed {
                    fingerprint = now;
                    tracing::info!(config = %path.display(), "configuration file changed: reloading");
                }
                changed
            }
            _ = ticks.check.tick() => {
                // tokio's clock (the wall clock unless paused, as in tests) drives the flap guards.
                st.apply_round(checks.run_once(tokio::time::Instant::now().into_std()).await);
                false
            }
            Some(input) = in_rx.recv() => {
                match input {
                    Input::Command(cmd) => execute(cmd, &config, in_tx.clone()),
                    Input::CommandResult(r) => st.add_command_result(r),
                    other => on_input(other, &mut st, &mut events, &mut held),
                }
                false
            }
        };
        if reload {
            if let Some(c) = self::reload(opts.load, &path, &env) {
                config = c;
                tasks.stop().await;
                tasks = Tasks::spawn(&config, in_tx.clone(), &shutdown);
                checks = Checks::from_config(&config.checks);
                ticks = Ticks::new(&config);
            }
            apply_crio(&config, &opts, &mut st).await;
        }
        if st.changed() || !events.is_empty() {
            sink.publish(st.report(std::mem::take(&mut events), Utc::now()))
                .await;
            // The shutdown report is out (or handed to the reporter, which sends changes within
            // 200 ms): let the shutdown proceed shortly.
            let grace = match sink.reporter {
                Some(_) => SHUTDOWN_REPORT_GRACE,
                None => std::time::Duration::ZERO,
            };
            release_after(held.drain(..), grace);
        }
    }
    sink.stop().await;
    tasks.stop().await;
    tracing::info!("agent stopped");
}

/// The loop's two periodic timers: a round of health checks every `[checks] interval`, a look at
/// the configuration file's fingerprint every `[agent] config_poll_interval`. Each fires at once,
/// then once per period; a round that overruns its period delays the next instead of bunching up
/// the ones it missed. Made anew from the configuration on each reload.
struct Ticks {
    check: tokio::time::Interval,
    file: tokio::time::Interval,
}

impl Ticks {
    fn new(config: &AgentSections) -> Self {
        let every = |period| {
            let mut i = tokio::time::interval(period);
            i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            i
        };
        Ticks {
            check: every(config.checks.interval),
            file: every(config.agent.config_poll_interval),
        }
    }
}

fn on_input(
    input: Input,
    st: &mut AgentState,
    events: &mut Vec<NodeEvent>,
    held: &mut Vec<Delivered>,
) {
    match input {
        Input::Identity(id) => {
            tracing::info!(instance = %id.instance_id, cloud = ?id.cloud, preemptible = ?id.preemptible, "instance identity");
            st.set_identity(id);
        }
        Input::Source(SourceMessage::Event(e)) => {
            tracing::warn!(id = %e.id, kind = e.kind.name(), source = %e.source, deadline = ?e.deadline, "node event");
            events.push(e);
        }
        Input::Source(SourceMessage::Error { source, error }) => {
            tracing::debug!(source, %error, "metadata source error");
        }
        Input::Shutdown(ShutdownSignal::ShuttingDown { delivered, .. }) => {
            let e = NodeEvent::on_node(EventKind::ShuttingDown, "logind", st.boot_id(), Utc::now());
            tracing::warn!(id = %e.id, "node is shutting down");
            events.push(e);
            held.push(delivered);
        }
        Input::Shutdown(ShutdownSignal::Cancelled) => {
            let of =
                NodeEvent::on_node(EventKind::ShuttingDown, "logind", st.boot_id(), Utc::now()).id;
            tracing::info!(of = %of, "shutdown cancelled");
            events.push(NodeEvent::on_node(
                EventKind::Cancelled { of: of.clone() },
                "logind",
                &of,
                Utc::now(),
            ));
        }
        Input::Shutdown(other) => tracing::debug!(signal = ?other, "shutdown watcher"),
        Input::Labels(removals) => st.set_label_removals(removals),
        Input::Command(_) | Input::CommandResult(_) => {} // handled by the loop
    }
}

/// Where reports go: always the log; with `[report]`, the controller reporter too (events
/// separately: it queues and persists them until the controller acknowledges them).
struct Sink {
    reporter: Option<(watch::Sender<NodeReport>, mpsc::Sender<NodeEvent>)>,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Sink {
    /// Starts the reporter under a child of `shutdown`; [`Sink::stop`] waits for it (its queue
    /// is persisted when it ends).
    fn start(
        config: &AgentSections,
        opts: &AgentOptions,
        tx: mpsc::Sender<Input>,
        shutdown: &CancellationToken,
    ) -> Self {
        let stop = shutdown.child_token();
        let stop_rx = stop.clone();
        let mut sink = Sink {
            reporter: None,
            stop,
            task: None,
        };
        let Some(cfg) = config.report.clone() else {
            return sink;
        };
        let state_dir =
            crate::agent::crio::state::under_root(opts.root.as_deref(), &config.crio.state_dir);
        let reporter = match crate::agent::reporter::Reporter::new(cfg, &state_dir) {
            Ok(r) => r,
            Err(error) => {
                tracing::error!(%error, "reporter disabled: reports go to the log only");
                return sink;
            }
        };
        let (report_tx, report_rx) = watch::channel(
            AgentState::new(node_name(config), String::new(), String::new())
                .report(vec![], Utc::now()),
        );
        let (event_tx, event_rx) = mpsc::channel(256);
        let (cmd_tx, mut cmd_rx) = mpsc::channel(16);
        sink.task = Some(tokio::spawn(async move {
            let forward = async {
                while let Some(c) = cmd_rx.recv().await {
                    if tx.send(Input::Command(c)).await.is_err() {
                        break;
                    }
                }
            };
            tokio::join!(reporter.run(report_rx, event_rx, cmd_tx, stop_rx), forward);
        }));
        sink.reporter = Some((report_tx, event_tx));
        sink
    }

    async fn publish(&mut self, mut report: NodeReport) {
        log_report(&report);
        if let Some((report_tx, event_tx)) = &self.reporter {
            for e in std::mem::take(&mut report.events) {
                if event_tx.send(e).await.is_err() {
                    tracing::error!("reporter stopped: event not queued");
                }
            }
            let _ = report_tx.send(report);
        }
    }

    async fn stop(mut self) {
        self.stop.cancel();
        self.reporter = None;
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

/// How long a shutdown report handed to the reporter holds up the shutdown.
const SHUTDOWN_REPORT_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Releases each held shutdown `grace` from now.
fn release_after(held: impl IntoIterator<Item = Delivered>, grace: std::time::Duration) {
    for d in held {
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            d.done();
        });
    }
}

/// The longest a controller command may take before it is reported as failed.
const COMMAND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// `call`'s outcome, or a failure "`what` within 30s" once [`COMMAND_TIMEOUT`] has passed: a
/// hung bus or endpoint must not leave a command without a result forever.
async fn within_command_timeout<T>(
    what: &str,
    call: impl std::future::Future<Output = Result<T, String>>,
) -> Result<T, String> {
    tokio::time::timeout(COMMAND_TIMEOUT, call)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "{what} within {}",
                humantime::format_duration(COMMAND_TIMEOUT)
            ))
        })
}

/// How long the agent waits for a unit's restart job (within [`COMMAND_TIMEOUT`]).
const UNIT_RESTART_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(25);

/// A repair's `restart-unit` command: refused unless `unit` is in `allowed` (`[agent]
/// restart_units`); else the unit's failed state is reset (so systemd's start limit does not
/// refuse it) and it is restarted, waiting for the job. `Ok`: what happened; `Err`: the refusal
/// or failure, as the command's result says it.
pub async fn restart_unit<M: crate::agent::host::systemd::UnitManager>(
    systemd: &M,
    allowed: &[String],
    unit: &str,
) -> Result<String, String> {
    if !allowed.iter().any(|u| u == unit) {
        return Err(format!(
            "refused: {unit} is not in this agent's [agent] restart_units ({})",
            allowed.join(", ")
        ));
    }
    systemd
        .reset_failed(unit)
        .await
        .map_err(|e| crate::telemetry::error_chain(&e))?;
    let outcome = systemd
        .restart(unit, UNIT_RESTART_TIMEOUT)
        .await
        .map_err(|e| crate::telemetry::error_chain(&e))?;
    let state = format!(
        "job {}, {}/{}",
        outcome.job_result, outcome.status.active_state, outcome.status.sub_state
    );
    match outcome.succeeded() {
        true => Ok(format!("{unit} restarted: {state}")),
        false => Err(format!("{unit} restart failed: {state}")),
    }
}

/// Runs a controller command in the background; its result comes back as an input.
fn execute(cmd: crate::wire::AgentCommand, config: &AgentSections, tx: mpsc::Sender<Input>) {
    use crate::wire::{AgentCommand, CommandResult};
    let sources = config.sources.clone();
    let allowed = config.agent.restart_units.clone();
    tokio::spawn(async move {
        let (id, outcome) = match cmd {
            AgentCommand::Reboot { id, reason } => {
                tracing::warn!(%id, %reason, "rebooting on the controller's request");
                let call = async {
                    match Systemd::connect_system().await {
                        Ok(s) => s.reboot().await.map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    }
                };
                let r = within_command_timeout("systemd did not accept reboot.target", call).await;
                (id, r.map(|()| "reboot.target started".to_string()))
            }
            AgentCommand::RestartUnit { id, unit, reason } => {
                tracing::warn!(%id, %unit, %reason, "restarting a unit on the controller's request");
                let call = async {
                    match Systemd::connect_system().await {
                        Ok(s) => restart_unit(&s, &allowed, &unit).await,
                        Err(e) => Err(e.to_string()),
                    }
                };
                let what = format!("the restart of {unit} did not finish");
                (id, within_command_timeout(&what, call).await)
            }
            AgentCommand::AckScheduledEvent { id, event_id } => {
                let call = async {
                    crate::agent::sources::azure::ack_event(&sources, &event_id)
                        .await
                        .map_err(|e| e.to_string())
                };
                let what = format!("the approval of scheduled event {event_id} did not finish");
                let r = within_command_timeout(&what, call).await;
                (
                    id,
                    r.map(|()| format!("scheduled event {event_id} approved")),
                )
            }
        };
        let result = match outcome {
            Ok(message) => CommandResult {
                id,
                ok: true,
                message,
            },
            Err(message) => {
                tracing::error!(id = %id, %message, "command failed");
                CommandResult {
                    id,
                    ok: false,
                    message,
                }
            }
        };
        let _ = tx.send(Input::CommandResult(result)).await;
    });
}

/// The log form of a report: a summary at info, the whole report at debug.
fn log_report(report: &NodeReport) {
    tracing::info!(
        sequence = report.sequence,
        conditions = report.conditions.len(),
        events = report.events.len(),
        check_events = report.check_events.len(),
        problems = report.problems.len(),
        "node report"
    );
    if tracing::enabled!(tracing::Level::DEBUG) {
        tracing::debug!(report = %serde_json::to_string(report).unwrap_or_default(), "node report (full)");
    }
}

/// The background producers: the metadata source and the shutdown watcher.
struct Tasks {
    stop: CancellationToken,
    set: JoinSet<()>,
}

impl Tasks {
    /// Starts the producers under a child of `shutdown` (a reload stops them and starts new ones).
    fn spawn(
        config: &AgentSections,
        tx: mpsc::Sender<Input>,
        shutdown: &CancellationToken,
    ) -> Self {
        let stop = shutdown.child_token();
        let mut set = JoinSet::new();
        let (sources, tx1, stop1) = (config.sources.clone(), tx.clone(), stop.clone());
        set.spawn(async move { run_source(sources, tx1, stop1).await });
        if config.agent.shutdown_watcher {
            let options = WatcherOptions {
                max_delay: config.agent.shutdown_max_delay,
                ..WatcherOptions::default()
            };
            let (tx2, stop2) = (tx.clone(), stop.clone());
            set.spawn(async move { run_shutdown_watcher(options, tx2, stop2).await });
        }
        if !config.labels.cleanup.is_empty() {
            let (labels, node, stop3) = (config.labels.clone(), node_name(config), stop.clone());
            set.spawn(async move { run_label_rules(labels, node, tx, stop3).await });
        }
        Self { stop, set }
    }

    async fn stop(&mut self) {
        self.stop.cancel();
        while self.set.join_next().await.is_some() {}
    }
}

async fn run_source(
    cfg: crate::agent::sources::SourcesConfig,
    tx: mpsc::Sender<Input>,
    stop: CancellationToken,
) {
    let Some(cloud) = crate::agent::sources::detect::resolve(&cfg).await else {
        tracing::info!("no cloud metadata source (none detected or configured)");
        return;
    };
    let mut source = match crate::agent::sources::build(cloud, &cfg) {
        Ok(s) => s,
        Err(error) => {
            tracing::error!(%cloud, %error, "cannot start the metadata source");
            return;
        }
    };
    match source.identity().await {
        Ok(id) => {
            let _ = tx.send(Input::Identity(id)).await;
        }
        Err(error) => tracing::warn!(%cloud, %error, "cannot read the instance identity"),
    }
    let (msg_tx, mut msg_rx) = mpsc::channel(64);
    let driver = crate::agent::sources::driver::run(
        source,
        cfg.poll_interval,
        cfg.max_backoff,
        msg_tx,
        stop,
    );
    let forward = async {
        while let Some(m) = msg_rx.recv().await {
            if tx.send(Input::Source(m)).await.is_err() {
                break;
            }
        }
    };
    tokio::join!(driver, forward);
}

async fn run_label_rules(
    cfg: crate::agent::labels::LabelsConfig,
    node: String,
    tx: mpsc::Sender<Input>,
    stop: CancellationToken,
) {
    use crate::agent::labels::{self, PatchRemover, RemovalMode};
    let rules = match labels::compile(&cfg) {
        Ok(r) => r,
        Err(error) => return tracing::error!(%error, "label rules disabled"),
    };
    // In a pod: the service account token under /var/run/secrets/kubernetes.io/serviceaccount/;
    // elsewhere: KUBECONFIG (kube's own resolution). Rules are configured, so no client is an error.
    let client = match crate::k8s::client::config(None, None, "agent")
        .await
        .and_then(crate::k8s::client::client)
    {
        Ok(c) => c,
        Err(error) => {
            return tracing::error!(
                %error,
                rules = rules.len(),
                "label rules disabled: no Kubernetes API client (in a pod: is the service account \
                 token mounted at /var/run/secrets/kubernetes.io/serviceaccount/?)"
            )
        }
    };
    let remover = (cfg.mode == RemovalMode::Direct).then(|| PatchRemover::new(client.clone()));
    let (l_tx, mut l_rx) = mpsc::channel(8);
    let forward = async {
        while let Some(r) = l_rx.recv().await {
            if tx.send(Input::Labels(r)).await.is_err() {
                break;
            }
        }
    };
    tokio::join!(
        labels::watch(client, node, rules, remover, l_tx, stop),
        forward
    );
}

async fn run_shutdown_watcher(
    options: WatcherOptions,
    tx: mpsc::Sender<Input>,
    stop: CancellationToken,
) {
    let watcher = match ShutdownWatcher::connect_system(options).await {
        Ok(w) => w,
        Err(error) => {
            tracing::warn!(%error, "shutdown watcher unavailable: node shutdowns are not reported ahead");
            return;
        }
    };
    let (sig_tx, mut sig_rx) = mpsc::channel(8);
    let forward = async {
        while let Some(s) = sig_rx.recv().await {
            if tx.send(Input::Shutdown(s)).await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        r = watcher.run(sig_tx) => if let Err(error) = r { tracing::warn!(%error, "shutdown watcher stopped") },
        _ = forward => {}
        _ = stop.cancelled() => {}
    }
}

/// `[node] name`, else the host name.
pub fn node_name(config: &AgentSections) -> String {
    if !config.node.name.is_empty() {
        return config.node.name.clone();
    }
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown".to_string())
}

/// The kernel's boot id under the checks' host root (empty if unreadable).
pub fn boot_id(config: &AgentSections) -> String {
    let p = config
        .checks
        .host_root
        .join("proc/sys/kernel/random/boot_id");
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn instance_id() -> String {
    use rand::Rng;
    hex::encode(rand::rng().random::<[u8; 8]>())
}

/// Re-reads the configuration; an invalid file is logged and the running configuration kept.
fn reload(load: Load, path: &Path, env: &Env) -> Option<AgentSections> {
    match load(path, env) {
        Ok(l) => {
            for w in &l.warnings {
                tracing::warn!(diagnostic = %w.render(path), "configuration warning");
            }
            Some(l.config)
        }
        Err(e) => {
            tracing::error!(config = %path.display(), error = %e, "new configuration is invalid: keeping the running one");
            None
        }
    }
}

/// Content hash of the config file (None when unreadable), to notice edits and replacements.
fn file_fingerprint(path: &Path) -> Option<String> {
    std::fs::read(path)
        .ok()
        .map(|b| crate::agent::crio::state::digest(&b))
}

/// sha256 over the declared drop-ins (name and rendered content), to compare nodes.
pub fn crio_config_hash(config: &AgentSections) -> String {
    let mut bytes = Vec::new();
    for d in &config.crio.dropins {
        bytes.extend_from_slice(d.name.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(&apply::render(d));
        bytes.push(0);
    }
    crate::agent::crio::state::digest(&bytes)
}

async fn apply_crio(config: &AgentSections, opts: &AgentOptions, st: &mut AgentState) {
    let aopts = ApplyOptions {
        root: opts.root.clone(),
        dry_run: false,
    };
    let (report, result) = apply::apply(&config.crio, &aopts, Systemd::connect_system).await;
    match &result {
        Ok(()) if report.changed => tracing::info!(
            files = report.files.len(),
            restarted = report.restarted,
            unit_state = %report.unit_state,
            "CRI-O drop-ins applied"
        ),
        Ok(()) => tracing::debug!("CRI-O drop-ins unchanged"),
        Err(e) => {
            tracing::error!(error = %crate::telemetry::error_chain(e), rolled_back = report.rolled_back, "CRI-O apply failed")
        }
    }
    st.set_crio(crio_config_hash(config), &report, &result, Utc::now());
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;

    /// A command that never answers fails after exactly [`COMMAND_TIMEOUT`], saying so; one that
    /// answers just before it keeps its own outcome.
    #[tokio::test(start_paused = true)]
    async fn a_hung_command_fails_after_exactly_the_command_timeout() {
        let t0 = Instant::now();
        let r: Result<(), String> =
            within_command_timeout("systemd did not answer", std::future::pending()).await;
        assert_eq!(t0.elapsed(), COMMAND_TIMEOUT);
        assert_eq!(r.unwrap_err(), "systemd did not answer within 30s");
        let just_in_time = async {
            tokio::time::sleep(COMMAND_TIMEOUT - Duration::from_millis(1)).await;
            Ok(7)
        };
        assert_eq!(within_command_timeout("x", just_in_time).await, Ok(7));
    }

    /// The loop's timers on paused time: both fire at start, then every period; a round that
    /// overruns delays the next one a whole period (no burst of missed rounds); a reload's
    /// timers take the new periods and keep that rule.
    #[tokio::test(start_paused = true)]
    async fn check_rounds_and_config_polls_come_once_per_period_and_never_bunch_up() {
        // When a tick is taken (`tick()` returns the instant it was due, not when it fired).
        async fn fired(i: &mut tokio::time::Interval, t0: Instant) -> Duration {
            i.tick().await;
            t0.elapsed()
        }
        let mut config = AgentSections::default();
        config.checks.interval = Duration::from_secs(10);
        config.agent.config_poll_interval = Duration::from_secs(3);
        let t0 = Instant::now();
        let mut ticks = Ticks::new(&config);
        assert_eq!(
            fired(&mut ticks.check, t0).await,
            Duration::ZERO,
            "at start"
        );
        assert_eq!(fired(&mut ticks.file, t0).await, Duration::ZERO, "at start");
        let mut polls = Vec::new();
        for _ in 0..3 {
            polls.push(fired(&mut ticks.file, t0).await);
        }
        assert_eq!(polls, [3, 6, 9].map(Duration::from_secs));
        assert_eq!(fired(&mut ticks.check, t0).await, Duration::from_secs(10));
        // A round that takes 25 s (two and a half periods): the missed round at once, then the
        // next a whole period later.
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert_eq!(fired(&mut ticks.check, t0).await, Duration::from_secs(35));
        assert_eq!(fired(&mut ticks.check, t0).await, Duration::from_secs(45));
        // Reloaded with other periods: at once, then by the new ones, with the same rule.
        config.checks.interval = Duration::from_secs(4);
        let t1 = Instant::now();
        let mut ticks = Ticks::new(&config);
        assert_eq!(fired(&mut ticks.check, t1).await, Duration::ZERO);
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert_eq!(fired(&mut ticks.check, t1).await, Duration::from_secs(9));
        assert_eq!(fired(&mut ticks.check, t1).await, Duration::from_secs(13));
    }

    /// A shutdown held for its report is released `grace` later, not before.
    #[tokio::test(start_paused = true)]
    async fn a_held_shutdown_is_released_after_the_grace() {
        let (d, mut released) = Delivered::pair();
        release_after([d], SHUTDOWN_REPORT_GRACE);
        tokio::time::sleep(SHUTDOWN_REPORT_GRACE - Duration::from_millis(1)).await;
        assert!(released.try_recv().is_err(), "released early");
        tokio::time::sleep(Duration::from_millis(1)).await;
        tokio::task::yield_now().await;
        assert!(released.try_recv().is_ok(), "not released at the grace");
    }
}

#[cfg(test)]
mod restart_unit_tests {
    use super::restart_unit;
    use crate::agent::host::fake::{FakeCall, FakeUnitManager};

    fn allowed() -> Vec<String> {
        crate::agent::config::DEFAULT_RESTART_UNITS
            .iter()
            .map(|u| u.to_string())
            .collect()
    }

    #[tokio::test]
    async fn only_allow_listed_units_are_restarted_and_a_refusal_says_why() {
        let fake = FakeUnitManager::new()
            .with_unit("kubelet.service", FakeUnitManager::failed())
            .with_unit("sshd.service", FakeUnitManager::active());
        let e = restart_unit(&fake, &allowed(), "sshd.service")
            .await
            .unwrap_err();
        assert!(
            e.contains("refused") && e.contains("kubelet.service, crio.service"),
            "{e}"
        );
        assert!(fake.calls().is_empty(), "nothing asked of systemd");
        let ok = restart_unit(&fake, &allowed(), "kubelet.service")
            .await
            .unwrap();
        assert!(ok.starts_with("kubelet.service restarted"), "{ok}");
        assert!(
            matches!(&fake.calls()[0], FakeCall::ResetFailed { unit } if unit == "kubelet.service")
        );
        assert_eq!(fake.restarts("kubelet.service"), 1);
        fake.push_restart(Ok(FakeUnitManager::failed_restart()));
        let e = restart_unit(&fake, &allowed(), "kubelet.service")
            .await
            .unwrap_err();
        assert!(e.contains("restart failed"), "{e}");
    }
}

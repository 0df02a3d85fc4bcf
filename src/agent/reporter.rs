//! The agent's reporter: delivers the agent's [`NodeReport`] to the controller and hands the
//! controller's commands back.
//!
//! # Wiring (for `agent::run`)
//! ```text
//! let reporter = Reporter::new(config.report.clone().unwrap(), &state_dir)?;   // loads the persisted queue
//! let (report_tx, report_rx) = tokio::sync::watch::channel(initial_report);    // latest full state
//! let (event_tx, event_rx) = tokio::sync::mpsc::channel(256);                    // NodeEvents as they appear
//! let (cmd_tx, cmd_rx) = tokio::sync::mpsc::channel(16);                        // commands to execute
//! tokio::spawn(reporter.run(report_rx, event_rx, cmd_tx, shutdown_rx));
//! ```
//! - `report_tx.send(..)` whenever conditions, CRI-O state, label-removal requests or command
//!   results change; the reporter fills in `agent_instance`, `sequence` and `events` itself.
//! - Sends happen on change (at most every 200 ms) and every `heartbeat` (default 10 s); failures
//!   back off exponentially with jitter up to `backoff_max`.
//! - Events sent on `event_tx` are queued until the controller acknowledges their id. The queue is
//!   bounded (`max_queued_events`; the oldest is dropped with an error log when full — never while
//!   under the bound) and persisted to `<state_dir>/reporter-events.json` after every change, so a
//!   restarted agent resends them. Ids are deterministic, so duplicates are harmless.
//! - Commands are forwarded on `cmd_tx` at most once per id; ids are persisted to
//!   `<state_dir>/reporter-commands.json` before forwarding (so a command runs at most once even
//!   across restarts). The executor reports results through `NodeReport::command_results`.
//! - TLS: only the CA in `ca_file` is trusted and the certificate must be valid for `server_name`
//!   (independent of the host in `url`), so commands are accepted only from that controller.
//! - The projected service-account token is re-read from `token_file` for every request (kubelet
//!   rotates it in place).
//! - `shutdown` set to `true` (or dropped) ends `run` after persisting the queue.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::agent::sources::NodeEvent;
use crate::cfg_path;
use crate::config::Diagnostic;
use crate::report::{AgentCommand, CommandResult, NodeReport, ReportResponse};

const MIN_INTERVAL: Duration = Duration::from_millis(200);
/// The unacknowledged events, persisted in the state directory (a JSON array).
pub const EVENTS_FILE: &str = "reporter-events.json";
const COMMANDS_FILE: &str = "reporter-commands.json";
const REMEMBERED_COMMANDS: usize = 1000;

/// `[report]`: where and how the agent reports.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ReporterConfig {
    /// Controller base URL, e.g. `https://nodekeeper-controller.nodekeeper.svc:8443`.
    pub url: String,
    /// PEM CA certificate(s) the controller's certificate must chain to (required for https).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// The name the controller's certificate must carry (default: the host of `url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    /// The projected service-account token (audience `nodekeeper`).
    pub token_file: PathBuf,
    /// Report at least this often.
    #[serde(with = "humantime_serde")]
    pub heartbeat: Duration,
    /// Timeout of one request.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Longest wait between retries while the controller is unreachable.
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
    /// Unacknowledged events kept (and persisted) at most.
    pub max_queued_events: usize,
}

impl Default for ReporterConfig {
    fn default() -> Self {
        ReporterConfig {
            url: "https://nodekeeper-controller.nodekeeper.svc:8443".into(),
            ca_file: Some("/var/run/secrets/nodekeeper/ca.crt".into()),
            server_name: None,
            token_file: "/var/run/secrets/nodekeeper/token".into(),
            heartbeat: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            backoff_max: Duration::from_secs(30),
            max_queued_events: 1000,
        }
    }
}

impl ReporterConfig {
    /// Semantic checks.
    pub fn validate(&self) -> Vec<Diagnostic> {
        let mut d = Vec::new();
        match reqwest::Url::parse(&self.url) {
            Ok(u) if u.scheme() == "https" && self.ca_file.is_none() => d.push(Diagnostic::error(
                cfg_path!["report", "ca_file"],
                "required for an https:// controller URL (the controller's CA is pinned)",
            )),
            Ok(u) if u.scheme() == "https" || u.scheme() == "http" => {}
            _ => d.push(Diagnostic::error(
                cfg_path!["report", "url"],
                format!("`{}` must be an https:// (or http://) URL", self.url),
            )),
        }
        for (k, v) in [
            ("heartbeat", self.heartbeat),
            ("timeout", self.timeout),
            ("backoff_max", self.backoff_max),
        ] {
            if v.is_zero() {
                d.push(Diagnostic::error(
                    cfg_path!["report", k],
                    "must be greater than zero",
                ));
            }
        }
        if self.max_queued_events == 0 {
            d.push(Diagnostic::error(
                cfg_path!["report", "max_queued_events"],
                "must be greater than zero",
            ));
        }
        d
    }
}

/// Reporter failures.
#[derive(Debug, thiserror::Error)]
pub enum ReporterError {
    /// The controller URL does not parse.
    #[error("controller URL {url}: {source}")]
    Url {
        /// URL.
        url: String,
        /// Cause.
        #[source]
        source: url::ParseError,
    },
    /// No client for the controller URL (CA file, server name, TLS setup).
    #[error("controller URL {url}: {source}")]
    Client {
        /// URL.
        url: String,
        /// Cause.
        #[source]
        source: crate::http::TlsError,
    },
    /// The token file cannot be read.
    #[error("token file {path}: {source}")]
    Token {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The report cannot be encoded.
    #[error("encoding the report: {0}")]
    Encode(#[source] serde_json::Error),
    /// The request failed (connect, TLS, timeout, body).
    #[error("{url}: {source}")]
    Transport {
        /// URL.
        url: String,
        /// Cause.
        #[source]
        source: reqwest::Error,
    },
    /// The controller refused the report.
    #[error("POST {url}: HTTP {status}: {body}")]
    Status {
        /// URL.
        url: String,
        /// Status code.
        status: u16,
        /// Body (truncated).
        body: String,
    },
    /// The controller's answer is not a report response.
    #[error("POST {url}: invalid response: {source}")]
    Response {
        /// URL.
        url: String,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
    /// The state file cannot be written.
    #[error("state file {path}: {source}")]
    State {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A durable write of a state file failed (names the file and the step).
    #[error(transparent)]
    Write(#[from] crate::agent::fsops::FsError),
}

/// Delivers reports; see the module docs.
#[derive(Debug)]
pub struct Reporter {
    cfg: ReporterConfig,
    state_dir: PathBuf,
    client: reqwest::Client,
    /// The URL requested (the configured one, with `server_name` as its host when they differ).
    target: reqwest::Url,
    /// `<url>/v1/reports` as configured, for errors.
    endpoint: String,
    instance: String,
    sequence: u64,
    queue: VecDeque<NodeEvent>,
    executed: VecDeque<String>,
    /// Ids already executed when this reporter started (by an earlier agent process).
    earlier: std::collections::HashSet<String>,
    /// Commands the controller still sends that an earlier agent process ran: their results were
    /// lost with that process, so each report answers them (else the controller resends forever).
    replayed: Vec<String>,
}

impl Reporter {
    /// A reporter for `cfg`, persisting into `state_dir` (created if missing).
    pub fn new(cfg: ReporterConfig, state_dir: &Path) -> Result<Self, ReporterError> {
        let endpoint = format!("{}/v1/reports", cfg.url.trim_end_matches('/'));
        let (client, target) = client(&cfg, &endpoint)?;
        std::fs::create_dir_all(state_dir).map_err(|source| ReporterError::State {
            path: state_dir.to_path_buf(),
            source,
        })?;
        let queue: VecDeque<NodeEvent> =
            load_json(&state_dir.join(EVENTS_FILE)).unwrap_or_default();
        let executed: VecDeque<String> =
            load_json(&state_dir.join(COMMANDS_FILE)).unwrap_or_default();
        let raw: [u8; 8] = rand::rng().random();
        Ok(Reporter {
            endpoint,
            target,
            cfg,
            state_dir: state_dir.to_path_buf(),
            client,
            instance: hex::encode(raw),
            sequence: 0,
            queue,
            earlier: executed.iter().cloned().collect(),
            executed,
            replayed: Vec::new(),
        })
    }

    /// Unacknowledged events, oldest first.
    pub fn queued(&self) -> impl Iterator<Item = &NodeEvent> {
        self.queue.iter()
    }

    fn enqueue(&mut self, ev: NodeEvent) {
        if self.queue.iter().any(|e| e.id == ev.id) {
            return;
        }
        if self.queue.len() >= self.cfg.max_queued_events {
            if let Some(old) = self.queue.pop_front() {
                tracing::error!(id = %old.id, kind = old.kind.name(), "report queue full: dropped the oldest event");
            }
        }
        self.queue.push_back(ev);
        self.persist_queue();
    }

    fn persist_queue(&self) {
        let path = self.state_dir.join(EVENTS_FILE);
        if let Err(e) = store_json(&path, &self.queue) {
            tracing::warn!(error = %e, "cannot persist the event queue");
        }
    }

    /// Sends one report built from `latest`; applies the acknowledgements.
    pub async fn send_once(
        &mut self,
        latest: &NodeReport,
    ) -> Result<ReportResponse, ReporterError> {
        let token = std::fs::read_to_string(&self.cfg.token_file).map_err(|source| {
            ReporterError::Token {
                path: self.cfg.token_file.clone(),
                source,
            }
        })?;
        self.sequence += 1;
        let mut report = latest.clone();
        report.agent_instance = self.instance.clone();
        report.sequence = self.sequence;
        report.events.extend(self.queue.iter().cloned());
        self.answer_replayed(&mut report);
        let body = serde_json::to_vec(&report).map_err(ReporterError::Encode)?;
        let transport = |source| ReporterError::Transport {
            url: self.endpoint.clone(),
            source,
        };
        let resp = self
            .client
            .post(self.target.clone())
            .bearer_auth(token.trim())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .map_err(transport)?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.map_err(transport)?;
        if !(200..300).contains(&status) {
            return Err(ReporterError::Status {
                url: self.endpoint.clone(),
                status,
                body: crate::agent::sources::truncate(&String::from_utf8_lossy(&bytes), 300),
            });
        }
        let out: ReportResponse =
            serde_json::from_slice(&bytes).map_err(|source| ReporterError::Response {
                url: self.endpoint.clone(),
                source,
            })?;
        let before = self.queue.len();
        self.queue
            .retain(|e| !out.acknowledged_events.contains(&e.id));
        if self.queue.len() != before {
            self.persist_queue();
        }
        Ok(out)
    }

    /// Adds a result for every command an earlier agent process ran and the controller still
    /// sends (unless the report already carries one).
    fn answer_replayed(&self, report: &mut NodeReport) {
        for id in &self.replayed {
            if !report.command_results.iter().any(|r| &r.id == id) {
                report.command_results.push(CommandResult {
                    id: id.clone(),
                    ok: true,
                    message: "already run by an earlier agent process (before a restart or \
                              reboot); not run again"
                        .into(),
                });
            }
        }
    }

    /// Records new command ids (persisted first) and returns the commands not seen before.
    fn fresh_commands(&mut self, cmds: Vec<AgentCommand>) -> Vec<AgentCommand> {
        let mut out = Vec::new();
        self.replayed.clear();
        for c in cmds {
            let id = match &c {
                AgentCommand::Reboot { id, .. } | AgentCommand::AckScheduledEvent { id, .. } => {
                    id.clone()
                }
            };
            if self.executed.contains(&id) {
                tracing::debug!(%id, "command already executed: not running it again");
                // Run by this process: the agent loop reports its real result.
                if self.earlier.contains(&id) {
                    self.replayed.push(id);
                }
                continue;
            }
            self.executed.push_back(id);
            while self.executed.len() > REMEMBERED_COMMANDS {
                self.executed.pop_front();
            }
            out.push(c);
        }
        if !out.is_empty() {
            if let Err(e) = store_json(&self.state_dir.join(COMMANDS_FILE), &self.executed) {
                tracing::error!(error = %e, "cannot persist command ids: not running the commands");
                return vec![];
            }
        }
        out
    }

    fn backoff(&self, failures: u32) -> Duration {
        crate::backoff::delay(
            Duration::from_millis(500),
            self.cfg.backoff_max,
            failures.saturating_add(1),
        )
    }

    /// Runs until `shutdown`; see the module docs.
    pub async fn run(
        mut self,
        mut rx: watch::Receiver<NodeReport>,
        mut events: mpsc::Receiver<NodeEvent>,
        commands_tx: mpsc::Sender<AgentCommand>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut next = Instant::now();
        let mut last_send: Option<Instant> = None;
        let mut failures: u32 = 0;
        let (mut rx_open, mut ev_open) = (true, true);
        loop {
            let soon = |last: Option<Instant>| {
                last.map_or(Instant::now(), |l| (l + MIN_INTERVAL).max(Instant::now()))
            };
            tokio::select! {
                r = shutdown.changed() => if r.is_err() || *shutdown.borrow() { break },
                r = rx.changed(), if rx_open => match r {
                    Ok(()) => {
                        // Mark the value seen (else `changed()` fires again at once); sends read the latest.
                        rx.borrow_and_update();
                        if failures == 0 {
                            next = next.min(soon(last_send));
                        }
                    }
                    Err(_) => rx_open = false,
                },
                e = events.recv(), if ev_open => match e {
                    Some(ev) => {
                        self.enqueue(ev);
                        if failures == 0 { next = next.min(soon(last_send)); }
                    }
                    None => ev_open = false,
                },
                _ = tokio::time::sleep_until(next) => {
                    let latest = rx.borrow_and_update().clone();
                    last_send = Some(Instant::now());
                    match self.send_once(&latest).await {
                        Ok(resp) => {
                            if failures > 0 {
                                tracing::info!(after = failures, queued = self.queue.len(), "controller reachable again");
                            }
                            failures = 0;
                            next = Instant::now() + self.cfg.heartbeat;
                            for c in self.fresh_commands(resp.commands) {
                                if commands_tx.send(c).await.is_err() {
                                    tracing::warn!("command receiver closed");
                                }
                            }
                        }
                        Err(e) => {
                            failures = failures.saturating_add(1);
                            if failures == 1 || failures % 10 == 0 {
                                tracing::warn!(error = crate::telemetry::error_chain(&e), failures, queued = self.queue.len(), "report not delivered; degraded mode");
                            }
                            next = Instant::now() + self.backoff(failures);
                        }
                    }
                }
            }
        }
        self.persist_queue();
    }
}

fn load_json<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    let text = std::fs::read(path).ok()?;
    match serde_json::from_slice(&text) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "ignoring an unreadable state file");
            None
        }
    }
}

fn store_json<T: Serialize>(path: &Path, v: &T) -> Result<(), ReporterError> {
    let st = |source| ReporterError::State {
        path: path.to_path_buf(),
        source,
    };
    let text = serde_json::to_vec(v).map_err(|e| st(std::io::Error::other(e)))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    Ok(crate::agent::fsops::atomic_write(path, &text, dir)?)
}

/// The client for `cfg` and the URL to request for `endpoint`: with `ca_file`, only that CA is
/// trusted and the certificate must be valid for `server_name` (default: the URL's host); without
/// it, the system's roots (plain `http://` URLs also work: tests, local demos). Requests time out
/// after `timeout` (connect to last body byte); idle connections are kept for 60 s.
fn client(
    cfg: &ReporterConfig,
    endpoint: &str,
) -> Result<(reqwest::Client, reqwest::Url), ReporterError> {
    let target = reqwest::Url::parse(endpoint).map_err(|source| ReporterError::Url {
        url: cfg.url.clone(),
        source,
    })?;
    let tls = |source| ReporterError::Client {
        url: cfg.url.clone(),
        source,
    };
    let builder = match &cfg.ca_file {
        Some(ca) => crate::http::pinned_builder(ca).map_err(tls)?,
        None => crate::http::builder(None).map_err(tls)?.no_proxy(),
    };
    let (builder, target) = match (&cfg.server_name, target.scheme()) {
        (Some(name), "https") => {
            crate::http::pin_server_name(builder, &target, name).map_err(tls)?
        }
        _ => (builder, target),
    };
    let client = builder
        .timeout(cfg.timeout)
        .pool_idle_timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| tls(e.into()))?;
    Ok((client, target))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::sources::EventKind;

    fn ev(id: &str) -> NodeEvent {
        NodeEvent {
            version: 1,
            id: id.into(),
            kind: EventKind::Maintenance,
            cloud: None,
            source: "t".into(),
            not_before: None,
            deadline: None,
            detected_at: chrono::Utc::now(),
            detail: Default::default(),
        }
    }

    fn empty_report() -> NodeReport {
        crate::agent::state::AgentState::new("n".into(), "i".into(), "b".into())
            .report(vec![], chrono::Utc::now())
    }

    #[test]
    fn queue_is_bounded_deduplicated_and_persisted_and_commands_run_once() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = ReporterConfig {
            url: "http://127.0.0.1:9".into(),
            ca_file: None,
            max_queued_events: 2,
            ..Default::default()
        };
        let mut r = Reporter::new(cfg.clone(), dir.path()).unwrap();
        for id in ["a", "b", "b", "c"] {
            r.enqueue(ev(id));
        }
        let ids: Vec<&str> = r.queued().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, vec!["b", "c"]);
        let reboot = |id: &str| AgentCommand::Reboot {
            id: id.into(),
            reason: "x".into(),
        };
        assert_eq!(r.fresh_commands(vec![reboot("r1"), reboot("r1")]).len(), 1);
        assert!(r.fresh_commands(vec![reboot("r1")]).is_empty());
        let mut report = empty_report();
        r.answer_replayed(&mut report);
        assert!(
            report.command_results.is_empty(),
            "run by this process: the agent loop reports the real result"
        );
        let left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "every write renamed into place: {left:?}");
        let mut again = Reporter::new(cfg, dir.path()).unwrap();
        let ids: Vec<&str> = again.queued().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, vec!["b", "c"], "queue reloaded from state_dir");
        assert!(
            again.fresh_commands(vec![reboot("r1")]).is_empty(),
            "command ids survive restarts"
        );
        let mut report = empty_report();
        again.answer_replayed(&mut report);
        assert_eq!(report.command_results.len(), 1);
        assert_eq!(
            (
                report.command_results[0].id.as_str(),
                report.command_results[0].ok
            ),
            ("r1", true)
        );
        assert_eq!(again.fresh_commands(vec![reboot("r2")]).len(), 1);
        let mut report = empty_report();
        again.answer_replayed(&mut report);
        assert!(
            report.command_results.is_empty(),
            "no longer sent by the controller: no longer answered"
        );
    }

    #[test]
    fn config_requires_a_ca_for_https() {
        let c = ReporterConfig {
            ca_file: None,
            ..Default::default()
        };
        assert_eq!(c.validate().len(), 1);
        assert!(ReporterConfig::default().validate().is_empty());
    }
}

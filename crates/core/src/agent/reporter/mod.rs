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
//! - Connections: closed after `idle_timeout` (1 s) without a report (the controller closes them
//!   after its own `idle_timeout`, 3 s), so none is held between heartbeats; a reconnection
//!   resumes the TLS session (ticket).
//! - TLS: only the CA in `ca_file` is trusted and the certificate must be valid for `server_name`
//!   (independent of the host in `url`), so commands are accepted only from that controller.
//! - The projected service-account token is re-read from `token_file` for every request (kubelet
//!   rotates it in place).
//! - `shutdown` set to `true` (or dropped) ends `run` after persisting the queue.

mod config;
mod queue;

use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::Rng;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

pub use config::ReporterConfig;
pub use queue::EVENTS_FILE;

use crate::agent::sources::NodeEvent;
use crate::wire::{AgentCommand, NodeReport, ReportResponse};
use queue::Queue;

const MIN_INTERVAL: Duration = Duration::from_millis(200);

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
    client: reqwest::Client,
    /// The URL requested (the configured one, with `server_name` as its host when they differ).
    target: reqwest::Url,
    /// `<url>/v1/reports` as configured, for errors.
    endpoint: String,
    instance: String,
    sequence: u64,
    queue: Queue,
}

impl Reporter {
    /// A reporter for `cfg`, persisting into `state_dir` (created if missing).
    pub fn new(cfg: ReporterConfig, state_dir: &Path) -> Result<Self, ReporterError> {
        let endpoint = format!("{}/v1/reports", cfg.url.trim_end_matches('/'));
        let (client, target) = client(&cfg, &endpoint)?;
        let queue = Queue::load(state_dir, cfg.max_queued_events)?;
        let raw: [u8; 8] = rand::rng().random();
        Ok(Reporter {
            endpoint,
            target,
            cfg,
            client,
            instance: hex::encode(raw),
            sequence: 0,
            queue,
        })
    }

    /// Unacknowledged events, oldest first.
    pub fn queued(&self) -> impl Iterator<Item = &NodeEvent> {
        self.queue.events()
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
        report.events.extend(self.queue.events().cloned());
        self.queue.answer_replayed(&mut report);
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
        self.queue.acknowledge(&out.acknowledged_events);
        Ok(out)
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
                        self.queue.enqueue(ev);
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
                            for c in self.queue.fresh_commands(resp.commands) {
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
        self.queue.persist();
    }
}

/// The client for `cfg` and the URL to request for `endpoint`: with `ca_file`, only that CA is
/// trusted and the certificate must be valid for `server_name` (default: the URL's host); without
/// it, the system's roots (plain `http://` URLs also work: tests, local demos). Requests time out
/// after `timeout` (connect to last body byte). A connection is kept for `idle_timeout` (1 s)
/// after a report (a burst of changes reuses it), then closed: the controller holds no
/// connection between heartbeats, and the next report reconnects, resuming the TLS session (the
/// client's rustls config, built once, keeps the session tickets). Below the controller's
/// `idle_timeout` (3 s), so the agent closes an idle connection before the server does and never
/// sends a report into one the server is closing.
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
        .pool_idle_timeout(cfg.idle_timeout)
        .build()
        .map_err(|e| tls(e.into()))?;
    Ok((client, target))
}

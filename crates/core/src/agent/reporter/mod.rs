//! The agent's reporter: delivers the agent's [`NodeReport`] to the controller and hands the
//! controller's commands back.
//!
//! # Wiring (for `agent::run`)
//! ```text
//! let reporter = Reporter::new(config.report.clone().unwrap(), &state_dir)?;   // loads the persisted queue
//! let (report_tx, report_rx) = tokio::sync::watch::channel(initial_report);    // latest full state
//! let (event_tx, event_rx) = tokio::sync::mpsc::channel(256);                    // NodeEvents as they appear
//! let (cmd_tx, cmd_rx) = tokio::sync::mpsc::channel(16);                        // commands to execute
//! tokio::spawn(reporter.run(report_rx, event_rx, cmd_tx, shutdown.child_token())); // a CancellationToken
//! ```
//! - `report_tx.send(..)` whenever conditions, CRI-O state, label-removal requests or command
//!   results change; the reporter fills in `agent_instance`, `sequence` and `events` itself.
//! - Sends happen on change (at most every 200 ms), at once for a new event (a notice waits for
//!   no spacing), and every `heartbeat` (default 10 s); failures
//!   back off exponentially with jitter up to `backoff_max`, or wait 1–2× the `Retry-After` of a
//!   controller shedding load when that is longer.
//! - Events sent on `event_tx` are queued until the controller acknowledges their id. The queue is
//!   bounded (`max_queued_events`; the oldest is dropped with an error log when full — never while
//!   under the bound) and persisted to `<state_dir>/reporter-events.json` after every change, so a
//!   restarted agent resends them. Ids are deterministic, so duplicates are harmless. The file is
//!   written on a blocking thread while the report goes out (a notice's report does not wait for
//!   the disk); writes finishing out of order leave the latest state, and `run` ends with one.
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
//! - `shutdown` cancelled (a child of the agent's one shutdown token) ends `run` after persisting
//!   the queue.
//! - The exchange itself goes through a [`ReportTransport`] (`transport/`: the HTTPS one and a
//!   fake for the loop's tests on tokio's paused clock).

mod config;
mod queue;
pub mod transport;

use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::Rng;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

pub use config::ReporterConfig;
pub use queue::EVENTS_FILE;
pub use transport::ReportTransport;

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
        /// Cause (a `reqwest::Error` from the real transport).
        #[source]
        source: transport::TransportError,
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
        /// The answer's `Retry-After` (a controller shedding load): the next try waits at least this.
        retry_after: Option<Duration>,
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
    transport: Box<dyn ReportTransport>,
    /// `<url>/v1/reports` as configured, for errors.
    endpoint: String,
    instance: String,
    sequence: u64,
    queue: Queue,
}

impl Reporter {
    /// A reporter for `cfg`, persisting into `state_dir` (created if missing).
    pub fn new(cfg: ReporterConfig, state_dir: &Path) -> Result<Self, ReporterError> {
        let transport = transport::http::HttpTransport::new(&cfg, &cfg.endpoint())?;
        Self::with_transport(cfg, state_dir, Box::new(transport))
    }

    /// A reporter sending through `transport` (the loop's tests use a fake one).
    pub fn with_transport(
        cfg: ReporterConfig,
        state_dir: &Path,
        transport: Box<dyn ReportTransport>,
    ) -> Result<Self, ReporterError> {
        let endpoint = cfg.endpoint();
        let queue = Queue::load(state_dir, cfg.max_queued_events)?;
        let raw: [u8; 8] = rand::rng().random();
        Ok(Reporter {
            endpoint,
            cfg,
            transport,
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
        let answer = self
            .transport
            .post(token.trim(), body)
            .await
            .map_err(|source| ReporterError::Transport {
                url: self.endpoint.clone(),
                source,
            })?;
        let (status, bytes) = (answer.status, answer.body);
        if !(200..300).contains(&status) {
            return Err(ReporterError::Status {
                retry_after: answer.retry_after,
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
        if self.queue.acknowledge(&out.acknowledged_events) {
            self.persist_later();
        }
        Ok(out)
    }

    /// Writes the event queue as it is now on a thread that may block, so that the report
    /// carrying a new event does not wait for the disk (two fsyncs; on a busy node's disk they
    /// can take longer than the whole exchange with the controller).
    fn persist_later(&mut self) {
        let write = self.queue.events_write();
        tokio::task::spawn_blocking(move || write.run());
    }

    /// The wait after `failures` failures in a row, the last one `e`: the backoff, or when the
    /// controller asked for more (`Retry-After`, capped at `backoff_max`), between one and two
    /// times that, so agents turned away together do not come back together.
    fn backoff(&self, failures: u32, e: &ReporterError) -> Duration {
        let backoff = crate::backoff::delay(
            Duration::from_millis(500),
            self.cfg.backoff_max,
            failures.saturating_add(1),
        );
        match e {
            ReporterError::Status {
                retry_after: Some(asked),
                ..
            } => {
                let asked = (*asked).min(self.cfg.backoff_max);
                backoff.max(asked + asked.mul_f64(rand::rng().random::<f64>()))
            }
            _ => backoff,
        }
    }

    /// Runs until `shutdown`; see the module docs.
    pub async fn run(
        mut self,
        mut rx: watch::Receiver<NodeReport>,
        mut events: mpsc::Receiver<NodeEvent>,
        commands_tx: mpsc::Sender<AgentCommand>,
        shutdown: tokio_util::sync::CancellationToken,
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
                _ = shutdown.cancelled() => break,
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
                    // A new event does not wait for the 200 ms between changes: a notice is
                    // what the controller must act on first (a cordon before the reclaim). One
                    // already queued goes with the next report.
                    Some(ev) => {
                        if self.queue.enqueue(ev) {
                            self.persist_later();
                            if failures == 0 { next = Instant::now(); }
                        }
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
                            next = Instant::now() + self.backoff(failures, &e);
                        }
                    }
                }
            }
        }
        // On this task, once, as it ends: a runtime shutting down may no longer run blocking tasks.
        self.queue.events_write().run();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio_util::sync::CancellationToken;

    use super::transport::fake::{FakeTransport, Script, Seen};
    use super::*;
    use crate::agent::sources::EventKind;

    const MS: fn(u64) -> Duration = Duration::from_millis;
    const S: fn(u64) -> Duration = Duration::from_secs;

    fn report() -> NodeReport {
        NodeReport {
            version: crate::wire::REPORT_VERSION,
            node: "n1".into(),
            agent_version: "test".into(),
            agent_instance: String::new(),
            sequence: 0,
            boot_id: "b".into(),
            generated_at: chrono::Utc::now(),
            identity: None,
            conditions: vec![],
            check_events: vec![],
            events: vec![],
            crio: None,
            label_removals: vec![],
            command_results: vec![],
            problems: vec![],
        }
    }

    /// A reporter loop over a fake transport, started at `t0`.
    struct Run {
        seen: Arc<Mutex<Seen>>,
        report_tx: watch::Sender<NodeReport>,
        event_tx: mpsc::Sender<NodeEvent>,
        _commands: mpsc::Receiver<AgentCommand>,
        stop: CancellationToken,
        task: tokio::task::JoinHandle<()>,
        t0: Instant,
        _dir: tempfile::TempDir,
    }

    fn start(script: &[Script], heartbeat: Duration, backoff_max: Duration) -> Run {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), "t\n").unwrap();
        let cfg = ReporterConfig {
            url: "http://controller.test".into(),
            ca_file: None,
            token_file: dir.path().join("token"),
            heartbeat,
            backoff_max,
            ..ReporterConfig::default()
        };
        let fake = FakeTransport::new(script);
        let seen = fake.seen.clone();
        let r = Reporter::with_transport(cfg, dir.path(), Box::new(fake)).unwrap();
        let (report_tx, rx) = watch::channel(report());
        let (event_tx, erx) = mpsc::channel(16);
        let (ctx, crx) = mpsc::channel(16);
        let stop = CancellationToken::new();
        let t0 = Instant::now();
        let task = tokio::spawn(r.run(rx, erx, ctx, stop.clone()));
        Run {
            seen,
            report_tx,
            event_tx,
            _commands: crx,
            stop,
            task,
            t0,
            _dir: dir,
        }
    }

    impl Run {
        /// When each report was sent, from the start.
        fn sent_at(&self) -> Vec<Duration> {
            let seen = self.seen.lock().unwrap();
            seen.at.iter().map(|t| *t - self.t0).collect()
        }
        async fn at(&self, offset: Duration) {
            tokio::time::sleep_until(self.t0 + offset).await;
        }
        async fn stop(self) -> Arc<Mutex<Seen>> {
            self.stop.cancel();
            self.task.await.unwrap();
            self.seen
        }
    }

    /// Tokio's timer wheel rounds a sleep up to the next millisecond.
    fn near(got: &[Duration], want: &[Duration]) -> bool {
        got.len() == want.len()
            && got
                .iter()
                .zip(want)
                .all(|(g, w)| *g >= *w && *g <= *w + MS(1))
    }

    #[tokio::test(start_paused = true)]
    async fn reports_at_once_then_every_heartbeat_exactly() {
        let r = start(&[], S(10), S(30));
        r.at(MS(29_999)).await;
        let got = r.sent_at();
        assert!(near(&got, &[S(0), S(10), S(20)]), "{got:?}");
        r.at(S(30) + MS(1)).await;
        let got = r.sent_at();
        assert!(near(&got, &[S(0), S(10), S(20), S(30)]), "{got:?}");
        let seen = r.stop().await;
        let seqs: Vec<u64> = seen
            .lock()
            .unwrap()
            .reports
            .iter()
            .map(|r| r.sequence)
            .collect();
        assert_eq!(seqs, vec![1, 2, 3, 4], "one sequence number per report");
    }

    #[tokio::test(start_paused = true)]
    async fn changes_wait_200_ms_events_go_at_once_both_restart_the_heartbeat() {
        let r = start(&[], S(10), S(30));
        r.at(MS(50)).await;
        r.report_tx.send_modify(|x| x.boot_id = "changed".into());
        r.at(MS(300)).await;
        let ev = NodeEvent::on_node(EventKind::ShuttingDown, "t", "k", chrono::Utc::now());
        r.event_tx.send(ev).await.unwrap();
        r.at(MS(1_000)).await;
        r.report_tx.send_modify(|x| x.boot_id = "again".into());
        r.at(MS(10_999)).await;
        let got = r.sent_at();
        // The change at 50 ms: within 200 ms of the first, so at 200; the event at 300 ms: at
        // once, 100 ms after the last send; the change at 1 s: at once.
        assert!(near(&got, &[S(0), MS(200), MS(300), S(1)]), "{got:?}");
        r.at(S(11) + MS(1)).await;
        let got = r.sent_at();
        assert!(
            near(&got, &[S(0), MS(200), MS(300), S(1), S(11)]),
            "{got:?}"
        );
        let seen = r.stop().await;
        let seen = seen.lock().unwrap();
        assert_eq!(seen.reports[1].boot_id, "changed");
        assert_eq!(
            seen.reports[2].events.len(),
            1,
            "the queued event goes along"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_doubling_to_the_cap_then_the_heartbeat_resumes() {
        use Script::{Down, Ok};
        let r = start(&[Down, Down, Down, Down, Ok], S(10), S(2));
        // A change while degraded does not cut the backoff short.
        r.at(MS(100)).await;
        r.report_tx.send_modify(|x| x.boot_id = "changed".into());
        r.at(S(30)).await;
        let got = r.sent_at();
        let gaps: Vec<Duration> = got.windows(2).map(|w| w[1] - w[0]).collect();
        // after failure n: min(500 ms · 2^n, 2 s), jittered into [d/2, d]
        for (i, d) in [MS(1_000), S(2), S(2), S(2)].iter().enumerate() {
            assert!(
                gaps[i] >= *d / 2 && gaps[i] <= *d + MS(1),
                "gap {i}: {:?} for {d:?} ({gaps:?})",
                gaps[i]
            );
        }
        assert!(gaps[4] >= S(10) && gaps[4] <= S(10) + MS(1), "{gaps:?}");
        r.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_report_turned_away_with_retry_after_waits_that_long_with_jitter_then_backs_off() {
        use Script::{Busy, Ok};
        // Retry-After 5 s, then 1 s (the backoff, 1–2 s by then, is longer), then 60 s (above
        // backoff_max: capped at it), then accepted.
        let r = start(&[Busy(5), Busy(1), Busy(60), Ok], S(10), S(20));
        r.at(S(100)).await;
        let got = r.sent_at();
        let gaps: Vec<Duration> = got.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps[0] >= S(5) && gaps[0] <= S(10) + MS(1), "{gaps:?}");
        assert!(gaps[1] >= S(1) && gaps[1] <= S(2) + MS(1), "{gaps:?}");
        assert!(gaps[2] >= S(20) && gaps[2] <= S(40) + MS(1), "{gaps:?}");
        assert!(
            gaps[3] >= S(10) && gaps[3] <= S(10) + MS(1),
            "the heartbeat resumes: {gaps:?}"
        );
        r.stop().await;
    }
}

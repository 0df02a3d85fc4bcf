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

use crate::wire::NodeEvent;
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

/// A report body that fits `[report] max_report_bytes`.
#[derive(Debug)]
pub struct Fitted {
    /// The serialized report.
    pub body: Vec<u8>,
    /// How many of the offered events it carries (the oldest).
    pub events: usize,
    /// Check events left out (the report was too large even without any event).
    pub check_events_dropped: usize,
    /// The oldest event, when it alone does not fit: it can never be sent.
    pub unsendable: Option<String>,
}

/// `report` (with the events it carries already) and as many of `events` (oldest first) as fit
/// in `max_bytes`: all of them, else
/// half as many, and so on (a few serializations at most). Without any event the body may still
/// be too large (thousands of check events with long lines): check events are then halved too,
/// the newest kept. Pure, so that a backlog always drains whatever the limit.
pub fn fit(
    mut report: NodeReport,
    events: &[NodeEvent],
    max_bytes: usize,
) -> Result<Fitted, serde_json::Error> {
    let own = std::mem::take(&mut report.events);
    let mut n = events.len();
    let mut unsendable = None;
    loop {
        report.events = own.iter().chain(&events[..n]).cloned().collect();
        let body = serde_json::to_vec(&report)?;
        if body.len() <= max_bytes {
            return Ok(Fitted {
                body,
                events: n,
                check_events_dropped: 0,
                unsendable,
            });
        }
        if n == 0 {
            break;
        }
        if n == 1 {
            unsendable = Some(events[0].id.clone());
        }
        n /= 2;
    }
    // Too large without any event: no event is to blame.
    let unsendable = None;
    let mut dropped = 0;
    loop {
        let keep = report.check_events.len() / 2;
        let cut = report.check_events.len() - keep;
        report.check_events.drain(..cut);
        dropped += cut;
        let body = serde_json::to_vec(&report)?;
        if body.len() <= max_bytes || report.check_events.is_empty() {
            return Ok(Fitted {
                body,
                events: 0,
                check_events_dropped: dropped,
                unsendable,
            });
        }
    }
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
    /// The controller's last `Warning`, logged once when it first appears or changes.
    warning: Option<String>,
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
            warning: None,
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
        self.queue.answer_replayed(&mut report);
        let dropped = self.queue.take_dropped();
        if dropped > 0 {
            report.problems.push(crate::wire::Problem::new(
                "reporter",
                format!(
                    "{dropped} queued events dropped: over max_queued_events, or too large for \
                     a report (max_report_bytes)"
                ),
            ));
        }
        let queued: Vec<NodeEvent> = self
            .queue
            .events()
            .take(crate::wire::MAX_EVENTS_PER_REPORT)
            .cloned()
            .collect();
        let fitted =
            fit(report, &queued, self.cfg.max_report_bytes).map_err(ReporterError::Encode)?;
        if let Some(id) = &fitted.unsendable {
            tracing::error!(%id, max_report_bytes = self.cfg.max_report_bytes,
                "a queued event does not fit in a report alone: dropped");
            self.queue.drop_unsendable(id);
            self.persist_later();
        }
        if fitted.check_events_dropped > 0 {
            tracing::error!(
                dropped = fitted.check_events_dropped,
                max_report_bytes = self.cfg.max_report_bytes,
                "the report did not fit without its oldest check events: dropped them"
            );
        }
        let body = fitted.body;
        let answer = self
            .transport
            .post(token.trim(), body)
            .await
            .map_err(|source| ReporterError::Transport {
                url: self.endpoint.clone(),
                source,
            })?;
        if answer.warning.is_some() && answer.warning != self.warning {
            tracing::warn!(
                warning = answer.warning.as_deref().unwrap_or_default(),
                url = %self.endpoint,
                "the controller warns about this agent's reports: upgrade the agent (docs/install.md, version skew)"
            );
        }
        self.warning = answer.warning.clone();
        let (status, bytes) = (answer.status, answer.body);
        if !(200..300).contains(&status) {
            return Err(ReporterError::Status {
                retry_after: answer.retry_after,
                url: self.endpoint.clone(),
                status,
                body: crate::text::truncate(&String::from_utf8_lossy(&bytes), 300),
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
    use crate::wire::EventKind;

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
            command_types: vec![],
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

    /// An agent upgraded before its controller: the controller refuses the new report version
    /// (400). The agent keeps its queued notice (sent again with every report), backs off as for
    /// any failure (no spinning), and delivers once the controller reads its version.
    #[tokio::test(start_paused = true)]
    async fn a_report_version_refused_with_400_keeps_the_queue_and_backs_off() {
        use Script::{Ok, OldController};
        let r = start(
            &[
                OldController,
                OldController,
                OldController,
                OldController,
                Ok,
            ],
            S(10),
            S(4),
        );
        let ev = NodeEvent::on_node(EventKind::ShuttingDown, "t", "k", chrono::Utc::now());
        let id = ev.id.clone();
        r.event_tx.send(ev).await.unwrap();
        r.at(S(30)).await;
        let got = r.sent_at();
        let gaps: Vec<Duration> = got.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.len() >= 5, "{got:?}");
        // After failure n: min(500 ms · 2^n, 4 s), jittered into [d/2, d].
        for (i, d) in [S(1), S(2), S(4), S(4)].iter().enumerate() {
            let gap = gaps[i];
            assert!(
                gap >= *d / 2 && gap <= *d + MS(1),
                "gap {i}: {gap:?} for {d:?} ({gaps:?})"
            );
        }
        assert!(
            gaps[4..].iter().all(|g| *g >= S(10) - MS(1)),
            "delivered: the heartbeat resumes ({gaps:?})"
        );
        let seen = r.stop().await;
        let seen = seen.lock().unwrap();
        // The first report (at 0) may go before the loop takes the event (both are ready at
        // once); every later one carries it, the refused ones and those after them.
        assert!(
            seen.reports[1..]
                .iter()
                .all(|rep| rep.events.iter().any(|e| e.id == id)),
            "every report after the first carries the queued event"
        );
        assert!(seen
            .reports
            .iter()
            .all(|rep| rep.version == crate::wire::REPORT_VERSION));
    }

    /// A controller that warns (a deprecated report version): the agent logs it once, not once
    /// per report, and its reports are taken as usual.
    #[tokio::test(start_paused = true)]
    async fn the_controllers_warning_is_logged_once() {
        use Script::{Deprecated, Ok};
        let log = crate::telemetry::Captured::default();
        let _guard = tracing::subscriber::set_default(log.subscriber("warn"));
        let r = start(&[Deprecated, Deprecated, Deprecated, Ok], S(1), S(4));
        r.at(S(5)).await;
        assert!(r.sent_at().len() >= 4, "{:?}", r.sent_at());
        r.stop().await;
        let text = log.text();
        assert_eq!(
            text.matches("the controller warns about this agent's reports")
                .count(),
            1,
            "{text}"
        );
        assert!(text.contains("report version 1 is deprecated"), "{text}");
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

    /// A controller that refuses bodies over `max` (413, as `max_report_bytes` does) and
    /// acknowledges every event of the others.
    #[derive(Debug)]
    struct Limited {
        max: usize,
        seen: Arc<Mutex<Vec<(usize, NodeReport)>>>,
    }

    impl ReportTransport for Limited {
        fn post<'a>(
            &'a self,
            _token: &'a str,
            body: Vec<u8>,
        ) -> futures::future::BoxFuture<'a, Result<transport::Answer, transport::TransportError>>
        {
            let r: NodeReport = serde_json::from_slice(&body).unwrap();
            let ids: Vec<String> = r.events.iter().map(|e| e.id.clone()).collect();
            self.seen.lock().unwrap().push((body.len(), r));
            let answer = if body.len() > self.max {
                transport::Answer {
                    status: 413,
                    body: br#"{"error":"too large"}"#.to_vec().into(),
                    retry_after: None,
                    warning: None,
                }
            } else {
                let resp = ReportResponse {
                    accepted: true,
                    acknowledged_events: ids,
                    commands: vec![],
                };
                transport::Answer {
                    status: 200,
                    body: serde_json::to_vec(&resp).unwrap().into(),
                    retry_after: None,
                    warning: None,
                }
            };
            Box::pin(async move { Ok(answer) })
        }
    }

    fn big_event(i: usize) -> NodeEvent {
        let mut e = NodeEvent::on_node(
            EventKind::Maintenance,
            "test",
            &format!("k{i}"),
            chrono::Utc::now(),
        );
        e.id = format!("ev-{i:05}");
        e.detail.insert("pad".into(), "p".repeat(200));
        e
    }

    /// Probe 8: 20,000 events saved by an earlier agent (over `max_queued_events`), and a
    /// controller refusing reports over its `max_report_bytes` with 413. The queue keeps the
    /// newest 1,000 on load (the drop told in the next report's problems), every report fits,
    /// and the backlog drains in order; before, every report carried all 20,000 and was refused
    /// forever.
    #[tokio::test]
    async fn a_saved_backlog_over_the_bounds_drains_in_reports_that_fit() {
        const SAVED: usize = 20_000;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), "t\n").unwrap();
        let saved: Vec<NodeEvent> = (0..SAVED).map(big_event).collect();
        std::fs::write(
            dir.path().join(queue::EVENTS_FILE),
            serde_json::to_vec(&saved).unwrap(),
        )
        .unwrap();
        let cfg = ReporterConfig {
            url: "http://controller.test".into(),
            ca_file: None,
            token_file: dir.path().join("token"),
            max_report_bytes: config::MIN_REPORT_BYTES,
            ..ReporterConfig::default()
        };
        let max_queued = cfg.max_queued_events;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let fake = Limited {
            max: cfg.max_report_bytes,
            seen: seen.clone(),
        };
        let mut r = Reporter::with_transport(cfg, dir.path(), Box::new(fake)).unwrap();
        assert_eq!(r.queued().count(), max_queued, "bounded on load");
        let mut sends = 0;
        while r.queued().next().is_some() {
            r.send_once(&report()).await.unwrap();
            sends += 1;
            assert!(sends <= max_queued, "the backlog does not drain");
        }
        let seen = seen.lock().unwrap();
        assert!(seen.iter().all(|(len, _)| *len <= config::MIN_REPORT_BYTES));
        let sent: Vec<&str> = seen
            .iter()
            .flat_map(|(_, r)| r.events.iter().map(|e| e.id.as_str()))
            .collect();
        let want: Vec<String> = (SAVED - max_queued..SAVED)
            .map(|i| format!("ev-{i:05}"))
            .collect();
        assert_eq!(sent, want, "the newest kept, each sent once, oldest first");
        assert!(
            seen[0]
                .1
                .problems
                .iter()
                .any(|p| p.source == "reporter"
                    && p.message.starts_with("19000 queued events dropped")),
            "{:?}",
            seen[0].1.problems
        );
        assert!(seen[1].1.problems.is_empty());
        eprintln!("NOTE: {max_queued} events in {sends} reports of at most 16 KiB");
    }

    #[test]
    fn fit_takes_fewer_events_then_fewer_check_events_and_names_an_unsendable_event() {
        let events: Vec<NodeEvent> = (0..64).map(big_event).collect();
        let one = serde_json::to_vec(&events[0]).unwrap().len();
        let base = serde_json::to_vec(&report()).unwrap().len();
        // All fit.
        let f = fit(report(), &events, 1 << 20).unwrap();
        assert_eq!(
            (f.events, f.check_events_dropped, f.unsendable),
            (64, 0, None)
        );
        // Room for about 10: halved until they fit (8).
        let f = fit(report(), &events, base + 10 * (one + 1)).unwrap();
        assert_eq!(f.events, 8);
        assert!(f.body.len() <= base + 10 * (one + 1));
        // The oldest alone is too large (but the report without it fits): named.
        let f = fit(report(), &events, base + one / 2).unwrap();
        assert_eq!((f.events, f.unsendable.as_deref()), (0, Some("ev-00000")));
        // Too large without any event: the oldest check events go, no event is blamed.
        let mut r = report();
        r.check_events = (0..100)
            .map(|i| crate::wire::CheckEvent {
                reason: "R".into(),
                message: format!("{i:03}{}", "x".repeat(100)),
                severity: crate::wire::EventSeverity::Warning,
            })
            .collect();
        let f = fit(r, &events[..1], 4000).unwrap();
        assert!(f.body.len() <= 4000);
        assert_eq!((f.events, f.unsendable), (0, None));
        assert!(f.check_events_dropped >= 50, "{}", f.check_events_dropped);
        let kept: NodeReport = serde_json::from_slice(&f.body).unwrap();
        assert_eq!(kept.check_events.last().unwrap().message[..3], *"099");
    }
}

//! Optional webhook notifications on the start, finish and failure of each action
//! (`[[controller.notify]]`, docs/status.md "Notifications").
//!
//! [`Notifier::notify`] never blocks and never fails: it appends to each matching target's
//! bounded queue (dropping the oldest entry when full, counted in [`NotifyStats::dropped`]) and
//! wakes that target's delivery task. Delivery POSTs the default JSON body ([`Payload`]) or the
//! configured template, signed like the webhook provider (`X-Nodekeeper-Signature:
//! sha256=<hex>` when a secret is set). 2xx = delivered; 4xx other than 429 = given up at
//! once; 5xx, 429, timeouts and connection errors are retried with jittered exponential
//! backoff up to `max_attempts`, with the same body and `Idempotency-Key`. Plain HTTP only (no
//! TLS in this build). The secret is never logged or printed, and neither is a target's URL path
//! or query (webhook URLs often embed a token): logs, errors and counters name a target
//! `notify[i] http://host:port`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::cfg_path;
use crate::config::{Diagnostic, Secret};
use crate::controller::metrics;
use crate::controller::provider::webhook::{backoff, sign, SIGNATURE_HEADER};

/// Version of the default JSON body ([`Payload::version`]).
pub const PAYLOAD_VERSION: u32 = 1;
/// Header naming the phase (`started`, `finished`, `failed`).
pub const EVENT_HEADER: &str = "X-Nodekeeper-Event";

/// When an action is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The action began.
    Started,
    /// It succeeded.
    Finished,
    /// It failed.
    Failed,
}

impl Phase {
    /// Every phase.
    pub const ALL: [Phase; 3] = [Phase::Started, Phase::Finished, Phase::Failed];

    /// `started`, `finished`, `failed`.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Started => "started",
            Phase::Finished => "finished",
            Phase::Failed => "failed",
        }
    }

    /// The `{result}` of a template and the `result` field: `started`, `succeeded`, `failed`.
    pub fn result(self) -> &'static str {
        match self {
            Phase::Started => "started",
            Phase::Finished => "succeeded",
            Phase::Failed => "failed",
        }
    }
}

/// `[[controller.notify]]`: one webhook target.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NotifyConfig {
    /// `https://` (or `http://`) URL to POST to.
    pub url: String,
    /// A PEM CA file trusted besides the system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<std::path::PathBuf>,
    /// Which phases are sent (default: all three).
    #[serde(default = "all_phases")]
    pub events: Vec<Phase>,
    /// Body template with `{node}`, `{action}`, `{phase}`, `{result}`, `{reason}`,
    /// `{message}`, `{time}`, `{id}` placeholders (default: the JSON [`Payload`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Content-Type of a templated body (default: `application/json` when the template looks
    /// like JSON (`{"...` or `[`), else `text/plain; charset=utf-8`). With a JSON type, values
    /// are JSON-escaped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// HMAC-SHA256 key for `X-Nodekeeper-Signature` (empty: unsigned); never printed.
    #[serde(default)]
    pub secret: Secret,
    /// Timeout of one attempt.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Attempts on 5xx / 429 / timeouts / connection errors before giving up.
    #[serde(default = "default_attempts")]
    pub max_attempts: u32,
    /// First retry delay (doubled each attempt, with jitter, capped at 30 s).
    #[serde(default = "default_backoff", with = "humantime_serde")]
    pub backoff: Duration,
    /// Notifications waiting at most; when full the oldest is dropped (and counted).
    #[serde(default = "default_queue")]
    pub queue_size: usize,
}

fn all_phases() -> Vec<Phase> {
    Phase::ALL.to_vec()
}
fn default_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_attempts() -> u32 {
    5
}
fn default_backoff() -> Duration {
    Duration::from_millis(500)
}
fn default_queue() -> usize {
    256
}

impl NotifyConfig {
    /// A target for `url` with the defaults.
    pub fn new(url: &str) -> Self {
        NotifyConfig {
            url: url.to_string(),
            ca_file: None,
            events: all_phases(),
            template: None,
            content_type: None,
            secret: Secret::default(),
            timeout: default_timeout(),
            max_attempts: default_attempts(),
            backoff: default_backoff(),
            queue_size: default_queue(),
        }
    }

    /// The Content-Type of the body.
    pub fn effective_content_type(&self) -> &str {
        match (&self.content_type, &self.template) {
            (Some(c), _) => c,
            (None, None) => "application/json",
            (None, Some(t)) if looks_like_json(t) => "application/json",
            (None, Some(_)) => "text/plain; charset=utf-8",
        }
    }
}

/// A template starting with `[`, or with `{` followed by `"` or `}` (a JSON object rather
/// than a leading placeholder such as `{node}`).
fn looks_like_json(tpl: &str) -> bool {
    let t = tpl.trim_start();
    match t.strip_prefix('{') {
        Some(rest) => rest.trim_start().starts_with(['"', '}']),
        None => t.starts_with('['),
    }
}

/// Checks every `[[controller.notify]]` entry; paths are `controller.notify[i].<key>`.
pub fn validate(targets: &[NotifyConfig]) -> Vec<Diagnostic> {
    targets
        .iter()
        .enumerate()
        .flat_map(|(i, t)| validate_one(i, t))
        .collect()
}

fn validate_one(i: usize, t: &NotifyConfig) -> Vec<Diagnostic> {
    let at = |k: &str| cfg_path!["controller", "notify", i, k];
    let mut d = Vec::new();
    d.extend(super::provider::check_http_url(&t.url, at("url")));
    if t.events.is_empty() {
        d.push(Diagnostic::error(
            at("events"),
            "must name at least one of started, finished, failed",
        ));
    }
    if let Some(Err(e)) = t.template.as_deref().map(parse_template) {
        d.push(Diagnostic::error(at("template"), e));
    }
    if t.content_type
        .as_deref()
        .is_some_and(|c| c.trim().is_empty())
    {
        d.push(Diagnostic::error(at("content_type"), "must not be empty"));
    }
    if t.timeout.is_zero() {
        d.push(Diagnostic::error(
            at("timeout"),
            "must be greater than zero",
        ));
    }
    if t.max_attempts == 0 {
        d.push(Diagnostic::error(at("max_attempts"), "must be at least 1"));
    }
    if t.queue_size == 0 {
        d.push(Diagnostic::error(at("queue_size"), "must be at least 1"));
    }
    d
}

/// A template placeholder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Node,
    Action,
    Phase,
    Result,
    Reason,
    Message,
    Time,
    Id,
}

const FIELDS: &[(&str, Field)] = &[
    ("node", Field::Node),
    ("action", Field::Action),
    ("phase", Field::Phase),
    ("result", Field::Result),
    ("reason", Field::Reason),
    ("message", Field::Message),
    ("time", Field::Time),
    ("id", Field::Id),
];

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Var(Field),
}

/// Splits a template: `{name}` (letters, digits, `_`) is a placeholder and must be known; every
/// other brace is literal, so JSON templates need no escaping.
fn parse_template(tpl: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut rest = tpl;
    while let Some(open) = rest.find('{') {
        text.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let name_len = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        if name_len == 0 || !after[name_len..].starts_with('}') {
            text.push('{');
            rest = after;
            continue;
        }
        let name = &after[..name_len];
        let field = FIELDS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, f)| *f)
            .ok_or_else(|| {
                let known: Vec<String> = FIELDS.iter().map(|(n, _)| format!("{{{n}}}")).collect();
                format!("unknown placeholder {{{name}}}; known: {}", known.join(" "))
            })?;
        if !text.is_empty() {
            pieces.push(Piece::Text(std::mem::take(&mut text)));
        }
        pieces.push(Piece::Var(field));
        rest = &after[name_len + 1..];
    }
    text.push_str(rest);
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

/// One action's progress, as reported by the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// Node name.
    pub node: String,
    /// Action (`drain`, `reboot`, `replace`, `cordon`, ...).
    pub action: String,
    /// Started, finished or failed.
    pub phase: Phase,
    /// Why (`repair:Ready=False`, `interruption:preemption`).
    pub reason: String,
    /// Details (the error of a failure, the blocker...); may be empty.
    pub message: String,
}

/// The default JSON body (stable; `version` = [`PAYLOAD_VERSION`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payload {
    /// [`PAYLOAD_VERSION`].
    pub version: u32,
    /// Unique per notification, also in `Idempotency-Key` (the same on every retry).
    pub id: String,
    /// When [`Notifier::notify`] was called.
    pub time: DateTime<Utc>,
    /// Node name.
    pub node: String,
    /// Action.
    pub action: String,
    /// `started`, `finished`, `failed`.
    pub phase: String,
    /// `started`, `succeeded`, `failed`.
    pub result: String,
    /// Reason.
    pub reason: String,
    /// Message.
    pub message: String,
}

/// A notification waiting in a queue.
#[derive(Debug, Clone)]
struct Queued {
    n: Notification,
    id: String,
    time: DateTime<Utc>,
}

impl Queued {
    fn payload(&self) -> Payload {
        Payload {
            version: PAYLOAD_VERSION,
            id: self.id.clone(),
            time: self.time,
            node: self.n.node.clone(),
            action: self.n.action.clone(),
            phase: self.n.phase.name().into(),
            result: self.n.phase.result().into(),
            reason: self.n.reason.clone(),
            message: self.n.message.clone(),
        }
    }

    fn field(&self, f: Field) -> String {
        match f {
            Field::Node => self.n.node.clone(),
            Field::Action => self.n.action.clone(),
            Field::Phase => self.n.phase.name().into(),
            Field::Result => self.n.phase.result().into(),
            Field::Reason => self.n.reason.clone(),
            Field::Message => self.n.message.clone(),
            Field::Time => self.time.to_rfc3339(),
            Field::Id => self.id.clone(),
        }
    }
}

/// The body for `q` under `cfg` (template or default JSON).
fn body(cfg: &NotifyConfig, pieces: Option<&[Piece]>, q: &Queued) -> Vec<u8> {
    let Some(pieces) = pieces else {
        return serde_json::to_vec(&q.payload()).unwrap_or_default();
    };
    let json = cfg.effective_content_type().contains("json");
    let mut out = String::new();
    for p in pieces {
        match p {
            Piece::Text(t) => out.push_str(t),
            Piece::Var(f) if json => out.push_str(&json_escape(&q.field(*f))),
            Piece::Var(f) => out.push_str(&q.field(*f)),
        }
    }
    out.into_bytes()
}

/// `s` escaped for use inside a JSON string (without the quotes).
fn json_escape(s: &str) -> String {
    let quoted = serde_json::to_string(s).unwrap_or_default();
    quoted
        .strip_prefix('"')
        .and_then(|q| q.strip_suffix('"'))
        .unwrap_or_default()
        .to_string()
}

/// Errors setting up the notifier.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// The HTTP client for a target could not be built.
    #[error("{target}: building the HTTP client: {source}")]
    Client {
        /// Target name (`notify[i] http://host:port`).
        target: String,
        /// Cause.
        source: reqwest::Error,
    },
    /// The TLS setup of a target (its `ca_file`) failed.
    #[error("{target}: {source}")]
    Tls {
        /// Target name.
        target: String,
        /// Cause.
        source: crate::http::TlsError,
    },
    /// The template of a target is invalid (validation should have caught it).
    #[error("{target}: template: {message}")]
    Template {
        /// Target name.
        target: String,
        /// What is wrong.
        message: String,
    },
    /// Not called inside a tokio runtime.
    #[error("the notifier must be started inside a tokio runtime")]
    NoRuntime,
}

/// Counters of one target (no node names: bounded).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct NotifyStats {
    /// Target name: `notify[i] http://host:port` (no path or query).
    pub target: String,
    /// Waiting now.
    pub queued: usize,
    /// Being delivered now (0 or 1).
    pub in_flight: u64,
    /// Delivered (2xx).
    pub sent: u64,
    /// Given up (4xx, or `max_attempts` used up).
    pub failed: u64,
    /// Retries after a failed attempt.
    pub retries: u64,
    /// Dropped because the queue was full (oldest first).
    pub dropped: u64,
}

#[derive(Debug, Default)]
struct Counters {
    in_flight: AtomicU64,
    sent: AtomicU64,
    failed: AtomicU64,
    retries: AtomicU64,
    dropped: AtomicU64,
}

struct Target {
    name: String,
    cfg: NotifyConfig,
    pieces: Option<Vec<Piece>>,
    http: reqwest::Client,
    queue: Mutex<VecDeque<Queued>>,
    wake: tokio::sync::Notify,
    counters: Counters,
}

impl Target {
    fn new(index: usize, cfg: &NotifyConfig) -> Result<Self, NotifyError> {
        let name = target_name(index, &cfg.url);
        let http = crate::http::builder(cfg.ca_file.as_deref())
            .map_err(|e| NotifyError::Tls {
                target: name.clone(),
                source: e,
            })?
            .timeout(cfg.timeout)
            .build()
            .map_err(|source| NotifyError::Client {
                target: name.clone(),
                source,
            })?;
        let pieces = match cfg.template.as_deref().map(parse_template) {
            None => None,
            Some(Ok(p)) => Some(p),
            Some(Err(message)) => {
                return Err(NotifyError::Template {
                    target: name,
                    message,
                })
            }
        };
        Ok(Target {
            name,
            cfg: cfg.clone(),
            pieces,
            http,
            queue: Mutex::new(VecDeque::new()),
            wake: tokio::sync::Notify::new(),
            counters: Counters::default(),
        })
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Queued>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends, dropping the oldest entry when full.
    fn push(&self, q: Queued) {
        let dropped = {
            let mut queue = self.queue();
            queue.push_back(q);
            let over = queue.len().saturating_sub(self.cfg.queue_size.max(1));
            queue.drain(..over).count()
        };
        if dropped > 0 {
            let before = self
                .counters
                .dropped
                .fetch_add(dropped as u64, Ordering::Relaxed);
            // Logged at the 1st, 2nd, 4th, 8th... drop: a dead receiver must not flood the log.
            let total = before + dropped as u64;
            if (before + 1..=total).any(u64::is_power_of_two) {
                tracing::warn!(target_name = %self.name, dropped_total = total, "notification queue full; dropped the oldest");
            }
        }
        self.wake.notify_one();
    }

    fn stats(&self) -> NotifyStats {
        let c = &self.counters;
        NotifyStats {
            target: self.name.clone(),
            queued: self.queue().len(),
            in_flight: c.in_flight.load(Ordering::SeqCst),
            sent: c.sent.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            retries: c.retries.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
        }
    }
}

/// The targets' counters, read when `/metrics` is encoded: labelled by the target's index only
/// (bounded; no URLs, no node names). Holds the targets, not the [`Notifier`], so the registry
/// does not keep the delivery tasks alive.
struct NotifyMetrics(Vec<Arc<Target>>);

impl std::fmt::Debug for NotifyMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NotifyMetrics")
            .field("targets", &self.0.len())
            .finish()
    }
}

impl Collector for NotifyMetrics {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats: Vec<NotifyStats> = self.0.iter().map(|t| t.stats()).collect();
        let targets: Vec<String> = (0..stats.len()).map(|i| i.to_string()).collect();
        let outcomes = stats.iter().zip(&targets).flat_map(|(s, i)| {
            [
                ("sent", s.sent),
                ("failed", s.failed),
                ("dropped", s.dropped),
            ]
            .map(|(outcome, v)| {
                (
                    [("target", i.as_str()), ("outcome", outcome)],
                    ConstCounter::new(v),
                )
            })
        });
        metrics::encode_family(
            &mut enc,
            metrics::counter_name("nodekeeper_notifications_total"),
            "Notifications by target and outcome.",
            MetricType::Counter,
            outcomes,
        )?;
        let per_target = |value: fn(&NotifyStats) -> u64| {
            stats
                .iter()
                .zip(&targets)
                .map(move |(s, i)| ([("target", i.as_str())], value(s)))
        };
        metrics::encode_family(
            &mut enc,
            metrics::counter_name("nodekeeper_notification_retries_total"),
            "Retried attempts by target.",
            MetricType::Counter,
            per_target(|s| s.retries).map(|(l, v)| (l, ConstCounter::new(v))),
        )?;
        metrics::encode_family(
            &mut enc,
            "nodekeeper_notification_queue_length",
            "Notifications waiting by target.",
            MetricType::Gauge,
            per_target(|s| s.queued as u64).map(|(l, v)| (l, ConstGauge::new(v as i64))),
        )
    }
}

/// Sends action notifications to the configured webhooks, in the background.
pub struct Notifier {
    targets: Vec<Arc<Target>>,
    _stop: DropGuard,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.targets.iter().map(|t| t.name.as_str()).collect();
        f.debug_struct("Notifier").field("targets", &names).finish()
    }
}

impl Notifier {
    /// Starts one delivery task per target on the current tokio runtime; they stop when the
    /// notifier is dropped. An empty list gives a notifier that sends nothing.
    pub fn start(targets: &[NotifyConfig]) -> Result<Self, NotifyError> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| NotifyError::NoRuntime)?;
        let stop = CancellationToken::new();
        let targets = targets
            .iter()
            .enumerate()
            .map(|(i, c)| Target::new(i, c).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        for t in &targets {
            handle.spawn(deliver_loop(t.clone(), stop.clone()));
        }
        Ok(Notifier {
            targets,
            _stop: stop.drop_guard(),
        })
    }

    /// Queues `n` for every target whose `events` include its phase. Never blocks.
    pub fn notify(&self, n: Notification) {
        let q = Queued {
            id: new_id(),
            time: Utc::now(),
            n,
        };
        for t in self
            .targets
            .iter()
            .filter(|t| t.cfg.events.contains(&q.n.phase))
        {
            t.push(q.clone());
        }
    }

    /// Counters per target, in configuration order.
    pub fn stats(&self) -> Vec<NotifyStats> {
        self.targets.iter().map(|t| t.stats()).collect()
    }

    /// Registers the targets' counters into the controller's registry (`/metrics`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(NotifyMetrics(self.targets.clone())));
    }

    /// The counters alone in the Prometheus text format (tests, debugging).
    pub fn metrics_text(&self) -> String {
        let mut registry = Registry::default();
        self.register(&mut registry);
        metrics::encode(&registry)
    }

    /// Waits until every queue is empty and nothing is in flight, up to `timeout`; returns
    /// whether that happened (for shutdown and tests).
    pub async fn flush(&self, timeout: Duration) -> bool {
        let idle = || {
            self.stats()
                .iter()
                .all(|s| s.queued == 0 && s.in_flight == 0)
        };
        tokio::time::timeout(timeout, async {
            while !idle() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .is_ok()
    }
}

/// `notify[i] scheme://host[:port]`: names a target without its path or query.
pub fn target_name(index: usize, url: &str) -> String {
    let origin = reqwest::Url::parse(url)
        .map(|u| u.origin().ascii_serialization())
        .unwrap_or_else(|_| "(invalid url)".to_string());
    format!("notify[{index}] {origin}")
}

/// 16 random bytes, hex.
fn new_id() -> String {
    let b: [u8; 16] = rand::rng().random();
    hex::encode(b)
}

async fn deliver_loop(t: Arc<Target>, stop: CancellationToken) {
    loop {
        let next = {
            let mut queue = t.queue();
            let next = queue.pop_front();
            if next.is_some() {
                t.counters.in_flight.store(1, Ordering::SeqCst);
            }
            next
        };
        match next {
            Some(q) => {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = deliver(&t, &q) => {}
                }
                t.counters.in_flight.store(0, Ordering::SeqCst);
            }
            None => tokio::select! {
                _ = stop.cancelled() => return,
                _ = t.wake.notified() => {}
            },
        }
    }
}

enum Attempt {
    Delivered,
    Permanent(String),
    Retry(String),
}

async fn attempt(t: &Target, q: &Queued, body: &[u8]) -> Attempt {
    let mut req = t
        .http
        .post(&t.cfg.url)
        .header(
            reqwest::header::CONTENT_TYPE,
            t.cfg.effective_content_type(),
        )
        .header(EVENT_HEADER, q.n.phase.name())
        .header("Idempotency-Key", &q.id);
    let secret = t.cfg.secret.expose();
    if !secret.is_empty() {
        req = req.header(SIGNATURE_HEADER, sign(secret.as_bytes(), body));
    }
    match req.body(body.to_vec()).send().await {
        Ok(r) if r.status().is_success() => Attempt::Delivered,
        Ok(r) if r.status().is_client_error() && r.status().as_u16() != 429 => {
            Attempt::Permanent(format!("{} answered {}", t.name, r.status()))
        }
        Ok(r) => Attempt::Retry(format!("{} answered {}", t.name, r.status())),
        Err(e) => Attempt::Retry(format!(
            "POST {}: {}",
            t.name,
            crate::telemetry::error_chain(&e.without_url())
        )),
    }
}

async fn deliver(t: &Target, q: &Queued) {
    let body = body(&t.cfg, t.pieces.as_deref(), q);
    let c = &t.counters;
    for n in 1..=t.cfg.max_attempts {
        match attempt(t, q, &body).await {
            Attempt::Delivered => {
                c.sent.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Attempt::Permanent(why) => {
                tracing::warn!(node = %q.n.node, action = %q.n.action, error = %why, "notification refused; not retried");
                c.failed.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Attempt::Retry(why) => {
                tracing::warn!(node = %q.n.node, action = %q.n.action, attempt = n, error = %why, "notification attempt failed");
            }
        }
        if n < t.cfg.max_attempts {
            c.retries.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(backoff(t.cfg.backoff, n)).await;
        }
    }
    c.failed.fetch_add(1, Ordering::Relaxed);
}

/// The engine's hook: every side-effect action's start, finish and failure becomes a
/// notification (`start_drain` → `drain`, `request_reboot` → `reboot`, `request_replacement`
/// → `replace`; dry-run decisions are marked in the message).
impl super::actions::Notifier for Notifier {
    fn notify(&self, a: &super::actions::ActionNotice) {
        let phase = match a.phase {
            "started" => Phase::Started,
            "finished" => Phase::Finished,
            _ => Phase::Failed,
        };
        let action = match a.kind {
            "start_drain" => "drain",
            "request_reboot" => "reboot",
            "request_replacement" | "replacement" => "replace",
            k => k,
        };
        let message = match a.dry_run {
            true => format!("dry run: {}", a.message),
            false => a.message.clone(),
        };
        Notifier::notify(
            self,
            Notification {
                node: a.node.clone(),
                action: action.to_string(),
                phase,
                reason: String::new(),
                message,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(message: &str) -> Queued {
        Queued {
            n: Notification {
                node: "n1".into(),
                action: "drain".into(),
                phase: Phase::Finished,
                reason: "repair:Ready=False".into(),
                message: message.into(),
            },
            id: "abc".into(),
            time: DateTime::parse_from_rfc3339("2026-11-30T12:00:00Z")
                .unwrap()
                .with_timezone(&Utc),
        }
    }

    fn render(tpl: &str, message: &str) -> (String, String) {
        let mut cfg = NotifyConfig::new("http://127.0.0.1:1/");
        cfg.template = Some(tpl.into());
        let pieces = parse_template(tpl).unwrap();
        let b = body(&cfg, Some(&pieces), &q(message));
        (
            String::from_utf8(b).unwrap(),
            cfg.effective_content_type().to_string(),
        )
    }

    #[test]
    fn templates_substitute_and_escape_for_json() {
        let (b, ct) = render("{action} of {node}: {result} ({reason}) {message}", "ok");
        assert_eq!(b, "drain of n1: succeeded (repair:Ready=False) ok");
        assert_eq!(ct, "text/plain; charset=utf-8");
        let (b, ct) = render(
            r#"{"text": "{node} {phase} {message}", "x": {"y": 1}}"#,
            "said \"no\"\n",
        );
        assert_eq!(ct, "application/json");
        let v: serde_json::Value = serde_json::from_str(&b).unwrap();
        assert_eq!(v["text"], "n1 finished said \"no\"\n");
        assert_eq!(v["x"]["y"], 1);
        let (b, _) = render("{time} {id} {unclosed", "");
        assert_eq!(b, "2026-11-30T12:00:00+00:00 abc {unclosed");
    }

    #[test]
    fn content_type_follows_the_template() {
        for (tpl, json) in [
            (r#"{"text": "{node}"}"#, true),
            ("  { \"a\": 1}", true),
            ("{}", true),
            ("[{node}]", true),
            ("{node} drained", false),
            ("plain", false),
        ] {
            assert_eq!(looks_like_json(tpl), json, "{tpl}");
        }
        let mut cfg = NotifyConfig::new("http://x/");
        cfg.template = Some("{node}".into());
        cfg.content_type = Some("application/x-ndjson".into());
        assert_eq!(cfg.effective_content_type(), "application/x-ndjson");
    }

    #[test]
    fn targets_are_named_without_path_or_query() {
        assert_eq!(
            target_name(
                2,
                "http://hooks.internal:8080/services/T0/B0/s3cr3t?token=x"
            ),
            "notify[2] http://hooks.internal:8080"
        );
        assert_eq!(target_name(0, "nope"), "notify[0] (invalid url)");
    }

    #[test]
    fn unknown_placeholders_are_rejected() {
        let e = parse_template("hello {nodes}").unwrap_err();
        assert!(
            e.contains("unknown placeholder {nodes}") && e.contains("{node}"),
            "{e}"
        );
        assert!(parse_template("{} { } {-}").is_ok());
    }

    #[test]
    fn default_body_is_the_versioned_payload() {
        let cfg = NotifyConfig::new("http://127.0.0.1:1/");
        let v: serde_json::Value = serde_json::from_slice(&body(&cfg, None, &q("m"))).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"version": 1, "id": "abc", "time": "2026-11-30T12:00:00Z",
                "node": "n1", "action": "drain", "phase": "finished", "result": "succeeded",
                "reason": "repair:Ready=False", "message": "m"})
        );
    }

    #[tokio::test]
    async fn queue_drops_the_oldest_when_full() {
        let mut cfg = NotifyConfig::new("http://127.0.0.1:1/");
        cfg.queue_size = 2;
        let t = Target::new(0, &cfg).unwrap();
        for m in ["a", "b", "c", "d"] {
            t.push(q(m));
        }
        let left: Vec<String> = t.queue().iter().map(|x| x.n.message.clone()).collect();
        assert_eq!(left, ["c", "d"]);
        assert_eq!(t.stats().dropped, 2);
    }
}

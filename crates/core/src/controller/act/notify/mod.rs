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

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use prometheus_client::registry::Registry;
use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::controller::metrics;

mod config;
mod deliver;
mod post;
mod queue;
mod template;

pub use config::{validate, NotifyConfig};
pub use queue::NotifyStats;

#[cfg(test)]
use config::looks_like_json;
use deliver::deliver_loop;
use queue::{NotifyMetrics, Queued, Target};
#[cfg(test)]
use template::{body, parse_template};

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
    /// The target's URL names an address outbound requests may not reach (loopback without
    /// `[controller] allow_loopback_destinations`, metadata, link-local, unspecified).
    #[error("{target}: {why}")]
    Refused {
        /// Target name.
        target: String,
        /// Which address, and why (starts with "refused").
        why: String,
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
    /// notifier is dropped. An empty list gives a notifier that sends nothing. Targets on
    /// loopback only with `allow_loopback` (`[controller] allow_loopback_destinations`).
    pub fn start(targets: &[NotifyConfig], allow_loopback: bool) -> Result<Self, NotifyError> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| NotifyError::NoRuntime)?;
        let stop = CancellationToken::new();
        let targets = targets
            .iter()
            .enumerate()
            .map(|(i, c)| Target::new(i, c, allow_loopback).map(Arc::new))
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

/// The engine's hook: every side-effect action's start, finish and failure becomes a
/// notification (`start_drain` → `drain`, `request_reboot` → `reboot`, `request_replacement`
/// → `replace`; dry-run decisions are marked in the message).
impl crate::controller::act::actions::Notifier for Notifier {
    fn notify(&self, a: &crate::controller::act::actions::ActionNotice) {
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

    /// `flush` returns at once when nothing is queued, and gives up at exactly its timeout while
    /// a delivery keeps failing (paused time: the retries' backoff and the timeout are virtual).
    #[tokio::test(start_paused = true)]
    async fn flush_waits_for_the_queues_up_to_its_timeout() {
        let idle = Notifier::start(&[NotifyConfig::new("http://127.0.0.1:1/")], true).unwrap();
        let t0 = tokio::time::Instant::now();
        assert!(idle.flush(Duration::from_secs(5)).await);
        assert_eq!(t0.elapsed(), Duration::ZERO);

        let mut cfg = NotifyConfig::new("http://127.0.0.1:1/");
        cfg.max_attempts = 1_000;
        let failing = Notifier::start(&[cfg], true).unwrap();
        failing.notify(q("m").n);
        let t0 = tokio::time::Instant::now();
        assert!(!failing.flush(Duration::from_secs(5)).await);
        assert_eq!(t0.elapsed(), Duration::from_secs(5));
        let st = &failing.stats()[0];
        // still waiting (queued, or in flight between retries), never sent
        assert_eq!(st.queued as u64 + st.in_flight, 1, "{st:?}");
        assert_eq!(st.sent, 0, "{st:?}");
    }

    #[tokio::test]
    async fn queue_drops_the_oldest_when_full() {
        let mut cfg = NotifyConfig::new("http://127.0.0.1:1/");
        cfg.queue_size = 2;
        let t = Target::new(0, &cfg, true).unwrap();
        for m in ["a", "b", "c", "d"] {
            t.push(q(m));
        }
        let left: Vec<String> = t.queue().iter().map(|x| x.n.message.clone()).collect();
        assert_eq!(left, ["c", "d"]);
        assert_eq!(t.stats().dropped, 2);
    }
}

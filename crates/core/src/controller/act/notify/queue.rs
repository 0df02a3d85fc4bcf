//! Each target's bounded queue (oldest dropped when full) and its counters, also exposed on
//! `/metrics`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use serde::Serialize;

use super::config::NotifyConfig;
use super::template::{parse_template, Field, Piece};
use super::{target_name, Notification, NotifyError, Payload, PAYLOAD_VERSION};
use crate::controller::metrics;

/// A notification waiting in a queue.
#[derive(Debug, Clone)]
pub(super) struct Queued {
    pub(super) n: Notification,
    pub(super) id: String,
    pub(super) time: DateTime<Utc>,
}

impl Queued {
    pub(super) fn payload(&self) -> Payload {
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

    pub(super) fn field(&self, f: Field) -> String {
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
pub(super) struct Counters {
    pub(super) in_flight: AtomicU64,
    pub(super) sent: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) retries: AtomicU64,
    pub(super) dropped: AtomicU64,
}

pub(super) struct Target {
    pub(super) name: String,
    pub(super) cfg: NotifyConfig,
    pub(super) pieces: Option<Vec<Piece>>,
    pub(super) http: Box<dyn super::post::WebhookPost>,
    queue: Mutex<VecDeque<Queued>>,
    pub(super) wake: tokio::sync::Notify,
    pub(super) counters: Counters,
}

impl Target {
    pub(super) fn new(
        index: usize,
        cfg: &NotifyConfig,
        allow_loopback: bool,
    ) -> Result<Self, NotifyError> {
        let name = target_name(index, &cfg.url);
        if let Ok(url) = reqwest::Url::parse(&cfg.url) {
            crate::http::check_destination(&url, allow_loopback).map_err(|why| {
                NotifyError::Refused {
                    target: name.clone(),
                    why,
                }
            })?;
        }
        let http = crate::http::builder(cfg.ca_file.as_deref()).map_err(|e| NotifyError::Tls {
            target: name.clone(),
            source: e,
        })?;
        // No redirect (a 3xx is the answer: the signed body is never re-sent to another
        // host); names resolving to metadata, link-local or unspecified addresses refused.
        let http = crate::http::guard(http, allow_loopback)
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
        Ok(Target::with_post(
            name,
            cfg,
            pieces,
            Box::new(super::post::http::HttpPost(http)),
        ))
    }

    /// A target posting through `http` (the delivery tests use a fake one).
    pub(super) fn with_post(
        name: String,
        cfg: &NotifyConfig,
        pieces: Option<Vec<Piece>>,
        http: Box<dyn super::post::WebhookPost>,
    ) -> Self {
        Target {
            name,
            cfg: cfg.clone(),
            pieces,
            http,
            queue: Mutex::new(VecDeque::new()),
            wake: tokio::sync::Notify::new(),
            counters: Counters::default(),
        }
    }

    pub(super) fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Queued>> {
        crate::sync::lock(&self.queue)
    }

    /// Appends, dropping the oldest entry when full.
    pub(super) fn push(&self, q: Queued) {
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

    pub(super) fn stats(&self) -> NotifyStats {
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
/// (bounded; no URLs, no node names). Holds the targets, not the [`Notifier`](super::Notifier), so the registry
/// does not keep the delivery tasks alive.
pub(super) struct NotifyMetrics(pub(super) Vec<Arc<Target>>);

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

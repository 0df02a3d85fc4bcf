//! A lasting, bounded history of what nodekeeper did to each node, with no database: one
//! ConfigMap per node in the controller's namespace ([`store`]), read by `nodekeeper status NODE
//! --history` and `kubectl nodekeeper history NODE` (docs/operations.md, "History").
//!
//! - **What is recorded**: each batch of one node's actions the actor carries out (one entry:
//!   what, why, the condition or notice that drove it, its Events' notes, outcome, duration:
//!   [`of_batch`]), and each drain's end ([`of_drain`]: completed, timed out, cancelled, with
//!   what it removed and how long it took). Dry-run decisions change nothing and are not
//!   recorded.
//! - **Never in the way**: [`History::record`] queues the entry and returns; the [`Writer`]
//!   (a supervised task) writes each node's queued entries in one read-merge-write. A write that
//!   fails is logged and counted (`nodekeeper_engine_history_write_failures_total`); the action
//!   it describes has happened regardless.
//! - **Bounded**: by count and age (`[controller.history]`, [`config`]) and by size
//!   ([`config::MAX_BYTES`]), in the pure [`entry::merge`]; once an hour the leader sweeps every
//!   history: entries past `max_age` go, and a history left empty (its node long gone) is
//!   deleted.
//!
//! Why a ConfigMap per node and not a Node annotation: every Node write wakes every Node
//! watcher (kubelet, the scheduler's cache, Karpenter, kube-controller-manager, this
//! controller's own reflector) and a Node replaced by a new one loses it; a ConfigMap is watched
//! by nobody, outlives its node and holds up to 1 MiB. Not Events: the API server drops them
//! after `--event-ttl` (1 h by default). Not one ConfigMap for all nodes: every write would
//! contend on one object, and its 1 MiB would bound the fleet.

pub mod config;
pub mod entry;
pub mod store;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Node;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

pub use config::HistoryConfig;
pub use entry::Entry;

use crate::controller::act::drain::DrainReport;
use crate::controller::metrics::EngineMetrics;
use crate::controller::policy::view::keys;
use crate::controller::policy::Action;

/// Entries queued at most; past it an entry is dropped (and counted as a failed write).
pub const QUEUE: usize = 4096;
/// How often the leader ages every history out.
pub const SWEEP_EVERY: Duration = Duration::from_secs(3600);
/// How long the writer keeps writing what is queued once it is told to stop.
pub const FLUSH_ON_STOP: Duration = Duration::from_secs(2);

/// Where the actor and the drains hand their entries: cheap to clone, never blocks.
#[derive(Clone)]
pub struct History {
    tx: mpsc::Sender<(String, Entry)>,
    metrics: Arc<EngineMetrics>,
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History").finish_non_exhaustive()
    }
}

impl History {
    /// Queues `entry` for `node`'s history; a full queue drops it (logged and counted).
    pub fn record(&self, node: &str, entry: Entry) {
        if let Err(e) = self.tx.try_send((node.to_string(), entry.bounded())) {
            self.metrics
                .history_write_failures
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(node, error = %e, "history entry dropped");
        }
    }
}

/// Writes the queued entries ([`History::record`]) and sweeps the histories on the leader.
pub struct Writer {
    rx: mpsc::Receiver<(String, Entry)>,
    store: store::Histories,
    cfg: HistoryConfig,
    metrics: Arc<EngineMetrics>,
}

/// A recorder and the writer behind it, for the histories in `namespace`.
pub fn channel(
    client: kube::Client,
    namespace: &str,
    cfg: HistoryConfig,
    metrics: Arc<EngineMetrics>,
) -> (History, Writer) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let history = History {
        tx,
        metrics: metrics.clone(),
    };
    let writer = Writer {
        rx,
        store: store::Histories::new(client, namespace),
        cfg,
        metrics,
    };
    (history, writer)
}

impl Writer {
    /// Runs until `cancel`: writes what is queued, node by node; once this replica leads and
    /// every [`SWEEP_EVERY`] while it does, ages the histories out
    /// ([`store::Histories::sweep`]). On `cancel`, writes what is queued for at most
    /// [`FLUSH_ON_STOP`].
    pub async fn run(mut self, mut leader: watch::Receiver<bool>, cancel: CancellationToken) {
        let mut sweep = tokio::time::interval(SWEEP_EVERY);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut batch = Vec::new();
        let mut leading = *leader.borrow_and_update();
        let mut watching = true;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                n = self.rx.recv_many(&mut batch, 256) => {
                    if n == 0 {
                        return;
                    }
                    self.write(std::mem::take(&mut batch)).await;
                }
                changed = leader.changed(), if watching => {
                    // The election ended (shutdown): no more sweeps.
                    watching = changed.is_ok();
                    let now = watching && *leader.borrow_and_update();
                    if now && !leading {
                        sweep.reset();
                        self.sweep().await;
                    }
                    leading = now;
                }
                _ = sweep.tick() => {
                    if leading {
                        self.sweep().await;
                    }
                }
            }
        }
        self.rx.close();
        let flush = async {
            while let Some(e) = self.rx.recv().await {
                batch.push(e);
            }
            self.write(batch).await;
        };
        let _ = tokio::time::timeout(FLUSH_ON_STOP, flush).await;
    }

    async fn write(&self, batch: Vec<(String, Entry)>) {
        let mut by_node: BTreeMap<String, Vec<Entry>> = BTreeMap::new();
        for (node, e) in batch {
            by_node.entry(node).or_default().push(e);
        }
        let limits = self.cfg.limits();
        for (node, entries) in by_node {
            match self
                .store
                .append(&node, &entries, &limits, Utc::now())
                .await
            {
                Ok(_) => {
                    self.metrics.history_writes.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    self.metrics
                        .history_write_failures
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        node,
                        error = %crate::telemetry::error_chain(&e),
                        entries = entries.len(),
                        "history not written"
                    );
                }
            }
        }
    }

    async fn sweep(&self) {
        match self.store.sweep(&self.cfg.limits(), Utc::now()).await {
            Ok(s) => tracing::info!(
                seen = s.seen,
                trimmed = s.trimmed,
                deleted = s.deleted,
                "histories aged out"
            ),
            Err(e) => tracing::warn!(error = %e, "history sweep failed; retried in an hour"),
        }
    }
}

/// The order in which an action kind tells what a batch did ([`Entry::action`]).
const HEADLINE: [&str; 13] = [
    "request_replacement",
    "retire_node",
    "request_reboot",
    "start_drain",
    "stop_drain",
    "hold",
    "cordon",
    "uncordon",
    "taint",
    "untaint",
    "label",
    "annotate",
    "event",
];

/// The entry for one batch of `actions` on a node that, before it, looked like `before`;
/// started at `time`, it took `took` and ended with `error` (none: done). `None` for a batch
/// that only records the node's first Ready (bookkeeping, not an action). Pure.
pub fn of_batch(
    actions: &[Action],
    before: Option<&Node>,
    time: DateTime<Utc>,
    took: Duration,
    error: Option<String>,
) -> Option<Entry> {
    let bookkeeping =
        |a: &Action| matches!(a, Action::Annotate { key, .. } if key == keys::SEEN_READY);
    if actions.iter().all(bookkeeping) {
        return None;
    }
    let mut changes: Vec<String> = Vec::new();
    let mut events = Vec::new();
    let (mut why, mut step, mut notice) = (None, None, None);
    for a in actions {
        let kind = crate::controller::act::actions::kind(a);
        if !changes.iter().any(|c| c == kind) {
            changes.push(kind.to_string());
        }
        match a {
            Action::Annotate {
                key,
                value: Some(v),
            } => match key.as_str() {
                keys::REASON => why = Some(v.clone()),
                keys::REPAIR_STEP => step = Some(v.clone()),
                keys::INTERRUPTION => notice = Some(v.clone()),
                _ => {}
            },
            Action::StartDrain { reason, .. }
            | Action::RequestReboot { reason, .. }
            | Action::RequestReplacement { reason, .. }
            | Action::RetireNode { reason, .. }
            | Action::AbandonReplacement { reason, .. } => {
                why.get_or_insert_with(|| reason.clone());
            }
            Action::Hold(h) => {
                why.get_or_insert_with(|| h.blocker.message());
            }
            Action::Event { message, .. } => events.push(message.clone()),
            _ => {}
        }
    }
    let annotation = |k: &str| {
        before
            .and_then(|n| n.metadata.annotations.as_ref()?.get(k))
            .cloned()
    };
    let why = why.or_else(|| annotation(keys::REASON));
    let step = step.or_else(|| annotation(keys::REPAIR_STEP));
    let notice = notice.or_else(|| annotation(keys::INTERRUPTION));
    let mut inputs = Vec::new();
    if let Some(c) = why.as_deref().and_then(|w| condition_input(w, before)) {
        inputs.push(c);
    }
    if let Some(n) = notice.filter(|_| {
        why.as_deref()
            .is_some_and(|w| w.starts_with("interruption"))
    }) {
        inputs.push(format!("notice {n}"));
    }
    let action = HEADLINE
        .iter()
        .find(|k| changes.iter().any(|c| c == *k))
        .map_or("event", |k| k);
    Some(Entry {
        changes,
        step,
        why,
        inputs,
        outcome: if error.is_some() { "error" } else { "ok" }.into(),
        detail: error,
        duration_ms: took.as_millis() as u64,
        events,
        ..Entry::new(time, action)
    })
}

/// For a repair's `why` (`repair:Type=Status`): the node's condition of that type as it stood,
/// `Type=Status Reason: message (since …)`.
fn condition_input(why: &str, node: Option<&Node>) -> Option<String> {
    let (type_, _) = why.strip_prefix("repair:")?.split_once('=')?;
    let c = node?
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)?;
    let mut s = format!("{}={}", c.type_, c.status);
    if let Some(r) = c.reason.as_deref().filter(|r| !r.is_empty()) {
        s.push_str(&format!(" {r}"));
    }
    if let Some(m) = c.message.as_deref().filter(|m| !m.is_empty()) {
        s.push_str(&format!(": {m}"));
    }
    if let Some(t) = &c.last_transition_time {
        s.push_str(&format!(" (since {})", t.0));
    }
    Some(s)
}

/// The entry for a drain of a node that started at `time` for `why`, ended `outcome`
/// (`completed`, `failed`: timed out, `cancelled`, `error`) after `took`, with `report` (what it
/// removed) and `error`. Pure.
pub fn of_drain(
    time: DateTime<Utc>,
    why: &str,
    outcome: &str,
    took: Duration,
    report: Option<&DrainReport>,
    error: Option<String>,
) -> Entry {
    let detail = error.or_else(|| {
        report.map(|r| {
            let forced = r.removed.iter().filter(|p| p.forced).count();
            let mut s = format!(
                "{} pod(s) removed, {} left alone",
                r.removed.len(),
                r.skipped.len()
            );
            if forced > 0 {
                s.push_str(&format!(" ({forced} force-deleted at the deadline)"));
            }
            s
        })
    });
    Entry {
        why: Some(why.to_string()),
        outcome: outcome.to_string(),
        detail,
        duration_ms: took.as_millis() as u64,
        ..Entry::new(time, "drain")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::controller::catalog::{EventType, Reason};
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::entry::tests::t0;

    fn set(key: &str, v: &str) -> Action {
        Action::Annotate {
            key: key.into(),
            value: Some(v.into()),
        }
    }

    fn node(annotations: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: "False".into(),
                    reason: Some("KubeletNotReady".into()),
                    message: Some("container runtime is down".into()),
                    ..NodeCondition::default()
                }]),
                ..NodeStatus::default()
            }),
            ..Node::default()
        }
    }

    #[test]
    fn a_batch_says_what_why_and_what_drove_it() {
        let ms = Duration::from_millis(7);
        let repair_start = [
            set(keys::STATE, "repairing"),
            set(keys::REASON, "repair:Ready=False"),
            Action::Cordon,
            set(keys::REPAIR_STEP, "drain"),
            Action::Event {
                type_: EventType::Warning,
                reason: Reason::RepairStarted,
                message: "repair:Ready=False: repair started with step drain".into(),
            },
            Action::StartDrain {
                deadline: t0(),
                reason: "repair:Ready=False".into(),
            },
        ];
        let before = node(&[]);
        let e = of_batch(&repair_start, Some(&before), t0(), ms, None).unwrap();
        assert_eq!(e.action, "start_drain");
        assert_eq!(e.changes, ["annotate", "cordon", "event", "start_drain"]);
        assert_eq!(e.step.as_deref(), Some("drain"));
        assert_eq!(e.why.as_deref(), Some("repair:Ready=False"));
        assert_eq!(
            e.inputs,
            ["Ready=False KubeletNotReady: container runtime is down"]
        );
        assert_eq!((e.outcome.as_str(), e.duration_ms), ("ok", 7));
        assert_eq!(e.events.len(), 1);

        // A release: why and step come from the node as it stood.
        let release = [
            Action::Annotate {
                key: keys::REASON.into(),
                value: None,
            },
            Action::Uncordon,
        ];
        let before = node(&[
            (keys::REASON, "repair:Ready=False"),
            (keys::REPAIR_STEP, "drain"),
        ]);
        let e = of_batch(&release, Some(&before), t0(), ms, Some("boom".into())).unwrap();
        assert_eq!(
            (e.action.as_str(), e.why.as_deref(), e.step.as_deref()),
            ("uncordon", Some("repair:Ready=False"), Some("drain"))
        );
        assert_eq!(
            (e.outcome.as_str(), e.detail.as_deref()),
            ("error", Some("boom"))
        );

        // A notice: its annotation is the input.
        let notice = [
            set(keys::REASON, "interruption:preemption"),
            set(keys::INTERRUPTION, "preemption/ev-1/2026-12-01T00:02:00Z"),
            Action::Cordon,
        ];
        let e = of_batch(&notice, None, t0(), ms, None).unwrap();
        assert_eq!(e.inputs, ["notice preemption/ev-1/2026-12-01T00:02:00Z"]);
        assert_eq!(e.action, "cordon");

        // Bookkeeping alone is no entry; nothing is none.
        assert!(of_batch(&[set(keys::SEEN_READY, "x")], None, t0(), ms, None).is_none());
        assert!(of_batch(&[], None, t0(), ms, None).is_none());
    }

    #[test]
    fn a_drain_says_what_it_removed() {
        let e = of_drain(
            t0(),
            "repair:Ready=False",
            "completed",
            Duration::from_secs(3),
            None,
            None,
        );
        assert_eq!(
            (e.action.as_str(), e.outcome.as_str(), e.duration_ms),
            ("drain", "completed", 3000)
        );
        let e = of_drain(
            t0(),
            "x",
            "error",
            Duration::ZERO,
            None,
            Some("forbidden".into()),
        );
        assert_eq!(e.detail.as_deref(), Some("forbidden"));
    }
}

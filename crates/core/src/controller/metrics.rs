//! The disruption engine's metrics, and the controller's one metrics registry: every component
//! registers into a `prometheus_client` [`Registry`] (`register(&self, &mut Registry)`), and
//! `/metrics` encodes it once ([`encode`], Prometheus text format 0.0.4).
//!
//! Labels are bounded: action kinds and results are fixed sets, groups are node pools (the
//! value of `budgets.group_by`); no metric carries a node or pod name. Names are listed in
//! docs/catalog.md (a test compares the exposed set with that table).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::controller::policy::GroupStatus;
use crate::sync::lock;

/// `Content-Type` of [`encode`]'s output.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The registry in the Prometheus text format (0.0.4).
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String does not fail; the collectors here do not either.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, registry);
    out
}

/// The name a counter is registered under: `prometheus_client` appends `_total` when it encodes
/// a counter, so `full` (the exposed name, as in docs/catalog.md) must end with it.
pub fn counter_name(full: &'static str) -> &'static str {
    full.strip_suffix("_total")
        .unwrap_or_else(|| panic!("counter {full} must end with _total"))
}

/// Encodes one unlabelled counter named `full` (exposed name, with `_total`) from a collector.
pub fn encode_counter(
    enc: &mut DescriptorEncoder,
    full: &'static str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    let m = ConstCounter::new(value);
    m.encode(enc.encode_descriptor(counter_name(full), help, None, MetricType::Counter)?)
}

/// Encodes one unlabelled gauge from a collector.
pub fn encode_gauge<N>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: N,
) -> Result<(), std::fmt::Error>
where
    ConstGauge<N>: EncodeMetric,
{
    let m = ConstGauge::new(value);
    m.encode(enc.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

/// Encodes a metric family (counter or gauge) from a collector: one sample per label set.
pub fn encode_family<L, M>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric_type: MetricType,
    samples: impl IntoIterator<Item = (L, M)>,
) -> Result<(), std::fmt::Error>
where
    L: prometheus_client::encoding::EncodeLabelSet,
    M: EncodeMetric,
{
    let mut family = enc.encode_descriptor(name, help, None, metric_type)?;
    for (labels, m) in samples {
        m.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Upper bounds (seconds) of the drain duration histogram.
pub const DRAIN_BUCKETS: [f64; 10] = [
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];

/// Upper bounds (seconds) of the notice → cordon histogram: the fast path answers in
/// milliseconds (docs/dev/benchmarks.md); the top buckets catch an API server that stalls.
pub const NOTICE_CORDON_BUCKETS: [f64; 10] =
    [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

/// Result label of an executed action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ActionResult {
    /// Done.
    Ok,
    /// Failed (retried by the next reconcile).
    Error,
    /// Not executed: dry run.
    DryRun,
}

impl ActionResult {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ActionResult::Ok => "ok",
            ActionResult::Error => "error",
            ActionResult::DryRun => "dry_run",
        }
    }
}

/// A family whose `# HELP`/`# TYPE` lines are written while it has no series yet
/// (`prometheus_client` leaves empty families out): the exposed set of metrics does not
/// depend on what happened since the start.
#[derive(Debug, Clone)]
struct Described<M>(M);

impl<M: EncodeMetric> EncodeMetric for Described<M> {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }
}

/// Labels of `nodekeeper_engine_actions_total`: `kind`, `result`.
type ActionLabels = [(&'static str, &'static str); 2];
/// Why the engine's loop woke (`nodekeeper_engine_wakes_total{cause}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The tick (`[controller.engine] tick`).
    Tick,
    /// A change the policy sees: a Node past the wake filter, a notice, a drain's progress, a
    /// NodePool.
    Change,
    /// A repair toleration's expiry.
    Due,
    /// A change of leadership.
    Leader,
}

impl Wake {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Wake::Tick => "tick",
            Wake::Change => "change",
            Wake::Due => "due",
            Wake::Leader => "leader",
        }
    }
}

/// Labels of `nodekeeper_engine_drain_duration_seconds` (`result`) and
/// `nodekeeper_engine_wakes_total` (`cause`).
pub(crate) type OneLabel = [(&'static str, &'static str); 1];

fn drain_histogram() -> Histogram {
    Histogram::new(DRAIN_BUCKETS)
}

/// Counters and gauges of the engine. The atomics and the per-group figures are read when
/// `/metrics` is encoded ([`EngineMetrics::register`]).
#[derive(Debug)]
pub struct EngineMetrics {
    actions: Family<ActionLabels, Counter>,
    wakes: Family<OneLabel, Counter>,
    drains: Family<OneLabel, Histogram, fn() -> Histogram>,
    notice_to_cordon: Histogram,
    groups: Mutex<Vec<GroupStatus>>,
    held: Mutex<BTreeMap<&'static str, u64>>,
    /// Evictions refused by a PodDisruptionBudget (counted once per blocking pod episode).
    pub evictions_blocked_by_pdb: AtomicU64,
    /// Reconciles run.
    pub reconciles: AtomicU64,
    /// Reconciles that ran as leader and executed at least one action.
    pub reconciles_with_actions: AtomicU64,
    /// Drains running now.
    pub drains_running: AtomicU64,
    /// Replacement requests accepted by the provider.
    pub replacements: AtomicU64,
    /// Duration of the last reconcile, microseconds.
    pub last_reconcile_us: AtomicU64,
    /// Notices acted on by the fast path (one node, before the full reconcile).
    pub fast_paths: AtomicU64,
    /// Repair tolerations acted on at their expiry for their groups alone, before the full
    /// reconcile.
    pub due_paths: AtomicU64,
    /// Reconciles not started because the next repair toleration expires before they would
    /// end (the due path and the reconcile run at the expiry instead).
    pub reconciles_held: AtomicU64,
    /// Taint patches refused with 409 (the Node changed since the copy they were computed from).
    pub node_write_conflicts: AtomicU64,
    /// Node histories written (`act/history`).
    pub history_writes: AtomicU64,
    /// History entries not written (the API refused, conflicts, a full queue).
    pub history_write_failures: AtomicU64,
}

impl Default for EngineMetrics {
    fn default() -> Self {
        EngineMetrics {
            actions: Family::default(),
            wakes: Family::default(),
            drains: Family::new_with_constructor(drain_histogram as fn() -> Histogram),
            notice_to_cordon: Histogram::new(NOTICE_CORDON_BUCKETS),
            groups: Mutex::default(),
            held: Mutex::default(),
            evictions_blocked_by_pdb: AtomicU64::default(),
            reconciles: AtomicU64::default(),
            reconciles_with_actions: AtomicU64::default(),
            drains_running: AtomicU64::default(),
            replacements: AtomicU64::default(),
            last_reconcile_us: AtomicU64::default(),
            fast_paths: AtomicU64::default(),
            due_paths: AtomicU64::default(),
            reconciles_held: AtomicU64::default(),
            node_write_conflicts: AtomicU64::default(),
            history_writes: AtomicU64::default(),
            history_write_failures: AtomicU64::default(),
        }
    }
}

impl EngineMetrics {
    /// Counts one action of `kind` with `result`.
    pub fn action(&self, kind: &'static str, result: ActionResult) {
        self.actions
            .get_or_create(&[("kind", kind), ("result", result.as_str())])
            .inc();
    }

    /// How many actions of `kind` ended with `result` (tests, status).
    pub fn action_count(&self, kind: &'static str, result: ActionResult) -> u64 {
        self.actions
            .get(&[("kind", kind), ("result", result.as_str())])
            .map_or(0, |c| c.get())
    }

    /// Counts one wake of the engine's loop.
    pub fn wake(&self, cause: Wake) {
        self.wakes.get_or_create(&[("cause", cause.as_str())]).inc();
    }

    /// How many times the engine's loop woke for `cause` (tests).
    pub fn wake_count(&self, cause: Wake) -> u64 {
        self.wakes
            .get(&[("cause", cause.as_str())])
            .map_or(0, |c| c.get())
    }

    /// Observes a finished drain (`result`: `completed`, `failed`, `cancelled`).
    pub fn drain_finished(&self, result: &'static str, took: Duration) {
        self.drains
            .get_or_create(&[("result", result)])
            .observe(took.as_secs_f64());
    }

    /// Observes the time from the engine taking a notice to its node's cordon patch answered
    /// (the fast path).
    pub fn notice_cordoned(&self, took: Duration) {
        self.notice_to_cordon.observe(took.as_secs_f64());
    }

    /// Replaces the per-group figures with the last decision's.
    pub fn set_groups(&self, groups: Vec<GroupStatus>) {
        *lock(&self.groups) = groups;
    }

    /// Nodes currently held, by blocker reason (`BlockedByBudget`, ...).
    pub fn set_held(&self, held: BTreeMap<&'static str, u64>) {
        *lock(&self.held) = held;
    }

    /// Registers the engine's metrics into the controller's registry.
    pub fn register(self: &Arc<Self>, registry: &mut Registry) {
        registry.register(
            counter_name("nodekeeper_engine_actions_total"),
            "Actions executed, by kind and result",
            Described(self.actions.clone()),
        );
        registry.register(
            counter_name("nodekeeper_engine_wakes_total"),
            "Wakes of the engine's loop, by cause",
            Described(self.wakes.clone()),
        );
        registry.register(
            "nodekeeper_engine_drain_duration_seconds",
            "Wall time of each drain, by result",
            Described(self.drains.clone()),
        );
        registry.register(
            "nodekeeper_engine_notice_to_cordon_seconds",
            "Time from the engine taking a notice to its node's cordon patch answered (fast path)",
            Described(self.notice_to_cordon.clone()),
        );
        registry.register_collector(Box::new(self.clone()));
    }

    /// The engine's metrics alone, in the Prometheus text format (tests).
    pub fn render(self: &Arc<Self>) -> String {
        let mut registry = Registry::default();
        self.register(&mut registry);
        encode(&registry)
    }
}

/// The figures kept outside `prometheus_client`'s types (atomics the engine updates, the last
/// decision's per-group figures), read at encode time.
impl Collector for EngineMetrics {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let held: Vec<_> = lock(&self.held)
            .iter()
            .map(|(reason, n)| ([("reason", *reason)], ConstGauge::new(*n as i64)))
            .collect();
        encode_family(
            &mut enc,
            "nodekeeper_engine_nodes_held",
            "Nodes held back now, by reason.",
            MetricType::Gauge,
            held,
        )?;
        encode_counter(
            &mut enc,
            "nodekeeper_engine_evictions_blocked_by_pdb_total",
            "Evictions a PodDisruptionBudget started refusing (once per blocking episode).",
            g(&self.evictions_blocked_by_pdb),
        )?;
        encode_counter(
            &mut enc,
            "nodekeeper_engine_reconciles_total",
            "Reconciles run as leader.",
            g(&self.reconciles),
        )?;
        encode_gauge(
            &mut enc,
            "nodekeeper_engine_drains_running",
            "Drains evicting now.",
            g(&self.drains_running) as i64,
        )?;
        encode_counter(
            &mut enc,
            "nodekeeper_engine_replacements_total",
            "Replacement requests accepted by the provider.",
            g(&self.replacements),
        )?;
        encode_gauge(
            &mut enc,
            "nodekeeper_engine_reconcile_seconds",
            "Duration of the last reconcile, seconds.",
            g(&self.last_reconcile_us) as f64 / 1e6,
        )?;
        encode_counter(
            &mut enc,
            "nodekeeper_engine_fast_paths_total",
            "Notices acted on at once for their node alone, before the full reconcile (counted once its own write is done).",
            g(&self.fast_paths),
        )?;
        encode_counter(
            &mut enc,
            "nodekeeper_engine_due_paths_total",
            "Expired repair tolerations decided at once for their groups alone, before the full reconcile.",
            g(&self.due_paths),
        )?;
        encode_counter(
            &mut enc,
            "nodekeeper_engine_reconciles_held_total",
            "Reconciles not started because the next repair toleration expires before they would end (the due path and the reconcile run at the expiry instead).",
            g(&self.reconciles_held),
        )?;
        encode_counter(
            &mut enc,
            "nodekeeper_engine_node_write_conflicts_total",
            "Taint patches refused because the Node changed since the copy they were computed from (each is re-read and retried).",
            g(&self.node_write_conflicts),
        )?;
        encode_counter(
            &mut enc,
            "nodekeeper_engine_history_writes_total",
            "Node histories written (one read-merge-write of a node's queued entries).",
            g(&self.history_writes),
        )?;
        encode_counter(
            &mut enc,
            "nodekeeper_engine_history_write_failures_total",
            "Node history writes that failed, and entries dropped from a full queue (the actions happened regardless).",
            g(&self.history_write_failures),
        )?;
        self.encode_groups(&mut enc)
    }
}

/// A per-group gauge: name, help, value.
type GroupSeries = (&'static str, &'static str, fn(&GroupStatus) -> i64);

impl EngineMetrics {
    fn encode_groups(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let groups = lock(&self.groups);
        let series: [GroupSeries; 5] = [
            ("nodekeeper_engine_group_nodes", "Nodes per group.", |s| {
                s.total as i64
            }),
            (
                "nodekeeper_engine_budget_allowed",
                "The repair budget's limit now (-1: no budget active).",
                // -1: no budget active for repairs in the group now.
                |s| s.repair_limit.map_or(-1, |l| l as i64),
            ),
            (
                "nodekeeper_engine_budget_used",
                "Nodes counted against the repair budget.",
                |s| s.counted as i64,
            ),
            (
                "nodekeeper_engine_unhealthy_nodes",
                "Nodes matching a repair policy.",
                |s| s.unhealthy as i64,
            ),
            (
                "nodekeeper_engine_repair_short_circuited",
                "1 while repairs are short-circuited.",
                |s| i64::from(s.short_circuited),
            ),
        ];
        for (name, help, value) in series {
            encode_family(
                enc,
                name,
                help,
                MetricType::Gauge,
                groups
                    .iter()
                    .map(|s| ([("group", s.group.as_str())], ConstGauge::new(value(s)))),
            )?;
        }
        Ok(())
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_bounded_series() {
        let m = Arc::new(EngineMetrics::default());
        m.action("cordon", ActionResult::Ok);
        m.action("cordon", ActionResult::Ok);
        m.action("taint", ActionResult::Error);
        m.drain_finished("completed", Duration::from_secs(3));
        m.set_groups(vec![GroupStatus {
            group: "spot\"x".into(),
            total: 4,
            counted: 1,
            repair_limit: Some(1),
            unhealthy: 2,
            short_circuited: true,
        }]);
        let t = m.render();
        assert!(
            t.contains("nodekeeper_engine_actions_total{kind=\"cordon\",result=\"ok\"} 2"),
            "{t}"
        );
        assert!(
            t.contains("nodekeeper_engine_actions_total{kind=\"taint\",result=\"error\"} 1"),
            "{t}"
        );
        assert!(
            t.contains(
                "nodekeeper_engine_drain_duration_seconds_bucket{result=\"completed\",le=\"1\"} 0"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "nodekeeper_engine_drain_duration_seconds_bucket{result=\"completed\",le=\"5\"} 1"
            ),
            "{t}"
        );
        assert!(
            t.contains("nodekeeper_engine_budget_allowed{group=\"spot\\\"x\"} 1"),
            "{t}"
        );
        assert!(
            t.contains("nodekeeper_engine_repair_short_circuited{group=\"spot\\\"x\"} 1"),
            "{t}"
        );
        assert_eq!(m.action_count("cordon", ActionResult::Ok), 2);
    }
}

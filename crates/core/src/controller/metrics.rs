//! The disruption engine's metrics, rendered on the controller's `/metrics` (Prometheus text).
//!
//! Labels are bounded: action kinds and results are fixed sets, groups are node pools (the
//! value of `budgets.group_by`); no metric carries a node or pod name. Names are listed in
//! docs/catalog.md.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::policy::GroupStatus;

/// Upper bounds (seconds) of the drain duration histogram.
pub const DRAIN_BUCKETS: [f64; 10] = [
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];

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

#[derive(Debug, Default)]
struct Histogram {
    buckets: [u64; DRAIN_BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// Counters and gauges of the engine.
#[derive(Debug, Default)]
pub struct EngineMetrics {
    actions: Mutex<BTreeMap<(&'static str, ActionResult), u64>>,
    drains: Mutex<BTreeMap<&'static str, Histogram>>,
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
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl EngineMetrics {
    /// Counts one action of `kind` with `result`.
    pub fn action(&self, kind: &'static str, result: ActionResult) {
        *lock(&self.actions).entry((kind, result)).or_default() += 1;
    }

    /// How many actions of `kind` ended with `result` (tests, status).
    pub fn action_count(&self, kind: &'static str, result: ActionResult) -> u64 {
        lock(&self.actions)
            .get(&(kind, result))
            .copied()
            .unwrap_or(0)
    }

    /// Observes a finished drain (`result`: `completed`, `failed`, `cancelled`).
    pub fn drain_finished(&self, result: &'static str, took: Duration) {
        let mut m = lock(&self.drains);
        let h = m.entry(result).or_default();
        let s = took.as_secs_f64();
        for (i, b) in DRAIN_BUCKETS.iter().enumerate() {
            if s <= *b {
                h.buckets[i] += 1;
            }
        }
        h.count += 1;
        h.sum += s;
    }

    /// Replaces the per-group figures with the last decision's.
    pub fn set_groups(&self, groups: Vec<GroupStatus>) {
        *lock(&self.groups) = groups;
    }

    /// Nodes currently held, by blocker reason (`BlockedByBudget`, ...).
    pub fn set_held(&self, held: BTreeMap<&'static str, u64>) {
        *lock(&self.held) = held;
    }

    /// Prometheus text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        out.push_str("# TYPE nodekeeper_engine_actions_total counter\n");
        for ((kind, result), n) in lock(&self.actions).iter() {
            let _ = writeln!(
                out,
                "nodekeeper_engine_actions_total{{kind=\"{kind}\",result=\"{}\"}} {n}",
                result.as_str()
            );
        }
        out.push_str("# TYPE nodekeeper_engine_nodes_held gauge\n");
        for (reason, n) in lock(&self.held).iter() {
            let _ = writeln!(
                out,
                "nodekeeper_engine_nodes_held{{reason=\"{reason}\"}} {n}"
            );
        }
        out.push_str("# TYPE nodekeeper_engine_drain_duration_seconds histogram\n");
        for (result, h) in lock(&self.drains).iter() {
            for (i, b) in DRAIN_BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "nodekeeper_engine_drain_duration_seconds_bucket{{result=\"{result}\",le=\"{b}\"}} {}",
                    h.buckets[i]
                );
            }
            let _ = writeln!(
                out,
                "nodekeeper_engine_drain_duration_seconds_bucket{{result=\"{result}\",le=\"+Inf\"}} {}\n\
                 nodekeeper_engine_drain_duration_seconds_sum{{result=\"{result}\"}} {}\n\
                 nodekeeper_engine_drain_duration_seconds_count{{result=\"{result}\"}} {}",
                h.count, h.sum, h.count
            );
        }
        let _ = write!(
            out,
            "# TYPE nodekeeper_engine_evictions_blocked_by_pdb_total counter\n\
             nodekeeper_engine_evictions_blocked_by_pdb_total {}\n\
             # TYPE nodekeeper_engine_reconciles_total counter\n\
             nodekeeper_engine_reconciles_total {}\n\
             # TYPE nodekeeper_engine_drains_running gauge\n\
             nodekeeper_engine_drains_running {}\n\
             # TYPE nodekeeper_engine_replacements_total counter\n\
             nodekeeper_engine_replacements_total {}\n\
             # TYPE nodekeeper_engine_reconcile_seconds gauge\n\
             nodekeeper_engine_reconcile_seconds {}\n\
             # TYPE nodekeeper_engine_fast_paths_total counter\n\
             nodekeeper_engine_fast_paths_total {}\n",
            g(&self.evictions_blocked_by_pdb),
            g(&self.reconciles),
            g(&self.drains_running),
            g(&self.replacements),
            g(&self.last_reconcile_us) as f64 / 1e6,
            g(&self.fast_paths),
        );
        self.render_groups(&mut out);
        out
    }

    fn render_groups(&self, out: &mut String) {
        let groups = lock(&self.groups);
        let series = [
            ("nodekeeper_engine_group_nodes", "gauge"),
            ("nodekeeper_engine_budget_allowed", "gauge"),
            ("nodekeeper_engine_budget_used", "gauge"),
            ("nodekeeper_engine_unhealthy_nodes", "gauge"),
            ("nodekeeper_engine_repair_short_circuited", "gauge"),
        ];
        for (i, (name, ty)) in series.iter().enumerate() {
            let _ = writeln!(out, "# TYPE {name} {ty}");
            for s in groups.iter() {
                let value = match i {
                    0 => s.total as i64,
                    // -1: no budget active for repairs in the group now.
                    1 => s.repair_limit.map_or(-1, |l| l as i64),
                    2 => s.counted as i64,
                    3 => s.unhealthy as i64,
                    _ => i64::from(s.short_circuited),
                };
                let _ = writeln!(out, "{name}{{group=\"{}\"}} {value}", escape(&s.group));
            }
        }
    }
}

/// Escapes a label value (backslash, quote, newline).
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_bounded_series() {
        let m = EngineMetrics::default();
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

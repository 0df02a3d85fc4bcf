//! Simulated control loops: kubelet, node lifecycle, scheduler, workload controllers, provisioner.
//!
//! Each loop is a task ticking in real time and reading simulated time from the store clock, so a
//! time scale of 60 makes a 40 s node-monitor grace period pass in under a second.

pub mod disruption;
pub mod kubelet;
pub mod lifecycle;
pub mod provisioner;
pub mod recorder;
pub mod scheduler;
pub mod workloads;

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::Sim;

/// Which loops run and their (simulated) timings.
#[derive(Debug, Clone)]
pub struct LoopOptions {
    /// Real-time tick of every loop.
    pub tick: Duration,
    /// Kubelets: Lease heartbeats, Ready condition, pods start, graceful termination.
    pub kubelet: bool,
    /// Node lifecycle: Ready → Unknown after missed heartbeats.
    pub lifecycle: bool,
    /// Scheduler.
    pub scheduler: bool,
    /// ReplicaSet, Deployment, DaemonSet, StatefulSet and disruption controllers and owner garbage
    /// collection.
    pub controllers: bool,
    /// Karpenter-like NodeClaim provisioner.
    pub provisioner: bool,
    /// Simulated interval between kubelet heartbeats.
    pub heartbeat_interval: Duration,
    /// Simulated time without heartbeat before a node turns Unknown.
    pub node_monitor_grace: Duration,
    /// Simulated time from binding to Running+Ready.
    pub pod_start_delay: Duration,
    /// Simulated time from NodeClaim deletion to node removal.
    pub terminate_delay: Duration,
    /// Simulated time from node removal to the replacement node.
    pub launch_delay: Duration,
}

impl Default for LoopOptions {
    fn default() -> Self {
        LoopOptions {
            tick: Duration::from_millis(100),
            kubelet: true,
            lifecycle: true,
            scheduler: true,
            controllers: true,
            provisioner: true,
            heartbeat_interval: Duration::from_secs(10),
            node_monitor_grace: Duration::from_secs(40),
            pod_start_delay: Duration::from_secs(2),
            terminate_delay: Duration::from_secs(30),
            launch_delay: Duration::from_secs(60),
        }
    }
}

impl LoopOptions {
    /// No loops at all.
    pub fn none() -> Self {
        LoopOptions {
            kubelet: false,
            lifecycle: false,
            scheduler: false,
            controllers: false,
            provisioner: false,
            ..Default::default()
        }
    }
}

/// Starts the enabled loops; they stop when `cancel` fires.
pub fn spawn(sim: Arc<Sim>, cancel: CancellationToken) {
    let o = sim.opts.loops.clone();
    if o.kubelet {
        let mut k = kubelet::Kubelets::default();
        let lo = o.clone();
        every(&sim, &cancel, o.tick, move |s| k.tick(s, &lo));
    }
    if o.lifecycle {
        let lo = o.clone();
        every(&sim, &cancel, o.tick, move |s| lifecycle::tick(s, &lo));
    }
    if o.scheduler {
        every(&sim, &cancel, o.tick, scheduler::tick);
    }
    if o.controllers {
        let mut last = None;
        let mut skipped = 0u32;
        every(&sim, &cancel, o.tick, move |s| {
            // The controllers read only these resources: when none changed since the last pass
            // (the steady state of a big cluster), the pass is skipped, except every 50th tick.
            let inputs = workloads::INPUTS.map(|r| s.store.last_write(r()));
            if last == Some(inputs) && skipped < 50 {
                skipped += 1;
                return;
            }
            skipped = 0;
            workloads::deployments(s);
            workloads::replicasets(s);
            workloads::daemonsets(s);
            workloads::statefulsets(s);
            workloads::garbage_collect(s);
            disruption::tick(s);
            last = Some(inputs);
        });
    }
    if o.provisioner {
        let mut p = provisioner::Provisioner::default();
        let lo = o.clone();
        every(&sim, &cancel, o.tick, move |s| p.tick(s, &lo));
    }
}

/// Runs `f` every `tick` until cancelled.
fn every(
    sim: &Arc<Sim>,
    cancel: &CancellationToken,
    tick: Duration,
    mut f: impl FnMut(&Sim) + Send + 'static,
) {
    let sim = sim.clone();
    let cancel = cancel.clone();
    tokio::spawn(async move {
        let mut t = tokio::time::interval(tick);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = t.tick() => {
                    // A malformed object must not kill the loop: log and carry on.
                    let run = std::panic::AssertUnwindSafe(|| f(&sim));
                    if std::panic::catch_unwind(run).is_err() {
                        tracing::error!("a simulated control loop panicked on this tick; continuing");
                    }
                }
            }
        }
    });
}

/// `metadata.name`.
pub fn name_of(o: &Value) -> &str {
    o.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// `metadata.namespace` ("" for cluster-scoped).
pub fn ns_of(o: &Value) -> &str {
    o.pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// `metadata.uid`.
pub fn uid_of(o: &Value) -> &str {
    o.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Status of a condition by type.
pub fn condition_status<'a>(o: &'a Value, type_: &str) -> Option<&'a str> {
    o.pointer("/status/conditions")
        .and_then(Value::as_array)?
        .iter()
        .find(|c| c["type"] == type_)
        .and_then(|c| c["status"].as_str())
}

/// CPU quantity in millicores (`100m`, `2`, `0.5`); unparsable counts as 0.
pub fn cpu_millis(q: &str) -> i64 {
    if let Some(m) = q.strip_suffix('m') {
        return m.parse().unwrap_or(0);
    }
    q.parse::<f64>()
        .map(|c| (c * 1000.0).round() as i64)
        .unwrap_or(0)
}

/// Whether a pod tolerates a taint.
pub fn tolerates(pod: &Value, taint: &Value) -> bool {
    let tols = pod.pointer("/spec/tolerations").and_then(Value::as_array);
    tols.into_iter().flatten().any(|t| {
        let key = t["key"].as_str().unwrap_or_default();
        let exists = t["operator"].as_str() == Some("Exists");
        let effect_ok = t["effect"]
            .as_str()
            .is_none_or(|e| e.is_empty() || Some(e) == taint["effect"].as_str());
        let key_ok = (key.is_empty() && exists) || Some(key) == taint["key"].as_str();
        let value_ok = exists
            || t["value"].as_str().unwrap_or_default()
                == taint["value"].as_str().unwrap_or_default();
        effect_ok && key_ok && value_ok
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn quantities_and_tolerations() {
        assert_eq!(cpu_millis("100m"), 100);
        assert_eq!(cpu_millis("2"), 2000);
        assert_eq!(cpu_millis("0.5"), 500);
        assert_eq!(cpu_millis("bogus"), 0);
        let taint = json!({"key": "k", "value": "v", "effect": "NoSchedule"});
        let cases = vec![
            (json!([{"operator": "Exists"}]), true),
            (json!([{"key": "k", "operator": "Exists"}]), true),
            (
                json!([{"key": "k", "operator": "Equal", "value": "v"}]),
                true,
            ),
            (
                json!([{"key": "k", "operator": "Equal", "value": "w"}]),
                false,
            ),
            (
                json!([{"key": "k", "operator": "Exists", "effect": "NoExecute"}]),
                false,
            ),
            (json!([{"key": "other", "operator": "Exists"}]), false),
            (json!([]), false),
        ];
        for (tols, want) in cases {
            assert_eq!(
                tolerates(&json!({"spec": {"tolerations": tols}}), &taint),
                want,
                "{tols}"
            );
        }
    }
}

//! Simulated kubelets (one loop for all nodes): Lease heartbeats in `kube-node-lease`, the Ready
//! condition, pods bound to the node going Running+Ready after a delay, graceful termination.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::{condition_status, name_of, LoopOptions};
use crate::apiserver::admin::upsert_condition;
use crate::apiserver::clock::{fmt_micro, fmt_time, parse_time};
use crate::apiserver::resources::well_known;
use crate::apiserver::scenario::running_status;
use crate::apiserver::store::{Filter, WriteTarget};
use crate::apiserver::Sim;

/// State of the kubelet loop: when each node last heartbeated.
#[derive(Debug, Default)]
pub struct Kubelets {
    last_beat: HashMap<String, DateTime<Utc>>,
}

impl Kubelets {
    /// One pass over all nodes and pods.
    pub fn tick(&mut self, sim: &Sim, o: &LoopOptions) {
        let now = sim.store.clock.now();
        let nodes = sim
            .store
            .list(well_known::nodes(), &Filter::default(), None, None)
            .items;
        let mut alive = HashMap::new();
        for node in &nodes {
            let name = name_of(node).to_string();
            // A deleted Node is gone with its kubelet, unless a finalizer holds it: then the machine
            // still runs (Karpenter's termination drains it before it terminates the instance).
            let held = node
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .is_some_and(|f| !f.is_empty());
            let up = !sim.nodes.heartbeat_stopped(&name)
                && (node.pointer("/metadata/deletionTimestamp").is_none() || held);
            alive.insert(name.clone(), up);
            if !up {
                continue;
            }
            let due = self.last_beat.get(&name).is_none_or(|t| {
                now - *t >= chrono::Duration::from_std(o.heartbeat_interval).unwrap_or_default()
            });
            if due {
                self.last_beat.insert(name.clone(), now);
                renew_lease(sim, &name, node, now);
            }
            report_ready(sim, &name, node, now);
        }
        self.last_beat.retain(|n, _| alive.contains_key(n));
        start_pods(sim, o, &alive, now);
        sim.store
            .txn(|t| t.reap_terminated_pods(|n| alive.get(n).copied().unwrap_or(false)));
    }
}

fn renew_lease(sim: &Sim, node: &str, node_obj: &Value, now: DateTime<Utc>) {
    let leases = well_known::leases();
    let renew = fmt_micro(now);
    sim.store.txn(|t| {
        if t.get(leases, "kube-node-lease", node).is_some() {
            let _ = t.modify(leases, "kube-node-lease", node, WriteTarget::Internal, |l| {
                let mut l = l.clone();
                l["spec"]["renewTime"] = json!(renew);
                Ok(l)
            });
        } else {
            let lease = json!({"metadata": {"name": node, "ownerReferences": [{"apiVersion": "v1", "kind": "Node",
                    "name": node, "uid": node_obj["metadata"]["uid"]}]},
                "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": renew}});
            let _ = t.create(leases, "kube-node-lease", lease);
        }
    });
}

/// The kubelet's pressure conditions, as it reports them when there is no pressure.
const PRESSURE: [(&str, &str, &str); 3] = [
    (
        "MemoryPressure",
        "KubeletHasSufficientMemory",
        "kubelet has sufficient memory available",
    ),
    (
        "DiskPressure",
        "KubeletHasNoDiskPressure",
        "kubelet has no disk pressure",
    ),
    (
        "PIDPressure",
        "KubeletHasSufficientPID",
        "kubelet has sufficient PID available",
    ),
];

/// Sets Ready=True when it is not (unless pinned by the admin API), with the pressure conditions
/// the lifecycle loop turned Unknown back to False, and re-applies pinned conditions.
fn report_ready(sim: &Sim, name: &str, node: &Value, now: DateTime<Utc>) {
    let pinned = sim.nodes.pinned(name);
    let ready_pinned = pinned.iter().any(|c| c["type"] == "Ready");
    let needs_ready = !ready_pinned && condition_status(node, "Ready") != Some("True");
    let needs_pin = pinned.iter().any(|p| {
        let cur = node
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == p["type"]));
        cur.is_none_or(|c| c["status"] != p["status"])
    });
    if !needs_ready && !needs_pin {
        return;
    }
    let stamp = fmt_time(now);
    let _ = sim.store.txn(|t| {
        t.modify(well_known::nodes(), "", name, WriteTarget::Internal, |n| {
            let mut n = n.clone();
            if needs_ready {
                upsert_condition(&mut n, &json!({"type": "Ready", "status": "True", "reason": "KubeletReady",
                    "message": "kubelet is posting ready status", "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}));
                // A kubelet posting status again reports its pressure conditions too (the
                // lifecycle loop set them Unknown while it was silent).
                for (t, reason, message) in PRESSURE {
                    let unknown = condition_status(&n, t) == Some("Unknown");
                    if unknown && !pinned.iter().any(|p| p["type"] == t) {
                        upsert_condition(&mut n, &json!({"type": t, "status": "False", "reason": reason,
                            "message": message, "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}));
                    }
                }
            }
            for p in &pinned {
                upsert_condition(&mut n, p);
            }
            Ok(n)
        })
    });
}

/// Pods bound to a live node go Running+Ready `pod_start_delay` after being scheduled.
fn start_pods(sim: &Sim, o: &LoopOptions, alive: &HashMap<String, bool>, now: DateTime<Utc>) {
    let delay = chrono::Duration::from_std(o.pod_start_delay).unwrap_or_default();
    // Only pending, bound, live pods are parsed (the summary answers the rest).
    let pods = sim.store.list_where(well_known::pods(), |s| {
        &*s.phase == "Pending"
            && !s.terminating
            && s.node()
                .is_some_and(|n| alive.get(n).copied().unwrap_or(false))
    });
    let ready: Vec<(String, String)> = pods
        .iter()
        .filter(|p| scheduled_at(p).is_some_and(|t| t + delay <= now))
        .map(|p| {
            (
                p["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                name_of(p).to_string(),
            )
        })
        .collect();
    if ready.is_empty() {
        return;
    }
    let stamp = fmt_time(now);
    sim.store.txn(|t| {
        for (ns, name) in &ready {
            let _ = t.modify(well_known::pods(), ns, name, WriteTarget::Internal, |p| {
                let mut p = p.clone();
                p["status"] = running_status(&stamp);
                Ok(p)
            });
        }
    });
}

fn scheduled_at(p: &Value) -> Option<DateTime<Utc>> {
    let cond = p
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "PodScheduled"))
        .and_then(|c| c["lastTransitionTime"].as_str())
        .and_then(parse_time);
    cond.or_else(|| {
        p.pointer("/metadata/creationTimestamp")
            .and_then(Value::as_str)
            .and_then(parse_time)
    })
}

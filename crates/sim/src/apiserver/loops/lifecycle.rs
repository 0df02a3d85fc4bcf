//! Node lifecycle: Ready → Unknown (plus unreachable taints) after missed Lease heartbeats, not-ready
//! taints on a node whose kubelet posts Ready=False, taints removed when the node is Ready again; the
//! unschedulable taint on a cordoned node; pod GC for pods bound to nodes that no longer exist.

use std::collections::HashSet;

use serde_json::{json, Value};

use super::{condition_status, name_of, LoopOptions};
use crate::apiserver::clock::{fmt_time, parse_time};
use crate::apiserver::resources::well_known;
use crate::apiserver::store::{Filter, WriteTarget};
use crate::apiserver::Sim;

/// Taint key set on nodes whose kubelet stopped posting status.
pub const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
/// Taint key set on nodes whose kubelet posts Ready=False (kube-controller-manager's
/// TaintNodesByCondition and NoExecute passes).
pub const NOT_READY: &str = "node.kubernetes.io/not-ready";
/// NoSchedule taint kept on a node whose `spec.unschedulable` is true, removed once it is not (the
/// NoSchedule pass of TaintNodesByCondition in `node_lifecycle_controller.go`).
pub const UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";

/// One pass.
pub fn tick(sim: &Sim, o: &LoopOptions) {
    let now = sim.store.clock.now();
    let grace = chrono::Duration::from_std(o.node_monitor_grace).unwrap_or_default();
    let nodes = sim
        .store
        .list(well_known::nodes(), &Filter::default(), None, None)
        .items;
    let mut names = HashSet::new();
    for node in &nodes {
        let name = name_of(node).to_string();
        names.insert(name.clone());
        let cordoned = node.pointer("/spec/unschedulable") == Some(&Value::Bool(true));
        if cordoned != has_taint(node, UNSCHEDULABLE) {
            set_unschedulable_taint(sim, &name, cordoned);
        }
        let lease = sim
            .store
            .get(well_known::leases(), "kube-node-lease", &name);
        let renewed = lease
            .as_ref()
            .and_then(|l| l.pointer("/spec/renewTime"))
            .and_then(Value::as_str)
            .and_then(parse_time);
        let stale = renewed.is_some_and(|r| now - r > grace);
        let ready = condition_status(node, "Ready");
        if stale && ready != Some("Unknown") {
            mark_unknown(sim, &name, &fmt_time(now));
        } else if !stale {
            let want = match ready {
                Some("False") => Some(NOT_READY),
                Some("True") => None,
                _ => continue,
            };
            if tainted_with(node) != want {
                set_taints(sim, &name, want);
            }
        }
    }
    let orphans: Vec<(String, String)> = sim
        .store
        .summaries(well_known::pods())
        .iter()
        .map(|p| p.summary())
        .filter(|s| s.node().is_some_and(|n| !names.contains(n)))
        .map(|s| (s.namespace.to_string(), s.name.to_string()))
        .collect();
    if !orphans.is_empty() {
        sim.store.txn(|t| {
            for (ns, n) in &orphans {
                t.remove(well_known::pods(), ns, n);
            }
        });
    }
}

fn has_taint(node: &Value, key: &str) -> bool {
    node.pointer("/spec/taints")
        .and_then(Value::as_array)
        .is_some_and(|ts| ts.iter().any(|t| t["key"] == key))
}

fn set_unschedulable_taint(sim: &Sim, name: &str, on: bool) {
    let add = if on {
        vec![json!({"key": UNSCHEDULABLE, "effect": "NoSchedule"})]
    } else {
        vec![]
    };
    modify_node(sim, name, |n| replace_taints(n, &[UNSCHEDULABLE], add));
}

/// Changes the stored Node `name` in place (nothing when it is gone).
fn modify_node(sim: &Sim, name: &str, change: impl FnOnce(&mut Value)) {
    let _ = sim.store.txn(|t| {
        t.modify(well_known::nodes(), "", name, WriteTarget::Internal, |n| {
            let mut n = n.clone();
            change(&mut n);
            Ok(n)
        })
    });
}

/// Which of the lifecycle's taint keys the node carries.
fn tainted_with(node: &Value) -> Option<&'static str> {
    let ts = node.pointer("/spec/taints").and_then(Value::as_array)?;
    [UNREACHABLE, NOT_READY]
        .into_iter()
        .find(|k| ts.iter().any(|t| t["key"] == *k))
}

/// The conditions the node-lifecycle controller owns once the kubelet stops posting status
/// (`nodeConditionTypes` in `node_lifecycle_controller.go`); every other condition (the
/// kubelet's `NetworkUnavailable`, nodekeeper's own, an NPD's) is left as it is.
pub const KUBELET_CONDITIONS: [&str; 4] =
    ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];

fn mark_unknown(sim: &Sim, name: &str, stamp: &str) {
    modify_node(sim, name, |n| {
        mark_unknown_conditions(n, stamp);
        add_taints(n, Some(UNREACHABLE));
    });
}

/// `tryUpdateNodeHealth` for a node whose kubelet went silent: each of [`KUBELET_CONDITIONS`]
/// not already `Unknown` becomes `Unknown` / `NodeStatusUnknown` (transition time `stamp`); a
/// missing one is added as `Unknown` / `NodeStatusNeverUpdated`. Nothing else changes.
pub fn mark_unknown_conditions(n: &mut Value, stamp: &str) {
    if !n.get("status").is_some_and(Value::is_object) {
        n["status"] = json!({});
    }
    if !n["status"].get("conditions").is_some_and(Value::is_array) {
        n["status"]["conditions"] = json!([]);
    }
    let created = n
        .pointer("/metadata/creationTimestamp")
        .cloned()
        .unwrap_or_else(|| json!(stamp));
    let Some(conds) = n["status"]["conditions"].as_array_mut() else {
        return;
    };
    for t in KUBELET_CONDITIONS {
        match conds.iter_mut().find(|c| c["type"] == t) {
            Some(c) if c["status"] != "Unknown" => {
                c["status"] = json!("Unknown");
                c["reason"] = json!("NodeStatusUnknown");
                c["message"] = json!("Kubelet stopped posting node status.");
                c["lastTransitionTime"] = json!(stamp);
            }
            Some(_) => {}
            None => conds.push(json!({"type": t, "status": "Unknown",
                "reason": "NodeStatusNeverUpdated", "message": "Kubelet never posted node status.",
                "lastHeartbeatTime": created, "lastTransitionTime": stamp})),
        }
    }
}

fn set_taints(sim: &Sim, name: &str, key: Option<&str>) {
    modify_node(sim, name, |n| add_taints(n, key));
}

/// Replaces the lifecycle's taints by `key`'s NoSchedule and NoExecute pair (none: removes them).
fn add_taints(n: &mut Value, key: Option<&str>) {
    let add = key
        .map(|key| {
            vec![
                json!({"key": key, "effect": "NoSchedule"}),
                json!({"key": key, "effect": "NoExecute"}),
            ]
        })
        .unwrap_or_default();
    replace_taints(n, &[UNREACHABLE, NOT_READY], add);
}

/// Drops the node's taints with a key in `drop`, then appends `add` (other writers' taints kept).
fn replace_taints(n: &mut Value, drop: &[&str], add: Vec<Value>) {
    let mut taints: Vec<Value> = n
        .pointer("/spec/taints")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    taints.retain(|t| !drop.iter().any(|k| t["key"] == *k));
    taints.extend(add);
    if !n.get("spec").is_some_and(Value::is_object) {
        n["spec"] = json!({});
    }
    n["spec"]["taints"] = Value::Array(taints);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn only_the_kubelet_conditions_turn_unknown() {
        let old = "2026-01-01T00:00:00Z";
        let cond = |t: &str, s: &str| json!({"type": t, "status": s, "reason": "R", "message": "m", "lastTransitionTime": old});
        let mut n = json!({"metadata": {"name": "n1", "creationTimestamp": old}, "status": {"conditions": [
            cond("Ready", "True"), cond("MemoryPressure", "False"), cond("DiskPressure", "Unknown"),
            cond("NetworkUnavailable", "False"), cond("NodekeeperHeld", "True"),
            cond("NodekeeperKernelDeadlock", "False")]}});
        mark_unknown_conditions(&mut n, "2026-01-01T00:05:00Z");
        let by = |t: &str| {
            n["status"]["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["type"] == t)
                .cloned()
                .unwrap()
        };
        for t in ["Ready", "MemoryPressure"] {
            let c = by(t);
            assert_eq!(
                (c["status"].as_str(), c["reason"].as_str()),
                (Some("Unknown"), Some("NodeStatusUnknown")),
                "{t}"
            );
            assert_eq!(c["lastTransitionTime"], "2026-01-01T00:05:00Z");
        }
        // Already Unknown: untouched, transition time kept.
        assert_eq!(by("DiskPressure"), cond("DiskPressure", "Unknown"));
        // Missing: added.
        let pid = by("PIDPressure");
        assert_eq!(
            (pid["status"].as_str(), pid["reason"].as_str()),
            (Some("Unknown"), Some("NodeStatusNeverUpdated"))
        );
        // Everyone else's conditions stay exactly as they were.
        for t in [
            "NetworkUnavailable",
            "NodekeeperHeld",
            "NodekeeperKernelDeadlock",
        ] {
            assert_eq!(
                by(t),
                cond(
                    t,
                    if t == "NodekeeperHeld" {
                        "True"
                    } else {
                        "False"
                    }
                ),
                "{t}"
            );
        }
        assert_eq!(n["status"]["conditions"].as_array().unwrap().len(), 7);
    }
}

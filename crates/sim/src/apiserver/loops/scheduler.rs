//! The scheduler: binds pending pods to Ready, schedulable nodes with room, honouring nodeSelector,
//! taints/tolerations and cordon; picks the least loaded node.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::recorder::{record, About};
use super::{condition_status, cpu_millis, name_of, tolerates};
use crate::apiserver::resources::well_known;
use crate::apiserver::store::{Filter, WriteTarget};
use crate::apiserver::Sim;

#[derive(Debug, Default, Clone, Copy)]
struct Usage {
    pods: i64,
    cpu: i64,
}

fn pod_cpu(p: &Value) -> i64 {
    p.pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.pointer("/resources/requests/cpu").and_then(Value::as_str))
        .map(cpu_millis)
        .sum()
}

/// Whether `pod` may run on `node` given what is already there.
pub fn fits(pod: &Value, node: &Value, used_pods: i64, used_cpu: i64) -> bool {
    if node.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true)
        || condition_status(node, "Ready") != Some("True")
        || node.pointer("/metadata/deletionTimestamp").is_some()
    {
        return false;
    }
    let labels = node
        .pointer("/metadata/labels")
        .cloned()
        .unwrap_or(Value::Null);
    let selector_ok = pod
        .pointer("/spec/nodeSelector")
        .and_then(Value::as_object)
        .is_none_or(|sel| sel.iter().all(|(k, v)| labels.get(k) == Some(v)));
    let taints = node
        .pointer("/spec/taints")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let taints_ok = taints
        .iter()
        .filter(|t| matches!(t["effect"].as_str(), Some("NoSchedule") | Some("NoExecute")))
        .all(|t| tolerates(pod, t));
    let max_pods = node
        .pointer("/status/allocatable/pods")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .unwrap_or(110);
    let max_cpu = node
        .pointer("/status/allocatable/cpu")
        .and_then(Value::as_str)
        .map(cpu_millis)
        .unwrap_or(i64::MAX);
    selector_ok && taints_ok && used_pods < max_pods && used_cpu + pod_cpu(pod) <= max_cpu
}

/// One pass: binds every pending pod that fits somewhere.
pub fn tick(sim: &Sim) {
    // The common case, nothing pending, is answered from the summaries without parsing pods.
    let candidates = sim
        .store
        .list_where(well_known::pods(), |s| !s.bound && !s.terminating);
    if candidates.is_empty() {
        return;
    }
    let pods = sim
        .store
        .list(well_known::pods(), &Filter::default(), None, None)
        .items;
    let pending: Vec<&Value> = pods
        .iter()
        .map(|p| &**p)
        .filter(|p| {
            p.pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
        })
        .filter(|p| p.pointer("/metadata/deletionTimestamp").is_none())
        .filter(|p| {
            p.pointer("/spec/schedulerName")
                .and_then(Value::as_str)
                .is_none_or(|s| s == "default-scheduler")
        })
        .collect();
    if pending.is_empty() {
        return;
    }
    let nodes = sim
        .store
        .list(well_known::nodes(), &Filter::default(), None, None)
        .items;
    let mut usage: HashMap<String, Usage> = HashMap::new();
    for p in pods
        .iter()
        .filter(|p| p.pointer("/metadata/deletionTimestamp").is_none())
    {
        if let Some(n) = p.pointer("/spec/nodeName").and_then(Value::as_str) {
            let u = usage.entry(n.to_string()).or_default();
            u.pods += 1;
            u.cpu += pod_cpu(p);
        }
    }
    let stamp = sim.store.clock.stamp();
    for pod in pending {
        let best = nodes
            .iter()
            .filter(|n| {
                let u = usage.get(name_of(n)).copied().unwrap_or_default();
                fits(pod, n, u.pods, u.cpu)
            })
            .min_by_key(|n| {
                (
                    usage.get(name_of(n)).copied().unwrap_or_default().pods,
                    name_of(n).to_string(),
                )
            });
        let Some(node) = best else { continue };
        let node_name = name_of(node).to_string();
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default();
        let bound = sim.store.txn(|t| {
            let r = t.modify(well_known::pods(), ns, name_of(pod), WriteTarget::Internal, |p| {
                let mut p = p.clone();
                p["spec"]["nodeName"] = json!(node_name);
                if !p.get("status").is_some_and(Value::is_object) {
                    p["status"] = json!({"phase": "Pending"});
                }
                p["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp}]);
                Ok(p)
            });
            if let Ok(p) = &r {
                let about = About { obj: p, kind: "Pod", api_version: "v1" };
                let note = format!("Successfully assigned {ns}/{} to {node_name}", name_of(p));
                record(t, about, "default-scheduler", "Binding", "Scheduled", note);
            }
            r
        });
        if bound.is_ok() {
            let u = usage.entry(node_name).or_default();
            u.pods += 1;
            u.cpu += pod_cpu(pod);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn node() -> Value {
        json!({"metadata": {"name": "n", "labels": {"pool": "gpu"}},
            "spec": {"taints": [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"pods": "2", "cpu": "1"}, "conditions": [{"type": "Ready", "status": "True"}]}})
    }

    #[test]
    fn fits_table() {
        let tol =
            json!([{"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]);
        let cases = vec![
            (json!({"spec": {}}), 0, 0, false),
            (json!({"spec": {"tolerations": tol}}), 0, 0, true),
            (
                json!({"spec": {"tolerations": [{"operator": "Exists"}]}}),
                0,
                0,
                true,
            ),
            (
                json!({"spec": {"tolerations": tol, "nodeSelector": {"pool": "cpu"}}}),
                0,
                0,
                false,
            ),
            (
                json!({"spec": {"tolerations": tol, "nodeSelector": {"pool": "gpu"}}}),
                0,
                0,
                true,
            ),
            (json!({"spec": {"tolerations": tol}}), 2, 0, false),
            (
                json!({"spec": {"tolerations": tol, "containers": [{"resources": {"requests": {"cpu": "600m"}}}]}}),
                0,
                500,
                false,
            ),
            (
                json!({"spec": {"tolerations": tol, "containers": [{"resources": {"requests": {"cpu": "0.5"}}}]}}),
                0,
                500,
                true,
            ),
        ];
        for (pod, used_pods, used_cpu, want) in cases {
            assert_eq!(fits(&pod, &node(), used_pods, used_cpu), want, "{pod}");
        }
        let mut cordoned = node();
        cordoned["spec"]["unschedulable"] = json!(true);
        assert!(!fits(
            &json!({"spec": {"tolerations": [{"operator": "Exists"}]}}),
            &cordoned,
            0,
            0
        ));
    }
}

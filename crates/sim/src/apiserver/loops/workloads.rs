//! ReplicaSet, Deployment, DaemonSet and StatefulSet controllers, and owner-reference garbage
//! collection.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::recorder::{record, About};
use super::{name_of, ns_of, tolerates, uid_of};
use crate::apiserver::eviction::pod_healthy;
use crate::apiserver::resources::{well_known, ResourceDef};
use crate::apiserver::store::{DeleteOptions, Filter, Txn, WriteTarget};
use crate::apiserver::Sim;

/// The resources the controllers read (a pass whose inputs did not change can be skipped).
pub const INPUTS: [fn() -> &'static ResourceDef; 7] = [
    well_known::pods,
    well_known::statefulsets,
    well_known::pdbs,
    well_known::replicasets,
    well_known::deployments,
    well_known::daemonsets,
    well_known::nodes,
];

fn all(sim: &Sim, res: &ResourceDef) -> Vec<Arc<Value>> {
    sim.store.list(res, &Filter::default(), None, None).items
}

fn controller_uid(obj: &Value) -> Option<&str> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)?
        .iter()
        .find(|r| r["controller"] == true)
        .and_then(|r| r["uid"].as_str())
}

fn owner_ref(kind: &str, owner: &Value) -> Value {
    json!([{"apiVersion": "apps/v1", "kind": kind, "name": name_of(owner), "uid": uid_of(owner),
        "controller": true, "blockOwnerDeletion": true}])
}

fn pod_from_template(owner: &Value, kind: &str) -> Value {
    let mut pod = owner
        .pointer("/spec/template")
        .cloned()
        .unwrap_or(json!({}));
    if !pod.get("metadata").is_some_and(Value::is_object) {
        pod["metadata"] = json!({});
    }
    pod["metadata"]["generateName"] = json!(format!("{}-", name_of(owner)));
    pod["metadata"]["ownerReferences"] = owner_ref(kind, owner);
    pod
}

/// Pods grouped by controller uid (terminating pods excluded).
fn pods_by_owner(sim: &Sim) -> HashMap<String, Vec<Arc<Value>>> {
    let mut out: HashMap<String, Vec<Arc<Value>>> = HashMap::new();
    for p in all(sim, well_known::pods()) {
        if p.pointer("/metadata/deletionTimestamp").is_some() {
            continue;
        }
        if let Some(uid) = controller_uid(&p) {
            out.entry(uid.to_string()).or_default().push(p);
        }
    }
    out
}

fn set_status(t: &mut Txn<'_>, res: &'static ResourceDef, obj: &Value, status: Value) {
    let mut merged = obj.get("status").cloned().unwrap_or(json!({}));
    if let (Some(m), Some(s)) = (merged.as_object_mut(), status.as_object()) {
        for (k, v) in s {
            m.insert(k.clone(), v.clone());
        }
    }
    merged["observedGeneration"] = obj["metadata"]["generation"].clone();
    if obj.get("status") == Some(&merged) {
        return;
    }
    let _ = t.modify(res, ns_of(obj), name_of(obj), WriteTarget::Internal, |o| {
        let mut o = o.clone();
        o["status"] = merged;
        Ok(o)
    });
}

/// ReplicaSets: create or delete pods to match `spec.replicas`, report status.
pub fn replicasets(sim: &Sim) {
    let by_owner = pods_by_owner(sim);
    for rs in all(sim, well_known::replicasets()) {
        if rs.pointer("/metadata/deletionTimestamp").is_some() {
            continue;
        }
        let want = rs
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(1)
            .max(0);
        let pods = by_owner.get(uid_of(&rs)).cloned().unwrap_or_default();
        let have = i64::try_from(pods.len()).unwrap_or(i64::MAX);
        let ready = i64::try_from(pods.iter().filter(|p| pod_healthy(p)).count()).unwrap_or(0);
        sim.store.txn(|t| {
            let about = About { obj: &rs, kind: "ReplicaSet", api_version: "apps/v1" };
            for _ in have..want {
                if let Ok(p) = t.create(well_known::pods(), ns_of(&rs), pod_from_template(&rs, "ReplicaSet")) {
                    let note = format!("Created pod: {}", name_of(&p));
                    record(t, about, "replicaset-controller", "Create", "SuccessfulCreate", note);
                }
            }
            if have > want {
                let mut victims = pods.clone();
                // Unscheduled and unready pods go first.
                victims.sort_by_key(|p| (p.pointer("/spec/nodeName").is_some(), pod_healthy(p)));
                for p in victims.iter().take(usize::try_from(have - want).unwrap_or(0)) {
                    if t.delete(well_known::pods(), ns_of(p), name_of(p), &DeleteOptions::default()).is_ok() {
                        let note = format!("Deleted pod: {}", name_of(p));
                        record(t, about, "replicaset-controller", "Delete", "SuccessfulDelete", note);
                    }
                }
            }
            set_status(t, well_known::replicasets(), &rs,
                json!({"replicas": have.min(want).max(0), "readyReplicas": ready, "availableReplicas": ready,
                       "fullyLabeledReplicas": have}));
        });
    }
}

fn template_hash(d: &Value) -> String {
    let t = d
        .pointer("/spec/template")
        .map(Value::to_string)
        .unwrap_or_default();
    hex::encode(&Sha256::digest(t.as_bytes())[..5])
}

/// Deployments: one ReplicaSet per template; a new template scales the old ones to zero.
pub fn deployments(sim: &Sim) {
    let sets = all(sim, well_known::replicasets());
    for d in all(sim, well_known::deployments()) {
        if d.pointer("/metadata/deletionTimestamp").is_some() {
            continue;
        }
        let want = d
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let hash = template_hash(&d);
        let rs_name = format!("{}-{hash}", name_of(&d));
        let owned: Vec<&Arc<Value>> = sets
            .iter()
            .filter(|r| controller_uid(r) == Some(uid_of(&d)))
            .collect();
        sim.store.txn(|t| {
            let about = About { obj: &d, kind: "Deployment", api_version: "apps/v1" };
            let scaled = |t: &mut Txn<'_>, rs: &str, from: i64, to: i64| {
                let dir = if to > from { "up" } else { "down" };
                let note = format!("Scaled {dir} replica set {rs} from {from} to {to}");
                record(t, about, "deployment-controller", "Scale", "ScalingReplicaSet", note);
            };
            let current = owned.iter().find(|r| name_of(r) == rs_name);
            match current {
                None => {
                    let mut template = d.pointer("/spec/template").cloned().unwrap_or(json!({}));
                    template["metadata"]["labels"]["pod-template-hash"] = json!(hash);
                    let mut selector = d.pointer("/spec/selector").cloned().unwrap_or(json!({}));
                    selector["matchLabels"]["pod-template-hash"] = json!(hash);
                    let rs = json!({"metadata": {"name": rs_name, "labels": template["metadata"]["labels"],
                            "ownerReferences": owner_ref("Deployment", &d)},
                        "spec": {"replicas": want, "selector": selector, "template": template}});
                    if t.create(well_known::replicasets(), ns_of(&d), rs).is_ok() {
                        scaled(t, &rs_name, 0, want);
                    }
                }
                Some(rs) if rs.pointer("/spec/replicas").and_then(Value::as_i64) != Some(want) => {
                    let from = rs.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1);
                    let r = t.modify(well_known::replicasets(), ns_of(rs), name_of(rs), WriteTarget::Internal, |r| {
                        let mut r = r.clone();
                        r["spec"]["replicas"] = json!(want);
                        Ok(r)
                    });
                    if r.is_ok() {
                        scaled(t, name_of(rs), from, want);
                    }
                }
                Some(_) => {}
            }
            for old in owned.iter().filter(|r| name_of(r) != rs_name) {
                let from = old.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1);
                if from != 0 {
                    let r = t.modify(well_known::replicasets(), ns_of(old), name_of(old), WriteTarget::Internal, |r| {
                        let mut r = r.clone();
                        r["spec"]["replicas"] = json!(0);
                        Ok(r)
                    });
                    if r.is_ok() {
                        scaled(t, name_of(old), from, 0);
                    }
                }
            }
            let ready: i64 = owned.iter().filter_map(|r| r.pointer("/status/readyReplicas").and_then(Value::as_i64)).sum();
            let replicas: i64 = owned.iter().filter_map(|r| r.pointer("/status/replicas").and_then(Value::as_i64)).sum();
            set_status(t, well_known::deployments(), &d,
                json!({"replicas": replicas, "readyReplicas": ready, "availableReplicas": ready, "updatedReplicas": replicas}));
        });
    }
}

/// Whether a DaemonSet pod may run on a node (nodeSelector + taints; DaemonSets ignore cordon).
fn ds_fits(ds_pod: &Value, node: &Value) -> bool {
    let labels = node
        .pointer("/metadata/labels")
        .cloned()
        .unwrap_or(Value::Null);
    let sel_ok = ds_pod
        .pointer("/spec/nodeSelector")
        .and_then(Value::as_object)
        .is_none_or(|s| s.iter().all(|(k, v)| labels.get(k) == Some(v)));
    let taints = node
        .pointer("/spec/taints")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    sel_ok
        && taints
            .iter()
            .filter(|t| t["effect"] == "NoSchedule" || t["effect"] == "NoExecute")
            .filter(|t| {
                !t["key"]
                    .as_str()
                    .is_some_and(|k| k.starts_with("node.kubernetes.io/"))
            })
            .all(|t| tolerates(ds_pod, t))
}

/// DaemonSets: one pod per eligible node, bound directly.
pub fn daemonsets(sim: &Sim) {
    let by_owner = pods_by_owner(sim);
    let nodes = all(sim, well_known::nodes());
    for ds in all(sim, well_known::daemonsets()) {
        if ds.pointer("/metadata/deletionTimestamp").is_some() {
            continue;
        }
        let template = pod_from_template(&ds, "DaemonSet");
        let pods = by_owner.get(uid_of(&ds)).cloned().unwrap_or_default();
        let placed: HashSet<&str> = pods
            .iter()
            .filter_map(|p| p.pointer("/spec/nodeName").and_then(Value::as_str))
            .collect();
        let eligible: Vec<&Arc<Value>> = nodes.iter().filter(|n| ds_fits(&template, n)).collect();
        let ready = pods.iter().filter(|p| pod_healthy(p)).count();
        sim.store.txn(|t| {
            for n in eligible.iter().filter(|n| !placed.contains(name_of(n))) {
                let mut pod = template.clone();
                pod["spec"]["nodeName"] = json!(name_of(n));
                if let Ok(p) = t.create(well_known::pods(), ns_of(&ds), pod) {
                    let about = About { obj: &ds, kind: "DaemonSet", api_version: "apps/v1" };
                    let note = format!("Created pod: {}", name_of(&p));
                    record(t, about, "daemonset-controller", "Create", "SuccessfulCreate", note);
                }
            }
            set_status(t, well_known::daemonsets(), &ds, json!({"desiredNumberScheduled": eligible.len(),
                "currentNumberScheduled": placed.len(), "numberReady": ready, "numberAvailable": ready,
                "updatedNumberScheduled": placed.len(), "numberMisscheduled": 0}));
        });
    }
}

/// StatefulSets (`podManagementPolicy: OrderedReady`, the default): pod `<name>-<ordinal>` for each
/// ordinal below `spec.replicas`, created one at a time and each only once every lower ordinal is
/// Running and Ready (an evicted pod comes back under its own name once it is gone); ordinals at or
/// above `replicas` are deleted highest first, one at a time.
pub fn statefulsets(sim: &Sim) {
    let by_owner = pods_by_owner(sim);
    for ss in all(sim, well_known::statefulsets()) {
        if ss.pointer("/metadata/deletionTimestamp").is_some() {
            continue;
        }
        let want = ss
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(1)
            .max(0);
        let name = name_of(&ss).to_string();
        let ordinal = |p: &Value| {
            name_of(p)
                .strip_prefix(&format!("{name}-"))
                .and_then(|o| o.parse::<i64>().ok())
        };
        let pods = by_owner.get(uid_of(&ss)).cloned().unwrap_or_default();
        let ready = i64::try_from(pods.iter().filter(|p| pod_healthy(p)).count()).unwrap_or(0);
        let have = i64::try_from(pods.len()).unwrap_or(i64::MAX);
        sim.store.txn(|t| {
            let about = About {
                obj: &ss,
                kind: "StatefulSet",
                api_version: "apps/v1",
            };
            let excess = pods
                .iter()
                .filter(|p| ordinal(p).is_some_and(|o| o >= want))
                .max_by_key(|p| ordinal(p));
            if let Some(p) = excess {
                if t.delete(
                    well_known::pods(),
                    ns_of(p),
                    name_of(p),
                    &DeleteOptions::default(),
                )
                .is_ok()
                {
                    let note =
                        format!("delete Pod {} in StatefulSet {name} successful", name_of(p));
                    record(
                        t,
                        about,
                        "statefulset-controller",
                        "Delete",
                        "SuccessfulDelete",
                        note,
                    );
                }
            } else {
                for i in 0..want {
                    let pod_name = format!("{name}-{i}");
                    match t.get(well_known::pods(), ns_of(&ss), &pod_name) {
                        Some(p) if pod_healthy(&p) => continue,
                        // Starting, unready or terminating: the next ordinal waits for it.
                        Some(_) => break,
                        None => {
                            let mut pod = pod_from_template(&ss, "StatefulSet");
                            if let Some(m) = pod["metadata"].as_object_mut() {
                                m.remove("generateName");
                            }
                            pod["metadata"]["name"] = json!(pod_name);
                            pod["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"] =
                                json!(pod_name);
                            pod["metadata"]["labels"]["apps.kubernetes.io/pod-index"] =
                                json!(i.to_string());
                            if t.create(well_known::pods(), ns_of(&ss), pod).is_ok() {
                                let note = format!(
                                    "create Pod {pod_name} in StatefulSet {name} successful"
                                );
                                record(
                                    t,
                                    about,
                                    "statefulset-controller",
                                    "Create",
                                    "SuccessfulCreate",
                                    note,
                                );
                            }
                            break;
                        }
                    }
                }
            }
            set_status(
                t,
                well_known::statefulsets(),
                &ss,
                json!({"replicas": have, "readyReplicas": ready,
                "availableReplicas": ready, "currentReplicas": have, "updatedReplicas": have}),
            );
        });
    }
}

/// Garbage collection: pods and ReplicaSets whose controller owner is gone are deleted.
pub fn garbage_collect(sim: &Sim) {
    let mut uids: HashSet<String> = HashSet::new();
    for res in [
        well_known::replicasets(),
        well_known::deployments(),
        well_known::daemonsets(),
        well_known::statefulsets(),
    ] {
        uids.extend(all(sim, res).iter().map(|o| uid_of(o).to_string()));
    }
    for res in [well_known::pods(), well_known::replicasets()] {
        let orphans: Vec<Arc<Value>> = all(sim, res)
            .into_iter()
            .filter(|o| o.pointer("/metadata/deletionTimestamp").is_none())
            .filter(|o| {
                let refs = o
                    .pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array);
                refs.is_some_and(|rs| {
                    rs.iter().any(|r| {
                        matches!(
                            r["kind"].as_str(),
                            Some("ReplicaSet" | "Deployment" | "DaemonSet" | "StatefulSet")
                        ) && r["uid"].as_str().is_some_and(|u| !uids.contains(u))
                    })
                })
            })
            .collect();
        if orphans.is_empty() {
            continue;
        }
        sim.store.txn(|t| {
            for o in &orphans {
                let _ = t.delete(res, ns_of(o), name_of(o), &DeleteOptions::default());
            }
        });
    }
}

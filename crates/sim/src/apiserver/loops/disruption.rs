//! The disruption controller: each PodDisruptionBudget's `status` (expected, healthy and desired
//! pods, `disruptionsAllowed`, the `DisruptionAllowed` condition, `observedGeneration`), computed
//! as kube-controller-manager's `pkg/controller/disruption` does, so the eviction subresource
//! ([`crate::apiserver::eviction`]) and readers of the status see what a real cluster shows:
//! - `maxUnavailable` and a percentage `minAvailable` count the *scale* of the pods' controllers
//!   (ReplicaSet, or its Deployment, and StatefulSet); pods without a controller are left out, so a
//!   PDB of bare pods expects 0 and allows nothing; a pod whose controller has no scale (a
//!   DaemonSet's) fails safe: `disruptionsAllowed: 0`, condition `SyncFailed`, the generation not
//!   marked observed;
//! - an integer `minAvailable` counts the matching pods;
//! - pods being deleted, and pods evicted less than two minutes ago (`status.disruptedPods`), are not
//!   healthy; `disruptionsAllowed` is 0 while no pods are expected.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::{json, Map, Value};

use super::{name_of, ns_of, uid_of};
use crate::apiserver::clock::{fmt_time, parse_time};
use crate::apiserver::eviction::{covered_by, pod_healthy, scaled};
use crate::apiserver::resources::well_known;
use crate::apiserver::store::{Filter, WriteTarget};
use crate::apiserver::Sim;

/// How long an evicted pod counts as disrupted while it is not yet being deleted
/// (`DeletionTimeout` of the disruption controller).
const DELETION_TIMEOUT: chrono::Duration = chrono::Duration::minutes(2);

/// One pass over every PDB.
pub fn tick(sim: &Sim) {
    let all = |res| sim.store.list(res, &Filter::default(), None, None).items;
    let pdbs = all(well_known::pdbs());
    // Most clusters of a scale run have no PDB: then no pod is read at all.
    if pdbs.is_empty() {
        return;
    }
    let now = sim.store.clock.now();
    let mut pods_in: HashMap<String, Vec<Arc<Value>>> = HashMap::new();
    for p in all(well_known::pods()) {
        pods_in.entry(ns_of(&p).to_string()).or_default().push(p);
    }
    let scales = Scales::new(
        &all(well_known::replicasets()),
        &all(well_known::deployments()),
        &all(well_known::statefulsets()),
    );
    for pdb in pdbs {
        if pdb.pointer("/metadata/deletionTimestamp").is_some() {
            continue;
        }
        let ns = ns_of(&pdb);
        let mine = covered_by(&pdb, pods_in.get(ns).cloned().unwrap_or_default());
        let mine: Vec<&Value> = mine.iter().map(|p| p.as_ref()).collect();
        let status = status(&pdb, &mine, &scales, now);
        if pdb.get("status") == Some(&status) {
            continue;
        }
        let _ = sim.store.txn(|t| {
            t.modify(
                well_known::pdbs(),
                ns,
                name_of(&pdb),
                WriteTarget::Internal,
                |o| {
                    let mut o = o.clone();
                    o["status"] = status.clone();
                    Ok(o)
                },
            )
        });
    }
}

/// For each controller uid a pod may name: the controller that counts (a ReplicaSet of a Deployment
/// counts as its Deployment, once however many ReplicaSets it has) and its scale (`spec.replicas`).
pub struct Scales {
    by_uid: HashMap<String, (String, i64)>,
}

impl Scales {
    /// From the cluster's ReplicaSets, Deployments and StatefulSets.
    pub fn new(
        replicasets: &[Arc<Value>],
        deployments: &[Arc<Value>],
        statefulsets: &[Arc<Value>],
    ) -> Self {
        let replicas = |o: &Value| {
            o.pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(1)
        };
        let deploy: HashMap<&str, i64> = deployments
            .iter()
            .map(|d| (uid_of(d), replicas(d)))
            .collect();
        let mut by_uid = HashMap::new();
        for rs in replicasets {
            let owner = controller_ref(rs)
                .filter(|r| r["kind"] == "Deployment")
                .and_then(|r| r["uid"].as_str())
                .and_then(|u| deploy.get(u).map(|n| (u.to_string(), *n)));
            let counted = owner.unwrap_or_else(|| (uid_of(rs).to_string(), replicas(rs)));
            by_uid.insert(uid_of(rs).to_string(), counted);
        }
        for ss in statefulsets {
            by_uid.insert(
                uid_of(ss).to_string(),
                (uid_of(ss).to_string(), replicas(ss)),
            );
        }
        Scales { by_uid }
    }
}

fn controller_ref(o: &Value) -> Option<&Value> {
    o.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)?
        .iter()
        .find(|r| r["controller"] == true)
}

/// `getExpectedScale`: the sum of the scales of the pods' controllers, each counted once (pods
/// without a controller left out); an error for a pod whose controller has no scale.
fn expected_scale(pods: &[&Value], scales: &Scales) -> Result<i64, String> {
    let mut seen = HashSet::new();
    let mut total = 0;
    for p in pods {
        let Some(r) = controller_ref(p) else { continue };
        let uid = r["uid"].as_str().unwrap_or_default();
        let (counted, scale) = scales
            .by_uid
            .get(uid)
            .ok_or_else(|| format!("found no controllers for pod {:?}", name_of(p)))?;
        if seen.insert(counted.clone()) {
            total += scale;
        }
    }
    Ok(total)
}

/// `getExpectedPodCount`: (expected pods, desired healthy).
fn expected(pdb: &Value, pods: &[&Value], scales: &Scales) -> Result<(i64, i64), String> {
    let spec = pdb.get("spec").cloned().unwrap_or(Value::Null);
    let min = spec.get("minAvailable").filter(|v| !v.is_null());
    let max = spec.get("maxUnavailable").filter(|v| !v.is_null());
    match (min, max) {
        (_, Some(max)) => {
            let expected = expected_scale(pods, scales)?;
            Ok((expected, (expected - scaled(max, expected)?).max(0)))
        }
        (Some(Value::Number(n)), None) => Ok((
            i64::try_from(pods.len()).unwrap_or(i64::MAX),
            n.as_i64().unwrap_or(0),
        )),
        (Some(min), None) => {
            let expected = expected_scale(pods, scales)?;
            Ok((expected, scaled(min, expected)?))
        }
        (None, None) => Ok((i64::try_from(pods.len()).unwrap_or(i64::MAX), 0)),
    }
}

/// The PDB's new status at `now`.
pub fn status(pdb: &Value, pods: &[&Value], scales: &Scales, now: DateTime<Utc>) -> Value {
    let old = pdb.get("status").cloned().unwrap_or_else(|| json!({}));
    let generation = pdb
        .pointer("/metadata/generation")
        .cloned()
        .unwrap_or(json!(1));
    let (expected, desired) = match expected(pdb, pods, scales) {
        Ok(v) => v,
        Err(e) => {
            // failSafe: nothing may be evicted; the generation stays unobserved.
            let mut s = old.clone();
            s["disruptionsAllowed"] = json!(0);
            let observed = old.get("observedGeneration").cloned().unwrap_or(json!(0));
            set_condition(&mut s, &old, false, "SyncFailed", &e, &observed, now);
            return s;
        }
    };
    // buildDisruptedPodMap: evicted pods not yet being deleted, for two minutes.
    let mut disrupted = Map::new();
    if let Some(d) = old.get("disruptedPods").and_then(Value::as_object) {
        for p in pods
            .iter()
            .filter(|p| p.pointer("/metadata/deletionTimestamp").is_none())
        {
            if let Some(at) = d.get(name_of(p)) {
                if at
                    .as_str()
                    .and_then(parse_time)
                    .is_some_and(|t| t + DELETION_TIMEOUT > now)
                {
                    disrupted.insert(name_of(p).to_string(), at.clone());
                }
            }
        }
    }
    let healthy = i64::try_from(
        pods.iter()
            .filter(|p| pod_healthy(p) && !disrupted.contains_key(name_of(p)))
            .count(),
    )
    .unwrap_or(i64::MAX);
    let mut allowed = healthy - desired;
    if expected <= 0 || allowed <= 0 {
        allowed = 0;
    }
    let mut s = json!({"currentHealthy": healthy, "desiredHealthy": desired, "expectedPods": expected,
        "disruptionsAllowed": allowed, "observedGeneration": generation});
    if !disrupted.is_empty() {
        s["disruptedPods"] = Value::Object(disrupted);
    }
    let reason = if allowed > 0 {
        "SufficientPods"
    } else {
        "InsufficientPods"
    };
    set_condition(&mut s, &old, allowed > 0, reason, "", &generation, now);
    s
}

/// `DisruptionAllowed`, its transition time kept unless its status changes.
fn set_condition(
    s: &mut Value,
    old: &Value,
    allowed: bool,
    reason: &str,
    message: &str,
    observed: &Value,
    now: DateTime<Utc>,
) {
    let status = if allowed { "True" } else { "False" };
    let prev = old
        .get("conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "DisruptionAllowed"));
    let since = prev
        .filter(|c| c["status"] == status)
        .and_then(|c| c.get("lastTransitionTime").cloned())
        .unwrap_or_else(|| json!(fmt_time(now)));
    s["conditions"] = json!([{"type": "DisruptionAllowed", "status": status, "reason": reason,
        "message": message, "observedGeneration": observed, "lastTransitionTime": since}]);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        parse_time("2026-01-01T00:10:00Z").unwrap()
    }

    fn pod(name: &str, owner: Option<(&str, &str)>, ready: bool) -> Value {
        let mut p = json!({"metadata": {"name": name, "namespace": "a", "labels": {"app": "x"}},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}});
        if let Some((kind, uid)) = owner {
            p["metadata"]["ownerReferences"] =
                json!([{"kind": kind, "uid": uid, "name": "o", "controller": true}]);
        }
        p
    }

    fn pdb(spec: Value) -> Value {
        let mut spec = spec;
        spec["selector"] = json!({"matchLabels": {"app": "x"}});
        json!({"metadata": {"name": "b", "namespace": "a", "generation": 2}, "spec": spec})
    }

    fn scales() -> Scales {
        let d = Arc::new(json!({"metadata": {"uid": "d1"}, "spec": {"replicas": 3}}));
        let rs = Arc::new(json!({"metadata": {"uid": "rs1", "ownerReferences": [
            {"kind": "Deployment", "uid": "d1", "controller": true}]}, "spec": {"replicas": 3}}));
        let rs2 = Arc::new(json!({"metadata": {"uid": "rs2", "ownerReferences": [
            {"kind": "Deployment", "uid": "d1", "controller": true}]}, "spec": {"replicas": 1}}));
        let ss = Arc::new(json!({"metadata": {"uid": "ss1"}, "spec": {"replicas": 2}}));
        Scales::new(&[rs, rs2], &[d], &[ss])
    }

    fn run(spec: Value, pods: &[Value]) -> Value {
        let refs: Vec<&Value> = pods.iter().collect();
        status(&pdb(spec), &refs, &scales(), now())
    }

    #[test]
    fn arithmetic_table() {
        let deploy = |n: &str, ready| pod(n, Some(("ReplicaSet", "rs1")), ready);
        let three = [deploy("w1", true), deploy("w2", true), deploy("w3", true)];
        // (spec, pods, expected, desired, healthy, allowed)
        let cases: Vec<(Value, Vec<Value>, i64, i64, i64, i64)> = vec![
            (json!({"maxUnavailable": 1}), three.to_vec(), 3, 2, 3, 1),
            (json!({"maxUnavailable": "50%"}), three.to_vec(), 3, 1, 3, 2),
            (json!({"minAvailable": 3}), three.to_vec(), 3, 3, 3, 0),
            (json!({"minAvailable": "50%"}), three.to_vec(), 3, 2, 3, 1),
            // The Deployment's scale counts, not the pods seen: one pod missing.
            (
                json!({"maxUnavailable": 1}),
                three[..2].to_vec(),
                3,
                2,
                2,
                0,
            ),
            (
                json!({"minAvailable": 1}),
                vec![deploy("w1", true), deploy("w2", false)],
                2,
                1,
                1,
                0,
            ),
            // Two ReplicaSets of one Deployment (a rollout): its scale counts once.
            (
                json!({"maxUnavailable": 1}),
                vec![
                    deploy("w1", true),
                    pod("w9", Some(("ReplicaSet", "rs2")), true),
                ],
                3,
                2,
                2,
                0,
            ),
            // Bare pods: expected 0, nothing allowed.
            (
                json!({"maxUnavailable": 1}),
                vec![pod("bare", None, true)],
                0,
                0,
                1,
                0,
            ),
            (
                json!({"minAvailable": 0}),
                vec![pod("bare", None, true)],
                1,
                0,
                1,
                1,
            ),
            (
                json!({"maxUnavailable": 1}),
                vec![
                    pod("s-0", Some(("StatefulSet", "ss1")), true),
                    pod("s-1", Some(("StatefulSet", "ss1")), true),
                ],
                2,
                1,
                2,
                1,
            ),
        ];
        for (spec, pods, e, d, h, a) in cases {
            let s = run(spec.clone(), &pods);
            assert_eq!(
                (
                    s["expectedPods"].as_i64(),
                    s["desiredHealthy"].as_i64(),
                    s["currentHealthy"].as_i64(),
                    s["disruptionsAllowed"].as_i64()
                ),
                (Some(e), Some(d), Some(h), Some(a)),
                "{spec} over {} pods: {s:#}",
                pods.len()
            );
            assert_eq!(s["observedGeneration"], 2);
            let c = &s["conditions"][0];
            assert_eq!(c["status"], if a > 0 { "True" } else { "False" });
        }
    }

    #[test]
    fn a_daemonset_pod_under_a_percentage_fails_safe_and_stays_unobserved() {
        let s = run(
            json!({"maxUnavailable": 1}),
            &[pod("ds-x", Some(("DaemonSet", "ds1")), true)],
        );
        assert_eq!(s["disruptionsAllowed"], 0);
        assert_eq!(s["conditions"][0]["reason"], "SyncFailed");
        assert!(s["conditions"][0]["message"]
            .as_str()
            .unwrap()
            .contains("ds-x"));
        assert_ne!(s["observedGeneration"], 2);
        // An integer minAvailable counts pods and needs no controller.
        let s = run(
            json!({"minAvailable": 0}),
            &[pod("ds-x", Some(("DaemonSet", "ds1")), true)],
        );
        assert_eq!(s["disruptionsAllowed"], 1);
    }

    #[test]
    fn recently_evicted_pods_are_not_healthy_for_two_minutes() {
        let deploy = |n: &str| pod(n, Some(("ReplicaSet", "rs1")), true);
        let mut b = pdb(json!({"maxUnavailable": 1}));
        b["status"] =
            json!({"disruptedPods": {"w1": "2026-01-01T00:09:00Z", "w2": "2026-01-01T00:07:00Z"}});
        let pods = [deploy("w1"), deploy("w2"), deploy("w3")];
        let refs: Vec<&Value> = pods.iter().collect();
        let s = status(&b, &refs, &scales(), now());
        assert_eq!(s["currentHealthy"], 2, "{s:#}");
        assert_eq!(s["disruptedPods"], json!({"w1": "2026-01-01T00:09:00Z"}));
        assert_eq!(s["disruptionsAllowed"], 0);
    }
}

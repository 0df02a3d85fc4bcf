//! The Eviction subresource: PodDisruptionBudget evaluation and graceful deletion.

use std::sync::Arc;

use serde_json::{json, Value};

use super::error::{ApiError, ApiResult};
use super::resources::well_known;
use super::selectors::LabelSelector;
use super::store::{DeleteOptions, Txn, WriteTarget};

/// Whether a pod is Ready and not terminating (a "healthy" pod for PDBs).
pub fn pod_healthy(pod: &Value) -> bool {
    pod.pointer("/metadata/deletionTimestamp").is_none()
        && pod
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// An int-or-percent value scaled against `total`, rounding up (as the disruption controller does).
pub fn scaled(v: &Value, total: i64) -> Result<i64, String> {
    match v {
        Value::Number(n) => n.as_i64().ok_or_else(|| format!("invalid integer {n}")),
        Value::String(s) => {
            let pct = s
                .strip_suffix('%')
                .and_then(|p| p.trim().parse::<i64>().ok())
                .filter(|p| (0..=100).contains(p))
                .ok_or_else(|| {
                    format!("invalid value {s:?}: expected an integer or a percentage")
                })?;
            Ok((total * pct + 99) / 100)
        }
        other => Err(format!("invalid value {other}")),
    }
}

/// The budget arithmetic of one PDB over its matching pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// Pods the PDB covers.
    pub expected: i64,
    /// Ready, non-terminating pods.
    pub current_healthy: i64,
    /// Pods that must stay healthy.
    pub desired_healthy: i64,
    /// Evictions allowed now.
    pub disruptions_allowed: i64,
}

/// Computes a PDB's budget from its spec and matching pods.
pub fn budget(pdb: &Value, pods: &[Arc<Value>]) -> Result<Budget, String> {
    let expected = i64::try_from(pods.len()).unwrap_or(i64::MAX);
    let current_healthy =
        i64::try_from(pods.iter().filter(|p| pod_healthy(p)).count()).unwrap_or(i64::MAX);
    let spec = pdb.get("spec").cloned().unwrap_or(Value::Null);
    let desired_healthy = match (spec.get("minAvailable"), spec.get("maxUnavailable")) {
        (Some(min), _) if !min.is_null() => scaled(min, expected)?,
        (_, Some(max)) if !max.is_null() => (expected - scaled(max, expected)?).max(0),
        _ => 1,
    };
    let disruptions_allowed = (current_healthy - desired_healthy).max(0);
    Ok(Budget {
        expected,
        current_healthy,
        desired_healthy,
        disruptions_allowed,
    })
}

/// Whether the disruption controller has written the PDB's status for its current generation.
fn observed(pdb: &Value) -> bool {
    let generation = pdb.pointer("/metadata/generation").and_then(Value::as_i64);
    generation.is_some()
        && pdb
            .pointer("/status/observedGeneration")
            .and_then(Value::as_i64)
            == generation
}

/// Decides whether evicting `pod` is allowed by `pdb` (given the PDB's matching pods), as the
/// eviction subresource does: from the status the disruption controller wrote
/// ([`crate::apiserver::loops::disruption`]) once it observed the PDB's generation; before that
/// (a PDB the loop has not seen yet, or the sim runs without loops), from the same arithmetic over
/// the pods at hand. `Ok(true)`: allowed and it spends one disruption (the caller records it in the
/// status); `Ok(false)`: allowed without spending (an unready pod).
pub fn check(pdb: &Value, pod: &Value, pods: &[Arc<Value>]) -> Result<bool, ApiError> {
    let name = pdb
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let from_status = observed(pdb);
    let b = if from_status {
        let n = |f: &str| {
            pdb.pointer(&format!("/status/{f}"))
                .and_then(Value::as_i64)
                .unwrap_or(0)
        };
        Budget {
            expected: n("expectedPods"),
            current_healthy: n("currentHealthy"),
            desired_healthy: n("desiredHealthy"),
            disruptions_allowed: n("disruptionsAllowed"),
        }
    } else {
        budget(pdb, pods)
            .map_err(|e| ApiError::internal(format!("PodDisruptionBudget {name}: {e}")))?
    };
    let always = pdb
        .pointer("/spec/unhealthyPodEvictionPolicy")
        .and_then(Value::as_str)
        == Some("AlwaysAllow");
    // An unready pod goes without spending the budget when the policy says AlwaysAllow or the
    // budget is met and non-zero (`CurrentHealthy >= DesiredHealthy && DesiredHealthy > 0`);
    // otherwise it needs a disruption like a ready pod.
    if !pod_healthy(pod)
        && (always || (b.current_healthy >= b.desired_healthy && b.desired_healthy > 0))
    {
        return Ok(false);
    }
    if b.disruptions_allowed > 0 {
        return Ok(from_status);
    }
    let cause = format!(
        "The disruption budget {name} needs {} healthy pods and has {} currently",
        b.desired_healthy, b.current_healthy
    );
    Err(ApiError::new(
        429,
        "TooManyRequests",
        format!("Cannot evict pod as it would violate the pod's disruption budget. {cause}"),
    )
    .with_details(json!({"causes": [{"reason": "DisruptionBudget", "message": cause}]})))
}

/// Spends one of the PDB's disruptions on `pod` (`checkAndDecrement`): `disruptionsAllowed` − 1 and
/// the pod in `disruptedPods`, so the next eviction sees it before the controller's next pass.
fn spend(t: &mut Txn<'_>, pdb: &Value, pod: &str) -> ApiResult<()> {
    let now = t.now();
    let ns = pdb
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let name = pdb
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    t.modify(well_known::pdbs(), ns, name, WriteTarget::Internal, |o| {
        let mut o = o.clone();
        let left = o
            .pointer("/status/disruptionsAllowed")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        o["status"]["disruptionsAllowed"] = json!((left - 1).max(0));
        if !o["status"]
            .get("disruptedPods")
            .is_some_and(Value::is_object)
        {
            o["status"]["disruptedPods"] = json!({});
        }
        o["status"]["disruptedPods"][pod] = json!(now);
        Ok(o)
    })
    .map(|_| ())
}

/// `deleteOptions.dryRun` of an Eviction: `true` for `["All"]` (nothing is deleted), an error for
/// any other value (`ValidateDeleteOptions`).
fn dry_run(body: &Value) -> ApiResult<bool> {
    let Some(v) = body
        .pointer("/deleteOptions/dryRun")
        .filter(|v| !v.is_null())
    else {
        return Ok(false);
    };
    let values: Vec<&str> = v
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    match values.as_slice() {
        [] => Ok(false),
        ["All"] => Ok(true),
        _ => Err(ApiError::new(
            422,
            "Invalid",
            format!("DeleteOptions.meta.k8s.io \"\" is invalid: dryRun: Unsupported value: {v}: supported values: \"All\""),
        )),
    }
}

/// `POST pods/{name}/eviction`: evaluates matching PDBs and deletes the pod gracefully when allowed
/// (with `deleteOptions.dryRun: ["All"]`: every check, nothing deleted). Refused with 403 in a
/// namespace that is being deleted, as NamespaceLifecycle admission does.
pub fn evict(t: &mut Txn<'_>, ns: &str, name: &str, body: &Value) -> ApiResult<Value> {
    let pods = well_known::pods();
    if t.namespace_terminating(ns) {
        return Err(ApiError::namespace_terminating(pods, name, ns));
    }
    if body
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|k| k != "Eviction")
    {
        return Err(ApiError::bad_request(
            "the body must be a policy/v1 Eviction",
        ));
    }
    if let Some(n) = body
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| *n != name)
    {
        return Err(ApiError::bad_request(format!(
            "name in URL ({name}) does not match name in Eviction object ({n})"
        )));
    }
    let pod = t
        .get(pods, ns, name)
        .ok_or_else(|| ApiError::not_found(pods, name))?;
    let phase = pod
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let skip_pdb = pod.pointer("/metadata/deletionTimestamp").is_some()
        || matches!(phase, "Succeeded" | "Failed" | "Pending");
    let dry = dry_run(body)?;
    let mut spends = None;
    if !skip_pdb {
        if let Some(pdb) = governing_pdb(&pod, t.list(well_known::pdbs(), Some(ns)))? {
            if check(&pdb, &pod, &covered_by(&pdb, t.list(pods, Some(ns))))? {
                spends = Some(pdb);
            }
        }
    }
    let grace = body
        .pointer("/deleteOptions/gracePeriodSeconds")
        .and_then(Value::as_i64);
    let uid = body
        .pointer("/deleteOptions/preconditions/uid")
        .and_then(Value::as_str)
        .map(str::to_string);
    if dry {
        // A dry-run delete still checks its preconditions.
        if uid
            .as_deref()
            .is_some_and(|u| pod.pointer("/metadata/uid").and_then(Value::as_str) != Some(u))
        {
            return Err(ApiError::conflict(pods, name, "Precondition failed: UID in precondition does not match the UID in record. The object might have been deleted and then recreated"));
        }
        return Ok(
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
        );
    }
    t.delete(
        pods,
        ns,
        name,
        &DeleteOptions {
            grace_seconds: grace,
            uid,
            resource_version: None,
        },
    )?;
    if let Some(pdb) = spends {
        spend(t, &pdb, name)?;
    }
    Ok(
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    )
}

/// The PDB that decides on evicting `pod`, out of the PDBs of its namespace (`None`: no PDB
/// selects it; an error when several do, as the eviction subresource refuses that).
pub fn governing_pdb(pod: &Value, pdbs: Vec<Arc<Value>>) -> Result<Option<Arc<Value>>, ApiError> {
    let labels = super::selectors::labels_of(pod);
    let mut matching = pdbs
        .into_iter()
        .filter(|pdb| pdb_selector(pdb).is_some_and(|s| s.matches(&labels)));
    let first = matching.next();
    if matching.next().is_some() {
        return Err(ApiError::internal(
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
        ));
    }
    Ok(first)
}

/// The pods (of the PDB's namespace) that `pdb` covers.
pub fn covered_by(pdb: &Value, pods: Vec<Arc<Value>>) -> Vec<Arc<Value>> {
    let selector = pdb_selector(pdb).unwrap_or_default();
    pods.into_iter()
        .filter(|p| selector.matches_object(p))
        .collect()
}

/// A PDB's selector; `None` for a missing selector (matches nothing), empty matches everything.
fn pdb_selector(pdb: &Value) -> Option<LabelSelector> {
    let sel = pdb.pointer("/spec/selector")?;
    LabelSelector::from_json(sel).ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pod(ready: bool) -> Arc<Value> {
        Arc::new(json!({"metadata": {"name": "p"}, "status": {"conditions": [
            {"type": "Ready", "status": if ready { "True" } else { "False" }}]}}))
    }

    fn pdb(spec: Value) -> Value {
        json!({"metadata": {"name": "web-pdb"}, "spec": spec})
    }

    #[test]
    fn budget_table() {
        // (spec, ready pods, unready pods, disruptions allowed)
        let cases: Vec<(Value, usize, usize, i64)> = vec![
            (json!({"minAvailable": 2}), 3, 0, 1),
            (json!({"minAvailable": 3}), 3, 0, 0),
            (json!({"minAvailable": "50%"}), 3, 0, 1), // ceil(1.5) = 2
            (json!({"minAvailable": "100%"}), 4, 0, 0),
            (json!({"maxUnavailable": 1}), 3, 0, 1),
            (json!({"maxUnavailable": 1}), 2, 1, 0),
            (json!({"maxUnavailable": "34%"}), 3, 0, 2), // ceil(1.02) = 2 unavailable
            (json!({"maxUnavailable": 0}), 3, 0, 0),
            (json!({"maxUnavailable": "0%"}), 5, 0, 0),
            (json!({}), 2, 0, 1),
        ];
        for (spec, ready, unready, want) in cases {
            let pods: Vec<Arc<Value>> = (0..ready)
                .map(|_| pod(true))
                .chain((0..unready).map(|_| pod(false)))
                .collect();
            let b = budget(&pdb(spec.clone()), &pods).unwrap();
            assert_eq!(
                b.disruptions_allowed, want,
                "spec {spec} ready {ready} unready {unready}: {b:?}"
            );
        }
        assert!(budget(&pdb(json!({"minAvailable": "x%"})), &[]).is_err());
        assert!(scaled(&json!("150%"), 10).is_err());
    }

    #[test]
    fn check_names_the_pdb_and_honours_unhealthy_policy() {
        let pods = vec![pod(true), pod(true)];
        let err = check(&pdb(json!({"minAvailable": 2})), &pods[0], &pods).unwrap_err();
        assert_eq!(err.code, 429);
        assert!(err.message.contains("web-pdb"), "{}", err.message);
        // An unready pod: IfHealthyBudget allows only when the budget is met.
        let mixed = vec![pod(true), pod(false)];
        assert!(check(&pdb(json!({"minAvailable": 2})), &mixed[1], &mixed).is_err());
        assert!(check(&pdb(json!({"minAvailable": 1})), &mixed[1], &mixed).is_ok());
        assert!(check(
            &pdb(json!({"minAvailable": 2, "unhealthyPodEvictionPolicy": "AlwaysAllow"})),
            &mixed[1],
            &mixed
        )
        .is_ok());
    }

    #[test]
    fn an_unready_pod_needs_a_non_zero_met_budget() {
        // All unready, minAvailable 0: healthy 0 >= desired 0, but desired is 0 → 429 (real:
        // `CurrentHealthy >= DesiredHealthy && DesiredHealthy > 0`), and no disruption is allowed.
        let unready = vec![pod(false), pod(false)];
        for spec in [
            json!({"minAvailable": 0}),
            json!({"maxUnavailable": "100%"}),
        ] {
            let err = check(&pdb(spec.clone()), &unready[0], &unready).unwrap_err();
            assert_eq!(err.code, 429, "{spec}");
        }
        // A budget with room still lets it go (like a ready pod).
        let mixed = vec![pod(true), pod(true), pod(false)];
        assert!(check(&pdb(json!({"minAvailable": 0})), &mixed[2], &mixed).is_ok());
        // AlwaysAllow: regardless.
        assert!(check(
            &pdb(json!({"minAvailable": 0, "unhealthyPodEvictionPolicy": "AlwaysAllow"})),
            &unready[0],
            &unready
        )
        .is_ok());
    }

    #[test]
    fn dry_run_values() {
        assert!(!dry_run(&json!({})).unwrap());
        assert!(!dry_run(&json!({"deleteOptions": {"dryRun": []}})).unwrap());
        assert!(dry_run(&json!({"deleteOptions": {"dryRun": ["All"]}})).unwrap());
        assert_eq!(
            dry_run(&json!({"deleteOptions": {"dryRun": ["Some"]}}))
                .unwrap_err()
                .code,
            422
        );
    }
}

//! What nodekeeper would do to each node of a what-if (pure): the decided actions summed up,
//! the blocker (a hold the policy publishes, or the PodDisruptionBudget / do-not-disrupt pod a
//! drain would meet first), and the table and JSON forms.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;
use serde_json::Value;

use crate::apiserver::eviction;
use nodekeeper_core::controller::act::actions::describe;
use nodekeeper_core::controller::act::drain::select::{self, Class, SelectOptions};
use nodekeeper_core::controller::policy::explain::Blocker;
use nodekeeper_core::controller::policy::view::State;
use nodekeeper_core::controller::policy::{group_of, Action, ClusterView, Decision, PolicyConfig};

/// One node's outcome.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Verdict {
    /// Node.
    pub node: String,
    /// Its budget group (`[budgets] group_by`).
    pub group: String,
    /// `repair:Ready=False`, `interruption:preemption`, `held`, `continue:repairing`, `none`.
    pub decision: String,
    /// The visible steps decided now: taint, cordon, drain, reboot, replace.
    pub steps: Vec<&'static str>,
    /// What holds it back, if anything.
    pub blocker: Option<Blocker>,
    /// [`Blocker::message`] of the blocker.
    pub why: Option<String>,
    /// Every decided action, as the controller logs it in dry run.
    pub actions: Vec<String>,
    /// The dry-run Events the controller recorded about the node.
    pub events: Vec<EventLine>,
}

/// A Kubernetes Event the controller recorded.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EventLine {
    /// Reason (docs/catalog.md).
    pub reason: String,
    /// Note.
    pub note: String,
}

/// Pods and PDBs as the drain forecast needs them.
pub struct Workloads {
    /// Every pod (JSON).
    pub pods: Vec<Arc<Value>>,
    /// Every PDB (JSON).
    pub pdbs: Vec<Arc<Value>>,
}

/// The verdict of every node of `view` (sorted by name) from `decisions`.
pub fn verdicts(
    view: &ClusterView,
    decisions: &[Decision],
    cfg: &PolicyConfig,
    w: &Workloads,
) -> Vec<Verdict> {
    let mut nodes: Vec<_> = view.nodes.iter().collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    nodes
        .into_iter()
        .map(|n| {
            let actions: Vec<&Action> = decisions
                .iter()
                .filter(|d| d.node == n.name)
                .map(|d| &d.action)
                .collect();
            let mut steps = Vec::new();
            let mut reason = None;
            let mut hold = None;
            for a in &actions {
                let step = match a {
                    Action::Taint { .. } => Some("taint"),
                    Action::Cordon => Some("cordon"),
                    Action::StartDrain { reason: r, .. } => {
                        reason.get_or_insert_with(|| r.clone());
                        Some("drain")
                    }
                    Action::RequestReboot { reason: r, .. } => {
                        reason.get_or_insert_with(|| r.clone());
                        Some("reboot")
                    }
                    Action::RequestReplacement { reason: r, .. } => {
                        reason.get_or_insert_with(|| r.clone());
                        Some("replace")
                    }
                    Action::Hold(h) => {
                        hold = Some(h.blocker.clone());
                        None
                    }
                    _ => None,
                };
                if let Some(s) = step.filter(|s| !steps.contains(s)) {
                    steps.push(s);
                }
            }
            let record = n.record();
            let recorded = record.state.name();
            // A hold already published on the node is not published again.
            let hold = hold.or_else(|| record.held.map(|h| h.blocker));
            let draining = steps.contains(&"drain");
            let blocker = match hold {
                Some(b) => Some(b),
                None if draining => drain_blocker(&n.name, cfg, w),
                None => None,
            };
            let decision = match (reason, &blocker, recorded) {
                (Some(r), _, _) => r,
                (None, Some(_), _) if steps.is_empty() => "held".to_string(),
                (None, _, Some(state)) if record.state != State::Idle => {
                    format!("continue:{state}")
                }
                _ if !steps.is_empty() => "act".to_string(),
                _ => "none".to_string(),
            };
            Verdict {
                node: n.name.clone(),
                group: group_of(n, cfg),
                decision,
                steps,
                why: blocker.as_ref().map(Blocker::message),
                blocker,
                actions: actions.iter().map(|a| describe(a)).collect(),
                events: Vec::new(),
            }
        })
        .collect()
}

/// The first pod a drain of `node` could not evict now: held by do-not-disrupt, or refused by
/// its PodDisruptionBudget. Pods are taken in the drain's tier order. A PDB with a `status` (any
/// export of a real cluster: kube-controller-manager's disruption controller writes it) is judged as
/// the real Eviction API judges it, by [`status_allows`], each eviction taking one of its
/// `disruptionsAllowed`; a PDB without one (a hand-written snapshot) by the sim's arithmetic
/// ([`eviction::check`]).
pub fn drain_blocker(node: &str, cfg: &PolicyConfig, w: &Workloads) -> Option<Blocker> {
    let on_node: Vec<Pod> = w
        .pods
        .iter()
        .filter(|p| p.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node))
        .filter_map(|p| serde_json::from_value((**p).clone()).ok())
        .collect();
    let opts = SelectOptions {
        taint_key: cfg.interruption.taint_key.clone(),
        ..SelectOptions::at(chrono::Utc::now())
    };
    let plan = select::plan(&on_node, &opts);
    let mut taken: std::collections::HashMap<String, i64> = std::collections::HashMap::new();
    for (pod, class) in plan.all() {
        let key = select::pod_key(pod);
        match class {
            Class::Held(_) => {
                return Some(Blocker::DoNotDisrupt {
                    pod: key,
                    deadline: None,
                })
            }
            Class::Evict(_) => {}
            _ => continue,
        }
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let in_ns = |list: &[Arc<Value>]| -> Vec<Arc<Value>> {
            list.iter()
                .filter(|o| o.pointer("/metadata/namespace").and_then(Value::as_str) == Some(&ns))
                .cloned()
                .collect()
        };
        let Some(raw) = w.pods.iter().find(|p| super::snapshot::key_of(p) == key) else {
            continue;
        };
        let pdb = match eviction::governing_pdb(raw, in_ns(&w.pdbs)) {
            Ok(Some(pdb)) => pdb,
            Ok(None) => continue,
            // Several PDBs select the pod: the eviction API refuses it outright.
            Err(_) => {
                return Some(Blocker::Pdb {
                    pod: key,
                    pdb: format!("{ns}/(more than one)"),
                    deadline: None,
                })
            }
        };
        let pdb_key = format!(
            "{ns}/{}",
            super::snapshot::name_of(&pdb).unwrap_or_default()
        );
        let allowed = match pdb.get("status").filter(|s| s.is_object()) {
            Some(_) => {
                let used = taken.entry(pdb_key).or_insert(0);
                status_allows(&pdb, raw, used)
            }
            None => {
                let covered = eviction::covered_by(&pdb, in_ns(&w.pods));
                eviction::check(&pdb, raw, &covered).is_ok()
            }
        };
        if !allowed {
            return Some(Blocker::Pdb {
                pod: key,
                pdb: format!(
                    "{ns}/{}",
                    super::snapshot::name_of(&pdb).unwrap_or_default()
                ),
                deadline: None,
            });
        }
    }
    None
}

/// Whether the real Eviction API (`pkg/registry/core/pod/storage/eviction.go`) lets `pod` go under
/// `pdb`, from the PDB's `status` as the disruption controller wrote it; `used` counts the evictions
/// this forecast already took from it (a successful eviction decrements `disruptionsAllowed`).
/// - a pod that is not Running (Pending, Succeeded, Failed) or already terminating: always;
/// - an unready pod: with `unhealthyPodEvictionPolicy: AlwaysAllow`, always; otherwise when
///   `currentHealthy >= desiredHealthy > 0`;
/// - a ready pod: when the status is current (`observedGeneration >= generation`; a PDB not yet
///   processed answers 429) and `disruptionsAllowed - used > 0`.
pub fn status_allows(pdb: &Value, pod: &Value, used: &mut i64) -> bool {
    let phase = pod
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    if phase != "Running" || pod.pointer("/metadata/deletionTimestamp").is_some() {
        return true;
    }
    let int = |p: &str| pdb.pointer(p).and_then(Value::as_i64).unwrap_or(0);
    if !eviction::pod_healthy(pod) {
        let policy = pdb
            .pointer("/spec/unhealthyPodEvictionPolicy")
            .and_then(Value::as_str);
        if policy == Some("AlwaysAllow") {
            return true;
        }
        let desired = int("/status/desiredHealthy");
        return int("/status/currentHealthy") >= desired && desired > 0;
    }
    if int("/status/observedGeneration") < int("/metadata/generation") {
        return false;
    }
    if int("/status/disruptionsAllowed") - *used > 0 {
        *used += 1;
        return true;
    }
    false
}

/// The per-node table of the text output.
pub fn table(verdicts: &[Verdict]) -> String {
    let rows: Vec<[String; 4]> = verdicts
        .iter()
        .map(|v| {
            let what = if v.steps.is_empty() {
                v.decision.clone()
            } else {
                format!("{} → {}", v.decision, v.steps.join(" + "))
            };
            let why = v.why.clone().unwrap_or_else(|| "-".into());
            [v.node.clone(), v.group.clone(), what, why]
        })
        .collect();
    let header = ["NODE", "GROUP", "DECISION", "BLOCKER"].map(String::from);
    let w = |i: usize| {
        rows.iter()
            .chain(std::iter::once(&header))
            .map(|r| r[i].chars().count())
            .max()
            .unwrap_or(0)
    };
    let (w0, w1, w2) = (w(0), w(1), w(2));
    let mut s = String::new();
    for r in std::iter::once(&header).chain(&rows) {
        let pad =
            |t: &str, n: usize| format!("{t}{}", " ".repeat(n.saturating_sub(t.chars().count())));
        s.push_str(&format!(
            "{}  {}  {}  {}\n",
            pad(&r[0], w0),
            pad(&r[1], w1),
            pad(&r[2], w2),
            r[3]
        ));
    }
    let acting = verdicts.iter().filter(|v| !v.steps.is_empty()).count();
    let held = verdicts.iter().filter(|v| v.blocker.is_some()).count();
    s.push_str(&format!(
        "{acting} node(s) acted on, {held} blocked or held, {} untouched",
        verdicts
            .iter()
            .filter(|v| v.steps.is_empty() && v.blocker.is_none())
            .count()
    ));
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, node: &str, app: &str) -> Arc<Value> {
        Arc::new(
            json!({"metadata": {"name": name, "namespace": "default", "labels": {"app": app},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": app, "uid": "u", "controller": true}]},
            "spec": {"nodeName": node, "containers": [{"name": "c"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}),
        )
    }

    #[test]
    fn forecast_names_the_pdb_that_allows_no_disruption() {
        let pdb = |name: &str, app: &str, min: i64| {
            Arc::new(json!({"metadata": {"name": name, "namespace": "default"},
                "spec": {"minAvailable": min, "selector": {"matchLabels": {"app": app}}}}))
        };
        let w = Workloads {
            pods: vec![
                pod("web-0", "n-0", "web"),
                pod("web-1", "n-1", "web"),
                pod("db-0", "n-0", "db"),
                pod("db-1", "n-1", "db"),
            ],
            pdbs: vec![pdb("web-pdb", "web", 1), pdb("db-pdb", "db", 2)],
        };
        let cfg = PolicyConfig::default();
        let b = drain_blocker("n-0", &cfg, &w).unwrap();
        assert_eq!(
            b,
            Blocker::Pdb {
                pod: "default/db-0".into(),
                pdb: "default/db-pdb".into(),
                deadline: None
            }
        );
        let relaxed = Workloads {
            pdbs: vec![pdb("web-pdb", "web", 1), pdb("db-pdb", "db", 1)],
            ..w
        };
        assert_eq!(drain_blocker("n-0", &cfg, &relaxed), None);
    }

    #[test]
    fn a_pdb_status_is_judged_as_the_eviction_api_does() {
        let pdb = |status: Value, extra: Value| {
            let mut p = json!({"metadata": {"name": "p", "namespace": "default", "generation": 2},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}, "status": status});
            if let Some(policy) = extra.get("policy") {
                p["spec"]["unhealthyPodEvictionPolicy"] = policy.clone();
            }
            p
        };
        let ready = pod("web-0", "n-0", "web");
        let mut unready = (*ready).clone();
        unready["status"]["conditions"][0]["status"] = json!("False");
        let mut pending = (*ready).clone();
        pending["status"]["phase"] = json!("Pending");
        let st = |allowed: i64, cur: i64, desired: i64, gen: i64| {
            json!({"disruptionsAllowed": allowed, "currentHealthy": cur, "desiredHealthy": desired,
                   "expectedPods": 3, "observedGeneration": gen})
        };
        let none = json!({});
        // (pdb, pod, evictions already taken, allowed)
        let cases = [
            (pdb(st(1, 3, 2, 2), none.clone()), &*ready, 0, true),
            (pdb(st(1, 3, 2, 2), none.clone()), &*ready, 1, false),
            (pdb(st(0, 2, 2, 2), none.clone()), &*ready, 0, false),
            // Not yet processed at this generation: 429 "still being processed".
            (pdb(st(5, 3, 2, 1), none.clone()), &*ready, 0, false),
            // A bare pod under maxUnavailable: the disruption controller wrote 0 expected, 0 allowed.
            (pdb(st(0, 1, 0, 2), none.clone()), &*ready, 0, false),
            (pdb(st(0, 2, 2, 2), none.clone()), &unready, 0, true),
            (pdb(st(0, 1, 2, 2), none.clone()), &unready, 0, false),
            (pdb(st(0, 0, 0, 2), none.clone()), &unready, 0, false),
            (
                pdb(st(0, 1, 2, 2), json!({"policy": "AlwaysAllow"})),
                &unready,
                0,
                true,
            ),
            (pdb(st(0, 0, 2, 2), none.clone()), &pending, 0, true),
        ];
        for (i, (p, pod, taken, want)) in cases.into_iter().enumerate() {
            let mut used = taken;
            assert_eq!(status_allows(&p, pod, &mut used), want, "case {i}");
            assert_eq!(
                used,
                if want
                    && pod.pointer("/status/conditions/0/status") == Some(&json!("True"))
                    && pod["status"]["phase"] == "Running"
                {
                    taken + 1
                } else {
                    taken
                },
                "case {i}: used"
            );
        }
    }

    #[test]
    fn table_lists_decision_and_blocker() {
        let v = Verdict {
            node: "n-0".into(),
            group: "spot".into(),
            decision: "repair:Ready=False".into(),
            steps: vec!["cordon", "drain"],
            blocker: None,
            why: Some("eviction refused".into()),
            actions: vec![],
            events: vec![],
        };
        let t = table(&[v]);
        assert!(t.contains("repair:Ready=False → cordon + drain"), "{t}");
        assert!(t.contains("eviction refused"), "{t}");
    }
}

//! What nodekeeper would do to each node of a what-if (pure): the decided actions summed up,
//! the blocker (a hold the policy publishes, or the PodDisruptionBudget / do-not-disrupt pod a
//! drain would meet first), and the table and JSON forms.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;
use serde_json::Value;

use crate::controller::actions::describe;
use crate::controller::drain::select::{self, Class, SelectOptions};
use crate::controller::policy::explain::Blocker;
use crate::controller::policy::view::State;
use crate::controller::policy::{group_of, Action, ClusterView, Decision, PolicyConfig};
use crate::sim::apiserver::eviction;

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
/// its PodDisruptionBudget with the Eviction API's own arithmetic (the sim's
/// [`eviction::check`]). Pods are taken in the drain's tier order.
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
        let covered = eviction::covered_by(&pdb, in_ns(&w.pods));
        if eviction::check(&pdb, raw, &covered).is_err() {
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

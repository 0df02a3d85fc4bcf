//! Pure pod classification: which pods of a node the drain evicts, in which tier, and which it leaves
//! alone. No I/O; table-tested.

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Pod, Toleration};
use serde::Serialize;

use super::{Tier, DO_NOT_DISRUPT, KARPENTER_DO_NOT_DISRUPT};

/// Annotation the kubelet puts on mirror pods of static manifests.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Why a pod is not drained at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SkipReason {
    /// A mirror pod of a static manifest (the API cannot delete it).
    Mirror,
    /// Succeeded or Failed.
    Terminal,
    /// Tolerates the drain taint, so it would come straight back.
    ToleratesTaint,
    /// Terminating for longer than the stuck threshold past its deletion time (its node is likely gone).
    StuckTerminating,
    /// A DaemonSet pod created after the drain started: the DaemonSet controller ignores cordons, so it
    /// would recreate every evicted pod (taint the node to keep DaemonSet pods off).
    RecreatedDaemonSet,
}

/// How one pod is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Evict it in this tier.
    Evict(Tier),
    /// Counts in this tier but is held by a do-not-disrupt annotation.
    Held(Tier),
    /// Already terminating: counts in this tier until it is gone.
    Terminating(Tier),
    /// Not drained.
    Skip(SkipReason),
}

impl Class {
    /// The tier, unless skipped.
    pub fn tier(self) -> Option<Tier> {
        match self {
            Class::Evict(t) | Class::Held(t) | Class::Terminating(t) => Some(t),
            Class::Skip(_) => None,
        }
    }
}

/// Inputs of the classification besides the pod.
#[derive(Debug, Clone)]
pub struct SelectOptions {
    /// Key of the drain taint (pods tolerating `KEY[=value]:NoSchedule` are skipped).
    pub taint_key: String,
    /// Value of the drain taint; `None` matches tolerations of any value.
    pub taint_value: Option<String>,
    /// Honour do-not-disrupt annotations (false past an interruption's deadline).
    pub honour_do_not_disrupt: bool,
    /// Now (for stuck-terminating detection).
    pub now: DateTime<Utc>,
    /// A pod still terminating this long after its deletion timestamp is skipped.
    pub stuck_after: chrono::Duration,
    /// UIDs of the DaemonSet pods on the node when the drain started; other DaemonSet pods are
    /// skipped as recreated. `None`: no such filter (first listing).
    pub initial_daemonset_pods: Option<std::collections::HashSet<String>>,
}

impl SelectOptions {
    /// Defaults for a drain at `now`: the nodekeeper taint, any value, annotations honoured, stuck after 60 s.
    pub fn at(now: DateTime<Utc>) -> Self {
        SelectOptions {
            taint_key: super::INTERRUPTION_TAINT.into(),
            taint_value: None,
            honour_do_not_disrupt: true,
            now,
            stuck_after: chrono::Duration::seconds(60),
            initial_daemonset_pods: None,
        }
    }
}

/// Classifies one pod.
pub fn classify(pod: &Pod, o: &SelectOptions) -> Class {
    if let Some(skip) = skip_reason(pod, o) {
        return Class::Skip(skip);
    }
    let tier = tier_of(pod);
    if pod.metadata.deletion_timestamp.is_some() {
        Class::Terminating(tier)
    } else if o.honour_do_not_disrupt && do_not_disrupt(pod) {
        Class::Held(tier)
    } else {
        Class::Evict(tier)
    }
}

fn skip_reason(pod: &Pod, o: &SelectOptions) -> Option<SkipReason> {
    if is_mirror(pod) {
        return Some(SkipReason::Mirror);
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return Some(SkipReason::Terminal);
    }
    if tolerates_taint(pod, &o.taint_key, o.taint_value.as_deref()) {
        return Some(SkipReason::ToleratesTaint);
    }
    let stuck = pod.metadata.deletion_timestamp.as_ref().is_some_and(|t| {
        o.now.timestamp_millis() - t.0.as_millisecond() > o.stuck_after.num_milliseconds()
    });
    if stuck {
        return Some(SkipReason::StuckTerminating);
    }
    let recreated = o.initial_daemonset_pods.as_ref().is_some_and(|known| {
        is_daemonset(pod) && !known.contains(pod.metadata.uid.as_deref().unwrap_or_default())
    });
    recreated.then_some(SkipReason::RecreatedDaemonSet)
}

/// A mirror pod: the kubelet's annotation or owned by the Node.
pub fn is_mirror(pod: &Pod) -> bool {
    let annotated = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION));
    annotated || controller_kind(pod) == Some("Node")
}

/// Owned (as controller) by a DaemonSet.
pub fn is_daemonset(pod: &Pod) -> bool {
    controller_kind(pod) == Some("DaemonSet")
}

fn controller_kind(pod: &Pod) -> Option<&str> {
    pod.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| o.kind.as_str())
}

/// Priority class `system-cluster-critical` or `system-node-critical`.
pub fn is_critical(pod: &Pod) -> bool {
    let class = pod
        .spec
        .as_ref()
        .and_then(|s| s.priority_class_name.as_deref());
    matches!(
        class,
        Some("system-cluster-critical" | "system-node-critical")
    )
}

/// The pod's tier.
pub fn tier_of(pod: &Pod) -> Tier {
    match (is_critical(pod), is_daemonset(pod)) {
        (false, false) => Tier::NonCritical,
        (false, true) => Tier::NonCriticalDaemonSet,
        (true, false) => Tier::Critical,
        (true, true) => Tier::CriticalDaemonSet,
    }
}

/// `karpenter.sh/do-not-disrupt: "true"` or `nodekeeper.io/do-not-disrupt: "true"`.
pub fn do_not_disrupt(pod: &Pod) -> bool {
    pod.metadata.annotations.as_ref().is_some_and(|a| {
        [KARPENTER_DO_NOT_DISRUPT, DO_NOT_DISRUPT]
            .iter()
            .any(|k| a.get(*k).is_some_and(|v| v.eq_ignore_ascii_case("true")))
    })
}

/// Whether the pod tolerates the `key[=value]:NoSchedule` taint.
pub fn tolerates_taint(pod: &Pod, key: &str, value: Option<&str>) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| tolerates(t, key, value)))
}

fn tolerates(t: &Toleration, key: &str, value: Option<&str>) -> bool {
    let effect_ok = matches!(t.effect.as_deref(), None | Some("") | Some("NoSchedule"));
    let tkey = t.key.as_deref().unwrap_or_default();
    let exists = t.operator.as_deref() == Some("Exists");
    if !effect_ok || (tkey.is_empty() && !exists) {
        return false;
    }
    if tkey.is_empty() {
        return true;
    }
    if tkey != key {
        return false;
    }
    exists || value.is_none_or(|v| t.value.as_deref().unwrap_or_default() == v)
}

/// One node's pods, classified.
#[derive(Debug, Clone, Default)]
pub struct Plan<'a> {
    /// The first tier with pods left (the one being drained), if any.
    pub tier: Option<Tier>,
    /// Pods per tier (index = [`Tier::index`]) with their class.
    pub tiers: [Vec<(&'a Pod, Class)>; 4],
    /// Pods not drained.
    pub skipped: Vec<(&'a Pod, SkipReason)>,
}

impl<'a> Plan<'a> {
    /// Pods left in all tiers.
    pub fn remaining(&self) -> usize {
        self.tiers.iter().map(Vec::len).sum()
    }

    /// Pods of the tier being drained.
    pub fn active(&self) -> &[(&'a Pod, Class)] {
        self.tier.map(|t| &self.tiers[t.index()][..]).unwrap_or(&[])
    }

    /// Pods of every tier, in order.
    pub fn all(&self) -> impl Iterator<Item = &(&'a Pod, Class)> {
        self.tiers.iter().flatten()
    }
}

/// Classifies every pod and picks the first non-empty tier.
pub fn plan<'a>(pods: &'a [Pod], o: &SelectOptions) -> Plan<'a> {
    let mut p = Plan::default();
    for pod in pods {
        match classify(pod, o) {
            Class::Skip(r) => p.skipped.push((pod, r)),
            c => {
                if let Some(t) = c.tier() {
                    p.tiers[t.index()].push((pod, c));
                }
            }
        }
    }
    p.tier = Tier::ALL
        .into_iter()
        .find(|t| !p.tiers[t.index()].is_empty());
    p
}

/// `namespace/name` of a pod.
pub fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(extra: serde_json::Value) -> Pod {
        let mut base = json!({"metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Running"}});
        merge(&mut base, extra);
        serde_json::from_value(base).unwrap()
    }

    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn ds() -> serde_json::Value {
        json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
            "name": "d", "uid": "u", "controller": true}]}})
    }

    fn now() -> DateTime<Utc> {
        "2026-01-01T00:10:00Z".parse().unwrap()
    }

    #[test]
    fn classification_table() {
        let crit = json!({"spec": {"priorityClassName": "system-node-critical"}});
        let mut crit_ds = ds();
        merge(&mut crit_ds, crit.clone());
        let rs_owner = json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1",
            "kind": "ReplicaSet", "name": "r", "uid": "u", "controller": true}]}});
        let non_controller_ds = json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1",
            "kind": "DaemonSet", "name": "d", "uid": "u", "controller": false}]}});
        let tol = |t: serde_json::Value| json!({"spec": {"tolerations": [t]}});
        let cases: Vec<(&str, serde_json::Value, Class)> = vec![
            ("plain", json!({}), Class::Evict(Tier::NonCritical)),
            ("replicaset", rs_owner, Class::Evict(Tier::NonCritical)),
            ("daemonset", ds(), Class::Evict(Tier::NonCriticalDaemonSet)),
            (
                "ds not controller",
                non_controller_ds,
                Class::Evict(Tier::NonCritical),
            ),
            ("critical", crit.clone(), Class::Evict(Tier::Critical)),
            (
                "cluster critical",
                json!({"spec": {"priorityClassName": "system-cluster-critical"}}),
                Class::Evict(Tier::Critical),
            ),
            (
                "other priority",
                json!({"spec": {"priorityClassName": "high"}}),
                Class::Evict(Tier::NonCritical),
            ),
            (
                "critical ds",
                crit_ds,
                Class::Evict(Tier::CriticalDaemonSet),
            ),
            (
                "mirror",
                json!({"metadata": {"annotations": {MIRROR_ANNOTATION: "x"}}}),
                Class::Skip(SkipReason::Mirror),
            ),
            (
                "node owned",
                json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Node",
                "name": "n", "uid": "u", "controller": true}]}}),
                Class::Skip(SkipReason::Mirror),
            ),
            (
                "succeeded",
                json!({"status": {"phase": "Succeeded"}}),
                Class::Skip(SkipReason::Terminal),
            ),
            (
                "failed",
                json!({"status": {"phase": "Failed"}}),
                Class::Skip(SkipReason::Terminal),
            ),
            (
                "pending",
                json!({"status": {"phase": "Pending"}}),
                Class::Evict(Tier::NonCritical),
            ),
            (
                "tolerate all",
                tol(json!({"operator": "Exists"})),
                Class::Skip(SkipReason::ToleratesTaint),
            ),
            (
                "tolerate key",
                tol(json!({"key": INTERRUPTION, "operator": "Exists"})),
                Class::Skip(SkipReason::ToleratesTaint),
            ),
            (
                "tolerate key NoSchedule",
                tol(json!({"key": INTERRUPTION, "operator": "Exists", "effect": "NoSchedule"})),
                Class::Skip(SkipReason::ToleratesTaint),
            ),
            (
                "tolerate key NoExecute only",
                tol(json!({"key": INTERRUPTION, "operator": "Exists", "effect": "NoExecute"})),
                Class::Evict(Tier::NonCritical),
            ),
            (
                "tolerate equal any value",
                tol(json!({"key": INTERRUPTION, "operator": "Equal", "value": "spot"})),
                Class::Skip(SkipReason::ToleratesTaint),
            ),
            (
                "tolerate other key",
                tol(json!({"key": "node.kubernetes.io/unschedulable", "operator": "Exists"})),
                Class::Evict(Tier::NonCritical),
            ),
            (
                "ds tolerating all",
                {
                    let mut d = ds();
                    merge(&mut d, tol(json!({"operator": "Exists"})));
                    d
                },
                Class::Skip(SkipReason::ToleratesTaint),
            ),
            (
                "karpenter dnd",
                json!({"metadata": {"annotations": {KARPENTER_DO_NOT_DISRUPT: "true"}}}),
                Class::Held(Tier::NonCritical),
            ),
            (
                "nodekeeper dnd",
                json!({"metadata": {"annotations": {DO_NOT_DISRUPT: "True"}}}),
                Class::Held(Tier::NonCritical),
            ),
            (
                "dnd false",
                json!({"metadata": {"annotations": {DO_NOT_DISRUPT: "false"}}}),
                Class::Evict(Tier::NonCritical),
            ),
            (
                "dnd on ds",
                {
                    let mut d = ds();
                    merge(
                        &mut d,
                        json!({"metadata": {"annotations": {DO_NOT_DISRUPT: "true"}}}),
                    );
                    d
                },
                Class::Held(Tier::NonCriticalDaemonSet),
            ),
            (
                "terminating",
                json!({"metadata": {"deletionTimestamp": "2026-01-01T00:09:50Z"}}),
                Class::Terminating(Tier::NonCritical),
            ),
            (
                "stuck terminating",
                json!({"metadata": {"deletionTimestamp": "2026-01-01T00:08:00Z"}}),
                Class::Skip(SkipReason::StuckTerminating),
            ),
            (
                "terminating dnd",
                json!({"metadata": {"deletionTimestamp": "2026-01-01T00:09:50Z", "annotations": {DO_NOT_DISRUPT: "true"}}}),
                Class::Terminating(Tier::NonCritical),
            ),
        ];
        let o = SelectOptions::at(now());
        for (name, extra, want) in cases {
            assert_eq!(classify(&pod(extra), &o), want, "case {name}");
        }
    }

    const INTERRUPTION: &str = super::super::INTERRUPTION_TAINT;

    #[test]
    fn recreated_daemonset_pods_are_skipped() {
        let mut d = ds();
        merge(&mut d, json!({"metadata": {"uid": "new"}}));
        let mut o = SelectOptions::at(now());
        assert_eq!(
            classify(&pod(d.clone()), &o),
            Class::Evict(Tier::NonCriticalDaemonSet)
        );
        o.initial_daemonset_pods = Some(["old".to_string()].into());
        assert_eq!(
            classify(&pod(d.clone()), &o),
            Class::Skip(SkipReason::RecreatedDaemonSet)
        );
        o.initial_daemonset_pods = Some(["new".to_string()].into());
        assert_eq!(
            classify(&pod(d), &o),
            Class::Evict(Tier::NonCriticalDaemonSet)
        );
        // Only DaemonSet pods.
        o.initial_daemonset_pods = Some(Default::default());
        assert_eq!(
            classify(&pod(json!({})), &o),
            Class::Evict(Tier::NonCritical)
        );
    }

    #[test]
    fn taint_value_and_deadline_override() {
        let p = pod(
            json!({"spec": {"tolerations": [{"key": INTERRUPTION, "operator": "Equal", "value": "spot"}]},
            "metadata": {"annotations": {KARPENTER_DO_NOT_DISRUPT: "true"}}}),
        );
        let mut o = SelectOptions::at(now());
        o.taint_value = Some("maintenance".into());
        assert_eq!(classify(&p, &o), Class::Held(Tier::NonCritical));
        o.honour_do_not_disrupt = false;
        assert_eq!(classify(&p, &o), Class::Evict(Tier::NonCritical));
        o.taint_value = Some("spot".into());
        assert_eq!(classify(&p, &o), Class::Skip(SkipReason::ToleratesTaint));
    }

    #[test]
    fn plan_picks_first_non_empty_tier() {
        let mut crit = ds();
        merge(
            &mut crit,
            json!({"spec": {"priorityClassName": "system-node-critical"}}),
        );
        let pods = vec![
            pod(crit.clone()),
            pod(ds()),
            pod(json!({"status": {"phase": "Succeeded"}})),
            pod(json!({"spec": {"priorityClassName": "system-cluster-critical"}})),
        ];
        let o = SelectOptions::at(now());
        let p = plan(&pods, &o);
        assert_eq!(p.tier, Some(Tier::NonCriticalDaemonSet));
        assert_eq!(p.remaining(), 3);
        assert_eq!(p.active().len(), 1);
        assert_eq!(p.skipped.len(), 1);
        let p = plan(&pods[..1], &o);
        assert_eq!(p.tier, Some(Tier::CriticalDaemonSet));
        let p = plan(&pods[2..3], &o);
        assert_eq!(p.tier, None);
        assert_eq!(p.remaining(), 0);
        let mut plain = vec![pod(json!({}))];
        plain.extend(pods);
        assert_eq!(plan(&plain, &o).tier, Some(Tier::NonCritical));
    }
}

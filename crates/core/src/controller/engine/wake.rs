//! Which Node changes wake the disruption engine ([`NodeWake`]): only those the policy can see
//! ([`policy_digest`]), so that kubelets' heartbeats and other controllers' writes do not start a
//! reconcile each.

use std::collections::{BTreeSet, HashMap, HashSet};

use k8s_openapi::api::core::v1::Node;

use crate::controller::engine::time;
use crate::controller::policy::view::keys;
use crate::controller::policy::PolicyConfig;

/// A digest of what [`node_view`](crate::controller::engine::node_view) reads from a Node, so the Node watch wakes the engine only for a
/// change the policy can see: a kubelet's or our own condition heartbeat (`lastHeartbeatTime`), a
/// status field nothing decides on, another controller's annotation or `managedFields` leave it as
/// it was. At 5,000 nodes such writes arrive every few milliseconds and each would start a full
/// reconcile.
///
/// Of the conditions, only those whose type is in `conditions` count (all when `None`).
pub fn policy_digest(n: &Node, conditions: Option<&BTreeSet<String>>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    let m = &n.metadata;
    m.name.hash(&mut h);
    m.labels.hash(&mut h);
    // Only the annotations the policy reads: other controllers annotate Nodes too (kube-controller-
    // manager's TTL controller rewrites `node.alpha.kubernetes.io/ttl` on every node each time the
    // cluster crosses one of its size steps).
    for (k, v) in m.annotations.iter().flatten() {
        if keys::read_by_policy(k) {
            (k, v).hash(&mut h);
        }
    }
    m.creation_timestamp.as_ref().map(time).hash(&mut h);
    m.deletion_timestamp.is_some().hash(&mut h);
    let spec = n.spec.as_ref();
    spec.and_then(|s| s.unschedulable).hash(&mut h);
    for t in spec.and_then(|s| s.taints.as_deref()).unwrap_or_default() {
        (&t.key, &t.value, &t.effect).hash(&mut h);
    }
    let status = n.status.as_ref();
    for c in status
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|c| conditions.is_none_or(|read| read.contains(&c.type_)))
    {
        // The reason too: a policy's `reason` pattern reads it.
        (
            &c.type_,
            &c.status,
            &c.reason,
            c.last_transition_time.as_ref().map(time),
        )
            .hash(&mut h);
    }
    status
        .and_then(|s| s.node_info.as_ref())
        .map(|i| &i.boot_id)
        .hash(&mut h);
    h.finish()
}

/// Which Node watch events wake the engine: a node's arrival or departure, a (re-)list's end, and a
/// change of its [`policy_digest`]. A change the policy cannot see wakes nothing (the tick and the
/// toleration timer still run).
#[derive(Debug, Default)]
pub struct NodeWake {
    seen: HashMap<String, u64>,
    /// The names listed so far by a (re-)list under way.
    relisted: Option<HashSet<String>>,
    /// The condition types whose changes count (all when `None`).
    conditions: Option<BTreeSet<String>>,
}

impl NodeWake {
    /// Wakes only for the conditions `policy` reads ([`RepairConfig::condition_types`]): an
    /// agent's check flipping a condition no repair policy names changes no decision.
    ///
    /// [`RepairConfig::condition_types`]: crate::controller::policy::config::RepairConfig::condition_types
    pub fn for_policy(policy: &PolicyConfig) -> Self {
        NodeWake {
            conditions: Some(policy.repair.condition_types()),
            ..NodeWake::default()
        }
    }

    fn digest(&self, n: &Node) -> u64 {
        policy_digest(n, self.conditions.as_ref())
    }

    /// Records `ev`; true when the engine should reconcile.
    pub fn wakes(&mut self, ev: &kube::runtime::watcher::Event<Node>) -> bool {
        use kube::runtime::watcher::Event;
        let name = |n: &Node| n.metadata.name.clone().unwrap_or_default();
        match ev {
            Event::Apply(n) => {
                let d = self.digest(n);
                self.seen.insert(name(n), d) != Some(d)
            }
            Event::Delete(n) => {
                self.seen.remove(&name(n));
                true
            }
            Event::Init => {
                self.relisted = Some(HashSet::new());
                false
            }
            Event::InitApply(n) => {
                if let Some(l) = self.relisted.as_mut() {
                    l.insert(name(n));
                }
                let d = self.digest(n);
                self.seen.insert(name(n), d);
                false
            }
            Event::InitDone => {
                // Forget the nodes that went while the watch was down.
                if let Some(l) = self.relisted.take() {
                    self.seen.retain(|n, _| l.contains(n));
                }
                true
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;
    use serde_json::json;
    use std::time::Duration;

    fn node(name: &str, ready: &str, heartbeat: &str, rv: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": { "name": name, "resourceVersion": rv,
                "creationTimestamp": "2026-12-01T00:00:00Z",
                "labels": { "karpenter.sh/nodepool": "a" } },
            "spec": { "providerID": "kwok://x" },
            "status": {
                "conditions": [{ "type": "Ready", "status": ready, "reason": "KubeletReady",
                    "lastHeartbeatTime": heartbeat, "lastTransitionTime": "2026-12-01T00:01:00Z" }],
                "nodeInfo": { "bootID": "b1", "machineID": "", "systemUUID": "", "kernelVersion": "",
                    "osImage": "", "containerRuntimeVersion": "", "kubeletVersion": "",
                    "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64" }
            }
        }))
        .unwrap()
    }

    /// A heartbeat (new `lastHeartbeatTime` and resourceVersion, a status field the policy does not
    /// read) wakes nothing; each change the policy reads does, once.
    #[test]
    fn only_changes_the_policy_sees_wake_the_engine() {
        let mut w = NodeWake::default();
        let base = node("n1", "True", "2026-12-01T00:02:00Z", "10");
        assert!(w.wakes(&Event::Apply(base.clone())), "a new node");
        let mut beat = node("n1", "True", "2026-12-01T00:02:10Z", "11");
        beat.status.as_mut().unwrap().allocatable = Some(Default::default());
        assert!(!w.wakes(&Event::Apply(beat)), "a heartbeat");
        type Edit = fn(&mut Node);
        let changes: [(&str, Edit); 7] = [
            ("Ready=False", |n| {
                n.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into()
            }),
            ("an annotation", |n| {
                n.metadata.annotations =
                    Some([("nodekeeper.io/state".into(), "repairing".into())].into())
            }),
            ("a label", |n| {
                n.metadata
                    .labels
                    .as_mut()
                    .unwrap()
                    .insert("karpenter.sh/nodepool".into(), "b".into());
            }),
            ("cordoned", |n| {
                n.spec.as_mut().unwrap().unschedulable = Some(true)
            }),
            ("a taint", |n| {
                n.spec.as_mut().unwrap().taints = Some(vec![k8s_openapi::api::core::v1::Taint {
                    key: "k".into(),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                }])
            }),
            ("deleting", |n| {
                n.metadata.deletion_timestamp = n.metadata.creation_timestamp.clone()
            }),
            ("rebooted", |n| {
                n.status
                    .as_mut()
                    .unwrap()
                    .node_info
                    .as_mut()
                    .unwrap()
                    .boot_id = "b2".into()
            }),
        ];
        for (what, edit) in changes {
            let mut n = base.clone();
            edit(&mut n);
            assert!(w.wakes(&Event::Apply(n.clone())), "{what} wakes");
            assert!(!w.wakes(&Event::Apply(n)), "{what} again does not");
            assert!(w.wakes(&Event::Apply(base.clone())), "back from {what}");
        }
        // Another controller's annotation (kube-controller-manager's TTL controller) wakes nothing;
        // Karpenter's do-not-disrupt, which the fence reads, does.
        let mut ttl = base.clone();
        ttl.metadata.annotations =
            Some([("node.alpha.kubernetes.io/ttl".into(), "300".into())].into());
        assert!(!w.wakes(&Event::Apply(ttl.clone())), "the TTL annotation");
        let mut dnd = ttl;
        dnd.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(keys::KARPENTER_DO_NOT_DISRUPT.into(), "true".into());
        assert!(
            w.wakes(&Event::Apply(dnd)),
            "karpenter.sh/do-not-disrupt wakes"
        );
        assert!(w.wakes(&Event::Delete(base)), "a node gone");
    }

    /// Built for the policy, the wake ignores a condition no repair policy names (an agent's check
    /// flipping `NodekeeperDiskPressure` under a policy on `Ready` only), and still wakes for
    /// `Ready` and for a condition a group's policy names.
    #[test]
    fn a_condition_no_repair_policy_reads_wakes_nothing() {
        use crate::controller::policy::config::{RepairGroup, RepairPolicy};
        let named = |t: &str| RepairPolicy {
            condition_type: t.into(),
            condition_status: "True".into(),
            toleration: Duration::from_secs(600),
            ..Default::default()
        };
        let mut policy = PolicyConfig::default();
        policy.repair.policy = vec![named("Ready")];
        policy.repair.groups.insert(
            "gpu".into(),
            RepairGroup {
                policy: Some(vec![named("GpuXidErrors")]),
                ..Default::default()
            },
        );
        let with = |type_: &str, status: &str| {
            let mut n = node("n1", "True", "2026-12-01T00:02:00Z", "10");
            let conds = n.status.as_mut().unwrap().conditions.as_mut().unwrap();
            for (t, s) in [
                ("NodekeeperDiskPressure", "False"),
                ("GpuXidErrors", "False"),
            ] {
                conds.push(k8s_openapi::api::core::v1::NodeCondition {
                    type_: t.into(),
                    status: if t == type_ { status } else { s }.into(),
                    ..Default::default()
                });
            }
            n
        };
        let mut w = NodeWake::for_policy(&policy);
        let mut all = NodeWake::default();
        let base = with("", "");
        assert!(w.wakes(&Event::Apply(base.clone())) && all.wakes(&Event::Apply(base)));
        let check = with("NodekeeperDiskPressure", "True");
        assert!(!w.wakes(&Event::Apply(check.clone())), "no policy reads it");
        assert!(
            all.wakes(&Event::Apply(check)),
            "the unfiltered wake sees it"
        );
        assert!(
            w.wakes(&Event::Apply(with("GpuXidErrors", "True"))),
            "a group's policy reads it"
        );
        let mut down = with("GpuXidErrors", "True");
        down.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into();
        assert!(w.wakes(&Event::Apply(down)), "Ready");
    }

    /// A re-list wakes once, at its end; a node that went while the watch was down is forgotten,
    /// so its return wakes even unchanged.
    #[test]
    fn a_relist_wakes_at_its_end_and_forgets_the_nodes_it_did_not_list() {
        let mut w = NodeWake::default();
        let t = "2026-12-01T00:02:00Z";
        let (a, b) = (node("a", "True", t, "1"), node("b", "True", t, "2"));
        assert!(w.wakes(&Event::Apply(a.clone())));
        assert!(w.wakes(&Event::Apply(b.clone())));
        assert!(!w.wakes(&Event::Init));
        assert!(!w.wakes(&Event::InitApply(a.clone())));
        assert!(w.wakes(&Event::InitDone));
        assert!(!w.wakes(&Event::Apply(a)), "listed: known");
        assert!(w.wakes(&Event::Apply(b)), "not listed: forgotten");
    }
}

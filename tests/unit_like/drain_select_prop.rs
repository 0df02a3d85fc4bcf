//! Property tests of the pure drain selection: every pod is either skipped or in exactly one tier,
//! the active tier is the first non-empty one, and the classification agrees with the pod's attributes.
#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::Pod;
use nodekeeper_core::controller::act::drain::select::{self, Class, SelectOptions, SkipReason};
use nodekeeper_core::controller::act::drain::Tier;
use proptest::prelude::*;
use serde_json::json;

#[derive(Debug, Clone)]
struct Attrs {
    ds: bool,
    critical: bool,
    mirror: bool,
    phase: u8, // 0 Running, 1 Succeeded, 2 Failed, 3 Pending
    tolerates: bool,
    dnd: bool,
    terminating: bool,
}

fn attrs() -> impl Strategy<Value = Attrs> {
    (
        any::<bool>(),
        any::<bool>(),
        prop::bool::weighted(0.1),
        0u8..4,
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.15),
    )
        .prop_map(
            |(ds, critical, mirror, phase, tolerates, dnd, terminating)| Attrs {
                ds,
                critical,
                mirror,
                phase,
                tolerates,
                dnd,
                terminating,
            },
        )
}

fn build(i: usize, a: &Attrs) -> Pod {
    let mut meta = json!({"name": format!("p{i}"), "namespace": "default", "uid": format!("u{i}"), "annotations": {}});
    let kind = if a.mirror {
        "Node"
    } else if a.ds {
        "DaemonSet"
    } else {
        "ReplicaSet"
    };
    meta["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": kind, "name": "o", "uid": "x", "controller": true}]);
    if a.dnd {
        meta["annotations"]["karpenter.sh/do-not-disrupt"] = json!("true");
    }
    if a.terminating {
        meta["deletionTimestamp"] = json!("2026-01-01T00:09:50Z");
    }
    let mut spec = json!({"containers": [{"name": "c"}]});
    if a.critical {
        spec["priorityClassName"] = json!("system-cluster-critical");
    }
    if a.tolerates {
        spec["tolerations"] = json!([{"key": "nodekeeper.io/interruption", "operator": "Exists"}]);
    }
    let phase = ["Running", "Succeeded", "Failed", "Pending"][a.phase as usize];
    serde_json::from_value(json!({"metadata": meta, "spec": spec, "status": {"phase": phase}}))
        .unwrap()
}

proptest! {
    #[test]
    fn plan_invariants(list in prop::collection::vec(attrs(), 0..60), honour in any::<bool>()) {
        let pods: Vec<Pod> = list.iter().enumerate().map(|(i, a)| build(i, a)).collect();
        let mut o = SelectOptions::at("2026-01-01T00:10:00Z".parse().unwrap());
        o.honour_do_not_disrupt = honour;
        let plan = select::plan(&pods, &o);
        // Partition: every pod exactly once.
        prop_assert_eq!(plan.remaining() + plan.skipped.len(), pods.len());
        // The active tier is the first non-empty one; nothing is left in earlier tiers.
        match plan.tier {
            None => prop_assert_eq!(plan.remaining(), 0),
            Some(t) => {
                prop_assert!(!plan.tiers[t.index()].is_empty());
                for earlier in Tier::ALL.iter().filter(|e| **e < t) {
                    prop_assert!(plan.tiers[earlier.index()].is_empty());
                }
            }
        }
        for (pod, a) in pods.iter().zip(&list) {
            let c = select::classify(pod, &o);
            let want_skip = if a.mirror {
                Some(SkipReason::Mirror)
            } else if a.phase == 1 || a.phase == 2 {
                Some(SkipReason::Terminal)
            } else if a.tolerates {
                Some(SkipReason::ToleratesTaint)
            } else {
                None
            };
            match want_skip {
                Some(r) => prop_assert_eq!(c, Class::Skip(r)),
                None => {
                    let tier = match (a.critical, a.ds) {
                        (false, false) => Tier::NonCritical,
                        (false, true) => Tier::NonCriticalDaemonSet,
                        (true, false) => Tier::Critical,
                        (true, true) => Tier::CriticalDaemonSet,
                    };
                    let want = if a.terminating {
                        Class::Terminating(tier)
                    } else if a.dnd && honour {
                        Class::Held(tier)
                    } else {
                        Class::Evict(tier)
                    };
                    prop_assert_eq!(c, want);
                }
            }
        }
    }
}

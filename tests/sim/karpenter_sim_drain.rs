//! The sim's Karpenter loop terminates a node as Karpenter v1.14.1 does when its NodeClaim is deleted
//! (crates/sim/src/apiserver/loops/provisioner.rs): the Node deleted (held by Karpenter's finalizer),
//! tainted `karpenter.sh/disrupted:NoSchedule`, drained through the Eviction API (PDBs hold), then
//! removed with its claim.
//! - `deleting_a_nodeclaim_taints_and_drains_through_pdbs_before_the_node_goes`: the loop alone;
//! - `nodekeeper_drains_first_and_the_sim_karpenter_finds_nothing_to_evict`: the scenario of the real
//!   test `karpenter::nodekeeper_repairs_a_karpenter_node_with_one_drain_and_karpenter_terminates_it`
//!   (tests/e2e/karpenter.rs) on the sim. Not one `on_both!` scenario: the sim serves the NodeClaim and
//!   NodePool APIs but does not provision for pending pods (its replacement is the scenario pool's
//!   size), while the real test builds its nodes by making Karpenter provision for a Deployment; the
//!   assertions are the same.
#![allow(clippy::unwrap_used)]

use crate::support::engine as engine_support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::DynamicObject;
use nodekeeper_core::controller::act::provider::karpenter::nodeclaim_resource;
use nodekeeper_core::controller::act::provider::ProviderConfig;
use nodekeeper_core::controller::policy::view::keys;
use nodekeeper_sim::apiserver::loops::provisioner::DISRUPTED_TAINT;
use nodekeeper_sim::apiserver::scenario::{PdbSpec, Scenario};
use nodekeeper_sim::apiserver::TestCluster;
use serde_json::json;

use engine_support::*;

const LB: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// Two spot nodes, `web` (2 replicas, pinned to spot, `pdb`) and the tolerate-all node-exporter.
fn scenario(pdb: PdbSpec) -> Scenario {
    let mut s = Scenario::default_mixed();
    s.pools.retain(|p| p.name == "spot");
    s.workloads[0].replicas = 2;
    s.workloads[0].termination_grace_seconds = 1;
    s.workloads[0].node_selector =
        BTreeMap::from([("karpenter.sh/nodepool".into(), "spot".into())]);
    s.workloads[0].pdb = Some(pdb);
    s
}

/// `(reason, note, reportingController)` of the Events about pods of `app` (namespace default).
async fn pod_events(c: &TestCluster, prefix: &str) -> Vec<(String, String, String)> {
    let api: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(c.client.clone(), "default");
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("Pod")
                    && r.name.as_deref().is_some_and(|n| n.starts_with(prefix))
            })
        })
        .map(|e| {
            (
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default(),
                e.reporting_controller.unwrap_or_default(),
            )
        })
        .collect()
}

/// The web pods on `node`, not terminating.
async fn web_on(c: &TestCluster, node: &str) -> Vec<String> {
    pods_on(c, node)
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .filter(|n| n.starts_with("web-"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_nodeclaim_taints_and_drains_through_pdbs_before_the_node_goes() {
    let c = cluster(
        20.0,
        scenario(PdbSpec {
            min_available: None,
            max_unavailable: Some(toml::Value::Integer(0)),
        }),
        loops(),
    )
    .await;
    let victim = wait_until(
        Duration::from_secs(30),
        "a web pod Running on a spot node",
        || async {
            for n in ["spot-0", "spot-1"] {
                if running_on(&c, n).await >= 2 && !web_on(&c, n).await.is_empty() {
                    return Some(n.to_string());
                }
            }
            None
        },
    )
    .await;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(c.client.clone(), "default");
    wait_until(Duration::from_secs(15), "the PDB counted", || async {
        pdbs.get("web-pdb")
            .await
            .unwrap()
            .status
            .is_some_and(|s| s.current_healthy == 2)
    })
    .await;
    let web = web_on(&c, &victim).await;
    let claims: Api<DynamicObject> = Api::all_with(c.client.clone(), &nodeclaim_resource());
    claims.delete(&victim, &Default::default()).await.unwrap();

    // Karpenter's termination starts: the Node deleting (its finalizer keeps it), tainted, out of LBs.
    let n = wait_until(Duration::from_secs(10), "the node terminating", || async {
        let n = node(&c, &victim).await;
        (n.metadata.deletion_timestamp.is_some() && taint(&n, DISRUPTED_TAINT).is_some())
            .then_some(n)
    })
    .await;
    assert_eq!(taint(&n, DISRUPTED_TAINT).unwrap().effect, "NoSchedule");
    assert_eq!(label(&n, LB), Some("karpenter"));
    assert!(n
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == "karpenter.sh/termination")));
    // maxUnavailable 0: every eviction refused (a FailedDraining Warning on the Node), the pods stay
    // and so does the node, past the instance's termination delay (30 s simulated = 1.5 s here).
    wait_until(
        Duration::from_secs(10),
        "FailedDraining on the node",
        || async {
            let api: Api<k8s_openapi::api::events::v1::Event> =
                Api::namespaced(c.client.clone(), "default");
            api.list(&ListParams::default())
                .await
                .unwrap()
                .items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("FailedDraining")
                        && e.type_.as_deref() == Some("Warning")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                            == Some(victim.as_str())
                        && e.note
                            .as_deref()
                            .is_some_and(|m| m.contains("violates a PDB"))
                })
        },
    )
    .await;
    let deleted = c.sim.store.clock.now();
    wait_until(Duration::from_secs(20), "40 simulated seconds", || async {
        c.sim.store.clock.now() - deleted > chrono::Duration::seconds(40)
    })
    .await;
    assert!(
        node_opt(&c, &victim).await.is_some(),
        "a PDB-blocked drain keeps the node"
    );
    assert_eq!(web_on(&c, &victim).await, web, "no web pod evicted");

    // The PDB allows one: Karpenter evicts the web pod (an Evicted Event of its own), leaves the
    // tolerate-all DaemonSet pod, and the node and its claim go.
    pdbs.patch(
        "web-pdb",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"maxUnavailable": 1}})),
    )
    .await
    .unwrap();
    wait_until(Duration::from_secs(30), "node and claim gone", || async {
        node_opt(&c, &victim).await.is_none() && claims.get_opt(&victim).await.unwrap().is_none()
    })
    .await;
    let evs = pod_events(&c, "web-").await;
    for p in &web {
        assert!(
            evs.iter().any(|(r, m, who)| r == "Evicted"
                && m == "Evicted pod: Forceful Termination"
                && who == "karpenter"),
            "{p}: {evs:?}"
        );
    }
    let ds_events: Vec<_> =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(c.client.clone(), "kube-system")
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("Evicted"))
            .collect();
    assert!(
        ds_events.is_empty(),
        "the DaemonSet pod tolerates the taint: {ds_events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodekeeper_drains_first_and_the_sim_karpenter_finds_nothing_to_evict() {
    let c = cluster(
        20.0,
        scenario(PdbSpec {
            min_available: Some(toml::Value::Integer(1)),
            max_unavailable: None,
        }),
        loops(),
    )
    .await;
    let victim = wait_until(
        Duration::from_secs(30),
        "a web pod Running on a spot node",
        || async {
            for n in ["spot-0", "spot-1"] {
                if running_on(&c, n).await >= 2 && !web_on(&c, n).await.is_empty() {
                    return Some(n.to_string());
                }
            }
            None
        },
    )
    .await;
    let mut cfg = controller_config("sim-karp-coop");
    cfg.provider = ProviderConfig::Karpenter;
    let p = policy(
        r#"
[repair]
max_unhealthy = "50%"
[[repair.policy]]
condition_type = "Ready"
condition_status = "False"
toleration = "60s"
"#,
    );
    let ctl = controller(&c, &cfg, p, None).await;
    age_nodes(&c, 90).await;
    wait_until(Duration::from_secs(15), "the victim seen ready", || async {
        annotation(&node(&c, &victim).await, keys::SEEN_READY).is_some()
    })
    .await;
    pin_condition(&c, &victim, "Ready", "False").await;

    // Until the claim deletes, every observation of it deleting finds the web pods gone from the node;
    // while the node is there after that, it is Karpenter's (tainted) and nodekeeper's retire did it.
    let claims: Api<DynamicObject> = Api::all_with(c.client.clone(), &nodeclaim_resource());
    let mut seen_tainted = false;
    let end = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let claim = claims.get_opt(&victim).await.unwrap();
        if claim.is_none_or(|c| c.metadata.deletion_timestamp.is_some()) {
            let left = web_on(&c, &victim).await;
            assert!(
                left.is_empty(),
                "the NodeClaim was deleted while {left:?} ran on {victim}"
            );
            match node_opt(&c, &victim).await {
                Some(n) => {
                    assert!(
                        annotation(&n, keys::RETIRE_REQUESTED).is_some(),
                        "by the retire"
                    );
                    seen_tainted |= taint(&n, DISRUPTED_TAINT).is_some();
                }
                None => break,
            }
        }
        assert!(tokio::time::Instant::now() < end, "the node never went");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        seen_tainted,
        "the sim's Karpenter tainted the node before removing it"
    );
    assert!(
        claims.get_opt(&victim).await.unwrap().is_none(),
        "the claim released"
    );
    // One eviction stream: nodekeeper's. The sim's Karpenter evicted none of the web pods.
    let by_karpenter: Vec<_> = pod_events(&c, "web-")
        .await
        .into_iter()
        .filter(|(r, _, who)| r == "Evicted" && who == "karpenter")
        .collect();
    assert!(by_karpenter.is_empty(), "{by_karpenter:?}");
    // The drain had emptied the node: no replacement NodeClaim was added for it.
    let twins = claims
        .list(&ListParams::default().labels(&format!("nodekeeper.io/replaces={victim}")))
        .await
        .unwrap()
        .items;
    assert!(twins.is_empty(), "{twins:?}");
    // Both web pods run again (the pool's replacement node; the evicted pod rescheduled).
    wait_until(Duration::from_secs(30), "both web pods Running", || async {
        Api::<Pod>::namespaced(c.client.clone(), "default")
            .list(&ListParams::default().labels("app=web"))
            .await
            .unwrap()
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .count()
            == 2
    })
    .await;
    ctl.stop().await;
}

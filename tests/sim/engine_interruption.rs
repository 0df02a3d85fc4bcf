//! The disruption engine against the simulated cluster: a preemption notice for a node with
//! ~110 pods (PDB-protected ones and DaemonSets among them) → taint + cordon + LB label in one
//! write, the drain in tiers before the deadline, one replacement through the karpenter
//! provider (the sim's provisioner launches a new Ready node).
//!
//! Sim only: drives a 110-pod node at a scaled clock through the sim's Karpenter-like loop (no
//! Karpenter on the real cluster yet); the tiered preemption drain runs on both in `tests/e2e`
//! (`preemption`).
#![allow(clippy::unwrap_used)]

use crate::support::engine as engine_support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::core::DynamicObject;
use nodekeeper_core::agent::sources::EventKind;
use nodekeeper_core::controller::act::actions::REPLACEMENT_ACCEPTED;
use nodekeeper_core::controller::act::drain::Tier;
use nodekeeper_core::controller::act::provider::karpenter::{
    nodeclaim_resource, twin_name, REQUEST_ANNOTATION,
};
use nodekeeper_core::controller::act::provider::ProviderConfig;
use nodekeeper_core::controller::metrics::ActionResult;
use nodekeeper_core::controller::policy::view::keys;
use nodekeeper_core::controller::policy::PolicyConfig;
use nodekeeper_sim::apiserver::scenario::{DaemonSetSpec, PdbSpec, Pool, Scenario, Workload};

use engine_support::*;
use nodekeeper_sim::apiserver as kube_sim;

const NODE: &str = "spot-0";
const LB: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
const TAINT: &str = "nodekeeper.io/interruption";

fn pool(name: &str, count: usize) -> Pool {
    let mut p = Scenario::default_mixed().pools[0].clone();
    p.name = name.into();
    p.count = count;
    p.cpu = "64".into();
    p.pods = 130;
    p
}

fn workload(name: &str, replicas: u32, on_spot: bool, pdb: Option<PdbSpec>) -> Workload {
    let mut w = Scenario::default_mixed().workloads[0].clone();
    w.name = name.into();
    w.replicas = replicas;
    w.cpu_request = "10m".into();
    w.termination_grace_seconds = 2;
    w.pdb = pdb;
    w.kind = "ReplicaSet".into();
    if on_spot {
        w.node_selector = BTreeMap::from([("karpenter.sh/nodepool".into(), "spot".into())]);
    }
    w
}

/// spot-0 ends up with 110 pods: 102 batch pods pinned to the spot pool, 6 `guarded` pods
/// (added by [`guarded_pods`], PDB maxUnavailable 1), node-exporter (tolerates everything) and
/// log-shipper (a DaemonSet pod that must go in its tier). `web` (PDB) runs on the general pool.
fn scenario() -> Scenario {
    Scenario {
        pools: vec![pool("spot", 1), pool("general", 2)],
        workloads: vec![
            workload("batch", 102, true, None),
            workload(
                "web",
                9,
                false,
                Some(PdbSpec {
                    min_available: None,
                    max_unavailable: Some(toml::Value::Integer(1)),
                }),
            ),
        ],
        daemonsets: vec![
            DaemonSetSpec {
                name: "node-exporter".into(),
                namespace: "kube-system".into(),
                tolerate_all: true,
                node_selector: BTreeMap::new(),
            },
            DaemonSetSpec {
                name: "log-shipper".into(),
                namespace: "kube-system".into(),
                tolerate_all: false,
                node_selector: BTreeMap::new(),
            },
        ],
        filler_pods_per_node: 0,
    }
}

/// ReplicaSet `guarded` of `n` pods on spot-0, covered by PDB `guarded-pdb` (maxUnavailable 2):
/// their evictions are admitted two at a time, each once the ReplicaSet's replacement (scheduled on
/// the general pool) is Ready — the disruption controller counts the ReplicaSet's scale, as the real
/// one does (bare pods under `maxUnavailable` would allow no eviction at all). The template pins the
/// pods to the spot pool until they run there, then no longer, so replacements go elsewhere.
async fn guarded_pods(c: &kube_sim::TestCluster, n: usize) {
    use k8s_openapi::api::apps::v1::ReplicaSet;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use kube::api::{Patch, PatchParams, PostParams};
    let pdb: PodDisruptionBudget = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "guarded-pdb", "namespace": "default"},
        "spec": {"maxUnavailable": 2, "selector": {"matchLabels": {"app": "guarded"}}}}))
    .unwrap();
    Api::namespaced(c.client.clone(), "default")
        .create(&PostParams::default(), &pdb)
        .await
        .unwrap();
    let rss: Api<ReplicaSet> = Api::namespaced(c.client.clone(), "default");
    let rs: ReplicaSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "guarded"},
        "spec": {"replicas": n, "selector": {"matchLabels": {"app": "guarded"}},
            "template": {"metadata": {"labels": {"app": "guarded"}},
                "spec": {"terminationGracePeriodSeconds": 2,
                    "nodeSelector": {"karpenter.sh/nodepool": "spot"},
                    "containers": [{"name": "c", "image": "registry.example/guarded:1"}]}}}}))
    .unwrap();
    rss.create(&PostParams::default(), &rs).await.unwrap();
    wait_until(Duration::from_secs(30), "guarded pods running", || async {
        running_on(c, NODE).await >= 110
    })
    .await;
    rss.patch(
        "guarded",
        &PatchParams::default(),
        &Patch::Json::<()>(
            serde_json::from_value(serde_json::json!([
                {"op": "remove", "path": "/spec/template/spec/nodeSelector"}
            ]))
            .unwrap(),
        ),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preemption_taints_cordons_drains_in_tiers_and_replaces_once() {
    let mut l = loops();
    // The instance goes away after its notice time, not at the NodeClaim deletion.
    l.terminate_delay = Duration::from_secs(330);
    l.launch_delay = Duration::from_secs(20);
    let c = cluster(20.0, scenario(), l).await;
    wait_until(
        Duration::from_secs(30),
        "~110 pods running on spot-0",
        || async { running_on(&c, NODE).await >= 104 },
    )
    .await;
    guarded_pods(&c, 6).await;
    let before = pods_on(&c, NODE).await.len();
    let web_before = pods_on(&c, NODE)
        .await
        .iter()
        .filter(|p| {
            p.metadata
                .name
                .as_deref()
                .unwrap_or("")
                .starts_with("guarded-")
        })
        .count();
    assert!(web_before >= 1, "no PDB-protected pod on {NODE}");

    let mut cfg = controller_config("engine-a");
    cfg.provider = ProviderConfig::Karpenter;
    let ctl = controller(&c, &cfg, PolicyConfig::default(), None).await;
    let engine = ctl.engine.clone().unwrap();

    let now = c.sim.store.clock.now();
    let at = now + chrono::Duration::seconds(300);
    let ev = notice("spot-itn-1", EventKind::Preemption, Some(at), now);
    let t0 = std::time::Instant::now();
    assert!(ctl.app.states.ingest_event(NODE, ev).await);

    // Taint, cordon and LB label arrive together (one patch), quickly.
    let nodes: Api<Node> = Api::all(c.client.clone());
    let first = loop {
        let n = nodes.get(NODE).await.unwrap();
        if taint(&n, TAINT).is_some() || unschedulable(&n) || label(&n, LB).is_some() {
            break n;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "no reaction to the notice"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let reaction = t0.elapsed();
    let t = taint(&first, TAINT).expect("taint with the cordon");
    assert_eq!(t.value.as_deref(), Some("preemption"));
    assert_eq!(t.effect, "NoSchedule");
    assert!(unschedulable(&first), "cordoned in the same write");
    assert_eq!(label(&first, LB), Some("nodekeeper"));
    assert_eq!(annotation(&first, keys::STATE), Some("interrupted"));
    assert_eq!(annotation(&first, keys::CORDONED_BY), Some("nodekeeper"));
    assert!(reaction < Duration::from_secs(2), "{reaction:?}");
    eprintln!("notice → taint+cordon+label: {reaction:?}");

    // The drain finishes before its deadline (announced time − 15 s safety margin).
    let deadline = at - chrono::Duration::seconds(15);
    wait_until(Duration::from_secs(30), "drain completed", || async {
        engine.drains().view(NODE).phase
            == nodekeeper_core::controller::policy::view::DrainPhase::Completed
    })
    .await;
    let done_at = c.sim.store.clock.now();
    assert!(
        done_at < deadline,
        "drain done at {done_at}, deadline {deadline}"
    );
    let report = engine.drains().report(NODE).unwrap();
    let tiers: Vec<Tier> = report.removed.iter().map(|r| r.tier).collect();
    assert!(
        tiers.windows(2).all(|w| w[0] <= w[1]),
        "tiers out of order: {tiers:?}"
    );
    let removed: Vec<&str> = report.removed.iter().map(|r| r.pod.as_str()).collect();
    assert!(
        removed.len() >= before - 2,
        "{} removed of {before}",
        removed.len()
    );
    let shipper = removed
        .iter()
        .position(|p| p.starts_with("kube-system/log-shipper-"))
        .expect("the DaemonSet pod was evicted");
    assert_eq!(tiers[shipper], Tier::NonCriticalDaemonSet);
    assert_eq!(
        removed
            .iter()
            .filter(|p| p.starts_with("default/guarded-"))
            .count(),
        web_before,
        "every PDB-protected pod left through the Eviction API"
    );
    assert!(
        report
            .skipped
            .iter()
            .any(|s| s.pod.starts_with("kube-system/node-exporter-")),
        "{:?}",
        report.skipped
    );

    // Exactly one replacement: a NodeClaim of the pool added at the notice, and the old NodeClaim,
    // with our request id on it, deleted once the drain was over (retired).
    let claims: Api<DynamicObject> = Api::all_with(c.client.clone(), &nodeclaim_resource());
    let n = node(&c, NODE).await;
    let accepted = annotation(&n, REPLACEMENT_ACCEPTED).unwrap().to_string();
    let twin = twin_name(NODE, &accepted);
    assert!(
        claims.get_opt(&twin).await.unwrap().is_some(),
        "{twin} created"
    );
    let claim = crate::support::wait::until(
        Duration::from_secs(20),
        "the old NodeClaim deleting",
        || {
            let claims = claims.clone();
            async move {
                claims
                    .get(NODE)
                    .await
                    .ok()
                    .filter(|c| c.metadata.deletion_timestamp.is_some())
            }
        },
    )
    .await;
    assert!(annotation(&node(&c, NODE).await, keys::RETIRE_REQUESTED).is_some());
    assert_eq!(
        claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(REQUEST_ANNOTATION))
            .map(String::as_str),
        Some(accepted.as_str())
    );
    // The instance goes away at its time; the provisioner launches a replacement that turns Ready.
    c.sim.store.clock.advance(Duration::from_secs(330));
    wait_until(
        Duration::from_secs(20),
        "a Ready replacement node",
        || async {
            let list = nodes.list(&ListParams::default()).await.unwrap().items;
            list.iter().any(|n| {
                n.metadata
                    .name
                    .as_deref()
                    .unwrap_or("")
                    .starts_with("spot-0-nk")
                    && condition(n, "Ready").is_some_and(|c| c.status == "True")
            })
        },
    )
    .await;
    wait_until(
        Duration::from_secs(20),
        "the preempted node gone",
        || async { node_opt(&c, NODE).await.is_none() },
    )
    .await;
    // Reconciles after the node went: none may ask for another replacement.
    three_more_reconciles(&ctl).await;
    let spot: Vec<String> = nodes
        .list(&ListParams::default().labels("karpenter.sh/nodepool=spot"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    assert_eq!(spot.len(), 1, "one replacement only: {spot:?}");
    let m = &engine.metrics;
    assert_eq!(m.replacements.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(m.action_count("request_replacement", ActionResult::Ok), 1);
    assert!(m.action_count("cordon", ActionResult::Ok) >= 1);
    // guarded-pdb refused some of the concurrent evictions on the way.
    assert!(
        m.evictions_blocked_by_pdb
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );
    let evs = events_about(&c, NODE).await;
    assert_eq!(
        evs.iter()
            .filter(|(r, _)| r == "ReplacementRequested")
            .count(),
        1,
        "{evs:?}"
    );
    assert!(
        evs.iter().any(|(r, _)| r == "InterruptionNotice"),
        "{evs:?}"
    );
    // The metrics endpoint shows the engine's series.
    let text = nodekeeper_core::http::client()
        .unwrap()
        .get(format!("http://{}/metrics", ctl.addr))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("nodekeeper_engine_drain_duration_seconds_count{result=\"completed\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("nodekeeper_engine_budget_used{group=\"spot\"}"),
        "{text}"
    );
    assert!(!text.contains(NODE), "node names in metrics: {text}");
    ctl.stop().await;
}

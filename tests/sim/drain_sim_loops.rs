//! The drain against the full simulated cluster (time scale 20): kubelets finish graceful termination,
//! the scheduler and ReplicaSet controller replace evicted pods elsewhere, the PDB admits one disruption
//! at a time, the DaemonSet controller recreates DaemonSet pods on the cordoned node.
//!
//! Sim only: at time scale 20; the same drain runs on both at real time in `tests/e2e` (`drain`,
//! `preemption`).
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use nodekeeper_core::controller::act::drain::{
    self, select::SkipReason, BlockReason, DrainOptions, Tier,
};
use nodekeeper_sim::apiserver::scenario::{DaemonSetSpec, PdbSpec, Scenario};
use nodekeeper_sim::apiserver::{SimOptions, TestCluster};
use tokio_util::sync::CancellationToken;

fn running_on(pods: &[Pod], node: &str, app: &str) -> usize {
    pods.iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app"))
                .map(String::as_str)
                == Some(app)
        })
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drains_a_node_of_the_simulated_cluster() {
    let mut sc = Scenario::default_mixed();
    sc.workloads[0].replicas = 12;
    sc.workloads[0].pdb = Some(PdbSpec {
        min_available: None,
        max_unavailable: Some(toml::Value::Integer(1)),
    });
    sc.daemonsets.push(DaemonSetSpec {
        name: "log-shipper".into(),
        namespace: "kube-system".into(),
        tolerate_all: false,
        node_selector: BTreeMap::new(),
    });
    let opts = SimOptions {
        time_scale: 20.0,
        scenario: sc,
        ..Default::default()
    };
    let c = TestCluster::start(opts).await.unwrap();
    let pods: Api<Pod> = Api::all(c.client.clone());

    // Wait for the 12 web pods and the DaemonSets to run; pick the node with the most web pods.
    let end = tokio::time::Instant::now() + Duration::from_secs(20);
    let node = loop {
        let all = pods.list(&ListParams::default()).await.unwrap().items;
        let nodes = ["general-0", "general-1", "general-2", "spot-0", "spot-1"];
        let web: usize = nodes.iter().map(|n| running_on(&all, n, "web")).sum();
        let shippers: usize = nodes
            .iter()
            .map(|n| running_on(&all, n, "log-shipper"))
            .sum();
        if web == 12 && shippers == 5 {
            break nodes
                .iter()
                .max_by_key(|n| running_on(&all, n, "web"))
                .unwrap()
                .to_string();
        }
        assert!(
            tokio::time::Instant::now() < end,
            "cluster not settled: {web} web, {shippers} shippers"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let before = running_on(
        &pods.list(&ListParams::default()).await.unwrap().items,
        &node,
        "web",
    );
    assert!(before >= 3, "{node} has {before} web pods");

    let mut o = DrainOptions::new(&node).with_timeout(Duration::from_secs(60));
    o.poll_interval = Duration::from_millis(50);
    let mut blockers = Vec::new();
    let mut tiers = Vec::new();
    let cfg = {
        let mut cfg = kube::Config::new(c.url.parse().unwrap());
        cfg.default_namespace = "default".into();
        cfg
    };
    let report = drain::drain(
        drain::client(cfg).unwrap(),
        &o,
        CancellationToken::new(),
        |p| {
            if let Some(b) = &p.blocker {
                blockers.push(b.clone());
            }
            tiers.extend(p.tier);
        },
    )
    .await
    .unwrap();

    // Web pods first (one at a time through the PDB), then the non-tolerating DaemonSet pod.
    let order: Vec<(String, Tier)> = report
        .removed
        .iter()
        .map(|r| (r.pod.clone(), r.tier))
        .collect();
    assert_eq!(order.len(), before + 1, "{order:?}");
    assert!(
        order[..before]
            .iter()
            .all(|(p, t)| p.starts_with("default/web-") && *t == Tier::NonCritical),
        "{order:?}"
    );
    assert!(
        order[before].0.starts_with("kube-system/log-shipper-")
            && order[before].1 == Tier::NonCriticalDaemonSet,
        "{order:?}"
    );
    assert!(tiers.windows(2).all(|w| w[0] <= w[1]), "{tiers:?}");
    // The PDB (maxUnavailable 1) refused evictions on the way and was named; the terminations were waited for.
    assert!(
        blockers
            .iter()
            .any(|b| b.reason == BlockReason::PodDisruptionBudget
                && b.pdb.as_deref() == Some("default/web-pdb")),
        "{blockers:?}"
    );
    assert!(
        blockers
            .iter()
            .any(|b| b.reason == BlockReason::Terminating),
        "{blockers:?}"
    );
    // node-exporter tolerates everything: left alone. The recreated log-shipper pod is skipped, not chased.
    let all = pods.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(running_on(&all, &node, "web"), 0);
    assert!(
        report
            .skipped
            .iter()
            .any(|s| s.pod.starts_with("kube-system/node-exporter-")
                && s.reason == SkipReason::ToleratesTaint),
        "{:?}",
        report.skipped
    );
    // All 12 web replicas run again elsewhere.
    let end = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let all = pods.list(&ListParams::default()).await.unwrap().items;
        let web: usize = ["general-0", "general-1", "general-2", "spot-0", "spot-1"]
            .iter()
            .map(|n| running_on(&all, n, "web"))
            .sum();
        if web == 12 {
            break;
        }
        assert!(tokio::time::Instant::now() < end, "{web} web pods running");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

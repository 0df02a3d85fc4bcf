//! The drain engine against the sim over HTTP (real kube-rs): a 110-pod node drained in tiers,
//! PDB-protected pods evicted as the budget allows, skipped pods left alone, other nodes untouched,
//! dry-run changing nothing.
//!
//! Sim only: a bare API server without loops, to see every eviction; the 110-pod drain runs on both
//! in `tests/e2e` (`drain`).
#![allow(clippy::unwrap_used)]

use crate::support::drain as drain_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use drain_support::*;
use nodekeeper_core::controller::act::drain::{
    self, BlockReason, DrainOptions, DrainProgress, Tier,
};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drains_110_pods_in_tier_order() {
    let c = cluster().await;
    big_node(&c, "n1");
    big_node(&c, "n2");
    // 20 web pods in all; the PDB allows one disruption at a time, the stand-in ReplicaSet replaces them on n3.
    pdb(
        &c,
        "web-pdb",
        "web",
        serde_json::json!({"minAvailable": 19}),
    );
    assert_eq!(pods_on(&c, "n1").len(), 110);
    let n2_before = pods_on(&c, "n2");
    node(&c, "n3");
    let rs = replicaset(&c, "web", 20, "n3");

    let seen: Arc<Mutex<Vec<DrainProgress>>> = Arc::default();
    let s = seen.clone();
    let opts = DrainOptions::new("n1").with_timeout(Duration::from_secs(60));
    let report = drain::drain(client(&c), &opts, CancellationToken::new(), move |p| {
        s.lock().unwrap().push(p.clone())
    })
    .await
    .unwrap();
    rs.abort();

    // Every drainable pod removed exactly once, tiers never going backwards.
    assert_eq!(report.removed.len(), 103, "{:?}", report.removed);
    let tiers: Vec<Tier> = report.removed.iter().map(|r| r.tier).collect();
    assert!(
        tiers.windows(2).all(|w| w[0] <= w[1]),
        "tiers out of order: {tiers:?}"
    );
    let count = |t: Tier| tiers.iter().filter(|x| **x == t).count();
    assert_eq!(
        [
            count(Tier::NonCritical),
            count(Tier::NonCriticalDaemonSet),
            count(Tier::Critical),
            count(Tier::CriticalDaemonSet)
        ],
        [90, 6, 4, 3]
    );
    assert!(report.removed.iter().all(|r| !r.forced));
    assert!(report.cordoned_by_us);
    assert!(unschedulable(&c, "n1"));

    // Left: the 7 skipped pods, with their reasons.
    let mut left = pods_on(&c, "n1");
    left.sort();
    assert_eq!(left.len(), 7, "{left:?}");
    assert!(
        left.iter()
            .all(|p| p.contains("exporter-") || p.contains("static-") || p.contains("job-")),
        "{left:?}"
    );
    assert_eq!(report.skipped.len(), 7);
    // Other node untouched.
    assert_eq!(pods_on(&c, "n2"), n2_before);
    assert!(!unschedulable(&c, "n2"));

    // Progress: tiers in order, PDB blocker named on the way, done at the end.
    let seen = seen.lock().unwrap();
    let ptiers: Vec<Tier> = seen.iter().filter_map(|p| p.tier).collect();
    assert!(ptiers.windows(2).all(|w| w[0] <= w[1]), "{ptiers:?}");
    assert_eq!(ptiers.first(), Some(&Tier::NonCritical));
    assert_eq!(ptiers.last(), Some(&Tier::CriticalDaemonSet));
    let pdb_block = seen
        .iter()
        .filter_map(|p| p.blocker.as_ref())
        .find(|b| b.reason == BlockReason::PodDisruptionBudget)
        .unwrap_or_else(|| {
            panic!(
                "the web PDB (minAvailable 19 of 20) must refuse some evictions: {:?}",
                seen.iter()
                    .filter_map(|p| p.blocker.clone())
                    .collect::<Vec<_>>()
            )
        });
    assert_eq!(pdb_block.pdb.as_deref(), Some("default/web-pdb"));
    assert!(
        pdb_block.pod.starts_with("default/web-n1-"),
        "{pdb_block:?}"
    );
    assert_eq!(seen.last().unwrap().phase, drain::Phase::Done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_lists_and_changes_nothing() {
    let c = cluster().await;
    big_node(&c, "n1");
    pod("held", "held")
        .annotate("karpenter.sh/do-not-disrupt", "true")
        .on(&c, "n1");
    let rv = c.sim.store.resource_version();
    let mut opts = DrainOptions::new("n1");
    opts.dry_run = true;
    let mut calls = 0;
    let report = drain::drain(client(&c), &opts, CancellationToken::new(), |_| calls += 1)
        .await
        .unwrap();
    assert_eq!(
        c.sim.store.resource_version(),
        rv,
        "a dry run must not write"
    );
    assert!(!unschedulable(&c, "n1"));
    assert_eq!(pods_on(&c, "n1").len(), 111);
    assert!(report.removed.is_empty() && report.dry_run && !report.cordoned_by_us);
    assert_eq!(report.planned.len(), 104);
    let tiers: Vec<Tier> = report.planned.iter().map(|p| p.tier).collect();
    assert!(tiers.windows(2).all(|w| w[0] <= w[1]));
    let held: Vec<_> = report.planned.iter().filter(|p| p.held).collect();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].pod, "default/held");
    assert_eq!(report.skipped.len(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_node_is_an_error() {
    let c = cluster().await;
    let err = drain::drain(
        client(&c),
        &DrainOptions::new("nope"),
        CancellationToken::new(),
        |_| {},
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, drain::DrainError::NodeNotFound { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("nope"));
}

/// The DaemonSet controller ignores cordons: a DaemonSet pod recreated during the drain is skipped,
/// so the drain ends instead of evicting its replacements forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recreated_daemonset_pods_do_not_loop() {
    let c = cluster().await;
    node(&c, "n1");
    pod("logs-0", "logs").ds("logs").on(&c, "n1");
    // A critical pod held by a PDB for 400 ms keeps the drain going after the DaemonSet tier.
    let mut crit = pod("crit-0", "crit").critical();
    crit.ns = "default".into();
    crit.on(&c, "n1");
    pdb(
        &c,
        "crit-pdb",
        "crit",
        serde_json::json!({"minAvailable": 1}),
    );
    let sim2 = c.sim.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        sim2.store
            .txn(|t| {
                t.delete(
                    nodekeeper_sim::apiserver::resources::well_known::pdbs(),
                    "default",
                    "crit-pdb",
                    &Default::default(),
                )
            })
            .unwrap();
    });
    let sim = c.sim.clone();
    // A DaemonSet controller stand-in: recreates logs pods on n1 as they go.
    let h = tokio::spawn(async move {
        let mut n = 0;
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let have = sim
                .store
                .txn(|t| {
                    t.list(
                        nodekeeper_sim::apiserver::resources::well_known::pods(),
                        Some("kube-system"),
                    )
                })
                .len();
            if have == 0 {
                n += 1;
                let tc = &sim;
                let obj = serde_json::json!({"metadata": {"name": format!("logs-new-{n}"), "labels": {"app": "logs"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "logs", "uid": "uid-logs", "controller": true}]},
                    "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "x"}]},
                    "status": nodekeeper_sim::apiserver::scenario::running_status(&tc.store.clock.stamp())});
                let _ = tc.store.txn(|t| {
                    t.create(
                        nodekeeper_sim::apiserver::resources::well_known::pods(),
                        "kube-system",
                        obj,
                    )
                });
            }
        }
    });
    let opts = DrainOptions::new("n1").with_timeout(Duration::from_secs(5));
    let report = drain::drain(client(&c), &opts, CancellationToken::new(), |_| {})
        .await
        .unwrap();
    h.abort();
    let removed: Vec<&str> = report.removed.iter().map(|r| r.pod.as_str()).collect();
    assert_eq!(removed, ["kube-system/logs-0", "default/crit-0"]);
    assert!(
        report
            .skipped
            .iter()
            .any(|s| s.reason == drain::select::SkipReason::RecreatedDaemonSet),
        "{:?}",
        report.skipped
    );
}

//! What holds a drain, against the sim over HTTP: a PDB (blocker named, timeout, then success once the
//! PDB allows), several PDBs (500), do-not-disrupt annotations (and the interruption override),
//! force-delete at the deadline with grace clamped to the time left, VolumeAttachments, a
//! terminating namespace (403 waited for), cancellation.
//!
//! Sim only: uses the sim's fault hooks and a terminating namespace held open; the PDB-blocked
//! drain runs on both in `tests/e2e` (`drain`).
#![allow(clippy::unwrap_used)]

use crate::support::drain as drain_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use drain_support::*;
use nodekeeper_core::controller::act::drain::{
    self, BlockReason, DrainError, DrainOptions, DrainProgress, OnTimeout,
};
use nodekeeper_sim::apiserver::resources::well_known;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

fn opts(node: &str, timeout_ms: u64) -> DrainOptions {
    let mut o = DrainOptions::new(node).with_timeout(Duration::from_millis(timeout_ms));
    o.poll_interval = Duration::from_millis(50);
    o.force_settle = Duration::from_millis(300);
    o
}

async fn run(
    c: &drain_support::Cluster,
    o: &DrainOptions,
) -> (Result<drain::DrainReport, DrainError>, Vec<DrainProgress>) {
    let seen: Arc<Mutex<Vec<DrainProgress>>> = Arc::default();
    let s = seen.clone();
    let r = drain::drain(client(c), o, CancellationToken::new(), move |p| {
        s.lock().unwrap().push(p.clone())
    })
    .await;
    let v = seen.lock().unwrap().clone();
    (r, v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pdb_blocks_then_allows() {
    let c = cluster().await;
    node(&c, "n1");
    for i in 0..3 {
        pod(&format!("db-{i}"), "db").on(&c, "n1");
    }
    pod("web-0", "web").on(&c, "n1");
    pdb(&c, "db-pdb", "db", json!({"minAvailable": 3}));

    let (r, seen) = run(&c, &opts("n1", 1500)).await;
    let err = r.unwrap_err();
    let DrainError::TimedOut {
        blocker,
        remaining,
        report,
        ..
    } = &err
    else {
        panic!("{err}")
    };
    let b = blocker.as_deref().unwrap();
    assert_eq!(b.reason, BlockReason::PodDisruptionBudget);
    assert_eq!(b.pdb.as_deref(), Some("default/db-pdb"));
    assert!(b.pod.starts_with("default/db-"), "{b:?}");
    assert_eq!(*remaining, 3);
    let msg = err.to_string();
    assert!(
        msg.contains("default/db-pdb") && msg.contains("default/db-"),
        "{msg}"
    );
    // The unprotected pod went; the node stays cordoned; the blocker was reported live.
    assert_eq!(report.removed.len(), 1);
    assert_eq!(pods_on(&c, "n1").len(), 3);
    assert!(unschedulable(&c, "n1"));
    assert!(seen.iter().any(|p| p
        .blocker
        .as_ref()
        .is_some_and(|x| x.pdb.as_deref() == Some("default/db-pdb"))));

    // The PDB relents: the next drain finishes (and did not cordon: it was already cordoned).
    c.sim
        .store
        .txn(|t| t.delete(well_known::pdbs(), "default", "db-pdb", &Default::default()))
        .unwrap();
    let (r, _) = run(&c, &opts("n1", 5000)).await;
    let report = r.unwrap();
    assert_eq!(report.removed.len(), 3);
    assert!(!report.cordoned_by_us);
    assert!(pods_on(&c, "n1").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multiple_pdbs_are_named() {
    let c = cluster().await;
    node(&c, "n1");
    pod("api-0", "api").on(&c, "n1");
    pdb(&c, "api-a", "api", json!({"maxUnavailable": 1}));
    pdb(&c, "api-b", "api", json!({"maxUnavailable": 1}));
    let (r, _) = run(&c, &opts("n1", 800)).await;
    let err = r.unwrap_err();
    let DrainError::TimedOut { blocker, .. } = &err else {
        panic!("{err}")
    };
    let b = blocker.as_deref().unwrap();
    assert_eq!(b.reason, BlockReason::MultiplePodDisruptionBudgets);
    assert_eq!(b.pdb.as_deref(), Some("default/api-a,default/api-b"));
    assert_eq!(b.pod, "default/api-0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn do_not_disrupt_is_respected_except_past_an_interruption_deadline() {
    let c = cluster().await;
    node(&c, "n1");
    pod("keep-k", "keep")
        .annotate("karpenter.sh/do-not-disrupt", "true")
        .on(&c, "n1");
    pod("keep-n", "keep")
        .annotate("nodekeeper.io/do-not-disrupt", "true")
        .on(&c, "n1");
    pod("plain", "plain").on(&c, "n1");

    // Plain drain: the annotated pods stay; the blocker says why.
    let (r, _) = run(&c, &opts("n1", 600)).await;
    let err = r.unwrap_err();
    let DrainError::TimedOut { blocker, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(
        blocker.as_deref().unwrap().reason,
        BlockReason::DoNotDisrupt
    );
    let mut left = pods_on(&c, "n1");
    left.sort();
    assert_eq!(left, ["default/keep-k", "default/keep-n"]);

    // force-delete does not override the annotation outside an interruption.
    let mut o = opts("n1", 600);
    o.on_timeout = OnTimeout::ForceDelete;
    let (r, _) = run(&c, &o).await;
    assert!(matches!(r, Err(DrainError::TimedOut { .. })));
    assert_eq!(pods_on(&c, "n1").len(), 2);

    // An interruption: past its deadline the annotation no longer protects the pods.
    o.interruption = true;
    o.on_timeout = OnTimeout::Fail;
    o.deadline = Some(tokio::time::Instant::now() + Duration::from_millis(400));
    o.force_settle = Duration::from_secs(2);
    let mut o2 = o.clone();
    o2.on_timeout = OnTimeout::ForceDelete;
    let started = std::time::Instant::now();
    let (r, _) = run(&c, &o2).await;
    let report = r.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(350),
        "held until the deadline"
    );
    assert_eq!(report.removed.len(), 2);
    assert!(pods_on(&c, "n1").is_empty());
}

/// While a PDB holds the drain (2 s, rounds every 50 ms), the drain lists the node's pods twice, at
/// its start and right after its evictions were accepted: from then on the watch's events (the six
/// pods' finalizers removed, then their deletions, 500 ms in) are applied to the pods it holds, not
/// answered with a list each, and the PDB-refused eviction is retried at its backoff on those pods.
/// That the six are gone at the end (1 pod left, not 7) is the events' doing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_drain_lists_the_pods_twice_and_follows_the_watch() {
    let c = cluster().await;
    node(&c, "n1");
    pod("db-0", "db").on(&c, "n1");
    for i in 0..6 {
        pod(&format!("web-{i}"), "web").finalizer().on(&c, "n1");
    }
    let (kubelet, _) = kubelet_after(&c, Duration::from_millis(500));
    pdb(&c, "db-pdb", "db", json!({"minAvailable": 1}));
    let (client, log) = counting_client(&c);
    let r = drain::drain(client, &opts("n1", 2000), CancellationToken::new(), |_| {}).await;
    let Err(DrainError::TimedOut { remaining, .. }) = &r else {
        panic!("{r:?}")
    };
    kubelet.abort();
    assert_eq!(*remaining, 1, "db-0 held");
    let log = log.lock().unwrap().clone();
    let pods = |watch: bool| {
        log.iter()
            .filter(|l| l.starts_with("GET /api/v1/pods?"))
            .filter(|l| l.contains("watch=true") == watch)
            .count()
    };
    let evictions = log.iter().filter(|l| l.contains("/eviction")).count();
    // 40 rounds' worth when every round listed, up to 14 when every change did.
    assert!(
        pods(false) <= 2,
        "{} lists:\n{}",
        pods(false),
        log.join("\n")
    );
    assert!(pods(true) >= 1, "no watch:\n{}", log.join("\n"));
    assert!(
        evictions >= 4,
        "the held pod's eviction retried: {evictions}"
    );
}

/// Pod name → grace the API server was given.
type Graces = Arc<Mutex<Vec<(String, i64)>>>;

/// A stand-in kubelet: pods carrying the test finalizer lose it once terminating (recording the grace
/// the API server was given), so they then disappear.
fn kubelet(c: &drain_support::Cluster) -> (tokio::task::JoinHandle<()>, Graces) {
    kubelet_after(c, Duration::ZERO)
}

/// [`kubelet`], starting `after` this long.
fn kubelet_after(
    c: &drain_support::Cluster,
    after: Duration,
) -> (tokio::task::JoinHandle<()>, Graces) {
    let sim = c.sim.clone();
    let graces: Graces = Arc::default();
    let g = graces.clone();
    let h = tokio::spawn(async move {
        tokio::time::sleep(after).await;
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let pods = sim
                .store
                .txn(|t| t.list(well_known::pods(), Some("default")));
            for p in pods {
                if p["metadata"].get("deletionTimestamp").is_none()
                    || p["metadata"].get("finalizers").is_none()
                {
                    continue;
                }
                let name = p["metadata"]["name"].as_str().unwrap().to_string();
                g.lock().unwrap().push((
                    name.clone(),
                    p["metadata"]["deletionGracePeriodSeconds"]
                        .as_i64()
                        .unwrap(),
                ));
                let mut np: Value = (*p).clone();
                np["metadata"].as_object_mut().unwrap().remove("finalizers");
                let _ = sim.store.txn(|t| {
                    t.update(
                        well_known::pods(),
                        "default",
                        &name,
                        np,
                        nodekeeper_sim::apiserver::store::WriteTarget::Main,
                    )
                });
            }
        }
    });
    (h, graces)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_delete_clamps_grace_to_the_time_left() {
    let c = cluster().await;
    node(&c, "n1");
    // Both PDB-blocked; `slow` needs more grace than the whole timeout, `quick` 1 s.
    pod("slow", "db").grace(30).finalizer().on(&c, "n1");
    pod("quick", "db").grace(1).finalizer().on(&c, "n1");
    pdb(&c, "db-pdb", "db", json!({"minAvailable": 2}));
    let (k, graces) = kubelet(&c);
    let mut o = opts("n1", 3000);
    o.on_timeout = OnTimeout::ForceDelete;
    let started = std::time::Instant::now();
    let (r, seen) = run(&c, &o).await;
    k.abort();
    let report = r.unwrap();
    assert!(pods_on(&c, "n1").is_empty());
    assert_eq!(report.removed.len(), 2);
    assert!(
        report.removed.iter().all(|x| x.forced),
        "{:?}",
        report.removed
    );
    let graces = graces.lock().unwrap().clone();
    let slow = graces.iter().find(|(n, _)| n == "slow").unwrap().1;
    let quick = graces.iter().find(|(n, _)| n == "quick").unwrap().1;
    // `slow` is deleted at once with the time left (< its 30 s); `quick` once its 1 s no longer fits.
    assert!((1..=3).contains(&slow), "slow got grace {slow}");
    assert_eq!(quick, 1);
    let quick_at = report
        .removed
        .iter()
        .find(|x| x.pod == "default/quick")
        .unwrap()
        .at_ms;
    let slow_at = report
        .removed
        .iter()
        .find(|x| x.pod == "default/slow")
        .unwrap()
        .at_ms;
    assert!(slow_at < 1000, "slow deleted at {slow_at} ms");
    assert!(
        quick_at >= 1500,
        "quick deleted at {quick_at} ms (before its grace stopped fitting)"
    );
    assert!(started.elapsed() < Duration::from_millis(3000 + 300));
    assert!(seen.iter().any(|p| p
        .blocker
        .as_ref()
        .is_some_and(|b| b.reason == BlockReason::PodDisruptionBudget)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_volume_attachments() {
    let c = cluster().await;
    node(&c, "n1");
    pod("db-0", "db").on(&c, "n1");
    create(
        &c,
        volumeattachments(),
        "",
        json!({"metadata": {"name": "csi-123"},
        "spec": {"attacher": "ebs.csi.aws.com", "nodeName": "n1", "source": {"persistentVolumeName": "pv-1"}}}),
    );
    create(
        &c,
        volumeattachments(),
        "",
        json!({"metadata": {"name": "csi-other"},
        "spec": {"attacher": "ebs.csi.aws.com", "nodeName": "n2", "source": {"persistentVolumeName": "pv-2"}}}),
    );
    let (r, seen) = run(&c, &opts("n1", 700)).await;
    let err = r.unwrap_err();
    let DrainError::TimedOut {
        blocker, remaining, ..
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!(*remaining, 0);
    let b = blocker.as_deref().unwrap();
    assert_eq!(
        (b.reason, b.pod.as_str()),
        (BlockReason::VolumeAttachment, "csi-123")
    );
    assert!(seen.iter().any(|p| p.phase == drain::Phase::WaitingVolumes));
    // Detached: the drain completes.
    let sim = c.sim.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        sim.store
            .txn(|t| t.delete(volumeattachments(), "", "csi-123", &Default::default()))
            .unwrap();
    });
    let started = std::time::Instant::now();
    let (r, _) = run(&c, &opts("n1", 5000)).await;
    r.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(250));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminating_namespace_is_waited_for_not_fatal() {
    let c = cluster().await;
    node(&c, "n1");
    // A namespace held by a finalizer: deleted, Terminating, its pod still there (its namespace
    // controller has not got to it yet). Evictions there are refused 403 NamespaceTerminating.
    create(
        &c,
        well_known::namespaces(),
        "",
        json!({"metadata": {"name": "doomed", "finalizers": ["test.nodekeeper.io/hold"]}}),
    );
    let mut p = pod("crate-1", "crate");
    p.ns = "doomed".into();
    p.on(&c, "n1");
    pod("web-0", "web").on(&c, "n1");
    c.sim
        .store
        .txn(|t| t.delete(well_known::namespaces(), "", "doomed", &Default::default()))
        .unwrap();

    // The drain does not fail on the 403: it evicts the rest and waits, naming the reason.
    let (r, seen) = run(&c, &opts("n1", 800)).await;
    let err = r.unwrap_err();
    let DrainError::TimedOut {
        blocker,
        remaining,
        report,
        ..
    } = &err
    else {
        panic!("expected a timeout, got {err}")
    };
    let b = blocker.as_deref().unwrap();
    assert_eq!(
        (b.reason, b.pod.as_str()),
        (BlockReason::NamespaceTerminating, "doomed/crate-1")
    );
    assert!(b.message.contains("being terminated"), "{}", b.message);
    assert_eq!(*remaining, 1);
    assert_eq!(report.removed.len(), 1, "{report:?}");
    assert!(seen.iter().any(|p| p
        .blocker
        .as_ref()
        .is_some_and(|b| b.reason == BlockReason::NamespaceTerminating)));

    // The namespace controller deletes the pod: the drain completes.
    let sim = c.sim.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = nodekeeper_sim::apiserver::store::DeleteOptions {
            grace_seconds: Some(0),
            ..Default::default()
        };
        sim.store
            .txn(|t| t.delete(well_known::pods(), "doomed", "crate-1", &now))
            .unwrap();
    });
    let (r, _) = run(&c, &opts("n1", 5000)).await;
    r.unwrap();
    assert!(pods_on(&c, "n1").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_stops_the_drain() {
    let c = cluster().await;
    node(&c, "n1");
    pod("db-0", "db").on(&c, "n1");
    pdb(&c, "db-pdb", "db", json!({"minAvailable": 1}));
    let cancel = CancellationToken::new();
    let cc = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        cc.cancel();
    });
    let o = DrainOptions::new("n1"); // no deadline
    let started = std::time::Instant::now();
    let err = drain::drain(client(&c), &o, cancel, |_| {})
        .await
        .unwrap_err();
    assert!(matches!(err, DrainError::Cancelled { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(unschedulable(&c, "n1"));
}

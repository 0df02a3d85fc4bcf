//! A controller stopped mid-drain and a new one started: the new leader resumes from the
//! Node's annotations (drain restarted, blocker shown again) and never asks for a second
//! replacement; a replacement recorded as requested but never accepted (a crash between the
//! annotation and the provider call) is asked again with the same idempotency key; a node that
//! failed within its first minute, before a restart, is still repaired (its "seen Ready" is on
//! the Node), not replaced as a failed launch.
//!
//! Sim only: stops a controller at chosen points with the sim's scaled clock; the restart mid-drain
//! runs on both in `tests/e2e` (`failover`, `supervised`).
#![allow(clippy::unwrap_used)]

use crate::support::engine as engine_support;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, Patch, PatchParams, PostParams};
use nodekeeper_core::agent::sources::EventKind;
use nodekeeper_core::controller::act::actions::REPLACEMENT_ACCEPTED;
use nodekeeper_core::controller::act::provider::fake::FakeProvider;
use nodekeeper_core::controller::policy::view::{keys, DrainPhase};
use nodekeeper_core::controller::policy::PolicyConfig;
use nodekeeper_sim::apiserver::scenario::Scenario;
use nodekeeper_sim::apiserver::TestCluster;

use engine_support::*;

const NODE: &str = "spot-0";

/// A pod on spot-0 that PDB `stuck-pdb` (maxUnavailable 0) refuses to let go.
async fn stuck_pod(c: &TestCluster) {
    let pdb: PodDisruptionBudget = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "stuck-pdb", "namespace": "default"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "stuck"}}}}))
    .unwrap();
    Api::namespaced(c.client.clone(), "default")
        .create(&PostParams::default(), &pdb)
        .await
        .unwrap();
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "stuck-0", "labels": {"app": "stuck"}},
        "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "registry.example/stuck:1"}]}}))
    .unwrap();
    Api::<Pod>::namespaced(c.client.clone(), "default")
        .create(&PostParams::default(), &p)
        .await
        .unwrap();
    // Only a Running (healthy) pod is protected by its PDB.
    wait_until(Duration::from_secs(20), "stuck pod running", || async {
        pods_on(c, NODE).await.iter().any(|p| {
            p.metadata.name.as_deref() == Some("stuck-0")
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_controller_resumes_the_drain_without_a_second_replacement() {
    let c = cluster(20.0, Scenario::default_mixed(), loops()).await;
    stuck_pod(&c).await;
    let fake = Arc::new(FakeProvider::new());
    let a = controller(
        &c,
        &controller_config("engine-e1"),
        PolicyConfig::default(),
        Some(fake.clone()),
    )
    .await;
    let now = c.sim.store.clock.now();
    let ev = notice(
        "spot-itn-e",
        EventKind::Preemption,
        Some(now + chrono::Duration::seconds(900)),
        now,
    );
    assert!(a.app.states.ingest_event(NODE, ev).await);

    // Mid-drain: blocked by the PDB, shown on the node; the replacement was asked and accepted.
    wait_until(
        Duration::from_secs(15),
        "hold naming the pod and its PDB",
        || async {
            let n = node(&c, NODE).await;
            annotation(&n, keys::BLOCKED)
                .is_some_and(|b| b.contains("stuck-pdb") && b.contains("default/stuck-0"))
                && annotation(&n, REPLACEMENT_ACCEPTED).is_some()
                // (The hold's condition is a second write.)
                && condition(&n, "NodekeeperHeld").is_some()
        },
    )
    .await;
    let n = node(&c, NODE).await;
    let held = condition(&n, "NodekeeperHeld").unwrap();
    assert_eq!(held.status, "True");
    assert_eq!(held.reason.as_deref(), Some("BlockedByPDB"));
    assert!(held.message.as_deref().unwrap_or("").contains("stuck-pdb"));
    let requested = annotation(&n, keys::REPLACEMENT_REQUESTED)
        .unwrap()
        .to_string();
    assert_eq!(fake.requests().len(), 1);
    assert_eq!(
        a.engine.as_ref().unwrap().drains().view(NODE).phase,
        DrainPhase::Running
    );

    // The controller goes away mid-drain; a new one takes the lease.
    a.stop().await;
    let b = controller(
        &c,
        &controller_config("engine-e2"),
        PolicyConfig::default(),
        Some(fake.clone()),
    )
    .await;
    let eb = b.engine.clone().unwrap();
    wait_until(
        Duration::from_secs(10),
        "drain resumed by the new leader",
        || async {
            let v = eb.drains().view(NODE);
            v.phase == DrainPhase::Running
                && v.blocker
                    .as_ref()
                    .is_some_and(|p| p.blocking_pdb.as_deref() == Some("default/stuck-pdb"))
        },
    )
    .await;
    // The PDB is relaxed: the resumed drain finishes; the hold is lifted. (`maxUnavailable: 1`
    // would not do: a bare pod has no controller scale, so the disruption controller expects 0
    // pods and allows nothing; an integer `minAvailable` counts the pods themselves.)
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(c.client.clone(), "default");
    pdbs.patch(
        "stuck-pdb",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"maxUnavailable": null, "minAvailable": 0}})),
    )
    .await
    .unwrap();
    wait_until(
        Duration::from_secs(20),
        "resumed drain completed",
        || async { eb.drains().view(NODE).phase == DrainPhase::Completed },
    )
    .await;
    wait_until(Duration::from_secs(5), "hold lifted", || async {
        let n = node(&c, NODE).await;
        annotation(&n, keys::BLOCKED).is_none()
            && condition(&n, "NodekeeperHeld").is_some_and(|c| c.status == "False")
    })
    .await;
    let n = node(&c, NODE).await;
    assert!(unschedulable(&n), "still cordoned");
    assert_eq!(annotation(&n, keys::STATE), Some("interrupted"));
    assert_eq!(
        annotation(&n, keys::REPLACEMENT_REQUESTED),
        Some(requested.as_str())
    );
    assert!(pods_on(&c, NODE).await.iter().all(|p| !p
        .metadata
        .name
        .as_deref()
        .unwrap_or("")
        .starts_with("stuck")));
    // Exactly one replacement request across both controllers, reconciles after the drain ended.
    three_more_reconciles(&b).await;
    assert_eq!(fake.requests().len(), 1, "{:?}", fake.requests());
    assert_eq!(fake.launched(), 1);
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_recorded_but_not_accepted_is_asked_again_with_the_same_key() {
    let c = cluster(20.0, Scenario::default_mixed(), loops()).await;
    let fake = Arc::new(FakeProvider::new());
    // The first call fails: the request stays recorded as asked, not accepted.
    fake.fail_next("provider unavailable");
    // A permanent refusal is not retried by this controller; a new one asks again (same key).
    let a = controller(
        &c,
        &controller_config("engine-f1"),
        PolicyConfig::default(),
        Some(fake.clone()),
    )
    .await;
    let now = c.sim.store.clock.now();
    let ev = notice(
        "spot-itn-f",
        EventKind::Preemption,
        Some(now + chrono::Duration::seconds(900)),
        now,
    );
    assert!(a.app.states.ingest_event(NODE, ev).await);
    wait_until(
        Duration::from_secs(10),
        "first (failed) request",
        || async { fake.requests().len() == 1 },
    )
    .await;
    // Reconciles after the refusal: none may ask again.
    three_more_reconciles(&a).await;
    let n = node(&c, NODE).await;
    assert!(annotation(&n, keys::REPLACEMENT_REQUESTED).is_some());
    assert_eq!(annotation(&n, REPLACEMENT_ACCEPTED), None);
    assert_eq!(
        fake.requests().len(),
        1,
        "a permanent refusal is not hammered"
    );
    wait_until(
        Duration::from_secs(10),
        "a ReplacementFailed Event",
        || async {
            let evs = events_about(&c, NODE).await;
            match evs
                .iter()
                .any(|(r, n)| r == "ReplacementFailed" && n.contains("provider unavailable"))
            {
                true => Ok(()),
                false => Err(evs),
            }
        },
    )
    .await;
    a.stop().await;

    let b = controller(
        &c,
        &controller_config("engine-f2"),
        PolicyConfig::default(),
        Some(fake.clone()),
    )
    .await;
    wait_until(
        Duration::from_secs(10),
        "accepted by the second controller",
        || async { annotation(&node(&c, NODE).await, REPLACEMENT_ACCEPTED).is_some() },
    )
    .await;
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(
        reqs[0].request_id, reqs[1].request_id,
        "same idempotency key"
    );
    assert_eq!(fake.launched(), 1);
    assert_eq!(
        annotation(&node(&c, NODE).await, REPLACEMENT_ACCEPTED),
        Some(reqs[0].request_id.as_str())
    );
    b.stop().await;
}

/// Counts webhook deliveries (and answers 202).
async fn webhook_receiver() -> (String, Arc<std::sync::atomic::AtomicU32>) {
    use axum::routing::post;
    let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let c2 = calls.clone();
    let app = axum::Router::new().route(
        "/replace",
        post(move || {
            let c = c2.clone();
            async move {
                c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                axum::http::StatusCode::ACCEPTED
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/replace"), calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_is_called_once_across_a_restart_mid_drain() {
    use nodekeeper_core::controller::act::provider::{ProviderConfig, WebhookConfig};
    let c = cluster(20.0, Scenario::default_mixed(), loops()).await;
    stuck_pod(&c).await;
    let (url, calls) = webhook_receiver().await;
    let config = |id: &str| {
        let mut cfg = controller_config(id);
        // the receiver is on loopback
        cfg.allow_loopback_destinations = true;
        cfg.provider = ProviderConfig::Webhook(WebhookConfig {
            url: url.clone(),
            ca_file: None,
            secret: "webhook-secret".into(),
            timeout: Duration::from_secs(2),
            max_attempts: 3,
            backoff: Duration::from_millis(50),
        });
        cfg
    };
    let a = controller(&c, &config("engine-g1"), PolicyConfig::default(), None).await;
    let now = c.sim.store.clock.now();
    let ev = notice(
        "spot-itn-g",
        EventKind::Preemption,
        Some(now + chrono::Duration::seconds(900)),
        now,
    );
    assert!(a.app.states.ingest_event(NODE, ev).await);
    wait_until(
        Duration::from_secs(15),
        "accepted and blocked by the PDB",
        || async {
            let n = node(&c, NODE).await;
            annotation(&n, REPLACEMENT_ACCEPTED).is_some()
                && annotation(&n, keys::BLOCKED).is_some_and(|b| b.contains("stuck-pdb"))
        },
    )
    .await;
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    a.stop().await;
    let b = controller(&c, &config("engine-g2"), PolicyConfig::default(), None).await;
    let eb = b.engine.clone().unwrap();
    wait_until(Duration::from_secs(10), "drain resumed", || async {
        eb.drains().view(NODE).phase == DrainPhase::Running
    })
    .await;
    three_more_reconciles(&b).await;
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the webhook was called again after the restart"
    );
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_young_node_failed_before_a_restart_is_repaired_not_replaced_as_a_failed_launch() {
    // Scale 5: the node's first simulated minute lasts 12 s.
    let mut s = Scenario::default_mixed();
    s.pools.truncate(1);
    s.pools[0].count = 2;
    s.workloads.clear();
    s.daemonsets.clear();
    let c = cluster(5.0, s, loops()).await;
    let p: PolicyConfig = toml::from_str(
        r#"
[repair]
startup_timeout = "300s"
max_unhealthy = "100%"
[[repair.policy]]
condition_type = "Ready"
condition_status = "False"
toleration = "60s"
"#,
    )
    .unwrap();
    const YOUNG: &str = "general-0";
    let fake = Arc::new(FakeProvider::new());
    let a = controller(
        &c,
        &controller_config("engine-y1"),
        p.clone(),
        Some(fake.clone()),
    )
    .await;
    wait_until(Duration::from_secs(10), "seen-ready stored", || async {
        annotation(&node(&c, YOUNG).await, keys::SEEN_READY).is_some()
    })
    .await;
    pin_condition(&c, YOUNG, "Ready", "False").await;
    // Failed within its first minute: by its Ready transition alone it never became Ready.
    let n = node(&c, YOUNG).await;
    let created = n.metadata.creation_timestamp.clone().unwrap().0.as_second();
    let failed = condition(&n, "Ready")
        .unwrap()
        .last_transition_time
        .unwrap()
        .0
        .as_second();
    assert!(
        failed - created < 60,
        "failed {}s after creation",
        failed - created
    );

    // The controller restarts before the toleration expired (no repair state yet).
    assert_eq!(annotation(&n, keys::STATE), None);
    a.stop().await;
    let b = controller(&c, &controller_config("engine-y2"), p, Some(fake)).await;
    wait_until(
        Duration::from_secs(40),
        "the young node handled",
        || async { annotation(&node(&c, YOUNG).await, keys::STATE).is_some() },
    )
    .await;
    let n = node(&c, YOUNG).await;
    assert_eq!(annotation(&n, keys::REASON), Some("repair:Ready=False"));
    let startup: Vec<_> = events_about(&c, YOUNG)
        .await
        .into_iter()
        .filter(|(r, _)| r == "StartupTimeout")
        .collect();
    assert!(startup.is_empty(), "{startup:?}");
    b.stop().await;
}

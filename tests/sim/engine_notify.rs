//! The engine's actions reach the configured webhook (`[[controller.notify]]`): a preemption's
//! drain and replacement are announced to a local receiver, and `/metrics` counts them.
//!
//! Sim only: at a scaled clock through the sim's Karpenter-like loop; webhook delivery over HTTPS
//! is proved by `notify_webhook`, the preemption path on both by `tests/e2e` (`preemption`).
#![allow(clippy::unwrap_used)]

use crate::support::engine as engine_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use axum::Router;
use nodekeeper_core::agent::sources::EventKind;
use nodekeeper_core::controller::act::notify::{NotifyConfig, Payload};
use nodekeeper_core::controller::act::provider::fake::FakeProvider;
use nodekeeper_core::controller::policy::PolicyConfig;
use nodekeeper_sim::apiserver::scenario::Scenario;

use engine_support::*;

type Seen = Arc<Mutex<Vec<Payload>>>;

async fn receiver() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let app = Router::new()
        .route(
            "/hook",
            post(|State(s): State<Seen>, body: Bytes| async move {
                s.lock()
                    .unwrap()
                    .push(serde_json::from_slice(&body).unwrap());
                "ok"
            }),
        )
        .with_state(seen.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    (format!("http://{addr}/hook"), seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preemption_actions_are_notified() {
    let (url, seen) = receiver().await;
    let c = cluster(20.0, Scenario::default_mixed(), loops()).await;
    let mut cfg = controller_config("engine-notify");
    // the receiver is on loopback
    cfg.allow_loopback_destinations = true;
    cfg.notify = vec![toml::from_str::<NotifyConfig>(&format!("url = \"{url}\"")).unwrap()];
    let fake = Arc::new(FakeProvider::new());
    let ctl = controller(&c, &cfg, PolicyConfig::default(), Some(fake.clone())).await;
    let now = c.sim.store.clock.now();
    let at = Some(now + chrono::Duration::seconds(600));
    let ev = notice("p-1", EventKind::Preemption, at, now);
    assert!(ctl.app.states.ingest_event("spot-0", ev).await);
    wait_until(
        Duration::from_secs(20),
        "drain and replace notified",
        || async {
            let s = seen.lock().unwrap();
            let has = |action: &str| {
                s.iter()
                    .any(|p| p.node == "spot-0" && p.action == action && p.phase == "started")
            };
            has("drain") && has("replace")
        },
    )
    .await;
    assert!(
        seen.lock().unwrap().iter().all(|p| p.node == "spot-0"),
        "only the preempted node is acted on"
    );
    let metrics = nodekeeper_core::http::client()
        .unwrap()
        .get(format!("http://{}/metrics", ctl.addr))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let sent: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("nodekeeper_notifications_total") && l.contains("sent"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(sent >= 2, "{metrics}");
    ctl.stop().await;
}

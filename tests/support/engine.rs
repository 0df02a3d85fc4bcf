//! Shared helpers of the engine tests: a simulated cluster with its loops, a controller with
//! the disruption engine on the sim's (scaled) clock, notices, waits and readers.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use nodekeeper_core::agent::sources::{EventKind, NodeEvent, NODE_EVENT_VERSION};
use nodekeeper_core::controller::act::provider::NodeProvider;
use nodekeeper_core::controller::clock::Clock;
use nodekeeper_core::controller::config::ControllerConfig;
use nodekeeper_core::controller::engine::EngineOptions;
use nodekeeper_core::controller::policy::PolicyConfig;
use nodekeeper_core::controller::Running;
use nodekeeper_sim::apiserver::clock::SimClock;
use nodekeeper_sim::apiserver::loops::LoopOptions;
use nodekeeper_sim::apiserver::scenario::Scenario;
use nodekeeper_sim::apiserver::{SimOptions, TestCluster};

/// The sim's clock as the engine's clock.
pub struct SimTime(pub Arc<SimClock>);

impl Clock for SimTime {
    fn now(&self) -> DateTime<Utc> {
        self.0.now()
    }
    fn real(&self, d: Duration) -> Duration {
        self.0.real(d)
    }
}

/// A policy from its TOML (the `[repair]`, `[budgets]` and `[interruption]` sections), checked valid.
pub fn policy(text: &str) -> PolicyConfig {
    let p: PolicyConfig = toml::from_str(text).unwrap();
    assert!(p.validate().is_empty(), "{:?}", p.validate());
    p
}

pub fn init() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
}

/// A simulated cluster at `scale` with `scenario` and `loops`, plus the `nodekeeper` namespace.
pub async fn cluster(scale: f64, scenario: Scenario, loops: LoopOptions) -> TestCluster {
    init();
    let c = TestCluster::start(SimOptions {
        time_scale: scale,
        scenario,
        loops,
        ..Default::default()
    })
    .await
    .unwrap();
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "nodekeeper"}})).unwrap();
    Api::all(c.client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    c
}

/// A controller configuration for tests: plain HTTP on loopback, a fast lease, a 200 ms tick.
pub fn controller_config(id: &str) -> ControllerConfig {
    let mut c = ControllerConfig {
        listen: "127.0.0.1:0".into(),
        insecure_plain_http: true,
        ..Default::default()
    };
    c.leader.identity = Some(id.into());
    c.leader.lease_duration = Duration::from_secs(2);
    c.leader.retry_period = Duration::from_millis(200);
    c.engine.tick = Duration::from_millis(200);
    c.engine.wait_volume_detach = false;
    assert!(c.validate().is_empty(), "{:?}", c.validate());
    c
}

/// Starts a controller with the engine on the sim's clock (leading or not).
pub async fn start_engine(
    c: &TestCluster,
    cfg: &ControllerConfig,
    policy: PolicyConfig,
    provider: Option<Arc<dyn NodeProvider>>,
) -> Running {
    let mut opts = EngineOptions::new(policy);
    opts.clock = Arc::new(SimTime(c.sim.store.clock.clone()));
    opts.provider = provider;
    nodekeeper_core::controller::start_with(c.client.clone(), cfg, Some(opts))
        .await
        .unwrap()
}

/// Starts a controller with the engine on the sim's clock; waits until it leads.
pub async fn controller(
    c: &TestCluster,
    cfg: &ControllerConfig,
    policy: PolicyConfig,
    provider: Option<Arc<dyn NodeProvider>>,
) -> Running {
    let r = start_engine(c, cfg, policy, provider).await;
    wait_until(Duration::from_secs(15), "leadership", || async {
        *r.app.leader.borrow() && r.app.ready.load(std::sync::atomic::Ordering::Relaxed)
    })
    .await;
    r
}

/// The shared polling helper (tests/support/wait.rs), under the name the engine tests use.
pub use super::wait::until as wait_until;

/// Waits until the engine of `r` has finished three more reconciles than when called: the last
/// two started after the call, so whatever the engine would do about the state then (and about its
/// own writes of the first) is done. For a "nothing happened" check: wait on this, then assert.
pub async fn three_more_reconciles(r: &Running) {
    use std::sync::atomic::Ordering::Relaxed;
    let m = &r
        .engine
        .as_ref()
        .expect("a controller with the engine")
        .metrics;
    let before = m.reconciles.load(Relaxed);
    wait_until(Duration::from_secs(30), "three more reconciles", || {
        std::future::ready(m.reconciles.load(Relaxed) >= before + 3)
    })
    .await;
}

/// A notice as an agent would report it.
pub fn notice(
    id: &str,
    kind: EventKind,
    at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> NodeEvent {
    NodeEvent {
        version: NODE_EVENT_VERSION,
        id: id.into(),
        kind,
        cloud: None,
        source: "test/notice".into(),
        not_before: at,
        deadline: None,
        detected_at: now,
        detail: Default::default(),
    }
}

pub async fn node(c: &TestCluster, name: &str) -> Node {
    Api::<Node>::all(c.client.clone()).get(name).await.unwrap()
}

pub async fn node_opt(c: &TestCluster, name: &str) -> Option<Node> {
    Api::<Node>::all(c.client.clone())
        .get_opt(name)
        .await
        .unwrap()
}

pub fn annotation<'a>(n: &'a Node, key: &str) -> Option<&'a str> {
    n.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

pub fn label<'a>(n: &'a Node, key: &str) -> Option<&'a str> {
    n.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

pub fn unschedulable(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

pub fn taint<'a>(n: &'a Node, key: &str) -> Option<&'a k8s_openapi::api::core::v1::Taint> {
    n.spec
        .as_ref()?
        .taints
        .as_ref()?
        .iter()
        .find(|t| t.key == key)
}

pub fn condition(n: &Node, type_: &str) -> Option<k8s_openapi::api::core::v1::NodeCondition> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .cloned()
}

/// Pods bound to `node`, not terminating.
pub async fn pods_on(c: &TestCluster, node: &str) -> Vec<Pod> {
    Api::<Pod>::all(c.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

/// Running pods bound to `node`.
pub async fn running_on(c: &TestCluster, node: &str) -> usize {
    pods_on(c, node)
        .await
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count()
}

/// `(reason, note)` of the Events nodekeeper recorded about `node`.
pub async fn events_about(c: &TestCluster, node: &str) -> Vec<(String, String)> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(
        c.client.clone(),
        nodekeeper_core::controller::cluster::events::NODE_EVENT_NAMESPACE,
    );
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

/// Pins a node condition through the sim's admin API.
pub async fn pin_condition(c: &TestCluster, node: &str, type_: &str, status: &str) {
    let r = nodekeeper_core::http::client().unwrap()
        .post(c.admin_url(&format!("nodes/{node}/conditions")))
        .json(&serde_json::json!({"type": type_, "status": status, "reason": "Test", "message": "pinned by the test"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
}

/// Loops of a cluster for engine tests (everything on).
pub fn loops() -> LoopOptions {
    LoopOptions::default()
}

/// Waits until the seeded nodes are `secs` simulated seconds old (the policy tells a node that
/// never became Ready from one that failed later by its Ready transition relative to creation).
pub async fn age_nodes(c: &TestCluster, secs: i64) {
    let start = Api::<Node>::all(c.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|n| n.metadata.creation_timestamp.as_ref())
        .map(|t| t.0.as_second())
        .max()
        .unwrap();
    let clock = c.sim.store.clock.clone();
    wait_until(Duration::from_secs(30), "nodes aged", || {
        let clock = clock.clone();
        async move { clock.now().timestamp() - start >= secs }
    })
    .await;
}

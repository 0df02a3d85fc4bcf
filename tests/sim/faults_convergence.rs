//! API faults: with the sim injecting 5xx, 429, latency and periodic watch drops (the fault plan:
//! 10 % 5xx, 5 % 429, 1 s latency, drops every 10 s, scaled down by `SCALE` for CI), the agent's
//! label cleaning (`agent::labels::watch`, direct mode) and the controller's node-state layer
//! (real agent reporters → report API over TLS → Node conditions) converge, without a panic.
//! Convergence times are measured against a fault-free run of the same scenario and the ratio is
//! printed (docs/dev/reliability.md); the test asserts convergence within a generous bound, not the
//! ratio (no timed assertions on shared CI machines).
//!
//! `NODEKEEPER_FAULT_SCALE=1` runs the unscaled faults (the long variant).
//!
//! Sim only: the sim's fault plan (5xx, 429, latency, watch drops) has no real equivalent.

use crate::support::ctl;
use crate::support::wait;

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use ctl::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use nodekeeper_core::agent::checks::ConditionStatus::{self, False, True};
use nodekeeper_core::agent::labels::{self, CleanupRule, LabelRemover, LabelsConfig, PatchRemover};
use nodekeeper_core::agent::reporter::{Reporter, ReporterConfig};
use serde_json::{json, Value};
use tokio::time::Instant;

const NODES: usize = 4;
const LABEL: &str = "last-migration-failure";
/// Nothing may take longer than this to converge, faults or not.
const BOUND: Duration = Duration::from_secs(90);

static PANICS: AtomicUsize = AtomicUsize::new(0);

/// Counts every panic in the process outside the tests' own code (controller, reporters and
/// watchers run in-process).
fn count_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // Other tests share this process (one `sim` test binary): a panic of a test's own
            // code (under tests/) is that test's failure, not one of the product under faults.
            if !info
                .location()
                .is_some_and(|l| l.file().starts_with("tests/"))
            {
                PANICS.fetch_add(1, Relaxed);
            }
            prev(info);
        }));
    });
}

fn scale() -> u64 {
    std::env::var("NODEKEEPER_FAULT_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|s| *s >= 1)
        .unwrap_or(10)
}

/// Per resource request: 429 with p = 0.05, else 500 or 503 (together ≈ 10 % of all requests),
/// plus `1 s / scale` latency.
fn fault_spec() -> Value {
    json!({"errorRates": {"429": 0.05, "500": 0.0527, "503": 0.0527}, "latencyMs": 1000 / scale()})
}

async fn admin_call(env: &Env, method: &str, path: &str, body: Option<Value>) -> Value {
    let (code, bytes) = request(
        admin(),
        method,
        &env.cluster.admin_url(path),
        None,
        &[],
        body.map(|b| serde_json::to_vec(&b).unwrap()),
    )
    .await
    .unwrap();
    assert_eq!(
        code,
        200,
        "{method} {path}: {}",
        String::from_utf8_lossy(&bytes)
    );
    serde_json::from_slice(&bytes).unwrap()
}

/// Nodes as stored in the sim (read through the admin API, which faults do not touch).
async fn stored_nodes(env: &Env) -> Vec<Value> {
    let state = admin_call(env, "GET", "state", None).await;
    state["objects"]["v1/nodes"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn condition(node: &Value, type_: &str) -> Option<String> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .and_then(|c| c["status"].as_str().map(str::to_string))
}

async fn wait_nodes(env: &Env, what: &str, ok: impl Fn(&Value) -> bool) -> Duration {
    let start = Instant::now();
    wait::until(BOUND, format!("{what} to converge"), || async {
        let nodes = stored_nodes(env).await;
        nodes.len() == NODES && nodes.iter().all(&ok)
    })
    .await;
    start.elapsed()
}

/// Retries a write of the test itself until the (faulty) API takes it.
async fn set_ready(pods: &Api<Pod>, name: &str, ready: bool) {
    let status = if ready { "True" } else { "False" };
    let patch = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": status}]}});
    for _ in 0..100 {
        if pods
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("cannot set pod {name} Ready={ready}");
}

fn rules() -> Vec<labels::Rule> {
    labels::compile(&LabelsConfig {
        mode: labels::RemovalMode::Direct,
        cleanup: vec![CleanupRule {
            label: LABEL.into(),
            when_pod_ready: Some(labels::config::PodReady {
                namespace: "kube-system".into(),
                selector: "k8s-app=cilium".into(),
            }),
            when_condition: None,
        }],
    })
    .unwrap()
}

struct Agent {
    report_tx: tokio::sync::watch::Sender<nodekeeper_core::wire::NodeReport>,
    _events: tokio::sync::mpsc::Sender<nodekeeper_core::agent::sources::NodeEvent>,
    _commands: tokio::sync::mpsc::Receiver<nodekeeper_core::wire::AgentCommand>,
}

/// One node's agent: the real reporter (to the controller over TLS) and the label watcher.
async fn start_agent(
    env: &Env,
    ctl: &nodekeeper_core::controller::Running,
    node: &str,
    stop: &tokio_util::sync::CancellationToken,
) -> Agent {
    let dir = env.dir.path().join(node);
    std::fs::create_dir_all(&dir).unwrap();
    let token_file = dir.join("token");
    std::fs::write(&token_file, env.token(node, "nodekeeper").await).unwrap();
    let cfg = ReporterConfig {
        url: ip_url(ctl.addr, ""),
        ca_file: Some(env.ca.clone()),
        server_name: Some(SERVER_NAME.into()),
        token_file,
        heartbeat: Duration::from_secs(10) / scale() as u32,
        timeout: Duration::from_secs(5),
        backoff_max: Duration::from_secs(30) / scale() as u32,
        max_queued_events: 100,
        ..ReporterConfig::default()
    };
    let reporter = Reporter::new(cfg, &dir.join("state")).unwrap();
    let (report_tx, report_rx) =
        tokio::sync::watch::channel(report(node, 0, &[("NodekeeperDiskPressure", False)]));
    let (events, ev_rx) = tokio::sync::mpsc::channel(16);
    let (cmd_tx, commands) = tokio::sync::mpsc::channel(16);
    tokio::spawn(reporter.run(report_rx, ev_rx, cmd_tx, stop.clone()));
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(labels::watch(
        env.cluster.client.clone(),
        node.to_string(),
        rules(),
        Some(PatchRemover::new(env.cluster.client.clone())),
        tx,
        stop.clone(),
    ));
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    Agent {
        report_tx,
        _events: events,
        _commands: commands,
    }
}

#[derive(Debug)]
struct Figures {
    conditions: Vec<Duration>,
    labels: Duration,
    drops: u64,
}

fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[v.len() / 2]
}

/// Which faults a scenario injects.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Faults {
    /// None.
    Off,
    /// Only the latency (the floor any request-bound step pays).
    LatencyOnly,
    /// Errors, latency and watch drops.
    All,
}

async fn scenario(faults: Faults) -> Figures {
    let env = Env::new(NODES).await;
    let pods: Api<Pod> = Api::namespaced(env.cluster.client.clone(), "kube-system");
    for i in 0..NODES {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("cilium-{i}"), "namespace": "kube-system", "labels": {"k8s-app": "cilium"}},
            "spec": {"nodeName": format!("n{i}"), "containers": [{"name": "agent", "image": "cilium"}]}}))
        .unwrap();
        pods.create(&PostParams::default(), &p).await.unwrap();
        set_ready(&pods, &format!("cilium-{i}"), false).await;
    }
    // Leader election at the production defaults (15 s lease, 2 s retry), scaled like the faults:
    // the tests' usual 2 s lease cannot be renewed through 1 s of latency per request.
    let mut cfg = env.config();
    cfg.leader.lease_duration = Duration::from_secs(15) / scale() as u32;
    cfg.leader.retry_period = Duration::from_secs(2) / scale() as u32;
    let ctl = env.controller(&cfg, true).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let mut agents = Vec::new();
    for i in 0..NODES {
        agents.push(start_agent(&env, &ctl, &format!("n{i}"), &stop).await);
    }
    wait_nodes(&env, "initial reports", |n| {
        condition(n, "NodekeeperDiskPressure").as_deref() == Some("False")
    })
    .await;

    let drops = Arc::new(AtomicUsize::new(0));
    if faults == Faults::LatencyOnly {
        let latency = json!({"latencyMs": 1000 / scale()});
        admin_call(&env, "PUT", "faults", Some(latency)).await;
    }
    let dropper = if faults == Faults::All {
        admin_call(&env, "PUT", "faults", Some(fault_spec())).await;
        let (url, every, d) = (
            env.cluster.admin_url("watches/drop"),
            Duration::from_secs(10) / scale() as u32,
            drops.clone(),
        );
        Some(tokio::spawn(async move {
            let mut iv = tokio::time::interval(every);
            iv.tick().await;
            loop {
                iv.tick().await;
                if admin().post(&url).send().await.is_ok() {
                    d.fetch_add(1, Relaxed);
                }
            }
        }))
    } else {
        None
    };

    // Reports → conditions: every agent flips its condition; time until all Nodes show it.
    let mut conditions = Vec::new();
    // Enough rounds that the unscaled variant sees several watch drops too.
    let rounds = (30 / scale() as usize).max(3);
    for round in 0..rounds {
        let want: ConditionStatus = if round % 2 == 0 { True } else { False };
        for (i, a) in agents.iter().enumerate() {
            a.report_tx
                .send(report(
                    &format!("n{i}"),
                    0,
                    &[("NodekeeperDiskPressure", want)],
                ))
                .unwrap();
        }
        let w = want.to_string();
        conditions.push(
            wait_nodes(&env, "conditions", |n| {
                condition(n, "NodekeeperDiskPressure").as_deref() == Some(w.as_str())
            })
            .await,
        );
    }
    // Label cleaning: every Cilium pod becomes Ready; time until no node has the label.
    for i in 0..NODES {
        set_ready(&pods, &format!("cilium-{i}"), true).await;
    }
    let labels = wait_nodes(&env, "label cleaning", |n| {
        n["metadata"]["labels"].get(LABEL).is_none()
    })
    .await;

    if let Some(d) = dropper {
        d.abort();
    }
    admin_call(&env, "DELETE", "faults", None).await;
    stop.cancel();
    ctl.stop().await;
    Figures {
        conditions,
        labels,
        drops: drops.load(Relaxed) as u64,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agent_and_controller_converge_under_api_faults() {
    count_panics();
    let clean = scenario(Faults::Off).await;
    let slow = scenario(Faults::LatencyOnly).await;
    let faulty = scenario(Faults::All).await;
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-3);
    let (cc, cs, cf) = (
        median(&clean.conditions),
        median(&slow.conditions),
        median(&faulty.conditions),
    );
    eprintln!(
        "fault scale 1/{}: conditions median {cc:?} fault-free, {cs:?} latency only, {cf:?} all faults \
         (×{:.1} fault-free, ×{:.1} latency only); label cleaning {:?} / {:?} / {:?} (×{:.1}, ×{:.1}); \
         {} watch drops; rounds {:?} / {:?} / {:?}",
        scale(),
        ratio(cf, cc),
        ratio(cf, cs),
        clean.labels,
        slow.labels,
        faulty.labels,
        ratio(faulty.labels, clean.labels),
        ratio(faulty.labels, slow.labels),
        faulty.drops,
        clean.conditions,
        slow.conditions,
        faulty.conditions,
    );
    assert!(faulty.drops >= 1, "the faulty run dropped no watches");
    assert_eq!(PANICS.load(Relaxed), 0, "panics under API faults");
}

/// Regression: a failed direct removal was never retried (the watcher only re-evaluated on a
/// change, and nothing changes while the label is still there).
#[tokio::test]
async fn failed_direct_removal_is_retried() {
    struct Flaky {
        inner: PatchRemover,
        calls: AtomicUsize,
    }
    impl LabelRemover for Flaky {
        async fn remove(&self, node: &str, label: &str) -> Result<(), labels::LabelError> {
            // The first two attempts hit a node that does not exist: real API errors (404).
            let n = self.calls.fetch_add(1, Relaxed);
            let target = if n < 2 { "no-such-node" } else { node };
            self.inner.remove(target, label).await
        }
    }
    let env = Env::new(1).await;
    let pods: Api<Pod> = Api::namespaced(env.cluster.client.clone(), "kube-system");
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": "cilium-0", "namespace": "kube-system", "labels": {"k8s-app": "cilium"}},
        "spec": {"nodeName": "n0", "containers": [{"name": "agent", "image": "cilium"}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
    set_ready(&pods, "cilium-0", true).await;
    let remover = Arc::new(Flaky {
        inner: PatchRemover::new(env.cluster.client.clone()),
        calls: AtomicUsize::new(0),
    });
    struct Shared(Arc<Flaky>);
    impl LabelRemover for Shared {
        async fn remove(&self, node: &str, label: &str) -> Result<(), labels::LabelError> {
            self.0.remove(node, label).await
        }
    }
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(labels::watch(
        env.cluster.client.clone(),
        "n0".into(),
        rules(),
        Some(Shared(remover.clone())),
        tx,
        stop.clone(),
    ));
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    wait_nodes_one(&env, Duration::from_secs(20)).await;
    assert!(
        remover.calls.load(Relaxed) >= 3,
        "{}",
        remover.calls.load(Relaxed)
    );
    stop.cancel();
}

async fn wait_nodes_one(env: &Env, limit: Duration) {
    let start = Instant::now();
    loop {
        let nodes = stored_nodes(env).await;
        if nodes
            .iter()
            .all(|n| n["metadata"]["labels"].get(LABEL).is_none())
        {
            return;
        }
        assert!(start.elapsed() < limit, "the label was never removed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

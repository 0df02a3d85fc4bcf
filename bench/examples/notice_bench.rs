//! Benchmark: a notice becoming visible → the interruption taint and the cordon visible in a
//! Node watch, per source, side by side, through the real path:
//!
//! - **OCI, AWS, Azure, GCP metadata**: a real `nodekeeper agent` process per node with its own
//!   metadata emulator on loopback (`[sources] endpoint`, the demo's agent supervisor), reporting
//!   to the controller over loopback HTTP with a sim-minted token; the controller (in-process,
//!   with the disruption engine) writes the Node in the sim. The notice is injected into the
//!   emulator (`ImdsEmulator::preempt`, what `POST /admin/preempt` does) at a point spread over
//!   the poll phase, so the figure includes the wait for the next poll: OCI, AWS and Azure poll
//!   every `--poll-ms` (default 1,000 ms, the agent's default), GCP long-polls. The agent then
//!   sends the notice at once (reports are at most one per 200 ms).
//! - **OCI Events push**: an OCI Notifications-style POST to the controller's
//!   `/v1/oci-events`, timed from the start of the POST.
//!
//! Each trial uses a fresh node (and agent), so every notice is new to the controller.
//!
//! `--kubeconfig FILE` runs it on a real control plane instead of the sim (`bench/notice.sh
//! --real` starts one): KWOK nodes, the controller as the `nodekeeper-controller` ServiceAccount,
//! each agent with tokens bound to the shipped DaemonSet's pod on its node (the demo's
//! [`nodekeeper_sim::demo::real`] backend).
//!
//! `cargo run --example notice_bench -- [--trials 20] [--poll-ms 1000] [--kubeconfig FILE]` (or
//! `bench/notice.sh`); the agent binary is `NODEKEEPER_BIN`, else the `nodekeeper` of
//! the example's own profile under `target/`.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{arg, pct};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use nodekeeper_core::agent::sources::Cloud;
use nodekeeper_core::controller::act::provider::ProviderConfig;
use nodekeeper_core::controller::engine::EngineOptions;
use nodekeeper_core::controller::policy::PolicyConfig;
use nodekeeper_sim::apiserver::{SimOptions, TestCluster};
use nodekeeper_sim::demo::agents::Agents;
use nodekeeper_sim::demo::backend::Backend;
use nodekeeper_sim::demo::real::RealCluster;
use nodekeeper_sim::oci_events::{envelope, OciEventKind};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const TAINT: &str = "nodekeeper.io/interruption";
const OCI_TOKEN: &str = "bench-token-0123456789";

fn agent_exe() -> PathBuf {
    if let Some(p) = std::env::var_os("NODEKEEPER_BIN") {
        return p.into();
    }
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join(profile)
        .join("nodekeeper")
}

/// When each node was first seen with the interruption taint and `unschedulable`.
type Seen = Arc<Mutex<HashMap<String, Instant>>>;

fn watch_cordons(client: kube::Client) -> Seen {
    let seen: Seen = Arc::default();
    let s2 = seen.clone();
    let api: Api<Node> = Api::all(client);
    tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default()).applied_objects();
        let mut stream = std::pin::pin!(stream);
        while let Some(Ok(n)) = stream.next().await {
            let spec = n.spec.unwrap_or_default();
            let tainted = spec
                .taints
                .unwrap_or_default()
                .iter()
                .any(|t| t.key == TAINT);
            if tainted && spec.unschedulable == Some(true) {
                if let Some(name) = n.metadata.name {
                    let mut s = s2.lock().unwrap_or_else(|e| e.into_inner());
                    s.entry(name).or_insert_with(Instant::now);
                }
            }
        }
    });
    seen
}

async fn wait_seen(seen: &Seen, node: &str, t0: Instant) -> Result<f64, BoxError> {
    let end = t0 + Duration::from_secs(20);
    loop {
        let at = seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(node)
            .copied();
        if let Some(at) = at {
            return Ok(at.saturating_duration_since(t0).as_secs_f64() * 1000.0);
        }
        if Instant::now() > end {
            return Err(format!("{node}: no taint + cordon within 20 s").into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A Ready node (on a real cluster KWOK plays its kubelet: the annotation).
async fn add_node(client: &kube::Client, name: &str, provider_id: &str) -> Result<(), BoxError> {
    let since = (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    let n: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"karpenter.sh/nodepool": "bench"},
            "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "spec": {"providerID": provider_id},
        "status": {"capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
            "allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "lastHeartbeatTime": since, "lastTransitionTime": since}]}}))?;
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &n)
        .await?;
    Ok(())
}

/// One agent-polled source: a fresh node and agent per trial.
async fn polled(
    cloud: Cloud,
    trials: usize,
    poll: Duration,
    env: &BenchEnv,
) -> Result<Vec<f64>, BoxError> {
    let dir = env.dir.join(cloud.as_str());
    std::fs::create_dir_all(&dir)?;
    let credentials = env.cluster.credentials(&env.kubeconfig);
    let agents = Agents::new(agent_exe(), dir, env.controller_url.clone(), credentials)
        .with_source(cloud, poll);
    let mut samples = Vec::with_capacity(trials);
    for i in 0..trials {
        let node = format!("{cloud}-{i}");
        add_node(&env.admin, &node, &format!("{cloud}://bench-{cloud}-{i}")).await?;
        agents.sync(std::slice::from_ref(&node)).await?;
        // Up and polling: the first metadata answers are in, the first report sent.
        let up = Instant::now();
        while agents.metadata_requests(&node).await.unwrap_or(0) < 2 {
            if up.elapsed() > Duration::from_secs(20) {
                return Err(format!("{node}: the agent never read its metadata").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // One more poll interval, then a point spread over the next one.
        let phase = poll.mul_f64((i * 7 % trials) as f64 / trials as f64);
        tokio::time::sleep(poll + Duration::from_millis(300) + phase).await;
        let t0 = Instant::now();
        if !agents.preempt(&node, Duration::from_secs(120)).await {
            return Err(format!("{node}: no agent").into());
        }
        samples.push(wait_seen(&env.seen, &node, t0).await?);
    }
    agents.stop_all().await;
    Ok(samples)
}

/// OCI Events: POST to the controller, a fresh node per trial.
async fn pushed(trials: usize, env: &BenchEnv) -> Result<Vec<f64>, BoxError> {
    let http = nodekeeper_core::http::client().unwrap();
    let ocid = |i: usize| format!("ocid1.instance.oc1.phx.benchpush{i}");
    for i in 0..trials {
        add_node(
            &env.admin,
            &format!("push-{i}"),
            &format!("oci://{}", ocid(i)),
        )
        .await?;
    }
    // The controller's Node cache maps OCIDs to nodes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut samples = Vec::with_capacity(trials);
    for i in 0..trials {
        let body = envelope(OciEventKind::Preemption, &ocid(i), "");
        let t0 = Instant::now();
        let r = http
            .post(format!("{}/v1/oci-events/{OCI_TOKEN}", env.controller_url))
            .json(&body)
            .send()
            .await?;
        let status = r.status();
        let text = r.text().await.unwrap_or_default();
        if !status.is_success() || !text.contains("push-") {
            return Err(format!("OCI event {i}: {status} {text}").into());
        }
        samples.push(wait_seen(&env.seen, &format!("push-{i}"), t0).await?);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(samples)
}

struct BenchEnv {
    cluster: Backend,
    admin: kube::Client,
    dir: PathBuf,
    kubeconfig: PathBuf,
    controller_url: String,
    seen: Seen,
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), BoxError> {
    let trials = arg("--trials", 20).max(1) as usize;
    let poll = Duration::from_millis(arg("--poll-ms", 1000).max(1));
    let exe = agent_exe();
    if !exe.exists() {
        return Err(format!(
            "{}: no agent binary (cargo build, or set NODEKEEPER_BIN)",
            exe.display()
        )
        .into());
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = std::env::temp_dir().join(format!("nk-notice-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (cluster, kubeconfig) = match string_arg("--kubeconfig") {
        Some(path) => {
            let real = RealCluster::connect(std::path::Path::new(&path))
                .await
                .map_err(|e| e.to_string())?;
            (Backend::Real(real), PathBuf::from(path))
        }
        None => {
            let cluster = TestCluster::start(SimOptions::bare()).await?;
            let ns: k8s_openapi::api::core::v1::Namespace =
                serde_json::from_value(serde_json::json!({"metadata": {"name": "nodekeeper"}}))?;
            Api::all(cluster.client.clone())
                .create(&PostParams::default(), &ns)
                .await?;
            let kubeconfig = dir.join("kubeconfig");
            cluster.write_kubeconfig(&kubeconfig)?;
            (Backend::Sim(cluster), kubeconfig)
        }
    };
    let admin = cluster.admin();

    // The demo's controller settings (plain HTTP on loopback, the agents' service account),
    // no replacement provider, OCI Events on; the default policy (preemption → drain_replace).
    let mut cfg = nodekeeper_sim::demo::script::controller_config(None);
    cfg.provider = ProviderConfig::None;
    cfg.oci_events.enabled = true;
    cfg.oci_events.token = nodekeeper_core::config::Secret::new(OCI_TOKEN);
    let engine = EngineOptions::new(PolicyConfig::default());
    let client = cluster
        .controller_client()
        .await
        .map_err(|e| e.to_string())?;
    let ctl = nodekeeper_core::controller::start_with(client, &cfg, Some(engine)).await?;
    let start = Instant::now();
    while !*ctl.app.leader.borrow() {
        if start.elapsed() > Duration::from_secs(30) {
            return Err("the controller never led".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seen = watch_cordons(admin.clone());
    println!("cluster: {}", cluster.describe());
    let env = BenchEnv {
        controller_url: format!("http://{}", ctl.addr),
        cluster,
        admin: admin.clone(),
        dir: dir.clone(),
        kubeconfig,
        seen,
    };
    println!(
        "notice visible -> interruption taint + cordon seen by a Node watch ({trials} trials per source, {} build, agent {})",
        if cfg!(debug_assertions) { "debug" } else { "release" },
        exe.display()
    );
    println!(
        "{:<24} {:>14} {:>10} {:>10} {:>10}",
        "source", "poll", "p50 ms", "p99 ms", "max ms"
    );
    let mut rows: Vec<(String, String, Vec<f64>)> = Vec::new();
    rows.push((
        "OCI Events push".into(),
        "push".into(),
        pushed(trials, &env).await?,
    ));
    for cloud in [Cloud::Oci, Cloud::Aws, Cloud::Azure, Cloud::Gcp] {
        let interval = if cloud == Cloud::Gcp {
            "long poll".to_string()
        } else {
            format!("{} ms", poll.as_millis())
        };
        let samples = polled(cloud, trials, poll, &env).await?;
        rows.push((format!("{cloud} metadata (agent)"), interval, samples));
    }
    for (name, interval, mut v) in rows {
        v.sort_by(|a, b| a.total_cmp(b));
        println!(
            "{name:<24} {interval:>14} {:>10.1} {:>10.1} {:>10.1}",
            pct(&v, 0.5),
            pct(&v, 0.99),
            v.last().copied().unwrap_or(f64::NAN)
        );
    }
    ctl.stop().await;
    // The bench's nodes (a real cluster outlives the run).
    let nodes: Api<Node> = Api::all(admin);
    let lp = kube::api::ListParams::default().labels("karpenter.sh/nodepool=bench");
    let _ = nodes.delete_collection(&Default::default(), &lp).await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The value of `--name VALUE`, if given.
fn string_arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

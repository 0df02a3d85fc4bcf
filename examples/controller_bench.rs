//! Controller benchmark: authenticated reports per second and report → Node condition latency,
//! against the in-process sim API server over real TLS with sim-minted tokens.
//!
//! `cargo run --release --example controller_bench -- [--nodes 5000] [--seconds 10] [--concurrency 64] [--rate 500] [--connections 1]`
//!
//! Phase 1 (throughput): `concurrency` workers send heartbeats for random nodes as fast as they
//! can for `seconds`; a tenth of the reports change a condition (so the Node is written).
//! Phase 2 (latency): reports flipping a condition are sent at `rate`/s, one per node; a Node
//! watcher records when each change becomes visible; prints p50/p99/max of send → visible.
//! Phase 3 (with `--connections 1`): one open connection per node, as agents hold them: a child
//! process (this example again, `--hold`) opens `nodes` connections, each with its own client as
//! every agent has, and keeps them; the controller's process (this one, without the clients)
//! prints its RSS before and after, so the figure is the server side's cost per agent.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{arg, status_kib};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use nodekeeper_core::agent::checks::{CheckResult, ConditionStatus};
use nodekeeper_core::controller::config::ControllerConfig;
use nodekeeper_core::wire::{NodeReport, REPORT_VERSION};
use nodekeeper_sim::apiserver::{SimOptions, TestCluster};

const SA: &str = "system:serviceaccount:nodekeeper:nodekeeper-agent";
const NAME: &str = "nodekeeper-controller.nodekeeper.svc";

/// The agent's client (`nodekeeper_core::http`'s pinned CA and server name) for `url` on 127.0.0.1:
/// the client and the URL to request.
fn pinned(
    ca: &std::path::Path,
    url: &str,
) -> Result<(reqwest::Client, String), Box<dyn std::error::Error + Send + Sync>> {
    let (builder, url) = nodekeeper_core::http::pin_server_name(
        nodekeeper_core::http::pinned_builder(ca)?,
        &reqwest::Url::parse(url)?,
        NAME,
    )?;
    Ok((
        builder.timeout(Duration::from_secs(30)).build()?,
        url.into(),
    ))
}

/// A GET, or a JSON POST when `body` is given: the status and the body.
async fn request(
    c: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    body: Option<Vec<u8>>,
) -> Result<(u16, bytes::Bytes), reqwest::Error> {
    let mut req = match body {
        Some(b) => c
            .post(url)
            .header("content-type", "application/json")
            .body(b),
        None => c.get(url),
    };
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await?;
    let code = resp.status().as_u16();
    Ok((code, resp.bytes().await?))
}

fn report(node: &str, seq: u64, status: ConditionStatus) -> Vec<u8> {
    let r = NodeReport {
        version: REPORT_VERSION,
        node: node.into(),
        agent_version: "bench".into(),
        agent_instance: "bench".into(),
        sequence: seq,
        boot_id: "b".into(),
        generated_at: chrono::Utc::now(),
        identity: None,
        conditions: vec![
            CheckResult::new("NodekeeperDiskPressure", status, "Bench", "bench"),
            CheckResult::new(
                "NodekeeperMemoryPressure",
                ConditionStatus::False,
                "Bench",
                "bench",
            ),
        ],
        check_events: vec![],
        events: vec![],
        crio: None,
        label_removals: vec![],
        command_results: vec![],
        problems: vec![],
    };
    serde_json::to_vec(&r).unwrap_or_default()
}

/// The child of phase 3: `--hold N --port P --ca FILE`: N agents' clients, one `GET /livez` each,
/// prints `held N` and keeps them (answering the server's HTTP/2 pings) until killed.
async fn hold(n: usize) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let _ = nodekeeper_core::serve::raise_open_files_limit();
    let port = arg("--port", 0);
    let args: Vec<String> = std::env::args().collect();
    let ca = args
        .iter()
        .position(|a| a == "--ca")
        .and_then(|i| args.get(i + 1))
        .ok_or("--hold needs --ca")?;
    let url = format!("https://127.0.0.1:{port}/livez");
    let clients: Vec<_> = futures::stream::iter(0..n)
        .map(|_| {
            let url = url.clone();
            async move {
                let (c, url) = pinned(std::path::Path::new(ca), &url).ok()?;
                match request(&c, &url, None, None).await {
                    Ok((200, _)) => Some(c),
                    _ => None,
                }
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let held = clients.iter().flatten().count();
    println!("held {held}");
    tokio::time::sleep(Duration::from_secs(3600)).await;
    drop(clients);
    Ok(())
}

/// Phase 3: the controller process's RSS with `nodes` agent connections held by a child.
async fn connections(
    nodes: usize,
    port: u16,
    ca: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use tokio::io::AsyncBufReadExt;
    let me = std::process::id();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = status_kib(me, "VmRSS:");
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .args([
            "--hold",
            &nodes.to_string(),
            "--port",
            &port.to_string(),
            "--ca",
        ])
        .arg(ca)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let out = child.stdout.take().ok_or("no stdout")?;
    let mut lines = tokio::io::BufReader::new(out).lines();
    let held = lines.next_line().await?.unwrap_or_default();
    // a few HTTP/2 keep-alive ping rounds (every 10 s) on every connection
    tokio::time::sleep(Duration::from_secs(25)).await;
    let after = status_kib(me, "VmRSS:");
    let n: u64 = held.trim_start_matches("held ").parse().unwrap_or(0);
    println!(
        "connections: {held} of {nodes} agent connections open: controller process RSS {:.1} → {:.1} MiB, +{} KiB per connection",
        before as f64 / 1024.0,
        after as f64 / 1024.0,
        after.saturating_sub(before) / n.max(1)
    );
    child.kill().await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    if let Some(n) = std::env::args()
        .position(|a| a == "--hold")
        .map(|_| arg("--hold", 0))
    {
        return hold(n as usize).await;
    }
    let nodes = arg("--nodes", 5000) as usize;
    let seconds = arg("--seconds", 10);
    let concurrency = arg("--concurrency", 64) as usize;
    let rate = arg("--rate", 500);
    let _ = rustls::crypto::ring::default_provider().install_default();

    let cluster = TestCluster::start(SimOptions::bare()).await?;
    let dir = tempfile::tempdir()?;
    let ca_key = rcgen::KeyPair::generate()?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key)?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate()?;
    let cert = rcgen::CertificateParams::new(vec![NAME.to_string()])?.signed_by(&key, &issuer)?;
    std::fs::write(dir.path().join("ca.pem"), ca.pem())?;
    std::fs::write(dir.path().join("tls.crt"), cert.pem())?;
    std::fs::write(dir.path().join("tls.key"), key.serialize_pem())?;

    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "nodekeeper"}}))?;
    Api::all(cluster.client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    let napi: Api<Node> = Api::all(cluster.client.clone());
    let t = Instant::now();
    futures::stream::iter(0..nodes)
        .map(|i| {
            let napi = napi.clone();
            async move {
                let n: Node = serde_json::from_value(
                    serde_json::json!({"metadata": {"name": format!("n{i}")}}),
                )
                .unwrap_or_default();
                let _ = napi.create(&PostParams::default(), &n).await;
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
    let admin = nodekeeper_core::http::builder(None)?
        .timeout(Duration::from_secs(60))
        .build()?;
    let tokens: Vec<String> = futures::stream::iter(0..nodes)
        .map(|i| {
            let (admin, url) = (admin.clone(), cluster.admin_url("tokens"));
            async move {
                let body = serde_json::json!({"pod": format!("agent-n{i}"), "node": format!("n{i}"), "audiences": ["nodekeeper"],
                    "namespace": "nodekeeper", "serviceAccount": "nodekeeper-agent"});
                let (_, b) = request(&admin, &url, None, serde_json::to_vec(&body).ok()).await.ok()?;
                let v: serde_json::Value = serde_json::from_slice(&b).ok()?;
                v["token"].as_str().map(str::to_string)
            }
        })
        .buffered(64)
        .map(Option::unwrap_or_default)
        .collect()
        .await;
    eprintln!("setup: {nodes} nodes and tokens in {:?}", t.elapsed());

    let mut cfg = ControllerConfig {
        listen: "127.0.0.1:0".into(),
        tls_cert_file: Some(dir.path().join("tls.crt")),
        tls_key_file: Some(dir.path().join("tls.key")),
        service_account: SA.into(),
        staleness: Duration::from_secs(3600),
        ..Default::default()
    };
    cfg.leader.retry_period = Duration::from_millis(200);
    let ctl = nodekeeper_core::controller::start(cluster.client.clone(), &cfg).await?;
    while !(ctl.app.ready.load(Ordering::Relaxed) && *ctl.app.leader.borrow()) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (client, url) = pinned(
        &dir.path().join("ca.pem"),
        &format!("https://127.0.0.1:{}/v1/reports", ctl.addr.port()),
    )?;
    let tokens = Arc::new(tokens);

    // Warm-up: one report per node (first TokenReview, first Node write), not measured.
    let seqs: Arc<Vec<AtomicU64>> = Arc::new((0..nodes).map(|_| AtomicU64::new(1)).collect());
    let t = Instant::now();
    futures::stream::iter(0..nodes)
        .map(|i| {
            let (client, url, token) = (client.clone(), url.clone(), tokens[i].clone());
            async move {
                let _ = request(
                    &client,
                    &url,
                    Some(&token),
                    Some(report(&format!("n{i}"), 1, ConditionStatus::False)),
                )
                .await;
            }
        })
        .buffer_unordered(concurrency)
        .collect::<Vec<_>>()
        .await;
    let warm_reviews = ctl.app.auth.reviews.load(Ordering::Relaxed);
    let warm_writes = ctl.app.states.counters.node_writes.load(Ordering::Relaxed);
    eprintln!(
        "warm-up: {nodes} first reports in {:?} ({warm_reviews} TokenReviews)",
        t.elapsed()
    );

    // Phase 1: throughput.
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs(seconds);
    let start = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|w| {
            let (client, url, tokens, seqs, done, errors) = (
                client.clone(),
                url.clone(),
                tokens.clone(),
                seqs.clone(),
                done.clone(),
                errors.clone(),
            );
            tokio::spawn(async move {
                let mut i = w;
                while Instant::now() < end {
                    i = (i + concurrency * 7 + 1) % nodes;
                    let seq = seqs[i].fetch_add(1, Ordering::Relaxed) + 1;
                    let status = if seq % 10 == 0 {
                        ConditionStatus::True
                    } else {
                        ConditionStatus::False
                    };
                    let body = report(&format!("n{i}"), seq, status);
                    match request(&client, &url, Some(&tokens[i]), Some(body)).await {
                        Ok((200, _)) => done.fetch_add(1, Ordering::Relaxed),
                        _ => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.await;
    }
    let secs = start.elapsed().as_secs_f64();
    let n = done.load(Ordering::Relaxed);
    println!(
        "throughput: {n} authenticated reports in {secs:.1}s = {:.0} reports/s ({} errors, {} TokenReviews, {} node writes), concurrency {concurrency}",
        n as f64 / secs,
        errors.load(Ordering::Relaxed),
        ctl.app.auth.reviews.load(Ordering::Relaxed) - warm_reviews,
        ctl.app.states.counters.node_writes.load(Ordering::Relaxed) - warm_writes
    );

    // Phase 2: latency report → condition visible through a watch.
    let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let lat: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let (s2, l2) = (sent.clone(), lat.clone());
    let watch = tokio::spawn(async move {
        let mut st = std::pin::pin!(watcher(napi, watcher::Config::default()).applied_objects());
        while let Some(Ok(n)) = st.next().await {
            let name = n.metadata.name.clone().unwrap_or_default();
            let flipped = n
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| {
                    c.type_ == "NodekeeperDiskPressure" && c.reason.as_deref() == Some("Latency")
                });
            if flipped {
                if let Some(t0) = s2.lock().map(|mut m| m.remove(&name)).ok().flatten() {
                    if let Ok(mut l) = l2.lock() {
                        l.push(t0.elapsed());
                    }
                }
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let count = nodes.min((rate * seconds) as usize);
    let mut tick = tokio::time::interval(interval);
    let mut handles = Vec::with_capacity(count);
    for i in 0..count {
        tick.tick().await;
        let name = format!("n{i}");
        let seq = seqs[i].fetch_add(1, Ordering::Relaxed) + 1;
        let mut r: NodeReport = serde_json::from_slice(&report(&name, seq, ConditionStatus::True))?;
        r.conditions[0].reason = "Latency".into();
        let body = serde_json::to_vec(&r)?;
        if let Ok(mut m) = sent.lock() {
            m.insert(name, Instant::now());
        }
        let (client, url, token) = (client.clone(), url.clone(), tokens[i].clone());
        handles.push(tokio::spawn(async move {
            request(&client, &url, Some(&token), Some(body)).await
        }));
    }
    for h in handles {
        let _ = h.await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    watch.abort();
    let mut l = lat.lock().map(|l| l.clone()).unwrap_or_default();
    l.sort();
    let pct = |p: f64| {
        l.get(((l.len() as f64 * p) as usize).min(l.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    println!(
        "latency at {nodes} nodes, {rate} changes/s: {} of {count} seen; p50 {:?}, p99 {:?}, max {:?}",
        l.len(), pct(0.50), pct(0.99), l.last().copied().unwrap_or_default()
    );
    if arg("--connections", 0) > 0 {
        connections(nodes, ctl.addr.port(), &dir.path().join("ca.pem")).await?;
    }
    ctl.stop().await;
    Ok(())
}

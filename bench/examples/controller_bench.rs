//! Controller benchmark: authenticated reports per second and report → Node condition latency,
//! against the in-process sim API server over real TLS with sim-minted tokens.
//!
//! `cargo run --release --example controller_bench -- [--nodes 5000] [--seconds 10] [--concurrency 64] [--rate 500] [--connections 1] [--window 30] [--transport h1-idle]`
//!
//! Phase 1 (throughput): `concurrency` workers send heartbeats for random nodes as fast as they
//! can for `seconds`; a tenth of the reports change a condition (so the Node is written).
//! Phase 2 (latency): reports flipping a condition are sent at `rate`/s, one per node; a Node
//! watcher records when each change becomes visible; prints p50/p99/max of send → visible.
//! Phase 3 (with `--connections 1`): every node's agent reporting at the default interval (10 s):
//! a child process (this example again, `--agents`) runs `nodes` of the agent's own `Reporter`s,
//! each with its client; the controller's process (this one, without the clients) prints its RSS
//! before and during, the connections open, handshakes/s (resumed or full), its CPU, and the
//! latency of the agents' condition changes (10/s) to a Node watch, over `--window` seconds.
//! `--transport h2-held | h1-held | h2-idle | h1-idle` (default `h1-idle`, the shipped one) picks
//! the report API's transport for the whole run (docs/controller.md "Benchmark");
//! `bench/controller.sh --transports a,b,…` runs several, one process each, in a row.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{arg, cpu_seconds, status_kib};
use futures::future::BoxFuture;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use nodekeeper_core::agent::checks::{CheckResult, ConditionStatus};
use nodekeeper_core::agent::reporter::transport::{http::HttpTransport, Answer, TransportError};
use nodekeeper_core::agent::reporter::ReportTransport;
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
        command_types: vec![],
    };
    serde_json::to_vec(&r).unwrap_or_default()
}

/// The value of `--name VALUE`, or `default`.
fn str_arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| default.to_string())
}

/// `--transport`: the report API's transport, server and agents together.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Transport {
    /// Before: HTTP/2, every agent holds its connection (60 s client idle > heartbeat), pinged.
    H2Held,
    /// HTTP/1.1 only, agents hold their connection (server idle 15 s, client 60 s).
    H1Held,
    /// HTTP/2, agents close after 1 s idle and reconnect with TLS resumption.
    H2Idle,
    /// HTTP/1.1 only, server idle 3 s, agents close after 1 s and reconnect with TLS
    /// resumption: the default.
    H1Idle,
}

impl Transport {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "h2-held" => Transport::H2Held,
            "h1-held" => Transport::H1Held,
            "h2-idle" => Transport::H2Idle,
            "h1-idle" => Transport::H1Idle,
            _ => return None,
        })
    }
    /// `[controller] http2`, `[controller] idle_timeout`, `[report] idle_timeout`.
    fn settings(self) -> (bool, Duration, Duration) {
        let d = ControllerConfig::default().idle_timeout;
        let agent = nodekeeper_core::agent::reporter::ReporterConfig::default().idle_timeout;
        let held = Duration::from_secs(60);
        match self {
            Transport::H2Held => (true, d, held),
            Transport::H1Held => (false, Duration::from_secs(15), held),
            Transport::H2Idle => (true, d, agent),
            Transport::H1Idle => (false, d, agent),
        }
    }
}

/// The time since the Unix epoch in nanoseconds (the same clock in both processes).
fn unix_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// A noticed node's transport (the agent's own HTTPS one): prints `post NODE START_NS END_NS` for
/// the first report that carries the bench's notice, when the reporter began to send it and when
/// the answer came, so the bench's audit splits the notice's delivery into the agent's part (to
/// the POST) and the wire's (the connection, TLS resumption, the controller accepting it).
#[derive(Debug)]
struct Timed {
    inner: HttpTransport,
    node: String,
    printed: AtomicBool,
}

impl ReportTransport for Timed {
    fn post<'a>(
        &'a self,
        token: &'a str,
        body: Vec<u8>,
    ) -> BoxFuture<'a, Result<Answer, TransportError>> {
        const MARK: &[u8] = NOTICE_SOURCE.as_bytes();
        Box::pin(async move {
            let carries = !self.printed.load(Ordering::Relaxed)
                && body.windows(MARK.len()).any(|w| w == MARK);
            let start = unix_ns();
            let out = self.inner.post(token, body).await;
            if carries && !self.printed.swap(true, Ordering::Relaxed) {
                println!("post {} {start} {}", self.node, unix_ns());
            }
            out
        })
    }
}

/// The source of the bench's notices (`NodeEvent::source`).
const NOTICE_SOURCE: &str = "bench/spot";

/// The child of phase 3: `--agents N --port P --dir D --idle-ms I`: N agents' reporters (the
/// agent's own `Reporter`, each with its client, token file and state directory under D, the
/// default 10 s heartbeat, `[report] idle_timeout` I), started spread over one heartbeat; prints
/// `started N` (the agents it runs), then flips one agent's condition status every `--change-ms`
/// (default 100 ms; its message carries the send time, for the parent's watch) until killed.
/// With `--notices K` (bench/scale-real.sh), the agents of nodes `n{F}`…`n{F+K-1}`
/// (`--notice-from F`) each report one spot interruption notice, one every `--notice-ms`
/// (default 200 ms), starting `--notice-delay-s` (default 2) after `started`, or, with
/// `--notice-go FILE`, once FILE exists (the bench's measurement window is open then, however
/// long its earlier phases took); each prints `notice NODE UNIX_NS` (when it was handed to the
/// reporter, as the agent's source does) on stdout, and `post NODE START_NS END_NS` for the
/// report that carried it ([`Timed`]). With `--part fleet` the process runs every agent but the
/// noticing ones, with `--part noticed` those alone (a process of their own beside the fleet's,
/// as each agent has its node's runtime to itself; each process flips the conditions of its own
/// agents only, so the two together make the same changes as one). The agents' setup is the
/// same on the sim and on the real control plane: only the token files differ.
async fn agents(n: usize) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use nodekeeper_core::agent::reporter::{Reporter, ReporterConfig};
    let _ = nodekeeper_core::serve::raise_open_files_limit();
    let port = arg("--port", 0);
    let dir = std::path::PathBuf::from(str_arg("--dir", ""));
    let idle = Duration::from_millis(arg("--idle-ms", 1000));
    let heartbeat = ReporterConfig::default().heartbeat;
    let (notices, from) = (
        arg("--notices", 0) as usize,
        arg("--notice-from", 0) as usize,
    );
    let noticing = |i: usize| (from..from + notices).contains(&i);
    let part = str_arg("--part", "all");
    let hosted = |i: usize| match part.as_str() {
        "fleet" => !noticing(i),
        "noticed" => noticing(i),
        _ => true,
    };
    let stop_all = tokio_util::sync::CancellationToken::new();
    let mut senders = Vec::with_capacity(n);
    let mut keep = Vec::with_capacity(n);
    for i in 0..n {
        if !hosted(i) {
            senders.push(None);
            keep.push(None);
            continue;
        }
        let cfg = ReporterConfig {
            url: format!("https://127.0.0.1:{port}"),
            ca_file: Some(dir.join("ca.pem")),
            server_name: Some(NAME.into()),
            token_file: dir.join("tokens").join(format!("n{i}")),
            idle_timeout: idle,
            ..ReporterConfig::default()
        };
        let state = dir.join("state").join(format!("n{i}"));
        let rep = if noticing(i) {
            let inner = HttpTransport::new(&cfg, &cfg.endpoint())?;
            let timed = Timed {
                inner,
                node: format!("n{i}"),
                printed: AtomicBool::new(false),
            };
            Reporter::with_transport(cfg, &state, Box::new(timed))?
        } else {
            Reporter::new(cfg, &state)?
        };
        let first: NodeReport =
            serde_json::from_slice(&report(&format!("n{i}"), 0, ConditionStatus::False))?;
        let (tx, rx) = tokio::sync::watch::channel(first);
        let (ev_tx, ev_rx) = tokio::sync::mpsc::channel(1);
        let (cmd_tx, cmd_rx) = tokio::sync::mpsc::channel(16);
        let stop = stop_all.child_token();
        let delay = heartbeat.mul_f64(i as f64 / n as f64);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            rep.run(rx, ev_rx, cmd_tx, stop).await
        });
        senders.push(Some(tx));
        keep.push(Some((ev_tx, cmd_rx)));
    }
    tokio::time::sleep(heartbeat + Duration::from_secs(2)).await;
    println!("started {}", senders.iter().flatten().count());
    let notice_every = Duration::from_millis(arg("--notice-ms", 200));
    let notify: Vec<_> = keep
        .iter()
        .enumerate()
        .skip(from)
        .take(notices)
        .filter_map(|(i, k)| k.as_ref().map(|(ev, _)| (i, ev.clone())))
        .collect();
    let notice_delay = Duration::from_secs(arg("--notice-delay-s", 2));
    let notice_go = str_arg("--notice-go", "");
    tokio::spawn(async move {
        use nodekeeper_core::agent::sources::{EventKind, NodeEvent};
        if notice_go.is_empty() {
            tokio::time::sleep(notice_delay).await;
        } else {
            while !std::path::Path::new(&notice_go).exists() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let mut tick = tokio::time::interval(notice_every);
        for (i, ev) in notify {
            tick.tick().await;
            let now = chrono::Utc::now();
            let mut notice =
                NodeEvent::on_node(EventKind::Preemption, NOTICE_SOURCE, &format!("n{i}"), now);
            notice.deadline = Some(now + chrono::Duration::minutes(2));
            println!("notice n{i} {}", unix_ns());
            if ev.send(notice).await.is_err() {
                eprintln!("agent n{i}: reporter gone");
            }
        }
    });
    let mut tick = tokio::time::interval(Duration::from_millis(arg("--change-ms", 100)));
    for k in 0usize.. {
        tick.tick().await;
        let i = k.wrapping_mul(7919) % n;
        // Node i's (k / n)-th change (k ↦ i is a permutation of each run of n: 7919 is prime), so
        // every change flips its status: False (the first report), True, False, …
        let status = if (k / n) % 2 == 0 {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        };
        let Some(sender) = &senders[i] else { continue };
        sender.send_modify(|r| {
            r.conditions[0] = CheckResult::new(
                "NodekeeperDiskPressure",
                status,
                "Latency",
                format!("sent_ns={}", unix_ns()),
            );
        });
    }
    drop(keep);
    Ok(())
}

/// Phase 3: `nodes` agents reporting at the default interval from a child process (their clients
/// and memory are not this process's); this process (controller + sim) measures over `window`
/// seconds its RSS, open connections, handshakes (resumed or full), its CPU, and report → Node
/// condition latency of the changes the agents send (10/s, each on a fresh connection unless
/// the agent holds one).
async fn connections(
    nodes: usize,
    ctl: &nodekeeper_core::controller::Running,
    dir: &std::path::Path,
    tokens: &[String],
    napi: Api<Node>,
    transport: Transport,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use tokio::io::AsyncBufReadExt;
    let window = Duration::from_secs(arg("--window", 30));
    let me = std::process::id();
    std::fs::create_dir_all(dir.join("tokens"))?;
    for (i, t) in tokens.iter().enumerate() {
        std::fs::write(dir.join("tokens").join(format!("n{i}")), t)?;
    }
    // The agents' changes: `sent_ns=` in the message, seen through a watch.
    let lat: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let l2 = lat.clone();
    let watch = tokio::spawn(async move {
        let mut seen = std::collections::HashSet::new();
        let mut st = std::pin::pin!(watcher(napi, watcher::Config::default()).applied_objects());
        while let Some(Ok(n)) = st.next().await {
            let now = unix_ns();
            for c in n.status.and_then(|s| s.conditions).unwrap_or_default() {
                let sent = c
                    .message
                    .as_deref()
                    .and_then(|m| m.strip_prefix("sent_ns="))
                    .and_then(|v| v.parse::<u128>().ok());
                if let Some(sent) = sent.filter(|s| seen.insert(*s)) {
                    if let Ok(mut l) = l2.lock() {
                        l.push(Duration::from_nanos(now.saturating_sub(sent) as u64));
                    }
                }
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = status_kib(me, "VmRSS:");
    let (_, _, agent_idle) = transport.settings();
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .args(["--agents", &nodes.to_string(), "--port"])
        .arg(ctl.addr.port().to_string())
        .arg("--dir")
        .arg(dir)
        .args(["--idle-ms", &agent_idle.as_millis().to_string()])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let out = child.stdout.take().ok_or("no stdout")?;
    let mut lines = tokio::io::BufReader::new(out).lines();
    let started = lines.next_line().await?.unwrap_or_default();
    if let Ok(mut l) = lat.lock() {
        l.clear();
    }
    let conns = &ctl.app.connections;
    let (a0, r0, cpu0, t0) = (
        conns.accepted.load(Ordering::Relaxed),
        conns.resumed.load(Ordering::Relaxed),
        cpu_seconds("self"),
        Instant::now(),
    );
    let (mut rss_max, mut open_sum, mut open_max, mut samples) = (0u64, 0u64, 0u64, 0u64);
    while t0.elapsed() < window {
        tokio::time::sleep(Duration::from_secs(1)).await;
        rss_max = rss_max.max(status_kib(me, "VmRSS:"));
        let open = conns.open.load(Ordering::Relaxed);
        open_sum += open;
        open_max = open_max.max(open);
        samples += 1;
    }
    let secs = t0.elapsed().as_secs_f64();
    let after = status_kib(me, "VmRSS:");
    let accepted = conns.accepted.load(Ordering::Relaxed) - a0;
    let resumed = conns.resumed.load(Ordering::Relaxed) - r0;
    let cpu = cpu_seconds("self") - cpu0;
    child.kill().await?;
    watch.abort();
    let mut l: Vec<f64> = lat
        .lock()
        .map(|l| l.iter().map(|d| d.as_secs_f64() * 1e3).collect())
        .unwrap_or_default();
    l.sort_by(f64::total_cmp);
    let (http2, server_idle, _) = transport.settings();
    println!(
        "agents [{transport:?}: http2 {http2}, server idle {server_idle:?}, agent idle {agent_idle:?}]: {started} agents reporting every 10 s for {secs:.0} s: \
         controller process RSS {:.1} → {:.1} MiB (max {:.1}), +{:.1} MiB = {} KiB per agent; \
         connections open mean {:.0}, max {open_max}; {:.1} handshakes/s ({resumed} of {accepted} resumed); \
         CPU {:.0} millicores (controller + sim, whole process); \
         change → Node condition (watch) {} seen: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        before as f64 / 1024.0,
        after as f64 / 1024.0,
        rss_max as f64 / 1024.0,
        after.saturating_sub(before) as f64 / 1024.0,
        after.saturating_sub(before) / nodes.max(1) as u64,
        open_sum as f64 / samples.max(1) as f64,
        accepted as f64 / secs,
        cpu / secs * 1000.0,
        l.len(),
        common::pct(&l, 0.5),
        common::pct(&l, 0.99),
        l.last().copied().unwrap_or(f64::NAN),
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    if let Some(n) = std::env::args()
        .position(|a| a == "--agents")
        .map(|_| arg("--agents", 0))
    {
        return agents(n as usize).await;
    }
    let transport = Transport::parse(&str_arg("--transport", "h1-idle"))
        .ok_or("--transport: h2-held, h1-held, h2-idle or h1-idle")?;
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
    let napi3 = napi.clone();
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
    (cfg.http2, cfg.idle_timeout, _) = transport.settings();
    let ctl = nodekeeper_core::controller::start(cluster.client.clone(), &cfg).await?;
    while !(ctl.app.ready.load(Ordering::Relaxed) && *ctl.app.leader.borrow()) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (client, url) = pinned(
        &dir.path().join("ca.pem"),
        &format!("https://127.0.0.1:{}/v1/reports", ctl.addr.port()),
    )?;
    let tokens = Arc::new(tokens);
    eprintln!("transport {transport:?}");

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
        drop(client);
        connections(nodes, &ctl, dir.path(), &tokens, napi3, transport).await?;
    }
    ctl.stop().await;
    Ok(())
}

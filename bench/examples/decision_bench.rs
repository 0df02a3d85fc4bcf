//! Decision latency and controller memory at scale: the real `nodekeeper controller` binary (a
//! child process, so its RSS is its own) against the in-process sim with N nodes and M pods.
//!
//! `cargo run --release --example decision_bench -- [--nodes 5000] [--pods-per-node 20]
//!     [--trials 20] [--toleration 10] [--tick-ms 1000] [--idle 10] [--pools 1]`
//!
//! `--pools P` spreads the nodes over P Karpenter NodePools (`karpenter.sh/nodepool`, the default
//! budget group), node k in pool `k % P`, as the real control plane's scale bench does (100
//! pools); with one pool (the default) every node is in one group.
//!
//! `trials` nodes get `Ready=False`, 250 ms apart, through the sim's admin API. For each, the
//! latency is the time from `lastTransitionTime + toleration` (when the repair became due) to
//! the moment a Node watcher sees nodekeeper's `nodekeeper.io/state` annotation on it. Prints
//! p50/p99/max and the controller's RSS (VmRSS and its peak VmHWM) after the trials. Before the
//! trials it waits until the controller has written `nodekeeper.io/seen-ready` on the (all new)
//! nodes, and prints how long that took; then, for `--idle` seconds (default 10) with nothing
//! changing, the controller's CPU and its CPU per reconcile (its tick's view and decision of
//! every node: what a repair that falls due waits for).

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{arg, cpu_seconds, pct, status_kib};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use nodekeeper_sim::apiserver::loops::LoopOptions;
use nodekeeper_sim::apiserver::scenario::Scenario;
use nodekeeper_sim::apiserver::{SimOptions, TestCluster};

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let nodes = arg("--nodes", 5000) as usize;
    let ppn = arg("--pods-per-node", 20) as usize;
    let trials = arg("--trials", 20) as usize;
    let toleration = arg("--toleration", 10);
    let tick_ms = arg("--tick-ms", 1000);
    let idle = arg("--idle", 10);
    let pools = (arg("--pools", 1) as usize).clamp(1, nodes.max(1));
    let t = Instant::now();
    let mut scenario = Scenario::scale(nodes, ppn);
    if pools > 1 {
        let base = scenario.pools[0].clone();
        scenario.pools = (0..pools)
            .map(|p| {
                let mut pool = base.clone();
                pool.name = format!("scale{p}");
                pool.count = nodes / pools + usize::from(p < nodes % pools);
                pool
            })
            .collect();
    }
    let opts = SimOptions {
        loops: LoopOptions::none(),
        scenario,
        ..SimOptions::default()
    };
    let cluster = TestCluster::start(opts).await.expect("sim");
    println!(
        "sim: {nodes} nodes, {} pods seeded in {:.1}s",
        nodes * ppn,
        t.elapsed().as_secs_f64()
    );
    let dir = std::env::temp_dir().join(format!("nk-decision-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let kubeconfig = dir.join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let cfg = dir.join("controller.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"[log]
level = "warn"
[controller]
listen = "127.0.0.1:{port}"
insecure_plain_http = true
staleness = "1h"
[controller.leader]
lease_duration = "5s"
retry_period = "500ms"
[controller.engine]
tick = "{tick_ms}ms"
[controller.oci_events]
enabled = true
token = "bench-token-0123456789"
[sources]
cloud = "none"
[repair]
max_unhealthy = "100%"
[[repair.policy]]
condition_type = "Ready"
condition_status = "False"
toleration = "{toleration}s"
[budgets]
budgets = [{{ nodes = "100%" }}]
"#
        ),
    )
    .expect("config");
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "nodekeeper"}})).unwrap();
    Api::all(cluster.client.clone())
        .create(&Default::default(), &ns)
        .await
        .expect("namespace");
    let exe = std::env::var("NODEKEEPER_BIN")
        .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string() + "/target/release/nodekeeper");
    let mut child = tokio::process::Command::new(&exe)
        .args(["controller", "--config"])
        .arg(&cfg)
        .env("KUBECONFIG", &kubeconfig)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{exe}: {e}"));
    let pid = child.id().expect("pid");
    let http = nodekeeper_core::http::client().unwrap();
    let start = Instant::now();
    loop {
        let ok = http
            .get(format!("http://127.0.0.1:{port}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ok {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "controller not ready"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Leadership: the Lease names a holder.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(cluster.client.clone(), "nodekeeper");
    loop {
        let held = leases
            .list(&Default::default())
            .await
            .map(|l| {
                l.items.iter().any(|l| {
                    l.spec
                        .as_ref()
                        .and_then(|s| s.holder_identity.as_ref())
                        .is_some()
                })
            })
            .unwrap_or(false);
        if held {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "controller ready and leading after {:.1}s; RSS {} KiB",
        start.elapsed().as_secs_f64(),
        status_kib(pid, "VmRSS:")
    );
    // A new cluster: every node is young, so the first reconciles write `seen-ready` on each
    // (once, in its first two minutes). Measure that apart from the steady state below.
    let stamping = Instant::now();
    let nodes_api: Api<Node> = Api::all(cluster.client.clone());
    let (mut stamped, mut last, mut still) = (0, usize::MAX, 0);
    while stamped < nodes && still < 3 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        stamped = nodes_api
            .list(&Default::default())
            .await
            .map(|l| {
                l.items
                    .iter()
                    .filter(|n| {
                        n.metadata
                            .annotations
                            .as_ref()
                            .is_some_and(|a| a.contains_key("nodekeeper.io/seen-ready"))
                    })
                    .count()
            })
            .unwrap_or(0);
        still = if stamped == last { still + 1 } else { 0 };
        last = stamped;
    }
    println!(
        "seen-ready written on {stamped} of {nodes} new nodes in {:.1}s (first start on a new cluster)",
        stamping.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Idle: nothing changes, the engine reconciles at its tick. Its CPU per reconcile is what a
    // repair waits for once due (the view of every node and the decision).
    if idle > 0 {
        let reconciles = || async {
            metric(&http, port, "nodekeeper_engine_reconciles_total")
                .await
                .unwrap_or(f64::NAN)
        };
        let (cpu0, r0) = (cpu_seconds(&pid.to_string()), reconciles().await);
        tokio::time::sleep(Duration::from_secs(idle)).await;
        let (cpu1, r1) = (cpu_seconds(&pid.to_string()), reconciles().await);
        println!(
            "controller idle for {idle}s: CPU {:.0} millicores, {} reconciles, {:.1} ms CPU per reconcile",
            (cpu1 - cpu0) * 1000.0 / idle as f64,
            r1 - r0,
            (cpu1 - cpu0) * 1000.0 / (r1 - r0)
        );
    }
    // Times are wall-clock (UTC): the repair is due at the condition's lastTransitionTime (as
    // the sim stored it, the controller's input) + toleration.
    let seen: Arc<Mutex<HashMap<String, chrono::DateTime<chrono::Utc>>>> = Arc::default();
    let s2 = seen.clone();
    let api: Api<Node> = Api::all(cluster.client.clone());
    tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default()).applied_objects();
        let mut stream = std::pin::pin!(stream);
        while let Some(Ok(n)) = stream.next().await {
            let acting = n
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("nodekeeper.io/state"));
            if acting {
                if let Some(name) = n.metadata.name {
                    s2.lock()
                        .unwrap()
                        .entry(name)
                        .or_insert_with(chrono::Utc::now);
                }
            }
        }
    });
    let mut due: HashMap<String, chrono::DateTime<chrono::Utc>> = HashMap::new();
    for i in 0..trials {
        let node = node_name(i * (nodes / trials.max(1)), pools);
        let body =
            serde_json::json!({"type": "Ready", "status": "False", "reason": "KubeletNotReady"});
        let r = http
            .post(cluster.admin_url(&format!("nodes/{node}/conditions")))
            .json(&body)
            .send()
            .await
            .expect("admin");
        assert!(r.status().is_success(), "{node}: {}", r.status());
        let n: Node = r.json().await.expect("node");
        let since = n
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .and_then(|c| c.last_transition_time)
            .map(|t| chrono::DateTime::from_timestamp(t.0.as_second(), 0).unwrap_or_default())
            .expect("Ready transition time");
        due.insert(node, since + chrono::Duration::seconds(toleration as i64));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let wait_until = Instant::now() + Duration::from_secs(toleration + 30);
    while seen.lock().unwrap().len() < trials && Instant::now() < wait_until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (rss, hwm) = (status_kib(pid, "VmRSS:"), status_kib(pid, "VmHWM:"));
    let acted = seen.lock().unwrap().clone();
    let cordon = notice_to_cordon(&cluster, port, nodes, pools, trials).await;
    let mut lat: Vec<f64> = due
        .iter()
        .filter_map(|(n, d)| {
            acted
                .get(n)
                .map(|s| (*s - *d).num_microseconds().unwrap_or(0) as f64 / 1e6)
        })
        .collect();
    lat.sort_by(|a, b| a.total_cmp(b));
    println!(
        "decision latency after toleration expiry ({} of {trials} nodes acted on): p50 {:.3}s  p99 {:.3}s  max {:.3}s",
        lat.len(),
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        lat.last().copied().unwrap_or(f64::NAN)
    );
    println!(
        "controller RSS {:.1} MiB (peak {:.1} MiB) at {nodes} nodes / {} pods",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0,
        nodes * ppn
    );
    println!(
        "OCI Events preemption notice → taint + cordon visible ({} of {trials} nodes): p50 {:.3}s  p99 {:.3}s  max {:.3}s",
        cordon.len(),
        pct(&cordon, 0.5),
        pct(&cordon, 0.99),
        cordon.last().copied().unwrap_or(f64::NAN)
    );
    let metrics = http
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .unwrap_or_default();
    for l in metrics.lines().filter(|l| {
        [
            "nodekeeper_engine_reconciles_total",
            "nodekeeper_engine_reconcile_seconds",
            "nodekeeper_engine_fast_paths_total",
            "nodekeeper_engine_due_paths_total",
        ]
        .iter()
        .any(|m| l.starts_with(m))
    }) {
        println!("controller: {l}");
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(lat.len(), trials, "some nodes were never acted on");
    assert_eq!(cordon.len(), trials, "some notices were never acted on");
}

/// Posts an OCI Events preemption for `trials` other nodes, 100 ms apart; returns, sorted, the
/// seconds from each POST to the Node watch showing the interruption taint and the cordon.
async fn notice_to_cordon(
    cluster: &TestCluster,
    port: u16,
    nodes: usize,
    pools: usize,
    trials: usize,
) -> Vec<f64> {
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let s2 = seen.clone();
    let api: Api<Node> = Api::all(cluster.client.clone());
    // OCI Events name instances by OCID: give the chosen nodes OCI provider IDs.
    let ocid = |node: &str| format!("ocid1.instance.oc1.phx.bench{node}");
    let chosen: Vec<String> = (0..trials)
        .map(|i| node_name(i * (nodes / trials.max(1)) + 1, pools))
        .collect();
    for node in &chosen {
        let patch = serde_json::json!({"spec": {"providerID": format!("oci://{}", ocid(node))}});
        api.patch(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("providerID");
    }
    // Notices are posted once the watch has listed every node (an earlier notice could land
    // between the list and the watch of a watcher still starting).
    let (listed_tx, listed) = tokio::sync::oneshot::channel();
    let watch = tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default());
        let mut stream = std::pin::pin!(stream);
        let mut listed_tx = Some(listed_tx);
        while let Some(ev) = stream.next().await {
            let n = match ev {
                Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => n,
                Ok(watcher::Event::InitDone) => {
                    if let Some(tx) = listed_tx.take() {
                        let _ = tx.send(());
                    }
                    continue;
                }
                Ok(_) => continue,
                Err(e) => {
                    println!("watch error (the watcher retries): {e}");
                    continue;
                }
            };
            let spec = n.spec.unwrap_or_default();
            let tainted = spec
                .taints
                .unwrap_or_default()
                .iter()
                .any(|t| t.key == "nodekeeper.io/interruption");
            if tainted && spec.unschedulable == Some(true) {
                if let Some(name) = n.metadata.name {
                    s2.lock().unwrap().entry(name).or_insert_with(Instant::now);
                }
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(60), listed)
        .await
        .expect("watch never listed the nodes")
        .expect("watch task ended");
    let http = nodekeeper_core::http::client().unwrap();
    let mut sent: HashMap<String, Instant> = HashMap::new();
    for (i, node) in chosen.into_iter().enumerate() {
        let body = nodekeeper_sim::oci_events::envelope(
            nodekeeper_sim::oci_events::OciEventKind::Preemption,
            &ocid(&node),
            "",
        );
        let t = Instant::now();
        let r = http
            .post(format!(
                "http://127.0.0.1:{port}/v1/oci-events/bench-token-0123456789"
            ))
            .json(&body)
            .send()
            .await
            .expect("oci event");
        let status = r.status();
        let text = r.text().await.unwrap_or_default();
        assert!(status.is_success(), "{node}: {status} {text}");
        if i == 0 {
            println!("OCI event for {node}: {status} {text}");
        }
        sent.insert(node, t);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let end = Instant::now() + Duration::from_secs(30);
    while seen.lock().unwrap().len() < trials && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    watch.abort();
    let seen = seen.lock().unwrap().clone();
    for n in sent.keys().filter(|n| !seen.contains_key(*n)) {
        // Not seen by the watch: say what the Node holds.
        let api: Api<Node> = Api::all(cluster.client.clone());
        if let Ok(node) = api.get(n).await {
            let spec = node.spec.unwrap_or_default();
            println!(
                "{n} not seen tainted + cordoned: unschedulable {:?}, taints {:?}, annotations {:?}",
                spec.unschedulable,
                spec.taints.unwrap_or_default().iter().map(|t| &t.key).collect::<Vec<_>>(),
                node.metadata.annotations.unwrap_or_default().keys().collect::<Vec<_>>()
            );
        }
    }
    let mut order: Vec<(&Instant, f64)> = sent
        .iter()
        .filter_map(|(n, t)| {
            seen.get(n)
                .map(|s| (t, s.saturating_duration_since(*t).as_secs_f64()))
        })
        .collect();
    order.sort_by_key(|(t, _)| **t);
    let line: Vec<String> = order
        .iter()
        .map(|(_, d)| format!("{:.0}", d * 1e3))
        .collect();
    println!(
        "notice → taint + cordon, ms, in the order posted: {}",
        line.join(" ")
    );
    let mut v: Vec<f64> = order.into_iter().map(|(_, d)| d).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

/// The value of the first sample of metric `name` on the controller's `/metrics`.
async fn metric(http: &reqwest::Client, port: u16, name: &str) -> Option<f64> {
    let text = http
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find(|l| l.split([' ', '{']).next() == Some(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The sim's name of node `k` when the nodes are spread over `pools` NodePools.
fn node_name(k: usize, pools: usize) -> String {
    if pools == 1 {
        format!("scale-{k}")
    } else {
        format!("scale{}-{}", k % pools, k / pools)
    }
}

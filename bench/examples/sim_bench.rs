//! Scale benchmark of the sim apiserver: seed N nodes × M pods, then measure RSS, list latency of
//! the pods on one node (over HTTP with kube-rs), and watch fan-out to W watchers at R events/s.
//!
//! `cargo run --release --example sim_bench -- [NODES] [PODS_PER_NODE] [WATCHERS] [EVENTS_PER_SEC]`
//! (defaults 5000 20 10 1000); see bench/sim.sh and docs/dev/sim.md.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use nodekeeper_sim::apiserver::resources::well_known;
use nodekeeper_sim::apiserver::scenario::Scenario;
use nodekeeper_sim::apiserver::store::WriteTarget;
use nodekeeper_sim::apiserver::{loops::LoopOptions, SimOptions, TestCluster};
use serde_json::json;

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() {
    let (nodes, per_node, watchers, rate) = (arg(1, 5000), arg(2, 20), arg(3, 10), arg(4, 1000));
    let rss0 = rss_mib();
    let t0 = Instant::now();
    let opts = SimOptions {
        loops: LoopOptions::none(),
        scenario: Scenario::scale(nodes, per_node),
        ..Default::default()
    };
    let c = TestCluster::start(opts).await.unwrap();
    let seed = t0.elapsed();
    println!(
        "nodes={nodes} pods={} start+seed={:.2}s rss={:.0}MiB (baseline {:.0}MiB)",
        c.sim.store.count(well_known::pods()),
        seed.as_secs_f64(),
        rss_mib(),
        rss0
    );

    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    // Warm-up: connection setup and first-touch page faults are not part of the steady state.
    for i in 0..20 {
        let lp = ListParams::default().fields(&format!("spec.nodeName=scale-{}", (i * 53) % nodes));
        pods.list(&lp).await.unwrap();
    }
    let mut lat = Vec::new();
    for i in 0..1000 {
        let lp = ListParams::default().fields(&format!("spec.nodeName=scale-{}", (i * 37) % nodes));
        let t = Instant::now();
        let l = pods.list(&lp).await.unwrap();
        lat.push(t.elapsed());
        assert_eq!(l.items.len(), per_node);
    }
    lat.sort();
    let ms = |q: usize| lat[(lat.len() * q / 1000).min(lat.len() - 1)].as_secs_f64() * 1e3;
    println!(
        "list pods on one node over HTTP ({} requests): p50={:.2}ms p99={:.2}ms p99.9={:.2}ms max={:.2}ms (load average {})",
        lat.len(),
        ms(500),
        ms(990),
        ms(999),
        ms(1000),
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );
    let t = Instant::now();
    let all = pods.list(&ListParams::default()).await.unwrap();
    println!(
        "list all {} pods over HTTP: {:.0}ms",
        all.items.len(),
        t.elapsed().as_secs_f64() * 1e3
    );

    let rv = c.sim.store.resource_version().to_string();
    let received = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..watchers {
        let pods = pods.clone();
        let rv = rv.clone();
        let received = received.clone();
        tasks.push(tokio::spawn(async move {
            let mut s = pods
                .watch(&WatchParams::default().timeout(290), &rv)
                .await
                .unwrap()
                .boxed();
            while let Some(ev) = s.next().await {
                if let Ok(WatchEvent::Modified(_)) = ev {
                    received.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let secs = 5;
    let total = rate * secs;
    let t = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let per_tick = (rate / 100).max(1);
    let mut sent = 0;
    while sent < total {
        tick.tick().await;
        c.sim.store.txn(|tx| {
            for _ in 0..per_tick {
                let node = sent % nodes;
                let name = format!("filler-scale-{node}-{}", sent % per_node);
                let _ = tx.modify(
                    well_known::pods(),
                    "default",
                    &name,
                    WriteTarget::Internal,
                    |p| {
                        let mut p = p.clone();
                        p["metadata"]["annotations"] = json!({"bench": sent.to_string()});
                        Ok(p)
                    },
                );
                sent += 1;
            }
        });
    }
    let want = (total * watchers) as u64;
    let deadline = Instant::now() + Duration::from_secs(30);
    while received.load(Ordering::Relaxed) < want && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let got = received.load(Ordering::Relaxed);
    println!("watch fan-out: {total} events at {rate}/s to {watchers} watchers: delivered {got}/{want} in {:.2}s (send phase {secs}s)",
        t.elapsed().as_secs_f64());
    println!("final rss={:.0}MiB", rss_mib());
    for t in tasks {
        t.abort();
    }
}

//! Benchmark: how long from a notice becoming visible in the metadata service to the
//! `NodeEvent` being emitted, per source, against the in-process emulators on loopback.
//!
//! - Polling sources (OCI, AWS, Azure): the duration of the poll that sees the notice (request,
//!   parse, dedupe); the wait for that poll is the poll interval (1 s by default) on top.
//! - GCP (long polls): from the change in the emulator to the event leaving the source driver.
//! - `--e2e`: also AWS end to end through the driver at the default 1 s poll interval.
//!
//! Run: `cargo run --release --example imds_latency -- [--iterations N] [--e2e]`
//! (or `bench/imds-latency.sh`).

use std::time::{Duration, Instant};

use nodekeeper_core::agent::sources::config::{NoticeKind, OciPollPath};
use nodekeeper_core::agent::sources::driver::{run, SourceMessage};
use nodekeeper_core::agent::sources::{build, Cloud, EventKind, SourcesConfig};
use nodekeeper_sim::imds::{oci as emu_oci, CancelWhat, ImdsEmulator};
use tokio::sync::mpsc;

fn config(url: &str) -> SourcesConfig {
    let mut cfg = SourcesConfig {
        endpoint: url.to_string(),
        ..SourcesConfig::default()
    };
    cfg.oci.poll_paths = vec![OciPollPath {
        path: emu_oci::PREEMPT_PATH.to_string(),
        kind: NoticeKind::Preemption,
    }];
    cfg
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

fn report(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{name:<34} n={:<4} p50={:>7.3} ms  p99={:>7.3} ms  max={:>7.3} ms",
        samples.len(),
        ms(percentile(&samples, 0.50)),
        ms(percentile(&samples, 0.99)),
        ms(samples.last().copied().unwrap_or_default())
    );
}

type BoxError = Box<dyn std::error::Error>;

async fn polling(cloud: Cloud, n: usize) -> Result<Vec<Duration>, BoxError> {
    let emu = ImdsEmulator::start(cloud, "127.0.0.1:0".parse()?).await?;
    let mut src = build(cloud, &config(&emu.url()))?;
    src.poll().await;
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        emu.preempt(Duration::from_secs(120));
        let t = Instant::now();
        let out = src.poll().await;
        let took = t.elapsed();
        if out.events.len() != 1 || out.events[0].kind != EventKind::Preemption {
            return Err(format!(
                "{cloud}: expected one preemption, got {:?} {:?}",
                out.events, out.errors
            )
            .into());
        }
        samples.push(took);
        emu.cancel(CancelWhat::All);
        src.poll().await;
    }
    Ok(samples)
}

async fn through_driver(
    cloud: Cloud,
    n: usize,
    interval: Duration,
) -> Result<Vec<Duration>, BoxError> {
    let emu = ImdsEmulator::start(cloud, "127.0.0.1:0".parse()?).await?;
    let src = build(cloud, &config(&emu.url()))?;
    let (tx, mut rx) = mpsc::channel(16);
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(run(src, interval, Duration::from_secs(5), tx, stop.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await; // first answers are in, long polls waiting
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        // Spread injections over the poll phase.
        tokio::time::sleep(Duration::from_millis(37 * (i as u64 % 27))).await;
        emu.preempt(Duration::from_secs(30));
        let t = Instant::now();
        wait_for(&mut rx, |k| *k == EventKind::Preemption).await?;
        samples.push(t.elapsed());
        emu.cancel(CancelWhat::All);
        wait_for(&mut rx, |k| matches!(k, EventKind::Cancelled { .. })).await?;
    }
    stop.cancel();
    task.await?;
    Ok(samples)
}

async fn wait_for(
    rx: &mut mpsc::Receiver<SourceMessage>,
    want: impl Fn(&EventKind) -> bool,
) -> Result<(), BoxError> {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await? {
            Some(SourceMessage::Event(e)) if want(&e.kind) => return Ok(()),
            Some(SourceMessage::Event(_)) => {}
            Some(SourceMessage::Error { error, .. }) => return Err(error.into()),
            None => return Err("driver stopped".into()),
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let n = args
        .iter()
        .position(|a| a == "--iterations")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    println!("notice visible -> NodeEvent emitted ({n} iterations, loopback emulators)");
    for cloud in [Cloud::Oci, Cloud::Aws, Cloud::Azure] {
        report(
            &format!("{cloud}: poll that sees the notice"),
            polling(cloud, n).await?,
        );
    }
    report(
        "gcp: change -> event (long poll)",
        through_driver(Cloud::Gcp, n.min(200), Duration::from_secs(1)).await?,
    );
    if args.iter().any(|a| a == "--e2e") {
        let samples = through_driver(Cloud::Aws, 20, Duration::from_secs(1)).await?;
        report("aws: inject -> event, 1 s interval", samples);
    }
    Ok(())
}

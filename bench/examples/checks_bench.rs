//! Cost of the health checks on this machine: time per run of each check, and CPU time and wall
//! time of one full debounced round (all checks), plus peak RSS. Not a timed test: run it with
//! `bench/checks.sh` and record the figures in docs/checks.md.
//!
//! ```text
//! cargo run --release --example checks_bench -- [--rounds N] [--bus unix:path=...] [--host-root DIR]
//! ```
//! Without `--bus` the systemd check is left out (no system bus on a build box).

#![allow(clippy::unwrap_used)] // a benchmark binary, not agent code

use std::sync::Arc;
use std::time::{Duration, Instant};

use nodekeeper_core::agent::checks::config::ChecksConfig;
use nodekeeper_core::agent::checks::disk::DiskCheck;
use nodekeeper_core::agent::checks::kmsg::KmsgCheck;
use nodekeeper_core::agent::checks::memory::MemoryCheck;
use nodekeeper_core::agent::checks::pids::PidsCheck;
use nodekeeper_core::agent::checks::systemd_unit::SystemdUnitCheck;
use nodekeeper_core::agent::checks::{Checks, HealthCheck, HostRoot};
use nodekeeper_core::agent::host::systemd::Systemd;

/// utime + stime of this process, in seconds (clock ticks of 10 ms).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

fn status_kib(key: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with(key)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

async fn time_check(check: &mut dyn HealthCheck, rounds: usize) -> Duration {
    check.check().await.unwrap(); // warm-up (opens /dev/kmsg, connects)
    let t = Instant::now();
    for _ in 0..rounds {
        check.check().await.unwrap();
    }
    t.elapsed() / rounds as u32
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds: usize = arg(&args, "--rounds").map_or(2000, |r| r.parse().unwrap());
    let bus = arg(&args, "--bus");
    let mut cfg = ChecksConfig::default();
    if let Some(root) = arg(&args, "--host-root") {
        cfg.host_root = root.into();
    }
    let host = HostRoot::new(&cfg.host_root);
    let systemd = match &bus {
        Some(addr) => Some(Arc::new(Systemd::connect_address(addr).await.unwrap())),
        None => None,
    };

    println!("rounds per figure: {rounds}");
    println!("{:<10} {:>12}", "check", "wall/run");
    let mut per: Vec<(&str, Box<dyn HealthCheck>)> = vec![
        (
            "memory",
            Box::new(MemoryCheck::new(cfg.memory.clone(), &host)),
        ),
        ("disk", Box::new(DiskCheck::new(cfg.disk.clone(), &host))),
        ("pids", Box::new(PidsCheck::new(cfg.pids.clone(), &host))),
        ("kmsg", Box::new(KmsgCheck::new(cfg.kmsg.clone()))),
    ];
    if let Some(s) = &systemd {
        per.push((
            "systemd",
            Box::new(SystemdUnitCheck::new(cfg.systemd.clone(), s.clone())),
        ));
    }
    for (name, check) in &mut per {
        let d = time_check(check.as_mut(), rounds).await;
        println!("{name:<10} {:>9.1} µs", d.as_secs_f64() * 1e6);
    }

    let mut checks = match &systemd {
        Some(s) => Checks::from_config_with(&cfg, s.clone()),
        None => {
            cfg.systemd.enabled = false;
            Checks::from_config(&cfg)
        }
    };
    checks.run_once(Instant::now()).await;
    let (cpu0, t0) = (cpu_seconds(), Instant::now());
    let mut conditions = 0;
    for _ in 0..rounds {
        conditions = checks.run_once(Instant::now()).await.conditions.len();
    }
    let wall = t0.elapsed() / rounds as u32;
    let cpu = (cpu_seconds() - cpu0) / rounds as f64;
    println!(
        "full round ({} checks, {conditions} conditions): wall {:.1} µs, CPU {:.1} µs",
        checks.names().len(),
        wall.as_secs_f64() * 1e6,
        cpu * 1e6
    );
    println!("at one round per second: {:.3} millicores", cpu * 1000.0);
    println!(
        "RSS now {} KiB, peak {} KiB",
        status_kib("VmRSS:"),
        status_kib("VmHWM:")
    );
}

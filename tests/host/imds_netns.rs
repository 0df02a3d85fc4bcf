//! The metadata sources at the real address, 169.254.169.254, inside a private network
//! namespace: the outer test re-runs this test binary under
//! `unshare -n sh -c 'ip link set lo up; ip addr add 169.254.169.254/32 dev lo; exec …'` with
//! only the inner test selected. Inside, `nodekeeper sim imds` serves each cloud on
//! 169.254.169.254:80 and the sources (default endpoint, auto-detection) read it. Nothing is
//! ever sent to 169.254.169.254 from the host namespace: the inner test refuses to run unless
//! that address is local (bound to the namespace's loopback).
#![allow(clippy::unwrap_used)]

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nodekeeper_core::agent::sources::config::{CloudChoice, NoticeKind, OciPollPath};
use nodekeeper_core::agent::sources::{build, poll_once, Cloud, EventKind, SourcesConfig};

use crate::support::netns;

const INNER: &str = "inner_sources_at_169_254_169_254";

#[test]
#[ignore = "needs root (unshare -n)"]
fn sources_at_the_real_address_in_a_netns() {
    assert!(
        netns::is_root(),
        "needs root for `unshare -n`: run as root, as CI does, or leave out `--include-ignored`"
    );
    let stdout = netns::run_inner(&crate::support::test_name(module_path!(), INNER));
    assert!(stdout.contains("netns: all four clouds ok"), "{stdout}");
}

/// A child process killed (by its PID) and reaped when dropped, also when an assertion fails.
struct Emulator(Child);

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `nodekeeper sim imds` on 169.254.169.254:80 and waits until it accepts connections.
fn start_emulator(cloud: Cloud) -> Emulator {
    let child = Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args([
            "sim",
            "imds",
            "--cloud",
            cloud.as_str(),
            "--listen",
            "169.254.169.254:80",
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let child = Emulator(child);
    let addr: SocketAddr = "169.254.169.254:80".parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
        assert!(Instant::now() < deadline, "{cloud} emulator did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

#[tokio::test]
#[ignore = "runs inside a network namespace, started by sources_at_the_real_address_in_a_netns"]
async fn inner_sources_at_169_254_169_254() {
    if !netns::is_child() {
        eprintln!("{INNER}: a helper, only run by sources_at_the_real_address_in_a_netns");
        return;
    }
    netns::assert_inside();
    let no_dmi = tempfile::tempdir().unwrap();
    for cloud in Cloud::ALL {
        let child = start_emulator(cloud);
        let mut cfg = SourcesConfig {
            cloud: CloudChoice::Auto,
            host_root: no_dmi.path().to_path_buf(),
            ..Default::default()
        };
        assert_eq!(
            cfg.endpoint, "http://169.254.169.254",
            "the default endpoint is used"
        );
        cfg.gcp.long_poll_timeout = Duration::from_secs(2);
        cfg.oci.poll_paths = vec![OciPollPath {
            path: nodekeeper_sim::imds::oci::PREEMPT_PATH.to_string(),
            kind: NoticeKind::Preemption,
        }];

        let report = poll_once(&cfg).await;
        assert_eq!(
            report.cloud,
            Some(cloud),
            "auto-detection: {:?}",
            report.errors
        );
        assert!(
            report.identity.is_some() && report.errors.is_empty(),
            "{cloud}: {:?}",
            report.errors
        );
        assert!(report.events.is_empty());

        let mut src = build(cloud, &cfg).unwrap();
        let admin = nodekeeper_core::http::plain_builder()
            .unwrap()
            .no_proxy()
            .build()
            .unwrap();
        let r = admin
            .post("http://169.254.169.254/admin/preempt")
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let mut preemptions = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        while preemptions == 0 {
            assert!(Instant::now() < deadline, "{cloud}: no preemption event");
            let out = tokio::time::timeout(Duration::from_secs(5), src.poll())
                .await
                .unwrap();
            assert!(out.errors.is_empty(), "{cloud}: {:?}", out.errors);
            preemptions += out
                .events
                .iter()
                .filter(|e| e.kind == EventKind::Preemption)
                .count();
        }
        assert_eq!(preemptions, 1, "{cloud}");
        drop(child);
        println!("netns: {cloud} ok");
    }
    println!("netns: all four clouds ok");
}

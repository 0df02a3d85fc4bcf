//! `host::systemd::Systemd` against a real systemd (PID 1 in a systemd-nspawn container), over the
//! container's system bus: restarts tracked to their job, failed starts, unknown units, a missing
//! bus and restart timeouts.
#![allow(clippy::unwrap_used)]

use crate::support as common;

use std::time::{Duration, Instant};

use common::nspawn::NspawnNode;
use nodekeeper_core::agent::host::systemd::{ServiceProxy, Systemd, SystemdError, UnitManager};

const CRIO: &str = "crio.service";
const T: Duration = Duration::from_secs(30);

async fn connect(node: &NspawnNode) -> Systemd {
    Systemd::connect_address(&node.bus_address()).await.unwrap()
}

/// (ActiveEnterTimestamp, MainPID) of `unit`.
async fn enter_and_pid(systemd: &Systemd, unit: &str) -> (u64, u32) {
    let proxy = systemd.unit(unit).await.unwrap();
    let enter = proxy.active_enter_timestamp().await.unwrap();
    let service = ServiceProxy::builder(systemd.connection())
        .path(proxy.inner().path().to_owned())
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await
        .unwrap();
    (enter, service.main_pid().await.unwrap())
}

#[tokio::test]
#[ignore = "needs root (systemd-nspawn)"]
async fn restart_of_crio_is_done_and_leaves_it_running_with_a_new_process() {
    let Some(node) = NspawnNode::boot("restart").await else {
        return;
    };
    let systemd = connect(&node).await;
    let before = systemd.status(CRIO).await.unwrap();
    assert_eq!(
        (
            before.load_state.as_str(),
            before.active_state.as_str(),
            before.sub_state.as_str()
        ),
        ("loaded", "active", "running")
    );
    let (enter_before, pid_before) = enter_and_pid(&systemd, CRIO).await;
    assert_ne!(pid_before, 0);

    let outcome = systemd.restart(CRIO, T).await.unwrap();
    assert_eq!(outcome.job_result, "done");
    assert!(outcome.succeeded(), "{outcome:?}");
    assert_eq!(
        (
            outcome.status.active_state.as_str(),
            outcome.status.sub_state.as_str()
        ),
        ("active", "running")
    );
    // A manual restart is not an automatic one: NRestarts stays, the process and timestamp change.
    assert_eq!(outcome.status.n_restarts, before.n_restarts);
    let (enter_after, pid_after) = enter_and_pid(&systemd, CRIO).await;
    assert!(
        enter_after > enter_before,
        "ActiveEnterTimestamp {enter_before} -> {enter_after}"
    );
    assert_ne!(pid_after, pid_before);
    // The container's own systemctl agrees.
    assert_eq!(
        node.exec_ok(&["systemctl", "is-active", CRIO]).trim(),
        "active"
    );
}

#[tokio::test]
#[ignore = "needs root (systemd-nspawn)"]
async fn a_dropin_the_stand_in_crio_refuses_makes_the_job_fail_and_the_unit_failed() {
    let Some(node) = NspawnNode::boot("broken").await else {
        return;
    };
    let systemd = connect(&node).await;
    let broken = node.dropin_dir().join("99-broken.conf");
    std::fs::write(&broken, "BROKEN = true\n").unwrap();

    let outcome = systemd.restart(CRIO, T).await.unwrap();
    assert_eq!(outcome.job_result, "failed", "{outcome:?}");
    assert!(!outcome.succeeded());
    assert_eq!(outcome.status.active_state, "failed");
    assert_eq!(systemd.status(CRIO).await.unwrap().active_state, "failed");

    // Restoring the previous files and restarting again brings it back.
    std::fs::remove_file(&broken).unwrap();
    let outcome = systemd.restart(CRIO, T).await.unwrap();
    assert!(outcome.succeeded(), "{outcome:?}");
}

#[tokio::test]
#[ignore = "needs root (systemd-nspawn)"]
async fn unknown_units_are_no_such_unit_for_status_and_restart() {
    let Some(node) = NspawnNode::boot("unknown").await else {
        return;
    };
    let systemd = connect(&node).await;
    let unit = "no-such-thing.service";
    match systemd.status(unit).await {
        Err(SystemdError::NoSuchUnit { unit: u }) => assert_eq!(u, unit),
        other => panic!("expected NoSuchUnit, got {other:?}"),
    }
    match systemd.restart(unit, T).await {
        Err(e @ SystemdError::NoSuchUnit { .. }) => assert_eq!(
            e.to_string(),
            "systemd unit no-such-thing.service not found"
        ),
        other => panic!("expected NoSuchUnit, got {other:?}"),
    }
    // An existing but never started unit is found through LoadUnit.
    let slow = systemd.status("slow.service").await.unwrap();
    assert_eq!(
        (slow.load_state.as_str(), slow.active_state.as_str()),
        ("loaded", "inactive")
    );
}

#[tokio::test]
#[ignore = "needs root (systemd-nspawn)"]
async fn a_restart_that_outlasts_its_timeout_is_a_timeout_error() {
    let Some(node) = NspawnNode::boot("timeout").await else {
        return;
    };
    let systemd = connect(&node).await;
    let started = Instant::now();
    let timeout = Duration::from_millis(1500);
    match systemd.restart("slow.service", timeout).await {
        Err(e @ SystemdError::Timeout { .. }) => {
            assert_eq!(
                e.to_string(),
                "systemd restart of unit slow.service did not finish within 1s 500ms"
            );
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed >= timeout && elapsed < Duration::from_secs(5),
        "took {elapsed:?}"
    );
    // systemd is still working on it (ExecStartPre sleeps 20 s).
    let status = systemd.status("slow.service").await.unwrap();
    assert_eq!(
        (status.active_state.as_str(), status.sub_state.as_str()),
        ("activating", "start-pre")
    );
}

#[tokio::test]
async fn a_missing_bus_is_a_connect_error_naming_the_address() {
    let dir = tempfile::tempdir().unwrap();
    let address = format!("unix:path={}/no_bus_here", dir.path().display());
    match Systemd::connect_address(&address).await {
        Err(e @ SystemdError::Connect { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.starts_with(&format!(
                    "cannot connect to the system D-Bus at {address}: "
                )),
                "{msg}"
            );
        }
        other => panic!(
            "expected Connect error, got {:?}",
            other.map(|_| "connected")
        ),
    }
}

/// Run in a child process by `connect_system_honours_dbus_system_bus_address` (the variable is
/// set only in that child, so parallel tests never see it).
#[tokio::test]
#[ignore = "helper: run in a child process by connect_system_honours_dbus_system_bus_address"]
async fn helper_connect_system() {
    if std::env::var_os("NK_HELPER").is_none() {
        eprintln!("helper_connect_system: a helper, only meaningful when run by its parent test");
        return;
    }
    let systemd = Systemd::connect_system()
        .await
        .unwrap_or_else(|e| panic!("NK-HELPER error: {e}"));
    let status = systemd.status(CRIO).await.unwrap();
    println!("NK-HELPER crio {}", status.active_state);
}

#[tokio::test]
#[ignore = "needs root (systemd-nspawn)"]
async fn connect_system_honours_dbus_system_bus_address() {
    let Some(node) = NspawnNode::boot("sysbus").await else {
        return;
    };
    let bus = node.bus_address();
    let out = crate::support::run_helper(
        module_path!(),
        "helper_connect_system",
        &[("DBUS_SYSTEM_BUS_ADDRESS", std::ffi::OsStr::new(&bus))],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("NK-HELPER crio active"), "{stdout}");

    // And a bad variable yields the Connect error naming that address.
    let out = crate::support::run_helper(
        module_path!(),
        "helper_connect_system",
        &[(
            "DBUS_SYSTEM_BUS_ADDRESS",
            std::ffi::OsStr::new("unix:path=/nonexistent/nk_socket"),
        )],
    );
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success());
    assert!(
        all.contains("NK-HELPER error: cannot connect to the system D-Bus at unix:path=/nonexistent/nk_socket: "),
        "{all}"
    );
}

#[tokio::test]
#[ignore = "needs root (systemd-nspawn)"]
async fn reset_failed_lifts_the_start_limit_that_refuses_a_good_restart() {
    let Some(node) = NspawnNode::boot("startlimit").await else {
        return;
    };
    let systemd = connect(&node).await;
    let broken = node.dropin_dir().join("99-broken.conf");
    std::fs::write(&broken, "BROKEN = true\n").unwrap();
    // Boot + 4 failed starts = 5 starts in 10 s (the default StartLimitBurst).
    for _ in 0..4 {
        assert_eq!(systemd.restart(CRIO, T).await.unwrap().job_result, "failed");
    }
    std::fs::remove_file(&broken).unwrap();
    // The files are good again, but systemd refuses the sixth start.
    let refused = systemd.restart(CRIO, T).await.unwrap();
    assert!(!refused.succeeded(), "{refused:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !node
        .journal()
        .contains("crio.service: Start request repeated too quickly.")
    {
        assert!(Instant::now() < deadline, "{refused:?}\n{}", node.journal());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    systemd.reset_failed(CRIO).await.unwrap();
    let outcome = systemd.restart(CRIO, T).await.unwrap();
    assert!(outcome.succeeded(), "{outcome:?}");
    assert!(matches!(
        systemd.reset_failed("no-such-thing.service").await,
        Err(SystemdError::NoSuchUnit { .. })
    ));
}

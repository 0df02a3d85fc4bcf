//! The systemd unit check against a real systemd (PID 1 in a systemd-nspawn container), over the
//! container's system bus: active units, a stopped unit, a failed start, a crash loop counted by
//! `NRestarts`, and an unknown unit.

#![allow(clippy::unwrap_used)] // tests may unwrap (project rules)

use crate::support as common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::nspawn::NspawnNode;
use nodekeeper_core::agent::checks::config::{SystemdConfig, UnitCheckConfig};
use nodekeeper_core::agent::checks::systemd_unit::SystemdUnitCheck;
use nodekeeper_core::agent::checks::{CheckOutput, ConditionStatus, HealthCheck};
use nodekeeper_core::agent::host::systemd::Systemd;

fn cond(out: &CheckOutput, t: &str) -> (ConditionStatus, String, String) {
    let c = out
        .conditions
        .iter()
        .find(|c| c.condition_type == t)
        .unwrap_or_else(|| panic!("no {t}: {out:?}"));
    (c.status, c.reason.clone(), c.message.clone())
}

/// Polls the check until `t` has `reason` (systemd state changes are asynchronous).
async fn wait_reason(check: &mut SystemdUnitCheck<Systemd>, t: &str, reason: &str) -> CheckOutput {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = check.check().await.unwrap();
        if cond(&out, t).1 == reason || Instant::now() > deadline {
            return out;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
#[ignore = "needs root (systemd-nspawn)"]
async fn unit_check_against_real_systemd() {
    let Some(node) = NspawnNode::boot("checks").await else {
        return;
    };
    let systemd = Arc::new(Systemd::connect_address(&node.bus_address()).await.unwrap());
    let mut units = SystemdConfig::default().units;
    units.push(UnitCheckConfig {
        name: "nodekeeper-absent.service".into(),
        condition_type: "AbsentUnhealthy".into(),
    });
    let cfg = SystemdConfig {
        units,
        max_restarts: 3,
        restart_window: Duration::from_secs(60),
        ..Default::default()
    };
    let mut check = SystemdUnitCheck::new(cfg, systemd);

    // both stand-ins run after boot; an unknown unit is Unknown
    let out = wait_reason(&mut check, "NodekeeperKubeletUnhealthy", "UnitActive").await;
    let (st, reason, msg) = cond(&out, "NodekeeperKubeletUnhealthy");
    assert_eq!(
        (st, reason.as_str()),
        (ConditionStatus::False, "UnitActive"),
        "{msg}"
    );
    assert!(
        msg.starts_with(
            "kubelet.service: LoadState=loaded ActiveState=active SubState=running NRestarts=0"
        ),
        "{msg}"
    );
    assert_eq!(
        cond(&out, "NodekeeperContainerRuntimeUnhealthy").1,
        "UnitActive"
    );
    assert_eq!(cond(&out, "AbsentUnhealthy").0, ConditionStatus::Unknown);
    assert_eq!(cond(&out, "AbsentUnhealthy").1, "UnitNotFound");

    // a crash loop: Restart=always, killed three times → NRestarts grows by 3 → FrequentRestarts
    node.exec_ok(&["mkdir", "-p", "/run/systemd/system/kubelet.service.d"]);
    node.exec_ok(&["sh", "-c", "printf '[Unit]\\nStartLimitIntervalSec=0\\n[Service]\\nRestart=always\\nRestartSec=100ms\\n' > /run/systemd/system/kubelet.service.d/10-restart.conf"]);
    node.exec_ok(&["systemctl", "daemon-reload"]);
    for i in 1..=3u32 {
        node.exec_ok(&["systemctl", "kill", "--signal=KILL", "kubelet.service"]);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = check.check().await.unwrap();
            let msg = cond(&out, "NodekeeperKubeletUnhealthy").2;
            if msg.contains(&format!(
                "ActiveState=active SubState=running NRestarts={i} "
            )) {
                break;
            }
            assert!(Instant::now() < deadline, "restart {i} not seen: {msg}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let out = check.check().await.unwrap();
    let (st, reason, msg) = cond(&out, "NodekeeperKubeletUnhealthy");
    assert_eq!(
        (st, reason.as_str()),
        (ConditionStatus::True, "FrequentRestarts"),
        "{msg}"
    );
    assert!(msg.contains("NRestarts=3 (+3 in the last 1m)"), "{msg}");

    // stopped by hand → inactive
    node.exec_ok(&["systemctl", "stop", "kubelet.service"]);
    let out = wait_reason(&mut check, "NodekeeperKubeletUnhealthy", "UnitNotActive").await;
    let (st, reason, msg) = cond(&out, "NodekeeperKubeletUnhealthy");
    assert_eq!(
        (st, reason.as_str()),
        (ConditionStatus::True, "UnitNotActive"),
        "{msg}"
    );
    assert!(msg.contains("ActiveState=inactive SubState=dead"), "{msg}");

    // a start that fails for real → failed
    std::fs::write(node.dropin_dir().join("99-broken.conf"), "BROKEN\n").unwrap();
    let _ = node.exec(&["systemctl", "restart", "crio.service"]);
    let out = wait_reason(
        &mut check,
        "NodekeeperContainerRuntimeUnhealthy",
        "UnitFailed",
    )
    .await;
    let (st, reason, msg) = cond(&out, "NodekeeperContainerRuntimeUnhealthy");
    assert_eq!(
        (st, reason.as_str()),
        (ConditionStatus::True, "UnitFailed"),
        "{msg}"
    );
    assert!(msg.contains("ActiveState=failed SubState=failed"), "{msg}");
    assert!(out.problems.is_empty(), "{:?}", out.problems);
}

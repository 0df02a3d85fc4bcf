//! The systemd unit check with the scripted `FakeUnitManager`.

#![allow(clippy::unwrap_used)] // tests may unwrap (project rules)

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nodekeeper_core::agent::checks::config::{
    ChecksConfig, DiskConfig, KmsgConfig, MemoryConfig, PidsConfig, SystemdConfig,
};
use nodekeeper_core::agent::checks::debounce::FlapConfig;
use nodekeeper_core::agent::checks::systemd_unit::SystemdUnitCheck;
use nodekeeper_core::agent::checks::{CheckOutput, Checks, ConditionStatus, HealthCheck};
use nodekeeper_core::agent::host::fake::FakeUnitManager;
use nodekeeper_core::agent::host::systemd::{
    RestartOutcome, SystemdError, UnitManager, UnitStatus,
};

fn status(active: &str, sub: &str, n_restarts: u32) -> UnitStatus {
    UnitStatus {
        load_state: "loaded".into(),
        active_state: active.into(),
        sub_state: sub.into(),
        n_restarts,
    }
}

/// The fake has no setter: a scripted restart outcome is how a unit's status changes.
async fn set(fake: &FakeUnitManager, unit: &str, s: UnitStatus) {
    fake.push_restart(Ok(RestartOutcome {
        job_result: "done".into(),
        status: s,
    }));
    fake.restart(unit, Duration::from_secs(1)).await.unwrap();
}

fn cond(out: &CheckOutput, t: &str) -> (ConditionStatus, String, String) {
    let c = out
        .conditions
        .iter()
        .find(|c| c.condition_type == t)
        .unwrap_or_else(|| panic!("no {t}: {out:?}"));
    (c.status, c.reason.clone(), c.message.clone())
}

struct FakeClock(Mutex<Instant>);

impl FakeClock {
    fn advance(&self, d: Duration) {
        *self.0.lock().unwrap() += d;
    }
}

fn setup() -> (
    Arc<FakeUnitManager>,
    Arc<FakeClock>,
    SystemdUnitCheck<FakeUnitManager>,
) {
    let fake = Arc::new(
        FakeUnitManager::new()
            .with_unit("kubelet.service", status("active", "running", 0))
            .with_unit("crio.service", status("active", "running", 2)),
    );
    let clock = Arc::new(FakeClock(Mutex::new(Instant::now())));
    let c = clock.clone();
    let check = SystemdUnitCheck::new(SystemdConfig::default(), fake.clone())
        .with_clock(Arc::new(move || *c.0.lock().unwrap()));
    (fake, clock, check)
}

#[tokio::test]
async fn unit_states_map_to_conditions() {
    let (fake, _clock, mut check) = setup();
    assert_eq!(
        check.condition_types(),
        [
            "NodekeeperKubeletUnhealthy",
            "NodekeeperContainerRuntimeUnhealthy"
        ]
    );
    let out = check.check().await.unwrap();
    let (st, reason, msg) = cond(&out, "NodekeeperKubeletUnhealthy");
    assert_eq!(
        (st, reason.as_str()),
        (ConditionStatus::False, "UnitActive")
    );
    assert_eq!(msg, "kubelet.service: LoadState=loaded ActiveState=active SubState=running NRestarts=0 (+0 in the last 10m)");
    assert_eq!(
        cond(&out, "NodekeeperContainerRuntimeUnhealthy").1,
        "UnitActive"
    );

    let cases = [
        (
            status("failed", "failed", 0),
            ConditionStatus::True,
            "UnitFailed",
        ),
        (
            status("activating", "auto-restart", 0),
            ConditionStatus::True,
            "UnitNotActive",
        ),
        (
            status("inactive", "dead", 0),
            ConditionStatus::True,
            "UnitNotActive",
        ),
        (
            UnitStatus {
                load_state: "masked".into(),
                ..status("inactive", "dead", 0)
            },
            ConditionStatus::True,
            "UnitNotLoaded",
        ),
        (
            status("active", "running", 0),
            ConditionStatus::False,
            "UnitActive",
        ),
    ];
    for (s, want_status, want_reason) in cases {
        set(&fake, "kubelet.service", s.clone()).await;
        let out = check.check().await.unwrap();
        let (st, reason, msg) = cond(&out, "NodekeeperKubeletUnhealthy");
        assert_eq!(
            (st, reason.as_str()),
            (want_status, want_reason),
            "{s:?}: {msg}"
        );
        assert!(
            msg.contains(&format!(
                "ActiveState={} SubState={}",
                s.active_state, s.sub_state
            )),
            "{msg}"
        );
        assert_eq!(
            cond(&out, "NodekeeperContainerRuntimeUnhealthy").1,
            "UnitActive",
            "other unit unaffected"
        );
    }
}

#[tokio::test]
async fn nrestarts_growth_within_the_window() {
    let (fake, clock, mut check) = setup();
    check.check().await.unwrap(); // baseline NRestarts=2 for crio
    for (after, n, want) in [
        (60, 3, "UnitActive"),
        (60, 4, "UnitActive"),
        (60, 5, "FrequentRestarts"),
    ] {
        clock.advance(Duration::from_secs(after));
        set(&fake, "crio.service", status("active", "running", n)).await;
        let out = check.check().await.unwrap();
        let (_, reason, msg) = cond(&out, "NodekeeperContainerRuntimeUnhealthy");
        assert_eq!(reason, want, "NRestarts={n}: {msg}");
    }
    let out = check.check().await.unwrap();
    assert!(cond(&out, "NodekeeperContainerRuntimeUnhealthy")
        .2
        .contains("NRestarts=5 (+3 in the last 10m)"));
    // ten quiet minutes later the old restarts have left the window
    clock.advance(Duration::from_secs(601));
    let out = check.check().await.unwrap();
    assert_eq!(
        cond(&out, "NodekeeperContainerRuntimeUnhealthy").0,
        ConditionStatus::False
    );
}

#[tokio::test]
async fn unknown_unit_is_unknown_not_an_error() {
    let fake = Arc::new(
        FakeUnitManager::new().with_unit("kubelet.service", status("active", "running", 0)),
    );
    let mut check = SystemdUnitCheck::new(SystemdConfig::default(), fake);
    let out = check.check().await.unwrap();
    let (st, reason, msg) = cond(&out, "NodekeeperContainerRuntimeUnhealthy");
    assert_eq!(
        (st, reason.as_str()),
        (ConditionStatus::Unknown, "UnitNotFound")
    );
    assert_eq!(msg, "systemd has no unit crio.service");
    assert!(out.problems.is_empty());
}

#[tokio::test]
async fn query_failure_is_unknown_and_a_problem() {
    struct Broken;
    impl UnitManager for Broken {
        async fn status(&self, unit: &str) -> Result<UnitStatus, SystemdError> {
            Err(SystemdError::Call {
                unit: unit.into(),
                method: "GetUnit",
                source: zbus::Error::Failure("bus gone".into()),
            })
        }
        async fn restart(
            &self,
            unit: &str,
            timeout: Duration,
        ) -> Result<RestartOutcome, SystemdError> {
            Err(SystemdError::Timeout {
                unit: unit.into(),
                timeout,
            })
        }
    }
    let mut check = SystemdUnitCheck::new(SystemdConfig::default(), Arc::new(Broken));
    let out = check.check().await.unwrap();
    let (st, reason, msg) = cond(&out, "NodekeeperKubeletUnhealthy");
    assert_eq!(
        (st, reason.as_str()),
        (ConditionStatus::Unknown, "UnitQueryFailed")
    );
    assert!(
        msg.contains("GetUnit on unit kubelet.service failed") && msg.contains("bus gone"),
        "{msg}"
    );
    assert_eq!(out.problems.len(), 2);
}

#[tokio::test]
async fn runner_debounces_unit_conditions() {
    let fake = Arc::new(
        FakeUnitManager::new()
            .with_unit("kubelet.service", status("active", "running", 0))
            .with_unit("crio.service", status("active", "running", 0)),
    );
    let cfg = ChecksConfig {
        memory: MemoryConfig {
            enabled: false,
            ..Default::default()
        },
        disk: DiskConfig {
            enabled: false,
            ..Default::default()
        },
        pids: PidsConfig {
            enabled: false,
            ..Default::default()
        },
        kmsg: KmsgConfig {
            enabled: false,
            ..Default::default()
        },
        systemd: SystemdConfig {
            flap: FlapConfig::new(2, Duration::ZERO),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut checks = Checks::from_config_with(&cfg, fake.clone());
    assert_eq!(checks.names(), ["systemd"]);
    let t0 = Instant::now();
    let r = checks.run_once(t0).await;
    assert!(
        r.conditions
            .iter()
            .all(|c| c.status == ConditionStatus::False),
        "{r:?}"
    );
    // a restart blip (one round activating) does not flip the condition
    set(&fake, "kubelet.service", status("activating", "start", 0)).await;
    let r = checks.run_once(t0 + Duration::from_secs(10)).await;
    assert_eq!(r.conditions[0].status, ConditionStatus::False);
    set(&fake, "kubelet.service", status("active", "running", 0)).await;
    let r = checks.run_once(t0 + Duration::from_secs(20)).await;
    assert_eq!(r.conditions[0].status, ConditionStatus::False);
    // a failure that persists does
    set(&fake, "kubelet.service", status("failed", "failed", 0)).await;
    checks.run_once(t0 + Duration::from_secs(30)).await;
    let r = checks.run_once(t0 + Duration::from_secs(40)).await;
    assert_eq!(
        (r.conditions[0].status, r.conditions[0].reason.as_str()),
        (ConditionStatus::True, "UnitFailed")
    );
}

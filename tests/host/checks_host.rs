//! Health checks against this machine and against a crafted host root.

#![allow(clippy::unwrap_used)] // tests may unwrap (project rules)

use std::path::Path;
use std::time::{Duration, Instant};

use nodekeeper_core::agent::checks::config::{
    ByteSize, ChecksConfig, DiskConfig, KmsgConfig, MemoryConfig, PidsConfig, SystemdConfig,
};
use nodekeeper_core::agent::checks::debounce::FlapConfig;
use nodekeeper_core::agent::checks::disk::{stat_path, DiskCheck, PathState};
use nodekeeper_core::agent::checks::memory::MemoryCheck;
use nodekeeper_core::agent::checks::pids::PidsCheck;
use nodekeeper_core::agent::checks::{CheckError, Checks, ConditionStatus, HealthCheck, HostRoot};

fn find<'a>(
    round: &'a nodekeeper_core::agent::checks::Round,
    t: &str,
) -> &'a nodekeeper_core::agent::checks::CheckResult {
    round
        .conditions
        .iter()
        .find(|c| c.condition_type == t)
        .unwrap_or_else(|| panic!("no {t} in {round:?}"))
}

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn meminfo(total_kb: u64, avail_kb: u64) -> String {
    format!("MemTotal:       {total_kb} kB\nMemFree:        1000 kB\nMemAvailable:   {avail_kb} kB\nBuffers:        10 kB\n")
}

/// A host root with proc files and a `data` directory for the disk check.
fn fake_host() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "proc/meminfo", &meminfo(8 << 20, 4 << 20));
    write(d.path(), "proc/loadavg", "0.10 0.20 0.30 2/100 4242\n");
    write(d.path(), "proc/sys/kernel/pid_max", "1000\n");
    write(d.path(), "proc/sys/kernel/threads-max", "5000\n");
    std::fs::create_dir_all(d.path().join("data")).unwrap();
    d
}

fn fake_config(root: &Path, flap: FlapConfig) -> ChecksConfig {
    ChecksConfig {
        host_root: root.to_path_buf(),
        memory: MemoryConfig {
            min_available_bytes: ByteSize(0),
            min_available_percent: 10.0,
            flap,
            ..Default::default()
        },
        pids: PidsConfig {
            max_used_percent: 50.0,
            flap,
            ..Default::default()
        },
        // thresholds off: `/data` lives on the build box's own disk, whose fill is not ours
        disk: DiskConfig {
            paths: vec!["/data".into(), "/missing".into()],
            min_free_percent: 0.0,
            min_free_inodes_percent: 0.0,
            flap,
            ..Default::default()
        },
        kmsg: KmsgConfig {
            enabled: false,
            ..Default::default()
        },
        systemd: SystemdConfig {
            enabled: false,
            ..Default::default()
        },
        ..Default::default()
    }
}

#[tokio::test]
async fn memory_on_this_machine_is_sane() {
    let mut c = MemoryCheck::new(MemoryConfig::default(), &HostRoot::default());
    let out = c.check().await.expect("meminfo readable");
    assert_eq!(out.conditions.len(), 1);
    let r = &out.conditions[0];
    assert_ne!(r.status, ConditionStatus::Unknown);
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    let m = nodekeeper_core::agent::checks::memory::parse_meminfo(&text).unwrap();
    assert!(m.total > 64 << 20, "total {} bytes", m.total);
    assert!(m.available > 0 && m.available <= m.total, "{m:?}");
    assert!(r.message.starts_with("MemAvailable "), "{}", r.message);
}

#[tokio::test]
async fn pids_on_this_machine_are_sane() {
    let c = PidsCheck::new(PidsConfig::default(), &HostRoot::default());
    let u = c.read().expect("readable");
    let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(u.limit <= pid_max && u.limit >= 300, "{u:?}");
    // at least this test's process and threads exist; far fewer than the limit on an idle box
    let procs = std::fs::read_dir("/proc").unwrap().filter(|e| {
        e.as_ref().is_ok_and(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
    });
    let nprocs = procs.count() as u64;
    assert!(
        u.used >= nprocs / 2 && u.used >= 2,
        "used {} vs {nprocs} processes",
        u.used
    );
    assert!(u.used < u.limit, "{u:?}");
    let r = c.evaluate(u);
    assert_eq!(r.status, ConditionStatus::False, "{r:?}");
}

#[tokio::test]
async fn disk_on_this_machine_is_sane() {
    let PathState::Usage(u) = stat_path(Path::new("/")) else {
        panic!("statvfs / failed")
    };
    assert!(u.total_bytes > 0 && u.free_bytes <= u.total_bytes, "{u:?}");
    assert!(
        u.free_inodes <= u.total_inodes || u.total_inodes == 0,
        "{u:?}"
    );
    assert_eq!(
        stat_path(Path::new("/definitely/not/here")),
        PathState::NotFound
    );
    let cfg = DiskConfig {
        paths: vec!["/".into()],
        min_free_percent: 0.0,
        min_free_inodes_percent: 0.0,
        ..Default::default()
    };
    let mut c = DiskCheck::new(cfg, &HostRoot::default());
    let out = c.check().await.expect("disk check");
    assert_eq!(out.conditions.len(), 2);
    assert!(
        out.conditions
            .iter()
            .all(|r| r.status == ConditionStatus::False),
        "{:?}",
        out.conditions
    );
    // with a 100% free threshold / is always low
    let cfg = DiskConfig {
        paths: vec!["/".into()],
        min_free_percent: 100.0,
        ..Default::default()
    };
    let out = DiskCheck::new(cfg, &HostRoot::default())
        .check()
        .await
        .expect("disk check");
    assert_eq!(
        out.conditions[0].status,
        ConditionStatus::True,
        "{:?}",
        out.conditions[0]
    );
    assert_eq!(out.conditions[0].reason, "DiskSpaceLow");
}

#[tokio::test]
async fn default_config_round_on_this_machine() {
    let cfg = ChecksConfig {
        kmsg: KmsgConfig {
            enabled: false,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut checks = Checks::from_config(&cfg);
    assert_eq!(checks.names(), ["memory", "disk", "pids", "systemd"]);
    let round = checks.run_once(Instant::now()).await;
    assert_eq!(round.conditions.len(), 6, "{:?}", round.conditions);
    assert_ne!(
        find(&round, "NodekeeperMemoryPressure").status,
        ConditionStatus::Unknown
    );
    assert_ne!(
        find(&round, "NodekeeperPIDPressure").status,
        ConditionStatus::Unknown
    );
    // this build box has no system bus: the unit conditions are Unknown with the reason why
    if std::env::var_os("DBUS_SYSTEM_BUS_ADDRESS").is_none()
        && !Path::new("/run/dbus/system_bus_socket").exists()
    {
        for t in [
            "NodekeeperKubeletUnhealthy",
            "NodekeeperContainerRuntimeUnhealthy",
        ] {
            let c = find(&round, t);
            assert_eq!(
                (c.status, c.reason.as_str()),
                (ConditionStatus::Unknown, "CheckFailed")
            );
            assert!(
                c.message.contains("cannot connect to the system D-Bus"),
                "{}",
                c.message
            );
        }
        let failed: Vec<&str> = round.failures.iter().map(|f| f.check.as_str()).collect();
        assert_eq!(failed, ["systemd"]);
        assert!(
            matches!(round.failures[0].error, CheckError::Systemd { .. }),
            "{:?}",
            round.failures[0]
        );
    } else {
        eprintln!("NOTE: a system bus exists here; not asserting the no-bus path");
    }
    let disk = find(&round, "NodekeeperDiskPressure");
    // low space on "/" outranks a missing path: which one this box shows depends on how full it is
    let PathState::Usage(root) = stat_path(Path::new("/")) else {
        panic!("statvfs /")
    };
    let root_low = (root.free_bytes as f64 * 100.0 / root.total_bytes as f64)
        < DiskConfig::default().min_free_percent;
    if root_low {
        assert_eq!(
            (disk.status, disk.reason.as_str()),
            (ConditionStatus::True, "DiskSpaceLow"),
            "{disk:?}"
        );
    }
    // the default paths /var/lib/containers and /var/lib/kubelet do not exist on this build box
    for p in ["/var/lib/containers", "/var/lib/kubelet"] {
        if !Path::new(p).exists() {
            if !root_low {
                assert_eq!(disk.status, ConditionStatus::Unknown, "{disk:?}");
                assert_eq!(disk.reason, "DiskPathNotFound");
            }
            assert!(
                disk.message.contains(&format!("{p}: path not found")),
                "{}",
                disk.message
            );
        }
    }
}

#[tokio::test]
async fn fake_host_root_drives_thresholds_both_ways_through_the_flap_guard() {
    let host = fake_host();
    let root = host.path();
    let mut checks = Checks::from_config(&fake_config(root, FlapConfig::new(2, Duration::ZERO)));
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);

    let r = checks.run_once(at(0)).await;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(
        find(&r, "NodekeeperMemoryPressure").status,
        ConditionStatus::False
    );
    assert_eq!(
        find(&r, "NodekeeperPIDPressure").status,
        ConditionStatus::False
    );
    assert_eq!(
        find(&r, "NodekeeperPIDPressure").message,
        "100 of 1000 PIDs in use (10.0%); threshold 50%"
    );
    let disk = find(&r, "NodekeeperDiskPressure");
    assert_eq!(
        (disk.status, disk.reason.as_str()),
        (ConditionStatus::Unknown, "DiskPathNotFound")
    );
    assert!(disk.message.contains(&format!(
        "/missing: path not found under host root {}",
        root.display()
    )));

    // memory and PIDs go bad: the first bad round is absorbed, the second flips
    write(root, "proc/meminfo", &meminfo(8 << 20, 100 << 10));
    write(root, "proc/loadavg", "0.10 0.20 0.30 2/600 4242\n");
    let r = checks.run_once(at(10)).await;
    assert_eq!(
        find(&r, "NodekeeperMemoryPressure").status,
        ConditionStatus::False
    );
    assert_eq!(
        find(&r, "NodekeeperPIDPressure").status,
        ConditionStatus::False
    );
    let r = checks.run_once(at(20)).await;
    let mem = find(&r, "NodekeeperMemoryPressure");
    assert_eq!(
        (mem.status, mem.reason.as_str()),
        (ConditionStatus::True, "MemoryAvailableLow")
    );
    assert!(mem.message.contains("(1.2%)"), "{}", mem.message);
    assert_eq!(find(&r, "NodekeeperPIDPressure").reason, "PIDUsageHigh");

    // threads-max lower than pid_max bounds the limit
    write(root, "proc/sys/kernel/threads-max", "700\n");
    let r = checks.run_once(at(25)).await;
    assert!(find(&r, "NodekeeperPIDPressure")
        .message
        .starts_with("600 of 700 PIDs"));

    // back to normal: needs two rounds again
    write(root, "proc/meminfo", &meminfo(8 << 20, 4 << 20));
    let r = checks.run_once(at(30)).await;
    assert_eq!(
        find(&r, "NodekeeperMemoryPressure").status,
        ConditionStatus::True
    );
    let r = checks.run_once(at(40)).await;
    assert_eq!(
        find(&r, "NodekeeperMemoryPressure").status,
        ConditionStatus::False
    );
    assert_eq!(
        find(&r, "NodekeeperMemoryPressure").reason,
        "MemoryAvailableOk"
    );
}

#[tokio::test]
async fn malformed_or_missing_proc_files_give_typed_errors_and_unknown() {
    let host = fake_host();
    let root = host.path();
    let mut checks = Checks::from_config(&fake_config(root, FlapConfig::new(1, Duration::ZERO)));
    write(root, "proc/meminfo", "MemTotal: lots\n");
    std::fs::remove_file(root.join("proc/sys/kernel/pid_max")).unwrap();
    let r = checks.run_once(Instant::now()).await;
    let mem = find(&r, "NodekeeperMemoryPressure");
    assert_eq!(
        (mem.status, mem.reason.as_str()),
        (ConditionStatus::Unknown, "CheckFailed")
    );
    assert!(
        mem.message.contains("proc/meminfo") && mem.message.contains("not a number"),
        "{}",
        mem.message
    );
    let pids = find(&r, "NodekeeperPIDPressure");
    assert_eq!(pids.status, ConditionStatus::Unknown);
    assert!(pids.message.contains("pid_max"), "{}", pids.message);
    let names: Vec<&str> = r.failures.iter().map(|f| f.check.as_str()).collect();
    assert_eq!(names, ["memory", "pids"]);
    assert!(
        matches!(r.failures[0].error, CheckError::Parse { .. }),
        "{:?}",
        r.failures[0]
    );
    assert!(
        matches!(r.failures[1].error, CheckError::Read { .. }),
        "{:?}",
        r.failures[1]
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["failures"][0]["check"], "memory");
    assert_eq!(json["conditions"][0]["status"], "Unknown");
}

/// A check that never finishes is reported Unknown after the timeout, and the round goes on.
#[tokio::test]
async fn a_hung_check_times_out() {
    struct Hang;
    impl HealthCheck for Hang {
        fn name(&self) -> &str {
            "hang"
        }
        fn condition_types(&self) -> Vec<String> {
            vec!["HangCondition".into()]
        }
        fn check(&mut self) -> nodekeeper_core::agent::checks::CheckFuture<'_> {
            Box::pin(async {
                std::future::pending::<()>().await;
                unreachable!()
            })
        }
    }
    let host = fake_host();
    let mut checks = Checks::new(
        vec![(Box::new(Hang), FlapConfig::new(1, Duration::ZERO))],
        Duration::from_millis(50),
    );
    checks.push(
        Box::new(MemoryCheck::new(
            MemoryConfig::default(),
            &HostRoot::new(host.path()),
        )),
        FlapConfig::default(),
    );
    let r = checks.run_once(Instant::now()).await;
    let h = find(&r, "HangCondition");
    assert_eq!(
        (h.status, h.reason.as_str()),
        (ConditionStatus::Unknown, "CheckFailed")
    );
    assert_eq!(h.message, "check hang failed: did not finish within 50ms");
    assert_eq!(r.failures.len(), 1, "{:?}", r.failures);
    assert!(matches!(
        r.failures[0].error,
        CheckError::Timeout { ref check, .. } if check == "hang"
    ));
    assert_eq!(
        find(&r, "NodekeeperMemoryPressure").status,
        ConditionStatus::False
    );
}

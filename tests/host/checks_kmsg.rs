//! The kernel-log check against a file, a FIFO and the real `/dev/kmsg`.

#![allow(clippy::unwrap_used)] // tests may unwrap (project rules)

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nodekeeper_core::agent::checks::config::{
    ChecksConfig, DiskConfig, KmsgConfig, KmsgRule, MemoryConfig, PidsConfig, RuleKind,
    SystemdConfig,
};
use nodekeeper_core::agent::checks::kmsg::KmsgCheck;
use nodekeeper_core::agent::checks::{
    CheckError, CheckOutput, Checks, ConditionStatus, EventSeverity, HealthCheck,
};

fn append(path: &Path, lines: &[&str]) {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .unwrap();
    for l in lines {
        writeln!(f, "{l}").unwrap();
    }
}

fn kmsg_cfg(path: &Path, replay: bool) -> KmsgConfig {
    KmsgConfig {
        path: path.to_path_buf(),
        replay_conditions: replay,
        ..Default::default()
    }
}

fn reasons(out: &CheckOutput) -> Vec<&str> {
    out.events.iter().map(|e| e.reason.as_str()).collect()
}

fn status(out: &CheckOutput, t: &str) -> (ConditionStatus, String) {
    let c = out
        .conditions
        .iter()
        .find(|c| c.condition_type == t)
        .unwrap_or_else(|| panic!("no {t}"));
    (c.status, c.reason.clone())
}

const OLD: &[&str] = &[
    "6,1,100,-;Linux version 6.1.0",
    "3,2,200,-;Out of memory: Killed process 11 (old)",
    "3,3,300,-;EXT4-fs error (device sda1): Remounting filesystem read-only",
];

#[tokio::test]
async fn file_source_starts_at_the_end() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("kmsg");
    append(&path, OLD);
    let mut c = KmsgCheck::new(kmsg_cfg(&path, false));
    assert_eq!(
        c.condition_types(),
        ["NodekeeperKernelDeadlock", "NodekeeperReadonlyFilesystem"]
    );
    let out = c.check().await.unwrap();
    assert!(
        out.events.is_empty(),
        "old lines replayed: {:?}",
        out.events
    );
    assert_eq!(
        status(&out, "NodekeeperReadonlyFilesystem"),
        (ConditionStatus::False, "NoKernelLogMatch".into())
    );

    append(
        &path,
        &[
            "6,4,400,-;Out of memory: Killed process 4242 (stress) total-vm:10kB",
            "6,5,500,-;eth0: link up",
        ],
    );
    let out = c.check().await.unwrap();
    assert_eq!(reasons(&out), ["OOMKilling"]);
    assert_eq!(
        out.events[0].message,
        "Out of memory: Killed process 4242 (stress) total-vm:10kB"
    );
    assert_eq!(out.events[0].severity, EventSeverity::Warning);
    // events are reported once
    assert!(c.check().await.unwrap().events.is_empty());

    append(
        &path,
        &["3,6,600,-;EXT4-fs (sdb1): Remounting filesystem read-only"],
    );
    let out = c.check().await.unwrap();
    assert!(out.events.is_empty());
    assert_eq!(
        status(&out, "NodekeeperReadonlyFilesystem"),
        (ConditionStatus::True, "FilesystemIsReadOnly".into())
    );
    // permanent: still True later
    let out = c.check().await.unwrap();
    assert_eq!(
        status(&out, "NodekeeperReadonlyFilesystem").0,
        ConditionStatus::True
    );
    assert!(
        out.conditions[1].message.contains("sdb1"),
        "{:?}",
        out.conditions
    );
}

#[tokio::test]
async fn replay_restores_conditions_but_not_events() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("kmsg");
    append(&path, OLD);
    let mut c = KmsgCheck::new(kmsg_cfg(&path, true));
    let out = c.check().await.unwrap();
    assert!(out.events.is_empty(), "{:?}", out.events);
    assert_eq!(
        status(&out, "NodekeeperReadonlyFilesystem"),
        (ConditionStatus::True, "FilesystemIsReadOnly".into())
    );
    append(
        &path,
        &["3,7,700,-;Buffer I/O error on dev sdc, logical block 7"],
    );
    assert_eq!(reasons(&c.check().await.unwrap()), ["IOError"]);
}

#[tokio::test]
async fn malformed_records_are_reported_and_skipped() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("kmsg");
    append(&path, &[]);
    let mut c = KmsgCheck::new(kmsg_cfg(&path, false));
    c.check().await.unwrap();
    append(
        &path,
        &[
            "garbage without separator",
            "x,y,z;Out of memory: Killed process 1",
            " SUBSYSTEM=block",
            "6,9,900,-;Out of memory: Killed process 2 (ok)",
        ],
    );
    let out = c.check().await.unwrap();
    assert_eq!(reasons(&out), ["OOMKilling"]);
    assert_eq!(out.problems.len(), 1, "{:?}", out.problems);
    let CheckError::Parse { message, .. } = &out.problems[0] else {
        panic!("{:?}", out.problems)
    };
    assert!(
        message.starts_with("2 malformed record(s) skipped; first: no `;`"),
        "{message}"
    );
}

#[tokio::test]
async fn custom_rules_and_missing_source() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("kmsg");
    let cfg = KmsgConfig {
        default_rules: false,
        rules: vec![
            KmsgRule {
                pattern: r"NETDEV WATCHDOG: \S+".into(),
                kind: RuleKind::Event,
                condition_type: None,
                reason: "TxTimeout".into(),
                severity: EventSeverity::Normal,
            },
            KmsgRule {
                pattern: r"unregister_netdevice: waiting for \w+".into(),
                kind: RuleKind::Condition,
                condition_type: Some("NetdeviceStuck".into()),
                reason: "UnregisterNetDevice".into(),
                severity: EventSeverity::Warning,
            },
            KmsgRule {
                pattern: r"(unclosed".into(),
                kind: RuleKind::Event,
                condition_type: None,
                reason: "Broken".into(),
                severity: EventSeverity::Warning,
            },
        ],
        ..kmsg_cfg(&path, false)
    };
    let mut c = KmsgCheck::new(cfg);
    assert_eq!(c.condition_types(), ["NetdeviceStuck"]);
    // the source does not exist yet: a typed error naming it, and the check retries later
    let err = c.check().await.expect_err("missing source");
    assert!(
        matches!(&err, CheckError::Kmsg { path: p, .. } if *p == path),
        "{err:?}"
    );
    append(&path, &[]);
    let out = c.check().await.unwrap();
    assert_eq!(
        out.problems.len(),
        1,
        "the broken rule is reported: {:?}",
        out.problems
    );
    assert!(
        out.problems[0]
            .to_string()
            .contains("rule `Broken` skipped"),
        "{}",
        out.problems[0]
    );
    append(
        &path,
        &[
            "4,1,1,-;NETDEV WATCHDOG: eth0 (ixgbe): transmit queue 0 timed out",
            "0,2,2,-;unregister_netdevice: waiting for lo to become free",
        ],
    );
    let out = c.check().await.unwrap();
    assert_eq!(reasons(&out), ["TxTimeout"]);
    assert_eq!(out.events[0].severity, EventSeverity::Normal);
    assert_eq!(
        status(&out, "NetdeviceStuck"),
        (ConditionStatus::True, "UnregisterNetDevice".into())
    );
    assert!(out.problems.is_empty());
}

#[tokio::test]
async fn fifo_source_with_split_writes() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("kmsg.fifo");
    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let mut c = KmsgCheck::new(kmsg_cfg(&path, false));
    // no writer yet: nothing, no blocking
    let out = c.check().await.unwrap();
    assert!(out.events.is_empty());
    let mut w = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    w.write_all(b"6,1,1,-;INFO: task kworker/0:1:77 blocked for more than 120 seconds.\n3,2,2,-;Buffer I/O err").unwrap();
    w.flush().unwrap();
    let out = c.check().await.unwrap();
    assert_eq!(
        reasons(&out),
        ["TaskHung"],
        "the partial second record waits"
    );
    w.write_all(b"or on dev sda1\n").unwrap();
    let out = c.check().await.unwrap();
    assert_eq!(reasons(&out), ["IOError"]);
    assert_eq!(out.events[0].message, "Buffer I/O error on dev sda1");
    drop(w);
    assert!(
        c.check().await.unwrap().events.is_empty(),
        "writer gone: EOF, no error"
    );
}

#[tokio::test]
async fn event_flood_is_capped_in_a_round() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("kmsg");
    append(&path, &[]);
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
        systemd: SystemdConfig {
            enabled: false,
            ..Default::default()
        },
        kmsg: KmsgConfig {
            max_events_per_round: 10,
            ..kmsg_cfg(&path, false)
        },
        ..Default::default()
    };
    let mut checks = Checks::from_config(&cfg);
    assert_eq!(checks.names(), ["kmsg"]);
    checks.run_once(Instant::now()).await;
    let lines: Vec<String> = (0..500)
        .map(|i| format!("6,{i},{i},-;Out of memory: Killed process {i} (p)"))
        .collect();
    append(&path, &lines.iter().map(String::as_str).collect::<Vec<_>>());
    let r = checks.run_once(Instant::now()).await;
    assert_eq!(r.events.len(), 11);
    assert_eq!(r.events[10].reason, "KernelEventsDropped");
    assert!(
        r.events[10].message.starts_with("490 more"),
        "{}",
        r.events[10].message
    );
    assert_eq!(r.conditions.len(), 2);
}

/// Writes to the real kernel log and sees the record come back through the check.
#[tokio::test]
#[ignore = "needs root (writes /dev/kmsg)"]
async fn real_dev_kmsg() {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "needs root to write /dev/kmsg: run as root, as CI does, or leave out `--include-ignored`"
    );
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let token = format!("nodekeeper-test-{}-{nanos}", std::process::id());
    let rules = vec![
        KmsgRule {
            pattern: format!(r"{token}: event \d+"),
            kind: RuleKind::Event,
            condition_type: None,
            reason: "NodekeeperTestEvent".into(),
            severity: EventSeverity::Warning,
        },
        KmsgRule {
            pattern: format!(r"{token}: sticky"),
            kind: RuleKind::Condition,
            condition_type: Some("NodekeeperTestCondition".into()),
            reason: "NodekeeperTestSticky".into(),
            severity: EventSeverity::Warning,
        },
    ];
    let cfg = KmsgConfig {
        path: PathBuf::from("/dev/kmsg"),
        default_rules: false,
        rules,
        replay_conditions: false,
        ..Default::default()
    };
    let mut c = KmsgCheck::new(cfg.clone());
    let first = c.check().await.expect("/dev/kmsg readable as root");
    assert!(first.events.is_empty());
    let write = |msg: &str| std::fs::write("/dev/kmsg", format!("<3>{msg}\n")).unwrap();
    write(&format!("{token}: event 1"));
    write(&format!("{token}: sticky"));
    let t0 = Instant::now();
    let out = c.check().await.unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "non-blocking read took {:?}",
        t0.elapsed()
    );
    assert_eq!(reasons(&out), ["NodekeeperTestEvent"], "{:?}", out.events);
    assert!(
        out.events[0]
            .message
            .ends_with(&format!("{token}: event 1")),
        "{}",
        out.events[0].message
    );
    assert_eq!(
        status(&out, "NodekeeperTestCondition"),
        (ConditionStatus::True, "NodekeeperTestSticky".into())
    );
    assert!(
        c.check().await.unwrap().events.is_empty(),
        "each record once"
    );

    // a fresh check with replay finds the condition in the buffer but re-emits no event
    let mut replay = KmsgCheck::new(KmsgConfig {
        replay_conditions: true,
        ..cfg.clone()
    });
    let out = replay.check().await.unwrap();
    assert!(out.events.is_empty(), "{:?}", out.events);
    assert_eq!(
        status(&out, "NodekeeperTestCondition").0,
        ConditionStatus::True
    );
    // and without replay it does not
    let mut fresh = KmsgCheck::new(cfg);
    assert_eq!(
        status(&fresh.check().await.unwrap(), "NodekeeperTestCondition").0,
        ConditionStatus::False
    );
}

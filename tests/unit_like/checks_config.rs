//! `[checks]` in the configuration file: defaults, a full example, and located errors.

#![allow(clippy::unwrap_used)] // tests may unwrap (project rules)

use std::path::Path;
use std::time::Duration;

use crate::support::config::{errors, load};
use nodekeeper_core::agent::checks::config::{ByteSize, RuleKind};

const FULL: &str = r#"
[checks]
host_root = "/host"
interval = "5s"
check_timeout = "2s"

[checks.memory]
min_available_bytes = "512MiB"
min_available_percent = 7.5
flap = { count = 2, for = "30s" }

[checks.disk]
paths = ["/", "/var/lib/kubelet"]
min_free_bytes = 1073741824
min_free_inodes_percent = 3

[checks.pids]
enabled = false

[checks.kmsg]
path = "/dev/kmsg"
default_rules = false

[[checks.kmsg.rule]]
pattern = 'NETDEV WATCHDOG: \S+'
kind = "event"
reason = "TxTimeout"
severity = "Normal"

[[checks.kmsg.rule]]
pattern = "unregister_netdevice: waiting for"
kind = "condition"
condition_type = "NetdeviceStuck"
reason = "UnregisterNetDevice"
"#;

#[test]
fn full_example_parses() {
    let c = load(FULL).expect("valid").config.agent.checks;
    assert_eq!(c.host_root, Path::new("/host"));
    assert_eq!(c.interval, Duration::from_secs(5));
    assert_eq!(c.memory.min_available_bytes, ByteSize(512 << 20));
    assert_eq!(c.memory.flap.count, 2);
    assert_eq!(c.memory.flap.duration, Duration::from_secs(30));
    assert_eq!(c.disk.min_free_bytes, ByteSize(1 << 30));
    assert_eq!(c.disk.min_free_percent, 10.0, "default kept");
    assert!(!c.pids.enabled);
    assert_eq!(c.kmsg.rules.len(), 2);
    assert_eq!(c.kmsg.rules[1].kind, RuleKind::Condition);
    // the printed config reads back the same
    let again = load(&load(FULL).unwrap().config.to_redacted_toml()).expect("round trip");
    assert_eq!(again.config.agent.checks, c);
}

#[test]
fn empty_file_enables_all_checks_with_defaults() {
    let c = load("").expect("valid").config.agent.checks;
    assert!(c.memory.enabled && c.disk.enabled && c.pids.enabled && c.kmsg.enabled);
    assert_eq!(c.disk.paths.len(), 3);
    assert_eq!(c.memory.condition_type, "NodekeeperMemoryPressure");
}

#[test]
fn bad_regex_is_located_at_its_pattern() {
    let text =
        "[[checks.kmsg.rule]]\nkind = \"event\"\nreason = \"Bad\"\npattern = \"task (unclosed\"\n";
    let e = errors(text);
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("c.toml:4:11: error: invalid regular expression: unclosed group ["),
        "{e:?}"
    );
    assert!(e[0].contains("checks.kmsg.rule[0].pattern"), "{e:?}");
}

#[test]
fn semantic_errors_are_all_reported_with_locations() {
    let text = "[checks]\nhost_root = \"host\"\n[checks.memory]\ncondition_type = \"MemoryPressure\"\nflap = { count = 0 }\n[checks.disk]\nmin_free_percent = 120.0\npaths = [\"/\", \"relative\"]\n[[checks.kmsg.rule]]\npattern = \"x\"\nkind = \"condition\"\nreason = \"not camel\"\n";
    let e = errors(text);
    let has =
        |prefix: &str, word: &str| e.iter().any(|l| l.starts_with(prefix) && l.contains(word));
    assert!(has("c.toml:2:13: error:", "absolute"), "{e:?}");
    assert!(has("c.toml:4:18: error:", "owned by the kubelet"), "{e:?}");
    assert!(has("c.toml:5:18: error:", "at least 1"), "{e:?}");
    assert!(has("c.toml:7:20: error:", "percentage"), "{e:?}");
    assert!(
        has("c.toml:8:15: error:", "`relative` must be an absolute path"),
        "{e:?}"
    );
    assert!(has("c.toml:9:", "needs `condition_type`"), "{e:?}");
    assert!(has("c.toml:12:10: error:", "CamelCase"), "{e:?}");
    assert_eq!(e.len(), 7, "{e:?}");
}

#[test]
fn unknown_keys_and_bad_sizes_are_refused() {
    let e = errors("[checks.memory]\nthreshold = 5\n");
    assert!(
        e[0].starts_with("c.toml:2:1: error: unknown field `threshold`"),
        "{e:?}"
    );
    let e = errors("[checks.memory]\nmin_available_bytes = \"lots\"\n");
    assert!(
        e[0].starts_with("c.toml:2:") && e[0].contains("`lots` is not a size"),
        "{e:?}"
    );
    let e = errors("[checks.kmsg]\n[[checks.kmsg.rule]]\npattern = \"x\"\nkind = \"sometimes\"\nreason = \"X\"\n");
    assert!(
        e.iter()
            .any(|l| l.starts_with("c.toml:4:8: error: unknown variant `sometimes`")),
        "{e:?}"
    );
}

#[test]
fn runtime_check_is_off_by_default_and_validated() {
    let c = load("").expect("valid").config.agent.checks;
    assert!(!c.runtime.enabled);
    assert_eq!(c.runtime.socket, Path::new("/run/crio/crio.sock"));
    assert_eq!(
        c.runtime.condition_type,
        "NodekeeperContainerRuntimeUnreachable"
    );
    let errs =
        errors("[checks.runtime]\nenabled = true\nsocket = \"run/crio.sock\"\ntimeout = \"0s\"\n");
    assert!(
        errs.iter()
            .any(|e| e.contains("must be an absolute path") && e.contains("checks.runtime.socket")),
        "{errs:?}"
    );
    assert!(
        errs.iter()
            .any(|e| e.contains("greater than zero") && e.contains("checks.runtime.timeout")),
        "{errs:?}"
    );
}

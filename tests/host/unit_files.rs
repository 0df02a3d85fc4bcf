//! The shipped systemd unit files parse cleanly with the real `systemd-analyze verify`
//! (unknown keys and bad values are only warnings to systemd, so any output is a failure here).

use std::process::Command;

#[test]
fn shipped_units_verify_without_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_nodekeeper");
    let mut names = Vec::new();
    for unit in ["nodekeeper-agent.service", "nodekeeper-crio-apply.service"] {
        let text =
            std::fs::read_to_string(format!("{}/systemd/{unit}", env!("CARGO_MANIFEST_DIR")))
                .unwrap();
        assert!(
            text.contains("/usr/bin/nodekeeper "),
            "{unit} runs /usr/bin/nodekeeper"
        );
        // Point ExecStart at the freshly built binary so the executable check is real.
        std::fs::write(
            dir.path().join(unit),
            text.replace("/usr/bin/nodekeeper ", &format!("{bin} ")),
        )
        .unwrap();
        names.push(dir.path().join(unit));
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&names)
        .env("SYSTEMD_LOG_LEVEL", "notice")
        .output()
        .expect("systemd-analyze (Debian package systemd, installed by scripts/setup.sh) must be on PATH");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("nodekeeper"))
        .collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify: {stderr}"
    );
}

#[test]
fn agent_unit_is_hardened_and_validates_first() {
    let text = std::fs::read_to_string(format!(
        "{}/systemd/nodekeeper-agent.service",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    for line in [
        "ProtectSystem=strict",
        // One writable mount for drop-ins and state: atomic renames never cross mounts.
        "ReadWritePaths=/etc/crio /var/lib/nodekeeper",
        "Environment=NODEKEEPER_CRIO_STATE_DIR=/etc/crio/nodekeeper-state",
        "NoNewPrivileges=yes",
        "PrivateTmp=yes",
        "ExecStartPre=/usr/bin/nodekeeper validate --config /etc/nodekeeper/agent.toml",
    ] {
        assert!(text.lines().any(|l| l == line), "missing `{line}`");
    }
    let oneshot = std::fs::read_to_string(format!(
        "{}/systemd/nodekeeper-crio-apply.service",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    assert!(oneshot
        .lines()
        .any(|l| l == "Before=crio.service kubelet.service"));
    // Both units write drop-ins: same sandbox paths and state dir (they share the apply lock).
    for line in [
        "ReadWritePaths=/etc/crio /var/lib/nodekeeper",
        "Environment=NODEKEEPER_CRIO_STATE_DIR=/etc/crio/nodekeeper-state",
    ] {
        assert!(
            oneshot.lines().any(|l| l == line),
            "oneshot: missing `{line}`"
        );
    }
    assert!(oneshot.lines().any(|l| l == "Type=oneshot"));
}

#[test]
fn example_config_is_valid() {
    let out = Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args([
            "validate",
            "--config",
            &format!("{}/packaging/agent.toml", env!("CARGO_MANIFEST_DIR")),
        ])
        .env("NODEKEEPER_CRIO_VERSION", "1.34.0")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "the example has no warnings: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

//! The .rpm (scripts/package-rpm.sh, cargo-generate-rpm) checked with the real `rpm` CLI (Debian's
//! `rpm` package, installed by scripts/setup.sh): its file list and scriptlets; then installed with
//! `rpm -i --root` into a copy of the nspawn rootfs (its %post runs there, chrooted, and enables
//! the units) which boots with real systemd (tests/support/package_boot.rs: the boot-time oneshot
//! runs before crio.service, both units are enabled, the agent runs).
#![allow(clippy::unwrap_used)]

use crate::support as common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::nspawn::require_root;
use common::package_boot::{assert_boots, assert_installed, node_root, repo, run, stripped_binary};

const FILES: [&str; 5] = [
    "/usr/bin/nodekeeper",
    "/usr/lib/systemd/system/nodekeeper-agent.service",
    "/usr/lib/systemd/system/nodekeeper-crio-apply.service",
    "/usr/share/doc/nodekeeper/examples/agent.toml",
    "/usr/share/doc/nodekeeper/README.md",
];

fn rpm_cli() -> &'static str {
    assert!(
        Command::new("rpm").arg("--version").output().is_ok(),
        "the rpm CLI (Debian package rpm) is missing: run scripts/setup.sh"
    );
    "rpm"
}

/// Builds the .rpm around a stripped copy of the test binary (uncompressed: zstd of the debug
/// binary takes ~30 s here).
fn build_rpm(dir: &Path) -> PathBuf {
    let out = run(Command::new(repo().join("scripts/package-rpm.sh"))
        .env("NODEKEEPER_BIN", stripped_binary(dir))
        .env("NODEKEEPER_RPM_COMPRESSION", "none"));
    PathBuf::from(out.lines().last().unwrap().trim())
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root (debootstrap, systemd-nspawn)"]
async fn rpm_has_the_units_and_scripts_and_boots_with_the_oneshot_before_crio() {
    require_root("rpm_has_the_units_and_scripts_and_boots_with_the_oneshot_before_crio");
    let rpm = rpm_cli();
    let dir = tempfile::Builder::new()
        .prefix("nk-rpm-")
        .tempdir()
        .unwrap();
    let pkg = build_rpm(dir.path());

    // What the package holds, as rpm reads it.
    let name = run(Command::new(rpm)
        .args(["-qp", "--queryformat", "%{NAME} %{VERSION}"])
        .arg(&pkg));
    assert_eq!(name, format!("nodekeeper {}", env!("CARGO_PKG_VERSION")));
    let list = run(Command::new(rpm).args(["-qlp"]).arg(&pkg));
    let files: Vec<&str> = list.lines().collect();
    for f in FILES {
        assert!(files.contains(&f), "{f} not in the rpm:\n{list}");
    }
    assert!(
        !files.iter().any(|f| f.contains(".service.d/")),
        "the units are correct on their own, no drop-in:\n{list}"
    );
    let docs = run(Command::new(rpm).args(["-qdp"]).arg(&pkg));
    assert!(
        docs.contains("/usr/share/doc/nodekeeper/examples/agent.toml"),
        "{docs}"
    );
    let modes = run(Command::new(rpm)
        .args([
            "-qp",
            "--queryformat",
            "[%{FILEMODES:perms} %{FILENAMES}\n]",
        ])
        .arg(&pkg));
    assert!(
        modes.lines().any(|l| l == "-rwxr-xr-x /usr/bin/nodekeeper"),
        "{modes}"
    );
    let scripts = run(Command::new(rpm).args(["-qp", "--scripts"]).arg(&pkg));
    for want in [
        "postinstall scriptlet",
        "systemctl enable nodekeeper-crio-apply.service",
        "preuninstall scriptlet",
        "systemctl disable nodekeeper-agent.service nodekeeper-crio-apply.service",
    ] {
        assert!(scripts.contains(want), "missing {want:?} in:\n{scripts}");
    }
    // The units in the package are the ones in systemd/, byte for byte.
    let x = dir.path().join("x");
    std::fs::create_dir_all(&x).unwrap();
    run(Command::new("sh")
        .arg("-c")
        .arg("rpm2cpio \"$1\" | cpio -idm --quiet")
        .arg("sh")
        .arg(&pkg)
        .current_dir(&x));
    for unit in ["nodekeeper-agent.service", "nodekeeper-crio-apply.service"] {
        assert_eq!(
            std::fs::read(x.join("usr/lib/systemd/system").join(unit)).unwrap(),
            std::fs::read(repo().join("systemd").join(unit)).unwrap(),
            "{unit}"
        );
    }

    // Installed into the node's root: rpm's database is created there, the %post scriptlet runs
    // chrooted (Debian's root has no rpm-provided /bin/sh: --nodeps).
    let root = node_root(dir.path());
    run(Command::new(rpm).arg("--root").arg(&root).arg("--initdb"));
    let install = run(Command::new(rpm)
        .arg("--root")
        .arg(&root)
        .args(["-i", "--nodeps", "-v"])
        .arg(&pkg));
    let query = run(Command::new(rpm)
        .arg("--root")
        .arg(&root)
        .args(["-q", "nodekeeper"]));
    assert!(query.starts_with("nodekeeper-"), "{query}");
    assert_installed(
        &root,
        &[
            "usr/bin/nodekeeper",
            "usr/lib/systemd/system/nodekeeper-agent.service",
            "usr/lib/systemd/system/nodekeeper-crio-apply.service",
            "usr/share/doc/nodekeeper/examples/agent.toml",
            "var/lib/nodekeeper",
            "etc/systemd/system/multi-user.target.wants/nodekeeper-agent.service",
            "etc/systemd/system/crio.service.requires/nodekeeper-crio-apply.service",
        ],
        &install,
    );
    assert_boots(&root, dir.path(), "rpm").await;
}

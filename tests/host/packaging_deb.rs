//! The .deb (scripts/package-deb.sh) installed with `dpkg -i` into a copy of the nspawn rootfs,
//! which then boots with real systemd (tests/support/package_boot.rs: the boot-time oneshot runs
//! before crio.service, both units are enabled, the agent runs).
#![allow(clippy::unwrap_used)]

use crate::support as common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::nspawn::require_root;
use common::package_boot::{assert_boots, assert_installed, node_root, repo, run, stripped_binary};

/// Builds the .deb around a stripped copy of the test binary (uncompressed: fast).
fn build_deb(dir: &Path) -> PathBuf {
    let out = run(Command::new(repo().join("scripts/package-deb.sh"))
        .env("NODEKEEPER_BIN", stripped_binary(dir))
        .env("NODEKEEPER_DEB_COMPRESSION", "none"));
    PathBuf::from(out.lines().last().unwrap().trim())
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root (debootstrap, systemd-nspawn)"]
async fn deb_installs_and_the_crio_oneshot_runs_before_crio_at_boot() {
    require_root("deb_installs_and_the_crio_oneshot_runs_before_crio_at_boot");
    let dir = tempfile::Builder::new()
        .prefix("nk-deb-")
        .tempdir()
        .unwrap();
    let deb = build_deb(dir.path());
    let root = node_root(dir.path());
    // The package after the config (its postinst enables both units).
    std::fs::copy(&deb, root.join("tmp/nodekeeper.deb")).unwrap();
    let install =
        run(Command::new("chroot")
            .arg(&root)
            .args(["dpkg", "-i", "/tmp/nodekeeper.deb"]));
    assert!(install.contains("Setting up nodekeeper"), "{install}");
    assert_installed(
        &root,
        &[
            "usr/bin/nodekeeper",
            "lib/systemd/system/nodekeeper-agent.service",
            "lib/systemd/system/nodekeeper-crio-apply.service",
            "usr/share/doc/nodekeeper/examples/agent.toml",
            "var/lib/nodekeeper",
            "etc/systemd/system/multi-user.target.wants/nodekeeper-agent.service",
            "etc/systemd/system/crio.service.requires/nodekeeper-crio-apply.service",
        ],
        &install,
    );
    // The units are correct on their own: no drop-in is shipped.
    assert!(!root
        .join("lib/systemd/system/nodekeeper-crio-apply.service.d")
        .exists());
    assert_boots(&root, dir.path(), "deb").await;
}

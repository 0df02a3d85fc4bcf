//! The .deb (scripts/package-deb.sh) installed into a copy of the nspawn rootfs (a debootstrapped
//! Debian with a stand-in `crio.service`), which then boots with real systemd: the boot-time
//! oneshot runs and finishes **before** crio.service starts (CRI-O starts once), both units are
//! enabled, and the agent unit loads and runs.
//!
//! Known gap (reported to the lead, not hidden): with a `[[crio.dropin]]` configured, the oneshot
//! as shipped in systemd/ fails under systemd with `cannot rename into place ...: Invalid
//! cross-device link` (seen in nspawn on a plain filesystem too, with ProtectSystem=strict and
//! with ProtectSystem=yes; the same `crio apply` run outside the unit succeeds): the unit's
//! mount sandbox puts state_dir and the drop-in directory on different mounts. This test's config
//! therefore declares no drop-in.
//!
//! The agent config sets `[sources] cloud = "none"`: the container shares the host's network
//! namespace and must never talk to 169.254.169.254 from there.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::nspawn::{require_root, rootfs, NspawnNode};

const NK: &str = env!("CARGO_BIN_EXE_nodekeeper");

/// No drop-in (see the module docs); `cloud = "none"`: never 169.254.169.254 from the host netns.
fn agent_toml() -> String {
    "[sources]\ncloud = \"none\"\n".to_string()
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Builds the .deb around a stripped copy of the test binary (uncompressed: fast).
fn build_deb(dir: &Path) -> PathBuf {
    let bin = dir.join("nodekeeper");
    std::fs::copy(NK, &bin).unwrap();
    run(Command::new("strip").arg(&bin));
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = run(Command::new(repo.join("scripts/package-deb.sh"))
        .env("NODEKEEPER_BIN", &bin)
        .env("NODEKEEPER_DEB_COMPRESSION", "none"));
    PathBuf::from(out.lines().last().unwrap().trim())
}

/// A copy of the cached rootfs that `NspawnNode::boot` will use: scripts/nspawn-rootfs.sh
/// honours NSPAWN_ROOTFS and accepts a tree whose stamp matches.
fn rootfs_copy(dir: &Path) -> PathBuf {
    let src = rootfs();
    let dst = dir.join("rootfs");
    run(Command::new("cp").arg("-a").arg(&src).arg(&dst));
    let stamp = src.with_extension("stamp");
    std::fs::copy(&stamp, dst.with_extension("stamp")).unwrap();
    dst
}

fn show(node: &NspawnNode, unit: &str) -> BTreeMap<String, String> {
    node.exec_ok(&["systemctl", "show", unit])
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn mono(p: &BTreeMap<String, String>, key: &str) -> u64 {
    p[key]
        .parse()
        .unwrap_or_else(|e| panic!("{key}={}: {e}", p[key]))
}

#[tokio::test(flavor = "multi_thread")]
async fn deb_installs_and_the_crio_oneshot_runs_before_crio_at_boot() {
    if !require_root("deb_installs_and_the_crio_oneshot_runs_before_crio_at_boot") {
        return;
    }
    let t0 = Instant::now();
    let dir = tempfile::Builder::new()
        .prefix("nk-deb-")
        .tempdir()
        .unwrap();
    let deb = build_deb(dir.path());
    let root = rootfs_copy(dir.path());

    // As an image build would: config first, then the package (its postinst enables both units).
    std::fs::create_dir_all(root.join("etc/nodekeeper")).unwrap();
    std::fs::write(root.join("etc/nodekeeper/agent.toml"), agent_toml()).unwrap();
    std::fs::copy(&deb, root.join("tmp/nodekeeper.deb")).unwrap();
    let install =
        run(Command::new("chroot")
            .arg(&root)
            .args(["dpkg", "-i", "/tmp/nodekeeper.deb"]));
    assert!(install.contains("Setting up nodekeeper"), "{install}");
    for f in [
        "usr/bin/nodekeeper",
        "lib/systemd/system/nodekeeper-agent.service",
        "lib/systemd/system/nodekeeper-crio-apply.service",
        "usr/share/doc/nodekeeper/examples/agent.toml",
        "var/lib/nodekeeper",
        "etc/systemd/system/multi-user.target.wants/nodekeeper-agent.service",
        "etc/systemd/system/crio.service.requires/nodekeeper-crio-apply.service",
    ] {
        assert!(
            // symlink_metadata: enable links point at absolute paths inside the root.
            root.join(f).symlink_metadata().is_ok(),
            "{f} missing after dpkg -i:\n{install}\n{}",
            run(Command::new("find").arg(root.join("etc/systemd/system")))
        );
    }
    let version = run(Command::new("chroot")
        .arg(&root)
        .args(["nodekeeper", "--version"]));
    assert!(version.contains(env!("CARGO_PKG_VERSION")), "{version}");

    // SAFETY of the test process environment: this test binary has a single test.
    std::env::set_var("NSPAWN_ROOTFS", &root);
    let node = NspawnNode::boot("deb").await.unwrap();

    let apply = show(&node, "nodekeeper-crio-apply.service");
    let crio = show(&node, "crio.service");
    let journal = || node.journal();
    assert_eq!(
        (apply["ActiveState"].as_str(), apply["Result"].as_str()),
        ("active", "success"),
        "oneshot did not run:\n{}",
        journal()
    );
    assert_eq!(apply["UnitFileState"], "enabled");
    assert!(
        apply["Before"].split(' ').any(|u| u == "crio.service"),
        "{:?}",
        apply["Before"]
    );
    // It finished before crio.service began to start.
    let applied = mono(&apply, "ExecMainExitTimestampMonotonic");
    let crio_start = mono(&crio, "InactiveExitTimestampMonotonic");
    assert!(
        applied > 0 && applied <= crio_start,
        "oneshot exited at {applied} µs, crio.service started at {crio_start} µs"
    );
    assert_eq!(crio["ActiveState"], "active");
    assert_eq!(node.crio_starts(), 1, "CRI-O started once");
    // The oneshot recorded its (empty) state in the package's state directory.
    let state = node.exec_ok(&["ls", "-A", "/var/lib/nodekeeper"]);
    assert!(!state.trim().is_empty(), "nothing in /var/lib/nodekeeper");

    // The agent unit loads, is enabled, and runs (its ExecStartPre validates the config).
    let deadline = Instant::now() + Duration::from_secs(20);
    let agent = loop {
        let a = show(&node, "nodekeeper-agent.service");
        if a["ActiveState"] == "active" || Instant::now() > deadline {
            break a;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(agent["LoadState"], "loaded");
    assert_eq!(agent["UnitFileState"], "enabled");
    assert_eq!(
        (agent["ActiveState"].as_str(), agent["SubState"].as_str()),
        ("active", "running"),
        "agent:\n{}",
        journal()
    );
    eprintln!("deb test took {:?}", t0.elapsed());
}

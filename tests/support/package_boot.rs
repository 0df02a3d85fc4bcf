//! Shared by tests/host/packaging_deb.rs and tests/host/packaging_rpm.rs: a node package installed into a
//! copy of the nspawn rootfs whose `crio.service` is the real CRI-O (scripts/nspawn-rootfs.sh --crio), which
//! then boots with real systemd, on a plain filesystem like a node's (no overlay, no bind mount over the
//! drop-in directory), in a network namespace of its own. [`assert_boots`] checks what both packages promise:
//! the boot-time oneshot writes the configured CRI-O drop-in **before** crio.service starts (CRI-O starts
//! once, never restarted, and runs with the drop-in's value), both units are enabled, and the agent unit
//! loads and runs.
//!
//! The agent config sets `[sources] cloud = "none"`: the container shares the host's network
//! namespace and must never talk to 169.254.169.254 from there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use nodekeeper_core::agent::host::systemd::Systemd;

use super::nspawn::{crio_rootfs, crio_starts_in, leader_of, remove_cgroup_tree, CRIO_JOURNAL};

pub const NK: &str = env!("CARGO_BIN_EXE_nodekeeper");
pub const DROPIN: &str = "50-nodekeeper-deb-test.conf";
pub const DROPIN_CONTENT: &str = "[crio.runtime]\npids_limit = 2048\n";

pub fn agent_toml() -> String {
    format!(
        "[crio]\n[[crio.dropin]]\nname = \"{DROPIN}\"\ncontent = \"\"\"\n{DROPIN_CONTENT}\"\"\"\n\n\
         [sources]\ncloud = \"none\"\n"
    )
}

pub fn run(cmd: &mut Command) -> String {
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

/// A stripped copy of the test binary in `dir` (what the packages ship, minus the release build).
pub fn stripped_binary(dir: &Path) -> PathBuf {
    let bin = dir.join("nodekeeper");
    std::fs::copy(NK, &bin).unwrap();
    run(Command::new("strip").arg(&bin));
    bin
}

/// The repository root.
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A disposable copy of the cached rootfs in `dir/rootfs` with the agent config in place (as an
/// image build would do it: config first, then the package).
pub fn node_root(dir: &Path) -> PathBuf {
    let root = dir.join("rootfs");
    run(Command::new("cp").arg("-a").arg(crio_rootfs()).arg(&root));
    std::fs::create_dir_all(root.join("etc/nodekeeper")).unwrap();
    std::fs::write(root.join("etc/nodekeeper/agent.toml"), agent_toml()).unwrap();
    root
}

/// The package's files exist in `root` (`symlink_metadata`: enable links point at absolute
/// paths inside the root); `log` is shown on failure.
pub fn assert_installed(root: &Path, files: &[&str], log: &str) {
    for f in files {
        assert!(
            root.join(f).symlink_metadata().is_ok(),
            "{f} missing after the install:\n{log}"
        );
    }
    let version = run(Command::new("chroot")
        .arg(root)
        .args(["nodekeeper", "--version"]));
    assert!(version.contains(env!("CARGO_PKG_VERSION")), "{version}");
}

/// A booted copy of the rootfs: its own cgroup (never the host's root cgroup), its system bus
/// reachable at `dir/dbus`, powered off and cleaned up on drop.
pub struct Booted {
    child: Child,
    machine: String,
    leader: u32,
    cgroups: Vec<PathBuf>,
}

impl Booted {
    pub async fn boot(root: &Path, dir: &Path, tag: &str) -> Booted {
        let machine = format!("nk-{tag}-{}", std::process::id());
        let pure_v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let cgroups: Vec<PathBuf> = [
            "/sys/fs/cgroup/systemd",
            "/sys/fs/cgroup/unified",
            "/sys/fs/cgroup",
        ]
        .iter()
        .map(Path::new)
        .filter(|h| h.join("cgroup.procs").exists())
        .filter(|h| (*h == Path::new("/sys/fs/cgroup")) == pure_v2)
        .map(|h| h.join("nodekeeper-tests").join(&machine))
        .collect();
        for cg in &cgroups {
            std::fs::create_dir_all(cg).unwrap();
        }
        let procs: Vec<String> = cgroups
            .iter()
            .map(|c| c.join("cgroup.procs").display().to_string())
            .collect();
        let bus = dir.join("dbus");
        std::fs::create_dir_all(&bus).unwrap();
        let log = std::fs::File::create(dir.join("nspawn.log")).unwrap();
        let child = Command::new("sh")
            .arg("-c")
            .arg(r#"for f in $NK_CGROUP_PROCS; do echo $$ > "$f" || exit 1; done; exec "$@""#)
            .arg("sh")
            .arg("systemd-nspawn")
            .arg("-D")
            .arg(root)
            .args([
                "-b",
                "--register=no",
                "--keep-unit",
                "--console=passive",
                "--private-network",
            ])
            .arg(format!("--machine={machine}"))
            .arg(format!("--bind={}:/run/dbus", bus.display()))
            .env("NK_CGROUP_PROCS", procs.join(" "))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut b = Booted {
            child,
            machine,
            leader: 0,
            cgroups,
        };
        let address = format!("unix:path={}", bus.join("system_bus_socket").display());
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = String::from("(no bus yet)");
        while Instant::now() < deadline {
            if let Ok(s) = Systemd::connect_address(&address).await {
                match s.system_state().await {
                    // "degraded": a unit failed; the assertions below say which.
                    Ok(st) if st == "running" || st == "degraded" => {
                        b.leader = leader_of(b.child.id()).expect("container PID 1");
                        return b;
                    }
                    Ok(st) => last = st,
                    Err(e) => last = e.to_string(),
                }
            }
            assert!(
                b.child.try_wait().unwrap().is_none(),
                "nspawn exited during boot"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "not running after 60s ({last}):\n{}",
            std::fs::read_to_string(dir.join("nspawn.log")).unwrap_or_default()
        );
    }

    pub fn exec_ok(&self, argv: &[&str]) -> String {
        run(Command::new("nsenter")
            .args(["-t", &self.leader.to_string(), "-a", "--"])
            .args(argv))
    }

    pub fn show(&self, unit: &str) -> BTreeMap<String, String> {
        self.exec_ok(&["systemctl", "show", unit])
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    pub fn journal(&self) -> String {
        // The oneshot's own lines first: the last 80 of the boot alone can miss its failure.
        let unit = self.exec_ok(&[
            "journalctl",
            "--no-pager",
            "-u",
            "nodekeeper-crio-apply.service",
        ]);
        let tail = self.exec_ok(&["journalctl", "--no-pager", "-n", "80"]);
        format!("{unit}\n--- the boot's last 80 lines ---\n{tail}")
    }
}

impl Drop for Booted {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        for cg in &self.cgroups {
            remove_cgroup_tree(cg);
            if let Some(parent) = cg.parent() {
                let _ = std::fs::remove_dir(parent);
            }
        }
        let _ =
            std::fs::remove_dir_all(Path::new("/run/systemd/nspawn/propagate").join(&self.machine));
    }
}

pub fn mono(p: &BTreeMap<String, String>, key: &str) -> u64 {
    p[key]
        .parse()
        .unwrap_or_else(|e| panic!("{key}={}: {e}", p[key]))
}

/// Boots `root` (the package installed) and checks the boot order, the drop-in and the agent.
pub async fn assert_boots(root: &Path, dir: &Path, tag: &str) {
    let node = Booted::boot(root, dir, tag).await;
    let apply = node.show("nodekeeper-crio-apply.service");
    let crio = node.show("crio.service");
    assert_eq!(
        (apply["ActiveState"].as_str(), apply["Result"].as_str()),
        ("active", "success"),
        "oneshot:\n{}",
        node.journal()
    );
    assert_eq!(apply["UnitFileState"], "enabled");
    assert!(
        apply["Before"].split(' ').any(|u| u == "crio.service"),
        "{:?}",
        apply["Before"]
    );
    // It finished before crio.service began to start, so CRI-O started once, with the drop-in.
    let applied = mono(&apply, "ExecMainExitTimestampMonotonic");
    let crio_start = mono(&crio, "InactiveExitTimestampMonotonic");
    assert!(
        applied > 0 && applied <= crio_start,
        "oneshot exited at {applied} µs, crio.service started at {crio_start} µs"
    );
    assert_eq!(crio["ActiveState"], "active", "{}", node.journal());
    assert_eq!(crio["NRestarts"], "0");
    let crio_log = node.exec_ok(&CRIO_JOURNAL);
    assert_eq!(
        crio_starts_in(&crio_log),
        1,
        "CRI-O started once:\n{crio_log}"
    );
    // The real CRI-O runs with the drop-in's value (its live configuration, from its own client).
    let live: toml::Table = node.exec_ok(&["crio", "status", "config"]).parse().unwrap();
    assert_eq!(
        live["crio"]["runtime"]["pids_limit"].as_integer(),
        Some(2048)
    );
    assert_eq!(
        std::fs::read_to_string(root.join("etc/crio/crio.conf.d").join(DROPIN)).unwrap(),
        DROPIN_CONTENT
    );
    assert!(root
        .join("etc/crio/nodekeeper-state/crio-state.json")
        .exists());

    // The agent unit loads, is enabled, and runs (its ExecStartPre validates the config).
    let deadline = Instant::now() + Duration::from_secs(20);
    let agent = loop {
        let a = node.show("nodekeeper-agent.service");
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
        node.journal()
    );
}

//! A real systemd (PID 1 of a debootstrapped Debian) booted with `systemd-nspawn`, for tests of the
//! D-Bus boundary. See docs in `scripts/nspawn-rootfs.sh` and the test-environment notes.
//!
//! Each [`NspawnNode`] gets a private tempdir `T` with `T/dbus` bound to the container's `/run/dbus`
//! (so its system bus is reachable from the host at `unix:path=T/dbus/system_bus_socket`) and
//! `T/root/etc/crio/crio.conf.d` bound to `/etc/crio/crio.conf.d`, so `T/root` serves as
//! `nodekeeper crio apply --root`. Every container runs in its own cgroup
//! (`nodekeeper-tests/<machine>` in the `name=systemd` and unified hierarchies), so containers can
//! boot in parallel; dropping the node powers it off and removes that cgroup tree.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use nodekeeper_core::agent::host::systemd::Systemd;

const BOOT_TIMEOUT: Duration = Duration::from_secs(60);
const POWEROFF_TIMEOUT: Duration = Duration::from_secs(20);
const DROPIN_DIR: &str = "root/etc/crio/crio.conf.d";
/// The real CRI-O's `/run/crio` (its socket), as `--root` finds it.
const CRIO_RUN: &str = "root/var/run/crio";
/// The real CRI-O node's volatile journal, as `journalctl --root` finds it.
const JOURNAL: &str = "root/run/log/journal";

/// Which crio.service the node runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The stand-in of scripts/nspawn-rootfs.sh.
    StandIn,
    /// The real CRI-O of scripts/nspawn-rootfs-crio.sh.
    RealCrio,
}
/// cgroup v1/hybrid hosts: the `name=systemd` and unified hierarchies; a pure cgroup v2 host:
/// `/sys/fs/cgroup` itself.
const CGROUP_HIERARCHIES: [&str; 3] = [
    "/sys/fs/cgroup/systemd",
    "/sys/fs/cgroup/unified",
    "/sys/fs/cgroup",
];

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Fails `test` unless running as root: a missing prerequisite is a failure, never a silent pass.
/// The tests that boot containers are `#[ignore = "needs root …"]`; `-- --include-ignored` runs
/// them (scripts/test.sh does; CI runs as root).
pub fn require_root(test: &str) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "{test} needs root (systemd-nspawn, debootstrap): run as root, as CI does, or leave out `--include-ignored`"
    );
}

/// Build (once, cached) the rootfs and return its path.
pub fn rootfs() -> PathBuf {
    rootfs_of(&[])
}

/// Build (once, cached) the rootfs whose crio.service is the real CRI-O
/// (`scripts/nspawn-rootfs.sh --crio`) and return its path.
pub fn crio_rootfs() -> PathBuf {
    rootfs_of(&["--crio"])
}

fn rootfs_of(args: &[&str]) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/nspawn-rootfs.sh");
    let out = Command::new(&script)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} failed: {}",
        script.display(),
        out.status
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = stdout.lines().last().unwrap_or_default().trim().to_string();
    assert!(
        Path::new(&path).join("lib/systemd/systemd").exists(),
        "no rootfs at {path:?}"
    );
    PathBuf::from(path)
}

/// The files of `dir`, by name.
pub fn read_dir(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

/// `journalctl` inside a node: crio.service's own output.
pub const CRIO_JOURNAL: [&str; 6] = [
    "journalctl",
    "--no-pager",
    "-q",
    "-o",
    "cat",
    "_SYSTEMD_UNIT=crio.service",
];

/// How many CRI-O processes started, from crio.service's own output ([`CRIO_JOURNAL`]).
pub fn crio_starts_in(journal: &str) -> usize {
    journal
        .lines()
        .filter(|l| l.contains("Starting CRI-O, version"))
        .count()
}

/// A booted container; powered off and cleaned up on drop.
pub struct NspawnNode {
    machine: String,
    dir: tempfile::TempDir,
    child: Child,
    exited: Option<ExitStatus>,
    leader: u32,
    cgroups: Vec<PathBuf>,
}

impl NspawnNode {
    /// Boot a container named after `name` (made unique) and wait until its systemd reports
    /// `SystemState` `running`; fails the test when not root ([`require_root`]). `None` only where
    /// a caller's own `?` chain wants an `Option`.
    pub async fn boot(name: &str) -> Option<NspawnNode> {
        Self::boot_from(name, Kind::StandIn).await
    }

    /// Boot a node whose crio.service is the real CRI-O ([`crio_rootfs`]), with a network
    /// namespace of its own (nothing it tries reaches past it) and, for `--root`, its CRI-O socket
    /// directory at `root()/var/run/crio` and its journal at `root()/run/log/journal`.
    pub async fn boot_crio(name: &str) -> NspawnNode {
        match Self::boot_from(name, Kind::RealCrio).await {
            Some(n) => n,
            None => unreachable!("boot_from fails the test or returns a node"),
        }
    }

    async fn boot_from(name: &str, kind: Kind) -> Option<NspawnNode> {
        require_root(name);
        let rootfs = match kind {
            Kind::StandIn => rootfs(),
            Kind::RealCrio => crio_rootfs(),
        };
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let machine = format!("nk-{name}-{}-{n}", std::process::id());
        let dir = tempfile::Builder::new()
            .prefix("nk-nspawn-")
            .tempdir()
            .unwrap();
        for sub in ["dbus", DROPIN_DIR, CRIO_RUN, JOURNAL] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        let cgroups = make_cgroups(&machine);
        let child = spawn_nspawn(&rootfs, &machine, dir.path(), &cgroups, kind);
        let mut node = NspawnNode {
            machine,
            dir,
            child,
            exited: None,
            leader: 0,
            cgroups,
        };
        node.wait_running().await;
        Some(node)
    }

    /// The machine name (unique per test process and call).
    pub fn machine(&self) -> &str {
        &self.machine
    }

    /// D-Bus address of the container's system bus, reachable from the host.
    pub fn bus_address(&self) -> String {
        format!(
            "unix:path={}",
            self.dir.path().join("dbus/system_bus_socket").display()
        )
    }

    /// Host path of the container's `/etc/crio/crio.conf.d` (`root()/etc/crio/crio.conf.d`).
    pub fn dropin_dir(&self) -> PathBuf {
        self.dir.path().join(DROPIN_DIR)
    }

    /// A host root for `--root`: its `etc/crio/crio.conf.d` is the container's drop-in dir.
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// The private tempdir of this node (holds `dbus/`, `root/` and `nspawn.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// PID (host namespace) of the container's PID 1.
    pub fn leader_pid(&self) -> u32 {
        self.leader
    }

    /// Run `argv` inside the container (all its namespaces) and return its output.
    pub fn exec(&self, argv: &[&str]) -> Output {
        Command::new("nsenter")
            .args(["-t", &self.leader.to_string(), "-a", "--"])
            .args(argv)
            .output()
            .unwrap_or_else(|e| panic!("nsenter into {}: {e}", self.machine))
    }

    /// Run `argv` inside the container and assert that it succeeds; returns its stdout.
    pub fn exec_ok(&self, argv: &[&str]) -> String {
        let out = self.exec(argv);
        assert!(
            out.status.success(),
            "{argv:?} in {} failed: {}\n{}",
            self.machine,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A command that runs the host program `program` inside the container's PID namespace only
    /// (host filesystem, host network): peers on the container's bus then see its PID, which
    /// systemd-logind requires of callers of `Inhibit`. nsenter forks: stop the program with
    /// [`kill_tree`], not by killing nsenter alone.
    pub fn pidns_command(&self, program: &Path) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.args(["-t", &self.leader.to_string(), "-p", "--"])
            .arg(program);
        cmd
    }

    /// `nodekeeper crio apply --config CONFIG --root root()`, reaching this node's systemd over its bus.
    pub fn crio_apply(&self, config: &Path) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_nodekeeper"));
        cmd.args(["crio", "apply", "--config"])
            .arg(config)
            .arg("--root")
            .arg(self.root())
            .env("DBUS_SYSTEM_BUS_ADDRESS", self.bus_address())
            .env("NODEKEEPER_LOG_LEVEL", "warn")
            .stdin(Stdio::null());
        cmd
    }

    /// Host path of the real CRI-O's socket (`root()/var/run/crio/crio.sock`).
    pub fn crio_socket(&self) -> PathBuf {
        self.dir.path().join(CRIO_RUN).join("crio.sock")
    }

    /// How many times the stand-in crio.service began a start (boot included).
    pub fn crio_starts(&self) -> usize {
        let out = self.exec(&["cat", "/run/crio-starts"]);
        String::from_utf8_lossy(&out.stdout).lines().count()
    }

    /// The container's journal (for failure messages).
    pub fn journal(&self) -> String {
        let out = self.exec(&["journalctl", "--no-pager", "-n", "200"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// True while systemd-nspawn has not exited.
    pub fn is_running(&mut self) -> bool {
        self.poll_exit().is_none()
    }

    /// Wait up to `timeout` for systemd-nspawn to exit (e.g. after a poweroff inside).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.poll_exit() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn poll_exit(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().unwrap();
        }
        self.exited
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("nspawn.log")).unwrap_or_default()
    }

    async fn wait_running(&mut self) {
        let deadline = Instant::now() + BOOT_TIMEOUT;
        let socket = self.dir.path().join("dbus/system_bus_socket");
        let mut last = String::from("(no bus yet)");
        while Instant::now() < deadline {
            if let Some(status) = self.poll_exit() {
                panic!(
                    "systemd-nspawn {} exited during boot: {status}\n{}",
                    self.machine,
                    self.log()
                );
            }
            if socket.exists() {
                match state(&self.bus_address()).await {
                    Ok(s) if s == "running" => {
                        // Only now: early on, nspawn's child is an intermediate process.
                        self.leader = leader_of(self.child.id())
                            .unwrap_or_else(|| panic!("{}: no container PID 1", self.machine));
                        return;
                    }
                    Ok(s) => last = s,
                    Err(e) => last = e,
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "{} not running after {BOOT_TIMEOUT:?}: last SystemState {last}\n{}",
            self.machine,
            self.log()
        );
    }

    fn poweroff(&mut self) {
        if self.poll_exit().is_some() {
            return;
        }
        let pid = Pid::from_raw(self.child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        if self.wait_exit(POWEROFF_TIMEOUT).is_none() {
            eprintln!(
                "{}: no clean power-off in {POWEROFF_TIMEOUT:?}, killing",
                self.machine
            );
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Drop for NspawnNode {
    fn drop(&mut self) {
        self.poweroff();
        for cg in &self.cgroups {
            remove_cgroup_tree(cg);
        }
        for cg in &self.cgroups {
            // The shared parent goes once the last container of any test is gone.
            if let Some(parent) = cg.parent() {
                let _ = std::fs::remove_dir(parent);
            }
        }
        let _ =
            std::fs::remove_dir_all(Path::new("/run/systemd/nspawn/propagate").join(&self.machine));
    }
}

async fn state(address: &str) -> Result<String, String> {
    let systemd = Systemd::connect_address(address)
        .await
        .map_err(|e| e.to_string())?;
    systemd.system_state().await.map_err(|e| e.to_string())
}

/// One cgroup per container and hierarchy, so parallel containers never share `payload/`.
fn make_cgroups(machine: &str) -> Vec<PathBuf> {
    let pure_v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    CGROUP_HIERARCHIES
        .iter()
        .map(Path::new)
        .filter(|h| h.join("cgroup.procs").exists())
        .filter(|h| (*h == Path::new("/sys/fs/cgroup")) == pure_v2)
        .map(|h| {
            let cg = h.join("nodekeeper-tests").join(machine);
            std::fs::create_dir_all(&cg).unwrap_or_else(|e| panic!("mkdir {}: {e}", cg.display()));
            cg
        })
        .collect()
}

fn spawn_nspawn(
    rootfs: &Path,
    machine: &str,
    dir: &Path,
    cgroups: &[PathBuf],
    kind: Kind,
) -> Child {
    let log = std::fs::File::create(dir.join("nspawn.log")).unwrap();
    let procs: Vec<String> = cgroups
        .iter()
        .map(|c| c.join("cgroup.procs").display().to_string())
        .collect();
    // The shell moves itself into the container's cgroups, then becomes systemd-nspawn.
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(r#"for f in $NK_CGROUP_PROCS; do echo $$ > "$f" || exit 1; done; exec "$@""#)
        .arg("sh")
        .arg("systemd-nspawn")
        .arg("-D")
        .arg(rootfs)
        .args([
            "--volatile=overlay",
            "-b",
            "--register=no",
            "--keep-unit",
            "--console=passive",
        ])
        .arg(format!("--machine={machine}"))
        .arg(format!("--bind={}:/run/dbus", dir.join("dbus").display()))
        .arg(format!(
            "--bind={}:/etc/crio/crio.conf.d",
            dir.join(DROPIN_DIR).display()
        ));
    if kind == Kind::RealCrio {
        cmd.arg("--private-network")
            .arg(format!("--bind={}:/run/crio", dir.join(CRIO_RUN).display()))
            .arg(format!(
                "--bind={}:/run/log/journal",
                dir.join(JOURNAL).display()
            ));
    }
    cmd.env("NK_CGROUP_PROCS", procs.join(" "))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot start systemd-nspawn for {machine}: {e}"))
}

/// The container's PID 1: the child of systemd-nspawn that runs systemd.
pub fn leader_of(nspawn: u32) -> Option<u32> {
    let children =
        std::fs::read_to_string(format!("/proc/{nspawn}/task/{nspawn}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .find(|pid: &u32| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "systemd")
        })
}

/// SIGKILL the children of `pid` (e.g. the program nsenter started), then `pid` itself.
pub fn kill_tree(pid: u32) {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    for child in children
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
    {
        let _ = kill(Pid::from_raw(child), Signal::SIGKILL);
    }
    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
}

pub fn remove_cgroup_tree(cg: &Path) {
    let Ok(entries) = std::fs::read_dir(cg) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            remove_cgroup_tree(&entry.path());
        }
    }
    if let Err(e) = std::fs::remove_dir(cg) {
        eprintln!("cannot remove cgroup {}: {e}", cg.display());
    }
}

impl NspawnNode {
    /// Keeps the node running for the rest of this test process (a fixture shared by several tests,
    /// in a `static`, which is never dropped): a watcher powers it off once this process is gone,
    /// then removes its cgroups and directory, as `Drop` would.
    // The watcher outlives this process by design: nothing here waits for it.
    #[allow(clippy::zombie_processes)]
    pub fn keep_until_exit(self) -> &'static NspawnNode {
        let cgroups: Vec<String> = self
            .cgroups
            .iter()
            .map(|c| c.display().to_string())
            .collect();
        let script = r#"owner=$1 nspawn=$2 dir=$3; shift 3
while kill -0 "$owner" 2>/dev/null; do sleep 1; done
kill -TERM "$nspawn" 2>/dev/null
for _ in $(seq 1 200); do kill -0 "$nspawn" 2>/dev/null || break; sleep 0.1; done
kill -KILL "$nspawn" 2>/dev/null
for cg in "$@"; do find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null; done
rm -rf "$dir""#;
        Command::new("setsid")
            .args(["sh", "-c", script, "nspawn-watch"])
            .arg(std::process::id().to_string())
            .arg(self.child.id().to_string())
            .arg(self.dir.path())
            .args(&cgroups)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the nspawn node's watcher");
        Box::leak(Box::new(self))
    }
}

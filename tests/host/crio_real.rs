//! `nodekeeper crio apply` and the agent against the **real CRI-O** (scripts/setup-crio.sh: v1.34.0 as the Go
//! module proxy serves it, docs/dev/testing.md says what that build reads) running as `crio.service` under a real
//! systemd in systemd-nspawn (scripts/nspawn-rootfs.sh --crio), in a network namespace of its own. The binary
//! reaches that systemd through the node's bus socket, CRI-O through its socket, the journal with
//! `journalctl --root`: the layout of tests/support/nspawn.rs ([`NspawnNode::boot_crio`]).
//!
//! Scenarios: (a) a changed drop-in → exactly one restart (a new MainPID, one more CRI-O start in its journal)
//! and the live configuration (`crio status config`) has the value; (b) the same config → no restart; (c) a
//! drop-in CRI-O refuses and nodekeeper's lint does not (an unknown `default_runtime`) → the restart fails, the
//! files are restored, CRI-O is active again, exit 1, the JSON names the unit, the file and CRI-O's own fatal
//! line; (e) SIGKILL mid-apply, then the next run converges; (f) the agent from a `FROM scratch`-like root with
//! the DaemonSet's volume mounts and its bus address applies a drop-in. A drop-in key this CRI-O does not read
//! (`short_name_mode`) is named as ignored. Bad input: CRI-O installed but stopped (files written, not started),
//! a socket that does not exist (named). (d), the boot from the .deb, is tests/host/packaging_deb.rs.

use crate::support as common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::nspawn::{crio_starts_in, read_dir, NspawnNode, CRIO_JOURNAL};
use rand::{Rng, SeedableRng};
use serde_json::Value;

const PIDS_4096: &str = "[crio.runtime]\npids_limit = 4096\n";
const PIDS_2048: &str = "[crio.runtime]\npids_limit = 2048\n";
/// CRI-O refuses to start with it; nodekeeper's own lint cannot know which runtimes a node has.
const BAD_RUNTIME: &str = "[crio.runtime]\ndefault_runtime = \"does-not-exist\"\n";
const ENFORCING: &str = "[crio.image]\nshort_name_mode = \"enforcing\"\n";

/// The bin directory of scripts/setup-crio.sh (scripts/setup.sh builds it before the tests; a missing build
/// fails the test).
pub fn crio_bin() -> PathBuf {
    let script = common::repo().join("scripts/setup-crio.sh");
    let out = Command::new(&script).arg("--print").output().unwrap();
    assert!(
        out.status.success(),
        "the real CRI-O is not built: run scripts/setup-crio.sh (scripts/setup.sh does)"
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// A config declaring `dropins` (name, TOML content) for the node's crio.service.
fn config(dropins: &[(&str, &str)]) -> String {
    let mut s = String::from("[crio]\nrestart_timeout = \"60s\"\n");
    for (name, content) in dropins {
        s.push_str(&format!(
            "\n[[crio.dropin]]\nname = \"{name}\"\ncontent = '''\n{content}'''\n"
        ));
    }
    s
}

pub struct CrioNode {
    pub node: NspawnNode,
    config: PathBuf,
}

impl CrioNode {
    pub async fn boot(name: &str) -> CrioNode {
        let node = NspawnNode::boot_crio(name).await;
        let config = node.dir().join("nodekeeper.toml");
        let n = CrioNode { node, config };
        n.wait_active().await;
        n
    }

    fn write(&self, dropins: &[(&str, &str)]) {
        std::fs::write(&self.config, config(dropins)).unwrap();
    }

    fn command(&self) -> Command {
        let mut cmd = self.node.crio_apply(&self.config);
        cmd.args(["--output", "json"]);
        cmd
    }

    /// `crio apply --output json`: (exit code, the one JSON line, stderr).
    fn apply(&self) -> (i32, Value, String) {
        json_of(self.command().output().unwrap())
    }

    /// `systemctl show -P PROP crio.service` in the node.
    fn show(&self, prop: &str) -> String {
        self.node
            .exec_ok(&["systemctl", "show", "-P", prop, "crio.service"])
            .trim()
            .to_string()
    }

    fn main_pid(&self) -> u32 {
        self.show("MainPID").parse().unwrap()
    }

    /// How many times a CRI-O process started (its own first log line, in the node's journal).
    fn starts(&self) -> usize {
        crio_starts_in(&self.node.exec_ok(&CRIO_JOURNAL))
    }

    async fn wait_active(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let state = self.show("ActiveState");
            if state == "active" && self.node.crio_socket().exists() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "crio.service not active after 60 s ({state}):\n{}",
                self.node.journal()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// CRI-O's live configuration, as its own client prints it (`crio status config`).
    fn live(&self) -> toml::Table {
        let out = Command::new(crio_bin().join("crio"))
            .arg("status")
            .arg("--socket")
            .arg(self.node.crio_socket())
            .arg("config")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "crio status config: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .parse()
            .unwrap_or_else(|e| panic!("crio status config is not TOML: {e}"))
    }

    fn dir(&self) -> BTreeMap<String, Vec<u8>> {
        read_dir(&self.node.dropin_dir())
    }
}

fn json_of(out: Output) -> (i32, Value, String) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let line = stdout
        .lines()
        .last()
        .unwrap_or_else(|| panic!("no JSON line; stderr: {stderr}"));
    let v = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"));
    (out.status.code().unwrap_or(-1), v, stderr)
}

/// The report's (changed, restarted, unit_state).
fn assert_outcome(r: &Value, changed: bool, restarted: bool, unit_state: &str) {
    assert_eq!(
        (&r["changed"], &r["restarted"], &r["unit_state"]),
        (
            &Value::Bool(changed),
            &Value::Bool(restarted),
            &Value::from(unit_state)
        ),
        "{r}"
    );
}

fn pids_limit(live: &toml::Table) -> i64 {
    live["crio"]["runtime"]["pids_limit"].as_integer().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root (systemd-nspawn)"]
async fn a_change_restarts_the_real_crio_once_and_the_same_config_never() {
    let n = CrioNode::boot("crio-change").await;
    let (pid, starts) = (n.main_pid(), n.starts());
    assert_eq!(starts, 1, "CRI-O started once at boot");
    assert_ne!(pids_limit(&n.live()), 4096);

    // (a) A changed drop-in: one restart over D-Bus, and CRI-O runs with the value.
    n.write(&[("20-runtime.conf", PIDS_4096)]);
    let (code, r, err) = n.apply();
    assert_eq!(code, 0, "{r}\n{err}");
    assert_outcome(&r, true, true, "active");
    let pid_after = n.main_pid();
    assert_ne!(pid_after, pid, "a new CRI-O process");
    assert_eq!(n.starts(), starts + 1, "exactly one restart");
    assert_eq!(pids_limit(&n.live()), 4096);
    // What the running CRI-O said on its socket: its version over CRI, nothing ignored.
    assert_eq!(r["runtime"]["version"]["runtime_name"], "cri-o", "{r}");
    assert_eq!(r["runtime"]["version"]["runtime_version"], "1.34.0", "{r}");
    assert!(r["runtime"].get("ignored").is_none(), "{r}");
    assert!(r["runtime"].get("error").is_none(), "{r}");

    // (b) The same config again: no change, no restart.
    let (code, r, err) = n.apply();
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        (&r["changed"], &r["restarted"]),
        (&Value::Bool(false), &Value::Bool(false))
    );
    assert_eq!(n.main_pid(), pid_after);
    assert_eq!(n.starts(), starts + 1);
}

/// This CRI-O build has no `short_name_mode` (docs/dev/testing.md): the drop-in changes nothing, CRI-O says
/// nothing, and nodekeeper names the key as ignored by the running CRI-O.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root (systemd-nspawn)"]
async fn a_key_the_running_crio_does_not_read_is_named_ignored() {
    let n = CrioNode::boot("crio-ignored").await;
    assert!(
        n.live()["crio"]["image"].get("short_name_mode").is_none(),
        "this CRI-O build does not know short_name_mode"
    );
    n.write(&[
        ("11-default.conf", ENFORCING),
        ("20-runtime.conf", PIDS_2048),
    ]);
    let (code, r, err) = n.apply();
    assert_eq!(code, 0, "{r}\n{err}");
    assert_eq!(r["restarted"], true);
    let ignored = r["runtime"]["ignored"].as_array().unwrap();
    assert_eq!(ignored.len(), 1, "{r}");
    assert_eq!(
        (&ignored[0]["file"], &ignored[0]["key"], &ignored[0]["live"]),
        (
            &Value::from("11-default.conf"),
            &Value::from("crio.image.short_name_mode"),
            &Value::Null
        )
    );
    assert!(
        err.contains("does not know the key") && err.contains("short_name_mode"),
        "the warning is logged: {err}"
    );
    assert_eq!(pids_limit(&n.live()), 2048, "the other drop-in took effect");
    // And so it is: with `enforcing` and two search registries (the node's registries.conf) the short name is
    // ambiguous, yet this CRI-O tries the registries, as `disabled` does (inside the node's empty network).
    let pull = n.node.exec(&[
        "crictl",
        "--runtime-endpoint",
        "unix:///var/run/crio/crio.sock",
        "pull",
        "nk-img:1",
    ]);
    let said = String::from_utf8_lossy(&pull.stderr);
    assert!(!pull.status.success());
    assert!(
        said.contains("registry-b.invalid") && !said.contains("ambiguous"),
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root (systemd-nspawn)"]
async fn a_dropin_the_real_crio_refuses_is_rolled_back_with_crios_own_error() {
    let n = CrioNode::boot("crio-refused").await;
    n.write(&[("20-runtime.conf", PIDS_4096)]);
    assert_eq!(n.apply().0, 0);
    let good = n.dir();
    let pid = n.main_pid();

    // (c) default_runtime naming no runtime: valid TOML, a known key, refused by CRI-O alone.
    n.write(&[
        ("20-runtime.conf", PIDS_2048),
        ("30-runtime.conf", BAD_RUNTIME),
    ]);
    let t0 = Instant::now();
    let (code, r, err) = n.apply();
    assert_eq!(code, 1, "{r}\n{err}");
    assert_eq!(
        (&r["changed"], &r["restarted"], &r["rolled_back"]),
        (&Value::Bool(true), &Value::Bool(true), &Value::Bool(true)),
        "{r}"
    );
    assert_eq!(r["unit_state"], "active", "CRI-O runs again: {r}");
    let error = r["error"].as_str().unwrap();
    assert!(
        error.contains("restart of crio.service failed (job result: failed"),
        "{error}"
    );
    assert!(
        error.contains("30-runtime.conf") && error.contains("20-runtime.conf"),
        "the files rolled back: {error}"
    );
    assert!(
        error.contains("crio.service said: ") && error.contains("level=fatal"),
        "CRI-O's own error line from the journal: {error}"
    );
    assert!(error.contains("does-not-exist"), "{error}");
    assert_eq!(n.dir(), good, "the previous files, byte for byte");
    assert_ne!(n.main_pid(), pid, "restarted with the restored files");
    assert_eq!(n.show("ActiveState"), "active");
    assert_eq!(pids_limit(&n.live()), 4096);
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "rolled back in {:?}",
        t0.elapsed()
    );
}

/// Bad input: CRI-O installed but not running (as at boot, before crio.service): the files are written and
/// CRI-O is not started; a socket that does not exist is named.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root (systemd-nspawn)"]
async fn a_stopped_crio_is_not_started_and_a_missing_socket_is_named() {
    let n = CrioNode::boot("crio-stopped").await;
    n.node.exec_ok(&["systemctl", "stop", "crio.service"]);
    let starts = n.starts();
    n.write(&[("20-runtime.conf", PIDS_4096)]);
    let (code, r, err) = n.apply();
    assert_eq!(code, 0, "{r}\n{err}");
    assert_outcome(&r, true, false, "inactive");
    assert!(
        r.get("runtime").is_none(),
        "a stopped CRI-O is not asked: {r}"
    );
    assert_eq!(n.dir()["20-runtime.conf"], PIDS_4096.as_bytes());
    assert_eq!(n.show("ActiveState"), "inactive");
    assert_eq!(n.starts(), starts, "not started");

    // It reads the file when it starts.
    n.node.exec_ok(&["systemctl", "start", "crio.service"]);
    n.wait_active().await;
    assert_eq!(pids_limit(&n.live()), 4096);

    // A socket path that does not exist: the run succeeds (the files are CRI-O's) and names the socket.
    let missing = "/var/run/no-such-crio/crio.sock";
    let (code, r, err) = json_of(
        n.command()
            .env("NODEKEEPER_CRIO_SOCKET", missing)
            .output()
            .unwrap(),
    );
    assert_eq!(code, 0, "{err}");
    let error = r["runtime"]["error"].as_str().unwrap();
    assert!(
        error.contains("no-such-crio/crio.sock") && error.contains("cannot connect"),
        "{error}"
    );
    assert!(err.contains("no-such-crio/crio.sock"), "and logged: {err}");
}

/// (e) SIGKILL at random points of applies that restart the real CRI-O; after each, the next run converges:
/// complete files only, CRI-O active, with the final value.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root (systemd-nspawn)"]
async fn a_crash_mid_apply_is_finished_by_the_next_run() {
    let n = CrioNode::boot("crio-crash").await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let values = [("4096", PIDS_4096), ("2048", PIDS_2048)];
    for trial in 0..6 {
        let (want, content) = values[trial % 2];
        n.write(&[("20-runtime.conf", content)]);
        let mut child = n
            .command()
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let delay = Duration::from_millis(rng.random_range(0..1500));
        std::thread::sleep(delay);
        let _ = child.kill();
        let _ = child.wait();
        for (name, bytes) in n.dir() {
            assert!(
                name == "20-runtime.conf"
                    && (bytes == PIDS_4096.as_bytes() || bytes == PIDS_2048.as_bytes()),
                "trial {trial} (kill after {delay:?}): {name} = {:?}",
                String::from_utf8_lossy(&bytes)
            );
        }
        // The next run finishes the change (and restarts CRI-O if the killed one had not).
        let (code, r, err) = n.apply();
        assert_eq!(code, 0, "trial {trial} (kill after {delay:?}): {r}\n{err}");
        n.wait_active().await;
        assert_eq!(
            pids_limit(&n.live()).to_string(),
            want,
            "trial {trial} (kill after {delay:?})"
        );
        assert_eq!(n.dir()["20-runtime.conf"], content.as_bytes());
    }
}

/// (f) The agent as the DaemonSet runs it: a root with nothing but the binary, its libraries and the pod's
/// volumes at the manifest's mount paths (no `/var/run → /run` link, as in the `FROM scratch` image), the
/// DaemonSet's environment, the shipped ConfigMap's config plus one drop-in (the test's only change), in a
/// network namespace of its own. It applies the drop-in: one restart of the real CRI-O over the mounted bus.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root (systemd-nspawn, unshare, chroot)"]
async fn the_agent_with_the_daemonsets_mounts_applies_a_dropin() {
    let n = CrioNode::boot("crio-agent").await;
    let (pid, starts) = (n.main_pid(), n.starts());
    let pod = common::pod_root::PodRoot::agent(n.node.dir(), &n.node);
    let mut cfg: toml::Table = pod.shipped_config().parse().unwrap();
    let dropin: toml::Table = toml::from_str(&format!(
        "[[dropin]]\nname = \"20-runtime.conf\"\ncontent = '''\n{PIDS_4096}'''\n"
    ))
    .unwrap();
    cfg["crio"]
        .as_table_mut()
        .unwrap()
        .insert("dropin".into(), dropin["dropin"].clone());
    let mut agent = pod.spawn_agent(&toml::to_string(&cfg).unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    while n.starts() < starts + 1 || n.show("ActiveState") != "active" {
        assert!(
            Instant::now() < deadline,
            "the agent restarted no CRI-O in 60 s:\n{}",
            agent.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    n.wait_active().await;
    assert_ne!(n.main_pid(), pid);
    assert_eq!(pids_limit(&n.live()), 4096);
    let log = agent.stop();
    assert!(log.contains("restarted after drop-in change"), "{log}");
    assert!(
        !log.contains("cannot connect to the system D-Bus"),
        "the bus the DaemonSet mounts is the one the agent dials:\n{log}"
    );
    assert_eq!(n.starts(), starts + 1, "exactly one restart");
}

/// The agent (a process on the node, as the systemd unit runs it) reports to the controller (in-process,
/// over TLS, against the API stand-in), which records on the Node: a drop-in key the running CRI-O ignores
/// (`short_name_mode`) as `CrioConfigIgnored`, then a drop-in the real CRI-O refuses as
/// `CrioConfigRolledBack`, naming the unit, the file and CRI-O's own fatal line from the node's journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs root (systemd-nspawn)"]
async fn a_rollback_is_an_event_on_the_node_through_the_controller() {
    use common::agent_proc::{report_toml, Agent};
    use common::ctl::{Env, SERVER_NAME};
    use k8s_openapi::api::events::v1::Event;

    let n = CrioNode::boot("crio-event").await;
    let env = Env::new(1).await;
    let token = env.dir.path().join("token");
    std::fs::write(&token, env.token("n0", "nodekeeper").await + "\n").unwrap();
    let ctl = env.controller(&env.config(), true).await;
    let config = n.node.dir().join("agent.toml");
    let agent_toml = |dropin: &str| {
        format!(
            "[node]\nname = \"n0\"\n[sources]\ncloud = \"none\"\n[agent]\nshutdown_watcher = false\n\
             config_poll_interval = \"200ms\"\n[checks]\ninterval = \"1s\"\n{}\n\
             [crio]\nrestart_timeout = \"60s\"\n\
             [[crio.dropin]]\nname = \"11-default.conf\"\ncontent = '''\n{ENFORCING}'''\n\
             [[crio.dropin]]\nname = \"30-runtime.conf\"\ncontent = '''\n{dropin}'''\n",
            report_toml(ctl.addr.port(), &env.ca, SERVER_NAME, &token, "500ms")
        )
    };
    let events: kube::Api<Event> = kube::Api::namespaced(env.cluster.client.clone(), "default");
    let event = |reason: &'static str| {
        let events = events.clone();
        common::wait::until(
            Duration::from_secs(20),
            format!("a {reason} Event"),
            move || {
                let events = events.clone();
                async move {
                    let list = events
                        .list(&Default::default())
                        .await
                        .map_err(|e| e.to_string())?;
                    list.items
                        .into_iter()
                        .find(|e| e.reason.as_deref() == Some(reason))
                        .ok_or_else(|| "none yet".to_string())
                }
            },
        )
    };
    std::fs::write(&config, agent_toml(PIDS_4096)).unwrap();
    let mut agent = Agent::start(&config, &n.node.root(), &n.node.bus_address());
    agent
        .expect("restarted after drop-in change", Duration::from_secs(60))
        .await;
    let ignored = event("CrioConfigIgnored").await;
    let note = ignored.note.unwrap_or_default();
    assert!(
        note.contains("11-default.conf") && note.contains("crio.image.short_name_mode"),
        "{note}"
    );
    std::fs::write(&config, agent_toml(BAD_RUNTIME)).unwrap();
    agent
        .expect("CRI-O apply failed", Duration::from_secs(60))
        .await;
    let event = event("CrioConfigRolledBack").await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(
        event.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("n0")
    );
    let note = event.note.unwrap_or_default();
    for part in [
        "crio.service",
        "job result: failed",
        "30-runtime.conf",
        "level=fatal",
        "does-not-exist",
    ] {
        assert!(note.contains(part), "{part} in {note}");
    }
    assert_eq!(
        pids_limit(&n.live()),
        4096,
        "CRI-O runs with the restored drop-in"
    );
    agent.terminate(Duration::from_secs(10)).await;
    ctl.stop().await;
}

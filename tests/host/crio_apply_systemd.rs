//! `nodekeeper crio apply` end to end against a **stand-in** `crio.service` under a real systemd (a
//! container booted with systemd-nspawn; a drop-in containing `BROKEN` makes its start fail, one containing
//! `SLOW_START` makes it take 30 s), for what the real CRI-O cannot show quickly or at all: 50 SIGKILL trials,
//! the start limit after six starts in 10 s, restart timeouts, an unknown unit, a missing bus, files
//! nodekeeper did not create. The binary reaches that systemd through `DBUS_SYSTEM_BUS_ADDRESS`.
//! The same scenarios against the real CRI-O are tests/host/crio_real.rs.
//!
//! The CRI-O apply tests: (a) change → one restart, exact content; (b) no change → no restart;
//! (c) refused drop-in → failed restart → rollback, exit 1; (d) unknown unit → clear error, exit 1,
//! nothing changed; (e) SIGKILL at random points (≥ 50 trials) never leaves a partial or temp file
//! in the drop-in dir; (f) files nodekeeper did not create are never modified or removed.
#![allow(clippy::unwrap_used)]

use crate::support as common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::nspawn::{read_dir, NspawnNode};
use nodekeeper_core::agent::host::systemd::{Systemd, UnitManager};
use rand::{Rng, SeedableRng};

const NK: &str = env!("CARGO_BIN_EXE_nodekeeper");

const DEFAULT_CONF: &str = "[crio.image]\nshort_name_mode = \"enforcing\"\n";
const DEFAULT_CONF_2: &str =
    "[crio.image]\nshort_name_mode = \"enforcing\"\npause_image = \"registry.k8s.io/pause:3.10\"\n";
const BROKEN_CONF: &str =
    "# BROKEN: the stand-in crio refuses to start with this file\n[crio.runtime]\npids_limit = 1\n";
const ADMIN_CONF: &str =
    "# written by the node's admin, not by nodekeeper\n[crio.runtime]\nlog_level = \"info\"\n";

/// A config with `content` drop-ins (name, content) and one `settings` drop-in when `pids` is set.
fn config(unit: &str, dropins: &[(&str, &str)], pids: Option<i64>) -> String {
    config_with_timeout(unit, "20s", dropins, pids)
}

fn config_with_timeout(
    unit: &str,
    timeout: &str,
    dropins: &[(&str, &str)],
    pids: Option<i64>,
) -> String {
    let mut s = format!(
        "[crio]\nunit = \"{unit}\"\nrestart_timeout = \"{timeout}\"\nversion = \"1.34.0\"\n"
    );
    for (name, content) in dropins {
        s.push_str(&format!(
            "\n[[crio.dropin]]\nname = \"{name}\"\ncontent = '''\n{content}'''\n"
        ));
    }
    if let Some(p) = pids {
        s.push_str(&format!("\n[[crio.dropin]]\nname = \"20-runtime.conf\"\n[crio.dropin.settings.crio.runtime]\npids_limit = {p}\n"));
    }
    s
}

struct Env {
    node: NspawnNode,
    config: PathBuf,
}

impl Env {
    async fn boot(name: &str) -> Option<Env> {
        let node = NspawnNode::boot(name).await?;
        let config = node.dir().join("nodekeeper.toml");
        Some(Env { node, config })
    }

    fn write_config(&self, text: &str) {
        std::fs::write(&self.config, text).unwrap();
    }

    fn command(&self, json: bool) -> Command {
        let mut cmd = self.node.crio_apply(&self.config);
        if json {
            cmd.args(["--output", "json"]);
        }
        cmd
    }

    /// Run `crio apply --output json`; returns (exit code, the one JSON line, stderr).
    fn apply_json(&self) -> (i32, serde_json::Value, String) {
        let out = self.command(true).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "--output json must print one line, got {stdout:?}\nstderr: {}",
            stderr(&out)
        );
        let report =
            serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"));
        (out.status.code().unwrap_or(-1), report, stderr(&out))
    }

    fn apply_text(&self) -> Output {
        self.command(false).output().unwrap()
    }

    fn dir(&self) -> BTreeMap<String, Vec<u8>> {
        read_dir(&self.node.dropin_dir())
    }

    async fn crio(&self) -> nodekeeper_core::agent::host::systemd::UnitStatus {
        let systemd = Systemd::connect_address(&self.node.bus_address())
            .await
            .unwrap();
        systemd.status("crio.service").await.unwrap()
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn files(report: &serde_json::Value) -> Vec<String> {
    report["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap().to_string())
        .collect()
}

fn mtime(path: &Path) -> std::time::SystemTime {
    std::fs::metadata(path).unwrap().modified().unwrap()
}

#[tokio::test]
#[ignore = "needs root (systemd-nspawn)"]
async fn a_change_restarts_once_then_no_change_restarts_never() {
    let Some(env) = Env::boot("apply").await else {
        return;
    };
    // (f) a file nodekeeper did not create, present from the start.
    let admin = env.node.dropin_dir().join("05-admin.conf");
    std::fs::write(&admin, ADMIN_CONF).unwrap();
    let admin_mtime = mtime(&admin);
    let starts = env.node.crio_starts();
    assert_eq!(starts, 1, "boot starts crio once");

    // (a) a change: both files written, exactly one restart, unit active.
    env.write_config(&config(
        "crio.service",
        &[("11-default.conf", DEFAULT_CONF)],
        Some(4096),
    ));
    let (code, report, err) = env.apply_json();
    assert_eq!(code, 0, "{report}\n{err}");
    assert_eq!(report["changed"], true);
    assert_eq!(report["restarted"], true);
    assert_eq!(report["rolled_back"], false);
    assert_eq!(report["unit_state"], "active");
    assert_eq!(files(&report), ["11-default.conf", "20-runtime.conf"]);
    assert_eq!(env.node.crio_starts(), starts + 1, "exactly one restart");
    let status = env.crio().await;
    assert_eq!(
        (status.active_state.as_str(), status.sub_state.as_str()),
        ("active", "running")
    );
    let dir = env.dir();
    assert_eq!(
        dir.keys().collect::<Vec<_>>(),
        ["05-admin.conf", "11-default.conf", "20-runtime.conf"]
    );
    assert_eq!(
        dir["11-default.conf"],
        DEFAULT_CONF.as_bytes(),
        "content written byte for byte"
    );
    let runtime: toml::Table =
        toml::from_str(std::str::from_utf8(&dir["20-runtime.conf"]).unwrap()).unwrap();
    assert_eq!(
        runtime["crio"]["runtime"]["pids_limit"].as_integer(),
        Some(4096)
    );
    assert_eq!(runtime.len(), 1);
    // What the container (i.e. CRI-O) sees is what was written.
    assert_eq!(
        env.node
            .exec_ok(&["cat", "/etc/crio/crio.conf.d/11-default.conf"]),
        DEFAULT_CONF
    );

    // (b) the same config again: no change, no restart.
    let (code, report, err) = env.apply_json();
    assert_eq!(code, 0, "{report}\n{err}");
    assert_eq!(report["changed"], false);
    assert_eq!(report["restarted"], false);
    assert_eq!(files(&report), Vec::<String>::new());
    assert_eq!(
        env.node.crio_starts(),
        starts + 1,
        "no restart without a change"
    );
    let text = env.apply_text();
    assert_eq!(text.status.code(), Some(0));
    // The stand-in has no CRI-O socket: the text says so after the outcome.
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(
        stdout.starts_with("no change\nwarning: cannot check the drop-ins against the running CRI-O: cannot connect to CRI-O's socket"),
        "{stdout}"
    );
    assert_eq!(env.node.crio_starts(), starts + 1);
    assert_eq!(env.dir(), dir);

    // An update and a removal of an owned file: one restart; the admin's file stays.
    env.write_config(&config(
        "crio.service",
        &[("11-default.conf", DEFAULT_CONF_2)],
        None,
    ));
    let (code, report, err) = env.apply_json();
    assert_eq!(code, 0, "{report}\n{err}");
    assert_eq!(files(&report), ["11-default.conf", "20-runtime.conf"]);
    assert_eq!(env.node.crio_starts(), starts + 2);
    let dir = env.dir();
    assert_eq!(
        dir.keys().collect::<Vec<_>>(),
        ["05-admin.conf", "11-default.conf"]
    );
    assert_eq!(dir["11-default.conf"], DEFAULT_CONF_2.as_bytes());

    // (f) never modified or removed.
    assert_eq!(dir["05-admin.conf"], ADMIN_CONF.as_bytes());
    assert_eq!(mtime(&admin), admin_mtime);
}

#[tokio::test]
#[ignore = "needs root (systemd-nspawn)"]
async fn a_dropin_crio_refuses_is_rolled_back_and_exits_1() {
    let Some(env) = Env::boot("rollback").await else {
        return;
    };
    let admin = env.node.dropin_dir().join("05-admin.conf");
    std::fs::write(&admin, ADMIN_CONF).unwrap();
    env.write_config(&config(
        "crio.service",
        &[("11-default.conf", DEFAULT_CONF)],
        Some(4096),
    ));
    let (code, _, err) = env.apply_json();
    assert_eq!(code, 0, "{err}");
    let good = env.dir();
    let pid_before = env
        .node
        .exec_ok(&["systemctl", "show", "-P", "MainPID", "crio.service"]);

    // (c) 11-default.conf gets content the stand-in CRI-O refuses; 20-runtime.conf changes too.
    env.write_config(&config(
        "crio.service",
        &[("11-default.conf", BROKEN_CONF)],
        Some(1024),
    ));
    let (code, report, err) = env.apply_json();
    assert_eq!(code, 1, "{report}\n{err}");
    assert_eq!(report["changed"], true);
    assert_eq!(report["restarted"], true);
    assert_eq!(report["rolled_back"], true);
    assert_eq!(report["unit_state"], "active", "{report}");
    let error = report["error"].as_str().unwrap();
    assert!(
        error.contains("crio.service") && error.contains("failed"),
        "{error}"
    );
    assert!(
        error.contains("11-default.conf"),
        "the message names the file rolled back: {error}"
    );
    // Previous files restored byte for byte; the unit runs again, with a new process.
    assert_eq!(env.dir(), good);
    let status = env.crio().await;
    assert_eq!(
        (status.active_state.as_str(), status.sub_state.as_str()),
        ("active", "running")
    );
    assert_ne!(
        env.node
            .exec_ok(&["systemctl", "show", "-P", "MainPID", "crio.service"]),
        pid_before
    );

    // The same in text mode: exit 1 and one message naming unit, job result and file. This is
    // the sixth start in 10 s: the rollback only succeeds because apply resets the start limit.
    let out = env.apply_text();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    let path = env.node.dropin_dir().join("11-default.conf");
    assert!(
        err.contains("restart of crio.service failed (job result: failed"),
        "{err}"
    );
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert_eq!(env.dir(), good);
    assert_eq!(env.crio().await.active_state, "active", "{err}");
    // The good config still applies as a no-op afterwards.
    env.write_config(&config(
        "crio.service",
        &[("11-default.conf", DEFAULT_CONF)],
        Some(4096),
    ));
    let (code, report, _) = env.apply_json();
    assert_eq!(
        (code, &report["changed"]),
        (0, &serde_json::Value::Bool(false)),
        "{report}"
    );
}

#[tokio::test]
#[ignore = "needs root (systemd-nspawn)"]
async fn an_unknown_unit_is_a_clear_error_and_changes_nothing() {
    let Some(env) = Env::boot("nounit").await else {
        return;
    };
    std::fs::write(env.node.dropin_dir().join("05-admin.conf"), ADMIN_CONF).unwrap();
    let before = env.dir();
    let starts = env.node.crio_starts();
    env.write_config(&config(
        "no-such-crio.service",
        &[("11-default.conf", DEFAULT_CONF)],
        None,
    ));

    let out = env.apply_text();
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = stderr(&out);
    assert!(
        err.contains("no-such-crio.service") && err.contains("not found"),
        "{err}"
    );
    assert_eq!(
        err.lines().filter(|l| l.starts_with("error:")).count(),
        1,
        "{err}"
    );
    let (code, report, _) = env.apply_json();
    assert_eq!(code, 1);
    assert_eq!(report["restarted"], false);
    assert!(
        report["error"]
            .as_str()
            .unwrap()
            .contains("no-such-crio.service"),
        "{report}"
    );

    assert_eq!(env.dir(), before, "nothing written");
    assert_eq!(env.node.crio_starts(), starts, "nothing restarted");
}

/// The drop-in dir must only ever hold the admin's file and complete versions of declared files.
fn assert_clean(
    dir: &BTreeMap<String, Vec<u8>>,
    allowed: &BTreeMap<&str, Vec<&[u8]>>,
    trial: usize,
    delay: Duration,
) {
    for (name, bytes) in dir {
        let Some(versions) = allowed.get(name.as_str()) else {
            panic!("trial {trial} (kill after {delay:?}): unexpected file {name:?} in the drop-in dir: {dir:?}");
        };
        assert!(
            versions.contains(&bytes.as_slice()),
            "trial {trial} (kill after {delay:?}): {name} holds a partial or unknown content: {:?}",
            String::from_utf8_lossy(bytes)
        );
    }
    assert_eq!(
        dir.get("05-admin.conf").map(Vec::as_slice),
        Some(ADMIN_CONF.as_bytes()),
        "trial {trial}"
    );
}

#[tokio::test]
#[ignore = "needs root (systemd-nspawn)"]
async fn sigkill_at_random_points_never_leaves_partial_or_temp_files() {
    let Some(env) = Env::boot("sigkill").await else {
        return;
    };
    std::fs::write(env.node.dropin_dir().join("05-admin.conf"), ADMIN_CONF).unwrap();
    let configs = [
        config(
            "crio.service",
            &[("11-default.conf", DEFAULT_CONF)],
            Some(4096),
        ),
        config("crio.service", &[("11-default.conf", DEFAULT_CONF_2)], None),
        config(
            "crio.service",
            &[("11-default.conf", BROKEN_CONF)],
            Some(1024),
        ),
        config(
            "crio.service",
            &[
                ("11-default.conf", DEFAULT_CONF),
                ("30-extra.conf", DEFAULT_CONF_2),
            ],
            Some(1024),
        ),
    ];
    let pids = |p: i64| format!("[crio.runtime]\npids_limit = {p}\n");
    let (p4096, p1024) = (pids(4096), pids(1024));
    let allowed: BTreeMap<&str, Vec<&[u8]>> = BTreeMap::from([
        ("05-admin.conf", vec![ADMIN_CONF.as_bytes()]),
        (
            "11-default.conf",
            vec![
                DEFAULT_CONF.as_bytes(),
                DEFAULT_CONF_2.as_bytes(),
                BROKEN_CONF.as_bytes(),
            ],
        ),
        ("20-runtime.conf", vec![p4096.as_bytes(), p1024.as_bytes()]),
        ("30-extra.conf", vec![DEFAULT_CONF_2.as_bytes()]),
    ]);

    // How long an unkilled run with a restart takes: kills land anywhere in [0, 1.3 × that].
    env.write_config(&configs[0]);
    let started = Instant::now();
    let (code, _, err) = env.apply_json();
    assert_eq!(code, 0, "{err}");
    let full = started.elapsed();
    let rendered = std::fs::read(env.node.dropin_dir().join("20-runtime.conf")).unwrap();
    assert_eq!(
        rendered,
        p4096.as_bytes(),
        "settings render as expected (the allowed set relies on it)"
    );

    let seed: u64 = std::env::var("NK_SIGKILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("sigkill trials: seed {seed} (set NK_SIGKILL_SEED to replay), full run {full:?}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let max = full.mul_f64(1.3).as_micros() as u64;
    let mut killed = 0;
    let mut trials = 0;
    // Runs that find nothing to do finish early and may escape the kill: go on until ≥ 55 kills.
    while killed < 55 {
        trials += 1;
        assert!(
            trials <= 400,
            "only {killed} kills in 400 trials (seed {seed})"
        );
        let trial = trials;
        env.write_config(&configs[rng.random_range(0..configs.len())]);
        let delay = Duration::from_micros(rng.random_range(0..max.max(1)));
        let mut child = env
            .command(true)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap();
            killed += 1;
        }
        child.wait().unwrap();
        assert_clean(&env.dir(), &allowed, trial, delay);
    }
    eprintln!("sigkill trials: {killed} of {trials} runs killed before they finished");

    // A run that is not killed converges: the declared files exactly, the unit active. So many
    // restarts in a row hit systemd's start limit (5 per 10 s) and may leave crio failed: reset
    // it (it is then inactive, which apply leaves alone), apply a good config, start crio, and
    // make sure the last run has a change to apply.
    env.node
        .exec_ok(&["systemctl", "reset-failed", "crio.service"]);
    env.write_config(&configs[1]);
    let (code, report, err) = env.apply_json();
    assert_eq!(code, 0, "{report}\n{err}");
    env.node.exec_ok(&["systemctl", "start", "crio.service"]);
    env.write_config(&configs[3]);
    let (code, report, err) = env.apply_json();
    assert_eq!(code, 0, "{report}\n{err}");
    let dir = env.dir();
    assert_eq!(
        dir.keys().collect::<Vec<_>>(),
        [
            "05-admin.conf",
            "11-default.conf",
            "20-runtime.conf",
            "30-extra.conf"
        ]
    );
    assert_eq!(dir["11-default.conf"], DEFAULT_CONF.as_bytes());
    assert_eq!(dir["20-runtime.conf"], p1024.as_bytes());
    assert_eq!(dir["30-extra.conf"], DEFAULT_CONF_2.as_bytes());
    assert_eq!(env.crio().await.active_state, "active");
    let (code, report, _) = env.apply_json();
    assert_eq!(
        (code, &report["changed"], &report["restarted"]),
        (0, &false.into(), &false.into()),
        "{report}"
    );
}

#[tokio::test]
#[ignore = "needs root (systemd-nspawn)"]
async fn a_file_nodekeeper_did_not_create_is_never_overwritten() {
    let Some(env) = Env::boot("foreign").await else {
        return;
    };
    // (f) the admin's file has the name of a declared drop-in.
    let path = env.node.dropin_dir().join("11-default.conf");
    std::fs::write(&path, ADMIN_CONF).unwrap();
    let before = mtime(&path);
    let starts = env.node.crio_starts();
    env.write_config(&config(
        "crio.service",
        &[("11-default.conf", DEFAULT_CONF)],
        None,
    ));
    let out = env.apply_text();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("refusing to overwrite {}", path.display())),
        "{err}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), ADMIN_CONF.as_bytes());
    assert_eq!(mtime(&path), before);
    assert_eq!(env.node.crio_starts(), starts);

    // A config that declares nothing never removes it either.
    env.write_config(&config("crio.service", &[], None));
    let (code, report, err) = env.apply_json();
    assert_eq!(code, 0, "{report}\n{err}");
    assert_eq!(report["changed"], false);
    assert_eq!(std::fs::read(&path).unwrap(), ADMIN_CONF.as_bytes());
    assert_eq!(mtime(&path), before);
}

#[tokio::test]
#[ignore = "needs root (systemd-nspawn)"]
async fn a_restart_timeout_rolls_back_and_names_the_timeout() {
    let Some(env) = Env::boot("slow").await else {
        return;
    };
    env.write_config(&config(
        "crio.service",
        &[("11-default.conf", DEFAULT_CONF)],
        None,
    ));
    let (code, _, err) = env.apply_json();
    assert_eq!(code, 0, "{err}");
    let good = env.dir();

    // SLOW_START makes the stand-in crio's start take 30 s: longer than restart_timeout.
    let slow = "# SLOW_START\n[crio.runtime]\npids_limit = 2048\n";
    env.write_config(&config_with_timeout(
        "crio.service",
        "2s",
        &[("11-default.conf", slow)],
        None,
    ));
    let started = Instant::now();
    let out = env.apply_text();
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("restart of crio.service failed")
            && err.contains("did not finish within 2s")
            && err.contains("11-default.conf"),
        "{err}"
    );
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(10),
        "took {took:?}"
    );
    // Rolled back, and the restart with the restored files replaced the slow start.
    assert_eq!(env.dir(), good);
    assert_eq!(env.crio().await.active_state, "active");
}

#[test]
fn a_missing_bus_is_one_clear_error_and_nothing_is_written() {
    let root = tempfile::tempdir().unwrap();
    let dropins = root.path().join("etc/crio/crio.conf.d");
    std::fs::create_dir_all(&dropins).unwrap();
    let config_file = root.path().join("nodekeeper.toml");
    let text = config("crio.service", &[("11-default.conf", DEFAULT_CONF)], None);
    std::fs::write(&config_file, text).unwrap();
    let address = format!("unix:path={}/no_bus_here", root.path().display());
    let out = Command::new(NK)
        .args(["crio", "apply", "--config"])
        .arg(&config_file)
        .arg("--root")
        .arg(root.path())
        .env("DBUS_SYSTEM_BUS_ADDRESS", &address)
        .env("NODEKEEPER_LOG_LEVEL", "warn")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(
        errors[0].contains(&format!("cannot connect to the system D-Bus at {address}")),
        "{err}"
    );
    assert!(read_dir(&dropins).is_empty(), "nothing written");
}

//! `nodekeeper validate` and `nodekeeper crio apply` on bad input, through the real binary:
//! one clear message naming what and where, the documented exit code, and no partial files.
//! (Restarts against real systemd are in tests/host/crio_apply_systemd.rs.)

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn nk() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nodekeeper"));
    // No bus unless a test gives one: nothing here may reach the host's real systemd.
    c.env(
        "DBUS_SYSTEM_BUS_ADDRESS",
        "unix:path=/nonexistent/nodekeeper-test-bus",
    );
    c.env("NODEKEEPER_LOG_LEVEL", "warn");
    c
}

fn run(c: &mut Command) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = c.output().expect("run nodekeeper");
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&stdout).into(),
        String::from_utf8_lossy(&stderr).into(),
    )
}

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        let f = Self {
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::create_dir_all(f.dropins()).unwrap();
        f
    }
    fn root(&self) -> &Path {
        self.dir.path()
    }
    fn dropins(&self) -> PathBuf {
        self.root().join("etc/crio/crio.conf.d")
    }
    fn config(&self, text: &str) -> PathBuf {
        let p = self.root().join("agent.toml");
        std::fs::write(&p, text).unwrap();
        p
    }
    fn apply(&self, cfg: &Path, extra: &[&str]) -> (i32, String, String) {
        run(nk()
            .args(["crio", "apply", "--config"])
            .arg(cfg)
            .arg("--root")
            .arg(self.root())
            .args(extra))
    }
    fn listing(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.dropins())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into())
            .collect();
        v.sort();
        v
    }
}

const ONE: &str = "[[crio.dropin]]\nname = \"11-default.conf\"\ncontent = \"[crio.image]\\nshort_name_mode = \\\"enforcing\\\"\\n\"\n";

#[test]
fn version_prints_commit() {
    let (code, out, _) = run(nk().arg("--version"));
    assert_eq!(code, 0);
    assert!(
        out.starts_with(&format!("nodekeeper {} (", env!("CARGO_PKG_VERSION"))),
        "{out}"
    );
}

#[test]
fn validate_prints_effective_config_or_every_error() {
    let f = Fixture::new();
    let cfg = f.config(ONE);
    let (code, out, _) = run(nk().args(["validate", "--config"]).arg(&cfg));
    assert_eq!(code, 0);
    assert!(
        out.contains("restart_timeout = \"1m 30s\"") && out.contains("11-default.conf"),
        "{out}"
    );

    let cfg = f.config("[crio]\nunit = 3\nbogus = true\n\n[[crio.dropin]]\nname = \"../evil.conf\"\ncontent = \"x = 1\"\n");
    let (code, out, err) = run(nk().args(["validate", "--config"]).arg(&cfg));
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty());
    let file = cfg.display().to_string();
    let lines: Vec<&str> = err.lines().filter(|l| l.contains(": error: ")).collect();
    assert_eq!(lines.len(), 3, "{err}");
    assert!(
        err.contains(&format!(
            "{file}:7:11: warning: `../evil.conf`: top-level key `x` is not a CRI-O option"
        )),
        "{err}"
    );
    assert!(
        lines[0].starts_with(&format!("{file}:2:8: error: invalid type")),
        "{err}"
    );
    assert!(
        lines[1].starts_with(&format!("{file}:3:1: error: unknown field `bogus`")),
        "{err}"
    );
    assert!(
        lines[2].starts_with(&format!("{file}:6:8: error: drop-in name `../evil.conf`")),
        "{err}"
    );
}

#[test]
fn invalid_toml_is_exit_2_and_touches_nothing() {
    let f = Fixture::new();
    let cfg = f.config("[[crio.dropin]\nname = 1\n");
    let (code, out, err) = f.apply(&cfg, &["--output", "json"]);
    assert_eq!(code, 2);
    assert!(err.contains(&format!("{}:1:", cfg.display())), "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON line");
    assert_eq!(v["changed"], false);
    assert!(v["error"]
        .as_str()
        .unwrap()
        .contains("invalid configuration"));
    assert!(f.listing().is_empty());
    assert!(!f.root().join("var/lib/nodekeeper").exists());
}

#[test]
fn drop_in_content_that_crio_cannot_parse_is_refused_with_its_place() {
    let f = Fixture::new();
    let cfg =
        f.config("[[crio.dropin]]\nname = \"a.conf\"\ncontent = \"\"\"\n[crio.image\n\"\"\"\n");
    let (code, _, err) = f.apply(&cfg, &[]);
    assert_eq!(code, 2);
    assert!(
        err.contains(":3:11: error: content of `a.conf` is not valid TOML (line 1, column"),
        "{err}"
    );
    assert!(f.listing().is_empty());
}

#[test]
fn missing_bus_is_a_clear_error_and_nothing_changes() {
    let f = Fixture::new();
    let cfg = f.config(ONE);
    let (code, out, err) = f.apply(&cfg, &["--output", "json"]);
    assert_eq!(code, 1, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON line");
    let msg = v["error"].as_str().unwrap();
    assert!(
        msg.contains("cannot connect to the system D-Bus") && msg.contains("nothing was changed"),
        "{msg}"
    );
    assert_eq!(v["restarted"], false);
    assert!(f.listing().is_empty(), "no drop-in written without a bus");
}

#[test]
fn dry_run_prints_a_diff_and_touches_nothing() {
    let f = Fixture::new();
    std::fs::write(f.dropins().join("00-foreign.conf"), "x = 1\n").unwrap();
    let cfg = f.config(ONE);
    let (code, out, err) = f.apply(&cfg, &["--dry-run"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("would create") && out.contains("+short_name_mode = \"enforcing\""),
        "{out}"
    );
    assert_eq!(f.listing(), vec!["00-foreign.conf"]);
}

#[test]
fn unwritable_drop_in_dir_is_named() {
    let f = Fixture::new();
    // A regular file where the directory should be: even root cannot write below it.
    std::fs::remove_dir(f.dropins()).unwrap();
    std::fs::write(f.dropins(), "not a directory").unwrap();
    let cfg = f.config(ONE);
    let (code, _, err) = f.apply(&cfg, &[]);
    assert_eq!(code, 1);
    assert!(
        err.contains("crio.conf.d/11-default.conf") && err.contains("Not a directory"),
        "{err}"
    );
}

#[test]
fn foreign_file_in_the_way_is_refused() {
    let f = Fixture::new();
    std::fs::write(
        f.dropins().join("11-default.conf"),
        "[crio.image]\nshort_name_mode = \"disabled\"\n",
    )
    .unwrap();
    let cfg = f.config(ONE);
    let (code, _, err) = f.apply(&cfg, &[]);
    assert_eq!(code, 1);
    assert!(
        err.contains("refusing to overwrite") && err.contains("adopt = true"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(f.dropins().join("11-default.conf")).unwrap(),
        "[crio.image]\nshort_name_mode = \"disabled\"\n"
    );
}

//! Helpers shared by every integration-test binary (`tests/<binary>/main.rs` includes this
//! module with `#[path = "../support/mod.rs"] mod support;`). Not every binary uses every helper.
#![allow(dead_code)]

pub mod agent_proc;
pub mod ctl;
pub mod drain;
pub mod engine;
pub mod netns;
pub mod nspawn;
pub mod package_boot;
pub mod packaging;
pub mod policy;
pub mod wait;

use std::path::{Path, PathBuf};

/// The libtest name of the test function `f` declared in the module `module` (pass
/// `module_path!()`): the module path without the crate's name, e.g. `systemd_units::helper`.
/// For tests that re-run their own binary with `--exact NAME` (the child-process helpers).
pub fn test_name(module: &str, f: &str) -> String {
    match module.split_once("::") {
        Some((_, path)) => format!("{path}::{f}"),
        None => f.to_string(),
    }
}

/// Runs the `#[ignore]`d helper test `f` of `module` (pass `module_path!()`) in a child process of
/// this test binary, with `NK_HELPER=1` (without it a helper returns at once) and `envs`: what a
/// test must set process-wide (an environment variable) stays in that child.
pub fn run_helper(
    module: &str,
    f: &str,
    envs: &[(&str, &std::ffi::OsStr)],
) -> std::process::Output {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        test_name(module, f).as_str(),
        "--ignored",
        "--nocapture",
    ])
    .env("NK_HELPER", "1");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// The repository (the root package's directory).
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The real kubectl that `scripts/setup-kubectl.sh` installs; fails the test when it is missing.
pub fn kubectl_bin() -> PathBuf {
    let p = repo().join(".cache/venv/bin/kubectl");
    assert!(
        p.exists(),
        "real kubectl not found at {}: run scripts/setup-kubectl.sh",
        p.display()
    );
    p
}

/// A free loopback port (bind to port 0, read the port, close). Another process may take it
/// before the caller binds it; prefer a listener the code under test binds itself on port 0.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

//! Helpers shared by every integration-test binary (`tests/<binary>/main.rs` includes this
//! module with `#[path = "../support/mod.rs"] mod support;`). Not every binary uses every helper.
#![allow(dead_code)]

pub mod agent_proc;
pub mod config;
pub mod ctl;
pub mod drain;
pub mod engine;
pub mod netns;
pub mod nspawn;
pub mod package_boot;
pub mod packaging;
pub mod pod_root;
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

/// `scripts/k8s-cluster.sh up DIR ARGS…` (which starts a component again on new ports when one
/// picked for it was taken meanwhile); fails the test, naming the logs, when it fails.
pub fn k8s_cluster_up(dir: &Path, args: &[String]) {
    let out = std::process::Command::new(repo().join("scripts/k8s-cluster.sh"))
        .arg("up")
        .arg(dir)
        .args(args)
        .output()
        .expect("run scripts/k8s-cluster.sh");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "scripts/k8s-cluster.sh up {} failed (logs in {}/logs)",
        dir.display(),
        dir.display()
    );
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

/// A loopback address where nothing listens, kept so while the returned socket lives: it is
/// bound (no other process can take the port) but never listens, so a connection is refused at
/// once. For tests of an unreachable peer; never a port picked, closed and hoped to stay free.
pub fn refused_addr() -> (tokio::net::TcpSocket, std::net::SocketAddr) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = socket.local_addr().unwrap();
    (socket, addr)
}

/// The address a `nodekeeper controller` child process bound (its `listen` may name port 0): read
/// from the documented log line `controller listening` (field `addr`) in its JSON log `log` (run
/// it with `NODEKEEPER_LOG_FORMAT=json` and stderr to `log`). No test picks a free port for a
/// server it starts: the server binds port 0 and reports the address (in process:
/// `controller::Running::addr`).
pub async fn controller_addr(log: &Path) -> std::net::SocketAddr {
    wait::until(
        std::time::Duration::from_secs(30),
        format!("`controller listening` in {}", log.display()),
        || {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let addr = text
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|v| v["message"] == "controller listening")
                .and_then(|v| v["addr"].as_str().and_then(|a| a.parse().ok()));
            std::future::ready(addr.ok_or(text))
        },
    )
    .await
}

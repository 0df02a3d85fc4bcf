//! Running a test inside a private network namespace where 169.254.169.254 is a local address.
//!
//! The outer test calls [`run_inner`] with the name of an `#[ignore]`d inner test of the same
//! binary; it is re-executed under
//! `unshare -n sh -c 'ip link set lo up && ip addr add 169.254.169.254/32 dev lo && exec …'`.
//! The inner test returns at once unless [`is_child`], then calls [`assert_inside`], which refuses
//! to go on unless it runs there, so nothing is ever sent to 169.254.169.254 from the host
//! namespace. `run_inner` takes the test's full name ([`super::test_name`]).
#![allow(dead_code, clippy::unwrap_used)]

use std::process::Command;

/// Set for the inner test by [`run_inner`].
pub const MARKER_ENV: &str = "NODEKEEPER_TEST_IN_NETNS";

/// Whether this process may create network namespaces.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Re-runs this test binary's ignored test `inner` inside a new network namespace and returns
/// its stdout; panics with the full output unless exactly that one test ran and passed.
pub fn run_inner(inner: &str) -> String {
    run_inner_with(inner, &[])
}

/// [`run_inner`] with extra environment variables for the inner test (e.g. the path of a peer
/// binary the outer test built).
pub fn run_inner_with(inner: &str, envs: &[(&str, &std::ffi::OsStr)]) -> String {
    let exe = std::env::current_exe().unwrap();
    let script = "ip link set lo up && ip addr add 169.254.169.254/32 dev lo && exec \"$0\" \"$@\"";
    let out = Command::new("unshare")
        .args(["-n", "sh", "-c", script])
        .arg(&exe)
        .args([
            "--exact",
            inner,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(MARKER_ENV, "1")
        .envs(envs.iter().copied())
        .output()
        .expect("run unshare (util-linux) and ip (iproute2)");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "inner test {inner} failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("1 passed"),
        "inner test {inner} did not run:\n{stdout}\n{stderr}"
    );
    stdout
}

/// Whether this process is the child started by [`run_inner`]. The inner test returns at once
/// otherwise: it is `#[ignore]`d, and `--include-ignored` (scripts/test.sh) also runs it in the
/// host namespace, where it must do nothing.
pub fn is_child() -> bool {
    std::env::var(MARKER_ENV).as_deref() == Ok("1")
}

/// Panics unless this process was started by [`run_inner`] and 169.254.169.254 is local.
pub fn assert_inside() {
    assert_eq!(
        std::env::var(MARKER_ENV).as_deref(),
        Ok("1"),
        "only run by the outer test"
    );
    // Binding succeeds only when the address is local, i.e. in the test's namespace.
    std::net::UdpSocket::bind("169.254.169.254:0")
        .expect("169.254.169.254 must be local: refusing to run");
}

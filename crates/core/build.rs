//! Records the git commit for `nodekeeper --version`. Writes nothing into the source tree.
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    Command::new("git")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=NODEKEEPER_GIT_COMMIT={commit}");
    // Watch the files that exist: in a git worktree `.git` is a file and HEAD lives elsewhere
    // (a path that does not exist would make cargo re-run this script, and rebuild the crate,
    // on every build).
    for rel in ["HEAD", "refs/heads"] {
        if let Some(p) = git(&["rev-parse", "--git-path", rel]) {
            if std::path::Path::new(&p).exists() {
                println!("cargo:rerun-if-changed={p}");
            }
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}

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
    // Watch this checkout's HEAD and the ref file of its branch (or packed-refs when the ref is
    // packed), only files that exist: a path that does not exist makes cargo re-run this script,
    // and rebuild the crate, on every build. Not the whole `refs/heads` directory: in a git
    // worktree it is shared, so a commit on any other worktree's branch rebuilt this crate.
    let mut watch = vec!["HEAD".to_string()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.push(branch);
    }
    watch.push("packed-refs".into());
    for rel in &watch {
        if let Some(p) = git(&["rev-parse", "--git-path", rel]) {
            if std::path::Path::new(&p).exists() {
                println!("cargo:rerun-if-changed={p}");
            }
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}

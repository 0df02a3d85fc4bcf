//! Short-name resolution as real code does it, offline: Debian's buildah (containers/image, the library CRI-O
//! resolves image names with; CRI-O's `[crio.image] short_name_mode` maps onto the same modes) in an empty network
//! namespace, with private registries.conf files and every `connect()` traced. These are the facts the lint's
//! `short_name_mode` warnings state (crates/core/src/agent/crio/lint.rs):
//! - `enforcing` with two unqualified-search registries refuses an ambiguous short name locally, with zero network
//!   connects (no TTY to ask);
//! - `enforcing` with ONE search registry resolves the short name there (it tries that registry);
//! - `disabled` tries every search registry in turn: it permits short names, it does not require full ones;
//! - with no search registries, a short name fails locally in either mode: the way to require full names.

use std::path::Path;
use std::process::{Command, Stdio};

struct Pull {
    /// buildah's stderr.
    error: String,
    /// `connect()` calls to anything but a unix socket.
    inet_connects: usize,
}

fn pull(dir: &Path, mode: &str, registries: &[&str]) -> Pull {
    let conf = dir.join(format!("registries-{mode}-{}.conf", registries.len()));
    let list: Vec<String> = registries.iter().map(|r| format!("\"{r}\"")).collect();
    std::fs::write(
        &conf,
        format!(
            "unqualified-search-registries = [{}]\nshort-name-mode = \"{mode}\"\n",
            list.join(", ")
        ),
    )
    .unwrap();
    let policy = dir.join("policy.json");
    std::fs::write(
        &policy,
        r#"{"default": [{"type": "insecureAcceptAnything"}]}"#,
    )
    .unwrap();
    let trace = dir.join(format!("trace-{mode}-{}", registries.len()));
    let out = Command::new("unshare")
        .args(["--net", "strace", "-f", "-qq", "-e", "trace=connect", "-o"])
        .arg(&trace)
        .args(["buildah", "--root"])
        .arg(dir.join("store"))
        .arg("--runroot")
        .arg(dir.join("run"))
        .args(["--storage-driver", "vfs", "pull", "--signature-policy"])
        .arg(&policy)
        .arg("nk-img:1")
        .env("CONTAINERS_REGISTRIES_CONF", &conf)
        // buildah's own short-name aliases cache, kept out of the machine's $HOME
        .env("HOME", dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("unshare/strace/buildah (scripts/setup.sh installs them): {e}"));
    assert!(
        !out.status.success(),
        "nothing can be pulled offline: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let traced = std::fs::read_to_string(&trace).unwrap();
    let inet_connects = traced
        .lines()
        .filter(|l| l.contains("connect(") && !l.contains("AF_UNIX"))
        .count();
    Pull {
        error: String::from_utf8_lossy(&out.stderr).into_owned(),
        inet_connects,
    }
}

#[test]
#[ignore = "needs root (unshare --net)"]
fn short_name_modes_behave_as_the_lint_says() {
    crate::support::nspawn::require_root("short_name_modes_behave_as_the_lint_says");
    let dir = tempfile::Builder::new()
        .prefix("nk-shortname-")
        .tempdir()
        .unwrap();
    let two = ["registry-a.invalid", "registry-b.invalid"];

    let p = pull(dir.path(), "enforcing", &two);
    assert!(
        p.error
            .contains("short-name resolution enforced but cannot prompt without a TTY"),
        "{}",
        p.error
    );
    assert_eq!(p.inet_connects, 0, "refused locally: {}", p.error);

    let p = pull(dir.path(), "enforcing", &two[..1]);
    assert!(
        p.error.contains("registry-a.invalid"),
        "one search registry: enforcing resolves the short name there: {}",
        p.error
    );
    assert!(p.inet_connects > 0, "it went to the network: {}", p.error);

    let p = pull(dir.path(), "disabled", &two);
    assert!(
        p.error.contains("registry-a.invalid") && p.error.contains("registry-b.invalid"),
        "disabled tries every search registry: {}",
        p.error
    );
    assert!(p.inet_connects > 0, "{}", p.error);

    for mode in ["enforcing", "disabled"] {
        let p = pull(dir.path(), mode, &[]);
        assert!(
            p.error
                .contains("no unqualified-search registries are defined"),
            "{mode}: {}",
            p.error
        );
        assert_eq!(p.inet_connects, 0, "{mode}: refused locally: {}", p.error);
    }
}

//! The container image (packaging/Containerfile, scripts/build-image.sh).
//!
//! Building it needs two static release builds (minutes from cold), so that test is `#[ignore]`d
//! and runs with `cargo test --test host packaging_image:: -- --ignored` (CI's `scripts/test.sh`
//! includes it, after `scripts/setup.sh` built the images). The Containerfile's shape is checked in
//! every run.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The instructions of the Containerfile (comments and blank lines dropped).
fn instructions() -> Vec<(String, String)> {
    std::fs::read_to_string(repo().join("packaging/Containerfile"))
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k.to_string(), v.trim().to_string())
        })
        .collect()
}

#[test]
fn containerfile_is_scratch_static_and_non_root() {
    let ins = instructions();
    assert_eq!(
        ins[0],
        ("FROM".to_string(), "scratch".to_string()),
        "no base image"
    );
    let get =
        |k: &str| -> Vec<&String> { ins.iter().filter(|(i, _)| i == k).map(|(_, v)| v).collect() };
    assert_eq!(get("USER"), ["65532:65532"]);
    assert_eq!(get("ENTRYPOINT"), [r#"["/usr/bin/nodekeeper"]"#]);
    let copies: Vec<&str> = get("COPY")
        .iter()
        .map(|c| c.split(' ').next().unwrap())
        .collect();
    // Every COPY source is a file build-image.sh puts into the build context.
    let script = std::fs::read_to_string(repo().join("scripts/build-image.sh")).unwrap();
    for src in &copies {
        assert!(
            script.contains(&format!("\"$ctx/{src}\"")),
            "COPY {src}: not prepared by scripts/build-image.sh"
        );
    }
    assert!(copies.contains(&"ca-certificates.crt") && copies.contains(&"nodekeeper"));
}

#[test]
#[ignore = "builds two static release binaries and the images (minutes cold): cargo test --test host packaging_image:: -- --ignored"]
fn image_builds_and_its_binary_runs() {
    let out = Command::new(repo().join("scripts/build-image.sh"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "build-image.sh: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let field = |k: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("no {k}= in:\n{stdout}"))
            .to_string()
    };
    assert!(field("version").contains(env!("CARGO_PKG_VERSION")));
    assert!(!field("version").contains("agent build"));
    assert_eq!(field("user"), "65532:65532");
    assert!(field("binary").ends_with("static"));
    // the DaemonSet's image: the agent build
    assert!(field("agent_image").contains("nodekeeper-agent:"));
    assert!(field("agent_version").contains("agent build"));
    assert_eq!(field("agent_user"), "65532:65532");
    assert!(field("agent_binary").ends_with("static"));
    // The binary that went into the image is static: it runs without any loader or libc.
    let bin = repo().join("target/x86_64-unknown-linux-gnu/release/nodekeeper");
    let ldd = Command::new("ldd").arg(&bin).output().unwrap();
    assert!(
        !ldd.status.success() || String::from_utf8_lossy(&ldd.stdout).contains("statically linked")
    );
    // The controller's image is the controller build: no API stand-in, no demo.
    let help = Command::new(&bin).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("controller"), "{help}");
    for absent in ["\n  demo ", "\n  sim "] {
        assert!(
            !help.contains(absent),
            "the controller image has{absent}:\n{help}"
        );
    }
}

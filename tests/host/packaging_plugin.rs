//! The kubectl plugin archive and its krew manifest (scripts/package-plugin.sh): the archive holds
//! the binary, the `kubectl-nodekeeper` symlink and the licence; the manifest names the archive's
//! sha256, and what krew would link (`bin`, started as `kubectl-nodekeeper`) runs the plugin.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::Command;

use sha2::Digest;

use crate::support::repo;

#[test]
fn the_plugin_archive_and_its_krew_manifest_match() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(repo().join("scripts/package-plugin.sh"))
        .env("NODEKEEPER_BIN", env!("CARGO_BIN_EXE_nodekeeper"))
        .env(
            "NODEKEEPER_PLUGIN_URI",
            "https://example.invalid/kubectl-nodekeeper.tar.gz",
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let archive = PathBuf::from(
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .last()
            .unwrap(),
    );
    assert_eq!(
        archive.file_name().unwrap().to_str().unwrap(),
        format!(
            "kubectl-nodekeeper_{}_linux_amd64.tar.gz",
            env!("CARGO_PKG_VERSION")
        )
    );

    // Its entries: the binary, the symlink to it, the licence.
    let list = Command::new("tar")
        .arg("-tvzf")
        .arg(&archive)
        .output()
        .unwrap();
    let list = String::from_utf8(list.stdout).unwrap();
    let entries: Vec<&str> = list.lines().collect();
    assert_eq!(entries.len(), 4, "{list}");
    assert!(
        entries
            .iter()
            .any(|l| l.starts_with("-rwxr-xr-x") && l.ends_with(" nodekeeper")),
        "{list}"
    );
    assert!(
        entries
            .iter()
            .any(|l| l.ends_with(" kubectl-nodekeeper -> nodekeeper")),
        "{list}"
    );
    assert!(
        entries
            .iter()
            .any(|l| l.ends_with(" kubectl_complete-nodekeeper -> nodekeeper")),
        "{list}"
    );
    assert!(entries.iter().any(|l| l.ends_with(" LICENSE")), "{list}");

    // The manifest: filled in, the archive's sha256, what krew links.
    let manifest_path = archive.with_file_name("nodekeeper.yaml");
    let text = std::fs::read_to_string(&manifest_path).unwrap();
    assert!(!text.contains("{{"), "unfilled placeholder:\n{text}");
    let m: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    assert_eq!(
        m["apiVersion"],
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(m["kind"], "Plugin");
    assert_eq!(m["metadata"]["name"], "nodekeeper");
    assert_eq!(
        m["spec"]["version"].as_str().unwrap(),
        format!("v{}", env!("CARGO_PKG_VERSION"))
    );
    let p = &m["spec"]["platforms"][0];
    assert_eq!(p["selector"]["matchLabels"]["os"], "linux");
    assert_eq!(
        p["uri"],
        "https://example.invalid/kubectl-nodekeeper.tar.gz"
    );
    let sha = hex::encode(sha2::Sha256::digest(std::fs::read(&archive).unwrap()));
    assert_eq!(p["sha256"].as_str().unwrap(), sha);
    assert_eq!(p["bin"], "nodekeeper");
    let froms: Vec<&str> = p["files"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|f| f["from"].as_str().unwrap())
        .collect();
    assert!(froms.contains(&"nodekeeper"), "{froms:?}");

    // Unpacked, and linked as krew links it: the plugin's commands.
    let unpacked = dir.path().join("unpacked");
    std::fs::create_dir_all(&unpacked).unwrap();
    let st = Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(&unpacked)
        .status()
        .unwrap();
    assert!(st.success());
    let krew_link = dir.path().join("kubectl-nodekeeper");
    std::os::unix::fs::symlink(unpacked.join("nodekeeper"), &krew_link).unwrap();
    for exe in [krew_link, unpacked.join("kubectl-nodekeeper")] {
        let help = Command::new(&exe).arg("--help").output().unwrap();
        let help = String::from_utf8(help.stdout).unwrap();
        assert!(
            help.contains("Usage: kubectl nodekeeper") && help.contains("explain"),
            "{}: {help}",
            exe.display()
        );
    }
    // kubectl's completion helper answers in cobra's protocol.
    let done = Command::new(unpacked.join("kubectl_complete-nodekeeper"))
        .arg("ex")
        .output()
        .unwrap();
    let done = String::from_utf8(done.stdout).unwrap();
    assert!(
        done.starts_with("explain\t") && done.ends_with("\n:4\n"),
        "{done}"
    );
    // Started by its own name, it is nodekeeper.
    let help = Command::new(unpacked.join("nodekeeper"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(String::from_utf8(help.stdout)
        .unwrap()
        .contains("Usage: nodekeeper"));
}

//! `--kubeconfig-out` of the real binary is accepted by kube-rs `Client::try_default()` via KUBECONFIG.
#![allow(clippy::unwrap_used)]

use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use tokio::io::AsyncBufReadExt;

/// Starts the real binary with `extra` args; returns the child and its first stdout line.
async fn start_binary(kc: &std::path::Path, extra: &[&str]) -> (tokio::process::Child, String) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(["sim", "apiserver", "--listen", "127.0.0.1:0", "--no-loops"])
        .args(extra)
        .arg("--kubeconfig-out")
        .arg(kc)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    (child, first)
}

/// `Client::try_default()` with `KUBECONFIG=kc`, in a child process (this test binary again,
/// running [`helper_try_default`]): the variable is set only there, so the other tests of this
/// binary, which share its process, never see it.
fn five_nodes_via_try_default(kc: &std::path::Path) {
    let out = crate::support::run_helper(
        module_path!(),
        "helper_try_default",
        &[("KUBECONFIG", kc.as_os_str())],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("NK-HELPER nodes 5 namespace default"),
        "{stdout}"
    );
}

/// Run in a child process by [`binary_kubeconfig_works_with_try_default`], with KUBECONFIG set.
#[tokio::test]
#[ignore = "helper: run in a child process by binary_kubeconfig_works_with_try_default"]
async fn helper_try_default() {
    if std::env::var_os("NK_HELPER").is_none() {
        eprintln!("helper_try_default: a helper, only meaningful when run by its parent test");
        return;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = kube::Client::try_default().await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes.list(&ListParams::default()).await.unwrap();
    println!(
        "NK-HELPER nodes {} namespace {}",
        list.items.len(),
        client.default_namespace()
    );
}

/// Plain HTTP, then `--tls` (a generated CA in the kubeconfig): kube-rs `Client::try_default()`
/// accepts both (the default scenario's 5 nodes, namespace `default`).
#[tokio::test]
async fn binary_kubeconfig_works_with_try_default() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kc/config");
    let (mut child, first) = start_binary(&kc, &[]).await;
    assert!(first.contains("listening on http://127.0.0.1:"), "{first}");
    five_nodes_via_try_default(&kc);
    child.kill().await.unwrap();

    let kc = dir.path().join("kc/tls-config");
    let (mut child, first) = start_binary(&kc, &["--tls"]).await;
    assert!(first.contains("listening on https://127.0.0.1:"), "{first}");
    let text = std::fs::read_to_string(&kc).unwrap();
    assert!(text.contains("certificate-authority-data: "), "{text}");
    five_nodes_via_try_default(&kc);
    child.kill().await.unwrap();
}

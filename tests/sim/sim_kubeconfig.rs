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

async fn five_nodes_via_try_default(kc: &std::path::Path) {
    // Only one test in this binary sets the variable, so this cannot race.
    std::env::set_var("KUBECONFIG", kc);
    let client = kube::Client::try_default().await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 5, "the default scenario has 5 nodes");
    assert_eq!(client.default_namespace(), "default");
}

/// Plain HTTP, then `--tls` (a generated CA in the kubeconfig): kube-rs `Client::try_default()`
/// accepts both. One test, so setting KUBECONFIG cannot race with another test.
#[tokio::test]
async fn binary_kubeconfig_works_with_try_default() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kc/config");
    let (mut child, first) = start_binary(&kc, &[]).await;
    assert!(first.contains("listening on http://127.0.0.1:"), "{first}");
    five_nodes_via_try_default(&kc).await;
    child.kill().await.unwrap();

    let kc = dir.path().join("kc/tls-config");
    let (mut child, first) = start_binary(&kc, &["--tls"]).await;
    assert!(first.contains("listening on https://127.0.0.1:"), "{first}");
    let text = std::fs::read_to_string(&kc).unwrap();
    assert!(text.contains("certificate-authority-data: "), "{text}");
    five_nodes_via_try_default(&kc).await;
    child.kill().await.unwrap();
}

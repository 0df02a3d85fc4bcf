//! `--kubeconfig-out` of the real binary is accepted by kube-rs `Client::try_default()` via KUBECONFIG.
#![allow(clippy::unwrap_used)]

use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use tokio::io::AsyncBufReadExt;

#[tokio::test]
async fn binary_kubeconfig_works_with_try_default() {
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kc/config");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args([
            "sim",
            "apiserver",
            "--listen",
            "127.0.0.1:0",
            "--no-loops",
            "--kubeconfig-out",
        ])
        .arg(&kc)
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
    assert!(first.contains("listening on http://127.0.0.1:"), "{first}");
    // The only test in this binary: setting the variable cannot race with other tests.
    std::env::set_var("KUBECONFIG", &kc);
    let client = kube::Client::try_default().await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 5, "the default scenario has 5 nodes");
    assert_eq!(client.default_namespace(), "default");
    child.kill().await.unwrap();
}

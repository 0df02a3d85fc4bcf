//! `[budgets] source = "nodepool"` without Karpenter: the real control plane of `support::cluster()`
//! serves no `karpenter.sh` API (no Karpenter CRDs), so `nodekeeper controller`, as the shipped
//! controller ServiceAccount (whose ClusterRole grants `list, watch` on `nodepools`), refuses to start:
//! exit 1, before listening, with an error naming the missing NodePool CRD.
//!
//! Real only: the sim serves `nodepools` (its NodePool scenario is
//! tests/sim/engine_nodepool_budgets.rs); the real cluster with Karpenter's CRDs
//! (`support::karpenter_cluster()`) has no nodekeeper manifests to run the controller as.

use std::time::Duration;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodekeeper_controller_refuses_to_start_without_the_nodepool_crd() {
    init_tracing();
    let c = cluster();
    let admin = c.admin().await;
    let dir = tempfile::tempdir().unwrap();
    let config = controller_toml(dir.path(), "nodepool-absent", |t| {
        t.entry("budgets")
            .or_insert_with(|| toml::Table::new().into())
            .as_table_mut()
            .unwrap()
            .insert("source".into(), "nodepool".into());
    });
    let token = sa_token(&admin, NS, CONTROLLER_SA, None, None).await;
    let kubeconfig = dir.path().join("controller.kubeconfig");
    c.write_token_kubeconfig(&kubeconfig, &token);
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
            .args(["controller", "--config"])
            .arg(&config)
            .env("KUBECONFIG", &kubeconfig)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the controller exits at once")
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "[budgets] source = \"nodepool\" needs Karpenter's NodePool CRD, but the API server does not serve karpenter.sh/v1 nodepools (404)"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("controller listening"), "{stderr}");
}

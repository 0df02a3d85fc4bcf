//! The report API on the real API server: the agent's token is a real bound ServiceAccount token
//! (TokenRequest with `boundObjectRef` = the shipped DaemonSet's pod on that node, audience
//! `nodekeeper`), reviewed by the real TokenReview as the controller's own ServiceAccount.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use nodekeeper_core::agent::checks::ConditionStatus;
use nodekeeper_core::controller::config::ControllerConfig;

use crate::ctl;
use crate::support::*;

/// The `[controller]` config of the shipped ConfigMap (manifests/21-controller-config.yaml), made to
/// listen on loopback with test TLS material and a short lease.
pub fn shipped_controller_config(dir: &std::path::Path) -> ControllerConfig {
    let (_, cert, key) = ctl::write_certs(dir);
    let yaml = std::fs::read_to_string(repo().join("manifests/21-controller-config.yaml")).unwrap();
    let cm: serde_json::Value = serde_yaml::from_str(&yaml).unwrap();
    let text = cm["data"]["config.toml"].as_str().unwrap();
    let full: toml::Value = toml::from_str(text).unwrap();
    let mut c: ControllerConfig = full["controller"].clone().try_into().unwrap();
    c.listen = "127.0.0.1:0".into();
    c.tls_cert_file = Some(cert);
    c.tls_key_file = Some(key);
    c.leader.lease_duration = Duration::from_secs(3);
    c.leader.retry_period = Duration::from_millis(300);
    assert!(c.validate().is_empty(), "{:?}", c.validate());
    c
}

on_both!(a_bound_agent_token_reports_for_its_own_node_only);
async fn a_bound_agent_token_reports_for_its_own_node_only(c: &'static Cluster) {
    init_tracing();
    let admin = c.admin().await;
    let _nodes = c
        .create_nodes(&[
            kwok_node("id-a", serde_json::json!({})),
            kwok_node("id-b", serde_json::json!({})),
        ])
        .await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = shipped_controller_config(dir.path());
    let ctl_client = controller_client(c).await;
    let running = nodekeeper_core::controller::start(ctl_client, &cfg)
        .await
        .unwrap();
    crate::shared::wait::until(
        Duration::from_secs(20),
        "the controller ready and leading",
        || {
            std::future::ready(
                running.app.ready.load(std::sync::atomic::Ordering::Relaxed)
                    && *running.app.leader.borrow(),
            )
        },
    )
    .await;

    let (pod_a, uid_a) = agent_pod_on(&admin, "id-a").await;
    let token_a = sa_token(
        &admin,
        NS,
        AGENT_SA,
        Some(REPORT_AUDIENCE),
        Some((&pod_a, &uid_a)),
    )
    .await;
    let https = ctl::https(&dir.path().join("ca.pem"), running.addr);

    // Its own node: accepted, and the condition lands on the Node (written as the controller SA).
    let r = ctl::report(
        "id-a",
        1,
        &[("NodekeeperDiskPressure", ConditionStatus::False)],
    );
    let (code, body) = post_report(&https, running.addr, &token_a, &r).await;
    assert_eq!(code, 200, "{body}");
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_until(Duration::from_secs(10), "the condition on id-a", || {
        let nodes = nodes.clone();
        async move {
            ctl::conditions(&nodes, "id-a")
                .await
                .contains_key("NodekeeperDiskPressure")
        }
    })
    .await;

    // Another node's report with the same token: refused, and nothing written there.
    let r = ctl::report(
        "id-b",
        1,
        &[("NodekeeperDiskPressure", ConditionStatus::True)],
    );
    let (code, body) = post_report(&https, running.addr, &token_a, &r).await;
    assert_eq!(code, 403, "{body}");
    assert!(ctl::conditions(&nodes, "id-b").await.is_empty());

    // A token of the right account but the API server's audience: refused by the real TokenReview.
    let wrong_aud = sa_token(&admin, NS, AGENT_SA, None, Some((&pod_a, &uid_a))).await;
    let r = ctl::report("id-a", 2, &[]);
    let (code, body) = post_report(&https, running.addr, &wrong_aud, &r).await;
    assert_eq!(code, 401, "{body}");

    // The controller's own account (right audience, wrong identity): refused.
    let ctl_tok = sa_token(&admin, NS, CONTROLLER_SA, Some(REPORT_AUDIENCE), None).await;
    let (code, body) = post_report(&https, running.addr, &ctl_tok, &r).await;
    assert!(code == 403 || code == 401, "{code} {body}");

    // The agent pod's token, while its pod lives, is reviewed once for its life (the controller
    // watches the agent pods): more reports, no more TokenReviews. Until the controller's pod
    // watch holds the pod (it may lag the DaemonSet's pod under load), each report is reviewed:
    // reports go until one is not, then three more must not be either.
    let reviews = || {
        running
            .app
            .auth
            .reviews
            .load(std::sync::atomic::Ordering::SeqCst)
    };
    let addr = running.addr;
    let report_a = |seq: u64| {
        let https = https.clone();
        let token = token_a.clone();
        async move {
            let (code, body) =
                post_report(&https, addr, &token, &ctl::report("id-a", seq, &[])).await;
            assert_eq!(code, 200, "{body}");
        }
    };
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut seq = 3;
    loop {
        let before = reviews();
        report_a(seq).await;
        seq += 1;
        if reviews() == before {
            break;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "the live pod's token is still reviewed on every report after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let before = reviews();
    for seq in seq..seq + 3 {
        report_a(seq).await;
    }
    assert_eq!(reviews(), before, "the live pod's token was reviewed again");
    // The pod deleted (its DaemonSet makes another): its token stops working as soon as the API
    // server refuses it (gone, or 60 s into its termination), not after a cache lifetime.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(admin.clone(), NS);
    pods.delete(&pod_a, &Default::default()).await.unwrap();
    let deleted = tokio::time::Instant::now();
    let (mut seq, addr) = (seq + 3, running.addr);
    wait_until(
        Duration::from_secs(90),
        "the deleted pod's token refused",
        || {
            seq += 1;
            let report = ctl::report("id-a", seq, &[]);
            let (https, token) = (https.clone(), token_a.clone());
            async move { post_report(&https, addr, &token, &report).await.0 == 401 }
        },
    )
    .await;
    eprintln!(
        "the deleted pod's token refused {:?} after the deletion",
        deleted.elapsed()
    );
    running.stop().await;
}

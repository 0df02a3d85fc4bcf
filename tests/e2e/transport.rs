//! The controller's Kubernetes clients as the product builds them (`k8s::client::client`, and the
//! drain's `drain::client`), authenticated as the shipped controller ServiceAccount: kube-apiserver
//! (and the sim, which must serve what it serves) offers HTTP/2 by ALPN, and every request in flight
//! is a stream of one connection rather than a connection (and a TLS handshake) of its own.

use futures::future::join_all;
use http::{Request, StatusCode, Version};
use kube::client::Body;

use crate::support::*;

/// A node list, then 16 at once (on the first one's connection); each one's status and HTTP version.
async fn lists_at_once(client: &kube::Client) -> Vec<(StatusCode, Version)> {
    let list = || async {
        let req = Request::get("/api/v1/nodes?limit=1")
            .body(Body::empty())
            .unwrap();
        let resp = client.send(req).await.expect("GET nodes");
        (resp.status(), resp.version())
    };
    let mut answers = vec![list().await];
    answers.extend(join_all((0..16).map(|_| list())).await);
    answers
}

on_both!(the_controllers_clients_speak_http2_as_its_service_account);
async fn the_controllers_clients_speak_http2_as_its_service_account(c: &'static Cluster) {
    init_tracing();
    let admin = c.admin().await;
    let token = sa_token(&admin, NS, CONTROLLER_SA, None, None).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("controller.kubeconfig");
    c.write_token_kubeconfig(&path, &token);
    let cfg = nodekeeper_core::k8s::client::config(Some(&path), None)
        .await
        .unwrap();
    let clients = [
        (
            "controller",
            nodekeeper_core::k8s::client::client(cfg.clone()).unwrap(),
        ),
        (
            "drain",
            nodekeeper_core::controller::drain::client(cfg).unwrap(),
        ),
    ];
    for (which, client) in clients {
        let answers = lists_at_once(&client).await;
        assert!(
            answers
                .iter()
                .all(|a| *a == (StatusCode::OK, Version::HTTP_2)),
            "{which}: {answers:?}"
        );
    }
}

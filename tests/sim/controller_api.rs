//! The report API against `nodekeeper sim` over real TLS with sim-minted tokens.
//!
//! Sim only: sim-minted tokens at a chosen expiry; real bound tokens run on both in `tests/e2e`
//! (`identity`).

use crate::support::ctl;

use std::time::Duration;

use ctl::*;
use nodekeeper_core::agent::checks::ConditionStatus::{False, True};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn authn_authz_replay_and_conditions() {
    let env = Env::new(2).await;
    let ctl = env.controller(&env.config(), true).await;
    let http = https(&env.ca, ctl.addr);
    let nodes = env.nodes();
    let t0 = env.token("n0", "nodekeeper").await;

    // Health endpoints.
    assert_eq!(get(&http, ctl.addr, "/livez").await.unwrap().0, 200);
    assert_eq!(get(&http, ctl.addr, "/readyz").await.unwrap().0, 200);

    // A report about another node with n0's token: 403 and n1 untouched.
    let forged =
        serde_json::to_value(report("n1", 1, &[("NodekeeperDiskPressure", True)])).unwrap();
    let (code, _) = post(&http, ctl.addr, Some(&t0), &forged).await;
    assert_eq!(code, 403);
    assert!(
        conditions(&nodes, "n1").await.is_empty(),
        "forged report changed n1"
    );

    // Wrong audience, unknown token, no token: 401.
    let wrong_aud = env.token("n0", "https://kubernetes.default.svc").await;
    let own = serde_json::to_value(report("n0", 1, &[("NodekeeperDiskPressure", True)])).unwrap();
    assert_eq!(post(&http, ctl.addr, Some(&wrong_aud), &own).await.0, 401);
    assert_eq!(post(&http, ctl.addr, Some("sim.bogus"), &own).await.0, 401);
    assert_eq!(post(&http, ctl.addr, None, &own).await.0, 401);
    // Another service account: 403.
    let other_sa = token_for(&env.cluster, "n0", "nodekeeper", "default").await;
    assert_eq!(post(&http, ctl.addr, Some(&other_sa), &own).await.0, 403);
    // Unknown schema version: 400. Oversized: 413.
    let mut v2 = own.clone();
    v2["version"] = json!(2);
    assert_eq!(post(&http, ctl.addr, Some(&t0), &v2).await.0, 400);
    let mut big = own.clone();
    big["problems"] = json!(["x".repeat(2 << 20)]);
    // The controller answers 413 from the declared length (its body limit) and closes the
    // connection without reading the body: a client still writing may see that close (a broken pipe or a reset)
    // before it reads the answer. Either way the report is refused.
    let sent = send(
        http.post(url(ctl.addr, "/v1/reports"))
            .bearer_auth(&t0)
            .json(&big),
    )
    .await;
    match sent {
        Ok((code, _)) => assert_eq!(code, 413),
        Err(e) => assert!(
            e.contains("Broken pipe") || e.contains("reset"),
            "oversized report: {e}"
        ),
    }
    assert!(conditions(&nodes, "n0").await.is_empty());

    // A valid report writes the conditions.
    let two = serde_json::to_value(report(
        "n0",
        1,
        &[
            ("NodekeeperDiskPressure", True),
            ("NodekeeperMemoryPressure", False),
        ],
    ))
    .unwrap();
    let (code, body) = post(&http, ctl.addr, Some(&t0), &two).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["accepted"], true);
    let c1 = conditions(&nodes, "n0").await;
    assert_eq!(c1["NodekeeperDiskPressure"].0, "True");
    assert_eq!(c1["NodekeeperDiskPressure"].1, "Because");
    assert_eq!(c1["NodekeeperMemoryPressure"].0, "False");

    // Replay of the same sequence: ignored, no write.
    let writes = ctl
        .app
        .states
        .counters
        .node_writes
        .load(std::sync::atomic::Ordering::Relaxed);
    let mut changed_replay =
        serde_json::to_value(report("n0", 1, &[("NodekeeperDiskPressure", False)])).unwrap();
    changed_replay["generated_at"] = json!(chrono::Utc::now());
    let (code, body) = post(&http, ctl.addr, Some(&t0), &changed_replay).await;
    assert_eq!((code, body["accepted"].clone()), (200, json!(false)));
    assert_eq!(
        ctl.app
            .states
            .counters
            .node_writes
            .load(std::sync::atomic::Ordering::Relaxed),
        writes
    );
    assert_eq!(
        conditions(&nodes, "n0").await["NodekeeperDiskPressure"].0,
        "True"
    );

    // Status change: transition time moves for that type only (times have second resolution).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let flip = serde_json::to_value(report(
        "n0",
        2,
        &[
            ("NodekeeperDiskPressure", False),
            ("NodekeeperMemoryPressure", False),
        ],
    ))
    .unwrap();
    assert_eq!(post(&http, ctl.addr, Some(&t0), &flip).await.0, 200);
    let c2 = conditions(&nodes, "n0").await;
    assert_eq!(c2["NodekeeperDiskPressure"].0, "False");
    assert_ne!(
        c2["NodekeeperDiskPressure"].2, c1["NodekeeperDiskPressure"].2,
        "transition time must change"
    );
    assert_eq!(
        c2["NodekeeperMemoryPressure"].2, c1["NodekeeperMemoryPressure"].2,
        "unchanged status keeps its transition time"
    );
    assert_ne!(
        c2["NodekeeperMemoryPressure"].3, c1["NodekeeperMemoryPressure"].3,
        "heartbeat refreshed on write"
    );

    // The token was reviewed once and then served from the cache.
    // Reviews: t0 once, wrong audience, bogus, other SA (no token: no review).
    assert_eq!(
        ctl.app
            .auth
            .reviews
            .load(std::sync::atomic::Ordering::Relaxed),
        4
    );

    // Label removal: allow-listed key removed, other key kept and denied.
    let mut lr = report(
        "n0",
        3,
        &[
            ("NodekeeperDiskPressure", False),
            ("NodekeeperMemoryPressure", False),
        ],
    );
    lr.label_removals = vec![
        nodekeeper_core::wire::LabelRemoval {
            label: "last-migration-failure".into(),
            reason: "cilium Ready".into(),
        },
        nodekeeper_core::wire::LabelRemoval {
            label: "keep".into(),
            reason: "not allowed".into(),
        },
    ];
    assert_eq!(
        post(
            &http,
            ctl.addr,
            Some(&t0),
            &serde_json::to_value(&lr).unwrap()
        )
        .await
        .0,
        200
    );
    let labels = nodes.get("n0").await.unwrap().metadata.labels.unwrap();
    assert!(!labels.contains_key("last-migration-failure"));
    assert_eq!(labels["keep"], "x");
    let n1_labels = nodes.get("n1").await.unwrap().metadata.labels.unwrap();
    assert!(
        n1_labels.contains_key("last-migration-failure"),
        "other node untouched"
    );

    let metrics = get(&http, ctl.addr, "/metrics").await.unwrap().1;
    assert!(
        metrics.contains("nodekeeper_reports_forbidden_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("nodekeeper_report_replays_total 1"),
        "{metrics}"
    );
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plain_https_client_without_the_ca_is_refused() {
    let env = Env::new(1).await;
    let ctl = env.controller(&env.config(), true).await;
    install_crypto();
    let other = tempfile::tempdir().unwrap();
    let (other_ca, _, _) = write_certs(other.path());
    let wrong = https(&other_ca, ctl.addr);
    let err = get(&wrong, ctl.addr, "/livez").await.unwrap_err();
    assert!(
        err.contains("certificate") || err.contains("UnknownIssuer"),
        "{err}"
    );
    assert_eq!(
        get(&https(&env.ca, ctl.addr), ctl.addr, "/livez")
            .await
            .unwrap()
            .0,
        200
    );
    ctl.stop().await;
}

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
    let mut v3 = own.clone();
    v3["version"] = json!(3);
    assert_eq!(post(&http, ctl.addr, Some(&t0), &v3).await.0, 400);
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

/// A golden report body of `tests/fixtures/reports/`.
fn golden(name: &str) -> serde_json::Value {
    let path = crate::support::repo()
        .join("tests/fixtures/reports")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// The golden body of the current version is what this build writes: read and written again,
/// it is the same JSON (a field added to `NodeReport` fails here until the golden body has it).
/// The previous version's reads as the same report but for its version and problem sources.
#[test]
fn golden_report_bodies_match_the_schema_of_their_version() {
    use nodekeeper_core::wire::{
        parse_body, parse_versioned, Problem, ACCEPTED_REPORT_VERSIONS, REPORT_VERSION,
    };
    assert_eq!(
        ACCEPTED_REPORT_VERSIONS,
        [1, 2],
        "a golden body per accepted version"
    );
    let v2 = golden("v2.json");
    let read = parse_body(v2.to_string().as_bytes()).unwrap();
    assert_eq!(read.version, REPORT_VERSION);
    assert_eq!(
        serde_json::to_value(&read).unwrap(),
        v2,
        "v2.json vs what the agent writes"
    );
    let (version, mut v1) = parse_versioned(golden("v1.json").to_string().as_bytes()).unwrap();
    assert_eq!((version, v1.version), (1, REPORT_VERSION));
    assert_eq!(
        v1.problems,
        vec![
            Problem::new("", "aws imds: invalid JSON"),
            Problem::new("", "check kmsg: 2 malformed records skipped"),
        ]
    );
    // Besides the version, the problems' sources and the ids, v1.json carries what v2.json does.
    v1.problems.clone_from(&read.problems);
    v1.agent_version.clone_from(&read.agent_version);
    v1.agent_instance.clone_from(&read.agent_instance);
    for e in &mut v1.events {
        e.id = e.id.replace("-v1", "-v2");
        if let nodekeeper_core::wire::EventKind::Cancelled { of } = &mut e.kind {
            *of = of.replace("-v1", "-v2");
        }
    }
    assert_eq!(v1, read);
}

/// Version skew over the real report API: the golden body of each accepted version is taken
/// (its conditions written, its notices acknowledged), the older one counted and answered with a
/// `Warning`; a body of a future version is refused with 400 naming the accepted versions, and
/// nothing of it is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn golden_reports_of_each_accepted_version_are_taken_a_future_one_refused() {
    let env = Env::new(1).await;
    let ctl = env.controller(&env.config(), true).await;
    let http = https(&env.ca, ctl.addr);
    let nodes = env.nodes();
    let t0 = env.token("n0", "nodekeeper").await;
    let send_golden = |name: &'static str| {
        let body = golden(name);
        let req = http
            .post(url(ctl.addr, "/v1/reports"))
            .bearer_auth(&t0)
            .json(&body);
        async move {
            let resp = req.send().await.unwrap();
            let code = resp.status().as_u16();
            let warning = resp
                .headers()
                .get("warning")
                .map(|v| v.to_str().unwrap().to_string());
            let body: serde_json::Value = resp.json().await.unwrap();
            (code, warning, body)
        }
    };

    // A future version: 400 naming the accepted versions, nothing written.
    let (code, warning, body) = send_golden("v3-future.json").await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(warning, None);
    assert_eq!(
        body["error"],
        "unsupported report version 3; this controller accepts report versions 1, 2"
    );
    assert_eq!(body["accepted_versions"], json!([1, 2]));
    assert!(
        conditions(&nodes, "n0").await.is_empty(),
        "a refused report wrote conditions"
    );

    // The previous version: taken, with a warning.
    let (code, warning, body) = send_golden("v1.json").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["accepted"], true);
    assert_eq!(
        body["acknowledged_events"],
        json!(["oci-3a2b-v1", "oci-9f-v1"])
    );
    let warning = warning.expect("a Warning header for a report of version 1");
    assert!(
        warning.starts_with("299 - \"report version 1 is deprecated")
            && warning.contains("accepts versions 1, 2"),
        "{warning}"
    );
    let conds = conditions(&nodes, "n0").await;
    assert_eq!(
        conds.get("NodekeeperDiskPressure").map(|c| c.0.as_str()),
        Some("True"),
        "{conds:?}"
    );

    // The current version: taken, no warning.
    let (code, warning, body) = send_golden("v2.json").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["accepted"], true);
    assert_eq!(
        body["acknowledged_events"],
        json!(["oci-3a2b-v2", "oci-9f-v2"])
    );
    assert_eq!(warning, None);

    let metrics = get(&http, ctl.addr, "/metrics").await.unwrap().1;
    for line in [
        "nodekeeper_reports_by_version_total{version=\"1\"} 1",
        "nodekeeper_reports_by_version_total{version=\"2\"} 1",
        "nodekeeper_reports_unsupported_version_total 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }
    ctl.stop().await;
}

//! An agent's notices survive a controller kill: the report API acknowledges an event id (the
//! agent then drops it from its queue for good) only once the Node stores the notice — the
//! interruption annotation, written in the same patch as the taint and the cordon — or once what
//! the Node stores accounts for it. A notice that cannot be stored yet (a rebalance configured to
//! drain, waiting for its budget) stays unacknowledged, so the agent resends it.
//!
//! Sim only: uses the sim's scaled clock and a budget held for minutes; report delivery and
//! acknowledgement run on both in `tests/e2e` (`events`, `identity`).
#![allow(clippy::unwrap_used)]

use crate::support::ctl;
use crate::support::engine as engine_support;

use std::time::{Duration, Instant};

use nodekeeper_core::agent::sources::EventKind;
use nodekeeper_core::controller::act::provider::fake::FakeProvider;
use nodekeeper_core::controller::api::server::REPORT_RECORD_WAIT;
use nodekeeper_core::controller::policy::view::keys;
use nodekeeper_core::controller::Running;
use nodekeeper_core::wire::{NodeReport, ReportResponse};
use nodekeeper_sim::apiserver::scenario::Scenario;

use engine_support::*;

const NODE: &str = "spot-0";
const TAINT: &str = "nodekeeper.io/interruption";

/// POSTs `report` with `token` as the agent does; the response and how long it took.
async fn send(ctl: &Running, token: &str, report: &NodeReport) -> (ReportResponse, Duration) {
    let t0 = Instant::now();
    let r = nodekeeper_core::http::client()
        .unwrap()
        .post(format!("http://{}/v1/reports", ctl.addr))
        .bearer_auth(token)
        .json(report)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    (r.json().await.unwrap(), t0.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_acknowledges_a_notice_only_once_the_node_stores_it() {
    let mut s = Scenario::default_mixed();
    s.workloads.clear();
    s.daemonsets.clear();
    let c = cluster(1.0, s, loops()).await;
    // Rebalance recommendations drain, and no rebalance may start (a budget of 0).
    let p = policy(
        r#"
[interruption.actions]
rebalance = "drain"
[[budgets.budgets]]
nodes = "0"
reasons = ["rebalance"]
"#,
    );
    let ctl = controller(
        &c,
        &controller_config("report-notice"),
        p,
        Some(std::sync::Arc::new(FakeProvider::new())),
    )
    .await;
    let token = ctl::token_for(&c, NODE, "nodekeeper", "nodekeeper-agent").await;
    let now = chrono::Utc::now();

    // A notice the Node cannot store yet: answered after the wait, not acknowledged.
    let mut r = ctl::report(NODE, 1, &[]);
    r.events = vec![notice("rb-1", EventKind::Rebalance, None, now)];
    let (resp, took) = send(&ctl, &token, &r).await;
    assert!(resp.accepted);
    assert!(
        resp.acknowledged_events.is_empty(),
        "acknowledged a notice the Node does not store: {:?}",
        resp.acknowledged_events
    );
    assert!(took >= REPORT_RECORD_WAIT, "answered after {took:?}");
    let n = node(&c, NODE).await;
    assert_eq!(annotation(&n, keys::INTERRUPTION), None);
    assert!(!unschedulable(&n));

    // The agent resends it with a preemption notice: once the Node stores the preemption (which
    // accounts for the weaker rebalance too), both are acknowledged — and not before.
    r.sequence = 2;
    r.events
        .push(notice("pre-1", EventKind::Preemption, None, now));
    let (resp, _) = send(&ctl, &token, &r).await;
    let n = node(&c, NODE).await;
    let mut acked = resp.acknowledged_events.clone();
    acked.sort();
    assert_eq!(acked, ["pre-1", "rb-1"]);
    assert!(taint(&n, TAINT).is_some(), "acknowledged before the taint");
    assert!(unschedulable(&n), "acknowledged before the cordon");
    let recorded = annotation(&n, keys::INTERRUPTION).unwrap();
    assert!(recorded.contains("pre-1"), "{recorded}");

    // A replay of the same report (a lost response): the same acknowledgements at once.
    let (resp, took) = send(&ctl, &token, &r).await;
    assert!(!resp.accepted);
    let mut again = resp.acknowledged_events.clone();
    again.sort();
    assert_eq!(again, acked);
    assert!(took < REPORT_RECORD_WAIT, "a stored notice waited {took:?}");
    ctl.stop().await;
}

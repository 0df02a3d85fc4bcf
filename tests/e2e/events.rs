//! An agent-reported preemption notice on the real control plane: the shipped controller config
//! (engine on, dry run off) taints and cordons the node, drains it, and records Events that the real
//! `kubectl describe node` lists for that node.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use nodekeeper_core::agent::sources::{EventKind, NodeEvent, NODE_EVENT_VERSION};
use nodekeeper_core::controller::policy::view::keys;

use crate::ctl;
use crate::support::*;

const NODE: &str = "ev-0";
const TAINT: &str = "nodekeeper.io/interruption";

on_both!(a_preemption_notice_cordons_and_kubectl_describe_lists_the_events);
async fn a_preemption_notice_cordons_and_kubectl_describe_lists_the_events(c: &'static Cluster) {
    init_tracing();
    let _one_engine = c.exclusive().await;
    let admin = c.admin().await;
    let agent = c.reporting_node(&admin, NODE, "ev-pool", "events").await;
    let now = chrono::Utc::now();
    let mut report = ctl::report(NODE, 1, &[]);
    report.events = vec![NodeEvent {
        version: NODE_EVENT_VERSION,
        id: "oci-preempt-1".into(),
        kind: EventKind::Preemption,
        cloud: None,
        source: "oci/instance-action".into(),
        not_before: Some(now + chrono::Duration::seconds(120)),
        deadline: None,
        detected_at: now,
        detail: Default::default(),
    }];
    // The leader may take a moment: a follower answers 503 and the agent resends.
    wait_leading(&admin, "nodekeeper-events", "events").await;
    let acked = agent
        .report_until(&report, |resp| {
            resp["acknowledged_events"]
                .to_string()
                .contains("oci-preempt-1")
        })
        .await;
    eprintln!("report answer: {acked}");

    let api: Api<Node> = Api::all(admin.clone());
    let n = api.get(NODE).await.unwrap();
    assert!(unschedulable(&n), "cordoned");
    let tainted = n
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == TAINT));
    assert!(tainted, "tainted {TAINT}");
    assert!(annotation(&n, keys::INTERRUPTION).is_some());

    // The Events are about this Node, so `kubectl describe node` shows them.
    let text = wait_for(
        Duration::from_secs(20),
        "Events in kubectl describe",
        || async {
            let out = kubectl(c, &["describe", "node", NODE]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.contains("PreemptionNotice").then_some(text)
        },
    )
    .await;
    let events = text.split("Events:").nth(1).unwrap_or_default();
    assert!(
        events.contains("nodekeeper"),
        "reported by nodekeeper: {events}"
    );

    assert_eq!(
        agent.ctl.forbidden_lines(),
        Vec::<String>::new(),
        "the controller hit a 403"
    );
    agent.ctl.stop().await;
}

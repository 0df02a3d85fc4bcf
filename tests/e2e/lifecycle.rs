//! Kubernetes 1.37's lifecycle conditions that follow an agent's notices (KEP-5683; the real control
//! plane runs with `NodeLifecycleConditions` on): a scheduled maintenance a few seconds ahead makes
//! `MaintenancePlanned` True, then at its start `MaintenanceInProgress` True, both cleared once its
//! window ends; a shutdown from the agent's watcher makes `GracefulNodeShutdownInProgress` True
//! until the agent reports from a new boot. The shipped controller config (lifecycle conditions on).

use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use nodekeeper_core::agent::sources::{EventKind, NodeEvent, NODE_EVENT_VERSION};
use nodekeeper_core::controller::catalog::{
    GRACEFUL_NODE_SHUTDOWN_IN_PROGRESS, MAINTENANCE_ENDED, MAINTENANCE_IN_PROGRESS,
    MAINTENANCE_PLANNED, MAINTENANCE_STARTED, MAINTENANCE_WINDOW, NODE_REBOOTED, NODE_SHUTDOWN,
};

use crate::ctl;
use crate::support::*;

const NODE: &str = "lc-0";

/// Waits until `node`'s conditions `types` have the statuses `want` (`None`: absent or False),
/// returning the Node.
async fn wait_conditions(
    nodes: &Api<Node>,
    types: &[&str],
    want: &[Option<&str>],
    what: &str,
) -> Node {
    wait_for(Duration::from_secs(40), what, || async {
        let n = nodes.get(NODE).await.ok()?;
        let got: Vec<Option<String>> = types
            .iter()
            .map(|t| condition(&n, t).map(|c| c.status).filter(|s| s != "False"))
            .collect();
        let want: Vec<Option<String>> = want.iter().map(|s| s.map(String::from)).collect();
        (got == want).then_some(n)
    })
    .await
}

fn maintenance(id: &str, start: DateTime<Utc>, end: DateTime<Utc>) -> NodeEvent {
    NodeEvent {
        version: NODE_EVENT_VERSION,
        id: id.into(),
        kind: EventKind::Maintenance,
        cloud: None,
        source: "aws/scheduled".into(),
        not_before: Some(start),
        deadline: Some(end),
        detected_at: Utc::now(),
        detail: Default::default(),
    }
}

on_both!(notices_set_and_clear_the_maintenance_and_shutdown_conditions);
async fn notices_set_and_clear_the_maintenance_and_shutdown_conditions(c: &'static Cluster) {
    init_tracing();
    let _one_engine = c.exclusive().await;
    let admin = c.admin().await;
    let agent = c.reporting_node(&admin, NODE, "lc-pool", "lifecycle").await;
    wait_leading(&admin, "nodekeeper-lifecycle", "lifecycle").await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let maint = [MAINTENANCE_PLANNED, MAINTENANCE_IN_PROGRESS];

    // A window 8 s to 16 s ahead (AWS's NotBefore and NotAfter).
    let start = Utc::now() + chrono::Duration::seconds(8);
    let end = start + chrono::Duration::seconds(8);
    let mut report = ctl::report(NODE, 1, &[]);
    report.boot_id = "boot-1".into();
    report.events = vec![maintenance("aws-maint-1", start, end)];
    agent
        .report_until(&report, |r| {
            r["acknowledged_events"].to_string().contains("aws-maint-1")
        })
        .await;
    let n = wait_conditions(&nodes, &maint, &[Some("True"), None], "MaintenancePlanned").await;
    assert!(Utc::now() < start, "planned seen before the window");
    let planned = condition(&n, MAINTENANCE_PLANNED).unwrap();
    assert_eq!(planned.reason.as_deref(), Some(MAINTENANCE_WINDOW));
    let message = planned.message.unwrap_or_default();
    let at = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    assert!(
        message.contains(&at(start)) && message.contains(&at(end)),
        "the window in the message: {message}"
    );

    // At the start (the engine's timed wake, not a notice or a Node change).
    let n = wait_conditions(
        &nodes,
        &maint,
        &[None, Some("True")],
        "MaintenanceInProgress",
    )
    .await;
    assert!(Utc::now() >= start, "in progress only from the start");
    let planned = condition(&n, MAINTENANCE_PLANNED).unwrap();
    assert_eq!(planned.reason.as_deref(), Some(MAINTENANCE_STARTED));

    let n = wait_conditions(&nodes, &maint, &[None, None], "the window over").await;
    assert!(Utc::now() >= end, "in progress until the end");
    let done = condition(&n, MAINTENANCE_IN_PROGRESS).unwrap();
    assert_eq!(
        (done.status.as_str(), done.reason.as_deref()),
        ("False", Some(MAINTENANCE_ENDED))
    );

    // The agent's shutdown watcher, then the agent back from a new boot.
    let shutdown = NodeEvent::on_node(EventKind::ShuttingDown, "logind", "boot-1", Utc::now());
    let id = shutdown.id.clone();
    report.sequence = 100;
    report.events = vec![shutdown];
    agent
        .report_until(&report, |r| {
            r["acknowledged_events"].to_string().contains(&id)
        })
        .await;
    let gns = [GRACEFUL_NODE_SHUTDOWN_IN_PROGRESS];
    let n = wait_conditions(&nodes, &gns, &[Some("True")], "shutting down").await;
    let on = condition(&n, GRACEFUL_NODE_SHUTDOWN_IN_PROGRESS).unwrap();
    assert_eq!(on.reason.as_deref(), Some(NODE_SHUTDOWN));

    let mut rebooted = ctl::report(NODE, 1, &[]);
    rebooted.agent_instance = "inst-2".into();
    rebooted.boot_id = "boot-2".into();
    agent.report_until(&rebooted, |_| true).await;
    let n = wait_conditions(&nodes, &gns, &[None], "the new boot").await;
    let off = condition(&n, GRACEFUL_NODE_SHUTDOWN_IN_PROGRESS).unwrap();
    assert_eq!(
        (off.status.as_str(), off.reason.as_deref()),
        ("False", Some(NODE_REBOOTED))
    );

    assert_eq!(
        agent.ctl.forbidden_lines(),
        Vec::<String>::new(),
        "the controller hit a 403"
    );
    agent.ctl.stop().await;
}

//! Kubernetes Events the controller records, with the reason catalog (docs/catalog.md).
//!
//! Events are `events.k8s.io/v1` objects about a Node, reported by `nodekeeper-controller`.
//! Recording is best effort: a failure is logged and counted, never fails the report.

use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};

/// The reason catalog. Each reason is stable (alerting may match on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A cloud announced preemption/termination of the node's instance (Warning).
    PreemptionNotice,
    /// Host maintenance, reboot, redeploy or freeze was announced (Warning).
    MaintenanceNotice,
    /// The platform recommends moving work off the instance (Normal).
    RebalanceRecommendation,
    /// The node's operating system is shutting down (Warning).
    NodeShuttingDown,
    /// An earlier notice was withdrawn (Normal).
    NoticeCancelled,
    /// The agent stopped reporting; its conditions were set to Unknown (Warning).
    AgentSilent,
    /// An allow-listed label was removed on the agent's request (Normal).
    LabelRemoved,
    /// An agent asked to remove a label that is not allow-listed (Warning).
    LabelRemovalDenied,
}

impl Reason {
    /// The CamelCase reason string.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::PreemptionNotice => "PreemptionNotice",
            Reason::MaintenanceNotice => "MaintenanceNotice",
            Reason::RebalanceRecommendation => "RebalanceRecommendation",
            Reason::NodeShuttingDown => "NodeShuttingDown",
            Reason::NoticeCancelled => "NoticeCancelled",
            Reason::AgentSilent => "AgentSilent",
            Reason::LabelRemoved => "LabelRemoved",
            Reason::LabelRemovalDenied => "LabelRemovalDenied",
        }
    }

    /// `Normal` or `Warning`.
    pub fn event_type(self) -> &'static str {
        match self {
            Reason::RebalanceRecommendation | Reason::NoticeCancelled | Reason::LabelRemoved => {
                "Normal"
            }
            _ => "Warning",
        }
    }

    /// The reason for a node event kind.
    pub fn for_kind(kind: &crate::agent::sources::EventKind) -> Reason {
        use crate::agent::sources::EventKind as K;
        match kind {
            K::Preemption | K::Termination => Reason::PreemptionNotice,
            K::Maintenance | K::Reboot | K::Redeploy | K::Freeze => Reason::MaintenanceNotice,
            K::Rebalance => Reason::RebalanceRecommendation,
            K::ShuttingDown => Reason::NodeShuttingDown,
            K::Cancelled { .. } => Reason::NoticeCancelled,
        }
    }
}

/// Records Events about Nodes.
#[derive(Clone)]
pub struct Recorder {
    api: Api<Event>,
    instance: String,
    /// Events that could not be written.
    pub failures: std::sync::Arc<AtomicU64>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

/// The `reportingController` of every event.
pub const REPORTING_CONTROLLER: &str = "nodekeeper.io/controller";

impl Recorder {
    /// A recorder writing into `namespace` as replica `instance`.
    pub fn new(client: kube::Client, namespace: &str, instance: &str) -> Self {
        Recorder {
            api: Api::namespaced(client, namespace),
            instance: instance.into(),
            failures: Default::default(),
        }
    }

    /// Records `reason` about `node` with `note` (truncated to 1 kB).
    pub async fn node(&self, node: &str, reason: Reason, action: &str, note: &str) {
        self.node_with(node, reason.as_str(), reason.event_type(), action, note)
            .await;
    }

    /// Records an event with a free-form reason (check events keep their own).
    pub async fn node_with(&self, node: &str, reason: &str, type_: &str, action: &str, note: &str) {
        let mut note = note.to_string();
        if note.len() > 1024 {
            let mut cut = 1021;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
            note.push_str("...");
        }
        let ev = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{node}.")),
                ..Default::default()
            },
            event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            action: Some(action.into()),
            reason: Some(reason.into()),
            note: Some(note),
            type_: Some(type_.into()),
            reporting_controller: Some(REPORTING_CONTROLLER.into()),
            reporting_instance: Some(self.instance.clone()),
            regarding: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.into()),
                uid: Some(node.into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        if let Err(e) = self.api.create(&PostParams::default(), &ev).await {
            self.failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(node, reason, error = %e, "cannot record event");
        }
    }
}

//! A notice about a node ([`NodeEvent`]): what the agent's sources and its shutdown watcher
//! produce, and what the controller acts on. Versioned by [`NODE_EVENT_VERSION`].

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Version of the [`NodeEvent`] schema; bumped on incompatible changes.
pub const NODE_EVENT_VERSION: u32 = 1;

/// A cloud whose instance-metadata service nodekeeper reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cloud {
    /// Oracle Cloud Infrastructure.
    Oci,
    /// Amazon EC2.
    Aws,
    /// Microsoft Azure.
    Azure,
    /// Google Compute Engine.
    Gcp,
}

impl Cloud {
    /// All clouds, in auto-detection order.
    pub const ALL: [Cloud; 4] = [Cloud::Oci, Cloud::Aws, Cloud::Azure, Cloud::Gcp];

    /// The lowercase name used in config, ids and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Cloud::Oci => "oci",
            Cloud::Aws => "aws",
            Cloud::Azure => "azure",
            Cloud::Gcp => "gcp",
        }
    }
}

impl fmt::Display for Cloud {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Cloud {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Cloud::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| format!("unknown cloud `{s}` (expected oci, aws, azure or gcp)"))
    }
}

/// What a [`NodeEvent`] announces.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    /// Spot/preemptible capacity is being reclaimed.
    Preemption,
    /// The instance will be terminated (or stopped) by the platform.
    Termination,
    /// Host maintenance (live migration or similar) is scheduled.
    Maintenance,
    /// The platform recommends moving work off this instance (AWS rebalance).
    Rebalance,
    /// A reboot is scheduled.
    Reboot,
    /// The instance will be moved to another host (Azure Redeploy).
    Redeploy,
    /// The instance will be paused for a few seconds (Azure Freeze).
    Freeze,
    /// The operating system is shutting down (from the shutdown watcher).
    ShuttingDown,
    /// An earlier notice disappeared before it happened.
    Cancelled {
        /// The id of the cancelled event.
        of: String,
    },
}

impl EventKind {
    /// A short stable name (`preemption`, `cancelled`, ...), for logs and ids.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::Preemption => "preemption",
            EventKind::Termination => "termination",
            EventKind::Maintenance => "maintenance",
            EventKind::Rebalance => "rebalance",
            EventKind::Reboot => "reboot",
            EventKind::Redeploy => "redeploy",
            EventKind::Freeze => "freeze",
            EventKind::ShuttingDown => "shutting_down",
            EventKind::Cancelled { .. } => "cancelled",
        }
    }
}

/// One notice about this node, as reported to the controller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEvent {
    /// Schema version ([`NODE_EVENT_VERSION`]).
    pub version: u32,
    /// Deterministic id: the same notice always gets the same id (hex SHA-256 prefix).
    pub id: String,
    /// What is announced.
    pub kind: EventKind,
    /// The cloud that announced it (none for on-node signals such as shutdown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud: Option<Cloud>,
    /// The producer and channel, e.g. `aws/spot` or `azure/scheduledevents`.
    pub source: String,
    /// Earliest time the announced action happens, when the notice says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<DateTime<Utc>>,
    /// Latest time, when the notice says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DateTime<Utc>>,
    /// When this agent first saw the notice.
    pub detected_at: DateTime<Utc>,
    /// Notice fields worth showing (never user data or secrets).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub detail: BTreeMap<String, String>,
}

impl NodeEvent {
    /// An event from an on-node signal (no cloud), e.g. [`EventKind::ShuttingDown`] from the
    /// shutdown watcher. `key` identifies the occurrence (for a shutdown: the boot id from
    /// `/proc/sys/kernel/random/boot_id`), so the id is deterministic like the clouds' ones.
    pub fn on_node(kind: EventKind, source: &str, key: &str, detected_at: DateTime<Utc>) -> Self {
        NodeEvent {
            version: NODE_EVENT_VERSION,
            id: event_id(None, source, &kind, key),
            kind,
            cloud: None,
            source: source.to_string(),
            not_before: None,
            deadline: None,
            detected_at,
            detail: BTreeMap::new(),
        }
    }
}

/// The deterministic id of a notice: hex of the first 16 bytes of
/// SHA-256(`cloud` NUL `channel` NUL `kind` NUL `key`).
pub fn event_id(cloud: Option<Cloud>, channel: &str, kind: &EventKind, key: &str) -> String {
    let mut h = Sha256::new();
    for part in [
        cloud.map_or("node", Cloud::as_str),
        channel,
        kind.name(),
        key,
    ] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    hex::encode(&h.finalize()[..16])
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn on_node_events_have_deterministic_ids() {
        let now = Utc::now();
        let a = NodeEvent::on_node(EventKind::ShuttingDown, "logind", "boot-1", now);
        let b = NodeEvent::on_node(EventKind::ShuttingDown, "logind", "boot-1", now);
        let c = NodeEvent::on_node(EventKind::ShuttingDown, "logind", "boot-2", now);
        assert_eq!(a.id, b.id);
        assert_ne!(a.id, c.id);
        assert_eq!(a.cloud, None);
        let v = serde_json::to_value(&a).unwrap();
        assert_eq!(v["kind"], serde_json::json!({"type": "shutting_down"}));
        assert!(v.get("cloud").is_none());
    }
}

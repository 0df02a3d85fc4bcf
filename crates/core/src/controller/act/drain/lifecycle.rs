//! Kubernetes 1.37's node lifecycle conditions (KEP-5683, feature gate `NodeLifecycleConditions`)
//! around nodekeeper's drains: `DrainInProgress` while a drain runs, `Drained` once it met its
//! criteria, both cleared when the drain ends otherwise or the node returns to service. "The admin
//! is responsible for setting and clearing" them (the API's own words); nodekeeper's controller is
//! that admin for the drains it runs. [`changes`] decides which conditions move (pure, only real
//! transitions, so each `lastTransitionTime` stays true); [`write()`] patches them like the
//! controller's other conditions (a strategic merge of `status.conditions`, keyed by type).
//! [`write_all`] is that writer for any lifecycle condition: the engine writes the ones that follow
//! a node's notices through it too ([`crate::controller::policy::lifecycle`]).

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde_json::json;

use crate::controller::catalog::{DRAINED, DRAIN_IN_PROGRESS};
use crate::controller::policy::lifecycle::Condition;

/// A step in a drain's life that moves its conditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainEdge {
    /// A drain started.
    Started,
    /// It removed every pod it had to.
    Completed,
    /// Its deadline passed with pods left.
    TimedOut,
    /// It was cancelled while running (the node recovered, or the policy stopped it).
    Cancelled,
    /// It failed on an API error (it starts again).
    Failed,
    /// A completed drain was let go: the node is back in service.
    Released,
}

/// One condition to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// [`DRAIN_IN_PROGRESS`] or [`DRAINED`].
    pub type_: &'static str,
    /// True or False.
    pub status: bool,
    /// One of [`crate::controller::catalog::DRAIN_CONDITION_REASONS`].
    pub reason: &'static str,
}

/// The conditions that change at `edge`.
pub fn changes(edge: DrainEdge) -> Vec<Change> {
    let c = |type_, status, reason| Change {
        type_,
        status,
        reason,
    };
    match edge {
        DrainEdge::Started => vec![
            c(DRAIN_IN_PROGRESS, true, "DrainStarted"),
            c(DRAINED, false, "DrainStarted"),
        ],
        DrainEdge::Completed => vec![
            c(DRAIN_IN_PROGRESS, false, "DrainCompleted"),
            c(DRAINED, true, "DrainCompleted"),
        ],
        DrainEdge::TimedOut => vec![c(DRAIN_IN_PROGRESS, false, "DrainTimedOut")],
        DrainEdge::Cancelled => vec![c(DRAIN_IN_PROGRESS, false, "DrainStopped")],
        DrainEdge::Failed => vec![c(DRAIN_IN_PROGRESS, false, "DrainFailed")],
        DrainEdge::Released => vec![c(DRAINED, false, "DrainStopped")],
    }
}

/// Writes the conditions of `edge` on `node`, `message` saying why (the drain's reason).
pub async fn write(
    nodes: &Api<Node>,
    node: &str,
    edge: DrainEdge,
    message: &str,
) -> Result<Node, kube::Error> {
    let all: Vec<Condition> = changes(edge)
        .into_iter()
        .map(|c| Condition {
            type_: c.type_,
            status: c.status,
            reason: c.reason,
            message: message.to_string(),
            transition: true,
        })
        .collect();
    write_all(nodes, node, &all).await
}

/// Writes `conditions` on `node` in one strategic merge of `status.conditions` (keyed by type:
/// the Node's other conditions stay as they are, whoever wrote them), each with the heartbeat
/// time of now, and the transition time of now where its status changes (the merge keeps the
/// written one elsewhere).
pub async fn write_all(
    nodes: &Api<Node>,
    node: &str,
    conditions: &[Condition],
) -> Result<Node, kube::Error> {
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let items: Vec<_> = conditions
        .iter()
        .map(|c| {
            let mut item = json!({"type": c.type_, "status": if c.status { "True" } else { "False" },
                "reason": c.reason, "message": c.message, "lastHeartbeatTime": now});
            if c.transition {
                item["lastTransitionTime"] = json!(now);
            }
            item
        })
        .collect();
    let patch = json!({"status": {"conditions": items}});
    nodes
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
}

/// [`write()`], a failure logged: the drain goes on (the conditions inform, they decide nothing).
pub async fn write_or_log(nodes: &Api<Node>, node: &str, edge: DrainEdge, message: &str) {
    if let Err(e) = write(nodes, node, edge, message).await {
        tracing::warn!(node, ?edge, error = %e, "lifecycle conditions not written");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::catalog::DRAIN_CONDITION_REASONS;

    #[test]
    fn each_edge_moves_only_the_conditions_it_changes() {
        use DrainEdge::*;
        let table: [(DrainEdge, &[(&str, bool)]); 6] = [
            (Started, &[(DRAIN_IN_PROGRESS, true), (DRAINED, false)]),
            (Completed, &[(DRAIN_IN_PROGRESS, false), (DRAINED, true)]),
            (TimedOut, &[(DRAIN_IN_PROGRESS, false)]),
            (Cancelled, &[(DRAIN_IN_PROGRESS, false)]),
            (Failed, &[(DRAIN_IN_PROGRESS, false)]),
            (Released, &[(DRAINED, false)]),
        ];
        for (edge, want) in table {
            let got: Vec<(&str, bool)> =
                changes(edge).iter().map(|c| (c.type_, c.status)).collect();
            assert_eq!(got, want, "{edge:?}");
            for c in changes(edge) {
                assert!(DRAIN_CONDITION_REASONS.contains(&c.reason), "{c:?}");
            }
        }
    }
}

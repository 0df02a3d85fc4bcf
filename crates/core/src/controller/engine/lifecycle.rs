//! The lifecycle conditions that follow a node's notices (KEP-5683: `MaintenancePlanned`,
//! `MaintenanceInProgress`, `GracefulNodeShutdownInProgress`): decided for every node by each
//! reconcile ([`lifecycle::decide`], pure), written in the node's turn through the actor, and
//! woken for when a maintenance window starts or ends (the reconcile's [`Due`]).

use super::*;
use crate::controller::policy::lifecycle::{self, Condition};

impl Engine {
    /// The lifecycle conditions to write, by node, and the soonest moment one changes by time
    /// alone (none with `[controller.engine] lifecycle_conditions = false`, or in a dry run).
    pub(super) fn decide_lifecycle(
        &self,
        view: &ClusterView,
        now: DateTime<Utc>,
    ) -> (BTreeMap<String, Vec<Condition>>, Option<DateTime<Utc>>) {
        let mut writes = BTreeMap::new();
        let mut next: Option<DateTime<Utc>> = None;
        if !self.cfg.lifecycle_conditions || self.policy.controller.dry_run {
            return (writes, next);
        }
        for n in view.nodes.iter().filter(|n| !n.deleting) {
            let l = lifecycle::decide(n, &self.policy, now);
            next = match (next, l.next) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if !l.changes.is_empty() {
                writes.insert(n.name.clone(), l.changes);
            }
        }
        (writes, next)
    }

    /// Writes each node's lifecycle conditions in its turn (at most `node_concurrency` nodes at
    /// once), skipping a node the fast path acted on since `view` (the next reconcile decides it
    /// again). A failed write is logged and decided again by the next reconcile.
    pub(super) async fn write_lifecycle(
        &self,
        writes: BTreeMap<String, Vec<Condition>>,
        view: View,
    ) {
        futures::stream::iter(writes)
            .for_each_concurrent(
                self.cfg.node_concurrency.max(1),
                |(node, conditions)| async move {
                    let turn = self.order.turn(&node).await;
                    if !self.order.fresh_for(&turn, view) {
                        return;
                    }
                    match self.actor.write_conditions(&node, &conditions).await {
                        Ok(()) => tracing::info!(node, ?conditions, "lifecycle conditions written"),
                        Err(e) => {
                            tracing::warn!(node, error = %e, "lifecycle conditions not written")
                        }
                    }
                },
            )
            .await;
    }
}

//! The Karpenter fence around a node nodekeeper acts on, and what tells the reconcile that the
//! fast path acted on a node since it read it.

use super::*;

impl Engine {
    /// Counts `node` as acted on by a fast path now: a reconcile whose view predates this skips it.
    pub(super) fn touch(&self, node: &str) {
        let done = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        lock(&self.touched).insert(node.to_string(), done);
    }

    /// Whether a fast path acted on `node` since `epoch` (a view of then is out of date there).
    pub(super) fn acted_since(&self, node: &str, epoch: u64) -> bool {
        let since = lock(&self.touched).get(node).is_some_and(|t| *t > epoch);
        if since {
            tracing::debug!(
                node,
                "acted on by the fast path since this view; next round"
            );
        }
        since
    }

    /// Writes fence-only `marks` ([`fence_only`]) on `node` through the [`FenceGate`]: at most
    /// [`FENCE_WRITES`] in flight, each once the engine's other writes are answered; not when the
    /// node's lane is taken (another write of it in flight: the next reconcile fences it), a fast
    /// path acted on it since `epoch` (the reconcile's view), or the cached Node already carries
    /// them (a fast path and a reconcile deciding the same fence). Returns whether it wrote.
    pub(super) async fn write_fence(
        &self,
        node: &str,
        marks: &[Action],
        epoch: Option<u64>,
    ) -> bool {
        let Some(_slot) = self.fence_gate.fence_slot().await else {
            return false;
        };
        let lane = self.node_lock(node);
        let Ok(_guard) = lane.try_lock() else {
            tracing::debug!(node, "being written; fenced next round");
            return false;
        };
        if epoch.is_some_and(|e| self.acted_since(node, e)) || self.carries(node, marks) {
            return false;
        }
        if let Err(e) = self
            .actor
            .execute(node, marks, self.policy.controller.dry_run)
            .await
        {
            tracing::warn!(error = %e, "fence failed; retried by the next reconcile");
        }
        true
    }

    /// Whether the cached `node` (or the engine's fresher answer for it) already has every
    /// annotation `actions` set or remove.
    pub(super) fn carries(&self, node: &str, actions: &[Action]) -> bool {
        let Some(v) = self.node_now(node) else {
            return false;
        };
        actions.iter().all(|a| match a {
            Action::Annotate { key, value } => v.annotation(key) == value.as_deref(),
            _ => false,
        })
    }

    /// A reconcile's fence-only actions on one node ([`Self::write_fence`]).
    pub(super) async fn fence_on(&self, node: String, marks: Vec<Action>, epoch: u64) -> bool {
        self.write_fence(&node, &marks, Some(epoch)).await
    }
}

//! The Karpenter fence around a node nodekeeper acts on, written in the node's turn
//! ([`NodeOrder`]).

use super::*;

/// Who writes a fence: the fast path after its notice (the write counts as the fast path's act
/// on that node, [`NodeOrder::acted`]), or a reconcile, which skips a node a fast path acted on
/// since its view.
#[derive(Debug, Clone, Copy)]
pub(super) enum FenceBy {
    FastPath,
    Reconcile(View),
}

impl Engine {
    /// Writes fence-only `marks` ([`fence_only`]) on `node` through the [`FenceGate`]: at most
    /// [`FENCE_WRITES`] in flight, each once the engine's other writes are answered; not when the
    /// node's turn is taken (another write of it in flight: the next reconcile fences it), for a
    /// reconcile when a fast path acted on the node since its view, nor when the cached Node
    /// already carries them (a fast path and a reconcile deciding the same fence). Returns
    /// whether it wrote.
    pub(super) async fn write_fence(&self, node: &str, marks: &[Action], by: FenceBy) -> bool {
        let Some(_slot) = self.fence_gate.fence_slot().await else {
            return false;
        };
        let Some(turn) = self.order.try_turn(node) else {
            tracing::debug!(node, "being written; fenced next round");
            return false;
        };
        let stale = match by {
            FenceBy::Reconcile(view) => !self.order.fresh_for(&turn, view),
            FenceBy::FastPath => false,
        };
        if stale || self.carries(node, marks) {
            return false;
        }
        if let Err(e) = self
            .actor
            .execute(node, marks, self.policy.controller.dry_run)
            .await
        {
            tracing::warn!(error = %e, "fence failed; retried by the next reconcile");
        }
        if let FenceBy::FastPath = by {
            self.order.acted(turn);
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
    pub(super) async fn fence_on(&self, node: String, marks: Vec<Action>, view: View) -> bool {
        self.write_fence(&node, &marks, FenceBy::Reconcile(view))
            .await
    }
}

//! The engine's one per-node serialisation: every write the engine makes to a Node is made in that
//! node's turn, and what a fast path did is ordered against the reconciles' views.
//!
//! Invariants, kept by the shape of this API:
//! 1. **One writer per node.** The fast path, a reconcile's or due pass's actions and a fence
//!    write each hold the node's [`Turn`] while they write it ([`NodeOrder::turn`] waits for it; a
//!    fence write takes only a free one, [`NodeOrder::try_turn`], and leaves a busy node to the
//!    next reconcile).
//! 2. **A view knows its age.** A reconcile takes its [`View`] ([`NodeOrder::view`]) before it
//!    reads the Nodes, and in the node's turn acts only if [`NodeOrder::fresh_for`]: no fast path
//!    acted on the node after the view was taken (the view's decisions there are out of date; the
//!    next reconcile decides again).
//! 3. **A fast path marks what it did before it gives its turn up.** [`NodeOrder::acted`] takes
//!    the turn by value, so the next turn of that node sees the mark.
//!
//! The fence's pacing behind the engine's other writes is not ordering but priority: that is the
//! [`super::fence_gate::FenceGate`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;

use crate::sync::lock;

/// Per node: its turn, and the position at which a fast path last finished acting on it.
#[derive(Debug, Default)]
struct Slot {
    turn: Arc<tokio::sync::Mutex<()>>,
    acted: u64,
}

/// The per-node order of the engine's writes (the module's invariants).
#[derive(Debug, Default)]
pub(super) struct NodeOrder {
    nodes: Mutex<HashMap<String, Slot>>,
    /// Bumped by each [`NodeOrder::acted`].
    position: AtomicU64,
}

/// When a view of the Nodes was taken, in the order of the fast paths' acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct View(u64);

/// A node's turn: while it lives, no other engine path writes the node.
#[must_use = "the node is the holder's only while the turn lives"]
#[derive(Debug)]
pub(super) struct Turn {
    node: String,
    _held: OwnedMutexGuard<()>,
}

impl NodeOrder {
    fn turn_of(&self, node: &str) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.nodes)
            .entry(node.to_string())
            .or_default()
            .turn
            .clone()
    }

    /// The position now: take it before reading the Nodes a decision rests on.
    pub(super) fn view(&self) -> View {
        View(self.position.load(Ordering::SeqCst))
    }

    /// Waits for `node`'s turn.
    pub(super) async fn turn(&self, node: &str) -> Turn {
        Turn {
            node: node.to_string(),
            _held: self.turn_of(node).lock_owned().await,
        }
    }

    /// `node`'s turn if no one holds it now.
    pub(super) fn try_turn(&self, node: &str) -> Option<Turn> {
        let held = self.turn_of(node).try_lock_owned().ok()?;
        Some(Turn {
            node: node.to_string(),
            _held: held,
        })
    }

    /// Whether no fast path acted on the turn's node after `view` was taken.
    pub(super) fn fresh_for(&self, turn: &Turn, view: View) -> bool {
        let acted = lock(&self.nodes).get(&turn.node).map_or(0, |s| s.acted);
        let fresh = acted <= view.0;
        if !fresh {
            tracing::debug!(
                node = turn.node,
                "acted on by the fast path since this view; next round"
            );
        }
        fresh
    }

    /// Records that a fast path acted on the turn's node, then gives the turn up.
    pub(super) fn acted(&self, turn: Turn) {
        let at = self.position.fetch_add(1, Ordering::SeqCst) + 1;
        lock(&self.nodes)
            .entry(turn.node.clone())
            .or_default()
            .acted = at;
        drop(turn);
    }

    /// Forgets the nodes `alive` rejects, unless someone holds their turn.
    pub(super) fn retain(&self, alive: impl Fn(&str) -> bool) {
        lock(&self.nodes).retain(|n, s| alive(n) || Arc::strong_count(&s.turn) > 1);
    }

    /// The nodes a fast path acted on (tests).
    #[cfg(test)]
    pub(super) fn acted_nodes(&self) -> Vec<String> {
        let mut v: Vec<String> = lock(&self.nodes)
            .iter()
            .filter(|(_, s)| s.acted > 0)
            .map(|(n, _)| n.clone())
            .collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_turn_per_node_at_a_time() {
        let o = NodeOrder::default();
        let a = o.turn("a").await;
        assert!(o.try_turn("a").is_none(), "a's turn is held");
        let b = o.try_turn("b").expect("another node's turn is free");
        drop(a);
        assert!(o.try_turn("a").is_some(), "free again");
        drop(b);
    }

    #[tokio::test]
    async fn a_view_taken_before_a_fast_path_acted_is_stale_there_only() {
        let o = NodeOrder::default();
        let before = o.view();
        o.acted(o.turn("a").await);
        let after = o.view();
        let a = o.turn("a").await;
        assert!(!o.fresh_for(&a, before), "a changed after the view");
        assert!(o.fresh_for(&a, after));
        let b = o.turn("b").await;
        assert!(o.fresh_for(&b, before), "b was not acted on");
    }

    #[tokio::test]
    async fn the_next_turn_sees_the_mark_and_held_turns_are_kept() {
        let o = Arc::new(NodeOrder::default());
        let view = o.view();
        let first = o.turn("a").await;
        let waiter = {
            let o = o.clone();
            tokio::spawn(async move {
                let t = o.turn("a").await;
                o.fresh_for(&t, view)
            })
        };
        tokio::task::yield_now().await;
        o.retain(|_| false);
        o.acted(first);
        assert!(
            !waiter.await.unwrap(),
            "the waiting turn sees the fast path's mark"
        );
        o.retain(|_| false);
        assert!(o.acted_nodes().is_empty(), "a free, gone node is forgotten");
    }
}

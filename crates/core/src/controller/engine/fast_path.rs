//! The fast path after a notice: a node whose decision needs no other node is acted on at once,
//! its own patch first, the rest on the engine's runtime.

use super::*;

/// What the fast path hands to [`Engine::after_notice`] once the node's own patch is answered.
pub(super) struct AfterNotice {
    node: String,
    view: NodeView,
    actions: Vec<Action>,
    /// Where the actions after the own patch begin ([`Actor::write_leading`]).
    rest: usize,
    /// The own patch's result.
    first: Result<(), crate::controller::act::actions::ActionError>,
    now: DateTime<Utc>,
    /// The node's turn ([`NodeOrder`]), held until its actions are done.
    turn: node_order::Turn,
}

impl Engine {
    /// The fast path after a notice: when the policy's decision for `node` does not depend on
    /// the rest of the cluster ([`decide_interruption`]: the interruption flow owns it and
    /// nothing waits for a budget), act on it now, without the whole [`ClusterView`]. The full
    /// reconcile that follows decides the same for this node (and, having read the node before
    /// this acted, skips it). Returns whether it acted. `spawned`: when its task was spawned
    /// (logged with `notice acted on`: how long it waited for a thread and the node's turn).
    ///
    /// Where it runs: spawned on the notice lane ([`crate::controller::engine::notice_thread`]), it decides there and writes
    /// the node's own patch (the taint, the cordon, the notice's annotation) through the lane's
    /// client ([`Actor::write_leading`]); the rest — the node's Events and drain, and the
    /// Karpenter fence — runs on the engine's runtime (`Engine::after_notice`).
    pub async fn fast_path(self: &Arc<Self>, node: &str, spawned: std::time::Instant) -> bool {
        let started = std::time::Instant::now();
        let turn = self.order.turn(node).await;
        let now = self.clock.now();
        let Some(v) = self.node_now(node) else {
            return false;
        };
        let Some(actions) = decide_interruption(&v, &self.policy, now) else {
            return false;
        };
        if actions.is_empty() {
            return false;
        }
        let dry_run = self.policy.controller.dry_run;
        let writing = std::time::Instant::now();
        let (rest, first) = {
            // The fence's writes give way to this one.
            let _urgent = self.fence_gate.urgent();
            self.actor.write_leading(node, &actions, dry_run).await
        };
        // Notice → cordon: when this patch carried the cordon and it landed.
        if first.is_ok() && !dry_run && actions[..rest.min(actions.len())].contains(&Action::Cordon)
        {
            self.metrics.notice_cordoned(spawned.elapsed());
        }
        tracing::info!(
            node,
            ok = first.is_ok(),
            queued_us = micros(started - spawned),
            decided_us = micros(writing - started),
            took_ms = writing.elapsed().as_millis() as u64,
            "notice acted on"
        );
        let after = AfterNotice {
            node: node.to_string(),
            view: v,
            actions,
            rest,
            first,
            now,
            turn,
        };
        if let Err(e) = self.home.spawn(self.clone().after_notice(after)).await {
            tracing::warn!(node, error = %e, "fast path's follow-up failed; the next reconcile retries it");
        }
        true
    }

    /// The fast path after the node's own patch ([`Self::fast_path`]), on the engine's runtime:
    /// the node's Events and the rest of its actions (the drain), and beside them the Karpenter
    /// fence ([`fence_now`]) on the NodePool's other nodes, whose views are built now (a pass
    /// over the whole cache) — not a reconcile later, so that Karpenter starts no voluntary
    /// disruption there in between — each write giving way to the engine's other writes
    /// ([`FenceGate`]). A fenced node another task is writing right now (its turn is taken) is
    /// left to the reconcile, which fences it too.
    pub(super) async fn after_notice(self: Arc<Self>, a: AfterNotice) {
        let AfterNotice {
            node,
            view,
            actions,
            rest,
            first,
            now,
            turn,
        } = a;
        let dry_run = self.policy.controller.dry_run;
        let own = async {
            let done = match first {
                Ok(()) => {
                    self.actor
                        .execute_rest(&node, &actions, rest, dry_run)
                        .await
                }
                Err(e) => Err(e),
            };
            if let Err(e) = done {
                tracing::warn!(error = %e, "fast path failed; retried by the next reconcile");
            }
            self.order.acted(turn);
            // Counted when the node's own actions are done, not after the fence's writes too.
            self.metrics.fast_paths.fetch_add(1, Ordering::Relaxed);
        };
        // Beside the node's Events and drain start: the fence waits for its own patch alone.
        let fences = async {
            let mut fence: BTreeMap<String, Vec<Action>> = BTreeMap::new();
            for (n, a) in fence_now(&self.pool_of(view), &node, &actions, now) {
                fence.entry(n).or_default().push(a);
            }
            let me = &self;
            futures::future::join_all(fence.into_iter().map(|(n, marks)| async move {
                me.write_fence(&n, &marks, FenceBy::FastPath).await;
            }))
            .await
        };
        tokio::join!(own, fences);
        self.bump();
    }

    /// Starts the fast path for `node` on the notice lane.
    pub(super) fn spawn_fast_path(self: &Arc<Self>, node: String) {
        let (me, spawned) = (self.clone(), std::time::Instant::now());
        self.actor
            .background
            .spawn("fast path", self.notice_thread.handle(), async move {
                me.fast_path(&node, spawned).await;
            });
    }
}

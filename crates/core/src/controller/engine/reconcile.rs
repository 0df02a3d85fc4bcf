//! The full reconcile: the whole cluster decided at once, each node's actions handed to the
//! actor, and the provider calls retried.

use super::*;

/// Decisions as each node's actions, in order.
pub(super) fn by_node(decisions: Vec<Decision>) -> BTreeMap<String, Vec<Action>> {
    let mut out: BTreeMap<String, Vec<Action>> = BTreeMap::new();
    for d in decisions {
        out.entry(d.node).or_default().push(d.action);
    }
    out
}

impl Engine {
    /// One reconcile: decide and act. Returns the number of actions decided.
    pub async fn reconcile(self: &Arc<Self>) -> usize {
        let started = std::time::Instant::now();
        let now = self.clock.now();
        // Nodes the fast path acts on after this are skipped: this view predates them.
        let taken = self.order.view();
        // Building the view and deciding for every node is CPU-bound (a quarter of a second at
        // 5,000 nodes in a debug build): off the async workers, so that the fast path after a
        // notice, agent reports and the API are not queued behind it.
        let me = self.clone();
        let planned = tokio::task::spawn_blocking(move || {
            let view = me.view(now);
            let (decisions, groups) = decide_with_status(&view, &me.policy, now);
            let (conditions, changes_at) = me.decide_lifecycle(&view, now);
            *lock(&me.next_due) = due::sooner(next_expiry(&view, &me.policy, now), changes_at);
            (view, decisions, groups, conditions)
        })
        .await;
        let (view, decisions, groups, conditions) = match planned {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, "reconcile failed; next round");
                return 0;
            }
        };
        self.metrics.set_groups(groups);
        let mut held: BTreeMap<&'static str, u64> = BTreeMap::new();
        for h in view.nodes.iter().filter_map(|n| n.record().held) {
            *held.entry(h.blocker.reason()).or_default() += 1;
        }
        self.metrics.set_held(held);
        let dry_run = self.policy.controller.dry_run;
        if !dry_run {
            self.retry_provider_calls(&view);
        }
        let count = decisions.len();
        let mut by_node = by_node(decisions);
        if !dry_run {
            // Persist "seen Ready" for young nodes (in the node's first patch of this round).
            for n in view.nodes.iter().filter(|n| n.needs_seen_ready(now)) {
                by_node.entry(n.name.clone()).or_default().insert(
                    0,
                    Action::Annotate {
                        key: keys::SEEN_READY.to_string(),
                        value: Some(now.to_rfc3339()),
                    },
                );
            }
        }
        self.act(by_node, taken).await;
        self.write_lifecycle(conditions, taken).await;
        self.bump();
        self.metrics.reconciles.fetch_add(1, Ordering::Relaxed);
        if count > 0 {
            self.metrics
                .reconciles_with_actions
                .fetch_add(1, Ordering::Relaxed);
        }
        let us = micros(started.elapsed());
        self.metrics.last_reconcile_us.store(us, Ordering::Relaxed);
        let _ = self
            .reconcile_us
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |was| {
                Some(us.max(was - was / 8))
            });
        count
    }

    /// Executes each node's actions (at most `node_concurrency` nodes at once), in the node's
    /// turn, skipping a node the fast path acted on since `view` was taken (it predates that); the
    /// nodes whose actions are only the fence's through [`Self::write_fence`].
    pub(super) async fn act(&self, by_node: BTreeMap<String, Vec<Action>>, view: View) {
        // The fence's writes apart, so that none of them holds a place the others wait for.
        let (fences, others): (Vec<_>, Vec<_>) =
            by_node.into_iter().partition(|(_, a)| fence_only(a));
        // Boxed: a stream's closure futures inside `join!` trip the compiler's `Send` inference
        // for the spawned engine (rust-lang/rust#110338).
        let others = futures::stream::iter(others)
            .for_each_concurrent(self.cfg.node_concurrency.max(1), |(node, actions)| {
                self.act_on(node, actions, view)
            })
            .boxed();
        let fences = futures::future::join_all(
            fences
                .into_iter()
                .map(|(node, marks)| self.fence_on(node, marks, view)),
        )
        .boxed();
        let ((), _) = tokio::join!(others, fences);
    }

    /// One node's actions in its turn (waiting for it), counted as a write the fence gives way to.
    pub(super) async fn act_on(&self, node: String, actions: Vec<Action>, view: View) {
        let turn = self.order.turn(&node).await;
        if !self.order.fresh_for(&turn, view) {
            return;
        }
        let _urgent = self.fence_gate.urgent();
        let dry_run = self.policy.controller.dry_run;
        if let Err(e) = self.actor.execute(&node, &actions, dry_run).await {
            tracing::warn!(error = %e, "action failed; retried by the next reconcile");
        }
    }

    /// Repeats the provider calls a restart or a failure may have lost, with the same idempotency
    /// key: replacements recorded as requested but not accepted (a crash between the annotation
    /// and the call, or a failed call), and nodes recorded as handed over that are not being
    /// deleted yet (the providers' `retire` is idempotent; the actor asks once per process).
    pub(super) fn retry_provider_calls(&self, view: &ClusterView) {
        for n in &view.nodes {
            let Some(at) = n.annotation(keys::REPLACEMENT_REQUESTED) else {
                continue;
            };
            let retire = if !n.annotations.contains_key(REPLACEMENT_ACCEPTED) {
                false
            } else if n.annotations.contains_key(keys::RETIRE_REQUESTED) && !n.deleting {
                true
            } else {
                continue;
            };
            let id = format!("{}/{}", n.name, at);
            let reason = n
                .annotation(keys::REASON)
                .unwrap_or("replacement")
                .to_string();
            let (actor, node) = (self.actor.clone(), n.name.clone());
            self.actor
                .background
                .spawn("provider retry", None, async move {
                    let done = if retire {
                        actor.retire(&node, &id, &reason).await
                    } else {
                        actor.replace(&node, &id, &reason, false).await
                    };
                    if let Err(e) = done {
                        tracing::warn!(error = %e, retire, "provider call failed");
                    }
                });
        }
    }
}

//! Notices per node: recorded on the Node, kept in memory for the policy, withdrawn by a
//! cancellation, taken from the agents' reports and OCI Events.

use super::*;

/// Why a notice could not be recorded on its Node.
#[derive(Debug, thiserror::Error)]
pub enum NotRecorded {
    /// This replica does not hold the Lease (only the leader writes).
    #[error("not the leader")]
    NotLeader,
    /// The Node is not in the cache.
    #[error("node {0} not found")]
    NoNode(String),
    /// Not recorded within the time allowed.
    #[error("not recorded on node {node} within {waited:?}")]
    Timeout {
        /// Node.
        node: String,
        /// How long it waited.
        waited: Duration,
    },
}

/// How a notice stands after [`Engine::record_notice`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// Stored on the Node (or superseded by what is stored, or asking for nothing).
    OnNode,
    /// `dry_run`: nothing is ever written; accepted in memory only.
    DryRun,
}

impl Engine {
    /// Hands a notice to the engine and waits (at most `timeout`, while `leader` holds) until the
    /// Node stores it ([`notice_recorded`]: the interruption annotation, written in the same
    /// patch as its taint and cordon), so that a controller killed afterwards loses nothing.
    pub async fn record_notice(
        &self,
        node: &str,
        ev: &NodeEvent,
        leader: &watch::Receiver<bool>,
        timeout: Duration,
    ) -> Result<Recorded, NotRecorded> {
        if self.policy.controller.dry_run {
            return Ok(Recorded::DryRun);
        }
        let notice = Notice::from(ev);
        let mut progress = self.progress.subscribe();
        let end = tokio::time::Instant::now() + timeout;
        loop {
            if !*leader.borrow() {
                return Err(NotRecorded::NotLeader);
            }
            let v = self
                .node_now(node)
                .ok_or_else(|| NotRecorded::NoNode(node.to_string()))?;
            if notice_recorded(&v, &notice, &self.policy) {
                return Ok(Recorded::OnNode);
            }
            // Re-read after each reconcile or fast path, and now and then in any case.
            let step = tokio::time::Instant::now() + Duration::from_millis(100);
            let wait = tokio::time::timeout_at(step.min(end), progress.changed()).await;
            if tokio::time::Instant::now() >= end {
                return Err(NotRecorded::Timeout {
                    node: node.to_string(),
                    waited: timeout,
                });
            }
            if matches!(wait, Ok(Err(_))) {
                tokio::time::sleep_until(step).await;
            }
        }
    }

    /// Records a notice for `node` (a cancellation replaces the notice it withdraws); true when
    /// the engine did not hold it yet.
    pub fn add_notice(&self, node: &str, ev: &NodeEvent) -> bool {
        let mut n = Notice::from(ev);
        n.boot_id = lock(&self.agent_boots).get(node).cloned();
        let mut all = lock(&self.notices);
        let list = all.entry(node.to_string()).or_default();
        if let NoticeKind::Cancelled { of } = &n.kind {
            list.retain(|x| &x.id != of);
        }
        let added = !list.iter().any(|x| x.id == n.id && x.kind == n.kind);
        if added {
            list.push(n);
        }
        drop(all);
        self.wake.notify_one();
        added
    }

    /// Hands a redelivered notice to the engine again (a notice not stored before a failed
    /// write, a lagging broadcast or a restart): when the engine did not hold it, it is added
    /// and the fast path started. Idempotent.
    pub fn renotice(self: &Arc<Self>, node: &str, ev: &NodeEvent) {
        if self.add_notice(node, ev) {
            self.spawn_fast_path(node.to_string());
        }
    }

    /// The ids of `events` (an agent's report) that `node` stores within `timeout`, waited for
    /// together ([`Self::record_notice`]; each handed to the engine again first): only these are
    /// acknowledged, so the agent resends the others until a leader stores them.
    pub async fn recorded_ids(
        self: &Arc<Self>,
        node: &str,
        events: &[NodeEvent],
        leader: &watch::Receiver<bool>,
        timeout: Duration,
    ) -> Vec<String> {
        let waits = events.iter().map(|ev| async move {
            self.renotice(node, ev);
            match self.record_notice(node, ev, leader, timeout).await {
                Ok(_) => Some(ev.id.clone()),
                Err(e) => {
                    tracing::debug!(node, id = %ev.id, error = %e,
                        "notice not acknowledged yet: the agent resends it");
                    None
                }
            }
        });
        futures::future::join_all(waits)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Takes the boot id of a report from `node`'s agent (before its notices: a notice belongs to
    /// the boot it came from); a new boot wakes the reconcile.
    pub fn agent_reported(&self, node: &str, boot_id: &str) {
        let was = lock(&self.agent_boots).insert(node.to_string(), boot_id.to_string());
        if was.is_some_and(|b| b != boot_id) {
            self.wake.notify_one();
        }
    }

    /// The current notices of `node`.
    pub fn notices(&self, node: &str) -> Vec<Notice> {
        lock(&self.notices).get(node).cloned().unwrap_or_default()
    }

    /// Forgets notices of gone nodes and notices long past.
    pub(super) fn prune_notices(&self, alive: &BTreeMap<String, ()>, now: DateTime<Utc>) {
        let keep_for =
            chrono::Duration::from_std(self.policy.interruption.release_after + KEEP_CANCELLED)
                .unwrap_or(chrono::Duration::MAX);
        let mut all = lock(&self.notices);
        all.retain(|node, _| alive.contains_key(node));
        for list in all.values_mut() {
            list.retain(|n| {
                let at = n.at.unwrap_or(n.detected_at).max(n.detected_at);
                at.checked_add_signed(keep_for).is_none_or(|end| end > now)
            });
        }
    }

    /// Records each notice (waking the reconcile) and, while leading, runs the fast path for
    /// its node at once. Runs on the notice lane when there is one.
    pub(super) async fn take_notices(
        self: Arc<Self>,
        leader: watch::Receiver<bool>,
        mut events: broadcast::Receiver<(String, NodeEvent)>,
        cancel: CancellationToken,
    ) {
        loop {
            let (node, ev) = tokio::select! {
                _ = cancel.cancelled() => return,
                ev = events.recv() => match ev {
                    Ok(x) => x,
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "engine missed node events");
                        self.wake.notify_one();
                        continue;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            };
            let _ = self.add_notice(&node, &ev);
            if *leader.borrow() {
                self.spawn_fast_path(node);
            }
        }
    }
}

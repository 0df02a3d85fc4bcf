//! The due path: the groups whose repair toleration expires now are decided first, when it
//! expires, not at the next tick.

use super::*;

/// The real time from `clock`'s now until `due`, plus 5 ms so that the clock has passed `due` on
/// waking (5 ms when `due` is past).
pub(super) fn wake_after(clock: &dyn Clock, due: DateTime<Utc>) -> Duration {
    let left = (due - clock.now()).to_std().unwrap_or_default();
    clock.real(left) + Duration::from_millis(5)
}

/// `due`, or a wake at `at` with no group to decide first (a lifecycle condition's moment:
/// [`Engine::decide_lifecycle`]) when that is sooner.
pub(super) fn sooner(due: Option<Due>, at: Option<DateTime<Utc>>) -> Option<Due> {
    match (due, at) {
        (Some(d), Some(at)) if at >= d.at => Some(d),
        (_, Some(at)) => Some(Due {
            at,
            groups: BTreeSet::new(),
        }),
        (d, None) => d,
    }
}

impl Engine {
    /// The due path, when a repair toleration expires ([`Due`]): decides and acts on the groups
    /// of the nodes whose toleration ended, from a view of those groups alone
    /// ([`decide_groups`]: the same decision the full reconcile makes for them), so that the
    /// repair's cordon does not wait for a view of the whole cluster. The full reconcile follows
    /// at once. When those groups hold more than half the cluster (one group, or none labelled),
    /// it leaves them to that reconcile, which then costs hardly more. Returns the number of
    /// actions decided.
    pub async fn due_path(self: &Arc<Self>, groups: &BTreeSet<String>) -> usize {
        let taken = self.order.view();
        // Off the async workers, as the reconcile's view (up to half the cluster here).
        let me = self.clone();
        let wanted = groups.clone();
        let planned = tokio::task::spawn_blocking(move || me.decide_due(&wanted)).await;
        let decisions = match planned {
            Ok(Some(d)) => d,
            Ok(None) => return 0,
            Err(e) => {
                tracing::error!(error = %e, "due path failed; the reconcile decides");
                return 0;
            }
        };
        let count = decisions.len();
        self.act(by_node(decisions), taken).await;
        self.metrics.due_paths.fetch_add(1, Ordering::Relaxed);
        self.bump();
        count
    }

    /// [`Self::due_path`]'s view and decision; `None` when `groups` hold more than half the nodes.
    pub(super) fn decide_due(&self, groups: &BTreeSet<String>) -> Option<Vec<Decision>> {
        let now = self.clock.now();
        let group_by = &self.policy.budgets.group_by;
        let all = self.store.state();
        let members: Vec<&Arc<Node>> = all
            .iter()
            .filter(|n| {
                let group = n.metadata.labels.as_ref().and_then(|l| l.get(group_by));
                groups.contains(group.map_or("", String::as_str))
            })
            .collect();
        if members.len() * 2 > all.len() {
            return None;
        }
        let view = ClusterView {
            nodes: members
                .into_iter()
                .filter_map(|n| self.view_of(n))
                .collect(),
            nodepools: self.nodepool_budgets(),
        };
        let decisions = decide_groups(&view, &self.policy, now, groups);
        tracing::debug!(
            groups = groups.len(),
            nodes = view.nodes.len(),
            actions = decisions.len(),
            "repair toleration expired: deciding its groups"
        );
        Some(decisions)
    }

    /// Real time until the next repair toleration expires (plus a little, so that the clock has
    /// passed it on waking), if one is running.
    pub(super) fn until_due(&self) -> Option<Duration> {
        let due = lock(&self.next_due).as_ref()?.at;
        Some(wake_after(self.clock.as_ref(), due))
    }

    /// Whether the next repair toleration expires before a reconcile started now would end: sooner
    /// than twice a recent reconcile's duration (`reconcile_us`: they vary with the API's load),
    /// and at most a tick away (so that holding delays the rest of the reconcile's work by a tick
    /// at most).
    pub(super) fn due_before_done(&self) -> bool {
        let took = Duration::from_micros(self.reconcile_us.load(Ordering::Relaxed));
        let window = (took * 2).min(self.cfg.tick);
        self.until_due().is_some_and(|left| left < window)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_sooner_lifecycle_moment_wakes_with_no_group() {
        let t = |s: i64| DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap();
        let repair = || {
            Some(Due {
                at: t(10),
                groups: ["a".to_string()].into(),
            })
        };
        let alone = |s: i64| {
            Some(Due {
                at: t(s),
                groups: BTreeSet::new(),
            })
        };
        assert_eq!(sooner(repair(), Some(t(5))), alone(5));
        assert_eq!(
            sooner(repair(), Some(t(10))),
            repair(),
            "the repair's groups kept"
        );
        assert_eq!(sooner(repair(), Some(t(20))), repair());
        assert_eq!(sooner(repair(), None), repair());
        assert_eq!(sooner(None, Some(t(5))), alone(5));
        assert_eq!(sooner(None, None), None);
    }
}

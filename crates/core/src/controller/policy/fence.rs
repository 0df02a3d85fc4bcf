//! The Karpenter fence: while nodekeeper disrupts a **Ready** node of a Karpenter NodePool (a repair
//! of a node whose failing condition leaves it Ready, a rebalance drain, the drain of an
//! interruption), the NodePool's other nodes carry `karpenter.sh/do-not-disrupt`, so Karpenter starts
//! no voluntary disruption (consolidation, drift) there meanwhile.
//!
//! Why: Karpenter's budget arithmetic counts a node as disrupting only when it is NotReady or its
//! NodeClaim or Node is being deleted; a node nodekeeper drains while it stays Ready is invisible to
//! it, so Karpenter could disrupt one node more than the NodePool's budget allows. Karpenter takes
//! no external count, so the fence pauses its voluntary disruptions in that NodePool instead.
//! Interruptions are fenced too: neither tool *gates* them by budgets, but both *count* them
//! (Karpenter's own interruption handling deletes the NodeClaim at once, which its arithmetic
//! counts), so a voluntary disruption must not start beside one beyond the budget
//! (tests/e2e/karpenter_budgets.rs saw Karpenter drift the other node of a `nodes: "1"` NodePool
//! while nodekeeper drained a preempted one).
//!
//! Pure: computed from the view with the round's actions played forward ([`NodeView::apply`]).
//! Marks carry `nodekeeper.io/do-not-disrupt-by: fence`; only such marks are lifted, and only once
//! no node of the NodePool needs the fence. A mark someone else put is never touched.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};

use super::view::{keys, parse_time, NodeView, State};
use super::Action;
use crate::controller::policy::nodepool::POOL_LABEL;

/// Value of [`keys::DO_NOT_DISRUPT_BY`] on a fence mark.
pub const FENCE: &str = "fence";

/// Whether `n` (after this round's actions) is a nodekeeper disruption Karpenter cannot count:
/// repairing, or interrupted (an interruption's drain or a rebalance recommendation's), Ready, not
/// being deleted, not yet handed to the provider (once its NodeClaim is deleted Karpenter counts it).
pub fn invisible_to_karpenter(n: &NodeView) -> bool {
    let record = n.record();
    let disrupting = matches!(record.state, State::Repairing | State::Interrupted);
    disrupting && n.is_ready() && !n.deleting && !record.retire_requested
}

/// How long a fence stays after a node of its NodePool was handed to the provider
/// (`retire-requested`), although no node needs it any more: a wave of notices in one NodePool (a
/// cloud reclaims spot capacity per capacity pool) then costs each other node one mark and one
/// lift, not a pair per notice, and the lifts come after the wave instead of among its cordons.
/// Karpenter's voluntary disruptions in that NodePool wait this much longer.
pub const LIFT_HOLD: chrono::TimeDelta = chrono::TimeDelta::seconds(30);

/// The fence actions for the whole view, given each node's actions of this round, at `now`.
pub fn fence(
    nodes: &[NodeView],
    round: &BTreeMap<String, Vec<Action>>,
    now: DateTime<Utc>,
) -> Vec<(String, Action)> {
    // Only the nodes acted on this round are copied (a reconcile of thousands of idle nodes
    // copies none).
    let after: Vec<Cow<'_, NodeView>> = nodes
        .iter()
        .map(|n| match round.get(&n.name) {
            Some(actions) => {
                let mut n = n.clone();
                for a in actions {
                    n.apply(a);
                }
                Cow::Owned(n)
            }
            None => Cow::Borrowed(n),
        })
        .collect();
    // The pool label first: nodes outside Karpenter NodePools never have their record parsed.
    let fenced_pools: BTreeSet<&str> = after
        .iter()
        .filter_map(|n| Some((n.labels.get(POOL_LABEL)?.as_str(), n)))
        .filter(|(_, n)| invisible_to_karpenter(n))
        .map(|(pool, _)| pool)
        .collect();
    // NodePools with a node handed over less than LIFT_HOLD ago keep their marks.
    let held_pools: BTreeSet<&str> = after
        .iter()
        .filter_map(|n| Some((n.labels.get(POOL_LABEL)?.as_str(), n)))
        .filter(|(_, n)| {
            n.annotation(keys::RETIRE_REQUESTED)
                .and_then(parse_time)
                .is_some_and(|t| now - t < LIFT_HOLD)
        })
        .map(|(pool, _)| pool)
        .collect();
    let mut out = Vec::new();
    for n in &after {
        let Some(pool) = n.labels.get(POOL_LABEL) else {
            continue;
        };
        let marked = n.annotation(keys::KARPENTER_DO_NOT_DISRUPT) == Some("true");
        let ours = n.annotation(keys::DO_NOT_DISRUPT_BY) == Some(FENCE);
        let wanted = fenced_pools.contains(pool.as_str()) && !n.deleting;
        let annotate = |key: &str, value: Option<&str>| {
            (
                n.name.clone(),
                Action::Annotate {
                    key: key.to_string(),
                    value: value.map(str::to_string),
                },
            )
        };
        if wanted && !marked {
            // Ownership first, so a crash in between never leaves an unowned mark.
            out.push(annotate(keys::DO_NOT_DISRUPT_BY, Some(FENCE)));
            out.push(annotate(keys::KARPENTER_DO_NOT_DISRUPT, Some("true")));
        } else if !wanted && ours && !held_pools.contains(pool.as_str()) {
            out.push(annotate(keys::KARPENTER_DO_NOT_DISRUPT, None));
            out.push(annotate(keys::DO_NOT_DISRUPT_BY, None));
        }
    }
    out
}

/// The marks a fresh disruption needs at once, for the engine's fast path after a notice: what
/// [`fence`] adds when `node` takes `actions` this round, given `pool`, the nodes of its NodePool
/// (`node` included). Only additions: whether a mark is lifted depends on the whole round, which
/// the reconcile decides; a disruption only ever adds marks, so these are [`fence`]'s for the pool.
pub fn fence_now(
    pool: &[NodeView],
    node: &str,
    actions: &[Action],
    now: DateTime<Utc>,
) -> Vec<(String, Action)> {
    let round = BTreeMap::from([(node.to_string(), actions.to_vec())]);
    fence(pool, &round, now)
        .into_iter()
        .filter(|(_, a)| matches!(a, Action::Annotate { value: Some(_), .. }))
        .collect()
}

/// Whether a node's actions only set or lift fence marks ([`fence`]'s writes, or the lift of a
/// mark of nodekeeper's): what the engine lets wait for its other Node writes
/// (`controller::engine::fence_gate`).
pub fn fence_only(actions: &[Action]) -> bool {
    !actions.is_empty()
        && actions.iter().all(|a| match a {
            Action::Annotate { key, value } => match value.as_deref() {
                None => key == keys::KARPENTER_DO_NOT_DISRUPT || key == keys::DO_NOT_DISRUPT_BY,
                Some(v) => {
                    (key == keys::KARPENTER_DO_NOT_DISRUPT && v == "true")
                        || (key == keys::DO_NOT_DISRUPT_BY && v == FENCE)
                }
            },
            _ => false,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotate(key: &str, value: Option<&str>) -> Action {
        Action::Annotate {
            key: key.into(),
            value: value.map(str::to_string),
        }
    }

    #[test]
    fn only_marks_and_lifts_are_fence_only() {
        let mark = [
            annotate(keys::DO_NOT_DISRUPT_BY, Some(FENCE)),
            annotate(keys::KARPENTER_DO_NOT_DISRUPT, Some("true")),
        ];
        let lift = [
            annotate(keys::KARPENTER_DO_NOT_DISRUPT, None),
            annotate(keys::DO_NOT_DISRUPT_BY, None),
        ];
        assert!(fence_only(&mark));
        assert!(fence_only(&lift));
        // A node's own mark (by nodekeeper, not the fence) goes with its disruption: not the fence's.
        assert!(!fence_only(&[
            annotate(keys::DO_NOT_DISRUPT_BY, Some("nodekeeper")),
            annotate(keys::KARPENTER_DO_NOT_DISRUPT, Some("true")),
        ]));
        assert!(!fence_only(&[mark[0].clone(), Action::Cordon]));
        assert!(!fence_only(&[annotate(
            keys::KARPENTER_DO_NOT_DISRUPT,
            Some("false")
        )]));
        assert!(!fence_only(&[annotate(keys::RETIRE_REQUESTED, None)]));
        assert!(!fence_only(&[]));
    }
}

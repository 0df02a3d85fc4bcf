//! "Why is this node held?": a machine-readable blocker per node, published as the
//! `nodekeeper.io/blocked` annotation (JSON) and as a `NodekeeperHeld` node condition, and
//! repeated in Events. `nodekeeper status` reads the annotation back.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::budget::in_zone;
use crate::controller::catalog::{self, Reason};

/// What holds a node back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Blocker {
    /// An eviction is refused by a PodDisruptionBudget.
    Pdb {
        /// `namespace/name` of the pod.
        pod: String,
        /// `namespace/name` of the PDB.
        pdb: String,
        /// The drain deadline, when there is one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deadline: Option<DateTime<Utc>>,
    },
    /// A pod opts out of voluntary disruption.
    DoNotDisrupt {
        /// `namespace/name` of the pod.
        pod: String,
        /// The drain deadline, when there is one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deadline: Option<DateTime<Utc>>,
    },
    /// An operator vetoed the node's repair with a do-not-repair annotation.
    DoNotRepair {
        /// The annotation (`karpenter.sh/do-not-repair` or `nodekeeper.io/do-not-repair`).
        annotation: String,
    },
    /// Karpenter is disrupting the node (its `karpenter.sh/disrupted` taint: its NodeRepair,
    /// drift or consolidation chose it and replaces and drains it; or `karpenter.sh/rebooting`:
    /// its NodeRepair reboots it in place), so nodekeeper starts no
    /// repair of its own there and stops one that had not reached its replacement.
    KarpenterDisrupting,
    /// The group's disruption budget allows no more nodes now.
    Budget {
        /// Node group.
        group: String,
        /// Index of the binding budget in the group's list.
        budget: usize,
        /// Its `nodes` value (`"1"`, `"10%"`).
        nodes: String,
        /// Nodes already disrupting or NotReady in the group.
        disrupting: usize,
        /// Nodes in the group.
        total: usize,
        /// When the schedules alone free a slot (`None`: when a disruption finishes).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        opens_at: Option<DateTime<Utc>>,
        /// The binding budget's time zone, for display.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timezone: Option<String>,
        /// The NodePool the binding budget comes from (`[budgets] source = "nodepool"`; then
        /// `budget` indexes its `spec.disruption.budgets`); absent: the configuration's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        nodepool: Option<String>,
    },
    /// The group's NodePool has budgets Karpenter would refuse: its disruptions are held.
    NodePool {
        /// Node group.
        group: String,
        /// The NodePool.
        nodepool: String,
        /// The field and what is wrong with it.
        problem: String,
    },
    /// Too many nodes of the group are unhealthy to start another repair.
    ShortCircuit {
        /// Node group.
        group: String,
        /// Unhealthy nodes.
        unhealthy: usize,
        /// Nodes in the group.
        total: usize,
        /// The configured `max_unhealthy`.
        max_unhealthy: String,
    },
    /// A drain missed its deadline.
    Deadline {
        /// The deadline.
        deadline: DateTime<Utc>,
    },
    /// Replacement nodes kept failing to become Ready.
    StartupRetries {
        /// Replacements done.
        retries: u32,
        /// Limit.
        max: u32,
    },
    /// A replacement was requested but the node is still here.
    ReplacementPending {
        /// Requested at.
        requested_at: DateTime<Utc>,
    },
    /// The ladder's next step is destructive (reboot, replace) and the condition is one
    /// nodekeeper cannot see clear (its policy does not set `allow_destructive`).
    UntrustedCondition {
        /// The condition type.
        condition: String,
        /// The step not taken.
        step: String,
    },
    /// The repair policy's ladder says `none`: no action, held for an operator.
    RepairPolicy {
        /// The matched condition (`Type=Status`, `/Reason` with a reason pattern).
        condition: String,
    },
}

impl Blocker {
    /// The reason of the `NodekeeperHeld` condition and of the Event announcing the hold.
    pub fn event_reason(&self) -> Reason {
        match self {
            Blocker::Pdb { .. } => Reason::BlockedByPDB,
            Blocker::DoNotDisrupt { .. } => Reason::BlockedByDoNotDisrupt,
            Blocker::DoNotRepair { .. } => Reason::BlockedByDoNotRepair,
            Blocker::KarpenterDisrupting => Reason::BlockedByKarpenter,
            Blocker::Budget { .. } => Reason::BlockedByBudget,
            Blocker::NodePool { .. } => Reason::BlockedByNodePool,
            Blocker::ShortCircuit { .. } => Reason::RepairShortCircuited,
            Blocker::Deadline { .. } => Reason::DeadlineExceeded,
            Blocker::StartupRetries { .. } => Reason::StartupRetriesExhausted,
            Blocker::ReplacementPending { .. } => Reason::ReplacementPending,
            Blocker::UntrustedCondition { .. } => Reason::BlockedByUntrustedCondition,
            Blocker::RepairPolicy { .. } => Reason::HeldByRepairPolicy,
        }
    }

    /// [`Blocker::event_reason`] as a string (conditions, status, metric labels).
    pub fn reason(&self) -> &'static str {
        self.event_reason().as_str()
    }

    /// One line for people.
    pub fn message(&self) -> String {
        let dl = |d: &Option<DateTime<Utc>>| {
            d.map(|d| format!(" (drain deadline {})", d.to_rfc3339()))
                .unwrap_or_default()
        };
        match self {
            Blocker::Pdb { pod, pdb, deadline } => {
                format!("eviction of pod {pod} refused by PodDisruptionBudget {pdb}{}", dl(deadline))
            }
            Blocker::DoNotDisrupt { pod, deadline } => {
                format!("pod {pod} is marked do-not-disrupt{}", dl(deadline))
            }
            Blocker::DoNotRepair { annotation } => format!(
                "repair vetoed by the node's annotation {annotation}=\"true\": no cordon, drain, reboot or replacement for a repair until it is removed (interruption notices are still handled)"
            ),
            Blocker::KarpenterDisrupting => format!(
                "Karpenter is disrupting the node (taint {} or {}): it drains and replaces or reboots it, so nodekeeper stands back (no cordon, drain, reboot or replacement of its own)",
                super::view::KARPENTER_DISRUPTED_TAINT,
                super::view::KARPENTER_REBOOTING_TAINT
            ),
            Blocker::Budget {
                group,
                budget,
                nodes,
                disrupting,
                total,
                opens_at,
                timezone,
                nodepool,
            } => {
                let when = match opens_at {
                    Some(t) => format!("; window opens at {}", in_zone(*t, timezone.as_deref())),
                    None => "; waits for a disruption in the group to finish".to_string(),
                };
                let of = match nodepool {
                    Some(p) => format!("of NodePool {p}"),
                    None => format!("of group {}", group_name(group)),
                };
                format!(
                    "disruption budget #{budget} (nodes={nodes}) {of} allows no more: {disrupting} of {total} nodes disrupting or NotReady{when}"
                )
            }
            Blocker::NodePool {
                group,
                nodepool,
                problem,
            } => format!(
                "NodePool {nodepool}: {problem}; Karpenter would refuse it, so disruptions of group {} are held until it is fixed",
                group_name(group)
            ),
            Blocker::ShortCircuit {
                group,
                unhealthy,
                total,
                max_unhealthy,
            } => format!(
                "repair short-circuited: {unhealthy} of {total} nodes of group {} unhealthy (max_unhealthy {max_unhealthy})",
                group_name(group)
            ),
            Blocker::Deadline { deadline } => {
                format!("drain did not finish by its deadline {}", deadline.to_rfc3339())
            }
            Blocker::StartupRetries { retries, max } => format!(
                "node never became Ready; its predecessors were replaced {retries} times (max_startup_retries {max}); held for an operator"
            ),
            Blocker::ReplacementPending { requested_at } => format!(
                "replacement requested at {} but the node is still present",
                requested_at.to_rfc3339()
            ),
            Blocker::UntrustedCondition { condition, step } => format!(
                "{condition} is written by another component and nodekeeper cannot see it clear, so the repair does not {step}; held until it clears or an operator acts (allow_destructive = true on its policy trusts it)"
            ),
            Blocker::RepairPolicy { condition } => format!(
                "the repair policy for {condition} takes no action (step none): held for an operator"
            ),
        }
    }
}

/// Display name of a group (`""` is the group of nodes without the label).
pub fn group_name(group: &str) -> &str {
    if group.is_empty() {
        "(none)"
    } else {
        group
    }
}

/// A published hold: the blocker and since when it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// The blocker.
    #[serde(flatten)]
    pub blocker: Blocker,
    /// Since when (kept while the blocker stays the same).
    pub since: DateTime<Utc>,
}

/// Node condition type carrying the hold.
pub const CONDITION_TYPE: &str = catalog::HELD_CONDITION;

/// A node condition as the actor writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionSpec {
    /// [`CONDITION_TYPE`].
    pub type_: &'static str,
    /// `True` while held.
    pub status: &'static str,
    /// [`Blocker::reason`].
    pub reason: &'static str,
    /// [`Blocker::message`].
    pub message: String,
    /// Since.
    pub last_transition_time: DateTime<Utc>,
}

impl Held {
    /// The annotation value (compact JSON).
    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
    /// Parses [`Held::encode`].
    pub fn decode(s: &str) -> Option<Self> {
        serde_json::from_str(s).ok()
    }
    /// The `NodekeeperHeld` condition.
    pub fn condition(&self) -> ConditionSpec {
        ConditionSpec {
            type_: CONDITION_TYPE,
            status: "True",
            reason: self.blocker.reason(),
            message: self.blocker.message(),
            last_transition_time: self.since,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_round_trips_and_names_pod_and_pdb() {
        let since = DateTime::parse_from_rfc3339("2026-11-30T01:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let h = Held {
            blocker: Blocker::Pdb {
                pod: "shop/web-1".into(),
                pdb: "shop/web".into(),
                deadline: None,
            },
            since,
        };
        let s = h.encode();
        assert_eq!(
            s,
            r#"{"kind":"pdb","pod":"shop/web-1","pdb":"shop/web","since":"2026-11-30T01:00:00Z"}"#
        );
        assert_eq!(Held::decode(&s), Some(h.clone()));
        let c = h.condition();
        assert_eq!(c.reason, "BlockedByPDB");
        assert!(c.message.contains("shop/web-1") && c.message.contains("shop/web"));
    }

    #[test]
    fn a_veto_hold_names_its_annotation() {
        let h = Held {
            blocker: Blocker::DoNotRepair {
                annotation: "karpenter.sh/do-not-repair".into(),
            },
            since: DateTime::parse_from_rfc3339("2026-12-06T01:00:00Z")
                .unwrap()
                .with_timezone(&Utc),
        };
        let s = h.encode();
        assert_eq!(
            s,
            r#"{"kind":"do_not_repair","annotation":"karpenter.sh/do-not-repair","since":"2026-12-06T01:00:00Z"}"#
        );
        assert_eq!(Held::decode(&s), Some(h.clone()));
        let c = h.condition();
        assert_eq!(c.reason, "BlockedByDoNotRepair");
        assert!(
            c.message.contains("karpenter.sh/do-not-repair"),
            "{}",
            c.message
        );
    }

    #[test]
    fn budget_message_shows_opening_in_zone() {
        let b = Blocker::Budget {
            group: "spot".into(),
            budget: 1,
            nodes: "0".into(),
            disrupting: 0,
            total: 4,
            opens_at: Some(
                DateTime::parse_from_rfc3339("2026-11-30T15:00:00Z")
                    .unwrap()
                    .with_timezone(&Utc),
            ),
            timezone: Some("Asia/Shanghai".into()),
            nodepool: None,
        };
        assert!(
            b.message().contains("window opens at 2026-11-30 23:00 CST"),
            "{}",
            b.message()
        );
    }
}

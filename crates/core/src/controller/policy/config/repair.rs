//! `[repair]`: policies, escalation steps, per-group overrides, and their validation.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::kpo::RawPolicy;
use super::Quantity;
use crate::cfg_path;
use crate::config::{k8s_value_error, Diagnostic, PathSeg};
use crate::k8s::validation as k8s;

/// One escalation step of a repair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RepairStep {
    /// Cordon and drain gracefully (bounded by `drain_timeout`).
    Drain,
    /// Ask the node's agent to reboot through systemd; done when the boot id changes.
    Reboot,
    /// Ask the replacement provider for a new node (the old one is removed by it).
    Replace,
}

impl RepairStep {
    /// Stable lower-case name, as written in the `nodekeeper.io/repair-step` annotation.
    pub fn name(self) -> &'static str {
        match self {
            RepairStep::Drain => "drain",
            RepairStep::Reboot => "reboot",
            RepairStep::Replace => "replace",
        }
    }
    /// Parses [`RepairStep::name`].
    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "drain" => Some(RepairStep::Drain),
            "reboot" => Some(RepairStep::Reboot),
            "replace" => Some(RepairStep::Replace),
            _ => None,
        }
    }
}

/// `[[repair.policy]]`: a node whose condition `condition_type` has had status
/// `condition_status` for `toleration` is repaired.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "RawPolicy", into = "RawPolicy")]
pub struct RepairPolicy {
    /// Node condition type, e.g. `Ready`.
    pub condition_type: String,
    /// Status that counts as unhealthy: `True`, `False` or `Unknown`.
    pub condition_status: String,
    /// How long the condition must hold before the repair starts.
    pub toleration: Duration,
}

/// `[repair]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RepairConfig {
    /// Repairs happen at all (policies still count unhealthy nodes when false).
    pub enabled: bool,
    /// The policies (`[[repair.policy]]`). Empty (and no `repairPolicies`): no repair.
    pub policy: Vec<RepairPolicy>,
    /// KPO's `repairPolicies = [...]`, as-is; used together with `policy`.
    #[serde(rename = "repairPolicies", skip_serializing_if = "Vec::is_empty")]
    pub repair_policies: Vec<RepairPolicy>,
    /// Escalation steps, in order (a subsequence of `drain`, `reboot`, `replace`).
    pub steps: Vec<RepairStep>,
    /// No new repair starts while more nodes of the group than this are unhealthy
    /// (count or percentage of the group, rounded up; default 20 %, like Karpenter).
    pub max_unhealthy: Quantity,
    /// A repaired node healthy again for this long ends its repair (flap guard).
    #[serde(with = "humantime_serde")]
    pub healthy_delay: Duration,
    /// How long the `drain` step may take before escalating.
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// How long the `reboot` step may take (boot id change and healthy) before escalating.
    #[serde(with = "humantime_serde")]
    pub reboot_timeout: Duration,
    /// After this long a requested replacement whose node still exists is shown as blocked.
    #[serde(with = "humantime_serde")]
    pub replace_timeout: Duration,
    /// A node never Ready this long after creation is replaced (`0s` disables; default 10 min,
    /// as Cluster API's `nodeStartupTimeout`).
    #[serde(with = "humantime_serde")]
    pub startup_timeout: Duration,
    /// How many times a node that fails to start is replaced before it is held.
    pub max_startup_retries: u32,
    /// Per-group overrides, keyed by the group name (the value of `budgets.group_by`).
    pub groups: BTreeMap<String, RepairGroup>,
}

impl Default for RepairConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            policy: Vec::new(),
            repair_policies: Vec::new(),
            steps: vec![RepairStep::Drain, RepairStep::Replace],
            max_unhealthy: Quantity::Percent(20),
            healthy_delay: Duration::from_secs(120),
            drain_timeout: Duration::from_secs(15 * 60),
            reboot_timeout: Duration::from_secs(10 * 60),
            replace_timeout: Duration::from_secs(30 * 60),
            startup_timeout: Duration::from_secs(10 * 60),
            max_startup_retries: 3,
            groups: BTreeMap::new(),
        }
    }
}

/// `[repair.groups.<name>]`: overrides for one node group.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RepairGroup {
    /// Overrides `repair.enabled`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Replaces `repair.policy` for this group.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<Vec<RepairPolicy>>,
    /// KPO's form of `policy` (used together with it).
    #[serde(rename = "repairPolicies", skip_serializing_if = "Option::is_none")]
    pub repair_policies: Option<Vec<RepairPolicy>>,
    /// Overrides `repair.steps`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<Vec<RepairStep>>,
    /// Overrides `repair.max_unhealthy`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_unhealthy: Option<Quantity>,
}

/// The repair settings in effect for one group.
#[derive(Debug, Clone)]
pub struct EffectiveRepair<'a> {
    /// Repairs enabled.
    pub enabled: bool,
    /// Policies (`policy` then `repairPolicies`).
    pub policies: Vec<RepairPolicy>,
    /// Steps.
    pub steps: &'a [RepairStep],
    /// Short-circuit threshold.
    pub max_unhealthy: Quantity,
}

impl RepairConfig {
    /// The Node condition types the policy reads: `Ready`, and every type a repair policy names
    /// (the global ones and each group's). A change of any other condition cannot change a
    /// decision (the engine's [`NodeWake`](crate::controller::engine::wake::NodeWake) ignores it).
    pub fn condition_types(&self) -> BTreeSet<String> {
        let groups = self.groups.values().flat_map(|g| {
            let policy = g.policy.iter().flatten();
            policy.chain(g.repair_policies.iter().flatten())
        });
        self.policy
            .iter()
            .chain(&self.repair_policies)
            .chain(groups)
            .map(|p| p.condition_type.clone())
            .chain(["Ready".to_string()])
            .collect()
    }

    /// The settings for `group` (overrides applied).
    pub fn for_group(&self, group: &str) -> EffectiveRepair<'_> {
        let o = self.groups.get(group);
        EffectiveRepair {
            enabled: o.and_then(|g| g.enabled).unwrap_or(self.enabled),
            policies: match o {
                Some(g) if g.policy.is_some() || g.repair_policies.is_some() => {
                    let mut v = g.policy.clone().unwrap_or_default();
                    v.extend(g.repair_policies.clone().unwrap_or_default());
                    v
                }
                _ => {
                    let mut v = self.policy.clone();
                    v.extend(self.repair_policies.iter().cloned());
                    v
                }
            },
            steps: o.and_then(|g| g.steps.as_deref()).unwrap_or(&self.steps),
            max_unhealthy: o
                .and_then(|g| g.max_unhealthy)
                .unwrap_or(self.max_unhealthy),
        }
    }
}

pub(super) fn validate_repair(r: &RepairConfig) -> Vec<Diagnostic> {
    let mut d = validate_policies(&r.policy, cfg_path!["repair", "policy"]);
    d.extend(validate_policies(
        &r.repair_policies,
        cfg_path!["repair", "repairPolicies"],
    ));
    d.extend(validate_steps(&r.steps, cfg_path!["repair", "steps"]));
    if r.enabled && r.steps.is_empty() {
        d.push(Diagnostic::error(
            cfg_path!["repair", "steps"],
            "at least one step (drain, reboot, replace) is needed while repair is enabled",
        ));
    }
    if r.healthy_delay.is_zero() {
        d.push(Diagnostic::warning(
            cfg_path!["repair", "healthy_delay"],
            "0s: a node that is healthy for an instant cancels its repair (no flap guard)",
        ));
    }
    for (key, v) in [
        ("drain_timeout", r.drain_timeout),
        ("reboot_timeout", r.reboot_timeout),
        ("replace_timeout", r.replace_timeout),
    ] {
        if v.is_zero() {
            d.push(Diagnostic::error(
                cfg_path!["repair", key],
                "must be greater than zero",
            ));
        }
    }
    for (name, g) in &r.groups {
        d.extend(k8s_value_error(
            cfg_path!["repair", "groups", name.as_str()],
            "group name (a value of the budgets.group_by label)",
            name,
            k8s::label_value(name),
        ));
        if let Some(p) = &g.policy {
            d.extend(validate_policies(
                p,
                cfg_path!["repair", "groups", name.as_str(), "policy"],
            ));
        }
        if let Some(p) = &g.repair_policies {
            d.extend(validate_policies(
                p,
                cfg_path!["repair", "groups", name.as_str(), "repairPolicies"],
            ));
        }
        if let Some(s) = &g.steps {
            d.extend(validate_steps(
                s,
                cfg_path!["repair", "groups", name.as_str(), "steps"],
            ));
        }
    }
    d
}

fn validate_policies(policies: &[RepairPolicy], path: Vec<PathSeg>) -> Vec<Diagnostic> {
    let mut d = Vec::new();
    for (i, p) in policies.iter().enumerate() {
        let at = |k: &str| {
            let mut v = path.clone();
            v.push(PathSeg::Index(i));
            v.push(PathSeg::from(k));
            v
        };
        if !matches!(p.condition_status.as_str(), "True" | "False" | "Unknown") {
            d.push(Diagnostic::error(
                at("condition_status"),
                format!(
                    "`{}` is not a condition status (True, False or Unknown)",
                    p.condition_status
                ),
            ));
        }
        if p.condition_type.trim().is_empty() {
            d.push(Diagnostic::error(at("condition_type"), "must not be empty"));
        }
        if p.toleration.is_zero() {
            d.push(Diagnostic::warning(
                at("toleration"),
                "0s: the node is repaired the moment the condition appears",
            ));
        }
        let dup = policies[..i].iter().any(|q| {
            q.condition_type == p.condition_type && q.condition_status == p.condition_status
        });
        if dup {
            d.push(Diagnostic::warning(
                at("condition_type"),
                format!(
                    "{}={} is listed twice; the shortest toleration wins",
                    p.condition_type, p.condition_status
                ),
            ));
        }
    }
    d
}

fn validate_steps(steps: &[RepairStep], path: Vec<PathSeg>) -> Vec<Diagnostic> {
    let ordered = steps.windows(2).all(|w| w[0] < w[1]);
    if ordered {
        return Vec::new();
    }
    vec![Diagnostic::error(
        path,
        "steps escalate in the order drain, reboot, replace, each at most once",
    )]
}

//! `[budgets]`: per-group disruption budgets with cron windows, and their validation.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::super::budget::{parse_reason, Window};
use super::Quantity;
use crate::cfg_path;
use crate::config::{k8s_value_error, Diagnostic, PathSeg};
use crate::k8s::validation as k8s;

/// One disruption budget, in Karpenter's shape plus `timezone`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// At most this many nodes of the group disrupted at once (`"1"` or `"10%"`, rounded up).
    pub nodes: Quantity,
    /// When the budget is active: 5-field cron (`0 9 * * 1-5`) or `@daily`, `@weekly`, ...;
    /// absent: always active.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// How long each window lasts from a schedule hit (required with `schedule`).
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub duration: Option<Duration>,
    /// IANA time zone the schedule is read in (default `UTC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// The disruption reasons it applies to (`repair`, `rebalance`); empty: all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
}

impl Budget {
    /// An always-active budget of `nodes`.
    pub fn always(nodes: Quantity) -> Self {
        Budget {
            nodes,
            schedule: None,
            duration: None,
            timezone: None,
            reasons: Vec::new(),
        }
    }
}

/// `[budgets] source`: where each group's budgets come from.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BudgetsSource {
    /// This section (`budgets`, `groups`).
    #[default]
    Config,
    /// The Karpenter NodePool named like the group (`spec.disruption.budgets`, read as Karpenter
    /// reads it), plus the group's `[budgets.groups.<group>]` list if any; groups without a
    /// NodePool use this section.
    #[serde(rename = "nodepool")]
    NodePool,
}

impl BudgetsSource {
    /// `config` or `nodepool`.
    pub fn name(self) -> &'static str {
        match self {
            BudgetsSource::Config => "config",
            BudgetsSource::NodePool => "nodepool",
        }
    }
}

/// `[budgets]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetsConfig {
    /// The node label whose value names a node's group (nodes without it form group `""`).
    /// Budgets and the repair short-circuit are evaluated per group.
    pub group_by: String,
    /// Where the budgets come from: `config` (this section) or `nodepool` (Karpenter's NodePools;
    /// needs the NodePool CRD, checked when the controller starts).
    pub source: BudgetsSource,
    /// `budgets = [...]`: budgets of every group not listed in `groups` (Karpenter's
    /// default: one `10%`).
    #[serde(rename = "budgets")]
    pub default: Vec<Budget>,
    /// Budgets per group name, e.g. `shared-spot = [{ nodes = "1" }]`.
    pub groups: BTreeMap<String, Vec<Budget>>,
}

impl Default for BudgetsConfig {
    fn default() -> Self {
        Self {
            group_by: "karpenter.sh/nodepool".to_string(),
            source: BudgetsSource::Config,
            default: vec![Budget::always(Quantity::Percent(10))],
            groups: BTreeMap::new(),
        }
    }
}

impl BudgetsConfig {
    /// The budgets of `group`.
    pub fn for_group(&self, group: &str) -> &[Budget] {
        self.groups.get(group).unwrap_or(&self.default)
    }
}

pub(super) fn validate_budgets(b: &BudgetsConfig) -> Vec<Diagnostic> {
    let mut d = Vec::new();
    if b.group_by.trim().is_empty() {
        d.push(Diagnostic::error(
            cfg_path!["budgets", "group_by"],
            "must name a node label, e.g. karpenter.sh/nodepool",
        ));
    } else {
        d.extend(k8s_value_error(
            cfg_path!["budgets", "group_by"],
            "label key",
            &b.group_by,
            k8s::qualified_name(&b.group_by),
        ));
    }
    if b.source == BudgetsSource::NodePool {
        d.push(Diagnostic::warning(
            cfg_path!["budgets", "source"],
            "\"nodepool\" reads each group's budgets from the Karpenter NodePool of the same name: \
             the controller needs the NodePool CRD (karpenter.sh/v1 nodepools) and list/watch \
             on it, and refuses to start without them (validate does not contact the cluster)",
        ));
    }
    for name in b.groups.keys() {
        d.extend(k8s_value_error(
            cfg_path!["budgets", "groups", name.as_str()],
            "group name (a value of the group_by label)",
            name,
            k8s::label_value(name),
        ));
    }
    for (i, budget) in b.default.iter().enumerate() {
        d.extend(validate_budget(budget, cfg_path!["budgets", "budgets", i]));
    }
    for (name, list) in &b.groups {
        for (i, budget) in list.iter().enumerate() {
            d.extend(validate_budget(
                budget,
                cfg_path!["budgets", "groups", name.as_str(), i],
            ));
        }
    }
    d
}

fn validate_budget(b: &Budget, path: Vec<PathSeg>) -> Vec<Diagnostic> {
    let at = |k: &str| {
        let mut v = path.clone();
        v.push(PathSeg::from(k));
        v
    };
    let mut d = Vec::new();
    match (&b.schedule, b.duration) {
        (Some(_), None) => d.push(Diagnostic::error(
            at("schedule"),
            "a schedule needs a `duration` (how long each window lasts, e.g. \"14h\")",
        )),
        (None, Some(_)) => d.push(Diagnostic::error(
            at("duration"),
            "a duration needs a `schedule` (when each window starts)",
        )),
        (Some(s), Some(dur)) => {
            let tz = b.timezone.as_deref().unwrap_or("UTC");
            if let Err(e) = Window::parse(s, dur, tz) {
                let key = if e.starts_with("time zone") {
                    "timezone"
                } else {
                    "schedule"
                };
                d.push(Diagnostic::error(at(key), e));
            }
        }
        (None, None) => {
            if b.timezone.is_some() {
                d.push(Diagnostic::warning(
                    at("timezone"),
                    "has no effect without `schedule`",
                ));
            }
        }
    }
    for (j, r) in b.reasons.iter().enumerate() {
        let mut p = at("reasons");
        p.push(PathSeg::Index(j));
        match parse_reason(r) {
            Ok(Some(_)) => {}
            Ok(None) => d.push(Diagnostic::warning(
                p,
                format!(
                    "`{r}` is a reason nodekeeper never disrupts for; this entry never applies"
                ),
            )),
            Err(e) => d.push(Diagnostic::error(p, e)),
        }
    }
    d
}

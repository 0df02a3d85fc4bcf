//! Policy configuration: `[repair]` (with `[[repair.policy]]` and per-group overrides),
//! `[budgets]` (per-group disruption budgets with cron windows in IANA time zones),
//! `[interruption]` and `[controller] dry_run`.
//!
//! Repair policies are accepted in nodekeeper's form (`condition_type`, `condition_status`,
//! `toleration = "10m"`) and in Karpenter/KPO's form as-is (`conditionType`, `conditionStatus`,
//! `tolerationDuration = 600000000000`, in nanoseconds), also as KPO's Helm/JSON
//! `repairPolicies` list ([`parse_kpo_repair_policies`]).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::budget::{parse_reason, Window};
use crate::cfg_path;
use crate::config::{k8s_value_error, Diagnostic, PathSeg};
use crate::k8s::validation as k8s;

/// All policy sections. In the config file they are top-level sections of
/// [`crate::config::Config`] (`[repair]`, `[budgets]`, `[interruption]`, `[controller]`);
/// [`PolicyConfig::from_config`] bundles them for [`super::decide`]. (They are separate fields
/// there, not one `#[serde(flatten)]` field: flattening loses the FILE:LINE:COL of every
/// unknown top-level key and of type errors inside these sections.)
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// `[repair]`
    pub repair: RepairConfig,
    /// `[budgets]`
    pub budgets: BudgetsConfig,
    /// `[interruption]`
    pub interruption: InterruptionConfig,
    /// `[controller]` (the policy's part: `dry_run`).
    pub controller: ControllerPolicyConfig,
}

impl PolicyConfig {
    /// The policy sections of a loaded configuration.
    pub fn from_config(c: &crate::config::Config) -> Self {
        PolicyConfig {
            repair: c.repair.clone(),
            budgets: c.budgets.clone(),
            interruption: c.interruption.clone(),
            controller: ControllerPolicyConfig {
                dry_run: c.controller.as_ref().is_some_and(|c| c.dry_run),
            },
        }
    }
}

/// `[controller]`: the part the decision core reads.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ControllerPolicyConfig {
    /// Decide as usual, but mark every decision dry-run: the actor only logs them and writes
    /// Events/status, never cordons, evicts, reboots or replaces.
    pub dry_run: bool,
}

/// A node count: absolute (`"1"`, `1`) or a percentage of the group (`"10%"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantity {
    /// An absolute number of nodes.
    Count(u32),
    /// A percentage (0–100) of the group's nodes.
    Percent(u32),
}

impl Quantity {
    /// The number of nodes for a group of `total`; percentages are rounded up (as Karpenter
    /// budgets do) or down.
    pub fn resolve(self, total: usize, round_up: bool) -> usize {
        match self {
            Quantity::Count(n) => n as usize,
            Quantity::Percent(p) => {
                let scaled = total as u64 * u64::from(p);
                let v = if round_up {
                    scaled.div_ceil(100)
                } else {
                    scaled / 100
                };
                usize::try_from(v).unwrap_or(usize::MAX)
            }
        }
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Quantity::Count(n) => write!(f, "{n}"),
            Quantity::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl std::str::FromStr for Quantity {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            let p: u32 = p
                .trim()
                .parse()
                .map_err(|_| format!("`{s}` is not a percentage like \"10%\""))?;
            if p > 100 {
                return Err(format!("`{s}`: a percentage must be 0–100%"));
            }
            return Ok(Quantity::Percent(p));
        }
        t.parse()
            .map(Quantity::Count)
            .map_err(|_| format!("`{s}` is not a node count (\"1\") or a percentage (\"10%\")"))
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum QuantityRaw {
    Int(u32),
    Str(String),
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match QuantityRaw::deserialize(d)? {
            QuantityRaw::Int(n) => Ok(Quantity::Count(n)),
            QuantityRaw::Str(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

impl Serialize for Quantity {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

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

/// Wire form of a policy: nodekeeper's keys or Karpenter/KPO's, as-is.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(alias = "conditionType")]
    condition_type: String,
    #[serde(alias = "conditionStatus")]
    condition_status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    toleration: Option<String>,
    /// Karpenter's `tolerationDuration`: a Go `time.Duration` in nanoseconds.
    #[serde(
        default,
        rename = "tolerationDuration",
        skip_serializing_if = "Option::is_none"
    )]
    toleration_duration: Option<u64>,
}

impl TryFrom<RawPolicy> for RepairPolicy {
    type Error = String;
    fn try_from(raw: RawPolicy) -> Result<Self, String> {
        let what = format!(
            "repair policy {}={}",
            raw.condition_type, raw.condition_status
        );
        let toleration = match (raw.toleration, raw.toleration_duration) {
            (Some(_), Some(_)) => {
                return Err(format!(
                "{what}: set either `toleration` or `tolerationDuration` (nanoseconds), not both"
            ))
            }
            (None, None) => {
                return Err(format!(
                "{what}: missing `toleration` (e.g. \"10m\") or `tolerationDuration` (nanoseconds)"
            ))
            }
            (Some(t), None) => humantime::parse_duration(&t)
                .map_err(|e| format!("{what}: toleration `{t}` is not a duration: {e}"))?,
            (None, Some(ns)) => Duration::from_nanos(ns),
        };
        Ok(RepairPolicy {
            condition_type: raw.condition_type,
            condition_status: raw.condition_status,
            toleration,
        })
    }
}

impl From<RepairPolicy> for RawPolicy {
    fn from(p: RepairPolicy) -> Self {
        RawPolicy {
            condition_type: p.condition_type,
            condition_status: p.condition_status,
            toleration: Some(humantime::format_duration(p.toleration).to_string()),
            toleration_duration: None,
        }
    }
}

/// Parses KPO's `--repair-policies` / Helm `settings.repairPolicies` JSON as-is, e.g.
/// `[{"conditionType":"Ready","conditionStatus":"False","tolerationDuration":600000000000}]`.
pub fn parse_kpo_repair_policies(json: &str) -> Result<Vec<RepairPolicy>, serde_json::Error> {
    serde_json::from_str(json)
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

/// `[budgets]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetsConfig {
    /// The node label whose value names a node's group (nodes without it form group `""`).
    /// Budgets and the repair short-circuit are evaluated per group.
    pub group_by: String,
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

/// Effect of the interruption taint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum TaintEffect {
    /// `NoSchedule`
    NoSchedule,
    /// `PreferNoSchedule`
    PreferNoSchedule,
    /// `NoExecute`: parsed so that `validate` can refuse it with the reason (the taint-eviction
    /// controller would delete every pod not tolerating it at once, bypassing the tiered,
    /// PDB-respecting drain).
    NoExecute,
}

impl TaintEffect {
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }
}

/// What nodekeeper does on a notice of one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InterruptionAction {
    /// Nothing.
    Ignore,
    /// An Event only.
    Event,
    /// Cordon (recorded, undone on cancellation).
    Cordon,
    /// Taint + cordon + LB exclusion + drain before the deadline.
    Drain,
    /// As `drain`, and request the replacement immediately.
    DrainReplace,
}

/// `[interruption.actions]`: the action per notice kind.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct InterruptionActions {
    /// Spot/preemptible reclaim.
    pub preemption: InterruptionAction,
    /// Platform termination / stop.
    pub termination: InterruptionAction,
    /// The OS is shutting down.
    pub shutting_down: InterruptionAction,
    /// Host maintenance.
    pub maintenance: InterruptionAction,
    /// Scheduled reboot.
    pub reboot: InterruptionAction,
    /// Move to another host.
    pub redeploy: InterruptionAction,
    /// A pause of a few seconds.
    pub freeze: InterruptionAction,
    /// Rebalance recommendation (cordon only by default).
    pub rebalance: InterruptionAction,
}

impl Default for InterruptionActions {
    fn default() -> Self {
        use InterruptionAction::*;
        Self {
            preemption: DrainReplace,
            termination: DrainReplace,
            shutting_down: DrainReplace,
            maintenance: Drain,
            reboot: Drain,
            redeploy: Drain,
            freeze: Event,
            rebalance: Cordon,
        }
    }
}

/// `[interruption]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct InterruptionConfig {
    /// The taint put on an interrupted node (value: the notice kind).
    pub taint_key: String,
    /// Its effect.
    pub taint_effect: TaintEffect,
    /// Label (value `nodekeeper`) that takes the node out of external load balancers; empty: none.
    pub lb_exclude_label: String,
    /// Drains must finish this long before the announced time.
    #[serde(with = "humantime_serde")]
    pub safety_margin: Duration,
    /// Announced time assumed for a notice without one: detection time + this.
    #[serde(with = "humantime_serde")]
    pub default_lead: Duration,
    /// A node still present and healthy this long after the announced time is released
    /// (untainted, and uncordoned if nodekeeper cordoned it).
    #[serde(with = "humantime_serde")]
    pub release_after: Duration,
    /// Action per notice kind.
    pub actions: InterruptionActions,
}

impl Default for InterruptionConfig {
    fn default() -> Self {
        Self {
            taint_key: "nodekeeper.io/interruption".to_string(),
            taint_effect: TaintEffect::NoSchedule,
            lb_exclude_label: "node.kubernetes.io/exclude-from-external-load-balancers".to_string(),
            safety_margin: Duration::from_secs(15),
            default_lead: Duration::from_secs(120),
            release_after: Duration::from_secs(15 * 60),
            actions: InterruptionActions::default(),
        }
    }
}

impl PolicyConfig {
    /// Semantic checks; each finding names its key path.
    pub fn validate(&self) -> Vec<Diagnostic> {
        let mut d = validate_repair(&self.repair);
        d.extend(validate_budgets(&self.budgets));
        d.extend(validate_interruption(&self.interruption));
        d
    }
}

fn validate_repair(r: &RepairConfig) -> Vec<Diagnostic> {
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

fn validate_budgets(b: &BudgetsConfig) -> Vec<Diagnostic> {
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

fn validate_interruption(c: &InterruptionConfig) -> Vec<Diagnostic> {
    let mut d = Vec::new();
    if c.taint_key.trim().is_empty() {
        d.push(Diagnostic::error(
            cfg_path!["interruption", "taint_key"],
            "must not be empty",
        ));
    } else {
        d.extend(k8s_value_error(
            cfg_path!["interruption", "taint_key"],
            "taint key",
            &c.taint_key,
            k8s::qualified_name(&c.taint_key),
        ));
    }
    if c.taint_effect == TaintEffect::NoExecute {
        d.push(Diagnostic::error(
            cfg_path!["interruption", "taint_effect"],
            "NoExecute is not allowed: the taint-eviction controller deletes every pod that does not \
             tolerate a NoExecute taint at once (or when its tolerationSeconds run out; plain deletes, no Eviction API), so PodDisruptionBudgets, \
             tiers and do-not-disrupt would be bypassed before nodekeeper's drain starts; use NoSchedule \
             (the default) or PreferNoSchedule",
        ));
    }
    if !c.lb_exclude_label.is_empty() {
        d.extend(k8s_value_error(
            cfg_path!["interruption", "lb_exclude_label"],
            "label key",
            &c.lb_exclude_label,
            k8s::qualified_name(&c.lb_exclude_label),
        ));
    }
    if c.default_lead <= c.safety_margin {
        d.push(Diagnostic::warning(
            cfg_path!["interruption", "default_lead"],
            "not longer than safety_margin: notices without a time get a drain deadline of now",
        ));
    }
    d
}

//! `[repair]`: policies, escalation steps, per-group overrides, and their validation.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::kpo::RawPolicy;
use super::Quantity;
use crate::cfg_path;
use crate::config::{k8s_value_error, Diagnostic, PathSeg};
use crate::k8s::validation as k8s;

/// One escalation step of a repair, in the order a ladder escalates (`restart-unit` first,
/// `none` last).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RepairStep {
    /// Ask the node's agent to restart one systemd unit (a policy's step: it names the unit);
    /// done when the condition clears within the step's timeout.
    #[serde(rename = "restart-unit")]
    RestartUnit,
    /// Cordon and drain gracefully (bounded by `drain_timeout`).
    Drain,
    /// Ask the node's agent to reboot through systemd; done when the boot id changes.
    Reboot,
    /// Ask the replacement provider for a new node (the old one is removed by it).
    Replace,
    /// Take no action: hold the node and say why (an operator decides).
    None,
}

impl RepairStep {
    /// Stable lower-case name, as written in the `nodekeeper.io/repair-step` annotation (a
    /// `restart-unit` step adds `:UNIT` there).
    pub fn name(self) -> &'static str {
        match self {
            RepairStep::RestartUnit => "restart-unit",
            RepairStep::Drain => "drain",
            RepairStep::Reboot => "reboot",
            RepairStep::Replace => "replace",
            RepairStep::None => "none",
        }
    }
    /// Parses [`RepairStep::name`].
    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "restart-unit" => Some(RepairStep::RestartUnit),
            "drain" => Some(RepairStep::Drain),
            "reboot" => Some(RepairStep::Reboot),
            "replace" => Some(RepairStep::Replace),
            "none" => Some(RepairStep::None),
            _ => None,
        }
    }
    /// Reboot and replace: taken only for a condition nodekeeper can see clear, unless its
    /// policy opts in (`allow_destructive`).
    pub fn destructive(self) -> bool {
        matches!(self, RepairStep::Reboot | RepairStep::Replace)
    }
}

/// One step of a policy's own ladder (`[[repair.policy]] steps`): written `"reboot"`,
/// `"restart-unit:kubelet.service"`, or as a table `{ step = "restart-unit", unit =
/// "kubelet.service", timeout = "3m" }`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "RawStep", into = "RawStep")]
pub struct LadderStep {
    /// The step.
    pub step: RepairStep,
    /// The systemd unit of a `restart-unit` step.
    pub unit: Option<String>,
    /// How long the step may take before the next one starts (default: the `[repair]`
    /// timeout of its kind: `restart_timeout`, `drain_timeout`, `reboot_timeout`).
    pub timeout: Option<Duration>,
}

impl LadderStep {
    /// A step of `kind` with the `[repair]` defaults (no unit).
    pub fn of(step: RepairStep) -> Self {
        LadderStep {
            step,
            unit: None,
            timeout: None,
        }
    }
    /// `restart-unit` of `unit`.
    pub fn restart(unit: &str) -> Self {
        LadderStep {
            step: RepairStep::RestartUnit,
            unit: Some(unit.to_string()),
            timeout: None,
        }
    }
    /// Its value in the `nodekeeper.io/repair-step` annotation: the name, with `:UNIT` for a
    /// `restart-unit` step.
    pub fn label(&self) -> String {
        match &self.unit {
            Some(u) => format!("{}:{u}", self.step.name()),
            None => self.step.name().to_string(),
        }
    }
    /// Parses [`LadderStep::label`] (the timeout is not recorded).
    pub fn from_label(s: &str) -> Option<Self> {
        let (name, unit) = match s.split_once(':') {
            Some((n, u)) => (n, Some(u.to_string())),
            None => (s, None),
        };
        let step = RepairStep::from_name(name)?;
        (unit.is_some() == (step == RepairStep::RestartUnit)).then_some(LadderStep {
            step,
            unit,
            timeout: None,
        })
    }
    /// Whether this is the step `other` names (kind and unit; the timeout aside).
    pub fn same(&self, other: &LadderStep) -> bool {
        self.step == other.step && self.unit == other.unit
    }
}

/// The written forms of a [`LadderStep`].
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
enum RawStep {
    Name(String),
    Table {
        step: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        unit: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout: Option<String>,
    },
}

impl TryFrom<RawStep> for LadderStep {
    type Error = String;
    fn try_from(raw: RawStep) -> Result<Self, String> {
        let (name, unit, timeout) = match raw {
            RawStep::Name(s) => match s.split_once(':') {
                Some((n, u)) => (n.to_string(), Some(u.to_string()), None),
                None => (s, None, None),
            },
            RawStep::Table {
                step,
                unit,
                timeout,
            } => (step, unit, timeout),
        };
        let step = RepairStep::from_name(&name).ok_or_else(|| {
            format!("`{name}` is not a repair step (restart-unit, drain, reboot, replace, none)")
        })?;
        match (step, &unit) {
            (RepairStep::RestartUnit, None) => {
                return Err(
                    "restart-unit needs its unit: \"restart-unit:kubelet.service\" or { step = \"restart-unit\", unit = \"kubelet.service\" }"
                        .into(),
                )
            }
            (RepairStep::RestartUnit, Some(u)) if !crate::wire::valid_unit(u) => {
                return Err(format!(
                    "`{u}` is not a systemd service name (letters, digits, `:-_.@\\`, ending in `.service`)"
                ))
            }
            (RepairStep::RestartUnit, Some(_)) | (_, None) => {}
            (_, Some(_)) => return Err(format!("only restart-unit takes a unit, not {name}")),
        }
        let timeout = timeout
            .map(|t| {
                humantime::parse_duration(&t)
                    .map_err(|e| format!("step {name}: timeout `{t}` is not a duration: {e}"))
            })
            .transpose()?;
        Ok(LadderStep {
            step,
            unit,
            timeout,
        })
    }
}

impl From<LadderStep> for RawStep {
    fn from(s: LadderStep) -> Self {
        match s.timeout {
            None => RawStep::Name(s.label()),
            Some(t) => RawStep::Table {
                step: s.step.name().to_string(),
                unit: s.unit,
                timeout: Some(humantime::format_duration(t).to_string()),
            },
        }
    }
}

/// A policy's `reason`: a regular expression matched against the whole of the condition's
/// reason (anchored: `Kubelet.*` matches `KubeletNotReady`, not `NotKubelet`).
#[derive(Debug, Clone)]
pub struct ReasonPattern {
    source: String,
    regex: regex::Regex,
}

impl ReasonPattern {
    /// Compiles `source`, anchored at both ends.
    pub fn new(source: &str) -> Result<Self, regex::Error> {
        let regex = regex::RegexBuilder::new(&format!("^(?:{source})$"))
            .size_limit(1 << 20)
            .build()?;
        Ok(ReasonPattern {
            source: source.to_string(),
            regex,
        })
    }
    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }
    /// Whether the whole of `reason` matches.
    pub fn matches(&self, reason: &str) -> bool {
        self.regex.is_match(reason)
    }
}

impl PartialEq for ReasonPattern {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}
impl Eq for ReasonPattern {}

/// The condition types nodekeeper can see clear: the kubelet's own (`Ready`, `MemoryPressure`,
/// `DiskPressure`, `PIDPressure`: the node-lifecycle controller sets them Unknown when the
/// kubelet's Lease heartbeat stops) and its agent's (`Nodekeeper*`: the controller sets them
/// Unknown when the agent stops reporting). Only these take destructive steps (reboot, replace)
/// by default; they also keep their status whatever their `lastHeartbeatTime` (their writers'
/// heartbeats are watched already).
pub fn seen_clear(condition_type: &str) -> bool {
    matches!(
        condition_type,
        "Ready" | "MemoryPressure" | "DiskPressure" | "PIDPressure"
    ) || condition_type.starts_with(crate::wire::OWNED_PREFIX)
}

/// `[[repair.policy]]`: a node whose condition `condition_type` has had status
/// `condition_status` (and, when `reason` is set, a reason it matches) for `toleration` is
/// repaired, by the policy's own `steps` or else `[repair] steps`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "RawPolicy", into = "RawPolicy")]
pub struct RepairPolicy {
    /// Node condition type, e.g. `Ready`.
    pub condition_type: String,
    /// Status that counts as unhealthy: `True`, `False` or `Unknown`.
    pub condition_status: String,
    /// How long the condition must hold before the repair starts.
    pub toleration: Duration,
    /// The condition's reason must match this (anchored) regular expression; `None`: any.
    pub reason: Option<ReasonPattern>,
    /// The policy's own ladder; `None`: `[repair] steps`.
    pub steps: Option<Vec<LadderStep>>,
    /// Take reboot and replace for a condition nodekeeper cannot see clear ([`seen_clear`]).
    pub allow_destructive: bool,
}

impl RepairPolicy {
    /// Whether `c` (status and reason) is what this policy repairs.
    pub fn matches(&self, status: &str, reason: &str) -> bool {
        status == self.condition_status && self.reason.as_ref().is_none_or(|r| r.matches(reason))
    }
    /// Whether the policy may take a destructive step (reboot, replace).
    pub fn trusted(&self) -> bool {
        self.allow_destructive || seen_clear(&self.condition_type)
    }
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
    /// Escalation steps, in order (a subsequence of `drain`, `reboot`, `replace`, `none`), for
    /// every policy without steps of its own.
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
    /// How long a `restart-unit` step may take (the condition clear) before escalating.
    #[serde(with = "humantime_serde")]
    pub restart_timeout: Duration,
    /// A condition of another component (not [`seen_clear`]) whose `lastHeartbeatTime` is older
    /// than this counts as Unknown, not as the fault it last said.
    #[serde(with = "humantime_serde")]
    pub heartbeat_timeout: Duration,
    /// After this long a requested replacement whose node still exists is shown as blocked.
    #[serde(with = "humantime_serde")]
    pub replace_timeout: Duration,
    /// A node never Ready this long after creation is replaced (`0s` disables; default 10 min,
    /// as Cluster API's `nodeStartupTimeout`).
    #[serde(with = "humantime_serde")]
    pub startup_timeout: Duration,
    /// How many times a node that fails to start is replaced before it is held.
    pub max_startup_retries: u32,
    /// A `drain` step followed by `replace` asks for the replacement when the drain starts, so
    /// the drained pods land on capacity already launching (as Karpenter v1.15's repair
    /// pre-spins). Only with a provider whose request only adds capacity (`karpenter`); a repair
    /// that ends without its `replace` (the condition cleared, a veto) abandons the replacement.
    pub prespin: bool,
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
            restart_timeout: Duration::from_secs(5 * 60),
            heartbeat_timeout: Duration::from_secs(10 * 60),
            replace_timeout: Duration::from_secs(30 * 60),
            startup_timeout: Duration::from_secs(10 * 60),
            max_startup_retries: 3,
            prespin: true,
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
    /// `[repair] heartbeat_timeout`.
    pub heartbeat_timeout: Duration,
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
            heartbeat_timeout: self.heartbeat_timeout,
        }
    }
}

pub(super) fn validate_repair(r: &RepairConfig) -> Vec<Diagnostic> {
    let mut d = validate_policies(&r.policy, &r.steps, cfg_path!["repair", "policy"]);
    d.extend(validate_policies(
        &r.repair_policies,
        &r.steps,
        cfg_path!["repair", "repairPolicies"],
    ));
    d.extend(validate_steps(&r.steps, cfg_path!["repair", "steps"]));
    if r.enabled && r.steps.is_empty() {
        d.push(Diagnostic::error(
            cfg_path!["repair", "steps"],
            "at least one step (drain, reboot, replace, none) is needed while repair is enabled",
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
        ("restart_timeout", r.restart_timeout),
        ("heartbeat_timeout", r.heartbeat_timeout),
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
        let steps = g.steps.as_deref().unwrap_or(&r.steps);
        d.extend(k8s_value_error(
            cfg_path!["repair", "groups", name.as_str()],
            "group name (a value of the budgets.group_by label)",
            name,
            k8s::label_value(name),
        ));
        if let Some(p) = &g.policy {
            d.extend(validate_policies(
                p,
                steps,
                cfg_path!["repair", "groups", name.as_str(), "policy"],
            ));
        }
        if let Some(p) = &g.repair_policies {
            d.extend(validate_policies(
                p,
                steps,
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

fn validate_policies(
    policies: &[RepairPolicy],
    global: &[RepairStep],
    path: Vec<PathSeg>,
) -> Vec<Diagnostic> {
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
            q.condition_type == p.condition_type
                && q.condition_status == p.condition_status
                && q.reason == p.reason
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
        if let Some(steps) = &p.steps {
            d.extend(validate_ladder(steps, at("steps")));
        }
        let destructive = match &p.steps {
            Some(s) => s.iter().find(|s| s.step.destructive()).map(|s| s.step),
            None => global.iter().copied().find(|s| s.destructive()),
        };
        if let (Some(step), false) = (destructive, p.trusted()) {
            d.push(Diagnostic::warning(
                at("condition_type"),
                format!(
                    "{} is written by another component, so nodekeeper cannot see it clear: the ladder holds before {} (set allow_destructive = true to trust it)",
                    p.condition_type,
                    step.name()
                ),
            ));
        }
    }
    d
}

fn validate_steps(steps: &[RepairStep], path: Vec<PathSeg>) -> Vec<Diagnostic> {
    if steps.contains(&RepairStep::RestartUnit) {
        return vec![Diagnostic::error(
            path,
            "restart-unit names its unit, so it goes in a [[repair.policy]]'s own steps (\"restart-unit:kubelet.service\")",
        )];
    }
    let ordered = steps.windows(2).all(|w| w[0] < w[1]);
    if ordered {
        return Vec::new();
    }
    vec![Diagnostic::error(
        path,
        "steps escalate in the order drain, reboot, replace, none, each at most once",
    )]
}

/// A policy's own ladder: escalating (restart-unit, drain, reboot, replace, none), each once but
/// `restart-unit` (once per unit), and not empty.
fn validate_ladder(steps: &[LadderStep], path: Vec<PathSeg>) -> Vec<Diagnostic> {
    if steps.is_empty() {
        return vec![Diagnostic::error(
            path,
            "a policy's steps cannot be empty (leave `steps` out to use [repair] steps; `none` takes no action)",
        )];
    }
    let ordered = steps.windows(2).all(|w| {
        w[0].step < w[1].step || (w[0].step == RepairStep::RestartUnit && w[1].step == w[0].step)
    });
    let repeated = steps
        .iter()
        .enumerate()
        .any(|(i, s)| steps[..i].iter().any(|t| t.same(s)));
    if ordered && !repeated {
        return Vec::new();
    }
    vec![Diagnostic::error(
        path,
        "steps escalate in the order restart-unit, drain, reboot, replace, none; each at most once (restart-unit once per unit)",
    )]
}

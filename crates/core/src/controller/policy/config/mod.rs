//! Policy configuration: `[repair]` (with `[[repair.policy]]` and per-group overrides),
//! `[budgets]` (per-group disruption budgets with cron windows in IANA time zones),
//! `[interruption]` and `[controller] dry_run`.
//!
//! Repair policies are accepted in nodekeeper's form (`condition_type`, `condition_status`,
//! `toleration = "10m"`) and in Karpenter/KPO's form as-is (`conditionType`, `conditionStatus`,
//! `tolerationDuration = 600000000000`, in nanoseconds), also as KPO's Helm/JSON
//! `repairPolicies` list ([`parse_kpo_repair_policies`]).
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::config::Diagnostic;

mod budgets;
mod interruption;
mod kpo;
mod repair;

use budgets::validate_budgets;
use interruption::validate_interruption;
use repair::validate_repair;

pub use budgets::{Budget, BudgetsConfig, BudgetsSource};
pub use interruption::{InterruptionAction, InterruptionActions, InterruptionConfig, TaintEffect};
pub use kpo::parse_kpo_repair_policies;
pub use repair::{
    seen_clear, EffectiveRepair, LadderStep, ReasonPattern, RepairConfig, RepairGroup,
    RepairPolicy, RepairStep,
};

/// All policy sections. In the config file they are top-level sections (`[repair]`, `[budgets]`,
/// `[interruption]`, `[controller]`); [`PolicyConfig::from_sections`] bundles them for
/// [`super::decide`]. (They are separate fields of the file, not one `#[serde(flatten)]` field:
/// flattening loses the FILE:LINE:COL of every unknown top-level key and of type errors inside
/// these sections.)
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
    /// The policy from its sections of the configuration file.
    pub fn from_sections(
        repair: &RepairConfig,
        budgets: &BudgetsConfig,
        interruption: &InterruptionConfig,
        controller: &ControllerPolicyConfig,
    ) -> Self {
        PolicyConfig {
            repair: repair.clone(),
            budgets: budgets.clone(),
            interruption: interruption.clone(),
            controller: controller.clone(),
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
    /// The provider's replacement request only adds capacity, the old node staying until it is
    /// retired (`karpenter`): a replacement may be asked for before the drain
    /// ([`RepairConfig::prespin`]). Derived from
    /// `[controller.provider]`, not a key of its own.
    #[serde(skip)]
    pub provider_adds_capacity: bool,
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

impl PolicyConfig {
    /// Semantic checks; each finding names its key path.
    pub fn validate(&self) -> Vec<Diagnostic> {
        let mut d = validate_repair(&self.repair);
        d.extend(validate_budgets(&self.budgets));
        d.extend(validate_interruption(&self.interruption));
        d
    }
}

//! Karpenter/KPO compatibility: repair policies in their wire form (`conditionType`,
//! `conditionStatus`, `tolerationDuration` in nanoseconds), as-is.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::repair::{LadderStep, ReasonPattern};
use super::RepairPolicy;

/// Wire form of a policy: nodekeeper's keys or Karpenter/KPO's, as-is.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPolicy {
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
    /// nodekeeper's: a regular expression the condition's reason must match (anchored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    /// nodekeeper's: the policy's own ladder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    steps: Option<Vec<LadderStep>>,
    /// nodekeeper's: reboot and replace for a condition nodekeeper cannot see clear.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    allow_destructive: bool,
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
        let reason = raw
            .reason
            .map(|r| {
                ReasonPattern::new(&r)
                    .map_err(|e| format!("{what}: reason `{r}` is not a regular expression: {e}"))
            })
            .transpose()?;
        Ok(RepairPolicy {
            condition_type: raw.condition_type,
            condition_status: raw.condition_status,
            toleration,
            reason,
            steps: raw.steps,
            allow_destructive: raw.allow_destructive,
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
            reason: p.reason.map(|r| r.as_str().to_string()),
            steps: p.steps,
            allow_destructive: p.allow_destructive,
        }
    }
}

/// Parses KPO's `--repair-policies` / Helm `settings.repairPolicies` JSON as-is, e.g.
/// `[{"conditionType":"Ready","conditionStatus":"False","tolerationDuration":600000000000}]`.
pub fn parse_kpo_repair_policies(json: &str) -> Result<Vec<RepairPolicy>, serde_json::Error> {
    serde_json::from_str(json)
}

//! `[interruption]`: the taint, the action per notice kind, and their validation.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cfg_path;
use crate::config::{k8s_value_error, Diagnostic};
use crate::k8s::validation as k8s;

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

pub(super) fn validate_interruption(c: &InterruptionConfig) -> Vec<Diagnostic> {
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

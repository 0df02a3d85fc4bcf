//! What a health check reports: node conditions ([`CheckResult`]) and temporary events
//! ([`CheckEvent`]). The catalog of condition types and reasons is `docs/checks.md`.

use std::fmt;

use serde::Serialize;

/// The prefix of the condition types the controller writes by default (`[controller]
/// condition_prefix`): it writes only its own types, so that it never fights another writer
/// (the Node Problem Detector's `KernelDeadlock`, ...).
pub const OWNED_PREFIX: &str = "Nodekeeper";

/// The status of a node condition, as Kubernetes spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
pub enum ConditionStatus {
    /// The problem the condition names is present (e.g. memory is low).
    True,
    /// The problem is absent.
    False,
    /// The check could not tell (missing path, unreadable file, ...).
    Unknown,
}

impl fmt::Display for ConditionStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        })
    }
}

/// One node condition as a check sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct CheckResult {
    /// Condition type, e.g. `NodekeeperMemoryPressure` (see `docs/checks.md`).
    pub condition_type: String,
    /// True, False or Unknown.
    pub status: ConditionStatus,
    /// A CamelCase reason from the catalog, e.g. `MemoryAvailableLow`.
    pub reason: String,
    /// A human-readable explanation with the figures behind it.
    pub message: String,
}

impl CheckResult {
    /// A result with the given fields.
    pub fn new(
        condition_type: impl Into<String>,
        status: ConditionStatus,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            condition_type: condition_type.into(),
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// Kubernetes event type of a [`CheckEvent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, Default)]
pub enum EventSeverity {
    /// Informational.
    Normal,
    /// Something went wrong on the node.
    #[default]
    Warning,
}

/// A temporary problem (NPD's "temporary" rules): reported once, never a condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct CheckEvent {
    /// CamelCase reason, e.g. `OOMKilling`.
    pub reason: String,
    /// What happened (for kernel-log rules: the kernel line).
    pub message: String,
    /// Normal or Warning.
    pub severity: EventSeverity,
}

//! The drain engine: cordon a node, then evict its pods through the Eviction API in four tiers
//! (non-critical → non-critical DaemonSet → critical → critical DaemonSet), within a deadline, naming
//! what blocks it (the pod **and** the PodDisruptionBudget). See docs/drain.md.
//!
//! Layout: [`select`] (pure pod classification and tiering), [`exec`] (the executor over kube-rs),
//! [`blocker`] (who refused an eviction), [`tasks`] (the controller's one drain task per node).
//! The `nodekeeper drain` command is the binary's `cli::drain`.

pub mod blocker;
pub mod exec;
pub mod lifecycle;
pub mod select;
pub mod tasks;

use std::time::Duration;

use serde::Serialize;

pub use exec::{client, drain, DrainOptions};

/// Taint key nodekeeper puts on interrupted nodes; pods tolerating it are not drained.
pub const INTERRUPTION_TAINT: &str = "nodekeeper.io/interruption";
/// Pod annotation (Karpenter's) that forbids voluntary eviction.
pub const KARPENTER_DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
/// Pod annotation (nodekeeper's) that forbids voluntary eviction.
pub const DO_NOT_DISRUPT: &str = "nodekeeper.io/do-not-disrupt";

/// Eviction tier, in drain order: a tier starts only when every pod of the previous ones is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tier {
    /// Ordinary workload pods.
    NonCritical,
    /// DaemonSet pods without a critical priority class.
    NonCriticalDaemonSet,
    /// `system-cluster-critical` / `system-node-critical` pods not owned by a DaemonSet.
    Critical,
    /// Critical DaemonSet pods.
    CriticalDaemonSet,
}

impl Tier {
    /// All tiers in drain order.
    pub const ALL: [Tier; 4] = [
        Tier::NonCritical,
        Tier::NonCriticalDaemonSet,
        Tier::Critical,
        Tier::CriticalDaemonSet,
    ];

    /// Position in drain order (0..4).
    pub fn index(self) -> usize {
        self as usize
    }

    /// Stable name used in text and JSON output.
    pub fn name(self) -> &'static str {
        match self {
            Tier::NonCritical => "non-critical",
            Tier::NonCriticalDaemonSet => "non-critical-daemonset",
            Tier::Critical => "critical",
            Tier::CriticalDaemonSet => "critical-daemonset",
        }
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a pod is still on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BlockReason {
    /// The eviction was refused (429) by a PodDisruptionBudget.
    PodDisruptionBudget,
    /// The pod is covered by more than one PDB (500 from the Eviction API).
    MultiplePodDisruptionBudgets,
    /// The pod carries a do-not-disrupt annotation.
    DoNotDisrupt,
    /// The pod is terminating and not gone yet.
    Terminating,
    /// The API server throttled the eviction (429 without a PDB).
    Throttled,
    /// Another API error; retried.
    ApiError,
    /// A VolumeAttachment of the node has not been detached yet.
    VolumeAttachment,
    /// The pod's namespace is being deleted: evictions are refused (403 `NamespaceTerminating`)
    /// until the namespace controller deletes the pod; waited for, like kubectl drain does.
    NamespaceTerminating,
}

impl BlockReason {
    /// Stable name used in text and JSON output.
    pub fn name(self) -> &'static str {
        match self {
            BlockReason::PodDisruptionBudget => "pod-disruption-budget",
            BlockReason::MultiplePodDisruptionBudgets => "multiple-pod-disruption-budgets",
            BlockReason::DoNotDisrupt => "do-not-disrupt",
            BlockReason::Terminating => "terminating",
            BlockReason::Throttled => "throttled",
            BlockReason::ApiError => "api-error",
            BlockReason::VolumeAttachment => "volume-attachment",
            BlockReason::NamespaceTerminating => "namespace-terminating",
        }
    }

    /// Whether a policy (PDB or annotation) holds the pod, as opposed to slowness or errors.
    pub fn is_policy(self) -> bool {
        matches!(
            self,
            BlockReason::PodDisruptionBudget
                | BlockReason::MultiplePodDisruptionBudgets
                | BlockReason::DoNotDisrupt
        )
    }
}

/// What currently keeps the drain from finishing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Blocker {
    /// `namespace/name` of the pod (or the VolumeAttachment's name for volume waits).
    pub pod: String,
    /// `namespace/name` of the PDB(s) refusing the eviction, comma-separated when several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pdb: Option<String>,
    /// Category.
    pub reason: BlockReason,
    /// The API server's message or a short explanation.
    pub message: String,
}

impl std::fmt::Display for Blocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.pdb, self.reason) {
            (Some(pdb), _) => write!(
                f,
                "pod {} blocked by PodDisruptionBudget {pdb}: {}",
                self.pod, self.message
            ),
            (None, BlockReason::VolumeAttachment) => {
                write!(f, "VolumeAttachment {}: {}", self.pod, self.message)
            }
            (None, r) => write!(f, "pod {} ({}): {}", self.pod, r.name(), self.message),
        }
    }
}

/// What to do when the deadline passes with pods left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnTimeout {
    /// Stop and report the blocker (the node stays cordoned).
    #[default]
    Fail,
    /// Delete the remaining pods (bypassing PDBs), each with its own grace period clamped to the time left.
    ForceDelete,
}

impl OnTimeout {
    /// Every value, in the order the command line lists them.
    pub const ALL: [OnTimeout; 2] = [OnTimeout::Fail, OnTimeout::ForceDelete];

    /// The spelling on the command line.
    pub fn name(self) -> &'static str {
        match self {
            OnTimeout::Fail => "fail",
            OnTimeout::ForceDelete => "force-delete",
        }
    }
}

impl std::fmt::Display for OnTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for OnTimeout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        OnTimeout::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| {
                format!("unknown on-timeout action `{s}` (expected fail or force-delete)")
            })
    }
}

/// Where the drain is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Marking the node unschedulable.
    Cordoning,
    /// Evicting (or waiting for) the pods of a tier.
    Evicting,
    /// Deadline passed: deleting pods regardless of PDBs.
    ForceDeleting,
    /// Waiting for the node's VolumeAttachments to go.
    WaitingVolumes,
    /// Finished.
    Done,
}

/// One progress report, sent whenever the tier, the counts, the phase or the blocker change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DrainProgress {
    /// Node being drained.
    pub node: String,
    /// Current phase.
    pub phase: Phase,
    /// Tier being evicted (none before the first list and once all pods are gone).
    pub tier: Option<Tier>,
    /// Pods still to go, all tiers.
    pub remaining: usize,
    /// Pods still to go in the current tier.
    pub remaining_in_tier: usize,
    /// Evictions accepted so far.
    pub evicted: usize,
    /// Pods force-deleted so far.
    pub force_deleted: usize,
    /// What holds the drain right now, if anything.
    pub blocker: Option<Blocker>,
    /// Time since the drain started, in milliseconds.
    pub elapsed_ms: u64,
}

impl DrainProgress {
    /// Same content ignoring the clock.
    fn same_as(&self, other: &DrainProgress) -> bool {
        DrainProgress {
            elapsed_ms: 0,
            ..self.clone()
        } == DrainProgress {
            elapsed_ms: 0,
            ..other.clone()
        }
    }
}

/// One pod the drain evicted or deleted (in the order the API server accepted it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Removal {
    /// `namespace/name`.
    pub pod: String,
    /// Its tier.
    pub tier: Tier,
    /// `true` if deleted after the deadline rather than evicted.
    pub forced: bool,
    /// Milliseconds since the drain started.
    pub at_ms: u64,
}

/// A pod the drain leaves alone, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// `namespace/name`.
    pub pod: String,
    /// Why.
    pub reason: select::SkipReason,
}

/// A pod a dry run would evict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Planned {
    /// `namespace/name`.
    pub pod: String,
    /// Its tier.
    pub tier: Tier,
    /// `true` when a do-not-disrupt annotation would hold it.
    pub held: bool,
}

/// The result of a drain (or of a dry run).
#[derive(Debug, Clone, Default, Serialize)]
pub struct DrainReport {
    /// Node.
    pub node: String,
    /// `true` when this drain cordoned the node (it was schedulable before).
    pub cordoned_by_us: bool,
    /// Dry run: nothing was changed.
    pub dry_run: bool,
    /// Pods evicted or deleted, in order.
    pub removed: Vec<Removal>,
    /// Pods left alone.
    pub skipped: Vec<Skipped>,
    /// Dry run only: what would be evicted, in tier order.
    pub planned: Vec<Planned>,
    /// Wall time in milliseconds.
    pub elapsed_ms: u64,
}

/// Why a drain did not finish.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// The node does not exist.
    #[error("node {node} not found")]
    NodeNotFound {
        /// Node.
        node: String,
    },
    /// A Kubernetes API call failed in a way retrying will not fix.
    #[error("{action} for node {node}: {source}")]
    Api {
        /// Node.
        node: String,
        /// What was being done, e.g. `cordon` or `evict pod default/web-1`.
        action: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// An eviction (or deletion) was refused in a way retrying will not fix, e.g. 403 from RBAC or
    /// an admission webhook (a 403 for a namespace being deleted is waited for instead).
    #[error("eviction of pod {pod} on node {node} refused ({code}): {message}")]
    EvictionRefused {
        /// Node.
        node: String,
        /// `namespace/name` of the pod.
        pod: String,
        /// HTTP status code.
        code: u16,
        /// The API server's message.
        message: String,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },
    /// The deadline passed with pods (or volumes) left.
    #[error("drain of node {node} timed out after {waited:?} with {remaining} pod(s) left{}", blocker_suffix(.blocker))]
    TimedOut {
        /// Node.
        node: String,
        /// How long the drain ran.
        waited: Duration,
        /// Pods still on the node (0 when only volumes are left).
        remaining: usize,
        /// What held it last.
        blocker: Option<Box<Blocker>>,
        /// Partial report.
        report: Box<DrainReport>,
    },
    /// The caller cancelled the drain.
    #[error("drain of node {node} cancelled with {remaining} pod(s) left")]
    Cancelled {
        /// Node.
        node: String,
        /// Pods still on the node.
        remaining: usize,
        /// Partial report.
        report: Box<DrainReport>,
    },
}

fn blocker_suffix(b: &Option<Box<Blocker>>) -> String {
    b.as_ref().map(|b| format!(": {b}")).unwrap_or_default()
}

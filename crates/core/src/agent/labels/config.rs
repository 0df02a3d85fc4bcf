//! `[labels]`: rules that remove a label from this node once a condition holds, e.g. OKE's
//! `last-migration-failure` once the node's Cilium pod is Ready (replaces the ad-hoc
//! node-label-cleaner DaemonSet).

use serde::{Deserialize, Serialize};

use crate::cfg_path;
use crate::config::{k8s_value_error, Diagnostic};
use crate::k8s::validation as k8s;

/// `[labels]`
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LabelsConfig {
    /// Who removes the label: `report` (the default: the agent asks the controller, the only writer
    /// of Node objects) or `direct` (the agent patches its own node; for clusters without the
    /// controller, needs `patch nodes` RBAC fenced to the own node).
    pub mode: RemovalMode,
    /// The rules.
    pub cleanup: Vec<CleanupRule>,
}

/// Who carries out a removal.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RemovalMode {
    /// In the node report, for the controller.
    #[default]
    Report,
    /// A patch of the own node by the agent.
    Direct,
}

/// `[[labels.cleanup]]`: remove `label` once exactly one `when_*` condition holds.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CleanupRule {
    /// The label key to remove.
    pub label: String,
    /// A pod matching `selector` in `namespace`, on this node, is Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_pod_ready: Option<PodReady>,
    /// The node has condition `type` with `status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_condition: Option<NodeConditionIs>,
}

/// `when_pod_ready = { namespace = "kube-system", selector = "k8s-app=cilium" }`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PodReady {
    /// The pod's namespace.
    pub namespace: String,
    /// A label selector (`k=v`, `k!=v`, `k in (a,b)`, `k notin (a)`, `k`, `!k`; comma = and).
    pub selector: String,
}

/// `when_condition = { type = "NetworkUnavailable", status = "False" }`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NodeConditionIs {
    /// Condition type.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
}

impl LabelsConfig {
    /// Checks every rule; errors are located at the rule's key.
    pub fn validate(&self) -> Vec<Diagnostic> {
        let mut out = Vec::new();
        for (i, r) in self.cleanup.iter().enumerate() {
            out.extend(k8s_value_error(
                cfg_path!["labels", "cleanup", i, "label"],
                "label key",
                &r.label,
                k8s::qualified_name(&r.label),
            ));
            match (&r.when_pod_ready, &r.when_condition) {
                (Some(p), None) => {
                    if let Err(e) = crate::k8s::selectors::LabelSelector::parse(&p.selector) {
                        out.push(Diagnostic::error(
                            cfg_path!["labels", "cleanup", i, "when_pod_ready"],
                            e.to_string(),
                        ));
                    }
                    if p.namespace.is_empty() {
                        out.push(Diagnostic::error(
                            cfg_path!["labels", "cleanup", i, "when_pod_ready"],
                            "namespace must not be empty",
                        ));
                    } else {
                        out.extend(k8s_value_error(
                            cfg_path!["labels", "cleanup", i, "when_pod_ready", "namespace"],
                            "namespace name",
                            &p.namespace,
                            k8s::dns1123_label(&p.namespace),
                        ));
                    }
                }
                (None, Some(c)) => {
                    if !matches!(c.status.as_str(), "True" | "False" | "Unknown") {
                        out.push(Diagnostic::error(
                            cfg_path!["labels", "cleanup", i, "when_condition"],
                            format!("status must be True, False or Unknown, got `{}`", c.status),
                        ));
                    }
                }
                _ => out.push(Diagnostic::error(
                    cfg_path!["labels", "cleanup", i],
                    format!(
                        "rule for `{}` needs exactly one of `when_pod_ready` or `when_condition`",
                        r.label
                    ),
                )),
            }
        }
        out
    }
}

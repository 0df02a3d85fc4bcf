//! Who refused an eviction: the PDB named in a 429, or the PDBs whose selectors match the pod.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::Status;

use super::{BlockReason, Blocker};

/// The PDB name in an Eviction API 429 ("The disruption budget NAME needs ..."), from the causes or the message.
pub fn pdb_from_status(s: &Status) -> Option<String> {
    let causes = s.details.iter().flat_map(|d| d.causes.iter());
    causes
        .map(|c| c.message.as_str())
        .chain(std::iter::once(s.message.as_str()))
        .find_map(pdb_from_message)
}

fn pdb_from_message(msg: &str) -> Option<String> {
    let rest = msg.split("disruption budget ").nth(1)?;
    let name: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
        .collect();
    let name = name.trim_end_matches('.');
    (!name.is_empty()).then(|| name.to_string())
}

/// Whether a label selector matches `labels` (matchLabels and matchExpressions; an empty selector matches all).
pub fn selector_matches(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = sel.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        let have = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => have.is_some_and(|v| values.contains(v)),
            "NotIn" => have.is_none_or(|v| !values.contains(v)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            _ => false,
        }
    });
    labels_ok && exprs_ok
}

/// Names of the PDBs (same namespace) whose selector matches the pod; a PDB without selector matches nothing.
pub fn matching_pdbs(pod: &Pod, pdbs: &[PodDisruptionBudget]) -> Vec<String> {
    let empty = BTreeMap::new();
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    let ns = pod.metadata.namespace.as_deref();
    pdbs.iter()
        .filter(|p| p.metadata.namespace.as_deref() == ns)
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .is_some_and(|s| selector_matches(s, labels))
        })
        .filter_map(|p| p.metadata.name.clone())
        .collect()
}

/// The blocker for a refused eviction of `pod` (`pod_key` = `namespace/name`).
///
/// `pdbs` are the PDBs matching the pod (used when the message names none, and for 500 multi-PDB).
pub fn from_refusal(pod_key: &str, ns: &str, status: &Status, pdbs: &[String]) -> Blocker {
    let qualify = |n: &str| format!("{ns}/{n}");
    let (reason, pdb) = match status.code {
        429 => match pdb_from_status(status) {
            Some(n) => (BlockReason::PodDisruptionBudget, Some(qualify(&n))),
            None if !pdbs.is_empty() && status.message.contains("disruption budget") => (
                BlockReason::PodDisruptionBudget,
                Some(
                    pdbs.iter()
                        .map(|n| qualify(n))
                        .collect::<Vec<_>>()
                        .join(","),
                ),
            ),
            None => (BlockReason::Throttled, None),
        },
        500 if pdbs.len() > 1 || status.message.contains("more than one") => (
            BlockReason::MultiplePodDisruptionBudgets,
            (!pdbs.is_empty()).then(|| {
                pdbs.iter()
                    .map(|n| qualify(n))
                    .collect::<Vec<_>>()
                    .join(",")
            }),
        ),
        403 if super::exec::namespace_terminating(status) => {
            (BlockReason::NamespaceTerminating, None)
        }
        _ => (BlockReason::ApiError, None),
    };
    Blocker {
        pod: pod_key.to_string(),
        pdb,
        reason,
        message: cause_message(status).unwrap_or_else(|| short(&status.message)),
    }
}

/// The message of the first `DisruptionBudget` cause, which says what the budget needs.
fn cause_message(s: &Status) -> Option<String> {
    s.details
        .iter()
        .flat_map(|d| d.causes.iter())
        .find(|c| c.reason == "DisruptionBudget" && !c.message.is_empty())
        .map(|c| short(&c.message))
}

/// The message trimmed of the API server's boilerplate prefix.
fn short(msg: &str) -> String {
    let m = msg
        .strip_prefix("Cannot evict pod as it would violate the pod's disruption budget.")
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .unwrap_or(msg);
    m.chars().take(300).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn status(code: u16, msg: &str, cause: Option<&str>) -> Status {
        let mut v =
            json!({"status": "Failure", "code": code, "message": msg, "reason": "TooManyRequests"});
        if let Some(c) = cause {
            v["details"] = json!({"causes": [{"reason": "DisruptionBudget", "message": c}]});
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn names_the_pdb_from_cause_or_message() {
        let s = status(
            429,
            "Cannot evict pod as it would violate the pod's disruption budget.",
            Some("The disruption budget web-pdb needs 2 healthy pods and has 2 currently"),
        );
        let b = from_refusal("default/web-1", "default", &s, &[]);
        assert_eq!(b.pdb.as_deref(), Some("default/web-pdb"));
        assert_eq!(b.reason, BlockReason::PodDisruptionBudget);
        assert!(b.message.contains("needs 2 healthy"), "{}", b.message);
        let s = status(429, "Cannot evict pod as it would violate the pod's disruption budget. The disruption budget db.main needs 3 healthy pods.", None);
        assert_eq!(pdb_from_status(&s).as_deref(), Some("db.main"));
        // Message without a name: fall back to selector matches.
        let s = status(
            429,
            "Cannot evict pod as it would violate the pod's disruption budget.",
            None,
        );
        let b = from_refusal("ns1/a", "ns1", &s, &["x".into()]);
        assert_eq!(b.pdb.as_deref(), Some("ns1/x"));
        // A 429 from API throttling is not a PDB.
        let s = status(429, "too many requests, please try again later", None);
        let b = from_refusal("ns1/a", "ns1", &s, &["x".into()]);
        assert_eq!((b.reason, b.pdb), (BlockReason::Throttled, None));
        // 500 multi-PDB lists them.
        let s = status(500, "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.", None);
        let b = from_refusal("ns1/a", "ns1", &s, &["x".into(), "y".into()]);
        assert_eq!(b.reason, BlockReason::MultiplePodDisruptionBudgets);
        assert_eq!(b.pdb.as_deref(), Some("ns1/x,ns1/y"));
        let s = status(503, "unavailable", None);
        assert_eq!(
            from_refusal("a/b", "a", &s, &[]).reason,
            BlockReason::ApiError
        );
    }

    #[test]
    fn selectors() {
        let labels: BTreeMap<String, String> = [
            ("app".to_string(), "web".to_string()),
            ("tier".to_string(), "fe".to_string()),
        ]
        .into();
        let sel = |v: serde_json::Value| -> LabelSelector { serde_json::from_value(v).unwrap() };
        let cases = [
            (json!({}), true),
            (json!({"matchLabels": {"app": "web"}}), true),
            (json!({"matchLabels": {"app": "db"}}), false),
            (
                json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["fe", "be"]}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["fe"]}]}),
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "Exists"}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}),
                false,
            ),
            (
                json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "x", "operator": "Exists"}]}),
                false,
            ),
        ];
        for (s, want) in cases {
            assert_eq!(selector_matches(&sel(s.clone()), &labels), want, "{s}");
        }
    }
}

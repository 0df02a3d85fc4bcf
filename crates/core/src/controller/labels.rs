//! Label removal on the agent's request: only allow-listed keys, only on the reporting node
//! (the report's node was already checked against the caller's token).

use super::catalog::Reason;
use super::nodestate::NodeStates;
use crate::wire::LabelRemoval;

/// Splits requests into allowed label keys (present on the node) and denied ones.
pub fn partition(allow: &[String], requests: &[LabelRemoval]) -> (Vec<String>, Vec<String>) {
    let mut ok = Vec::new();
    let mut denied = Vec::new();
    for r in requests {
        let list = if allow.contains(&r.label) {
            &mut ok
        } else {
            &mut denied
        };
        if !list.contains(&r.label) {
            list.push(r.label.clone());
        }
    }
    (ok, denied)
}

/// Executes the allowed removals on `node` and records Events for both outcomes.
pub async fn remove_requested(states: &NodeStates, node: &str, requests: &[LabelRemoval]) {
    if requests.is_empty() {
        return;
    }
    let (ok, denied) = partition(&states.config().label_allow, requests);
    let present: Vec<String> = ok
        .into_iter()
        .filter(|l| states.node_has_label(node, l))
        .collect();
    for l in &denied {
        states
            .recorder()
            .node(
                node,
                Reason::LabelRemovalDenied,
                "RemoveLabel",
                &format!("label {l} is not in the controller's allow-list"),
            )
            .await;
    }
    if present.is_empty() {
        return;
    }
    match states.remove_labels(node, &present).await {
        Ok(()) => {
            states
                .counters
                .labels_removed
                .fetch_add(present.len() as u64, std::sync::atomic::Ordering::Relaxed);
            for r in requests.iter().filter(|r| present.contains(&r.label)) {
                states
                    .recorder()
                    .node(
                        node,
                        Reason::LabelRemoved,
                        "RemoveLabel",
                        &format!("removed label {}: {}", r.label, r.reason),
                    )
                    .await;
            }
        }
        Err(e) => {
            tracing::warn!(node, error = %e, "label removal failed; the agent will ask again")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_allow_listed_labels_pass() {
        let req = |l: &str| LabelRemoval {
            label: l.into(),
            reason: "r".into(),
        };
        let (ok, denied) = partition(
            &["last-migration-failure".into()],
            &[
                req("last-migration-failure"),
                req("node-role.kubernetes.io/control-plane"),
                req("last-migration-failure"),
            ],
        );
        assert_eq!(ok, vec!["last-migration-failure"]);
        assert_eq!(denied, vec!["node-role.kubernetes.io/control-plane"]);
    }
}

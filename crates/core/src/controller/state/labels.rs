//! Label removal on the agent's request: only allow-listed keys ([`partition`], pure), only on the
//! reporting node (the report's node was already checked against the caller's token); the removal
//! itself is [`NodeStates::remove_requested_labels`](super::nodestate::NodeStates::remove_requested_labels).

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

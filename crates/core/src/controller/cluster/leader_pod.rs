//! The leader's pod label: with `[controller.leader] pod_label = true`, each replica labels its
//! own pod `nodekeeper.io/leader=true` while it holds the Lease and `false` otherwise, so a Service
//! selecting that label (the shipped `nodekeeper-controller-events`) routes OCI Notifications
//! deliveries to the leader only.
//!
//! Why: a follower answers an OCI Events delivery 503 (only the leader stores notices), and OCI
//! Notifications retries once at once, then only after 1, 2, 4… minutes; behind a Service spreading
//! over two replicas, a quarter of the deliveries would lose more than a minute of a two-minute
//! preemption notice. A restarted container starts as `false` (its first patch), so a crashed
//! leader's pod does not keep the label.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The label the leader sets `true` on its pod (and every other replica `false`).
pub const LEADER_LABEL: &str = "nodekeeper.io/leader";

/// The merge patch that labels a pod as leading or not (pure).
pub fn label_patch(leading: bool) -> serde_json::Value {
    serde_json::json!({"metadata": {"labels": {LEADER_LABEL: if leading { "true" } else { "false" }}}})
}

/// Keeps `pod`'s label in step with `leader` until `cancel`; a failed patch is retried with
/// backoff (from `retry`, capped at 30 s) until it succeeds or leadership changes again. On
/// cancel, a leading pod is labelled `false` (best effort, 2 s).
pub async fn run(
    api: Api<Pod>,
    pod: String,
    mut leader: watch::Receiver<bool>,
    retry: Duration,
    cancel: CancellationToken,
) {
    let mut labelled: Option<bool> = None;
    loop {
        let want = *leader.borrow_and_update();
        let mut attempt = 0;
        while labelled != Some(want) {
            attempt += 1;
            match api
                .patch(
                    &pod,
                    &PatchParams::default(),
                    &Patch::Merge(label_patch(want)),
                )
                .await
            {
                Ok(_) => {
                    tracing::info!(pod, leading = want, label = LEADER_LABEL, "pod label set");
                    labelled = Some(want);
                }
                Err(e) => {
                    tracing::warn!(pod, leading = want, attempt, error = %crate::telemetry::error_chain(&e), "cannot label the controller's pod; retrying");
                    let pause = crate::backoff::delay(retry, Duration::from_secs(30), attempt);
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(pause) => {}
                        changed = leader.changed() => {
                            if changed.is_err() { return; }
                            break;
                        }
                    }
                }
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => {
                if labelled == Some(true) {
                    let (params, patch) = (PatchParams::default(), Patch::Merge(label_patch(false)));
                    let clear = api.patch(&pod, &params, &patch);
                    let _ = tokio::time::timeout(Duration::from_secs(2), clear).await;
                }
                return;
            }
            changed = leader.changed() => {
                if changed.is_err() {
                    // The election ended (the controller is stopping): nothing left to follow.
                    cancel.cancelled().await;
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patch_labels_leader_and_follower() {
        assert_eq!(
            label_patch(true),
            serde_json::json!({"metadata": {"labels": {"nodekeeper.io/leader": "true"}}})
        );
        assert_eq!(
            label_patch(false)["metadata"]["labels"][LEADER_LABEL],
            "false"
        );
    }
}

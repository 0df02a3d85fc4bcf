//! The eviction and deletion calls, what each answer means (accepted, gone, retry, fatal), and
//! the per-pod retry state and blocker they leave.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use kube::core::Status;
use serde_json::json;
use tokio::time::Instant;

use super::{uid, Drainer, Track};
use crate::backoff::delay as backoff;
use crate::controller::act::drain::select::{self, Class, Plan};
use crate::controller::act::drain::{
    blocker, Blocker, DrainError, DrainProgress, OnTimeout, Removal,
};

/// Result of one eviction or deletion call.
#[derive(Debug)]
enum Outcome {
    /// Accepted: the pod is terminating or gone.
    Accepted,
    /// 404, or a 409 after which the pod is not found or has another UID: the pod we meant is gone.
    Gone,
    /// Refused or failed; retry after a backoff (429, 5xx, transport errors, a 409 while the same
    /// pod is still there, a 403 because its namespace is being deleted).
    Retry(Box<Status>),
    /// An error retrying will not fix (e.g. a 403 from RBAC or admission).
    Fatal(kube::Error),
}

/// The `reason` of the StatusCause NamespaceLifecycle admission adds when it refuses a create
/// (an eviction is a create of `pods/eviction`) in a namespace that is being deleted.
pub const NAMESPACE_TERMINATING_CAUSE: &str = "NamespaceTerminating";

/// Whether `s` is NamespaceLifecycle's 403 for a namespace being deleted ("unable to create new
/// content in namespace X because it is being terminated", cause `NamespaceTerminating`). kubectl
/// drain waits for such pods (kubernetes#93947): the namespace controller deletes them.
pub fn namespace_terminating(s: &Status) -> bool {
    s.code == 403
        && (s
            .details
            .iter()
            .flat_map(|d| d.causes.iter())
            .any(|c| c.reason == NAMESPACE_TERMINATING_CAUSE)
            || s.message.contains("because it is being terminated"))
}

pub(super) fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// Whether an API error is worth retrying (throttling, server errors, transport).
pub(super) fn retriable(e: &kube::Error) -> bool {
    match api_code(e) {
        Some(code) => code == 429 || code >= 500,
        None => true,
    }
}

impl<F: FnMut(&DrainProgress) + Send> Drainer<'_, F> {
    /// Evicts the active tier's evictable pods that are due; returns how many were accepted.
    pub(super) async fn evict_tier(
        &mut self,
        plan: &Plan<'_>,
        now: Instant,
    ) -> Result<usize, DrainError> {
        let due: Vec<&Pod> = plan
            .active()
            .iter()
            .filter(|(_, c)| matches!(c, Class::Evict(_)))
            .map(|(p, _)| *p)
            .filter(|p| {
                self.tracks
                    .get(&uid(p))
                    .is_none_or(|t| !t.accepted && t.next_try <= now)
            })
            .collect();
        if due.is_empty() {
            return Ok(0);
        }
        let api = &self.pods;
        let limit = self.call_limit(now);
        // The calls are collected as boxed `Send` futures first (no closure inside the stream),
        // so that a drain can be `tokio::spawn`ed: a closure-mapped stream held across an await
        // trips rustc's higher-ranked lifetime check for `Send`.
        let calls: Vec<futures::future::BoxFuture<'_, (&Pod, Outcome)>> = due
            .into_iter()
            .map(|p| -> futures::future::BoxFuture<'_, (&Pod, Outcome)> {
                Box::pin(async move { (p, bounded(limit, evict(api, p)).await) })
            })
            .collect();
        let results: Vec<(&Pod, Outcome)> = futures::stream::iter(calls)
            .buffer_unordered(self.opts.concurrency.max(1))
            .collect()
            .await;
        let mut accepted = 0;
        let mut pdbs: Option<Vec<PodDisruptionBudget>> = None;
        for (pod, outcome) in results {
            accepted += usize::from(self.apply(pod, outcome, false, &mut pdbs).await?);
        }
        Ok(accepted)
    }

    /// Records one outcome; `Ok(true)` when the pod was accepted for removal.
    async fn apply(
        &mut self,
        pod: &Pod,
        outcome: Outcome,
        forced: bool,
        pdbs: &mut Option<Vec<PodDisruptionBudget>>,
    ) -> Result<bool, DrainError> {
        let key = select::pod_key(pod);
        let now = Instant::now();
        let at_ms = self.elapsed_ms();
        let tier = select::tier_of(pod);
        let initial = self.opts.backoff_initial;
        let track = self.tracks.entry(uid(pod)).or_insert(Track {
            attempts: 0,
            next_try: now,
            accepted: false,
            forced: false,
            blocker: None,
        });
        match outcome {
            Outcome::Accepted | Outcome::Gone => {
                let first = !track.accepted;
                track.accepted = true;
                track.forced |= forced;
                track.blocker = None;
                if first || forced {
                    self.report.removed.push(Removal {
                        pod: key,
                        tier,
                        forced,
                        at_ms,
                    });
                }
                Ok(true)
            }
            Outcome::Retry(status) => {
                track.attempts += 1;
                let attempts = track.attempts;
                track.next_try = now + backoff(initial, self.opts.backoff_max, attempts);
                let names = if matches!(status.code, 429 | 500) {
                    self.pdbs_for(pod, pdbs).await
                } else {
                    Vec::new()
                };
                let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
                let b = blocker::from_refusal(&key, ns, &status, &names);
                tracing::debug!(node = %self.opts.node, pod = %key, code = status.code, blocker = %b, "eviction refused");
                if let Some(t) = self.tracks.get_mut(&uid(pod)) {
                    keep_reason(&mut t.blocker, b);
                }
                Ok(false)
            }
            Outcome::Fatal(kube::Error::Api(status)) => Err(DrainError::EvictionRefused {
                node: self.node().to_string(),
                pod: key,
                code: status.code,
                message: status.message.clone(),
                source: Box::new(kube::Error::Api(status)),
            }),
            Outcome::Fatal(e) => Err(self.api_err(format!("evict pod {key}"), e)),
        }
    }

    /// Names of the PDBs matching `pod` (PDBs listed once per round; empty if they cannot be listed).
    async fn pdbs_for(
        &self,
        pod: &Pod,
        cache: &mut Option<Vec<PodDisruptionBudget>>,
    ) -> Vec<String> {
        if cache.is_none() {
            let list = self.pdbs.list(&ListParams::default()).await;
            *cache = Some(list.map(|l| l.items).unwrap_or_default());
        }
        cache
            .as_deref()
            .map(|all| blocker::matching_pdbs(pod, all))
            .unwrap_or_default()
    }

    /// With `force-delete`: deletes every pod whose grace period no longer fits before the deadline,
    /// with that grace clamped to the time left (at least 1 s). Returns how many were accepted.
    pub(super) async fn force_delete_due(
        &mut self,
        plan: &Plan<'_>,
        now: Instant,
    ) -> Result<usize, DrainError> {
        let Some(deadline) = self.opts.deadline else {
            return Ok(0);
        };
        if self.opts.on_timeout != OnTimeout::ForceDelete {
            return Ok(0);
        }
        let left = deadline.saturating_duration_since(now);
        let due: Vec<(&Pod, u32)> = plan
            .all()
            .filter(|(_, c)| matches!(c, Class::Evict(_) | Class::Terminating(_)))
            .map(|(p, _)| (*p, pod_grace(p)))
            .filter(|(p, grace)| {
                Duration::from_secs(u64::from(*grace)) >= left
                    && !self.tracks.get(&uid(p)).is_some_and(|t| t.forced)
            })
            .map(|(p, grace)| {
                (
                    p,
                    u32::try_from(left.as_secs())
                        .unwrap_or(u32::MAX)
                        .clamp(1, grace.max(1)),
                )
            })
            .collect();
        let mut accepted = 0;
        let mut pdbs = None;
        for (pod, grace) in due {
            let limit = self.call_limit(Instant::now());
            let outcome = bounded(limit, force_delete(&self.pods, pod, grace)).await;
            accepted += usize::from(self.apply(pod, outcome, true, &mut pdbs).await?);
        }
        Ok(accepted)
    }
}

/// The pod's terminationGracePeriodSeconds (default 30).
fn pod_grace(pod: &Pod) -> u32 {
    pod.spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .and_then(|g| u32::try_from(g.max(0)).ok())
        .unwrap_or(30)
}

/// The outcome of an eviction or deletion, or `Err` with the 409 that needs a look at the pod:
/// a 409 means "gone" only when the pod no longer exists or has another UID (our UID
/// precondition failed); the apiserver also answers 409 when its own resourceVersion retries
/// give up, for a pod that is still there.
fn classify(r: Result<(), kube::Error>) -> Result<Outcome, Box<Status>> {
    Ok(match r {
        Ok(()) => Outcome::Accepted,
        Err(kube::Error::Api(s)) if s.code == 404 => Outcome::Gone,
        Err(kube::Error::Api(s)) if s.code == 409 => return Err(s),
        Err(kube::Error::Api(s)) if namespace_terminating(&s) => Outcome::Retry(s),
        Err(kube::Error::Api(s)) if s.code == 429 || s.code >= 500 => Outcome::Retry(s),
        Err(e) if retriable(&e) => {
            Outcome::Retry(Box::new(Status::failure(&e.to_string(), "Transport")))
        }
        Err(e) => Outcome::Fatal(e),
    })
}

/// After a 409 for `pod`: `Gone` when it is not found or has another UID, else `Retry`.
async fn after_conflict(api: &Api<Pod>, pod: &Pod, conflict: Box<Status>) -> Outcome {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    match api.get_opt(name).await {
        Ok(None) => Outcome::Gone,
        Ok(Some(now)) if now.metadata.uid != pod.metadata.uid => Outcome::Gone,
        Ok(Some(_)) => Outcome::Retry(conflict),
        // Cannot tell: try again later (a pod that is gone answers 404 then).
        Err(e) => Outcome::Retry(Box::new(
            Status::failure(
                &format!(
                    "{}; and the pod could not be re-read: {e}",
                    conflict.message
                ),
                "Conflict",
            )
            .with_code(409),
        )),
    }
}

/// Records `new` as why the pod is still there, unless it is an API error or throttling (a
/// timeout near the deadline, a 5xx) and a policy (a PDB) refused the pod before: that says
/// nothing new, and the PDB stays the reason the drain reports (and its exit code).
fn keep_reason(current: &mut Option<Blocker>, new: Blocker) {
    let policy_before = current.as_ref().is_some_and(|b| b.reason.is_policy());
    if new.reason.is_policy() || !policy_before {
        *current = Some(new);
    }
}

/// [`classify`], looking at the pod again after a 409 (`api` is the pod's namespace).
async fn outcome(api: &Api<Pod>, pod: &Pod, r: Result<(), kube::Error>) -> Outcome {
    match classify(r) {
        Ok(o) => o,
        Err(conflict) => after_conflict(api, pod, conflict).await,
    }
}

/// Runs `call` for at most `limit`; a call cut short is retried like a 504.
async fn bounded(limit: Duration, call: impl std::future::Future<Output = Outcome>) -> Outcome {
    match tokio::time::timeout(limit, call).await {
        Ok(o) => o,
        Err(_) => Outcome::Retry(Box::new(
            Status::failure(&format!("no answer within {limit:?}"), "Timeout").with_code(504),
        )),
    }
}

/// `POST pods/NAME/eviction` (policy/v1) with the pod's UID as precondition.
async fn evict(api: &Api<Pod>, pod: &Pod) -> Outcome {
    let ns = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let name = pod.metadata.name.clone().unwrap_or_default();
    let body = json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": name, "namespace": ns},
        "deleteOptions": {"preconditions": {"uid": uid(pod)}}});
    let api: Api<Pod> = Api::namespaced(api.clone().into_client(), &ns);
    let r: Result<Status, kube::Error> = api
        .create_subresource("eviction", &name, &PostParams::default(), &body)
        .await;
    outcome(&api, pod, r.map(|_| ())).await
}

/// `DELETE pod` with `grace` seconds and the pod's UID as precondition (bypasses PDBs).
async fn force_delete(api: &Api<Pod>, pod: &Pod, grace: u32) -> Outcome {
    let ns = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let name = pod.metadata.name.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(api.clone().into_client(), &ns);
    let dp = DeleteParams {
        grace_period_seconds: Some(grace),
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let r = api.delete(&name, &dp).await.map(|_| ());
    outcome(&api, pod, r).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::controller::act::drain::exec::mock::{
        conflict, mock, pod, status, terminating, EVICT, GET,
    };
    use crate::controller::act::drain::BlockReason;

    #[test]
    fn a_timeout_after_a_pdb_refusal_keeps_the_pdb_as_the_reason() {
        let b = |reason, pdb: Option<&str>| Blocker {
            pod: "ns/p".into(),
            pdb: pdb.map(str::to_string),
            reason,
            message: String::new(),
        };
        let mut cur = None;
        keep_reason(&mut cur, b(BlockReason::ApiError, None));
        assert_eq!(
            cur.as_ref().unwrap().reason,
            BlockReason::ApiError,
            "nothing better known"
        );
        keep_reason(
            &mut cur,
            b(BlockReason::PodDisruptionBudget, Some("ns/pdb")),
        );
        keep_reason(&mut cur, b(BlockReason::ApiError, None));
        keep_reason(&mut cur, b(BlockReason::Throttled, None));
        let kept = cur.clone().unwrap();
        assert_eq!(
            (kept.reason, kept.pdb.as_deref()),
            (BlockReason::PodDisruptionBudget, Some("ns/pdb"))
        );
        keep_reason(&mut cur, b(BlockReason::DoNotDisrupt, None));
        assert_eq!(
            cur.unwrap().reason,
            BlockReason::DoNotDisrupt,
            "a newer policy replaces it"
        );
    }

    #[tokio::test]
    async fn a_409_means_gone_only_if_the_pod_is_gone_or_replaced() {
        // Still there with the same UID: retried, not taken as gone.
        let (c, seen) = mock(|m, p| match (m, p) {
            ("POST", EVICT) => (409, conflict()),
            ("GET", GET) => (
                200,
                json!({"metadata": {"name": "web-1", "namespace": "shop", "uid": "u1"}}),
            ),
            _ => (500, json!({})),
        });
        let o = evict(&Api::all(c), &pod("u1")).await;
        assert!(matches!(&o, Outcome::Retry(s) if s.code == 409), "{o:?}");
        assert_eq!(
            *seen.lock().unwrap(),
            [format!("POST {EVICT}"), format!("GET {GET}")]
        );
        // Replaced (same name, another UID): gone.
        let (c, _) = mock(|m, p| match (m, p) {
            ("POST", EVICT) => (409, conflict()),
            ("GET", GET) => (
                200,
                json!({"metadata": {"name": "web-1", "namespace": "shop", "uid": "u2"}}),
            ),
            _ => (500, json!({})),
        });
        assert!(matches!(
            evict(&Api::all(c), &pod("u1")).await,
            Outcome::Gone
        ));
        // Not found any more: gone.
        let (c, _) = mock(|m, p| match (m, p) {
            ("POST", EVICT) => (409, conflict()),
            _ => (
                404,
                status(404, "NotFound", "pods \"web-1\" not found", json!([])),
            ),
        });
        assert!(matches!(
            evict(&Api::all(c), &pod("u1")).await,
            Outcome::Gone
        ));
        // The re-read fails: retried (never "gone" on a guess).
        let (c, _) = mock(|m, p| match (m, p) {
            ("POST", EVICT) => (409, conflict()),
            _ => (
                503,
                status(503, "ServiceUnavailable", "etcd is sad", json!([])),
            ),
        });
        assert!(matches!(
            evict(&Api::all(c), &pod("u1")).await,
            Outcome::Retry(_)
        ));
        // Force deletion goes through the same check.
        let (c, _) = mock(|m, p| match (m, p) {
            ("DELETE", GET) => (409, conflict()),
            ("GET", GET) => (
                200,
                json!({"metadata": {"name": "web-1", "namespace": "shop", "uid": "u1"}}),
            ),
            _ => (500, json!({})),
        });
        assert!(matches!(
            force_delete(&Api::all(c), &pod("u1"), 5).await,
            Outcome::Retry(_)
        ));
    }

    #[tokio::test]
    async fn a_terminating_namespace_is_waited_for_other_403s_are_fatal() {
        let (c, _) = mock(|_, _| (403, terminating()));
        let o = evict(&Api::all(c), &pod("u1")).await;
        let Outcome::Retry(s) = &o else {
            panic!("{o:?}")
        };
        assert!(namespace_terminating(s));
        let b = blocker::from_refusal("shop/web-1", "shop", s, &[]);
        assert_eq!(b.reason, BlockReason::NamespaceTerminating);
        assert!(b.message.contains("being terminated"), "{}", b.message);
        // The message alone (an apiserver that drops causes) is recognised too.
        let mut bare = terminating();
        bare["details"]["causes"] = json!([]);
        let (c, _) = mock(move |_, _| (403, bare.clone()));
        assert!(matches!(
            evict(&Api::all(c), &pod("u1")).await,
            Outcome::Retry(_)
        ));
        // RBAC: fatal.
        let rbac = status(403, "Forbidden", "pods \"web-1\" is forbidden: User \"system:serviceaccount:nodekeeper:nodekeeper-controller\" cannot create resource \"pods/eviction\" in API group \"\" in the namespace \"shop\"", json!([]));
        let (c, _) = mock(move |_, _| (403, rbac.clone()));
        let o = evict(&Api::all(c), &pod("u1")).await;
        assert!(
            matches!(&o, Outcome::Fatal(kube::Error::Api(s)) if s.code == 403),
            "{o:?}"
        );
    }

    #[test]
    fn classify_table() {
        let api = |v: serde_json::Value| -> Result<(), kube::Error> {
            Err(kube::Error::Api(Box::new(
                serde_json::from_value(v).unwrap(),
            )))
        };
        assert!(matches!(classify(Ok(())), Ok(Outcome::Accepted)));
        assert!(matches!(
            classify(api(status(404, "NotFound", "x", json!([])))),
            Ok(Outcome::Gone)
        ));
        assert!(matches!(classify(api(conflict())), Err(s) if s.code == 409));
        assert!(matches!(
            classify(api(terminating())),
            Ok(Outcome::Retry(_))
        ));
        for code in [429, 500, 503, 504] {
            assert!(
                matches!(
                    classify(api(status(code, "X", "x", json!([])))),
                    Ok(Outcome::Retry(_))
                ),
                "{code}"
            );
        }
        for code in [400, 401, 403, 422] {
            assert!(
                matches!(
                    classify(api(status(code, "X", "x", json!([])))),
                    Ok(Outcome::Fatal(_))
                ),
                "{code}"
            );
        }
    }
}

//! The drain executor over kube-rs: cordon, evict tier by tier with bounded concurrency and jittered
//! backoff, confirm deletions by UID, force-delete past the deadline if asked, wait for volumes.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use kube::core::Status;
use kube::Client;
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::select::{self, Class, Plan, SelectOptions};
use super::{
    blocker, BlockReason, Blocker, DrainError, DrainProgress, DrainReport, OnTimeout, Phase,
    Planned, Removal, Skipped, Tier,
};

/// How to drain one node.
#[derive(Debug, Clone)]
pub struct DrainOptions {
    /// Node name.
    pub node: String,
    /// When the drain must be over (`None`: no deadline).
    pub deadline: Option<Instant>,
    /// What to do at the deadline.
    pub on_timeout: OnTimeout,
    /// Evictions in flight at once.
    pub concurrency: usize,
    /// List what would be evicted; change nothing (no cordon either).
    pub dry_run: bool,
    /// After the pods, wait until no VolumeAttachment names the node.
    pub wait_volume_detach: bool,
    /// An interruption drain: past the deadline, do-not-disrupt annotations are no longer honoured.
    pub interruption: bool,
    /// Value of the drain taint pods may tolerate (`None`: any value).
    pub taint_value: Option<String>,
    /// Re-list period while waiting for pods to go.
    pub poll_interval: Duration,
    /// First retry delay after a refused eviction (doubles, jittered, up to `backoff_max`).
    pub backoff_initial: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// With `force-delete`: how long past the deadline to wait for force-deleted pods to go.
    pub force_settle: Duration,
    /// Longest single eviction or deletion call (also cut at the deadline).
    pub call_timeout: Duration,
}

impl DrainOptions {
    /// Defaults for `node`: no deadline, fail on timeout, 16 evictions in flight, wait for volumes.
    pub fn new(node: impl Into<String>) -> Self {
        DrainOptions {
            node: node.into(),
            deadline: None,
            on_timeout: OnTimeout::Fail,
            concurrency: 16,
            dry_run: false,
            wait_volume_detach: true,
            interruption: false,
            taint_value: None,
            poll_interval: Duration::from_millis(200),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            force_settle: Duration::from_secs(5),
            call_timeout: Duration::from_secs(10),
        }
    }

    /// Sets the deadline to `timeout` from now.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.deadline = Some(Instant::now() + timeout);
        self
    }
}

/// Per-pod (by UID) retry state.
#[derive(Debug, Clone)]
struct Track {
    attempts: u32,
    next_try: Instant,
    accepted: bool,
    forced: bool,
    blocker: Option<Blocker>,
}

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

/// A client for the drain: `cfg` with kube's built-in retry of 429/503/504 turned off.
///
/// kube-rs retries 429 transparently by default (up to 15 times, minutes in all), which would hide the
/// PodDisruptionBudget that refuses an eviction and overrun the deadline. The drain handles 429 itself.
pub fn client(mut cfg: kube::Config) -> Result<Client, kube::Error> {
    cfg.default_retry = false;
    Client::try_from(cfg)
}

/// Drains `opts.node` using `client` (build it with [`client`]: a client that retries 429 itself is
/// bounded by `call_timeout` but hides blockers). Progress goes to `progress` whenever it changes; `cancel` stops the drain
/// (the node stays cordoned). Returns the report, or why the drain did not finish.
pub async fn drain(
    client: Client,
    opts: &DrainOptions,
    cancel: CancellationToken,
    progress: impl FnMut(&DrainProgress) + Send,
) -> Result<DrainReport, DrainError> {
    let mut d = Drainer {
        pods: Api::all(client.clone()),
        nodes: Api::all(client.clone()),
        pdbs: Api::all(client.clone()),
        volumes: Api::all(client),
        opts,
        start: Instant::now(),
        tracks: HashMap::new(),
        report: DrainReport {
            node: opts.node.clone(),
            dry_run: opts.dry_run,
            ..DrainReport::default()
        },
        last: None,
        progress,
        cancel,
        initial_ds: None,
    };
    d.run().await
}

struct Drainer<'a, F> {
    pods: Api<Pod>,
    nodes: Api<Node>,
    pdbs: Api<PodDisruptionBudget>,
    volumes: Api<VolumeAttachment>,
    opts: &'a DrainOptions,
    start: Instant,
    tracks: HashMap<String, Track>,
    report: DrainReport,
    last: Option<DrainProgress>,
    progress: F,
    cancel: CancellationToken,
    /// UIDs of the DaemonSet pods seen at the first listing.
    initial_ds: Option<HashSet<String>>,
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// Whether an API error is worth retrying (throttling, server errors, transport).
fn retriable(e: &kube::Error) -> bool {
    match api_code(e) {
        Some(code) => code == 429 || code >= 500,
        None => true,
    }
}

impl<F: FnMut(&DrainProgress) + Send> Drainer<'_, F> {
    fn node(&self) -> &str {
        &self.opts.node
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn api_err(&self, action: impl Into<String>, source: kube::Error) -> DrainError {
        DrainError::Api {
            node: self.node().to_string(),
            action: action.into(),
            source,
        }
    }

    async fn run(&mut self) -> Result<DrainReport, DrainError> {
        let node = match self.nodes.get_opt(self.node()).await {
            Ok(Some(n)) => n,
            Ok(None) => {
                return Err(DrainError::NodeNotFound {
                    node: self.node().to_string(),
                })
            }
            Err(e) => return Err(self.api_err("get node", e)),
        };
        if self.opts.dry_run {
            return self.dry_run().await;
        }
        self.cordon(&node).await?;
        self.evict_all().await?;
        if self.opts.wait_volume_detach {
            self.wait_volumes().await?;
        }
        self.emit(Phase::Done, None, 0, 0, None);
        self.report.elapsed_ms = self.elapsed_ms();
        Ok(self.report.clone())
    }

    async fn cordon(&mut self, node: &Node) -> Result<(), DrainError> {
        let unschedulable = node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        if unschedulable {
            return Ok(());
        }
        self.emit(Phase::Cordoning, None, 0, 0, None);
        let name = self.node().to_string();
        self.nodes
            .cordon(&name)
            .await
            .map_err(|e| self.api_err("cordon", e))?;
        self.report.cordoned_by_us = true;
        Ok(())
    }

    async fn list_pods(&self) -> Result<Vec<Pod>, kube::Error> {
        let lp = ListParams::default().fields(&format!("spec.nodeName={}", self.node()));
        Ok(self.pods.list(&lp).await?.items)
    }

    fn select_options(&self, now: Instant) -> SelectOptions {
        let past = self.opts.deadline.is_some_and(|d| now >= d);
        SelectOptions {
            taint_value: self.opts.taint_value.clone(),
            honour_do_not_disrupt: !(past && self.opts.interruption),
            initial_daemonset_pods: self.initial_ds.clone(),
            ..SelectOptions::at(chrono::Utc::now())
        }
    }

    async fn dry_run(&mut self) -> Result<DrainReport, DrainError> {
        let pods = self
            .list_pods()
            .await
            .map_err(|e| self.api_err("list pods", e))?;
        let plan = select::plan(&pods, &self.select_options(Instant::now()));
        self.record_skipped(&plan);
        self.report.planned = plan
            .all()
            .filter_map(|(p, c)| {
                c.tier().map(|tier| Planned {
                    pod: select::pod_key(p),
                    tier,
                    held: matches!(c, Class::Held(_)),
                })
            })
            .collect();
        self.report.elapsed_ms = self.elapsed_ms();
        Ok(self.report.clone())
    }

    fn record_skipped(&mut self, plan: &Plan<'_>) {
        self.report.skipped = plan
            .skipped
            .iter()
            .map(|(p, r)| Skipped {
                pod: select::pod_key(p),
                reason: *r,
            })
            .collect();
    }

    /// Rounds of list → (force-delete) → evict the active tier → wait, until no pod is left.
    async fn evict_all(&mut self) -> Result<(), DrainError> {
        loop {
            if self.cancel.is_cancelled() {
                return Err(self.cancelled(None));
            }
            let pods = match self.list_pods().await {
                Ok(p) => p,
                Err(e) if retriable(&e) => {
                    self.check_deadline(None, usize::MAX)?;
                    self.sleep(self.opts.poll_interval).await?;
                    continue;
                }
                Err(e) => return Err(self.api_err("list pods", e)),
            };
            if self.initial_ds.is_none() {
                let ds = pods.iter().filter(|p| select::is_daemonset(p)).map(uid);
                self.initial_ds = Some(ds.collect());
            }
            let now = Instant::now();
            let plan = select::plan(&pods, &self.select_options(now));
            self.record_skipped(&plan);
            let present: HashSet<String> = pods.iter().map(uid).collect();
            self.tracks.retain(|u, _| present.contains(u));
            if plan.remaining() == 0 {
                return Ok(());
            }
            let forced = self.force_delete_due(&plan, now).await?;
            let blocker = self.current_blocker(&plan);
            let forcing = self.opts.on_timeout == OnTimeout::ForceDelete;
            let phase = if forcing && self.past_deadline(now) {
                Phase::ForceDeleting
            } else {
                Phase::Evicting
            };
            self.emit(
                phase,
                plan.tier,
                plan.remaining(),
                plan.active().len(),
                blocker.clone(),
            );
            self.check_deadline(blocker, plan.remaining())?;
            let accepted = self.evict_tier(&plan, now).await? + forced;
            if accepted == 0 {
                let wait = self.next_wake(now);
                self.sleep(wait).await?;
            }
        }
    }

    /// How long one call may take: `call_timeout`, cut at the deadline (at least 100 ms).
    fn call_limit(&self, now: Instant) -> Duration {
        let to_deadline = self
            .opts
            .deadline
            .map(|d| d.saturating_duration_since(now))
            .unwrap_or(Duration::MAX);
        self.opts
            .call_timeout
            .min(to_deadline)
            .max(Duration::from_millis(100))
    }

    fn past_deadline(&self, now: Instant) -> bool {
        self.opts.deadline.is_some_and(|d| now >= d)
    }

    /// Fails with `TimedOut` when the deadline (plus the force-delete settle time) has passed.
    fn check_deadline(&self, blocker: Option<Blocker>, remaining: usize) -> Result<(), DrainError> {
        let Some(deadline) = self.opts.deadline else {
            return Ok(());
        };
        let limit = match self.opts.on_timeout {
            OnTimeout::Fail => deadline,
            OnTimeout::ForceDelete => deadline + self.opts.force_settle,
        };
        if Instant::now() < limit {
            return Ok(());
        }
        Err(DrainError::TimedOut {
            node: self.node().to_string(),
            waited: self.start.elapsed(),
            remaining: if remaining == usize::MAX {
                0
            } else {
                remaining
            },
            blocker: blocker.map(Box::new),
            report: Box::new(self.finished_report()),
        })
    }

    fn finished_report(&self) -> DrainReport {
        let mut r = self.report.clone();
        r.elapsed_ms = self.elapsed_ms();
        r
    }

    fn cancelled(&self, remaining: Option<usize>) -> DrainError {
        DrainError::Cancelled {
            node: self.node().to_string(),
            remaining: remaining.unwrap_or(0),
            report: Box::new(self.finished_report()),
        }
    }

    /// Sleeps `d` unless cancelled.
    async fn sleep(&self, d: Duration) -> Result<(), DrainError> {
        tokio::select! {
            _ = self.cancel.cancelled() => Err(self.cancelled(None)),
            _ = tokio::time::sleep(d) => Ok(()),
        }
    }

    /// The earliest of: the poll interval, the next retry, the deadline.
    fn next_wake(&self, now: Instant) -> Duration {
        let mut wake = now + self.opts.poll_interval;
        for t in self.tracks.values() {
            if !t.accepted && t.next_try > now {
                wake = wake.min(t.next_try);
            }
        }
        if let Some(d) = self.opts.deadline.filter(|d| *d > now) {
            wake = wake.min(d);
        }
        wake.saturating_duration_since(now)
            .max(Duration::from_millis(5))
    }

    /// Evicts the active tier's evictable pods that are due; returns how many were accepted.
    async fn evict_tier(&mut self, plan: &Plan<'_>, now: Instant) -> Result<usize, DrainError> {
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
    async fn force_delete_due(
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

    /// The blocker to report: a refused eviction (policy first), a held pod, then a terminating one.
    fn current_blocker(&self, plan: &Plan<'_>) -> Option<Blocker> {
        let refused = |policy: bool| {
            plan.active().iter().find_map(|(p, _)| {
                self.tracks
                    .get(&uid(p))
                    .and_then(|t| t.blocker.clone())
                    .filter(|b| b.reason.is_policy() == policy)
            })
        };
        let by_class = |want: fn(&Class) -> bool, reason: BlockReason, msg: &str| {
            plan.active()
                .iter()
                .find(|(_, c)| want(c))
                .map(|(p, _)| Blocker {
                    pod: select::pod_key(p),
                    pdb: None,
                    reason,
                    message: msg.to_string(),
                })
        };
        refused(true)
            .or_else(|| {
                by_class(
                    |c| matches!(c, Class::Held(_)),
                    BlockReason::DoNotDisrupt,
                    "the pod has a do-not-disrupt annotation",
                )
            })
            .or_else(|| refused(false))
            .or_else(|| {
                by_class(
                    |c| matches!(c, Class::Terminating(_)),
                    BlockReason::Terminating,
                    "waiting for the pod to terminate",
                )
            })
    }

    /// Waits until no VolumeAttachment names the node (bounded by the deadline).
    async fn wait_volumes(&mut self) -> Result<(), DrainError> {
        loop {
            let left: Vec<String> = match self.volumes.list(&ListParams::default()).await {
                Ok(l) => l
                    .items
                    .into_iter()
                    .filter(|v| v.spec.node_name == self.opts.node)
                    .filter_map(|v| v.metadata.name)
                    .collect(),
                Err(e) if retriable(&e) => vec![],
                Err(e) => return Err(self.api_err("list volumeattachments", e)),
            };
            let Some(first) = left.first() else {
                return Ok(());
            };
            let b = Blocker {
                pod: first.clone(),
                pdb: None,
                reason: BlockReason::VolumeAttachment,
                message: format!("{} VolumeAttachment(s) still attached", left.len()),
            };
            self.emit(Phase::WaitingVolumes, None, 0, 0, Some(b.clone()));
            self.check_deadline(Some(b), 0)?;
            self.sleep(self.next_wake(Instant::now())).await?;
        }
    }

    fn emit(
        &mut self,
        phase: Phase,
        tier: Option<Tier>,
        remaining: usize,
        remaining_in_tier: usize,
        blocker: Option<Blocker>,
    ) {
        let p = DrainProgress {
            node: self.opts.node.clone(),
            phase,
            tier,
            remaining,
            remaining_in_tier,
            evicted: self.report.removed.iter().filter(|r| !r.forced).count(),
            force_deleted: self.report.removed.iter().filter(|r| r.forced).count(),
            blocker,
            elapsed_ms: self.elapsed_ms(),
        };
        if self.last.as_ref().is_some_and(|l| l.same_as(&p)) {
            return;
        }
        (self.progress)(&p);
        self.last = Some(p);
    }
}

pub use crate::backoff::delay as backoff;

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

    use super::*;
    use std::sync::{Arc, Mutex};

    /// A kube client whose apiserver answers each request with `answer(method, path)`, and the
    /// requests it saw.
    fn mock(
        answer: impl Fn(&str, &str) -> (u16, serde_json::Value) + Send + Sync + 'static,
    ) -> (Client, Arc<Mutex<Vec<String>>>) {
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let log = seen.clone();
        let answer = Arc::new(answer);
        let svc = tower::service_fn(move |req: hyper::Request<kube::client::Body>| {
            let (method, path) = (req.method().to_string(), req.uri().path().to_string());
            log.lock().unwrap().push(format!("{method} {path}"));
            let (code, body) = answer(&method, &path);
            async move {
                hyper::Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
            }
        });
        (Client::new(svc, "default"), seen)
    }

    fn pod(uid: &str) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "web-1", "namespace": "shop", "uid": uid}}),
        )
        .unwrap()
    }

    fn status(
        code: u16,
        reason: &str,
        message: &str,
        causes: serde_json::Value,
    ) -> serde_json::Value {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code,
            "details": {"name": "web-1", "kind": "pods", "causes": causes}})
    }

    const EVICT: &str = "/api/v1/namespaces/shop/pods/web-1/eviction";
    const GET: &str = "/api/v1/namespaces/shop/pods/web-1";

    /// The real apiserver's 409 when its retries on the pod's resourceVersion give up.
    fn conflict() -> serde_json::Value {
        status(409, "Conflict", "Operation cannot be fulfilled on pods \"web-1\": the object has been modified; please apply your changes to the latest version and try again", json!([]))
    }

    /// NamespaceLifecycle's refusal (staging/src/k8s.io/apiserver/pkg/admission/plugin/namespace/lifecycle).
    fn terminating() -> serde_json::Value {
        status(403, "Forbidden",
            "pods \"web-1\" is forbidden: unable to create new content in namespace shop because it is being terminated",
            json!([{"reason": "NamespaceTerminating", "message": "namespace shop is being terminated", "field": "metadata.namespace"}]))
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

    /// A cordoned node `n1` with one ReplicaSet pod (grace 10 s) whose eviction a PDB always
    /// refuses (429); deletions are accepted but the pod stays listed. Runs the drain with
    /// `opts` on paused time; returns its result and each request with its time.
    async fn refused_drain(
        opts: DrainOptions,
    ) -> (Result<DrainReport, DrainError>, Vec<(Duration, String)>) {
        let t0 = Instant::now();
        let log: Arc<Mutex<Vec<(Duration, String)>>> = Arc::default();
        let timed = log.clone();
        let pod = json!({"metadata": {"name": "web-1", "namespace": "shop", "uid": "u1",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web",
                    "uid": "rs1", "controller": true}]},
            "spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 10, "containers": []}});
        let (client, _) = mock(move |method, path| {
            timed
                .lock()
                .unwrap()
                .push((t0.elapsed(), format!("{method} {path}")));
            let list = |items: serde_json::Value| json!({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": items});
            match (method, path) {
                ("GET", "/api/v1/nodes/n1") => (
                    200,
                    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
                        "spec": {"unschedulable": true}}),
                ),
                ("GET", "/api/v1/pods") => (200, list(json!([pod.clone()]))),
                ("POST", EVICT) => (
                    429,
                    status(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        json!([]),
                    ),
                ),
                ("GET", "/apis/policy/v1/poddisruptionbudgets") => (200, list(json!([]))),
                ("DELETE", GET) => (200, pod.clone()),
                _ => (404, status(404, "NotFound", "no", json!([]))),
            }
        });
        let r = drain(client, &opts, CancellationToken::new(), |_| {}).await;
        let log = log.lock().unwrap().clone();
        (r, log)
    }

    fn opts(deadline: Duration, on_timeout: OnTimeout) -> DrainOptions {
        let mut o = DrainOptions::new("n1").with_timeout(deadline);
        o.on_timeout = on_timeout;
        o.wait_volume_detach = false;
        o
    }

    const S: fn(u64) -> Duration = Duration::from_secs;
    const MS: fn(u64) -> Duration = Duration::from_millis;

    /// `fail`: a drain blocked by a PDB times out at its deadline — not a poll later, not
    /// earlier — naming the pod left and the refusal, with evictions retried until then.
    #[tokio::test(start_paused = true)]
    async fn a_blocked_drain_times_out_exactly_at_its_deadline() {
        let (r, log) = refused_drain(opts(S(30), OnTimeout::Fail)).await;
        let Err(DrainError::TimedOut {
            waited,
            remaining,
            blocker,
            ..
        }) = r
        else {
            panic!("{r:?}")
        };
        assert!(waited >= S(30) && waited <= S(30) + MS(1), "{waited:?}");
        assert_eq!(remaining, 1);
        // no PDB is listed, so the 429 reads as throttling
        let b = blocker.unwrap();
        assert_eq!(
            (b.pod.as_str(), b.reason),
            ("shop/web-1", BlockReason::Throttled)
        );
        let evictions: Vec<Duration> = log
            .iter()
            .filter(|(_, r)| r == &format!("POST {EVICT}"))
            .map(|(t, _)| *t)
            .collect();
        // backoff 100 ms doubling to 10 s, jittered: at least 5 tries in 30 s, all before it
        assert!(evictions.len() >= 5, "{evictions:?}");
        assert!(evictions.iter().all(|t| *t < S(30)), "{evictions:?}");
        assert!(
            !log.iter().any(|(_, r)| r.starts_with("DELETE")),
            "fail never deletes"
        );
    }

    /// `force-delete`: the pod is deleted once its grace (10 s) no longer fits before the
    /// deadline (30 s), i.e. at the first round from 20 s; the drain then gives the deletion
    /// `force_settle` (5 s) and times out at 35 s (rounds are at most a poll interval apart).
    #[tokio::test(start_paused = true)]
    async fn force_delete_starts_when_the_grace_no_longer_fits_and_settles_after() {
        let (r, log) = refused_drain(opts(S(30), OnTimeout::ForceDelete)).await;
        let Err(DrainError::TimedOut { waited, .. }) = r else {
            panic!("{r:?}")
        };
        let poll = DrainOptions::new("n1").poll_interval;
        assert!(waited >= S(35) && waited <= S(35) + poll, "{waited:?}");
        let deletes: Vec<Duration> = log
            .iter()
            .filter(|(_, r)| r.starts_with("DELETE"))
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(deletes.len(), 1, "{deletes:?}");
        assert!(
            deletes[0] >= S(20) && deletes[0] <= S(20) + poll,
            "{deletes:?}"
        );
    }

    /// The wait between rounds: the poll interval, cut by a pod's next retry and by the
    /// deadline, at least 5 ms; a call's limit: `call_timeout` cut at the deadline, at least
    /// 100 ms.
    #[tokio::test(start_paused = true)]
    async fn next_wake_and_call_limit_are_cut_at_the_deadline() {
        let (client, _) = mock(|_, _| (404, json!({})));
        let mut o = DrainOptions::new("n1").with_timeout(S(1));
        o.poll_interval = S(10);
        o.call_timeout = S(10);
        let d = Drainer {
            pods: Api::all(client.clone()),
            nodes: Api::all(client.clone()),
            pdbs: Api::all(client.clone()),
            volumes: Api::all(client),
            opts: &o,
            start: Instant::now(),
            tracks: HashMap::new(),
            report: DrainReport::default(),
            last: None,
            progress: |_: &DrainProgress| {},
            cancel: CancellationToken::new(),
            initial_ds: None,
        };
        let now = Instant::now();
        assert_eq!(d.next_wake(now), S(1));
        assert_eq!(d.call_limit(now), S(1));
        assert_eq!(d.next_wake(now + MS(999)), MS(5));
        assert_eq!(d.call_limit(now + MS(950)), MS(100));
        assert!(!d.past_deadline(now + MS(999)));
        assert!(d.past_deadline(now + S(1)));
        assert_eq!(
            d.next_wake(now + S(2)),
            S(10),
            "past the deadline: the poll interval"
        );
        assert!(d.check_deadline(None, 1).is_ok());
        tokio::time::advance(MS(999)).await;
        assert!(d.check_deadline(None, 1).is_ok());
        tokio::time::advance(MS(1)).await;
        assert!(matches!(
            d.check_deadline(None, 1),
            Err(DrainError::TimedOut { waited, remaining: 1, .. }) if waited == S(1)
        ));
    }
}

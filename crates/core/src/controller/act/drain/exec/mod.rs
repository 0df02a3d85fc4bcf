//! The drain executor over kube-rs: cordon, evict tier by tier with bounded concurrency and jittered
//! backoff, confirm deletions by UID, force-delete past the deadline if asked, wait for volumes.
//!
//! - this file: the options, the [`drain`] entry point, its round loop (list, plan, evict, wait) and the
//!   wait for VolumeAttachments after the pods are gone;
//! - `evict.rs`: the eviction and deletion calls, what their answers mean, and per-pod retries;
//! - `deadline.rs`: the deadline, call limits, the wait between rounds, cancellation;
//! - `feed.rs`: the node's pods between rounds (a list, then a watch; a new list on a change).

mod deadline;
mod evict;
mod feed;
#[cfg(test)]
mod mock;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, ListParams};
use kube::Client;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::select::{self, Class, Plan, SelectOptions};
use super::{
    BlockReason, Blocker, DrainError, DrainProgress, DrainReport, OnTimeout, Phase, Planned,
    Skipped, Tier,
};
use evict::retriable;
pub use evict::{namespace_terminating, NAMESPACE_TERMINATING_CAUSE};

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
    Drainer::new(client, opts, cancel, progress).run().await
}

impl<'a, F: FnMut(&DrainProgress) + Send> Drainer<'a, F> {
    /// A drain of `opts.node` through `client`, not started.
    fn new(client: Client, opts: &'a DrainOptions, cancel: CancellationToken, progress: F) -> Self {
        Drainer {
            feed: feed::PodFeed::new(Api::all(client.clone()), &opts.node),
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
        }
    }
}

struct Drainer<'a, F> {
    feed: feed::PodFeed,
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
            let pods = match self.feed.pods().await {
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
                self.wait_change(wait).await?;
            }
        }
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

//! The node-state layer: the latest report of every agent, written onto its Node.
//!
//! - A kube-runtime reflector caches Nodes; `/readyz` waits for its first list.
//! - Conditions whose type starts with the configured prefix are **owned**: every write sets the
//!   full reported set (strategic merge by `type`) and deletes owned types the agent no longer
//!   reports — including types found on the Node after a controller restart.
//! - `lastTransitionTime` changes only when the status changes (taken from the Node the first time,
//!   so restarts keep it); `lastHeartbeatTime` is refreshed when anything changes and at least every
//!   `heartbeat_write_interval`.
//! - Reports are idempotent: `(agent_instance, sequence)` at or below the last seen is a replay.
//! - Only the leader writes. A follower keeps the latest report in memory and writes it when it
//!   becomes leader; it does not acknowledge events (so the agent resends them).
//! - An agent silent for `staleness` (counted from the controller's start for nodes it has not
//!   heard from yet) gets its owned conditions set to `Unknown` / `AgentNotReporting`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// tokio's clock: the wall clock, or a paused one in tests.
use tokio::time::Instant;

use chrono::{DateTime, SecondsFormat, Utc};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::Store;
use serde_json::{json, Value};
use tokio::sync::{broadcast, watch};

use crate::controller::catalog::{EventType, Reason};
use crate::controller::cluster::events::Recorder;
use crate::controller::state::fresh::FreshNodes;
use crate::controller::state::limits::{Bucket, Exceeded, Limit, ReportLimits, SeenEvents};
use crate::wire::NodeEvent;
use crate::wire::{AgentCommand, CrioReport, CrioResult, LabelRemoval, NodeReport, ReportResponse};
use crate::wire::{CheckResult, ConditionStatus};

/// Reason written on conditions of a silent agent.
pub const STALE_REASON: &str = crate::controller::catalog::AGENT_NOT_REPORTING;
/// Attempts of one status write when the API server answers 429/5xx (then the agent's retry or
/// the maintenance tick takes over).
const WRITE_ATTEMPTS: u32 = 3;
/// Pause before the second attempt (grows linearly, jittered).
const WRITE_RETRY_BASE: Duration = Duration::from_millis(50);

/// A 429 or 5xx from the API server, or a transport error: worth an immediate retry.
fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// Tunables of the node-state layer.
#[derive(Debug, Clone)]
pub struct NodeStateConfig {
    /// Owned condition type prefix.
    pub prefix: String,
    /// Silence after which conditions become Unknown.
    pub staleness: Duration,
    /// Refresh unchanged conditions at most this often.
    pub heartbeat_write_interval: Duration,
    /// Label keys agents may have removed from their own node.
    pub label_allow: Vec<String>,
    /// What one node's reports may ask (`[controller.report_limits]`).
    pub limits: ReportLimits,
}

impl From<&crate::controller::config::ControllerConfig> for NodeStateConfig {
    /// The node-state settings of a `[controller]` table.
    fn from(cfg: &crate::controller::config::ControllerConfig) -> Self {
        NodeStateConfig {
            prefix: cfg.condition_prefix.clone(),
            staleness: cfg.staleness,
            heartbeat_write_interval: cfg.heartbeat_write_interval,
            label_allow: cfg.label_removal_allow.clone(),
            limits: cfg.report_limits.clone(),
        }
    }
}

/// Failures writing Node state.
#[derive(Debug, thiserror::Error)]
pub enum NodeStateError {
    /// Patching the Node failed.
    #[error("patch node {node}: {source}")]
    Patch {
        /// Node.
        node: String,
        /// Cause.
        source: kube::Error,
    },
}

/// Counters exported on `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    /// Reports accepted.
    pub reports: AtomicU64,
    /// Replays ignored.
    pub replays: AtomicU64,
    /// Node status writes.
    pub node_writes: AtomicU64,
    /// Failed Node writes.
    pub write_failures: AtomicU64,
    /// Node events recorded.
    pub node_events: AtomicU64,
    /// Labels removed.
    pub labels_removed: AtomicU64,
    /// Nodes marked stale.
    pub stale_marked: AtomicU64,
    /// Reports refused over a limit, by [`Limit::ALL`]'s order.
    pub over_limit: [AtomicU64; Limit::ALL.len()],
    /// Events about Nodes not recorded: over the node's Event rate.
    pub events_suppressed: AtomicU64,
    /// New notices not taken (nor acknowledged) over the node's notice rate.
    pub notices_deferred: AtomicU64,
    /// Passes of [`NodeStates::tick`] done as the leader (staleness marked, stale types removed).
    pub maintenance_passes: AtomicU64,
}

#[derive(Debug, Default)]
struct Agent {
    instance: String,
    sequence: u64,
    last_seen: Option<Instant>,
    conditions: Vec<CheckResult>,
    /// type → (status, lastTransitionTime) as last written.
    written: Option<BTreeMap<String, (String, String)>>,
    written_at: Option<Instant>,
    dirty: bool,
    stale: bool,
    seen_events: SeenEvents,
    /// New notices taken from this node's reports.
    notices: Bucket,
    /// Events recorded about this node.
    events: Bucket,
    /// Events are being dropped (the `EventsRateLimited` Event is recorded once per stretch).
    events_limited: bool,
    pending_commands: Vec<AgentCommand>,
    /// When the CRI-O apply last recorded as an Event ran (`CrioReport::at`).
    crio_recorded: Option<DateTime<Utc>>,
}

/// The shared node state.
pub struct NodeStates {
    cfg: NodeStateConfig,
    nodes_api: Api<Node>,
    /// What this process's Node writes returned (shared with the actor).
    fresh: FreshNodes,
    store: Store<Node>,
    leader: watch::Receiver<bool>,
    agents: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Agent>>>>,
    started: Instant,
    recorder: Recorder,
    events_tx: broadcast::Sender<(String, NodeEvent)>,
    /// Counters.
    pub counters: Counters,
}

impl std::fmt::Debug for NodeStates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeStates")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

fn ts(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

impl NodeStates {
    /// A node-state layer over a Node reflector `store`.
    pub fn new(
        cfg: NodeStateConfig,
        client: kube::Client,
        store: Store<Node>,
        leader: watch::Receiver<bool>,
        recorder: Recorder,
    ) -> Arc<Self> {
        let (events_tx, _) = broadcast::channel(4096);
        Arc::new(NodeStates {
            cfg,
            nodes_api: Api::all(client),
            fresh: FreshNodes::default(),
            store,
            leader,
            agents: Mutex::new(HashMap::new()),
            started: Instant::now(),
            recorder,
            events_tx,
            counters: Counters::default(),
        })
    }

    /// The newest Node objects this process's writes returned (the actor records its own here too).
    pub fn fresh(&self) -> &FreshNodes {
        &self.fresh
    }

    /// Every new node event (from agents or OCI Events), as `(node, event)`, once per id.
    pub fn subscribe_events(&self) -> broadcast::Receiver<(String, NodeEvent)> {
        self.events_tx.subscribe()
    }

    /// Queues a command for the agent on `node` (delivered with the next response until it reports a result).
    pub async fn queue_command(&self, node: &str, cmd: AgentCommand) {
        self.agent(node).lock().await.pending_commands.push(cmd);
    }

    /// The ids of the commands still sent to the agent on `node` (no result reported yet).
    pub async fn pending_commands(&self, node: &str) -> Vec<String> {
        let a = self.agent(node);
        let a = a.lock().await;
        a.pending_commands
            .iter()
            .map(|c| command_id(c).to_string())
            .collect()
    }

    fn is_leader(&self) -> bool {
        *self.leader.borrow()
    }

    fn agent(&self, node: &str) -> Arc<tokio::sync::Mutex<Agent>> {
        let mut m = crate::sync::lock(&self.agents);
        m.entry(node.to_string()).or_default().clone()
    }

    /// Handles an authenticated report (the caller checked `report.node`), `received` when its
    /// request arrived (for the `notice received` log line).
    pub async fn handle(
        &self,
        report: NodeReport,
        received: Instant,
    ) -> Result<ReportResponse, NodeStateError> {
        let node = report.node.clone();
        let entry = self.agent(&node);
        let mut a = entry.lock().await;
        if a.instance == report.agent_instance && report.sequence <= a.sequence {
            self.counters.replays.fetch_add(1, Ordering::Relaxed);
            let acked = acknowledged(&a, &report.events);
            return Ok(ReportResponse {
                accepted: false,
                acknowledged_events: acked,
                commands: vec![],
            });
        }
        self.counters.reports.fetch_add(1, Ordering::Relaxed);
        a.instance = report.agent_instance.clone();
        a.sequence = report.sequence;
        a.last_seen = Some(Instant::now());
        a.stale = false;
        a.conditions = report
            .conditions
            .iter()
            .filter(|c| c.condition_type.starts_with(&self.cfg.prefix))
            // An agent cannot set the engine's hold condition.
            .filter(|c| c.condition_type != crate::controller::policy::explain::CONDITION_TYPE)
            .cloned()
            .collect();
        let done: HashSet<&str> = report
            .command_results
            .iter()
            .map(|r| r.id.as_str())
            .collect();
        // A pending command's failure (an agent's refusal among them) is said once, as an Event.
        let mut failed: Vec<String> = report
            .command_results
            .iter()
            .filter(|r| !r.ok)
            .filter_map(|r| {
                let c = a.pending_commands.iter().find(|c| c.id() == r.id)?;
                Some(format!("{} {}: {}", c.type_name(), r.id, r.message))
            })
            .collect();
        a.pending_commands.retain(|c| !done.contains(command_id(c)));
        // A command type the agent does not run is never sent (it would fail on the whole answer).
        a.pending_commands.retain(|c| {
            let runs = report.runs(c.type_name());
            if !runs {
                failed.push(format!(
                    "{} {}: not sent: the node's agent ({}) does not run {} commands; upgrade it",
                    c.type_name(),
                    c.id(),
                    report.agent_version,
                    c.type_name()
                ));
            }
            runs
        });
        if !self.is_leader() {
            a.dirty = true;
            return Ok(ReportResponse {
                accepted: true,
                acknowledged_events: vec![],
                commands: vec![],
            });
        }
        // The engine first: a notice's cordon waits neither for the conditions' write nor for
        // the notice's Event (a failed write below is answered 503; the agent resends the
        // report, and its events, already handed over, are acknowledged once stored).
        let fresh = self.take_events(&node, &mut a, &report.events, received, true);
        let written = self.write_conditions(&node, &mut a, false).await;
        self.notice_events(&node, &mut a, &fresh).await;
        if let Err(e) = written {
            // The maintenance tick retries it even if the agent does not report again.
            a.dirty = true;
            return Err(e);
        }
        // Those over the notices' rate are not acknowledged: the agent sends them again.
        let acked = acknowledged(&a, &report.events);
        for ce in &report.check_events {
            if !self.admit_event(&node, &mut a).await {
                continue;
            }
            // The reason comes from the agent's rules: made a valid Event reason by the recorder.
            let type_ = match ce.severity {
                crate::wire::EventSeverity::Normal => EventType::Normal,
                crate::wire::EventSeverity::Warning => EventType::Warning,
            };
            self.recorder
                .check(&node, &ce.reason, type_, &ce.message)
                .await;
        }
        if let Some((reason, note)) = crio_event(a.crio_recorded, report.crio.as_ref()) {
            a.crio_recorded = report.crio.as_ref().map(|c| c.at);
            // An agent sets `at` itself: one node cannot flood the API with applies either.
            if self.admit_event(&node, &mut a).await {
                self.recorder
                    .node(&node, reason, "ApplyCrioConfig", &note)
                    .await;
            }
        }
        self.remove_requested_labels(&node, &report.label_removals)
            .await;
        for note in failed {
            tracing::warn!(%node, %note, "agent command failed");
            if self.admit_event(&node, &mut a).await {
                self.recorder
                    .node(&node, Reason::AgentCommandFailed, "AgentCommand", &note)
                    .await;
            }
        }
        Ok(ReportResponse {
            accepted: true,
            acknowledged_events: acked,
            commands: a.pending_commands.clone(),
        })
    }

    /// Whether `report` keeps within `[controller.report_limits]`; a refusal is counted. The
    /// report API calls it before [`Self::handle`], so nothing of a refused report is stored.
    pub fn check_limits(&self, report: &NodeReport) -> Result<(), Exceeded> {
        crate::controller::state::limits::check(report, &self.cfg.limits, &self.cfg.prefix)
            .inspect_err(|e| {
                if let Some(i) = Limit::ALL.iter().position(|l| *l == e.limit) {
                    self.counters.over_limit[i].fetch_add(1, Ordering::Relaxed);
                }
                tracing::warn!(node = %report.node, error = %e, "refused a report over a limit");
            })
    }

    /// Whether one more Event about `node` may be recorded now (`events_burst`/`events_every`).
    /// The first one refused in a stretch records an `EventsRateLimited` Event in its place.
    async fn admit_event(&self, node: &str, a: &mut Agent) -> bool {
        let l = &self.cfg.limits;
        if a.events
            .take(Instant::now(), l.events_burst, l.events_every)
        {
            a.events_limited = false;
            return true;
        }
        self.counters
            .events_suppressed
            .fetch_add(1, Ordering::Relaxed);
        if !a.events_limited {
            a.events_limited = true;
            let note = format!(
                "more than {} Events about this node in a burst: further ones are dropped until \
                 one per {} is left (events_burst, events_every); counted in \
                 nodekeeper_node_events_suppressed_total",
                l.events_burst,
                humantime::format_duration(l.events_every)
            );
            self.recorder
                .node(node, Reason::EventsRateLimited, "Record", &note)
                .await;
        }
        false
    }

    /// Marks each event not seen within the dedup window as seen, logs it (`notice received`,
    /// with the time since `received`: authentication, parsing and waiting for the node's
    /// previous report) and hands it to the engine at once; returns those (for
    /// [`Self::notice_events`]). With `limited` (a node's own report), new events past the
    /// node's notice rate are left untaken: not acknowledged, the agent sends them again.
    fn take_events<'e>(
        &self,
        node: &str,
        a: &mut Agent,
        events: &'e [NodeEvent],
        received: Instant,
        limited: bool,
    ) -> Vec<&'e NodeEvent> {
        let mut fresh = Vec::new();
        let l = &self.cfg.limits;
        let now = Instant::now();
        for ev in events {
            if a.seen_events.seen(&ev.id, now, l.event_dedup_window) {
                continue;
            }
            if limited && !a.notices.take(now, l.notices_burst, l.notices_every) {
                self.counters
                    .notices_deferred
                    .fetch_add(1, Ordering::Relaxed);
                continue;
            }
            tracing::info!(
                node,
                kind = ev.kind.name(),
                id = %ev.id,
                source = %ev.source,
                waited_ms = received.elapsed().as_millis() as u64,
                "notice received"
            );
            self.counters.node_events.fetch_add(1, Ordering::Relaxed);
            let _ = self.events_tx.send((node.to_string(), ev.clone()));
            a.seen_events.remember(&ev.id, now, l.event_dedup_window);
            fresh.push(ev);
        }
        fresh
    }

    /// A `Notice` Event on `node` for each of `events`.
    async fn notice_events(&self, node: &str, a: &mut Agent, events: &[&NodeEvent]) {
        for ev in events {
            if !self.admit_event(node, a).await {
                continue;
            }
            let reason = Reason::for_kind(&ev.kind);
            let mut note = format!("{} from {} (id {})", ev.kind.name(), ev.source, ev.id);
            if let Some(d) = ev.not_before {
                note.push_str(&format!(", not before {}", ts(d)));
            }
            self.recorder.node(node, reason, "Notice", &note).await;
        }
    }

    /// Records a node event from a central source (OCI Events); true when it was new.
    pub async fn ingest_event(&self, node: &str, ev: NodeEvent) -> bool {
        let received = Instant::now();
        let entry = self.agent(node);
        let mut a = entry.lock().await;
        let fresh = self.take_events(node, &mut a, std::slice::from_ref(&ev), received, false);
        self.notice_events(node, &mut a, &fresh).await;
        !fresh.is_empty()
    }

    /// The owned conditions currently on the Node in the cache.
    fn node_conditions(&self, node: &str) -> Vec<Value> {
        let key = kube::runtime::reflector::ObjectRef::<Node>::new(node);
        let Some(n) = self.store.get(&key) else {
            return vec![];
        };
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .map(|cs| {
                cs.iter()
                    .filter(|c| c.type_.starts_with(&self.cfg.prefix))
                    // The disruption engine's hold condition is not the agents' to remove.
                    .filter(|c| c.type_ != crate::controller::policy::explain::CONDITION_TYPE)
                    .filter_map(|c| serde_json::to_value(c).ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Writes the agent's conditions when they changed (or `force`, or the heartbeat interval passed).
    async fn write_conditions(
        &self,
        node: &str,
        a: &mut Agent,
        force: bool,
    ) -> Result<(), NodeStateError> {
        let on_node = self.node_conditions(node);
        let written = a.written.get_or_insert_with(|| {
            on_node
                .iter()
                .filter_map(|c| {
                    Some((
                        c.get("type")?.as_str()?.to_string(),
                        (
                            c.get("status")?.as_str()?.to_string(),
                            c.get("lastTransitionTime")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_string(),
                        ),
                    ))
                })
                .collect()
        });
        let now = ts(Utc::now());
        let mut next: BTreeMap<String, (String, String)> = BTreeMap::new();
        let mut items = Vec::new();
        let mut changed = force || a.dirty;
        for c in &a.conditions {
            let status = c.status.to_string();
            let transition = match written.get(&c.condition_type) {
                Some((s, t)) if *s == status && !t.is_empty() => t.clone(),
                _ => {
                    changed = true;
                    now.clone()
                }
            };
            items.push(
                json!({"type": c.condition_type, "status": status, "reason": c.reason,
                "message": c.message, "lastHeartbeatTime": now, "lastTransitionTime": transition}),
            );
            next.insert(c.condition_type.clone(), (status, transition));
        }
        let mut gone: HashSet<String> = written.keys().cloned().collect();
        gone.extend(
            on_node
                .iter()
                .filter_map(|c| c.get("type")?.as_str().map(str::to_string)),
        );
        for t in gone.iter().filter(|t| !next.contains_key(*t)) {
            changed = true;
            items.push(json!({"type": t, "$patch": "delete"}));
        }
        let due = a
            .written_at
            .is_none_or(|w| w.elapsed() >= self.cfg.heartbeat_write_interval);
        if !changed && !due {
            return Ok(());
        }
        self.patch_conditions(node, items).await?;
        a.written = Some(next);
        a.written_at = Some(Instant::now());
        a.dirty = false;
        Ok(())
    }

    async fn patch_conditions(&self, node: &str, items: Vec<Value>) -> Result<(), NodeStateError> {
        if items.is_empty() {
            return Ok(());
        }
        let patch = json!({"status": {"conditions": items}});
        let mut attempt = 0;
        loop {
            self.counters.node_writes.fetch_add(1, Ordering::Relaxed);
            let res = self
                .nodes_api
                .patch_status(node, &PatchParams::default(), &Patch::Strategic(&patch))
                .await;
            let source = match res {
                Ok(n) => {
                    self.fresh.record(n);
                    return Ok(());
                }
                Err(e) => e,
            };
            self.counters.write_failures.fetch_add(1, Ordering::Relaxed);
            attempt += 1;
            if attempt >= WRITE_ATTEMPTS || !transient(&source) {
                return Err(NodeStateError::Patch {
                    node: node.into(),
                    source,
                });
            }
            tracing::debug!(node, attempt, error = %source, "node status write failed; retrying");
            let pause = crate::backoff::delay(WRITE_RETRY_BASE, WRITE_RETRY_BASE * 4, attempt);
            tokio::time::sleep(pause).await;
        }
    }

    /// Removes `labels` from `node` (the caller checked the allow-list).
    pub(super) async fn remove_labels(
        &self,
        node: &str,
        labels: &[String],
    ) -> Result<(), NodeStateError> {
        let map: serde_json::Map<String, Value> =
            labels.iter().map(|l| (l.clone(), Value::Null)).collect();
        let patch = json!({"metadata": {"labels": map}});
        self.counters.node_writes.fetch_add(1, Ordering::Relaxed);
        let n = self
            .nodes_api
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| NodeStateError::Patch {
                node: node.into(),
                source,
            })?;
        self.fresh.record(n);
        Ok(())
    }

    /// Whether `node` currently has `label` (from the cache).
    pub(super) fn node_has_label(&self, node: &str, label: &str) -> bool {
        let key = kube::runtime::reflector::ObjectRef::<Node>::new(node);
        self.store
            .get(&key)
            .and_then(|n| n.metadata.labels.as_ref().map(|l| l.contains_key(label)))
            .unwrap_or(false)
    }

    pub(super) fn config(&self) -> &NodeStateConfig {
        &self.cfg
    }

    pub(super) fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    /// Events that could not be recorded (refused by the apiserver, unreachable, or invalid).
    pub fn recorder_failures(&self) -> u64 {
        self.recorder.failures.load(Ordering::Relaxed)
    }

    /// One maintenance pass (leader only): writes reports a follower kept, marks silent agents stale.
    pub async fn tick(&self) {
        if !self.is_leader() {
            return;
        }
        let agents: Vec<(String, Arc<tokio::sync::Mutex<Agent>>)> = {
            let m = crate::sync::lock(&self.agents);
            m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
        };
        let known: HashSet<String> = agents.iter().map(|(k, _)| k.clone()).collect();
        for (node, entry) in agents {
            let mut a = entry.lock().await;
            let silent = a.last_seen.unwrap_or(self.started).elapsed() > self.cfg.staleness;
            let res = if silent && !a.stale {
                self.mark_stale(&node, &mut a).await
            } else if a.dirty && !silent {
                self.write_conditions(&node, &mut a, true).await
            } else {
                Ok(())
            };
            if let Err(e) = res {
                tracing::warn!(node, error = %e, "node state write failed; will retry");
            }
        }
        if self.started.elapsed() > self.cfg.staleness {
            for n in self.store.state() {
                let name = n.metadata.name.clone().unwrap_or_default();
                if !known.contains(&name) && !self.node_conditions(&name).is_empty() {
                    self.agent(&name);
                }
            }
        }
        self.counters
            .maintenance_passes
            .fetch_add(1, Ordering::Relaxed);
    }

    async fn mark_stale(&self, node: &str, a: &mut Agent) -> Result<(), NodeStateError> {
        let on_node = self.node_conditions(node);
        if on_node.is_empty() {
            a.stale = true;
            return Ok(());
        }
        let now = ts(Utc::now());
        let silent_for = a.last_seen.unwrap_or(self.started).elapsed().as_secs();
        let msg = format!("no report from the nodekeeper agent for {silent_for}s");
        let items: Vec<Value> = on_node
            .iter()
            .filter_map(|c| {
                let t = c.get("type")?.as_str()?;
                let same = c.get("status").and_then(Value::as_str) == Some("Unknown");
                let transition = if same {
                    c.get("lastTransitionTime").cloned().unwrap_or(json!(now))
                } else {
                    json!(now)
                };
                Some(
                    json!({"type": t, "status": "Unknown", "reason": STALE_REASON, "message": msg,
                    "lastHeartbeatTime": now, "lastTransitionTime": transition}),
                )
            })
            .collect();
        self.patch_conditions(node, items).await?;
        self.counters.stale_marked.fetch_add(1, Ordering::Relaxed);
        a.stale = true;
        a.written = None;
        a.conditions = a
            .conditions
            .iter()
            .map(|c| {
                CheckResult::new(
                    c.condition_type.clone(),
                    ConditionStatus::Unknown,
                    STALE_REASON,
                    msg.clone(),
                )
            })
            .collect();
        self.recorder
            .node(node, Reason::AgentSilent, "MarkUnknown", &msg)
            .await;
        Ok(())
    }

    /// How often [`run_maintenance`](Self::run_maintenance) ticks for `staleness`: a quarter of
    /// it (a silent agent is marked at most a quarter late), between 100 ms and 5 s.
    pub fn maintenance_period(staleness: Duration) -> Duration {
        (staleness / 4).clamp(Duration::from_millis(100), Duration::from_secs(5))
    }

    /// Runs [`tick`](Self::tick) every `period` until `cancel`.
    pub async fn run_maintenance(
        self: Arc<Self>,
        period: Duration,
        cancel: tokio_util::sync::CancellationToken,
    ) {
        let mut iv = tokio::time::interval(period);
        iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = iv.tick() => self.tick().await,
            }
        }
    }

    /// Executes the allowed removals on `node` and records Events for both outcomes.
    pub async fn remove_requested_labels(&self, node: &str, requests: &[LabelRemoval]) {
        if requests.is_empty() {
            return;
        }
        let (ok, denied) = super::labels::partition(&self.config().label_allow, requests);
        let present: Vec<String> = ok
            .into_iter()
            .filter(|l| self.node_has_label(node, l))
            .collect();
        for l in &denied {
            self.recorder()
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
        match self.remove_labels(node, &present).await {
            Ok(()) => {
                self.counters
                    .labels_removed
                    .fetch_add(present.len() as u64, std::sync::atomic::Ordering::Relaxed);
                for r in requests.iter().filter(|r| present.contains(&r.label)) {
                    self.recorder()
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
}

fn command_id(c: &AgentCommand) -> &str {
    c.id()
}

/// The ids of `events` the node's agent has handed over for good (seen, so never handled again).
fn acknowledged(a: &Agent, events: &[NodeEvent]) -> Vec<String> {
    events
        .iter()
        .filter(|e| a.seen_events.contains(&e.id))
        .map(|e| e.id.clone())
        .collect()
}

/// The Event a report's CRI-O apply calls for: a failed or rolled-back apply, or one whose keys the
/// running CRI-O ignores, not recorded yet (each apply once, by its time; the agent resends its
/// last apply with every report).
fn crio_event(
    recorded: Option<DateTime<Utc>>,
    crio: Option<&CrioReport>,
) -> Option<(Reason, String)> {
    let c = crio?;
    if recorded == Some(c.at) {
        return None;
    }
    let why = c.message.as_deref().unwrap_or("no message");
    match c.result {
        CrioResult::RolledBack => Some((
            Reason::CrioConfigRolledBack,
            format!(
                "CRI-O refused the new drop-ins; the previous ones are back (unit {}): {why}",
                c.unit_state
            ),
        )),
        CrioResult::Failed => Some((
            Reason::CrioConfigFailed,
            format!("CRI-O drop-ins not applied (unit {}): {why}", c.unit_state),
        )),
        CrioResult::Ok | CrioResult::NoChange if !c.ignored.is_empty() => Some((
            Reason::CrioConfigIgnored,
            format!(
                "the running CRI-O does not take every drop-in key: {}",
                c.ignored.join("; ")
            ),
        )),
        CrioResult::Ok | CrioResult::NoChange => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::REPORT_VERSION;
    use kube::runtime::{reflector, watcher};

    const S: fn(u64) -> Duration = Duration::from_secs;
    const PREFIX: &str = "Nodekeeper";

    /// A rolled-back or failed apply is recorded once per apply (by its time), with the agent's
    /// message (unit, job result, files, CRI-O's own line); a good apply never.
    #[test]
    fn a_crio_apply_that_failed_is_one_event_per_apply() {
        let at = |s: i64| DateTime::<Utc>::from_timestamp(s, 0).unwrap();
        let report = |result, t| {
            CrioReport {
            config_hash: "h".into(),
            result,
            unit_state: "active".into(),
            message: Some("restart of crio.service failed (job result: failed, unit failed); crio.service said: level=fatal msg=x; rolled back /etc/crio/crio.conf.d/30-x.conf".into()),
            ignored: vec![],
            at: at(t),
        }
        };
        let rolled = report(CrioResult::RolledBack, 1);
        let (reason, note) = crio_event(None, Some(&rolled)).unwrap();
        assert_eq!(reason, Reason::CrioConfigRolledBack);
        assert_eq!(reason.event_type(), EventType::Warning);
        assert!(
            note.contains("30-x.conf")
                && note.contains("level=fatal")
                && note.contains("unit active"),
            "{note}"
        );
        assert_eq!(crio_event(Some(at(1)), Some(&rolled)), None, "resent: once");
        let failed = report(CrioResult::Failed, 2);
        assert_eq!(
            crio_event(Some(at(1)), Some(&failed)).unwrap().0,
            Reason::CrioConfigFailed
        );
        for ok in [CrioResult::Ok, CrioResult::NoChange] {
            assert_eq!(crio_event(None, Some(&report(ok, 3))), None);
            let mut ignoring = report(ok, 4);
            ignoring.ignored = vec!["11-default.conf sets crio.image.short_name_mode = \"enforcing\", but the running CRI-O does not know the key".into()];
            let (reason, note) = crio_event(None, Some(&ignoring)).unwrap();
            assert_eq!(reason, Reason::CrioConfigIgnored);
            assert!(note.contains("short_name_mode"), "{note}");
            assert_eq!(crio_event(Some(at(4)), Some(&ignoring)), None);
        }
        assert_eq!(crio_event(None, None), None);
    }

    /// A kube client whose API server answers every request with the Node `n1`, a PATCH of
    /// Node status after `status_delay`; counts those PATCHes.
    fn client(status_delay: Duration) -> (kube::Client, Arc<AtomicU64>) {
        let patches = Arc::new(AtomicU64::new(0));
        let seen = patches.clone();
        let svc = tower::service_fn(move |req: hyper::Request<kube::client::Body>| {
            let status = req.method() == "PATCH" && req.uri().path().ends_with("/status");
            if status {
                seen.fetch_add(1, Ordering::SeqCst);
            }
            async move {
                if status {
                    tokio::time::sleep(status_delay).await;
                }
                hyper::Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(
                        serde_json::to_vec(&node_json()).unwrap_or_default(),
                    ))
            }
        });
        (kube::Client::new(svc, "default"), patches)
    }

    fn node_json() -> Value {
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
            "status": {"conditions": [{"type": "NodekeeperDiskPressure", "status": "False",
                "reason": "Fine", "message": "ok", "lastTransitionTime": "2026-01-01T00:00:00Z",
                "lastHeartbeatTime": "2026-01-01T00:00:00Z"}]}})
    }

    fn report(sequence: u64) -> NodeReport {
        NodeReport {
            version: REPORT_VERSION,
            node: "n1".into(),
            agent_version: "test".into(),
            agent_instance: "i1".into(),
            sequence,
            boot_id: "b".into(),
            generated_at: Utc::now(),
            identity: None,
            conditions: vec![CheckResult::new(
                "NodekeeperDiskPressure",
                ConditionStatus::False,
                "Fine",
                "ok",
            )],
            check_events: vec![],
            events: vec![],
            crio: None,
            label_removals: vec![],
            command_results: vec![],
            problems: vec![],
            command_types: vec![],
        }
    }

    fn states(staleness: Duration, heartbeat: Duration) -> (Arc<NodeStates>, Arc<AtomicU64>) {
        states_slow(staleness, heartbeat, Duration::ZERO)
    }

    /// [`states`] whose API server answers a Node status PATCH after `status_delay`.
    fn states_slow(
        staleness: Duration,
        heartbeat: Duration,
        status_delay: Duration,
    ) -> (Arc<NodeStates>, Arc<AtomicU64>) {
        let (client, patches) = client(status_delay);
        let (store, mut writer) = reflector::store::<Node>();
        let node: Node = serde_json::from_value(node_json()).unwrap();
        writer.apply_watcher_event(&watcher::Event::Apply(node));
        // (the receiver keeps its last value when the sender is gone)
        let (_, leader) = watch::channel(true);
        let recorder = Recorder::new(client.clone(), "test", None);
        let cfg = NodeStateConfig {
            prefix: PREFIX.into(),
            staleness,
            heartbeat_write_interval: heartbeat,
            label_allow: vec![],
            limits: ReportLimits::default(),
        };
        (
            NodeStates::new(cfg, client, store, leader, recorder),
            patches,
        )
    }

    fn stale_marked(s: &NodeStates) -> u64 {
        s.counters.stale_marked.load(Ordering::SeqCst)
    }

    /// A `restart_unit` command goes only to an agent that lists it in `command_types`; an
    /// older agent's is dropped (said by an `AgentCommandFailed` Event), its reboot still sent.
    #[tokio::test(start_paused = true)]
    async fn a_command_type_the_agent_does_not_run_is_never_sent() {
        let (s, _) = states(S(60), S(3600));
        let restart = AgentCommand::RestartUnit {
            id: "n1/restart-unit/kubelet.service/t".into(),
            unit: "kubelet.service".into(),
            reason: "repair:Ready=False".into(),
        };
        let reboot = AgentCommand::Reboot {
            id: "n1/reboot/t".into(),
            reason: "repair:Ready=False".into(),
        };
        s.queue_command("n1", restart.clone()).await;
        s.queue_command("n1", reboot.clone()).await;
        let old = s.handle(report(1), Instant::now()).await.unwrap();
        assert_eq!(old.commands, vec![reboot.clone()]);
        let again = s.handle(report(2), Instant::now()).await.unwrap();
        assert_eq!(again.commands, vec![reboot], "dropped, not kept for later");
        // An agent that runs it gets it, until it reports a result (here a refusal).
        s.queue_command("n1", restart.clone()).await;
        let mut now = report(3);
        now.command_types = crate::wire::COMMAND_TYPES
            .iter()
            .map(|t| t.to_string())
            .collect();
        now.command_results = vec![crate::wire::CommandResult {
            id: "n1/reboot/t".into(),
            ok: true,
            message: String::new(),
        }];
        let r = s.handle(now.clone(), Instant::now()).await.unwrap();
        assert_eq!(r.commands, vec![restart.clone()]);
        now.sequence = 4;
        now.command_results = vec![crate::wire::CommandResult {
            id: restart.id().into(),
            ok: false,
            message: "refused: kubelet.service is not in this agent's [agent] restart_units".into(),
        }];
        let r = s.handle(now, Instant::now()).await.unwrap();
        assert!(r.commands.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_agent_is_marked_stale_just_after_staleness_once() {
        let (s, _) = states(S(60), S(3600));
        s.handle(report(1), Instant::now()).await.unwrap();
        tokio::time::advance(S(60)).await;
        s.tick().await;
        assert_eq!(
            stale_marked(&s),
            0,
            "silent for exactly `staleness`: not yet"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        s.tick().await;
        assert_eq!(stale_marked(&s), 1, "silent for longer: marked");
        tokio::time::advance(S(600)).await;
        s.tick().await;
        assert_eq!(stale_marked(&s), 1, "marked once, not on every tick");
        // A report clears it; the silence counts again from that report.
        s.handle(report(2), Instant::now()).await.unwrap();
        tokio::time::advance(S(59)).await;
        s.tick().await;
        assert_eq!(stale_marked(&s), 1);
        tokio::time::advance(S(2)).await;
        s.tick().await;
        assert_eq!(stale_marked(&s), 2);
    }

    /// The maintenance loop ticks every quarter of `staleness` (5 s for 20 s): an agent silent
    /// since t = 0 is marked at the first tick past 20 s, i.e. at 25 s, not before.
    #[tokio::test(start_paused = true)]
    async fn maintenance_ticks_every_quarter_of_the_staleness() {
        assert_eq!(NodeStates::maintenance_period(S(20)), S(5));
        assert_eq!(NodeStates::maintenance_period(S(3600)), S(5));
        assert_eq!(
            NodeStates::maintenance_period(S(0)),
            Duration::from_millis(100)
        );
        let (s, _) = states(S(20), S(3600));
        s.handle(report(1), Instant::now()).await.unwrap();
        let cancel = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(
            s.clone()
                .run_maintenance(NodeStates::maintenance_period(S(20)), cancel.clone()),
        );
        tokio::time::sleep(Duration::from_millis(24_900)).await;
        assert_eq!(stale_marked(&s), 0, "no tick between 20 s and 24.9 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(stale_marked(&s), 1, "the tick at 25 s marks it");
        cancel.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_never_heard_from_counts_from_the_controllers_start() {
        let (s, _) = states(S(30), S(3600));
        // The Node has nodekeeper conditions, but no agent reported since the start.
        tokio::time::advance(S(30)).await;
        s.tick().await; // not past `staleness` since the start: nothing
        s.tick().await;
        assert_eq!(stale_marked(&s), 0);
        tokio::time::advance(Duration::from_millis(1)).await;
        s.tick().await; // adopts it
        s.tick().await; // marks it
        assert_eq!(stale_marked(&s), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn unchanged_conditions_are_rewritten_after_the_heartbeat_interval() {
        let (s, patches) = states(S(3600), S(60));
        s.handle(report(1), Instant::now()).await.unwrap();
        let first = patches.load(Ordering::SeqCst);
        assert_eq!(first, 1, "the first report is written");
        tokio::time::advance(S(59)).await;
        s.handle(report(2), Instant::now()).await.unwrap();
        assert_eq!(
            patches.load(Ordering::SeqCst),
            1,
            "unchanged within the interval"
        );
        tokio::time::advance(S(1)).await;
        s.handle(report(3), Instant::now()).await.unwrap();
        assert_eq!(
            patches.load(Ordering::SeqCst),
            2,
            "unchanged, but the interval passed"
        );
    }

    /// A notice reaches the engine before the report's condition write is answered: a slow
    /// status PATCH does not delay the cordon.
    #[tokio::test(start_paused = true)]
    async fn a_notice_reaches_the_engine_before_the_condition_write_is_answered() {
        let (s, patches) = states_slow(S(60), S(3600), S(1));
        let mut engine = s.subscribe_events();
        let mut r = report(1);
        r.conditions[0].status = ConditionStatus::True;
        r.events = vec![NodeEvent::on_node(
            crate::wire::EventKind::Preemption,
            "test",
            "k",
            Utc::now(),
        )];
        let id = r.events[0].id.clone();
        let start = Instant::now();
        let handled = tokio::spawn({
            let s = s.clone();
            async move { s.handle(r, Instant::now()).await }
        });
        let (node, ev) = engine.recv().await.unwrap();
        assert_eq!((node.as_str(), ev.id.as_str()), ("n1", id.as_str()));
        assert_eq!(start.elapsed(), Duration::ZERO, "handed over at once");
        assert!(
            !handled.is_finished(),
            "the condition write is still in flight"
        );
        let resp = handled.await.unwrap().unwrap();
        assert_eq!(start.elapsed(), S(1), "answered after the write");
        assert_eq!(patches.load(Ordering::SeqCst), 1);
        assert_eq!(resp.acknowledged_events, vec![id]);
    }
}

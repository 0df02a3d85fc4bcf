//! The model of `nodekeeper status`: one [`NodeStatus`] row per Node, computed from its labels,
//! annotations and `spec.unschedulable` (pure), and [`list_rows`], the only part that talks to
//! the API server (a paginated list of Nodes).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use serde::Serialize;

use crate::controller::policy::budget::{GroupBudgets, Origin, Reason};
use crate::controller::policy::config::{BudgetsConfig, BudgetsSource, LadderStep, RepairStep};
use crate::controller::policy::explain::{group_name, Blocker, Held};
use crate::controller::policy::nodepool::PoolBudgets;
use crate::controller::policy::view::{keys, Record, State};

/// Errors listing the nodes; each names the server involved.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// Listing Nodes failed (unreachable, forbidden...).
    #[error("cannot list nodes from the API server {server}: {source}")]
    List {
        /// API server URL.
        server: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// Listing NodePools failed (`--config` with `[budgets] source = "nodepool"`).
    #[error("cannot list karpenter.sh/v1 nodepools from the API server {server} ([budgets] source = \"nodepool\"): {source}")]
    ListNodePools {
        /// API server URL.
        server: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

/// One budget in force for a group (`nodekeeper status --config`; one element of the JSON
/// `budgets` array).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BudgetStatus {
    /// Group (`""`: nodes without the group label).
    pub group: String,
    /// `config` or `NodePool <name>` (`NodePool <name> (invalid)`: the group is held).
    pub source: String,
    /// Index in its source's list (the configured list, or `spec.disruption.budgets`).
    pub index: usize,
    /// `"1"`, `"10%"`.
    pub nodes: String,
    /// Cron schedule, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// Window length (`14h`), with `schedule`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    /// Time zone of the schedule (`UTC` when a schedule has none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// Reasons it is limited to (empty: all).
    pub reasons: Vec<String>,
    /// Active now.
    pub active: bool,
    /// Nodes it allows disrupted at once now for a repair (resolved against the group's size),
    /// when it is active and applies to repairs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repair_max: Option<usize>,
    /// Why the NodePool is refused (then the group is held).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// The budgets in force per group of `rows` (groups sorted, `""` for nodes without the label),
/// from `cfg` and, with `source = "nodepool"`, the NodePools' budgets `pools`.
pub fn budget_rows(
    rows: &[NodeStatus],
    cfg: &BudgetsConfig,
    pools: &BTreeMap<String, PoolBudgets>,
    now: DateTime<Utc>,
) -> Vec<BudgetStatus> {
    let mut sizes: BTreeMap<String, usize> = BTreeMap::new();
    for r in rows {
        *sizes
            .entry(r.group.clone().unwrap_or_default())
            .or_default() += 1;
    }
    let mut out = Vec::new();
    for (group, total) in sizes {
        let g = GroupBudgets::in_force(&group, cfg, pools);
        for e in g.entries() {
            let active = e.is_active(now);
            let b = &e.budget;
            out.push(BudgetStatus {
                group: group.clone(),
                source: e.origin.describe(),
                index: e.index,
                nodes: b.nodes.to_string(),
                schedule: b.schedule.clone(),
                duration: b
                    .duration
                    .map(|d| humantime::format_duration(d).to_string()),
                timezone: b
                    .schedule
                    .as_ref()
                    .map(|_| b.timezone.clone().unwrap_or_else(|| "UTC".into())),
                reasons: b.reasons.clone(),
                active,
                repair_max: (active && e.applies_to(Reason::Repair))
                    .then(|| b.nodes.resolve(total, true)),
                problem: match &e.origin {
                    Origin::InvalidNodePool(err) => Some(format!("{}: {}", err.path, err.problem)),
                    _ => None,
                },
            });
        }
    }
    out
}

/// Lists the NodePools' budgets when `cfg` reads them (`source = "nodepool"`), else none.
pub async fn list_nodepools(
    client: kube::Client,
    server: &str,
    cfg: &BudgetsConfig,
) -> Result<BTreeMap<String, PoolBudgets>, StatusError> {
    if cfg.source != BudgetsSource::NodePool {
        return Ok(BTreeMap::new());
    }
    let api: Api<kube::core::DynamicObject> = Api::all_with(
        client,
        &crate::controller::state::nodepools::nodepool_resource(),
    );
    let list =
        api.list(&ListParams::default())
            .await
            .map_err(|source| StatusError::ListNodePools {
                server: server.to_string(),
                source,
            })?;
    Ok(list
        .items
        .iter()
        .filter_map(|o| {
            let name = o.metadata.name.clone()?;
            let b = crate::controller::policy::nodepool::read_budgets(
                &name,
                o.data.pointer("/spec/disruption/budgets"),
            );
            Some((name, b))
        })
        .collect())
}

/// Who cordoned a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CordonedBy {
    /// nodekeeper (it will uncordon).
    Nodekeeper,
    /// Someone else: never undone by nodekeeper.
    Admin,
}

/// The notice being handled, as shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NoticeStatus {
    /// Kind (`preemption`, `maintenance`, ...).
    pub kind: String,
    /// Event id.
    pub id: String,
    /// When the announced action happens.
    pub at: DateTime<Utc>,
}

/// A hold, as shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HoldStatus {
    /// CamelCase reason (as in the `NodekeeperHeld` condition).
    pub reason: &'static str,
    /// One line for people.
    pub message: String,
    /// Since when.
    pub since: DateTime<Utc>,
    /// The blocker as published in `nodekeeper.io/blocked` (`kind` plus its fields).
    pub blocker: Blocker,
}

/// What nodekeeper does next with a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Next {
    /// In words.
    pub action: String,
    /// When (a deadline, a window opening, an announced notice), if known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at: Option<DateTime<Utc>>,
}

/// One row of `nodekeeper status` (and one element of the JSON `nodes` array).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeStatus {
    /// Node name.
    pub name: String,
    /// Value of the group label, if set.
    pub group: Option<String>,
    /// `idle`, `interrupted`, `cordoned` or `repairing`.
    pub state: &'static str,
    /// When the state (or, for an idle node, the hold) began.
    pub since: Option<DateTime<Utc>>,
    /// Recorded reason (`repair:Ready=False`, `interruption:preemption`).
    pub reason: Option<String>,
    /// Current repair step (`drain`, `reboot`, `replace`).
    pub repair_step: Option<String>,
    /// When that step began.
    pub repair_step_since: Option<DateTime<Utc>>,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// Who cordoned it, when it is cordoned.
    pub cordoned_by: Option<CordonedBy>,
    /// When a replacement was requested.
    pub replacement_requested: Option<DateTime<Utc>>,
    /// The interruption notice being handled.
    pub interruption: Option<NoticeStatus>,
    /// Why nodekeeper holds it back.
    pub held: Option<HoldStatus>,
    /// The raw `nodekeeper.io/blocked` value when it could not be read (e.g. written by a newer
    /// controller); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_unreadable: Option<String>,
    /// What happens next.
    pub next: Option<Next>,
}

impl NodeStatus {
    /// A row from a node's name, labels, annotations and `spec.unschedulable`.
    pub fn from_parts(
        name: &str,
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
        unschedulable: bool,
        group_label: &str,
    ) -> Self {
        let rec = Record::from_annotations(annotations);
        let held = rec.held.as_ref().map(hold_status);
        let since = rec.since.or(held.as_ref().map(|h| h.since));
        NodeStatus {
            name: name.to_string(),
            group: labels.get(group_label).cloned(),
            state: rec.state.name().unwrap_or("idle"),
            since,
            reason: rec.reason.clone(),
            repair_step: rec.step.map(|step| {
                LadderStep {
                    step,
                    unit: rec.step_unit.clone(),
                    timeout: None,
                }
                .label()
            }),
            repair_step_since: rec.step_since,
            unschedulable,
            cordoned_by: match (unschedulable, rec.cordoned_by_us) {
                (false, _) => None,
                (true, true) => Some(CordonedBy::Nodekeeper),
                (true, false) => Some(CordonedBy::Admin),
            },
            replacement_requested: rec.replacement_requested,
            interruption: rec.notice.as_ref().map(|n| NoticeStatus {
                kind: n.kind.name().to_string(),
                id: n.id.clone(),
                at: n.at,
            }),
            next: next(&rec),
            held_unreadable: match (&held, annotations.get(keys::BLOCKED)) {
                (None, Some(raw)) => Some(raw.clone()),
                _ => None,
            },
            held,
        }
    }

    /// A row from a Node object.
    pub fn from_node(node: &Node, group_label: &str) -> Self {
        let empty = BTreeMap::new();
        let m = &node.metadata;
        NodeStatus::from_parts(
            m.name.as_deref().unwrap_or_default(),
            m.labels.as_ref().unwrap_or(&empty),
            m.annotations.as_ref().unwrap_or(&empty),
            node.spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false),
            group_label,
        )
    }

    /// nodekeeper holds the node back (readable or not).
    pub fn is_held(&self) -> bool {
        self.held.is_some() || self.held_unreadable.is_some()
    }

    /// nodekeeper is acting on the node (its state is not idle).
    pub fn acting(&self) -> bool {
        self.state != "idle"
    }
}

fn hold_status(h: &Held) -> HoldStatus {
    HoldStatus {
        reason: h.blocker.reason(),
        message: h.blocker.message(),
        since: h.since,
        blocker: h.blocker.clone(),
    }
}

fn next_at(action: String, at: Option<DateTime<Utc>>) -> Option<Next> {
    Some(Next { action, at })
}

/// What nodekeeper does next, from its record.
pub fn next(rec: &Record) -> Option<Next> {
    match &rec.held {
        Some(h) => next_when_held(&h.blocker),
        None => next_when_free(rec),
    }
}

fn next_when_held(b: &Blocker) -> Option<Next> {
    match b {
        Blocker::Pdb { pod, pdb, deadline } => {
            next_at(format!("evict {pod} once PDB {pdb} allows"), *deadline)
        }
        Blocker::DoNotDisrupt { pod, deadline } => next_at(
            format!("evict {pod} once its do-not-disrupt annotation is removed"),
            *deadline,
        ),
        Blocker::DoNotRepair { annotation } => {
            next_at(format!("repair once {annotation} is removed"), None)
        }
        Blocker::KarpenterDisrupting => next_at("none: Karpenter replaces the node".into(), None),
        Blocker::Budget {
            opens_at: Some(t), ..
        } => next_at("start when the budget window opens".into(), Some(*t)),
        Blocker::Budget { group, .. } => next_at(
            format!(
                "start when a disruption in group {} finishes",
                group_name(group)
            ),
            None,
        ),
        Blocker::NodePool { nodepool, .. } => next_at(
            format!("start when NodePool {nodepool}'s budgets are valid again"),
            None,
        ),
        Blocker::ShortCircuit {
            group,
            max_unhealthy,
            ..
        } => next_at(
            format!(
                "repair when at most {max_unhealthy} of group {} are unhealthy",
                group_name(group)
            ),
            None,
        ),
        Blocker::Deadline { .. } | Blocker::StartupRetries { .. } => {
            next_at("none: needs an operator".into(), None)
        }
        Blocker::ReplacementPending { .. } => {
            next_at("wait for the node to be replaced".into(), None)
        }
        Blocker::UntrustedCondition { condition, step } => next_at(
            format!("release when {condition} clears; {step} needs its policy's allow_destructive or an operator"),
            None,
        ),
        Blocker::RepairPolicy { .. } => next_at(
            "none: the repair policy takes no action (needs an operator, or the condition to clear)".into(),
            None,
        ),
    }
}

fn next_when_free(rec: &Record) -> Option<Next> {
    if rec.retire_requested && rec.state != State::Idle {
        // Drained and handed over: the provider takes the node away (`karpenter`: the NodeClaim
        // is deleted, Karpenter's termination removes the instance and the Node).
        return next_at(
            "wait for the provider to remove the node (drain over, handed over)".into(),
            None,
        );
    }
    match rec.state {
        State::Idle => None,
        State::Interrupted => {
            let kind = rec
                .notice
                .as_ref()
                .map_or("interruption", |n| n.kind.name());
            let at = rec.notice.as_ref().map(|n| n.at);
            let what = if rec.replacement_requested.is_some() {
                "finish the drain"
            } else {
                "drain and request a replacement"
            };
            next_at(format!("{what} before the {kind}"), at)
        }
        State::Cordoned => next_at("uncordon when the notice is cancelled".into(), None),
        State::Repairing => next_at(repair_next(rec).into(), None),
    }
}

fn repair_next(rec: &Record) -> &'static str {
    match (rec.step, rec.replacement_requested) {
        (Some(RepairStep::RestartUnit), _) => {
            "wait for the condition to clear after the unit's restart, else the next repair step"
        }
        (Some(RepairStep::Reboot), _) => "wait for the reboot (a new boot id)",
        (Some(RepairStep::None), _) => "none: the repair policy takes no action",
        (Some(RepairStep::Replace), Some(_)) => "wait for the replacement node",
        (Some(RepairStep::Replace), None) => "request a replacement",
        _ => "drain, then the next repair step",
    }
}

/// The figures of the summary line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Nodes listed.
    pub nodes: usize,
    /// Nodes nodekeeper is acting on.
    pub acting: usize,
    /// Nodes held back (with a blocker).
    pub held: usize,
}

impl Summary {
    /// Counts `rows`.
    pub fn of(rows: &[NodeStatus]) -> Self {
        Summary {
            nodes: rows.len(),
            acting: rows.iter().filter(|r| r.acting()).count(),
            held: rows.iter().filter(|r| r.is_held()).count(),
        }
    }
}

/// Lists the nodes of `server` (paginated, `chunk` per request; only those matching `selector`)
/// and builds the rows, sorted by name; `group_label` names a node's group.
pub async fn list_rows(
    client: kube::Client,
    server: &str,
    selector: Option<&str>,
    chunk: u32,
    group_label: &str,
) -> Result<Vec<NodeStatus>, StatusError> {
    let nodes = list_nodes(client, server, selector, chunk).await?;
    let mut rows: Vec<NodeStatus> = nodes
        .iter()
        .map(|n| NodeStatus::from_node(n, group_label))
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(rows)
}

async fn list_nodes(
    client: kube::Client,
    server: &str,
    selector: Option<&str>,
    chunk: u32,
) -> Result<Vec<Node>, StatusError> {
    let api: Api<Node> = Api::all(client);
    let mut lp = ListParams::default().limit(chunk);
    if let Some(s) = selector {
        lp = lp.labels(s);
    }
    let mut out = Vec::new();
    loop {
        let page = api.list(&lp).await.map_err(|source| StatusError::List {
            server: server.to_string(),
            source,
        })?;
        out.extend(page.items);
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => return Ok(out),
        }
    }
}

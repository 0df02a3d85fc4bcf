//! `nodekeeper status`: what nodekeeper is doing with each Node and what holds it back, read
//! back from the annotations the controller writes (see [`keys`] and docs/status.md).
//!
//! The pure part ([`NodeStatus::from_parts`], [`render`]) turns annotations into rows and rows
//! into text or JSON; the kube part ([`list_rows`]) only lists Nodes (paginated). The command
//! (arguments, exit codes, printing) is the binary's `cli::status`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use serde::Serialize;

use super::policy::budget::{in_zone, GroupBudgets, Origin, Reason};
use super::policy::config::{BudgetsConfig, BudgetsSource};
use super::policy::explain::{group_name, Blocker, Held};
use super::policy::nodepool::PoolBudgets;
use super::policy::view::{keys, Record, State};
use crate::controller::policy::config::RepairStep;

/// Version of the JSON document printed by `-o json`; bumped on any incompatible change.
pub const SCHEMA_VERSION: u32 = 1;
/// Output formats of `nodekeeper status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusOutput {
    /// NODE GROUP STATE BLOCKER SINCE NEXT.
    Text,
    /// The table plus REASON, STEP, NOTICE and REPLACEMENT.
    Wide,
    /// One JSON document (schema version 1, described in docs/status.md).
    Json,
}

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
    let api: Api<kube::core::DynamicObject> =
        Api::all_with(client, &super::nodepools::nodepool_resource());
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
            let b = super::policy::nodepool::read_budgets(
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
    pub repair_step: Option<&'static str>,
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
            repair_step: rec.step.map(RepairStep::name),
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
    }
}

fn next_when_free(rec: &Record) -> Option<Next> {
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
        (Some(RepairStep::Reboot), _) => "wait for the reboot (a new boot id)",
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

/// The JSON document of `-o json`.
#[derive(Debug, Serialize)]
pub struct StatusDocument<'a> {
    /// [`SCHEMA_VERSION`].
    pub version: u32,
    /// When it was produced.
    pub generated_at: DateTime<Utc>,
    /// Counts.
    pub summary: Summary,
    /// One element per node, sorted by name.
    pub nodes: &'a [NodeStatus],
    /// The budgets in force per group (only with `--config`).
    #[serde(skip_serializing_if = "<[BudgetStatus]>::is_empty")]
    pub budgets: &'a [BudgetStatus],
}

/// Renders `rows` (sorted by name by the caller) as of `now`.
pub fn render(rows: &[NodeStatus], output: StatusOutput, now: DateTime<Utc>) -> String {
    render_with_budgets(rows, &[], output, now)
}

/// As [`render`], followed by the budgets in force (`--config`; nothing when `budgets` is empty).
pub fn render_with_budgets(
    rows: &[NodeStatus],
    budgets: &[BudgetStatus],
    output: StatusOutput,
    now: DateTime<Utc>,
) -> String {
    match output {
        StatusOutput::Json => {
            let doc = StatusDocument {
                version: SCHEMA_VERSION,
                generated_at: now,
                summary: Summary::of(rows),
                nodes: rows,
                budgets,
            };
            let mut s = serde_json::to_string_pretty(&doc).unwrap_or_default();
            s.push('\n');
            s
        }
        StatusOutput::Text | StatusOutput::Wide => {
            let mut s = render_table(rows, output == StatusOutput::Wide, now);
            if !budgets.is_empty() {
                s.push('\n');
                s.push_str(&render_budgets(budgets));
            }
            s
        }
    }
}

/// `GROUP SOURCE BUDGET NODES WINDOW REASONS ACTIVE ALLOWS`, then one line per refused NodePool.
fn render_budgets(budgets: &[BudgetStatus]) -> String {
    let dash = || "-".to_string();
    let mut table = vec![[
        "GROUP", "SOURCE", "BUDGET", "NODES", "WINDOW", "REASONS", "ACTIVE", "ALLOWS",
    ]
    .iter()
    .map(|h| h.to_string())
    .collect::<Vec<_>>()];
    for b in budgets {
        table.push(vec![
            group_name(&b.group).to_string(),
            b.source.clone(),
            format!("#{}", b.index),
            b.nodes.clone(),
            match (&b.schedule, &b.duration) {
                (Some(s), Some(d)) => {
                    format!("{s} for {d} ({})", b.timezone.as_deref().unwrap_or("UTC"))
                }
                _ => "always".to_string(),
            },
            if b.reasons.is_empty() {
                "all".to_string()
            } else {
                b.reasons.join(",")
            },
            if b.active { "yes" } else { "no" }.to_string(),
            b.repair_max.map_or_else(dash, |n| n.to_string()),
        ]);
    }
    let mut out = align(&table);
    for b in budgets {
        if let Some(p) = &b.problem {
            out.push_str(&format!(
                "{}: {p}: disruptions of group {} are held\n",
                b.source.trim_end_matches(" (invalid)"),
                group_name(&b.group)
            ));
        }
    }
    out
}

fn render_table(rows: &[NodeStatus], wide: bool, now: DateTime<Utc>) -> String {
    let mut header = vec!["NODE", "GROUP", "STATE", "BLOCKER", "SINCE", "NEXT"];
    if wide {
        header.extend(["REASON", "STEP", "NOTICE", "REPLACEMENT"]);
    }
    let mut table = vec![header.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
    table.extend(rows.iter().map(|r| row_cells(r, wide, now)));
    let mut out = align(&table);
    let s = Summary::of(rows);
    out.push_str(&format!(
        "{} nodes, {} acting, {} held\n",
        s.nodes, s.acting, s.held
    ));
    out
}

fn row_cells(r: &NodeStatus, wide: bool, now: DateTime<Utc>) -> Vec<String> {
    let dash = || "-".to_string();
    let mut cells = vec![
        r.name.clone(),
        r.group.clone().unwrap_or_else(dash),
        state_cell(r),
        match (&r.held, &r.held_unreadable) {
            (Some(h), _) => blocker_cell(&h.blocker),
            (None, Some(_)) => format!("unreadable {} (see -o json)", keys::BLOCKED),
            (None, None) => dash(),
        },
        r.since.map_or_else(dash, |t| age(now - t)),
        r.next.as_ref().map_or_else(dash, |n| next_cell(n, now)),
    ];
    if wide {
        cells.extend([
            r.reason.clone().unwrap_or_else(dash),
            r.repair_step
                .map_or_else(dash, |s| match r.repair_step_since {
                    Some(t) => format!("{s} ({})", age(now - t)),
                    None => s.to_string(),
                }),
            r.interruption
                .as_ref()
                .map_or_else(dash, |n| format!("{} at {}", n.kind, hhmm(n.at, now))),
            r.replacement_requested
                .map_or_else(dash, |t| format!("requested {} ago", age(now - t))),
        ]);
    }
    cells
}

/// `STATE`: the state, with `,cordoned` (by nodekeeper) or `,admin-cordoned`.
fn state_cell(r: &NodeStatus) -> String {
    match r.cordoned_by {
        Some(CordonedBy::Nodekeeper) => format!("{},cordoned", r.state),
        Some(CordonedBy::Admin) => format!("{},admin-cordoned", r.state),
        None => r.state.to_string(),
    }
}

/// `BLOCKER`: the blocker in a few words (the full message is in `-o json`).
pub fn blocker_cell(b: &Blocker) -> String {
    match b {
        Blocker::Pdb { pod, pdb, .. } => format!("PDB {pdb} (pod {pod})"),
        Blocker::DoNotDisrupt { pod, .. } => format!("do-not-disrupt (pod {pod})"),
        Blocker::Budget {
            group,
            budget,
            nodes,
            disrupting,
            total,
            opens_at,
            timezone,
            nodepool,
        } => {
            let of = match nodepool {
                Some(p) => format!("NodePool {p}"),
                None => group_name(group).to_string(),
            };
            let mut s =
                format!("budget #{budget} nodes={nodes} of {of} ({disrupting}/{total} disrupting)");
            if let Some(t) = opens_at {
                s.push_str(&format!(", opens {}", in_zone(*t, timezone.as_deref())));
            }
            s
        }
        Blocker::NodePool {
            nodepool, problem, ..
        } => format!("invalid NodePool {nodepool}: {problem}"),
        Blocker::ShortCircuit {
            group,
            unhealthy,
            total,
            max_unhealthy,
        } => format!(
            "short-circuit: {unhealthy}/{total} of {} unhealthy (max {max_unhealthy})",
            group_name(group)
        ),
        Blocker::Deadline { deadline } => format!("deadline {} passed", deadline.to_rfc3339()),
        Blocker::StartupRetries { retries, max } => {
            format!("startup retries exhausted ({retries}/{max})")
        }
        Blocker::ReplacementPending { .. } => "replacement pending".to_string(),
    }
}

fn next_cell(n: &Next, now: DateTime<Utc>) -> String {
    match n.at {
        Some(t) => format!("{} ({})", n.action, relative(t, now)),
        None => n.action.clone(),
    }
}

/// `in 5m` / `5m ago`.
pub fn relative(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    if t >= now {
        format!("in {}", age(t - now))
    } else {
        format!("{} ago", age(now - t))
    }
}

fn hhmm(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    format!("{} ({})", t.format("%H:%M:%SZ"), relative(t, now))
}

/// A kubectl-style age: `45s`, `5m`, `2h10m`, `3d4h`.
pub fn age(d: chrono::TimeDelta) -> String {
    let s = d.num_seconds().max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => match (s / 3600, s % 3600 / 60) {
            (h, 0) => format!("{h}h"),
            (h, m) => format!("{h}h{m}m"),
        },
        _ => match (s / 86400, s % 86400 / 3600) {
            (d, 0) => format!("{d}d"),
            (d, h) => format!("{d}d{h}h"),
        },
    }
}

/// Left-aligned columns separated by three spaces (the last one unpadded).
fn align(table: &[Vec<String>]) -> String {
    let cols = table.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            table
                .iter()
                .map(|r| r[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in table {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 < cols {
                line.push_str(&format!("{cell:<w$}   ", w = widths[c]));
            } else {
                line.push_str(cell);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::policy::view::{keys, NoticeKind, RecordedNotice};

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }
    const NOW: &str = "2026-11-30T12:00:00Z";

    fn ann(pairs: &[(&str, String)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    fn group(g: &str) -> BTreeMap<String, String> {
        ann(&[("karpenter.sh/nodepool", g.to_string())])
    }

    fn row(name: &str, g: &str, a: &[(&str, String)], unsched: bool) -> NodeStatus {
        NodeStatus::from_parts(name, &group(g), &ann(a), unsched, "karpenter.sh/nodepool")
    }

    fn held(b: Blocker, since: &str) -> String {
        Held {
            blocker: b,
            since: t(since),
        }
        .encode()
    }

    fn fixture() -> Vec<NodeStatus> {
        let budget = held(
            Blocker::Budget {
                group: "spot".into(),
                budget: 1,
                nodes: "1".into(),
                disrupting: 1,
                total: 4,
                opens_at: Some(t("2026-11-30T15:00:00Z")),
                timezone: Some("Asia/Shanghai".into()),
                nodepool: None,
            },
            "2026-11-30T11:50:00Z",
        );
        let pdb = held(
            Blocker::Pdb {
                pod: "shop/web-1".into(),
                pdb: "shop/web".into(),
                deadline: Some(t("2026-11-30T12:05:00Z")),
            },
            "2026-11-30T11:58:00Z",
        );
        let notice = RecordedNotice {
            kind: NoticeKind::Preemption,
            id: "aws-spot-1".into(),
            at: t("2026-11-30T12:02:00Z"),
        };
        vec![
            row("a-idle", "spot", &[], false),
            row("b-admin", "on-demand", &[], true),
            row(
                "c-budget",
                "spot",
                &[
                    (keys::STATE, "repairing".into()),
                    (keys::STATE_SINCE, "2026-11-30T11:45:00Z".into()),
                    (keys::REASON, "repair:Ready=False".into()),
                    (keys::BLOCKED, budget),
                ],
                false,
            ),
            row(
                "d-pdb",
                "spot",
                &[
                    (keys::STATE, "repairing".into()),
                    (keys::STATE_SINCE, "2026-11-30T10:00:00Z".into()),
                    (keys::REASON, "repair:Ready=False".into()),
                    (keys::REPAIR_STEP, "drain".into()),
                    (keys::REPAIR_STEP_SINCE, "2026-11-30T11:57:30Z".into()),
                    (keys::CORDONED_BY, keys::OWNER.into()),
                    (keys::BLOCKED, pdb),
                ],
                true,
            ),
            row(
                "e-spot",
                "spot",
                &[
                    (keys::STATE, "interrupted".into()),
                    (keys::STATE_SINCE, "2026-11-30T11:59:00Z".into()),
                    (keys::REASON, "interruption:preemption".into()),
                    (keys::CORDONED_BY, keys::OWNER.into()),
                    (keys::INTERRUPTION, notice.encode()),
                    (keys::REPLACEMENT_REQUESTED, "2026-11-30T11:59:01Z".into()),
                ],
                true,
            ),
        ]
    }

    #[test]
    fn table_names_blockers_next_steps_and_summary() {
        let out = render(&fixture(), StatusOutput::Text, t(NOW));
        let expected = "\
NODE       GROUP       STATE                  BLOCKER                                                                  SINCE   NEXT
a-idle     spot        idle                   -                                                                        -       -
b-admin    on-demand   idle,admin-cordoned    -                                                                        -       -
c-budget   spot        repairing              budget #1 nodes=1 of spot (1/4 disrupting), opens 2026-11-30 23:00 CST   15m     start when the budget window opens (in 3h)
d-pdb      spot        repairing,cordoned     PDB shop/web (pod shop/web-1)                                            2h      evict shop/web-1 once PDB shop/web allows (in 5m)
e-spot     spot        interrupted,cordoned   -                                                                        1m      finish the drain before the preemption (in 2m)
5 nodes, 3 acting, 2 held
";
        assert_eq!(out, expected, "\n{out}");
    }

    #[test]
    fn wide_adds_reason_step_notice_replacement() {
        let out = render(&fixture(), StatusOutput::Wide, t(NOW));
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].ends_with("REASON                    STEP         NOTICE                            REPLACEMENT"), "{}", lines[0]);
        assert!(
            lines[4].contains("repair:Ready=False") && lines[4].contains("drain (2m)"),
            "{}",
            lines[4]
        );
        assert!(
            lines[5].contains("preemption at 12:02:00Z (in 2m)")
                && lines[5].ends_with("requested 59s ago"),
            "{}",
            lines[5]
        );
        assert_eq!(lines.last(), Some(&"5 nodes, 3 acting, 2 held"));
    }

    #[test]
    fn json_is_versioned_and_carries_the_full_blocker() {
        let out = render(&fixture(), StatusOutput::Json, t(NOW));
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["version"], SCHEMA_VERSION);
        assert_eq!(v["generated_at"], NOW);
        assert_eq!(
            v["summary"],
            serde_json::json!({"nodes": 5, "acting": 3, "held": 2})
        );
        let n = &v["nodes"];
        assert_eq!(n[0]["state"], "idle");
        assert!(n[0]["held"].is_null() && n[0]["next"].is_null());
        assert_eq!(n[1]["cordoned_by"], "admin");
        assert_eq!(n[2]["held"]["reason"], "BlockedByBudget");
        assert_eq!(n[2]["held"]["blocker"]["kind"], "budget");
        assert_eq!(n[2]["held"]["blocker"]["opens_at"], "2026-11-30T15:00:00Z");
        assert_eq!(n[2]["held"]["blocker"]["timezone"], "Asia/Shanghai");
        assert_eq!(n[2]["next"]["at"], "2026-11-30T15:00:00Z");
        assert_eq!(n[3]["held"]["blocker"]["pod"], "shop/web-1");
        assert_eq!(n[3]["held"]["blocker"]["pdb"], "shop/web");
        assert_eq!(n[3]["held"]["blocker"]["deadline"], "2026-11-30T12:05:00Z");
        assert!(n[3]["held"]["message"]
            .as_str()
            .unwrap()
            .contains("refused by PodDisruptionBudget shop/web"));
        assert_eq!(n[3]["repair_step"], "drain");
        assert_eq!(n[3]["cordoned_by"], "nodekeeper");
        assert_eq!(n[4]["interruption"]["kind"], "preemption");
        assert_eq!(n[4]["interruption"]["at"], "2026-11-30T12:02:00Z");
        assert_eq!(n[4]["replacement_requested"], "2026-11-30T11:59:01Z");
    }

    #[test]
    fn every_blocker_has_a_cell_and_a_next_step() {
        let d = Some(t("2026-11-30T12:10:00Z"));
        let cases: Vec<(Blocker, &str, &str)> = vec![
            (
                Blocker::DoNotDisrupt {
                    pod: "a/b".into(),
                    deadline: d,
                },
                "do-not-disrupt (pod a/b)",
                "evict a/b once its do-not-disrupt annotation is removed (in 10m)",
            ),
            (
                Blocker::Budget {
                    group: "".into(),
                    budget: 0,
                    nodes: "10%".into(),
                    disrupting: 2,
                    total: 10,
                    opens_at: None,
                    timezone: None,
                    nodepool: None,
                },
                "budget #0 nodes=10% of (none) (2/10 disrupting)",
                "start when a disruption in group (none) finishes",
            ),
            (
                Blocker::Budget {
                    group: "spot".into(),
                    budget: 1,
                    nodes: "0".into(),
                    disrupting: 0,
                    total: 3,
                    opens_at: None,
                    timezone: None,
                    nodepool: Some("spot".into()),
                },
                "budget #1 nodes=0 of NodePool spot (0/3 disrupting)",
                "start when a disruption in group spot finishes",
            ),
            (
                Blocker::NodePool {
                    group: "spot".into(),
                    nodepool: "spot".into(),
                    problem: "spec.disruption.budgets[0].nodes: \"150%\" does not match".into(),
                },
                "invalid NodePool spot: spec.disruption.budgets[0].nodes: \"150%\" does not match",
                "start when NodePool spot's budgets are valid again",
            ),
            (
                Blocker::ShortCircuit {
                    group: "gpu".into(),
                    unhealthy: 3,
                    total: 10,
                    max_unhealthy: "20%".into(),
                },
                "short-circuit: 3/10 of gpu unhealthy (max 20%)",
                "repair when at most 20% of group gpu are unhealthy",
            ),
            (
                Blocker::Deadline {
                    deadline: t("2026-11-30T11:00:00Z"),
                },
                "deadline 2026-11-30T11:00:00+00:00 passed",
                "none: needs an operator",
            ),
            (
                Blocker::StartupRetries { retries: 3, max: 3 },
                "startup retries exhausted (3/3)",
                "none: needs an operator",
            ),
            (
                Blocker::ReplacementPending {
                    requested_at: t(NOW),
                },
                "replacement pending",
                "wait for the node to be replaced",
            ),
        ];
        for (b, cell, nxt) in cases {
            assert_eq!(blocker_cell(&b), cell);
            let r = row("n", "g", &[(keys::BLOCKED, held(b, NOW))], false);
            assert_eq!(next_cell(r.next.as_ref().unwrap(), t(NOW)), nxt);
            assert_eq!(r.state, "idle");
            assert_eq!(
                r.since,
                Some(t(NOW)),
                "an idle held node's SINCE is the hold's"
            );
        }
    }

    #[test]
    fn repair_steps_without_hold() {
        let step = |s: &str, repl: bool| {
            let mut a = vec![
                (keys::STATE, "repairing".to_string()),
                (keys::REPAIR_STEP, s.to_string()),
            ];
            if repl {
                a.push((keys::REPLACEMENT_REQUESTED, NOW.to_string()));
            }
            row("n", "g", &a, false).next.unwrap().action
        };
        assert_eq!(step("drain", false), "drain, then the next repair step");
        assert_eq!(step("reboot", false), "wait for the reboot (a new boot id)");
        assert_eq!(step("replace", false), "request a replacement");
        assert_eq!(step("replace", true), "wait for the replacement node");
        let c = row("n", "g", &[(keys::STATE, "cordoned".into())], true);
        assert_eq!(
            c.next.unwrap().action,
            "uncordon when the notice is cancelled"
        );
        assert_eq!(c.cordoned_by, Some(CordonedBy::Admin));
    }

    #[test]
    fn an_unreadable_hold_is_shown_not_hidden() {
        let raw = r#"{"kind":"quota","since":"2026-11-30T11:00:00Z"}"#;
        let r = row("n", "g", &[(keys::BLOCKED, raw.into())], false);
        assert!(r.held.is_none());
        assert_eq!(r.held_unreadable.as_deref(), Some(raw));
        let out = render(std::slice::from_ref(&r), StatusOutput::Text, t(NOW));
        assert!(
            out.contains("unreadable nodekeeper.io/blocked (see -o json)"),
            "{out}"
        );
        assert!(out.ends_with("1 nodes, 0 acting, 1 held\n"), "{out}");
        let v: serde_json::Value =
            serde_json::from_str(&render(&[r], StatusOutput::Json, t(NOW))).unwrap();
        assert_eq!(v["nodes"][0]["held_unreadable"], raw);
        assert!(v["nodes"][0].get("held_unreadable").is_some());
        let fine = row("m", "g", &[], false);
        let v: serde_json::Value =
            serde_json::from_str(&render(&[fine], StatusOutput::Json, t(NOW))).unwrap();
        assert!(v["nodes"][0].get("held_unreadable").is_none());
    }

    #[test]
    fn ages_and_relative_times() {
        let d = chrono::TimeDelta::seconds;
        assert_eq!(age(d(-5)), "0s");
        assert_eq!(age(d(59)), "59s");
        assert_eq!(age(d(60)), "1m");
        assert_eq!(age(d(3600)), "1h");
        assert_eq!(age(d(3600 + 120)), "1h2m");
        assert_eq!(age(d(86400 * 2)), "2d");
        assert_eq!(age(d(86400 + 7200)), "1d2h");
        assert_eq!(relative(t("2026-11-30T12:00:30Z"), t(NOW)), "in 30s");
        assert_eq!(relative(t("2026-11-30T11:00:00Z"), t(NOW)), "1h ago");
    }

    #[test]
    fn empty_list_prints_header_and_zero_summary() {
        assert_eq!(
            render(&[], StatusOutput::Text, t(NOW)),
            "NODE   GROUP   STATE   BLOCKER   SINCE   NEXT\n0 nodes, 0 acting, 0 held\n"
        );
    }

    /// `--config`: the budgets in force per group of the listed nodes, with their origin; a
    /// refused NodePool is shown as the hold it causes.
    #[test]
    fn budgets_in_force_per_group_with_their_source() {
        use crate::controller::policy::nodepool::read_budgets;
        use serde_json::json;
        let now = t("2026-11-30T02:00:00Z");
        let row = |name: &str, group: Option<&str>| {
            let labels: BTreeMap<String, String> = group
                .map(|g| ("pool".to_string(), g.to_string()))
                .into_iter()
                .collect();
            NodeStatus::from_parts(name, &labels, &BTreeMap::new(), false, "pool")
        };
        let rows: Vec<NodeStatus> = (0..30)
            .map(|i| row(&format!("s{i}"), Some("shared-spot")))
            .chain([row("bad-0", Some("bad")), row("bare", None)])
            .collect();
        let mut cfg = BudgetsConfig {
            source: BudgetsSource::NodePool,
            ..Default::default()
        };
        cfg.groups.insert(
            "shared-spot".into(),
            vec![crate::controller::policy::config::Budget {
                nodes: crate::controller::policy::config::Quantity::Count(0),
                schedule: Some("0 23 * * *".into()),
                duration: Some(std::time::Duration::from_secs(10 * 3600)),
                timezone: Some("Asia/Shanghai".into()),
                reasons: vec!["repair".into()],
            }],
        );
        let pools: BTreeMap<String, PoolBudgets> = [
            ("shared-spot", json!([{"nodes": "10%"}, {"nodes": "5%", "schedule": "0 1 * * *", "duration": "14h"}])),
            ("bad", json!([{"nodes": "150%"}])),
        ]
        .into_iter()
        .map(|(n, b)| (n.to_string(), read_budgets(n, Some(&b))))
        .collect();
        let b = budget_rows(&rows, &cfg, &pools, now);
        let text = render_budgets(&b);
        let want = "\
GROUP         SOURCE                   BUDGET   NODES   WINDOW                               REASONS   ACTIVE   ALLOWS
(none)        config                   #0       10%     always                               all       yes      1
bad           NodePool bad (invalid)   #0       0       always                               all       yes      0
shared-spot   NodePool shared-spot     #0       10%     always                               all       yes      3
shared-spot   NodePool shared-spot     #1       5%      0 1 * * * for 14h (UTC)              all       yes      2
shared-spot   config                   #0       0       0 23 * * * for 10h (Asia/Shanghai)   repair    no       -
NodePool bad: spec.disruption.budgets[0].nodes: \"150%\" does not match ^((100|[0-9]{1,2})%|[0-9]+)$ (a node count such as \"1\" or a percentage 0-100% such as \"10%\"): disruptions of group bad are held
";
        assert_eq!(text, want, "\n{text}");
        let doc = render_with_budgets(&rows[..1], &b, StatusOutput::Json, now);
        let v: serde_json::Value = serde_json::from_str(&doc).unwrap();
        assert_eq!(v["budgets"][2]["source"], "NodePool shared-spot");
        assert_eq!(v["budgets"][2]["repair_max"], 3);
        assert_eq!(
            v["budgets"][1]["problem"]
                .as_str()
                .unwrap()
                .split(':')
                .next(),
            Some("spec.disruption.budgets[0].nodes")
        );
        // Without --config: no `budgets` key, and the text ends with the summary line.
        let plain = render(&rows[..1], StatusOutput::Json, now);
        assert!(!plain.contains("\"budgets\""), "{plain}");
    }
}

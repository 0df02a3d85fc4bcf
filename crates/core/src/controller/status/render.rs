//! The rendering of `nodekeeper status`: rows into the aligned text table (`-o text`, `-o wide`)
//! or the versioned JSON document (`-o json`). Pure: the time is passed in.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::model::{BudgetStatus, CordonedBy, Next, NodeStatus, Summary};
use crate::controller::policy::budget::in_zone;
use crate::controller::policy::explain::{group_name, Blocker};
use crate::controller::policy::view::keys;

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

impl StatusOutput {
    /// Every value, in the order the command line lists them.
    pub const ALL: [StatusOutput; 3] = [StatusOutput::Text, StatusOutput::Wide, StatusOutput::Json];

    /// The spelling on the command line.
    pub fn name(self) -> &'static str {
        match self {
            StatusOutput::Text => "text",
            StatusOutput::Wide => "wide",
            StatusOutput::Json => "json",
        }
    }
}

impl std::fmt::Display for StatusOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for StatusOutput {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        StatusOutput::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| format!("unknown output `{s}` (expected text, wide or json)"))
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
pub(super) fn render_budgets(budgets: &[BudgetStatus]) -> String {
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
                .as_deref()
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
        Blocker::DoNotRepair { annotation } => format!("repair vetoed by {annotation}"),
        Blocker::KarpenterDisrupting => "Karpenter is disrupting it".to_string(),
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
        Blocker::UntrustedCondition { condition, step } => {
            format!("{step} not taken: {condition} not seen clear")
        }
        Blocker::RepairPolicy { condition } => format!("policy for {condition}: step none"),
    }
}

pub(super) fn next_cell(n: &Next, now: DateTime<Utc>) -> String {
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

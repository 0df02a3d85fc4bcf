//! One node in full (`kubectl nodekeeper explain NODE`), its nodekeeper Events (also the context
//! of `history NODE`, [`super::history`]), and whether nodekeeper is installed in a cluster at
//! all.
//!
//! The model is [`NodeStatus`] (what `status` shows per row, from the Node's annotations) plus the
//! Node's nodekeeper conditions and the Events the controller recorded about it
//! (`events.k8s.io/v1` in [`NODE_EVENT_NAMESPACE`], reported by [`REPORTING_CONTROLLER`]), which
//! the API server keeps for its `--event-ttl` (1 h by default).

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use serde::Serialize;

use super::model::NodeStatus;
use super::render::{age, blocker_cell, relative};
use crate::controller::catalog::{DRAINED, DRAIN_IN_PROGRESS};
use crate::controller::cluster::events::{NODE_EVENT_NAMESPACE, REPORTING_CONTROLLER};

/// Schema version of the `explain` JSON document.
pub const EXPLAIN_SCHEMA_VERSION: u32 = 1;

/// The ServiceAccount every installation of nodekeeper has in its namespace (manifests, chart).
pub const CONTROLLER_SERVICE_ACCOUNT: &str = "nodekeeper-controller";

/// The namespace nodekeeper is installed in unless told otherwise (`-n`).
pub const DEFAULT_NAMESPACE: &str = "nodekeeper";

/// Errors of `explain`, `history` and the installation check; each names the server.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// No such Node.
    #[error("node {node} not found on the API server {server}")]
    NoNode {
        /// Node name.
        node: String,
        /// API server URL.
        server: String,
    },
    /// Reading the Node failed (unreachable, forbidden...).
    #[error("cannot get node {node} from the API server {server}: {source}")]
    Get {
        /// Node name.
        node: String,
        /// API server URL.
        server: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// Listing the Events failed.
    #[error("cannot list events.k8s.io/v1 events in namespace {NODE_EVENT_NAMESPACE} from the API server {server}: {source}")]
    Events {
        /// API server URL.
        server: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// nodekeeper is not installed: `missing` names what is not there.
    #[error("nodekeeper is not installed in the cluster at {server}: {missing} (install it: docs/install.md; installed in another namespace? pass -n NAMESPACE)")]
    NotInstalled {
        /// What is missing, e.g. `namespace "nodekeeper" not found`.
        missing: String,
        /// API server URL.
        server: String,
    },
    /// The installation check itself failed (unreachable, ...).
    #[error("cannot check that nodekeeper is installed (serviceaccount {namespace}/{CONTROLLER_SERVICE_ACCOUNT}) on the API server {server}: {source}")]
    Check {
        /// Namespace looked in.
        namespace: String,
        /// API server URL.
        server: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

/// What the installation check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Installed {
    /// The controller's ServiceAccount is there.
    Yes,
    /// The caller may not read it (403): nothing is known; the commands go on.
    Unknown(String),
}

/// A Kubernetes timestamp in chrono.
fn chrono(t: k8s_openapi::jiff::Timestamp) -> DateTime<Utc> {
    DateTime::from_timestamp(t.as_second(), t.subsec_nanosecond().max(0) as u32).unwrap_or_default()
}

/// A chrono time as a Kubernetes timestamp (tests).
#[cfg(test)]
fn jiff(t: DateTime<Utc>) -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::from_second(t.timestamp()).unwrap()
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Whether nodekeeper is installed in `namespace`: its controller's ServiceAccount is there
/// (every installation has it, whether the controller runs in the cluster or not). When it is
/// not, [`ExplainError::NotInstalled`] names the namespace when that is missing too.
pub async fn check_installed(
    client: kube::Client,
    server: &str,
    namespace: &str,
) -> Result<Installed, ExplainError> {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let check = |source| ExplainError::Check {
        namespace: namespace.to_string(),
        server: server.to_string(),
        source,
    };
    match sas.get_opt(CONTROLLER_SERVICE_ACCOUNT).await {
        Ok(Some(_)) => Ok(Installed::Yes),
        Ok(None) => {
            let namespaces: Api<Namespace> = Api::all(client);
            let missing = match namespaces.get_opt(namespace).await {
                Ok(None) => format!("namespace \"{namespace}\" not found"),
                _ => format!(
                    "serviceaccount \"{CONTROLLER_SERVICE_ACCOUNT}\" not found in namespace \"{namespace}\""
                ),
            };
            Err(ExplainError::NotInstalled {
                missing,
                server: server.to_string(),
            })
        }
        Err(e) if is_status(&e, 403) => Ok(Installed::Unknown(format!(
            "cannot check that nodekeeper is installed: get serviceaccount {namespace}/{CONTROLLER_SERVICE_ACCOUNT} is forbidden"
        ))),
        Err(e) => Err(check(e)),
    }
}

/// The Node `name`.
pub async fn get_node(
    client: kube::Client,
    server: &str,
    name: &str,
) -> Result<Node, ExplainError> {
    let nodes: Api<Node> = Api::all(client);
    match nodes.get_opt(name).await {
        Ok(Some(n)) => Ok(n),
        Ok(None) => Err(ExplainError::NoNode {
            node: name.to_string(),
            server: server.to_string(),
        }),
        Err(source) => Err(ExplainError::Get {
            node: name.to_string(),
            server: server.to_string(),
            source,
        }),
    }
}

/// The names of the cluster's Nodes (metadata only, unpaginated: shell completion).
pub async fn node_names(client: kube::Client) -> Result<Vec<String>, kube::Error> {
    let nodes: Api<Node> = Api::all(client);
    let list = nodes.list_metadata(&ListParams::default()).await?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect())
}

/// One Event about the node, as `history` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventLine {
    /// When it was last seen (the series' last observation, else the event time).
    pub last_seen: Option<DateTime<Utc>>,
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The catalog reason (docs/catalog.md), e.g. `BlockedByBudget`.
    pub reason: String,
    /// The Event's note.
    pub message: String,
    /// How many times it happened (a series counts more than one).
    pub count: i32,
    /// The controller replica that recorded it.
    pub reported_by: String,
}

impl EventLine {
    fn from_event(e: &Event) -> Self {
        let last_seen = e
            .series
            .as_ref()
            .map(|s| s.last_observed_time.0)
            .or(e.event_time.as_ref().map(|t| t.0))
            .or(e.deprecated_last_timestamp.as_ref().map(|t| t.0))
            .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0))
            .map(chrono);
        EventLine {
            last_seen,
            type_: e.type_.clone().unwrap_or_default(),
            reason: e.reason.clone().unwrap_or_default(),
            message: e.note.clone().unwrap_or_default(),
            count: e
                .series
                .as_ref()
                .map_or(1, |s| s.count)
                .max(e.deprecated_count.unwrap_or(1)),
            reported_by: e.reporting_instance.clone().unwrap_or_default(),
        }
    }
}

/// The nodekeeper Events about Node `node`, newest first.
pub async fn node_events(
    client: kube::Client,
    server: &str,
    node: &str,
) -> Result<Vec<EventLine>, ExplainError> {
    let api: Api<Event> = Api::namespaced(client, NODE_EVENT_NAMESPACE);
    let lp = ListParams::default().fields(&format!("regarding.name={node}"));
    let list = api.list(&lp).await.map_err(|source| ExplainError::Events {
        server: server.to_string(),
        source,
    })?;
    Ok(select_events(&list.items, node))
}

/// The Events of `items` about Node `node` recorded by nodekeeper's controller, newest first.
pub fn select_events(items: &[Event], node: &str) -> Vec<EventLine> {
    let mut out: Vec<EventLine> = items
        .iter()
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("Node") && r.name.as_deref() == Some(node)
            }) && e.reporting_controller.as_deref() == Some(REPORTING_CONTROLLER)
        })
        .map(EventLine::from_event)
        .collect();
    out.sort_by(|a, b| b.last_seen.cmp(&a.last_seen).then(a.reason.cmp(&b.reason)));
    out
}

/// One nodekeeper condition of the Node (`Nodekeeper*`: the agent's checks and `NodekeeperHeld`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConditionLine {
    /// The condition type.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False`, `Unknown`.
    pub status: String,
    /// Reason.
    pub reason: String,
    /// Message.
    pub message: String,
    /// Last transition.
    pub since: Option<DateTime<Utc>>,
}

/// Whether nodekeeper writes conditions of type `t`: its own (`Nodekeeper*`: the agent's checks,
/// `NodekeeperHeld`) and the node lifecycle conditions around its drains.
fn is_nodekeepers(t: &str) -> bool {
    t.starts_with("Nodekeeper") || t == DRAIN_IN_PROGRESS || t == DRAINED
}

/// `explain NODE`: the row `status` shows, the node's nodekeeper conditions and its latest
/// nodekeeper Events.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    /// [`EXPLAIN_SCHEMA_VERSION`].
    pub version: u32,
    /// When it was produced.
    pub generated_at: DateTime<Utc>,
    /// What `status` shows for the node (docs/status.md's JSON `nodes[]` element).
    pub node: NodeStatus,
    /// The conditions nodekeeper writes on the node (`Nodekeeper*`, `DrainInProgress`,
    /// `Drained`), by type.
    pub conditions: Vec<ConditionLine>,
    /// The latest nodekeeper Events about it, newest first (at most [`EXPLAIN_EVENTS`]).
    pub recent_events: Vec<EventLine>,
}

/// How many Events `explain` shows.
pub const EXPLAIN_EVENTS: usize = 5;

/// The explanation of `node` as of `now`.
pub fn explain(
    node: &Node,
    events: &[EventLine],
    group_label: &str,
    now: DateTime<Utc>,
) -> Explanation {
    let mut conditions: Vec<ConditionLine> = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| is_nodekeepers(&c.type_))
        .map(|c| ConditionLine {
            type_: c.type_.clone(),
            status: c.status.clone(),
            reason: c.reason.clone().unwrap_or_default(),
            message: c.message.clone().unwrap_or_default(),
            since: c.last_transition_time.as_ref().map(|t| chrono(t.0)),
        })
        .collect();
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
    Explanation {
        version: EXPLAIN_SCHEMA_VERSION,
        generated_at: now,
        node: NodeStatus::from_node(node, group_label),
        conditions,
        recent_events: events.iter().take(EXPLAIN_EVENTS).cloned().collect(),
    }
}

fn when(t: Option<DateTime<Utc>>, now: DateTime<Utc>) -> String {
    t.map_or("-".into(), |t| {
        format!("{} ({})", t.format("%Y-%m-%d %H:%M:%SZ"), relative(t, now))
    })
}

/// The text of `explain`: what nodekeeper is doing, why the node is held, what happens next
/// and when, then its conditions and latest Events.
pub fn render_explanation(x: &Explanation, now: DateTime<Utc>) -> String {
    let n = &x.node;
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("{k:<13}{v}\n"));
    line("Node:", n.name.clone());
    line("Group:", n.group.clone().unwrap_or_else(|| "-".into()));
    let state = match (n.acting(), n.since) {
        (true, Some(s)) => format!("{} since {}", n.state, when(Some(s), now)),
        _ => n.state.to_string(),
    };
    line("State:", state);
    if let Some(r) = &n.reason {
        line("Reason:", r.clone());
    }
    if let Some(step) = &n.repair_step {
        line(
            "Repair step:",
            format!("{step} since {}", when(n.repair_step_since, now)),
        );
    }
    line(
        "Cordoned:",
        match n.cordoned_by {
            None => "no".into(),
            Some(super::CordonedBy::Nodekeeper) => {
                "yes, by nodekeeper (it uncordons the node when done)".into()
            }
            Some(super::CordonedBy::Admin) => {
                "yes, by someone else (nodekeeper never uncordons it)".into()
            }
        },
    );
    if let Some(i) = &n.interruption {
        line(
            "Notice:",
            format!("{} {} at {}", i.kind, i.id, when(Some(i.at), now)),
        );
    }
    if let Some(t) = n.replacement_requested {
        line("Replacement:", format!("requested {}", when(Some(t), now)));
    }
    match (&n.held, &n.held_unreadable) {
        (Some(h), _) => {
            line(
                "Held:",
                format!("yes, {} since {}", h.reason, when(Some(h.since), now)),
            );
            line("Why:", h.message.clone());
            line("Blocker:", blocker_cell(&h.blocker));
        }
        (None, Some(raw)) => line(
            "Held:",
            format!("yes, but nodekeeper.io/blocked is unreadable (a newer controller?): {raw}"),
        ),
        (None, None) => line("Held:", "no".into()),
    }
    line(
        "Next:",
        match &n.next {
            Some(next) => match next.at {
                Some(t) => format!("{} ({})", next.action, when(Some(t), now)),
                None => next.action.clone(),
            },
            None => "nothing: nodekeeper is not acting on this node".into(),
        },
    );
    out.push_str("\nConditions:\n");
    if x.conditions.is_empty() {
        out.push_str("  (no Nodekeeper* condition: no agent has reported for this node)\n");
    }
    for c in &x.conditions {
        out.push_str(&format!(
            "  {}={} {}: {} (since {})\n",
            c.type_,
            c.status,
            c.reason,
            c.message,
            c.since.map_or("-".into(), |t| age(now - t)),
        ));
    }
    out.push_str(&format!(
        "\nRecent events (newest first, {EXPLAIN_EVENTS} at most; all: kubectl nodekeeper history {}):\n",
        n.name
    ));
    if x.recent_events.is_empty() {
        out.push_str("  (none)\n");
    }
    out.push_str(&render_event_lines(&x.recent_events, now, "  "));
    out
}

/// Events as a table: `LAST SEEN  TYPE  REASON  COUNT  MESSAGE`, each line after `indent`.
pub(super) fn render_event_lines(events: &[EventLine], now: DateTime<Utc>, indent: &str) -> String {
    if events.is_empty() {
        return String::new();
    }
    let mut rows = vec![["LAST SEEN", "TYPE", "REASON", "COUNT", "MESSAGE"].map(String::from)];
    for e in events {
        rows.push([
            e.last_seen.map_or("-".into(), |t| age(now - t)),
            e.type_.clone(),
            e.reason.clone(),
            e.count.to_string(),
            e.message.clone(),
        ]);
    }
    let widths: Vec<usize> = (0..4)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut l = indent.to_string();
        for (c, w) in widths.iter().enumerate() {
            l.push_str(&format!("{:<w$}   ", r[c]));
        }
        l.push_str(&r[4]);
        out.push_str(l.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus as KNodeStatus, ObjectReference};
    use k8s_openapi::api::events::v1::EventSeries;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};

    use super::*;
    use crate::controller::catalog::HELD_CONDITION;
    use crate::controller::policy::explain::{Blocker, Held};
    use crate::controller::policy::view::keys;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn event(node: &str, reason: &str, at: &str, controller: &str) -> Event {
        Event {
            metadata: ObjectMeta {
                name: Some(format!("{node}.{reason}")),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(jiff(t(at)))),
            reason: Some(reason.into()),
            note: Some(format!("{reason} on {node}")),
            type_: Some("Normal".into()),
            regarding: Some(ObjectReference {
                kind: Some("Node".into()),
                name: Some(node.into()),
                ..ObjectReference::default()
            }),
            reporting_controller: Some(controller.into()),
            reporting_instance: Some("replica-a".into()),
            ..Event::default()
        }
    }

    #[test]
    fn only_nodekeepers_events_about_the_node_newest_first() {
        let mut series = event(
            "n1",
            "BlockedByBudget",
            "2026-11-30T11:00:00Z",
            REPORTING_CONTROLLER,
        );
        series.series = Some(EventSeries {
            count: 4,
            last_observed_time: MicroTime(jiff(t("2026-11-30T11:58:00Z"))),
        });
        let items = vec![
            event(
                "n1",
                "RepairStarted",
                "2026-11-30T11:50:00Z",
                REPORTING_CONTROLLER,
            ),
            event("n1", "NodeNotReady", "2026-11-30T11:59:00Z", "kubelet"),
            event(
                "n2",
                "RepairStarted",
                "2026-11-30T11:59:30Z",
                REPORTING_CONTROLLER,
            ),
            series,
        ];
        let got = select_events(&items, "n1");
        let reasons: Vec<(&str, i32)> = got.iter().map(|e| (e.reason.as_str(), e.count)).collect();
        assert_eq!(reasons, [("BlockedByBudget", 4), ("RepairStarted", 1)]);
        let text = render_event_lines(&got, t("2026-11-30T12:00:00Z"), "");
        assert_eq!(
            text,
            "LAST SEEN   TYPE     REASON            COUNT   MESSAGE\n\
             2m          Normal   BlockedByBudget   4       BlockedByBudget on n1\n\
             10m         Normal   RepairStarted     1       RepairStarted on n1\n"
        );
        assert!(render_event_lines(&[], t("2026-11-30T12:00:00Z"), "").is_empty());
    }

    #[test]
    fn a_held_node_is_explained_with_why_and_what_next() {
        let now = t("2026-11-30T12:00:00Z");
        let held = Held {
            blocker: Blocker::Deadline {
                deadline: t("2026-11-30T11:00:00Z"),
            },
            since: t("2026-11-30T11:00:00Z"),
        };
        let annotations = BTreeMap::from([
            (keys::STATE.to_string(), "repairing".to_string()),
            (
                keys::STATE_SINCE.to_string(),
                "2026-11-30T10:00:00Z".to_string(),
            ),
            (keys::REASON.to_string(), "repair:Ready=False".to_string()),
            (
                keys::BLOCKED.to_string(),
                serde_json::to_string(&held).unwrap(),
            ),
        ]);
        let node = Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                labels: Some(BTreeMap::from([("pool".to_string(), "spot".to_string())])),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            status: Some(KNodeStatus {
                conditions: Some(vec![
                    NodeCondition {
                        type_: "Ready".into(),
                        status: "False".into(),
                        ..NodeCondition::default()
                    },
                    NodeCondition {
                        type_: DRAIN_IN_PROGRESS.into(),
                        status: "True".into(),
                        reason: Some("DrainStarted".into()),
                        message: Some("d".into()),
                        ..NodeCondition::default()
                    },
                    NodeCondition {
                        type_: HELD_CONDITION.into(),
                        status: "True".into(),
                        reason: Some("DeadlineExceeded".into()),
                        message: Some("m".into()),
                        last_transition_time: Some(Time(jiff(t("2026-11-30T11:00:00Z")))),
                        ..NodeCondition::default()
                    },
                ]),
                ..KNodeStatus::default()
            }),
            ..Node::default()
        };
        let x = explain(&node, &[], "pool", now);
        let types: Vec<&str> = x.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(
            types,
            [DRAIN_IN_PROGRESS, HELD_CONDITION],
            "nodekeeper's, by type"
        );
        let text = render_explanation(&x, now);
        for want in [
            "Node:        n1\n",
            "Group:       spot\n",
            "State:       repairing since 2026-11-30 10:00:00Z (2h ago)\n",
            "Reason:      repair:Ready=False\n",
            "Held:        yes, DeadlineExceeded since 2026-11-30 11:00:00Z (1h ago)\n",
            "Next:        none: needs an operator\n",
            "  NodekeeperHeld=True DeadlineExceeded: m (since 1h)\n",
            "  (none)\n",
        ] {
            assert!(text.contains(want), "{want:?} in\n{text}");
        }
        let json = serde_json::to_value(&x).unwrap();
        assert_eq!(json["node"]["held"]["reason"], "DeadlineExceeded");
        assert_eq!(json["conditions"][1]["type"], HELD_CONDITION);
    }
}

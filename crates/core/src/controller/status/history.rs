//! A node's action history as `nodekeeper status NODE --history` and `kubectl nodekeeper history
//! NODE` show it (one rendering for both): the entries the controller keeps in the node's history
//! ConfigMap ([`crate::controller::act::history`]), newest first, then the node's nodekeeper
//! Events the API server still holds, as context.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::explain::{node_events, render_event_lines, EventLine, ExplainError};
use super::render::{age, relative};
use crate::controller::act::history::{store, Entry};

/// Schema version of the history JSON document (`-o json`).
pub const HISTORY_SCHEMA_VERSION: u32 = 1;

/// The history JSON document.
#[derive(Debug, Clone, Serialize)]
pub struct HistoryDocument {
    /// [`HISTORY_SCHEMA_VERSION`].
    pub version: u32,
    /// When it was produced.
    pub generated_at: DateTime<Utc>,
    /// The node.
    pub node: String,
    /// Where the history is kept: `<namespace>/<configmap>`.
    pub stored_in: String,
    /// What nodekeeper did to the node, newest first (docs/operations.md, "History").
    pub history: Vec<Entry>,
    /// Its nodekeeper Events still on the API server (its `--event-ttl`), newest first; `null`
    /// when the caller may not list them.
    pub events: Option<Vec<EventLine>>,
}

/// Errors reading a history; each names the server.
#[derive(Debug, thiserror::Error)]
pub enum HistoryReadError {
    /// The history ConfigMap could not be read.
    #[error("{source} (API server {server})")]
    Store {
        /// API server URL.
        server: String,
        /// Cause.
        #[source]
        source: store::HistoryError,
    },
    /// The node's Events could not be listed.
    #[error(transparent)]
    Events(#[from] ExplainError),
}

/// Reads `node`'s history from `namespace` (where nodekeeper's controller runs) and its Events
/// (left out, as `None`, when listing them is forbidden).
pub async fn node_history(
    client: kube::Client,
    server: &str,
    namespace: &str,
    node: &str,
    now: DateTime<Utc>,
) -> Result<HistoryDocument, HistoryReadError> {
    let mut history = store::Histories::new(client.clone(), namespace)
        .read(node)
        .await
        .map_err(|source| HistoryReadError::Store {
            server: server.to_string(),
            source,
        })?;
    history.reverse();
    let events = match node_events(client, server, node).await {
        Ok(e) => Some(e),
        Err(ExplainError::Events {
            source: kube::Error::Api(s),
            ..
        }) if s.code == 403 => None,
        Err(e) => return Err(e.into()),
    };
    Ok(HistoryDocument {
        version: HISTORY_SCHEMA_VERSION,
        generated_at: now,
        node: node.to_string(),
        stored_in: format!("{namespace}/{}", store::name(node)),
        history,
        events,
    })
}

/// The last column of an entry: its error or drain summary, else what drove it, else what
/// nodekeeper said.
fn detail(e: &Entry) -> String {
    if let Some(d) = &e.detail {
        return d.clone();
    }
    if !e.inputs.is_empty() {
        return e.inputs.join("; ");
    }
    e.events.first().cloned().unwrap_or_default()
}

fn took(ms: u64) -> String {
    match ms {
        0..1000 => format!("{ms}ms"),
        _ => age(chrono::TimeDelta::milliseconds(ms as i64)),
    }
}

/// The text: `WHEN  ACTION  STEP  WHY  OUTCOME  TOOK  DETAIL`, newest first, then the Events.
pub fn render_history(doc: &HistoryDocument, now: DateTime<Utc>) -> String {
    let mut out = String::new();
    if doc.history.is_empty() {
        out.push_str(&format!(
            "no recorded actions on node {} ({} holds none)\n",
            doc.node, doc.stored_in
        ));
    } else {
        let mut rows =
            vec![["WHEN", "ACTION", "STEP", "WHY", "OUTCOME", "TOOK", "DETAIL"].map(String::from)];
        for e in &doc.history {
            rows.push([
                format!(
                    "{} ({})",
                    e.time.format("%Y-%m-%d %H:%M:%SZ"),
                    relative(e.time, now)
                ),
                e.action.clone(),
                e.step.clone().unwrap_or_else(|| "-".into()),
                e.why.clone().unwrap_or_else(|| "-".into()),
                e.outcome.clone(),
                took(e.duration_ms),
                detail(e),
            ]);
        }
        let widths: Vec<usize> = (0..6)
            .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
            .collect();
        for r in rows {
            let mut l = String::new();
            for (c, w) in widths.iter().enumerate() {
                l.push_str(&format!("{:<w$}   ", r[c]));
            }
            l.push_str(&r[6]);
            out.push_str(l.trim_end());
            out.push('\n');
        }
    }
    match &doc.events {
        Some(events) if !events.is_empty() => {
            out.push_str(
                "\nEvents (the API server keeps them for its --event-ttl, 1h by default):\n",
            );
            out.push_str(&render_event_lines(events, now, "  "));
        }
        Some(_) => {}
        None => out.push_str("\n(the node's Events are not shown: listing them is forbidden)\n"),
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn entry(at: &str, action: &str, outcome: &str, ms: u64) -> Entry {
        Entry {
            step: Some("drain".into()),
            why: Some("repair:Ready=False".into()),
            inputs: vec!["Ready=False KubeletNotReady".into()],
            outcome: outcome.into(),
            duration_ms: ms,
            ..Entry::new(t(at), action)
        }
    }

    #[test]
    fn the_history_is_a_table_newest_first_then_the_events() {
        let now = t("2026-11-30T12:00:00Z");
        let mut drained = entry("2026-11-30T11:50:30Z", "drain", "completed", 90_000);
        drained.detail = Some("3 pod(s) removed, 1 left alone".into());
        let doc = HistoryDocument {
            version: HISTORY_SCHEMA_VERSION,
            generated_at: now,
            node: "n1".into(),
            stored_in: "nodekeeper/nodekeeper-history-n1".into(),
            history: vec![
                drained,
                entry("2026-11-30T11:50:00Z", "start_drain", "ok", 12),
            ],
            events: Some(vec![]),
        };
        assert_eq!(
            render_history(&doc, now),
            "WHEN                             ACTION        STEP    WHY                  OUTCOME     TOOK   DETAIL\n\
             2026-11-30 11:50:30Z (9m ago)    drain         drain   repair:Ready=False   completed   1m     3 pod(s) removed, 1 left alone\n\
             2026-11-30 11:50:00Z (10m ago)   start_drain   drain   repair:Ready=False   ok          12ms   Ready=False KubeletNotReady\n"
        );
        let empty = HistoryDocument {
            history: vec![],
            events: None,
            ..doc
        };
        let text = render_history(&empty, now);
        assert!(
            text.starts_with(
                "no recorded actions on node n1 (nodekeeper/nodekeeper-history-n1 holds none)"
            ),
            "{text}"
        );
        assert!(text.contains("listing them is forbidden"), "{text}");
        let json = serde_json::to_value(&empty).unwrap();
        assert_eq!(json["events"], serde_json::Value::Null);
        assert_eq!(json["version"], 1);
    }
}

//! The report (`POST /v1/reports`) and the controller's answer with its commands.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{CheckEvent, CheckResult, InstanceIdentity, NodeEvent};

/// The schema version this build writes.
///
/// Version 2 made `problems` typed objects ([`Problem`]: `source` and `message`); in version 1
/// they were plain strings.
pub const REPORT_VERSION: u32 = 2;

/// Every version this build reads, oldest first: the current one and the one before it, so a
/// controller upgraded first keeps taking the reports of agents not yet upgraded. A body of an
/// older version is upgraded to the current schema on read ([`parse_body`]); the controller
/// counts and warns about it (docs/install.md "Version skew").
pub const ACCEPTED_REPORT_VERSIONS: [u32; 2] = [1, REPORT_VERSION];

/// The accepted versions as text, e.g. `1, 2`.
pub fn accepted_report_versions() -> String {
    ACCEPTED_REPORT_VERSIONS
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Most notices (`events`) the agent puts in one report, oldest first; the rest go with the next
/// reports. The controller's default `[controller.report_limits] max_events`.
pub const MAX_EVENTS_PER_REPORT: usize = 64;

/// One report from the agent on `node`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeReport {
    /// Schema version ([`REPORT_VERSION`]; a body of an older accepted version is upgraded to
    /// this one on read, [`parse_versioned`] tells which it was).
    pub version: u32,
    /// The Kubernetes node the agent runs on (the controller checks it against the caller's token).
    pub node: String,
    /// `nodekeeper --version` of the agent.
    pub agent_version: String,
    /// A random id chosen when the agent process starts; with `sequence`, makes reports idempotent.
    pub agent_instance: String,
    /// Increases by one per report of this agent instance; replays (≤ the last seen) are ignored.
    pub sequence: u64,
    /// The kernel boot id (`/proc/sys/kernel/random/boot_id`): a change proves a reboot.
    pub boot_id: String,
    /// When the report was made.
    pub generated_at: DateTime<Utc>,
    /// The cloud instance behind the node, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<InstanceIdentity>,
    /// Current (debounced) health conditions; the full set the agent owns.
    #[serde(default)]
    pub conditions: Vec<CheckResult>,
    /// Temporary health events since the last delivered report.
    #[serde(default)]
    pub check_events: Vec<CheckEvent>,
    /// Interruption/maintenance notices (and their cancellations) not yet acknowledged.
    #[serde(default)]
    pub events: Vec<NodeEvent>,
    /// The last CRI-O apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crio: Option<CrioReport>,
    /// Labels the agent's rules want removed from its own node.
    #[serde(default)]
    pub label_removals: Vec<LabelRemoval>,
    /// Results of commands the controller sent earlier.
    #[serde(default)]
    pub command_results: Vec<CommandResult>,
    /// Problems of checks, sources and the reporter (e.g. a metadata endpoint answering garbage).
    #[serde(default)]
    pub problems: Vec<Problem>,
    /// The [`AgentCommand`] types this agent runs (`reboot`, `ack_scheduled_event`,
    /// `restart_unit`): the controller sends it no other, since an agent fails on a response with
    /// a type it does not know. Added within version 2: absent (an agent built before it) reads as
    /// [`LEGACY_COMMAND_TYPES`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command_types: Vec<String>,
}

/// The command types of an agent whose report does not list them (built before
/// `command_types`).
pub const LEGACY_COMMAND_TYPES: &[&str] = &["reboot", "ack_scheduled_event"];

/// The command types this build's agent runs.
pub const COMMAND_TYPES: &[&str] = &["reboot", "ack_scheduled_event", "restart_unit"];

impl NodeReport {
    /// Whether the reporting agent runs commands of `type_` ([`AgentCommand::type_name`]).
    pub fn runs(&self, type_: &str) -> bool {
        if self.command_types.is_empty() {
            return LEGACY_COMMAND_TYPES.contains(&type_);
        }
        self.command_types.iter().any(|t| t == type_)
    }
}

/// One problem the agent reports (version 2; a version 1 problem was a string, read as a
/// problem of source `""`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// What had it: `check NAME`, `metadata source`, `reporter`, `checks`; `""` when not known
    /// (a version 1 report).
    pub source: String,
    /// What went wrong.
    pub message: String,
}

impl Problem {
    /// A problem of `source`.
    pub fn new(source: impl Into<String>, message: impl Into<String>) -> Self {
        Problem {
            source: source.into(),
            message: message.into(),
        }
    }
}

/// Why a report body was refused (400); messages carry at most a bounded slice of the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// Not JSON.
    #[error("invalid JSON: {0}")]
    Json(String),
    /// A `version` this controller does not read (or none).
    #[error(
        "unsupported report version {0}; this controller accepts report versions {accepted}",
        accepted = accepted_report_versions()
    )]
    Version(String),
    /// JSON, but not a report of this version.
    #[error("invalid report: {0}")]
    Schema(String),
}

/// Longest error text taken from serde (which may quote the input).
const MAX_ERROR_CHARS: usize = 200;

/// Parses and version-checks a `POST /v1/reports` body: [`parse_versioned`] without the body's
/// version.
pub fn parse_body(body: &[u8]) -> Result<NodeReport, BodyError> {
    parse_versioned(body).map(|(_, report)| report)
}

/// Parses and version-checks a `POST /v1/reports` body (the handler calls this after
/// authentication and before the node check): the version the body was written in, and the
/// report in the current schema (a body of an older accepted version is upgraded, its `version`
/// made [`REPORT_VERSION`]).
pub fn parse_versioned(body: &[u8]) -> Result<(u32, NodeReport), BodyError> {
    let short = |e: serde_json::Error| crate::text::truncate(&e.to_string(), MAX_ERROR_CHARS);
    let mut value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| BodyError::Json(short(e)))?;
    let version = match value.get("version") {
        Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) if ACCEPTED_REPORT_VERSIONS.contains(&n) => n,
            _ => {
                let shown = crate::text::truncate(&v.to_string(), 40);
                return Err(BodyError::Version(shown));
            }
        },
        None => return Err(BodyError::Version("none".into())),
    };
    if version == 1 {
        upgrade_v1(&mut value).map_err(BodyError::Schema)?;
    }
    let mut report: NodeReport =
        serde_json::from_value(value).map_err(|e| BodyError::Schema(short(e)))?;
    report.version = REPORT_VERSION;
    Ok((version, report))
}

/// A version 1 body in the version 2 schema: each problem string becomes a [`Problem`] of
/// source `""`. Anything else is left for the schema to judge.
fn upgrade_v1(value: &mut serde_json::Value) -> Result<(), String> {
    let Some(problems) = value.get_mut("problems") else {
        return Ok(());
    };
    let Some(list) = problems.as_array_mut() else {
        return Err("problems: a version 1 report's problems are an array of strings".into());
    };
    for p in list {
        let Some(text) = p.as_str() else {
            return Err("problems: a version 1 report's problems are strings".into());
        };
        *p = serde_json::json!({ "source": "", "message": text });
    }
    Ok(())
}

/// The outcome of the last CRI-O apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrioReport {
    /// sha256 of the rendered drop-ins (name + content), to compare nodes.
    pub config_hash: String,
    /// `ok`, `no_change`, `failed`, `rolled_back`.
    pub result: CrioResult,
    /// The unit's ActiveState afterwards (`unknown` when not asked).
    pub unit_state: String,
    /// The error, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Drop-in keys the running CRI-O ignores or holds otherwise, one line each (from its live
    /// configuration, after a successful apply).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignored: Vec<String>,
    /// When it ran.
    pub at: DateTime<Utc>,
}

/// Result of a CRI-O apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CrioResult {
    /// Changed and (if running) restarted successfully.
    Ok,
    /// Nothing to do.
    NoChange,
    /// Failed before changing anything (or the rollback itself failed).
    Failed,
    /// The restart failed and the previous files were restored.
    RolledBack,
}

/// A request to remove a label from the reporting node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelRemoval {
    /// The label key.
    pub label: String,
    /// Why (which rule matched, e.g. `cilium pod cilium-x7k2p Ready`).
    pub reason: String,
}

/// What happened to a command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandResult {
    /// The command's id.
    pub id: String,
    /// It ran (or had already run) successfully.
    pub ok: bool,
    /// Details or the error.
    #[serde(default)]
    pub message: String,
}

/// The controller's answer to a report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReportResponse {
    /// The report was new (false: a replay, ignored).
    pub accepted: bool,
    /// Event ids the controller has recorded; the agent stops resending them.
    #[serde(default)]
    pub acknowledged_events: Vec<String>,
    /// Commands for the agent (each runs at most once, by id).
    #[serde(default)]
    pub commands: Vec<AgentCommand>,
}

/// A command from the controller to one agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentCommand {
    /// Reboot the node through systemd (verified by a new boot id).
    Reboot {
        /// Command id.
        id: String,
        /// Why, for the logs and the journal.
        reason: String,
    },
    /// Approve an Azure scheduled event early (`StartRequests`).
    AckScheduledEvent {
        /// Command id.
        id: String,
        /// The Azure `EventId`.
        event_id: String,
    },
    /// Restart one systemd unit (a repair's `restart-unit` step); the agent runs it only for a
    /// unit of its allow-list (`[agent] restart_units`) and reports a refusal otherwise. Sent
    /// only to agents that list `restart_unit` in [`NodeReport::command_types`].
    RestartUnit {
        /// Command id.
        id: String,
        /// The unit, e.g. `kubelet.service`.
        unit: String,
        /// Why, for the logs and the journal.
        reason: String,
    },
}

/// A systemd service name the agent may be asked to restart: `NAME.service`, NAME of letters,
/// digits and `:-_.@\\` (systemd's unit name characters).
pub fn valid_unit(u: &str) -> bool {
    u.len() <= 255
        && u.strip_suffix(".service").is_some_and(|n| {
            !n.is_empty()
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || ":-_.@\\".contains(c))
        })
}

impl AgentCommand {
    /// The command's id.
    pub fn id(&self) -> &str {
        match self {
            AgentCommand::Reboot { id, .. }
            | AgentCommand::AckScheduledEvent { id, .. }
            | AgentCommand::RestartUnit { id, .. } => id,
        }
    }
    /// Its `type` on the wire.
    pub fn type_name(&self) -> &'static str {
        match self {
            AgentCommand::Reboot { .. } => "reboot",
            AgentCommand::AckScheduledEvent { .. } => "ack_scheduled_event",
            AgentCommand::RestartUnit { .. } => "restart_unit",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_round_trips_and_tolerates_unknown_fields() {
        let r = NodeReport {
            version: REPORT_VERSION,
            node: "n1".into(),
            agent_version: "0.1.0".into(),
            agent_instance: "i".into(),
            sequence: 7,
            boot_id: "b".into(),
            generated_at: Utc::now(),
            identity: None,
            conditions: vec![],
            check_events: vec![],
            events: vec![],
            crio: None,
            label_removals: vec![LabelRemoval {
                label: "last-migration-failure".into(),
                reason: "cilium Ready".into(),
            }],
            command_results: vec![],
            problems: vec![],
            command_types: vec![],
        };
        let mut v = serde_json::to_value(&r).unwrap();
        v["added_later"] = serde_json::json!(1);
        let back: NodeReport = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
        let c: AgentCommand =
            serde_json::from_str(r#"{"type":"reboot","id":"r1","reason":"repair"}"#).unwrap();
        assert_eq!(
            c,
            AgentCommand::Reboot {
                id: "r1".into(),
                reason: "repair".into()
            }
        );
        // An agent before `command_types` runs reboots, not unit restarts.
        assert!(r.runs("reboot") && !r.runs("restart_unit"));
        let c: AgentCommand = serde_json::from_str(
            r#"{"type":"restart_unit","id":"u1","unit":"kubelet.service","reason":"repair"}"#,
        )
        .unwrap();
        assert_eq!((c.id(), c.type_name()), ("u1", "restart_unit"));
        let now = NodeReport {
            command_types: COMMAND_TYPES.iter().map(|t| t.to_string()).collect(),
            ..r
        };
        assert!(now.runs("restart_unit"));
        for c in COMMAND_TYPES {
            assert!(now.runs(c));
        }
    }

    fn body(version: serde_json::Value, problems: serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "version": version, "node": "n1", "agent_version": "t", "agent_instance": "i",
            "sequence": 1, "boot_id": "b", "generated_at": "2026-11-30T03:30:00Z",
            "problems": problems,
        }))
        .unwrap()
    }

    #[test]
    fn a_version_1_body_is_upgraded_to_the_current_schema() {
        let (v, r) = parse_versioned(&body(
            1.into(),
            serde_json::json!(["aws imds: invalid JSON"]),
        ))
        .unwrap();
        assert_eq!((v, r.version), (1, REPORT_VERSION));
        // Written again, it is a current body.
        let again = parse_versioned(&serde_json::to_vec(&r).unwrap()).unwrap();
        assert_eq!(again, (REPORT_VERSION, r.clone()));
        assert_eq!(r.problems, vec![Problem::new("", "aws imds: invalid JSON")]);
        // A version 1 body with version 2's problems is not a version 1 body.
        let e = parse_body(&body(
            1.into(),
            serde_json::json!([{"source": "s", "message": "m"}]),
        ))
        .unwrap_err();
        assert!(matches!(e, BodyError::Schema(_)), "{e}");
    }

    #[test]
    fn a_version_2_body_reads_typed_problems_and_refuses_strings() {
        let (v, r) = parse_versioned(&body(
            2.into(),
            serde_json::json!([{"source": "check kmsg", "message": "bad record"}]),
        ))
        .unwrap();
        assert_eq!((v, r.version), (2, 2));
        assert_eq!(r.problems, vec![Problem::new("check kmsg", "bad record")]);
        let e = parse_body(&body(2.into(), serde_json::json!(["text"]))).unwrap_err();
        assert!(matches!(e, BodyError::Schema(_)), "{e}");
    }

    #[test]
    fn other_versions_are_refused_naming_the_accepted_ones() {
        for v in [
            serde_json::json!(0),
            serde_json::json!(3),
            serde_json::json!(4_294_967_297u64),
            serde_json::json!(-1),
            serde_json::json!("2"),
            serde_json::json!(2.5),
        ] {
            let e = parse_body(&body(v.clone(), serde_json::json!([]))).unwrap_err();
            assert!(matches!(e, BodyError::Version(_)), "{v}: {e}");
            assert!(
                e.to_string()
                    .ends_with("this controller accepts report versions 1, 2"),
                "{e}"
            );
        }
        let e = parse_body(br#"{"node":"n1"}"#).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unsupported report version none; this controller accepts report versions 1, 2"
        );
    }
}

//! Everything that crosses the agent → controller boundary, versioned: the report
//! ([`NodeReport`], `POST /v1/reports`) with its node events, check results and instance identity,
//! and the controller's answer ([`ReportResponse`]) with its [`AgentCommand`]s.
//!
//! A report is the agent's whole current view of its node (conditions, CRI-O state, pending label
//! removals) plus the events not yet acknowledged by the controller. The controller answers with
//! commands for the agent. Compatibility rule: fields are only added within a version (readers
//! ignore fields they do not know); anything else bumps [`REPORT_VERSION`] (or, for an event,
//! [`NODE_EVENT_VERSION`]). The controller reads the current and the previous report version
//! ([`ACCEPTED_REPORT_VERSIONS`]; an older body is upgraded on read by [`parse_body`]) and
//! rejects any other with 400 naming the versions it accepts. Golden bodies of each accepted
//! version are in `tests/fixtures/reports/`, replayed against the controller in CI.
//!
//! A leaf: it imports nothing from `agent` or `controller` (only serde, chrono and the crate's
//! leaves; `tests/unit_like/layering.rs` checks it). Both sides import the schema from here.

mod check;
mod event;
mod identity;
mod report;

pub use check::{CheckEvent, CheckResult, ConditionStatus, EventSeverity, OWNED_PREFIX};
pub use event::{event_id, Cloud, EventKind, NodeEvent, NODE_EVENT_VERSION};
pub use identity::InstanceIdentity;
pub use report::valid_unit;
pub use report::{
    accepted_report_versions, parse_body, parse_versioned, AgentCommand, BodyError, CommandResult,
    CrioReport, CrioResult, LabelRemoval, NodeReport, Problem, ReportResponse,
    ACCEPTED_REPORT_VERSIONS, COMMAND_TYPES, LEGACY_COMMAND_TYPES, MAX_EVENTS_PER_REPORT,
    REPORT_VERSION,
};

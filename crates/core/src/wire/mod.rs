//! Everything that crosses the agent → controller boundary, versioned: the report
//! ([`NodeReport`], `POST /v1/reports`) with its node events, check results and instance identity,
//! and the controller's answer ([`ReportResponse`]) with its [`AgentCommand`]s.
//!
//! A report is the agent's whole current view of its node (conditions, CRI-O state, pending label
//! removals) plus the events not yet acknowledged by the controller. The controller answers with
//! commands for the agent. Compatibility rule: fields are only added within a version (readers
//! ignore fields they do not know); anything else bumps [`REPORT_VERSION`] (or, for an event,
//! [`NODE_EVENT_VERSION`]), and the controller rejects versions it does not know with 400.
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
pub use report::{
    parse_body, AgentCommand, BodyError, CommandResult, CrioReport, CrioResult, LabelRemoval,
    NodeReport, ReportResponse, MAX_EVENTS_PER_REPORT, REPORT_VERSION,
};

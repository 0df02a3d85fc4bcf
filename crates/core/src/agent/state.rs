//! The agent's current view of its node, assembled from checks, sources and CRI-O applies, and
//! turned into [`NodeReport`]s. Pure: no I/O, no clock of its own.

use chrono::{DateTime, Utc};

use crate::agent::checks::Round;
use crate::agent::crio::apply::{ApplyError, ApplyReport};
use crate::wire::{
    CheckEvent, CheckResult, CommandResult, CrioReport, CrioResult, InstanceIdentity, LabelRemoval,
    NodeEvent, NodeReport, Problem, REPORT_VERSION,
};

/// Command results carried in every report (the controller matches them by id).
pub const MAX_COMMAND_RESULTS: usize = 16;

/// Most check events kept between two delivered reports (older ones are dropped, counted in `problems`).
pub const MAX_CHECK_EVENTS: usize = 256;

/// What the agent knows now.
#[derive(Debug, Clone)]
pub struct AgentState {
    node: String,
    agent_instance: String,
    boot_id: String,
    sequence: u64,
    identity: Option<InstanceIdentity>,
    conditions: Vec<CheckResult>,
    check_events: Vec<CheckEvent>,
    dropped_check_events: usize,
    crio: Option<CrioReport>,
    label_removals: Vec<LabelRemoval>,
    command_results: Vec<CommandResult>,
    problems: Vec<Problem>,
    /// Fingerprint of the last published content (conditions, crio, labels, identity).
    last_published: Option<String>,
}

impl AgentState {
    /// A state for `node`, this process's `agent_instance` id, and the kernel `boot_id`.
    pub fn new(node: String, agent_instance: String, boot_id: String) -> Self {
        Self {
            node,
            agent_instance,
            boot_id,
            sequence: 0,
            identity: None,
            conditions: Vec::new(),
            check_events: Vec::new(),
            dropped_check_events: 0,
            crio: None,
            label_removals: Vec::new(),
            command_results: Vec::new(),
            problems: Vec::new(),
            last_published: None,
        }
    }

    /// Takes in one round of health checks: its conditions replace the previous ones.
    pub fn apply_round(&mut self, round: Round) {
        let mut conditions = round.conditions;
        conditions.sort_by(|a, b| a.condition_type.cmp(&b.condition_type));
        self.conditions = conditions;
        for e in round.events {
            if self.check_events.len() >= MAX_CHECK_EVENTS {
                self.check_events.remove(0);
                self.dropped_check_events += 1;
            }
            self.check_events.push(e);
        }
        self.problems = round
            .failures
            .iter()
            .map(|f| Problem::new(format!("check {}", f.check), f.error.to_string()))
            .collect();
    }

    /// Records the instance identity once it is known.
    pub fn set_identity(&mut self, identity: InstanceIdentity) {
        self.identity = Some(identity);
    }

    /// Records the outcome of a CRI-O apply.
    pub fn set_crio(
        &mut self,
        config_hash: String,
        report: &ApplyReport,
        result: &Result<(), ApplyError>,
        at: DateTime<Utc>,
    ) {
        let outcome = match (result, report.rolled_back, report.changed) {
            (Err(_), true, _) => CrioResult::RolledBack,
            (Err(_), false, _) => CrioResult::Failed,
            (Ok(()), _, true) => CrioResult::Ok,
            (Ok(()), _, false) => CrioResult::NoChange,
        };
        // A no-op re-apply keeps the unit state learnt by the last real apply.
        let unit_state = match (&self.crio, outcome, report.unit_state.as_str()) {
            (Some(prev), CrioResult::NoChange, "unknown") if prev.config_hash == config_hash => {
                prev.unit_state.clone()
            }
            _ => report.unit_state.clone(),
        };
        self.crio = Some(CrioReport {
            config_hash,
            result: outcome,
            unit_state,
            message: report.error.clone(),
            ignored: report
                .runtime
                .iter()
                .flat_map(|r| r.ignored.iter().map(ToString::to_string))
                .collect(),
            at,
        });
    }

    /// Replaces the label removals the rules currently want.
    pub fn set_label_removals(&mut self, removals: Vec<LabelRemoval>) {
        self.label_removals = removals;
    }

    /// Records the result of a controller command (the last [`MAX_COMMAND_RESULTS`] are reported).
    pub fn add_command_result(&mut self, result: CommandResult) {
        if self.command_results.len() >= MAX_COMMAND_RESULTS {
            self.command_results.remove(0);
        }
        self.command_results.push(result);
    }

    /// The kernel boot id the agent started under.
    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    /// The current conditions.
    pub fn conditions(&self) -> &[CheckResult] {
        &self.conditions
    }

    fn fingerprint(&self) -> String {
        let crio = self
            .crio
            .as_ref()
            .map(|c| (&c.config_hash, c.result, &c.unit_state, &c.message));
        serde_json::to_string(&(
            &self.conditions,
            crio,
            &self.label_removals,
            &self.identity,
            &self.problems,
            &self.command_results,
        ))
        .unwrap_or_default()
    }

    /// Whether anything a report carries changed since the last [`AgentState::report`], or
    /// check events are waiting.
    pub fn changed(&self) -> bool {
        !self.check_events.is_empty()
            || self.last_published.as_deref() != Some(self.fingerprint().as_str())
    }

    /// Builds the next report (new sequence number) with `events` and drains the check events.
    pub fn report(&mut self, events: Vec<NodeEvent>, now: DateTime<Utc>) -> NodeReport {
        self.sequence += 1;
        self.last_published = Some(self.fingerprint());
        let mut problems = self.problems.clone();
        if self.dropped_check_events > 0 {
            problems.push(Problem::new(
                "checks",
                format!(
                    "{} check events dropped (more than {MAX_CHECK_EVENTS} pending)",
                    self.dropped_check_events
                ),
            ));
            self.dropped_check_events = 0;
        }
        NodeReport {
            version: REPORT_VERSION,
            node: self.node.clone(),
            agent_version: crate::VERSION.to_string(),
            agent_instance: self.agent_instance.clone(),
            sequence: self.sequence,
            boot_id: self.boot_id.clone(),
            generated_at: now,
            identity: self.identity.clone(),
            conditions: self.conditions.clone(),
            check_events: std::mem::take(&mut self.check_events),
            events,
            crio: self.crio.clone(),
            label_removals: self.label_removals.clone(),
            command_results: self.command_results.clone(),
            problems,
            command_types: crate::wire::COMMAND_TYPES
                .iter()
                .map(|t| t.to_string())
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{ConditionStatus, EventSeverity};

    fn cond(t: &str, s: ConditionStatus) -> CheckResult {
        CheckResult {
            condition_type: t.into(),
            status: s,
            reason: "R".into(),
            message: "m".into(),
        }
    }

    #[test]
    fn reports_on_change_only_and_sequence_increases() {
        let mut st = AgentState::new("n1".into(), "i".into(), "b".into());
        assert!(st.changed(), "nothing published yet");
        let r1 = st.report(vec![], Utc::now());
        assert_eq!(r1.sequence, 1);
        assert!(!st.changed());
        st.apply_round(Round {
            conditions: vec![
                cond("B", ConditionStatus::False),
                cond("A", ConditionStatus::True),
            ],
            ..Round::default()
        });
        assert!(st.changed());
        let r2 = st.report(vec![], Utc::now());
        assert_eq!(r2.sequence, 2);
        assert_eq!(
            r2.conditions
                .iter()
                .map(|c| c.condition_type.as_str())
                .collect::<Vec<_>>(),
            vec!["A", "B"]
        );
        st.apply_round(Round {
            conditions: vec![
                cond("A", ConditionStatus::True),
                cond("B", ConditionStatus::False),
            ],
            ..Round::default()
        });
        assert!(
            !st.changed(),
            "same conditions in another order are no change"
        );
    }

    #[test]
    fn check_events_are_delivered_once_and_bounded() {
        let mut st = AgentState::new("n1".into(), "i".into(), "b".into());
        st.report(vec![], Utc::now());
        let ev = CheckEvent {
            reason: "OOMKilling".into(),
            message: "x".into(),
            severity: EventSeverity::default(),
        };
        st.apply_round(Round {
            events: vec![ev; MAX_CHECK_EVENTS + 3],
            ..Round::default()
        });
        assert!(st.changed());
        let r = st.report(vec![], Utc::now());
        assert_eq!(r.check_events.len(), MAX_CHECK_EVENTS);
        assert!(
            r.problems
                .iter()
                .any(|p| p.source == "checks" && p.message.starts_with("3 check events dropped")),
            "{:?}",
            r.problems
        );
        assert!(st.report(vec![], Utc::now()).check_events.is_empty());
    }

    #[test]
    fn crio_results() {
        let mut st = AgentState::new("n1".into(), "i".into(), "b".into());
        let changed = ApplyReport {
            changed: true,
            restarted: true,
            unit_state: "active".into(),
            ..ApplyReport::default()
        };
        st.set_crio("h".into(), &changed, &Ok(()), Utc::now());
        let noop = ApplyReport {
            unit_state: "unknown".into(),
            ..ApplyReport::default()
        };
        st.set_crio("h".into(), &noop, &Ok(()), Utc::now());
        let c = st.report(vec![], Utc::now()).crio.unwrap();
        assert_eq!(
            (c.result, c.unit_state.as_str()),
            (CrioResult::NoChange, "active")
        );
        let rolled = ApplyReport {
            changed: true,
            rolled_back: true,
            unit_state: "active".into(),
            error: Some("restart failed".into()),
            ..ApplyReport::default()
        };
        let err = Err(ApplyError::Locked { path: "/x".into() });
        st.set_crio("h2".into(), &rolled, &err, Utc::now());
        let c = st.report(vec![], Utc::now()).crio.unwrap();
        assert_eq!(c.result, CrioResult::RolledBack);
        assert_eq!(c.message.as_deref(), Some("restart failed"));
    }
}

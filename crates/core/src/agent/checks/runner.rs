//! The runner: builds the enabled checks from `[checks]`, runs them all once per tick, applies
//! each check's flap guard, and turns a failed check into `Unknown` conditions (`CheckFailed`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::ser::SerializeStruct;

use super::config::ChecksConfig;
use super::debounce::{Debounce, FlapConfig};
use super::disk::DiskCheck;
use super::kmsg::KmsgCheck;
use super::memory::MemoryCheck;
use super::pids::PidsCheck;
use super::systemd_unit::SystemdUnitCheck;
use super::{CheckError, CheckEvent, CheckResult, ConditionStatus, HealthCheck, HostRoot};
use crate::agent::host::systemd::UnitManager;

/// The reason of a condition whose check failed or timed out this round.
pub const CHECK_FAILED: &str = "CheckFailed";

/// A check that failed (its conditions are `Unknown`) or reported a non-fatal problem.
#[derive(Debug)]
pub struct CheckFailure {
    /// The check's name, e.g. `memory`.
    pub check: String,
    /// What went wrong.
    pub error: CheckError,
}

impl serde::Serialize for CheckFailure {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("CheckFailure", 2)?;
        st.serialize_field("check", &self.check)?;
        st.serialize_field("message", &self.error.to_string())?;
        st.end()
    }
}

/// What one round of all checks produced.
#[derive(Debug, Default, serde::Serialize)]
pub struct Round {
    /// Debounced conditions, one per condition type of every enabled check.
    pub conditions: Vec<CheckResult>,
    /// Temporary events (not debounced).
    pub events: Vec<CheckEvent>,
    /// Failed checks and non-fatal problems, for the logs and the report.
    pub failures: Vec<CheckFailure>,
}

struct Entry {
    check: Box<dyn HealthCheck>,
    debounce: Debounce,
    /// The error of the previous round, to log a persisting failure once.
    last_error: Option<String>,
}

/// All enabled checks with their flap guards.
pub struct Checks {
    entries: Vec<Entry>,
    timeout: Duration,
}

impl std::fmt::Debug for Checks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.entries.iter().map(|e| e.check.name()).collect();
        f.debug_struct("Checks")
            .field("checks", &names)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Checks {
    /// The enabled checks of a validated `[checks]` section; the systemd check connects to the
    /// system bus on its first run.
    pub fn from_config(cfg: &ChecksConfig) -> Self {
        let mut checks = Self::without_systemd(cfg);
        if cfg.systemd.enabled {
            checks.push(
                Box::new(SystemdUnitCheck::connecting(cfg.systemd.clone())),
                cfg.systemd.flap,
            );
        }
        checks
    }

    /// As [`Checks::from_config`], with the systemd check using `manager` (a connection shared
    /// with the CRI-O apply engine, or a fake).
    pub fn from_config_with<M: UnitManager + Send + Sync + 'static>(
        cfg: &ChecksConfig,
        manager: Arc<M>,
    ) -> Self {
        let mut checks = Self::without_systemd(cfg);
        if cfg.systemd.enabled {
            checks.push(
                Box::new(SystemdUnitCheck::new(cfg.systemd.clone(), manager)),
                cfg.systemd.flap,
            );
        }
        checks
    }

    fn without_systemd(cfg: &ChecksConfig) -> Self {
        let host = HostRoot::new(&cfg.host_root);
        let mut checks: Vec<(Box<dyn HealthCheck>, FlapConfig)> = Vec::new();
        if cfg.memory.enabled {
            checks.push((
                Box::new(MemoryCheck::new(cfg.memory.clone(), &host)),
                cfg.memory.flap,
            ));
        }
        if cfg.disk.enabled {
            checks.push((
                Box::new(DiskCheck::new(cfg.disk.clone(), &host)),
                cfg.disk.flap,
            ));
        }
        if cfg.pids.enabled {
            checks.push((
                Box::new(PidsCheck::new(cfg.pids.clone(), &host)),
                cfg.pids.flap,
            ));
        }
        if cfg.kmsg.enabled {
            checks.push((Box::new(KmsgCheck::new(cfg.kmsg.clone())), cfg.kmsg.flap));
        }
        Self::new(checks, cfg.check_timeout)
    }

    /// Arbitrary checks (tests, or checks built elsewhere), each with its flap guard.
    pub fn new(checks: Vec<(Box<dyn HealthCheck>, FlapConfig)>, timeout: Duration) -> Self {
        let entries = checks
            .into_iter()
            .map(|(check, flap)| Entry::new(check, flap))
            .collect();
        Self { entries, timeout }
    }

    /// Adds one check.
    pub fn push(&mut self, check: Box<dyn HealthCheck>, flap: FlapConfig) {
        self.entries.push(Entry::new(check, flap));
    }

    /// Names of the checks, in run order.
    pub fn names(&self) -> Vec<String> {
        self.entries
            .iter()
            .map(|e| e.check.name().to_string())
            .collect()
    }

    /// Runs every check once; `now` drives the flap guards.
    pub async fn run_once(&mut self, now: Instant) -> Round {
        let mut round = Round::default();
        for entry in &mut self.entries {
            let raw = entry.run(self.timeout, &mut round).await;
            round
                .conditions
                .extend(raw.into_iter().map(|r| entry.debounce.observe(r, now)));
        }
        round
    }
}

impl Entry {
    fn new(check: Box<dyn HealthCheck>, flap: FlapConfig) -> Self {
        Self {
            check,
            debounce: Debounce::new(flap),
            last_error: None,
        }
    }

    /// Runs the check; events and failures go into `round`, raw conditions are returned.
    async fn run(&mut self, timeout: Duration, round: &mut Round) -> Vec<CheckResult> {
        let name = self.check.name().to_string();
        let result = match tokio::time::timeout(timeout, self.check.check()).await {
            Ok(r) => r,
            Err(_) => Err(CheckError::Timeout {
                check: name.clone(),
                timeout,
            }),
        };
        match result {
            Ok(out) => {
                if self.last_error.take().is_some() {
                    tracing::info!(check = %name, "health check recovered");
                }
                round.events.extend(out.events);
                for error in out.problems {
                    tracing::warn!(check = %name, %error, "health check problem");
                    round.failures.push(CheckFailure {
                        check: name.clone(),
                        error,
                    });
                }
                out.conditions
            }
            Err(error) => {
                let text = error.to_string();
                // Log a failure when it starts or changes, not on every round it persists.
                if self.last_error.as_deref() != Some(text.as_str()) {
                    tracing::warn!(check = %name, error = %text, "health check failed");
                } else {
                    tracing::debug!(check = %name, error = %text, "health check still failing");
                }
                let msg = format!("check {name} failed: {text}");
                self.last_error = Some(text);
                round.failures.push(CheckFailure { check: name, error });
                unknown_all(self.check.as_ref(), &msg)
            }
        }
    }
}

fn unknown_all(check: &dyn HealthCheck, message: &str) -> Vec<CheckResult> {
    check
        .condition_types()
        .into_iter()
        .map(|t| CheckResult::new(t, ConditionStatus::Unknown, CHECK_FAILED, message))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>(_: &T) {}

    /// The agent loop may run a round inside a spawned task.
    #[test]
    fn checks_and_their_round_future_are_send() {
        let mut checks = Checks::from_config(&ChecksConfig::default());
        assert_send(&checks.run_once(Instant::now()));
        assert_send(&checks);
    }
}

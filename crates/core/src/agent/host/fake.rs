//! A hand-written, scripted [`UnitManager`] for unit tests of code that restarts units.
//!
//! Known units answer [`UnitManager::status`] with their current status; unknown ones answer
//! [`SystemdError::NoSuchUnit`]. Restarts take the next scripted outcome (if any), otherwise
//! succeed (`done`, `active/running`); a scripted outcome also becomes the unit's status. Every call
//! is recorded.
//!
//! ```
//! use std::time::Duration;
//! use nodekeeper_core::agent::host::fake::{FakeCall, FakeUnitManager};
//! use nodekeeper_core::agent::host::systemd::UnitManager;
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let fake = FakeUnitManager::new().with_unit("crio.service", FakeUnitManager::active());
//! fake.push_restart(Ok(FakeUnitManager::failed_restart()));
//! let outcome = fake.restart("crio.service", Duration::from_secs(1)).await.unwrap();
//! assert!(!outcome.succeeded());
//! assert_eq!(fake.status("crio.service").await.unwrap().active_state, "failed");
//! assert!(fake.restart("crio.service", Duration::from_secs(1)).await.unwrap().succeeded());
//! assert_eq!(fake.restarts("crio.service"), 2);
//! assert_eq!(fake.calls()[0], FakeCall::Restart { unit: "crio.service".into(), timeout: Duration::from_secs(1) });
//! # });
//! ```

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::systemd::{RestartOutcome, SystemdError, UnitManager, UnitStatus};

/// One call made to the fake, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeCall {
    /// `status(unit)`.
    Status {
        /// The unit asked about.
        unit: String,
    },
    /// `reset_failed(unit)`.
    ResetFailed {
        /// The unit reset.
        unit: String,
    },
    /// `restart(unit, timeout)`.
    Restart {
        /// The unit restarted.
        unit: String,
        /// The timeout passed.
        timeout: Duration,
    },
}

#[derive(Debug, Default)]
struct State {
    units: HashMap<String, UnitStatus>,
    restarts: VecDeque<Result<RestartOutcome, SystemdError>>,
    calls: Vec<FakeCall>,
}

/// A scripted, recording [`UnitManager`].
#[derive(Debug, Default)]
pub struct FakeUnitManager {
    state: Mutex<State>,
}

impl FakeUnitManager {
    /// A fake that knows no units.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add (or replace) a known unit with its status.
    pub fn with_unit(self, unit: &str, status: UnitStatus) -> Self {
        self.lock().units.insert(unit.to_string(), status);
        self
    }

    /// Queue the outcome of the next restart (outcomes are used first in, first out).
    pub fn push_restart(&self, outcome: Result<RestartOutcome, SystemdError>) {
        self.lock().restarts.push_back(outcome);
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<FakeCall> {
        self.lock().calls.clone()
    }

    /// How many restarts of `unit` were requested.
    pub fn restarts(&self, unit: &str) -> usize {
        let state = self.lock();
        state
            .calls
            .iter()
            .filter(|c| matches!(c, FakeCall::Restart { unit: u, .. } if u == unit))
            .count()
    }

    /// `loaded`, `active`, `running`, no restarts.
    pub fn active() -> UnitStatus {
        UnitStatus {
            load_state: "loaded".into(),
            active_state: "active".into(),
            sub_state: "running".into(),
            n_restarts: 0,
        }
    }

    /// `loaded`, `failed`, `failed`.
    pub fn failed() -> UnitStatus {
        UnitStatus {
            load_state: "loaded".into(),
            active_state: "failed".into(),
            sub_state: "failed".into(),
            n_restarts: 0,
        }
    }

    /// A restart whose job ended `failed`, leaving the unit failed.
    pub fn failed_restart() -> RestartOutcome {
        RestartOutcome {
            job_result: "failed".into(),
            status: Self::failed(),
        }
    }

    /// A restart whose job ended `done`, leaving the unit active.
    pub fn done_restart() -> RestartOutcome {
        RestartOutcome {
            job_result: "done".into(),
            status: Self::active(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn do_status(&self, unit: &str) -> Result<UnitStatus, SystemdError> {
        let mut state = self.lock();
        state.calls.push(FakeCall::Status {
            unit: unit.to_string(),
        });
        state
            .units
            .get(unit)
            .cloned()
            .ok_or_else(|| SystemdError::NoSuchUnit {
                unit: unit.to_string(),
            })
    }

    fn do_reset_failed(&self, unit: &str) -> Result<(), SystemdError> {
        let mut state = self.lock();
        state.calls.push(FakeCall::ResetFailed {
            unit: unit.to_string(),
        });
        match state.units.get_mut(unit) {
            Some(status) => {
                if status.active_state == "failed" {
                    status.active_state = "inactive".into();
                    status.sub_state = "dead".into();
                }
                Ok(())
            }
            None => Err(SystemdError::NoSuchUnit {
                unit: unit.to_string(),
            }),
        }
    }

    fn do_restart(&self, unit: &str, timeout: Duration) -> Result<RestartOutcome, SystemdError> {
        let mut state = self.lock();
        state.calls.push(FakeCall::Restart {
            unit: unit.to_string(),
            timeout,
        });
        let outcome = match state.restarts.pop_front() {
            Some(scripted) => scripted,
            None if state.units.contains_key(unit) => Ok(Self::done_restart()),
            None => Err(SystemdError::NoSuchUnit {
                unit: unit.to_string(),
            }),
        };
        if let Ok(o) = &outcome {
            state.units.insert(unit.to_string(), o.status.clone());
        }
        outcome
    }
}

impl UnitManager for FakeUnitManager {
    async fn status(&self, unit: &str) -> Result<UnitStatus, SystemdError> {
        self.do_status(unit)
    }

    async fn restart(&self, unit: &str, timeout: Duration) -> Result<RestartOutcome, SystemdError> {
        self.do_restart(unit, timeout)
    }

    async fn reset_failed(&self, unit: &str) -> Result<(), SystemdError> {
        self.do_reset_failed(unit)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn unknown_units_are_no_such_unit() {
        let fake = FakeUnitManager::new();
        assert!(
            matches!(fake.status("nope.service").await, Err(SystemdError::NoSuchUnit { unit }) if unit == "nope.service")
        );
        assert!(matches!(
            fake.restart("nope.service", T).await,
            Err(SystemdError::NoSuchUnit { .. })
        ));
        assert_eq!(fake.restarts("nope.service"), 1);
    }

    #[tokio::test]
    async fn scripted_outcomes_in_order_then_default_success() {
        let fake = FakeUnitManager::new().with_unit("crio.service", FakeUnitManager::active());
        fake.push_restart(Ok(FakeUnitManager::failed_restart()));
        fake.push_restart(Err(SystemdError::Timeout {
            unit: "crio.service".into(),
            timeout: T,
        }));
        assert_eq!(
            fake.restart("crio.service", T).await.unwrap().job_result,
            "failed"
        );
        assert_eq!(
            fake.status("crio.service").await.unwrap(),
            FakeUnitManager::failed()
        );
        assert!(matches!(
            fake.restart("crio.service", T).await,
            Err(SystemdError::Timeout { .. })
        ));
        assert!(fake.restart("crio.service", T).await.unwrap().succeeded());
        assert_eq!(
            fake.status("crio.service").await.unwrap(),
            FakeUnitManager::active()
        );
        assert_eq!(fake.restarts("crio.service"), 3);
        assert_eq!(fake.calls().len(), 5);
    }

    #[tokio::test]
    async fn reset_failed_clears_failed_and_is_recorded() {
        let fake = FakeUnitManager::new().with_unit("crio.service", FakeUnitManager::failed());
        fake.reset_failed("crio.service").await.unwrap();
        assert_eq!(
            fake.status("crio.service").await.unwrap().active_state,
            "inactive"
        );
        assert!(matches!(
            fake.reset_failed("nope.service").await,
            Err(SystemdError::NoSuchUnit { .. })
        ));
        assert_eq!(
            fake.calls()[0],
            FakeCall::ResetFailed {
                unit: "crio.service".into()
            }
        );
    }
}

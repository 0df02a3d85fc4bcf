//! systemd over D-Bus (placeholder interface; the zbus implementation lands from branch `nspawn`).

use std::future::Future;
use std::time::Duration;

/// A unit's state as systemd reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UnitStatus {
    /// `loaded`, `not-found`, ...
    pub load_state: String,
    /// `active`, `inactive`, `failed`, `activating`, ...
    pub active_state: String,
    /// `running`, `dead`, `failed`, ...
    pub sub_state: String,
    /// `NRestarts` of a service unit.
    pub n_restarts: u32,
}

/// The result of a restart job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartOutcome {
    /// The `JobRemoved` result: done|failed|timeout|canceled|dependency|skipped.
    pub job_result: String,
    /// The unit's state after the job.
    pub status: UnitStatus,
}

impl RestartOutcome {
    /// Job `done` and unit `active`.
    pub fn succeeded(&self) -> bool {
        self.job_result == "done" && self.status.active_state == "active"
    }
}

/// systemd errors.
#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    /// No bus.
    #[error("cannot connect to the system D-Bus at {address}: {source}")]
    Connect {
        /// Bus address.
        address: String,
        /// Cause.
        source: zbus::Error,
    },
    /// Unknown unit.
    #[error("unit {unit} not found")]
    NoSuchUnit {
        /// Unit.
        unit: String,
    },
    /// A call failed.
    #[error("{method} of {unit} failed: {source}")]
    Call {
        /// Unit.
        unit: String,
        /// Method.
        method: &'static str,
        /// Cause.
        source: zbus::Error,
    },
    /// Timeout.
    #[error("{unit} did not finish restarting within {}", humantime::format_duration(*timeout))]
    Timeout {
        /// Unit.
        unit: String,
        /// Timeout.
        timeout: Duration,
    },
}

/// What the CRI-O apply engine needs from systemd.
pub trait UnitManager {
    /// The state of `unit`.
    fn status(&self, unit: &str) -> impl Future<Output = Result<UnitStatus, SystemdError>> + Send;
    /// Restart `unit` and wait for the job.
    fn restart(
        &self,
        unit: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<RestartOutcome, SystemdError>> + Send;
}

/// The system bus connection.
pub struct Systemd;

impl Systemd {
    /// Connects to the system bus.
    pub async fn connect_system() -> Result<Self, SystemdError> {
        Err(SystemdError::Connect {
            address: "system".into(),
            source: zbus::Error::Unsupported,
        })
    }
}

impl UnitManager for Systemd {
    async fn status(&self, unit: &str) -> Result<UnitStatus, SystemdError> {
        Err(SystemdError::NoSuchUnit { unit: unit.into() })
    }
    async fn restart(
        &self,
        unit: &str,
        _timeout: Duration,
    ) -> Result<RestartOutcome, SystemdError> {
        Err(SystemdError::NoSuchUnit { unit: unit.into() })
    }
}

//! Hand-written fakes of the host traits (placeholder; replaced from branch `nspawn`).

use std::sync::Mutex;
use std::time::Duration;

use super::systemd::{RestartOutcome, SystemdError, UnitManager, UnitStatus};

/// A scripted [`UnitManager`].
#[derive(Debug, Default)]
pub struct FakeUnitManager {
    /// Status returned by `status`.
    pub status: Mutex<UnitStatus>,
    /// Outcomes returned by successive restarts (last one repeats).
    pub outcomes: Mutex<Vec<RestartOutcome>>,
    /// Units restarted, in order.
    pub restarts: Mutex<Vec<String>>,
}

impl UnitManager for FakeUnitManager {
    async fn status(&self, _unit: &str) -> Result<UnitStatus, SystemdError> {
        Ok(self.status.lock().map(|s| s.clone()).unwrap_or_default())
    }
    async fn restart(
        &self,
        unit: &str,
        _timeout: Duration,
    ) -> Result<RestartOutcome, SystemdError> {
        if let Ok(mut r) = self.restarts.lock() {
            r.push(unit.to_string());
        }
        let mut o = self
            .outcomes
            .lock()
            .map_err(|_| SystemdError::NoSuchUnit { unit: unit.into() })?;
        let out = if o.len() > 1 {
            o.remove(0)
        } else {
            o.first()
                .cloned()
                .ok_or(SystemdError::NoSuchUnit { unit: unit.into() })?
        };
        Ok(out)
    }
}

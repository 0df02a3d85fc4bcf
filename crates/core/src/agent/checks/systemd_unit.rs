//! systemd unit check (`kubelet.service`, `crio.service` by default): `ActiveState`, `SubState`
//! and growth of `NRestarts` over a window, read through [`UnitManager::status`]. One condition
//! per unit:
//! - `UnitActive` (False): active, and `NRestarts` grew less than `max_restarts` in the window;
//! - `FrequentRestarts` (True): active, but restarted `max_restarts` times or more in the window;
//! - `UnitFailed` (True): `ActiveState=failed`;
//! - `UnitNotActive` (True): inactive, activating (e.g. `auto-restart` in a crash loop),
//!   deactivating or reloading;
//! - `UnitNotLoaded` (True): `LoadState` other than `loaded` (e.g. `masked`);
//! - `UnitNotFound` (Unknown): systemd does not know the unit;
//! - `UnitQueryFailed` (Unknown): the D-Bus call failed.
//!
//! Before any systemd connection exists, the check connects to the system bus on its first run
//! (and retries on every later run until that works).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::{SystemdConfig, UnitCheckConfig};
use super::{CheckError, CheckFuture, CheckOutput, CheckResult, ConditionStatus, HealthCheck};
use crate::agent::host::systemd::{Systemd, SystemdError, UnitManager, UnitStatus};

/// How the check obtains its [`UnitManager`] when it has none yet.
pub type Connector<M> =
    Box<dyn Fn() -> Pin<Box<dyn Future<Output = Result<M, SystemdError>> + Send>> + Send>;

/// The clock the restart window is measured with (injected so tests can move time).
pub type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// NRestarts samples of one unit within the window.
#[derive(Debug, Default)]
struct History(VecDeque<(Instant, u32)>);

impl History {
    /// Records `n` at `now` and returns how much it grew within `window`.
    fn record(&mut self, now: Instant, n: u32, window: Duration) -> u32 {
        if self.0.back().is_some_and(|&(_, last)| n < last) {
            self.0.clear(); // counter reset (unit restarted by hand, manager re-executed)
        }
        self.0.push_back((now, n));
        while self
            .0
            .front()
            .is_some_and(|&(t, _)| now.saturating_duration_since(t) > window)
        {
            self.0.pop_front();
        }
        self.0
            .front()
            .map_or(0, |&(_, first)| n.saturating_sub(first))
    }
}

/// Where the check's [`UnitManager`] comes from.
enum Source<M> {
    /// Connected (or given).
    Ready(Arc<M>),
    /// Not connected yet: connect on the next run.
    Connect(Connector<M>),
}

/// The unit check.
pub struct SystemdUnitCheck<M> {
    config: SystemdConfig,
    source: Source<M>,
    clock: Clock,
    history: HashMap<String, History>,
}

impl<M> std::fmt::Debug for SystemdUnitCheck<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SystemdUnitCheck")
            .field("config", &self.config)
            .field("connected", &matches!(self.source, Source::Ready(_)))
            .finish()
    }
}

impl SystemdUnitCheck<Systemd> {
    /// A check that connects to the system bus (`DBUS_SYSTEM_BUS_ADDRESS` or the default socket)
    /// on its first run.
    pub fn connecting(config: SystemdConfig) -> Self {
        let connect: Connector<Systemd> = Box::new(|| Box::pin(Systemd::connect_system()));
        Self {
            config,
            source: Source::Connect(connect),
            clock: Arc::new(Instant::now),
            history: HashMap::new(),
        }
    }
}

impl<M: UnitManager + Send + Sync + 'static> SystemdUnitCheck<M> {
    /// A check using an existing manager (shared with the CRI-O apply engine, or a fake).
    pub fn new(config: SystemdConfig, manager: Arc<M>) -> Self {
        Self {
            config,
            source: Source::Ready(manager),
            clock: Arc::new(Instant::now),
            history: HashMap::new(),
        }
    }

    /// Replaces the clock (tests).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The condition for one unit (pure): its status and its NRestarts growth in the window.
    pub fn evaluate(
        &self,
        unit: &UnitCheckConfig,
        status: &Result<UnitStatus, SystemdError>,
        growth: u32,
    ) -> CheckResult {
        let t = &unit.condition_type;
        let name = &unit.name;
        let s = match status {
            Ok(s) => s,
            Err(SystemdError::NoSuchUnit { .. }) => {
                return CheckResult::new(
                    t,
                    ConditionStatus::Unknown,
                    "UnitNotFound",
                    format!("systemd has no unit {name}"),
                );
            }
            Err(e) => {
                return CheckResult::new(
                    t,
                    ConditionStatus::Unknown,
                    "UnitQueryFailed",
                    e.to_string(),
                )
            }
        };
        let window = humantime::format_duration(self.config.restart_window);
        let figures = format!(
            "{name}: LoadState={} ActiveState={} SubState={} NRestarts={} (+{growth} in the last {window})",
            s.load_state, s.active_state, s.sub_state, s.n_restarts
        );
        let (status, reason) = if s.load_state != "loaded" {
            (ConditionStatus::True, "UnitNotLoaded")
        } else if s.active_state == "failed" {
            (ConditionStatus::True, "UnitFailed")
        } else if s.active_state != "active" {
            (ConditionStatus::True, "UnitNotActive")
        } else if self.config.max_restarts > 0 && growth >= self.config.max_restarts {
            (ConditionStatus::True, "FrequentRestarts")
        } else {
            (ConditionStatus::False, "UnitActive")
        };
        CheckResult::new(t, status, reason, figures)
    }

    async fn manager(&mut self) -> Result<Arc<M>, CheckError> {
        let m = match &self.source {
            Source::Ready(m) => return Ok(m.clone()),
            Source::Connect(connect) => Arc::new(
                connect()
                    .await
                    .map_err(|source| CheckError::Systemd { source })?,
            ),
        };
        self.source = Source::Ready(m.clone());
        Ok(m)
    }

    async fn run(&mut self) -> Result<CheckOutput, CheckError> {
        let manager = self.manager().await?;
        let mut out = CheckOutput::default();
        for unit in self.config.units.clone() {
            let status = manager.status(&unit.name).await;
            let growth = match &status {
                Ok(s) => {
                    let now = (self.clock)();
                    self.history.entry(unit.name.clone()).or_default().record(
                        now,
                        s.n_restarts,
                        self.config.restart_window,
                    )
                }
                Err(_) => 0,
            };
            out.conditions.push(self.evaluate(&unit, &status, growth));
            if let Err(e) = status {
                if !matches!(e, SystemdError::NoSuchUnit { .. }) {
                    out.problems.push(CheckError::Unit {
                        unit: unit.name.clone(),
                        source: Box::new(e),
                    });
                }
            }
        }
        Ok(out)
    }
}

impl<M: UnitManager + Send + Sync + 'static> HealthCheck for SystemdUnitCheck<M> {
    fn name(&self) -> &str {
        "systemd"
    }

    fn condition_types(&self) -> Vec<String> {
        self.config
            .units
            .iter()
            .map(|u| u.condition_type.clone())
            .collect()
    }

    fn check(&mut self) -> CheckFuture<'_> {
        Box::pin(self.run())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_counts_growth_within_the_window() {
        let t0 = Instant::now();
        let s = |x: u64| t0 + Duration::from_secs(x);
        let w = Duration::from_secs(60);
        let mut h = History::default();
        assert_eq!(h.record(s(0), 5, w), 0);
        assert_eq!(h.record(s(10), 6, w), 1);
        assert_eq!(h.record(s(50), 8, w), 3);
        // the sample at 0 leaves the window
        assert_eq!(h.record(s(65), 8, w), 2);
        assert_eq!(h.record(s(200), 8, w), 0);
        // counter reset
        assert_eq!(h.record(s(210), 1, w), 0);
        assert_eq!(h.record(s(220), 2, w), 1);
    }
}

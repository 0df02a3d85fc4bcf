//! The controller's notion of "now": wall time in production, simulated time against the sim.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// The engine's notion of "now": wall time in production, simulated time against the sim.
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> DateTime<Utc>;
    /// The real duration of `d` of this clock's time (identity for wall time).
    fn real(&self, d: Duration) -> Duration {
        d
    }
}

/// Wall time.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

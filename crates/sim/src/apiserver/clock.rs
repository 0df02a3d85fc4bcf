//! Simulated time: real time multiplied by a scale, plus manual advances.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, SecondsFormat, Utc};

/// The simulation clock shared by the store and the control loops.
#[derive(Debug)]
pub struct SimClock {
    base_real: Instant,
    base_sim: DateTime<Utc>,
    scale: f64,
    advanced_ms: AtomicI64,
}

impl SimClock {
    /// A clock starting now, running `scale` times faster than real time (1.0 = real time).
    pub fn new(scale: f64) -> Self {
        let scale = if scale.is_finite() && scale > 0.0 {
            scale
        } else {
            1.0
        };
        SimClock {
            base_real: Instant::now(),
            base_sim: Utc::now(),
            scale,
            advanced_ms: AtomicI64::new(0),
        }
    }

    /// Current simulated time.
    pub fn now(&self) -> DateTime<Utc> {
        let real = self.base_real.elapsed().as_secs_f64() * self.scale * 1000.0;
        let ms = real as i64 + self.advanced_ms.load(Ordering::Relaxed);
        self.base_sim + chrono::Duration::milliseconds(ms)
    }

    /// Jumps simulated time forward.
    pub fn advance(&self, by: Duration) {
        let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX / 4);
        self.advanced_ms.fetch_add(ms, Ordering::Relaxed);
    }

    /// Jumps simulated time backward (tests: objects created "in the past").
    pub fn rewind(&self, by: Duration) {
        let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX / 4);
        self.advanced_ms.fetch_sub(ms, Ordering::Relaxed);
    }

    /// The time scale.
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// Real duration that corresponds to `sim` simulated time (at least 1 ms).
    pub fn real(&self, sim: Duration) -> Duration {
        sim.div_f64(self.scale).max(Duration::from_millis(1))
    }

    /// Current simulated time formatted as in object metadata.
    pub fn stamp(&self) -> String {
        fmt_time(self.now())
    }
}

/// RFC 3339 with whole seconds (`2026-01-02T03:04:05Z`), like Kubernetes `metav1.Time`.
pub fn fmt_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// RFC 3339 with microseconds, like Kubernetes `metav1.MicroTime` (lease renewTime).
pub fn fmt_micro(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Parses a `metav1.Time` or `MicroTime`.
pub fn parse_time(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn scaled_clock_runs_faster_and_advances() {
        let c = SimClock::new(100.0);
        let t0 = c.now();
        std::thread::sleep(Duration::from_millis(20));
        assert!((c.now() - t0).num_milliseconds() >= 1500);
        c.advance(Duration::from_secs(3600));
        assert!((c.now() - t0).num_seconds() >= 3600);
        assert_eq!(c.real(Duration::from_secs(10)), Duration::from_millis(100));
        assert!(parse_time(&c.stamp()).is_some());
    }
}

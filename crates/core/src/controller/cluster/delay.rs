//! Scheduling delay: how late the controller gets to run. A task on the async runtime and a
//! thread of its own each sleep [`PERIOD`], over and over, and record how much longer than that
//! each sleep took (`nodekeeper_scheduling_delay_seconds{probe}`).
//!
//! The thread's delay is the operating system's: the process short of CPU (other processes on its
//! cores, a container's CPU limit throttling it). The task's is that plus the runtime's own: its
//! workers busy, or blocked by code that should not block them. So a slow cordon whose write
//! waited while both stayed small was slow outside the process (the API server, the network);
//! with the task's delay alone large, inside the runtime; with both large, the machine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::controller::metrics::OneLabel;

/// How long each probe sleeps between two measurements.
pub const PERIOD: Duration = Duration::from_millis(100);
/// Bucket bounds, seconds: from the timer's resolution to a stall of seconds.
const BUCKETS: [f64; 11] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];
/// A delay at least this long is logged (a warning with the probe and the delay).
pub const WARN_AT: Duration = Duration::from_millis(500);

/// Which probe measured a delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// A task on the async runtime.
    Runtime,
    /// A thread of its own, outside the runtime.
    Thread,
}

impl Probe {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Probe::Runtime => "runtime",
            Probe::Thread => "thread",
        }
    }
}

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// The two probes' delays.
#[derive(Debug)]
pub struct SchedulingDelay {
    delays: Family<OneLabel, Histogram, fn() -> Histogram>,
}

impl SchedulingDelay {
    /// The histograms, both series present (so `/metrics` shows them before the first sample).
    pub fn new() -> Arc<Self> {
        let delays = Family::new_with_constructor(histogram as fn() -> Histogram);
        for p in [Probe::Runtime, Probe::Thread] {
            let _ = delays.get_or_create(&[("probe", p.as_str())]);
        }
        Arc::new(SchedulingDelay { delays })
    }

    /// Records one delay of `probe`; logs it when it is at least [`WARN_AT`].
    pub fn observe(&self, probe: Probe, delay: Duration) {
        self.delays
            .get_or_create(&[("probe", probe.as_str())])
            .observe(delay.as_secs_f64());
        if delay >= WARN_AT {
            tracing::warn!(
                probe = probe.as_str(),
                delay_ms = delay.as_millis() as u64,
                "the controller ran late: a {} ms sleep ended this much later \
                 (probe thread: the process was short of CPU; runtime alone: its workers were busy)",
                PERIOD.as_millis()
            );
        }
    }

    /// Registers `nodekeeper_scheduling_delay_seconds`.
    pub fn register(self: &Arc<Self>, registry: &mut Registry) {
        registry.register(
            "nodekeeper_scheduling_delay_seconds",
            "How much later than asked a 100 ms sleep ended: probe runtime (a task on the async \
             runtime) or thread (a thread of its own)",
            self.delays.clone(),
        );
    }

    /// Starts both probes on the current runtime; they stop when `cancel` is cancelled (the
    /// thread also once the runtime's probe and every other holder of `self` are gone, so that a
    /// controller dropped without a shutdown leaves no thread behind). Without a thread (the
    /// system refused one) the runtime's probe runs alone. Returns the thread.
    pub fn start(
        self: &Arc<Self>,
        cancel: CancellationToken,
    ) -> Option<std::thread::JoinHandle<()>> {
        let me = self.clone();
        let stop = cancel.clone();
        tokio::spawn(async move {
            loop {
                let t = Instant::now();
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(PERIOD) => {}
                }
                me.observe(Probe::Runtime, t.elapsed().saturating_sub(PERIOD));
            }
        });
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("delay-probe".into())
            .spawn(move || {
                while !cancel.is_cancelled() {
                    let t = Instant::now();
                    std::thread::sleep(PERIOD);
                    let Some(me) = weak.upgrade() else {
                        return;
                    };
                    me.observe(Probe::Thread, t.elapsed().saturating_sub(PERIOD));
                }
            });
        match spawned {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(error = %e, "no thread for the scheduling delay probe: runtime probe only");
                None
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// (samples, samples above `le` seconds) of one probe, from the encoded registry.
    fn counts(d: &Arc<SchedulingDelay>, probe: &str, le: &str) -> (u64, u64) {
        let mut r = Registry::default();
        d.register(&mut r);
        let text = crate::controller::metrics::encode(&r);
        let value = |prefix: String| -> u64 {
            text.lines()
                .find(|l| l.starts_with(&prefix))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{prefix} not in\n{text}"))
        };
        let probe_label = format!("probe=\"{probe}\"");
        let count = value(format!(
            "nodekeeper_scheduling_delay_seconds_count{{{probe_label}}}"
        ));
        let within = value(format!(
            "nodekeeper_scheduling_delay_seconds_bucket{{{probe_label},le=\"{le}\"}}"
        ));
        (count, count - within)
    }

    #[test]
    fn both_series_are_exposed_before_any_sample() {
        let d = SchedulingDelay::new();
        assert_eq!(counts(&d, "runtime", "0.001"), (0, 0));
        assert_eq!(counts(&d, "thread", "0.001"), (0, 0));
    }

    /// Dropped without a shutdown (its runtime gone, no holder left), the thread's probe ends.
    #[test]
    fn the_thread_ends_with_its_last_holder() {
        let d = SchedulingDelay::new();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let thread = rt
            .block_on(async { d.start(CancellationToken::new()) })
            .unwrap();
        drop(rt);
        drop(d);
        std::thread::sleep(PERIOD * 3);
        assert!(
            thread.is_finished(),
            "the probe's thread outlived its holders"
        );
    }

    /// A task that blocks the runtime's only worker for 400 ms shows in the runtime's probe as
    /// a delay over 250 ms; the thread's probe goes on sampling beside it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_blocked_runtime_shows_in_the_runtime_probe() {
        let d = SchedulingDelay::new();
        let cancel = CancellationToken::new();
        d.start(cancel.clone());
        // the probe's first sleep starts
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        std::thread::sleep(Duration::from_millis(400));
        tokio::time::sleep(Duration::from_millis(250)).await;
        cancel.cancel();
        let (n, late) = counts(&d, "runtime", "0.25");
        assert!(
            n >= 1 && late >= 1,
            "runtime probe: {n} samples, {late} over 250 ms"
        );
        let (n, _) = counts(&d, "thread", "0.25");
        assert!(
            n >= 3,
            "thread probe sampled while the runtime was blocked: {n}"
        );
    }
}

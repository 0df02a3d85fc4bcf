//! Runs one [`EventSource`] until shutdown: poll, forward events and errors, then wait the poll
//! interval (or a jittered, doubling backoff while every request fails).

use std::time::Duration;

use rand::Rng;
use tokio::sync::{mpsc, watch};

use super::{EventSource, NodeEvent, SourceError};

/// Jittered exponential backoff: each delay is uniform in `[d/2, d]`, `d` doubling from `base`
/// up to `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    /// A backoff starting at `base`, capped at `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max: max.max(base),
            current: base,
        }
    }
    /// The starting delay.
    pub fn base(&self) -> Duration {
        self.base
    }
    /// The next delay (and doubles the following one).
    pub fn next_delay(&mut self) -> Duration {
        let d = self.current;
        self.current = (self.current * 2).min(self.max);
        let lo = d / 2;
        let span = (d - lo).as_micros() as u64;
        lo + Duration::from_micros(rand::rng().random_range(0..=span))
    }
    /// Back to `base` after a success.
    pub fn reset(&mut self) {
        self.current = self.base;
    }
}

/// What a running source reports.
#[derive(Debug)]
pub enum SourceMessage {
    /// A new event.
    Event(NodeEvent),
    /// A failed request; the source keeps running.
    Error {
        /// The source's name.
        source: &'static str,
        /// What failed.
        error: SourceError,
    },
}

/// Polls `source` until `stop` becomes true or the receiver of `tx` is gone.
pub async fn run(
    mut source: Box<dyn EventSource>,
    interval: Duration,
    max_backoff: Duration,
    tx: mpsc::Sender<SourceMessage>,
    mut stop: watch::Receiver<bool>,
) {
    let name = source.name();
    let mut backoff = Backoff::new(interval, max_backoff);
    while !*stop.borrow() {
        let out = tokio::select! {
            out = source.poll() => out,
            _ = stop.changed() => return,
        };
        let all_failed = !out.errors.is_empty() && out.events.is_empty();
        for e in out.events {
            if tx.send(SourceMessage::Event(e)).await.is_err() {
                return;
            }
        }
        for error in out.errors {
            tracing::warn!(source = name, kind = error.label(), "{error}");
            if tx
                .send(SourceMessage::Error {
                    source: name,
                    error,
                })
                .await
                .is_err()
            {
                return;
            }
        }
        let delay = if all_failed {
            backoff.next_delay()
        } else {
            backoff.reset();
            if source.long_polls() {
                continue;
            }
            interval
        };
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_and_caps() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(400));
        let d1 = b.next_delay();
        assert!(
            d1 >= Duration::from_millis(50) && d1 <= Duration::from_millis(100),
            "{d1:?}"
        );
        let d2 = b.next_delay();
        assert!(
            d2 >= Duration::from_millis(100) && d2 <= Duration::from_millis(200),
            "{d2:?}"
        );
        for _ in 0..5 {
            assert!(b.next_delay() <= Duration::from_millis(400));
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}

//! Runs one [`EventSource`] until shutdown: poll, forward events and errors, then wait the poll
//! interval (or a jittered, doubling backoff while every request fails).

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{EventSource, NodeEvent, SourceError};

pub use crate::backoff::Backoff;

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

/// Polls `source` until `stop` is cancelled or the receiver of `tx` is gone, every `interval`,
/// or more often if the source asks to ([`EventSource::poll_interval`]).
pub async fn run(
    mut source: Box<dyn EventSource>,
    interval: Duration,
    max_backoff: Duration,
    tx: mpsc::Sender<SourceMessage>,
    stop: CancellationToken,
) {
    let name = source.name();
    let interval = source
        .poll_interval()
        .map_or(interval, |own| own.min(interval));
    let mut backoff = Backoff::new(interval, max_backoff);
    while !stop.is_cancelled() {
        let out = tokio::select! {
            out = source.poll() => out,
            _ = stop.cancelled() => return,
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
            _ = stop.cancelled() => return,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use futures::future::BoxFuture;
    use tokio::time::Instant;

    use super::*;
    use crate::agent::sources::{Cloud, EventKind, InstanceIdentity, PollOutcome};

    /// What one scripted poll returns.
    #[derive(Clone, Copy)]
    enum Poll {
        Ok,
        Event,
        Fail,
        /// An event and an error: not "all failed".
        Partial,
    }

    /// A source answering from a script; records when each poll started; stops the driver
    /// after the last scripted poll.
    struct Scripted {
        script: VecDeque<Poll>,
        long_polls: bool,
        at: Arc<Mutex<Vec<Duration>>>,
        t0: Instant,
        stop: CancellationToken,
    }

    impl EventSource for Scripted {
        fn name(&self) -> &'static str {
            "scripted"
        }
        fn cloud(&self) -> Cloud {
            Cloud::Aws
        }
        fn poll(&mut self) -> BoxFuture<'_, PollOutcome> {
            self.at.lock().unwrap().push(self.t0.elapsed());
            let step = self.script.pop_front().unwrap();
            if self.script.is_empty() {
                self.stop.cancel();
            }
            let ev =
                || NodeEvent::on_node(EventKind::ShuttingDown, "scripted", "k", chrono::Utc::now());
            let err = || SourceError::Config("down".into());
            let out = match step {
                Poll::Ok => PollOutcome::default(),
                Poll::Event => PollOutcome {
                    events: vec![ev()],
                    errors: vec![],
                },
                Poll::Fail => PollOutcome::failed(err()),
                Poll::Partial => PollOutcome {
                    events: vec![ev()],
                    errors: vec![err()],
                },
            };
            Box::pin(async move { out })
        }
        fn identity(&mut self) -> BoxFuture<'_, Result<InstanceIdentity, SourceError>> {
            Box::pin(async { Ok(InstanceIdentity::default()) })
        }
        fn long_polls(&self) -> bool {
            self.long_polls
        }
    }

    /// Runs the driver over `script`; returns the gaps between consecutive polls and the
    /// number of messages forwarded.
    async fn gaps(
        script: &[Poll],
        long_polls: bool,
        interval: Duration,
        max: Duration,
    ) -> (Vec<Duration>, usize) {
        let stop = CancellationToken::new();
        let at = Arc::new(Mutex::new(Vec::new()));
        let source = Scripted {
            script: script.iter().copied().collect(),
            long_polls,
            at: at.clone(),
            t0: Instant::now(),
            stop: stop.clone(),
        };
        let (tx, mut rx) = mpsc::channel(64);
        run(Box::new(source), interval, max, tx, stop).await;
        let mut messages = 0;
        while rx.try_recv().is_ok() {
            messages += 1;
        }
        let at = at.lock().unwrap().clone();
        assert_eq!(at.len(), script.len(), "every scripted poll ran");
        (at.windows(2).map(|w| w[1] - w[0]).collect(), messages)
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    /// Tokio's timer wheel rounds a sleep up to the next millisecond.
    fn within(gap: Duration, lo: Duration, hi: Duration) -> bool {
        gap >= lo && gap <= hi + Duration::from_millis(1)
    }

    #[tokio::test(start_paused = true)]
    async fn polls_every_interval_exactly() {
        let script = [Poll::Ok, Poll::Event, Poll::Ok, Poll::Partial, Poll::Ok];
        let (g, messages) = gaps(&script, false, S(10), S(60)).await;
        // a poll with an event and an error is not a failure: the interval, no backoff
        assert_eq!(g, vec![S(10); 4]);
        assert_eq!(messages, 3, "two events and one error forwarded");
    }

    #[tokio::test(start_paused = true)]
    async fn failing_polls_back_off_doubling_to_the_cap_then_reset() {
        use Poll::{Fail, Ok};
        let script = [Fail, Fail, Fail, Fail, Fail, Fail, Ok, Fail, Ok];
        let (g, _) = gaps(&script, false, S(1), S(8)).await;
        // nominal delays after failure n: min(1 s × 2^(n−1), 8 s), jittered into [d/2, d]
        for (i, d) in [1u64, 2, 4, 8, 8, 8].iter().enumerate() {
            assert!(
                within(g[i], S(*d) / 2, S(*d)),
                "gap {i}: {:?} for {d} s",
                g[i]
            );
        }
        assert_eq!(g[6], S(1), "after a success: the interval exactly");
        assert!(
            within(g[7], S(1) / 2, S(1)),
            "the backoff was reset: {:?}",
            g[7]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_polling_source_is_polled_again_at_once_unless_it_fails() {
        use Poll::{Event, Fail, Ok};
        let script = [Ok, Event, Ok, Fail, Fail, Ok, Ok];
        let (g, _) = gaps(&script, true, S(5), S(60)).await;
        assert_eq!(&g[..3], &[Duration::ZERO; 3]);
        assert!(within(g[3], S(5) / 2, S(5)), "{:?}", g[3]);
        assert!(within(g[4], S(5), S(10)), "{:?}", g[4]);
        assert_eq!(g[5], Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn stop_ends_the_wait_without_another_poll() {
        let stop = CancellationToken::new();
        let at = Arc::new(Mutex::new(Vec::new()));
        let unused = CancellationToken::new();
        let source = Scripted {
            script: [Poll::Ok, Poll::Ok].into_iter().collect(),
            long_polls: false,
            at: at.clone(),
            t0: Instant::now(),
            stop: unused,
        };
        let (tx, _rx) = mpsc::channel(8);
        let t0 = Instant::now();
        let task = tokio::spawn(run(Box::new(source), S(3600), S(3600), tx, stop.clone()));
        tokio::time::sleep(S(60)).await;
        stop.cancel();
        task.await.unwrap();
        assert_eq!(
            at.lock().unwrap().len(),
            1,
            "one poll, then the hour's wait ended by stop"
        );
        assert_eq!(
            t0.elapsed(),
            S(60),
            "stopped at once, not after the interval"
        );
    }
}

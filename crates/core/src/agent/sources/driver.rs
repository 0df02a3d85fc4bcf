//! Runs one [`EventSource`] until shutdown: poll, forward events and errors, then wait the poll
//! interval (or a jittered, doubling backoff while every request fails).

use std::time::Duration;

use tokio::sync::{mpsc, watch};

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

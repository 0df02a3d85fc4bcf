//! Watches: the events fanned out to watchers, the history ring they start from, compaction.

use std::sync::Arc;

use tokio::sync::broadcast;

use super::{Filter, Store, StoredObject};
use crate::apiserver::error::{ApiError, ApiResult};
use crate::apiserver::resources::ResourceDef;

/// Kind of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Object created (or entered a selector).
    Added,
    /// Object changed.
    Modified,
    /// Object removed (or left a selector).
    Deleted,
}

impl EventType {
    /// Wire name (`ADDED`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}
/// One change, as fanned out to watchers and kept in the history ring.
#[derive(Debug)]
pub struct WatchEvent {
    /// Index of the resource in [`RESOURCES`](crate::apiserver::resources::RESOURCES).
    pub res: usize,
    /// What happened.
    pub kind: EventType,
    /// resourceVersion of the change.
    pub rv: u64,
    /// The object after the change (the last state for deletions).
    pub object: Arc<StoredObject>,
    /// The object before the change, if any.
    pub prev: Option<Arc<StoredObject>>,
}

/// The start of a watch: backlog to send first, live receiver, resourceVersion at subscription.
pub type WatchStart = (
    Vec<Arc<WatchEvent>>,
    broadcast::Receiver<Arc<WatchEvent>>,
    u64,
);
/// Where a watch starts.
#[derive(Debug, Clone, Copy)]
pub enum WatchFrom {
    /// Synthetic ADDED events for all current objects, then live.
    Current,
    /// Events after this resourceVersion.
    After(u64),
}
impl Store {
    /// Starts a watch: returns the backlog to send first and the live receiver (no gap, no duplicate).
    pub fn watch(
        &self,
        res: &ResourceDef,
        filter: &Filter,
        from: WatchFrom,
    ) -> ApiResult<WatchStart> {
        let inner = self.read();
        let rx = self.tx.subscribe();
        let idx = res.index();
        let backlog = match from {
            WatchFrom::After(rv) => {
                if rv < inner.compacted_rv {
                    return Err(ApiError::gone(format!(
                        "too old resource version: {rv} ({})",
                        inner.compacted_rv
                    )));
                }
                inner
                    .history
                    .iter()
                    .filter(|e| e.res == idx && e.rv > rv)
                    .cloned()
                    .collect()
            }
            WatchFrom::Current => inner.tables[idx]
                .objects
                .iter()
                .filter(|(k, _)| filter.namespace.as_ref().is_none_or(|ns| *ns == k.0))
                .map(|(_, o)| {
                    Arc::new(WatchEvent {
                        res: idx,
                        kind: EventType::Added,
                        rv: o.summary().rv,
                        object: o.clone(),
                        prev: None,
                    })
                })
                .collect(),
        };
        Ok((backlog, rx, inner.rv))
    }

    /// Forgets the whole watch history (watches from older versions then get 410 Gone).
    pub fn compact(&self) {
        let mut inner = self.write();
        inner.compacted_rv = inner.rv;
        inner.history.clear();
    }
}

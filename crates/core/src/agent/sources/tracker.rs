//! Deduplication and cancellation shared by all sources.
//!
//! A source parses each channel's answer into [`Notice`]s and hands the complete current set to
//! [`NoticeTracker::observe`]. The tracker emits a [`NodeEvent`] for each notice not seen before
//! and one [`EventKind::Cancelled`] for each notice that was active and is gone. A channel whose
//! request failed is simply not observed, so an error never looks like a cancellation.

use std::collections::BTreeMap;

use super::{Cloud, EventKind, NodeEvent, PollOutcome, SourceError, NODE_EVENT_VERSION};
use crate::wire::event_id;
use chrono::{DateTime, Utc};

/// A notice as parsed from one channel, before it gets its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// What identifies this notice within its channel (an event id, or the payload itself).
    pub key: String,
    /// What it announces.
    pub kind: EventKind,
    /// Earliest time of the action, if stated.
    pub not_before: Option<DateTime<Utc>>,
    /// Latest time of the action, if stated.
    pub deadline: Option<DateTime<Utc>>,
    /// Fields to show (never secrets).
    pub detail: BTreeMap<String, String>,
}

impl Notice {
    /// A notice with only a key and a kind.
    pub fn new(key: impl Into<String>, kind: EventKind) -> Self {
        Self {
            key: key.into(),
            kind,
            not_before: None,
            deadline: None,
            detail: BTreeMap::new(),
        }
    }
    /// Adds a detail field.
    pub fn with(mut self, k: &str, v: impl Into<String>) -> Self {
        self.detail.insert(k.to_string(), v.into());
        self
    }
}

/// Remembers the active notices of one source, per channel.
#[derive(Debug, Default)]
pub struct NoticeTracker {
    cloud: Option<Cloud>,
    /// channel → (id → event) of the notices currently active.
    active: BTreeMap<String, BTreeMap<String, NodeEvent>>,
}

impl NoticeTracker {
    /// A tracker for one source of `cloud`.
    pub fn new(cloud: Option<Cloud>) -> Self {
        Self {
            cloud,
            active: BTreeMap::new(),
        }
    }

    /// Records the complete current notice set of `channel` (e.g. `aws/spot`) seen at `now`;
    /// returns the events for new notices, then cancellations of vanished ones.
    pub fn observe(
        &mut self,
        channel: &str,
        notices: Vec<Notice>,
        now: DateTime<Utc>,
    ) -> Vec<NodeEvent> {
        let previous = self.active.remove(channel).unwrap_or_default();
        let mut current = BTreeMap::new();
        let mut out = Vec::new();
        for n in notices {
            let id = event_id(self.cloud, channel, &n.kind, &n.key);
            if current.contains_key(&id) {
                continue;
            }
            let event = match previous.get(&id) {
                Some(seen) => seen.clone(),
                None => {
                    let e = self.event(id.clone(), channel, n, now);
                    out.push(e.clone());
                    e
                }
            };
            current.insert(id, event);
        }
        for (id, gone) in previous {
            if !current.contains_key(&id) {
                out.push(self.cancellation(channel, &gone, now));
            }
        }
        if !current.is_empty() {
            self.active.insert(channel.to_string(), current);
        }
        out
    }

    /// Observes one channel's result into `out`: its events, or its error (a failed channel is
    /// not observed, so it never yields cancellations).
    pub fn record(
        &mut self,
        out: &mut PollOutcome,
        channel: &str,
        result: Result<Vec<Notice>, SourceError>,
    ) {
        match result {
            Ok(n) => out.events.extend(self.observe(channel, n, Utc::now())),
            Err(e) => out.errors.push(e),
        }
    }

    /// The notices currently active, over all channels.
    pub fn active(&self) -> impl Iterator<Item = &NodeEvent> {
        self.active.values().flat_map(BTreeMap::values)
    }

    fn event(&self, id: String, channel: &str, n: Notice, now: DateTime<Utc>) -> NodeEvent {
        NodeEvent {
            version: NODE_EVENT_VERSION,
            id,
            kind: n.kind,
            cloud: self.cloud,
            source: channel.to_string(),
            not_before: n.not_before,
            deadline: n.deadline,
            detected_at: now,
            detail: n.detail,
        }
    }

    fn cancellation(&self, channel: &str, gone: &NodeEvent, now: DateTime<Utc>) -> NodeEvent {
        let kind = EventKind::Cancelled {
            of: gone.id.clone(),
        };
        let mut detail = BTreeMap::new();
        detail.insert("cancelled_kind".to_string(), gone.kind.name().to_string());
        NodeEvent {
            version: NODE_EVENT_VERSION,
            id: event_id(self.cloud, channel, &kind, &gone.id),
            kind,
            cloud: self.cloud,
            source: channel.to_string(),
            not_before: None,
            deadline: None,
            detected_at: now,
            detail,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn n(key: &str) -> Notice {
        Notice::new(key, EventKind::Preemption)
    }

    #[test]
    fn new_notice_once_then_cancel_once() {
        let mut t = NoticeTracker::new(Some(Cloud::Aws));
        let now = Utc::now();
        let first = t.observe("aws/spot", vec![n("a")], now);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].kind, EventKind::Preemption);
        assert!(t.observe("aws/spot", vec![n("a")], now).is_empty());
        let gone = t.observe("aws/spot", vec![], now);
        assert_eq!(gone.len(), 1);
        assert_eq!(
            gone[0].kind,
            EventKind::Cancelled {
                of: first[0].id.clone()
            }
        );
        assert!(t.observe("aws/spot", vec![], now).is_empty());
    }

    #[test]
    fn ids_are_deterministic_and_distinct() {
        let mut a = NoticeTracker::new(Some(Cloud::Aws));
        let mut b = NoticeTracker::new(Some(Cloud::Aws));
        let now = Utc::now();
        let ea = a.observe("aws/spot", vec![n("x")], now);
        let eb = b.observe("aws/spot", vec![n("x")], now);
        assert_eq!(ea[0].id, eb[0].id);
        let other_channel = b.observe("aws/rebalance", vec![n("x")], now);
        assert_ne!(other_channel[0].id, ea[0].id);
        assert_eq!(ea[0].id.len(), 32);
    }

    #[test]
    fn channels_are_independent() {
        let mut t = NoticeTracker::new(Some(Cloud::Azure));
        let now = Utc::now();
        assert_eq!(t.observe("c1", vec![n("a")], now).len(), 1);
        assert_eq!(t.observe("c2", vec![n("b")], now).len(), 1);
        assert!(t.observe("c2", vec![n("b")], now).is_empty());
        assert_eq!(t.active().count(), 2);
    }
}

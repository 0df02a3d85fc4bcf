//! The reporter's persisted state: the unacknowledged events (bounded, deduplicated by id) and the
//! ids of the commands already forwarded, each a JSON file in the state directory written durably
//! ([`atomic_write`](crate::agent::fsops::atomic_write)) after every change, so a restarted agent
//! resends the events and runs no command twice. The events' file is written by an
//! [`EventsWrite`], which the reporter runs off its async task so that a notice's report does not
//! wait for the disk; writes finishing out of order leave the latest state.

use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::ReporterError;
use crate::wire::NodeEvent;
use crate::wire::{AgentCommand, CommandResult, NodeReport};

/// The unacknowledged events, persisted in the state directory (a JSON array).
pub const EVENTS_FILE: &str = "reporter-events.json";
const COMMANDS_FILE: &str = "reporter-commands.json";
const REMEMBERED_COMMANDS: usize = 1000;

/// The events not yet acknowledged and the commands already run, as persisted.
#[derive(Debug)]
pub(super) struct Queue {
    state_dir: PathBuf,
    max_events: usize,
    events: VecDeque<NodeEvent>,
    executed: VecDeque<String>,
    /// Ids already executed when this reporter started (by an earlier agent process).
    earlier: HashSet<String>,
    /// Commands the controller still sends that an earlier agent process ran: their results were
    /// lost with that process, so each report answers them (else the controller resends forever).
    replayed: Vec<String>,
    /// The events' states taken for writing so far ([`Queue::events_write`]).
    generation: u64,
    /// The latest of them written (shared with the writes in flight).
    written: Arc<Mutex<u64>>,
    /// Events dropped and not yet told ([`Queue::take_dropped`]).
    dropped: usize,
}

/// One state of the event queue, serialized, to be written to the state directory by a thread
/// that may block on the disk ([`EventsWrite::run`]).
#[derive(Debug)]
pub(super) struct EventsWrite {
    path: PathBuf,
    bytes: serde_json::Result<Vec<u8>>,
    generation: u64,
    written: Arc<Mutex<u64>>,
}

impl EventsWrite {
    /// Writes this state durably unless a later one is already written (a failure is logged).
    pub(super) fn run(self) {
        let EventsWrite {
            path,
            bytes,
            generation,
            written,
        } = self;
        // A poisoned lock only means a write panicked; the generation it guards is still right.
        let mut written = written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *written >= generation {
            return;
        }
        match store_bytes(&path, bytes) {
            Ok(()) => *written = generation,
            Err(e) => tracing::warn!(
                error = crate::telemetry::error_chain(&e),
                "cannot persist the event queue"
            ),
        }
    }
}

impl Queue {
    /// The state persisted in `state_dir` (created if missing), keeping at most `max_events`.
    pub(super) fn load(state_dir: &Path, max_events: usize) -> Result<Self, ReporterError> {
        std::fs::create_dir_all(state_dir).map_err(|source| ReporterError::State {
            path: state_dir.to_path_buf(),
            source,
        })?;
        let mut events: VecDeque<NodeEvent> =
            load_json(&state_dir.join(EVENTS_FILE)).unwrap_or_default();
        // A file written by a build with a larger bound, or by hand: the bound holds on load too.
        let dropped = events.len().saturating_sub(max_events);
        if dropped > 0 {
            events.drain(..dropped);
            tracing::error!(
                dropped,
                kept = events.len(),
                path = %state_dir.join(EVENTS_FILE).display(),
                "saved report queue over max_queued_events: dropped the oldest events"
            );
        }
        let executed: VecDeque<String> =
            load_json(&state_dir.join(COMMANDS_FILE)).unwrap_or_default();
        Ok(Queue {
            state_dir: state_dir.to_path_buf(),
            max_events,
            events,
            earlier: executed.iter().cloned().collect(),
            executed,
            replayed: Vec::new(),
            generation: 0,
            written: Arc::new(Mutex::new(0)),
            dropped,
        })
    }

    /// Events dropped since the last call (over `max_queued_events` on load, or too large to
    /// send), to be told in the next report's problems.
    pub(super) fn take_dropped(&mut self) -> usize {
        std::mem::take(&mut self.dropped)
    }

    /// Drops the event `id` (one that cannot be sent: alone it does not fit a report).
    pub(super) fn drop_unsendable(&mut self, id: &str) {
        let before = self.events.len();
        self.events.retain(|e| e.id != id);
        self.dropped += before - self.events.len();
    }

    /// Unacknowledged events, oldest first.
    pub(super) fn events(&self) -> impl Iterator<Item = &NodeEvent> {
        self.events.iter()
    }

    /// How many events are unacknowledged.
    pub(super) fn len(&self) -> usize {
        self.events.len()
    }

    /// Queues `ev` (unless an event with its id is queued); when full, the oldest event is dropped
    /// (never while under the bound). True when `ev` was queued: the queue is then to be written.
    pub(super) fn enqueue(&mut self, ev: NodeEvent) -> bool {
        if self.events.iter().any(|e| e.id == ev.id) {
            return false;
        }
        if self.events.len() >= self.max_events {
            if let Some(old) = self.events.pop_front() {
                self.dropped += 1;
                tracing::error!(id = %old.id, kind = old.kind.name(), "report queue full: dropped the oldest event");
            }
        }
        self.events.push_back(ev);
        true
    }

    /// Drops the events the controller acknowledged. True when one was: the queue is then to be
    /// written.
    pub(super) fn acknowledge(&mut self, ids: &[String]) -> bool {
        let before = self.events.len();
        self.events.retain(|e| !ids.contains(&e.id));
        self.events.len() != before
    }

    /// The queue as it is now, to be written to the state directory ([`EventsWrite::run`]).
    pub(super) fn events_write(&mut self) -> EventsWrite {
        self.generation += 1;
        EventsWrite {
            path: self.state_dir.join(EVENTS_FILE),
            bytes: serde_json::to_vec(&self.events),
            generation: self.generation,
            written: Arc::clone(&self.written),
        }
    }

    /// Adds a result for every command an earlier agent process ran and the controller still
    /// sends (unless the report already carries one).
    pub(super) fn answer_replayed(&self, report: &mut NodeReport) {
        for id in &self.replayed {
            if !report.command_results.iter().any(|r| &r.id == id) {
                report.command_results.push(CommandResult {
                    id: id.clone(),
                    ok: true,
                    message: "already run by an earlier agent process (before a restart or \
                              reboot); not run again"
                        .into(),
                });
            }
        }
    }

    /// Records new command ids (persisted first) and returns the commands not seen before.
    pub(super) fn fresh_commands(&mut self, cmds: Vec<AgentCommand>) -> Vec<AgentCommand> {
        let mut out = Vec::new();
        self.replayed.clear();
        for c in cmds {
            let id = c.id().to_string();
            if self.executed.contains(&id) {
                tracing::debug!(%id, "command already executed: not running it again");
                // Run by this process: the agent loop reports its real result.
                if self.earlier.contains(&id) {
                    self.replayed.push(id);
                }
                continue;
            }
            self.executed.push_back(id);
            while self.executed.len() > REMEMBERED_COMMANDS {
                self.executed.pop_front();
            }
            out.push(c);
        }
        if !out.is_empty() {
            if let Err(e) = store_json(&self.state_dir.join(COMMANDS_FILE), &self.executed) {
                tracing::error!(
                    error = crate::telemetry::error_chain(&e),
                    "cannot persist command ids: not running the commands"
                );
                return vec![];
            }
        }
        out
    }
}

fn load_json<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    let text = std::fs::read(path).ok()?;
    match serde_json::from_slice(&text) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "ignoring an unreadable state file");
            None
        }
    }
}

fn store_json<T: Serialize>(path: &Path, v: &T) -> Result<(), ReporterError> {
    store_bytes(path, serde_json::to_vec(v))
}

/// Writes `bytes` (a value serialized, or why it could not be) durably to `path`.
fn store_bytes(path: &Path, bytes: serde_json::Result<Vec<u8>>) -> Result<(), ReporterError> {
    let text = bytes.map_err(|e| ReporterError::State {
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    let dir = path.parent().unwrap_or(Path::new("."));
    Ok(crate::agent::fsops::atomic_write(path, &text, dir)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::EventKind;

    fn ev(id: &str) -> NodeEvent {
        NodeEvent {
            version: 1,
            id: id.into(),
            kind: EventKind::Maintenance,
            cloud: None,
            source: "t".into(),
            not_before: None,
            deadline: None,
            detected_at: chrono::Utc::now(),
            detail: Default::default(),
        }
    }

    fn empty_report() -> NodeReport {
        crate::agent::state::AgentState::new("n".into(), "i".into(), "b".into())
            .report(vec![], chrono::Utc::now())
    }

    #[test]
    fn queue_is_bounded_deduplicated_and_persisted_and_commands_run_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = Queue::load(dir.path(), 2).unwrap();
        let queued: Vec<bool> = ["a", "b", "b", "c"]
            .into_iter()
            .map(|id| r.enqueue(ev(id)))
            .collect();
        assert_eq!(
            queued,
            [true, true, false, true],
            "a queued id is not queued again"
        );
        let ids: Vec<&str> = r.events().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, vec!["b", "c"]);
        r.events_write().run();
        let reboot = |id: &str| AgentCommand::Reboot {
            id: id.into(),
            reason: "x".into(),
        };
        assert_eq!(r.fresh_commands(vec![reboot("r1"), reboot("r1")]).len(), 1);
        assert!(r.fresh_commands(vec![reboot("r1")]).is_empty());
        let mut report = empty_report();
        r.answer_replayed(&mut report);
        assert!(
            report.command_results.is_empty(),
            "run by this process: the agent loop reports the real result"
        );
        let left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "every write renamed into place: {left:?}");
        let mut again = Queue::load(dir.path(), 2).unwrap();
        let ids: Vec<&str> = again.events().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, vec!["b", "c"], "queue reloaded from state_dir");
        assert!(
            again.fresh_commands(vec![reboot("r1")]).is_empty(),
            "command ids survive restarts"
        );
        let mut report = empty_report();
        again.answer_replayed(&mut report);
        assert_eq!(report.command_results.len(), 1);
        assert_eq!(
            (
                report.command_results[0].id.as_str(),
                report.command_results[0].ok
            ),
            ("r1", true)
        );
        assert_eq!(again.fresh_commands(vec![reboot("r2")]).len(), 1);
        let mut report = empty_report();
        again.answer_replayed(&mut report);
        assert!(
            report.command_results.is_empty(),
            "no longer sent by the controller: no longer answered"
        );
    }

    #[test]
    fn writes_finishing_out_of_order_leave_the_latest_queue() {
        let dir = tempfile::tempdir().unwrap();
        let mut q = Queue::load(dir.path(), 8).unwrap();
        let reload = || -> Vec<String> {
            Queue::load(dir.path(), 8)
                .unwrap()
                .events()
                .map(|e| e.id.clone())
                .collect()
        };
        assert!(q.enqueue(ev("a")));
        let first = q.events_write();
        assert!(q.enqueue(ev("b")));
        let second = q.events_write();
        assert!(q.acknowledge(&["a".to_string()]));
        assert!(!q.acknowledge(&["a".to_string()]), "already gone");
        let third = q.events_write();
        second.run();
        assert_eq!(reload(), ["a", "b"]);
        third.run();
        assert_eq!(reload(), ["b"]);
        first.run();
        assert_eq!(
            reload(),
            ["b"],
            "an older state never overwrites a newer one"
        );
    }
}

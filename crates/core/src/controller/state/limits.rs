//! What one node's reports may ask of the controller (`[controller.report_limits]`): the pure
//! check of a report against the limits ([`check`]), the time-window deduplication of event ids
//! ([`SeenEvents`]) and the per-node token bucket of Event creation ([`Bucket`]).
//!
//! A token proves which node reports, not that the node is honest: without these, one node's
//! valid report put 9,000 conditions on its Node, 1,000 Events per resend, and 8,000 notices.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use serde::{Deserialize, Serialize};
// tokio's clock: the wall clock, or a paused one in tests.
use tokio::time::Instant;

use crate::cfg_path;
use crate::config::Diagnostic;
use crate::wire::NodeReport;

pub use crate::wire::MAX_EVENTS_PER_REPORT;

/// `[controller.report_limits]`: a report over any of them is refused whole (400 naming the
/// limit, `nodekeeper_reports_over_limit_total{limit}`), and nothing of it is written.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ReportLimits {
    /// Conditions in one report (every entry, owned or not).
    pub max_conditions: usize,
    /// Distinct owned (`Nodekeeper*`) condition types in one report: a report sets the Node's
    /// full owned set, so this is also the most a Node carries.
    pub max_condition_types: usize,
    /// Check events in one report (the agent keeps at most 256 between reports).
    pub max_check_events: usize,
    /// Notices (`events`) in one report (the agent sends at most 64, oldest first).
    pub max_events: usize,
    /// Longest condition or check-event message, and longest notice id, in bytes.
    pub max_message_bytes: usize,
    /// Longest condition type, condition reason or check-event reason, in bytes.
    pub max_reason_bytes: usize,
    /// A notice id seen within this long is not new again (a resent batch counts once).
    #[serde(with = "humantime_serde")]
    pub event_dedup_window: Duration,
    /// Kubernetes Events about one node recorded in a burst (check events and notices); past it
    /// one per `events_every`, and one `EventsRateLimited` Event says that some were dropped.
    pub events_burst: u32,
    /// The refill interval of `events_burst`.
    #[serde(with = "humantime_serde")]
    pub events_every: Duration,
    /// New notices taken from one node in a burst; past it one per `notices_every`. A notice
    /// over the rate is not acknowledged, so the agent sends it again: none is lost.
    pub notices_burst: u32,
    /// The refill interval of `notices_burst`.
    #[serde(with = "humantime_serde")]
    pub notices_every: Duration,
}

impl Default for ReportLimits {
    fn default() -> Self {
        ReportLimits {
            max_conditions: 128,
            max_condition_types: 64,
            max_check_events: 256,
            max_events: MAX_EVENTS_PER_REPORT,
            max_message_bytes: 4096,
            max_reason_bytes: 256,
            event_dedup_window: Duration::from_secs(3600),
            // kubelet's spam filter: 25 per object, then one per 5 minutes; a node's checks may
            // report bursts of kernel lines, so one per 10 s.
            events_burst: 25,
            events_every: Duration::from_secs(10),
            notices_burst: 16,
            notices_every: Duration::from_secs(10),
        }
    }
}

impl ReportLimits {
    /// Every limit must be above zero.
    pub fn validate(&self) -> Vec<Diagnostic> {
        let counts: [(&str, u64); 8] = [
            ("max_conditions", self.max_conditions as u64),
            ("max_condition_types", self.max_condition_types as u64),
            ("max_check_events", self.max_check_events as u64),
            ("max_events", self.max_events as u64),
            ("max_message_bytes", self.max_message_bytes as u64),
            ("max_reason_bytes", self.max_reason_bytes as u64),
            ("events_burst", u64::from(self.events_burst)),
            ("notices_burst", u64::from(self.notices_burst)),
        ];
        let times = [
            ("event_dedup_window", self.event_dedup_window),
            ("events_every", self.events_every),
            ("notices_every", self.notices_every),
        ];
        let zero = counts
            .iter()
            .filter(|(_, v)| *v == 0)
            .map(|(k, _)| *k)
            .chain(times.iter().filter(|(_, v)| v.is_zero()).map(|(k, _)| *k));
        zero.map(|k| {
            Diagnostic::error(
                cfg_path!["controller", "report_limits", k],
                format!("{k} must be greater than 0"),
            )
        })
        .collect()
    }
}

/// Which limit a report went over (the `limit` label and the key of `[controller.report_limits]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Limit {
    /// `max_conditions`
    Conditions,
    /// `max_condition_types`
    ConditionTypes,
    /// `max_check_events`
    CheckEvents,
    /// `max_events`
    Events,
    /// `max_message_bytes`
    MessageBytes,
    /// `max_reason_bytes`
    ReasonBytes,
}

impl Limit {
    /// Every limit, for the metric's samples.
    pub const ALL: [Limit; 6] = [
        Limit::Conditions,
        Limit::ConditionTypes,
        Limit::CheckEvents,
        Limit::Events,
        Limit::MessageBytes,
        Limit::ReasonBytes,
    ];

    /// The key in `[controller.report_limits]`.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Conditions => "max_conditions",
            Limit::ConditionTypes => "max_condition_types",
            Limit::CheckEvents => "max_check_events",
            Limit::Events => "max_events",
            Limit::MessageBytes => "max_message_bytes",
            Limit::ReasonBytes => "max_reason_bytes",
        }
    }
}

/// A report over a limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("report over [controller.report_limits] {}: {found} {what}, at most {max}", limit.as_str())]
pub struct Exceeded {
    /// The limit.
    pub limit: Limit,
    /// What the report had.
    pub found: usize,
    /// The limit's value.
    pub max: usize,
    /// What was counted.
    pub what: &'static str,
}

/// Whether `report` keeps within `limits` (owned types start with `prefix`). Pure: the handler
/// calls it before anything of the report is stored or written.
pub fn check(report: &NodeReport, limits: &ReportLimits, prefix: &str) -> Result<(), Exceeded> {
    let over = |limit, found: usize, max: usize, what| {
        if found > max {
            Err(Exceeded {
                limit,
                found,
                max,
                what,
            })
        } else {
            Ok(())
        }
    };
    over(
        Limit::Conditions,
        report.conditions.len(),
        limits.max_conditions,
        "conditions",
    )?;
    let types: BTreeSet<&str> = report
        .conditions
        .iter()
        .map(|c| c.condition_type.as_str())
        .filter(|t| t.starts_with(prefix))
        .collect();
    over(
        Limit::ConditionTypes,
        types.len(),
        limits.max_condition_types,
        "owned condition types",
    )?;
    over(
        Limit::CheckEvents,
        report.check_events.len(),
        limits.max_check_events,
        "check events",
    )?;
    over(
        Limit::Events,
        report.events.len(),
        limits.max_events,
        "events",
    )?;
    let longest = |it: &mut dyn Iterator<Item = usize>| it.max().unwrap_or(0);
    let message = longest(
        &mut report
            .conditions
            .iter()
            .map(|c| c.message.len())
            .chain(report.check_events.iter().map(|e| e.message.len()))
            .chain(report.events.iter().map(|e| e.id.len())),
    );
    over(
        Limit::MessageBytes,
        message,
        limits.max_message_bytes,
        "bytes in a message or event id",
    )?;
    let reason = longest(
        &mut report
            .conditions
            .iter()
            .flat_map(|c| [c.condition_type.len(), c.reason.len()])
            .chain(report.check_events.iter().map(|e| e.reason.len())),
    );
    over(
        Limit::ReasonBytes,
        reason,
        limits.max_reason_bytes,
        "bytes in a condition type or reason",
    )
}

/// Notice ids one node sent, each remembered for the dedup window after it was last seen: a
/// batch resent within the window is never new again, however many ids it holds. Its size is
/// bounded by the notices' rate ([`Bucket`]): only ids taken are remembered.
#[derive(Debug, Default)]
pub struct SeenEvents {
    last_seen: HashMap<String, Instant>,
}

impl SeenEvents {
    /// Whether `id` was seen within `window` before `now`; refreshes it when it was.
    pub fn seen(&mut self, id: &str, now: Instant, window: Duration) -> bool {
        match self.last_seen.get_mut(id) {
            Some(t) if now.saturating_duration_since(*t) < window => {
                *t = now;
                true
            }
            _ => false,
        }
    }

    /// Remembers `id` as seen at `now`, and forgets the ids not seen within `window`.
    pub fn remember(&mut self, id: &str, now: Instant, window: Duration) {
        self.last_seen
            .retain(|_, t| now.saturating_duration_since(*t) < window);
        self.last_seen.insert(id.to_string(), now);
    }

    /// Whether `id` is remembered (seen within the window, as of the last [`Self::remember`]).
    pub fn contains(&self, id: &str) -> bool {
        self.last_seen.contains_key(id)
    }

    /// Ids remembered.
    pub fn len(&self) -> usize {
        self.last_seen.len()
    }

    /// None remembered.
    pub fn is_empty(&self) -> bool {
        self.last_seen.is_empty()
    }
}

/// A token bucket: `burst` at once, then one per `every`.
#[derive(Debug, Clone)]
pub struct Bucket {
    tokens: f64,
    at: Option<Instant>,
}

impl Default for Bucket {
    fn default() -> Self {
        Bucket {
            tokens: f64::INFINITY,
            at: None,
        }
    }
}

impl Bucket {
    /// Takes one token at `now` if there is one.
    pub fn take(&mut self, now: Instant, burst: u32, every: Duration) -> bool {
        let burst = f64::from(burst.max(1));
        let refill = match self.at {
            Some(at) => now.saturating_duration_since(at).as_secs_f64() / every.as_secs_f64(),
            None => burst,
        };
        self.tokens = (self.tokens.min(burst) + refill).min(burst);
        self.at = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::wire::{CheckEvent, CheckResult, ConditionStatus, EventSeverity};

    fn report() -> NodeReport {
        crate::agent::state::AgentState::new("n".into(), "i".into(), "b".into())
            .report(vec![], chrono::Utc::now())
    }

    fn cond(t: &str) -> CheckResult {
        CheckResult::new(t, ConditionStatus::True, "R", "m")
    }

    fn ev(id: &str) -> crate::wire::NodeEvent {
        crate::wire::NodeEvent {
            version: 1,
            id: id.into(),
            kind: crate::wire::EventKind::Maintenance,
            cloud: None,
            source: "t".into(),
            not_before: None,
            deadline: None,
            detected_at: chrono::Utc::now(),
            detail: Default::default(),
        }
    }

    #[test]
    fn a_report_is_refused_naming_the_first_limit_it_exceeds() {
        let l = ReportLimits {
            max_conditions: 4,
            max_condition_types: 2,
            max_check_events: 2,
            max_events: 2,
            max_message_bytes: 8,
            max_reason_bytes: 12,
            ..ReportLimits::default()
        };
        fn check_ev(reason: &str, msg: &str) -> CheckEvent {
            CheckEvent {
                reason: reason.into(),
                message: msg.into(),
                severity: EventSeverity::Warning,
            }
        }
        type Case = (&'static str, fn(&mut NodeReport), Option<Limit>);
        let cases: Vec<Case> = vec![
            ("empty", |_| {}, None),
            (
                "at every limit",
                |r| {
                    r.conditions = vec![cond("NodekeeperA"), cond("NodekeeperB"), cond("Other")];
                    r.check_events = vec![CheckEvent {
                        reason: "R".into(),
                        message: "12345678".into(),
                        severity: EventSeverity::Normal,
                    }];
                },
                None,
            ),
            (
                "5 conditions",
                |r| r.conditions = vec![cond("NodekeeperA"); 5],
                Some(Limit::Conditions),
            ),
            (
                "3 owned types (unowned not counted, repeats once)",
                |r| {
                    r.conditions = vec![
                        cond("NodekeeperA"),
                        cond("NodekeeperA"),
                        cond("NodekeeperB"),
                        cond("NodekeeperC"),
                    ]
                },
                Some(Limit::ConditionTypes),
            ),
            (
                "3 check events",
                |r| r.check_events = vec![check_ev("R", "m"); 3],
                Some(Limit::CheckEvents),
            ),
            (
                "3 events",
                |r| r.events = vec![ev("a"), ev("b"), ev("c")],
                Some(Limit::Events),
            ),
            (
                "a long message",
                |r| r.check_events = vec![check_ev("R", "123456789")],
                Some(Limit::MessageBytes),
            ),
            (
                "a long event id",
                |r| r.events = vec![ev("123456789")],
                Some(Limit::MessageBytes),
            ),
            (
                "a long reason",
                |r| r.check_events = vec![check_ev("Reason6789abc", "m")],
                Some(Limit::ReasonBytes),
            ),
            (
                "a long condition type",
                |r| r.conditions = vec![cond("NodekeeperABC")],
                Some(Limit::ReasonBytes),
            ),
        ];
        for (name, edit, want) in cases {
            let mut r = report();
            edit(&mut r);
            let got = check(&r, &l, "Nodekeeper").err().map(|e| e.limit);
            assert_eq!(got, want, "{name}");
        }
        let mut r = report();
        r.conditions = vec![cond("NodekeeperA"); 5];
        let e = check(&r, &l, "Nodekeeper").unwrap_err();
        assert_eq!(
            e.to_string(),
            "report over [controller.report_limits] max_conditions: 5 conditions, at most 4"
        );
    }

    #[test]
    fn defaults_admit_what_the_agent_sends_and_validate() {
        let l = ReportLimits::default();
        assert!(l.validate().is_empty());
        assert_eq!(l.max_events, MAX_EVENTS_PER_REPORT);
        assert!(l.max_check_events >= crate::agent::state::MAX_CHECK_EVENTS);
        let zero = ReportLimits {
            max_events: 0,
            events_every: Duration::ZERO,
            ..l
        };
        let d = format!("{:?}", zero.validate());
        assert!(
            d.contains("max_events") && d.contains("events_every"),
            "{d}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_id_resent_within_the_window_is_not_new_however_many_were_sent() {
        let w = Duration::from_secs(3600);
        let mut s = SeenEvents::default();
        let t0 = Instant::now();
        // 300 ids (more than the former fixed 256), resent: none is new the second time.
        for i in 0..300 {
            assert!(!s.seen(&format!("e{i}"), t0, w));
            s.remember(&format!("e{i}"), t0, w);
        }
        let t1 = t0 + Duration::from_secs(60);
        assert!((0..300).all(|i| s.seen(&format!("e{i}"), t1, w)));
        // Resending refreshes: still seen an hour after the first time.
        assert!(s.seen("e0", t0 + Duration::from_secs(3599 + 60), w));
        // Forgotten after the window without a resend.
        let late = t1 + w;
        assert!(!s.seen("e1", late, w));
        s.remember("new", late, w);
        assert!(s.len() <= 2, "{}", s.len());
    }

    #[tokio::test(start_paused = true)]
    async fn the_bucket_gives_a_burst_then_one_per_interval() {
        let mut b = Bucket::default();
        let every = Duration::from_secs(10);
        let t0 = Instant::now();
        let taken = (0..100).filter(|_| b.take(t0, 25, every)).count();
        assert_eq!(taken, 25);
        assert!(!b.take(t0 + Duration::from_secs(9), 25, every));
        assert!(b.take(t0 + Duration::from_secs(10), 25, every));
        assert!(!b.take(t0 + Duration::from_secs(11), 25, every));
        // A long pause refills to the burst, never beyond.
        let later = t0 + Duration::from_secs(3600);
        assert_eq!((0..100).filter(|_| b.take(later, 25, every)).count(), 25);
    }
}

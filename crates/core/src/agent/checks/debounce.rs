//! The flap guard: a condition's reported status changes only after the new status was seen in
//! `count` consecutive results **and** has persisted for `for` (both configurable per check;
//! `count = 1` and `for = "0s"` turn the guard off). Pure: the caller passes the time.
//!
//! The first result for a condition type is taken as is: there is no earlier state to flap from.
//! A result with the same status as the reported one refreshes its reason and message at once
//! and cancels any pending change.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::{CheckResult, ConditionStatus};

/// How stable a new status must be before it is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FlapConfig {
    /// Consecutive results with the new status needed (at least 1).
    pub count: u32,
    /// How long the new status must have persisted since it was first seen.
    #[serde(rename = "for", with = "humantime_serde")]
    pub duration: Duration,
}

impl Default for FlapConfig {
    fn default() -> Self {
        Self {
            count: 3,
            duration: Duration::ZERO,
        }
    }
}

impl FlapConfig {
    /// A guard that needs `count` consecutive results and `duration` of persistence.
    pub fn new(count: u32, duration: Duration) -> Self {
        Self { count, duration }
    }
}

#[derive(Debug, Clone)]
struct Pending {
    result: CheckResult,
    first_seen: Instant,
    seen: u32,
}

#[derive(Debug, Clone)]
struct Tracked {
    current: CheckResult,
    since: Instant,
    pending: Option<Pending>,
}

/// Debounced state of every condition type one check reports.
#[derive(Debug, Clone)]
pub struct Debounce {
    policy: FlapConfig,
    tracked: HashMap<String, Tracked>,
}

impl Debounce {
    /// An empty guard with `policy`.
    pub fn new(policy: FlapConfig) -> Self {
        Self {
            policy,
            tracked: HashMap::new(),
        }
    }

    /// Feeds one raw result observed at `now`; returns the result to report.
    pub fn observe(&mut self, result: CheckResult, now: Instant) -> CheckResult {
        let policy = self.policy;
        let Some(t) = self.tracked.get_mut(&result.condition_type) else {
            let out = result.clone();
            let key = result.condition_type.clone();
            self.tracked.insert(
                key,
                Tracked {
                    current: result,
                    since: now,
                    pending: None,
                },
            );
            return out;
        };
        if result.status == t.current.status {
            t.current = result;
            t.pending = None;
            return t.current.clone();
        }
        let pending = match t.pending.take() {
            Some(p) if p.result.status == result.status => Pending {
                result,
                first_seen: p.first_seen,
                seen: p.seen.saturating_add(1),
            },
            _ => Pending {
                result,
                first_seen: now,
                seen: 1,
            },
        };
        let stable_for = now.saturating_duration_since(pending.first_seen);
        if pending.seen >= policy.count.max(1) && stable_for >= policy.duration {
            t.current = pending.result;
            t.since = now;
        } else {
            t.pending = Some(pending);
        }
        t.current.clone()
    }

    /// When the reported status of `condition_type` last changed (or was first seen).
    pub fn since(&self, condition_type: &str) -> Option<Instant> {
        self.tracked.get(condition_type).map(|t| t.since)
    }

    /// The status a change is pending to, if any.
    pub fn pending(&self, condition_type: &str) -> Option<ConditionStatus> {
        self.tracked
            .get(condition_type)?
            .pending
            .as_ref()
            .map(|p| p.result.status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ConditionStatus::{False, True, Unknown};

    fn r(status: ConditionStatus, reason: &str) -> CheckResult {
        CheckResult::new("T", status, reason, format!("{reason} msg"))
    }

    /// Steps `(seconds, status)` and the expected reported statuses.
    type Case<'a> = (&'a [(u64, ConditionStatus)], &'a [ConditionStatus]);

    /// Feeds `(seconds, status)` steps; returns the reported status after each.
    fn run(policy: FlapConfig, steps: &[(u64, ConditionStatus)]) -> Vec<ConditionStatus> {
        let t0 = Instant::now();
        let mut d = Debounce::new(policy);
        steps
            .iter()
            .map(|&(s, st)| d.observe(r(st, "R"), t0 + Duration::from_secs(s)).status)
            .collect()
    }

    #[test]
    fn count_table() {
        let p = FlapConfig::new(3, Duration::ZERO);
        let cases: &[Case] = &[
            // first result taken as is
            (&[(0, True)], &[True]),
            // needs three consecutive
            (
                &[(0, False), (1, True), (2, True), (3, True)],
                &[False, False, False, True],
            ),
            // interrupted: counter restarts
            (
                &[
                    (0, False),
                    (1, True),
                    (2, True),
                    (3, False),
                    (4, True),
                    (5, True),
                ],
                &[False; 6],
            ),
            // a third status restarts the count
            (
                &[
                    (0, False),
                    (1, True),
                    (2, Unknown),
                    (3, Unknown),
                    (4, Unknown),
                ],
                &[False, False, False, False, Unknown],
            ),
            // flipping back needs three as well
            (
                &[
                    (0, True),
                    (1, False),
                    (2, False),
                    (3, False),
                    (4, True),
                    (5, True),
                ],
                &[True, True, True, False, False, False],
            ),
        ];
        for (steps, want) in cases {
            assert_eq!(run(p, steps), *want, "steps {steps:?}");
        }
    }

    #[test]
    fn duration_table() {
        let p = FlapConfig::new(1, Duration::from_secs(30));
        let cases: &[Case] = &[
            (
                &[(0, False), (10, True), (20, True), (39, True), (40, True)],
                &[False, False, False, False, True],
            ),
            // a blip resets the clock
            (
                &[
                    (0, False),
                    (10, True),
                    (35, False),
                    (36, True),
                    (60, True),
                    (66, True),
                ],
                &[False, False, False, False, False, True],
            ),
        ];
        for (steps, want) in cases {
            assert_eq!(run(p, steps), *want, "steps {steps:?}");
        }
        // count 1 with no duration (or count 0, refused by validation): immediate
        assert_eq!(
            run(FlapConfig::new(1, Duration::ZERO), &[(0, False), (1, True)]),
            vec![False, True]
        );
        assert_eq!(
            run(FlapConfig::new(0, Duration::ZERO), &[(0, False), (1, True)]),
            vec![False, True]
        );
    }

    #[test]
    fn count_and_duration_both_required() {
        let p = FlapConfig::new(3, Duration::from_secs(10));
        // three results within 2 s: count met, duration not
        assert_eq!(
            run(p, &[(0, False), (1, True), (2, True), (3, True)]),
            vec![False; 4]
        );
        // duration met after the count
        assert_eq!(
            run(
                p,
                &[(0, False), (1, True), (2, True), (3, True), (11, True)]
            )
            .last(),
            Some(&True)
        );
        // duration met but only two results
        assert_eq!(
            run(p, &[(0, False), (1, True), (20, True)]).last(),
            Some(&False)
        );
    }

    #[test]
    fn same_status_refreshes_message_and_since_tracks_flips() {
        let t0 = Instant::now();
        let mut d = Debounce::new(FlapConfig::new(2, Duration::ZERO));
        d.observe(r(False, "A"), t0);
        let out = d.observe(r(False, "B"), t0 + Duration::from_secs(1));
        assert_eq!(out.reason, "B");
        assert_eq!(d.since("T"), Some(t0));
        let out = d.observe(r(True, "C"), t0 + Duration::from_secs(2));
        assert_eq!((out.status, out.reason.as_str()), (False, "B"));
        assert_eq!(d.pending("T"), Some(True));
        let out = d.observe(r(True, "D"), t0 + Duration::from_secs(3));
        assert_eq!((out.status, out.reason.as_str()), (True, "D"));
        assert_eq!(d.since("T"), Some(t0 + Duration::from_secs(3)));
        assert_eq!(d.pending("T"), None);
        assert_eq!(d.since("other"), None);
    }

    #[test]
    fn condition_types_are_independent() {
        let t0 = Instant::now();
        let mut d = Debounce::new(FlapConfig::new(2, Duration::ZERO));
        d.observe(CheckResult::new("A", False, "x", ""), t0);
        d.observe(CheckResult::new("B", False, "x", ""), t0);
        d.observe(CheckResult::new("A", True, "x", ""), t0);
        let b = d.observe(CheckResult::new("B", True, "x", ""), t0);
        let a = d.observe(CheckResult::new("A", True, "x", ""), t0);
        assert_eq!((a.status, b.status), (True, False));
    }
}

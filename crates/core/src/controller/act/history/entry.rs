//! One history entry, and the pure merge that keeps a node's history bounded: by count, by age
//! and by size (the ConfigMap that holds it stays far below the API server's 1 MiB object limit).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// One thing nodekeeper did to a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// When it started.
    pub time: DateTime<Utc>,
    /// What, in one word: the most telling of `changes` (`start_drain`, `request_reboot`,
    /// `request_replacement`, `cordon`, `hold`...), or `drain` for a drain's end.
    pub action: String,
    /// Every kind of change the batch made, in order (`annotate`, `cordon`, `taint`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<String>,
    /// The repair step it belongs to (`drain`, `reboot`, `replace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// Why: `repair:Ready=False`, `interruption:preemption`, a hold's blocker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// What drove it, as seen when it was done: the condition (`Ready=False KubeletNotReady: ...
    /// since ...`) or the notice (`preemption/<id>/<time>`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<String>,
    /// `ok` or `error` for a batch of changes; `completed`, `failed` (timed out), `cancelled` or
    /// `error` for a drain.
    pub outcome: String,
    /// The error, or what a drain removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// How long it took, in milliseconds.
    pub duration_ms: u64,
    /// What nodekeeper said about it (its Events' notes), kept past the Events' expiry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<String>,
}

/// The longest text kept in one field of an entry (longer is cut, with `…`).
pub const MAX_FIELD: usize = 512;
/// At most this many Event notes and inputs per entry.
pub const MAX_LIST: usize = 8;

impl Entry {
    /// An entry of `action` at `time`, outcome `ok`, nothing else said yet (fill in the rest
    /// with `Entry { why: …, ..Entry::new(time, action) }`).
    pub fn new(time: DateTime<Utc>, action: &str) -> Self {
        Entry {
            time,
            action: action.to_string(),
            changes: Vec::new(),
            step: None,
            why: None,
            inputs: Vec::new(),
            outcome: "ok".into(),
            detail: None,
            duration_ms: 0,
            events: Vec::new(),
        }
    }

    /// The entry with its texts cut to [`MAX_FIELD`] and its lists to [`MAX_LIST`], so that one
    /// entry is at most a few KiB whatever a message says.
    pub fn bounded(mut self) -> Self {
        let cut = |s: &mut String| {
            if s.len() > MAX_FIELD {
                *s = crate::text::truncate(s, MAX_FIELD);
            }
        };
        cut(&mut self.action);
        cut(&mut self.outcome);
        for s in [&mut self.step, &mut self.why, &mut self.detail]
            .into_iter()
            .flatten()
        {
            cut(s);
        }
        for l in [&mut self.changes, &mut self.inputs, &mut self.events] {
            l.truncate(MAX_LIST);
            l.iter_mut().for_each(cut);
        }
        self
    }
}

/// How much history one node keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Entries at most (the oldest go first).
    pub max_entries: usize,
    /// Entries older than this go.
    pub max_age: chrono::Duration,
    /// The encoded list ([`encode`]) at most this many bytes (the oldest go first).
    pub max_bytes: usize,
}

/// The stored form: a JSON array, oldest first.
pub fn encode(entries: &[Entry]) -> String {
    serde_json::to_string(entries).unwrap_or_else(|_| "[]".into())
}

/// Reads the stored form; an unreadable one (a newer controller's?) is an error, never guessed.
pub fn decode(text: &str) -> Result<Vec<Entry>, serde_json::Error> {
    serde_json::from_str(text)
}

/// The history after `new` is added to `old` at `now`: every entry once (an entry equal to one
/// kept is not added twice, so a retried write adds nothing), oldest first by time (ties keep
/// their order), none older than `max_age`, at most `max_entries`, and at most `max_bytes`
/// encoded; the newest are kept. Pure.
pub fn merge(old: Vec<Entry>, new: &[Entry], limits: &Limits, now: DateTime<Utc>) -> Vec<Entry> {
    let mut all = old;
    for e in new {
        if !all.contains(e) {
            all.push(e.clone());
        }
    }
    all.sort_by_key(|e| e.time);
    let oldest = now - limits.max_age;
    all.retain(|e| e.time >= oldest);
    let extra = all.len().saturating_sub(limits.max_entries);
    all.drain(..extra);
    // Commas between entries and the brackets: the encoded length exactly.
    let sizes: Vec<usize> = all
        .iter()
        .map(|e| serde_json::to_string(e).map_or(0, |s| s.len()))
        .collect();
    let mut total = 2 + sizes.iter().sum::<usize>() + sizes.len().saturating_sub(1);
    let mut drop = 0;
    while drop < all.len() && total > limits.max_bytes {
        total -= sizes[drop] + usize::from(all.len() - drop > 1);
        drop += 1;
    }
    all.drain(..drop);
    all
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(super) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The tests' epoch.
    pub(in crate::controller::act::history) fn t0() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-12-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    fn at(minutes: i64, action: &str) -> Entry {
        Entry {
            why: Some("repair:Ready=False".into()),
            duration_ms: 3,
            ..Entry::new(t0() + chrono::Duration::minutes(minutes), action)
        }
    }

    fn limits(max_entries: usize, max_age_min: i64, max_bytes: usize) -> Limits {
        Limits {
            max_entries,
            max_age: chrono::Duration::minutes(max_age_min),
            max_bytes,
        }
    }

    fn actions(v: &[Entry]) -> Vec<&str> {
        v.iter().map(|e| e.action.as_str()).collect()
    }

    #[test]
    fn merge_keeps_the_newest_within_count_age_and_size() {
        let big = 1 << 20;
        let now = t0() + chrono::Duration::minutes(100);
        // (old, new, limits, kept)
        type Case = (Vec<Entry>, Vec<Entry>, Limits, Vec<&'static str>);
        let cases: Vec<Case> = vec![
            // appended, in time order
            (
                vec![at(1, "a")],
                vec![at(2, "b")],
                limits(10, 1000, big),
                vec!["a", "b"],
            ),
            // a late write of an earlier entry is put in its place
            (
                vec![at(5, "b")],
                vec![at(2, "a")],
                limits(10, 1000, big),
                vec!["a", "b"],
            ),
            // by count: the oldest go
            (
                vec![at(1, "a"), at(2, "b"), at(3, "c")],
                vec![at(4, "d")],
                limits(2, 1000, big),
                vec!["c", "d"],
            ),
            // by age: older than 100 − 30 = 70 minutes go, the new one too if it is that old
            (
                vec![at(60, "a"), at(70, "b")],
                vec![at(80, "c"), at(10, "z")],
                limits(10, 30, big),
                vec!["b", "c"],
            ),
            // a retried write adds nothing
            (
                vec![at(1, "a"), at(2, "b")],
                vec![at(2, "b")],
                limits(10, 1000, big),
                vec!["a", "b"],
            ),
            // the same instant, another entry: both, in arrival order
            (
                vec![at(2, "a")],
                vec![at(2, "b")],
                limits(10, 1000, big),
                vec!["a", "b"],
            ),
            // nothing at all
            (vec![], vec![], limits(10, 1000, big), vec![]),
            // count 0 keeps nothing
            (
                vec![at(1, "a")],
                vec![at(2, "b")],
                limits(0, 1000, big),
                vec![],
            ),
        ];
        for (i, (old, new, l, want)) in cases.into_iter().enumerate() {
            let got = merge(old, &new, &l, now);
            assert_eq!(actions(&got), want, "case {i}");
        }
    }

    #[test]
    fn merge_drops_the_oldest_past_the_size_limit() {
        let now = t0() + chrono::Duration::minutes(100);
        let three = vec![at(1, "a"), at(2, "b"), at(3, "c")];
        let all = encode(&three).len();
        let two = encode(&three[1..]).len();
        let l = |b| limits(10, 1000, b);
        assert_eq!(
            actions(&merge(three.clone(), &[], &l(all), now)),
            ["a", "b", "c"]
        );
        assert_eq!(
            actions(&merge(three.clone(), &[], &l(all - 1), now)),
            ["b", "c"]
        );
        assert_eq!(
            actions(&merge(three.clone(), &[], &l(two), now)),
            ["b", "c"]
        );
        assert_eq!(actions(&merge(three.clone(), &[], &l(two - 1), now)), ["c"]);
        assert!(merge(three, &[], &l(2), now).is_empty());
    }

    #[test]
    fn a_long_entry_is_bounded() {
        let mut e = at(1, &"x".repeat(10_000));
        e.events = vec!["y".repeat(10_000); 100];
        let b = e.bounded();
        assert!(b.action.len() <= MAX_FIELD + 3, "{}", b.action.len());
        assert_eq!(b.events.len(), MAX_LIST);
        assert!(encode(&[b]).len() < 16 * 1024);
    }

    #[test]
    fn the_stored_form_reads_back_and_an_unreadable_one_is_an_error() {
        let v = vec![at(1, "a"), at(2, "b")];
        assert_eq!(decode(&encode(&v)).unwrap(), v);
        // Fields left out when empty are read back as empty.
        let text =
            r#"[{"time":"2026-12-01T00:00:00Z","action":"cordon","outcome":"ok","duration_ms":1}]"#;
        assert_eq!(decode(text).unwrap()[0].changes, Vec::<String>::new());
        assert!(decode("{").is_err());
    }

    fn entry() -> impl Strategy<Value = Entry> {
        (
            0i64..200,
            "[a-z]{1,12}",
            0u64..10_000,
            proptest::option::of("[ -~]{0,40}"),
        )
            .prop_map(|(m, action, ms, why)| Entry {
                why,
                duration_ms: ms,
                ..at(m, &action)
            })
    }

    proptest! {
        /// Whatever is merged: sorted by time, within every limit, the newest kept, and merging
        /// again changes nothing.
        #[test]
        fn merge_is_bounded_sorted_newest_first_kept_and_idempotent(
            old in proptest::collection::vec(entry(), 0..40),
            new in proptest::collection::vec(entry(), 0..10),
            max_entries in 0usize..30,
            max_age in 1i64..300,
            max_bytes in 2usize..6000,
        ) {
            let now = t0() + chrono::Duration::minutes(150);
            let l = limits(max_entries, max_age, max_bytes);
            let old = merge(old, &[], &limits(usize::MAX, 100_000, usize::MAX), now);
            let got = merge(old.clone(), &new, &l, now);
            prop_assert!(got.len() <= max_entries);
            prop_assert!(encode(&got).len() <= max_bytes.max(2));
            prop_assert!(got.windows(2).all(|w| w[0].time <= w[1].time));
            prop_assert!(got.iter().all(|e| e.time >= now - l.max_age));
            // Nothing kept is older than something dropped (within the age limit).
            let kept_oldest = got.first().map(|e| e.time);
            for e in old.iter().chain(&new) {
                if e.time >= now - l.max_age && !got.contains(e) {
                    prop_assert!(kept_oldest.is_none_or(|k| e.time <= k));
                }
            }
            prop_assert_eq!(merge(got.clone(), &[], &l, now), got.clone());
            prop_assert_eq!(merge(got.clone(), &new, &l, now).len() <= got.len() + new.len(), true);
        }
    }
}

//! Disruption budgets: Karpenter's semantics (`allowed = min over active budgets`, percentages
//! rounded up, nodes already disrupting and NotReady counted), plus IANA time zones for the
//! cron windows and per-reason budgets, and the computed time a blocked group's window opens.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;

use super::config::Budget;

/// Why nodekeeper disrupts a node, for per-reason budgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// A repair policy fired (gated by budgets).
    Repair,
    /// A rebalance recommendation configured to drain (gated).
    Rebalance,
    /// An interruption notice (never gated, always counted).
    Interruption,
}

impl Reason {
    /// Lower-case name used in `reasons = [...]`.
    pub fn name(self) -> &'static str {
        match self {
            Reason::Repair => "repair",
            Reason::Rebalance => "rebalance",
            Reason::Interruption => "interruption",
        }
    }
}

/// Karpenter's reasons: accepted (a KPO/Karpenter budget pasted as-is) but never apply here.
const KARPENTER_REASONS: &[&str] = &["drifted", "underutilized", "empty"];

/// Parses a budget reason: `Ok(Some)` for ours, `Ok(None)` for Karpenter's, `Err` otherwise.
pub fn parse_reason(s: &str) -> Result<Option<Reason>, String> {
    match s.to_ascii_lowercase().as_str() {
        "repair" => Ok(Some(Reason::Repair)),
        "rebalance" => Ok(Some(Reason::Rebalance)),
        "interruption" => Ok(Some(Reason::Interruption)),
        other if KARPENTER_REASONS.contains(&other) => Ok(None),
        _ => Err(format!(
            "`{s}` is not a disruption reason (repair, rebalance, interruption)"
        )),
    }
}

/// A cron window: active from each schedule hit for `duration`, read in a time zone.
#[derive(Debug, Clone)]
pub struct Window {
    /// More than one when both day-of-month and day-of-week are restricted (standard cron
    /// matches either).
    schedules: Vec<cron::Schedule>,
    duration: chrono::Duration,
    tz: Tz,
}

const DOW_NAMES: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];

impl Window {
    /// Parses a 5-field cron expression (or `@daily` etc.) in IANA time zone `tz`.
    pub fn parse(schedule: &str, duration: Duration, tz: &str) -> Result<Self, String> {
        let tz: Tz = Tz::from_str(tz).map_err(|_| {
            format!("time zone `{tz}` is not an IANA name (e.g. UTC, Asia/Shanghai)")
        })?;
        if duration > MAX_WINDOW {
            return Err("duration is longer than 10 years".to_string());
        }
        let duration =
            chrono::Duration::from_std(duration).map_err(|_| "duration is too long".to_string())?;
        let fields = expand_macro(schedule.trim())?;
        let [min, hour, dom, mon, dow] = fields;
        let dow_set = parse_dow(&dow)?;
        let dow_expr = dow_set
            .as_ref()
            .map(|set| {
                set.iter()
                    .map(|&d| DOW_NAMES[d])
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_else(|| "*".to_string());
        let dom_restricted = !(dom == "*" || dom == "?");
        let exprs = if dom_restricted && dow_set.is_some() {
            vec![
                format!("0 {min} {hour} {dom} {mon} *"),
                format!("0 {min} {hour} * {mon} {dow_expr}"),
            ]
        } else {
            vec![format!("0 {min} {hour} {dom} {mon} {dow_expr}")]
        };
        let schedules = exprs
            .iter()
            .map(|e| {
                cron::Schedule::from_str(e).map_err(|err| {
                    format!("schedule `{schedule}` is not a valid cron expression: {err}")
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Window {
            schedules,
            duration,
            tz,
        })
    }

    /// The first schedule hit strictly after `t`.
    fn next_hit(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = t.with_timezone(&self.tz);
        self.schedules
            .iter()
            .filter_map(|s| s.after(&local).next())
            .map(|d| d.with_timezone(&Utc))
            .min()
    }

    /// Active at `now`: a hit in `(now - duration, now]` (Karpenter's check).
    pub fn is_active(&self, now: DateTime<Utc>) -> bool {
        self.next_hit(now - self.duration).is_some_and(|t| t <= now)
    }

    /// Times in `(now, now + horizon]` at which this window may open or close.
    pub fn boundaries(&self, now: DateTime<Utc>, horizon: chrono::Duration) -> Vec<DateTime<Utc>> {
        let mut out = Vec::new();
        let mut t = now - self.duration;
        for _ in 0..MAX_HITS {
            let Some(hit) = self.next_hit(t) else { break };
            if hit > now + horizon {
                break;
            }
            for b in [hit, hit + self.duration] {
                if b > now && b <= now + horizon {
                    out.push(b);
                }
            }
            t = hit;
        }
        out
    }
}

/// Longest accepted window (keeps all time arithmetic far from chrono's limits).
const MAX_WINDOW: Duration = Duration::from_secs(3653 * 24 * 3600);

/// Bound on schedule hits looked at per window when searching the opening time.
const MAX_HITS: usize = 2000;

/// How far ahead the opening time of a closed window is searched.
pub const OPEN_HORIZON_DAYS: i64 = 8;

fn expand_macro(s: &str) -> Result<[String; 5], String> {
    let expanded = match s {
        "@yearly" | "@annually" => "0 0 1 1 *",
        "@monthly" => "0 0 1 * *",
        "@weekly" => "0 0 * * 0",
        "@daily" | "@midnight" => "0 0 * * *",
        "@hourly" => "0 * * * *",
        other => other,
    };
    let parts: Vec<String> = expanded.split_whitespace().map(str::to_string).collect();
    parts.try_into().map_err(|p: Vec<String>| {
        format!(
            "schedule `{s}` has {} fields; expected 5 (minute hour day-of-month month day-of-week) or @daily/@weekly/...",
            p.len()
        )
    })
}

/// Standard cron day-of-week (0–7, Sunday = 0 or 7, names) as a set; `None` for `*`.
fn parse_dow(field: &str) -> Result<Option<Vec<usize>>, String> {
    if field == "*" || field == "?" {
        return Ok(None);
    }
    let mut set = [false; 7];
    for part in field.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => (
                r,
                s.parse::<usize>()
                    .ok()
                    .filter(|&s| s > 0)
                    .ok_or_else(|| format!("day-of-week step `{s}` is not a positive number"))?,
            ),
            None => (part, 1),
        };
        let (lo, hi) = match range {
            "*" => (0, 6),
            r => match r.split_once('-') {
                Some((a, b)) => (dow_value(a)?, dow_value(b)?),
                None => {
                    let v = dow_value(r)?;
                    (v, if step > 1 { 6 } else { v })
                }
            },
        };
        let hi = if hi < lo { hi + 7 } else { hi };
        let mut d = lo;
        while d <= hi {
            set[d % 7] = true;
            d += step;
        }
    }
    Ok(Some((0..7).filter(|&d| set[d]).collect()))
}

fn dow_value(s: &str) -> Result<usize, String> {
    if let Ok(n) = s.parse::<usize>() {
        return if n <= 7 {
            Ok(n % 7)
        } else {
            Err(format!("day-of-week `{s}` is out of range 0-7"))
        };
    }
    const FULL: [&str; 7] = [
        "sunday",
        "monday",
        "tuesday",
        "wednesday",
        "thursday",
        "friday",
        "saturday",
    ];
    let lower = s.to_ascii_lowercase();
    FULL.iter()
        .position(|full| lower.len() >= 3 && full.starts_with(lower.as_str()))
        .ok_or_else(|| format!("`{s}` is not a day of the week"))
}

/// A budget ready for evaluation (schedule parsed).
#[derive(Debug, Clone)]
pub struct CompiledBudget {
    /// Index in the configured list.
    pub index: usize,
    /// The configured budget.
    pub budget: Budget,
    window: Option<Window>,
    reasons: Vec<Reason>,
    /// Only Karpenter reasons listed: never applies.
    inert: bool,
}

impl CompiledBudget {
    /// Compiles a budget; invalid schedules are reported by `validate()` and treated as
    /// always active here (the safe side).
    pub fn new(index: usize, budget: &Budget) -> Self {
        let window = match (&budget.schedule, budget.duration) {
            (Some(s), Some(d)) => {
                Window::parse(s, d, budget.timezone.as_deref().unwrap_or("UTC")).ok()
            }
            _ => None,
        };
        let parsed: Vec<Option<Reason>> = budget
            .reasons
            .iter()
            .filter_map(|r| parse_reason(r).ok())
            .collect();
        let reasons: Vec<Reason> = parsed.iter().flatten().copied().collect();
        Self {
            index,
            budget: budget.clone(),
            window,
            inert: !budget.reasons.is_empty() && reasons.is_empty(),
            reasons,
        }
    }

    /// Applies to `reason` (no reasons listed: all).
    pub fn applies_to(&self, reason: Reason) -> bool {
        !self.inert && (self.budget.reasons.is_empty() || self.reasons.contains(&reason))
    }

    /// Active at `now`.
    pub fn is_active(&self, now: DateTime<Utc>) -> bool {
        self.window.as_ref().is_none_or(|w| w.is_active(now))
    }
}

/// The budgets of one group.
#[derive(Debug, Clone)]
pub struct GroupBudgets {
    budgets: Vec<CompiledBudget>,
}

/// The binding (smallest) active budget for a reason at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// Max nodes disrupted at once (`None`: no budget active → unlimited).
    pub max: Option<usize>,
    /// Index of the budget giving `max`.
    pub budget_index: Option<usize>,
}

impl GroupBudgets {
    /// Compiles a group's budgets.
    pub fn new(budgets: &[Budget]) -> Self {
        Self {
            budgets: budgets
                .iter()
                .enumerate()
                .map(|(i, b)| CompiledBudget::new(i, b))
                .collect(),
        }
    }

    /// The configured budget at `index`.
    pub fn budget(&self, index: usize) -> Option<&Budget> {
        self.budgets.get(index).map(|b| &b.budget)
    }

    /// Min over budgets active at `now` for `reason`, resolved against `total` nodes.
    pub fn limit(&self, reason: Reason, total: usize, now: DateTime<Utc>) -> Limit {
        let mut best = Limit {
            max: None,
            budget_index: None,
        };
        for b in &self.budgets {
            if !b.applies_to(reason) || !b.is_active(now) {
                continue;
            }
            let v = b.budget.nodes.resolve(total, true);
            if best.max.is_none_or(|m| v < m) {
                best = Limit {
                    max: Some(v),
                    budget_index: Some(b.index),
                };
            }
        }
        best
    }

    /// How many more nodes may start disrupting: limit − already counted (never negative).
    pub fn allowed(
        &self,
        reason: Reason,
        total: usize,
        counted: usize,
        now: DateTime<Utc>,
    ) -> usize {
        match self.limit(reason, total, now).max {
            None => usize::MAX,
            Some(m) => m.saturating_sub(counted),
        }
    }

    /// The first time after `now` (within [`OPEN_HORIZON_DAYS`]) at which, with the same
    /// nodes counted, the schedules alone let one more node start; `None` when only a
    /// finishing disruption can free a slot.
    pub fn opens_at(
        &self,
        reason: Reason,
        total: usize,
        counted: usize,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        let horizon = chrono::Duration::days(OPEN_HORIZON_DAYS);
        let mut candidates: Vec<DateTime<Utc>> = self
            .budgets
            .iter()
            .filter(|b| b.applies_to(reason))
            .filter_map(|b| b.window.as_ref())
            .flat_map(|w| w.boundaries(now, horizon))
            .collect();
        candidates.sort();
        candidates.dedup();
        candidates
            .into_iter()
            .find(|&t| self.allowed(reason, total, counted, t) > 0)
    }
}

/// Formats a UTC instant in a budget's zone, for messages (`2026-11-30 09:00 CST`).
pub fn in_zone(t: DateTime<Utc>, tz: Option<&str>) -> String {
    match tz.and_then(|z| Tz::from_str(z).ok()) {
        Some(z) => z
            .from_utc_datetime(&t.naive_utc())
            .format("%Y-%m-%d %H:%M %Z")
            .to_string(),
        None => t.format("%Y-%m-%d %H:%M UTC").to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn dow_is_standard_cron() {
        assert_eq!(parse_dow("1-5").unwrap(), Some(vec![1, 2, 3, 4, 5]));
        assert_eq!(parse_dow("0,7").unwrap(), Some(vec![0]));
        assert_eq!(parse_dow("fri-mon").unwrap(), Some(vec![0, 1, 5, 6]));
        assert_eq!(parse_dow("*/2").unwrap(), Some(vec![0, 2, 4, 6]));
        assert!(parse_dow("8").is_err());
        assert!(parse_dow("xyz").is_err());
        assert!(parse_dow("ééé").is_err());
        assert_eq!(parse_dow("Monday-wed").unwrap(), Some(vec![1, 2, 3]));
        assert!(parse_dow("mo").is_err());
    }

    #[test]
    fn weekday_window_in_shanghai() {
        let w = Window::parse(
            "0 9 * * 1-5",
            Duration::from_secs(14 * 3600),
            "Asia/Shanghai",
        )
        .unwrap();
        // Monday 2026-11-30 01:00 UTC = 09:00 Shanghai: opens.
        assert!(w.is_active(t("2026-11-30T01:00:00Z")));
        assert!(!w.is_active(t("2026-11-30T00:59:59Z")));
        // 23:00 Shanghai = 15:00 UTC: closes (exclusive).
        assert!(w.is_active(t("2026-11-30T14:59:59Z")));
        assert!(!w.is_active(t("2026-11-30T15:00:00Z")));
        // Saturday 2026-12-05 02:00 UTC = 10:00 Shanghai: weekend, closed.
        assert!(!w.is_active(t("2026-12-05T02:00:00Z")));
        // The same expression in UTC is open at 09:00 UTC Monday.
        let u = Window::parse("0 9 * * 1-5", Duration::from_secs(14 * 3600), "UTC").unwrap();
        assert!(u.is_active(t("2026-11-30T09:30:00Z")));
        assert!(w.is_active(t("2026-11-30T09:30:00Z")));
        assert!(!w.is_active(t("2026-11-30T16:00:00Z")));
        assert!(u.is_active(t("2026-11-30T16:00:00Z")));
    }

    #[test]
    fn dom_or_dow() {
        // Standard cron: the 1st of the month OR any Monday.
        let w = Window::parse("0 0 1 * 1", Duration::from_secs(3600), "UTC").unwrap();
        assert!(w.is_active(t("2026-12-01T00:30:00Z"))); // Tuesday the 1st
        assert!(w.is_active(t("2026-11-30T00:30:00Z"))); // Monday the 30th
        assert!(!w.is_active(t("2026-12-02T00:30:00Z")));
    }

    #[test]
    fn bad_inputs_are_reported() {
        let d = Duration::from_secs(60);
        assert!(Window::parse("0 9 * *", d, "UTC")
            .unwrap_err()
            .contains("5"));
        assert!(Window::parse("0 9 * * *", d, "Mars/Base")
            .unwrap_err()
            .starts_with("time zone"));
        assert!(Window::parse("61 9 * * *", d, "UTC").is_err());
        assert!(Window::parse("@daily", d, "UTC").is_ok());
    }
}

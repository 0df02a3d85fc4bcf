//! Disruption budgets: Karpenter's semantics (`allowed = min over active budgets`, percentages
//! rounded up, nodes already disrupting and NotReady counted), plus IANA time zones for the
//! cron windows and per-reason budgets, and the computed time a blocked group's window opens.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;

use super::config::{Budget, BudgetsConfig, BudgetsSource, Quantity};
use super::nodepool::{NodePoolError, PoolBudgets};

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

/// Karpenter's consolidation and drift reasons: accepted (a KPO/Karpenter budget pasted as-is)
/// but never apply here.
const KARPENTER_REASONS: &[&str] = &["drifted", "underutilized", "empty"];

/// Parses a budget reason: `Ok(Some)` for ours and for Karpenter's `Unhealthy` (v1.15: its node
/// repair, which is nodekeeper's `repair`), `Ok(None)` for Karpenter's others, `Err` otherwise.
pub fn parse_reason(s: &str) -> Result<Option<Reason>, String> {
    match s.to_ascii_lowercase().as_str() {
        "repair" | "unhealthy" => Ok(Some(Reason::Repair)),
        "rebalance" => Ok(Some(Reason::Rebalance)),
        "interruption" => Ok(Some(Reason::Interruption)),
        other if KARPENTER_REASONS.contains(&other) => Ok(None),
        _ => Err(format!(
            "`{s}` is not a disruption reason (repair, rebalance, interruption)"
        )),
    }
}

/// A cron window: active from each schedule hit for `duration`, read in a time zone.
///
/// The expression is Karpenter's (robfig/cron's standard parser): 5 fields or a macro, names
/// of days and months, day-of-month OR day-of-week when both are restricted. `croner` parses
/// and evaluates it, in the zone (chrono-tz); [`Window::parse`] only keeps croner's extensions
/// (`L`, `W`, `#`, a `+` prefix, seconds, years), which Karpenter would refuse, out.
#[derive(Debug, Clone)]
pub struct Window {
    schedule: croner::Cron,
    duration: chrono::Duration,
    tz: Tz,
}

/// robfig/cron's macros (Karpenter's `@every` is refused by its CRD, and here).
const MACROS: [&str; 7] = [
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@midnight",
    "@hourly",
];

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
        let expr = standard_cron(schedule.trim())?;
        let parser = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Disallowed)
            .year(croner::parser::Year::Disallowed)
            .build();
        let schedule = parser.parse(&expr).map_err(|err| {
            format!("schedule `{schedule}` is not a valid cron expression: {err}")
        })?;
        Ok(Window {
            schedule,
            duration,
            tz,
        })
    }

    /// The first schedule hit strictly after `t`.
    fn next_hit(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = t.with_timezone(&self.tz);
        self.schedule
            .find_next_occurrence(&local, false)
            .ok()
            .map(|d| d.with_timezone(&Utc))
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

/// Checks that `s` is in robfig/cron's standard language, which croner extends: a macro, or 5
/// fields whose items are `*`, `?`, numbers or 3-letter names, with `-` ranges and `/` steps.
/// Gives the expression for croner: `@midnight` (robfig's alias of `@daily`) spelled out, and
/// a day field `*/1` written `*` (robfig reads it as unrestricted for the OR rule, croner not).
fn standard_cron(s: &str) -> Result<String, String> {
    if s.starts_with('@') {
        return match MACROS.iter().find(|m| m.eq_ignore_ascii_case(s)) {
            Some(&"@midnight") => Ok("@daily".to_string()),
            Some(_) => Ok(s.to_string()),
            None => Err(format!(
                "schedule `{s}` is not a cron macro ({})",
                MACROS.join(", ")
            )),
        };
    }
    let mut fields: Vec<&str> = s.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(format!(
            "schedule `{s}` has {} fields; expected 5 (minute hour day-of-month month day-of-week) or @daily/@weekly/...",
            fields.len()
        ));
    }
    for item in fields.iter().flat_map(|f| f.split([',', '-', '/'])) {
        let standard = matches!(item, "*" | "?")
            || (!item.is_empty() && item.bytes().all(|b| b.is_ascii_digit()))
            || (item.len() == 3 && item.bytes().all(|b| b.is_ascii_alphabetic()));
        if !standard {
            return Err(format!(
                "schedule `{s}`: `{item}` is not standard cron (numbers, *, ?, 3-letter names)"
            ));
        }
    }
    for day in [2, 4] {
        if matches!(fields[day], "*/1" | "?/1") {
            fields[day] = "*";
        }
    }
    Ok(fields.join(" "))
}

/// Where a budget in force comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The configuration (`[budgets] budgets` or `[budgets.groups]`).
    Config,
    /// `spec.disruption.budgets` of this NodePool (`[budgets] source = "nodepool"`).
    NodePool(String),
    /// A NodePool Karpenter would refuse: the group holds (a budget of 0, always active).
    InvalidNodePool(NodePoolError),
}

impl Origin {
    /// `config` or `NodePool <name>` (as `nodekeeper status` shows it).
    pub fn describe(&self) -> String {
        match self {
            Origin::Config => "config".to_string(),
            Origin::NodePool(name) => format!("NodePool {name}"),
            Origin::InvalidNodePool(e) => format!("NodePool {} (invalid)", e.pool),
        }
    }
}

/// A budget ready for evaluation (schedule parsed).
#[derive(Debug, Clone)]
pub struct CompiledBudget {
    /// Index in its source's list (the configured list, or the NodePool's
    /// `spec.disruption.budgets`).
    pub index: usize,
    /// Where it comes from.
    pub origin: Origin,
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
            origin: Origin::Config,
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
    /// Position (see [`GroupBudgets::entry`]) of the budget giving `max`.
    pub budget_index: Option<usize>,
}

impl GroupBudgets {
    /// Compiles a group's budgets (all from the configuration).
    pub fn new(budgets: &[Budget]) -> Self {
        Self {
            budgets: budgets
                .iter()
                .enumerate()
                .map(|(i, b)| CompiledBudget::new(i, b))
                .collect(),
        }
    }

    /// The budgets in force for `group`: with `source = "config"`, the configured ones; with
    /// `source = "nodepool"` and a NodePool named like the group, the NodePool's budgets (or, if
    /// Karpenter would refuse them, one budget of 0 that holds the group) plus the group's own
    /// `[budgets.groups.<group>]` list if there is one; a group without a NodePool (and the
    /// group `""`) keeps the configured ones.
    pub fn in_force(
        group: &str,
        cfg: &BudgetsConfig,
        pools: &BTreeMap<String, PoolBudgets>,
    ) -> Self {
        let pool = match cfg.source {
            BudgetsSource::NodePool => pools.get(group).filter(|_| !group.is_empty()),
            BudgetsSource::Config => None,
        };
        let Some(pool) = pool else {
            return Self::new(cfg.for_group(group));
        };
        let mut budgets = match pool {
            Ok(list) => list
                .iter()
                .map(|pb| CompiledBudget {
                    origin: Origin::NodePool(group.to_string()),
                    ..CompiledBudget::new(pb.index, &pb.budget)
                })
                .collect(),
            Err(e) => vec![CompiledBudget {
                origin: Origin::InvalidNodePool(e.clone()),
                ..CompiledBudget::new(0, &Budget::always(Quantity::Count(0)))
            }],
        };
        if let Some(extra) = cfg.groups.get(group) {
            budgets.extend(
                extra
                    .iter()
                    .enumerate()
                    .map(|(i, b)| CompiledBudget::new(i, b)),
            );
        }
        Self { budgets }
    }

    /// The configured budget at position `pos` (as in [`Limit::budget_index`]).
    pub fn budget(&self, pos: usize) -> Option<&Budget> {
        self.budgets.get(pos).map(|b| &b.budget)
    }

    /// The budget at position `pos` with its index in its source and its origin.
    pub fn entry(&self, pos: usize) -> Option<&CompiledBudget> {
        self.budgets.get(pos)
    }

    /// Every budget in force, in order (NodePool's first, then the configured ones).
    pub fn entries(&self) -> &[CompiledBudget] {
        &self.budgets
    }

    /// Min over budgets active at `now` for `reason`, resolved against `total` nodes.
    pub fn limit(&self, reason: Reason, total: usize, now: DateTime<Utc>) -> Limit {
        let mut best = Limit {
            max: None,
            budget_index: None,
        };
        for (pos, b) in self.budgets.iter().enumerate() {
            if !b.applies_to(reason) || !b.is_active(now) {
                continue;
            }
            let v = b.budget.nodes.resolve(total, true);
            if best.max.is_none_or(|m| v < m) {
                best = Limit {
                    max: Some(v),
                    budget_index: Some(pos),
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

    /// The next hit strictly after `at` (UTC).
    fn next(expr: &str, at: &str) -> String {
        let w = Window::parse(expr, Duration::from_secs(60), "UTC").unwrap();
        w.next_hit(t(at)).unwrap().to_rfc3339()
    }

    #[test]
    fn dow_is_standard_cron() {
        // (expression, after, next hit): Monday 2026-11-30.
        let table = [
            (
                "0 9 * * 1-5",
                "2026-12-04T09:00:00Z",
                "2026-12-07T09:00:00+00:00",
            ), // Fri → Mon
            (
                "0 9 * * mon-fri",
                "2026-12-04T09:00:00Z",
                "2026-12-07T09:00:00+00:00",
            ),
            (
                "0 9 * * MON-FRI",
                "2026-12-04T09:00:00Z",
                "2026-12-07T09:00:00+00:00",
            ),
            (
                "0 9 * * 0",
                "2026-11-30T00:00:00Z",
                "2026-12-06T09:00:00+00:00",
            ), // Sunday
            (
                "0 9 * * 7",
                "2026-11-30T00:00:00Z",
                "2026-12-06T09:00:00+00:00",
            ), // Sunday too
            (
                "0 9 * * sun",
                "2026-11-30T00:00:00Z",
                "2026-12-06T09:00:00+00:00",
            ),
            (
                "0 9 * * */2",
                "2026-11-30T10:00:00Z",
                "2026-12-01T09:00:00+00:00",
            ), // Sun,Tue,...
            (
                "0 9 * dec tue",
                "2026-11-30T00:00:00Z",
                "2026-12-01T09:00:00+00:00",
            ),
        ];
        for (expr, at, want) in table {
            assert_eq!(next(expr, at), want, "{expr}");
        }
        // robfig/cron's language only: croner's extensions and full names are refused.
        for bad in [
            "0 9 * * 8",
            "0 9 * * xyz",
            "0 9 * * ééé",
            "0 9 * * monday",
            "0 9 * * mo",
            "0 9 L * *",
            "0 9 * * 5L",
            "0 9 15W * *",
            "0 9 * * 1#2",
            "0 9 * * fri-mon", // robfig refuses a range that wraps
            "0 9 * * 5-1",
            "0 9 * * +1",
            "0 0 9 * * 1",
            "@every 1h",
            "@reboot",
        ] {
            assert!(
                Window::parse(bad, Duration::from_secs(60), "UTC").is_err(),
                "{bad}"
            );
        }
    }

    /// Standard cron: when day-of-month and day-of-week are both restricted a day matching
    /// either fires; with one of them `*` (or `?`) only the other counts.
    #[test]
    fn dom_dow_or_rule() {
        // (expression, after, next hit). 2026-12-01 is a Tuesday.
        let table = [
            (
                "0 0 1 * 1",
                "2026-11-30T00:00:00Z",
                "2026-12-01T00:00:00+00:00",
            ), // the 1st
            (
                "0 0 1 * 1",
                "2026-12-01T00:00:00Z",
                "2026-12-07T00:00:00+00:00",
            ), // a Monday
            (
                "0 0 15 * fri",
                "2026-12-01T00:00:00Z",
                "2026-12-04T00:00:00+00:00",
            ), // Friday first
            (
                "0 0 15 * fri",
                "2026-12-11T00:00:00Z",
                "2026-12-15T00:00:00+00:00",
            ), // then the 15th
            (
                "0 0 */10 * 1",
                "2026-12-01T00:00:00Z",
                "2026-12-07T00:00:00+00:00",
            ), // step: restricted
            (
                "0 0 1 * *",
                "2026-12-01T00:00:00Z",
                "2027-01-01T00:00:00+00:00",
            ), // dow *: dom only
            (
                "0 0 1 * ?",
                "2026-12-01T00:00:00Z",
                "2027-01-01T00:00:00+00:00",
            ),
            (
                "0 0 * * 1",
                "2026-12-01T00:00:00Z",
                "2026-12-07T00:00:00+00:00",
            ), // dom *: dow only
            (
                "0 0 ? * 1",
                "2026-12-01T00:00:00Z",
                "2026-12-07T00:00:00+00:00",
            ),
            (
                "0 0 2 * */1",
                "2026-12-01T00:00:00Z",
                "2026-12-02T00:00:00+00:00",
            ), // */1 is *
            (
                "0 0 2 * */1",
                "2026-12-02T00:00:00Z",
                "2027-01-02T00:00:00+00:00",
            ),
        ];
        for (expr, at, want) in table {
            assert_eq!(next(expr, at), want, "{expr} after {at}");
        }
    }

    /// Daylight saving time (croner's rule): a hit in the skipped hour fires at the end of
    /// the gap; a hit in the repeated hour fires once, at its first occurrence.
    #[test]
    fn dst_gap_and_fold() {
        let d = Duration::from_secs(3600);
        let gap = Window::parse("30 2 * * *", d, "America/New_York").unwrap();
        // 2027-03-14: 02:00 EST → 03:00 EDT (07:00 UTC).
        assert_eq!(
            gap.next_hit(t("2027-03-14T00:00:00Z")),
            Some(t("2027-03-14T07:00:00Z"))
        );
        let fold = Window::parse("30 1 * * *", d, "America/New_York").unwrap();
        // 2027-11-07: 01:30 EDT (05:30 UTC) fires; 01:30 EST (06:30 UTC) does not.
        let first = fold.next_hit(t("2027-11-07T00:00:00Z")).unwrap();
        assert_eq!(first, t("2027-11-07T05:30:00Z"));
        assert_eq!(fold.next_hit(first), Some(t("2027-11-08T06:30:00Z")));
    }

    /// robfig/cron's macros.
    #[test]
    fn macros() {
        let table = [
            ("@yearly", "2027-01-01T00:00:00+00:00"),
            ("@annually", "2027-01-01T00:00:00+00:00"),
            ("@monthly", "2026-12-01T00:00:00+00:00"),
            ("@weekly", "2026-12-06T00:00:00+00:00"), // Sunday
            ("@daily", "2026-12-01T00:00:00+00:00"),
            ("@midnight", "2026-12-01T00:00:00+00:00"),
            ("@hourly", "2026-11-30T11:00:00+00:00"),
            ("@DAILY", "2026-12-01T00:00:00+00:00"),
        ];
        for (expr, want) in table {
            assert_eq!(next(expr, "2026-11-30T10:30:00Z"), want, "{expr}");
        }
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

//! Karpenter NodePool disruption budgets, for `[budgets] source = "nodepool"`: a group's budgets
//! are read from the `karpenter.sh/v1` NodePool of the same name (`spec.disruption.budgets`),
//! exactly as Karpenter reads them (sigs.k8s.io/karpenter `pkg/apis/v1/nodepool.go`
//! `GetAllowedDisruptionsByReason`, and the CRD's validation):
//!
//! - `budgets` absent: one budget of `nodes: "10%"` (the CRD's default); `budgets: []`: none
//!   (unlimited); at most 50 items.
//! - `nodes` matches `^((100|[0-9]{1,2})%|[0-9]+)$` (default `"10%"`); percentages round up.
//! - `schedule` and `duration` both or neither; `duration` matches
//!   `^((([0-9]+(h|m))|([0-9]+h[0-9]+m))(0s)?)$`; `schedule` is robfig/cron's standard language
//!   (5 fields or `@yearly` … `@hourly`), always read in UTC (Karpenter has no time zones).
//! - `reasons`: `Underutilized`, `Empty`, `Drifted` (a set). Absent: the budget applies to every
//!   reason; Karpenter's reasons only: it gates none of nodekeeper's (see docs/policy.md); an
//!   empty list applies to nothing (Karpenter's `lo.Contains` on an empty list).
//!
//! A NodePool Karpenter would refuse (or with a budget it fails closed on) is a
//! [`NodePoolError`] naming the NodePool and the field; the group then holds (allowed 0).
//! Pure: the controller hands the NodePools' JSON in (see [`super::view::ClusterView`]).

use std::sync::LazyLock;
use std::time::Duration;

use regex::Regex;
use serde_json::Value;

use super::budget::Window;
use super::config::{Budget, Quantity};

/// Node label naming the Karpenter NodePool a node belongs to.
pub const POOL_LABEL: &str = "karpenter.sh/nodepool";

/// A NodePool whose budgets Karpenter would refuse, or that nodekeeper cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("NodePool {pool}: {path}: {problem}")]
pub struct NodePoolError {
    /// The NodePool's name.
    pub pool: String,
    /// The field (`spec.disruption.budgets[1].nodes`).
    pub path: String,
    /// What is wrong with it.
    pub problem: String,
}

/// One budget of a NodePool, as nodekeeper evaluates it.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolBudget {
    /// Its index in `spec.disruption.budgets`.
    pub index: usize,
    /// The budget (time zone always UTC; Karpenter's reason names kept as written).
    pub budget: Budget,
}

/// The budgets of one NodePool, or why they cannot be used.
pub type PoolBudgets = Result<Vec<PoolBudget>, NodePoolError>;

/// Karpenter's disruption reasons (the CRD's enum).
pub const KARPENTER_REASONS: [&str; 3] = ["Underutilized", "Empty", "Drifted"];

/// The CRD's `maxItems` of `budgets` (and of `reasons`).
const MAX_ITEMS: usize = 50;

/// The field path of the budgets.
const BUDGETS: &str = "spec.disruption.budgets";

const NODES_PATTERN: &str = r"^((100|[0-9]{1,2})%|[0-9]+)$";
const DURATION_PATTERN: &str = r"^((([0-9]+(h|m))|([0-9]+h[0-9]+m))(0s)?)$";
const SCHEDULE_PATTERN: &str =
    r"^(@(annually|yearly|monthly|weekly|daily|midnight|hourly))|((.+)\s(.+)\s(.+)\s(.+)\s(.+))$";

static NODES: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(NODES_PATTERN).ok());
static DURATION: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(DURATION_PATTERN).ok());
static SCHEDULE: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(SCHEDULE_PATTERN).ok());

fn matches(re: &LazyLock<Option<Regex>>, s: &str) -> bool {
    re.as_ref().is_some_and(|r| r.is_match(s))
}

/// A NodePool object (JSON, as listed or watched): its name and budgets. `None` without a name.
pub fn read_nodepool(obj: &Value) -> Option<(String, PoolBudgets)> {
    let name = obj.pointer("/metadata/name")?.as_str()?.to_string();
    let budgets = read_budgets(&name, obj.pointer("/spec/disruption/budgets"));
    Some((name, budgets))
}

/// Reads `spec.disruption.budgets` of NodePool `pool` (`None`: the field is absent).
pub fn read_budgets(pool: &str, budgets: Option<&Value>) -> PoolBudgets {
    let err = |path: String, problem: String| NodePoolError {
        pool: pool.to_string(),
        path,
        problem,
    };
    let items = match budgets {
        None | Some(Value::Null) => {
            return Ok(vec![PoolBudget {
                index: 0,
                budget: Budget::always(Quantity::Percent(10)),
            }])
        }
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(err(
                BUDGETS.into(),
                format!("must be a list, not {}", json_kind(other)),
            ))
        }
    };
    if items.len() > MAX_ITEMS {
        return Err(err(
            BUDGETS.into(),
            format!(
                "has {} items; Karpenter allows at most {MAX_ITEMS}",
                items.len()
            ),
        ));
    }
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        if let Some(b) =
            read_budget(item, &format!("{BUDGETS}[{i}]")).map_err(|(p, m)| err(p, m))?
        {
            out.push(PoolBudget {
                index: i,
                budget: b,
            });
        }
    }
    Ok(out)
}

/// One item; `Ok(None)`: valid but applies to no reason (`reasons: []`).
fn read_budget(item: &Value, at: &str) -> Result<Option<Budget>, (String, String)> {
    let field = |f: &str| format!("{at}.{f}");
    let Value::Object(m) = item else {
        return Err((
            at.to_string(),
            format!("must be an object, not {}", json_kind(item)),
        ));
    };
    let string = |f: &str| -> Result<Option<&str>, (String, String)> {
        match m.get(f) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(other) => Err((
                field(f),
                format!("must be a string, not {}", json_kind(other)),
            )),
        }
    };
    // The CRD defaults `nodes` to "10%".
    let nodes_raw = string("nodes")?.unwrap_or("10%");
    let nodes = parse_nodes(nodes_raw).ok_or_else(|| {
        (
            field("nodes"),
            format!(
                "{nodes_raw:?} does not match {NODES_PATTERN} (a node count such as \"1\" or a percentage 0-100% such as \"10%\")"
            ),
        )
    })?;
    let (schedule, duration) = match (string("schedule")?, string("duration")?) {
        (None, None) => (None, None),
        (Some(_), None) => {
            return Err((
                field("schedule"),
                "'schedule' must be set with 'duration'".into(),
            ))
        }
        (None, Some(_)) => {
            return Err((
                field("duration"),
                "'schedule' must be set with 'duration'".into(),
            ))
        }
        (Some(s), Some(d)) => {
            let dur = parse_duration(d).ok_or_else(|| {
                (
                    field("duration"),
                    format!(
                        "{d:?} does not match {DURATION_PATTERN} (hours and minutes, such as \"14h\" or \"1h30m\")"
                    ),
                )
            })?;
            if !matches(&SCHEDULE, s) {
                return Err((
                    field("schedule"),
                    format!(
                        "{s:?} does not match {SCHEDULE_PATTERN} (5 cron fields, or @yearly, @monthly, @weekly, @daily, @hourly ...)"
                    ),
                ));
            }
            Window::parse(s, dur, "UTC").map_err(|e| (field("schedule"), e))?;
            (Some(s.to_string()), Some(dur))
        }
    };
    let reasons = match m.get("reasons") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(rs)) => {
            if rs.is_empty() {
                return Ok(None);
            }
            if rs.len() > MAX_ITEMS {
                return Err((
                    field("reasons"),
                    format!(
                        "has {} items; Karpenter allows at most {MAX_ITEMS}",
                        rs.len()
                    ),
                ));
            }
            let mut out: Vec<String> = Vec::new();
            for (j, r) in rs.iter().enumerate() {
                let at = format!("{at}.reasons[{j}]");
                match r.as_str() {
                    Some(s) if KARPENTER_REASONS.contains(&s) => {
                        if out.iter().any(|o| o == s) {
                            return Err((at, format!("duplicate value {s:?}")));
                        }
                        out.push(s.to_string());
                    }
                    _ => {
                        return Err((
                            at,
                            format!(
                                "{r} is not one of {} (Karpenter's disruption reasons)",
                                KARPENTER_REASONS.join(", ")
                            ),
                        ))
                    }
                }
            }
            out
        }
        Some(other) => {
            return Err((
                field("reasons"),
                format!("must be a list, not {}", json_kind(other)),
            ))
        }
    };
    Ok(Some(Budget {
        nodes,
        schedule,
        duration,
        timezone: None,
        reasons,
    }))
}

/// `nodes` as the CRD accepts it; a count beyond `u32` saturates (it is unlimited anyway).
fn parse_nodes(s: &str) -> Option<Quantity> {
    if !matches(&NODES, s) {
        return None;
    }
    match s.strip_suffix('%') {
        Some(p) => p.parse().ok().map(Quantity::Percent),
        None => Some(Quantity::Count(s.parse().unwrap_or(u32::MAX))),
    }
}

/// A duration as the CRD accepts it: `14h`, `90m`, `1h30m`, each optionally followed by `0s`.
fn parse_duration(s: &str) -> Option<Duration> {
    if !matches(&DURATION, s) {
        return None;
    }
    let s = s.strip_suffix("0s").unwrap_or(s);
    let (hours, minutes) = match s.split_once('h') {
        Some((h, m)) => (h, m.strip_suffix('m').unwrap_or(m)),
        None => ("0", s.strip_suffix('m')?),
    };
    let num = |v: &str| -> Option<u64> {
        if v.is_empty() {
            Some(0)
        } else {
            v.parse().ok()
        }
    };
    let secs = num(hours)?
        .checked_mul(3600)?
        .checked_add(num(minutes)?.checked_mul(60)?)?;
    Some(Duration::from_secs(secs))
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(budgets: Value) -> PoolBudgets {
        read_budgets("shared-spot", Some(&budgets))
    }

    #[test]
    fn durations_are_hours_and_minutes() {
        let table = [
            ("14h", Some(14 * 3600)),
            ("90m", Some(90 * 60)),
            ("1h30m", Some(5400)),
            ("2h0s", Some(7200)),
            ("1h30m0s", Some(5400)),
            ("0m", Some(0)),
            ("10s", None),
            ("1d", None),
            ("1h30", None),
            ("h", None),
            ("1.5h", None),
            (" 1h", None),
            ("99999999999999999999h", None),
        ];
        for (s, want) in table {
            assert_eq!(parse_duration(s).map(|d| d.as_secs()), want, "{s}");
        }
    }

    #[test]
    fn nodes_as_the_crd_accepts_them() {
        let table = [
            ("1", Some(Quantity::Count(1))),
            ("0", Some(Quantity::Count(0))),
            ("007", Some(Quantity::Count(7))),
            ("10%", Some(Quantity::Percent(10))),
            ("0%", Some(Quantity::Percent(0))),
            ("100%", Some(Quantity::Percent(100))),
            ("99999999999", Some(Quantity::Count(u32::MAX))),
            ("150%", None),
            ("101%", None),
            ("100 %", None),
            (" 1", None),
            ("-1", None),
            ("1.5", None),
            ("", None),
        ];
        for (s, want) in table {
            assert_eq!(parse_nodes(s), want, "{s}");
        }
    }

    #[test]
    fn rejections_name_the_nodepool_and_the_field() {
        let table = [
            (
                json!([{"nodes": "1"}, {"nodes": "150%"}]),
                "NodePool shared-spot: spec.disruption.budgets[1].nodes: \"150%\" does not match",
            ),
            (
                json!([{"nodes": "1", "schedule": "@daily"}]),
                "NodePool shared-spot: spec.disruption.budgets[0].schedule: 'schedule' must be set with 'duration'",
            ),
            (
                json!([{"nodes": "1", "duration": "1h"}]),
                "spec.disruption.budgets[0].duration: 'schedule' must be set with 'duration'",
            ),
            (
                json!([{"nodes": "1", "schedule": "@daily", "duration": "1d"}]),
                "spec.disruption.budgets[0].duration: \"1d\" does not match",
            ),
            (
                json!([{"nodes": "1", "schedule": "0 9 * *", "duration": "1h"}]),
                "spec.disruption.budgets[0].schedule: \"0 9 * *\" does not match",
            ),
            (
                json!([{"nodes": "1", "schedule": "0 0 9 * * 1", "duration": "1h"}]),
                "spec.disruption.budgets[0].schedule: schedule `0 0 9 * * 1` has 6 fields",
            ),
            (
                json!([{"nodes": "1", "schedule": "0 9 L * *", "duration": "1h"}]),
                "spec.disruption.budgets[0].schedule: schedule `0 9 L * *`: `L` is not standard cron",
            ),
            (
                json!([{"nodes": "1", "schedule": "@every 1h", "duration": "1h"}]),
                "spec.disruption.budgets[0].schedule: \"@every 1h\" does not match",
            ),
            (
                json!([{"nodes": "1", "reasons": ["Drifted", "Expired"]}]),
                "spec.disruption.budgets[0].reasons[1]: \"Expired\" is not one of Underutilized, Empty, Drifted",
            ),
            (
                json!([{"nodes": "1", "reasons": ["Empty", "Empty"]}]),
                "spec.disruption.budgets[0].reasons[1]: duplicate value \"Empty\"",
            ),
            (
                json!([{"nodes": 1}]),
                "spec.disruption.budgets[0].nodes: must be a string, not a number",
            ),
            (json!({"nodes": "1"}), "spec.disruption.budgets: must be a list, not an object"),
            (
                Value::Array(vec![json!({"nodes": "1"}); 51]),
                "spec.disruption.budgets: has 51 items; Karpenter allows at most 50",
            ),
        ];
        for (budgets, want) in table {
            let e = read(budgets.clone()).expect_err(&budgets.to_string());
            assert_eq!(e.pool, "shared-spot");
            let msg = e.to_string();
            assert!(msg.contains(want), "{budgets}: {msg}");
        }
    }

    #[test]
    fn accepted_budgets_keep_their_index_and_read_in_utc() {
        let b = read(json!([
            {"nodes": "10%"},
            {"nodes": "5%", "schedule": "0 1 * * *", "duration": "14h", "reasons": ["Drifted"]},
            {"nodes": "0", "reasons": []},
            {},
            {"nodes": "2", "schedule": "@daily", "duration": "1h30m0s", "unknown": true},
        ]))
        .unwrap();
        let idx: Vec<usize> = b.iter().map(|b| b.index).collect();
        assert_eq!(idx, vec![0, 1, 3, 4], "reasons: [] applies to nothing");
        assert_eq!(b[1].budget.duration, Some(Duration::from_secs(14 * 3600)));
        assert_eq!(b[1].budget.reasons, vec!["Drifted".to_string()]);
        assert_eq!(b[1].budget.timezone, None);
        assert_eq!(b[2].budget.nodes, Quantity::Percent(10), "CRD default");
        assert_eq!(b[3].budget.duration, Some(Duration::from_secs(5400)));
        // absent: Karpenter's default, one 10%; an empty list: no budget at all.
        let d = read_budgets("p", None).unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].budget, Budget::always(Quantity::Percent(10)));
        assert_eq!(read(json!([])).unwrap(), vec![]);
    }

    #[test]
    fn a_whole_nodepool_object_is_read() {
        let obj = json!({
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodePool",
            "metadata": {"name": "default"},
            "spec": {"disruption": {"budgets": [{"nodes": "100%"}]}},
        });
        let (name, b) = read_nodepool(&obj).unwrap();
        assert_eq!(name, "default");
        assert_eq!(b.unwrap()[0].budget.nodes, Quantity::Percent(100));
        assert!(read_nodepool(&json!({"spec": {}})).is_none());
    }
}

//! Kubernetes 1.37's node lifecycle conditions (KEP-5683, gate `NodeLifecycleConditions`) that
//! follow a node's notices: `MaintenancePlanned` and `MaintenanceInProgress` from a scheduled host
//! maintenance notice, `GracefulNodeShutdownInProgress` from the agent's shutdown watcher.
//!
//! KEP-5683 leaves them to "an admin, or an admin-authorized maintenance controller", which sets
//! the status to `True` "when appropriate" and clears it "by setting the condition status to
//! `False` or removing the condition"; `reason` is a stable CamelCase cause (its examples:
//! `MaintenanceWindow`, `NodeShutdown`), `message` optional details. [`decide`] says which of the
//! three change on one node now (pure; only real transitions, so each `lastTransitionTime` stays
//! true) and when they next change by time alone; the engine writes them with the drain's
//! conditions' writer (`act/drain/lifecycle.rs`) and wakes then. A `True` condition some other
//! writer set (another reason) is neither rewritten nor cleared.

use chrono::{DateTime, SecondsFormat, Utc};

use super::config::PolicyConfig;
use super::interruption::announced_at;
use super::later;
use super::view::{NodeView, Notice, NoticeKind};
use crate::controller::catalog::{
    GRACEFUL_NODE_SHUTDOWN_IN_PROGRESS, MAINTENANCE_ENDED, MAINTENANCE_IN_PROGRESS,
    MAINTENANCE_PLANNED, MAINTENANCE_STARTED, MAINTENANCE_WINDOW, NODE_REBOOTED, NODE_SHUTDOWN,
    NOTICE_WITHDRAWN,
};

/// One condition to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// Condition type.
    pub type_: &'static str,
    /// True or False.
    pub status: bool,
    /// One of [`crate::controller::catalog::NOTICE_CONDITION_REASONS`] or
    /// [`crate::controller::catalog::DRAIN_CONDITION_REASONS`].
    pub reason: &'static str,
    /// Details.
    pub message: String,
    /// The status changes (else only the message does: `lastTransitionTime` stays as it is).
    pub transition: bool,
}

/// What [`decide`] found for one node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Lifecycle {
    /// The conditions to write now.
    pub changes: Vec<Condition>,
    /// When they next change by time alone (a window's start or end), if they will.
    pub next: Option<DateTime<Utc>>,
}

/// What one condition should be.
enum Want {
    On(&'static str, String),
    Off(&'static str),
}

/// A maintenance notice's window: its announced start (else detection + `default_lead`, as the
/// interruption policy takes it) to its announced end (else the start + `release_after`, when the
/// interruption policy lets a node that outlived its notice go).
struct Window<'a> {
    notice: &'a Notice,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
}

impl Window<'_> {
    fn message(&self) -> String {
        let n = self.notice;
        let start = match n.at {
            Some(_) => ts(self.start),
            None => format!("{} (not announced; expected)", ts(self.start)),
        };
        let end = match n.until {
            Some(_) => ts(self.end),
            None => format!("{} (not announced; expected)", ts(self.end)),
        };
        format!(
            "scheduled host maintenance (notice {}): {start} to {end}",
            n.id
        )
    }
}

fn ts(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The lifecycle conditions of `node` that change now, and when they next will.
pub fn decide(node: &NodeView, cfg: &PolicyConfig, now: DateTime<Utc>) -> Lifecycle {
    let withdrawn = node.withdrawn_notices();
    let live = |kind: NoticeKind| {
        let withdrawn = &withdrawn;
        node.notices
            .iter()
            .filter(move |n| n.kind == kind && !withdrawn.contains(&n.id.as_str()))
    };
    let mut out = Lifecycle::default();

    let windows: Vec<Window<'_>> = live(NoticeKind::Maintenance)
        .map(|n| {
            let start = announced_at(n, cfg);
            let end = n
                .until
                .unwrap_or_else(|| later(start, cfg.interruption.release_after));
            Window {
                notice: n,
                start,
                end,
            }
        })
        .collect();
    let (planned, in_progress) = match windows
        .iter()
        .filter(|w| w.end > now)
        .min_by_key(|w| w.start)
    {
        Some(w) if now < w.start => {
            out.next = Some(w.start);
            let m = w.message();
            (
                Want::On(MAINTENANCE_WINDOW, m),
                Want::Off(MAINTENANCE_ENDED),
            )
        }
        Some(w) => {
            out.next = Some(w.end);
            let m = w.message();
            (
                Want::Off(MAINTENANCE_STARTED),
                Want::On(MAINTENANCE_WINDOW, m),
            )
        }
        None if !windows.is_empty() => (Want::Off(MAINTENANCE_ENDED), Want::Off(MAINTENANCE_ENDED)),
        None => (Want::Off(NOTICE_WITHDRAWN), Want::Off(NOTICE_WITHDRAWN)),
    };
    set(node, &mut out.changes, MAINTENANCE_PLANNED, planned);
    set(node, &mut out.changes, MAINTENANCE_IN_PROGRESS, in_progress);

    // A shutdown belongs to the boot it was announced from: over once the agent reports another.
    let shutdowns: Vec<&Notice> = live(NoticeKind::ShuttingDown).collect();
    let same_boot = |n: &&&Notice| match (&n.boot_id, &node.agent_boot_id) {
        (Some(then), Some(now)) => then == now,
        _ => true,
    };
    let shutdown = match shutdowns.iter().find(same_boot) {
        Some(n) => Want::On(
            NODE_SHUTDOWN,
            format!(
                "the node's agent reported a shutdown at {} (notice {})",
                ts(n.detected_at),
                n.id
            ),
        ),
        None if !shutdowns.is_empty() => Want::Off(NODE_REBOOTED),
        None => Want::Off(NOTICE_WITHDRAWN),
    };
    set(
        node,
        &mut out.changes,
        GRACEFUL_NODE_SHUTDOWN_IN_PROGRESS,
        shutdown,
    );
    out
}

/// Pushes the write that takes `type_` on `node` to `want`, if one is needed: `True` when it is not
/// (or is ours with another message); `False` only over a `True` of ours.
fn set(node: &NodeView, out: &mut Vec<Condition>, type_: &'static str, want: Want) {
    let cur = node.condition(type_);
    let ours =
        cur.is_some_and(|c| [MAINTENANCE_WINDOW, NODE_SHUTDOWN].contains(&c.reason.as_str()));
    let is_true = cur.is_some_and(|c| c.status == "True");
    match want {
        Want::On(reason, message) => {
            if is_true && (!ours || cur.is_some_and(|c| c.message == message)) {
                return;
            }
            out.push(Condition {
                type_,
                status: true,
                reason,
                message,
                transition: !is_true,
            });
        }
        Want::Off(reason) if is_true && ours => out.push(Condition {
            type_,
            status: false,
            reason,
            message: match reason {
                MAINTENANCE_STARTED => "the maintenance window started".into(),
                MAINTENANCE_ENDED => "the maintenance window ended".into(),
                NODE_REBOOTED => "the node's agent reports from a new boot".into(),
                _ => "the notice was withdrawn".into(),
            },
            transition: true,
        }),
        Want::Off(_) => {}
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::controller::catalog::NOTICE_CONDITION_REASONS;
    use crate::controller::policy::view::ConditionView;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    fn notice(id: &str, kind: NoticeKind, at: Option<i64>, until: Option<i64>) -> Notice {
        Notice {
            id: id.into(),
            kind,
            at: at.map(t),
            detected_at: t(0),
            until: until.map(t),
            boot_id: Some("b1".into()),
        }
    }

    /// A node holding `notices` and `conditions` (type, status, reason, message).
    fn node(notices: Vec<Notice>, conditions: &[Cond]) -> NodeView {
        let mut n = NodeView::new("n", t(-1000));
        n.agent_boot_id = Some("b1".into());
        n.notices = notices;
        n.conditions
            .extend(conditions.iter().map(|(ty, st, r, m)| ConditionView {
                type_: ty.to_string(),
                status: st.to_string(),
                last_transition_time: t(0),
                reason: r.to_string(),
                message: m.to_string(),
                last_heartbeat_time: None,
            }));
        n
    }

    /// A condition on the node: (type, status, reason, message).
    type Cond<'a> = (&'a str, &'a str, &'a str, &'a str);
    /// A write: (type, status, reason).
    type Moved<'a> = (&'a str, bool, &'a str);

    fn short(l: &Lifecycle) -> Vec<Moved<'_>> {
        l.changes
            .iter()
            .map(|c| (c.type_, c.status, c.reason))
            .collect()
    }

    const MSG: &str =
        "scheduled host maintenance (notice m1): 2027-01-15T08:00:10Z to 2027-01-15T08:00:20Z";

    #[test]
    fn a_maintenance_window_is_planned_then_in_progress_then_over() {
        use NoticeKind::*;
        let m = || notice("m1", Maintenance, Some(10), Some(20));
        let planned = (MAINTENANCE_PLANNED, "True", MAINTENANCE_WINDOW, MSG);
        let running = (MAINTENANCE_IN_PROGRESS, "True", MAINTENANCE_WINDOW, MSG);
        let admin = (MAINTENANCE_PLANNED, "True", "AdminRequested", "mine");
        type Row<'a> = (
            &'a str,
            Vec<Notice>,
            Vec<Cond<'a>>,
            i64,
            Vec<Moved<'a>>,
            Option<i64>,
        );
        let table: Vec<Row> = vec![
            (
                "announced: planned",
                vec![m()],
                vec![],
                1,
                vec![(MAINTENANCE_PLANNED, true, MAINTENANCE_WINDOW)],
                Some(10),
            ),
            (
                "planned already: nothing",
                vec![m()],
                vec![planned],
                2,
                vec![],
                Some(10),
            ),
            (
                "window start: planned off, in progress on",
                vec![m()],
                vec![planned],
                10,
                vec![
                    (MAINTENANCE_PLANNED, false, MAINTENANCE_STARTED),
                    (MAINTENANCE_IN_PROGRESS, true, MAINTENANCE_WINDOW),
                ],
                Some(20),
            ),
            (
                "in progress already: nothing",
                vec![m()],
                vec![running],
                15,
                vec![],
                Some(20),
            ),
            (
                "window end: in progress off",
                vec![m()],
                vec![running],
                20,
                vec![(MAINTENANCE_IN_PROGRESS, false, MAINTENANCE_ENDED)],
                None,
            ),
            (
                "withdrawn before its start",
                vec![m(), notice("c", Cancelled { of: "m1".into() }, None, None)],
                vec![planned],
                5,
                vec![(MAINTENANCE_PLANNED, false, NOTICE_WITHDRAWN)],
                None,
            ),
            (
                "forgotten (pruned, a restart): withdrawn",
                vec![],
                vec![running],
                15,
                vec![(MAINTENANCE_IN_PROGRESS, false, NOTICE_WITHDRAWN)],
                None,
            ),
            (
                "an admin's True is left alone",
                vec![],
                vec![admin],
                5,
                vec![],
                None,
            ),
            (
                "an admin's True is not rewritten",
                vec![m()],
                vec![admin],
                5,
                vec![],
                Some(10),
            ),
            (
                "never set: no False written",
                vec![],
                vec![],
                5,
                vec![],
                None,
            ),
            (
                "the window moved: the message is rewritten",
                vec![notice("m1", Maintenance, Some(10), Some(30))],
                vec![planned],
                5,
                vec![(MAINTENANCE_PLANNED, true, MAINTENANCE_WINDOW)],
                Some(10),
            ),
            (
                "no end announced: start + release_after (15 min)",
                vec![notice("m2", Maintenance, Some(10), None)],
                vec![],
                11,
                vec![(MAINTENANCE_IN_PROGRESS, true, MAINTENANCE_WINDOW)],
                Some(910),
            ),
            (
                "no time announced: detection + default_lead (120 s)",
                vec![notice("m3", Maintenance, None, None)],
                vec![],
                1,
                vec![(MAINTENANCE_PLANNED, true, MAINTENANCE_WINDOW)],
                Some(120),
            ),
            (
                "two windows: the sooner first",
                vec![notice("late", Maintenance, Some(100), Some(200)), m()],
                vec![],
                1,
                vec![(MAINTENANCE_PLANNED, true, MAINTENANCE_WINDOW)],
                Some(10),
            ),
            (
                "one over, the next planned: in progress off",
                vec![notice("late", Maintenance, Some(100), Some(200)), m()],
                vec![running],
                25,
                vec![
                    (MAINTENANCE_PLANNED, true, MAINTENANCE_WINDOW),
                    (MAINTENANCE_IN_PROGRESS, false, MAINTENANCE_ENDED),
                ],
                Some(100),
            ),
            (
                "other notices set nothing",
                vec![notice("p", Preemption, Some(10), None)],
                vec![],
                1,
                vec![],
                None,
            ),
        ];
        for (what, notices, conds, now, want, next) in table {
            let got = decide(&node(notices, &conds), &PolicyConfig::default(), t(now));
            assert_eq!(short(&got), want, "{what}");
            assert_eq!(got.next, next.map(t), "{what}: next");
            // Only a True of ours rewritten with a new message keeps its transition time.
            let rewrite = what.starts_with("the window moved");
            for c in &got.changes {
                assert_eq!(c.transition, !rewrite, "{what}: {c:?}");
                assert!(
                    NOTICE_CONDITION_REASONS.contains(&c.reason),
                    "{what}: {c:?}"
                );
            }
        }
    }

    #[test]
    fn the_message_holds_the_window() {
        let n = node(
            vec![notice("m1", NoticeKind::Maintenance, Some(10), Some(20))],
            &[],
        );
        let got = decide(&n, &PolicyConfig::default(), t(0));
        assert_eq!(got.changes[0].message, MSG);
        let n = node(vec![notice("m3", NoticeKind::Maintenance, None, None)], &[]);
        let got = decide(&n, &PolicyConfig::default(), t(0));
        assert_eq!(
            got.changes[0].message,
            "scheduled host maintenance (notice m3): 2027-01-15T08:02:00Z (not announced; expected) \
             to 2027-01-15T08:17:00Z (not announced; expected)"
        );
    }

    #[test]
    fn a_shutdown_lasts_until_the_agent_reports_from_a_new_boot() {
        let sd = || notice("s1", NoticeKind::ShuttingDown, None, None);
        let on = (
            GRACEFUL_NODE_SHUTDOWN_IN_PROGRESS,
            "True",
            NODE_SHUTDOWN,
            "x",
        );
        type Case<'a> = (
            &'a str,
            Vec<Notice>,
            Option<&'a str>,
            Vec<Cond<'a>>,
            Vec<Moved<'a>>,
        );
        let cases: Vec<Case> = vec![
            (
                "shutting down",
                vec![sd()],
                Some("b1"),
                vec![],
                vec![(GRACEFUL_NODE_SHUTDOWN_IN_PROGRESS, true, NODE_SHUTDOWN)],
            ),
            (
                "no report since this controller started",
                vec![sd()],
                None,
                vec![],
                vec![(GRACEFUL_NODE_SHUTDOWN_IN_PROGRESS, true, NODE_SHUTDOWN)],
            ),
            (
                "a new boot",
                vec![sd()],
                Some("b2"),
                vec![on],
                vec![(GRACEFUL_NODE_SHUTDOWN_IN_PROGRESS, false, NODE_REBOOTED)],
            ),
            (
                "cancelled (PrepareForShutdown(false))",
                vec![
                    sd(),
                    notice("c", NoticeKind::Cancelled { of: "s1".into() }, None, None),
                ],
                Some("b1"),
                vec![on],
                vec![(GRACEFUL_NODE_SHUTDOWN_IN_PROGRESS, false, NOTICE_WITHDRAWN)],
            ),
            (
                "a new boot, never set: nothing",
                vec![sd()],
                Some("b2"),
                vec![],
                vec![],
            ),
        ];
        for (what, notices, boot, conds, want) in cases {
            let mut n = node(notices, &conds);
            n.agent_boot_id = boot.map(String::from);
            let got = decide(&n, &PolicyConfig::default(), t(5));
            assert_eq!(short(&got), want, "{what}");
            assert_eq!(got.next, None, "{what}");
        }
    }
}

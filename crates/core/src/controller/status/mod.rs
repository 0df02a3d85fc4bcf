//! `nodekeeper status`: what nodekeeper is doing with each Node and what holds it back, read
//! back from the annotations the controller writes (see [`keys`](crate::controller::policy::view::keys) and
//! docs/status.md).
//!
//! Two halves, re-exported here: the model (`model.rs`: [`NodeStatus::from_parts`] turns a Node's
//! labels and annotations into a row; [`list_rows`], the only part that talks to the API server,
//! lists the Nodes, paginated, and builds the rows) and the rendering (`render.rs`: [`render()`]
//! turns rows into the text table or the JSON document). The command (arguments, exit codes,
//! printing) is the binary's `cli::status`.

pub mod explain;
pub mod history;
mod model;
mod render;

pub use self::model::{
    budget_rows, list_nodepools, list_rows, next, BudgetStatus, CordonedBy, HoldStatus, Next,
    NodeStatus, NoticeStatus, StatusError, Summary,
};
pub use self::render::{
    age, blocker_cell, relative, render, render_with_budgets, StatusDocument, StatusOutput,
    SCHEMA_VERSION,
};

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use chrono::{DateTime, Utc};

    use super::render::{next_cell, render_budgets};
    use super::*;
    use crate::controller::policy::config::{BudgetsConfig, BudgetsSource};
    use crate::controller::policy::explain::{Blocker, Held};
    use crate::controller::policy::nodepool::PoolBudgets;
    use crate::controller::policy::view::{keys, NoticeKind, Record, RecordedNotice, State};

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }
    const NOW: &str = "2026-11-30T12:00:00Z";

    fn ann(pairs: &[(&str, String)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    fn group(g: &str) -> BTreeMap<String, String> {
        ann(&[("karpenter.sh/nodepool", g.to_string())])
    }

    fn row(name: &str, g: &str, a: &[(&str, String)], unsched: bool) -> NodeStatus {
        NodeStatus::from_parts(name, &group(g), &ann(a), unsched, "karpenter.sh/nodepool")
    }

    fn held(b: Blocker, since: &str) -> String {
        Held {
            blocker: b,
            since: t(since),
        }
        .encode()
    }

    fn fixture() -> Vec<NodeStatus> {
        let budget = held(
            Blocker::Budget {
                group: "spot".into(),
                budget: 1,
                nodes: "1".into(),
                disrupting: 1,
                total: 4,
                opens_at: Some(t("2026-11-30T15:00:00Z")),
                timezone: Some("Asia/Shanghai".into()),
                nodepool: None,
            },
            "2026-11-30T11:50:00Z",
        );
        let pdb = held(
            Blocker::Pdb {
                pod: "shop/web-1".into(),
                pdb: "shop/web".into(),
                deadline: Some(t("2026-11-30T12:05:00Z")),
            },
            "2026-11-30T11:58:00Z",
        );
        let notice = RecordedNotice {
            kind: NoticeKind::Preemption,
            id: "aws-spot-1".into(),
            at: t("2026-11-30T12:02:00Z"),
        };
        vec![
            row("a-idle", "spot", &[], false),
            row("b-admin", "on-demand", &[], true),
            row(
                "c-budget",
                "spot",
                &[
                    (keys::STATE, "repairing".into()),
                    (keys::STATE_SINCE, "2026-11-30T11:45:00Z".into()),
                    (keys::REASON, "repair:Ready=False".into()),
                    (keys::BLOCKED, budget),
                ],
                false,
            ),
            row(
                "d-pdb",
                "spot",
                &[
                    (keys::STATE, "repairing".into()),
                    (keys::STATE_SINCE, "2026-11-30T10:00:00Z".into()),
                    (keys::REASON, "repair:Ready=False".into()),
                    (keys::REPAIR_STEP, "drain".into()),
                    (keys::REPAIR_STEP_SINCE, "2026-11-30T11:57:30Z".into()),
                    (keys::CORDONED_BY, keys::OWNER.into()),
                    (keys::BLOCKED, pdb),
                ],
                true,
            ),
            row(
                "e-spot",
                "spot",
                &[
                    (keys::STATE, "interrupted".into()),
                    (keys::STATE_SINCE, "2026-11-30T11:59:00Z".into()),
                    (keys::REASON, "interruption:preemption".into()),
                    (keys::CORDONED_BY, keys::OWNER.into()),
                    (keys::INTERRUPTION, notice.encode()),
                    (keys::REPLACEMENT_REQUESTED, "2026-11-30T11:59:01Z".into()),
                ],
                true,
            ),
        ]
    }

    #[test]
    fn table_names_blockers_next_steps_and_summary() {
        let out = render(&fixture(), StatusOutput::Text, t(NOW));
        let expected = "\
NODE       GROUP       STATE                  BLOCKER                                                                  SINCE   NEXT
a-idle     spot        idle                   -                                                                        -       -
b-admin    on-demand   idle,admin-cordoned    -                                                                        -       -
c-budget   spot        repairing              budget #1 nodes=1 of spot (1/4 disrupting), opens 2026-11-30 23:00 CST   15m     start when the budget window opens (in 3h)
d-pdb      spot        repairing,cordoned     PDB shop/web (pod shop/web-1)                                            2h      evict shop/web-1 once PDB shop/web allows (in 5m)
e-spot     spot        interrupted,cordoned   -                                                                        1m      finish the drain before the preemption (in 2m)
5 nodes, 3 acting, 2 held
";
        assert_eq!(out, expected, "\n{out}");
    }

    #[test]
    fn wide_adds_reason_step_notice_replacement() {
        let out = render(&fixture(), StatusOutput::Wide, t(NOW));
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].ends_with("REASON                    STEP         NOTICE                            REPLACEMENT"), "{}", lines[0]);
        assert!(
            lines[4].contains("repair:Ready=False") && lines[4].contains("drain (2m)"),
            "{}",
            lines[4]
        );
        assert!(
            lines[5].contains("preemption at 12:02:00Z (in 2m)")
                && lines[5].ends_with("requested 59s ago"),
            "{}",
            lines[5]
        );
        assert_eq!(lines.last(), Some(&"5 nodes, 3 acting, 2 held"));
    }

    #[test]
    fn json_is_versioned_and_carries_the_full_blocker() {
        let out = render(&fixture(), StatusOutput::Json, t(NOW));
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["version"], SCHEMA_VERSION);
        assert_eq!(v["generated_at"], NOW);
        assert_eq!(
            v["summary"],
            serde_json::json!({"nodes": 5, "acting": 3, "held": 2})
        );
        let n = &v["nodes"];
        assert_eq!(n[0]["state"], "idle");
        assert!(n[0]["held"].is_null() && n[0]["next"].is_null());
        assert_eq!(n[1]["cordoned_by"], "admin");
        assert_eq!(n[2]["held"]["reason"], "BlockedByBudget");
        assert_eq!(n[2]["held"]["blocker"]["kind"], "budget");
        assert_eq!(n[2]["held"]["blocker"]["opens_at"], "2026-11-30T15:00:00Z");
        assert_eq!(n[2]["held"]["blocker"]["timezone"], "Asia/Shanghai");
        assert_eq!(n[2]["next"]["at"], "2026-11-30T15:00:00Z");
        assert_eq!(n[3]["held"]["blocker"]["pod"], "shop/web-1");
        assert_eq!(n[3]["held"]["blocker"]["pdb"], "shop/web");
        assert_eq!(n[3]["held"]["blocker"]["deadline"], "2026-11-30T12:05:00Z");
        assert!(n[3]["held"]["message"]
            .as_str()
            .unwrap()
            .contains("refused by PodDisruptionBudget shop/web"));
        assert_eq!(n[3]["repair_step"], "drain");
        assert_eq!(n[3]["cordoned_by"], "nodekeeper");
        assert_eq!(n[4]["interruption"]["kind"], "preemption");
        assert_eq!(n[4]["interruption"]["at"], "2026-11-30T12:02:00Z");
        assert_eq!(n[4]["replacement_requested"], "2026-11-30T11:59:01Z");
    }

    #[test]
    fn every_blocker_has_a_cell_and_a_next_step() {
        let d = Some(t("2026-11-30T12:10:00Z"));
        let cases: Vec<(Blocker, &str, &str)> = vec![
            (
                Blocker::DoNotDisrupt {
                    pod: "a/b".into(),
                    deadline: d,
                },
                "do-not-disrupt (pod a/b)",
                "evict a/b once its do-not-disrupt annotation is removed (in 10m)",
            ),
            (
                Blocker::DoNotRepair {
                    annotation: "karpenter.sh/do-not-repair".into(),
                },
                "repair vetoed by karpenter.sh/do-not-repair",
                "repair once karpenter.sh/do-not-repair is removed",
            ),
            (
                Blocker::KarpenterDisrupting,
                "Karpenter is disrupting it",
                "none: Karpenter replaces the node",
            ),
            (
                Blocker::Budget {
                    group: "".into(),
                    budget: 0,
                    nodes: "10%".into(),
                    disrupting: 2,
                    total: 10,
                    opens_at: None,
                    timezone: None,
                    nodepool: None,
                },
                "budget #0 nodes=10% of (none) (2/10 disrupting)",
                "start when a disruption in group (none) finishes",
            ),
            (
                Blocker::Budget {
                    group: "spot".into(),
                    budget: 1,
                    nodes: "0".into(),
                    disrupting: 0,
                    total: 3,
                    opens_at: None,
                    timezone: None,
                    nodepool: Some("spot".into()),
                },
                "budget #1 nodes=0 of NodePool spot (0/3 disrupting)",
                "start when a disruption in group spot finishes",
            ),
            (
                Blocker::NodePool {
                    group: "spot".into(),
                    nodepool: "spot".into(),
                    problem: "spec.disruption.budgets[0].nodes: \"150%\" does not match".into(),
                },
                "invalid NodePool spot: spec.disruption.budgets[0].nodes: \"150%\" does not match",
                "start when NodePool spot's budgets are valid again",
            ),
            (
                Blocker::ShortCircuit {
                    group: "gpu".into(),
                    unhealthy: 3,
                    total: 10,
                    max_unhealthy: "20%".into(),
                },
                "short-circuit: 3/10 of gpu unhealthy (max 20%)",
                "repair when at most 20% of group gpu are unhealthy",
            ),
            (
                Blocker::Deadline {
                    deadline: t("2026-11-30T11:00:00Z"),
                },
                "deadline 2026-11-30T11:00:00+00:00 passed",
                "none: needs an operator",
            ),
            (
                Blocker::StartupRetries { retries: 3, max: 3 },
                "startup retries exhausted (3/3)",
                "none: needs an operator",
            ),
            (
                Blocker::ReplacementPending {
                    requested_at: t(NOW),
                },
                "replacement pending",
                "wait for the node to be replaced",
            ),
        ];
        for (b, cell, nxt) in cases {
            assert_eq!(blocker_cell(&b), cell);
            let r = row("n", "g", &[(keys::BLOCKED, held(b, NOW))], false);
            assert_eq!(next_cell(r.next.as_ref().unwrap(), t(NOW)), nxt);
            assert_eq!(r.state, "idle");
            assert_eq!(
                r.since,
                Some(t(NOW)),
                "an idle held node's SINCE is the hold's"
            );
        }
    }

    #[test]
    fn repair_steps_without_hold() {
        let step = |s: &str, repl: bool| {
            let mut a = vec![
                (keys::STATE, "repairing".to_string()),
                (keys::REPAIR_STEP, s.to_string()),
            ];
            if repl {
                a.push((keys::REPLACEMENT_REQUESTED, NOW.to_string()));
            }
            row("n", "g", &a, false).next.unwrap().action
        };
        assert_eq!(step("drain", false), "drain, then the next repair step");
        assert_eq!(step("reboot", false), "wait for the reboot (a new boot id)");
        assert_eq!(step("replace", false), "request a replacement");
        assert_eq!(step("replace", true), "wait for the replacement node");
        assert_eq!(
            step("restart-unit:kubelet.service", false),
            "wait for the condition to clear after the unit's restart, else the next repair step"
        );
        assert_eq!(
            step("none", false),
            "none: the repair policy takes no action"
        );
        let r = row(
            "n",
            "g",
            &[
                (keys::STATE, "repairing".into()),
                (keys::REPAIR_STEP, "restart-unit:crio.service".into()),
            ],
            false,
        );
        assert_eq!(r.repair_step.as_deref(), Some("restart-unit:crio.service"));
        let c = row("n", "g", &[(keys::STATE, "cordoned".into())], true);
        assert_eq!(
            c.next.unwrap().action,
            "uncordon when the notice is cancelled"
        );
        assert_eq!(c.cordoned_by, Some(CordonedBy::Admin));
    }

    #[test]
    fn an_unreadable_hold_is_shown_not_hidden() {
        let raw = r#"{"kind":"quota","since":"2026-11-30T11:00:00Z"}"#;
        let r = row("n", "g", &[(keys::BLOCKED, raw.into())], false);
        assert!(r.held.is_none());
        assert_eq!(r.held_unreadable.as_deref(), Some(raw));
        let out = render(std::slice::from_ref(&r), StatusOutput::Text, t(NOW));
        assert!(
            out.contains("unreadable nodekeeper.io/blocked (see -o json)"),
            "{out}"
        );
        assert!(out.ends_with("1 nodes, 0 acting, 1 held\n"), "{out}");
        let v: serde_json::Value =
            serde_json::from_str(&render(&[r], StatusOutput::Json, t(NOW))).unwrap();
        assert_eq!(v["nodes"][0]["held_unreadable"], raw);
        assert!(v["nodes"][0].get("held_unreadable").is_some());
        let fine = row("m", "g", &[], false);
        let v: serde_json::Value =
            serde_json::from_str(&render(&[fine], StatusOutput::Json, t(NOW))).unwrap();
        assert!(v["nodes"][0].get("held_unreadable").is_none());
    }

    #[test]
    fn ages_and_relative_times() {
        let d = chrono::TimeDelta::seconds;
        assert_eq!(age(d(-5)), "0s");
        assert_eq!(age(d(59)), "59s");
        assert_eq!(age(d(60)), "1m");
        assert_eq!(age(d(3600)), "1h");
        assert_eq!(age(d(3600 + 120)), "1h2m");
        assert_eq!(age(d(86400 * 2)), "2d");
        assert_eq!(age(d(86400 + 7200)), "1d2h");
        assert_eq!(relative(t("2026-11-30T12:00:30Z"), t(NOW)), "in 30s");
        assert_eq!(relative(t("2026-11-30T11:00:00Z"), t(NOW)), "1h ago");
    }

    #[test]
    fn empty_list_prints_header_and_zero_summary() {
        assert_eq!(
            render(&[], StatusOutput::Text, t(NOW)),
            "NODE   GROUP   STATE   BLOCKER   SINCE   NEXT\n0 nodes, 0 acting, 0 held\n"
        );
    }

    /// `--config`: the budgets in force per group of the listed nodes, with their origin; a
    /// refused NodePool is shown as the hold it causes.
    #[test]
    fn budgets_in_force_per_group_with_their_source() {
        use crate::controller::policy::nodepool::read_budgets;
        use serde_json::json;
        let now = t("2026-11-30T02:00:00Z");
        let row = |name: &str, group: Option<&str>| {
            let labels: BTreeMap<String, String> = group
                .map(|g| ("pool".to_string(), g.to_string()))
                .into_iter()
                .collect();
            NodeStatus::from_parts(name, &labels, &BTreeMap::new(), false, "pool")
        };
        let rows: Vec<NodeStatus> = (0..30)
            .map(|i| row(&format!("s{i}"), Some("shared-spot")))
            .chain([row("bad-0", Some("bad")), row("bare", None)])
            .collect();
        let mut cfg = BudgetsConfig {
            source: BudgetsSource::NodePool,
            ..Default::default()
        };
        cfg.groups.insert(
            "shared-spot".into(),
            vec![crate::controller::policy::config::Budget {
                nodes: crate::controller::policy::config::Quantity::Count(0),
                schedule: Some("0 23 * * *".into()),
                duration: Some(std::time::Duration::from_secs(10 * 3600)),
                timezone: Some("Asia/Shanghai".into()),
                reasons: vec!["repair".into()],
            }],
        );
        let pools: BTreeMap<String, PoolBudgets> = [
            ("shared-spot", json!([{"nodes": "10%"}, {"nodes": "5%", "schedule": "0 1 * * *", "duration": "14h"}])),
            ("bad", json!([{"nodes": "150%"}])),
        ]
        .into_iter()
        .map(|(n, b)| (n.to_string(), read_budgets(n, Some(&b))))
        .collect();
        let b = budget_rows(&rows, &cfg, &pools, now);
        let text = render_budgets(&b);
        let want = "\
GROUP         SOURCE                   BUDGET   NODES   WINDOW                               REASONS   ACTIVE   ALLOWS
(none)        config                   #0       10%     always                               all       yes      1
bad           NodePool bad (invalid)   #0       0       always                               all       yes      0
shared-spot   NodePool shared-spot     #0       10%     always                               all       yes      3
shared-spot   NodePool shared-spot     #1       5%      0 1 * * * for 14h (UTC)              all       yes      2
shared-spot   config                   #0       0       0 23 * * * for 10h (Asia/Shanghai)   repair    no       -
NodePool bad: spec.disruption.budgets[0].nodes: \"150%\" does not match ^((100|[0-9]{1,2})%|[0-9]+)$ (a node count such as \"1\" or a percentage 0-100% such as \"10%\"): disruptions of group bad are held
";
        assert_eq!(text, want, "\n{text}");
        let doc = render_with_budgets(&rows[..1], &b, StatusOutput::Json, now);
        let v: serde_json::Value = serde_json::from_str(&doc).unwrap();
        assert_eq!(v["budgets"][2]["source"], "NodePool shared-spot");
        assert_eq!(v["budgets"][2]["repair_max"], 3);
        assert_eq!(
            v["budgets"][1]["problem"]
                .as_str()
                .unwrap()
                .split(':')
                .next(),
            Some("spec.disruption.budgets[0].nodes")
        );
        // Without --config: no `budgets` key, and the text ends with the summary line.
        let plain = render(&rows[..1], StatusOutput::Json, now);
        assert!(!plain.contains("\"budgets\""), "{plain}");
    }

    #[test]
    fn a_handed_over_node_says_the_provider_removes_it() {
        let mut rec = Record {
            state: State::Interrupted,
            replacement_requested: Some(t("2026-11-30T10:00:00Z")),
            replacement_accepted: true,
            ..Record::default()
        };
        let before = next(&rec).unwrap().action;
        assert!(before.contains("finish the drain"), "{before}");
        rec.retire_requested = true;
        let after = next(&rec).unwrap().action;
        assert_eq!(
            after,
            "wait for the provider to remove the node (drain over, handed over)"
        );
    }
}

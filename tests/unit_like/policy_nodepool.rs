//! `[budgets] source = "nodepool"`: budgets read from Karpenter NodePools as Karpenter reads them
//! (the seed budgets give Karpenter's numbers), how they combine with the configured ones, the
//! reason mapping, and the hold of a group whose NodePool Karpenter would refuse.

use std::collections::BTreeMap;

use crate::support::policy as policy_support;

use nodekeeper_core::controller::policy::budget::{GroupBudgets, Origin, Reason};
use nodekeeper_core::controller::policy::config::{BudgetsSource, Quantity};
use nodekeeper_core::controller::policy::explain::{Blocker, Held};
use nodekeeper_core::controller::policy::nodepool::{read_budgets, read_nodepool, PoolBudgets};
use nodekeeper_core::controller::policy::view::ClusterView;
use nodekeeper_core::controller::policy::{Action, PolicyConfig};
use policy_support::*;
use serde_json::{json, Value};

fn yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(format!(
        "{}/tests/fixtures/{path}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    serde_yaml::from_str(&text).unwrap()
}

fn pools(list: &[(&str, Value)]) -> BTreeMap<String, PoolBudgets> {
    list.iter()
        .map(|(name, budgets)| (name.to_string(), read_budgets(name, Some(budgets))))
        .collect()
}

/// The seed budgets, from the bare list and from the full NodePool, give Karpenter's arithmetic:
/// percentages of the group rounded up, the minimum over the active budgets, windows in UTC.
#[test]
fn seed_budgets_give_karpenters_numbers() {
    let bare = yaml("policy/nodepool_budgets.yaml");
    let from_list = read_budgets("shared-spot", bare.get("budgets")).unwrap();
    let (name, from_pool) = read_nodepool(&yaml("karpenter/nodepool_seed_budgets.yaml")).unwrap();
    assert_eq!(name, "shared-spot");
    let from_pool = from_pool.unwrap();
    assert_eq!(
        from_pool[..3],
        from_list[..],
        "the NodePool holds the seed list verbatim"
    );
    assert_eq!(from_pool[3].budget.reasons, vec!["Underutilized", "Empty"]);
    let mut cfg = PolicyConfig::default();
    cfg.budgets.source = BudgetsSource::NodePool;
    let all = BTreeMap::from([("shared-spot".to_string(), Ok(from_pool))]);
    let g = GroupBudgets::in_force("shared-spot", &cfg.budgets, &all);
    // (nodes in the group, UTC time, allowed): 10% always; 5% 01:00–15:00; 20% 18:00–20:00.
    let table = [
        (30, "2026-11-30T00:30:00Z", 3), // 10% of 30
        (30, "2026-11-30T02:00:00Z", 2), // 5% of 30 = 1.5 → 2
        (30, "2026-11-30T15:00:00Z", 3), // the 14h window ended (exclusive)
        (30, "2026-11-30T19:00:00Z", 3), // 20% = 6, but 10% still active
        (40, "2026-11-30T14:59:00Z", 2), // 5% of 40
        (3, "2026-11-30T02:00:00Z", 1),  // 5% of 3 rounds up to 1
        (7, "2026-11-30T19:00:00Z", 1),  // 10% of 7 = 0.7 → 1
        (0, "2026-11-30T19:00:00Z", 0),
    ];
    for (total, at, want) in table {
        let l = g.limit(Reason::Repair, total, t(at));
        assert_eq!(l.max, Some(want), "{total} nodes at {at}");
        let e = g.entry(l.budget_index.unwrap()).unwrap();
        assert_eq!(e.origin, Origin::NodePool("shared-spot".into()));
    }
    // Karpenter's consolidation-only budget (nodes "0") never binds nodekeeper's reasons.
    assert_eq!(
        g.limit(Reason::Rebalance, 30, t("2026-11-30T00:30:00Z"))
            .max,
        Some(3)
    );
}

/// Where a group's budgets come from: (source, NodePools, [budgets.groups], group, origins of the
/// budgets in force with their index, limit for 10 nodes at monday()).
#[test]
fn budgets_in_force_per_group_and_source() {
    let np = |n: &str| Origin::NodePool(n.into());
    type Row = (
        BudgetsSource,
        Value,
        &'static str,
        &'static str,
        Vec<(Origin, usize)>,
        Option<usize>,
    );
    let table: Vec<Row> = vec![
        // config: the NodePools are ignored; the default list (10%) applies.
        (
            BudgetsSource::Config,
            json!([{"nodes": "0"}]),
            "{}",
            "spot",
            vec![(Origin::Config, 0)],
            Some(1),
        ),
        // nodepool: the NodePool's list, not the default 10%.
        (
            BudgetsSource::NodePool,
            json!([{"nodes": "50%"}]),
            "{}",
            "spot",
            vec![(np("spot"), 0)],
            Some(5),
        ),
        // plus [budgets.groups.spot]: the minimum over both.
        (
            BudgetsSource::NodePool,
            json!([{"nodes": "50%"}]),
            r#"{ spot = [{ nodes = "2" }] }"#,
            "spot",
            vec![(np("spot"), 0), (Origin::Config, 0)],
            Some(2),
        ),
        // budgets: [] is no budget (unlimited), as in Karpenter.
        (
            BudgetsSource::NodePool,
            json!([]),
            "{}",
            "spot",
            vec![],
            None,
        ),
        // a group without a NodePool: the configured budgets.
        (
            BudgetsSource::NodePool,
            json!([{"nodes": "0"}]),
            "{}",
            "other",
            vec![(Origin::Config, 0)],
            Some(1),
        ),
        (
            BudgetsSource::NodePool,
            json!([{"nodes": "0"}]),
            r#"{ other = [{ nodes = "3" }] }"#,
            "other",
            vec![(Origin::Config, 0)],
            Some(3),
        ),
        // nodes without the group label never read a NodePool named "".
        (
            BudgetsSource::NodePool,
            json!([{"nodes": "0"}]),
            "{}",
            "",
            vec![(Origin::Config, 0)],
            Some(1),
        ),
    ];
    for (source, spot, groups, group, origins, limit) in table {
        let mut cfg = PolicyConfig::default();
        cfg.budgets.source = source;
        cfg.budgets.groups = toml::from_str::<BTreeMap<String, Value>>(&format!("g = {groups}"))
            .map(|m| serde_json::from_value(m["g"].clone()).unwrap())
            .unwrap();
        let mut all = pools(&[("spot", spot.clone())]);
        all.insert(
            String::new(),
            read_budgets("", Some(&json!([{"nodes": "0"}]))),
        );
        let g = GroupBudgets::in_force(group, &cfg.budgets, &all);
        let got: Vec<(Origin, usize)> = g
            .entries()
            .iter()
            .map(|e| (e.origin.clone(), e.index))
            .collect();
        assert_eq!(got, origins, "{source:?} {spot} {groups} {group}");
        assert_eq!(
            g.limit(Reason::Repair, 10, monday()).max,
            limit,
            "{source:?} {spot} {groups} {group}"
        );
    }
}

/// Karpenter's reasons against nodekeeper's: (NodePool budget, gates repair, gates rebalance).
#[test]
fn reason_mapping() {
    let table = [
        (json!({"nodes": "0"}), true, true),
        (json!({"nodes": "0", "reasons": ["Drifted"]}), false, false),
        (
            json!({"nodes": "0", "reasons": ["Underutilized", "Empty", "Drifted"]}),
            false,
            false,
        ),
        (json!({"nodes": "0", "reasons": []}), false, false),
        // v1.15: `Unhealthy` is Karpenter's repair, so it paces nodekeeper's too.
        (json!({"nodes": "0", "reasons": ["Unhealthy"]}), true, false),
        (
            json!({"nodes": "0", "reasons": ["Drifted", "Unhealthy"]}),
            true,
            false,
        ),
    ];
    let mut cfg = PolicyConfig::default();
    cfg.budgets.source = BudgetsSource::NodePool;
    for (budget, repair, rebalance) in table {
        let all = pools(&[("spot", json!([budget]))]);
        let g = GroupBudgets::in_force("spot", &cfg.budgets, &all);
        let gated = |r| g.limit(r, 10, monday()).max == Some(0);
        assert_eq!(gated(Reason::Repair), repair, "{budget}");
        assert_eq!(gated(Reason::Rebalance), rebalance, "{budget}");
    }
}

fn failing_pool(now: chrono::DateTime<chrono::Utc>) -> ClusterView {
    let mut a = node("a", "spot", now);
    ready(&mut a, "False", now - mins(12));
    view(vec![a, node("b", "spot", now), node("c", "spot", now)])
}

fn blocker(ds: &[nodekeeper_core::controller::policy::Decision], n: &str) -> Option<Blocker> {
    of(ds, n).into_iter().find_map(|x| match x {
        Action::Hold(Held { blocker, .. }) => Some(blocker),
        _ => None,
    })
}

/// A NodePool budget of 0 holds the repair with a blocker naming the NodePool; raising it to 1
/// lets the repair start (the decision reads the NodePools it is given, nothing else).
#[test]
fn nodepool_budget_holds_then_allows_a_repair() {
    let now = monday();
    let mut c = cfg();
    c.budgets.source = BudgetsSource::NodePool;
    let mut v = failing_pool(now);
    v.nodepools = pools(&[(
        "spot",
        json!([{"nodes": "10%"}, {"nodes": "0", "schedule": "@daily", "duration": "23h"}]),
    )]);
    let ds = run(&v, &c, now);
    let b = blocker(&ds, "a");
    assert_eq!(
        b,
        Some(Blocker::Budget {
            group: "spot".into(),
            budget: 1,
            nodes: "0".into(),
            disrupting: 0,
            total: 3,
            opens_at: Some(t("2026-11-30T23:00:00Z")),
            timezone: None,
            nodepool: Some("spot".into()),
        })
    );
    let msg = b.unwrap().message();
    assert!(
        msg.contains("disruption budget #1 (nodes=0) of NodePool spot"),
        "{msg}"
    );
    assert!(!has(&of(&ds, "a"), |x| matches!(
        x,
        Action::StartDrain { .. }
    )));
    apply(&mut v, &ds);
    v.nodepools = pools(&[("spot", json!([{"nodes": "1"}]))]);
    let ds = run(&v, &c, now + mins(1));
    assert!(
        has(&of(&ds, "a"), |x| matches!(x, Action::StartDrain { .. })),
        "{ds:#?}"
    );
    // With source = "config" the same NodePool is not read (the default 10% of 3 = 1 allows it).
    c.budgets.source = BudgetsSource::Config;
    let mut v = failing_pool(now);
    v.nodepools = pools(&[("spot", json!([{"nodes": "0"}]))]);
    assert!(has(&of(&run(&v, &c, now), "a"), |x| matches!(
        x,
        Action::StartDrain { .. }
    )));
}

/// A NodePool Karpenter would refuse holds its group (allowed 0) with a `node_pool` blocker that
/// names the NodePool, the field and the problem; other groups are not affected; interruptions
/// still proceed (never gated).
#[test]
fn invalid_nodepool_holds_its_group_and_names_the_problem() {
    use nodekeeper_core::controller::policy::view::NoticeKind;
    let now = monday();
    let mut c = cfg();
    c.repair.max_unhealthy = Quantity::Percent(100);
    c.budgets.source = BudgetsSource::NodePool;
    let mut v = failing_pool(now);
    let mut o = node("o", "other", now);
    ready(&mut o, "False", now - mins(12));
    v.nodes.push(o);
    let mut b = node("b2", "spot", now);
    b.notices.push(notice(
        "ev",
        NoticeKind::Preemption,
        Some(now + mins(2)),
        now,
    ));
    v.nodes.push(b);
    v.nodepools = pools(&[("spot", json!([{"nodes": "1"}, {"nodes": "150%"}]))]);
    let ds = run(&v, &c, now);
    let held = blocker(&ds, "a").unwrap();
    assert_eq!(
        held,
        Blocker::NodePool {
            group: "spot".into(),
            nodepool: "spot".into(),
            problem: "spec.disruption.budgets[1].nodes: \"150%\" does not match ^((100|[0-9]{1,2})%|[0-9]+)$ (a node count such as \"1\" or a percentage 0-100% such as \"10%\")".into(),
        }
    );
    assert_eq!(held.reason(), "BlockedByNodePool");
    assert!(
        held.message()
            .starts_with("NodePool spot: spec.disruption.budgets[1].nodes: \"150%\""),
        "{}",
        held.message()
    );
    assert!(!has(&of(&ds, "a"), |x| matches!(
        x,
        Action::StartDrain { .. }
    )));
    assert!(
        has(&of(&ds, "o"), |x| matches!(x, Action::StartDrain { .. })),
        "group without a NodePool"
    );
    assert!(
        has(&of(&ds, "b2"), |x| matches!(x, Action::StartDrain { .. })),
        "interruptions are not gated"
    );
    // The hold is published as JSON and read back.
    let h = Held {
        blocker: held,
        since: now,
    };
    assert_eq!(Held::decode(&h.encode()), Some(h.clone()));
    assert!(
        h.encode().contains(r#""kind":"node_pool""#),
        "{}",
        h.encode()
    );
}

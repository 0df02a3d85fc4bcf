//! Builders and helpers shared by the policy tests.
#![allow(dead_code)]

use chrono::{DateTime, Utc};
use nodekeeper_core::controller::policy::view::{
    condition, keys, ClusterView, DrainPhase, NodeView, Notice, NoticeKind,
};
use nodekeeper_core::controller::policy::{decide, Action, Decision, PolicyConfig};

/// RFC 3339 → UTC.
pub fn t(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().to_utc()
}

/// A Monday, 10:00 UTC (18:00 in Shanghai).
pub fn monday() -> DateTime<Utc> {
    t("2026-11-30T10:00:00Z")
}

pub fn mins(m: i64) -> chrono::Duration {
    chrono::Duration::minutes(m)
}

/// A Ready node of `group`, created a day before `now`.
pub fn node(name: &str, group: &str, now: DateTime<Utc>) -> NodeView {
    let mut n = NodeView::new(name, now - chrono::Duration::days(1));
    if !group.is_empty() {
        n.labels
            .insert("karpenter.sh/nodepool".into(), group.into());
    }
    n
}

/// Sets the node's Ready condition to `status` since `since`.
pub fn ready(n: &mut NodeView, status: &str, since: DateTime<Utc>) {
    n.conditions.retain(|c| c.type_ != "Ready");
    n.conditions.push(condition("Ready", status, since));
}

/// A notice of `kind` announced for `at`.
pub fn notice(
    id: &str,
    kind: NoticeKind,
    at: Option<DateTime<Utc>>,
    seen: DateTime<Utc>,
) -> Notice {
    Notice {
        id: id.into(),
        kind,
        at,
        detected_at: seen,
        until: None,
        boot_id: None,
    }
}

/// Ready=False 10 min policy, drain → replace.
pub fn cfg() -> PolicyConfig {
    let mut c = PolicyConfig::default();
    c.repair.policy = nodekeeper_core::controller::policy::config::parse_kpo_repair_policies(
        r#"[{"conditionType":"Ready","conditionStatus":"False","tolerationDuration":600000000000}]"#,
    )
    .unwrap();
    c
}

/// Budgets from inline TOML (`[{ nodes = "1" }]`).
pub fn budgets(toml_list: &str) -> Vec<nodekeeper_core::controller::policy::config::Budget> {
    #[derive(serde::Deserialize)]
    struct W {
        b: Vec<nodekeeper_core::controller::policy::config::Budget>,
    }
    toml::from_str::<W>(&format!("b = {toml_list}")).unwrap().b
}

pub fn view(nodes: Vec<NodeView>) -> ClusterView {
    ClusterView {
        nodes,
        ..ClusterView::default()
    }
}

pub fn run(v: &ClusterView, c: &PolicyConfig, now: DateTime<Utc>) -> Vec<Decision> {
    decide(v, c, now)
}

/// The actions for `node`, in order.
pub fn of(ds: &[Decision], node: &str) -> Vec<Action> {
    ds.iter()
        .filter(|d| d.node == node)
        .map(|d| d.action.clone())
        .collect()
}

/// Applies decisions as a successful actor would.
pub fn apply(v: &mut ClusterView, ds: &[Decision]) {
    for d in ds {
        if let Some(n) = v.nodes.iter_mut().find(|n| n.name == d.node) {
            n.apply(&d.action);
        }
    }
}

pub fn node_mut<'a>(v: &'a mut ClusterView, name: &str) -> &'a mut NodeView {
    v.nodes.iter_mut().find(|n| n.name == name).unwrap()
}

pub fn get<'a>(v: &'a ClusterView, name: &str) -> &'a NodeView {
    v.nodes.iter().find(|n| n.name == name).unwrap()
}

pub fn state(n: &NodeView) -> Option<&str> {
    n.annotation(keys::STATE)
}

pub fn has(actions: &[Action], f: impl Fn(&Action) -> bool) -> bool {
    actions.iter().any(f)
}

pub fn count(actions: &[Action], f: impl Fn(&Action) -> bool) -> usize {
    actions.iter().filter(|a| f(a)).count()
}

pub fn is_replacement(a: &Action) -> bool {
    matches!(a, Action::RequestReplacement { .. })
}

pub fn finish_drain(v: &mut ClusterView, name: &str) {
    node_mut(v, name).drain.phase = DrainPhase::Completed;
}

//! Property tests: random clusters, failures, notices, cancellations, drains, replacements,
//! controller restarts and budgets (with cron windows in several time zones), played forward
//! through `decide` and an actor that applies every decision. After every step:
//! 0 budget violations; no node cordoned by nodekeeper without a recorded state and reason;
//! admin cordons never undone; interruption drains scheduled (in the same decision) with the
//! deadline notice time − safety margin; deciding again after applying is a no-op (so no
//! duplicate replacement, reboot, cordon or Event); at most one replacement per node; dry-run
//! gives the same decisions marked dry-run; the engine's one-node fast path after a notice
//! (`decide_interruption`) decides exactly what `decide` decides for that node, and its due path
//! after a repair toleration expires (`decide_groups`, one group alone) what `decide` decides for
//! that group's nodes; a node carrying a repair veto gets no drain, unit restart, reboot or
//! replacement for a repair. The Ready=False policy sometimes has a ladder of its own
//! (restart-unit, `none`).
//!
//! `POLICY_PROP_CASES` sets the number of random seeds (default 256, proptest's default, so the
//! pure tier stays quick; scripts/test.sh runs 1,000, `POLICY_PROP_CASES=10000` is the full run).

use crate::support::policy as policy_support;

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use nodekeeper_core::controller::policy::budget::{GroupBudgets, Reason};
use nodekeeper_core::controller::policy::config::{
    InterruptionAction, LadderStep, Quantity, RepairStep,
};
use nodekeeper_core::controller::policy::interruption::drain_deadline;
use nodekeeper_core::controller::policy::repair::{evaluate, Health};
use nodekeeper_core::controller::policy::view::{
    keys, ClusterView, DrainPhase, NodeView, NoticeKind, PodView, Record, State,
};
use nodekeeper_core::controller::policy::{
    decide, decide_groups, decide_interruption, group_of, Action, Decision, PolicyConfig,
};
use policy_support::*;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const BUDGET_SETS: &[&str] = &[
    r#"[{ nodes = "1" }]"#,
    r#"[{ nodes = "10%" }]"#,
    r#"[{ nodes = "0" }]"#,
    r#"[{ nodes = "2" }, { nodes = "0", schedule = "0 */2 * * *", duration = "1h", timezone = "Asia/Shanghai" }]"#,
    r#"[{ nodes = "50%", reasons = ["repair"] }, { nodes = "1", schedule = "30 * * * 1-5", duration = "20m", timezone = "America/New_York" }]"#,
    r#"[{ nodes = "1", schedule = "0 9 * * 1-5", duration = "14h", timezone = "Asia/Shanghai", reasons = ["repair"] }, { nodes = "34%" }]"#,
    r#"[{ nodes = "0", schedule = "*/20 * * * *", duration = "10m", reasons = ["rebalance"] }]"#,
];

const KINDS: &[NoticeKind] = &[
    NoticeKind::Preemption,
    NoticeKind::Termination,
    NoticeKind::Maintenance,
    NoticeKind::Rebalance,
    NoticeKind::Freeze,
    NoticeKind::ShuttingDown,
];

struct Sim {
    rng: StdRng,
    view: ClusterView,
    cfg: PolicyConfig,
    now: DateTime<Utc>,
    admin: BTreeSet<String>,
    replaced: BTreeMap<String, usize>,
    next_id: usize,
}

fn config(rng: &mut StdRng) -> PolicyConfig {
    let mut c = cfg();
    let steps = [
        vec![RepairStep::Drain, RepairStep::Replace],
        vec![RepairStep::Drain, RepairStep::Reboot, RepairStep::Replace],
        vec![RepairStep::Reboot, RepairStep::Replace],
        vec![RepairStep::Replace],
        vec![RepairStep::Drain],
    ];
    c.repair.steps = steps[rng.random_range(0..steps.len())].clone();
    c.repair.max_unhealthy = if rng.random_bool(0.5) {
        Quantity::Percent(rng.random_range(0..=100))
    } else {
        Quantity::Count(rng.random_range(0..4))
    };
    c.repair.healthy_delay = std::time::Duration::from_secs(60 * rng.random_range(0..5));
    c.repair.max_startup_retries = rng.random_range(0..3);
    // A provider whose request only adds capacity (`karpenter`): drains that replace follows
    // pre-spin, and a repair released mid-drain abandons its replacement.
    c.controller.provider_adds_capacity = rng.random_bool(0.5);
    if rng.random_bool(0.3) {
        c.interruption.actions.rebalance = InterruptionAction::Drain;
    }
    c.budgets.default = budgets(BUDGET_SETS[rng.random_range(0..BUDGET_SETS.len())]);
    for g in ["g0", "g1"] {
        if rng.random_bool(0.5) {
            let b = budgets(BUDGET_SETS[rng.random_range(0..BUDGET_SETS.len())]);
            c.budgets.groups.insert(g.into(), b);
        }
    }
    // The Ready=False policy's own ladder, sometimes (restart-unit first, `none` last).
    if rng.random_bool(0.4) {
        let ladders: [&[LadderStep]; 4] = [
            &[
                LadderStep::restart("kubelet.service"),
                LadderStep::of(RepairStep::Reboot),
                LadderStep::of(RepairStep::Replace),
            ],
            &[
                LadderStep::restart("crio.service"),
                LadderStep::of(RepairStep::Drain),
                LadderStep::of(RepairStep::Replace),
            ],
            &[
                LadderStep::restart("kubelet.service"),
                LadderStep::of(RepairStep::None),
            ],
            &[LadderStep::of(RepairStep::None)],
        ];
        c.repair.policy[0].steps = Some(ladders[rng.random_range(0..ladders.len())].to_vec());
    }
    c
}

impl Sim {
    fn new(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let now =
            t("2026-11-30T00:00:00Z") + chrono::Duration::minutes(rng.random_range(0..60 * 24 * 7));
        let cfg = config(&mut rng);
        let n = rng.random_range(1..=12);
        let mut admin = BTreeSet::new();
        let mut nodes = Vec::new();
        for i in 0..n {
            let g = ["g0", "g1", ""][rng.random_range(0..3)];
            let mut nv = node(&format!("n{i}"), g, now);
            if rng.random_bool(0.1) {
                nv.unschedulable = true;
                admin.insert(nv.name.clone());
            }
            if rng.random_bool(0.2) {
                ready(&mut nv, "False", now - mins(rng.random_range(0..30)));
            }
            nodes.push(nv);
        }
        Sim {
            rng,
            view: ClusterView {
                nodes,
                ..ClusterView::default()
            },
            cfg,
            now,
            admin,
            replaced: BTreeMap::new(),
            next_id: 0,
        }
    }

    /// The world moves: failures, recoveries, notices, drains, replacements, restarts.
    fn perturb(&mut self) {
        self.now += chrono::Duration::minutes(self.rng.random_range(1..=8));
        let now = self.now;
        let restart = self.rng.random_bool(0.05);
        let mut gone = Vec::new();
        for n in &mut self.view.nodes {
            let r = &mut self.rng;
            if r.random_bool(0.08) {
                let s = if n.is_ready() { "False" } else { "True" };
                ready(n, s, now - mins(r.random_range(0..12)));
            }
            if !n.became_ready && r.random_bool(0.3) {
                n.became_ready = true;
                ready(n, "True", now);
            }
            if r.random_bool(0.04) {
                // An operator puts or lifts a repair veto.
                let key =
                    [keys::KARPENTER_DO_NOT_REPAIR, keys::DO_NOT_REPAIR][r.random_range(0..2)];
                if n.annotations.remove(key).is_none() {
                    n.annotations.insert(key.into(), "true".into());
                }
            }
            if r.random_bool(0.05) {
                let kind = KINDS[r.random_range(0..KINDS.len())].clone();
                let at = r
                    .random_bool(0.7)
                    .then(|| now + mins(r.random_range(-1..10)));
                self.next_id += 1;
                n.notices
                    .push(notice(&format!("ev{}", self.next_id), kind, at, now));
            }
            if r.random_bool(0.04) {
                if let Some(id) = n.notices.iter().map(|x| x.id.clone()).next() {
                    n.notices
                        .push(notice("cx", NoticeKind::Cancelled { of: id }, None, now));
                }
            }
            match n.drain.phase {
                DrainPhase::Running if r.random_bool(0.4) => n.drain.phase = DrainPhase::Completed,
                DrainPhase::Running if r.random_bool(0.1) => {
                    n.drain.blocker = Some(PodView {
                        namespace: "ns".into(),
                        name: "p".into(),
                        blocking_pdb: Some("ns/pdb".into()),
                        do_not_disrupt: false,
                    })
                }
                _ => {}
            }
            if n.record().replacement_requested.is_some() && r.random_bool(0.5) {
                gone.push(n.name.clone());
            }
            if restart {
                n.drain = Default::default();
                n.notices
                    .retain(|x| !matches!(x.kind, NoticeKind::Cancelled { .. }));
            }
        }
        for name in gone {
            let old = self.view.nodes.iter().position(|n| n.name == name).unwrap();
            let old = self.view.nodes.remove(old);
            let mut fresh = NodeView::new(&format!("{name}r"), now);
            fresh.labels = old.labels.clone();
            fresh
                .labels
                .remove("node.kubernetes.io/exclude-from-external-load-balancers");
            fresh.became_ready = self.rng.random_bool(0.5);
            if !fresh.became_ready {
                ready(&mut fresh, "False", now);
            }
            if let Some(k) = old.annotation("test/next-startup-retries") {
                fresh
                    .annotations
                    .insert(keys::STARTUP_RETRIES.into(), k.into());
            }
            self.view.nodes.push(fresh);
        }
    }

    fn step(&mut self) -> Result<(), TestCaseError> {
        self.perturb();
        let before = self.view.clone();
        let ds = decide(&before, &self.cfg, self.now);
        check_dry_run(&before, &self.cfg, self.now, &ds)?;
        check_fast_path(&before, &self.cfg, self.now, &ds)?;
        check_group_path(&before, &self.cfg, self.now, &ds)?;
        let mut after = before.clone();
        apply(&mut after, &ds);
        for d in &ds {
            if let Action::AbandonReplacement { .. } = &d.action {
                // Given back: the node's next repair may ask anew.
                let c = self.replaced.entry(d.node.clone()).or_default();
                prop_assert_eq!(*c, 1, "abandoned a replacement never asked for {}", d.node);
                *c = 0;
            }
        }
        for d in &ds {
            if let Action::RequestReplacement {
                startup_retries, ..
            } = &d.action
            {
                let c = self.replaced.entry(d.node.clone()).or_default();
                *c += 1;
                prop_assert_eq!(*c, 1, "second replacement for {}", d.node);
                let n = node_mut(&mut after, &d.node);
                n.annotations.insert(
                    "test/next-startup-retries".into(),
                    startup_retries.to_string(),
                );
            }
        }
        check_budgets(&before, &after, &self.cfg, self.now)?;
        check_cordons(&after, &ds, &self.admin)?;
        check_interruptions(&before, &after, &ds, &self.cfg)?;
        check_vetoes(&before, &ds)?;
        let again = decide(&after, &self.cfg, self.now);
        if let Some(d) = again.first() {
            let name = d.node.clone();
            let b = before.nodes.iter().find(|n| n.name == name);
            let a = after.nodes.iter().find(|n| n.name == name);
            let summary: Vec<String> = before
                .nodes
                .iter()
                .map(|n| {
                    let a = after.nodes.iter().find(|x| x.name == n.name).unwrap();
                    format!(
                        "{} g={} ready={} br={} {:?}->{:?} acts={:?}",
                        n.name,
                        group_of(n, &self.cfg),
                        n.is_ready(),
                        n.became_ready,
                        n.annotations,
                        a.annotations,
                        of(&ds, &n.name)
                            .iter()
                            .map(|x| format!("{x:?}").chars().take(40).collect::<String>())
                            .collect::<Vec<_>>()
                    )
                })
                .collect();
            return Err(TestCaseError::fail(format!(
                "{}\nnot idempotent at {}: again {:#?}\nfirst {:#?}\nbefore {:#?}\nafter {:#?}",
                summary.join("\n"),
                self.now,
                of(&again, &name),
                of(&ds, &name),
                b,
                a.map(|n| &n.annotations)
            )));
        }
        self.view = after;
        Ok(())
    }
}

fn check_dry_run(
    v: &ClusterView,
    cfg: &PolicyConfig,
    now: DateTime<Utc>,
    ds: &[Decision],
) -> Result<(), TestCaseError> {
    let mut dry = cfg.clone();
    dry.controller.dry_run = true;
    let sim = decide(v, &dry, now);
    prop_assert_eq!(sim.len(), ds.len());
    for (a, b) in sim.iter().zip(ds) {
        prop_assert!(a.dry_run && !b.dry_run);
        prop_assert_eq!((&a.node, &a.action), (&b.node, &b.action));
    }
    Ok(())
}

/// The engine's fast path after a notice (`decide_interruption`, one node alone) decides
/// exactly what `decide` decides for that node in the whole cluster, whenever it decides.
fn check_fast_path(
    v: &ClusterView,
    cfg: &PolicyConfig,
    now: DateTime<Utc>,
    ds: &[Decision],
) -> Result<(), TestCaseError> {
    for n in &v.nodes {
        if let Some(fast) = decide_interruption(n, cfg, now) {
            prop_assert_eq!(&fast, &of(ds, &n.name), "fast path differs for {}", n.name);
        }
    }
    Ok(())
}

/// The engine's due path (`decide_groups`, one group's nodes alone) decides exactly what `decide`
/// decides for that group's nodes when the groups are the NodePools (the default `group_by`). With
/// groups that cut across NodePools, it decides the same but may leave out Karpenter fence marks
/// (added or lifted) that nodes of other groups call for: what it decides for a node is then
/// `decide`'s actions for it with some of those marks missing at the end, never an extra or a
/// different action.
fn check_group_path(
    v: &ClusterView,
    cfg: &PolicyConfig,
    now: DateTime<Utc>,
    ds: &[Decision],
) -> Result<(), TestCaseError> {
    let groups: BTreeSet<String> = v.nodes.iter().map(|n| group_of(n, cfg)).collect();
    for g in &groups {
        let due = decide_groups(v, cfg, now, &[g.clone()].into());
        for d in &due {
            prop_assert_eq!(
                &group_of(node_of(v, &d.node), cfg),
                g,
                "{} is not in {}",
                d.node,
                g
            );
        }
        for n in v.nodes.iter().filter(|n| &group_of(n, cfg) == g) {
            prop_assert_eq!(
                of(&due, &n.name),
                of(ds, &n.name),
                "due path differs for {}",
                n.name
            );
        }
    }
    // Groups across NodePools: nodes split into two zones, whatever their NodePool.
    let mut zoned = cfg.clone();
    zoned.budgets.group_by = "topology.kubernetes.io/zone".into();
    let mut zv = v.clone();
    for (i, n) in zv.nodes.iter_mut().enumerate() {
        n.labels
            .insert(zoned.budgets.group_by.clone(), format!("zone-{}", i % 2));
    }
    let all = decide(&zv, &zoned, now);
    let is_fence = |a: &Action| {
        matches!(a, Action::Annotate { key, .. }
            if key == keys::KARPENTER_DO_NOT_DISRUPT || key == keys::DO_NOT_DISRUPT_BY)
    };
    for zone in ["zone-0", "zone-1"] {
        let due = decide_groups(&zv, &zoned, now, &[zone.to_string()].into());
        for n in zv.nodes.iter().filter(|n| group_of(n, &zoned) == zone) {
            let (mine, full) = (of(&due, &n.name), of(&all, &n.name));
            prop_assert!(
                mine.len() <= full.len() && mine[..] == full[..mine.len()],
                "due path for {} is not a prefix of decide's: {:?} vs {:?}",
                n.name,
                mine,
                full
            );
            prop_assert!(
                full[mine.len()..].iter().all(is_fence),
                "due path for {} left out more than fence marks: {:?} vs {:?}",
                n.name,
                mine,
                full
            );
        }
    }
    Ok(())
}

fn node_of<'a>(v: &'a ClusterView, name: &str) -> &'a NodeView {
    v.nodes
        .iter()
        .find(|n| n.name == name)
        .unwrap_or_else(|| panic!("no node {name}"))
}

fn disrupting(n: &NodeView) -> bool {
    n.deleting || matches!(n.record().state, State::Interrupted | State::Repairing)
}

/// A NotReady node waiting for its own repair does not count against the slot it waits for.
fn expired_candidate(n: &NodeView, cfg: &PolicyConfig, now: DateTime<Utc>) -> bool {
    let eff = cfg.repair.for_group(&group_of(n, cfg));
    n.became_ready
        && matches!(evaluate(n, &eff.policies), Health::Unhealthy { expires, .. } if expires <= now)
}

/// Gated starts never take a group above its budget's limit.
fn check_budgets(
    before: &ClusterView,
    after: &ClusterView,
    cfg: &PolicyConfig,
    now: DateTime<Utc>,
) -> Result<(), TestCaseError> {
    let mut groups: BTreeMap<String, Vec<&NodeView>> = BTreeMap::new();
    for n in &after.nodes {
        groups.entry(group_of(n, cfg)).or_default().push(n);
    }
    for (g, members) in groups {
        let gb = GroupBudgets::new(cfg.budgets.for_group(&g));
        let total = members.len();
        for (reason, other) in [
            (Reason::Repair, Reason::Rebalance),
            (Reason::Rebalance, Reason::Repair),
        ] {
            let started: Vec<&str> = members
                .iter()
                .filter(|n| gated_start(before, n, reason))
                .map(|n| n.name.as_str())
                .collect();
            // Starts for the other reason may have been granted after these (under their own
            // budget), so they are not held against this reason's limit.
            let others = members
                .iter()
                .filter(|n| gated_start(before, n, other))
                .count();
            if started.is_empty() {
                continue;
            }
            let Some(limit) = gb.limit(reason, total, now).max else {
                continue;
            };
            let counted = members
                .iter()
                .filter(|n| {
                    disrupting(n)
                        || (n.record().state == State::Idle
                            && !n.is_ready()
                            && !expired_candidate(n, cfg, now))
                })
                .count()
                .saturating_sub(others);
            prop_assert!(
                counted <= limit,
                "budget violation in group {:?} for {:?}: started {:?}, {} counted > limit {}\n{:#?}\nbefore {:#?}",
                g,
                reason,
                started,
                counted,
                limit,
                members,
                before.nodes.iter().filter(|n| group_of(n, cfg) == g).collect::<Vec<_>>()
            );
        }
    }
    Ok(())
}

/// Entered a gated state in this decision.
fn gated_start(before: &ClusterView, n: &NodeView, reason: Reason) -> bool {
    let Some(prev) = before.nodes.iter().find(|b| b.name == n.name) else {
        return false;
    };
    // A node already disrupting (counted) that switches kind is not a new disruption.
    let (was, is) = (prev.record(), n.record());
    let entered = was.since != is.since && is.state != State::Idle && !disrupting(prev);
    match reason {
        Reason::Repair => {
            entered
                && is.state == State::Repairing
                && is.reason.as_deref() != Some("repair:startup-timeout")
        }
        Reason::Rebalance => {
            entered
                && is.state == State::Interrupted
                && is
                    .notice
                    .as_ref()
                    .is_some_and(|x| x.kind == NoticeKind::Rebalance)
        }
        Reason::Interruption => false,
    }
}

fn check_cordons(
    after: &ClusterView,
    ds: &[Decision],
    admin: &BTreeSet<String>,
) -> Result<(), TestCaseError> {
    for n in &after.nodes {
        if admin.contains(&n.name) {
            prop_assert!(n.unschedulable, "admin cordon of {} undone", n.name);
            prop_assert!(!ds
                .iter()
                .any(|d| d.node == n.name && d.action == Action::Uncordon));
            continue;
        }
        let r: Record = n.record();
        if n.unschedulable {
            prop_assert!(
                r.cordoned_by_us && r.state != State::Idle && r.reason.is_some(),
                "{} cordoned without a recorded reason: {:?}",
                n.name,
                n.annotations
            );
        }
    }
    Ok(())
}

/// A node carrying a repair veto gets no repair: no drain, reboot or replacement for a repair
/// (one asked for before the veto is never asked again, and interruptions are not vetoed).
fn check_vetoes(before: &ClusterView, ds: &[Decision]) -> Result<(), TestCaseError> {
    for n in before.nodes.iter().filter(|n| n.repair_veto().is_some()) {
        for d in ds.iter().filter(|d| d.node == n.name) {
            let repair = match &d.action {
                Action::StartDrain { reason, .. } | Action::RequestReplacement { reason, .. } => {
                    reason.starts_with("repair:")
                }
                Action::RequestReboot { .. } | Action::RestartUnit { .. } => true,
                _ => false,
            };
            prop_assert!(
                !repair,
                "{} is vetoed ({:?}), yet {:?}",
                n.name,
                n.repair_veto(),
                d.action
            );
        }
    }
    Ok(())
}

fn check_interruptions(
    before: &ClusterView,
    after: &ClusterView,
    ds: &[Decision],
    cfg: &PolicyConfig,
) -> Result<(), TestCaseError> {
    for n in &after.nodes {
        let r = n.record();
        if r.state != State::Interrupted {
            continue;
        }
        let Some(rn) = r.notice else {
            return Err(TestCaseError::fail(format!(
                "{} interrupted without notice",
                n.name
            )));
        };
        prop_assert!(
            n.has_taint(&cfg.interruption.taint_key),
            "{} not tainted",
            n.name
        );
        prop_assert!(n.drain.phase != DrainPhase::Idle, "{} not draining", n.name);
        let prev = before
            .nodes
            .iter()
            .find(|b| b.name == n.name)
            .map(|b| b.record());
        let new = prev.is_none_or(|p| p.notice.as_ref().map(|x| &x.id) != Some(&rn.id));
        if new {
            let want = drain_deadline(rn.at, cfg);
            let ok = ds.iter().any(|d| {
                d.node == n.name
                    && matches!(&d.action, Action::StartDrain { deadline, .. } if *deadline == want)
            });
            prop_assert!(
                ok,
                "{}: no drain with deadline {} in the notice's decision",
                n.name,
                want
            );
        }
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("POLICY_PROP_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// The generator's seed: fixed by default so CI is repeatable; `POLICY_PROP_SEED=<u64>` explores
/// other clusters (a failure prints the case to add below as a regression test).
fn rng_seed() -> proptest::test_runner::RngSeed {
    let seed = std::env::var("POLICY_PROP_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x6e6b_7072_6f70);
    proptest::test_runner::RngSeed::Fixed(seed)
}

/// Found by a random run: a repair was granted before an ungated (no budget for its reason)
/// rebalance drain started in the same decision, which then pushed the count over the repair budget.
#[test]
fn regression_ungated_start_counted_before_gated_repair() {
    let mut sim = Sim::new(11107335690609509247);
    for _ in 0..9 {
        sim.step().unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, rng_seed: rng_seed(), ..ProptestConfig::default() })]

    #[test]
    fn random_clusters_keep_every_invariant(seed in any::<u64>(), steps in 4usize..16) {
        let mut sim = Sim::new(seed);
        for _ in 0..steps {
            sim.step()?;
        }
    }
}

//! Random scenarios through the whole sim: small random clusters (pools, workloads with PDBs
//! that allow evictions, budgets with cron windows in several time zones), random node failures
//! (`Ready=False` pinned through the admin API) and notices (preemption, maintenance,
//! rebalance) played against the real controller (in-process, the disruption engine on the
//! sim's clock, the karpenter provider) and the sim's kubelets, scheduler, workload
//! controllers and provisioner, at 30× time. The Nodes are sampled every 100 ms; checked:
//!
//! - **0 budget violations**: when a node is first seen repairing, the nodes of its group
//!   repairing since no later than it started (a lower bound of what the policy counts) are at
//!   most the repair limit of the group's budgets at that moment (windows evaluated at the
//!   recorded start time, on the sim's clock);
//! - **0 nodes cordoned without a recorded reason**, at every sample and at the end;
//! - **every interruption drained before its deadline** (announced time − safety margin) when
//!   PDBs allow: a drain seen completed by its deadline, unless the engine recorded
//!   `BlockedByPDB` for the node (counted and printed).
//!
//! `NODEKEEPER_SIM_SEEDS` (default 8) scenarios, two at a time, from `NODEKEEPER_SIM_SEED`
//! (fixed by default; each scenario's seed is printed and replays its shape and choices).
#![allow(clippy::unwrap_used)]

use crate::support::engine as engine_support;
use crate::support::policy as policy_support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use nodekeeper_core::agent::sources::EventKind;
use nodekeeper_core::controller::act::provider::ProviderConfig;
use nodekeeper_core::controller::engine::node_view;
use nodekeeper_core::controller::policy::budget::{GroupBudgets, Reason};
use nodekeeper_core::controller::policy::config::Quantity;
use nodekeeper_core::controller::policy::interruption::drain_deadline;
use nodekeeper_core::controller::policy::view::{DrainPhase, NodeView, State};
use nodekeeper_core::controller::policy::{group_of, PolicyConfig};
use nodekeeper_sim::apiserver::loops::LoopOptions;
use nodekeeper_sim::apiserver::scenario::{PdbSpec, Scenario};
use nodekeeper_sim::apiserver::TestCluster;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use engine_support::*;
use policy_support::budgets;

const SCALE: f64 = 30.0;
/// Real time of the random phase of one scenario.
const RUN: Duration = Duration::from_secs(8);

/// Budget sets (cron windows are whole minutes: a minute is 2 s at 30×).
const BUDGET_SETS: &[&str] = &[
    r#"[{ nodes = "1" }]"#,
    r#"[{ nodes = "2" }]"#,
    r#"[{ nodes = "0" }]"#,
    r#"[{ nodes = "2" }, { nodes = "0", schedule = "*/2 * * * *", duration = "1m" }]"#,
    r#"[{ nodes = "1", reasons = ["repair"] }, { nodes = "0", schedule = "*/3 * * * *", duration = "1m", timezone = "Asia/Shanghai" }]"#,
    r#"[{ nodes = "3" }, { nodes = "1", schedule = "*/2 * * * *", duration = "1m", timezone = "America/New_York", reasons = ["repair"] }]"#,
    r#"[{ nodes = "1" }, { nodes = "0", schedule = "*/2 * * * *", duration = "1m", reasons = ["rebalance"] }]"#,
];

struct Case {
    scenario: Scenario,
    policy: PolicyConfig,
}

fn case(rng: &mut StdRng) -> Case {
    let mut s = Scenario::default_mixed();
    let template = s.pools[0].clone();
    s.pools = (0..rng.random_range(1..=3))
        .map(|i| {
            let mut p = template.clone();
            p.name = format!("p{i}");
            p.count = rng.random_range(2..=5);
            p
        })
        .collect();
    let web = s.workloads[0].clone();
    s.workloads = (0..rng.random_range(1..=2))
        .map(|i| {
            let mut w = web.clone();
            w.name = format!("w{i}");
            w.replicas = rng.random_range(2..=6);
            w.termination_grace_seconds = rng.random_range(1..=10);
            // PDBs that allow one eviction at a time.
            w.pdb = Some(if rng.random_bool(0.5) {
                PdbSpec {
                    min_available: None,
                    max_unavailable: Some(toml::Value::Integer(1)),
                }
            } else {
                PdbSpec {
                    min_available: Some(toml::Value::Integer(i64::from(w.replicas) - 1)),
                    max_unavailable: None,
                }
            });
            w
        })
        .collect();
    let mut p = policy_support::cfg();
    p.repair.policy[0].toleration = Duration::from_secs(rng.random_range(10..=60));
    p.repair.max_unhealthy = Quantity::Percent(100);
    p.repair.healthy_delay = Duration::from_secs(rng.random_range(0..=60));
    p.budgets.default = budgets(BUDGET_SETS[rng.random_range(0..BUDGET_SETS.len())]);
    for pool in &s.pools {
        if rng.random_bool(0.4) {
            let b = budgets(BUDGET_SETS[rng.random_range(0..BUDGET_SETS.len())]);
            p.budgets.groups.insert(pool.name.clone(), b);
        }
    }
    Case {
        scenario: s,
        policy: p,
    }
}

fn loops() -> LoopOptions {
    LoopOptions {
        pod_start_delay: Duration::from_secs(2),
        // The instance goes 2 min after its NodeClaim is deleted (preempted nodes: at once).
        terminate_delay: Duration::from_secs(120),
        launch_delay: Duration::from_secs(20),
        // Only pinned conditions: heartbeats never lapse under a loaded machine.
        node_monitor_grace: Duration::from_secs(3600),
        ..LoopOptions::default()
    }
}

/// A notice sent to the engine, and what became of its drain.
struct Sent {
    node: String,
    kind: EventKind,
    deadline: DateTime<Utc>,
    completed: Option<DateTime<Utc>>,
}

#[derive(Default, Debug)]
struct Outcome {
    samples: usize,
    failures: usize,
    notices: usize,
    repair_starts: usize,
    /// Starts that took their group exactly to its limit (the check is not vacuous).
    at_limit: usize,
    drained_in_time: usize,
    pdb_blocked: usize,
    problems: Vec<String>,
}

fn check_cordons(nodes: &[NodeView], when: &str, problems: &mut Vec<String>) {
    for n in nodes {
        let r = n.record();
        if n.unschedulable && !(r.cordoned_by_us && r.state != State::Idle && r.reason.is_some()) {
            problems.push(format!(
                "{when}: {} cordoned without a recorded reason: {:?}",
                n.name, n.annotations
            ));
        }
    }
}

/// Budget check for the nodes first seen repairing in this sample.
fn check_starts(
    nodes: &[NodeView],
    cfg: &PolicyConfig,
    seen: &mut BTreeSet<(String, DateTime<Utc>)>,
    out: &mut Outcome,
) {
    let mut groups: BTreeMap<String, Vec<&NodeView>> = BTreeMap::new();
    for n in nodes {
        groups.entry(group_of(n, cfg)).or_default().push(n);
    }
    for (g, members) in groups {
        let gb = GroupBudgets::new(cfg.budgets.for_group(&g));
        for n in &members {
            let r = n.record();
            let (State::Repairing, Some(since)) = (r.state, r.since) else {
                continue;
            };
            // A node that never became Ready is retried outside the budget.
            if r.reason.as_deref() == Some("repair:startup-timeout") {
                continue;
            }
            if !seen.insert((n.name.clone(), since)) {
                continue;
            }
            out.repair_starts += 1;
            let Some(limit) = gb.limit(Reason::Repair, members.len(), since).max else {
                continue;
            };
            let counted: Vec<&str> = members
                .iter()
                .filter(|m| {
                    let mr = m.record();
                    mr.state == State::Repairing && mr.since.is_some_and(|s| s <= since)
                })
                .map(|m| m.name.as_str())
                .collect();
            if counted.len() == limit {
                out.at_limit += 1;
            }
            if counted.len() > limit {
                out.problems.push(format!(
                    "budget violation in group {g:?}: {} started at {since} with {counted:?} repairing, limit {limit}",
                    n.name
                ));
            }
        }
    }
}

async fn views(c: &TestCluster) -> Option<Vec<NodeView>> {
    let list = Api::<Node>::all(c.client.clone())
        .list(&ListParams::default())
        .await
        .ok()?;
    Some(list.items.iter().filter_map(node_view).collect())
}

async fn run_case(seed: u64) -> Outcome {
    let mut rng = StdRng::seed_from_u64(seed);
    let Case { scenario, policy } = case(&mut rng);
    let c = cluster(SCALE, scenario, loops()).await;
    // The policy tells a failed node from one that never became Ready by its age.
    age_nodes(&c, 90).await;
    let mut cfg = controller_config(&format!("rand-{seed}"));
    cfg.provider = ProviderConfig::Karpenter;
    let ctl = controller(&c, &cfg, policy.clone(), None).await;
    let engine = ctl.engine.clone().unwrap();
    let clock = c.sim.store.clock.clone();
    let mut out = Outcome::default();
    let mut starts = BTreeSet::new();
    let mut sent: Vec<Sent> = Vec::new();
    let mut touched: BTreeSet<String> = BTreeSet::new();
    let begin = tokio::time::Instant::now();
    let mut tick = 0u64;
    loop {
        let running = begin.elapsed() < RUN;
        let open = sent
            .iter()
            .any(|s| s.completed.is_none() && clock.now() <= s.deadline);
        if !running && (!open || begin.elapsed() > RUN + Duration::from_secs(20)) {
            break;
        }
        tick += 1;
        if let Some(nodes) = views(&c).await {
            out.samples += 1;
            check_cordons(&nodes, "sample", &mut out.problems);
            check_starts(&nodes, &policy, &mut starts, &mut out);
            // Events on idle, Ready nodes nobody touched yet, every 300 ms.
            if running && tick % 3 == 0 {
                // Not young replacements: those count as never Ready (startup timeout).
                let old = clock.now() - chrono::Duration::seconds(90);
                let idle: Vec<&NodeView> = nodes
                    .iter()
                    .filter(|n| !touched.contains(&n.name) && !n.deleting && n.created_at < old)
                    .filter(|n| n.record().state == State::Idle && n.is_ready())
                    .collect();
                if idle.len() > 1 {
                    let n = idle[rng.random_range(0..idle.len())].name.clone();
                    let roll = rng.random_range(0.0..1.0);
                    if roll < 0.2 {
                        pin_condition(&c, &n, "Ready", "False").await;
                        touched.insert(n);
                        out.failures += 1;
                    } else if roll < 0.35 {
                        let kinds = [
                            EventKind::Preemption,
                            EventKind::Maintenance,
                            EventKind::Rebalance,
                        ];
                        let kind = kinds[rng.random_range(0..kinds.len())].clone();
                        let now = clock.now();
                        let at = now + chrono::Duration::seconds(rng.random_range(90..=300));
                        let id = format!("n-{seed}-{}", sent.len());
                        let ev = notice(&id, kind.clone(), Some(at), now);
                        assert!(ctl.app.states.ingest_event(&n, ev).await);
                        sent.push(Sent {
                            node: n.clone(),
                            kind,
                            deadline: drain_deadline(at, &policy),
                            completed: None,
                        });
                        touched.insert(n);
                        out.notices += 1;
                    }
                }
            }
        }
        for s in sent.iter_mut().filter(|s| s.completed.is_none()) {
            if engine.drains().view(&s.node).phase == DrainPhase::Completed {
                s.completed = Some(clock.now());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for s in &sent {
        if s.kind == EventKind::Rebalance {
            continue; // cordon only: no drain
        }
        match s.completed {
            Some(t) if t <= s.deadline => out.drained_in_time += 1,
            _ => {
                let blocked = events_about(&c, &s.node)
                    .await
                    .iter()
                    .any(|(r, _)| r == "BlockedByPDB");
                if blocked {
                    out.pdb_blocked += 1;
                } else {
                    out.problems.push(format!(
                        "{:?} on {}: drain completed {:?}, deadline {} (no PDB block recorded)",
                        s.kind, s.node, s.completed, s.deadline
                    ));
                }
            }
        }
    }
    if let Some(nodes) = views(&c).await {
        check_cordons(&nodes, "end", &mut out.problems);
    }
    ctl.stop().await;
    out
}

fn seeds() -> Vec<u64> {
    let n: u64 = std::env::var("NODEKEEPER_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let base: u64 = std::env::var("NODEKEEPER_SIM_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x6e_6b53_494d);
    (0..n).map(|i| base.wrapping_add(i)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_scenarios_keep_budgets_records_and_deadlines() {
    let results: Vec<(u64, Outcome)> = futures::stream::iter(seeds())
        .map(|seed| async move { (seed, run_case(seed).await) })
        .buffer_unordered(2)
        .collect()
        .await;
    let mut failed = Vec::new();
    let mut total = Outcome::default();
    for (seed, o) in &results {
        eprintln!(
            "seed {seed}: {} samples, {} failures, {} notices, {} repair starts ({} at the limit), {} drained in time, {} PDB-blocked, {} problems",
            o.samples, o.failures, o.notices, o.repair_starts, o.at_limit, o.drained_in_time, o.pdb_blocked, o.problems.len()
        );
        for p in &o.problems {
            eprintln!("  seed {seed}: {p}");
        }
        if !o.problems.is_empty() {
            failed.push(*seed);
        }
        total.failures += o.failures;
        total.notices += o.notices;
        total.repair_starts += o.repair_starts;
        total.at_limit += o.at_limit;
        total.drained_in_time += o.drained_in_time;
        total.pdb_blocked += o.pdb_blocked;
    }
    eprintln!(
        "sim_random_scenarios: {} scenarios, {} failures, {} notices, {} repair starts checked ({} at the limit), {} drains in time, {} PDB-blocked",
        results.len(),
        total.failures,
        total.notices,
        total.repair_starts,
        total.at_limit,
        total.drained_in_time,
        total.pdb_blocked
    );
    assert!(failed.is_empty(), "scenarios with problems: {failed:?} (NODEKEEPER_SIM_SEED=<seed> NODEKEEPER_SIM_SEEDS=1 replays one)");
    // The run exercised what it checks.
    assert!(total.failures > 0 && total.notices > 0, "{total:?}");
}

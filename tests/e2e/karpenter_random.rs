//! One budget for both, on the real Karpenter: a seeded random sequence of nodekeeper repairs (nodes
//! NotReady), preemptions (reported by the agent's identity), drift (a NodePool template edited) and
//! consolidation (a Deployment scaled down) over two NodePools with budget `nodes: "1"`, nodekeeper's
//! controller (as its ServiceAccount, provider `karpenter`, budgets read from the NodePools) beside
//! Karpenter. A watch records, at every observation, per NodePool, the nodes disrupted by either side
//! (nodekeeper: its state annotation; Karpenter: the `karpenter.sh/disrupted` taint, a deleting Node or
//! NodeClaim) and asserts that no **voluntary** disruption (a repair; a consolidation or drift) starts
//! while the NodePool's disrupted nodes already fill its budget. Interruptions are gated by neither
//! tool (as in Karpenter), so they only count.
//!
//! Seed: `NODEKEEPER_KARPENTER_SEED` (default [`DEFAULT_SEED`], printed). Real only: the sim runs no
//! Karpenter. Shares the Karpenter cluster and its `ONE_AT_A_TIME` lock with tests/e2e/karpenter.rs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::karpenter::*;
use crate::support::*;
use nodekeeper_core::agent::sources::{EventKind, NodeEvent, NODE_EVENT_VERSION};
use nodekeeper_core::controller::policy::view::keys;

pub const DEFAULT_SEED: u64 = 16;
const POOLS: [&str; 2] = ["nk-rand-a", "nk-rand-b"];
const BUDGET: usize = 1;
const STEPS: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// nodekeeper's repair, or Karpenter's consolidation / drift.
    Voluntary,
    /// nodekeeper handling an interruption.
    Involuntary,
}

/// Per NodePool: node → why it is disrupted now.
type Snapshot = BTreeMap<String, BTreeMap<String, (Kind, &'static str)>>;

async fn snapshot(nodes: &Api<Node>, claims: &Api<kube::core::DynamicObject>) -> Option<Snapshot> {
    let selector = format!("karpenter.sh/nodepool in ({})", POOLS.join(","));
    let ns = nodes
        .list(&ListParams::default().labels(&selector))
        .await
        .ok()?
        .items;
    let cs = claims
        .list(&ListParams::default().labels(&selector))
        .await
        .ok()?
        .items;
    let deleting_claims: BTreeSet<String> = cs
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_some())
        .filter_map(|c| c.data["status"]["nodeName"].as_str().map(String::from))
        .collect();
    let mut out = Snapshot::new();
    for n in ns {
        let name = n.metadata.name.clone().unwrap_or_default();
        let pool = n
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("karpenter.sh/nodepool"))
            .cloned()
            .unwrap_or_default();
        let why = match annotation(&n, keys::STATE) {
            Some("interrupted") => Some((Kind::Involuntary, "nodekeeper interruption")),
            Some("repairing") => Some((Kind::Voluntary, "nodekeeper repair")),
            _ => {
                let tainted = n
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|ts| ts.iter().any(|t| t.key == "karpenter.sh/disrupted"));
                let deleting =
                    n.metadata.deletion_timestamp.is_some() || deleting_claims.contains(&name);
                (tainted || deleting).then_some((Kind::Voluntary, "karpenter"))
            }
        };
        if let Some(w) = why {
            out.entry(pool).or_default().insert(name, w);
        }
    }
    Some(out)
}

/// How long after nodekeeper's disruption of a node first shows, a disruption Karpenter starts in
/// the same NodePool is not counted against it: Karpenter does not count nodekeeper's disruptions
/// itself, it sees them through the fence (`karpenter.sh/do-not-disrupt` on the pool's other nodes),
/// which lands beside the disruption's first patch (the notice's fast path sends both at once; a
/// repair's round writes them together), not before it; a command Karpenter validated before the
/// fence landed still starts. (A CI run saw Karpenter start an `Empty` deletion 24 ms after
/// nodekeeper's preemption cordon, when the fence still waited for the reconcile after the notice.)
/// Past this, the fence must hold.
const FENCE_GRACE: Duration = Duration::from_millis(500);

/// The watch: every observation against the previous one. A node newly disrupted voluntarily may
/// start only while the nodes still disrupted from before, plus the other voluntary starts seen at
/// the same time, stay within the budget. `unfenced_yet`: nodekeeper's disruptions first seen less
/// than [`FENCE_GRACE`] ago, not counted against Karpenter's starts.
fn check(
    prev: &Snapshot,
    now: &Snapshot,
    unfenced_yet: &BTreeSet<String>,
    violations: &mut Vec<String>,
) {
    for (pool, cur) in now {
        let before = prev.get(pool).cloned().unwrap_or_default();
        let started: Vec<_> = cur
            .iter()
            .filter(|(n, (k, _))| *k == Kind::Voluntary && !before.contains_key(*n))
            .collect();
        let only_karpenter = started.iter().all(|(_, (_, who))| *who == "karpenter");
        let still = cur
            .keys()
            .filter(|n| before.contains_key(*n))
            .filter(|n| !(only_karpenter && unfenced_yet.contains(*n)))
            .count();
        if !started.is_empty() && still + started.len() > BUDGET {
            violations.push(format!(
                "NodePool {pool} (budget {BUDGET}): {started:?} started while {before:?} were disrupting (now {cur:?})"
            ));
        }
    }
}

fn pool_yaml(pool: &str, generation: usize) -> String {
    format!(
        r#"
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {{name: {pool}}}
spec:
  template:
    metadata: {{labels: {{nodekeeper.test/generation: "{generation}"}}}}
    spec:
      requirements:
        - {{key: kubernetes.io/arch, operator: In, values: [amd64]}}
        - {{key: kubernetes.io/os, operator: In, values: [linux]}}
        - {{key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}}
      nodeClassRef: {{group: karpenter.kwok.sh, kind: KWOKNodeClass, name: default}}
      expireAfter: Never
  limits: {{cpu: "64"}}
  disruption: {{consolidationPolicy: WhenEmptyOrUnderutilized, consolidateAfter: 0s, budgets: [{{nodes: "{BUDGET}"}}]}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {pool}-app, namespace: default}}
spec:
  replicas: 3
  selector: {{matchLabels: {{app: {pool}-app}}}}
  template:
    metadata: {{labels: {{app: {pool}-app}}}}
    spec:
      terminationGracePeriodSeconds: 0
      nodeSelector: {{karpenter.sh/nodepool: {pool}}}
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            - {{labelSelector: {{matchLabels: {{app: {pool}-app}}}}, topologyKey: kubernetes.io/hostname}}
      containers:
        - {{name: pause, image: "registry.k8s.io/pause:3.10", resources: {{requests: {{cpu: 1500m, memory: 512Mi}}}}}}
"#
    )
}

/// The pool's nodes that are Ready, not cordoned, not deleting: candidates for a fault.
async fn healthy_nodes(nodes: &Api<Node>, pool: &str) -> Vec<String> {
    nodes
        .list(&ListParams::default().labels(&format!("karpenter.sh/nodepool={pool}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|n| is_ready(n) && !unschedulable(n) && n.metadata.deletion_timestamp.is_none())
        .filter(|n| annotation(n, keys::STATE).is_none())
        .filter_map(|n| n.metadata.name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_repairs_preemptions_drift_and_consolidation_never_exceed_a_nodepool_budget() {
    init_tracing();
    let seed = std::env::var("NODEKEEPER_KARPENTER_SEED")
        .ok()
        .map(|s| {
            s.parse::<u64>()
                .expect("NODEKEEPER_KARPENTER_SEED is a u64")
        })
        .unwrap_or(DEFAULT_SEED);
    eprintln!(
        "karpenter random scenario: seed {seed} (NODEKEEPER_KARPENTER_SEED={seed} replays it)"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let _one = ONE_AT_A_TIME.lock().await;
    let c = karpenter_cluster();
    let admin = c.admin().await;
    let started = std::time::Instant::now();
    let fixtures = repo().join("tests/fixtures/karpenter");
    let out = kubectl(
        c,
        &[
            "apply",
            "-f",
            fixtures.join("kwoknodeclass.yaml").to_str().unwrap(),
        ],
    );
    assert!(out.status.success());
    for pool in POOLS {
        crate::drain::apply(c, &pool_yaml(pool, 0));
    }
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    for pool in POOLS {
        let app = format!("{pool}-app");
        wait_until(
            Duration::from_secs(180),
            &format!("3 pods of {app} Running"),
            || {
                let (pods, app) = (pods.clone(), app.clone());
                async move {
                    app_pods_of(&pods, &app)
                        .await
                        .iter()
                        .filter_map(running_on)
                        .collect::<BTreeSet<_>>()
                        .len()
                        == 3
                }
            },
        )
        .await;
    }

    let dir = tempfile::tempdir().unwrap();
    let config = karpenter_controller_toml_with(
        dir.path(),
        "karpenter-random",
        "condition_type = \"Ready\"\ncondition_status = \"False\"\ntoleration = \"2s\"",
        |t| {
            t["repair"]
                .as_table_mut()
                .unwrap()
                .insert("max_unhealthy".into(), "100%".into());
            t["budgets"]
                .as_table_mut()
                .unwrap()
                .insert("source".into(), "nodepool".into());
        },
    );
    let ctl = ControllerProc::start(c, &config, "karpenter-random").await;
    wait_leading(&admin, "nodekeeper-karpenter-random", "karpenter-random").await;
    let https = crate::ctl::https(&dir.path().join("ca.pem"), ctl.addr);

    // The watch.
    let nodes: Api<Node> = Api::all(admin.clone());
    let claims = nodeclaims(&admin);
    let violations = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = tokio_util::sync::CancellationToken::new();
    let watch = {
        let (nodes, claims, violations, stop) = (
            nodes.clone(),
            claims.clone(),
            violations.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            let mut prev = Snapshot::new();
            let mut observations = 0u64;
            let mut most: BTreeMap<String, usize> = BTreeMap::new();
            // When each of nodekeeper's disruptions was first seen.
            let mut since: BTreeMap<String, tokio::time::Instant> = BTreeMap::new();
            while !stop.is_cancelled() {
                if let Some(now) = snapshot(&nodes, &claims).await {
                    let t = tokio::time::Instant::now();
                    let ours: BTreeSet<String> = now
                        .values()
                        .flatten()
                        .filter(|(_, (_, who))| *who != "karpenter")
                        .map(|(n, _)| n.clone())
                        .collect();
                    since.retain(|n, _| ours.contains(n));
                    for n in &ours {
                        since.entry(n.clone()).or_insert(t);
                    }
                    let unfenced_yet: BTreeSet<String> = since
                        .iter()
                        .filter(|(_, at)| t.duration_since(**at) < FENCE_GRACE)
                        .map(|(n, _)| n.clone())
                        .collect();
                    check(&prev, &now, &unfenced_yet, &mut violations.lock().unwrap());
                    for (pool, set) in &now {
                        let m = most.entry(pool.clone()).or_default();
                        *m = (*m).max(set.len());
                    }
                    if now != prev {
                        eprintln!("watch: {now:?}");
                    }
                    prev = now;
                    observations += 1;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (observations, most)
        })
    };

    // The random sequence.
    let mut generation = 0;
    for step in 0..STEPS {
        let pool = POOLS[rng.random_range(0..POOLS.len())];
        let action = rng.random_range(0..4u8);
        let candidates = healthy_nodes(&nodes, pool).await;
        match action {
            0 | 1 if candidates.is_empty() => eprintln!("step {step}: {pool} has no healthy node"),
            0 => {
                let n = &candidates[rng.random_range(0..candidates.len())];
                eprintln!("step {step}: {n} of {pool} NotReady");
                c.kubelet_reports_not_ready(n).await;
            }
            1 => {
                let n = &candidates[rng.random_range(0..candidates.len())];
                eprintln!("step {step}: preemption of {n} of {pool}");
                let token = agent_report_token(&admin, n).await;
                let now = chrono::Utc::now();
                let mut report = crate::ctl::report(n, 1_000 * (step as u64 + 1), &[]);
                report.events = vec![NodeEvent {
                    version: NODE_EVENT_VERSION,
                    id: format!("rand-preempt-{step}"),
                    kind: EventKind::Preemption,
                    cloud: None,
                    source: "oci/instance-action".into(),
                    not_before: Some(now + chrono::Duration::seconds(60)),
                    deadline: None,
                    detected_at: now,
                    detail: Default::default(),
                }];
                let id = format!("rand-preempt-{step}");
                report_until(&https, ctl.addr, &token, &report, |r| {
                    r["acknowledged_events"].to_string().contains(&id)
                })
                .await;
            }
            2 => {
                generation += 1;
                eprintln!("step {step}: drift of {pool} (template generation {generation})");
                nodepools(&admin)
                    .patch(
                        pool,
                        &PatchParams::default(),
                        &Patch::Merge(json!({ "spec": { "template": { "metadata": {
                            "labels": { "nodekeeper.test/generation": generation.to_string() } } } } })),
                    )
                    .await
                    .unwrap();
            }
            _ => {
                let replicas = rng.random_range(1..=3);
                eprintln!("step {step}: {pool}-app scaled to {replicas}");
                let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
                    Api::namespaced(admin.clone(), "default");
                deployments
                    .patch(
                        &format!("{pool}-app"),
                        &PatchParams::default(),
                        &Patch::Merge(json!({ "spec": { "replicas": replicas } })),
                    )
                    .await
                    .unwrap();
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(2_000..6_000))).await;
    }
    // Let what was started play out for a while under the watch.
    tokio::time::sleep(Duration::from_secs(20)).await;
    stop.cancel();
    let (observations, most) = watch.await.unwrap();
    eprintln!(
        "karpenter random scenario (seed {seed}): {observations} observations, most disrupted at once per NodePool {most:?}, {:?} since the pools were applied",
        started.elapsed()
    );
    assert!(
        observations > 100,
        "the watch observed {observations} times"
    );
    let v = violations.lock().unwrap().clone();
    assert!(
        v.is_empty(),
        "seed {seed}: budget exceeded:\n{}",
        v.join("\n")
    );
    assert_eq!(
        ctl.forbidden_lines(),
        Vec::<String>::new(),
        "the controller hit a 403"
    );
    // Quiesce before the teardown: budget "0" (Karpenter starts nothing more), then every NodeClaim
    // of the pools initialized and none deleting. Deleting a NodePool while Karpenter's drift
    // replacement is launching left that replacement's KWOK node behind once (its NodeClaim was
    // deleted before the node registered), and `remove_pool` waits for every node of the pool.
    for pool in POOLS {
        set_pool_budget(&admin, pool, "0").await;
    }
    wait_until(
        Duration::from_secs(120),
        "the NodePools' NodeClaims initialized, none deleting",
        || {
            let claims = claims.clone();
            async move {
                let selector = format!("karpenter.sh/nodepool in ({})", POOLS.join(","));
                claims
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .is_ok_and(|l| {
                        l.items.iter().all(|c| {
                            c.metadata.deletion_timestamp.is_none()
                                && condition_true(c, "Initialized")
                        })
                    })
            }
        },
    )
    .await;
    ctl.stop().await;
    for pool in POOLS {
        remove_pool(c, "deployment", &format!("{pool}-app"), pool).await;
    }
}

/// The watch's rule, on its own: Karpenter may not start while nodekeeper's disruption fills the
/// budget, unless that disruption is younger than the fence's grace; nodekeeper never may.
#[test]
fn the_watch_allows_karpenter_only_the_fence_grace() {
    let snap = |entries: &[(&str, Kind, &'static str)]| -> Snapshot {
        let mut s = Snapshot::new();
        for (n, k, who) in entries {
            s.entry("p".into())
                .or_default()
                .insert(n.to_string(), (*k, *who));
        }
        s
    };
    let interrupted = snap(&[("a", Kind::Involuntary, "nodekeeper interruption")]);
    let karpenter_too = snap(&[
        ("a", Kind::Involuntary, "nodekeeper interruption"),
        ("b", Kind::Voluntary, "karpenter"),
    ]);
    let young: BTreeSet<String> = ["a".to_string()].into();
    let mut v = Vec::new();
    check(&interrupted, &karpenter_too, &young, &mut v);
    assert!(v.is_empty(), "within the grace: {v:?}");
    check(&interrupted, &karpenter_too, &BTreeSet::new(), &mut v);
    assert_eq!(v.len(), 1, "past the grace");
    let karpenter = snap(&[("b", Kind::Voluntary, "karpenter")]);
    let repair_too = snap(&[
        ("b", Kind::Voluntary, "karpenter"),
        ("c", Kind::Voluntary, "nodekeeper repair"),
    ]);
    let mut v = Vec::new();
    check(&karpenter, &repair_too, &["c".to_string()].into(), &mut v);
    assert_eq!(
        v.len(),
        1,
        "nodekeeper's repair never starts over the budget"
    );
}

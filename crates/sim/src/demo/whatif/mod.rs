//! `nodekeeper demo --snapshot FILE [--controller-config FILE] [--what-if EVENT:TARGET]...`:
//! what-if replay of a real cluster.
//!
//! The snapshot's Nodes, Pods and PodDisruptionBudgets ([`snapshot`]) are seeded into the sim
//! exactly as exported (uid and creation time kept; no kubelets, scheduler or controllers run,
//! so nothing else moves), the user's controller policy runs in-process in **dry run** (decisions
//! become Events only), the what-if events ([`event`]) are injected through the real paths (the
//! sim's node conditions; the controller's notice intake), and the engine's clock is set
//! `--after` ahead (default: the longest repair toleration + 1 s) so that tolerations have run
//! out. The result ([`verdict`]) is what nodekeeper would do to each node and what would hold it
//! back, in the demo's timeline style or as JSON. The run checks that the dry run changed no
//! object of the snapshot.

pub mod event;
pub mod snapshot;
pub mod verdict;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;
use kube::Api;
use serde_json::{json, Value};

use super::timeline::Timeline;
use super::{DemoArgs, DemoError};
use crate::apiserver::clock::SimClock;
use crate::apiserver::loops::LoopOptions;
use crate::apiserver::resources::{well_known, ResourceDef};
use crate::apiserver::scenario;
use crate::apiserver::{SimOptions, TestCluster};
use event::{Happening, WhatIf};
use nodekeeper_core::controller::act::provider::ProviderConfig;
use nodekeeper_core::controller::clock::Clock;
use nodekeeper_core::controller::config::ControllerConfig;
use nodekeeper_core::controller::engine::EngineOptions;
use nodekeeper_core::controller::policy::{decide_with_status, PolicyConfig};
use nodekeeper_core::wire::{NodeEvent, NODE_EVENT_VERSION};
use snapshot::Snapshot;
use verdict::{EventLine, Verdict, Workloads};

/// Phases of the replay, the summary included.
const PHASES: usize = 4;

/// The sim's clock, `by` ahead: the engine decides as if `by` had passed.
struct Ahead {
    clock: Arc<SimClock>,
    by: Duration,
}

impl Clock for Ahead {
    fn now(&self) -> DateTime<Utc> {
        nodekeeper_core::controller::policy::later(self.clock.now(), self.by)
    }
}

/// The longest `tolerationDuration` of the repair policies (every group included).
pub fn longest_toleration(p: &PolicyConfig) -> Duration {
    let r = &p.repair;
    let groups = r
        .groups
        .values()
        .flat_map(|g| g.policy.iter().chain(g.repair_policies.iter()).flatten());
    r.policy
        .iter()
        .chain(r.repair_policies.iter())
        .chain(groups)
        .map(|c| c.toleration)
        .max()
        .unwrap_or_default()
}

/// The controller of a what-if: the user's `[controller]` in dry run, on loopback, with no
/// provider, no notification targets and no OCI Events intake (nothing leaves the process).
fn controller_config(user: Option<ControllerConfig>) -> ControllerConfig {
    let mut c = super::script::controller_config(user);
    c.dry_run = true;
    c.provider = ProviderConfig::None;
    c.notify.clear();
    c.oci_events.enabled = false;
    c.engine.enabled = true;
    c
}

/// Runs the replay; `Ok(false)` when the dry run changed an object (a bug worth exit 1).
pub async fn run(args: &DemoArgs, path: &Path) -> Result<bool, DemoError> {
    let invalid = |e: String| DemoError::Invalid(e);
    let snap =
        Snapshot::load(path).map_err(|e| invalid(nodekeeper_core::telemetry::error_chain(&e)))?;
    let (config, mut policy) = super::cluster::policy(args.controller_config.as_deref(), 1.0)
        .map_err(|e| invalid(e.to_string()))?;
    policy.controller.dry_run = true;
    let mut injected: Vec<(WhatIf, Vec<String>)> = Vec::new();
    for w in &args.what_if {
        let nodes = w
            .nodes(&snap.nodes, &policy.budgets.group_by)
            .map_err(invalid)?;
        injected.push((w.clone(), nodes));
    }
    let after = args
        .after
        .unwrap_or_else(|| longest_toleration(&policy) + Duration::from_secs(1));
    let json_out = args.json;
    let out: Box<dyn std::io::Write + Send> = if json_out {
        Box::new(std::io::stderr())
    } else {
        Box::new(std::io::stdout())
    };
    let tl = Arc::new(Timeline::new(1.0, out));
    tl.phase(
        1,
        PHASES,
        &format!(
            "snapshot {}: {} nodes, {} pods, {} PodDisruptionBudgets",
            path.display(),
            snap.nodes.len(),
            snap.pods.len(),
            snap.pdbs.len()
        ),
    );
    let cluster = TestCluster::start(SimOptions {
        loops: LoopOptions::none(),
        ..SimOptions::default()
    })
    .await
    .map_err(|e| DemoError::Start(format!("sim: {e}")))?;
    seed(&cluster, &snap, path)?;
    scenario::ensure_namespace(&cluster.sim, "nodekeeper")
        .map_err(|e| DemoError::Start(e.to_string()))?;
    let ccfg = controller_config(config.controller.controller.clone());
    let mut engine_opts = EngineOptions::new(policy.clone());
    engine_opts.clock = Arc::new(Ahead {
        clock: cluster.sim.store.clock.clone(),
        by: after,
    });
    let ctl =
        nodekeeper_core::controller::start_with(cluster.client.clone(), &ccfg, Some(engine_opts))
            .await
            .map_err(|e| DemoError::Start(format!("controller: {e}")))?;
    let result = replay(&cluster, &ctl, &snap, &policy, &injected, after, &tl).await;
    ctl.stop().await;
    let report = result?;
    if let Some(dir) = &args.dir {
        write_after(dir, &report.after)?;
    }
    let ok = report.changed.is_empty();
    if json_out {
        let v = json!({
            "version": 1,
            "snapshot": path.display().to_string(),
            "objects": {"nodes": snap.nodes.len(), "pods": snap.pods.len(), "pdbs": snap.pdbs.len()},
            "left_out": snap.left_out,
            "what_if": injected.iter().map(|(w, n)| json!({"event": w.to_string(), "nodes": n})).collect::<Vec<_>>(),
            "after_seconds": after.as_secs_f64(),
            "at": report.at.to_rfc3339(),
            "dry_run": true,
            "changed": report.changed,
            "nodes": report.verdicts,
        });
        println!("{v}");
    } else {
        tl.phase(PHASES, PHASES, "summary");
        tl.raw(&verdict::table(&report.verdicts));
        if !snap.left_out.is_empty() {
            tl.raw(&format!(
                "left out {} pod(s) bound to nodes the snapshot does not hold (deleted while it was taken): {}",
                snap.left_out.len(),
                snap.left_out.join(", ")
            ));
        }
        if ok {
            tl.raw(&format!(
                "dry run: the {} objects of the snapshot are unchanged",
                report.compared
            ));
        } else {
            tl.raw(&format!(
                "✘ the dry run changed objects: {}",
                report.changed.join(", ")
            ));
        }
    }
    Ok(ok)
}

/// Seeds the snapshot (nodes, PDBs, then pods) into the sim.
fn seed(cluster: &TestCluster, snap: &Snapshot, path: &Path) -> Result<(), DemoError> {
    let all = [
        (well_known::nodes(), &snap.nodes),
        (well_known::pdbs(), &snap.pdbs),
        (well_known::pods(), &snap.pods),
    ];
    for (res, objs) in all {
        for o in objs {
            scenario::restore(&cluster.sim, res, o.clone())
                .map_err(|e| DemoError::Invalid(format!("{}: {e}", path.display())))?;
        }
    }
    Ok(())
}

struct Report {
    at: DateTime<Utc>,
    /// The objects at the end (`--dir`: written as `after.json`).
    after: BTreeMap<String, Value>,
    verdicts: Vec<Verdict>,
    changed: Vec<String>,
    compared: usize,
}

/// Every object of the snapshot's kinds, by `Kind/namespace/name`, without resourceVersion.
fn fingerprint(cluster: &TestCluster) -> BTreeMap<String, Value> {
    let kinds: [&'static ResourceDef; 3] =
        [well_known::nodes(), well_known::pods(), well_known::pdbs()];
    let mut out = BTreeMap::new();
    for res in kinds {
        for o in cluster.sim.store.txn(|t| t.list(res, None)) {
            let mut v = (*o).clone();
            if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("resourceVersion");
            }
            out.insert(format!("{}/{}", res.kind, snapshot::key_of(&v)), v);
        }
    }
    out
}

/// Writes the objects as they are after the replay to `dir/after.json` (a `List`, like the
/// snapshot: diff it against the snapshot to see that the dry run changed nothing but the
/// what-if conditions).
fn write_after(dir: &Path, objects: &BTreeMap<String, Value>) -> Result<(), DemoError> {
    let path = dir.join("after.json");
    let list =
        json!({"apiVersion": "v1", "kind": "List", "items": objects.values().collect::<Vec<_>>()});
    std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::write(&path, format!("{list:#}\n")))
        .map_err(|e| DemoError::Start(format!("{}: {e}", path.display())))
}

/// Polls `f` every 50 ms for up to 30 s.
async fn until(what: &str, mut f: impl FnMut() -> bool) -> Result<(), DemoError> {
    let start = Instant::now();
    while !f() {
        if start.elapsed() > Duration::from_secs(30) {
            return Err(DemoError::Start(format!("{what}: not within 30s")));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

async fn replay(
    cluster: &TestCluster,
    ctl: &nodekeeper_core::controller::Running,
    snap: &Snapshot,
    policy: &PolicyConfig,
    injected: &[(WhatIf, Vec<String>)],
    after: Duration,
    tl: &Arc<Timeline>,
) -> Result<Report, DemoError> {
    let engine = ctl
        .engine
        .clone()
        .ok_or_else(|| DemoError::Start("the disruption engine did not start".into()))?;
    let clock = Ahead {
        clock: cluster.sim.store.clock.clone(),
        by: after,
    };
    until("the controller's node cache", || {
        engine.view(clock.now()).nodes.len() == snap.nodes.len()
    })
    .await?;
    let (events_client, events_tl) = (cluster.client.clone(), tl.clone());
    let follow = tokio::spawn(async move {
        super::timeline::follow_events(
            events_client,
            nodekeeper_core::controller::cluster::events::NODE_EVENT_NAMESPACE,
            &events_tl,
        )
        .await;
    });
    tl.phase(
        2,
        PHASES,
        &format!("what-if: {} event(s) injected", injected.len()),
    );
    let admin = cluster.admin_url("");
    let mut notices = Vec::new();
    for (i, (w, nodes)) in injected.iter().enumerate() {
        for n in nodes {
            match &w.happening {
                Happening::NotReady => {
                    super::cluster::set_ready(&admin, n, "False")
                        .await
                        .map_err(DemoError::Start)?;
                    tl.line(n, "Ready=False", &format!("what-if: {w}"));
                }
                Happening::Notice(kind) => {
                    let ev = NodeEvent {
                        version: NODE_EVENT_VERSION,
                        id: format!("what-if-{i}-{n}"),
                        kind: kind.clone(),
                        cloud: None,
                        source: "nodekeeper/what-if".into(),
                        not_before: None,
                        deadline: None,
                        detected_at: clock.now(),
                        detail: Default::default(),
                    };
                    notices.push((n.clone(), ev.id.clone()));
                    ctl.app.states.ingest_event(n, ev).await;
                    tl.line(
                        n,
                        &format!("{} notice", kind.name()),
                        &format!("what-if: {w}"),
                    );
                }
            }
        }
    }
    let before = fingerprint(cluster);
    let not_ready: Vec<&String> = injected
        .iter()
        .filter(|(w, _)| w.happening == Happening::NotReady)
        .flat_map(|(_, n)| n)
        .collect();
    until("the engine seeing the what-if events", || {
        let view = engine.view(clock.now());
        let seen = |name: &str| view.nodes.iter().find(|v| v.name == name);
        not_ready
            .iter()
            .all(|n| seen(n).is_some_and(|v| !v.is_ready()))
            && notices
                .iter()
                .all(|(n, id)| seen(n).is_some_and(|v| v.notices.iter().any(|x| &x.id == id)))
    })
    .await?;
    // Two whole reconciles after the inputs were visible: the dry-run Events are written.
    let r0 = engine
        .metrics
        .reconciles
        .load(std::sync::atomic::Ordering::Relaxed);
    until("two reconciles of the engine", || {
        engine
            .metrics
            .reconciles
            .load(std::sync::atomic::Ordering::Relaxed)
            >= r0 + 2
    })
    .await?;
    let at = clock.now();
    tl.phase(
        3,
        PHASES,
        &format!(
            "what nodekeeper would do {} later (dry run: Events only)",
            humantime::format_duration(Duration::from_secs(after.as_secs()))
        ),
    );
    let view = engine.view(at);
    let (decisions, _) = decide_with_status(&view, policy, at);
    let store = &cluster.sim.store;
    let workloads = Workloads {
        pods: store.txn(|t| t.list(well_known::pods(), None)),
        pdbs: store.txn(|t| t.list(well_known::pdbs(), None)),
    };
    let mut verdicts = verdict::verdicts(&view, &decisions, policy, &workloads);
    let events = recorded_events(cluster).await;
    for v in &mut verdicts {
        v.events = events.get(&v.node).cloned().unwrap_or_default();
        if let Some(why) = &v.why {
            tl.line(&v.node, "would be blocked", why);
        }
    }
    follow.abort();
    let after_fp = fingerprint(cluster);
    let changed: Vec<String> = before
        .iter()
        .filter(|(k, v)| after_fp.get(*k) != Some(v))
        .map(|(k, _)| k.clone())
        .chain(
            after_fp
                .keys()
                .filter(|k| !before.contains_key(*k))
                .cloned(),
        )
        .collect();
    Ok(Report {
        at,
        verdicts,
        changed,
        compared: before.len(),
        after: after_fp,
    })
}

/// The controller's Events by node (reason, note), oldest first.
async fn recorded_events(cluster: &TestCluster) -> BTreeMap<String, Vec<EventLine>> {
    let api: Api<Event> = Api::namespaced(
        cluster.client.clone(),
        nodekeeper_core::controller::cluster::events::NODE_EVENT_NAMESPACE,
    );
    let mut out: BTreeMap<String, Vec<EventLine>> = BTreeMap::new();
    if let Ok(list) = api.list(&ListParams::default()).await {
        for e in list.items {
            let Some(node) = e.regarding.and_then(|r| r.name) else {
                continue;
            };
            out.entry(node).or_default().push(EventLine {
                reason: e.reason.unwrap_or_default(),
                note: e.note.unwrap_or_default(),
            });
        }
    }
    out
}

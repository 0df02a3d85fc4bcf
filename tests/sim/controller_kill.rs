//! The real controller binary SIGKILLed at random points while it repairs nodes (cordon →
//! drain → NodeClaim deletion through the karpenter provider) and while it takes preemption
//! notices (taint + cordon → drain, replacement requested at once) from OCI Events POSTs and from
//! agents' reports (the agent's own reporter; the controller killed within moments of the
//! report, or the moment the agent drops the acknowledged notice from its queue) on the
//! in-process sim, and a new one started each time (on the same port, as behind a Service).
//! At the end: every failed or
//! preempted node was replaced (0 lost actions), each with exactly one replacement request (one
//! request id on its NodeClaim, at most one `ReplacementRequested` Event: 0 duplicate
//! replacements; Events are best effort, a kill between the record and the Event write loses
//! it, so the run prints how many nodes went without one);
//! every preempted node was seen tainted + cordoned and had no workload pod left before it went
//! away (drained); no node left cordoned or tainted without nodekeeper's record (0 orphan
//! cordons/taints), the workload Running again.
//!
//! `NODEKEEPER_KILL_TRIALS` (default 20) kills; the schedule's seed is fixed by default and printed,
//! `NODEKEEPER_KILL_SEED` chooses another (or replays a run). Long run: docs/dev/reliability.md.
//!
//! Sim only: hundreds of seeded kill trials need the sim's scaled clock; one SIGKILL mid-drain runs
//! on both in `tests/e2e` (`failover`).
#![allow(clippy::unwrap_used)]

use crate::support::controller_addr;
use crate::support::ctl;
use crate::support::engine as engine_support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use nodekeeper_core::agent::reporter::{Reporter, ReporterConfig, EVENTS_FILE};
use nodekeeper_core::agent::sources::{Cloud, EventKind, NodeEvent};
use nodekeeper_core::controller::act::provider::karpenter::{
    nodeclaim_resource, REQUEST_ANNOTATION,
};
use nodekeeper_core::controller::policy::view::keys;
use nodekeeper_sim::apiserver::loops::LoopOptions;
use nodekeeper_sim::apiserver::resources::well_known;
use nodekeeper_sim::apiserver::scenario::Scenario;
use nodekeeper_sim::apiserver::TestCluster;
use nodekeeper_sim::oci_events::OciEventKind;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, watch};

use engine_support::*;

const POOL: &str = "general";
const POOL_SIZE: usize = 6;
const INTERRUPTION_TAINT: &str = "nodekeeper.io/interruption";
const OCI_TOKEN: &str = "kill-test-oci-events-secret";

fn scenario() -> Scenario {
    let mut s = Scenario::default_mixed();
    s.pools.truncate(1);
    s.pools[0].name = POOL.into();
    s.pools[0].count = POOL_SIZE;
    s.workloads[0].termination_grace_seconds = 1;
    s
}

fn fast_loops() -> LoopOptions {
    LoopOptions {
        pod_start_delay: Duration::from_millis(300),
        // A deleted NodeClaim's node goes 6 s later: a preempted node's replacement is
        // requested at once, its drain (restarted by each new controller) runs meanwhile.
        terminate_delay: Duration::from_secs(6),
        launch_delay: Duration::from_secs(1),
        // Pinned conditions only; kubelet heartbeats never lapse in a short run.
        node_monitor_grace: Duration::from_secs(3600),
        ..LoopOptions::default()
    }
}

fn write_config(dir: &Path, port: u16, identity: &str) -> PathBuf {
    let path = dir.join("controller.toml");
    std::fs::write(
        &path,
        format!(
            r#"[log]
level = "info"
[controller]
listen = "127.0.0.1:{port}"
insecure_plain_http = true
staleness = "1h"
[controller.leader]
identity = "{identity}"
lease_duration = "1s"
retry_period = "100ms"
[controller.engine]
tick = "200ms"
wait_volume_detach = false
[controller.oci_events]
enabled = true
token = "{OCI_TOKEN}"
[controller.provider]
kind = "karpenter"
[sources]
cloud = "none"
[repair]
max_unhealthy = "100%"
drain_timeout = "30s"
startup_timeout = "0s"
[[repair.policy]]
condition_type = "Ready"
condition_status = "False"
toleration = "1s"
[budgets]
budgets = [{{ nodes = "100%" }}]
"#
        ),
    )
    .unwrap();
    path
}

/// A controller child process named `identity` listening on `port` (0: a port it picks and logs),
/// logging JSON lines to
/// `<dir>/<identity>.log`.
fn spawn(dir: &Path, kubeconfig: &Path, identity: &str, port: u16) -> Child {
    let cfg = write_config(&dir.join(identity), port, identity);
    let log = std::fs::File::create(dir.join(format!("{identity}.log"))).unwrap();
    Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(["controller", "--config"])
        .arg(&cfg)
        .env("KUBECONFIG", kubeconfig)
        // JSON lines: the bound address is read from `controller listening` (support::controller_addr)
        .env("NODEKEEPER_LOG_FORMAT", "json")
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

fn ocid(node: &str) -> String {
    format!("ocid1.instance.oc1.phx.kill{node}")
}

/// An OCI preemption notice for `node` through the leader's OCI Events endpoint, delivered the
/// way OCI Notifications does: redelivered until the controller answers 2xx. Gives the node an
/// OCI provider ID first, and redelivers while the controller's Node cache does not map it yet
/// (answered 200 `ignored`).
async fn preempt_via_oci_events(c: &TestCluster, port: u16, node: &str) {
    let patch = serde_json::json!({"spec": {"providerID": format!("oci://{}", ocid(node))}});
    Api::<Node>::all(c.client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let body = nodekeeper_sim::oci_events::envelope(OciEventKind::Preemption, &ocid(node), "");
    let http = nodekeeper_core::http::client().unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let r = http
            .post(format!("http://127.0.0.1:{port}/v1/oci-events/{OCI_TOKEN}"))
            .json(&body)
            .send()
            .await;
        if let Ok(r) = r {
            let ok = r.status().is_success();
            let v: serde_json::Value = r.json().await.unwrap_or_default();
            if ok && v["node"] == node {
                return;
            }
        }
        assert!(Instant::now() < end, "OCI event for {node} never taken");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The agent of `node` as far as reporting goes: the agent's own reporter (queue, resend until
/// acknowledged, backoff), with a sim-minted token bound to `node`, reporting to `port` every
/// 300 ms. Returns the channel its notices go into.
async fn agent_reporter(
    c: &TestCluster,
    dir: &Path,
    port: u16,
    node: &str,
    stop: tokio_util::sync::CancellationToken,
) -> mpsc::Sender<NodeEvent> {
    let state = dir.join(format!("agent-{node}"));
    std::fs::create_dir_all(&state).unwrap();
    let token = state.join("token");
    std::fs::write(
        &token,
        ctl::token_for(c, node, "nodekeeper", "nodekeeper-agent").await,
    )
    .unwrap();
    let cfg = ReporterConfig {
        url: format!("http://127.0.0.1:{port}"),
        ca_file: None,
        server_name: None,
        token_file: token,
        heartbeat: Duration::from_millis(300),
        timeout: Duration::from_secs(5),
        backoff_max: Duration::from_millis(300),
        max_queued_events: 10,
        ..ReporterConfig::default()
    };
    let reporter = Reporter::new(cfg, &state).unwrap();
    let (rtx, rrx) = watch::channel(ctl::report(node, 0, &[]));
    let (etx, erx) = mpsc::channel(4);
    let (ctx, mut crx) = mpsc::channel(4);
    tokio::spawn(async move {
        let _keep = rtx;
        reporter.run(rrx, erx, ctx, stop).await;
    });
    tokio::spawn(async move { while crx.recv().await.is_some() {} });
    etx
}

/// Returns once the agent of `node` has no unacknowledged event (its persisted queue, polled
/// every millisecond).
async fn acknowledged(dir: &Path, node: &str) {
    let queue = dir.join(format!("agent-{node}")).join(EVENTS_FILE);
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let left = std::fs::read(&queue)
            .ok()
            .and_then(|b| serde_json::from_slice::<Vec<serde_json::Value>>(&b).ok());
        if left.is_some_and(|q| q.is_empty()) {
            return;
        }
        assert!(
            Instant::now() < end,
            "the notice of {node} never acknowledged"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A preemption notice as the agent's OCI metadata source emits it.
fn agent_notice(node: &str) -> NodeEvent {
    NodeEvent {
        version: 1,
        id: format!("oci-preemption-{node}"),
        kind: EventKind::Preemption,
        cloud: Some(Cloud::Oci),
        source: "oci-imds".into(),
        not_before: None,
        deadline: None,
        detected_at: chrono::Utc::now(),
        detail: BTreeMap::new(),
    }
}

/// What was seen of the preempted nodes over the run: tainted + cordoned with nodekeeper's
/// `interrupted` record; the workload pods (not DaemonSet pods, not terminating) still bound to
/// each, last sampled while the node existed.
#[derive(Default)]
struct Preempted {
    nodes: BTreeSet<String>,
    interrupted: BTreeSet<String>,
    pods_left: BTreeMap<String, usize>,
}

fn watch_preempted(c: &TestCluster) -> Arc<Mutex<Preempted>> {
    let seen: Arc<Mutex<Preempted>> = Arc::default();
    let s2 = seen.clone();
    let api: Api<Node> = Api::all(c.client.clone());
    tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default()).applied_objects();
        let mut stream = std::pin::pin!(stream);
        while let Some(Ok(n)) = stream.next().await {
            let marked = taint(&n, INTERRUPTION_TAINT).is_some()
                && unschedulable(&n)
                && annotation(&n, keys::STATE) == Some("interrupted");
            if let (true, Some(name)) = (marked, n.metadata.name) {
                s2.lock().unwrap().interrupted.insert(name);
            }
        }
    });
    let s3 = seen.clone();
    let client = c.client.clone();
    tokio::spawn(async move {
        loop {
            sample_pods(&client, &s3).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    seen
}

async fn sample_pods(client: &kube::Client, seen: &Mutex<Preempted>) {
    let watched = seen.lock().unwrap().nodes.clone();
    if watched.is_empty() {
        return;
    }
    let Ok(nodes) = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
    else {
        return;
    };
    let Ok(pods) = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await
    else {
        return;
    };
    let alive: BTreeSet<String> = nodes
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    let mut counts: BTreeMap<String, usize> = watched
        .intersection(&alive)
        .map(|n| (n.clone(), 0))
        .collect();
    for p in pods.items {
        let on = p.spec.as_ref().and_then(|s| s.node_name.clone());
        let daemon = p
            .metadata
            .owner_references
            .as_ref()
            .is_some_and(|o| o.iter().any(|r| r.kind == "DaemonSet"));
        if let Some(n) = on.and_then(|n| counts.get_mut(&n)) {
            if !daemon && p.metadata.deletion_timestamp.is_none() {
                *n += 1;
            }
        }
    }
    seen.lock().unwrap().pods_left.extend(counts);
}

async fn lease_holder(c: &TestCluster) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), "nodekeeper");
    leases
        .list(&ListParams::default())
        .await
        .ok()?
        .items
        .into_iter()
        .find_map(|l| l.spec?.holder_identity)
}

/// Recreates a (still idle) node as if created 10 minutes ago: the policy counts a node whose
/// Ready changed within 60 s of its creation as never Ready, and a restarted controller has no
/// memory of having seen it Ready (the sim keeps `creationTimestamp` on updates).
fn backdate(c: &TestCluster, node: &str) {
    let clock = &c.sim.store.clock;
    c.sim.store.txn(|t| {
        let old = t.remove(well_known::nodes(), "", node).unwrap();
        let mut obj = (*old).clone();
        for k in ["resourceVersion", "uid", "creationTimestamp"] {
            obj["metadata"].as_object_mut().unwrap().remove(k);
        }
        clock.rewind(Duration::from_secs(600));
        let r = t.create(well_known::nodes(), "", obj);
        clock.advance(Duration::from_secs(600));
        r.unwrap();
    });
}

/// Ready nodes of the pool nodekeeper does not act on.
async fn idle_ready_nodes(c: &TestCluster) -> Vec<String> {
    Api::<Node>::all(c.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|n| n.metadata.deletion_timestamp.is_none())
        .filter(|n| annotation(n, keys::STATE).is_none() && !unschedulable(n))
        .filter(|n| condition(n, "Ready").is_some_and(|c| c.status == "True"))
        .filter_map(|n| n.metadata.name)
        .collect()
}

/// Request ids seen on each NodeClaim (a watcher over the whole run).
fn watch_claims(c: &TestCluster) -> Arc<Mutex<BTreeMap<String, BTreeSet<String>>>> {
    let seen: Arc<Mutex<BTreeMap<String, BTreeSet<String>>>> = Arc::default();
    let s2 = seen.clone();
    let api: Api<DynamicObject> = Api::all_with(c.client.clone(), &nodeclaim_resource());
    tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default()).applied_objects();
        let mut stream = std::pin::pin!(stream);
        while let Some(Ok(o)) = stream.next().await {
            let name = o.metadata.name.clone().unwrap_or_default();
            let id = o
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(REQUEST_ANNOTATION))
                .cloned();
            let mut s = s2.lock().unwrap();
            let e = s.entry(name).or_default();
            e.extend(id);
        }
    });
    seen
}

/// Orphans: unschedulable without nodekeeper's record (or an admin's cordon: none here), or
/// the interruption taint without a state annotation.
fn orphans(nodes: &[Node]) -> Vec<String> {
    nodes
        .iter()
        .filter(|n| {
            let recorded = annotation(n, keys::STATE).is_some();
            (unschedulable(n) || taint(n, INTERRUPTION_TAINT).is_some()) && !recorded
        })
        .filter_map(|n| n.metadata.name.clone())
        .collect()
}

fn dump_logs(dir: &Path) {
    eprintln!("controller logs kept in {}", dir.display());
}

/// The kill schedule's seed unless `NODEKEEPER_KILL_SEED` chooses another: fixed, so a CI run
/// is repeatable.
const DEFAULT_SEED: u64 = 0x6e6b_6b69_6c6c;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_controller_loses_nothing_and_never_replaces_twice() {
    let trials: usize = std::env::var("NODEKEEPER_KILL_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let seed: u64 = std::env::var("NODEKEEPER_KILL_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_SEED);
    eprintln!("controller_kill: {trials} kills, seed {seed} (NODEKEEPER_KILL_SEED={seed} replays the schedule)");
    let mut rng = StdRng::seed_from_u64(seed);
    ctl::install_crypto();

    let c = cluster(1.0, scenario(), fast_loops()).await;
    let dir = std::env::temp_dir().join(format!("nk-controller-kill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    c.write_kubeconfig(&kubeconfig).unwrap();
    let claims = watch_claims(&c);
    let preempted = watch_preempted(&c);
    wait_until(Duration::from_secs(20), "web pods running", || async {
        let mut n = 0;
        for i in 0..POOL_SIZE {
            n += running_on(&c, &format!("{POOL}-{i}")).await;
        }
        n >= 4
    })
    .await;

    let mut failed: Vec<String> = Vec::new();
    let mut interrupted: Vec<String> = Vec::new();
    let (mut by_agent, mut by_oci) = (0, 0);
    let stop_agents = tokio_util::sync::CancellationToken::new();
    // The first controller binds port 0 and logs where; each later one listens there too (a new
    // process on the port its SIGKILLed predecessor held, as behind a Service).
    let mut port = 0;
    let started = Instant::now();
    for i in 0..=trials {
        let identity = format!("kill-{i}");
        std::fs::create_dir_all(dir.join(&identity)).unwrap();
        let mut child = spawn(&dir, &kubeconfig, &identity, port);
        if port == 0 {
            port = controller_addr(&dir.join(format!("{identity}.log")))
                .await
                .port();
        }
        let id2 = identity.clone();
        wait_until(Duration::from_secs(20), "the new controller leads", || {
            let (c, id) = (&c, id2.clone());
            async move { lease_holder(c).await.as_deref() == Some(id.as_str()) }
        })
        .await;
        if i == trials {
            // The survivor finishes everything.
            let res = finish(&c, &failed, &interrupted, &claims, &preempted).await;
            let _ = child.start_kill();
            let _ = child.wait().await;
            stop_agents.cancel();
            if res.is_err() {
                dump_logs(&dir);
            }
            res.unwrap();
            break;
        }
        // A failure or a preemption notice (from OCI Events or from the node's agent) on a
        // healthy node while at least 3 stay healthy; then a kill soon after.
        let mut kill_after = Duration::from_millis(rng.random_range(0..1500));
        if rng.random_bool(0.6) {
            let mut idle = idle_ready_nodes(&c).await;
            let healthy = idle.len();
            idle.retain(|n| !failed.contains(n) && !interrupted.contains(n));
            if healthy > 3 && !idle.is_empty() {
                let n = idle[rng.random_range(0..idle.len())].clone();
                match rng.random_range(0..3) {
                    0 => {
                        preempted.lock().unwrap().nodes.insert(n.clone());
                        // Answered 2xx only once the Node stores the notice.
                        preempt_via_oci_events(&c, port, &n).await;
                        interrupted.push(n);
                        by_oci += 1;
                    }
                    1 => {
                        preempted.lock().unwrap().nodes.insert(n.clone());
                        let agent = agent_reporter(&c, &dir, port, &n, stop_agents.clone()).await;
                        agent.send(agent_notice(&n)).await.unwrap();
                        if rng.random_bool(0.5) {
                            // Around the report's round trip: before, while and after it is stored.
                            kill_after = Duration::from_millis(rng.random_range(0..120));
                        } else {
                            // The moment the agent drops the notice from its queue (acknowledged).
                            acknowledged(&dir, &n).await;
                            kill_after = Duration::ZERO;
                        }
                        interrupted.push(n);
                        by_agent += 1;
                    }
                    _ => {
                        backdate(&c, &n);
                        pin_condition(&c, &n, "Ready", "False").await;
                        failed.push(n);
                    }
                }
            }
        }
        tokio::time::sleep(kill_after).await;
        let pid = child.id().unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let status = child.wait().await.unwrap();
        assert!(!status.success(), "{identity} exited on its own: {status}");
    }
    let mut without_event = Vec::new();
    for n in failed.iter().chain(&interrupted) {
        if !events_about(&c, n)
            .await
            .iter()
            .any(|(r, _)| r == "ReplacementRequested")
        {
            without_event.push(n.clone());
        }
    }
    eprintln!(
        "controller_kill: {trials} kills, {} failed and {} preempted nodes ({by_oci} via OCI Events, \
         {by_agent} via agent reports), all replaced once, in {:.1}s; \
         without a ReplacementRequested Event: {without_event:?}",
        failed.len(),
        interrupted.len(),
        started.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits for convergence; returns what is still wrong after the timeout.
async fn finish(
    c: &TestCluster,
    failed: &[String],
    interrupted: &[String],
    claims: &Mutex<BTreeMap<String, BTreeSet<String>>>,
    preempted: &Mutex<Preempted>,
) -> Result<(), String> {
    assert!(
        !failed.is_empty() || !interrupted.is_empty(),
        "no failure injected"
    );
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let mut problems = check(c, failed, interrupted, claims).await;
        problems.extend(check_preempted(interrupted, preempted));
        let done = problems.is_empty();
        if done {
            return Ok(());
        }
        if Instant::now() > end {
            return Err(format!("not converged: {problems:#?}"));
        }
        // Duplicates never heal: fail at once.
        if let Some(d) = problems.iter().find(|p| p.starts_with("duplicate")) {
            return Err(d.clone());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Everything that is not (yet) as it must end.
async fn check(
    c: &TestCluster,
    failed: &[String],
    interrupted: &[String],
    claims: &Mutex<BTreeMap<String, BTreeSet<String>>>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let nodes = Api::<Node>::all(c.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    for n in failed.iter().chain(interrupted) {
        let evs = events_about(c, n).await;
        let requested = evs
            .iter()
            .filter(|(r, _)| r == "ReplacementRequested")
            .count();
        if requested > 1 {
            problems.push(format!(
                "duplicate: {requested} ReplacementRequested for {n}"
            ));
        }
        if let Some(x) = nodes.iter().find(|x| x.metadata.name.as_deref() == Some(n)) {
            problems.push(format!(
                "{n} not replaced yet (created {:?}, Ready {:?}, annotations {:?})",
                x.metadata.creation_timestamp,
                condition(x, "Ready").map(|c| (c.status, c.last_transition_time)),
                x.metadata.annotations
            ));
        } else if claims.lock().unwrap().get(n).is_none_or(BTreeSet::is_empty) {
            // (The NodeClaim of a pool node has the node's name.)
            problems.push(format!(
                "{n} gone without nodekeeper's replacement request on its NodeClaim"
            ));
        }
    }
    for (claim, ids) in claims.lock().unwrap().iter() {
        if ids.len() > 1 {
            problems.push(format!("duplicate: NodeClaim {claim} request ids {ids:?}"));
        }
    }
    for o in orphans(&nodes) {
        problems.push(format!("orphan cordon/taint on {o}"));
    }
    let ready = nodes
        .iter()
        .filter(|n| condition(n, "Ready").is_some_and(|c| c.status == "True"))
        .filter(|n| !unschedulable(n))
        .count();
    if ready < POOL_SIZE {
        problems.push(format!(
            "{ready} of {POOL_SIZE} nodes Ready and schedulable"
        ));
    }
    let web_running = Api::<Pod>::namespaced(c.client.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count();
    if web_running < 4 {
        problems.push(format!("{web_running} of 4 web pods Running"));
    }
    problems
}

/// Every preempted node was seen tainted + cordoned as interrupted and left with no workload pod.
fn check_preempted(interrupted: &[String], preempted: &Mutex<Preempted>) -> Vec<String> {
    let p = preempted.lock().unwrap();
    let mut problems = Vec::new();
    for n in interrupted {
        if !p.interrupted.contains(n) {
            problems.push(format!("{n} never seen tainted + cordoned as interrupted"));
        }
        match p.pods_left.get(n) {
            Some(0) => {}
            Some(k) => problems.push(format!("{n}: {k} workload pods left (not drained)")),
            None => problems.push(format!("{n}: pods never sampled")),
        }
    }
    problems
}

#[test]
fn orphan_check_flags_unrecorded_cordons_and_taints_only() {
    let node = |name: &str, cordoned: bool, tainted: bool, state: bool| -> Node {
        let mut v =
            serde_json::json!({"metadata": {"name": name}, "spec": {"unschedulable": cordoned}});
        if tainted {
            v["spec"]["taints"] = serde_json::json!([{"key": INTERRUPTION_TAINT, "value": "preemption", "effect": "NoSchedule"}]);
        }
        if state {
            v["metadata"]["annotations"] = serde_json::json!({ (keys::STATE): "repairing" });
        }
        serde_json::from_value(v).unwrap()
    };
    let nodes = [
        node("cordoned-bare", true, false, false),
        node("tainted-bare", false, true, false),
        node("cordoned-recorded", true, true, true),
        node("idle", false, false, false),
    ];
    assert_eq!(orphans(&nodes), ["cordoned-bare", "tainted-bare"]);
}

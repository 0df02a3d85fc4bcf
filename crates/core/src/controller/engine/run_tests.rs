//! The run loop's timers on paused time: an engine over an empty Node cache and an apiserver
//! that is never reached; reconciles are counted through [`EngineMetrics::reconciles`].
#![allow(clippy::unwrap_used)]

use super::*;
use crate::controller::state::nodestate::{NodeStateConfig, NodeStates};
use crate::controller::{actions::ActorParts, events::Recorder, provider};

const MS: fn(u64) -> Duration = Duration::from_millis;

struct Running {
    engine: Arc<Engine>,
    leader: watch::Sender<bool>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    _events: broadcast::Sender<(String, NodeEvent)>,
}

impl Running {
    fn reconciles(&self) -> u64 {
        self.engine.metrics.reconciles.load(Ordering::Relaxed)
    }
    async fn stop(self) {
        self.cancel.cancel();
        self.task.await.unwrap();
    }
}

fn start(tick: Duration, debounce: Duration, leader: bool) -> Running {
    let svc = tower::service_fn(|_req: hyper::Request<kube::client::Body>| async {
        hyper::Response::builder()
            .status(404)
            .body(kube::client::Body::from(b"{}".to_vec()))
    });
    let client = kube::Client::new(svc, "default");
    let (store, _writer) = kube::runtime::reflector::store::<Node>();
    let cfg = EngineConfig {
        tick,
        debounce,
        ..EngineConfig::default()
    };
    let (leader_tx, leader_rx) = watch::channel(leader);
    let engine = engine(client, store, cfg, leader_rx.clone());
    let (events, events_rx) = broadcast::channel(8);
    let cancel = CancellationToken::new();
    let task = tokio::spawn(engine.clone().run(leader_rx, events_rx, cancel.clone()));
    Running {
        engine,
        leader: leader_tx,
        cancel,
        task,
        _events: events,
    }
}

/// An engine as the controller builds it, over `client` and the Node cache `store`.
fn engine(
    client: kube::Client,
    store: Store<Node>,
    cfg: EngineConfig,
    leader_rx: watch::Receiver<bool>,
) -> Arc<Engine> {
    engine_with(client, store, cfg, leader_rx, PolicyConfig::default())
}

/// [`engine`] with `policy`.
fn engine_with(
    client: kube::Client,
    store: Store<Node>,
    cfg: EngineConfig,
    leader_rx: watch::Receiver<bool>,
    policy: PolicyConfig,
) -> Arc<Engine> {
    engine_at(
        client,
        store,
        cfg,
        leader_rx,
        policy,
        Arc::new(SystemClock),
        None,
    )
}

/// [`engine_with`] on `clock`, with the notice lane `lane`.
fn engine_at(
    client: kube::Client,
    store: Store<Node>,
    cfg: EngineConfig,
    leader_rx: watch::Receiver<bool>,
    policy: PolicyConfig,
    clock: Arc<dyn Clock>,
    lane: Option<crate::controller::engine::notice_thread::Lane>,
) -> Arc<Engine> {
    let (metrics, wake) = (Arc::new(EngineMetrics::default()), Arc::new(Notify::new()));
    let drains = Arc::new(DrainTasks::new(
        client.clone(),
        cfg.clone(),
        clock.clone(),
        metrics.clone(),
        wake.clone(),
    ));
    let recorder = Recorder::new(client.clone(), "test", None);
    let states = NodeStates::new(
        NodeStateConfig::from(&crate::controller::config::ControllerConfig::default()),
        client.clone(),
        store.clone(),
        leader_rx,
        recorder.clone(),
    );
    let actor = Arc::new(Actor::new(ActorParts {
        client,
        urgent_client: lane.as_ref().map(|l| l.client.clone()),
        cache: store.clone(),
        recorder,
        provider: Arc::new(provider::none::NoReplacement),
        states,
        drains: drains.clone(),
        metrics: metrics.clone(),
        notifier: None,
    }));
    Engine::new(EngineParts {
        cfg,
        policy,
        clock,
        store,
        nodepools: None,
        actor,
        drains,
        metrics,
        wake,
        lane: lane.map(|l| l.handle),
    })
}

/// The API's answer to a PATCH of Node `name`.
fn node_answer(name: &str) -> Result<hyper::Response<kube::client::Body>, hyper::http::Error> {
    let node = serde_json::json!({ "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": name, "resourceVersion": "2" } });
    hyper::Response::builder()
        .status(200)
        .body(kube::client::Body::from(node.to_string().into_bytes()))
}

fn not_found() -> Result<hyper::Response<kube::client::Body>, hyper::http::Error> {
    hyper::Response::builder()
        .status(404)
        .body(kube::client::Body::from(b"{}".to_vec()))
}

/// A Ready node of the Karpenter NodePool `spot`, seen Ready long ago.
fn pool_node(name: &str) -> Node {
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "resourceVersion": "1",
            "creationTimestamp": "2026-12-01T00:00:00Z",
            "labels": { POOL_LABEL: "spot" },
            "annotations": { keys::SEEN_READY: "2026-12-01T00:01:00Z" } },
        "spec": { "providerID": format!("kwok://{name}") },
        "status": { "conditions": [{ "type": "Ready", "status": "True", "reason": "KubeletReady",
            "lastHeartbeatTime": "2026-12-01T00:01:00Z",
            "lastTransitionTime": "2026-12-01T00:01:00Z" }] }
    }))
    .unwrap()
}

/// The fast path after a preemption notice writes the Karpenter fence on the NodePool's other
/// node as soon as the notice's own patch is answered — not beside it (the cordon never shares
/// kube-apiserver with the fence's writes) nor a reconcile later — and counts both nodes as
/// acted on (so a reconcile whose view predates them skips them).
#[tokio::test(start_paused = true)]
async fn the_fast_path_fences_the_nodepool_once_the_cordon_is_answered() {
    type Seen = Arc<Mutex<Vec<(String, tokio::time::Instant)>>>;
    let seen: Seen = Default::default();
    let log = seen.clone();
    let svc = tower::service_fn(move |req: hyper::Request<kube::client::Body>| {
        let log = log.clone();
        async move {
            let at = tokio::time::Instant::now();
            let path = req.uri().path().to_string();
            let Some(name) = path.strip_prefix("/api/v1/nodes/") else {
                return not_found();
            };
            let name = name.to_string();
            lock(&log).push((format!("{} {name}", req.method()), at));
            if name == "p" {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            node_answer(&name)
        }
    });
    let client = kube::Client::new(svc, "default");
    let (store, mut writer) = kube::runtime::reflector::store::<Node>();
    for n in ["p", "q"] {
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(pool_node(n)));
    }
    let (_leader, leader_rx) = watch::channel(true);
    let engine = engine(client, store, EngineConfig::default(), leader_rx);
    let notice = preemption_notice();
    assert!(engine.add_notice("p", &notice));
    assert!(
        engine.fast_path("p", std::time::Instant::now()).await,
        "acted"
    );
    let seen = lock(&seen).clone();
    let at = |what: &str| {
        seen.iter()
            .find(|(w, _)| w == what)
            .map(|(_, at)| *at)
            .unwrap_or_else(|| panic!("no {what} in {seen:?}"))
    };
    assert_eq!(
        at("PATCH q"),
        at("PATCH p") + Duration::from_millis(300),
        "the fence was sent once the node's own patch was answered, not after its later steps: {seen:?}"
    );
    let touched = engine.order.acted_nodes();
    assert!(
        touched.iter().any(|n| n == "p") && touched.iter().any(|n| n == "q"),
        "{touched:?}"
    );
}

/// With the notice lane, the fast path runs on the lane's thread and the notice's own patch
/// goes through the lane's client; what follows (the node's Events and drain, the fence on
/// the NodePool's other node) through the controller's client, on its runtime: no request of
/// that client is sent from the lane.
#[tokio::test]
async fn on_the_notice_lane_the_cordon_goes_through_the_lanes_client() {
    type Seen = Arc<Mutex<Vec<(&'static str, String, Option<String>)>>>;
    let seen: Seen = Default::default();
    let api = |via: &'static str| {
        let log = seen.clone();
        tower::service_fn(move |req: hyper::Request<kube::client::Body>| {
            let log = log.clone();
            async move {
                let path = req.uri().path().to_string();
                let Some(name) = path.strip_prefix("/api/v1/nodes/") else {
                    return not_found();
                };
                let thread = std::thread::current().name().map(str::to_string);
                lock(&log).push((via, format!("{} {name}", req.method()), thread));
                node_answer(name)
            }
        })
    };
    let started = crate::controller::engine::notice_thread::NoticeLane::start(kube::Config::new(
        "https://127.0.0.1:1".parse().expect("a URI"),
    ))
    .await
    .expect("the lane");
    let handle = started.lane().handle;
    // Built on the lane's runtime, as the lane builds its own client.
    let lane_api = api("lane");
    let urgent = handle
        .spawn(async move { kube::Client::new(lane_api, "default") })
        .await
        .expect("the lane's client");
    let (store, mut writer) = kube::runtime::reflector::store::<Node>();
    for n in ["p", "q"] {
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(pool_node(n)));
    }
    let (_leader, leader_rx) = watch::channel(true);
    let engine = engine_at(
        kube::Client::new(api("shared"), "default"),
        store,
        EngineConfig::default(),
        leader_rx,
        PolicyConfig::default(),
        Arc::new(SystemClock),
        Some(crate::controller::engine::notice_thread::Lane {
            handle,
            client: urgent,
        }),
    );
    engine.renotice("p", &preemption_notice());
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    while !lock(&seen).iter().any(|(_, w, _)| w == "PATCH q") {
        assert!(
            tokio::time::Instant::now() < end,
            "no fence: {:?}",
            lock(&seen)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let seen = lock(&seen).clone();
    let lane = "nodekeeper-notices".to_string();
    assert!(
        seen.contains(&("lane", "PATCH p".into(), Some(lane.clone()))),
        "the cordon through the lane's client, on its thread: {seen:?}"
    );
    assert!(
        seen.iter()
            .filter(|(via, _, _)| *via == "shared")
            .all(|(_, _, t)| t.as_ref() != Some(&lane)),
        "the fence, the Events and the drain through the controller's client, on its runtime: {seen:?}"
    );
    assert!(
        !seen
            .iter()
            .any(|(via, w, _)| *via == "lane" && w != "PATCH p"),
        "only the notice's own patch on the lane: {seen:?}"
    );
}

/// Notices in two NodePools of 7 nodes each, at once: their fence writes (12 nodes) are at
/// most [`FENCE_WRITES`] in flight across both fast paths, none before the notified nodes'
/// own patches are answered, every node is fenced, and each notified node's own patch is sent
/// at once, never queued behind a fence.
#[tokio::test(start_paused = true)]
async fn the_fast_paths_fence_at_most_fence_writes_nodes_at_once() {
    let (client, seen) = counting_api(|n| !n.ends_with('0'), Duration::from_secs(1));
    let (store, mut writer) = kube::runtime::reflector::store::<Node>();
    for pool in ["a", "b"] {
        for i in 0..7 {
            let n = pool_node_in(&format!("{pool}{i}"), pool);
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(n));
        }
    }
    let (_leader, leader_rx) = watch::channel(true);
    // Only the Node writes of the fast paths and fences are counted: no drain conditions.
    let cfg = EngineConfig {
        lifecycle_conditions: false,
        ..EngineConfig::default()
    };
    let engine = engine(client, store, cfg, leader_rx);
    let notice = preemption_notice();
    let start = tokio::time::Instant::now();
    assert!(engine.add_notice("a0", &notice) && engine.add_notice("b0", &notice));
    let (a, b) = tokio::join!(
        engine.fast_path("a0", std::time::Instant::now()),
        engine.fast_path("b0", std::time::Instant::now())
    );
    assert!(a && b, "acted");
    let (sent, _, max) = lock(&seen).clone();
    assert!(
        max <= FENCE_WRITES,
        "{max} fence writes in flight at once: {sent:?}"
    );
    assert_eq!(max, FENCE_WRITES, "the fence used its permits: {sent:?}");
    let fences: Vec<_> = sent.iter().filter(|(n, _)| !n.ends_with('0')).collect();
    assert!(
        fences
            .iter()
            .all(|(_, at)| *at >= start + Duration::from_secs(1)),
        "no fence write before the own patches were answered: {sent:?}"
    );
    let fenced: BTreeSet<&str> = fences.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(fenced.len(), 12, "every other node fenced: {sent:?}");
    for own in ["a0", "b0"] {
        let at = sent.iter().find(|(n, _)| n == own).map(|(_, at)| *at);
        assert_eq!(
            at,
            Some(start),
            "{own}'s own patch was sent at once: {sent:?}"
        );
    }
}

/// A reconcile's round of one cordon and six fence-only nodes, with `node_concurrency` 2: the
/// cordon is sent at once although the fenced nodes come first (no fence holds a place it waits
/// for), the fence's writes wait until it is answered, at most [`FENCE_WRITES`] in flight.
#[tokio::test(start_paused = true)]
async fn a_reconciles_fence_writes_give_way_to_its_cordon() {
    let (client, seen) = counting_api(|n| n.starts_with('f'), Duration::from_millis(400));
    let (store, mut writer) = kube::runtime::reflector::store::<Node>();
    let names: Vec<String> = (0..6)
        .map(|i| format!("f{i}"))
        .chain(["z".into()])
        .collect();
    for n in &names {
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(pool_node(n)));
    }
    let (_leader, leader_rx) = watch::channel(true);
    let cfg = EngineConfig {
        node_concurrency: 2,
        ..EngineConfig::default()
    };
    let engine = engine(client, store, cfg, leader_rx);
    let mark = |key: &str, value: &str| Action::Annotate {
        key: key.into(),
        value: Some(value.into()),
    };
    let mut round: BTreeMap<String, Vec<Action>> = names[..6]
        .iter()
        .map(|n| {
            let marks = vec![
                mark(
                    keys::DO_NOT_DISRUPT_BY,
                    crate::controller::policy::fence::FENCE,
                ),
                mark(keys::KARPENTER_DO_NOT_DISRUPT, "true"),
            ];
            (n.clone(), marks)
        })
        .collect();
    round.insert("z".into(), vec![Action::Cordon]);
    let start = tokio::time::Instant::now();
    engine.act(round, engine.order.view()).await;
    let (sent, _, max) = lock(&seen).clone();
    let at = |n: &str| sent.iter().find(|(s, _)| s == n).map(|(_, at)| *at);
    assert_eq!(at("z"), Some(start), "the cordon at once: {sent:?}");
    for f in &names[..6] {
        let at = at(f).unwrap_or_else(|| panic!("{f} not fenced: {sent:?}"));
        assert!(
            at >= start + Duration::from_millis(400),
            "{f} before the cordon was answered: {sent:?}"
        );
    }
    assert_eq!(max, FENCE_WRITES, "{sent:?}");
}

/// The Node writes sent (node, when), and of those `is_fence` picks the most in flight at once.
type Counted = Arc<Mutex<(Vec<(String, tokio::time::Instant)>, usize, usize)>>;

/// An API that answers each Node PATCH after `delay`, recording it in [`Counted`].
fn counting_api(is_fence: fn(&str) -> bool, delay: Duration) -> (kube::Client, Counted) {
    let seen: Counted = Default::default();
    let log = seen.clone();
    let svc = tower::service_fn(move |req: hyper::Request<kube::client::Body>| {
        let log = log.clone();
        async move {
            let path = req.uri().path().to_string();
            let Some(name) = path.strip_prefix("/api/v1/nodes/") else {
                return not_found();
            };
            let name = name.to_string();
            let fence = is_fence(&name);
            {
                let mut l = lock(&log);
                l.0.push((name.clone(), tokio::time::Instant::now()));
                if fence {
                    l.1 += 1;
                    l.2 = l.2.max(l.1);
                }
            }
            tokio::time::sleep(delay).await;
            if fence {
                lock(&log).1 -= 1;
            }
            node_answer(&name)
        }
    });
    (kube::Client::new(svc, "default"), seen)
}

/// A preemption notice seen now, 2 minutes before the reclaim.
fn preemption_notice() -> NodeEvent {
    let now = Utc::now();
    NodeEvent {
        version: crate::wire::NODE_EVENT_VERSION,
        id: "ev1".into(),
        kind: crate::wire::EventKind::Preemption,
        cloud: None,
        source: "test".into(),
        not_before: Some(now + chrono::Duration::seconds(120)),
        deadline: None,
        detected_at: now,
        detail: Default::default(),
    }
}

/// `pool_node` in the NodePool `pool`.
fn pool_node_in(name: &str, pool: &str) -> Node {
    let mut n = pool_node(name);
    n.metadata.labels = Some([(POOL_LABEL.to_string(), pool.to_string())].into());
    n
}

/// A client whose API answers every PATCH of a Node with that Node (and anything else with
/// 404), and the `METHOD path` of each request it was sent.
fn recording_client() -> (kube::Client, Arc<Mutex<Vec<String>>>) {
    let seen: Arc<Mutex<Vec<String>>> = Default::default();
    let log = seen.clone();
    let svc = tower::service_fn(move |req: hyper::Request<kube::client::Body>| {
        let log = log.clone();
        async move {
            let path = req.uri().path().to_string();
            lock(&log).push(format!("{} {path}", req.method()));
            match path.strip_prefix("/api/v1/nodes/") {
                Some(name) => node_answer(name),
                None => not_found(),
            }
        }
    });
    (kube::Client::new(svc, "default"), seen)
}

/// `pool_node` in `pool`, `Ready=False` since long before the repair toleration.
fn failed_node(name: &str, pool: &str) -> Node {
    let mut n = pool_node_in(name, pool);
    if let Some(c) = n.status.as_mut().and_then(|s| s.conditions.as_mut()) {
        c[0].status = "False".into();
    }
    n
}

/// When a repair toleration expires, the due path decides the due node's group from that
/// group's nodes alone and writes the repair at once: the expired node of the due group is
/// patched; an expired node of another group is left to the full reconcile; the groups'
/// healthy nodes are read, not written. Groups holding most of the cluster are left to the
/// full reconcile.
#[tokio::test(start_paused = true)]
async fn the_due_path_starts_the_expired_repair_of_its_group_only() {
    let (client, seen) = recording_client();
    let (store, mut writer) = kube::runtime::reflector::store::<Node>();
    let mut nodes = vec![
        failed_node("due", "spot"),
        failed_node("elsewhere", "other"),
    ];
    nodes.extend((0..9).map(|i| pool_node(&format!("spot-{i}"))));
    nodes.extend((0..9).map(|i| pool_node_in(&format!("other-{i}"), "other")));
    for n in nodes {
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(n));
    }
    let (_leader, leader_rx) = watch::channel(true);
    let mut policy = PolicyConfig::default();
    policy.repair.policy = vec![crate::controller::policy::config::RepairPolicy {
        condition_type: "Ready".into(),
        condition_status: "False".into(),
        toleration: Duration::from_secs(600),
        ..Default::default()
    }];
    let engine = engine_with(client, store, EngineConfig::default(), leader_rx, policy);
    let decided = engine.due_path(&["spot".to_string()].into()).await;
    assert!(decided > 0, "the expired repair was decided");
    let requests = lock(&seen).clone();
    let patched: Vec<&String> = requests.iter().filter(|r| r.starts_with("PATCH")).collect();
    assert!(
        patched.iter().any(|r| r.ends_with("/nodes/due")),
        "the due node was written: {requests:?}"
    );
    assert!(
        patched.iter().all(|r| r.ends_with("/nodes/due")),
        "only the due node was written: {requests:?}"
    );
    assert_eq!(engine.metrics.due_paths.load(Ordering::Relaxed), 1);
    assert_eq!(engine.metrics.reconciles.load(Ordering::Relaxed), 0);
    // Groups holding most of the cluster are left to the full reconcile.
    let groups = ["spot".to_string(), "other".to_string()].into();
    assert_eq!(engine.due_path(&groups).await, 0);
    assert_eq!(engine.metrics.due_paths.load(Ordering::Relaxed), 1);
    assert!(
        !lock(&seen).iter().any(|r| r.ends_with("/nodes/elsewhere")),
        "{seen:?}"
    );
}

/// A reconcile that would still be running when a repair toleration expires is held until
/// the expiry, where the due path runs first: with reconciles taking long (here set to 20 s,
/// so the window is the 1 s tick), the tick half a second before the expiry starts
/// nothing, and the expiry runs the due path (writing the due node) and then the reconcile.
/// With reconciles as quick as they are here, the same tick reconciles.
#[tokio::test(start_paused = true)]
async fn a_reconcile_that_would_run_past_the_expiry_waits_for_it() {
    for slow in [true, false] {
        let (client, seen) = recording_client();
        let (store, mut writer) = kube::runtime::reflector::store::<Node>();
        // The due node's group is a third of the cluster (a due path is taken for no more
        // than half).
        let mut nodes = vec![failed_node("due", "spot"), pool_node("spot-0")];
        nodes.extend((0..4).map(|i| pool_node_in(&format!("other-{i}"), "other")));
        for n in nodes {
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(n));
        }
        // Ready=False since 00:01:00 (`failed_node`); the clock starts at 00:10:00, so a
        // toleration of 9 min 10.5 s expires 10.5 s after the start.
        let mut policy = PolicyConfig::default();
        policy.repair.policy = vec![crate::controller::policy::config::RepairPolicy {
            condition_type: "Ready".into(),
            condition_status: "False".into(),
            toleration: Duration::from_millis(550_500),
            ..Default::default()
        }];
        let t0 = tokio::time::Instant::now();
        let clock = super::wake_tests::Paused {
            base: "2026-12-01T00:10:00Z".parse().unwrap(),
            t0,
            speed: 1,
        };
        let cfg = EngineConfig {
            tick: Duration::from_secs(1),
            ..EngineConfig::default()
        };
        let (leader, leader_rx) = watch::channel(true);
        let engine = engine_at(
            client,
            store,
            cfg,
            leader_rx.clone(),
            policy,
            Arc::new(clock),
            None,
        );
        let (_events, events_rx) = broadcast::channel(8);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(engine.clone().run(leader_rx, events_rx, cancel.clone()));
        let m = &engine.metrics;
        tokio::time::sleep_until(t0 + MS(9_500)).await;
        assert_eq!(
            m.reconciles.load(Ordering::Relaxed),
            10,
            "the start and 9 ticks"
        );
        if slow {
            engine.reconcile_us.store(20_000_000, Ordering::Relaxed);
        }
        tokio::time::sleep_until(t0 + MS(10_400)).await;
        let (reconciles, held) = if slow { (10, 1) } else { (11, 0) };
        assert_eq!(
            m.reconciles.load(Ordering::Relaxed),
            reconciles,
            "slow {slow}"
        );
        assert_eq!(
            m.reconciles_held.load(Ordering::Relaxed),
            held,
            "slow {slow}"
        );
        assert!(
            !lock(&seen).iter().any(|r| r.starts_with("PATCH")),
            "{seen:?}"
        );
        // The due path and the reconcile run on blocking threads, in real time, while paused
        // time runs on: wait for them in 1 ms steps, before the next tick.
        while m.reconciles.load(Ordering::Relaxed) == reconciles
            && tokio::time::Instant::now() < t0 + MS(10_900)
        {
            tokio::time::sleep(MS(1)).await;
        }
        assert_eq!(m.due_paths.load(Ordering::Relaxed), 1, "slow {slow}");
        assert_eq!(
            m.reconciles.load(Ordering::Relaxed),
            reconciles + 1,
            "slow {slow}"
        );
        assert!(
            lock(&seen).iter().any(|r| r == "PATCH /api/v1/nodes/due"),
            "{seen:?}"
        );
        cancel.cancel();
        task.await.unwrap();
        drop(leader);
    }
}

/// One reconcile at start and one per tick (observed 1 ms after it: the reconcile runs
/// on a blocking thread at the tick's instant).
#[tokio::test(start_paused = true)]
async fn the_leader_reconciles_once_per_tick() {
    let t0 = tokio::time::Instant::now();
    let r = start(Duration::from_secs(1), MS(20), true);
    for (at, want) in [(1, 1), (999, 1), (1_001, 2), (4_999, 5), (5_001, 6)] {
        tokio::time::sleep_until(t0 + MS(at)).await;
        assert_eq!(r.reconciles(), want, "at {at} ms");
    }
    let m = &r.engine.metrics;
    assert_eq!(
        m.wake_count(Wake::Tick),
        6,
        "each reconcile woken by its tick"
    );
    assert_eq!(m.wake_count(Wake::Change), 0);
    r.stop().await;
}

/// A change (wake) is reconciled after the debounce's quiet time. Changes during the quiet
/// time leave one pending wake (a `Notify` permit), so three changes make two reconciles,
/// the second one debounce later; then nothing until the next tick.
#[tokio::test(start_paused = true)]
async fn changes_are_debounced_and_coalesced() {
    let t0 = tokio::time::Instant::now();
    let r = start(Duration::from_secs(60), MS(20), true);
    tokio::time::sleep_until(t0 + MS(300)).await;
    assert_eq!(r.reconciles(), 1, "the start");
    for _ in 0..3 {
        r.engine.wake.notify_one();
        tokio::time::sleep(MS(5)).await;
    }
    for (at, want) in [
        (319, 1),
        (321, 2),
        (339, 2),
        (341, 3),
        (59_999, 3),
        (60_001, 4),
    ] {
        tokio::time::sleep_until(t0 + MS(at)).await;
        assert_eq!(r.reconciles(), want, "at {at} ms");
    }
    let m = &r.engine.metrics;
    assert_eq!(
        (m.wake_count(Wake::Tick), m.wake_count(Wake::Change)),
        (2, 2)
    );
    r.stop().await;
}

/// A follower never reconciles, whatever the ticks; leadership gained is acted on at once.
#[tokio::test(start_paused = true)]
async fn a_follower_does_not_reconcile_until_it_leads() {
    let t0 = tokio::time::Instant::now();
    let r = start(Duration::from_secs(1), MS(20), false);
    r.engine.wake.notify_one();
    tokio::time::sleep_until(t0 + MS(10_500)).await;
    assert_eq!(r.reconciles(), 0);
    r.leader.send(true).unwrap();
    tokio::time::sleep_until(t0 + MS(10_501)).await;
    assert_eq!(
        r.reconciles(),
        1,
        "on the leadership change, not at the next tick"
    );
    r.stop().await;
}

//! How the controller's actor writes a Node's taints, as the shipped controller ServiceAccount: the
//! patch is computed from the copy of the Node the controller holds (its watch cache, or its last
//! patch's answer) and conditioned on that copy's resourceVersion. When someone else changed the
//! Node since (here: another taint), kube-apiserver refuses it with 409; the actor re-reads the Node,
//! recomputes and writes again, keeping the other writer's taint. When the copy is current, the
//! first patch lands (no re-read, no conflict).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{reflector, watcher};
use nodekeeper_core::controller::act::actions::{Actor, ActorParts};
use nodekeeper_core::controller::act::drain::tasks::DrainTasks;
use nodekeeper_core::controller::act::provider::none::NoReplacement;
use nodekeeper_core::controller::cluster::events::Recorder;
use nodekeeper_core::controller::config::{ControllerConfig, EngineConfig};
use nodekeeper_core::controller::metrics::EngineMetrics;
use nodekeeper_core::controller::policy::Action;
use nodekeeper_core::controller::state::nodestate::{NodeStateConfig, NodeStates};
use serde_json::json;

use crate::support::*;
use nodekeeper_core::controller::policy::view::keys;

const NODE: &str = "nw-0";
/// Not the interruption taint: other tests' controllers share the real cluster, and their engines
/// remove a leftover interruption taint from a node they are not acting on (the policy's
/// cleanup of orphans), which a CI run saw between this test's write and its read.
const OURS: &str = "nodekeeper.io/node-write-test";
const THEIRS: &str = "example.com/theirs";
/// kube-controller-manager's taint on a cordoned node (written here from its documentation).
const KUBE_UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";

/// An actor as the controller builds it, as the controller's ServiceAccount, with its Node cache (fed
/// by the test, as the controller's watch would).
async fn actor(
    c: &'static Cluster,
) -> (
    Arc<Actor>,
    reflector::store::Writer<Node>,
    Arc<EngineMetrics>,
) {
    let client = controller_client(c).await;
    let (cache, writer) = reflector::store::<Node>();
    let metrics = Arc::new(EngineMetrics::default());
    let clock: Arc<dyn nodekeeper_core::controller::clock::Clock> =
        Arc::new(nodekeeper_core::controller::clock::SystemClock);
    let wake = Arc::new(tokio::sync::Notify::new());
    let drains = Arc::new(DrainTasks::new(
        client.clone(),
        EngineConfig::default(),
        clock,
        metrics.clone(),
        wake,
    ));
    let recorder = Recorder::new(client.clone(), "node-write-test", None);
    let (_leader, leader_rx) = tokio::sync::watch::channel(true);
    let states = NodeStates::new(
        NodeStateConfig::from(&ControllerConfig::default()),
        client.clone(),
        cache.clone(),
        leader_rx,
        recorder.clone(),
    );
    let actor = Arc::new(Actor::new(ActorParts {
        client,
        urgent_client: None,
        cache,
        recorder,
        provider: Arc::new(NoReplacement),
        states,
        drains,
        metrics: metrics.clone(),
        notifier: None,
    }));
    (actor, writer, metrics)
}

/// The Node's taint keys, sorted.
fn taint_keys(n: &Node) -> Vec<String> {
    let mut keys: Vec<String> = n
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .map(|t| t.key.clone())
        .collect();
    keys.sort();
    keys
}

/// The Node once its resourceVersion has stayed the same for a second (KWOK and
/// kube-controller-manager done with it).
async fn settled(nodes: &Api<Node>) -> Node {
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut last = nodes.get(NODE).await.unwrap();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = nodes.get(NODE).await.unwrap();
        if now.metadata.resource_version == last.metadata.resource_version {
            return now;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "{NODE} still written after 30 s"
        );
        last = now;
    }
}

on_both!(a_taint_patch_from_a_stale_copy_is_refused_then_redone_keeping_the_other_writers_taint);
async fn a_taint_patch_from_a_stale_copy_is_refused_then_redone_keeping_the_other_writers_taint(
    c: &'static Cluster,
) {
    init_tracing();
    // Marked seen-ready already, so that the engines of other tests on this cluster do not write it
    // (they stamp young Ready nodes) while this one counts conflicts.
    let mut node = kwok_node(NODE, json!({}));
    node.metadata
        .annotations
        .get_or_insert_default()
        .insert(keys::SEEN_READY.into(), "true".into());
    let _nodes = c.create_nodes(&[node]).await;
    let admin = c.admin().await;
    let nodes: Api<Node> = Api::all(admin);
    // The copy the controller holds, then another writer's taint it has not seen.
    let stale = nodes.get(NODE).await.unwrap();
    nodes
        .patch(
            NODE,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "taints": [
                { "key": THEIRS, "value": "x", "effect": "NoSchedule" } ] } })),
        )
        .await
        .unwrap();
    let (actor, mut cache, metrics) = actor(c).await;
    cache.apply_watcher_event(&watcher::Event::Apply(stale));
    let interrupt = [
        Action::Taint {
            key: OURS.into(),
            value: "test".into(),
            effect: "NoSchedule".into(),
        },
        Action::Cordon,
    ];
    actor.execute(NODE, &interrupt, false).await.unwrap();
    let conflicts = metrics.node_write_conflicts.load(Ordering::Relaxed);
    assert!(
        conflicts >= 1,
        "the patch from the stale copy was refused ({conflicts} conflicts)"
    );
    // kube-controller-manager taints a cordoned node `node.kubernetes.io/unschedulable` (the sim's
    // lifecycle loop too): a third writer's taint, which the next write must keep as well.
    let cordoned = wait_for(
        Duration::from_secs(30),
        "kube's unschedulable taint on the cordoned node",
        || {
            let nodes = nodes.clone();
            async move {
                let n = nodes.get(NODE).await.ok()?;
                taint_keys(&n)
                    .contains(&KUBE_UNSCHEDULABLE.to_string())
                    .then_some(n)
            }
        },
    )
    .await;
    assert_eq!(
        taint_keys(&cordoned),
        vec![
            THEIRS.to_string(),
            KUBE_UNSCHEDULABLE.to_string(),
            OURS.to_string()
        ]
    );
    assert_eq!(
        cordoned.spec.as_ref().and_then(|s| s.unschedulable),
        Some(true)
    );

    // The watch delivers the Node once no one writes it any more: the actor's copy is current,
    // and removing its taint is one patch, without a conflict.
    cache.apply_watcher_event(&watcher::Event::Apply(settled(&nodes).await));
    actor
        .execute(NODE, &[Action::Untaint { key: OURS.into() }], false)
        .await
        .unwrap();
    let n = nodes.get(NODE).await.unwrap();
    assert_eq!(
        taint_keys(&n),
        vec![THEIRS.to_string(), KUBE_UNSCHEDULABLE.to_string()]
    );
    assert_eq!(
        metrics.node_write_conflicts.load(Ordering::Relaxed),
        conflicts,
        "a patch from a current copy lands at once"
    );
}

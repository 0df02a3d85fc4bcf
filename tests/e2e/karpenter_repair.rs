//! nodekeeper beside Karpenter v1.15's NodeRepair (`--karpenter-feature-gates NodeRepair=true`, on a
//! control plane of its own: [`karpenter_repair_cluster`]): both repair a node on `KWOKUnhealthy=True`
//! (the KWOK provider's repair policy: 30 s toleration, 45 s termination grace period, ReplaceNode;
//! `kwok/cloudprovider/cloudprovider.go`, `RepairPolicies`), and only one of them does.
//! - nodekeeper first (its toleration 1 s): it marks the node `karpenter.sh/do-not-repair` as its own;
//!   Karpenter's repair finds the node eligible and stands back, saying why (its `DisruptionBlocked`
//!   Event naming the annotation); nodekeeper drains (a PDB holds the drain until Karpenter has said
//!   so) with its replacement pre-spun as the drain started, then hands the node over.
//! - Karpenter first (nodekeeper's toleration 10 min): Karpenter taints the node
//!   `karpenter.sh/disrupted`, pre-spins a replacement and terminates the node; nodekeeper stands
//!   back, saying why (`NodekeeperHeld` `BlockedByKarpenter`, its Event, `nodekeeper status`).
//!
//! In both: nodekeeper's state, cordon or mark only in the first; Karpenter's taint never on the node
//! before nodekeeper's hand-over in the first; no `Evicted` Event of Karpenter's for the app's pods
//! in the first (one drain, nodekeeper's); exactly one NodeClaim added to the NodePool (one
//! replacement) — watched every 200 ms from the fault to the end. Real only (the sim has no
//! Karpenter); one test at a time on the cluster.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, Patch, PatchParams};
use nodekeeper_core::controller::policy::view::{keys, KARPENTER_DISRUPTED_TAINT};
use serde_json::json;

use crate::karpenter::{
    both_running_elsewhere, claim_of, claims_of_pool, finish, gone, karpenter_controller_toml_with,
    karpenter_evictions, no_eviction_pdb, nodeclaims, pool_with_two_pods, twins,
};
use crate::support::*;

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Every reason's budget 100 %; empty nodes consolidated only after 5 min: Karpenter pre-spins its
/// repair's replacement, which stays empty while its drain waits out the PDB for the 45 s grace
/// period — with `consolidateAfter: 30s` Karpenter consolidated it away and then provisioned a second
/// one for the evicted pod (Karpenter's own doing, seen in a trial run).
const DISRUPTION: &str =
    r#"{consolidationPolicy: WhenEmpty, consolidateAfter: 5m, budgets: [{nodes: "100%"}]}"#;
/// The finalizer that keeps the Karpenter-first victim's Node until the test has read nodekeeper's
/// hold (Karpenter may otherwise remove it within a second of deleting its NodeClaim).
const KEEP: &str = "nodekeeper.test/keep";

/// What the watcher saw, from the fault on.
#[derive(Debug, Default)]
struct Seen {
    /// Every NodeClaim of the NodePool.
    claims: BTreeSet<String>,
    /// `nodekeeper.io/state` values on the victim.
    states: BTreeSet<String>,
    /// nodekeeper's cordon record on the victim.
    cordoned_by_nodekeeper: bool,
    /// nodekeeper's own `karpenter.sh/do-not-repair` on the victim.
    marked_by_nodekeeper: bool,
    /// Karpenter's taint on the victim while nodekeeper had not handed it over.
    karpenter_taint_before_handover: bool,
    /// Karpenter's taint on the victim at all.
    karpenter_tainted: bool,
}

/// Lists the NodePool's NodeClaims and reads the victim every 200 ms into [`Seen`]; stops when the
/// returned set is dropped.
fn watch(
    admin: &kube::Client,
    pool: &str,
    victim: &str,
) -> (tokio::task::JoinSet<()>, Arc<Mutex<Seen>>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (claims, nodes): (Api<kube::core::DynamicObject>, Api<Node>) =
        (nodeclaims(admin), Api::all(admin.clone()));
    let (lp, victim, out) = (
        ListParams::default().labels(&format!("karpenter.sh/nodepool={pool}")),
        victim.to_string(),
        seen.clone(),
    );
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(async move {
        loop {
            let names: Vec<String> = claims
                .list(&lp)
                .await
                .map(|l| {
                    l.items
                        .into_iter()
                        .filter_map(|c| c.metadata.name)
                        .collect()
                })
                .unwrap_or_default();
            let node = nodes.get_opt(&victim).await.ok().flatten();
            {
                let mut s = out.lock().unwrap();
                s.claims.extend(names);
                if let Some(n) = &node {
                    if let Some(st) = annotation(n, keys::STATE) {
                        s.states.insert(st.to_string());
                    }
                    s.cordoned_by_nodekeeper |= annotation(n, keys::CORDONED_BY).is_some();
                    s.marked_by_nodekeeper |= annotation(n, keys::DO_NOT_REPAIR_BY).is_some();
                    let tainted = has_taint(n, KARPENTER_DISRUPTED_TAINT);
                    s.karpenter_tainted |= tainted;
                    s.karpenter_taint_before_handover |=
                        tainted && annotation(n, keys::RETIRE_REQUESTED).is_none();
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    (tasks, seen)
}

/// The victim's node-monitoring agent reports `KWOKUnhealthy=True` (the KWOK provider's simulated
/// fault); KWOK keeps the node Ready (its Lease) and, for the label, leaves the conditions alone.
async fn kwok_unhealthy(nodes: &Api<Node>, victim: &str) {
    let label =
        json!({ "metadata": { "labels": { "nodekeeper.test/kubelet": "kwok-unhealthy" } } });
    nodes
        .patch(victim, &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let status = json!({ "status": { "conditions": [{
        "type": "KWOKUnhealthy", "status": "True", "reason": "SimulatedFault",
        "message": "a fault both nodekeeper and Karpenter repair on",
        "lastHeartbeatTime": now, "lastTransitionTime": now
    }] } });
    nodes
        .patch_status(victim, &PatchParams::default(), &Patch::Strategic(&status))
        .await
        .unwrap();
}

/// nodekeeper's controller (provider `karpenter`) repairing `KWOKUnhealthy=True` after `toleration`,
/// with a drain bound longer than the test. The condition is the KWOK provider's, which nodekeeper
/// cannot see clear: the operator trusts it for the replacement (`allow_destructive`).
fn config(dir: &std::path::Path, identity: &str, toleration: &str) -> std::path::PathBuf {
    karpenter_controller_toml_with(
        dir,
        identity,
        &format!(
            "condition_type = \"KWOKUnhealthy\"\ncondition_status = \"True\"\ntoleration = \"{toleration}\"\nallow_destructive = true"
        ),
        |t| {
            t["repair"]
                .as_table_mut()
                .unwrap()
                .insert("drain_timeout".into(), "30m".into());
        },
    )
}

/// The messages of the core/v1 Events of `reason` about Node `node`.
async fn node_events(admin: &kube::Client, reason: &str, node: &str) -> Vec<String> {
    let events: Api<Event> = Api::all(admin.clone());
    events
        .list(&ListParams::default().fields(&format!(
            "reason={reason},involvedObject.kind=Node,involvedObject.name={node}"
        )))
        .await
        .map(|l| l.items.into_iter().filter_map(|e| e.message).collect())
        .unwrap_or_default()
}

/// A test's start: a NodePool `pool` of two nodes, each running one pod of `app` behind a PDB that
/// allows no eviction. The cluster, its admin, the pods of `default`, the Nodes, the victim (the first
/// node), its NodeClaim and the NodePool's NodeClaims before the fault.
type Scene = (
    &'static Cluster,
    kube::Client,
    Api<Pod>,
    Api<Node>,
    String,
    String,
    BTreeSet<String>,
);

async fn scene(pool: &str, app: &str) -> Scene {
    init_tracing();
    let c = karpenter_repair_cluster();
    let admin = c.admin().await;
    let pods = Api::namespaced(admin.clone(), "default");
    let hosts = pool_with_two_pods(c, &pods, pool, app, DISRUPTION, &no_eviction_pdb(app)).await;
    let victim = hosts[0].clone();
    let claim = claim_of(&admin, &victim).await;
    let before = claims_of_pool(&admin, pool).await;
    let nodes = Api::all(admin.clone());
    (c, admin, pods, nodes, victim, claim, before)
}

const FIRST_POOL: &str = "nk-kr-first";
const FIRST_APP: &str = "nk-kr-first-app";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodekeeper_repairs_first_and_karpenters_node_repair_stands_back() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (c, admin, pods, nodes, victim, claim, before) = scene(FIRST_POOL, FIRST_APP).await;

    let dir = tempfile::tempdir().unwrap();
    let ctl = ControllerProc::start(c, &config(dir.path(), "kr-first", "1s"), "kr-first").await;
    crate::repair::seen_ready(&nodes, &[victim.as_str()]).await;
    let (watcher, seen) = watch(&admin, FIRST_POOL, &victim);
    kwok_unhealthy(&nodes, &victim).await;

    // nodekeeper repairs at once, and marks the node karpenter.sh/do-not-repair as its own.
    wait_until(
        Duration::from_secs(60),
        "the victim repairing, marked do-not-repair by nodekeeper",
        || {
            let (nodes, victim) = (nodes.clone(), victim.clone());
            async move {
                nodes.get(&victim).await.is_ok_and(|n| {
                    annotation(&n, keys::STATE) == Some("repairing")
                        && annotation(&n, keys::KARPENTER_DO_NOT_REPAIR) == Some("true")
                        && annotation(&n, keys::DO_NOT_REPAIR_BY) == Some(keys::OWNER)
                })
            }
        },
    )
    .await;
    // Karpenter's repair finds the node past its 30 s toleration and stands back, saying why. (Its
    // recorder keeps one DisruptionBlocked per node for 2 min whatever the message, and its
    // consolidation reports nodekeeper's do-not-disrupt first: about 2 min.)
    let said = wait_for(
        Duration::from_secs(300),
        "Karpenter's DisruptionBlocked naming karpenter.sh/do-not-repair",
        || {
            let (admin, victim) = (admin.clone(), victim.clone());
            async move {
                node_events(&admin, "DisruptionBlocked", &victim)
                    .await
                    .into_iter()
                    .find(|m| m.contains(keys::KARPENTER_DO_NOT_REPAIR))
            }
        },
    )
    .await;
    eprintln!("Karpenter on {victim}: {said}");
    {
        let s = seen.lock().unwrap();
        assert!(
            !s.karpenter_tainted && s.marked_by_nodekeeper,
            "Karpenter chose the node: {s:?}"
        );
    }
    // The PDB goes: nodekeeper's drain evicts the pod onto the pre-spun replacement, nodekeeper hands
    // the node over (deletes its NodeClaim) and Karpenter terminates it.
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(admin.clone(), "default");
    pdbs.delete(FIRST_APP, &Default::default()).await.unwrap();
    gone(&admin, &victim, &claim).await;
    both_running_elsewhere(&pods, FIRST_APP, &victim).await;
    drop(watcher);

    let evicted = karpenter_evictions(&admin, FIRST_APP).await;
    assert!(evicted.is_empty(), "Karpenter evicted too: {evicted:?}");
    let s = std::mem::take(&mut *seen.lock().unwrap());
    eprintln!("seen: {s:?}");
    assert!(s.states.contains("repairing"), "{s:?}");
    assert!(
        !s.karpenter_taint_before_handover,
        "Karpenter disrupted the node nodekeeper was repairing: {s:?}"
    );
    let added: Vec<&String> = s.claims.difference(&before).collect();
    assert_eq!(added.len(), 1, "one replacement: {added:?}");
    // nodekeeper's, pre-spun as its drain started (`[repair] prespin`), not one Karpenter
    // provisioned for the evicted pod.
    let twins = twins(&admin, &victim).await;
    assert_eq!(
        added,
        twins.iter().collect::<Vec<_>>(),
        "the replacement is nodekeeper's"
    );
    finish(ctl, c, "deployment", FIRST_APP, FIRST_POOL).await;
}

const SECOND_POOL: &str = "nk-kr-second";
const SECOND_APP: &str = "nk-kr-second-app";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn karpenter_repairs_first_and_nodekeeper_stands_back_saying_why() {
    let _one = ONE_AT_A_TIME.lock().await;
    // The PDB makes Karpenter's drain wait for its 45 s grace period.
    let (c, admin, pods, nodes, victim, claim, before) = scene(SECOND_POOL, SECOND_APP).await;
    wait_until(
        Duration::from_secs(10),
        "the test's finalizer on the victim",
        || {
            let (nodes, victim) = (nodes.clone(), victim.clone());
            async move {
                let Ok(mut n) = nodes.get(&victim).await else {
                    return false;
                };
                n.metadata
                    .finalizers
                    .get_or_insert_with(Vec::new)
                    .push(KEEP.into());
                // A conflict with another writer: read again.
                nodes
                    .replace(&victim, &Default::default(), &n)
                    .await
                    .is_ok()
            }
        },
    )
    .await;

    // nodekeeper tolerates the fault 10 min: Karpenter (30 s) comes first.
    let dir = tempfile::tempdir().unwrap();
    let ctl = ControllerProc::start(c, &config(dir.path(), "kr-second", "10m"), "kr-second").await;
    crate::repair::seen_ready(&nodes, &[victim.as_str()]).await;
    let (watcher, seen) = watch(&admin, SECOND_POOL, &victim);
    kwok_unhealthy(&nodes, &victim).await;

    // Karpenter chooses the node (its taint before it pre-spins the replacement); nodekeeper stands
    // back and says why: the hold's condition, its Event, `nodekeeper status`.
    let held = wait_for(
        Duration::from_secs(300),
        "Karpenter's taint on the victim and nodekeeper's BlockedByKarpenter hold",
        || {
            let (nodes, victim) = (nodes.clone(), victim.clone());
            async move {
                let n = nodes.get(&victim).await.ok()?;
                let tainted = has_taint(&n, KARPENTER_DISRUPTED_TAINT);
                let held = condition(&n, "NodekeeperHeld")?;
                (tainted
                    && held.status == "True"
                    && held.reason.as_deref() == Some("BlockedByKarpenter"))
                .then(|| held.message.unwrap_or_default())
            }
        },
    )
    .await;
    assert!(held.contains(KARPENTER_DISRUPTED_TAINT), "{held}");
    wait_until(
        Duration::from_secs(30),
        "nodekeeper's BlockedByKarpenter Event about the victim",
        || {
            let (admin, victim) = (admin.clone(), victim.clone());
            async move {
                !node_events(&admin, "BlockedByKarpenter", &victim)
                    .await
                    .is_empty()
            }
        },
    )
    .await;
    let text = crate::repair::status_rows(c, &admin, dir.path(), SECOND_POOL).await;
    let row = text
        .lines()
        .find(|l| l.starts_with(victim.as_str()))
        .unwrap_or_else(|| panic!("a row for {victim}: {text}"));
    assert!(row.contains("Karpenter is disrupting it"), "{row}");

    // Karpenter terminates the node (its finalizer goes; the test's keeps the Node until now).
    wait_until(
        Duration::from_secs(180),
        "Karpenter done with the victim (only the test's finalizer left)",
        || {
            let (nodes, victim) = (nodes.clone(), victim.clone());
            async move {
                nodes.get(&victim).await.is_ok_and(|n| {
                    n.metadata.deletion_timestamp.is_some()
                        && n.metadata.finalizers.as_deref() == Some(&[KEEP.to_string()][..])
                })
            }
        },
    )
    .await;
    nodes
        .patch(
            &victim,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
        )
        .await
        .unwrap();
    gone(&admin, &victim, &claim).await;
    both_running_elsewhere(&pods, SECOND_APP, &victim).await;
    drop(watcher);

    let s = std::mem::take(&mut *seen.lock().unwrap());
    eprintln!("seen: {s:?}");
    assert!(
        s.states.is_empty() && !s.cordoned_by_nodekeeper && !s.marked_by_nodekeeper,
        "nodekeeper acted on the node Karpenter repairs: {s:?}"
    );
    let added: Vec<&String> = s.claims.difference(&before).collect();
    assert_eq!(added.len(), 1, "one replacement: {added:?}");
    finish(ctl, c, "deployment", SECOND_APP, SECOND_POOL).await;
}

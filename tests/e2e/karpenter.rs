//! The real Karpenter (its KWOK provider, `scripts/k8s-cluster.sh up DIR --karpenter`) on a control plane of
//! its own, as its chart's RBAC:
//! - a Deployment whose pods fit no existing node → Karpenter creates a NodeClaim and a KWOK Node, the
//!   Node becomes Ready and the pods are scheduled there; scaled to 0, the empty node is consolidated away
//!   (NodeClaim and Node deleted);
//! - nodekeeper's controller (as its ServiceAccount, provider `karpenter`) repairs a node of a NodePool:
//!   the replacement NodeClaim pre-spun as the drain starts (`[repair] prespin`), one drain
//!   (nodekeeper's), Karpenter kept off the node meanwhile, the NodeClaim deleted only once the drain is
//!   over, Karpenter terminating the node, the evicted pod on the pre-spun node and no other NodeClaim
//!   added (docs/karpenter.md);
//! - a repair released mid-drain (the node Ready again) abandons its pre-spun NodeClaim: its
//!   `do-not-disrupt` lifted, the node's replacement marks gone, and Karpenter's consolidation removes it.
//!
//! Real only: the sim has no Karpenter. The tests share one cluster and run one at a time (one engine
//! acts on every node; consolidation would move the other test's pods).

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::json;

use crate::support::*;
use nodekeeper_core::controller::policy::view::keys;

/// One test at a time on the Karpenter cluster.
pub(crate) static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const POOL: &str = "default";
const APP: &str = "karpenter-inflate";

pub(crate) fn nodeclaims(admin: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("karpenter.sh", "v1", "NodeClaim");
    Api::all_with(admin.clone(), &ApiResource::from_gvk(&gvk))
}

pub(crate) fn nodepools(admin: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("karpenter.sh", "v1", "NodePool");
    Api::all_with(admin.clone(), &ApiResource::from_gvk(&gvk))
}

/// Sets `pool`'s disruption budgets to the one budget `nodes` (a count or a percentage).
pub(crate) async fn set_pool_budget(admin: &kube::Client, pool: &str, nodes: &str) {
    nodepools(admin)
        .patch(
            pool,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "disruption": { "budgets": [{ "nodes": nodes }] } } })),
        )
        .await
        .unwrap();
}

/// `status.conditions[type].status == "True"` of a Karpenter object.
pub(crate) fn condition_true(o: &DynamicObject, type_: &str) -> bool {
    o.data["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == type_ && c["status"] == "True")
    })
}

/// The NodeClaims of the pool.
async fn pool_claims(api: &Api<DynamicObject>) -> Vec<DynamicObject> {
    api.list(&ListParams::default().labels(&format!("karpenter.sh/nodepool={POOL}")))
        .await
        .unwrap()
        .items
}

/// The Deployment's pods.
async fn app_pods(pods: &Api<Pod>) -> Vec<Pod> {
    app_pods_of(pods, APP).await
}

pub(crate) fn running_on(p: &Pod) -> Option<&str> {
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    (phase == Some("Running")).then_some(())?;
    p.spec.as_ref()?.node_name.as_deref()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn karpenter_provisions_a_kwok_node_for_pending_pods_and_consolidates_it_when_empty() {
    init_tracing();
    let _one = ONE_AT_A_TIME.lock().await;
    let c = karpenter_cluster();
    let admin = c.admin().await;

    // The default KWOKNodeClass and the example NodePool (spot + on-demand, consolidation at once).
    let fixtures = repo().join("tests/fixtures/karpenter");
    let out = kubectl(
        c,
        &[
            "apply",
            "-f",
            fixtures.join("kwoknodeclass.yaml").to_str().unwrap(),
            "-f",
            fixtures.join("nodepool.yaml").to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "kubectl apply of the Karpenter fixtures"
    );
    let pools = nodepools(&admin);
    wait_until(Duration::from_secs(60), "NodePool default Ready", || {
        let pools = pools.clone();
        async move {
            pools
                .get(POOL)
                .await
                .is_ok_and(|p| condition_true(&p, "Ready"))
        }
    })
    .await;

    // One existing node too small for any of the pods (1 CPU; each pod asks 1500m).
    let mut small = kwok_node("karp-small", json!({}));
    let res = json!({ "cpu": "1", "memory": "4Gi", "pods": "110" });
    small.status.as_mut().unwrap().allocatable = serde_json::from_value(res.clone()).unwrap();
    small.status.as_mut().unwrap().capacity = serde_json::from_value(res).unwrap();
    let _nodes = c.create_nodes(&[small]).await;

    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), "default");
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": { "name": APP },
        "spec": {
            "replicas": 2,
            "selector": { "matchLabels": { "app": APP } },
            "template": {
                "metadata": { "labels": { "app": APP } },
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    // Only this NodePool's nodes: another test's pool may still be terminating.
                    "nodeSelector": { "karpenter.sh/nodepool": POOL },
                    "containers": [{
                        "name": "pause",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": { "requests": { "cpu": "1500m", "memory": "512Mi" } }
                    }]
                }
            }
        }
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();

    // Karpenter launches NodeClaims; their KWOK nodes become Ready and the scheduler places every pod there.
    let claims_api = nodeclaims(&admin);
    let nodes: Api<Node> = Api::all(admin.clone());
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let hosts: BTreeSet<String> = wait_for(
        Duration::from_secs(120),
        "both pods Running on nodes of NodePool default",
        || {
            let pods = pods.clone();
            async move {
                let ps = app_pods(&pods).await;
                let on: Vec<String> = ps.iter().filter_map(running_on).map(String::from).collect();
                (ps.len() == 2 && on.len() == 2).then(|| on.into_iter().collect())
            }
        },
    )
    .await;
    assert!(
        !hosts.contains("karp-small"),
        "a 1500m pod cannot run on the 1-CPU node: {hosts:?}"
    );
    let claims = wait_for(
        Duration::from_secs(60),
        "every NodeClaim of the pool Launched, Registered and Initialized",
        || {
            let api = claims_api.clone();
            async move {
                let cs = pool_claims(&api).await;
                let done = !cs.is_empty()
                    && cs.iter().all(|c| {
                        ["Launched", "Registered", "Initialized"]
                            .iter()
                            .all(|t| condition_true(c, t))
                    });
                done.then_some(cs)
            }
        },
    )
    .await;
    let mut claimed_nodes = BTreeSet::new();
    for claim in &claims {
        let name = claim.data["status"]["nodeName"]
            .as_str()
            .expect("an initialized NodeClaim names its node")
            .to_string();
        let node = nodes.get(&name).await.unwrap();
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let annotations = node.metadata.annotations.clone().unwrap_or_default();
        assert!(is_ready(&node), "node {name} is Ready");
        assert_eq!(
            node.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
            claim.data["status"]["providerID"].as_str(),
            "node {name} is the NodeClaim's instance"
        );
        assert!(
            node.spec
                .as_ref()
                .and_then(|s| s.provider_id.as_deref())
                .is_some_and(|p| p.starts_with("kwok://")),
            "a KWOK provider id"
        );
        assert_eq!(
            labels.get("karpenter.sh/nodepool").map(String::as_str),
            Some(POOL)
        );
        assert_eq!(
            labels.get("nodekeeper.test/pool").map(String::as_str),
            Some("karpenter"),
            "the NodePool template's label"
        );
        let capacity = labels.get("karpenter.sh/capacity-type").map(String::as_str);
        assert!(
            matches!(capacity, Some("spot" | "on-demand")),
            "capacity type {capacity:?}"
        );
        assert_eq!(
            annotations.get("kwok.x-k8s.io/node").map(String::as_str),
            Some("fake"),
            "the cluster's KWOK plays its kubelet"
        );
        let taints = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        assert!(
            !taints.iter().any(|t| t.key == "karpenter.sh/unregistered"),
            "Karpenter removed its unregistered taint from {name}: {taints:?}"
        );
        claimed_nodes.insert(name);
    }
    assert!(
        hosts.is_subset(&claimed_nodes),
        "the pods run on Karpenter's nodes: pods on {hosts:?}, NodeClaims' nodes {claimed_nodes:?}"
    );

    // Scaled to 0: the nodes are empty, and with consolidateAfter 0s Karpenter deletes NodeClaims and Nodes.
    deployments
        .patch(
            APP,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "replicas": 0 } })),
        )
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(180),
        "NodeClaims and nodes of NodePool default gone",
        || {
            let api = claims_api.clone();
            let nodes = nodes.clone();
            let claimed_nodes = claimed_nodes.clone();
            async move {
                if !pool_claims(&api).await.is_empty() {
                    return false;
                }
                for n in &claimed_nodes {
                    if nodes.get_opt(n).await.unwrap().is_some() {
                        return false;
                    }
                }
                true
            }
        },
    )
    .await;
    // The node Karpenter does not own stays.
    assert!(nodes.get_opt("karp-small").await.unwrap().is_some());
    let out = kubectl(c, &["delete", "deployment", APP, "--ignore-not-found"]);
    assert!(out.status.success());
}

/// A PodDisruptionBudget that allows no eviction of `app`'s pods (`maxUnavailable: 0`), as YAML for
/// [`pool_with_two_pods`].
pub(crate) fn no_eviction_pdb(app: &str) -> String {
    format!(
        r#"---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {{name: {app}, namespace: default}}
spec:
  maxUnavailable: 0
  selector: {{matchLabels: {{app: {app}}}}}
"#
    )
}

/// What a NodePool test starts with: the Karpenter cluster to itself ([`ONE_AT_A_TIME`], held while
/// the guard lives), the cluster, its admin client, the pods of `default` and the Nodes.
pub(crate) async fn scene() -> (
    tokio::sync::MutexGuard<'static, ()>,
    &'static Cluster,
    kube::Client,
    Api<Pod>,
    Api<Node>,
) {
    init_tracing();
    let one = ONE_AT_A_TIME.lock().await;
    let c = karpenter_cluster();
    let admin = c.admin().await;
    let pods = Api::namespaced(admin.clone(), "default");
    let nodes = Api::all(admin.clone());
    (one, c, admin, pods, nodes)
}

/// A NodePool test's end: the controller hit no 403, is stopped, and the test's app objects and
/// NodePool are removed ([`remove_pool`]).
pub(crate) async fn finish(
    ctl: ControllerProc,
    c: &'static Cluster,
    kinds: &str,
    app: &str,
    pool: &str,
) {
    assert_eq!(
        ctl.forbidden_lines(),
        Vec::<String>::new(),
        "the controller hit a 403"
    );
    ctl.stop().await;
    remove_pool(c, kinds, app, pool).await;
}

/// A test's teardown: its app objects (`kinds` named `app`) and its NodePool, waiting until Karpenter has
/// terminated the pool's nodes, so the next test on the shared cluster never finds them.
pub(crate) async fn remove_pool(c: &'static Cluster, kinds: &str, app: &str, pool: &str) {
    let out = kubectl(c, &["delete", kinds, app, "--ignore-not-found"]);
    assert!(out.status.success(), "kubectl delete {kinds} {app}");
    let out = kubectl(
        c,
        &[
            "delete",
            "nodepool",
            pool,
            "--ignore-not-found",
            "--wait=false",
        ],
    );
    assert!(out.status.success(), "kubectl delete nodepool {pool}");
    let admin = c.admin().await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let claims = nodeclaims(&admin);
    let selector = format!("karpenter.sh/nodepool={pool}");
    // Karpenter deletes a NodeClaim's Node only once the NodeClaim has registered it, and waits for
    // that Node to be gone before it lets the NodeClaim go; a Node whose NodeClaim was deleted before
    // it registered is left to the cloud's node lifecycle controller (the CCM), which the KWOK provider
    // does not have. So once the pool's NodeClaims are gone, a Node left of the pool is such an orphan
    // (a replacement still launching when the NodePool went): the teardown deletes it, as a CCM would.
    wait_until(
        Duration::from_secs(180),
        &format!("the NodeClaims of NodePool {pool} gone"),
        || {
            let claims = claims.clone();
            let lp = ListParams::default().labels(&selector);
            async move { claims.list(&lp).await.unwrap().items.is_empty() }
        },
    )
    .await;
    for orphan in nodes
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items
    {
        let name = orphan.metadata.name.unwrap_or_default();
        eprintln!("NodePool {pool}: deleting {name}, whose NodeClaim went before it registered");
        nodes
            .delete(&name, &Default::default())
            .await
            .map(|_| ())
            .or_else(|e| match e {
                kube::Error::Api(ref r) if r.code == 404 => Ok(()),
                e => Err(e),
            })
            .unwrap();
    }
    wait_until(
        Duration::from_secs(60),
        &format!("the nodes of NodePool {pool} gone"),
        || {
            let nodes = nodes.clone();
            let lp = ListParams::default().labels(&selector);
            async move { nodes.list(&lp).await.unwrap().items.is_empty() }
        },
    )
    .await;
}

/// The default KWOKNodeClass, a NodePool `pool` of its own (on-demand, `disruption` as given) and a
/// Deployment `app` of 2 pods of 1500m pinned to it, one per node, plus `extra` YAML (a PDB); returns
/// the two nodes once both pods run there.
pub(crate) async fn pool_with_two_pods(
    c: &'static Cluster,
    pods: &Api<Pod>,
    pool: &str,
    app: &str,
    disruption: &str,
    extra: &str,
) -> Vec<String> {
    let fixtures = repo().join("tests/fixtures/karpenter");
    let out = kubectl(
        c,
        &[
            "apply",
            "-f",
            fixtures.join("kwoknodeclass.yaml").to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "kubectl apply of the KWOKNodeClass");
    crate::drain::apply(
        c,
        &format!(
            r#"
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {{name: {pool}}}
spec:
  template:
    spec:
      requirements:
        - {{key: kubernetes.io/arch, operator: In, values: [amd64]}}
        - {{key: kubernetes.io/os, operator: In, values: [linux]}}
        - {{key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}}
      nodeClassRef: {{group: karpenter.kwok.sh, kind: KWOKNodeClass, name: default}}
      expireAfter: Never
  limits: {{cpu: "64"}}
  disruption: {disruption}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {app}, namespace: default}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: {app}}}}}
  template:
    metadata: {{labels: {{app: {app}}}}}
    spec:
      terminationGracePeriodSeconds: 0
      nodeSelector: {{karpenter.sh/nodepool: {pool}}}
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            - {{labelSelector: {{matchLabels: {{app: {app}}}}}, topologyKey: kubernetes.io/hostname}}
      containers:
        - {{name: pause, image: "registry.k8s.io/pause:3.10", resources: {{requests: {{cpu: 1500m, memory: 512Mi}}}}}}
{extra}"#
        ),
    );
    let app = app.to_string();
    wait_for(
        Duration::from_secs(180),
        "both pods Running on two nodes of the NodePool",
        || {
            let (pods, app) = (pods.clone(), app.clone());
            async move {
                let on: BTreeSet<String> = app_pods_of(&pods, &app)
                    .await
                    .iter()
                    .filter_map(running_on)
                    .map(String::from)
                    .collect();
                (on.len() == 2).then(|| on.into_iter().collect())
            }
        },
    )
    .await
}

/// The shipped controller config with provider `karpenter`, half a group allowed unhealthy and the
/// one repair policy `policy` (TOML of a `[[repair.policy]]`).
pub(crate) fn karpenter_controller_toml(
    dir: &std::path::Path,
    identity: &str,
    policy: &str,
) -> std::path::PathBuf {
    karpenter_controller_toml_with(dir, identity, policy, |_| {})
}

/// [`karpenter_controller_toml`], then `edit` applied.
pub(crate) fn karpenter_controller_toml_with(
    dir: &std::path::Path,
    identity: &str,
    policy: &str,
    edit: impl FnOnce(&mut toml::Table),
) -> std::path::PathBuf {
    controller_toml(dir, identity, |t| {
        let r = t["repair"].as_table_mut().unwrap();
        r.insert("max_unhealthy".into(), "50%".into());
        r.insert(
            "policy".into(),
            toml::Value::Array(vec![toml::Value::Table(toml::from_str(policy).unwrap())]),
        );
        let mut provider = toml::Table::new();
        provider.insert("kind".into(), "karpenter".into());
        t["controller"]
            .as_table_mut()
            .unwrap()
            .insert("provider".into(), provider.into());
        edit(t);
    })
}

const COOP_POOL: &str = "nk-coop";
const COOP_APP: &str = "nk-coop-app";

/// The app's pods on `node` that still run there (not terminating).
async fn coop_pods_on(pods: &Api<Pod>, node: &str) -> Vec<String> {
    app_pods_of(pods, COOP_APP)
        .await
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.name)
        .collect()
}

/// The NodeClaim of `node` (by its `status.nodeName`, which Karpenter writes at registration, a little
/// after the pods may have started).
pub(crate) async fn claim_of(admin: &kube::Client, node: &str) -> String {
    let api = nodeclaims(admin);
    wait_for(Duration::from_secs(30), "the node's NodeClaim", || {
        let api = api.clone();
        async move {
            api.list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|c| c.data["status"]["nodeName"].as_str() == Some(node))?
                .metadata
                .name
        }
    })
    .await
}

/// Waits until Node `node` and NodeClaim `claim` are gone.
pub(crate) async fn gone(admin: &kube::Client, node: &str, claim: &str) {
    let (nodes, claims): (Api<Node>, _) = (Api::all(admin.clone()), nodeclaims(admin));
    wait_until(
        Duration::from_secs(180),
        "the old node and NodeClaim gone",
        || {
            let (nodes, claims) = (nodes.clone(), claims.clone());
            async move {
                nodes.get_opt(node).await.unwrap().is_none()
                    && claims.get_opt(claim).await.unwrap().is_none()
            }
        },
    )
    .await;
}

/// Waits until both of `app`'s pods run, neither on `node`.
pub(crate) async fn both_running_elsewhere(pods: &Api<Pod>, app: &str, node: &str) {
    let on: BTreeSet<String> =
        wait_for(Duration::from_secs(180), "both pods Running again", || {
            let pods = pods.clone();
            async move {
                let on: BTreeSet<String> = app_pods_of(&pods, app)
                    .await
                    .iter()
                    .filter_map(running_on)
                    .map(String::from)
                    .collect();
                (on.len() == 2).then_some(on)
            }
        })
        .await;
    assert!(!on.contains(node), "{on:?}");
}

/// The messages of Karpenter's `Evicted` Events (its drain records one per pod it evicts) about
/// the pods of `app` in `default`.
pub(crate) async fn karpenter_evictions(admin: &kube::Client, app: &str) -> Vec<String> {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(admin.clone(), "default");
    events
        .list(&ListParams::default().fields("reason=Evicted"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(app))
        })
        .filter_map(|e| e.message)
        .collect()
}

pub(crate) async fn app_pods_of(pods: &Api<Pod>, app: &str) -> Vec<Pod> {
    pods.list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .unwrap()
        .items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodekeeper_repairs_a_karpenter_node_with_one_drain_and_karpenter_terminates_it() {
    let (_one, c, admin, pods, nodes) = scene().await;
    // A NodePool of its own: empty nodes consolidated after 30 s, no underutilization moves.
    let claims_api = nodeclaims(&admin);
    let hosts = pool_with_two_pods(
        c,
        &pods,
        COOP_POOL,
        COOP_APP,
        r#"{consolidationPolicy: WhenEmpty, consolidateAfter: 30s, budgets: [{nodes: "100%"}]}"#,
        &format!(
            r#"---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {{name: {COOP_APP}, namespace: default}}
spec:
  minAvailable: 1
  selector: {{matchLabels: {{app: {COOP_APP}}}}}
"#
        ),
    )
    .await;
    let victim = hosts[0].clone();
    let victim_claim = claim_of(&admin, &victim).await;
    let before = claims_of_pool(&admin, COOP_POOL).await;
    let victim_host = hostname(&nodes.get(&victim).await.unwrap());

    // nodekeeper's controller, the shipped policy (drain → replace, Ready=False) with provider karpenter.
    let dir = tempfile::tempdir().unwrap();
    let config = karpenter_controller_toml(
        dir.path(),
        "karpenter-coop",
        "condition_type = \"Ready\"\ncondition_status = \"False\"\ntoleration = \"3s\"",
    );
    let ctl = ControllerProc::start(c, &config, "karpenter-coop").await;
    wait_until(Duration::from_secs(30), "the victim seen ready", || {
        let (nodes, victim) = (nodes.clone(), victim.clone());
        async move {
            nodes
                .get(&victim)
                .await
                .is_ok_and(|n| annotation(&n, keys::SEEN_READY).is_some())
        }
    })
    .await;
    c.kubelet_reports_not_ready(&victim).await;

    // nodekeeper acts: cordoned, and Karpenter kept off the node (its mark, with nodekeeper's record).
    wait_until(
        Duration::from_secs(60),
        "victim cordoned and marked do-not-disrupt",
        || {
            let (nodes, victim) = (nodes.clone(), victim.clone());
            async move {
                nodes.get(&victim).await.is_ok_and(|n| {
                    unschedulable(&n)
                        && annotation(&n, keys::KARPENTER_DO_NOT_DISRUPT) == Some("true")
                        && annotation(&n, keys::DO_NOT_DISRUPT_BY) == Some("nodekeeper")
                })
            }
        },
    )
    .await;

    // Until the old NodeClaim deletes: every observation of it deleting finds the app's pods gone from
    // the node (nodekeeper's drain was over before Karpenter's termination began).
    let end = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let claim = claims_api.get_opt(&victim_claim).await.unwrap();
        let deleting = claim
            .as_ref()
            .is_none_or(|c| c.metadata.deletion_timestamp.is_some());
        if deleting {
            let left = coop_pods_on(&pods, &victim).await;
            assert!(
                left.is_empty(),
                "the NodeClaim was deleted while {left:?} still ran on {victim}"
            );
            if let Some(n) = nodes.get_opt(&victim).await.unwrap() {
                assert!(
                    annotation(&n, keys::RETIRE_REQUESTED).is_some(),
                    "deleted by nodekeeper's retire"
                );
            }
            break;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "the old NodeClaim never deleted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Karpenter terminates the node; the evicted pod runs on capacity Karpenter provisioned for it.
    gone(&admin, &victim, &victim_claim).await;
    both_running_elsewhere(&pods, COOP_APP, &victim).await;
    // One eviction stream: Karpenter evicted none of the app's pods.
    let evicted_by_karpenter = karpenter_evictions(&admin, COOP_APP).await;
    assert!(
        evicted_by_karpenter.is_empty(),
        "Karpenter evicted: {evicted_by_karpenter:?}"
    );
    // One replacement, pre-spun by nodekeeper as its drain started: the only NodeClaim added, and
    // the evicted pod runs on its node.
    let twin = twin_of(&admin, &victim).await;
    let added: Vec<String> = claims_of_pool(&admin, COOP_POOL)
        .await
        .difference(&before)
        .cloned()
        .collect();
    assert_eq!(
        added,
        std::slice::from_ref(&twin),
        "one replacement, nodekeeper's"
    );
    let twin_node = claim_node(&admin, &twin).await;
    // A host of its own: the old claim's hostname label (KWOK's, recorded on the claim at launch) is
    // not copied, else the registration gives it to the new Node and every pod with a hostname
    // anti-affinity to the evicted one refuses the node while that pod terminates.
    let twin_host = hostname(&nodes.get(&twin_node).await.unwrap());
    assert_ne!(
        twin_host, victim_host,
        "the pre-spun node took the old hostname"
    );
    let on: Vec<Pod> = app_pods_of(&pods, COOP_APP).await;
    assert!(
        on.iter().any(|p| running_on(p) == Some(twin_node.as_str())),
        "no pod on the pre-spun node {twin_node}"
    );
    finish(ctl, c, "deployment,pdb", COOP_APP, COOP_POOL).await;
}

fn hostname(n: &Node) -> Option<String> {
    n.metadata
        .labels
        .as_ref()?
        .get("kubernetes.io/hostname")
        .cloned()
}

/// The names of the NodeClaims of NodePool `pool`.
pub(crate) async fn claims_of_pool(admin: &kube::Client, pool: &str) -> BTreeSet<String> {
    nodeclaims(admin)
        .list(&ListParams::default().labels(&format!("karpenter.sh/nodepool={pool}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect()
}

/// The names of the NodeClaims nodekeeper created to replace `node`.
pub(crate) async fn twins(admin: &kube::Client, node: &str) -> Vec<String> {
    nodeclaims(admin)
        .list(&ListParams::default().labels(&format!("nodekeeper.io/replaces={node}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect()
}

/// The name of the one NodeClaim nodekeeper created to replace `node` (waiting for it).
async fn twin_of(admin: &kube::Client, node: &str) -> String {
    wait_for(
        Duration::from_secs(30),
        "the pre-spun NodeClaim",
        || async move {
            let names = twins(admin, node).await;
            assert!(names.len() <= 1, "more than one replacement of {node}");
            names.into_iter().next()
        },
    )
    .await
}

/// The node of NodeClaim `claim`, once registered.
async fn claim_node(admin: &kube::Client, claim: &str) -> String {
    let api = nodeclaims(admin);
    wait_for(Duration::from_secs(60), "the NodeClaim's node", || {
        let api = api.clone();
        async move {
            let c = api.get_opt(claim).await.ok()??;
            c.data["status"]["nodeName"].as_str().map(String::from)
        }
    })
    .await
}

const ABANDON_POOL: &str = "nk-abandon";
const ABANDON_APP: &str = "nk-abandon-app";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repair_released_mid_drain_abandons_its_prespun_nodeclaim_to_consolidation() {
    let (_one, c, admin, pods, nodes) = scene().await;
    // The PDB allows no eviction: the drain holds, the repair stays on its drain step. Empty nodes
    // consolidated after 10 s.
    let hosts = pool_with_two_pods(
        c,
        &pods,
        ABANDON_POOL,
        ABANDON_APP,
        r#"{consolidationPolicy: WhenEmpty, consolidateAfter: 10s, budgets: [{nodes: "100%"}]}"#,
        &no_eviction_pdb(ABANDON_APP),
    )
    .await;
    let victim = hosts[0].clone();
    let dir = tempfile::tempdir().unwrap();
    let config = karpenter_controller_toml_with(
        dir.path(),
        "karpenter-abandon",
        "condition_type = \"Ready\"\ncondition_status = \"False\"\ntoleration = \"1s\"",
        |t| {
            t["repair"]
                .as_table_mut()
                .unwrap()
                .insert("healthy_delay".into(), "1s".into());
        },
    );
    let ctl = ControllerProc::start(c, &config, "karpenter-abandon").await;
    crate::repair::seen_ready(&nodes, &[victim.as_str()]).await;
    c.kubelet_reports_not_ready(&victim).await;

    // Repairing, on its drain step, with the replacement pre-spun and held for the node's pods.
    let twin = twin_of(&admin, &victim).await;
    wait_until(Duration::from_secs(60), "the replacement accepted", || {
        let (nodes, victim) = (nodes.clone(), victim.clone());
        async move {
            nodes.get(&victim).await.is_ok_and(|n| {
                annotation(&n, keys::REPAIR_STEP) == Some("drain")
                    && annotation(&n, keys::REPLACEMENT_ACCEPTED).is_some()
            })
        }
    })
    .await;
    let claims = nodeclaims(&admin);
    let held = claims.get(&twin).await.unwrap();
    assert!(
        held.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("karpenter.sh/do-not-disrupt")),
        "the pre-spun NodeClaim is held while the drain runs"
    );

    // The kubelet recovers: the repair ends, the replacement is abandoned.
    c.kubelet_reports(
        &victim,
        "True",
        "KubeletReady",
        "kubelet is posting ready status",
    )
    .await;
    wait_until(
        Duration::from_secs(60),
        "the victim released, its replacement marks gone",
        || {
            let (nodes, victim) = (nodes.clone(), victim.clone());
            async move {
                nodes.get(&victim).await.is_ok_and(|n| {
                    !unschedulable(&n)
                        && annotation(&n, keys::STATE).is_none()
                        && annotation(&n, keys::REPLACEMENT_REQUESTED).is_none()
                        && annotation(&n, keys::REPLACEMENT_ACCEPTED).is_none()
                })
            }
        },
    )
    .await;
    // Karpenter's consolidation takes the empty, no longer held NodeClaim.
    wait_until(
        Duration::from_secs(120),
        "the abandoned NodeClaim consolidated away",
        || {
            let (claims, twin) = (claims.clone(), twin.clone());
            async move {
                claims
                    .get_opt(&twin)
                    .await
                    .unwrap()
                    .is_none_or(|c| c.metadata.deletion_timestamp.is_some())
            }
        },
    )
    .await;
    // The pods never moved.
    let on: BTreeSet<String> = app_pods_of(&pods, ABANDON_APP)
        .await
        .iter()
        .filter_map(running_on)
        .map(String::from)
        .collect();
    assert!(on.contains(&victim), "{on:?}");
    finish(ctl, c, "deployment,pdb", ABANDON_APP, ABANDON_POOL).await;
}

const FENCE_POOL: &str = "nk-fence";
const FENCE_APP: &str = "nk-fence-app";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repair_of_a_ready_node_fences_its_nodepool_and_karpenter_holds_off() {
    let (_one, c, admin, pods, nodes) = scene().await;
    // Consolidation at once: every node is a candidate Karpenter evaluates on each pass. No eviction
    // allowed: the repair's drain waits (and the fence stays) until the test deletes the PDB.
    let hosts = pool_with_two_pods(
        c,
        &pods,
        FENCE_POOL,
        FENCE_APP,
        r#"{consolidationPolicy: WhenEmptyOrUnderutilized, consolidateAfter: 0s, budgets: [{nodes: "100%"}]}"#,
        &no_eviction_pdb(FENCE_APP),
    )
    .await;
    let (sick, other) = (hosts[0].clone(), hosts[1].clone());

    // A repair for a condition that leaves the node Ready (Karpenter's budgets cannot count it),
    // trusted for the replacement (NPD's condition: nodekeeper cannot see it clear).
    let dir = tempfile::tempdir().unwrap();
    let config = karpenter_controller_toml(
        dir.path(),
        "karpenter-fence",
        "condition_type = \"KernelDeadlock\"\ncondition_status = \"True\"\ntoleration = \"1s\"\nallow_destructive = true",
    );
    let ctl = ControllerProc::start(c, &config, "karpenter-fence").await;
    // KWOK keeps the node Ready (its Lease); the label stops it rewriting the conditions.
    let label =
        json!({ "metadata": { "labels": { "nodekeeper.test/kubelet": "kernel-deadlock" } } });
    nodes
        .patch(&sick, &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let status = json!({ "status": { "conditions": [{
        "type": "KernelDeadlock", "status": "True", "reason": "DockerHung",
        "message": "task docker:7 blocked for more than 120 seconds",
        "lastHeartbeatTime": now, "lastTransitionTime": now
    }] } });
    nodes
        .patch_status(&sick, &PatchParams::default(), &Patch::Strategic(&status))
        .await
        .unwrap();

    // The sick node is repaired (its own mark); the NodePool's other node is fenced, and Karpenter
    // says its disruption is blocked by the annotation.
    wait_until(
        Duration::from_secs(60),
        "sick node repairing, other node fenced",
        || {
            let (nodes, sick, other) = (nodes.clone(), sick.clone(), other.clone());
            async move {
                let (Ok(s), Ok(o)) = (nodes.get(&sick).await, nodes.get(&other).await) else {
                    return false;
                };
                annotation(&s, keys::STATE) == Some("repairing")
                    && is_ready(&s)
                    && annotation(&s, keys::DO_NOT_DISRUPT_BY) == Some("nodekeeper")
                    && annotation(&o, keys::KARPENTER_DO_NOT_DISRUPT) == Some("true")
                    && annotation(&o, keys::DO_NOT_DISRUPT_BY) == Some("fence")
            }
        },
    )
    .await;
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(admin.clone(), "default");
    let blocked = wait_for(
        // Karpenter's disruption loop took from 20 s to about 2 min to evaluate the node in trials.
        Duration::from_secs(300),
        "Karpenter's DisruptionBlocked for the fenced node",
        || {
            let (events, other) = (events.clone(), other.clone());
            async move {
                events
                    .list(&ListParams::default().fields(&format!(
                        "reason=DisruptionBlocked,involvedObject.kind=Node,involvedObject.name={other}"
                    )))
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .filter_map(|e| e.message)
                    .find(|m| m.contains("karpenter.sh/do-not-disrupt"))
            }
        },
    )
    .await;
    eprintln!("Karpenter on {other}: {blocked}");
    assert_eq!(
        annotation(&nodes.get(&sick).await.unwrap(), keys::STATE),
        Some("repairing"),
        "still draining (the PDB allows no eviction)"
    );
    let pdbs: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(admin.clone(), "default");
    pdbs.delete(FENCE_APP, &Default::default()).await.unwrap();

    // The PDB gone, the repair drains the sick node and hands it over; once its NodeClaim is
    // deleting, Karpenter counts it and the fence is lifted.
    wait_until(
        Duration::from_secs(180),
        "the fence lifted from the other node",
        || {
            let (nodes, other) = (nodes.clone(), other.clone());
            async move {
                nodes.get(&other).await.is_ok_and(|o| {
                    annotation(&o, keys::KARPENTER_DO_NOT_DISRUPT).is_none()
                        && annotation(&o, keys::DO_NOT_DISRUPT_BY).is_none()
                })
            }
        },
    )
    .await;
    let s = nodes.get_opt(&sick).await.unwrap();
    assert!(
        s.as_ref()
            .is_none_or(|s| annotation(s, keys::RETIRE_REQUESTED).is_some()),
        "the fence lifts only once the sick node is handed over"
    );
    finish(ctl, c, "deployment", FENCE_APP, FENCE_POOL).await;
}

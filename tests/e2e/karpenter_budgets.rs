//! `[budgets] source = "nodepool"` on the real Karpenter (`support::karpenter_cluster()`, the CRDs and
//! the NodePools Karpenter itself reads): nodekeeper's controller, as its ServiceAccount, takes each
//! NodePool's `spec.disruption.budgets` through its watch.
//!
//! Real only: the sim's NodePool scenario is tests/sim/engine_nodepool_budgets.rs (the sim serves
//! `nodepools` but runs no Karpenter). The tests share the Karpenter cluster with
//! tests/e2e/karpenter.rs and take its `ONE_AT_A_TIME` lock.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::karpenter::*;
use crate::support::*;
use nodekeeper_core::controller::policy::view::keys;

const BUDGET_POOL: &str = "nk-budget";
const BUDGET_APP: &str = "nk-budget-app";

/// `NodekeeperHeld` (True) reason and message of a node.
fn held(n: &Node) -> Option<(String, String)> {
    let c = condition(n, "NodekeeperHeld")?;
    (c.status == "True" && annotation(n, keys::BLOCKED).is_some())
        .then(|| (c.reason.unwrap_or_default(), c.message.unwrap_or_default()))
}

fn repairing(n: &Node) -> bool {
    annotation(n, keys::STATE) == Some("repairing")
}

/// Two NotReady nodes of a NodePool whose budget nodekeeper reads from the NodePool:
/// - budget `nodes: "0"`: both held (`BlockedByBudget`, naming the NodePool), neither cordoned;
/// - the NodePool edited to `nodes: "1"`: one repair starts, the other stays held by budget #0 of the
///   NodePool (its condition and `nodekeeper status` say so) while the first drains (a PDB keeps it
///   draining until the test deletes the PDB);
/// - edited to "0" and back to "1" meanwhile: the second's hold names each budget in turn;
/// - at every observation at most one of the two is being repaired; the second starts only once the
///   first is handed over to Karpenter (its NodeClaim deleted by nodekeeper's retire) and gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodepool_budget_read_from_karpenter_holds_the_second_repair_until_the_first_is_handed_over(
) {
    let (_one, c, admin, pods, nodes) = scene().await;
    // Budget "0" to start with: nothing may be disrupted, by Karpenter or by nodekeeper.
    let hosts = pool_with_two_pods(
        c,
        &pods,
        BUDGET_POOL,
        BUDGET_APP,
        r#"{consolidationPolicy: WhenEmpty, consolidateAfter: 30s, budgets: [{nodes: "0"}]}"#,
        &no_eviction_pdb(BUDGET_APP),
    )
    .await;

    // Budgets from the NodePools only (the shipped top-level `nodes = "1"` does not apply to a group
    // with a NodePool); both nodes may be unhealthy at once without short-circuiting.
    let dir = tempfile::tempdir().unwrap();
    let config = karpenter_controller_toml_with(
        dir.path(),
        "karpenter-budget",
        "condition_type = \"Ready\"\ncondition_status = \"False\"\ntoleration = \"3s\"",
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
    let ctl = ControllerProc::start(c, &config, "karpenter-budget").await;
    for h in &hosts {
        wait_until(Duration::from_secs(30), &format!("{h} seen ready"), || {
            let (nodes, h) = (nodes.clone(), h.clone());
            async move {
                nodes
                    .get(&h)
                    .await
                    .is_ok_and(|n| annotation(&n, keys::SEEN_READY).is_some())
            }
        })
        .await;
    }
    for h in &hosts {
        c.kubelet_reports_not_ready(h).await;
    }

    // nodes "0": both held by the NodePool's budget, nothing cordoned.
    wait_until(
        Duration::from_secs(60),
        "both nodes held by NodePool nk-budget's budget nodes=0",
        || {
            let (nodes, hosts) = (nodes.clone(), hosts.clone());
            async move {
                for h in &hosts {
                    let Ok(n) = nodes.get(h).await else {
                        return false;
                    };
                    let ok = held(&n).is_some_and(|(r, m)| {
                        r == "BlockedByBudget" && m.contains("(nodes=0) of NodePool nk-budget")
                    });
                    if !ok || repairing(&n) || unschedulable(&n) {
                        return false;
                    }
                }
                true
            }
        },
    )
    .await;

    // The NodePool edited to "1" (on the real API; nodekeeper reads it through its watch).
    set_pool_budget(&admin, BUDGET_POOL, "1").await;
    let (first, second) = wait_for(
        Duration::from_secs(60),
        "one repairing, the other held by nodes=1",
        || {
            let (nodes, hosts) = (nodes.clone(), hosts.clone());
            async move {
                let a = nodes.get(&hosts[0]).await.ok()?;
                let b = nodes.get(&hosts[1]).await.ok()?;
                assert!(
                    !(repairing(&a) && repairing(&b)),
                    "both repaired at once under nodes: \"1\""
                );
                let held_by_one = |n: &Node| {
                    held(n).is_some_and(|(r, m)| {
                        r == "BlockedByBudget" && m.contains("(nodes=1) of NodePool nk-budget")
                    })
                };
                if repairing(&a) && held_by_one(&b) {
                    Some((hosts[0].clone(), hosts[1].clone()))
                } else if repairing(&b) && held_by_one(&a) {
                    Some((hosts[1].clone(), hosts[0].clone()))
                } else {
                    None
                }
            }
        },
    )
    .await;
    let text = crate::repair::status_rows(c, &admin, dir.path(), BUDGET_POOL).await;
    let row = text
        .lines()
        .find(|l| l.starts_with(second.as_str()))
        .expect("a row for the held node");
    assert!(
        row.contains(&format!("budget #0 nodes=1 of NodePool {BUDGET_POOL}")),
        "{row}"
    );
    let row = text
        .lines()
        .find(|l| l.starts_with(first.as_str()))
        .expect("a row for the repaired node");
    assert!(row.contains("repairing"), "{row}");
    assert!(unschedulable(&nodes.get(&first).await.unwrap()));
    assert!(!unschedulable(&nodes.get(&second).await.unwrap()));

    // Edited to "0" and back to "1" while the first drains: the hold follows each edit.
    for budget in ["0", "1"] {
        set_pool_budget(&admin, BUDGET_POOL, budget).await;
        wait_until(
            Duration::from_secs(30),
            &format!("{second} held by nodes={budget}"),
            || {
                let (nodes, second) = (nodes.clone(), second.clone());
                let want = format!("(nodes={budget}) of NodePool {BUDGET_POOL}");
                async move {
                    nodes.get(&second).await.is_ok_and(|n| {
                        !repairing(&n)
                            && held(&n)
                                .is_some_and(|(r, m)| r == "BlockedByBudget" && m.contains(&want))
                    })
                }
            },
        )
        .await;
        assert!(
            repairing(&nodes.get(&first).await.unwrap()),
            "{first} still draining"
        );
    }

    // The PDB gone, the first drains and is handed over; the second starts only once the first is gone.
    let pdbs: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(admin.clone(), "default");
    pdbs.delete(BUDGET_APP, &Default::default()).await.unwrap();
    let end = tokio::time::Instant::now() + Duration::from_secs(240);
    loop {
        let f = nodes.get_opt(&first).await.unwrap();
        let s = nodes.get_opt(&second).await.unwrap();
        if s.as_ref().is_some_and(repairing) {
            assert!(
                f.is_none(),
                "{second} started while {first} was still there: {:?}",
                f.as_ref().map(|f| &f.metadata.annotations)
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "{second} never started (first present: {})",
            f.is_some()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The first went by nodekeeper's hand-over (its NodeClaim deleted by the retire, the retire's
    // last step; a NotReady node whose instance is gone is removed by Karpenter at once, too fast
    // to observe by polling), and the second's drain started after it, in the controller's own log.
    // (The Node shows the repair as soon as its patch lands; the controller logs `drain started`
    // a moment later, after the patch's Events.)
    wait_until(
        Duration::from_secs(10),
        "the second's `drain started` in the controller's log",
        || std::future::ready(ctl.position("drain started", &second).is_some()),
    )
    .await;
    let handed = ctl
        .position("drain over: deleting the old NodeClaim", &first)
        .unwrap_or_else(|| panic!("{first} never handed over; its log:\n{}", ctl.about(&first)));
    let started = ctl.position("drain started", &second).unwrap_or_else(|| {
        panic!(
            "{second}'s drain never started; its log:\n{}",
            ctl.about(&second)
        )
    });
    assert!(
        handed < started,
        "{first}'s NodeClaim deleted at log line {handed}, {second}'s drain started at {started}"
    );
    wait_until(
        Duration::from_secs(10),
        "the second's hold released",
        || {
            let (nodes, second) = (nodes.clone(), second.clone());
            async move {
                nodes
                    .get(&second)
                    .await
                    .is_ok_and(|n| annotation(&n, keys::BLOCKED).is_none())
            }
        },
    )
    .await;
    // The second repair runs to its hand-over too, so that the teardown finds no node that
    // nodekeeper holds mid-drain (cordoned, marked do-not-disrupt, its drain cancelled by the
    // controller's stop) when the NodePool goes: such a node outlived remove_pool's wait once.
    let end = tokio::time::Instant::now() + Duration::from_secs(120);
    while ctl
        .position("node handed to the provider", &second)
        .is_none()
    {
        assert!(
            tokio::time::Instant::now() < end,
            "{second} never handed over"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    finish(ctl, c, "deployment", BUDGET_APP, BUDGET_POOL).await;
}

const INTR_POOL: &str = "nk-intr";
const INTR_APP: &str = "nk-intr-app";

/// A preemption nodekeeper drains (the node stays Ready; a do-not-disrupt pod holds the drain) is invisible to
/// Karpenter's budget arithmetic; with the NodePool drifted meanwhile, Karpenter must not start a
/// drift of the NodePool's other node (budget `nodes: "1"`, already used by the preemption): at every
/// observation the other node carries no `karpenter.sh/disrupted` taint and its NodeClaim is not
/// deleting, until Karpenter reports the disruption blocked by the fence's `karpenter.sh/do-not-disrupt`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preemption_drain_fences_its_nodepool_so_karpenter_drifts_nothing_else_meanwhile() {
    let (_one, c, admin, pods, nodes) = scene().await;
    let claims = nodeclaims(&admin);
    let hosts = pool_with_two_pods(
        c,
        &pods,
        INTR_POOL,
        INTR_APP,
        r#"{consolidationPolicy: WhenEmptyOrUnderutilized, consolidateAfter: 0s, budgets: [{nodes: "1"}]}"#,
        "",
    )
    .await;
    let (preempted, other) = (hosts[0].clone(), hosts[1].clone());
    // The preempted node's pod is marked do-not-disrupt (the pod itself, not the template): nodekeeper's
    // drain waits for it until the deadline, and only that node is kept from Karpenter by it.
    let held_pod = app_pods_of(&pods, INTR_APP)
        .await
        .into_iter()
        .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(preempted.as_str()))
        .and_then(|p| p.metadata.name)
        .expect("the app's pod on the preempted node");
    pods.patch(
        &held_pod,
        &PatchParams::default(),
        &Patch::Merge(
            json!({ "metadata": { "annotations": { "karpenter.sh/do-not-disrupt": "true" } } }),
        ),
    )
    .await
    .unwrap();
    let other_claim = wait_for(
        Duration::from_secs(30),
        "the other node's NodeClaim",
        || {
            let (claims, other) = (claims.clone(), other.clone());
            async move {
                claims
                    .list(&kube::api::ListParams::default())
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .find(|c| c.data["status"]["nodeName"].as_str() == Some(other.as_str()))?
                    .metadata
                    .name
            }
        },
    )
    .await;

    let dir = tempfile::tempdir().unwrap();
    let config = karpenter_controller_toml_with(
        dir.path(),
        "karpenter-intr",
        "condition_type = \"Ready\"\ncondition_status = \"False\"\ntoleration = \"10m\"",
        |t| {
            t["budgets"]
                .as_table_mut()
                .unwrap()
                .insert("source".into(), "nodepool".into());
        },
    );
    let ctl = ControllerProc::start(c, &config, "karpenter-intr").await;
    wait_leading(&admin, "nodekeeper-karpenter-intr", "karpenter-intr").await;
    let https = crate::ctl::https(&dir.path().join("ca.pem"), ctl.addr);
    let token = agent_report_token(&admin, &preempted).await;
    let now = chrono::Utc::now();
    let mut report = crate::ctl::report(&preempted, 1, &[]);
    report.events = vec![nodekeeper_core::agent::sources::NodeEvent {
        version: nodekeeper_core::agent::sources::NODE_EVENT_VERSION,
        id: "intr-preempt-1".into(),
        kind: nodekeeper_core::agent::sources::EventKind::Preemption,
        cloud: None,
        source: "oci/instance-action".into(),
        not_before: Some(now + chrono::Duration::minutes(10)),
        deadline: None,
        detected_at: now,
        detail: Default::default(),
    }];
    report_until(&https, ctl.addr, &token, &report, |r| {
        r["acknowledged_events"]
            .to_string()
            .contains("intr-preempt-1")
    })
    .await;
    wait_until(
        Duration::from_secs(30),
        "the preempted node interrupted",
        || {
            let (nodes, n) = (nodes.clone(), preempted.clone());
            async move {
                nodes
                    .get(&n)
                    .await
                    .is_ok_and(|n| annotation(&n, keys::STATE) == Some("interrupted"))
            }
        },
    )
    .await;

    // Drift: every node of the NodePool is drifted from now on.
    nodepools(&admin)
        .patch(
            INTR_POOL,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "template": { "metadata": {
                "labels": { "nodekeeper.test/generation": "1" } } } } })),
        )
        .await
        .unwrap();
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(admin.clone(), "default");
    let end = tokio::time::Instant::now() + Duration::from_secs(300);
    let blocked = loop {
        let o = nodes.get(&other).await.unwrap();
        let tainted = o
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| ts.iter().any(|t| t.key == "karpenter.sh/disrupted"));
        let claim_deleting = claims
            .get_opt(&other_claim)
            .await
            .unwrap()
            .is_none_or(|c| c.metadata.deletion_timestamp.is_some());
        let p = nodes.get(&preempted).await.unwrap();
        assert_eq!(
            annotation(&p, keys::STATE),
            Some("interrupted"),
            "the preemption's drain still waits for the do-not-disrupt pod"
        );
        assert!(
            !tainted && !claim_deleting && o.metadata.deletion_timestamp.is_none(),
            "Karpenter disrupted {other} while {preempted} was being drained for a preemption (budget 1): tainted {tainted}, claim deleting {claim_deleting}"
        );
        let found = events
            .list(&kube::api::ListParams::default().fields(&format!(
                "reason=DisruptionBlocked,involvedObject.kind=Node,involvedObject.name={other}"
            )))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|e| e.message)
            .find(|m| m.contains("karpenter.sh/do-not-disrupt"));
        if let Some(m) = found {
            break m;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "Karpenter never evaluated {other}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("Karpenter on {other}: {blocked}");
    let o = nodes.get(&other).await.unwrap();
    assert_eq!(annotation(&o, keys::DO_NOT_DISRUPT_BY), Some("fence"));
    finish(ctl, c, "deployment", INTR_APP, INTR_POOL).await;
}

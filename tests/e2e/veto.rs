//! The per-node repair veto, on both backends: two nodes of one NodePool fail (their kubelets post
//! Ready=False), one annotated `karpenter.sh/do-not-repair: "true"` (Karpenter v1.15's veto), the other
//! `nodekeeper.io/do-not-repair: "true"`. The shipped controller config repairs neither: each is held
//! with the `do_not_repair` blocker naming its annotation (`nodekeeper.io/blocked`, the `NodekeeperHeld`
//! condition, a `BlockedByDoNotRepair` Event), left schedulable, and `nodekeeper status` (the real
//! binary, as a read-only operator) names the veto. Lifting one veto starts that node's repair; the
//! other stays held.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams};
use nodekeeper_core::controller::policy::view::keys;
use serde_json::json;

use crate::repair::{ready_false_repair, seen_ready, status_rows};
use crate::support::*;

const POOL: &str = "vt-pool";
/// vt-0: Karpenter's veto; vt-1: nodekeeper's; vt-2, vt-3 healthy.
const NODES: [&str; 4] = ["vt-0", "vt-1", "vt-2", "vt-3"];
const VETO: [&str; 2] = [keys::KARPENTER_DO_NOT_REPAIR, keys::DO_NOT_REPAIR];

/// The node's hold, when it is a veto: (the blocker JSON's annotation, the condition's reason).
fn veto_hold(n: &Node) -> Option<(String, String)> {
    let blocked: serde_json::Value = serde_json::from_str(annotation(n, keys::BLOCKED)?).ok()?;
    let cond = condition(n, "NodekeeperHeld")?;
    (blocked["kind"] == "do_not_repair" && cond.status == "True").then(|| {
        (
            blocked["annotation"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            cond.reason.unwrap_or_default(),
        )
    })
}

on_both!(do_not_repair_holds_a_failing_node_and_status_names_the_veto);
async fn do_not_repair_holds_a_failing_node_and_status_names_the_veto(c: &'static Cluster) {
    init_tracing();
    let _one_engine = c.exclusive().await;
    let admin = c.admin().await;
    let nodes: Vec<Node> = NODES
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let mut node = kwok_node(
                n,
                json!({ "karpenter.sh/nodepool": POOL, "kubernetes.io/hostname": n }),
            );
            if let Some(key) = VETO.get(i) {
                node.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(key.to_string(), "true".into());
            }
            node
        })
        .collect();
    let _nodes = c.create_nodes(&nodes).await;

    let dir = tempfile::tempdir().unwrap();
    // The shipped policy ([repair] drain → replace on Ready=False) with a short toleration, half the
    // pool allowed unhealthy, and a budget of 2: a vetoed NotReady node still counts against it (one
    // slot), so the other one can start once its veto is lifted.
    let config = controller_toml(dir.path(), "veto", |t| {
        ready_false_repair(t);
        let b = t["budgets"].as_table_mut().unwrap();
        b.insert(
            "budgets".into(),
            toml::Value::Array(vec![toml::Value::Table(
                toml::from_str(r#"nodes = "2""#).unwrap(),
            )]),
        );
    });
    let ctl = ControllerProc::start(c, &config, "veto").await;
    let api: Api<Node> = Api::all(admin.clone());
    seen_ready(&api, &NODES[..2]).await;
    c.kubelet_reports_not_ready(NODES[0]).await;
    c.kubelet_reports_not_ready(NODES[1]).await;

    // Both held by their own veto, once their toleration expired.
    for (n, veto) in NODES.iter().zip(VETO) {
        let node = wait_for(
            Duration::from_secs(60),
            &format!("{n} held by {veto}"),
            || {
                let api = api.clone();
                async move {
                    let node = api.get(n).await.ok()?;
                    let hold = veto_hold(&node)?;
                    (hold == (veto.to_string(), "BlockedByDoNotRepair".to_string())).then_some(node)
                }
            },
        )
        .await;
        assert_eq!(condition(&node, "Ready").unwrap().status, "False");
        assert!(!unschedulable(&node), "{n}: a vetoed node is not cordoned");
        assert_eq!(annotation(&node, keys::STATE), None, "{n}: no repair state");
        assert_eq!(annotation(&node, keys::REPAIR_STEP), None, "{n}");
        assert_eq!(
            annotation(&node, keys::KARPENTER_DO_NOT_DISRUPT),
            None,
            "{n}: nodekeeper did not mark it as acting on it"
        );
        let msg = condition(&node, "NodekeeperHeld").unwrap().message.unwrap();
        assert!(msg.contains(veto), "{n}: {msg}");
    }
    // The hold's Warning Event, about each node, naming its annotation.
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    for (n, veto) in NODES.iter().zip(VETO) {
        wait_until(
            Duration::from_secs(20),
            &format!("BlockedByDoNotRepair Event about {n}"),
            || {
                let events = events.clone();
                async move {
                    events
                        .list(&ListParams::default())
                        .await
                        .map(|l| {
                            l.items.iter().any(|e| {
                                e.reason.as_deref() == Some("BlockedByDoNotRepair")
                                    && e.type_.as_deref() == Some("Warning")
                                    && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                                        == Some(*n)
                                    && e.note.as_deref().is_some_and(|m| m.contains(veto))
                            })
                        })
                        .unwrap_or(false)
                }
            },
        )
        .await;
    }

    // `nodekeeper status` as an operator who may only list nodes: each row names its veto.
    let text = status_rows(c, &admin, dir.path(), POOL).await;
    for (n, veto) in NODES.iter().zip(VETO) {
        let row = text
            .lines()
            .find(|l| l.starts_with(n))
            .unwrap_or_else(|| panic!("a row for {n}"));
        assert!(row.contains(&format!("repair vetoed by {veto}")), "{row}");
        assert!(
            row.contains(&format!("repair once {veto} is removed")),
            "{row}"
        );
    }
    assert!(text.contains("4 nodes, 0 acting, 2 held"), "{text}");

    // The operator lifts nodekeeper's veto from vt-1: its repair starts (cordon, state), the hold goes.
    api.patch(
        NODES[1],
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "annotations": { keys::DO_NOT_REPAIR: null } } })),
    )
    .await
    .unwrap();
    wait_until(
        Duration::from_secs(30),
        "vt-1 repairing once unvetoed",
        || {
            let api = api.clone();
            async move {
                api.get(NODES[1]).await.is_ok_and(|n| {
                    annotation(&n, keys::STATE) == Some("repairing")
                        && unschedulable(&n)
                        && annotation(&n, keys::BLOCKED).is_none()
                })
            }
        },
    )
    .await;
    // The decision that started vt-1's repair saw vt-0 too: still held, still schedulable.
    let vt0 = api.get(NODES[0]).await.unwrap();
    assert_eq!(
        veto_hold(&vt0),
        Some((VETO[0].to_string(), "BlockedByDoNotRepair".to_string()))
    );
    assert!(!unschedulable(&vt0));
    assert_eq!(annotation(&vt0, keys::STATE), None);

    assert_eq!(
        ctl.forbidden_lines(),
        Vec::<String>::new(),
        "the controller hit a 403"
    );
    ctl.stop().await;
}

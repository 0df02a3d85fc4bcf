//! A preemption seen by the agent in its OCI metadata emulator, on the real control plane: the shipped
//! agent and controller configs; taint + cordon; a tiered drain whose PodDisruptionBudgets the real
//! disruption controller computes (maxUnavailable, a percentage minAvailable, a bare pod under
//! maxUnavailable — 0 allowed for real, a budget that allows 0, `unhealthyPodEvictionPolicy:
//! AlwaysAllow` with one unready pod); the replacement requested once; at the drain deadline the
//! held pods are still there and the hold names a PDB.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use nodekeeper_core::agent::sources::Cloud;
use nodekeeper_core::controller::policy::view::keys;
use serde_json::json;

use crate::drain::{apply, create_json, deployment};
use crate::support::*;

const NODE: &str = "pe-0";
const SPARE: &str = "pe-spare";
const APP: &str = "preempt";
/// The emulator's own path for an OCI preemption notice (OCI documents none; see docs/sources.md).
const EMULATOR_PREEMPT_PATH: &str = "/opc/v2/instance/preemptionAction";

fn pdb(name: &str, app: &str, spec: serde_json::Value) -> serde_json::Value {
    let mut s = spec;
    s["selector"] = json!({ "matchLabels": { "app": app } });
    json!({ "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": { "name": name, "namespace": APP }, "spec": s })
}

/// The workload of the test on `pe-0`, each app with its budget.
fn workload() -> Vec<serde_json::Value> {
    let pin = json!({ "preempt-test": "yes" });
    let with_pin = |mut d: serde_json::Value| {
        d["spec"]["template"]["spec"]["nodeSelector"] = pin.clone();
        d
    };
    let mut db = with_pin(deployment(APP, "db", NODE, 2));
    db["kind"] = json!("StatefulSet");
    db["spec"]["serviceName"] = json!("db");
    let solo = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "solo", "namespace": APP, "labels": { "app": "solo" } },
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 2,
            "containers": [{ "name": "app", "image": "registry.invalid/app:1" }]
        }
    });
    vec![
        with_pin(deployment(APP, "web", NODE, 3)),
        pdb("web", "web", json!({ "maxUnavailable": 1 })),
        db,
        pdb("db", "db", json!({ "minAvailable": "50%" })),
        solo,
        pdb("solo", "solo", json!({ "maxUnavailable": 1 })),
        with_pin(deployment(APP, "frozen", NODE, 1)),
        pdb("frozen", "frozen", json!({ "minAvailable": 1 })),
        with_pin(deployment(APP, "flaky", NODE, 2)),
        pdb(
            "flaky",
            "flaky",
            json!({ "minAvailable": 2, "unhealthyPodEvictionPolicy": "AlwaysAllow" }),
        ),
    ]
}

async fn pods_of(admin: &kube::Client, node: &str, app: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(admin.clone(), APP)
        .list(
            &ListParams::default()
                .labels(&format!("app={app}"))
                .fields(&format!("spec.nodeName={node}")),
        )
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

on_both!(an_agent_seen_preemption_drains_by_the_real_budgets_and_replaces_once);
async fn an_agent_seen_preemption_drains_by_the_real_budgets_and_replaces_once(
    c: &'static Cluster,
) {
    init_tracing();
    let _one_engine = c.exclusive().await;
    let admin = c.admin().await;
    let labels = |n: &str| json!({ "karpenter.sh/nodepool": "pe-pool", "preempt-test": "yes", "kubernetes.io/hostname": n });
    let _nodes = c
        .create_nodes(&[
            kwok_node(NODE, labels(NODE)),
            kwok_node(SPARE, labels(SPARE)),
        ])
        .await;
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes.cordon(SPARE).await.unwrap();
    apply(
        c,
        &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {APP}}}\n"),
    );
    create_json(&admin, APP, &workload()).await;
    wait_until(Duration::from_secs(60), "9 Ready pods on pe-0", || async {
        crate::drain::workload_pods(&admin, NODE).await == (9, 9)
    })
    .await;
    // One flaky pod turns unready (as its kubelet would report a failing readiness probe).
    let flaky = pods_of(&admin, NODE, "flaky").await;
    let unready = flaky[0].metadata.name.clone().unwrap();
    let ready_flaky = flaky[1].metadata.name.clone().unwrap();
    Api::<Pod>::namespaced(admin.clone(), APP)
        .patch_status(
            &unready,
            &PatchParams::default(),
            &Patch::Strategic(
                &json!({ "status": { "conditions": [{ "type": "Ready", "status": "False" }] } }),
            ),
        )
        .await
        .unwrap();
    nodes.uncordon(SPARE).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let (url, requests) = crate::failover::webhook_receiver().await;
    let config = controller_toml(dir.path(), "preempt", |t| webhook_provider(t, &url));
    let ctl = ControllerProc::start(c, &config, "preempt").await;
    let imds =
        nodekeeper_sim::imds::ImdsEmulator::start(Cloud::Oci, "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
    let endpoint = imds.url();
    let mut agent = start_shipped_agent(c, &admin, NODE, dir.path(), ctl.addr.port(), |t| {
        let s = t["sources"].as_table_mut().unwrap();
        s.insert("cloud".into(), "oci".into());
        s.insert("endpoint".into(), endpoint.clone().into());
        s.insert("poll_interval".into(), "200ms".into());
        let path: toml::Table = toml::from_str(&format!(
            "path = \"{EMULATOR_PREEMPT_PATH}\"\nkind = \"preemption\""
        ))
        .unwrap();
        let mut oci = toml::Table::new();
        oci.insert("poll_paths".into(), toml::Value::Array(vec![path.into()]));
        s.insert("oci".into(), oci.into());
    })
    .await;
    wait_first_report(&nodes, NODE).await;

    // Reclaimed in 45 s: the drain deadline is 30 s from now (safety margin 15 s).
    imds.preempt(Duration::from_secs(45));
    let t0 = tokio::time::Instant::now();
    let n = wait_interrupted(&nodes, NODE, Duration::from_secs(10)).await;
    eprintln!("notice → taint + cordon seen after {:?}", t0.elapsed());
    assert!(annotation(&n, keys::INTERRUPTION).is_some_and(|v| v.starts_with("preemption/")));
    if c.is_real() {
        // kube-apiserver names a write's field manager after its User-Agent: the cordon is the
        // controller's, by name (the sim keeps no managedFields).
        let owner = n
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .find(|m| {
                m.fields_v1
                    .as_ref()
                    .is_some_and(|f| f.0.pointer("/f:spec/f:unschedulable").is_some())
            })
            .and_then(|m| m.manager.clone());
        assert_eq!(owner.as_deref(), Some("nodekeeper-controller"));
    }

    // What the budgets allow leaves; the rest is held at the deadline.
    wait_until(
        Duration::from_secs(40),
        "web, db and the unready flaky pod gone",
        || async {
            pods_of(&admin, NODE, "web").await.is_empty()
                && pods_of(&admin, NODE, "db").await.is_empty()
                && !pods_of(&admin, NODE, "flaky")
                    .await
                    .iter()
                    .any(|p| p.metadata.name.as_deref() == Some(unready.as_str()))
        },
    )
    .await;
    // Until the deadline the Node says which PDB holds it; after, that the deadline passed.
    let holds = std::sync::Mutex::new(std::collections::BTreeSet::new());
    wait_until(
        Duration::from_secs(45),
        "the drain ended at its deadline",
        || {
            let ended = ctl
                .lines
                .lock()
                .unwrap()
                .iter()
                .any(|l| l["message"] == "drain ended" && l["node"] == NODE);
            let (holds, nodes) = (&holds, nodes.clone());
            async move {
                if let Some(b) = nodes
                    .get(NODE)
                    .await
                    .ok()
                    .as_ref()
                    .and_then(|n| annotation(n, keys::BLOCKED))
                {
                    let v: serde_json::Value = serde_json::from_str(b).unwrap_or_default();
                    holds.lock().unwrap().insert(format!(
                        "{}:{}",
                        v["kind"].as_str().unwrap_or(""),
                        v["pdb"].as_str().unwrap_or("")
                    ));
                }
                ended
            }
        },
    )
    .await;
    // The notice is logged as the controller takes it, the cordon as it lands, before the drain
    // starts (docs/controller.md).
    let received = ctl.position("notice received", NODE);
    let written = ctl.position("node written", NODE);
    let started = ctl.position("drain started", NODE);
    assert!(
        received.is_some() && received < written && written.is_some() && written < started,
        "`notice received`, then `node written`, then `drain started`:\n{}",
        ctl.about(NODE)
    );
    let line = ctl.lines.lock().unwrap()[received.unwrap_or_default()].clone();
    assert_eq!(log_field(&line, "kind"), "preemption", "{line}");
    assert!(log_field(&line, "waited_ms").is_u64(), "waited_ms: {line}");
    let line = ctl.lines.lock().unwrap()[written.unwrap_or_default()].clone();
    let changes = log_field(&line, "changes").as_str().unwrap_or_default();
    assert!(
        changes.split(',').any(|k| k == "cordon") && changes.split(',').any(|k| k == "taint"),
        "the first write cordons and taints: {line}"
    );
    // One PATCH: computed from the copy the controller held (the answer to its own condition
    // write of the agent's reports, or the watch cache), not refused as stale and re-read.
    let rereads = log_field(&line, "rereads").as_u64();
    assert_eq!(rereads, Some(0), "the cordon was one PATCH: {line}");
    let holds = holds.into_inner().unwrap();
    eprintln!("holds seen: {holds:?}");
    assert!(
        holds.iter().any(|h| [
            "pdb:preempt/solo",
            "pdb:preempt/frozen",
            "pdb:preempt/flaky"
        ]
        .contains(&h.as_str())),
        "the hold named a blocking PDB: {holds:?}"
    );
    let names = |ps: Vec<Pod>| {
        ps.into_iter()
            .filter_map(|p| p.metadata.name)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(pods_of(&admin, NODE, "solo").await),
        vec!["solo"],
        "a bare pod's PDB allows 0 for real"
    );
    assert_eq!(
        pods_of(&admin, NODE, "frozen").await.len(),
        1,
        "minAvailable 1 of 1 allows 0"
    );
    assert_eq!(
        names(pods_of(&admin, NODE, "flaky").await),
        vec![ready_flaky],
        "only the unready flaky pod may go"
    );
    // The hold after the deadline (written just after the drain's end).
    wait_until(
        Duration::from_secs(10),
        "the hold: deadline passed",
        || async {
            let n = nodes.get(NODE).await.unwrap();
            annotation(&n, keys::BLOCKED).is_some_and(|b| b.contains("\"kind\":\"deadline\""))
        },
    )
    .await;

    let reqs = requests.lock().unwrap().clone();
    assert_eq!(reqs.len(), 1, "one replacement request: {reqs:?}");
    assert_eq!(reqs[0]["node"], NODE);
    assert_eq!(reqs[0]["reason"], "interruption:preemption");
    assert_eq!(
        ctl.forbidden_lines(),
        Vec::<String>::new(),
        "the controller hit a 403"
    );
    agent.terminate(Duration::from_secs(10)).await;
    ctl.stop().await;
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .delete(APP, &Default::default())
        .await;
}

on_both!(oci_events_deliveries_taint_and_cordon_once_stored);
/// An OCI Events delivery (OCI Notifications' HTTPS POST of a Compute "instance preemption action"
/// event, written here from Oracle's event reference, not from nodekeeper's code) for each of several
/// nodes: the controller answers 2xx only once the Node stores the notice, taint and cordon are then
/// visible to a watch, and a redelivery changes nothing. Prints POST → taint latencies (a figure for
/// docs/dev/benchmarks.md, not an assertion).
async fn oci_events_deliveries_taint_and_cordon_once_stored(c: &'static Cluster) {
    use futures::StreamExt;
    use kube::runtime::{watcher, WatchStreamExt};
    init_tracing();
    let _one_engine = c.exclusive().await;
    let admin = c.admin().await;
    const N: usize = 10;
    let names: Vec<String> = (0..N).map(|i| format!("oe-{i}")).collect();
    let nodes: Vec<Node> = names
        .iter()
        .map(|n| {
            let mut node = kwok_node(
                n,
                json!({ "karpenter.sh/nodepool": "oe-pool", "kubernetes.io/hostname": n }),
            );
            node.spec.as_mut().unwrap().provider_id = Some(format!("ocid1.instance.oc1.phx.{n}"));
            node
        })
        .collect();
    let _nodes = c.create_nodes(&nodes).await;
    let dir = tempfile::tempdir().unwrap();
    let token = "oci-events-test-token-0123456789";
    let config = controller_toml(dir.path(), "oci-events", |t| {
        let mut oe = toml::Table::new();
        oe.insert("enabled".into(), true.into());
        oe.insert("token".into(), token.into());
        oe.insert("confirm_subscriptions".into(), false.into());
        t["controller"]
            .as_table_mut()
            .unwrap()
            .insert("oci_events".into(), oe.into());
    });
    let ctl = ControllerProc::start(c, &config, "oci-events").await;
    let https = crate::ctl::https(&dir.path().join("ca.pem"), ctl.addr);
    wait_leading(&admin, "nodekeeper-oci-events", "oci-events").await;

    // A watch that stamps when each node is first seen tainted and cordoned.
    let seen: std::sync::Arc<
        std::sync::Mutex<std::collections::HashMap<String, tokio::time::Instant>>,
    > = Default::default();
    let keep = seen.clone();
    let api: Api<Node> = Api::all(admin.clone());
    let watch = tokio::spawn(async move {
        let mut s = std::pin::pin!(watcher(
            api,
            watcher::Config::default().labels("karpenter.sh/nodepool=oe-pool")
        )
        .applied_objects());
        while let Some(Ok(n)) = s.next().await {
            let tainted = n
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|ts| ts.iter().any(|t| t.key == "nodekeeper.io/interruption"));
            if tainted && unschedulable(&n) {
                keep.lock()
                    .unwrap()
                    .entry(n.metadata.name.clone().unwrap())
                    .or_insert_with(tokio::time::Instant::now);
            }
        }
    });
    let delivery = |node: &str| {
        json!({
            "eventType": "com.oraclecloud.computeapi.instancepreemptionaction",
            "cloudEventsVersion": "0.1", "eventTypeVersion": "2.0", "source": "ComputeApi",
            "eventTime": chrono::Utc::now().to_rfc3339(), "contentType": "application/json",
            "eventID": format!("evt-{node}"),
            "data": { "resourceId": format!("ocid1.instance.oc1.phx.{node}"), "resourceName": node,
                      "additionalDetails": { "preemptionAction": "TERMINATE" } }
        })
    };
    let url = crate::ctl::url(ctl.addr, &format!("/v1/oci-events/{token}"));
    let deliver = |node: &str| {
        let body = serde_json::to_vec(&delivery(node)).unwrap();
        let (https, url) = (&https, &url);
        async move {
            // As OCI Notifications does: a 503 (the controller's node cache not synced yet) is
            // delivered again.
            let headers = [("content-type", "application/json")];
            for _ in 0..50 {
                let code =
                    crate::ctl::request(https, "POST", url, None, &headers, Some(body.clone()))
                        .await
                        .unwrap()
                        .0;
                if code != 503 {
                    return code;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            503
        }
    };
    let mut sent = Vec::new();
    for n in &names {
        let t0 = tokio::time::Instant::now();
        assert_eq!(deliver(n).await, 200, "delivery for {n}");
        sent.push((n.clone(), t0, t0.elapsed()));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_until(
        Duration::from_secs(10),
        "every node tainted and cordoned in the watch",
        || async { seen.lock().unwrap().len() == N },
    )
    .await;
    watch.abort();
    let mut lat: Vec<f64> = sent
        .iter()
        .map(|(n, t0, _)| (seen.lock().unwrap()[n] - *t0).as_secs_f64() * 1e3)
        .collect();
    lat.sort_by(f64::total_cmp);
    let answer: Vec<f64> = sent.iter().map(|(_, _, d)| d.as_secs_f64() * 1e3).collect();
    eprintln!(
        "OCI Events POST → taint + cordon in a watch, {N} nodes: p50 {:.1} ms, max {:.1} ms; POST answered after {:?} ms",
        lat[N / 2],
        lat[N - 1],
        answer.iter().map(|a| a.round()).collect::<Vec<_>>()
    );
    // A redelivery of the same event: answered 2xx, nothing written again.
    let api: Api<Node> = Api::all(admin.clone());
    let before = api.get(&names[0]).await.unwrap();
    let before = annotation(&before, keys::INTERRUPTION).map(str::to_string);
    assert_eq!(deliver(&names[0]).await, 200, "redelivery");
    let n = api.get(&names[0]).await.unwrap();
    assert!(
        before
            .as_deref()
            .is_some_and(|v| v.starts_with("preemption/")),
        "{before:?}"
    );
    assert_eq!(
        annotation(&n, keys::INTERRUPTION).map(str::to_string),
        before,
        "a redelivery is the same notice"
    );
    assert_eq!(
        ctl.forbidden_lines(),
        Vec::<String>::new(),
        "the controller hit a 403"
    );
    ctl.stop().await;
}

/// Waits until `node` is tainted `nodekeeper.io/interruption` and cordoned; returns it then.
pub async fn wait_interrupted(nodes: &Api<Node>, node: &str, within: Duration) -> Node {
    wait_for(within, &format!("{node} tainted and cordoned"), || async {
        let n = nodes.get(node).await.ok()?;
        (has_taint(&n, "nodekeeper.io/interruption") && unschedulable(&n)).then_some(n)
    })
    .await
}

on_both!(the_leader_labels_its_own_pod_for_the_events_service);
/// `[controller.leader] pod_label` as the shipped controller ServiceAccount: the leader labels its
/// pod `nodekeeper.io/leader=true` (the `nodekeeper-controller-events` Service's selector, so OCI
/// deliveries reach the leader only) — proof that the shipped Role allows the patch. Unit and sim
/// tests (`engine_oci_notice::only_the_leaders_pod_takes_deliveries_so_the_first_try_is_stored`)
/// cover two replicas and the failover.
async fn the_leader_labels_its_own_pod_for_the_events_service(c: &'static Cluster) {
    init_tracing();
    let admin = c.admin().await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let name = format!("nk-label-{}", rand_id());
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS,
                     "labels": {"app.kubernetes.io/name": "nodekeeper-controller"}},
        "spec": {"containers": [{"name": "controller", "image": "nodekeeper"}]}}))
    .unwrap();
    pods.create(&Default::default(), &pod).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let identity = format!("label-{}", rand_id());
    let config = controller_toml(dir.path(), &identity, |t| {
        let leader = t["controller"]["leader"].as_table_mut().unwrap();
        leader.insert("pod_label".into(), true.into());
        leader.insert("pod_name".into(), name.clone().into());
    });
    let ctl = ControllerProc::start(c, &config, &identity).await;
    wait_leading(&admin, &format!("nodekeeper-{identity}"), &identity).await;
    let label = || {
        let (pods, name) = (pods.clone(), name.clone());
        async move {
            pods.get(&name)
                .await
                .unwrap()
                .metadata
                .labels
                .unwrap_or_default()
                .get("nodekeeper.io/leader")
                .cloned()
        }
    };
    wait_until(
        Duration::from_secs(20),
        "the leader's pod labelled",
        || async { label().await.as_deref() == Some("true") },
    )
    .await;
    assert!(
        ctl.forbidden_lines().is_empty(),
        "{:?}",
        ctl.forbidden_lines()
    );
    drop(ctl);
    pods.delete(&name, &Default::default()).await.unwrap();
}

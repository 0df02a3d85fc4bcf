//! Two controllers on the real control plane, one Lease: an agent reports a preemption, the leader
//! starts the drain and evicts one pod; the PDB (`maxUnavailable: 1`, computed by the real disruption
//! controller) then blocks it, as the evicted pod's replacement cannot be scheduled (the only other
//! node is cordoned). The leader is SIGKILLed there, mid-drain. The standby takes the Lease; the spare
//! node is uncordoned; the standby's drain evicts the rest, and the replacement is requested exactly
//! once (a webhook receiver on loopback counts).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use nodekeeper_core::agent::sources::{EventKind, NodeEvent, NODE_EVENT_VERSION};
use nodekeeper_core::controller::policy::view::keys;
use serde_json::json;

use crate::drain::{create_json, workload_pods};
use crate::support::*;

const NODE: &str = "ha-0";
const SPARE: &str = "ha-spare";
const NS_APP: &str = "failover";
/// The one Lease both controllers contend for.
const LEASE: &str = "nodekeeper-failover";

/// A loopback HTTP server that records every replacement request it is sent.
pub async fn webhook_receiver() -> (String, Arc<Mutex<Vec<serde_json::Value>>>) {
    webhook_receiver_on("127.0.0.1").await
}

/// [`webhook_receiver`] listening on `ip` (a free port), served on the current runtime.
pub async fn webhook_receiver_on(ip: &str) -> (String, Arc<Mutex<Vec<serde_json::Value>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let keep = seen.clone();
    let app = axum::Router::new().route(
        "/replace",
        axum::routing::post(move |body: axum::Json<serde_json::Value>| {
            let keep = keep.clone();
            async move {
                keep.lock().unwrap().push(body.0);
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let url = format!("http://{}/replace", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, seen)
}

pub fn preemption(now: chrono::DateTime<chrono::Utc>) -> NodeEvent {
    NodeEvent {
        version: NODE_EVENT_VERSION,
        id: "ha-preempt-1".into(),
        kind: EventKind::Preemption,
        cloud: None,
        source: "oci/instance-action".into(),
        not_before: Some(now + chrono::Duration::seconds(180)),
        deadline: None,
        detected_at: now,
        detail: Default::default(),
    }
}

/// Two nodes `<p>-0` and `<p>-spare` of one NodePool, the spare cordoned; Deployment `web` (6 pods, grace 3 s)
/// on `<p>-0` with a PDB `maxUnavailable: 1` in namespace `ns`; a webhook receiver; controller configs that
/// contend for `lease` and replace through the receiver. The nodes go when this drops.
pub struct HaSetup {
    pub dir: tempfile::TempDir,
    pub url: String,
    pub requests: Arc<Mutex<Vec<serde_json::Value>>>,
    lease: String,
    _nodes: NodesGuard,
}

impl HaSetup {
    pub async fn start(
        c: &'static Cluster,
        admin: &kube::Client,
        p: &str,
        ns: &str,
        lease: &str,
    ) -> HaSetup {
        let (node, spare) = (format!("{p}-0"), format!("{p}-spare"));
        let selector = format!("{p}-test");
        let labels = |n: &str| json!({ "karpenter.sh/nodepool": format!("{p}-pool"), selector.clone(): "yes", "kubernetes.io/hostname": n });
        let guard = c
            .create_nodes(&[
                kwok_node(&node, labels(&node)),
                kwok_node(&spare, labels(&spare)),
            ])
            .await;
        // Everything starts on the first node: the spare is cordoned until the workload runs.
        Api::<Node>::all(admin.clone())
            .cordon(&spare)
            .await
            .unwrap();
        crate::drain::apply(
            c,
            &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n"),
        );
        let mut web = crate::drain::deployment(ns, "web", &node, 6);
        web["spec"]["template"]["spec"]["nodeSelector"] = json!({ selector.clone(): "yes" });
        web["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = json!(3);
        create_json(
            admin,
            ns,
            &[
                web,
                json!({
                    "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                    "metadata": { "name": "web", "namespace": ns },
                    "spec": { "maxUnavailable": 1, "selector": { "matchLabels": { "app": "web" } } }
                }),
            ],
        )
        .await;
        wait_until(
            Duration::from_secs(60),
            &format!("6 Ready pods on {node}"),
            || async { workload_pods(admin, &node).await == (6, 6) },
        )
        .await;
        let (url, requests) = webhook_receiver().await;
        HaSetup {
            dir: tempfile::tempdir().unwrap(),
            url,
            requests,
            lease: lease.to_string(),
            _nodes: guard,
        }
    }

    /// The config of replica `id` (each call writes the test's serving certificate anew: make every
    /// replica's config before starting the first).
    pub fn config(&self, id: &str) -> std::path::PathBuf {
        controller_toml(self.dir.path(), id, |t| {
            t["controller"]["leader"]
                .as_table_mut()
                .unwrap()
                .insert("lease_name".into(), self.lease.clone().into());
            webhook_provider(t, &self.url);
        })
    }

    /// Gives the standby `b` three more reconciles to (wrongly) ask again, then checks that exactly one
    /// replacement was asked for, for `node`, and that `b` never hit a 403.
    pub async fn one_replacement_by(&self, b: &ControllerProc, node: &str) {
        let https = crate::ctl::https(&self.dir.path().join("ca.pem"), b.addr);
        let reconciles = || async {
            let (_, text) = crate::ctl::get(&https, b.addr, "/metrics").await.unwrap();
            metric(&text, "nodekeeper_engine_reconciles_total")
        };
        let before = reconciles().await;
        wait_until(
            Duration::from_secs(20),
            "three more reconciles by the standby",
            || async { reconciles().await >= before + 3.0 },
        )
        .await;
        let requests = self.requests.lock().unwrap().clone();
        let ids: std::collections::BTreeSet<&str> = requests
            .iter()
            .filter_map(|r| r["request_id"].as_str())
            .collect();
        assert_eq!(
            ids.len(),
            1,
            "exactly one replacement asked for: {requests:?}"
        );
        assert_eq!(requests[0]["node"], node);
        assert_eq!(
            b.forbidden_lines(),
            Vec::<String>::new(),
            "the standby hit a 403"
        );
    }
}

on_both!(the_standby_resumes_a_drain_whose_leader_was_killed_and_replaces_once);
async fn the_standby_resumes_a_drain_whose_leader_was_killed_and_replaces_once(
    c: &'static Cluster,
) {
    init_tracing();
    let _one_engine = c.exclusive().await;
    let admin = c.admin().await;
    let ha = HaSetup::start(c, &admin, "ha", NS_APP, LEASE).await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let dir = &ha.dir;
    let (cfg_a, cfg_b) = (ha.config("ha-a"), ha.config("ha-b"));
    let mut a = ControllerProc::start(c, &cfg_a, "ha-a").await;
    wait_leading(&admin, LEASE, "ha-a").await;
    let b = ControllerProc::start(c, &cfg_b, "ha-b").await;

    // The agent on ha-0 reports the preemption to the leader.
    let token = agent_report_token(&admin, NODE).await;
    let https = crate::ctl::https(&dir.path().join("ca.pem"), a.addr);
    let mut report = crate::ctl::report(NODE, 1, &[]);
    report.events = vec![preemption(chrono::Utc::now())];

    // Until the leader takes it (a 503 can come before its own flag follows its Lease write).
    report_until(&https, a.addr, &token, &report, |_| true).await;

    // Mid-drain: one pod evicted and gone, the PDB holding the other five (the Node says so); the
    // leader dies there without releasing its Lease.
    let blocked = wait_for(
        Duration::from_secs(60),
        "the drain held by the PDB after one eviction",
        || async {
            let n = nodes.get(NODE).await.ok()?;
            let b = annotation(&n, keys::BLOCKED)?.to_string();
            (b.contains("failover/web") && workload_pods(&admin, NODE).await.0 == 5).then_some(b)
        },
    )
    .await;
    eprintln!("blocked: {blocked}");
    a.child.start_kill().unwrap();
    let _ = a.child.wait().await;

    wait_leading(&admin, LEASE, "ha-b").await;
    // Room for the evicted pods' replacements: the PDB allows the next eviction, one at a time.
    nodes.uncordon(SPARE).await.unwrap();
    wait_until(
        Duration::from_secs(90),
        "the drain finished by ha-b",
        || async { workload_pods(&admin, NODE).await.0 == 0 },
    )
    .await;
    wait_until(
        Duration::from_secs(10),
        "ha-b's drain of ha-0 completed",
        || async {
            b.lines.lock().unwrap().iter().any(|l| {
                l["message"] == "drain ended" && l["node"] == NODE && l["result"] == "completed"
            })
        },
    )
    .await;
    // The last evicted pod's replacement is created and scheduled by the ReplicaSet controller and the
    // scheduler after the drain ended (a loaded CI machine showed 5 of 6 at that instant).
    wait_until(
        Duration::from_secs(60),
        "the workload moved to the spare (6 pods)",
        || async { workload_pods(&admin, SPARE).await.0 == 6 },
    )
    .await;
    let n = nodes.get(NODE).await.unwrap();
    assert!(unschedulable(&n));
    assert!(
        annotation(&n, keys::REPLACEMENT_REQUESTED).is_some(),
        "replacement recorded on the Node"
    );
    ha.one_replacement_by(&b, NODE).await;
    b.stop().await;
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .delete(NS_APP, &Default::default())
        .await;
}

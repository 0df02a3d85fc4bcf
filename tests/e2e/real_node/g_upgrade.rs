//! (h) `helm upgrade` from the previous chart version on the real node. The Helm node is
//! installed from the newest version recorded in `packaging/helm/releases.tsv` (its chart from
//! `git archive`) and upgraded to the chart in the tree by its fixture ([`from_previous`]), so
//! that every Helm test runs on an upgraded install; this test asserts what the upgrade did. The
//! image tag moves too, so that every pod rolls as in a release: agents keep reporting, no node
//! is cordoned, tainted or drained, and the controller's Lease moves once.
//!
//! Both tags name the same build: the previous version's agents are not rebuilt from the old
//! commit. What an older agent sends a newer controller is proven by the golden report bodies
//! (`tests/fixtures/reports`, `report_versions`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use serde_json::json;

use super::a_pods::audit;
use super::{
    agent_silent, last_sequence, one_pod, real_node_helm, unknown_conditions, RealNode, NODE,
};
use crate::support::*;

const CHART: &str = "packaging/helm/nodekeeper";
const CONTROLLER_SA: &str = "system:serviceaccount:nodekeeper:nodekeeper-controller";
/// The image tag the previous version's release runs.
pub const PREVIOUS_TAG: &str = "previous";

/// What the upgrade did, as its fixture saw it.
#[derive(Debug)]
pub struct Upgrade {
    /// The chart version upgraded from.
    pub from: String,
    /// The agent's and the controller's pod uids before and after.
    pub agent: (String, String),
    pub controller: (String, String),
    /// The controller Lease's `leaseTransitions` before and after, and its holder after.
    pub transitions: (i32, i32),
    pub holder: String,
    /// The new controller pod's name.
    pub new_controller: String,
    /// What a watch of the Node saw nodekeeper do to it (taints, cordons) during the upgrade.
    pub disrupted: Vec<String>,
    /// Evictions and pod deletions by the controller during the upgrade (audit records).
    pub evictions: Vec<serde_json::Value>,
    /// `AgentSilent` Events about the node, before and after.
    pub silent: (usize, usize),
    /// nodekeeper's conditions Unknown after the upgrade.
    pub unknown: Vec<NodeCondition>,
}

/// The newest version of `packaging/helm/releases.tsv` and its chart from git, under `dir`.
pub fn previous_chart(dir: &Path) -> (String, PathBuf) {
    let text = std::fs::read_to_string(repo().join("packaging/helm/releases.tsv")).unwrap();
    let line = text
        .lines()
        .rfind(|l| !l.starts_with('#') && !l.trim().is_empty())
        .expect("packaging/helm/releases.tsv records no chart version");
    let mut f = line.split('\t');
    let (Some(version), Some(commit)) = (f.next(), f.next()) else {
        panic!("packaging/helm/releases.tsv: not `version<TAB>commit…`: {line}");
    };
    let current = std::fs::read_to_string(repo().join(CHART).join("Chart.yaml")).unwrap();
    assert!(
        !current.contains(&format!("\nversion: {version}\n")),
        "Chart.yaml still carries the recorded version {version}: bump it"
    );
    let dir = dir.join(format!("chart-{version}"));
    std::fs::create_dir_all(&dir).unwrap();
    let script = r#"set -euo pipefail; git -C "$1" archive "$2" "$3" | tar -x -C "$4""#;
    let out = Command::new("bash")
        .args(["-c", script, "chart_at"])
        .arg(repo())
        .args([commit, CHART])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the chart at {commit} from git (a clone without that commit cannot run this test): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (version.to_string(), dir.join(CHART))
}

/// The node's Helm values with the previous release's image tag.
pub fn previous_values(n: &RealNode) -> serde_json::Value {
    let mut v = n.helm_values();
    v["image"] = json!({ "tag": PREVIOUS_TAG });
    v
}

/// `leaseTransitions` and holder of the controller's Lease.
async fn lease(n: &RealNode) -> (i32, String) {
    let leases: Api<Lease> = Api::namespaced(n.cluster.admin().await, NS);
    let spec = leases
        .get("nodekeeper-controller")
        .await
        .unwrap()
        .spec
        .unwrap_or_default();
    (
        spec.lease_transitions.unwrap_or(0),
        spec.holder_identity.unwrap_or_default(),
    )
}

/// `helm upgrade` of the node (installed from chart `from`) to the chart in the tree, watching it.
pub async fn from_previous(n: &'static RealNode, from: String) -> Upgrade {
    let nodes: Api<Node> = Api::all(n.cluster.admin().await);
    wait_first_report(&nodes, NODE).await;
    let controller0 = one_pod(n, "nodekeeper-controller").await;
    let (transitions0, _) = wait_for(
        Duration::from_secs(60),
        "the previous release's controller leads",
        || async {
            let l = lease(n).await;
            l.1.starts_with(&controller0.0).then_some(l)
        },
    )
    .await;
    let agent0 = one_pod(n, "nodekeeper-agent").await;
    let silent0 = agent_silent(n).await;
    let seq = last_sequence(&nodes).await;
    let t0 = chrono::Utc::now();

    // Every state of the Node during the upgrade: cordoned, or tainted by nodekeeper?
    let disrupted: Arc<Mutex<Vec<String>>> = Default::default();
    let keep = disrupted.clone();
    let watched = nodes.clone();
    let watch = tokio::spawn(async move {
        let config = watcher::Config::default().fields(&format!("metadata.name={NODE}"));
        let mut s = std::pin::pin!(watcher(watched, config).applied_objects());
        while let Some(Ok(node)) = s.next().await {
            let spec = node.spec.unwrap_or_default();
            let taints = spec.taints.unwrap_or_default();
            let ours = taints
                .iter()
                .filter(|t| t.key.starts_with("nodekeeper.io/"));
            let seen: Vec<String> = ours
                .map(|t| format!("taint {}", t.key))
                .chain((spec.unschedulable == Some(true)).then(|| "cordoned".into()))
                .collect();
            keep.lock().unwrap().extend(seen);
        }
    });

    let chart = repo().join(CHART);
    let values = n.helm_values();
    tokio::task::spawn_blocking(move || {
        n.helm("upgrade", &chart, &values);
        n.wait_ready(Duration::from_secs(180));
    })
    .await
    .unwrap();
    let agent = one_pod(n, "nodekeeper-agent").await;
    let controller = one_pod(n, "nodekeeper-controller").await;
    wait_until(
        Duration::from_secs(60),
        "a report from the new agent pod",
        || async { last_sequence(&nodes).await != seq },
    )
    .await;
    let (transitions, holder) = wait_for(
        Duration::from_secs(60),
        "the new controller pod leads",
        || async {
            let l = lease(n).await;
            l.1.starts_with(&controller.0).then_some(l)
        },
    )
    .await;
    watch.abort();

    let evictions = audit(n, CONTROLLER_SA, |e| {
        e["objectRef"]["resource"] == "pods"
            && (e["objectRef"]["subresource"] == "eviction" || e["verb"] == "delete")
            && e["requestReceivedTimestamp"]
                .as_str()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .is_some_and(|t| t >= t0)
    });
    let disrupted = disrupted.lock().unwrap().clone();
    Upgrade {
        from,
        agent: (agent0.1, agent.1),
        controller: (controller0.1, controller.1),
        transitions: (transitions0, transitions),
        holder,
        new_controller: controller.0,
        disrupted,
        evictions,
        silent: (silent0, agent_silent(n).await),
        unknown: unknown_conditions(n).await,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_upgrade_from_the_previous_chart_keeps_agents_reporting() {
    init_tracing();
    let n = real_node_helm();
    let u = n.upgrade.get().expect("the Helm node was upgraded");
    eprintln!("{u:#?}");
    assert_ne!(u.agent.0, u.agent.1, "the agent pod did not roll");
    assert_ne!(
        u.controller.0, u.controller.1,
        "the controller did not roll"
    );
    assert_eq!(
        u.transitions.1 - u.transitions.0,
        1,
        "the Lease moved {} times (holder {}, new pod {})",
        u.transitions.1 - u.transitions.0,
        u.holder,
        u.new_controller
    );
    assert_eq!(
        u.disrupted,
        Vec::<String>::new(),
        "the upgrade disrupted the node"
    );
    assert!(u.evictions.is_empty(), "pods evicted: {:?}", u.evictions);
    assert_eq!(
        u.silent.1, u.silent.0,
        "the controller saw the agent silent during the upgrade from {}",
        u.from
    );
    assert!(u.unknown.is_empty(), "{:?}", u.unknown);
}

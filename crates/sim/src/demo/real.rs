//! `nodekeeper demo --kubeconfig FILE`: the demo's scenario on a real API server instead of the
//! embedded sim (`scripts/demo.sh --real` builds and starts one: kube-apiserver, etcd,
//! kube-controller-manager, kube-scheduler and KWOK, see docs/dev/testing.md).
//!
//! FILE is an admin kubeconfig, used only to seed the scenario (KWOK Nodes, Deployments, PDBs,
//! DaemonSets), to inject faults as a kubelet would, to mint ServiceAccount tokens and to watch.
//! nodekeeper itself runs as in production: the controller with a TokenRequest token of the
//! `nodekeeper-controller` ServiceAccount, each agent with tokens bound to the shipped
//! DaemonSet's pod on its node, so the real RBAC, admission policy and TokenReview apply. The
//! shipped manifests must be installed (the script does: `kubectl kustomize manifests/`).
//! Replacements go to the webhook provider, answered by [`Cloud`], a stand-in for the cloud:
//! it launches a new KWOK node in the pool at once and terminates the old one once drained.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};

use super::agents::{AgentCredentials, Credentials};
use super::DemoError;
use crate::apiserver::scenario::{self, Pool, Scenario};
use nodekeeper_core::controller::act::provider::{ProviderConfig, WebhookConfig};

/// The namespace, ServiceAccounts and token audience of the shipped manifests.
const NS: &str = "nodekeeper";
const CONTROLLER_SA: &str = "nodekeeper-controller";
const AGENT_SA: &str = "nodekeeper-agent";
const AGENT_POD_SELECTOR: &str = "app.kubernetes.io/name=nodekeeper-agent";
const REPORT_AUDIENCE: &str = "nodekeeper";
/// KWOK manages nodes with this annotation (scripts/k8s-cluster.sh).
const KWOK_ANNOTATION: &str = "kwok.x-k8s.io/node";
/// Nodes with this label are skipped by the KWOK node stages of scripts/setup-k8s.sh, so a
/// Ready=False posted "by the kubelet" stays.
const KUBELET_LABEL: &str = "nodekeeper.test/kubelet";
const WEBHOOK_SECRET: &str = "nodekeeper-demo-webhook";

/// A real cluster the demo runs on.
pub struct RealCluster {
    /// Admin client (seeding, faults, tokens, watching).
    pub admin: kube::Client,
    /// The API server's URL.
    pub server: String,
    /// `kube-apiserver` version (`/version` gitVersion).
    pub version: String,
    kubeconfig: Kubeconfig,
    cloud: Arc<Cloud>,
}

fn start_err(what: impl std::fmt::Display) -> DemoError {
    DemoError::Start(what.to_string())
}

impl RealCluster {
    /// Connects with the admin kubeconfig at `path` and checks that the shipped manifests are
    /// installed.
    pub async fn connect(path: &Path) -> Result<Arc<Self>, DemoError> {
        let kubeconfig = Kubeconfig::read_from(path)
            .map_err(|e| DemoError::Invalid(format!("{}: {e}", path.display())))?;
        let cfg =
            kube::Config::from_custom_kubeconfig(kubeconfig.clone(), &KubeConfigOptions::default())
                .await
                .map_err(|e| DemoError::Invalid(format!("{}: {e}", path.display())))?;
        let server = cfg.cluster_url.to_string();
        let admin = kube::Client::try_from(cfg)
            .map_err(|e| start_err(format!("client for {server}: {e}")))?;
        let version = admin
            .apiserver_version()
            .await
            .map_err(|e| start_err(format!("{server}: /version: {e}")))?
            .git_version;
        let sa: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(admin.clone(), NS);
        for name in [CONTROLLER_SA, AGENT_SA] {
            let found = sa
                .get_opt(name)
                .await
                .map_err(|e| start_err(format!("{server}: serviceaccount {NS}/{name}: {e}")))?;
            if found.is_none() {
                return Err(start_err(format!(
                    "{server}: serviceaccount {NS}/{name} not found: install the shipped manifests \
                     first (`kubectl kustomize manifests/ | kubectl apply -f -`; scripts/demo.sh --real does)"
                )));
            }
        }
        let cloud = Arc::new(Cloud::new(admin.clone()).await?);
        Ok(Arc::new(RealCluster {
            admin,
            server,
            version,
            kubeconfig,
            cloud,
        }))
    }

    /// Creates the scenario's objects (Nodes as KWOK nodes) and waits until every node is
    /// Ready, has its agent pod, and every workload pod runs.
    pub async fn seed(&self, sc: &Scenario, timeout: Duration) -> Result<(), DemoError> {
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let mut nodes = Vec::new();
        for (res, ns, mut obj) in scenario::objects(sc, &now, false) {
            if res.kind == "Node" {
                obj = kwok_node(obj);
                if let Some(n) = obj.pointer("/metadata/name").and_then(Value::as_str) {
                    nodes.push(n.to_string());
                }
            }
            let gvk = GroupVersionKind::gvk(res.group, res.version, res.kind);
            let ar = ApiResource::from_gvk_with_plural(&gvk, res.plural);
            let api: Api<DynamicObject> = if res.namespaced {
                Api::namespaced_with(self.admin.clone(), &ns, &ar)
            } else {
                Api::all_with(self.admin.clone(), &ar)
            };
            let mut body: DynamicObject = serde_json::from_value(obj)
                .map_err(|e| start_err(format!("scenario object: {e}")))?;
            body.types = Some(kube::core::TypeMeta {
                api_version: res.api_version(),
                kind: res.kind.into(),
            });
            let name = body.metadata.name.clone().unwrap_or_default();
            match api.create(&PostParams::default(), &body).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 && res.kind == "Namespace" => {}
                Err(e) => {
                    return Err(start_err(format!(
                        "creating {} {ns}/{name}: {e}",
                        res.plural
                    )))
                }
            }
        }
        let start = Instant::now();
        let nodes_api: Api<Node> = Api::all(self.admin.clone());
        let pods: Api<Pod> = Api::all(self.admin.clone());
        loop {
            let ready = nodes_api
                .list(&ListParams::default())
                .await
                .map(|l| {
                    l.items
                        .iter()
                        .filter(|n| nodekeeper_core::controller::act::provider::is_ready(n))
                        .count()
                })
                .unwrap_or(0);
            let (agents, pending) = match pods.list(&ListParams::default()).await {
                Ok(l) => (
                    l.items
                        .iter()
                        .filter(|p| {
                            is_agent_pod(p)
                                && p.spec.as_ref().is_some_and(|s| s.node_name.is_some())
                        })
                        .count(),
                    l.items
                        .iter()
                        .filter(|p| phase(p) != Some("Running"))
                        .count(),
                ),
                Err(_) => (0, usize::MAX),
            };
            if ready >= nodes.len() && agents >= nodes.len() && pending == 0 {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(start_err(format!(
                    "the scenario did not come up within {}s: {ready}/{} nodes Ready, {agents} agent pods, {pending} pods not Running",
                    timeout.as_secs(),
                    nodes.len()
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// A client as the shipped controller ServiceAccount.
    pub async fn controller_client(&self) -> Result<kube::Client, DemoError> {
        let token = self.token(CONTROLLER_SA, None, None).await?;
        self.client_with_token(&token).await
    }

    /// The webhook provider pointed at the demo's cloud stand-in.
    pub fn provider(&self) -> ProviderConfig {
        ProviderConfig::Webhook(WebhookConfig {
            url: self.cloud.url.clone(),
            secret: WEBHOOK_SECRET.into(),
            ca_file: None,
            timeout: Duration::from_secs(5),
            max_attempts: 3,
            backoff: Duration::from_millis(200),
        })
    }

    /// The node's kubelet posts Ready=`status`, as a kubelet whose runtime is down does (the
    /// label keeps KWOK from setting it back; kube-controller-manager then taints the node).
    pub async fn set_ready(&self, node: &str, status: &str) -> Result<(), String> {
        let api: Api<Node> = Api::all(self.admin.clone());
        let fail = |e: kube::Error| format!("cannot set Ready={status} on {node}: {e}");
        let label = json!({"metadata": {"labels": {KUBELET_LABEL: "not-ready"}}});
        api.patch(node, &PatchParams::default(), &Patch::Merge(&label))
            .await
            .map_err(fail)?;
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let body = json!({"status": {"conditions": [{
            "type": "Ready", "status": status, "reason": "KubeletNotReady",
            "message": "container runtime network not ready (injected by nodekeeper demo)",
            "lastHeartbeatTime": now, "lastTransitionTime": now}]}});
        api.patch_status(node, &PatchParams::default(), &Patch::Strategic(&body))
            .await
            .map_err(fail)?;
        Ok(())
    }

    /// A TokenRequest token of ServiceAccount `nodekeeper/sa`, bound to `pod` (name, uid) when given.
    async fn token(
        &self,
        sa: &str,
        audience: Option<&str>,
        pod: Option<(&str, &str)>,
    ) -> Result<String, DemoError> {
        use k8s_openapi::api::authentication::v1::{
            BoundObjectReference, TokenRequest, TokenRequestSpec,
        };
        let req = TokenRequest {
            spec: TokenRequestSpec {
                audiences: audience.map(|a| vec![a.to_string()]).unwrap_or_default(),
                expiration_seconds: Some(24 * 3600),
                bound_object_ref: pod.map(|(name, uid)| BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(name.into()),
                    uid: Some(uid.into()),
                }),
            },
            ..Default::default()
        };
        let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(self.admin.clone(), NS);
        let fail = |e: String| start_err(format!("TokenRequest for {NS}/{sa}: {e}"));
        let resp = sas
            .create_token_request(sa, &PostParams::default(), &req)
            .await
            .map_err(|e| fail(e.to_string()))?;
        resp.status
            .map(|s| s.token)
            .ok_or_else(|| fail("no token in the answer".into()))
    }

    /// The admin kubeconfig with its user replaced by `token`.
    fn token_kubeconfig(&self, token: &str) -> Kubeconfig {
        let mut kc = self.kubeconfig.clone();
        let user = kube::config::AuthInfo {
            token: Some(token.to_string().into()),
            ..Default::default()
        };
        for named in kc.auth_infos.iter_mut() {
            named.auth_info = Some(user.clone());
        }
        kc
    }

    async fn client_with_token(&self, token: &str) -> Result<kube::Client, DemoError> {
        let kc = self.token_kubeconfig(token);
        let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| start_err(format!("token kubeconfig: {e}")))?;
        kube::Client::try_from(cfg).map_err(|e| start_err(format!("token client: {e}")))
    }

    /// The shipped agent DaemonSet's pod on `node`: (name, uid), waiting up to `timeout`.
    async fn agent_pod_on(
        &self,
        node: &str,
        timeout: Duration,
    ) -> Result<(String, String), String> {
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), NS);
        let lp = ListParams::default()
            .labels(AGENT_POD_SELECTOR)
            .fields(&format!("spec.nodeName={node}"));
        let start = Instant::now();
        loop {
            if let Ok(list) = pods.list(&lp).await {
                let found = list.items.into_iter().find_map(|p| {
                    if p.metadata.deletion_timestamp.is_some() {
                        return None;
                    }
                    Some((p.metadata.name?, p.metadata.uid?))
                });
                if let Some(f) = found {
                    return Ok(f);
                }
            }
            if start.elapsed() > timeout {
                return Err(format!(
                    "no pod of the shipped agent DaemonSet on {node} within {}s",
                    timeout.as_secs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Credentials for RealCluster {
    fn issue<'a>(
        &'a self,
        node: &'a str,
        dir: &'a Path,
    ) -> futures::future::BoxFuture<'a, Result<AgentCredentials, String>> {
        Box::pin(async move {
            let (pod, uid) = self.agent_pod_on(node, Duration::from_secs(30)).await?;
            let text = |e: DemoError| e.to_string();
            let report = self
                .token(AGENT_SA, Some(REPORT_AUDIENCE), Some((&pod, &uid)))
                .await
                .map_err(text)?;
            let api = self
                .token(AGENT_SA, None, Some((&pod, &uid)))
                .await
                .map_err(text)?;
            let token_file = dir.join("token");
            write_private(&token_file, report.as_bytes())?;
            let kubeconfig = dir.join("agent.kubeconfig");
            let yaml = serde_yaml::to_string(&self.token_kubeconfig(&api))
                .map_err(|e| format!("{}: {e}", kubeconfig.display()))?;
            write_private(&kubeconfig, yaml.as_bytes())?;
            Ok(AgentCredentials {
                token_file,
                kubeconfig,
            })
        })
    }
}

/// Writes `bytes` to `path`, readable by this user only (tokens).
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(bytes)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// A scenario Node as a KWOK node: KWOK plays its kubelet (conditions, heartbeats, pods
/// Running), so the status the sim would seed is left to it, except the capacity.
fn kwok_node(mut obj: Value) -> Value {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    obj["metadata"]["annotations"] =
        json!({KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"});
    obj["spec"]["providerID"] = json!(format!("kwok://{name}"));
    let capacity = obj
        .pointer("/status/capacity")
        .cloned()
        .unwrap_or(Value::Null);
    obj["status"] = json!({"capacity": capacity, "allocatable": capacity});
    obj
}

fn is_agent_pod(p: &Pod) -> bool {
    p.metadata.namespace.as_deref() == Some(NS)
        && p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/name"))
            .is_some_and(|v| v == AGENT_SA)
}

fn phase(p: &Pod) -> Option<&str> {
    p.status.as_ref()?.phase.as_deref()
}

/// The cloud behind the webhook provider: for each replacement request it launches a new KWOK
/// node of the same pool at once (pre-provisioned, as a cloud's capacity would be), and
/// terminates the old instance (deletes its Node) once nothing but DaemonSet pods is left on it.
pub struct Cloud {
    url: String,
}

impl Cloud {
    async fn new(admin: kube::Client) -> Result<Self, DemoError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| start_err(format!("cloud stand-in: bind 127.0.0.1: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| start_err(format!("cloud stand-in: {e}")))?;
        let seen: Arc<tokio::sync::Mutex<BTreeSet<String>>> = Arc::default();
        let counter = Arc::new(AtomicUsize::new(0));
        let app = axum::Router::new().route(
            "/replace",
            axum::routing::post(move |body: axum::Json<Value>| {
                let (admin, seen, counter) = (admin.clone(), seen.clone(), counter.clone());
                async move {
                    let id = body["request_id"].as_str().unwrap_or_default().to_string();
                    let node = body["node"].as_str().unwrap_or_default().to_string();
                    if seen.lock().await.insert(id) {
                        tokio::spawn(replace(admin, node, counter));
                    }
                    "accepted"
                }
            }),
        );
        // Served for the rest of the demo's process (the token is never cancelled).
        tokio::spawn(nodekeeper_core::serve::serve(
            listener,
            app,
            None,
            nodekeeper_core::serve::ServeLimits::default(),
            Default::default(),
            tokio_util::sync::CancellationToken::new(),
        ));
        Ok(Cloud {
            url: format!("http://{addr}/replace"),
        })
    }
}

/// Launches a node like `old` (same pool labels, taints, capacity), then deletes `old` once it
/// is drained (or after 10 minutes, as a preempted instance would be gone anyway).
async fn replace(admin: kube::Client, old: String, counter: Arc<AtomicUsize>) {
    let api: Api<Node> = Api::all(admin.clone());
    let Ok(Some(node)) = api.get_opt(&old).await else {
        return;
    };
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let pool = labels
        .get(nodekeeper_core::controller::policy::nodepool::POOL_LABEL)
        .cloned()
        .unwrap_or_else(|| "pool".into());
    let n = counter.fetch_add(1, Ordering::Relaxed);
    let name = format!("{pool}-r{n}");
    let spec = Pool {
        name: pool.clone(),
        count: 1,
        labels: labels
            .iter()
            .filter(|(k, _)| !k.starts_with("kubernetes.io/") && *k != KUBELET_LABEL)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        taints: Vec::new(),
        cpu: quantity(&node, "cpu", "4"),
        memory: quantity(&node, "memory", "16Gi"),
        pods: quantity(&node, "pods", "110").parse().unwrap_or(110),
        capacity_type: labels
            .get("karpenter.sh/capacity-type")
            .cloned()
            .unwrap_or_else(|| "on-demand".into()),
        instance_type: labels
            .get("node.kubernetes.io/instance-type")
            .cloned()
            .unwrap_or_default(),
    };
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let mut obj = kwok_node(scenario::node_object(&spec, &name, &now));
    // The pool's own taints (e.g. OKE's preemptible one), not nodekeeper's or the kubelet's.
    let taints: Vec<Value> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| {
            !t.key.starts_with("node.kubernetes.io/") && !t.key.starts_with("nodekeeper.io/")
        })
        .filter_map(|t| serde_json::to_value(t).ok())
        .collect();
    obj["spec"]["taints"] = json!(taints);
    let created = match serde_json::from_value::<Node>(obj) {
        Ok(n) => api.create(&PostParams::default(), &n).await,
        Err(e) => {
            tracing::warn!(error = %e, "cloud stand-in: bad node object");
            return;
        }
    };
    if let Err(e) = created {
        tracing::warn!(node = %name, error = %e, "cloud stand-in: launching the replacement failed");
        return;
    }
    let pods: Api<Pod> = Api::all(admin);
    let lp = ListParams::default().fields(&format!("spec.nodeName={old}"));
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(600) {
        let drained = pods.list(&lp).await.is_ok_and(|l| {
            l.items
                .iter()
                .all(nodekeeper_core::controller::act::drain::select::is_daemonset)
        });
        if drained {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if let Err(e) = api.delete(&old, &Default::default()).await {
        tracing::warn!(node = %old, error = %e, "cloud stand-in: terminating the old node failed");
    }
}

fn quantity(n: &Node, key: &str, default: &str) -> String {
    n.status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get(key))
        .map(|q| q.0.clone())
        .unwrap_or_else(|| default.to_string())
}

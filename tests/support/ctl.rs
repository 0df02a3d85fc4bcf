//! Shared helpers of the controller tests: a sim cluster, TLS material, sim-minted tokens, a
//! controller on loopback and a pinned-CA HTTPS client.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use nodekeeper_core::agent::checks::{CheckResult, ConditionStatus};
use nodekeeper_core::controller::config::ControllerConfig;
use nodekeeper_core::wire::{NodeReport, REPORT_VERSION};
use nodekeeper_sim::apiserver::{SimOptions, TestCluster};

pub const SA: &str = "system:serviceaccount:nodekeeper:nodekeeper-agent";
pub const SERVER_NAME: &str = "nodekeeper-controller.nodekeeper.svc";

pub fn install_crypto() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// CA + server certificate for SERVER_NAME; returns (ca, cert, key) paths.
pub fn write_certs(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "nodekeeper test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec![SERVER_NAME.to_string()]).unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let (a, c, k) = (dir.join("ca.pem"), dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&a, ca.pem()).unwrap();
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (a, c, k)
}

pub struct Env {
    pub cluster: TestCluster,
    pub dir: tempfile::TempDir,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Env {
    pub async fn new(nodes: usize) -> Env {
        install_crypto();
        let cluster = TestCluster::start(SimOptions::bare()).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = write_certs(dir.path());
        let ns: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "nodekeeper"}}))
                .unwrap();
        Api::all(cluster.client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        let env = Env {
            cluster,
            dir,
            ca,
            cert,
            key,
        };
        for i in 0..nodes {
            env.add_node(
                &format!("n{i}"),
                &format!("oci://ocid1.instance.oc1.phx.n{i}"),
            )
            .await;
        }
        env
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.cluster.client.clone())
    }

    pub async fn add_node(&self, name: &str, provider_id: &str) {
        let n: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"last-migration-failure": "true", "keep": "x"}},
            "spec": {"providerID": provider_id}}))
        .unwrap();
        self.nodes()
            .create(&PostParams::default(), &n)
            .await
            .unwrap();
    }

    pub fn config(&self) -> ControllerConfig {
        let mut c = ControllerConfig {
            listen: "127.0.0.1:0".into(),
            tls_cert_file: Some(self.cert.clone()),
            tls_key_file: Some(self.key.clone()),
            service_account: SA.into(),
            staleness: Duration::from_secs(3600),
            label_removal_allow: vec!["last-migration-failure".into()],
            ..Default::default()
        };
        c.leader.lease_duration = Duration::from_secs(2);
        c.leader.retry_period = Duration::from_millis(200);
        assert!(c.validate().is_empty(), "{:?}", c.validate());
        c
    }

    /// Starts a controller and waits until it is ready and (when `lead`) the leader.
    pub async fn controller(
        &self,
        cfg: &ControllerConfig,
        lead: bool,
    ) -> nodekeeper_core::controller::Running {
        let r = nodekeeper_core::controller::start(self.cluster.client.clone(), cfg)
            .await
            .unwrap();
        super::wait::until(Duration::from_secs(10), "the controller ready", || {
            std::future::ready(
                r.app.ready.load(std::sync::atomic::Ordering::Relaxed)
                    && (!lead || *r.app.leader.borrow()),
            )
        })
        .await;
        r
    }

    pub async fn token(&self, node: &str, audience: &str) -> String {
        token_for(&self.cluster, node, audience, "nodekeeper-agent").await
    }
}

pub async fn token_for(cluster: &TestCluster, node: &str, audience: &str, sa: &str) -> String {
    let body = serde_json::json!({"pod": format!("agent-{node}"), "node": node, "audiences": [audience],
        "namespace": "nodekeeper", "serviceAccount": sa, "expirationSeconds": 3600});
    let (_, bytes) = send(admin().post(cluster.admin_url("tokens")).json(&body))
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    v["token"].as_str().unwrap().to_string()
}

/// A client for the sim's admin API and other plain endpoints (system roots, 60 s timeout).
pub fn admin() -> &'static reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT.get_or_init(|| {
        nodekeeper_core::http::builder(None)
            .unwrap()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap()
    })
}

/// An HTTPS client trusting only the test CA that reaches `addr`'s IP address as SERVER_NAME
/// (the agent's client, `nodekeeper_core::http`'s pinned builder): requests go to [`url`]s. Like
/// the agent's reporter it closes a connection after 1 s idle, before the controller does
/// (`[controller] idle_timeout`, 3 s): a client keeping it longer may send a request just as the
/// server closes the connection, and fail (seen on a loaded machine).
pub fn https(ca: &Path, addr: SocketAddr) -> reqwest::Client {
    https_idle(ca, addr, Duration::from_secs(1))
}

/// [`https`] keeping idle connections for `idle` (a client that holds its connection).
pub fn https_idle(ca: &Path, addr: SocketAddr, idle: Duration) -> reqwest::Client {
    install_crypto();
    let base = reqwest::Url::parse(&format!("https://{addr}")).unwrap();
    let (builder, _) = nodekeeper_core::http::pin_server_name(
        nodekeeper_core::http::pinned_builder(ca).unwrap(),
        &base,
        SERVER_NAME,
    )
    .unwrap();
    builder
        .timeout(Duration::from_secs(30))
        .pool_idle_timeout(idle)
        .build()
        .unwrap()
}

/// `path` on the controller at `addr` under SERVER_NAME, for [`https`]'s client.
pub fn url(addr: SocketAddr, path: &str) -> String {
    format!("https://{SERVER_NAME}:{}{path}", addr.port())
}

/// `path` on the controller at `addr` by IP address, for clients that pin SERVER_NAME
/// themselves (the agent's reporter, `nodekeeper sim oci-event`).
pub fn ip_url(addr: SocketAddr, path: &str) -> String {
    format!("https://127.0.0.1:{}{path}", addr.port())
}

/// Sends `req`; returns the status and the body (Err: the error's chain).
pub async fn send(req: reqwest::RequestBuilder) -> Result<(u16, bytes::Bytes), String> {
    let resp = req
        .send()
        .await
        .map_err(|e| nodekeeper_core::telemetry::error_chain(&e))?;
    let code = resp.status().as_u16();
    let body = resp
        .bytes()
        .await
        .map_err(|e| nodekeeper_core::telemetry::error_chain(&e))?;
    Ok((code, body))
}

/// One request: `bearer` as the Authorization, `headers`, and a JSON body when given.
pub async fn request(
    client: &reqwest::Client,
    method: &str,
    url: &str,
    bearer: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<Vec<u8>>,
) -> Result<(u16, bytes::Bytes), String> {
    let mut req = client.request(method.parse().unwrap(), url);
    if let Some(t) = bearer {
        req = req.bearer_auth(t);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(b) = body {
        req = req.header("content-type", "application/json").body(b);
    }
    send(req).await
}

pub async fn get(
    client: &reqwest::Client,
    addr: SocketAddr,
    path: &str,
) -> Result<(u16, String), String> {
    send(client.get(url(addr, path)))
        .await
        .map(|(c, b)| (c, String::from_utf8_lossy(&b).into_owned()))
}

pub fn report(node: &str, seq: u64, conds: &[(&str, ConditionStatus)]) -> NodeReport {
    NodeReport {
        version: REPORT_VERSION,
        node: node.into(),
        agent_version: "test".into(),
        agent_instance: "inst-1".into(),
        sequence: seq,
        boot_id: "boot".into(),
        generated_at: chrono::Utc::now(),
        identity: None,
        conditions: conds
            .iter()
            .map(|(t, s)| CheckResult::new(*t, *s, "Because", format!("{t} is {s}")))
            .collect(),
        check_events: vec![],
        events: vec![],
        crio: None,
        label_removals: vec![],
        command_results: vec![],
        problems: vec![],
        command_types: vec![],
    }
}

/// `type → (status, reason, lastTransitionTime, lastHeartbeatTime)` of the Node's nodekeeper conditions.
pub async fn conditions(
    nodes: &Api<Node>,
    node: &str,
) -> std::collections::BTreeMap<String, (String, String, String, String)> {
    let n = nodes.get(node).await.unwrap();
    n.status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.type_.starts_with("Nodekeeper"))
        .map(|c| {
            let t = |x: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
                x.map(|t| t.0.to_string()).unwrap_or_default()
            };
            (
                c.type_,
                (
                    c.status,
                    c.reason.unwrap_or_default(),
                    t(c.last_transition_time),
                    t(c.last_heartbeat_time),
                ),
            )
        })
        .collect()
}

pub async fn post(
    client: &reqwest::Client,
    addr: SocketAddr,
    token: Option<&str>,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    let mut req = client.post(url(addr, "/v1/reports")).json(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let (code, bytes) = send(req).await.unwrap();
    (
        code,
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    )
}

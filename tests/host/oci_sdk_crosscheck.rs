//! The signing cross-check against the OCI Go SDK (`tools/k8s/ocisdk`, built from the Go module proxy
//! by `scripts/setup-peers.sh ocisdk`): nodekeeper's real `oci` provider sends TerminateInstance,
//! GetInstance, DeleteNode and GetWorkRequest to the stand-in (which verifies each signature and
//! records the request as received); the SDK's own service clients then build and sign the same
//! operations with the same key, ids, host, date and `opc-request-id`. Path and query, the
//! `Authorization` header (parameter order included) and the request id must be byte-equal: RSA
//! PKCS#1 v1.5 is deterministic, so equal signatures mean equal signing strings.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use nodekeeper_core::controller::act::provider::oci::{
    Oci, OciAuth, OciConfig, OciMode, NODE_POOL_ANNOTATION,
};
use nodekeeper_core::controller::act::provider::{NodeProvider, ReplacementRequest};
use nodekeeper_sim::apiserver::scenario::Scenario;
use nodekeeper_sim::apiserver::{SimOptions, TestCluster};
use nodekeeper_sim::oci_compute::{self, Call, OciCompute, OciComputeOptions, Repeat};
use serde_json::{json, Value};

const TENANCY: &str =
    "ocid1.tenancy.oc1..aaaaaaaaba3pv6wkcr4jqae5f15p2b2m2yt2j6rx32uzr4h25vqstifsfdsq";
const USER: &str = "ocid1.user.oc1..aaaaaaaat5nvwcna5j6aqzjcaty5eqbb6qt2jvpkanghtgdaqedqw3rynjq";
const FINGERPRINT: &str = "20:3b:97:13:55:1c:5b:0d:d3:37:d8:50:4e:c5:3a:34";

fn openssl(args: &[&str]) {
    let out = Command::new("openssl").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The SDK program, built once (cached by its sources and the SDK version).
fn ocisdk() -> PathBuf {
    let out = Command::new(crate::support::repo().join("scripts/setup-peers.sh"))
        .arg("ocisdk")
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/setup-peers.sh");
    assert!(
        out.status.success(),
        "building tools/k8s/ocisdk failed (scripts/setup-peers.sh ocisdk; needs Go and the Go module proxy)"
    );
    let dir = String::from_utf8(out.stdout).unwrap();
    let bin = Path::new(dir.lines().last().unwrap_or_default().trim()).join("ocisdk");
    assert!(
        bin.is_file(),
        "scripts/setup-peers.sh ocisdk printed {dir:?}"
    );
    bin
}

/// The sim's mixed cluster with its nodes adopted as OCI instances, and its nodes.
async fn oci_cluster() -> (TestCluster, Vec<Node>) {
    let cluster = TestCluster::start(SimOptions {
        time_scale: 30.0,
        scenario: Scenario::default_mixed(),
        ..Default::default()
    })
    .await
    .unwrap();
    oci_compute::adopt_nodes(&cluster.client).await.unwrap();
    let nodes: Vec<Node> = Api::<Node>::all(cluster.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    (cluster, nodes)
}

/// Replaces and retires `node` through `p`: its DELETE must be the stand-in's last call, accepted
/// (204) and signed with a session token (`keyId="ST$…"`).
async fn retire_signed_by_a_session(p: &Oci, stand_in: &OciCompute, node: &Node, tag: &str) {
    let name = node.metadata.name.clone().unwrap();
    let req = ReplacementRequest::new(&name, "repair", tag);
    p.request_replacement(&req).await.unwrap();
    p.retire(&req).await.unwrap();
    let del = stand_in.calls().pop().unwrap();
    assert_eq!(
        (del.method.as_str(), del.status),
        ("DELETE", 204),
        "{del:?}"
    );
    assert!(del.key_id.as_deref().unwrap().starts_with("ST$"), "{del:?}");
}

/// A node's OCI instance id (its provider id without `oci://`).
fn instance(n: &Node) -> String {
    n.spec
        .as_ref()
        .unwrap()
        .provider_id
        .clone()
        .unwrap()
        .trim_start_matches("oci://")
        .to_string()
}

/// The SDK operation (and its inputs) of a request the stand-in received.
fn case_of(c: &Call, host: &str) -> Value {
    let (path, _query) = c.path.split_once('?').unwrap_or((&c.path, ""));
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let mut v = json!({"host": host, "date": c.date, "request_id": c.request_id});
    match (c.method.as_str(), segs.as_slice()) {
        ("DELETE", ["20160918", "instances", id]) => {
            v["op"] = json!("TerminateInstance");
            v["instance"] = json!(id);
        }
        ("GET", ["20160918", "instances", id]) => {
            v["op"] = json!("GetInstance");
            v["instance"] = json!(id);
        }
        ("DELETE", ["20180222", "nodePools", pool, "node", id]) => {
            v["op"] = json!("DeleteNode");
            v["node_pool"] = json!(pool);
            v["instance"] = json!(id);
            v["eviction_grace"] = json!("PT0M");
            v["force"] = json!(true);
        }
        ("GET", ["20180222", "workRequests", id]) => {
            v["op"] = json!("GetWorkRequest");
            v["work_request"] = json!(id);
        }
        other => panic!("no SDK operation for {other:?}"),
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodekeepers_signed_requests_equal_the_go_sdks() {
    let bin = ocisdk();
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key.pem");
    let public = dir.path().join("key.pub.pem");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    openssl(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        &s(&key),
    ]);
    openssl(&["pkey", "-in", &s(&key), "-pubout", "-out", &s(&public)]);
    let key_id = format!("{TENANCY}/{USER}/{FINGERPRINT}");

    let cluster = TestCluster::start(SimOptions {
        time_scale: 30.0,
        scenario: Scenario::default_mixed(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(oci_compute::adopt_nodes(&cluster.client).await.unwrap() > 1);
    let stand_in = OciCompute::start(OciComputeOptions {
        keys: BTreeMap::from([(key_id.clone(), std::fs::read_to_string(&public).unwrap())]),
        client: Some(cluster.client.clone()),
        launch_delay: Duration::from_millis(50),
        repeat: Repeat::NotFound,
        ..Default::default()
    })
    .await
    .unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &stand_in.ca_pem).unwrap();
    let provider = |mode| {
        Oci::new(
            OciConfig {
                region: None,
                endpoint: Some(stand_in.url.clone()),
                tenancy: TENANCY.into(),
                user: USER.into(),
                fingerprint: FINGERPRINT.into(),
                key_file: key.clone(),
                mode,
                ca_file: Some(ca.clone()),
                timeout: Duration::from_secs(5),
                max_attempts: 2,
                backoff: Duration::from_millis(20),
                eviction_grace: Duration::ZERO,
                force_delete_after_grace: true,
                auth: OciAuth::ApiKey,
                token_endpoint: None,
                service_account_token_file: PathBuf::new(),
                service_account_ca_file: PathBuf::new(),
                metadata_url: String::new(),
                auth_endpoint: None,
                work_request_timeout: Duration::from_secs(20),
                work_request_poll: Duration::from_millis(50),
            },
            cluster.client.clone(),
            true,
        )
        .unwrap()
    };
    let pool_nodes: Vec<String> = Api::<Node>::all(cluster.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|n| {
            n.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(NODE_POOL_ANNOTATION))
        })
        .filter_map(|n| n.metadata.name)
        .collect();
    assert!(pool_nodes.len() >= 2, "{pool_nodes:?}");

    // TerminateInstance; asked again by a fresh provider (a restarted controller): 404, then
    // GetInstance; DeleteNode, then GetWorkRequest until it SUCCEEDED.
    let a = ReplacementRequest::new(&pool_nodes[0], "repair", "sdk-a");
    let terminate = provider(OciMode::Terminate);
    terminate.request_replacement(&a).await.unwrap();
    terminate.retire(&a).await.unwrap();
    provider(OciMode::Terminate).retire(&a).await.unwrap();
    let b = ReplacementRequest::new(&pool_nodes[1], "repair", "sdk-b");
    let pool = provider(OciMode::NodePool);
    pool.request_replacement(&b).await.unwrap();
    pool.retire(&b).await.unwrap();

    let calls = stand_in.calls();
    assert!(
        calls
            .iter()
            .all(|c| c.key_id.as_deref() == Some(key_id.as_str())),
        "{calls:?}"
    );
    let cases: Vec<Value> = calls.iter().map(|c| case_of(c, &stand_in.url)).collect();
    let ops: std::collections::BTreeSet<&str> =
        cases.iter().map(|c| c["op"].as_str().unwrap()).collect();
    assert_eq!(
        ops.into_iter().collect::<Vec<_>>(),
        [
            "DeleteNode",
            "GetInstance",
            "GetWorkRequest",
            "TerminateInstance"
        ],
        "every operation checked"
    );
    let input = dir.path().join("cases.json");
    std::fs::write(
        &input,
        serde_json::to_vec(
            &json!({"tenancy": TENANCY, "user": USER, "fingerprint": FINGERPRINT,
            "key_file": key, "cases": cases}),
        )
        .unwrap(),
    )
    .unwrap();
    let out = Command::new(&bin).arg(&input).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sdk: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(sdk.len(), calls.len());
    let host = stand_in.url.trim_start_matches("https://");
    for (ours, theirs) in calls.iter().zip(&sdk) {
        let what = format!("{} {}", ours.method, ours.path);
        assert_eq!(theirs["method"], ours.method, "{what}");
        assert_eq!(
            theirs["target"],
            ours.path.as_str(),
            "{what}: path and query"
        );
        assert_eq!(theirs["host"], host, "{what}");
        assert_eq!(
            theirs["authorization"].as_str(),
            ours.authorization.as_deref(),
            "{what}: Authorization"
        );
        assert_eq!(
            theirs["opc_request_id"].as_str(),
            ours.request_id.as_deref(),
            "{what}"
        );
    }
}

/// Settings of a workload identity provider against `stand_in` (its token endpoint on the same
/// address), the service account token in `token_file`.
fn workload_identity(
    stand_in: &OciCompute,
    ca: &Path,
    token_file: &Path,
    mode: OciMode,
) -> OciConfig {
    OciConfig {
        region: None,
        endpoint: Some(stand_in.url.clone()),
        auth: OciAuth::WorkloadIdentity,
        tenancy: String::new(),
        user: String::new(),
        fingerprint: String::new(),
        key_file: PathBuf::new(),
        token_endpoint: Some(format!("{}/resourcePrincipalSessionTokens", stand_in.url)),
        service_account_token_file: token_file.to_path_buf(),
        service_account_ca_file: ca.to_path_buf(),
        metadata_url: String::new(),
        auth_endpoint: None,
        mode,
        ca_file: Some(ca.to_path_buf()),
        timeout: Duration::from_secs(5),
        max_attempts: 2,
        backoff: Duration::from_millis(20),
        eviction_grace: Duration::ZERO,
        force_delete_after_grace: true,
        work_request_timeout: Duration::from_secs(20),
        work_request_poll: Duration::from_millis(50),
    }
}

/// OKE workload identity: the stand-in's token endpoint is first proven with the OCI Go SDK's own
/// auth provider (as in a pod: the SDK finds it at `$KUBERNETES_SERVICE_HOST:12250` and gets a
/// session that signs a GetInstance the stand-in verifies); then nodekeeper's client meets the same
/// stand-in: its DELETE is signed with `keyId="ST$…"`; a wrong service account token is a clear,
/// retried error; a short-lived session is renewed before it expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workload_identity_sessions_work_for_the_go_sdk_and_for_nodekeeper() {
    // A service account token as the kubelet projects it: a JWT (the SDK reads its `exp`).
    let sa_token = {
        use base64::Engine;
        let b = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        let exp = chrono::Utc::now().timestamp() + 3600;
        format!(
            "{}.{}.c2ln",
            b(json!({"alg": "RS256", "kid": "sim"})),
            b(json!({"exp": exp, "sub": "system:serviceaccount:nodekeeper:nodekeeper-controller"}))
        )
    };
    let bin = ocisdk();
    let dir = tempfile::tempdir().unwrap();
    let (cluster, nodes) = oci_cluster().await;
    let stand_in = OciCompute::start(OciComputeOptions {
        client: Some(cluster.client.clone()),
        launch_delay: Duration::from_millis(50),
        service_account_tokens: [sa_token.clone()].into(),
        // Where the SDK looks for OKE's proxymux.
        proxymux_listen: Some("127.0.0.1:12250".parse().unwrap()),
        ..Default::default()
    })
    .await
    .unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &stand_in.ca_pem).unwrap();

    // 1. The SDK's own provider gets a working session from the stand-in.
    let out = Command::new(&bin)
        .args(["workload-identity", &stand_in.url, &instance(&nodes[0])])
        .arg(&ca)
        .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        .env("OCI_KUBERNETES_SERVICE_ACCOUNT_CERT_PATH", &ca)
        .env("OCI_RESOURCE_PRINCIPAL_VERSION", "2.2")
        .env("OCI_RESOURCE_PRINCIPAL_REGION", "us-phoenix-1")
        .env("NK_SA_TOKEN", &sa_token)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the SDK: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "RUNNING ST$");
    assert_eq!(stand_in.sessions_issued(), 1);
    let sdk_call = stand_in.calls().pop().unwrap();
    assert_eq!((sdk_call.method.as_str(), sdk_call.status), ("GET", 200));
    assert!(sdk_call.key_id.as_deref().unwrap().starts_with("ST$"));

    // 2. nodekeeper's client against the same stand-in.
    let token_file = dir.path().join("sa-token");
    std::fs::write(&token_file, format!("{sa_token}\n")).unwrap();
    let p = Oci::new(
        workload_identity(&stand_in, &ca, &token_file, OciMode::Terminate),
        cluster.client.clone(),
        true,
    )
    .unwrap();
    retire_signed_by_a_session(&p, &stand_in, &nodes[1], "wi").await;
    assert_eq!(stand_in.sessions_issued(), 2, "one session for nodekeeper");

    // A session OCI refuses before its time (revoked): 401, the session renewed, the retry signed
    // with the new one.
    stand_in.revoke_sessions();
    let name = nodes[2].metadata.name.clone().unwrap();
    let req = ReplacementRequest::new(&name, "repair", "wi-revoked");
    p.request_replacement(&req).await.unwrap();
    p.retire(&req).await.unwrap();
    let tail: Vec<u16> = stand_in
        .calls()
        .iter()
        .rev()
        .take(2)
        .map(|c| c.status)
        .collect();
    assert_eq!(tail, [204, 401], "{:?}", stand_in.calls());
    assert_eq!(stand_in.sessions_issued(), 3, "renewed after the 401");

    // A refused service account token: an error naming the endpoint and the answer, retried.
    let wrong = dir.path().join("wrong-token");
    std::fs::write(&wrong, "not-the-token").unwrap();
    let bad = Oci::new(
        workload_identity(&stand_in, &ca, &wrong, OciMode::Terminate),
        cluster.client.clone(),
        true,
    )
    .unwrap();
    let other = nodes[0].metadata.name.clone().unwrap();
    let req = ReplacementRequest::new(&other, "repair", "wi-bad");
    bad.request_replacement(&req).await.unwrap();
    let err = bad.retire(&req).await.unwrap_err();
    assert!(!err.is_permanent(), "retried with backoff: {err}");
    let msg = err.to_string();
    assert!(
        msg.contains("session token refused")
            && msg.contains("401")
            && msg.contains("resourcePrincipalSessionTokens"),
        "{msg}"
    );

    // A 4-second session is renewed before it expires (half its life, less a quarter).
    let short = OciCompute::start(OciComputeOptions {
        client: Some(cluster.client.clone()),
        service_account_tokens: [sa_token.clone()].into(),
        session_ttl: Some(Duration::from_secs(4)),
        repeat: Repeat::Accepted,
        ..Default::default()
    })
    .await
    .unwrap();
    let ca2 = dir.path().join("ca2.pem");
    std::fs::write(&ca2, &short.ca_pem).unwrap();
    let renewing = Oci::new(
        workload_identity(&short, &ca2, &token_file, OciMode::Terminate),
        cluster.client.clone(),
        true,
    )
    .unwrap();
    for (i, node) in nodes[3..5].iter().enumerate() {
        let req =
            ReplacementRequest::new(node.metadata.name.as_deref().unwrap(), "repair", "wi-renew");
        renewing.request_replacement(&req).await.unwrap();
        renewing.retire(&req).await.unwrap();
        assert_eq!(short.sessions_issued(), i + 1);
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    assert!(
        short.calls().iter().all(|c| c.key_id.is_some()),
        "{:?}",
        short.calls()
    );
}

/// Instance principals: the stand-in's metadata identity and federation endpoint are first proven
/// with the OCI Go SDK's own `InstancePrincipalConfigurationProvider` (pointed at them by
/// `OCI_METADATA_BASE_URL` and `OCI_SDK_AUTH_CLIENT_REGION_URL`: it gets a session that signs a
/// GetInstance the stand-in verifies); then nodekeeper's client meets the same stand-in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_principal_sessions_work_for_the_go_sdk_and_for_nodekeeper() {
    let bin = ocisdk();
    let dir = tempfile::tempdir().unwrap();
    let (cluster, nodes) = oci_cluster().await;
    let stand_in = OciCompute::start(OciComputeOptions {
        client: Some(cluster.client.clone()),
        launch_delay: Duration::from_millis(50),
        instance_identity: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &stand_in.ca_pem).unwrap();

    // 1. The SDK's own provider gets a working session from the stand-in.
    let out = Command::new(&bin)
        .args(["instance-principal", &stand_in.url, &instance(&nodes[0])])
        .arg(&ca)
        .env("OCI_METADATA_BASE_URL", format!("{}/opc/v2", stand_in.url))
        .env("OCI_SDK_AUTH_CLIENT_REGION_URL", &stand_in.url)
        .env("OCI_SDK_AUTH_CLIENT_CIRCUIT_BREAKER_ENABLED", "false")
        .env("SSL_CERT_FILE", &ca)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the SDK: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "RUNNING ST$");
    assert_eq!(stand_in.sessions_issued(), 1);
    let sdk_call = stand_in.calls().pop().unwrap();
    assert_eq!((sdk_call.method.as_str(), sdk_call.status), ("GET", 200));
    assert!(sdk_call.key_id.as_deref().unwrap().starts_with("ST$"));

    // 2. nodekeeper's client against the same stand-in: metadata identity, federation (signed
    // without `host`, verified with the certificate's key), then a DELETE signed `ST$…`.
    let cfg = |metadata: String| OciConfig {
        auth: OciAuth::InstancePrincipal,
        metadata_url: metadata,
        auth_endpoint: Some(stand_in.url.clone()),
        ..workload_identity(&stand_in, &ca, &ca, OciMode::Terminate)
    };
    let p = Oci::new(
        cfg(format!("{}/opc/v2", stand_in.url)),
        cluster.client.clone(),
        true,
    )
    .unwrap();
    retire_signed_by_a_session(&p, &stand_in, &nodes[1], "ip").await;
    assert_eq!(stand_in.sessions_issued(), 2, "one session for nodekeeper");

    // No metadata service: an error naming the URL, retried (never a crash).
    let lost = Oci::new(
        cfg("https://127.0.0.1:9/opc/v2".into()),
        cluster.client.clone(),
        true,
    )
    .unwrap();
    let other = nodes[0].metadata.name.clone().unwrap();
    let req = ReplacementRequest::new(&other, "repair", "ip-lost");
    lost.request_replacement(&req).await.unwrap();
    let err = lost.retire(&req).await.unwrap_err();
    assert!(!err.is_permanent(), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("instance identity") && msg.contains("127.0.0.1:9"),
        "{msg}"
    );
}

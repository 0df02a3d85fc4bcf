//! The oci provider against a local stand-in of the OCI Compute / Container Engine APIs
//! (`nodekeeper_sim::oci_compute`) that verifies every signature with the public key, and the
//! simulated cluster: terminate → one DELETE, old node removed, replacement Ready in the same pool;
//! asked again (same or fresh provider, however OCI answers the repeat) → still one; 429, 5xx and
//! 409 `IncorrectState`/`LockConflict` retried; 501 permanent; wrong key → 401 a few times → permanent;
//! a key without IAM policy → 404 → GetInstance → a permanent error naming the policy; node-pool
//! mode; config validation; `kind = "oci"` in the controller. Keys are generated per run
//! with the `openssl` CLI; the signing string is checked against Oracle's documented example.
#![allow(clippy::unwrap_used)]

use crate::support::engine as engine_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use axum::http::{HeaderMap, Method, Uri};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use nodekeeper_core::agent::sources::EventKind;
use nodekeeper_core::controller::act::provider::oci::{
    body_sha256, http_date, signing_plan, Oci, OciAuth, OciConfig, OciMode, OciSigner, SignInput,
    NODE_POOL_ANNOTATION,
};
use nodekeeper_core::controller::act::provider::{
    NodeProvider, ProviderConfig, ProviderError, ReplacementRequest, ReplacementTicket,
};
use nodekeeper_core::controller::policy::PolicyConfig;
use nodekeeper_sim::apiserver::scenario::Scenario;
use nodekeeper_sim::apiserver::{SimOptions, TestCluster};
use nodekeeper_sim::oci_compute::{self, Call, OciCompute, OciComputeOptions, Repeat};

use engine_support::wait_until;

const TENANCY: &str =
    "ocid1.tenancy.oc1..aaaaaaaaba3pv6wkcr4jqae5f15p2b2m2yt2j6rx32uzr4h25vqstifsfdsq";
const USER: &str = "ocid1.user.oc1..aaaaaaaat5nvwcna5j6aqzjcaty5eqbb6qt2jvpkanghtgdaqedqw3rynjq";

/// A test-only RSA key pair made with the openssl CLI: PKCS#8 and PKCS#1 PEM of the private key,
/// the public key (SPKI PEM), and its OCI fingerprint (MD5 of the DER public key).
struct TestKey {
    pkcs8: PathBuf,
    pkcs1: PathBuf,
    public_pem: String,
    fingerprint: String,
}

fn openssl(args: &[&str]) -> Vec<u8> {
    let out = Command::new("openssl").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn test_key(dir: &Path, name: &str) -> TestKey {
    let p = |s: &str| dir.join(format!("{name}{s}"));
    let (pkcs8, pkcs1, public) = (p(".pk8.pem"), p(".pk1.pem"), p(".pub.pem"));
    let s = |p: &Path| p.to_str().unwrap().to_string();
    openssl(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        &s(&pkcs8),
    ]);
    openssl(&["rsa", "-in", &s(&pkcs8), "-traditional", "-out", &s(&pkcs1)]);
    openssl(&["pkey", "-in", &s(&pkcs8), "-pubout", "-out", &s(&public)]);
    let der = openssl(&["pkey", "-pubin", "-in", &s(&public), "-outform", "DER"]);
    let fingerprint = {
        use std::fmt::Write;
        let digest = openssl_md5(dir, &der);
        digest.iter().fold(String::new(), |mut acc, b| {
            if !acc.is_empty() {
                acc.push(':');
            }
            let _ = write!(acc, "{b:02x}");
            acc
        })
    };
    TestKey {
        pkcs8,
        pkcs1,
        public_pem: std::fs::read_to_string(&public).unwrap(),
        fingerprint,
    }
}

fn openssl_md5(dir: &Path, data: &[u8]) -> Vec<u8> {
    let f = dir.join("md5-input.der");
    std::fs::write(&f, data).unwrap();
    openssl(&["dgst", "-md5", "-binary", f.to_str().unwrap()])
}

fn key_id(k: &TestKey) -> String {
    format!("{TENANCY}/{USER}/{}", k.fingerprint)
}

fn config(stand_in: &OciCompute, key: &TestKey, ca: &Path, mode: OciMode) -> OciConfig {
    OciConfig {
        endpoint: Some(stand_in.url.clone()),
        mode,
        ..config_for(key, ca)
    }
}

/// Settings signing with `key` and trusting `ca` (no endpoint yet).
fn config_for(key: &TestKey, ca: &Path) -> OciConfig {
    OciConfig {
        region: None,
        endpoint: None,
        tenancy: TENANCY.into(),
        user: USER.into(),
        fingerprint: key.fingerprint.clone(),
        key_file: key.pkcs8.clone(),
        mode: OciMode::Terminate,
        ca_file: Some(ca.to_path_buf()),
        timeout: Duration::from_secs(5),
        max_attempts: 4,
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
    }
}

/// A sim cluster whose nodes carry OCI identities, a stand-in acting on it that knows `key`
/// (accepted DELETEs held until `oci.release()`).
struct Fixture {
    dir: tempfile::TempDir,
    key: TestKey,
    cluster: TestCluster,
    oci: OciCompute,
    ca: PathBuf,
}

async fn fixture() -> Fixture {
    fixture_with(Repeat::default(), false).await
}

/// [`fixture`] whose DeleteNode work requests end FAILED.
async fn failing_work_requests() -> Fixture {
    fixture_opts(Repeat::default(), false, true).await
}

/// [`fixture`] with the stand-in answering repeated DELETEs as `repeat`; with `no_policy`, the
/// key authenticates but no IAM policy allows it anything.
async fn fixture_with(repeat: Repeat, no_policy: bool) -> Fixture {
    fixture_opts(repeat, no_policy, false).await
}

async fn fixture_opts(repeat: Repeat, no_policy: bool, fail_work_requests: bool) -> Fixture {
    engine_support::init();
    let dir = tempfile::tempdir().unwrap();
    let key = test_key(dir.path(), "api");
    let cluster = TestCluster::start(SimOptions {
        time_scale: 30.0,
        scenario: Scenario::default_mixed(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(oci_compute::adopt_nodes(&cluster.client).await.unwrap() > 0);
    let oci = OciCompute::start(OciComputeOptions {
        keys: BTreeMap::from([(key_id(&key), key.public_pem.clone())]),
        client: Some(cluster.client.clone()),
        launch_delay: Duration::from_millis(100),
        listen: None,
        hold: true,
        unauthorized: if no_policy {
            [key_id(&key)].into()
        } else {
            Default::default()
        },
        repeat,
        fail_work_requests,
        ..Default::default()
    })
    .await
    .unwrap();
    let ca = dir.path().join("oci-ca.pem");
    std::fs::write(&ca, &oci.ca_pem).unwrap();
    Fixture {
        dir,
        key,
        cluster,
        oci,
        ca,
    }
}

impl Fixture {
    fn provider(&self, mode: OciMode) -> Oci {
        Oci::new(
            config(&self.oci, &self.key, &self.ca, mode),
            self.cluster.client.clone(),
            // the stand-in is on loopback
            true,
        )
        .unwrap()
    }

    /// A node of a pool (it has the OKE node-pool annotation).
    async fn victim(&self) -> Node {
        Api::<Node>::all(self.cluster.client.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|n| annotation(n, NODE_POOL_ANNOTATION).is_some())
            .unwrap()
    }

    fn acted(&self) -> Vec<Call> {
        self.oci.calls().into_iter().filter(Call::acted).collect()
    }

    async fn node_names(&self) -> Vec<String> {
        Api::<Node>::all(self.cluster.client.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect()
    }
}

/// What the engine does with the provider: asks for the replacement, then, its drain being over,
/// retires the old node (the removal itself).
trait ReplaceNow {
    async fn replace_now(
        &self,
        req: &ReplacementRequest,
    ) -> Result<ReplacementTicket, ProviderError>;
}

impl ReplaceNow for Oci {
    async fn replace_now(
        &self,
        req: &ReplacementRequest,
    ) -> Result<ReplacementTicket, ProviderError> {
        let t = self.request_replacement(req).await?;
        self.retire(req).await?;
        Ok(t)
    }
}

fn annotation(n: &Node, key: &str) -> Option<String> {
    n.metadata.annotations.as_ref()?.get(key).cloned()
}

fn instance_of(n: &Node) -> String {
    let pid = n.spec.as_ref().unwrap().provider_id.clone().unwrap();
    pid.strip_prefix("oci://").unwrap().to_string()
}

async fn wait_ready(p: &Oci, t: &ReplacementTicket) -> String {
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(n) = p.replacement_ready(t).await.unwrap() {
            return n;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "no replacement within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn the_signing_string_matches_oracles_documented_examples() {
    // The GET and POST examples of docs.oracle.com "Request Signatures" (as in the OCI SDKs' tests).
    let date = "Thu, 05 Jan 2014 21:31:40 GMT";
    let get = signing_plan(&SignInput {
        method: "GET",
        path_and_query: "/20160918/instances?availabilityDomain=Pjwf%3A%20PHX-AD-1&compartmentId=ocid1.compartment.oc1..aaaaaaaam3we6vgnherjq5q2idnccdflvjsnog7mlr6rtdb25gilchfeyjxa&displayName=TeamXInstances&volumeId=ocid1.volume.oc1.phx.abyhqljrgvttnlx73nmrwfaux7kcvzfs3s66izvxf2h4lgvyndsdsnoiwr5q",
        host: "iaas.us-phoenix-1.oraclecloud.com",
        date,
        body: None,
    });
    assert_eq!(
        get.signing_string,
        "date: Thu, 05 Jan 2014 21:31:40 GMT\n\
         (request-target): get /20160918/instances?availabilityDomain=Pjwf%3A%20PHX-AD-1&compartmentId=ocid1.compartment.oc1..aaaaaaaam3we6vgnherjq5q2idnccdflvjsnog7mlr6rtdb25gilchfeyjxa&displayName=TeamXInstances&volumeId=ocid1.volume.oc1.phx.abyhqljrgvttnlx73nmrwfaux7kcvzfs3s66izvxf2h4lgvyndsdsnoiwr5q\n\
         host: iaas.us-phoenix-1.oraclecloud.com"
    );
    assert_eq!(get.headers, ["date", "(request-target)", "host"]);
    assert!(get.extra.is_empty());

    let body = "{\n    \"compartmentId\": \"ocid1.compartment.oc1..aaaaaaaam3we6vgnherjq5q2idnccdflvjsnog7mlr6rtdb25gilchfeyjxa\",\n    \"instanceId\": \"ocid1.instance.oc1.phx.abuw4ljrlsfiqw6vzzxb43vyypt4pkodawglp3wqxjqofakrwvou52gb6s5a\",\n    \"volumeId\": \"ocid1.volume.oc1.phx.abyhqljrgvttnlx73nmrwfaux7kcvzfs3s66izvxf2h4lgvyndsdsnoiwr5q\"\n}";
    let post = signing_plan(&SignInput {
        method: "POST",
        path_and_query: "/20160918/volumeAttachments",
        host: "iaas.us-phoenix-1.oraclecloud.com",
        date,
        body: Some(("application/json", body.as_bytes())),
    });
    assert_eq!(
        post.signing_string,
        "date: Thu, 05 Jan 2014 21:31:40 GMT\n\
         (request-target): post /20160918/volumeAttachments\n\
         host: iaas.us-phoenix-1.oraclecloud.com\n\
         content-length: 316\n\
         content-type: application/json\n\
         x-content-sha256: V9Z20UJTvkvpJ50flBzKE32+6m2zJjweHpDMX/U4Uy0="
    );
    assert_eq!(
        post.headers.join(" "),
        "date (request-target) host content-length content-type x-content-sha256"
    );
    // OCI hashes an empty body too.
    assert_eq!(
        body_sha256(b""),
        "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="
    );
    assert_eq!(
        http_date(chrono::DateTime::from_timestamp(1388957500, 0).unwrap()),
        "Sun, 05 Jan 2014 21:31:40 GMT"
    );
}

#[test]
fn signatures_cross_check_with_the_openssl_cli_and_the_stand_in() {
    let dir = tempfile::tempdir().unwrap();
    let key = test_key(dir.path(), "x");
    let plan = signing_plan(&SignInput {
        method: "DELETE",
        path_and_query: "/20160918/instances/ocid1.instance.oc1.sim.a?preserveBootVolume=false",
        host: "127.0.0.1:4443",
        date: &http_date(chrono::Utc::now()),
        body: None,
    });
    let data = dir.path().join("signing-string");
    std::fs::write(&data, &plan.signing_string).unwrap();
    let public = dir.path().join("x.pub.pem");
    for pem in [&key.pkcs8, &key.pkcs1] {
        // Our signature (PKCS#8 and PKCS#1 keys) verifies with openssl.
        let signer = OciSigner::from_pem(&key_id(&key), &std::fs::read(pem).unwrap()).unwrap();
        let auth = signer.authorization(&plan).unwrap();
        let b64 = auth
            .split("signature=\"")
            .nth(1)
            .unwrap()
            .trim_end_matches('"');
        use base64::Engine;
        let sig = dir.path().join("sig.bin");
        std::fs::write(
            &sig,
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap(),
        )
        .unwrap();
        let ok = Command::new("openssl")
            .args(["dgst", "-sha256", "-verify"])
            .arg(&public)
            .arg("-signature")
            .arg(&sig)
            .arg(&data)
            .output()
            .unwrap();
        assert!(
            ok.status.success(),
            "{}",
            String::from_utf8_lossy(&ok.stdout)
        );
        assert!(!format!("{signer:?}").contains("MII"), "Debug shows no key");
    }

    // openssl's signature verifies in the stand-in, which rebuilds the string from the request.
    let sig = openssl(&[
        "dgst",
        "-sha256",
        "-sign",
        key.pkcs8.to_str().unwrap(),
        data.to_str().unwrap(),
    ]);
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(&sig);
    let keys = BTreeMap::from([(
        key_id(&key),
        oci_compute::rsa_public_key_from_pem(&key.public_pem).unwrap(),
    )]);
    let date_line = plan.signing_string.lines().next().unwrap();
    let date = date_line.strip_prefix("date: ").unwrap();
    let headers = |signature: &str, host: &str| {
        let mut h = HeaderMap::new();
        h.insert("date", date.parse().unwrap());
        h.insert("host", host.parse().unwrap());
        h.insert(
            "authorization",
            format!(
                "Signature version=\"1\",keyId=\"{}\",algorithm=\"rsa-sha256\",headers=\"date (request-target) host\",signature=\"{signature}\"",
                key_id(&key)
            )
            .parse()
            .unwrap(),
        );
        h
    };
    let uri: Uri = "/20160918/instances/ocid1.instance.oc1.sim.a?preserveBootVolume=false"
        .parse()
        .unwrap();
    let now = chrono::Utc::now();
    assert_eq!(
        oci_compute::verify(
            &keys,
            &Method::DELETE,
            &uri,
            &headers(&b64, "127.0.0.1:4443"),
            now
        ),
        Ok(key_id(&key))
    );
    // Another host, method, path, or a stale date: refused.
    assert!(oci_compute::verify(
        &keys,
        &Method::DELETE,
        &uri,
        &headers(&b64, "127.0.0.1:4444"),
        now
    )
    .is_err());
    assert!(oci_compute::verify(
        &keys,
        &Method::GET,
        &uri,
        &headers(&b64, "127.0.0.1:4443"),
        now
    )
    .is_err());
    let other: Uri = "/20160918/instances/ocid1.instance.oc1.sim.b?preserveBootVolume=false"
        .parse()
        .unwrap();
    assert!(oci_compute::verify(
        &keys,
        &Method::DELETE,
        &other,
        &headers(&b64, "127.0.0.1:4443"),
        now
    )
    .is_err());
    let later = now + chrono::Duration::minutes(6);
    let err = oci_compute::verify(
        &keys,
        &Method::DELETE,
        &uri,
        &headers(&b64, "127.0.0.1:4443"),
        later,
    )
    .unwrap_err();
    assert!(err.contains("5 minutes"), "{err}");
    assert!(oci_compute::verify(&keys, &Method::DELETE, &uri, &HeaderMap::new(), now).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_deletes_the_instance_once_and_reports_the_ready_replacement() {
    let f = fixture().await;
    let victim = f.victim().await;
    let node = victim.metadata.name.clone().unwrap();
    let instance = instance_of(&victim);
    let pool = annotation(&victim, NODE_POOL_ANNOTATION).unwrap();
    let before = f.node_names().await;

    let p = f.provider(OciMode::Terminate);
    assert!(
        !format!("{p:?}").contains("PRIVATE"),
        "Debug redacts the key"
    );
    let req = ReplacementRequest::new(&node, "repair", "2026-12-01T00:00:00Z");
    let t1 = p.replace_now(&req).await.unwrap();
    assert_eq!(t1.provider, "oci");
    assert_eq!(t1.reference.as_deref(), Some(instance.as_str()));
    assert_eq!(t1.pool.as_deref(), Some(pool.as_str()));
    assert!(t1.existing_nodes.contains(&node));

    let calls = f.oci.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].method, "DELETE");
    assert_eq!(
        calls[0].path,
        format!("/20160918/instances/{instance}?preserveBootVolume=false")
    );
    assert_eq!(calls[0].status, 204);
    assert_eq!(
        calls[0].key_id.as_deref(),
        Some(key_id(&f.key).as_str()),
        "signature verified"
    );
    assert_eq!(
        calls[0].request_id.as_deref(),
        Some(req.request_id.as_str())
    );

    // Asked again by this provider (remembered: nothing sent) and by a fresh one (a restarted
    // controller): the stand-in answers 404 for the terminating instance, and GetInstance shows it
    // TERMINATING, which counts as done.
    assert_eq!(p.replace_now(&req).await.unwrap(), t1);
    assert_eq!(f.oci.calls().len(), 1, "a remembered ticket sends nothing");
    let fresh = f.provider(OciMode::Terminate);
    let t3 = fresh.replace_now(&req).await.unwrap();
    assert_eq!(t3.reference, t1.reference);
    assert_eq!(f.acted().len(), 1, "one termination: {:?}", f.oci.calls());
    let last: Vec<(String, u16)> = f.oci.calls()[1..]
        .iter()
        .map(|c| (c.method.clone(), c.status))
        .collect();
    assert_eq!(
        last,
        [("DELETE".to_string(), 404), ("GET".to_string(), 200)],
        "404, then GetInstance"
    );
    assert_eq!(f.oci.removed(), vec![instance.clone()]);
    assert_eq!(p.replacement_ready(&t1).await.unwrap(), None, "not yet");

    f.oci.release();
    let new_node = wait_ready(&p, &t1).await;
    assert_ne!(new_node, node);
    assert!(!before.contains(&new_node));
    let nodes: Api<Node> = Api::all(f.cluster.client.clone());
    assert!(
        nodes.get_opt(&node).await.unwrap().is_none(),
        "old node removed"
    );
    let fresh_node = nodes.get(&new_node).await.unwrap();
    assert_eq!(annotation(&fresh_node, NODE_POOL_ANNOTATION), Some(pool));
    assert_ne!(instance_of(&fresh_node), instance);
    assert_eq!(fresh.replacement_ready(&t3).await.unwrap(), Some(new_node));
    let after = f.node_names().await;
    assert_eq!(after.len(), before.len(), "one node gone, one new");
    drop(f.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_retried_then_the_instance_is_terminated() {
    let f = fixture().await;
    let node = f.victim().await.metadata.name.unwrap();
    f.oci.fail_next(&[429, 503]);
    let p = f.provider(OciMode::Terminate);
    let req = ReplacementRequest::new(&node, "interruption", "e1");
    p.replace_now(&req).await.unwrap();
    let statuses: Vec<u16> = f.oci.calls().iter().map(|c| c.status).collect();
    assert_eq!(statuses, [429, 503, 204]);
    assert!(f.oci.calls().iter().all(|c| c.key_id.is_some()));
    assert_eq!(f.acted().len(), 1);

    // Retries exhausted: a transient (not permanent) error.
    let other = f
        .node_names()
        .await
        .into_iter()
        .find(|n| *n != node)
        .unwrap();
    f.oci.fail_next(&[500, 500, 500, 500]);
    let err = p
        .replace_now(&ReplacementRequest::new(&other, "repair", "e2"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ProviderError::Transient { attempts: 4, .. }),
        "{err}"
    );
    assert!(!err.is_permanent());
    assert_eq!(f.acted().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_key_is_refused_with_401_and_a_permanent_error_naming_the_node() {
    let f = fixture().await;
    let node = f.victim().await.metadata.name.unwrap();
    // Same keyId, another private key: the signature does not verify.
    let wrong = test_key(f.dir.path(), "wrong");
    let mut cfg = config(&f.oci, &f.key, &f.ca, OciMode::Terminate);
    cfg.key_file = wrong.pkcs1.clone();
    let p = Oci::new(cfg, f.cluster.client.clone(), true).unwrap();
    let err = p
        .replace_now(&ReplacementRequest::new(&node, "repair", "e1"))
        .await
        .unwrap_err();
    assert!(err.is_permanent(), "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&node) && msg.contains("401"), "{msg}");
    assert!(msg.contains("NotAuthenticated"), "{msg}");
    let calls = f.oci.calls();
    assert_eq!(
        calls.len() as u32,
        nodekeeper_core::controller::act::provider::oci::AUTH_ATTEMPTS,
        "retried a few times, then given up: {calls:?}"
    );
    assert!(calls
        .iter()
        .all(|c| (c.status, c.key_id.clone()) == (401, None)));
    assert!(f.oci.removed().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_without_iam_policy_is_a_permanent_error_naming_the_statement() {
    // OCI answers a caller lacking the policy exactly as a missing instance: 404
    // NotAuthorizedOrNotFound. The provider must not take it for "already gone".
    let f = fixture_with(Repeat::default(), true).await;
    let node = f.victim().await.metadata.name.unwrap();
    for mode in [OciMode::Terminate, OciMode::NodePool] {
        let before = f.oci.calls().len();
        let err = f
            .provider(mode)
            .replace_now(&ReplacementRequest::new(&node, "repair", "no-policy"))
            .await
            .unwrap_err();
        assert!(err.is_permanent(), "{err}");
        let msg = err.to_string();
        let statement = match mode {
            OciMode::Terminate => "manage instances",
            OciMode::NodePool => "manage cluster-node-pools",
        };
        assert!(
            msg.contains(&node)
                && msg.contains("NotAuthorizedOrNotFound")
                && msg.contains(statement),
            "{msg}"
        );
        let calls: Vec<(String, u16)> = f.oci.calls()[before..]
            .iter()
            .map(|c| (c.method.clone(), c.status))
            .collect();
        assert_eq!(
            calls,
            [("DELETE".to_string(), 404), ("GET".to_string(), 404)],
            "one DELETE, one GetInstance, no retry"
        );
    }
    assert!(f.oci.removed().is_empty());
    assert!(f.acted().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_after_a_restart_ends_well_however_oci_answers_it() {
    for repeat in [Repeat::NotFound, Repeat::IncorrectState, Repeat::Accepted] {
        let f = fixture_with(repeat, false).await;
        let node = f.victim().await.metadata.name.unwrap();
        let req = ReplacementRequest::new(&node, "repair", "restart");
        f.provider(OciMode::Terminate)
            .replace_now(&req)
            .await
            .unwrap();
        // A restarted controller: a fresh provider, the instance terminating (held).
        let t = f
            .provider(OciMode::Terminate)
            .replace_now(&req)
            .await
            .unwrap_or_else(|e| panic!("{repeat:?}: {e}"));
        assert!(t.reference.is_some());
        assert_eq!(f.acted().len(), 1, "{repeat:?}: {:?}", f.oci.calls());
        let statuses: Vec<u16> = f.oci.calls().iter().map(|c| c.status).collect();
        let want: &[u16] = match repeat {
            Repeat::NotFound => &[204, 404, 200],
            Repeat::IncorrectState => &[204, 409, 200],
            Repeat::Accepted => &[204, 204],
        };
        assert_eq!(statuses, want, "{repeat:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicts_and_a_passing_401_are_retried_and_501_is_not() {
    let f = fixture().await;
    let nodes = f.node_names().await;
    let p = f.provider(OciMode::Terminate);
    // LockConflict retried; IncorrectState: GetInstance (here answered by a single 401, a clock
    // or key rotation settling), then retried.
    f.oci.fail_next_with(&[
        (409, "LockConflict"),
        (409, "IncorrectState"),
        (401, "NotAuthenticated"),
    ]);
    p.replace_now(&ReplacementRequest::new(&nodes[0], "repair", "c1"))
        .await
        .unwrap();
    let calls: Vec<(String, u16)> = f
        .oci
        .calls()
        .iter()
        .map(|c| (c.method.clone(), c.status))
        .collect();
    let want: Vec<(String, u16)> = [
        ("DELETE", 409),
        ("DELETE", 409),
        ("GET", 401),
        ("DELETE", 204),
    ]
    .iter()
    .map(|(m, s)| (m.to_string(), *s))
    .collect();
    assert_eq!(calls, want);
    assert_eq!(f.acted().len(), 1);
    // IncorrectState on an instance that is RUNNING: GetInstance, then retried.
    f.oci.fail_next_with(&[(409, "IncorrectState")]);
    let sent = f.oci.calls().len();
    p.replace_now(&ReplacementRequest::new(&nodes[2], "repair", "c2"))
        .await
        .unwrap();
    let calls: Vec<(String, u16)> = f.oci.calls()[sent..]
        .iter()
        .map(|c| (c.method.clone(), c.status))
        .collect();
    let want: Vec<(String, u16)> = [("DELETE", 409), ("GET", 200), ("DELETE", 204)]
        .iter()
        .map(|(m, s)| (m.to_string(), *s))
        .collect();
    assert_eq!(calls, want);
    assert_eq!(f.acted().len(), 2);
    // 501 NotImplemented and another 409 are permanent at once.
    for (status, code) in [(501, "MethodNotImplemented"), (409, "Conflict")] {
        let sent = f.oci.calls().len();
        f.oci.fail_next_with(&[(status, code)]);
        let err = p
            .replace_now(&ReplacementRequest::new(&nodes[1], "repair", code))
            .await
            .unwrap_err();
        assert!(
            err.is_permanent() && err.to_string().contains(code),
            "{err}"
        );
        assert_eq!(f.oci.calls().len(), sent + 1, "not retried");
    }
    assert_eq!(f.acted().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_pool_mode_deletes_the_node_from_its_oke_pool() {
    let f = fixture().await;
    f.oci.release();
    let victim = f.victim().await;
    let node = victim.metadata.name.clone().unwrap();
    let instance = instance_of(&victim);
    let pool = annotation(&victim, NODE_POOL_ANNOTATION).unwrap();
    let p = f.provider(OciMode::NodePool);
    // The request sends nothing: the removal waits for nodekeeper's drain (retire).
    let req = ReplacementRequest::new(&node, "repair", "e1");
    let t = p.request_replacement(&req).await.unwrap();
    assert!(f.oci.calls().is_empty(), "{:?}", f.oci.calls());
    p.retire(&req).await.unwrap();
    // retire returned once OKE's work request SUCCEEDED (followed with GetWorkRequest).
    let wr = format!("ocid1.clustersworkrequest.oc1.sim.{instance}");
    assert_eq!(
        f.oci.work_requests().get(&wr).map(String::as_str),
        Some("SUCCEEDED")
    );
    assert!(f
        .oci
        .calls()
        .iter()
        .any(|c| c.method == "GET" && c.path == format!("/20180222/workRequests/{wr}")));
    let calls = f.acted();
    assert_eq!(calls.len(), 1, "{:?}", f.oci.calls());
    assert_eq!(
        calls[0].path,
        format!("/20180222/nodePools/{pool}/node/{instance}?isDecrementSize=false&isForceDeletionAfterOverrideGraceDuration=true&overrideEvictionGraceDuration=PT0M")
    );
    assert_eq!(calls[0].status, 202);
    let new_node = wait_ready(&p, &t).await;
    assert_ne!(new_node, node);
    let fresh = Api::<Node>::all(f.cluster.client.clone())
        .get(&new_node)
        .await
        .unwrap();
    assert_eq!(annotation(&fresh, NODE_POOL_ANNOTATION), Some(pool));

    // A node without the OKE node-pool annotation cannot be deleted from its pool.
    let nodes: Api<Node> = Api::all(f.cluster.client.clone());
    let bare = f
        .node_names()
        .await
        .into_iter()
        .find(|n| *n != new_node)
        .unwrap();
    let strip = serde_json::json!({"metadata": {"annotations": {NODE_POOL_ANNOTATION: null}}});
    nodes
        .patch(
            &bare,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&strip),
        )
        .await
        .unwrap();
    let sent = f.oci.calls().len();
    let err = p
        .replace_now(&ReplacementRequest::new(&bare, "repair", "e2"))
        .await
        .unwrap_err();
    assert!(
        err.is_permanent() && err.to_string().contains(NODE_POOL_ANNOTATION),
        "{err}"
    );
    assert_eq!(f.oci.calls().len(), sent, "nothing sent");
    // A node that is not an OCI instance: permanent, nothing sent.
    let mut req = ReplacementRequest::new(&new_node, "repair", "e3");
    req.provider_id = Some("aws:///eu-west-1a/i-0abc".into());
    let err = p.replace_now(&req).await.unwrap_err();
    assert!(
        err.is_permanent() && err.to_string().contains("i-0abc"),
        "{err}"
    );
    assert_eq!(f.oci.calls().len(), sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_delete_node_work_request_is_a_permanent_error() {
    let f = failing_work_requests().await;
    f.oci.release();
    let node = f.victim().await.metadata.name.unwrap();
    let p = f.provider(OciMode::NodePool);
    let req = ReplacementRequest::new(&node, "repair", "wr-fail");
    p.request_replacement(&req).await.unwrap();
    let err = p.retire(&req).await.unwrap_err();
    assert!(err.is_permanent(), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&node) && msg.contains("FAILED") && msg.contains("InternalError"),
        "{msg}"
    );
    // The node is still there; asked again (the engine's next pass), DeleteNode is sent again.
    assert!(f.node_names().await.contains(&node));
    let sent = f.acted().len();
    let _ = p.retire(&req).await;
    assert_eq!(f.acted().len(), sent + 1, "{:?}", f.oci.calls());
}

fn parse(toml_text: &str) -> ProviderConfig {
    toml::from_str(toml_text).unwrap()
}

#[test]
fn config_is_validated_with_diagnostics() {
    let good = parse(&format!(
        "kind = \"oci\"\nregion = \"eu-frankfurt-1\"\ntenancy = \"{TENANCY}\"\nuser = \"{USER}\"\n\
         fingerprint = \"20:3b:97:13:55:1c:5b:0d:d3:37:d8:50:4e:c5:3a:34\"\nkey_file = \"/etc/nodekeeper/oci.pem\"\nmode = \"node-pool\"\n"
    ));
    assert!(good.validate().is_empty(), "{:?}", good.validate());
    let ProviderConfig::Oci(o) = &good else {
        panic!("{good:?}")
    };
    assert_eq!(o.mode, OciMode::NodePool);
    assert_eq!(
        o.base_url(),
        "https://containerengine.eu-frankfurt-1.oci.oraclecloud.com"
    );
    let mut t = o.clone();
    t.mode = OciMode::Terminate;
    assert_eq!(t.base_url(), "https://iaas.eu-frankfurt-1.oraclecloud.com");

    let bad = parse(
        "kind = \"oci\"\nendpoint = \"http://127.0.0.1:1\"\ntenancy = \"ocid1.user.oc1..x\"\nuser = \"bob\"\n\
         fingerprint = \"20:3b\"\nkey_file = \"\"\nmax_attempts = 0\ntimeout = \"0s\"\n",
    );
    let d = bad.validate();
    let paths: Vec<String> = d
        .iter()
        .map(|d| format!("{:?}", d.path.last().unwrap()))
        .collect();
    for key in [
        "endpoint",
        "tenancy",
        "user",
        "fingerprint",
        "key_file",
        "max_attempts",
        "timeout",
    ] {
        assert!(
            paths.iter().any(|p| p.contains(key)),
            "{key} not flagged: {d:?}"
        );
    }
    let neither = parse(&format!(
        "kind = \"oci\"\ntenancy = \"{TENANCY}\"\nuser = \"{USER}\"\n\
         fingerprint = \"20:3b:97:13:55:1c:5b:0d:d3:37:d8:50:4e:c5:3a:34\"\nkey_file = \"k.pem\"\n"
    ));
    let d = neither.validate();
    assert_eq!(d.len(), 1, "{d:?}");
    assert!(d[0].message.contains("region"), "{d:?}");
    // Unknown keys and modes are refused by the parser.
    assert!(toml::from_str::<ProviderConfig>("kind = \"oci\"\nregoin = \"x\"\n").is_err());
    assert!(toml::from_str::<ProviderConfig>(&format!(
        "kind = \"oci\"\nregion = \"r\"\ntenancy = \"{TENANCY}\"\nuser = \"{USER}\"\nfingerprint = \"f\"\nkey_file = \"k\"\nmode = \"scale\"\n"
    ))
    .is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_key_file_fails_setup_without_showing_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let c = TestCluster::start(SimOptions::default()).await.unwrap();
    let base = |key_file: PathBuf| OciConfig {
        region: Some("eu-frankfurt-1".into()),
        endpoint: None,
        tenancy: TENANCY.into(),
        user: USER.into(),
        fingerprint: "20:3b:97:13:55:1c:5b:0d:d3:37:d8:50:4e:c5:3a:34".into(),
        key_file,
        mode: OciMode::Terminate,
        ca_file: None,
        timeout: Duration::from_secs(1),
        max_attempts: 1,
        backoff: Duration::from_millis(1),
        eviction_grace: Duration::ZERO,
        force_delete_after_grace: true,
        auth: OciAuth::ApiKey,
        token_endpoint: None,
        service_account_token_file: PathBuf::new(),
        service_account_ca_file: PathBuf::new(),
        metadata_url: String::new(),
        auth_endpoint: None,
        work_request_timeout: Duration::from_secs(1),
        work_request_poll: Duration::from_millis(10),
    };
    let missing = dir.path().join("missing.pem");
    let err = Oci::new(base(missing.clone()), c.client.clone(), true).unwrap_err();
    assert!(err.to_string().contains("missing.pem"), "{err}");
    let ec = dir.path().join("ec.pem");
    openssl(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        ec.to_str().unwrap(),
    ]);
    let err = Oci::new(base(ec.clone()), c.client.clone(), true).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("RSA") && msg.contains("ec.pem"), "{msg}");
    let pem = std::fs::read_to_string(&ec).unwrap();
    let body = pem.lines().nth(1).unwrap();
    assert!(!msg.contains(body), "the key material is not in the error");
    // Built through the generic constructor, as the controller does.
    let key = test_key(dir.path(), "ok");
    let p = nodekeeper_core::controller::act::provider::build(
        &ProviderConfig::Oci(Box::new(base(key.pkcs1.clone()))),
        c.client.clone(),
        true,
    )
    .unwrap();
    assert_eq!(p.name(), "oci");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_replaces_an_interrupted_node_through_kind_oci() {
    let f = fixture().await;
    f.oci.release();
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "nodekeeper"}})).unwrap();
    Api::all(f.cluster.client.clone())
        .create(&kube::api::PostParams::default(), &ns)
        .await
        .unwrap();
    let victim = f.victim().await;
    let node = victim.metadata.name.clone().unwrap();
    let instance = instance_of(&victim);
    let mut cfg = engine_support::controller_config("oci-engine");
    cfg.provider = ProviderConfig::Oci(Box::new(config(&f.oci, &f.key, &f.ca, OciMode::Terminate)));
    // the stand-in is on loopback
    cfg.allow_loopback_destinations = true;
    let ctl = engine_support::controller(&f.cluster, &cfg, PolicyConfig::default(), None).await;
    let now = f.cluster.sim.store.clock.now();
    let ev = engine_support::notice(
        "oci-preempt-1",
        EventKind::Preemption,
        Some(now + chrono::Duration::seconds(120)),
        now,
    );
    assert!(ctl.app.states.ingest_event(&node, ev).await);
    let oci = &f.oci;
    wait_until(
        Duration::from_secs(30),
        "one DELETE of the instance",
        || async move { oci.calls().iter().any(Call::acted) },
    )
    .await;
    let acted = f.acted();
    assert_eq!(acted.len(), 1, "{:?}", f.oci.calls());
    assert_eq!(
        acted[0].path,
        format!("/20160918/instances/{instance}?preserveBootVolume=false")
    );
    let nodes: Api<Node> = Api::all(f.cluster.client.clone());
    wait_until(Duration::from_secs(30), "old node removed", || {
        let nodes = nodes.clone();
        let node = node.clone();
        async move { nodes.get_opt(&node).await.unwrap().is_none() }
    })
    .await;
    assert_eq!(f.acted().len(), 1, "{:?}", f.oci.calls());
    drop(ctl);
}

/// Kills the child (by its PID) when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sim_subcommand_serves_the_stand_in_for_a_cluster() {
    use std::io::BufRead;
    engine_support::init();
    let dir = tempfile::tempdir().unwrap();
    let key = test_key(dir.path(), "cli");
    let cluster = TestCluster::start(SimOptions {
        time_scale: 30.0,
        scenario: Scenario::default_mixed(),
        ..Default::default()
    })
    .await
    .unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig).unwrap();
    let public = dir.path().join("cli.pub.pem");
    let ca = dir.path().join("ca.pem");
    let mut child = Child(
        Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
            .args([
                "sim",
                "oci-compute",
                "--listen",
                "127.0.0.1:0",
                "--launch-delay",
                "200ms",
            ])
            .arg("--key")
            .arg(format!("{}={}", key_id(&key), public.display()))
            .arg("--ca-out")
            .arg(&ca)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--adopt-nodes")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = child.0.stderr.take().unwrap();
    std::thread::spawn(move || for _ in std::io::BufReader::new(stderr).lines() {});
    let mut lines = std::io::BufReader::new(child.0.stdout.take().unwrap()).lines();
    let url = tokio::task::spawn_blocking(move || {
        lines
            .find_map(|l| {
                l.unwrap()
                    .strip_prefix("OCI API stand-in listening on ")
                    .map(str::to_string)
            })
            .expect("the stand-in printed its URL")
    })
    .await
    .unwrap();

    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let victim = nodes
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|n| annotation(n, NODE_POOL_ANNOTATION).is_some())
        .expect("--adopt-nodes gave the nodes OCI identities");
    let node = victim.metadata.name.clone().unwrap();
    let mut cfg = OciConfig {
        endpoint: Some(url),
        ..config_for(&key, &ca)
    };
    cfg.mode = OciMode::NodePool;
    let p = Oci::new(cfg, cluster.client.clone(), true).unwrap();
    let t = p
        .replace_now(&ReplacementRequest::new(&node, "repair", "cli"))
        .await
        .unwrap();
    let new_node = wait_ready(&p, &t).await;
    assert!(
        nodes.get_opt(&node).await.unwrap().is_none(),
        "old node removed"
    );
    let fresh = nodes.get(&new_node).await.unwrap();
    assert_eq!(
        annotation(&fresh, NODE_POOL_ANNOTATION),
        annotation(&victim, NODE_POOL_ANNOTATION)
    );
}

#[test]
fn the_stand_in_checks_delete_nodes_query_as_the_api_defines_it() {
    use oci_compute::check_delete_node_query as check;
    assert_eq!(check(""), Ok(()));
    assert_eq!(
        check("isDecrementSize=false&isForceDeletionAfterOverrideGraceDuration=true&overrideEvictionGraceDuration=PT0M"),
        Ok(())
    );
    assert_eq!(check("overrideEvictionGraceDuration=PT60M"), Ok(()));
    for bad in [
        "overrideEvictionGraceDuration=PT61M",
        "overrideEvictionGraceDuration=0",
        "overrideEvictionGraceDuration=PT1H",
        "isDecrementSize=no",
        "isForceDeletionAfterOverrideGraceDuration=",
        "preserveBootVolume=false",
    ] {
        assert!(check(bad).is_err(), "{bad}");
    }
}

//! A local stand-in of the OCI API calls the `oci` replacement provider makes, served over HTTPS
//! with a throw-away CA:
//!
//! - Compute `DELETE /20160918/instances/{instanceId}` (TerminateInstance): 204;
//! - Compute `GET /20160918/instances/{instanceId}` (GetInstance): 200 with `lifecycleState`;
//! - Container Engine `DELETE /20180222/nodePools/{nodePoolId}/node/{nodeId}` (DeleteNode): 202
//!   with `opc-work-request-id`; its query checked as the API defines it (`isDecrementSize`,
//!   `isForceDeletionAfterOverrideGraceDuration` booleans, `overrideEvictionGraceDuration` PT0M to
//!   PT60M), else 400 `InvalidParameter`;
//! - Container Engine `GET /20180222/workRequests/{id}` (GetWorkRequest): `status` IN_PROGRESS until
//!   the node is replaced, then SUCCEEDED (FAILED with option `fail_work_requests`, the node left in
//!   place), and `GET .../errors` (ListWorkRequestErrors).
//!
//! With `service_account_tokens`, it is also OKE's workload identity token endpoint (proxymux,
//! `POST /resourcePrincipalSessionTokens`, on `proxymux_listen` too, e.g. `127.0.0.1:12250` where
//! the OCI Go SDK looks for it), as the SDK's client expects it
//! (`common/auth/federation_client_oke_workload_identity.go`): `Authorization: Bearer <service
//! account token>`, body `{"podKey": "<public key PEM>"}`, answer a JSON string of base64 of
//! `{"token": "ST$<JWT>"}` (JWT claims `iat`, `exp`: `session_ttl`). Requests signed with
//! `keyId="ST$<JWT>"` then verify with that session's public key until it expires. The SDK's own
//! auth provider gets a working session from it (tests/host/oci_sdk_crosscheck.rs).
//!
//! Answers follow OCI's API errors page (docs.oracle.com `Content/API/References/apierrors.htm`),
//! not the provider: an authenticated key without an IAM policy (option `unauthorized`) gets 404
//! `NotAuthorizedOrNotFound` for every call, exactly as for a missing resource. How OCI answers a
//! repeated DELETE of a terminating or terminated instance is not documented, so it is an option
//! ([`Repeat`]), and the provider's tests run against each of its values.
//!
//! Every request must carry a valid OCI signature (version 1, RSA-SHA256, `date (request-target)
//! host` at least, `Date` within 5 minutes): the stand-in rebuilds the signing string from the
//! request it received and verifies it with the public key registered for the `keyId`, independently
//! of the provider's signing code; a missing or bad signature is a 401 `NotAuthenticated` as on OCI.
//! Every call is recorded; the next answers can be forced with [`OciCompute::fail_next`] (each status
//! with the error code OCI's API errors page gives it) or [`OciCompute::fail_next_with`] (a status
//! and code, e.g. 409 `LockConflict`); with `hold`, accepted DELETEs wait for
//! [`OciCompute::release`] (deterministic tests).
//!
//! With a cluster (`client`, e.g. the sim API server's), an accepted DELETE behaves like OCI plus the
//! node pool: after `launch_delay` the Node whose `spec.providerID` is the instance is removed and a
//! replacement Node of the same pool (same labels, annotations, taints and capacity; a new name and
//! instance OCID) is created; the sim's kubelet loop keeps it Ready.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use nodekeeper_core::sync::lock;
use serde_json::json;
use tokio_util::sync::CancellationToken;

// What OKE and Karpenter put on a Node, from their documentation; the stand-in's own copy, never
// the provider's (a wrong name there must fail a test).
/// OKE's node pool of a Node (annotation, or label on older clusters).
const NODE_POOL_ANNOTATION: &str = "oci.oraclecloud.com/node-pool-id";
/// Karpenter's NodePool of a Node.
const POOL_LABEL: &str = "karpenter.sh/nodepool";

/// The instance OCID of an OKE `spec.providerID` (`oci://ocid1.instance…` or the bare OCID).
fn instance_ocid(provider_id: &str) -> Option<&str> {
    let id = provider_id.strip_prefix("oci://").unwrap_or(provider_id);
    id.starts_with("ocid1.instance.").then_some(id)
}

/// The OKE node pool OCID of `node`: its node-pool annotation or label.
fn node_pool_id(node: &Node) -> Option<String> {
    let m = &node.metadata;
    m.annotations
        .as_ref()
        .and_then(|a| a.get(NODE_POOL_ANNOTATION))
        .or_else(|| m.labels.as_ref().and_then(|l| l.get(NODE_POOL_ANNOTATION)))
        .filter(|p| p.starts_with("ocid1.nodepool."))
        .cloned()
}

/// Largest accepted difference between the `Date` header and the stand-in's clock (as OCI).
pub const MAX_SKEW: Duration = Duration::from_secs(300);

/// Why the stand-in cannot start.
#[derive(Debug, thiserror::Error)]
pub enum OciComputeError {
    /// A registered public key is unusable.
    #[error("public key for {key_id}: {why}")]
    Key {
        /// The keyId it was registered for.
        key_id: String,
        /// Why.
        why: String,
    },
    /// TLS material could not be made.
    #[error(transparent)]
    Tls(#[from] crate::apiserver::tls::TlsError),
    /// Binding the listener failed.
    #[error("binding {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
}

/// Options of [`OciCompute::start`].
#[derive(Clone, Default)]
pub struct OciComputeOptions {
    /// Accepted API keys: `keyId` (`tenancy/user/fingerprint`) → public key PEM (`PUBLIC KEY`, SPKI,
    /// as uploaded to OCI).
    pub keys: BTreeMap<String, String>,
    /// The cluster whose Nodes stand for the instances (remove / replace), if any.
    pub client: Option<kube::Client>,
    /// Real time between an accepted DELETE and the node's removal and replacement.
    pub launch_delay: Duration,
    /// Address to listen on (default `127.0.0.1:0`).
    pub listen: Option<SocketAddr>,
    /// Hold accepted DELETEs (instances stay terminating, nodes untouched) until
    /// [`OciCompute::release`].
    pub hold: bool,
    /// keyIds whose signatures verify but that no IAM policy allows anything: every call is a 404
    /// `NotAuthorizedOrNotFound`, as OCI answers a caller lacking the policy.
    pub unauthorized: std::collections::BTreeSet<String>,
    /// How a DELETE of an instance already terminating or terminated is answered.
    pub repeat: Repeat,
    /// DeleteNode's work requests end FAILED and leave the node in place.
    pub fail_work_requests: bool,
    /// Service account tokens the workload identity token endpoint accepts (empty: no endpoint).
    pub service_account_tokens: std::collections::BTreeSet<String>,
    /// Lifetime of a session token (default 1 hour).
    pub session_ttl: Option<Duration>,
    /// A second address serving the same (e.g. `127.0.0.1:12250`, the SDK's proxymux port).
    pub proxymux_listen: Option<SocketAddr>,
    /// Also be an instance's identity for instance principals: the metadata service's
    /// `/opc/v2/identity/{cert,key,intermediate}.pem` and `/opc/v2/instance/region`, and the auth
    /// service's `POST /v1/x509` federation.
    pub instance_identity: bool,
}

/// Tenancy OCID of the stand-in's instance identity (its certificate's `opc-tenant:` subject).
pub const IDENTITY_TENANCY: &str = "ocid1.tenancy.oc1..simidentity";
/// Region the stand-in's metadata service names.
pub const IDENTITY_REGION: &str = "us-phoenix-1";

/// An instance identity as the metadata service hands it out.
struct Identity {
    cert_pem: String,
    key_pem: String,
    intermediate_pem: String,
    /// `<tenancy>/fed-x509-sha256/<SHA-256 of the certificate, lower-case hex pairs with `:`>`.
    key_id: String,
    /// The certificate key's `RSAPublicKey` DER.
    public_der: Vec<u8>,
}

fn make_identity() -> Result<Identity, String> {
    use rsa::pkcs1::EncodeRsaPublicKey;
    use rsa::pkcs8::{EncodePrivateKey, LineEnding};
    let key =
        rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048).map_err(|e| e.to_string())?;
    let pkcs8 = key.to_pkcs8_der().map_err(|e| e.to_string())?;
    let key_pem = key
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| e.to_string())?
        .to_string();
    let public_der = key
        .to_public_key()
        .to_pkcs1_der()
        .map_err(|e| e.to_string())?
        .as_bytes()
        .to_vec();
    let der = rustls_pki_types::PrivatePkcs8KeyDer::from(pkcs8.as_bytes().to_vec());
    let pair = rcgen::KeyPair::from_pkcs8_der_and_sign_algo(&der, &rcgen::PKCS_RSA_SHA256)
        .map_err(|e| e.to_string())?;
    let mut params =
        rcgen::CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "ocid1.instance.oc1.sim.identity");
    params.distinguished_name.push(
        rcgen::DnType::OrganizationalUnitName,
        format!("opc-tenant:{IDENTITY_TENANCY}"),
    );
    let cert = params.self_signed(&pair).map_err(|e| e.to_string())?;
    let ca_key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    ca.distinguished_name.push(
        rcgen::DnType::CommonName,
        "PKISVC Identity Intermediate sim",
    );
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let intermediate = ca.self_signed(&ca_key).map_err(|e| e.to_string())?;
    use sha2::Digest;
    let fp = sha2::Sha256::digest(cert.der().as_ref())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    Ok(Identity {
        cert_pem: cert.pem(),
        key_pem,
        intermediate_pem: intermediate.pem(),
        key_id: format!("{IDENTITY_TENANCY}/fed-x509-sha256/{fp}"),
        public_der,
    })
}

/// How a DELETE of an instance that is already terminating or terminated is answered. OCI does not
/// document it; each value is a reading of its API errors page, and the provider must end well on
/// every one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Repeat {
    /// 404 `NotAuthorizedOrNotFound` ("the resource does not exist").
    #[default]
    NotFound,
    /// 409 `IncorrectState` ("the resource is in a state in which the operation is not allowed").
    IncorrectState,
    /// Accepted again (204 / 202), starting nothing new.
    Accepted,
}

/// One request the stand-in received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// HTTP method.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// The status answered.
    pub status: u16,
    /// The `keyId` of a verified signature (`None`: not authenticated).
    pub key_id: Option<String>,
    /// The `opc-request-id` header.
    pub request_id: Option<String>,
    /// This call started an instance's termination.
    pub started: bool,
    /// The `Authorization` header as received (signing cross-checks compare it).
    pub authorization: Option<String>,
    /// The `Date` header.
    pub date: Option<String>,
}

impl Call {
    /// Whether this call removed an instance (a DELETE that started a termination).
    pub fn acted(&self) -> bool {
        self.started
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    Terminating,
    Terminated,
}

struct Shared {
    keys: BTreeMap<String, Vec<u8>>,
    unauthorized: std::collections::BTreeSet<String>,
    repeat: Repeat,
    fail_work_requests: bool,
    work_requests: Mutex<BTreeMap<String, &'static str>>,
    sa_tokens: std::collections::BTreeSet<String>,
    session_ttl: Duration,
    /// Session JWT → (its public key, `RSAPublicKey` DER; expiry, epoch seconds).
    sessions: Mutex<BTreeMap<String, (Vec<u8>, i64)>>,
    identity: Option<Identity>,
    client: Option<kube::Client>,
    launch_delay: Duration,
    calls: Mutex<Vec<Call>>,
    faults: Mutex<VecDeque<(u16, String)>>,
    instances: Mutex<BTreeMap<String, Life>>,
    launched: AtomicU64,
    released: tokio::sync::watch::Sender<bool>,
}

/// A running stand-in; stops when dropped.
pub struct OciCompute {
    /// Base URL (`https://127.0.0.1:PORT`): the provider's `endpoint`.
    pub url: String,
    /// The CA (PEM) of its certificate: the provider's `ca_file`.
    pub ca_pem: String,
    shared: Arc<Shared>,
    cancel: CancellationToken,
}

impl Drop for OciCompute {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl OciCompute {
    /// Starts serving on `127.0.0.1:0`.
    pub async fn start(opts: OciComputeOptions) -> Result<Self, OciComputeError> {
        let mut keys = BTreeMap::new();
        for (key_id, pem) in &opts.keys {
            let der = rsa_public_key_from_pem(pem).map_err(|why| OciComputeError::Key {
                key_id: key_id.clone(),
                why,
            })?;
            keys.insert(key_id.clone(), der);
        }
        let shared = Arc::new(Shared {
            keys,
            unauthorized: opts.unauthorized,
            repeat: opts.repeat,
            fail_work_requests: opts.fail_work_requests,
            work_requests: Mutex::new(BTreeMap::new()),
            sa_tokens: opts.service_account_tokens,
            session_ttl: opts.session_ttl.unwrap_or(Duration::from_secs(3600)),
            sessions: Mutex::new(BTreeMap::new()),
            identity: if opts.instance_identity {
                Some(make_identity().map_err(|why| OciComputeError::Key {
                    key_id: "instance identity".into(),
                    why,
                })?)
            } else {
                None
            },
            client: opts.client,
            launch_delay: opts.launch_delay,
            calls: Mutex::new(Vec::new()),
            faults: Mutex::new(VecDeque::new()),
            instances: Mutex::new(BTreeMap::new()),
            launched: AtomicU64::new(0),
            released: tokio::sync::watch::Sender::new(!opts.hold),
        });
        let tls = crate::apiserver::tls::SimTls::generate()?;
        let at = opts
            .listen
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
        let listener = tokio::net::TcpListener::bind(at)
            .await
            .map_err(|e| OciComputeError::Bind(at, e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| OciComputeError::Bind(at, e))?;
        let router = axum::Router::new()
            .fallback(handle)
            .with_state(shared.clone());
        let cancel = CancellationToken::new();
        if let Some(at) = opts.proxymux_listen {
            let second = tokio::net::TcpListener::bind(at)
                .await
                .map_err(|e| OciComputeError::Bind(at, e))?;
            tokio::spawn(nodekeeper_core::serve::serve(
                second,
                router.clone(),
                Some(tls.server.clone()),
                nodekeeper_core::serve::ServeLimits::streaming(),
                Default::default(),
                cancel.clone(),
            ));
        }
        tokio::spawn(nodekeeper_core::serve::serve(
            listener,
            router,
            Some(tls.server.clone()),
            nodekeeper_core::serve::ServeLimits::streaming(),
            Default::default(),
            cancel.clone(),
        ));
        Ok(OciCompute {
            url: format!("https://{addr}"),
            ca_pem: tls.ca_pem,
            shared,
            cancel,
        })
    }

    /// Every request received, in order.
    pub fn calls(&self) -> Vec<Call> {
        lock(&self.shared.calls).clone()
    }

    /// The next authenticated requests are answered with `statuses`, in order (e.g. `[429]`), each
    /// with the error code OCI's API errors page lists first for it ([`error_code_of`]).
    pub fn fail_next(&self, statuses: &[u16]) {
        lock(&self.shared.faults)
            .extend(statuses.iter().map(|&s| (s, error_code_of(s).to_string())));
    }

    /// The next authenticated requests are answered with these statuses and error codes, in order
    /// (e.g. `[(409, "LockConflict")]`).
    pub fn fail_next_with(&self, answers: &[(u16, &str)]) {
        lock(&self.shared.faults).extend(answers.iter().map(|&(s, c)| (s, c.to_string())));
    }

    /// Lets held DELETEs (option `hold`) proceed, now and from now on.
    pub fn release(&self) {
        self.shared.released.send_replace(true);
    }

    /// The `status` of each DeleteNode work request, by id.
    pub fn work_requests(&self) -> BTreeMap<String, String> {
        lock(&self.shared.work_requests)
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect()
    }

    /// Revokes every session token issued so far: requests signed with them are refused 401.
    pub fn revoke_sessions(&self) {
        for (_, exp) in lock(&self.shared.sessions).values_mut() {
            *exp = 0;
        }
    }

    /// Session tokens issued by the workload identity endpoint so far.
    pub fn sessions_issued(&self) -> usize {
        lock(&self.shared.sessions).len()
    }

    /// Instances removed so far (terminating or terminated).
    pub fn removed(&self) -> Vec<String> {
        lock(&self.shared.instances).keys().cloned().collect()
    }
}

/// The PKCS#1 `RSAPublicKey` inside a PEM `PUBLIC KEY` (SubjectPublicKeyInfo).
pub fn rsa_public_key_from_pem(pem: &str) -> Result<Vec<u8>, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::SubjectPublicKeyInfoDer;
    let spki = SubjectPublicKeyInfoDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| format!("not a PEM `PUBLIC KEY`: {e}"))?;
    rsa_public_key_from_spki(spki.as_ref()).ok_or_else(|| "malformed SubjectPublicKeyInfo".into())
}

/// One DER TLV: `(tag, content, rest)`.
fn tlv(d: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, d) = d.split_first()?;
    let (&first, mut d) = d.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || d.len() < n {
            return None;
        }
        let (l, rest) = d.split_at(n);
        d = rest;
        l.iter().fold(0usize, |a, &b| (a << 8) | usize::from(b))
    };
    (d.len() >= len).then(|| (tag, &d[..len], &d[len..]))
}

/// `SEQUENCE { SEQUENCE { algorithm }, BIT STRING { 0, RSAPublicKey } }` → `RSAPublicKey`.
fn rsa_public_key_from_spki(der: &[u8]) -> Option<Vec<u8>> {
    let (0x30, body, _) = tlv(der)? else {
        return None;
    };
    let (0x30, _alg, rest) = tlv(body)? else {
        return None;
    };
    let (0x03, bits, _) = tlv(rest)? else {
        return None;
    };
    let (&0, key) = bits.split_first()? else {
        return None;
    };
    Some(key.to_vec())
}

/// The `k="v"` parameters of an `Authorization: Signature ...` header.
fn signature_params(auth: &str) -> Option<BTreeMap<&str, &str>> {
    let rest = auth.strip_prefix("Signature ")?;
    let mut out = BTreeMap::new();
    for part in rest.split(',') {
        let (k, v) = part.trim().split_once('=')?;
        out.insert(k, v.strip_prefix('"')?.strip_suffix('"')?);
    }
    Some(out)
}

/// Verifies the OCI signature of a request against `keys` (`keyId` → `RSAPublicKey` DER); returns
/// the `keyId`. Rebuilds the signing string from the request as received.
pub fn verify(
    keys: &BTreeMap<String, Vec<u8>>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<String, String> {
    verify_with(keys, method, uri, headers, now, true)
}

/// [`verify`]; `host_signed = false` for the federation endpoint, whose requests the SDK signs
/// without `host` (`common/auth/federation_client.go`: "host is not needed").
fn verify_with(
    keys: &BTreeMap<String, Vec<u8>>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    now: chrono::DateTime<chrono::Utc>,
    host_signed: bool,
) -> Result<String, String> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let auth = header("authorization").ok_or("no Authorization header")?;
    let p = signature_params(auth).ok_or("Authorization is not `Signature k=\"v\",...`")?;
    if p.get("version") != Some(&"1") || p.get("algorithm") != Some(&"rsa-sha256") {
        return Err("version must be \"1\" and algorithm \"rsa-sha256\"".into());
    }
    let key_id = *p.get("keyId").ok_or("no keyId")?;
    let key = keys
        .get(key_id)
        .ok_or_else(|| format!("unknown keyId {key_id}"))?;
    let signed: Vec<&str> = p.get("headers").ok_or("no headers")?.split(' ').collect();
    let mut required = vec!["date", "(request-target)"];
    if host_signed {
        required.push("host");
    }
    if matches!(*method, Method::POST | Method::PUT | Method::PATCH) {
        required.extend(["content-length", "content-type", "x-content-sha256"]);
    }
    if let Some(missing) = required.iter().find(|h| !signed.contains(h)) {
        return Err(format!("header `{missing}` is not signed"));
    }
    let date = header("date").ok_or("no Date header")?;
    let when = chrono::DateTime::parse_from_rfc2822(date).map_err(|e| format!("Date: {e}"))?;
    let skew = (now - when.with_timezone(&chrono::Utc)).abs();
    if skew.to_std().unwrap_or(Duration::MAX) > MAX_SKEW {
        return Err(format!("Date {date} is more than 5 minutes off"));
    }
    let host = header("host")
        .map(str::to_string)
        .or_else(|| uri.authority().map(|a| a.to_string()))
        .ok_or("no Host")?;
    let target = format!(
        "{} {}",
        method.as_str().to_ascii_lowercase(),
        uri.path_and_query().map_or("/", |p| p.as_str())
    );
    let mut lines = Vec::new();
    for h in &signed {
        let v = match *h {
            "(request-target)" => target.clone(),
            "host" => host.clone(),
            other => header(other)
                .ok_or_else(|| format!("signed header `{other}` is missing"))?
                .to_string(),
        };
        lines.push(format!("{h}: {v}"));
    }
    let sig = base64::engine::general_purpose::STANDARD
        .decode(p.get("signature").ok_or("no signature")?)
        .map_err(|e| format!("signature is not base64: {e}"))?;
    ring::signature::UnparsedPublicKey::new(&ring::signature::RSA_PKCS1_2048_8192_SHA256, key)
        .verify(lines.join("\n").as_bytes(), &sig)
        .map_err(|_| "signature does not verify".to_string())?;
    Ok(key_id.to_string())
}

/// The error code OCI's API errors page gives `status` (its first, for statuses with several).
pub fn error_code_of(status: u16) -> &'static str {
    match status {
        400 => "InvalidParameter",
        401 => "NotAuthenticated",
        404 => "NotAuthorizedOrNotFound",
        409 => "IncorrectState",
        412 => "NoEtagMatch",
        429 => "TooManyRequests",
        501 => "MethodNotImplemented",
        503 => "ServiceUnavailable",
        _ => "InternalServerError",
    }
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        axum::Json(json!({"code": code, "message": message})),
    )
        .into_response()
}

/// Which call a path is: `(instance, Some(node pool))` for DeleteNode.
fn route(path: &str) -> Option<(String, Option<String>)> {
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match segs.as_slice() {
        ["20160918", "instances", id] => Some((id.to_string(), None)),
        ["20180222", "nodePools", pool, "node", id] => {
            Some((id.to_string(), Some(pool.to_string())))
        }
        _ => None,
    }
}

async fn handle(
    State(s): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if uri.path() == "/resourcePrincipalSessionTokens" && !s.sa_tokens.is_empty() {
        return session_token(&s, &method, &headers, &body);
    }
    if let Some(id) = &s.identity {
        if let Some(r) = identity(&s, id, &method, &uri, &headers, &body) {
            return r;
        }
    }
    let now = chrono::Utc::now();
    let keys = {
        // The API keys, and the sessions not expired.
        let mut keys = s.keys.clone();
        for (jwt, (der, exp)) in lock(&s.sessions).iter() {
            if *exp > now.timestamp() {
                keys.insert(format!("ST${jwt}"), der.clone());
            }
        }
        keys
    };
    let verified = verify(&keys, &method, &uri, &headers, now);
    let (resp, started) = match &verified {
        Err(why) => {
            tracing::info!(%uri, why, "oci stand-in: not authenticated");
            (
                error(
                    StatusCode::UNAUTHORIZED,
                    "NotAuthenticated",
                    &format!("The required information to complete authentication was not provided or was incorrect: {why}"),
                ),
                false,
            )
        }
        Ok(key) if s.unauthorized.contains(key) => (
            error(
                StatusCode::NOT_FOUND,
                "NotAuthorizedOrNotFound",
                "Authorization failed or requested resource not found.",
            ),
            false,
        ),
        Ok(_) => answer(&s, &method, &uri).await,
    };
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    lock(&s.calls).push(Call {
        method: method.to_string(),
        path: uri.path_and_query().map_or("/", |p| p.as_str()).to_string(),
        status: resp.status().as_u16(),
        key_id: verified.ok(),
        request_id: headers
            .get("opc-request-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        started,
        authorization: header("authorization"),
        date: header("date"),
    });
    resp
}

/// The answer to an authenticated, authorized call, and whether it started a termination.
async fn answer(s: &Arc<Shared>, method: &Method, uri: &Uri) -> (Response, bool) {
    let fault = lock(&s.faults).pop_front();
    if let Some((code, name)) = fault {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return (error(status, &name, "injected by the stand-in"), false);
    }
    let not_found = || {
        error(
            StatusCode::NOT_FOUND,
            "NotAuthorizedOrNotFound",
            "Authorization failed or requested resource not found.",
        )
    };
    if let Some(r) = work_request(s, method, uri.path()) {
        return (r, false);
    }
    let Some((instance, pool)) = route(uri.path()) else {
        return (not_found(), false);
    };
    if pool.is_some() && *method == Method::DELETE {
        if let Err(why) = check_delete_node_query(uri.query().unwrap_or_default()) {
            return (
                error(StatusCode::BAD_REQUEST, "InvalidParameter", &why),
                false,
            );
        }
    }
    if *method == Method::GET && pool.is_none() {
        return (get_instance(s, &instance).await, false);
    }
    if *method != Method::DELETE {
        return (
            error(
                StatusCode::METHOD_NOT_ALLOWED,
                "NotAllowed",
                "method not allowed",
            ),
            false,
        );
    }
    let accepted = |pool: &Option<String>| {
        let mut r = if pool.is_some() {
            StatusCode::ACCEPTED.into_response()
        } else {
            StatusCode::NO_CONTENT.into_response()
        };
        if pool.is_some() {
            if let Ok(v) = work_request_id(&instance).parse() {
                r.headers_mut().insert("opc-work-request-id", v);
            }
        }
        r
    };
    let known = lock(&s.instances).get(&instance).copied();
    if known.is_some() {
        let r = match s.repeat {
            Repeat::NotFound => not_found(),
            Repeat::IncorrectState => error(
                StatusCode::CONFLICT,
                "IncorrectState",
                "The resource is in a state in which the operation is not allowed.",
            ),
            Repeat::Accepted => accepted(&pool),
        };
        return (r, false);
    }
    let node = match &s.client {
        Some(c) => match node_of(c, &instance).await {
            Ok(n) => n,
            Err(e) => {
                return (
                    error(StatusCode::INTERNAL_SERVER_ERROR, "InternalServerError", &e),
                    false,
                )
            }
        },
        None => None,
    };
    if s.client.is_some() && node.is_none() {
        return (not_found(), false);
    }
    if let (Some(pool), Some(n)) = (&pool, &node) {
        if node_pool_id(n).as_deref() != Some(pool.as_str()) {
            return (not_found(), false);
        }
    }
    lock(&s.instances).insert(instance.clone(), Life::Terminating);
    let wr = pool.as_ref().map(|_| work_request_id(&instance));
    if let Some(w) = &wr {
        lock(&s.work_requests).insert(w.clone(), "IN_PROGRESS");
    }
    let (s2, inst) = (s.clone(), instance.clone());
    let mut released = s.released.subscribe();
    tokio::spawn(async move {
        let _ = released.wait_for(|r| *r).await;
        tokio::time::sleep(s2.launch_delay).await;
        if let (Some(w), true) = (&wr, s2.fail_work_requests) {
            // OKE could not delete the node: it stays, its instance runs on.
            lock(&s2.instances).remove(&inst);
            lock(&s2.work_requests).insert(w.clone(), "FAILED");
            return;
        }
        if let (Some(c), Some(n)) = (&s2.client, node) {
            if let Err(e) = replace_node(&s2, c, n).await {
                tracing::warn!(instance = %inst, error = %e, "oci stand-in: replacing the node failed");
            }
        }
        lock(&s2.instances).insert(inst, Life::Terminated);
        if let Some(w) = wr {
            lock(&s2.work_requests).insert(w, "SUCCEEDED");
        }
    });
    (accepted(&pool), true)
}

/// The instance identity's metadata paths and the auth service's federation; `None`: another path.
fn identity(
    s: &Shared,
    id: &Identity,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Option<Response> {
    let metadata = match uri.path() {
        "/opc/v2/identity/cert.pem" => Some(id.cert_pem.as_str()),
        "/opc/v2/identity/key.pem" => Some(id.key_pem.as_str()),
        "/opc/v2/identity/intermediate.pem" => Some(id.intermediate_pem.as_str()),
        "/opc/v2/instance/region" => Some(IDENTITY_REGION),
        _ => None,
    };
    if let Some(answer) = metadata {
        // The metadata service v2 wants `Authorization: Bearer Oracle`.
        let ok = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v == "Bearer Oracle");
        return Some(if ok && *method == Method::GET {
            (StatusCode::OK, answer.to_string()).into_response()
        } else {
            StatusCode::UNAUTHORIZED.into_response()
        });
    }
    if uri.path() != "/v1/x509" {
        return None;
    }
    let keys = BTreeMap::from([(id.key_id.clone(), id.public_der.clone())]);
    if let Err(why) = verify_with(&keys, method, uri, headers, chrono::Utc::now(), false) {
        return Some(error(StatusCode::UNAUTHORIZED, "NotAuthenticated", &why));
    }
    use sha2::Digest;
    let digest = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(body));
    if headers
        .get("x-content-sha256")
        .and_then(|v| v.to_str().ok())
        != Some(digest.as_str())
    {
        return Some(error(
            StatusCode::UNAUTHORIZED,
            "NotAuthenticated",
            "x-content-sha256 is not the body's",
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let der = v
        .get("publicKey")
        .and_then(|k| k.as_str())
        .and_then(|k| base64::engine::general_purpose::STANDARD.decode(k).ok())
        .and_then(|spki| rsa_public_key_from_spki(&spki));
    let certificate = v
        .get("certificate")
        .and_then(|c| c.as_str())
        .unwrap_or_default();
    let ours: String = id
        .cert_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    let (Some(der), true) = (der, certificate == ours) else {
        return Some(error(
            StatusCode::BAD_REQUEST,
            "InvalidParameter",
            "publicKey is not a base64 SubjectPublicKeyInfo, or certificate is not the instance's",
        ));
    };
    let jwt = mint_session(s, der);
    Some(axum::Json(json!({"token": jwt})).into_response())
}

/// A session JWT for the public key `der` (`RSAPublicKey` DER), registered for verification.
fn mint_session(s: &Shared, der: Vec<u8>) -> String {
    let iat = chrono::Utc::now().timestamp();
    let exp = iat + i64::try_from(s.session_ttl.as_secs()).unwrap_or(3600);
    let n = lock(&s.sessions).len();
    let b64 = |v: serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let jwt = format!(
        "{}.{}.{}",
        b64(json!({"alg": "RS256", "typ": "JWT"})),
        // The claims the SDK reads: `iat`, `exp`, `res_tenant` (its TenancyOCID),
        // `res_compartment`.
        b64(
            json!({"iat": iat, "exp": exp, "sub": format!("ocid1.principal.sim.{n}"),
            "res_type": "workload", "res_tenant": "ocid1.tenancy.oc1..sim",
            "res_compartment": "ocid1.compartment.oc1..sim"})
        ),
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b"stand-in")
    );
    lock(&s.sessions).insert(jwt.clone(), (der, exp));
    jwt
}

/// OKE's workload identity token endpoint: a session for the posted public key.
fn session_token(s: &Shared, method: &Method, headers: &HeaderMap, body: &[u8]) -> Response {
    if *method != Method::POST {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "NotAllowed",
            "method not allowed",
        );
    }
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if !bearer.is_some_and(|t| s.sa_tokens.contains(t)) {
        return error(
            StatusCode::UNAUTHORIZED,
            "NotAuthenticated",
            "no valid service account token",
        );
    }
    let pod_key = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("podKey")?.as_str().map(str::to_string));
    let Some(der) = pod_key.and_then(|pem| rsa_public_key_from_pem(&pem).ok()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "InvalidParameter",
            "podKey is not a PEM public key",
        );
    };
    let jwt = mint_session(s, der);
    let inner = json!({"token": format!("ST${jwt}")}).to_string();
    axum::Json(json!(
        base64::engine::general_purpose::STANDARD.encode(inner)
    ))
    .into_response()
}

fn work_request_id(instance: &str) -> String {
    format!("ocid1.clustersworkrequest.oc1.sim.{instance}")
}

/// DeleteNode's query as the Container Engine API defines it: booleans `isDecrementSize` and
/// `isForceDeletionAfterOverrideGraceDuration`, `overrideEvictionGraceDuration` an ISO 8601
/// duration from PT0M to PT60M.
pub fn check_delete_node_query(query: &str) -> Result<(), String> {
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "isDecrementSize" | "isForceDeletionAfterOverrideGraceDuration" => {
                if v != "true" && v != "false" {
                    return Err(format!("{k}: `{v}` is not a boolean"));
                }
            }
            "overrideEvictionGraceDuration" => {
                let minutes = v
                    .strip_prefix("PT")
                    .and_then(|m| m.strip_suffix('M'))
                    .and_then(|m| m.parse::<u32>().ok());
                if minutes.is_none_or(|m| m > 60) {
                    return Err(format!("{k}: `{v}` is not a duration from PT0M to PT60M"));
                }
            }
            other => return Err(format!("unknown query parameter `{other}`")),
        }
    }
    Ok(())
}

/// GetWorkRequest and ListWorkRequestErrors of the DeleteNode work requests; `None`: another path.
fn work_request(s: &Shared, method: &Method, path: &str) -> Option<Response> {
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (id, errors) = match segs.as_slice() {
        ["20180222", "workRequests", id] => (*id, false),
        ["20180222", "workRequests", id, "errors"] => (*id, true),
        _ => return None,
    };
    if *method != Method::GET {
        return Some(error(
            StatusCode::METHOD_NOT_ALLOWED,
            "NotAllowed",
            "method not allowed",
        ));
    }
    let Some(status) = lock(&s.work_requests).get(id).copied() else {
        return Some(error(
            StatusCode::NOT_FOUND,
            "NotAuthorizedOrNotFound",
            "Authorization failed or requested resource not found.",
        ));
    };
    Some(if errors {
        let list = if status == "FAILED" {
            json!([{"code": "InternalError", "message": "the stand-in was told to fail this work request",
                    "timestamp": chrono::Utc::now().to_rfc3339()}])
        } else {
            json!([])
        };
        axum::Json(list).into_response()
    } else {
        axum::Json(json!({"id": id, "operationType": "NODEPOOL_UPDATE", "status": status}))
            .into_response()
    })
}

/// GetInstance: the instance's `lifecycleState` (TERMINATING / TERMINATED once deleted here,
/// RUNNING while a Node stands for it), else 404.
async fn get_instance(s: &Arc<Shared>, instance: &str) -> Response {
    let life = lock(&s.instances).get(instance).copied();
    let state = match life {
        Some(Life::Terminating) => "TERMINATING",
        Some(Life::Terminated) => "TERMINATED",
        None => {
            let exists = match &s.client {
                Some(c) => match node_of(c, instance).await {
                    Ok(n) => n.is_some(),
                    Err(e) => {
                        return error(StatusCode::INTERNAL_SERVER_ERROR, "InternalServerError", &e)
                    }
                },
                None => false,
            };
            if !exists {
                return error(
                    StatusCode::NOT_FOUND,
                    "NotAuthorizedOrNotFound",
                    "Authorization failed or requested resource not found.",
                );
            }
            "RUNNING"
        }
    };
    axum::Json(json!({"id": instance, "lifecycleState": state})).into_response()
}

async fn node_of(c: &kube::Client, instance: &str) -> Result<Option<Node>, String> {
    let nodes = Api::<Node>::all(c.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing nodes: {e}"))?;
    Ok(nodes.items.into_iter().find(|n| {
        n.spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .and_then(instance_ocid)
            == Some(instance)
    }))
}

/// Labels and annotations nodekeeper puts on a node it acts on: not carried to the replacement.
fn ours(key: &str) -> bool {
    key.starts_with("nodekeeper.io/")
        || key == "node.kubernetes.io/exclude-from-external-load-balancers"
}

/// Removes `old` and creates its replacement in the same pool (Ready; the sim's kubelet keeps it).
async fn replace_node(s: &Shared, c: &kube::Client, old: Node) -> Result<(), kube::Error> {
    let api = Api::<Node>::all(c.clone());
    let old_name = old.metadata.name.clone().unwrap_or_default();
    api.delete(&old_name, &DeleteParams::default()).await?;
    let n = s.launched.fetch_add(1, Ordering::Relaxed) + 1;
    let labels = old.metadata.labels.clone().unwrap_or_default();
    let prefix = labels
        .get(POOL_LABEL)
        .cloned()
        .unwrap_or_else(|| "node".into());
    let name = format!("{prefix}-oci-r{n}");
    let mut labels: BTreeMap<String, String> =
        labels.into_iter().filter(|(k, _)| !ours(k)).collect();
    labels.insert("kubernetes.io/hostname".into(), name.clone());
    let annotations: BTreeMap<String, String> = old
        .metadata
        .annotations
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| !ours(k))
        .collect();
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let status = old.status.clone().unwrap_or_default();
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"providerID": format!("oci://ocid1.instance.oc1.sim.{name}"),
                 "taints": old.spec.as_ref().and_then(|s| s.taints.clone())
                     .unwrap_or_default().into_iter()
                     .filter(|t| !t.key.starts_with("node.kubernetes.io/") && !t.key.starts_with("nodekeeper.io/"))
                     .collect::<Vec<_>>()},
        "status": {"capacity": status.capacity, "allocatable": status.allocatable,
                   "nodeInfo": status.node_info,
                   "addresses": [{"type": "Hostname", "address": name}],
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                   "message": "", "lastHeartbeatTime": now, "lastTransitionTime": now}]}
    });
    let node: Node = serde_json::from_value(node).map_err(kube::Error::SerdeError)?;
    api.create(&PostParams::default(), &node).await?;
    tracing::info!(old = %old_name, new = %name, "oci stand-in: instance replaced");
    Ok(())
}

/// Gives every node of the cluster an OCI identity as OKE would: `spec.providerID =
/// oci://ocid1.instance.oc1.sim.<name>` and, for nodes with a `karpenter.sh/nodepool` label, the
/// annotation `oci.oraclecloud.com/node-pool-id = ocid1.nodepool.oc1.sim.<pool>`. Returns the count.
pub async fn adopt_nodes(c: &kube::Client) -> Result<usize, kube::Error> {
    let api = Api::<Node>::all(c.clone());
    let nodes = api.list(&ListParams::default()).await?.items;
    for n in &nodes {
        let name = n.metadata.name.clone().unwrap_or_default();
        let pool = n.metadata.labels.as_ref().and_then(|l| l.get(POOL_LABEL));
        let mut patch =
            json!({"spec": {"providerID": format!("oci://ocid1.instance.oc1.sim.{name}")}});
        if let Some(p) = pool {
            patch["metadata"] = json!({"annotations": {NODE_POOL_ANNOTATION: format!("ocid1.nodepool.oc1.sim.{p}")}});
        }
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    Ok(nodes.len())
}

/// Arguments of `nodekeeper sim oci-compute` (parsed, with their defaults, by the binary's `cli::sim`).
#[derive(Debug, Clone)]
pub struct OciComputeArgs {
    /// Address to listen on (HTTPS).
    pub listen: SocketAddr,
    /// An accepted API key, `KEYID=FILE`: keyId `<tenancy>/<user>/<fingerprint>` and the PEM public
    /// key (`PUBLIC KEY`). Repeatable.
    pub keys: Vec<String>,
    /// File to write the CA certificate (PEM) of the stand-in's TLS certificate to (the
    /// provider's `ca_file`).
    pub ca_out: PathBuf,
    /// Cluster whose Nodes stand for the instances (removed and replaced on DELETE); without it,
    /// DELETEs are only answered and logged.
    pub kubeconfig: Option<PathBuf>,
    /// First give every node of that cluster an OCI identity (providerID, node-pool annotation).
    pub adopt_nodes: bool,
    /// Real time from an accepted DELETE to the node's removal and replacement.
    pub launch_delay: Duration,
}

/// `nodekeeper sim oci-compute`: serves until `shutdown` is cancelled (SIGTERM or SIGINT, at the binary edge).
pub async fn run(
    args: OciComputeArgs,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<u8, Box<dyn std::error::Error + Send + Sync>> {
    let mut keys = BTreeMap::new();
    for k in &args.keys {
        let (id, file) = k
            .split_once('=')
            .ok_or_else(|| format!("--key `{k}`: expected KEYID=FILE"))?;
        let pem = std::fs::read_to_string(file).map_err(|e| format!("--key {file}: {e}"))?;
        keys.insert(id.to_string(), pem);
    }
    let client = match &args.kubeconfig {
        Some(p) => {
            use nodekeeper_core::k8s::client;
            Some(client::client(
                client::config(Some(p), None, "oci-compute-emulator").await?,
            )?)
        }
        None => None,
    };
    if let (true, Some(c)) = (args.adopt_nodes, &client) {
        let n = adopt_nodes(c).await?;
        println!("gave {n} nodes an OCI identity");
    }
    let sim = OciCompute::start(OciComputeOptions {
        keys,
        client,
        launch_delay: args.launch_delay,
        listen: Some(args.listen),
        hold: false,
        unauthorized: Default::default(),
        repeat: Repeat::default(),
        fail_work_requests: false,
        ..Default::default()
    })
    .await?;
    std::fs::write(&args.ca_out, &sim.ca_pem)
        .map_err(|e| format!("--ca-out {}: {e}", args.ca_out.display()))?;
    println!("OCI API stand-in listening on {}", sim.url);
    shutdown.cancelled().await;
    Ok(0)
}

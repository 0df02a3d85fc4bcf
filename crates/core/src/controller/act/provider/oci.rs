//! The `oci` provider: replaces a node by terminating its OCI Compute instance
//! (`mode = "terminate"`, `DELETE /20160918/instances/{id}?preserveBootVolume=false`) or by deleting it
//! from its OKE node pool without shrinking the pool (`mode = "node-pool"`,
//! `DELETE /20180222/nodePools/{poolId}/node/{nodeId}?isDecrementSize=false&...`, OKE's own drain
//! overridden with `PT0M` and force, its work request followed); the node pool (or instance pool)
//! launches the replacement, reported by `replacement_ready` as a new Ready node of the same pool.
//! `request_replacement` only checks the node and records the ticket; the removal is `retire`,
//! once nodekeeper's drain is over.
//!
//! Requests are signed with OCI's API signature version 1 (draft-cavage HTTP signatures, RSA-SHA256
//! over `date (request-target) host`, plus `content-length content-type x-content-sha256` for bodies)
//! with an API key (`tenancy`/`user`/`fingerprint`, PEM private key in `key_file`, PKCS#8 or PKCS#1).
//! The key is never logged; `Debug` redacts it.
//!
//! Identity: the instance OCID is the node's `spec.providerID` (`oci://ocid1.instance...` or the
//! bare OCID, as OKE sets it); the OKE node pool is the node's `oci.oraclecloud.com/node-pool-id`
//! annotation (or label).
//!
//! Answers, as OCI's API errors page and its Go SDK's `DefaultRetryPolicy` define them ([`classify`]):
//! 2xx is accepted; 409 `IncorrectState` / `LockConflict`, 429 and 5xx except 501 are retried with
//! jittered backoff, as are transport errors; 401 `NotAuthenticated` is retried
//! [`AUTH_ATTEMPTS`]` - 1` times, then permanent. A 404 `NotAuthorizedOrNotFound` means "not found **or
//! not authorized**", so it never counts as done by itself: `GetInstance` decides ([`after_lookup`]).
//! TERMINATING or TERMINATED is done (a restarted controller asking again); anything else is a
//! permanent error naming the IAM policy statement to add ([`policy_hint`]). A 409 `IncorrectState`
//! is checked the same way, so a repeat answered with it ends once the instance is going away.
//!
//! Idempotency: tickets are remembered by `request_id` (a request that got its 2xx is not sent
//! again); `opc-request-id` carries the request id.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::Client;
use ring::signature::RsaKeyPair;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::webhook::trim;
use super::{
    check_retries, new_ready_node, with_retries, Attempt, CallError, NodeProvider, ProviderError,
    ReplacementRequest, ReplacementTicket, SetupError, POOL_LABEL,
};
use crate::cfg_path;
use crate::config::Diagnostic;

const NAME: &str = "oci";

/// Annotation (OKE sets it; also accepted as a label) naming a node's OKE node pool OCID.
pub const NODE_POOL_ANNOTATION: &str = "oci.oraclecloud.com/node-pool-id";

/// Compute API version path of TerminateInstance.
pub const COMPUTE_API: &str = "/20160918";
/// Container Engine (OKE) API version path of DeleteNode.
pub const OKE_API: &str = "/20180222";

/// Attempts a 401 `NotAuthenticated` gets before it is a permanent error (OCI's API errors page:
/// retry with backoff; a clock or key rotation settles within a few tries, a wrong key never does).
pub const AUTH_ATTEMPTS: u32 = 3;

/// What one answer of an OCI API call means, before anything else is looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// 2xx: the call was accepted.
    Accepted,
    /// 404 `NotAuthorizedOrNotFound`, or 409 `IncorrectState`: the instance may be gone or going
    /// away already, or (404) the caller lacks the policy; `GetInstance` decides ([`after_lookup`]).
    LookUp,
    /// Try again after a backoff.
    Retry,
    /// Give up: retrying cannot change the answer.
    Permanent,
}

/// The meaning of `status` with OCI's error `code` (the body's `"code"`) on attempt `attempt`
/// (1-based), per OCI's API errors page and the Go SDK's `DefaultRetryPolicy` (`common/retry.go`):
/// it retries (409, IncorrectState), (409, LockConflict), 429 and every 5xx but 501.
pub fn classify(status: u16, code: Option<&str>, attempt: u32) -> Verdict {
    match (status, code) {
        (200..=299, _) => Verdict::Accepted,
        (404, _) | (409, Some("IncorrectState")) => Verdict::LookUp,
        (409, Some("LockConflict")) | (429, _) => Verdict::Retry,
        (401, _) if attempt < AUTH_ATTEMPTS => Verdict::Retry,
        (501, _) => Verdict::Permanent,
        (500..=599, _) => Verdict::Retry,
        _ => Verdict::Permanent,
    }
}

/// What `GetInstance` said after a [`Verdict::LookUp`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// 200 with this `lifecycleState`.
    State(String),
    /// 404 `NotAuthorizedOrNotFound`.
    NotFound,
}

/// How a [`Verdict::LookUp`] ends, given the first call's `status` and what `GetInstance` said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterLookup {
    /// The instance is TERMINATING or TERMINATED: nothing left to do.
    Gone,
    /// Try the call again later (409 `IncorrectState` on an instance that is not going away).
    Retry,
    /// A 404 the instance's state does not explain: the IAM policy is missing (or the instance
    /// does not exist); the message says which statement to add.
    Unauthorized(String),
}

/// Decides a [`Verdict::LookUp`] (pure): `status` is the first call's (404 or 409), `looked` the
/// `GetInstance` answer, `mode` names the policy statement in the error.
pub fn after_lookup(status: u16, looked: &Lookup, mode: OciMode) -> AfterLookup {
    match looked {
        Lookup::State(s) if matches!(s.as_str(), "TERMINATING" | "TERMINATED") => AfterLookup::Gone,
        Lookup::State(_) if status == 409 => AfterLookup::Retry,
        Lookup::State(s) => AfterLookup::Unauthorized(format!(
            "OCI answered 404 NotAuthorizedOrNotFound although GetInstance shows the instance {s}: \
             the policy lets nodekeeper read the instance but not remove it; add {}",
            policy_hint(mode)
        )),
        Lookup::NotFound => AfterLookup::Unauthorized(format!(
            "OCI answered 404 NotAuthorizedOrNotFound and GetInstance does not find the instance \
             either: OCI says this both for a missing instance and for a missing IAM policy; if the \
             instance exists, add {} and `Allow <group or dynamic-group> to read instances in \
             compartment <the nodes' compartment>`",
            policy_hint(mode)
        )),
    }
}

/// The IAM policy statement `mode`'s call needs (OCI's policy reference: TerminateInstance needs
/// INSTANCE_DELETE, in `manage instances`; DeleteNode is a node pool update, in `manage
/// cluster-node-pools`).
pub fn policy_hint(mode: OciMode) -> &'static str {
    match mode {
        OciMode::Terminate => {
            "`Allow <group or dynamic-group> to manage instances in compartment <the nodes' compartment>`"
        }
        OciMode::NodePool => {
            "`Allow <group or dynamic-group> to manage cluster-node-pools in compartment <the cluster's compartment>`"
        }
    }
}

/// OCI's error `code` in an error body (`{"code": "NotAuthorizedOrNotFound", "message": ...}`).
pub fn error_code(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()?
        .get("code")?
        .as_str()
        .map(str::to_string)
}

/// How a node is replaced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OciMode {
    /// Compute TerminateInstance; the instance pool / node pool launches the replacement.
    #[default]
    Terminate,
    /// OKE DeleteNode with `isDecrementSize=false`: the node pool keeps its size.
    NodePool,
}

/// Who signs the OCI calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OciAuth {
    /// A user's API key (`tenancy`, `user`, `fingerprint`, `key_file`).
    #[default]
    ApiKey,
    /// OKE workload identity: the controller's service account gets session tokens from OKE
    /// (`crate::controller::act::provider::oci_auth`).
    WorkloadIdentity,
    /// Instance principals: the node's instance identity from the metadata service, federated at
    /// the auth service (`crate::controller::act::provider::oci_auth`).
    InstancePrincipal,
}

/// Settings of the oci provider (`[controller.provider] kind = "oci"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OciConfig {
    /// Region identifier, e.g. `eu-frankfurt-1` (endpoints `iaas.<region>.oraclecloud.com` and
    /// `containerengine.<region>.oraclecloud.com`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// `https://` base URL used for every call instead of the regional endpoints (a proxy, or a
    /// local stand-in of the APIs in tests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// `api-key` (default) or `workload-identity`.
    #[serde(default)]
    pub auth: OciAuth,
    /// Tenancy OCID (`ocid1.tenancy...`); API key only.
    #[serde(default)]
    pub tenancy: String,
    /// User OCID (`ocid1.user...`) owning the API key; API key only.
    #[serde(default)]
    pub user: String,
    /// Fingerprint of the API key (`12:34:...`, 16 hex pairs); API key only.
    #[serde(default)]
    pub fingerprint: String,
    /// PEM file of the API key's RSA private key (PKCS#8 `PRIVATE KEY` or PKCS#1
    /// `RSA PRIVATE KEY`, unencrypted). Its content is never logged. API key only.
    #[serde(default)]
    pub key_file: PathBuf,
    /// Workload identity: OKE's session token endpoint (default
    /// `https://$KUBERNETES_SERVICE_HOST:12250/resourcePrincipalSessionTokens`, as the SDK).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_endpoint: Option<String>,
    /// Workload identity: the controller's service account token (read at each renewal).
    #[serde(default = "default_sa_token_file")]
    pub service_account_token_file: PathBuf,
    /// Workload identity: the CA of the token endpoint's certificate (the cluster's CA).
    #[serde(default = "default_sa_ca_file")]
    pub service_account_ca_file: PathBuf,
    /// Instance principal: the metadata service's v2 base URL.
    #[serde(default = "default_metadata_url")]
    pub metadata_url: String,
    /// Instance principal: the auth service (default `https://auth.<region>.<domain>`, as the SDK).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_endpoint: Option<String>,
    /// `terminate` (default) or `node-pool`.
    #[serde(default)]
    pub mode: OciMode,
    /// Extra CA (PEM) to trust instead of the system roots (tests, TLS-intercepting proxies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// Timeout of one attempt.
    #[serde(default = "super::default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Attempts on 429 / 5xx / timeouts / connection errors before giving up.
    #[serde(default = "super::default_attempts")]
    pub max_attempts: u32,
    /// First retry delay (doubled each attempt, with jitter).
    #[serde(default = "super::default_backoff", with = "humantime_serde")]
    pub backoff: Duration,
    /// DeleteNode's `overrideEvictionGraceDuration`: how long OKE itself tries to evict the
    /// node's pods before deleting it. nodekeeper removes a node only after its own drain, so
    /// `0s` (`PT0M`, OKE drains nothing more); OKE's own default would be PT60M. Whole minutes,
    /// at most 60.
    #[serde(default, with = "humantime_serde")]
    pub eviction_grace: Duration,
    /// DeleteNode's `isForceDeletionAfterOverrideGraceDuration`: delete the node even when OKE's
    /// eviction did not finish within `eviction_grace` (nodekeeper has decided; without it OKE may
    /// leave the node in place).
    #[serde(default = "default_true")]
    pub force_delete_after_grace: bool,
    /// How long `retire` follows DeleteNode's work request (`GET /20180222/workRequests/{id}`) for
    /// its end; a FAILED or CANCELED one is reported as an error. `0s`: not followed.
    #[serde(default = "default_work_request_timeout", with = "humantime_serde")]
    pub work_request_timeout: Duration,
    /// Pause between two looks at the work request.
    #[serde(default = "default_work_request_poll", with = "humantime_serde")]
    pub work_request_poll: Duration,
}

fn default_true() -> bool {
    true
}
fn default_sa_token_file() -> PathBuf {
    PathBuf::from("/var/run/secrets/kubernetes.io/serviceaccount/token")
}
fn default_metadata_url() -> String {
    "http://169.254.169.254/opc/v2".into()
}
fn default_sa_ca_file() -> PathBuf {
    PathBuf::from("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
}
fn default_work_request_timeout() -> Duration {
    Duration::from_secs(20 * 60)
}
fn default_work_request_poll() -> Duration {
    Duration::from_secs(10)
}

/// The realm of a region outside the commercial realm `oc1`, from the OCI Go SDK's
/// `common/regions.go` (`regionRealm`), with its second-level domain when the SDK's `realm` table
/// gives one. `None`: the commercial realm (also for a region this table does not know, as the
/// SDK falls back to `oc1`).
pub fn realm_of(region: &str) -> Option<(&'static str, Option<&'static str>)> {
    Some(match region {
        "us-langley-1" | "us-luke-1" => ("oc2", Some("oraclegovcloud.com")),
        "us-gov-ashburn-1" | "us-gov-chicago-1" | "us-gov-phoenix-1" => {
            ("oc3", Some("oraclegovcloud.com"))
        }
        "uk-gov-london-1" | "uk-gov-cardiff-1" => ("oc4", Some("oraclegovcloud.uk")),
        "ap-chiyoda-1" | "ap-ibaraki-1" => ("oc8", Some("oraclecloud8.com")),
        "us-tacoma-1" => ("oc5", None),
        "eu-frankfurt-2" | "eu-madrid-2" => ("oc19", None),
        r if r.contains("-dcc-") || r.contains("-gov-") => {
            ("another sovereign or dedicated realm", None)
        }
        "us-westjordan-1" => ("oc16", None),
        "eu-jovanovac-1" => ("oc20", None),
        "me-abudhabi-3" => ("oc26", None),
        "ap-hobsonville-1" => ("oc31", None),
        _ => return None,
    })
}

fn is_ocid(s: &str, kind: &str) -> bool {
    s.strip_prefix("ocid1.")
        .and_then(|r| r.strip_prefix(kind))
        .is_some_and(|r| r.starts_with('.'))
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
}

fn is_fingerprint(s: &str) -> bool {
    let parts: Vec<&str> = s.split(':').collect();
    parts.len() == 16
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
}

impl OciConfig {
    /// Semantic checks; paths are relative to `[controller.provider]`. The key file is read when
    /// the provider is built, not here.
    pub fn validate(&self) -> Vec<Diagnostic> {
        let at = |k: &str| cfg_path!["controller", "provider", k];
        let mut d = Vec::new();
        match (&self.region, &self.endpoint) {
            (None, None) => d.push(Diagnostic::error(
                at("region"),
                "set `region` (e.g. \"eu-frankfurt-1\") or `endpoint`",
            )),
            (Some(r), _)
                if r.is_empty()
                    || !r
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') =>
            {
                d.push(Diagnostic::error(
                    at("region"),
                    format!("`{r}` is not a region identifier like \"eu-frankfurt-1\""),
                ))
            }
            _ => {}
        }
        if let Some(e) = &self.endpoint {
            match reqwest::Url::parse(e) {
                Ok(u) if u.scheme() == "https" && u.host_str().is_some() => {}
                Ok(_) => d.push(Diagnostic::error(
                    at("endpoint"),
                    format!("`{e}` is not an `https://` URL: OCI APIs are HTTPS only"),
                )),
                Err(err) => d.push(Diagnostic::error(
                    at("endpoint"),
                    format!("`{e}` is not a URL: {err}"),
                )),
            }
        }
        if self.auth == OciAuth::ApiKey {
            if !is_ocid(&self.tenancy, "tenancy") {
                d.push(Diagnostic::error(
                    at("tenancy"),
                    format!(
                        "`{}` is not a tenancy OCID (ocid1.tenancy...)",
                        self.tenancy
                    ),
                ));
            }
            if !is_ocid(&self.user, "user") {
                d.push(Diagnostic::error(
                    at("user"),
                    format!("`{}` is not a user OCID (ocid1.user...)", self.user),
                ));
            }
            if !is_fingerprint(&self.fingerprint) {
                d.push(Diagnostic::error(
                    at("fingerprint"),
                    format!(
                        "`{}` is not a key fingerprint (16 hex pairs separated by `:`)",
                        self.fingerprint
                    ),
                ));
            }
            if self.key_file.as_os_str().is_empty() {
                d.push(Diagnostic::error(
                    at("key_file"),
                    "must name the PEM file of the API key",
                ));
            }
        }
        if self.auth == OciAuth::InstancePrincipal
            && self.auth_endpoint.is_none()
            && self.region.is_none()
        {
            d.push(Diagnostic::error(
                at("auth_endpoint"),
                "instance principals need `region` (auth.<region>.<domain>) or `auth_endpoint`",
            ));
        }
        if let Some(e) = &self.token_endpoint {
            if !reqwest::Url::parse(e)
                .is_ok_and(|u| u.scheme() == "https" && u.host_str().is_some())
            {
                d.push(Diagnostic::error(
                    at("token_endpoint"),
                    format!("`{e}` is not an `https://` URL"),
                ));
            }
        }
        if let (Some(r), None) = (&self.region, &self.endpoint) {
            if let Some((realm, None)) = realm_of(r) {
                d.push(Diagnostic::error(
                    at("region"),
                    format!("`{r}` is in realm {realm}, whose API domain nodekeeper does not know: set `endpoint`"),
                ));
            }
        }
        let grace = self.eviction_grace.as_secs();
        if grace % 60 != 0 || grace > 3600 || self.eviction_grace.subsec_nanos() != 0 {
            d.push(Diagnostic::error(
                at("eviction_grace"),
                "must be whole minutes from 0s to 60m (OKE's overrideEvictionGraceDuration, PT0M..PT60M)",
            ));
        }
        if self.work_request_poll.is_zero() {
            d.push(Diagnostic::error(
                at("work_request_poll"),
                "must be greater than zero",
            ));
        }
        d.extend(check_retries(self.timeout, self.max_attempts));
        d
    }

    /// DeleteNode's query (keys sorted as the Go SDK's `url.Values.Encode` sends them).
    pub fn delete_node_query(&self) -> String {
        format!(
            "isDecrementSize=false&isForceDeletionAfterOverrideGraceDuration={}&overrideEvictionGraceDuration=PT{}M",
            self.force_delete_after_grace,
            self.eviction_grace.as_secs() / 60
        )
    }

    /// `keyId` of the signature: `<tenancy>/<user>/<fingerprint>`.
    pub fn key_id(&self) -> String {
        format!("{}/{}/{}", self.tenancy, self.user, self.fingerprint)
    }

    /// Base URL of the API used in `mode`.
    pub fn base_url(&self) -> String {
        match self.mode {
            OciMode::Terminate => self.compute_url(),
            OciMode::NodePool => self.oke_url(),
        }
    }

    /// Base URL of the auth service (instance principal federation): `auth_endpoint`, else the
    /// Go SDK's `https://auth.{region}.{secondLevelDomain}`.
    pub fn auth_url(&self) -> String {
        match &self.auth_endpoint {
            Some(e) => e.trim_end_matches('/').to_string(),
            None => {
                let region = self.region.as_deref().unwrap_or_default();
                let domain = realm_of(region)
                    .and_then(|(_, d)| d)
                    .unwrap_or("oraclecloud.com");
                format!("https://auth.{region}.{domain}")
            }
        }
    }

    /// Base URL of the Compute API (TerminateInstance, GetInstance), whatever the mode: the Go
    /// SDK's `https://iaas.{region}.{secondLevelDomain}`.
    pub fn compute_url(&self) -> String {
        self.regional("iaas", "")
    }

    /// Base URL of the Container Engine API (DeleteNode, GetWorkRequest): the Go SDK's
    /// `https://containerengine.{region}.oci.{secondLevelDomain}`.
    pub fn oke_url(&self) -> String {
        self.regional("containerengine", "oci.")
    }

    fn regional(&self, service: &str, oci: &str) -> String {
        if let Some(e) = &self.endpoint {
            return e.trim_end_matches('/').to_string();
        }
        let region = self.region.as_deref().unwrap_or_default();
        let domain = realm_of(region)
            .and_then(|(_, d)| d)
            .unwrap_or("oraclecloud.com");
        format!("https://{service}.{region}.{oci}{domain}")
    }
}

/// The parts of a request OCI signs.
#[derive(Debug, Clone, Copy)]
pub struct SignInput<'a> {
    /// HTTP method (any case).
    pub method: &'a str,
    /// Path and query exactly as sent (`/20160918/instances/ocid1...?preserveBootVolume=false`).
    pub path_and_query: &'a str,
    /// `Host` header value (with `:port` when not the default).
    pub host: &'a str,
    /// `Date` header value (RFC 7231, `Thu, 05 Jan 2014 21:31:40 GMT`).
    pub date: &'a str,
    /// Content type and body of POST/PUT/PATCH requests (ignored for other methods).
    pub body: Option<(&'a str, &'a [u8])>,
}

/// What to sign and which headers to add, for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigningPlan {
    /// Names of the signed headers in order (`headers="..."`).
    pub headers: Vec<&'static str>,
    /// The signing string: `name: value` lines joined by `\n`.
    pub signing_string: String,
    /// Headers to send besides `date` and `host` (the body headers of POST/PUT/PATCH).
    pub extra: Vec<(&'static str, String)>,
}

/// Base64 SHA-256 of `body` (`x-content-sha256`).
pub fn body_sha256(body: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(Sha256::digest(body))
}

/// Builds the signing string of OCI signature version 1: `date`, `(request-target)` (lower-case
/// method, space, path and query), `host`, and for POST/PUT/PATCH `content-length`,
/// `content-type`, `x-content-sha256` (base64 SHA-256 of the body, also for an empty body).
pub fn signing_plan(i: &SignInput<'_>) -> SigningPlan {
    let method = i.method.to_ascii_lowercase();
    let mut lines = vec![
        ("date", i.date.to_string()),
        ("(request-target)", format!("{method} {}", i.path_and_query)),
        ("host", i.host.to_string()),
    ];
    let mut extra = Vec::new();
    if matches!(method.as_str(), "post" | "put" | "patch") {
        let (ctype, body) = i.body.unwrap_or(("application/json", b""));
        extra = vec![
            ("content-length", body.len().to_string()),
            ("content-type", ctype.to_string()),
            ("x-content-sha256", body_sha256(body)),
        ];
        lines.extend(extra.iter().cloned());
    }
    SigningPlan {
        headers: lines.iter().map(|(k, _)| *k).collect(),
        signing_string: lines
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join("\n"),
        extra,
    }
}

/// The plan of a request to the auth service's federation endpoint: [`signing_plan`] without
/// `host`, as the Go SDK signs them (`common/auth/federation_client.go`).
pub fn federation_plan(i: &SignInput<'_>) -> SigningPlan {
    let mut p = signing_plan(i);
    let host = format!("host: {}", i.host);
    p.headers.retain(|h| *h != "host");
    p.signing_string = p
        .signing_string
        .split('\n')
        .filter(|l| *l != host)
        .collect::<Vec<_>>()
        .join("\n");
    p
}

/// The current time as an HTTP `Date` header value.
pub fn http_date(t: chrono::DateTime<chrono::Utc>) -> String {
    t.format("%a, %d %b %Y %H:%M:%S GMT").to_string()
}

/// Why a private key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Not a PEM private key at all.
    #[error("not a PEM private key: {0}")]
    Pem(#[source] rustls_pki_types::pem::Error),
    /// A PEM key of another kind (EC, ...).
    #[error("not an RSA private key; OCI API keys are RSA, 2048 bits or more")]
    NotRsa,
    /// An RSA key ring refuses (< 2048 bits, malformed): ring's reason (not a `std::error::Error`
    /// in the build we use, so held as its value, not as a source).
    #[error("not a usable RSA private key ({0}); OCI API keys are RSA, 2048 bits or more")]
    Rsa(ring::error::KeyRejected),
    /// Signing failed.
    #[error("signing failed")]
    Sign,
}

/// Signs requests with an OCI API key. `Debug` never shows the key.
pub struct OciSigner {
    key_id: String,
    key: RsaKeyPair,
    rng: ring::rand::SystemRandom,
}

impl std::fmt::Debug for OciSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OciSigner")
            .field("key_id", &self.key_id)
            .field("key", &crate::config::REDACTED)
            .finish()
    }
}

impl OciSigner {
    /// A signer for `key_id` with the PEM private key `pem` (PKCS#8 or PKCS#1).
    pub fn from_pem(key_id: &str, pem: &[u8]) -> Result<Self, KeyError> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::PrivateKeyDer;
        let der = PrivateKeyDer::from_pem_slice(pem).map_err(KeyError::Pem)?;
        let key = match &der {
            PrivateKeyDer::Pkcs8(k) => RsaKeyPair::from_pkcs8(k.secret_pkcs8_der()),
            PrivateKeyDer::Pkcs1(k) => RsaKeyPair::from_der(k.secret_pkcs1_der()),
            _ => return Err(KeyError::NotRsa),
        }
        .map_err(KeyError::Rsa)?;
        Ok(Self {
            key_id: key_id.to_string(),
            key,
            rng: ring::rand::SystemRandom::new(),
        })
    }

    /// A signer for `key_id` with a PKCS#8 DER private key (a workload identity session key).
    pub fn from_pkcs8_der(key_id: &str, der: &[u8]) -> Result<Self, KeyError> {
        let key = RsaKeyPair::from_pkcs8(der).map_err(KeyError::Rsa)?;
        Ok(Self {
            key_id: key_id.to_string(),
            key,
            rng: ring::rand::SystemRandom::new(),
        })
    }

    /// The `keyId` this signer uses.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// Base64 RSA-SHA256 (PKCS#1 v1.5) signature of `data`.
    pub fn sign(&self, data: &[u8]) -> Result<String, KeyError> {
        let mut sig = vec![0u8; self.key.public().modulus_len()];
        self.key
            .sign(
                &ring::signature::RSA_PKCS1_SHA256,
                &self.rng,
                data,
                &mut sig,
            )
            .map_err(|_| KeyError::Sign)?;
        Ok(base64::engine::general_purpose::STANDARD.encode(sig))
    }

    /// The `Authorization` header value for `plan`, its parameters in the Go SDK's order
    /// (`version,headers,keyId,algorithm,signature`, `common/http_signer.go`), so the header is
    /// byte-equal to the SDK's for the same request (tests/host/oci_sdk_crosscheck.rs).
    pub fn authorization(&self, plan: &SigningPlan) -> Result<String, KeyError> {
        Ok(format!(
            "Signature version=\"1\",headers=\"{}\",keyId=\"{}\",algorithm=\"rsa-sha256\",signature=\"{}\"",
            plan.headers.join(" "),
            self.key_id,
            self.sign(plan.signing_string.as_bytes())?
        ))
    }
}

/// The instance OCID in a `spec.providerID` (`oci://<ocid>` or the bare OCID), if it is one.
pub fn instance_ocid(provider_id: &str) -> Option<&str> {
    let id = provider_id.strip_prefix("oci://").unwrap_or(provider_id);
    is_ocid(id, "instance").then_some(id)
}

/// The OKE node pool OCID of `node`: its `oci.oraclecloud.com/node-pool-id` annotation or label.
pub fn node_pool_id(node: &Node) -> Option<String> {
    let m = &node.metadata;
    m.annotations
        .as_ref()
        .and_then(|a| a.get(NODE_POOL_ANNOTATION))
        .or_else(|| m.labels.as_ref().and_then(|l| l.get(NODE_POOL_ANNOTATION)))
        .filter(|p| is_ocid(p, "nodepool"))
        .cloned()
}

/// The group a replacement must come from: the OKE node pool, else the Karpenter NodePool label.
fn pool_of(node: &Node) -> Option<String> {
    node_pool_id(node).or_else(|| node.metadata.labels.as_ref()?.get(POOL_LABEL).cloned())
}

/// Whether `node` belongs to `pool` (OKE node pool OCID or Karpenter NodePool name).
fn in_pool(node: &Node, pool: Option<&str>) -> bool {
    pool.is_none_or(|p| pool_of(node).as_deref() == Some(p))
}

/// How a removal ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// The DELETE was accepted with this status (and DeleteNode's `opc-work-request-id`).
    Accepted(u16, Option<String>),
    /// The DELETE answered `status` (404 or 409) and `GetInstance` showed `state`.
    Gone {
        /// The DELETE's status.
        status: u16,
        /// The instance's `lifecycleState`.
        state: String,
    },
}

/// Replaces nodes through the OCI Compute or Container Engine API.
pub struct Oci {
    cfg: OciConfig,
    creds: Credentials,
    http: reqwest::Client,
    client: Client,
    tickets: Mutex<BTreeMap<String, ReplacementTicket>>,
    /// Request ids whose instance removal OCI accepted (or found under way).
    removed: Mutex<std::collections::BTreeSet<String>>,
}

/// One answer of the OCI API.
struct Answer {
    status: u16,
    body: bytes::Bytes,
    work_request: Option<String>,
}

/// What a work request's `status` means (ACCEPTED, IN_PROGRESS, CANCELING, SUCCEEDED, FAILED,
/// CANCELED: the Container Engine API's `WorkRequestStatusEnum`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkRequestEnd {
    /// Still running.
    Pending,
    /// Done.
    Succeeded,
    /// FAILED or CANCELED: the node was not deleted.
    Failed,
}

/// The end a work request's `status` reports (pure).
pub fn work_request_end(status: &str) -> WorkRequestEnd {
    match status {
        "SUCCEEDED" => WorkRequestEnd::Succeeded,
        "FAILED" | "CANCELED" => WorkRequestEnd::Failed,
        _ => WorkRequestEnd::Pending,
    }
}

impl std::fmt::Debug for Oci {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Oci")
            .field("base_url", &self.cfg.base_url())
            .field("mode", &self.cfg.mode)
            .field("creds", &self.creds)
            .finish()
    }
}

/// What signs the requests: an API key, or sessions (workload identity, instance principal).
#[derive(Debug)]
enum Credentials {
    ApiKey(std::sync::Arc<OciSigner>),
    Sessions(super::oci_auth::Sessions),
}

impl Credentials {
    async fn signer(&self) -> Result<std::sync::Arc<OciSigner>, super::oci_auth::AuthError> {
        match self {
            Credentials::ApiKey(s) => Ok(s.clone()),
            Credentials::Sessions(w) => w.signer().await,
        }
    }

    /// After a 401: a workload identity session is renewed by the next request.
    async fn refused(&self) {
        if let Credentials::Sessions(w) = self {
            w.invalidate().await;
        }
    }
}

/// A failed attempt of one result type as one of another (it carries no value).
fn never<T>(a: Attempt<std::convert::Infallible>) -> Attempt<T> {
    match a {
        Attempt::Done(never) => match never {},
        Attempt::Permanent(e) => Attempt::Permanent(e),
        Attempt::Retry(e) => Attempt::Retry(e),
    }
}

fn setup(what: String, source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> SetupError {
    SetupError {
        provider: NAME,
        what,
        source: source.into(),
    }
}

fn read_key(path: &Path) -> Result<Vec<u8>, SetupError> {
    std::fs::read(path).map_err(|e| setup(format!("reading key_file {}", path.display()), e))
}

/// The OCI API client: with `ca_file`, only that CA is trusted; else the system's roots. Each
/// request (connect to last body byte) times out after `timeout`; no proxy from the environment.
fn oci_client(
    cfg: &OciConfig,
    allow_loopback: bool,
) -> Result<reqwest::Client, crate::http::TlsError> {
    let builder = match &cfg.ca_file {
        Some(ca) => crate::http::pinned_builder(ca)?,
        None => crate::http::builder(None)?.no_proxy(),
    };
    // No redirect (a 3xx is the answer: signed requests are never re-sent to another host);
    // names resolving to metadata, link-local or unspecified addresses refused.
    Ok(crate::http::guard(builder, allow_loopback)
        .timeout(cfg.timeout)
        .pool_idle_timeout(std::time::Duration::from_secs(60))
        .build()?)
}

impl Oci {
    /// A provider for `cfg`; reads and checks the key file. `client` reads nodes.
    /// (`allow_loopback`: `[controller] allow_loopback_destinations`, for a stand-in on loopback.)
    /// With `auth = "workload-identity"` and no `token_endpoint`, the endpoint comes from
    /// `$KUBERNETES_SERVICE_HOST` (as the SDK: read once, here).
    pub fn new(cfg: OciConfig, client: Client, allow_loopback: bool) -> Result<Self, SetupError> {
        let creds = match cfg.auth {
            OciAuth::ApiKey => {
                let pem = read_key(&cfg.key_file)?;
                let signer = OciSigner::from_pem(&cfg.key_id(), &pem)
                    .map_err(|e| setup(format!("key_file {}", cfg.key_file.display()), e))?;
                Credentials::ApiKey(std::sync::Arc::new(signer))
            }
            OciAuth::WorkloadIdentity => {
                let endpoint = match &cfg.token_endpoint {
                    Some(e) => e.clone(),
                    None => {
                        let host = std::env::var("KUBERNETES_SERVICE_HOST").map_err(|e| {
                            setup(
                                "workload identity: KUBERNETES_SERVICE_HOST (not in a pod? set `token_endpoint`)".into(),
                                e,
                            )
                        })?;
                        let host = if host.contains(':') {
                            format!("[{host}]")
                        } else {
                            host
                        };
                        format!("https://{host}:12250/resourcePrincipalSessionTokens")
                    }
                };
                let url = reqwest::Url::parse(&endpoint)
                    .map_err(|e| setup(format!("token_endpoint {endpoint}"), e))?;
                crate::http::check_destination(&url, allow_loopback).map_err(|why| {
                    setup(
                        format!("token_endpoint {endpoint}"),
                        std::io::Error::other(why),
                    )
                })?;
                let ca = &cfg.service_account_ca_file;
                let http = crate::http::pinned_builder(ca)
                    .map(|b| crate::http::guard(b, allow_loopback).timeout(cfg.timeout))
                    .and_then(|b| Ok(b.build()?))
                    .map_err(|e| {
                        setup(
                            format!("HTTPS client for {endpoint} (CA {})", ca.display()),
                            e,
                        )
                    })?;
                Credentials::Sessions(super::oci_auth::Sessions::workload_identity(
                    endpoint,
                    cfg.service_account_token_file.clone(),
                    http,
                ))
            }
            OciAuth::InstancePrincipal => {
                let auth = cfg.auth_url();
                let url = reqwest::Url::parse(&auth)
                    .map_err(|e| setup(format!("auth_endpoint {auth}"), e))?;
                crate::http::check_destination(&url, allow_loopback).map_err(|why| {
                    setup(format!("auth_endpoint {auth}"), std::io::Error::other(why))
                })?;
                let http = oci_client(&cfg, allow_loopback)
                    .map_err(|e| setup(format!("HTTPS client for {auth}"), e))?;
                // The metadata service is link-local by design: no address guard, no proxy.
                let imds = match &cfg.ca_file {
                    Some(ca) => crate::http::pinned_builder(ca),
                    None => crate::http::builder(None),
                }
                .map(|b| b.no_proxy().timeout(cfg.timeout))
                .and_then(|b| Ok(b.build()?))
                .map_err(|e| setup(format!("metadata client for {}", cfg.metadata_url), e))?;
                Credentials::Sessions(super::oci_auth::Sessions::instance_principal(
                    cfg.metadata_url.clone(),
                    auth,
                    imds,
                    http,
                ))
            }
        };
        let base = cfg.base_url();
        let url = reqwest::Url::parse(&base).map_err(|e| setup(format!("endpoint {base}"), e))?;
        crate::http::check_destination(&url, allow_loopback)
            .map_err(|why| setup(format!("endpoint {base}"), std::io::Error::other(why)))?;
        let http = oci_client(&cfg, allow_loopback)
            .map_err(|e| setup(format!("HTTPS client for {base}"), e))?;
        Ok(Self {
            cfg,
            creds,
            http,
            client,
            tickets: Mutex::new(BTreeMap::new()),
            removed: Mutex::new(Default::default()),
        })
    }

    fn tickets(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ReplacementTicket>> {
        crate::sync::lock(&self.tickets)
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    fn permanent(node: &str, why: String) -> ProviderError {
        ProviderError::Permanent {
            provider: NAME,
            node: node.to_string(),
            source: CallError::Ruled(why),
        }
    }

    /// The API path (with query) that removes the node's instance.
    fn target(
        &self,
        node_name: &str,
        node: &Node,
        instance: &str,
    ) -> Result<String, ProviderError> {
        Ok(match self.cfg.mode {
            OciMode::Terminate => {
                format!("{COMPUTE_API}/instances/{instance}?preserveBootVolume=false")
            }
            OciMode::NodePool => {
                let pool = node_pool_id(node).ok_or_else(|| {
                    Self::permanent(
                        node_name,
                        format!("mode = \"node-pool\" but the node has no {NODE_POOL_ANNOTATION} annotation or label"),
                    )
                })?;
                format!(
                    "{OKE_API}/nodePools/{pool}/node/{instance}?{}",
                    self.cfg.delete_node_query()
                )
            }
        })
    }

    /// One signed request (`DELETE` or `GET`) of `base` + `path`, without a body: the status and
    /// the answer's body, or why there is none.
    async fn signed(
        &self,
        method: reqwest::Method,
        base: &str,
        path: &str,
        request_id: &str,
    ) -> Result<Answer, Attempt<std::convert::Infallible>> {
        let what = format!("{method} {path}");
        let url = format!("{base}{path}");
        let parsed = reqwest::Url::parse(&url).map_err(|e| {
            Attempt::Permanent(CallError::Prepare {
                what: format!("parsing {url}"),
                source: e.into(),
            })
        })?;
        let host = match (parsed.host_str(), parsed.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.to_string(),
            (None, _) => {
                return Err(Attempt::Permanent(CallError::Ruled(format!(
                    "{url}: no host"
                ))))
            }
        };
        let date = http_date(chrono::Utc::now());
        let plan = signing_plan(&SignInput {
            method: method.as_str(),
            path_and_query: path,
            host: &host,
            date: &date,
            body: None,
        });
        // A session that cannot be had (refused, expired, the endpoint down) is retried with
        // backoff; its error names the token endpoint and why.
        let signer = self.creds.signer().await.map_err(|e| {
            Attempt::Retry(CallError::Prepare {
                what: "getting an OCI session (workload identity or instance principal)".into(),
                source: e.into(),
            })
        })?;
        let auth = signer.authorization(&plan).map_err(|e| {
            Attempt::Permanent(CallError::Prepare {
                what: format!("signing {what}"),
                source: e.into(),
            })
        })?;
        let headers = [
            ("date", date.as_str()),
            ("authorization", auth.as_str()),
            ("opc-request-id", request_id),
            ("accept", "application/json"),
        ];
        let mut call = self.http.request(method, parsed);
        for (k, v) in headers {
            call = call.header(k, v);
        }
        let sent = match call.send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let work_request = resp
                    .headers()
                    .get("opc-work-request-id")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                resp.bytes().await.map(|body| Answer {
                    status,
                    body,
                    work_request,
                })
            }
            Err(e) => Err(e),
        };
        let answer = sent.map_err(|source| {
            Attempt::Retry(CallError::Send {
                request: what,
                source,
            })
        })?;
        if answer.status == 401 {
            self.creds.refused().await;
        }
        Ok(answer)
    }

    /// One attempt (number `n`) of removing `instance` with the DELETE of `path`: the DELETE, then,
    /// when its answer needs it, `GetInstance` ([`classify`], [`after_lookup`]).
    async fn remove(
        &self,
        req: &ReplacementRequest,
        instance: &str,
        path: &str,
        n: u32,
    ) -> Attempt<Outcome> {
        let Answer {
            status: code,
            body,
            work_request,
        } = match self
            .signed(
                reqwest::Method::DELETE,
                &self.cfg.base_url(),
                path,
                &req.request_id,
            )
            .await
        {
            Ok(answer) => answer,
            Err(a) => return never(a),
        };
        let status_error = |request: String, code: u16, body: &[u8]| CallError::Status {
            request,
            status: code,
            body: trim(&String::from_utf8_lossy(body)).to_string(),
        };
        let oci_code = error_code(&body);
        match classify(code, oci_code.as_deref(), n) {
            Verdict::Accepted => return Attempt::Done(Outcome::Accepted(code, work_request)),
            Verdict::Retry => {
                return Attempt::Retry(status_error(format!("DELETE {path}"), code, &body))
            }
            Verdict::Permanent => {
                return Attempt::Permanent(status_error(format!("DELETE {path}"), code, &body))
            }
            Verdict::LookUp => {}
        }
        let get = format!("{COMPUTE_API}/instances/{instance}");
        let (gcode, gbody) = match self
            .signed(
                reqwest::Method::GET,
                &self.cfg.compute_url(),
                &get,
                &req.request_id,
            )
            .await
        {
            Ok(a) => (a.status, a.body),
            Err(a) => return never(a),
        };
        let looked = match (gcode, classify(gcode, error_code(&gbody).as_deref(), n)) {
            (_, Verdict::Accepted) => {
                let state = serde_json::from_slice::<serde_json::Value>(&gbody)
                    .ok()
                    .and_then(|v| v.get("lifecycleState")?.as_str().map(str::to_string));
                match state {
                    Some(s) => Lookup::State(s),
                    None => {
                        return Attempt::Retry(CallError::Ruled(format!(
                            "GET {get} answered {gcode} without a lifecycleState"
                        )))
                    }
                }
            }
            (404, _) => Lookup::NotFound,
            (_, Verdict::Retry | Verdict::LookUp) => {
                return Attempt::Retry(status_error(format!("GET {get}"), gcode, &gbody))
            }
            (_, Verdict::Permanent) => {
                return Attempt::Permanent(status_error(format!("GET {get}"), gcode, &gbody))
            }
        };
        match after_lookup(code, &looked, self.cfg.mode) {
            AfterLookup::Gone => Attempt::Done(Outcome::Gone {
                status: code,
                state: match looked {
                    Lookup::State(s) => s,
                    Lookup::NotFound => String::new(),
                },
            }),
            AfterLookup::Retry => {
                Attempt::Retry(status_error(format!("DELETE {path}"), code, &body))
            }
            AfterLookup::Unauthorized(why) => Attempt::Permanent(CallError::Ruled(format!(
                "DELETE {path} answered {code} {}: {why}",
                oci_code.as_deref().unwrap_or("")
            ))),
        }
    }

    async fn request(&self, req: &ReplacementRequest) -> Result<ReplacementTicket, ProviderError> {
        if let Some(t) = self.tickets().get(&req.request_id) {
            return Ok(t.clone());
        }
        let kube_err = |action, source| ProviderError::Kube {
            provider: NAME,
            action,
            node: req.node.clone(),
            source,
        };
        let node = self
            .nodes()
            .get_opt(&req.node)
            .await
            .map_err(|e| kube_err("reading node", e))?
            .ok_or_else(|| Self::permanent(&req.node, "no such node".into()))?;
        let provider_id = req
            .provider_id
            .clone()
            .or_else(|| node.spec.as_ref()?.provider_id.clone())
            .unwrap_or_default();
        let instance = instance_ocid(&provider_id).ok_or_else(|| {
            Self::permanent(
                &req.node,
                format!("spec.providerID `{provider_id}` is not an OCI instance OCID"),
            )
        })?;
        // Checked now (nothing sent), so a node that cannot be removed fails at once.
        self.target(&req.node, &node, instance)?;
        let pool = pool_of(&node).or_else(|| req.pool.clone());
        let existing = self
            .nodes()
            .list(&ListParams::default())
            .await
            .map_err(|e| kube_err("listing nodes", e))?
            .items
            .into_iter()
            .filter(|n| in_pool(n, pool.as_deref()))
            .filter_map(|n| n.metadata.name)
            .collect();
        let requested_at = chrono::Utc::now().to_rfc3339();
        tracing::info!(node = %req.node, instance, mode = ?self.cfg.mode, request = %req.request_id, reason = %req.reason, "replacement accepted: the instance is removed once nodekeeper's drain is over");
        let ticket = ReplacementTicket {
            provider: NAME.into(),
            request_id: req.request_id.clone(),
            node: req.node.clone(),
            pool,
            reference: Some(instance.to_string()),
            requested_at: Some(requested_at),
            existing_nodes: existing,
        };
        self.tickets()
            .insert(req.request_id.clone(), ticket.clone());
        Ok(ticket)
    }

    fn removed(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<String>> {
        crate::sync::lock(&self.removed)
    }

    /// Removes the node's instance (nodekeeper's drain is over): the DELETE with retries, then,
    /// for DeleteNode, its work request followed to its end.
    async fn retire_node(&self, req: &ReplacementRequest) -> Result<(), ProviderError> {
        if self.removed().contains(&req.request_id) {
            return Ok(());
        }
        let node = self
            .nodes()
            .get_opt(&req.node)
            .await
            .map_err(|source| ProviderError::Kube {
                provider: NAME,
                action: "reading node",
                node: req.node.clone(),
                source,
            })?;
        let Some(node) = node else {
            tracing::info!(node = %req.node, "node already gone: nothing to remove");
            return Ok(());
        };
        let provider_id = req
            .provider_id
            .clone()
            .or_else(|| node.spec.as_ref()?.provider_id.clone())
            .unwrap_or_default();
        let instance = instance_ocid(&provider_id).ok_or_else(|| {
            Self::permanent(
                &req.node,
                format!("spec.providerID `{provider_id}` is not an OCI instance OCID"),
            )
        })?;
        let path = self.target(&req.node, &node, instance)?;
        tracing::info!(node = %req.node, instance, mode = ?self.cfg.mode, request = %req.request_id, "asking OCI to remove the instance");
        let outcome = with_retries(
            NAME,
            &req.node,
            self.cfg.max_attempts,
            self.cfg.backoff,
            |n| self.remove(req, instance, &path, n),
        )
        .await?;
        match &outcome {
            Outcome::Gone { status, state } => {
                tracing::info!(node = %req.node, instance, status, state, "instance already going away (GetInstance)");
            }
            Outcome::Accepted(_, Some(wr)) if self.cfg.mode == OciMode::NodePool => {
                self.follow_work_request(req, wr).await?;
            }
            Outcome::Accepted(..) => {}
        }
        self.removed().insert(req.request_id.clone());
        Ok(())
    }

    /// Follows DeleteNode's work request until it ends or `work_request_timeout` passes; FAILED or
    /// CANCELED is a permanent error with OCI's reason (`GET .../errors`).
    async fn follow_work_request(
        &self,
        req: &ReplacementRequest,
        id: &str,
    ) -> Result<(), ProviderError> {
        if self.cfg.work_request_timeout.is_zero() {
            return Ok(());
        }
        let end = tokio::time::Instant::now() + self.cfg.work_request_timeout;
        let path = format!("{OKE_API}/workRequests/{id}");
        loop {
            let v = with_retries(
                NAME,
                &req.node,
                self.cfg.max_attempts,
                self.cfg.backoff,
                |n| self.get_json(&path, &req.request_id, n),
            )
            .await;
            let v = match v {
                Ok(Some(v)) => v,
                Ok(None) => {
                    tracing::warn!(node = %req.node, work_request = id, "the DeleteNode work request is not readable (404 NotAuthorizedOrNotFound): its end is not followed; add `Allow <group or dynamic-group> to read cluster-work-requests in compartment <the cluster's compartment>`");
                    return Ok(());
                }
                Err(e) => return Err(e),
            };
            let status = v
                .get("status")
                .and_then(|s| s.as_str())
                .unwrap_or_default()
                .to_string();
            match work_request_end(&status) {
                WorkRequestEnd::Succeeded => {
                    tracing::info!(node = %req.node, work_request = id, "OKE deleted the node");
                    return Ok(());
                }
                WorkRequestEnd::Failed => {
                    let errors = format!("{path}/errors");
                    let why = match with_retries(
                        NAME,
                        &req.node,
                        self.cfg.max_attempts,
                        self.cfg.backoff,
                        |n| self.get_json(&errors, &req.request_id, n),
                    )
                    .await
                    {
                        Ok(Some(v)) => work_request_errors(&v),
                        _ => String::new(),
                    };
                    return Err(Self::permanent(
                        &req.node,
                        format!(
                            "OKE work request {id} ended {status}: the node was not deleted{why}"
                        ),
                    ));
                }
                WorkRequestEnd::Pending => {}
            }
            if tokio::time::Instant::now() >= end {
                tracing::warn!(node = %req.node, work_request = id, status, "the DeleteNode work request has not ended within work_request_timeout; no longer followed");
                return Ok(());
            }
            tokio::time::sleep(self.cfg.work_request_poll).await;
        }
    }

    /// One signed GET of `path` on the Container Engine API: its JSON (`None`: 404).
    async fn get_json(
        &self,
        path: &str,
        request_id: &str,
        n: u32,
    ) -> Attempt<Option<serde_json::Value>> {
        let a = match self
            .signed(reqwest::Method::GET, &self.cfg.oke_url(), path, request_id)
            .await
        {
            Ok(a) => a,
            Err(e) => return never(e),
        };
        let error = || CallError::Status {
            request: format!("GET {path}"),
            status: a.status,
            body: trim(&String::from_utf8_lossy(&a.body)).to_string(),
        };
        match classify(a.status, error_code(&a.body).as_deref(), n) {
            Verdict::Accepted => match serde_json::from_slice(&a.body) {
                Ok(v) => Attempt::Done(Some(v)),
                Err(e) => Attempt::Retry(CallError::Prepare {
                    what: format!("reading the answer to GET {path}"),
                    source: e.into(),
                }),
            },
            Verdict::LookUp if a.status == 404 => Attempt::Done(None),
            Verdict::Retry | Verdict::LookUp => Attempt::Retry(error()),
            Verdict::Permanent => Attempt::Permanent(error()),
        }
    }

    async fn ready(&self, t: &ReplacementTicket) -> Result<Option<String>, ProviderError> {
        let nodes = self
            .nodes()
            .list(&ListParams::default())
            .await
            .map_err(|source| ProviderError::Kube {
                provider: NAME,
                action: "listing nodes",
                node: t.node.clone(),
                source,
            })?
            .items;
        Ok(new_ready_node(
            nodes.into_iter().filter(|n| in_pool(n, t.pool.as_deref())),
            t,
        ))
    }
}

impl NodeProvider for Oci {
    fn name(&self) -> &'static str {
        NAME
    }

    fn request_replacement<'a>(
        &'a self,
        req: &'a ReplacementRequest,
    ) -> BoxFuture<'a, Result<ReplacementTicket, ProviderError>> {
        Box::pin(self.request(req))
    }

    fn replacement_ready<'a>(
        &'a self,
        ticket: &'a ReplacementTicket,
    ) -> BoxFuture<'a, Result<Option<String>, ProviderError>> {
        Box::pin(self.ready(ticket))
    }

    /// The removal itself: TerminateInstance or DeleteNode, only once nodekeeper's drain is over.
    fn retire<'a>(
        &'a self,
        req: &'a ReplacementRequest,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(self.retire_node(req))
    }
}

/// `: <code>: <message>; ...` of a work request's errors list (`[{code, message, timestamp}]`,
/// or `{"items": [...]}`), at most 3, each message cut to 200 characters.
pub fn work_request_errors(v: &serde_json::Value) -> String {
    let items = v
        .as_array()
        .or_else(|| v.get("items").and_then(|i| i.as_array()));
    let parts: Vec<String> = items
        .into_iter()
        .flatten()
        .take(3)
        .map(|e| {
            let s = |k: &str| e.get(k).and_then(|x| x.as_str()).unwrap_or_default();
            format!("{}: {}", s("code"), trim(s("message")))
        })
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!(": {}", parts.join("; "))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn instance_ocids_come_from_oke_and_ccm_provider_ids() {
        let id = "ocid1.instance.oc1.eu-frankfurt-1.antheljt5ouxq";
        assert_eq!(instance_ocid(&format!("oci://{id}")), Some(id));
        assert_eq!(instance_ocid(id), Some(id));
        assert_eq!(instance_ocid("aws:///eu-west-1a/i-0abc"), None);
        assert_eq!(instance_ocid("ocid1.volume.oc1..x"), None);
        assert_eq!(
            instance_ocid("ocid1.instance.oc1..x/../y"),
            None,
            "no path tricks"
        );
        assert_eq!(instance_ocid(""), None);
    }

    #[test]
    fn fingerprints_and_ocids_are_checked_by_shape() {
        assert!(is_fingerprint(
            "20:3b:97:13:55:1c:5b:0d:d3:37:d8:50:4e:c5:3a:34"
        ));
        assert!(!is_fingerprint(
            "20:3b:97:13:55:1c:5b:0d:d3:37:d8:50:4e:c5:3a"
        ));
        assert!(!is_fingerprint(
            "zz:3b:97:13:55:1c:5b:0d:d3:37:d8:50:4e:c5:3a:34"
        ));
        assert!(is_ocid("ocid1.tenancy.oc1..aaaa", "tenancy"));
        assert!(!is_ocid("ocid1.tenancyx.oc1..aaaa", "tenancy"));
        assert!(!is_ocid("ocid1.user.oc1..aaaa", "tenancy"));
    }

    #[test]
    fn body_headers_only_for_methods_with_a_body() {
        let plan = |method| {
            signing_plan(&SignInput {
                method,
                path_and_query: "/x",
                host: "h",
                date: "d",
                body: None,
            })
        };
        assert_eq!(plan("DELETE").headers, ["date", "(request-target)", "host"]);
        assert_eq!(
            plan("DELETE").signing_string,
            "date: d\n(request-target): delete /x\nhost: h"
        );
        let put = plan("PUT");
        assert_eq!(put.headers.len(), 6);
        assert_eq!(put.extra[0], ("content-length", "0".to_string()));
    }

    #[test]
    fn answers_are_classified_as_ocis_api_errors_page_and_the_go_sdk_say() {
        use Verdict::*;
        let cases: [(u16, Option<&str>, u32, Verdict); 17] = [
            (204, None, 1, Accepted),
            (202, None, 1, Accepted),
            (200, None, 1, Accepted),
            (404, Some("NotAuthorizedOrNotFound"), 1, LookUp),
            (404, None, 5, LookUp),
            (409, Some("IncorrectState"), 1, LookUp),
            (409, Some("LockConflict"), 1, Retry),
            (409, Some("Conflict"), 1, Permanent),
            (409, None, 1, Permanent),
            (429, Some("TooManyRequests"), 9, Retry),
            (500, Some("InternalServerError"), 1, Retry),
            (503, None, 1, Retry),
            (501, Some("MethodNotImplemented"), 1, Permanent),
            (401, Some("NotAuthenticated"), 1, Retry),
            (401, Some("NotAuthenticated"), AUTH_ATTEMPTS - 1, Retry),
            (401, Some("NotAuthenticated"), AUTH_ATTEMPTS, Permanent),
            (400, Some("InvalidParameter"), 1, Permanent),
        ];
        for (status, code, attempt, want) in cases {
            assert_eq!(
                classify(status, code, attempt),
                want,
                "{status} {code:?} attempt {attempt}"
            );
        }
        assert_eq!(classify(403, None, 1), Permanent);
    }

    #[test]
    fn a_404_is_done_only_when_get_instance_shows_the_instance_going_away() {
        let st = |s: &str| Lookup::State(s.to_string());
        for mode in [OciMode::Terminate, OciMode::NodePool] {
            for gone in ["TERMINATING", "TERMINATED"] {
                assert_eq!(after_lookup(404, &st(gone), mode), AfterLookup::Gone);
                assert_eq!(after_lookup(409, &st(gone), mode), AfterLookup::Gone);
            }
            assert_eq!(after_lookup(409, &st("STOPPING"), mode), AfterLookup::Retry);
            for (status, looked) in [(404, st("RUNNING")), (404, Lookup::NotFound)] {
                let AfterLookup::Unauthorized(why) = after_lookup(status, &looked, mode) else {
                    panic!("{status} {looked:?} is not done");
                };
                assert!(why.contains(policy_hint(mode)), "{why}");
                assert!(why.contains("NotAuthorizedOrNotFound"), "{why}");
            }
        }
        assert!(policy_hint(OciMode::Terminate).contains("manage instances"));
        assert!(policy_hint(OciMode::NodePool).contains("manage cluster-node-pools"));
    }

    #[test]
    fn the_error_code_comes_from_ocis_error_body() {
        assert_eq!(
            error_code(br#"{"code": "LockConflict", "message": "locked"}"#).as_deref(),
            Some("LockConflict")
        );
        assert_eq!(error_code(b"<html>"), None);
        assert_eq!(error_code(b"{\"code\": 5}"), None);
    }

    #[test]
    fn the_compute_api_is_used_for_get_instance_in_both_modes() {
        let cfg = |mode, endpoint: Option<&str>| OciConfig {
            region: Some("eu-frankfurt-1".into()),
            endpoint: endpoint.map(str::to_string),
            tenancy: "ocid1.tenancy.oc1..a".into(),
            user: "ocid1.user.oc1..a".into(),
            fingerprint: String::new(),
            key_file: PathBuf::new(),
            mode,
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
            work_request_timeout: Duration::from_secs(60),
            work_request_poll: Duration::from_secs(1),
        };
        let pool = cfg(OciMode::NodePool, None);
        assert_eq!(
            pool.compute_url(),
            "https://iaas.eu-frankfurt-1.oraclecloud.com"
        );
        let proxied = cfg(OciMode::NodePool, Some("https://127.0.0.1:4443/"));
        assert_eq!(proxied.compute_url(), "https://127.0.0.1:4443");
        assert_eq!(proxied.base_url(), "https://127.0.0.1:4443");
    }

    #[test]
    fn workload_identity_needs_no_api_key() {
        let cfg: OciConfig = toml::from_str(
            "region = \"eu-frankfurt-1\"\nauth = \"workload-identity\"\nmode = \"node-pool\"\n",
        )
        .unwrap();
        assert_eq!(cfg.auth, OciAuth::WorkloadIdentity);
        assert!(cfg.validate().is_empty(), "{:?}", cfg.validate());
        assert_eq!(
            cfg.service_account_token_file,
            PathBuf::from("/var/run/secrets/kubernetes.io/serviceaccount/token")
        );
        // API keys still need theirs; a token endpoint must be https.
        let api: OciConfig = toml::from_str("region = \"eu-frankfurt-1\"\n").unwrap();
        assert_eq!(api.validate().len(), 4, "{:?}", api.validate());
        let bad: OciConfig = toml::from_str(
            "region = \"eu-frankfurt-1\"\nauth = \"workload-identity\"\ntoken_endpoint = \"http://10.0.0.1:12250/x\"\n",
        )
        .unwrap();
        assert!(bad
            .validate()
            .iter()
            .any(|d| format!("{:?}", d.path).contains("token_endpoint")));
        // Instance principals need a region or an auth endpoint; an unknown auth is a parse error.
        let ip: OciConfig =
            toml::from_str("endpoint = \"https://proxy.example\"\nauth = \"instance-principal\"\n")
                .unwrap();
        assert!(ip
            .validate()
            .iter()
            .any(|d| format!("{:?}", d.path).contains("auth_endpoint")));
        let ip = OciConfig {
            region: Some("us-gov-ashburn-1".into()),
            endpoint: None,
            ..ip
        };
        assert!(ip.validate().is_empty(), "{:?}", ip.validate());
        assert_eq!(
            ip.auth_url(),
            "https://auth.us-gov-ashburn-1.oraclegovcloud.com"
        );
        assert!(
            toml::from_str::<OciConfig>("region = \"r\"\nauth = \"user-principal\"\n").is_err()
        );
    }

    #[test]
    fn work_requests_end_as_the_container_engine_api_says() {
        use WorkRequestEnd::*;
        for (status, want) in [
            ("ACCEPTED", Pending),
            ("IN_PROGRESS", Pending),
            ("CANCELING", Pending),
            ("SUCCEEDED", Succeeded),
            ("FAILED", Failed),
            ("CANCELED", Failed),
        ] {
            assert_eq!(work_request_end(status), want, "{status}");
        }
        let errs = serde_json::json!([
            {"code": "InternalError", "message": "node could not be deleted", "timestamp": "t"},
            {"code": "Other", "message": "x"}
        ]);
        assert_eq!(
            work_request_errors(&errs),
            ": InternalError: node could not be deleted; Other: x"
        );
        assert_eq!(work_request_errors(&serde_json::json!({"items": []})), "");
    }

    #[test]
    fn garbage_is_not_a_key() {
        let err = OciSigner::from_pem("k", b"not a key").unwrap_err();
        assert!(matches!(err, KeyError::Pem(_)), "{err}");
    }
}

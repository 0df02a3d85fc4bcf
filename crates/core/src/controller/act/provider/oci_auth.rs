//! Session credentials for the `oci` provider: OKE workload identity (`auth =
//! "workload-identity"`, the controller's Kubernetes service account) and instance principals
//! (`auth = "instance-principal"`, the node's instance), instead of a user's API key.
//!
//! Instance principals, as the OCI Go SDK's `InstancePrincipalConfigurationProvider` does
//! (`common/auth/instance_principal_key_provider.go`, `federation_client.go`): the instance's
//! certificate, key and intermediate certificate from the metadata service
//! (`/opc/v2/identity/{cert,key,intermediate}.pem`, `Authorization: Bearer Oracle`); then
//! `POST https://auth.<region>.<domain>/v1/x509` with `{"certificate", "publicKey" (the session
//! key), "intermediateCertificates", "fingerprintAlgorithm": "SHA256"}`, signed with the instance's
//! key as `keyId="<tenancy>/fed-x509-sha256/<SHA-256 of the certificate>"` (the tenancy from the
//! certificate's `opc-tenant:` subject) over `date (request-target) content-length content-type
//! x-content-sha256` (no `host`, as the SDK); the answer `{"token": "<JWT>"}` gives `keyId="ST$<JWT>"`.
//!
//! OKE workload identity:
//! As the OCI Go SDK's `OkeWorkloadIdentityConfigurationProvider` does
//! (`common/auth/federation_client_oke_workload_identity.go`, resource principal version 2.2):
//! 1. make a fresh RSA-2048 session key pair ([`new_session_key`]; `ring` cannot generate RSA
//!    keys, the `rsa` crate does);
//! 2. `POST https://$KUBERNETES_SERVICE_HOST:12250/resourcePrincipalSessionTokens` (OKE's proxymux,
//!    its certificate checked against the service account's `ca.crt`) with
//!    `Authorization: Bearer <service account token>` and `{"podKey": "<public key PEM>"}`;
//! 3. the answer is a JSON string holding base64 of `{"token": "ST$<JWT>"}`
//!    ([`parse_session_response`]);
//! 4. sign requests with the session's private key and `keyId="ST$<JWT>"`.
//!
//! The session is renewed (a new key pair, a new token) once half its life has passed, less a
//! buffer ([`needs_renewal`]): the SDK's rule, with its 5-minute buffer shortened for short-lived
//! tokens. A refused or failed renewal is an error the provider retries with backoff.

use std::path::PathBuf;
use std::sync::Arc;

use base64::Engine;

use super::oci::{KeyError, OciSigner};

/// Why no session could be had.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The session key pair could not be made.
    #[error("making the RSA session key: {0}")]
    Keygen(String),
    /// The service account token could not be read.
    #[error("reading the service account token {}: {source}", path.display())]
    ServiceAccountToken {
        /// The token file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// No answer from the token endpoint.
    #[error("POST {endpoint}: {}", crate::telemetry::error_chain(.source))]
    Send {
        /// The token endpoint.
        endpoint: String,
        /// Cause.
        #[source]
        source: reqwest::Error,
    },
    /// The token endpoint refused (403: the cluster is not an enhanced cluster, or the service
    /// account is not allowed).
    #[error("workload identity session token refused: {endpoint} answered {status}: {body}{hint}")]
    Refused {
        /// The token endpoint.
        endpoint: String,
        /// HTTP status.
        status: u16,
        /// The start of its body.
        body: String,
        /// What to check.
        hint: &'static str,
    },
    /// The answer is not what OKE sends.
    #[error("workload identity session token: {0}")]
    Malformed(&'static str),
    /// The session key was refused by the signer.
    #[error("session key: {0}")]
    Key(#[from] KeyError),
    /// The metadata service did not hand out the instance's identity.
    #[error("instance identity: GET {url}: {why}")]
    Metadata {
        /// The metadata URL.
        url: String,
        /// What went wrong.
        why: String,
    },
    /// The instance's certificate is not what OCI issues.
    #[error("instance identity certificate: {0}")]
    Certificate(&'static str),
    /// The auth service refused the federation, or answered something else than a token.
    #[error("instance principal federation: POST {url} answered {status}: {body}")]
    Federation {
        /// The federation URL.
        url: String,
        /// HTTP status.
        status: u16,
        /// The start of its body.
        body: String,
    },
}

/// A session token and its lifetime (seconds since the epoch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The JWT, without `ST$`.
    pub jwt: String,
    /// Issued at.
    pub iat: i64,
    /// Expires at.
    pub exp: i64,
}

impl Session {
    /// The `keyId` requests are signed with.
    pub fn key_id(&self) -> String {
        format!("ST${}", self.jwt)
    }
}

/// A fresh RSA-2048 key pair: the private key as PKCS#8 DER, the public key as PEM `PUBLIC KEY`
/// (what the SDK sends as `podKey`).
pub fn new_session_key() -> Result<(Vec<u8>, String), AuthError> {
    use rsa::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
    let key = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048)
        .map_err(|e| AuthError::Keygen(e.to_string()))?;
    let der = key
        .to_pkcs8_der()
        .map_err(|e| AuthError::Keygen(e.to_string()))?
        .as_bytes()
        .to_vec();
    let public = key
        .to_public_key()
        .to_public_key_pem(LineEnding::LF)
        .map_err(|e| AuthError::Keygen(e.to_string()))?;
    Ok((der, public))
}

/// The session in a token endpoint's 200 answer (pure): a JSON string of base64 of
/// `{"token": "ST$<JWT>"}`, the JWT's payload carrying `iat` and `exp`.
pub fn parse_session_response(body: &[u8]) -> Result<Session, AuthError> {
    let quoted: String =
        serde_json::from_slice(body).map_err(|_| AuthError::Malformed("not a JSON string"))?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(quoted.trim())
        .map_err(|_| AuthError::Malformed("not base64"))?;
    let v: serde_json::Value =
        serde_json::from_slice(&decoded).map_err(|_| AuthError::Malformed("not JSON inside"))?;
    let token = v
        .get("token")
        .and_then(|t| t.as_str())
        .ok_or(AuthError::Malformed("no `token`"))?;
    let jwt = token
        .strip_prefix("ST$")
        .ok_or(AuthError::Malformed("the token does not start with ST$"))?;
    session_from_jwt(jwt)
}

/// A session for a JWT (pure): its `iat` and `exp` claims.
pub fn session_from_jwt(jwt: &str) -> Result<Session, AuthError> {
    let payload = jwt
        .split('.')
        .nth(1)
        .filter(|_| jwt.split('.').count() == 3)
        .ok_or(AuthError::Malformed("the token is not a JWT"))?;
    let claims: serde_json::Value = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()
        .and_then(|p| serde_json::from_slice(&p).ok())
        .ok_or(AuthError::Malformed("the JWT's payload is not JSON"))?;
    let time = |k: &str| claims.get(k).and_then(|t| t.as_f64()).map(|t| t as i64);
    match (time("iat"), time("exp")) {
        (Some(iat), Some(exp)) if exp > iat => Ok(Session {
            jwt: jwt.to_string(),
            iat,
            exp,
        }),
        _ => Err(AuthError::Malformed(
            "the JWT has no `iat` before its `exp`",
        )),
    }
}

/// Whether `s` must be renewed at `now` (pure): past half its life, less a buffer of 5 minutes
/// (the SDK's) or a quarter of its life if shorter.
pub fn needs_renewal(s: &Session, now: i64) -> bool {
    let life = s.exp - s.iat;
    let buffer = (life / 4).min(300);
    now + buffer >= s.iat + life / 2
}

/// The tenancy OCID in an instance certificate's subject (`opc-tenant:<ocid>`), as the SDK's
/// `extractTenancyIDFromCertificate` reads it (pure): the DER string value (UTF8String,
/// PrintableString or IA5String, its length from its header) that starts with `opc-tenant:`.
pub fn tenancy_of_certificate(der: &[u8]) -> Option<String> {
    const TAG: &[u8] = b"opc-tenant:";
    let start = der.windows(TAG.len()).position(|w| w == TAG)?;
    let string_tag = |t: u8| matches!(t, 0x0c | 0x13 | 0x16);
    let len = match (
        start.checked_sub(3).map(|i| der[i]),
        start.checked_sub(2).map(|i| der[i]),
        start.checked_sub(1).map(|i| der[i]),
    ) {
        (_, Some(t), Some(l)) if string_tag(t) && l < 0x80 => usize::from(l),
        (Some(t), Some(0x81), Some(l)) if string_tag(t) => usize::from(l),
        _ => return None,
    };
    let value = der.get(start..start + len)?;
    let ocid = std::str::from_utf8(value.get(TAG.len()..)?).ok()?;
    ocid.starts_with("ocid1.tenancy.").then(|| ocid.to_string())
}

/// The SHA-256 fingerprint of a certificate as the SDK writes it: lower-case hex pairs joined
/// by `:`.
pub fn certificate_fingerprint(der: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Where sessions come from.
enum Federation {
    /// OKE's proxymux token endpoint, with the service account token in `token_file`.
    Oke {
        endpoint: String,
        token_file: PathBuf,
        http: reqwest::Client,
    },
    /// The metadata service's instance identity and the auth service's x509 federation.
    Instance {
        metadata: String,
        auth: String,
        imds: reqwest::Client,
        http: reqwest::Client,
    },
}

/// Sessions (workload identity or instance principal), renewed before they expire.
pub struct Sessions {
    federation: Federation,
    current: tokio::sync::Mutex<Option<(Session, Arc<OciSigner>)>>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.federation {
            Federation::Oke {
                endpoint,
                token_file,
                ..
            } => f
                .debug_struct("WorkloadIdentity")
                .field("endpoint", endpoint)
                .field("token_file", token_file)
                .finish(),
            Federation::Instance { metadata, auth, .. } => f
                .debug_struct("InstancePrincipal")
                .field("metadata", metadata)
                .field("auth", auth)
                .finish(),
        }
    }
}

impl Sessions {
    /// Workload identity sessions from `endpoint`, authenticated with the service account token in
    /// `token_file` (read at each renewal: projected tokens rotate) over `http` (trusting the
    /// cluster's CA).
    pub fn workload_identity(endpoint: String, token_file: PathBuf, http: reqwest::Client) -> Self {
        Sessions {
            federation: Federation::Oke {
                endpoint,
                token_file,
                http,
            },
            current: tokio::sync::Mutex::new(None),
        }
    }

    /// Instance principal sessions: the identity from the metadata service at `metadata` (e.g.
    /// `http://169.254.169.254/opc/v2`, over `imds`), federated at the auth service `auth` (e.g.
    /// `https://auth.eu-frankfurt-1.oraclecloud.com`, over `http`).
    pub fn instance_principal(
        metadata: String,
        auth: String,
        imds: reqwest::Client,
        http: reqwest::Client,
    ) -> Self {
        Sessions {
            federation: Federation::Instance {
                metadata: metadata.trim_end_matches('/').to_string(),
                auth: auth.trim_end_matches('/').to_string(),
                imds,
                http,
            },
            current: tokio::sync::Mutex::new(None),
        }
    }

    fn source(&self) -> &str {
        match &self.federation {
            Federation::Oke { endpoint, .. } => endpoint,
            Federation::Instance { auth, .. } => auth,
        }
    }

    /// Forgets the current session (OCI answered 401 to it: expired or revoked early): the next
    /// request renews it.
    pub async fn invalidate(&self) {
        if self.current.lock().await.take().is_some() {
            tracing::warn!(source = %self.source(), "OCI refused the session (401): renewing it");
        }
    }

    /// The signer of the current session, renewed first when it is due.
    pub async fn signer(&self) -> Result<Arc<OciSigner>, AuthError> {
        let mut current = self.current.lock().await;
        let now = chrono::Utc::now().timestamp();
        if let Some((s, signer)) = current.as_ref() {
            if !needs_renewal(s, now) {
                return Ok(signer.clone());
            }
        }
        let (der, public_pem) = new_session_key()?;
        let session = match &self.federation {
            Federation::Oke {
                endpoint,
                token_file,
                http,
            } => oke_session(endpoint, token_file, http, &public_pem).await?,
            Federation::Instance {
                metadata,
                auth,
                imds,
                http,
            } => instance_session(metadata, auth, imds, http, &public_pem).await?,
        };
        let signer = Arc::new(OciSigner::from_pkcs8_der(&session.key_id(), &der)?);
        tracing::info!(
            source = %self.source(),
            expires = session.exp,
            "OCI session renewed"
        );
        *current = Some((session, signer.clone()));
        Ok(signer)
    }
}

/// One workload identity session from OKE's token endpoint for `public_pem`.
async fn oke_session(
    endpoint: &str,
    token_file: &std::path::Path,
    http: &reqwest::Client,
    public_pem: &str,
) -> Result<Session, AuthError> {
    let sa =
        std::fs::read_to_string(token_file).map_err(|source| AuthError::ServiceAccountToken {
            path: token_file.to_path_buf(),
            source,
        })?;
    let send = |source| AuthError::Send {
        endpoint: endpoint.to_string(),
        source,
    };
    let r = http
        .post(endpoint)
        .bearer_auth(sa.trim())
        .header(
            "opc-request-id",
            format!("nk-{:032x}", rand::random::<u128>()),
        )
        .json(&serde_json::json!({"podKey": public_pem}))
        .send()
        .await
        .map_err(send)?;
    let status = r.status().as_u16();
    let body = r.bytes().await.map_err(send)?;
    if status != 200 {
        return Err(AuthError::Refused {
            endpoint: endpoint.to_string(),
            status,
            body: super::webhook::trim(&String::from_utf8_lossy(&body)).to_string(),
            hint: if status == 403 {
                " (workload identity needs an OKE enhanced cluster)"
            } else {
                ""
            },
        });
    }
    parse_session_response(&body)
}

/// One instance principal session for `public_pem`: the identity from the metadata service,
/// federated at the auth service.
async fn instance_session(
    metadata: &str,
    auth: &str,
    imds: &reqwest::Client,
    http: &reqwest::Client,
    public_pem: &str,
) -> Result<Session, AuthError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    let get = |path: &'static str| async move {
        let url = format!("{metadata}{path}");
        let failed = |why: String| AuthError::Metadata {
            url: url.clone(),
            why,
        };
        let r = imds
            .get(&url)
            .header("authorization", "Bearer Oracle")
            .send()
            .await
            .map_err(|e| failed(crate::telemetry::error_chain(&e)))?;
        if !r.status().is_success() {
            return Err(failed(format!("HTTP {}", r.status().as_u16())));
        }
        r.text()
            .await
            .map_err(|e| failed(crate::telemetry::error_chain(&e)))
    };
    let cert_pem = get("/identity/cert.pem").await?;
    let key_pem = get("/identity/key.pem").await?;
    let intermediate_pem = get("/identity/intermediate.pem").await?;
    let leaf = CertificateDer::from_pem_slice(cert_pem.as_bytes())
        .map_err(|_| AuthError::Certificate("cert.pem is not a PEM certificate"))?;
    let intermediate = CertificateDer::from_pem_slice(intermediate_pem.as_bytes())
        .map_err(|_| AuthError::Certificate("intermediate.pem is not a PEM certificate"))?;
    let tenancy = tenancy_of_certificate(&leaf).ok_or(AuthError::Certificate(
        "no opc-tenant: in the certificate's subject",
    ))?;
    let key_id = format!(
        "{tenancy}/fed-x509-sha256/{}",
        certificate_fingerprint(&leaf)
    );
    let instance_key = OciSigner::from_pem(&key_id, key_pem.as_bytes())?;
    let b64 = |d: &[u8]| base64::engine::general_purpose::STANDARD.encode(d);
    let public: String = public_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    let body = serde_json::to_vec(&serde_json::json!({
        "certificate": b64(&leaf),
        "publicKey": public,
        "intermediateCertificates": [b64(&intermediate)],
        "fingerprintAlgorithm": "SHA256",
    }))
    .map_err(|_| AuthError::Malformed("federation body"))?;
    let url = format!("{auth}/v1/x509");
    let parsed = reqwest::Url::parse(&url).map_err(|_| AuthError::Malformed("auth URL"))?;
    let host = match (parsed.host_str(), parsed.port()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h.to_string(),
        (None, _) => return Err(AuthError::Malformed("auth URL without a host")),
    };
    let date = super::oci::http_date(chrono::Utc::now());
    let plan = super::oci::federation_plan(&super::oci::SignInput {
        method: "POST",
        path_and_query: parsed.path(),
        host: &host,
        date: &date,
        body: Some(("application/json", &body)),
    });
    let authorization = instance_key.authorization(&plan)?;
    let mut req = http
        .post(parsed)
        .header("date", &date)
        .header("authorization", authorization);
    for (k, v) in &plan.extra {
        if *k != "content-length" {
            req = req.header(*k, v);
        }
    }
    let send = |source| AuthError::Send {
        endpoint: url.clone(),
        source,
    };
    let r = req.body(body).send().await.map_err(send)?;
    let status = r.status().as_u16();
    let answer = r.bytes().await.map_err(send)?;
    let token = (status == 200)
        .then(|| serde_json::from_slice::<serde_json::Value>(&answer).ok())
        .flatten()
        .and_then(|v| v.get("token")?.as_str().map(str::to_string));
    match token {
        Some(jwt) => session_from_jwt(&jwt),
        None => Err(AuthError::Federation {
            url,
            status,
            body: super::webhook::trim(&String::from_utf8_lossy(&answer)).to_string(),
        }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn answer(token: &str) -> Vec<u8> {
        let inner = serde_json::json!({"token": token}).to_string();
        serde_json::to_vec(&base64::engine::general_purpose::STANDARD.encode(inner)).unwrap()
    }

    fn jwt(claims: serde_json::Value) -> String {
        let b = |v: &serde_json::Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
        };
        format!(
            "{}.{}.c2ln",
            b(&serde_json::json!({"alg": "RS256"})),
            b(&claims)
        )
    }

    #[test]
    fn the_token_endpoints_answer_is_parsed_as_the_sdk_reads_it() {
        let j = jwt(serde_json::json!({"iat": 1000, "exp": 4600, "sub": "x"}));
        let s = parse_session_response(&answer(&format!("ST${j}"))).unwrap();
        assert_eq!((s.iat, s.exp), (1000, 4600));
        assert_eq!(s.key_id(), format!("ST${j}"));
        for (body, why) in [
            (b"{}".to_vec(), "not a JSON string"),
            (serde_json::to_vec("!!").unwrap(), "not base64"),
            (answer(&j), "ST$"),
            (answer("ST$a.b"), "not a JWT"),
            (
                answer(&format!("ST${}", jwt(serde_json::json!({"exp": 5})))),
                "iat",
            ),
        ] {
            let err = parse_session_response(&body).unwrap_err().to_string();
            assert!(err.contains(why), "{err} vs {why}");
        }
    }

    #[test]
    fn a_session_is_renewed_past_half_its_life_less_a_buffer() {
        let hour = Session {
            jwt: String::new(),
            iat: 0,
            exp: 3600,
        };
        // Half life 1800 s, buffer 300 s.
        assert!(!needs_renewal(&hour, 0));
        assert!(!needs_renewal(&hour, 1499));
        assert!(needs_renewal(&hour, 1500));
        // A 20 s token: half life 10 s, buffer 5 s.
        let short = Session {
            jwt: String::new(),
            iat: 100,
            exp: 120,
        };
        assert!(!needs_renewal(&short, 104));
        assert!(needs_renewal(&short, 105));
    }

    #[test]
    fn the_tenancy_and_fingerprint_come_from_the_certificate() {
        // An OU value (UTF8String, 38 bytes) followed by the next SEQUENCE (0x30: ASCII `0`).
        let der = b"\x06\x03\x55\x04\x0b\x0c\x26opc-tenant:ocid1.tenancy.oc1..aaaa-b_c0\x31\x00";
        assert_eq!(
            tenancy_of_certificate(der).as_deref(),
            Some("ocid1.tenancy.oc1..aaaa-b_c")
        );
        let user = b"\x0c\x1copc-tenant:ocid1.user.oc1..x";
        assert_eq!(tenancy_of_certificate(user), None);
        let bare = b"opc-tenant:ocid1.tenancy.oc1..x";
        assert_eq!(tenancy_of_certificate(bare), None, "no DER header");
        assert_eq!(tenancy_of_certificate(b"no subject"), None);
        let fp = certificate_fingerprint(b"x");
        assert_eq!(fp.len(), 32 * 3 - 1);
        assert!(fp.starts_with("2d:71:16:42"), "{fp}");
    }

    #[test]
    fn a_session_key_is_rsa_2048_and_signs() {
        let (der, public) = new_session_key().unwrap();
        assert!(public.starts_with("-----BEGIN PUBLIC KEY-----"), "{public}");
        let signer = OciSigner::from_pkcs8_der("ST$x", &der).unwrap();
        assert_eq!(
            signer.sign(b"data").unwrap().len(),
            344,
            "256-byte signature, base64"
        );
    }
}

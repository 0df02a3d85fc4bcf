//! OKE workload identity for the `oci` provider (`auth = "workload-identity"`): the controller's
//! Kubernetes service account, not a user's API key, signs the OCI calls.
//!
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
    #[error("workload identity session key: {0}")]
    Key(#[from] KeyError),
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

/// Sessions from OKE's token endpoint, renewed before they expire.
pub struct WorkloadIdentity {
    endpoint: String,
    token_file: PathBuf,
    http: reqwest::Client,
    current: tokio::sync::Mutex<Option<(Session, Arc<OciSigner>)>>,
}

impl std::fmt::Debug for WorkloadIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkloadIdentity")
            .field("endpoint", &self.endpoint)
            .field("token_file", &self.token_file)
            .finish()
    }
}

impl WorkloadIdentity {
    /// Sessions from `endpoint`, authenticated with the service account token in `token_file`
    /// (read at each renewal: projected tokens rotate) over `http` (trusting the cluster's CA).
    pub fn new(endpoint: String, token_file: PathBuf, http: reqwest::Client) -> Self {
        WorkloadIdentity {
            endpoint,
            token_file,
            http,
            current: tokio::sync::Mutex::new(None),
        }
    }

    /// Forgets the current session (OCI answered 401 to it: expired or revoked early): the next
    /// request renews it.
    pub async fn invalidate(&self) {
        if self.current.lock().await.take().is_some() {
            tracing::warn!(endpoint = %self.endpoint, "OCI refused the workload identity session (401): renewing it");
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
        let sa = std::fs::read_to_string(&self.token_file).map_err(|source| {
            AuthError::ServiceAccountToken {
                path: self.token_file.clone(),
                source,
            }
        })?;
        let answer = self
            .http
            .post(&self.endpoint)
            .bearer_auth(sa.trim())
            .header(
                "opc-request-id",
                format!("nk-{:032x}", rand::random::<u128>()),
            )
            .json(&serde_json::json!({"podKey": public_pem}))
            .send()
            .await;
        let (status, body) = match answer {
            Ok(r) => {
                let status = r.status().as_u16();
                let body = r.bytes().await.map_err(|source| AuthError::Send {
                    endpoint: self.endpoint.clone(),
                    source,
                })?;
                (status, body)
            }
            Err(source) => {
                return Err(AuthError::Send {
                    endpoint: self.endpoint.clone(),
                    source,
                })
            }
        };
        if status != 200 {
            return Err(AuthError::Refused {
                endpoint: self.endpoint.clone(),
                status,
                body: super::webhook::trim(&String::from_utf8_lossy(&body)).to_string(),
                hint: if status == 403 {
                    " (workload identity needs an OKE enhanced cluster)"
                } else {
                    ""
                },
            });
        }
        let session = parse_session_response(&body)?;
        let signer = Arc::new(OciSigner::from_pkcs8_der(&session.key_id(), &der)?);
        tracing::info!(
            endpoint = %self.endpoint,
            expires = session.exp,
            "OCI workload identity session renewed"
        );
        *current = Some((session, signer.clone()));
        Ok(signer)
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

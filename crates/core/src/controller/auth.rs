//! Who is calling: TokenReview of the agent's projected service-account token, with a bounded TTL
//! cache, and the node the token is bound to.
//!
//! The node comes from `user.extra["authentication.kubernetes.io/node-name"]` (Kubernetes ≥ 1.30
//! with bound tokens); without it the pod named in `authentication.kubernetes.io/pod-name` is looked
//! up and its `spec.nodeName` used. Only the configured service account and audience are accepted.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

// tokio's clock: the wall clock, or a paused one in tests.
use tokio::time::Instant;

use base64::Engine;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};

const NODE_NAME: &str = "authentication.kubernetes.io/node-name";
const POD_NAME: &str = "authentication.kubernetes.io/pod-name";

/// Why a caller was refused.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// No bearer token, or the token is unknown, expired or for another audience (401).
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// Authenticated, but not as the agent's service account or not bound to a node (403).
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// The API server could not be asked (503; the agent retries).
    #[error("cannot review token: {call}: {source}")]
    Upstream {
        /// The call that failed (`TokenReview`, `get pod NS/NAME`).
        call: String,
        /// The API server's or the connection's error.
        #[source]
        source: kube::Error,
    },
}

/// An authenticated agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The node the token is bound to.
    pub node: String,
    /// The pod the token is bound to, when known.
    pub pod: Option<String>,
    /// `system:serviceaccount:<ns>:<name>`.
    pub username: String,
}

#[derive(Debug, Clone)]
struct Entry {
    caller: Caller,
    until: Instant,
}

/// A bounded cache keyed by the token's SHA-256 (tokens themselves are never stored).
#[derive(Debug)]
struct Cache {
    cap: usize,
    map: HashMap<[u8; 32], Entry>,
    order: VecDeque<[u8; 32]>,
}

impl Cache {
    fn get(&mut self, k: &[u8; 32], now: Instant) -> Option<Caller> {
        match self.map.get(k) {
            Some(e) if e.until > now => Some(e.caller.clone()),
            Some(_) => {
                self.map.remove(k);
                None
            }
            None => None,
        }
    }

    fn put(&mut self, k: [u8; 32], e: Entry) {
        while self.map.len() >= self.cap {
            match self.order.pop_front() {
                Some(old) => {
                    self.map.remove(&old);
                }
                None => break,
            }
        }
        if self.map.insert(k, e).is_none() {
            self.order.push_back(k);
        }
        if self.order.len() > self.cap.saturating_mul(2) {
            let map = &self.map;
            self.order.retain(|k| map.contains_key(k));
        }
    }
}

/// Validates agent tokens.
pub struct Authenticator {
    client: kube::Client,
    audience: String,
    service_account: String,
    ttl: Duration,
    cache: Mutex<Cache>,
    /// TokenReviews sent (for the metrics and the cache test).
    pub reviews: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("audience", &self.audience)
            .field("service_account", &self.service_account)
            .finish_non_exhaustive()
    }
}

impl Authenticator {
    /// An authenticator requiring `service_account` and `audience`.
    pub fn new(
        client: kube::Client,
        service_account: &str,
        audience: &str,
        cache_size: usize,
        ttl: Duration,
    ) -> Self {
        Authenticator {
            client,
            audience: audience.into(),
            service_account: service_account.into(),
            ttl,
            cache: Mutex::new(Cache {
                cap: cache_size.max(1),
                map: HashMap::new(),
                order: VecDeque::new(),
            }),
            reviews: Default::default(),
        }
    }

    /// Authenticates an `Authorization` header value (`Bearer <token>`).
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Caller, AuthError> {
        let token = authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| AuthError::Unauthenticated("missing bearer token".into()))?;
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = Instant::now();
        if let Some(c) = self.lock().get(&key, now) {
            return Ok(c);
        }
        let caller = self.review(token).await?;
        let until = now + self.ttl.min(jwt_remaining(token).unwrap_or(self.ttl));
        self.lock().put(
            key,
            Entry {
                caller: caller.clone(),
                until,
            },
        );
        Ok(caller)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn review(&self, token: &str) -> Result<Caller, AuthError> {
        self.reviews
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tr = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: Some(vec![self.audience.clone()]),
            },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let out = api
            .create(&PostParams::default(), &tr)
            .await
            .map_err(|source| AuthError::Upstream {
                call: "TokenReview".into(),
                source,
            })?;
        let st = out.status.unwrap_or_default();
        if st.authenticated != Some(true) {
            return Err(AuthError::Unauthenticated(
                st.error.unwrap_or_else(|| "token not authenticated".into()),
            ));
        }
        if !st.audiences.unwrap_or_default().contains(&self.audience) {
            return Err(AuthError::Unauthenticated(format!(
                "token is not valid for audience {}",
                self.audience
            )));
        }
        let user = st.user.unwrap_or_default();
        let username = user.username.unwrap_or_default();
        if username != self.service_account {
            return Err(AuthError::Forbidden(format!(
                "{username:?} is not the agent service account"
            )));
        }
        let extra = user.extra.unwrap_or_default();
        // An empty value counts as absent (an issuer may send `[""]` for a token not bound to a node).
        let first = |k: &str| {
            extra
                .get(k)
                .and_then(|v| v.first())
                .filter(|v| !v.is_empty())
                .cloned()
        };
        let pod = first(POD_NAME);
        let node = match (first(NODE_NAME), &pod) {
            (Some(n), _) => n,
            (None, Some(p)) => self.node_of_pod(&username, p).await?,
            (None, None) => {
                return Err(AuthError::Forbidden(
                    "token is bound to neither a node nor a pod".into(),
                ))
            }
        };
        Ok(Caller {
            node,
            pod,
            username,
        })
    }

    async fn node_of_pod(&self, username: &str, pod: &str) -> Result<String, AuthError> {
        let ns = username.split(':').nth(2).unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let p = api
            .get_opt(pod)
            .await
            .map_err(|source| AuthError::Upstream {
                call: format!("get pod {ns}/{pod}"),
                source,
            })?
            .ok_or_else(|| {
                AuthError::Forbidden(format!("pod {ns}/{pod} of the token does not exist"))
            })?;
        p.spec
            .and_then(|s| s.node_name)
            .ok_or_else(|| AuthError::Forbidden(format!("pod {ns}/{pod} is not scheduled")))
    }
}

/// Seconds until a JWT's `exp` (unverified: only used to shorten the cache lifetime after the API
/// server accepted the token). None for tokens that are not JWTs.
fn jwt_remaining(token: &str) -> Option<Duration> {
    let payload = token.split('.').nth(1)?;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&raw).ok()?;
    let exp = v.get("exp")?.as_i64()?;
    let left = exp - chrono::Utc::now().timestamp();
    Some(Duration::from_secs(left.max(0) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_is_bounded_and_expires() {
        let mut c = Cache {
            cap: 2,
            map: HashMap::new(),
            order: VecDeque::new(),
        };
        let now = Instant::now();
        let caller = |n: &str| Caller {
            node: n.into(),
            pod: None,
            username: "u".into(),
        };
        let e = |n: &str, secs| Entry {
            caller: caller(n),
            until: now + Duration::from_secs(secs),
        };
        c.put([1; 32], e("a", 10));
        c.put([2; 32], e("b", 10));
        c.put([3; 32], e("c", 0));
        assert_eq!(c.map.len(), 2);
        assert!(c.get(&[1; 32], now).is_none(), "oldest evicted");
        assert_eq!(c.get(&[2; 32], now), Some(caller("b")));
        assert!(c.get(&[3; 32], now).is_none(), "expired");
    }

    const SA: &str = "system:serviceaccount:nodekeeper:nodekeeper-agent";

    /// An authenticator whose API server accepts every token as the agent's, bound to node
    /// `n1`; its `reviews` counter counts the TokenReviews.
    fn authenticator(ttl: Duration) -> Authenticator {
        let svc = tower::service_fn(|_req: hyper::Request<kube::client::Body>| async {
            let body = serde_json::json!({
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {},
                "status": {"authenticated": true, "audiences": ["nodekeeper"],
                    "user": {"username": SA, "extra": {NODE_NAME: ["n1"]}}}
            });
            hyper::Response::builder()
                .status(201)
                .header("content-type", "application/json")
                .body(kube::client::Body::from(
                    serde_json::to_vec(&body).unwrap_or_default(),
                ))
        });
        Authenticator::new(kube::Client::new(svc, "default"), SA, "nodekeeper", 16, ttl)
    }

    fn reviews(a: &Authenticator) -> u64 {
        a.reviews.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[tokio::test(start_paused = true)]
    async fn a_reviewed_token_is_cached_for_exactly_the_ttl() {
        let a = authenticator(Duration::from_secs(60));
        let auth = Some("Bearer not-a-jwt");
        assert_eq!(a.authenticate(auth).await.unwrap().node, "n1");
        assert_eq!(reviews(&a), 1);
        tokio::time::advance(Duration::from_millis(59_999)).await;
        assert_eq!(a.authenticate(auth).await.unwrap().node, "n1");
        assert_eq!(reviews(&a), 1, "cached until the TTL");
        tokio::time::advance(Duration::from_millis(1)).await;
        a.authenticate(auth).await.unwrap();
        assert_eq!(reviews(&a), 2, "reviewed again once the TTL is over");
        a.authenticate(Some("Bearer another")).await.unwrap();
        assert_eq!(reviews(&a), 3, "per token");
    }

    #[tokio::test(start_paused = true)]
    async fn a_jwt_is_cached_no_longer_than_its_expiry() {
        let a = authenticator(Duration::from_secs(600));
        // `exp` is read against the wall clock (whole seconds): 30 s, or 29 s across a second.
        let exp = chrono::Utc::now().timestamp() + 30;
        let p =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{{\"exp\":{exp}}}"));
        let auth = format!("Bearer h.{p}.s");
        a.authenticate(Some(&auth)).await.unwrap();
        tokio::time::advance(Duration::from_secs(28)).await;
        a.authenticate(Some(&auth)).await.unwrap();
        assert_eq!(reviews(&a), 1, "cached while the token is valid");
        tokio::time::advance(Duration::from_secs(3)).await;
        a.authenticate(Some(&auth)).await.unwrap();
        assert_eq!(
            reviews(&a),
            2,
            "not past its expiry, though the TTL is 10 min"
        );
    }

    #[test]
    fn jwt_expiry_is_read() {
        let exp = chrono::Utc::now().timestamp() + 100;
        let p =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{{\"exp\":{exp}}}"));
        let left = jwt_remaining(&format!("h.{p}.s")).unwrap();
        assert!(left <= Duration::from_secs(100) && left >= Duration::from_secs(98));
        assert!(jwt_remaining("sim.abc").is_none());
    }
}

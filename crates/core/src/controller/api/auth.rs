//! Who is calling: TokenReview of the agent's projected service-account token, with a bounded TTL
//! cache, and the node the token is bound to.
//!
//! A token bound to an agent pod that [`LivePods`] sees is cached until the token expires (at most
//! [`BOUND_TOKEN_TTL`]), and dropped from the cache the moment its pod is deleted or starts
//! terminating; a token bound to a pod it does not see is not cached; any other token (no pod
//! uid: an API server older than 1.30, or no pod) for `token_cache_ttl`. The kubelet renews a
//! projected token before 80 % of its life (one hour by default), so each agent costs about one
//! TokenReview an hour.
//!
//! The node comes from `user.extra["authentication.kubernetes.io/node-name"]` (Kubernetes ≥ 1.30
//! with bound tokens); without it the pod named in `authentication.kubernetes.io/pod-name` is looked
//! up and its `spec.nodeName` used. Only the configured service account and audience are accepted.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// tokio's clock: the wall clock, or a paused one in tests.
use tokio::time::Instant;

use base64::Engine;
use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::{watcher, WatchStreamExt};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

const NODE_NAME: &str = "authentication.kubernetes.io/node-name";
const POD_NAME: &str = "authentication.kubernetes.io/pod-name";
const POD_UID: &str = "authentication.kubernetes.io/pod-uid";

/// Longest a review of a token bound to a live agent pod is cached (the default life of a
/// projected service-account token).
pub const BOUND_TOKEN_TTL: Duration = Duration::from_secs(3600);

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
    /// The pod (name, uid) the entry lives no longer than, when cached for the token's life.
    bound_to: Option<(String, String)>,
}

/// A bounded cache keyed by the token's SHA-256 (tokens themselves are never stored).
#[derive(Debug)]
struct Cache {
    cap: usize,
    map: HashMap<[u8; 32], Entry>,
    order: VecDeque<[u8; 32]>,
}

impl Cache {
    fn get(&mut self, k: &[u8; 32], now: Instant, live: Option<&LivePods>) -> Option<Caller> {
        let pod_lives = |e: &Entry| match (&e.bound_to, live) {
            (None, _) => true,
            (Some((name, uid)), Some(live)) => live.has(name, uid),
            (Some(_), None) => false,
        };
        match self.map.get(k) {
            Some(e) if e.until > now && pod_lives(e) => Some(e.caller.clone()),
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
    live: Option<Arc<LivePods>>,
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
            live: None,
            reviews: Default::default(),
        }
    }

    /// Tokens bound to a pod `live` sees are cached for their life ([`BOUND_TOKEN_TTL`] at most)
    /// while that pod lives.
    pub fn with_live_pods(mut self, live: Arc<LivePods>) -> Self {
        self.live = Some(live);
        self
    }

    /// The caller of a token this authenticator has already reviewed and still caches, without
    /// asking the API server: `Ok(None)` when the token is not cached (it needs
    /// [`Authenticator::authenticate`]), an error when the header carries no bearer token. Costs a
    /// hash and a lookup: the report API calls it before it reads a body or takes a permit.
    pub fn cached(&self, authorization: Option<&str>) -> Result<Option<Caller>, AuthError> {
        let token = bearer(authorization)?;
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        Ok(self.lock().get(&key, Instant::now(), self.live.as_deref()))
    }

    /// Authenticates an `Authorization` header value (`Bearer <token>`).
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Caller, AuthError> {
        let token = bearer(authorization)?;
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = Instant::now();
        let live = self.live.as_deref();
        if let Some(c) = self.lock().get(&key, now, live) {
            return Ok(c);
        }
        let (caller, uid) = self.review(token).await?;
        let (ttl, bound_to) = match (&caller.pod, uid, live) {
            (Some(pod), Some(uid), Some(live)) if live.has(pod, &uid) => {
                (BOUND_TOKEN_TTL, Some((pod.clone(), uid)))
            }
            // Bound to a pod the watch does not hold (yet, or any more: the API server accepts
            // a terminating pod's token for 60 s): not cached, so it stops working with its pod.
            (Some(_), Some(_), Some(_)) => return Ok(caller),
            _ => (self.ttl, None),
        };
        let until = now + ttl.min(jwt_remaining(token).unwrap_or(ttl));
        self.lock().put(
            key,
            Entry {
                caller: caller.clone(),
                until,
                bound_to,
            },
        );
        Ok(caller)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        crate::sync::lock(&self.cache)
    }

    /// The caller, and the uid of the pod its token is bound to (when the token names one).
    async fn review(&self, token: &str) -> Result<(Caller, Option<String>), AuthError> {
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
        let uid = first(POD_UID);
        let node = match (first(NODE_NAME), &pod) {
            (Some(n), _) => n,
            (None, Some(p)) => self.node_of_pod(&username, p).await?,
            (None, None) => {
                return Err(AuthError::Forbidden(
                    "token is bound to neither a node nor a pod".into(),
                ))
            }
        };
        Ok((
            Caller {
                node,
                pod,
                username,
            },
            uid,
        ))
    }

    async fn node_of_pod(&self, username: &str, pod: &str) -> Result<String, AuthError> {
        let ns = service_account_namespace(username).unwrap_or_default();
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

/// The namespace of `system:serviceaccount:<ns>:<name>` (the agents' pods run there).
pub fn service_account_namespace(username: &str) -> Option<&str> {
    username.split(':').nth(2).filter(|ns| !ns.is_empty())
}

/// The pods of the agents' namespace that exist and are not terminating (name → uid), from a
/// metadata-only watch; empty until its first list. A token bound to a pod the set does not hold
/// is not cached. Names and uids only, not a reflector `Store` of the metadata: one entry per
/// node, at 5,000 nodes.
#[derive(Debug, Default)]
pub struct LivePods {
    pods: Mutex<HashMap<String, String>>,
}

impl LivePods {
    /// Whether pod `name` with `uid` lives.
    pub fn has(&self, name: &str, uid: &str) -> bool {
        self.lock().get(name).is_some_and(|u| u == uid)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        crate::sync::lock(&self.pods)
    }

    /// Keeps the set by a watch of the pods in `namespace` (names and uids only) until `cancel`.
    pub async fn run(
        self: Arc<Self>,
        client: kube::Client,
        namespace: String,
        cancel: CancellationToken,
    ) {
        // `PartialObjectMeta` makes the list and the watch metadata-only.
        let api: Api<PartialObjectMeta<Pod>> = Api::namespaced(client, &namespace);
        let mut events = std::pin::pin!(watcher(
            api,
            watcher::Config::default().timeout(crate::k8s::watch_timeout_secs())
        )
        .default_backoff());
        // A re-list is gathered here and swapped in whole at its end.
        let mut relist = HashMap::new();
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                item = events.next() => match item {
                    None => return,
                    Some(Err(error)) => tracing::warn!(%namespace, %error, "agent pod watch error (retrying)"),
                    Some(Ok(event)) => self.apply(event, &mut relist),
                },
            }
        }
    }

    /// One watch event.
    pub fn apply(
        &self,
        event: watcher::Event<PartialObjectMeta<Pod>>,
        relist: &mut HashMap<String, String>,
    ) {
        let entry = |m: &PartialObjectMeta<Pod>| {
            let live = m.metadata.deletion_timestamp.is_none();
            Some((m.metadata.name.clone()?, m.metadata.uid.clone()?, live))
        };
        match event {
            watcher::Event::Init => relist.clear(),
            watcher::Event::InitApply(m) => {
                if let Some((name, uid, true)) = entry(&m) {
                    relist.insert(name, uid);
                }
            }
            watcher::Event::InitDone => *self.lock() = std::mem::take(relist),
            watcher::Event::Apply(m) => match entry(&m) {
                Some((name, uid, true)) => {
                    self.lock().insert(name, uid);
                }
                Some((name, _, false)) => {
                    self.lock().remove(&name);
                }
                None => {}
            },
            watcher::Event::Delete(m) => {
                if let Some(name) = &m.metadata.name {
                    self.lock().remove(name);
                }
            }
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header value.
fn bearer(authorization: Option<&str>) -> Result<&str, AuthError> {
    authorization
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| AuthError::Unauthenticated("missing bearer token".into()))
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
            bound_to: None,
        };
        c.put([1; 32], e("a", 10));
        c.put([2; 32], e("b", 10));
        c.put([3; 32], e("c", 0));
        assert_eq!(c.map.len(), 2);
        assert!(c.get(&[1; 32], now, None).is_none(), "oldest evicted");
        assert_eq!(c.get(&[2; 32], now, None), Some(caller("b")));
        assert!(c.get(&[3; 32], now, None).is_none(), "expired");
    }

    const SA: &str = "system:serviceaccount:nodekeeper:nodekeeper-agent";

    /// An authenticator whose API server accepts every token as the agent's, bound to node
    /// `n1`; its `reviews` counter counts the TokenReviews.
    fn authenticator(ttl: Duration) -> Authenticator {
        authenticator_with(ttl, serde_json::json!({NODE_NAME: ["n1"]}))
    }

    /// As [`authenticator`], the tokens' `user.extra` being `extra`.
    fn authenticator_with(ttl: Duration, extra: serde_json::Value) -> Authenticator {
        let svc = tower::service_fn(move |_req: hyper::Request<kube::client::Body>| {
            let body = serde_json::json!({
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {},
                "status": {"authenticated": true, "audiences": ["nodekeeper"],
                    "user": {"username": SA, "extra": extra.clone()}}
            });
            async move {
                hyper::Response::builder()
                    .status(201)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(
                        serde_json::to_vec(&body).unwrap_or_default(),
                    ))
            }
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

    fn pod(name: &str, uid: &str, terminating: bool) -> PartialObjectMeta<Pod> {
        let mut m = PartialObjectMeta::<Pod>::default();
        m.metadata.name = Some(name.into());
        m.metadata.uid = Some(uid.into());
        if terminating {
            m.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                ));
        }
        m
    }

    #[test]
    fn live_pods_follow_the_watch() {
        use watcher::Event::*;
        let live = LivePods::default();
        let mut relist = HashMap::new();
        for e in [
            Init,
            InitApply(pod("a", "1", false)),
            InitApply(pod("t", "2", true)),
        ] {
            live.apply(e, &mut relist);
        }
        assert!(!live.has("a", "1"), "nothing before the first list ends");
        live.apply(InitDone, &mut relist);
        assert!(live.has("a", "1"));
        assert!(!live.has("a", "9"), "another pod of the same name");
        assert!(!live.has("t", "2"), "terminating");
        live.apply(Apply(pod("b", "3", false)), &mut relist);
        assert!(live.has("b", "3"));
        live.apply(Apply(pod("b", "3", true)), &mut relist);
        assert!(!live.has("b", "3"), "terminating since");
        live.apply(Delete(pod("a", "1", false)), &mut relist);
        assert!(!live.has("a", "1"), "deleted");
        // A re-list replaces the set whole (a deletion missed while disconnected is dropped).
        live.apply(Apply(pod("c", "4", false)), &mut relist);
        for e in [Init, InitApply(pod("d", "5", false)), InitDone] {
            live.apply(e, &mut relist);
        }
        assert!(!live.has("c", "4") && live.has("d", "5"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_of_a_live_agent_pod_is_cached_for_its_life_and_no_longer_than_its_pod() {
        let live = Arc::new(LivePods::default());
        let mut relist = HashMap::new();
        for e in [
            watcher::Event::Init,
            watcher::Event::InitApply(pod("agent-x", "u1", false)),
            watcher::Event::InitDone,
        ] {
            live.apply(e, &mut relist);
        }
        let extra = serde_json::json!({NODE_NAME: ["n1"], POD_NAME: ["agent-x"], POD_UID: ["u1"]});
        let a = authenticator_with(Duration::from_secs(60), extra).with_live_pods(live.clone());
        let auth = Some("Bearer not-a-jwt");
        let caller = a.authenticate(auth).await.unwrap();
        assert_eq!(
            (caller.node.as_str(), caller.pod.as_deref()),
            ("n1", Some("agent-x"))
        );
        tokio::time::advance(BOUND_TOKEN_TTL - Duration::from_millis(1)).await;
        a.authenticate(auth).await.unwrap();
        assert_eq!(
            reviews(&a),
            1,
            "cached for the token's life, past token_cache_ttl"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        a.authenticate(auth).await.unwrap();
        assert_eq!(reviews(&a), 2, "reviewed again after BOUND_TOKEN_TTL");

        // The pod starts terminating: its token's entry is dropped at once, and while the API
        // server still accepts the token (60 s into a pod's termination) every use is reviewed.
        live.apply(
            watcher::Event::Apply(pod("agent-x", "u1", true)),
            &mut relist,
        );
        a.authenticate(auth).await.unwrap();
        assert_eq!(reviews(&a), 3, "dropped when its pod terminates");
        a.authenticate(auth).await.unwrap();
        assert_eq!(reviews(&a), 4, "a pod the watch does not hold: not cached");

        // A token without a pod uid (an older API server, or no pod): `token_cache_ttl`.
        let a = authenticator_with(
            Duration::from_secs(60),
            serde_json::json!({NODE_NAME: ["n1"]}),
        )
        .with_live_pods(live);
        a.authenticate(auth).await.unwrap();
        tokio::time::advance(Duration::from_millis(59_999)).await;
        a.authenticate(auth).await.unwrap();
        assert_eq!(reviews(&a), 1);
        tokio::time::advance(Duration::from_millis(1)).await;
        a.authenticate(auth).await.unwrap();
        assert_eq!(reviews(&a), 2);
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

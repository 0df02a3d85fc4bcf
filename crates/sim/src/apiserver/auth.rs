//! Service-account tokens minted by the sim and the TokenReview API that checks them.

use std::collections::HashMap;
use std::sync::Mutex;

use base64::Engine;
use chrono::{DateTime, Utc};
use k8s_openapi::api::authentication::v1::TokenReviewSpec;
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::clock::{fmt_time, SimClock};

/// What a token is bound to (the body of `POST /sim/v1/tokens`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TokenRequest {
    /// Pod name.
    pub pod: String,
    /// Node name.
    pub node: String,
    /// Audiences the token is valid for (empty: the API server's default audience).
    #[serde(default)]
    pub audiences: Vec<String>,
    /// Namespace of the pod and service account.
    #[serde(default = "default_ns")]
    pub namespace: String,
    /// Service account name.
    #[serde(default = "default_sa")]
    pub service_account: String,
    /// Lifetime in simulated seconds.
    #[serde(default = "default_ttl")]
    pub expiration_seconds: i64,
    /// UID of the bound pod (a TokenRequest with `boundObjectRef`); empty for the sim's own
    /// tokens (`POST /sim/v1/tokens`), which name a pod that need not exist. With it, as on
    /// kube-apiserver, the review names the uid and refuses the token once the pod is gone,
    /// recreated, or terminating for more than 60 s.
    #[serde(default)]
    pub pod_uid: String,
}

/// What a review needs to know of a bound pod: its uid and, when terminating, since when.
pub type PodLookup<'a> = &'a dyn Fn(&str, &str) -> Option<(String, Option<DateTime<Utc>>)>;

fn default_ns() -> String {
    "default".into()
}
fn default_sa() -> String {
    "default".into()
}
fn default_ttl() -> i64 {
    3600
}

/// Default audience of tokens minted without one.
pub const DEFAULT_AUDIENCE: &str = "https://kubernetes.default.svc";

#[derive(Debug, Clone)]
struct Minted {
    req: TokenRequest,
    expires: DateTime<Utc>,
}

/// The token registry.
#[derive(Debug, Default)]
pub struct Tokens {
    minted: Mutex<HashMap<String, Minted>>,
}

impl Tokens {
    /// Mints a token; returns it with its expiry time.
    pub fn mint(&self, clock: &SimClock, mut req: TokenRequest) -> (String, String) {
        if req.audiences.is_empty() {
            req.audiences.push(DEFAULT_AUDIENCE.to_string());
        }
        let raw: [u8; 24] = rand::rng().random();
        let token = format!(
            "sim.{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
        );
        let expires = clock.now() + chrono::Duration::seconds(req.expiration_seconds.max(1));
        let mut m = self.minted.lock().unwrap_or_else(|e| e.into_inner());
        m.insert(token.clone(), Minted { req, expires });
        (token, fmt_time(expires))
    }

    /// Answers a TokenReview request body with the full TokenReview (spec + status); `pod`
    /// looks up a bound pod by namespace and name.
    pub fn review(&self, clock: &SimClock, body: &Value, pod: PodLookup<'_>) -> Value {
        // A malformed spec reviews as an empty one: not authenticated.
        let spec: TokenReviewSpec = body
            .get("spec")
            .and_then(|s| serde_json::from_value(s.clone()).ok())
            .unwrap_or_default();
        let token = spec.token.as_deref().unwrap_or_default();
        let status = self.status(
            clock,
            token,
            spec.audiences.as_deref().unwrap_or_default(),
            pod,
        );
        let mut out = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "metadata": {"creationTimestamp": null}, "spec": body.get("spec").cloned().unwrap_or(json!({})),
            "status": status});
        if let Some(m) = out["spec"].as_object_mut() {
            m.remove("token");
        }
        out
    }

    fn status(
        &self,
        clock: &SimClock,
        token: &str,
        wanted: &[String],
        pod: PodLookup<'_>,
    ) -> Value {
        let minted = {
            let m = self.minted.lock().unwrap_or_else(|e| e.into_inner());
            m.get(token).cloned()
        };
        let Some(minted) = minted else {
            return json!({"authenticated": false, "error": "invalid bearer token"});
        };
        if minted.expires <= clock.now() {
            return json!({"authenticated": false, "error": "invalid bearer token, token has expired"});
        }
        let audiences: Vec<&String> = if wanted.is_empty() {
            minted.req.audiences.iter().collect()
        } else {
            wanted
                .iter()
                .filter(|a| minted.req.audiences.contains(a))
                .collect()
        };
        if audiences.is_empty() {
            return json!({"authenticated": false,
                "error": "invalid bearer token, token audiences is invalid for the target audiences"});
        }
        let r = &minted.req;
        if !r.pod_uid.is_empty() {
            let grace = chrono::Duration::seconds(60);
            let valid = match pod(&r.namespace, &r.pod) {
                Some((uid, deleting)) => {
                    uid == r.pod_uid && deleting.is_none_or(|at| at + grace >= clock.now())
                }
                None => false,
            };
            if !valid {
                return json!({"authenticated": false,
                    "error": "invalid bearer token, Token has been invalidated"});
            }
        }
        let mut extra = json!({
            "authentication.kubernetes.io/credential-id": [format!("JTI={}", &token[token.len().saturating_sub(8)..])]
        });
        // A token bound to no pod (TokenRequest without boundObjectRef) names none, as on kube-apiserver.
        if !r.pod.is_empty() {
            extra["authentication.kubernetes.io/pod-name"] = json!([r.pod]);
        }
        if !r.pod_uid.is_empty() {
            extra["authentication.kubernetes.io/pod-uid"] = json!([r.pod_uid]);
        }
        if !r.node.is_empty() {
            extra["authentication.kubernetes.io/node-name"] = json!([r.node]);
        }
        json!({"authenticated": true, "audiences": audiences, "user": {
        "username": format!("system:serviceaccount:{}:{}", r.namespace, r.service_account),
        "uid": format!("sim-sa-{}-{}", r.namespace, r.service_account),
        "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{}", r.namespace), "system:authenticated"],
        "extra": extra}})
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn req(aud: &[&str], ttl: i64) -> TokenRequest {
        TokenRequest {
            pod: "agent-x".into(),
            node: "n1".into(),
            audiences: aud.iter().map(|s| s.to_string()).collect(),
            namespace: "kube-system".into(),
            service_account: "nodekeeper".into(),
            expiration_seconds: ttl,
            pod_uid: String::new(),
        }
    }

    #[test]
    fn review_table() {
        let clock = SimClock::new(1.0);
        let tokens = Tokens::default();
        let (tok, _) = tokens.mint(&clock, req(&["nodekeeper"], 60));
        let (short, _) = tokens.mint(&clock, req(&[], 10));
        let ok = tokens.review(
            &clock,
            &json!({"spec": {"token": tok, "audiences": ["nodekeeper"]}}),
            &|_, _| None,
        );
        assert_eq!(ok["status"]["authenticated"], true);
        assert_eq!(
            ok["status"]["user"]["extra"]["authentication.kubernetes.io/pod-name"][0],
            "agent-x"
        );
        assert_eq!(
            ok["status"]["user"]["extra"]["authentication.kubernetes.io/node-name"][0],
            "n1"
        );
        assert!(ok["spec"].get("token").is_none());
        let wrong_aud = tokens.review(
            &clock,
            &json!({"spec": {"token": tok, "audiences": ["other"]}}),
            &|_, _| None,
        );
        assert_eq!(wrong_aud["status"]["authenticated"], false);
        let unknown = tokens.review(&clock, &json!({"spec": {"token": "nope"}}), &|_, _| None);
        assert_eq!(unknown["status"]["authenticated"], false);
        let default_aud = tokens.review(&clock, &json!({"spec": {"token": short}}), &|_, _| None);
        assert_eq!(default_aud["status"]["audiences"][0], DEFAULT_AUDIENCE);
        clock.advance(std::time::Duration::from_secs(11));
        let expired = tokens.review(&clock, &json!({"spec": {"token": short}}), &|_, _| None);
        assert_eq!(expired["status"]["authenticated"], false);
        assert!(expired["status"]["error"]
            .as_str()
            .unwrap()
            .contains("expired"));
    }

    #[test]
    fn a_bound_pods_token_lives_no_longer_than_its_pod() {
        let clock = SimClock::new(1.0);
        let tokens = Tokens::default();
        let mut r = req(&["nodekeeper"], 3600);
        r.pod_uid = "u1".into();
        let (tok, _) = tokens.mint(&clock, r);
        let body = json!({"spec": {"token": tok, "audiences": ["nodekeeper"]}});
        let now = clock.now();
        // (the pod as the store has it: uid, terminating since (s); authenticated)
        type Pod<'a> = Option<(&'a str, Option<i64>)>;
        let cases: [(Pod<'_>, bool); 5] = [
            (Some(("u1", None)), true),
            (Some(("u1", Some(-59))), true),
            (Some(("u1", Some(-61))), false),
            (Some(("u2", None)), false),
            (None, false),
        ];
        for (pod, want) in cases {
            let lookup = move |ns: &str, name: &str| {
                assert_eq!((ns, name), ("kube-system", "agent-x"));
                pod.map(|(uid, since)| {
                    (
                        uid.to_string(),
                        since.map(|s| now + chrono::Duration::seconds(s)),
                    )
                })
            };
            let out = tokens.review(&clock, &body, &lookup);
            assert_eq!(out["status"]["authenticated"], want, "{pod:?}: {out}");
            if want {
                assert_eq!(
                    out["status"]["user"]["extra"]["authentication.kubernetes.io/pod-uid"][0],
                    "u1"
                );
            }
        }
    }
}

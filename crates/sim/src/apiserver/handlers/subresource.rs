//! Subresources with their own shapes: `serviceaccounts/token` (TokenRequest) and `/scale`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use super::*;
use crate::apiserver::error::{ApiError, ApiResult};
use crate::apiserver::patch;
use crate::apiserver::resources::{self};
use crate::apiserver::store::WriteTarget;
use crate::apiserver::Sim;

/// `POST …/serviceaccounts/{sa}/token` (TokenRequest): a token of an existing ServiceAccount, bound to
/// a pod of its namespace (and so to the pod's node) when `spec.boundObjectRef` names one, as
/// kube-apiserver mints them; TokenReview then returns the pod and node as `user.extra`.
pub(super) fn token_request(sim: &Sim, ns: &str, sa: &str, req: &Value) -> ApiResult<Value> {
    use k8s_openapi::api::authentication::v1::TokenRequestSpec;
    let accounts = resources::well_known::service_accounts();
    if sim.store.get(accounts, ns, sa).is_none() {
        return Err(ApiError::not_found(accounts, sa));
    }
    let mut spec: TokenRequestSpec =
        serde_json::from_value(req.get("spec").cloned().unwrap_or_else(|| json!({})))
            .map_err(|e| ApiError::bad_request(format!("TokenRequest spec: {e}")))?;
    let (mut pod, mut node, mut pod_uid) = (String::new(), String::new(), String::new());
    if let Some(bound) = &spec.bound_object_ref {
        let kind = bound.kind.as_deref().unwrap_or_default();
        let name = bound.name.as_deref().unwrap_or_default();
        if kind != "Pod" {
            return Err(ApiError::bad_request(format!(
                "cannot bind token to object of kind {kind:?}: the sim binds to pods only"
            )));
        }
        let pods = resources::well_known::pods();
        let obj = sim
            .store
            .get(pods, ns, name)
            .ok_or_else(|| ApiError::not_found(pods, name))?;
        let uid = obj.pointer("/metadata/uid").and_then(Value::as_str);
        if let Some(want) = bound.uid.as_deref() {
            if uid != Some(want) {
                return Err(ApiError::conflict(
                    pods,
                    name,
                    &format!("the UID in the bound object reference ({want}) does not match the UID in record. The object might have been deleted and then recreated"),
                ));
            }
        }
        pod = name.to_string();
        pod_uid = uid.unwrap_or_default().to_string();
        node = obj
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
    }
    let expiration_seconds = *spec.expiration_seconds.get_or_insert(3600);
    let (token, expires) = sim.tokens.mint(
        &sim.store.clock,
        crate::apiserver::auth::TokenRequest {
            pod,
            node,
            audiences: spec.audiences.clone(),
            namespace: ns.to_string(),
            service_account: sa.to_string(),
            expiration_seconds,
            pod_uid,
        },
    );
    Ok(
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "metadata": {"name": sa, "namespace": ns, "creationTimestamp": null},
        "spec": spec, "status": {"token": token, "expirationTimestamp": expires}}),
    )
}

/// The `autoscaling/v1` Scale of a Deployment or ReplicaSet.
pub(super) fn scale_of(obj: &Value) -> Value {
    let meta = |f: &str| obj.pointer(&format!("/metadata/{f}")).cloned();
    json!({"kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": {"name": meta("name"), "namespace": meta("namespace"), "uid": meta("uid"),
            "resourceVersion": meta("resourceVersion"), "creationTimestamp": meta("creationTimestamp")},
        "spec": {"replicas": obj.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1)},
        "status": {"replicas": obj.pointer("/status/replicas").and_then(Value::as_i64).unwrap_or(0),
            "selector": crate::apiserver::table::selector(obj)}})
}

/// `GET`, `PUT` and `PATCH` of `<deployments|replicasets>/<name>/scale` (what `kubectl scale` uses).
pub(super) fn scale(
    sim: &Arc<Sim>,
    method: &str,
    headers: &HeaderMap,
    t: &Target,
    name: &str,
    body: &Bytes,
) -> ApiResult<Response> {
    let res = t.res;
    let current = sim
        .store
        .get(res, &t.ns, name)
        .ok_or_else(|| ApiError::not_found(res, name))?;
    let desired = match method {
        "GET" => return Ok(json_response(StatusCode::OK, &scale_of(&current))),
        "PUT" => parse_body(headers, body)?,
        _ => {
            let (kind, doc) = patch_body(headers, body)?;
            patch::apply(kind, &scale_of(&current), &doc)
                .map_err(|e| ApiError::bad_request(e.to_string()))?
        }
    };
    let replicas = desired
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .filter(|r| *r >= 0)
        .ok_or_else(|| {
            ApiError::invalid(res, name, "spec.replicas", "must be a non-negative integer")
        })?;
    let rv = desired
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .filter(|v| !v.is_empty())
        .map(str::to_string);
    let out = sim.store.txn(|tx| {
        tx.modify(res, &t.ns, name, WriteTarget::Main, |o| {
            let mut o = o.clone();
            o["spec"]["replicas"] = json!(replicas);
            if let Some(rv) = &rv {
                o["metadata"]["resourceVersion"] = json!(rv);
            }
            Ok(o)
        })
    })?;
    Ok(json_response(StatusCode::OK, &scale_of(&out)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn scale_of_a_deployment() {
        let d = json!({"metadata": {"name": "web", "namespace": "a", "resourceVersion": "7"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"tier": "x", "app": "web"}}},
            "status": {"replicas": 2}});
        let s = scale_of(&d);
        assert_eq!(s["kind"], "Scale");
        assert_eq!(s["apiVersion"], "autoscaling/v1");
        assert_eq!(s["spec"]["replicas"], 3);
        assert_eq!(
            s["status"],
            json!({"replicas": 2, "selector": "app=web,tier=x"})
        );
        assert_eq!(s["metadata"]["resourceVersion"], "7");
    }
}

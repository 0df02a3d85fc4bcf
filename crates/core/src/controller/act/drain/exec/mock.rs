//! A kube client over a scripted apiserver, and the Status bodies the drain tests answer with.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use serde_json::json;

/// A kube client whose apiserver answers each request with `answer(method, path)`, and the
/// requests it saw.
pub(super) fn mock(
    answer: impl Fn(&str, &str) -> (u16, serde_json::Value) + Send + Sync + 'static,
) -> (Client, Arc<Mutex<Vec<String>>>) {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = seen.clone();
    let answer = Arc::new(answer);
    let svc = tower::service_fn(move |req: hyper::Request<kube::client::Body>| {
        let (method, path) = (req.method().to_string(), req.uri().path().to_string());
        log.lock().unwrap().push(format!("{method} {path}"));
        let (code, body) = answer(&method, &path);
        async move {
            hyper::Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
        }
    });
    (Client::new(svc, "default"), seen)
}

pub(super) fn pod(uid: &str) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": "web-1", "namespace": "shop", "uid": uid}}))
        .unwrap()
}

pub(super) fn status(
    code: u16,
    reason: &str,
    message: &str,
    causes: serde_json::Value,
) -> serde_json::Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
        "details": {"name": "web-1", "kind": "pods", "causes": causes}})
}

pub(super) const EVICT: &str = "/api/v1/namespaces/shop/pods/web-1/eviction";
pub(super) const GET: &str = "/api/v1/namespaces/shop/pods/web-1";

/// The real apiserver's 409 when its retries on the pod's resourceVersion give up.
pub(super) fn conflict() -> serde_json::Value {
    status(409, "Conflict", "Operation cannot be fulfilled on pods \"web-1\": the object has been modified; please apply your changes to the latest version and try again", json!([]))
}

/// NamespaceLifecycle's refusal (staging/src/k8s.io/apiserver/pkg/admission/plugin/namespace/lifecycle).
pub(super) fn terminating() -> serde_json::Value {
    status(403, "Forbidden",
        "pods \"web-1\" is forbidden: unable to create new content in namespace shop because it is being terminated",
        json!([{"reason": "NamespaceTerminating", "message": "namespace shop is being terminated", "field": "metadata.namespace"}]))
}

//! HTTP handlers of the Kubernetes API: routing by path (this file), then CRUD and patch
//! (`crud.rs`), subresources — TokenRequest and scale (`subresource.rs`) — and watch streaming
//! (`watch.rs`). Eviction is `../eviction.rs`, TokenReview `../auth.rs`.

mod crud;
mod subresource;
mod watch;

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::error::{ApiError, ApiResult};
use super::resources::{self, ResourceDef};
use super::store::WriteTarget;
use super::{openapi, Sim};
use crud::*;
use subresource::*;
use watch::*;

/// Largest accepted request body.
pub const BODY_LIMIT: usize = 3 * 1024 * 1024;

/// A parsed resource request path.
#[derive(Debug)]
struct Target {
    res: &'static ResourceDef,
    /// Namespace from the URL ("" when none).
    ns: String,
    name: Option<String>,
    sub: Option<String>,
}

enum Route {
    Json(Value),
    RawJson(Bytes),
    Text(&'static str),
    Resource(Target),
}

/// Renders an error as a `Status` response.
pub fn error_response(e: &ApiError) -> Response {
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(code, &e.to_status())
}

/// A JSON response.
pub fn json_response(code: StatusCode, v: &Value) -> Response {
    let body = serde_json::to_vec(v).unwrap_or_default();
    (code, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// A JSON response from already serialized bytes.
fn raw_json_response(code: StatusCode, body: Bytes) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Fallback handler for everything that is not the admin API.
pub async fn api(State(sim): State<Arc<Sim>>, req: Request) -> Response {
    match handle(&sim, req).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

async fn handle(sim: &Arc<Sim>, req: Request) -> ApiResult<Response> {
    let path = req.uri().path().to_string();
    let route = route(&path, &sim.server_addr())?;
    let target = match route {
        Route::Json(v) => return Ok(json_response(StatusCode::OK, &v)),
        Route::RawJson(b) => return Ok(raw_json_response(StatusCode::OK, b)),
        Route::Text(t) => return Ok((StatusCode::OK, t).into_response()),
        Route::Resource(t) => t,
    };
    sim.faults.before_request().await?;
    let query = axum::extract::Query::<HashMap<String, String>>::try_from_uri(req.uri())
        .map(|q| q.0)
        .map_err(|e| ApiError::bad_request(format!("invalid query string: {e}")))?;
    if query.get("dryRun").is_some_and(|v| !v.is_empty()) {
        return Err(ApiError::bad_request(
            "dryRun is not supported by nodekeeper sim",
        ));
    }
    let method = req.method().clone();
    let headers = req.headers().clone();
    let body = axum::body::to_bytes(req.into_body(), BODY_LIMIT)
        .await
        .map_err(|_| {
            ApiError::new(
                413,
                "RequestEntityTooLarge",
                format!("the request body is larger than {BODY_LIMIT} bytes"),
            )
        })?;
    dispatch(sim, &method, &headers, &query, target, &body).await
}

fn route(path: &str, server: &str) -> ApiResult<Route> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let not_found = || {
        ApiError::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    };
    match segs.as_slice() {
        ["version"] => Ok(Route::Json(
            json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-nodekeeper-sim",
            "gitCommit": "sim", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
            "goVersion": "none", "compiler": "rustc", "platform": "linux/amd64"}),
        )),
        ["healthz"] | ["readyz"] | ["livez"] => Ok(Route::Text("ok")),
        ["api"] => Ok(Route::Json(resources::api_versions(server))),
        ["api", "v1"] => resources::api_resource_list("", "v1")
            .map(Route::Json)
            .ok_or_else(not_found),
        ["apis"] => Ok(Route::Json(resources::api_group_list())),
        ["apis", g] => resources::api_group(g)
            .map(Route::Json)
            .ok_or_else(not_found),
        ["apis", g, v] => resources::api_resource_list(g, v)
            .map(Route::Json)
            .ok_or_else(not_found),
        ["api", "v1", rest @ ..] => target("", "v1", rest)
            .map(Route::Resource)
            .ok_or_else(not_found),
        ["apis", g, v, rest @ ..] => target(g, v, rest)
            .map(Route::Resource)
            .ok_or_else(not_found),
        ["openapi", "v3"] => Ok(Route::Json(openapi::get().index())),
        ["openapi", "v3", rest @ ..] => openapi::get()
            .document(&rest.join("/"))
            .map(Route::RawJson)
            .ok_or_else(not_found),
        _ => Err(not_found()),
    }
}

fn target(group: &str, version: &str, rest: &[&str]) -> Option<Target> {
    let mk = |plural: &str, ns: &str, name: Option<&&str>, sub: Option<&&str>| {
        let res = resources::find(group, version, plural)?;
        if res.namespaced == ns.is_empty() && !(res.namespaced && name.is_none()) {
            return None;
        }
        // Unknown subresources are 404, as on kube-apiserver (kubectl reads 404 as "not served").
        match sub.copied() {
            None => {}
            Some("status") if res.has_status => {}
            Some("eviction") if res.plural == "pods" && res.group.is_empty() => {}
            Some("token") if res.plural == "serviceaccounts" && res.group.is_empty() => {}
            Some("scale") if resources::has_scale(res) => {}
            Some(_) => return None,
        }
        Some(Target {
            res,
            ns: ns.to_string(),
            name: name.map(|s| s.to_string()),
            sub: sub.map(|s| s.to_string()),
        })
    };
    match rest {
        ["namespaces", ns, plural, more @ ..]
            if resources::find(group, version, plural).is_some_and(|r| r.namespaced) =>
        {
            if more.len() > 2 {
                return None;
            }
            mk(plural, ns, more.first(), more.get(1))
        }
        [plural, more @ ..] if more.len() <= 2 => mk(plural, "", more.first(), more.get(1)),
        _ => None,
    }
}

async fn dispatch(
    sim: &Arc<Sim>,
    method: &Method,
    headers: &HeaderMap,
    query: &HashMap<String, String>,
    t: Target,
    body: &Bytes,
) -> ApiResult<Response> {
    let res = t.res;
    match (method.as_str(), t.name.as_deref(), t.sub.as_deref()) {
        ("GET", None, None) => {
            let filter = filter_from(res, &t.ns, query)?;
            if query.get("watch").is_some_and(|w| w == "true" || w == "1") {
                return watch(sim, res, filter, query, Render::of(headers));
            }
            list(sim, res, &filter, query, Render::of(headers))
        }
        ("GET", Some(name), None | Some("status")) => {
            let obj = sim
                .store
                .get_stored(res, &t.ns, name)
                .ok_or_else(|| ApiError::not_found(res, name))?;
            let render = Render::of(headers);
            if render == Render::Metadata {
                return Ok(json_response(StatusCode::OK, &partial(&obj.value())));
            }
            if render == Render::Table && super::table::supported(res.kind) {
                let meta = json!({"resourceVersion": sim.store.resource_version().to_string()});
                let t = super::table::render(
                    res.kind,
                    std::iter::once(&obj.value()),
                    meta,
                    sim.store.clock.now(),
                );
                return Ok(json_response(StatusCode::OK, &t));
            }
            Ok(raw_json_response(StatusCode::OK, obj.raw().clone()))
        }
        ("POST", None, None) if res.virtual_create => {
            let pods = super::resources::well_known::pods();
            let lookup = |ns: &str, name: &str| {
                let pod = sim.store.get(pods, ns, name)?;
                let uid = pod.pointer("/metadata/uid")?.as_str()?.to_string();
                let deleting = pod
                    .pointer("/metadata/deletionTimestamp")
                    .and_then(Value::as_str)
                    .and_then(super::clock::parse_time);
                Some((uid, deleting))
            };
            let review = sim
                .tokens
                .review(&sim.store.clock, &parse_body(headers, body)?, &lookup);
            Ok(json_response(StatusCode::CREATED, &review))
        }
        ("POST", None, None) => {
            let mut obj = parse_body(headers, body)?;
            let warnings = admit(res, &mut obj, None, query)?;
            let created = sim.store.txn(|tx| tx.create(res, &t.ns, obj))?;
            Ok(with_warnings(
                json_response(StatusCode::CREATED, &created),
                &warnings,
            ))
        }
        ("POST", Some(name), Some("eviction")) if res.kind == "Pod" => {
            let ev = parse_body(headers, body)?;
            let status = sim
                .store
                .txn(|tx| super::eviction::evict(tx, &t.ns, name, &ev))?;
            Ok(json_response(StatusCode::CREATED, &status))
        }
        ("POST", Some(name), Some("token")) if res.kind == "ServiceAccount" => {
            let req = parse_body(headers, body)?;
            let out = token_request(sim, &t.ns, name, &req)?;
            Ok(json_response(StatusCode::CREATED, &out))
        }
        ("PUT", Some(name), sub @ (None | Some("status"))) => {
            let mut obj = parse_body(headers, body)?;
            let target = if sub.is_some() {
                WriteTarget::Status
            } else {
                WriteTarget::Main
            };
            let old = sim.store.get(res, &t.ns, name);
            let warnings = admit(res, &mut obj, old.as_deref(), query)?;
            let out = sim
                .store
                .txn(|tx| tx.update(res, &t.ns, name, obj, target))?;
            Ok(with_warnings(
                json_response(StatusCode::OK, &out),
                &warnings,
            ))
        }
        (m @ ("GET" | "PUT" | "PATCH"), Some(name), Some("scale")) => {
            scale(sim, m, headers, &t, name, body)
        }
        ("PATCH", Some(name), sub @ (None | Some("status"))) => {
            patch_object(sim, headers, query, &t, name, sub.is_some(), body)
        }
        ("DELETE", Some(name), None) => {
            let opts = delete_options(query, headers, body)?;
            let out = sim.store.txn(|tx| tx.delete(res, &t.ns, name, &opts))?;
            Ok(json_response(StatusCode::OK, &out))
        }
        ("DELETE", None, None) => delete_collection(sim, res, &t.ns, query, headers, body),
        (m, _, sub) => Err(ApiError::method_not_allowed(format!(
            "{m} is not supported on {}{}",
            res.qualified(),
            sub.map(|s| format!("/{s}")).unwrap_or_default()
        ))),
    }
}

/// How a read answers: the `as=` of its Accept header, as kube-apiserver reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Render {
    /// The objects themselves.
    Object,
    /// A `meta.k8s.io/v1` Table (`as=Table`; kinds without columns are answered as objects).
    Table,
    /// `meta.k8s.io/v1` PartialObjectMetadata (`as=PartialObjectMetadata` or `…List`): the
    /// metadata alone, what kube-rs's `metadata_watcher` and client-go's metadata informers ask for.
    Metadata,
}

impl Render {
    fn of(headers: &HeaderMap) -> Render {
        let accept = headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if super::table::wanted(accept) {
            Render::Table
        } else if accept.contains("as=PartialObjectMetadata") {
            Render::Metadata
        } else {
            Render::Object
        }
    }
}

/// An object as `meta.k8s.io/v1` PartialObjectMetadata.
pub(super) fn partial(obj: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({}))})
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let r = |p: &str| match route(p, "x").unwrap() {
            Route::Resource(t) => (t.res.plural, t.ns, t.name, t.sub),
            _ => panic!("{p} is not a resource route"),
        };
        assert_eq!(r("/api/v1/nodes"), ("nodes", String::new(), None, None));
        assert_eq!(r("/api/v1/nodes/n1/status").3.as_deref(), Some("status"));
        assert_eq!(r("/api/v1/pods"), ("pods", String::new(), None, None));
        assert_eq!(
            r("/api/v1/namespaces/default/pods/p/eviction").3.as_deref(),
            Some("eviction")
        );
        assert_eq!(r("/api/v1/namespaces/kube-system").0, "namespaces");
        assert_eq!(
            r("/api/v1/namespaces/kube-system/status").3.as_deref(),
            Some("status")
        );
        assert_eq!(
            r("/apis/apps/v1/namespaces/a/daemonsets/d").2.as_deref(),
            Some("d")
        );
        assert!(
            route("/api/v1/pods/p", "x").is_err(),
            "namespaced object without namespace"
        );
        assert!(
            route("/api/v1/namespaces/a/nodes", "x").is_err(),
            "unknown subresources are 404"
        );
        assert!(route("/api/v1/namespaces/a/resourcequotas", "x").is_ok());
        assert!(route("/api/v1/nodes/n1/eviction", "x").is_err());
        assert!(matches!(route("/openapi/v3", "x"), Ok(Route::Json(_))));
        assert!(matches!(
            route("/openapi/v3/apis/apps/v1", "x"),
            Ok(Route::RawJson(_))
        ));
        assert!(route("/openapi/v3/apis/nope/v1", "x").is_err());
        assert_eq!(
            r("/apis/apps/v1/namespaces/a/deployments/d/scale")
                .3
                .as_deref(),
            Some("scale")
        );
        assert!(route("/apis/apps/v1/namespaces/a/daemonsets/d/scale", "x").is_err());
        assert!(route("/apis/nope/v1/things", "x").is_err());
        assert!(matches!(route("/apis", "x"), Ok(Route::Json(_))));
    }
}

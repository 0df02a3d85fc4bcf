//! HTTP handlers of the Kubernetes API: routing by path, CRUD, patch, watch, eviction, TokenReview.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;

use super::error::{ApiError, ApiResult};
use super::patch::{self, PatchType};
use super::resources::{self, ResourceDef};
use super::selectors::{FieldSelector, LabelSelector};
use super::store::{DeleteOptions, EventType, Filter, Key, WatchEvent, WatchFrom, WriteTarget};
use super::validation::{self, Mode};
use super::{openapi, protobuf, Sim};

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
                return watch(sim, res, filter, query, as_table(headers));
            }
            list(sim, res, &filter, query, as_table(headers))
        }
        ("GET", Some(name), None | Some("status")) => {
            let obj = sim
                .store
                .get_stored(res, &t.ns, name)
                .ok_or_else(|| ApiError::not_found(res, name))?;
            if as_table(headers) && super::table::supported(res.kind) {
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
            let review = sim
                .tokens
                .review(&sim.store.clock, &parse_body(headers, body)?);
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

fn as_table(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(super::table::wanted)
}

/// `POST …/serviceaccounts/{sa}/token` (TokenRequest): a token of an existing ServiceAccount, bound to
/// a pod of its namespace (and so to the pod's node) when `spec.boundObjectRef` names one, as
/// kube-apiserver mints them; TokenReview then returns the pod and node as `user.extra`.
fn token_request(sim: &Sim, ns: &str, sa: &str, req: &Value) -> ApiResult<Value> {
    use k8s_openapi::api::authentication::v1::TokenRequestSpec;
    let accounts = resources::well_known::service_accounts();
    if sim.store.get(accounts, ns, sa).is_none() {
        return Err(ApiError::not_found(accounts, sa));
    }
    let mut spec: TokenRequestSpec =
        serde_json::from_value(req.get("spec").cloned().unwrap_or_else(|| json!({})))
            .map_err(|e| ApiError::bad_request(format!("TokenRequest spec: {e}")))?;
    let (mut pod, mut node) = (String::new(), String::new());
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
        node = obj
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
    }
    let expiration_seconds = *spec.expiration_seconds.get_or_insert(3600);
    let (token, expires) = sim.tokens.mint(
        &sim.store.clock,
        super::auth::TokenRequest {
            pod,
            node,
            audiences: spec.audiences.clone(),
            namespace: ns.to_string(),
            service_account: sa.to_string(),
            expiration_seconds,
        },
    );
    Ok(
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "metadata": {"name": sa, "namespace": ns, "creationTimestamp": null},
        "spec": spec, "status": {"token": token, "expirationTimestamp": expires}}),
    )
}

fn parse_body(headers: &HeaderMap, body: &Bytes) -> ApiResult<Value> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    if protobuf::is_protobuf(ct) {
        if body.is_empty() {
            return Err(ApiError::bad_request("the request body is empty"));
        }
        return protobuf::decode(body).map_err(|e| ApiError::bad_request(e.to_string()));
    }
    parse_doc(ct.contains("yaml"), body)
}

/// Server-side field validation of a write (`fieldValidation`); returns the warnings to send.
/// An object of another kind is left to the store, which refuses it.
fn admit(
    res: &ResourceDef,
    obj: &mut Value,
    before: Option<&Value>,
    q: &HashMap<String, String>,
) -> ApiResult<Vec<String>> {
    let mode = Mode::parse(q.get("fieldValidation").map(String::as_str))?;
    if obj
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|k| k != res.kind)
    {
        return Ok(Vec::new());
    }
    validation::admit(openapi::get(), res, obj, before, mode)
}

/// Adds a `Warning` header per warning (kubectl prints them as `Warning: ...`).
fn with_warnings(mut resp: Response, warnings: &[String]) -> Response {
    for w in validation::warning_headers(warnings) {
        if let Ok(v) = axum::http::HeaderValue::from_str(&w) {
            resp.headers_mut().append(header::WARNING, v);
        }
    }
    resp
}

fn parse_doc(yaml: bool, body: &Bytes) -> ApiResult<Value> {
    if body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    let v: Value = if yaml {
        serde_yaml::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid YAML body: {e}")))?
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?
    };
    Ok(v)
}

fn filter_from(res: &ResourceDef, ns: &str, q: &HashMap<String, String>) -> ApiResult<Filter> {
    let labels = LabelSelector::parse(
        q.get("labelSelector")
            .map(String::as_str)
            .unwrap_or_default(),
    )
    .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let fields = FieldSelector::parse(
        q.get("fieldSelector")
            .map(String::as_str)
            .unwrap_or_default(),
        res.kind,
    )
    .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let namespace = (!ns.is_empty()).then(|| ns.to_string());
    Ok(Filter {
        namespace,
        labels,
        fields,
    })
}

fn encode_continue(k: &Key) -> String {
    let raw = serde_json::to_vec(&[&k.0, &k.1]).unwrap_or_default();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

fn decode_continue(s: &str) -> ApiResult<Key> {
    let bad = || ApiError::bad_request(format!("invalid continue token {s:?}"));
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|_| bad())?;
    let [ns, name]: [String; 2] = serde_json::from_slice(&raw).map_err(|_| bad())?;
    Ok((ns, name))
}

fn list(
    sim: &Arc<Sim>,
    res: &ResourceDef,
    filter: &Filter,
    q: &HashMap<String, String>,
    as_table: bool,
) -> ApiResult<Response> {
    let limit = match q.get("limit") {
        Some(l) => Some(
            l.parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
        ),
        None => None,
    };
    let after = q
        .get("continue")
        .filter(|c| !c.is_empty())
        .map(|c| decode_continue(c))
        .transpose()?;
    let page = sim.store.list_stored(res, filter, after.as_ref(), limit);
    let mut meta = json!({"resourceVersion": page.rv.to_string()});
    if let Some(next) = &page.next {
        meta["continue"] = json!(encode_continue(next));
    }
    if as_table && super::table::supported(res.kind) {
        let items: Vec<Value> = page.items.iter().map(|i| i.value()).collect();
        let t = super::table::render(res.kind, items.iter(), meta, sim.store.clock.now());
        return Ok(json_response(StatusCode::OK, &t));
    }
    let size: usize = page.items.iter().map(|i| i.raw().len() + 1).sum();
    let mut out = Vec::with_capacity(256 + size);
    let head = json!({"kind": format!("{}List", res.kind), "apiVersion": res.api_version(), "metadata": meta});
    let head = serde_json::to_string(&head).map_err(|e| ApiError::internal(e.to_string()))?;
    out.extend_from_slice(&head.as_bytes()[..head.len() - 1]);
    out.extend_from_slice(b",\"items\":[");
    for (i, item) in page.items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item.raw());
    }
    out.extend_from_slice(b"]}");
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        out,
    )
        .into_response())
}

fn patch_object(
    sim: &Arc<Sim>,
    headers: &HeaderMap,
    q: &HashMap<String, String>,
    t: &Target,
    name: &str,
    status: bool,
    body: &Bytes,
) -> ApiResult<Response> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let kind = PatchType::from_content_type(ct).ok_or_else(|| {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format: {ct:?}"),
        )
    })?;
    let doc = parse_doc(kind == PatchType::Apply, body)?;
    let res = t.res;
    let target = if status {
        WriteTarget::Status
    } else {
        WriteTarget::Main
    };
    if kind == PatchType::Apply {
        if q.get("fieldManager").is_none_or(|f| f.is_empty()) {
            return Err(ApiError::bad_request(
                "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
            ));
        }
        if sim.store.get(res, &t.ns, name).is_none() && !status {
            let mut obj = doc;
            if !obj.get("metadata").is_some_and(Value::is_object) {
                obj["metadata"] = json!({});
            }
            obj["metadata"]["name"] = json!(name);
            let warnings = admit(res, &mut obj, None, q)?;
            let created = sim.store.txn(|tx| tx.create(res, &t.ns, obj))?;
            return Ok(with_warnings(
                json_response(StatusCode::CREATED, &created),
                &warnings,
            ));
        }
    }
    let mut warnings = Vec::new();
    let out = sim.store.txn(|tx| {
        tx.modify(res, &t.ns, name, target, |old| {
            let mut new = patch::apply(kind, old, &doc).map_err(|e| match e {
                patch::PatchError::Malformed { .. } => ApiError::bad_request(e.to_string()),
                patch::PatchError::DoesNotApply { .. } => {
                    ApiError::new(422, "Invalid", e.to_string())
                }
            })?;
            warnings = admit(res, &mut new, Some(old), q)?;
            Ok(new)
        })
    })?;
    Ok(with_warnings(
        json_response(StatusCode::OK, &out),
        &warnings,
    ))
}

/// The `autoscaling/v1` Scale of a Deployment or ReplicaSet.
fn scale_of(obj: &Value) -> Value {
    let mut sel: Vec<String> = obj
        .pointer("/spec/selector/matchLabels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    sel.sort();
    let meta = |f: &str| obj.pointer(&format!("/metadata/{f}")).cloned();
    json!({"kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": {"name": meta("name"), "namespace": meta("namespace"), "uid": meta("uid"),
            "resourceVersion": meta("resourceVersion"), "creationTimestamp": meta("creationTimestamp")},
        "spec": {"replicas": obj.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1)},
        "status": {"replicas": obj.pointer("/status/replicas").and_then(Value::as_i64).unwrap_or(0),
            "selector": sel.join(",")}})
}

/// `GET`, `PUT` and `PATCH` of `<deployments|replicasets>/<name>/scale` (what `kubectl scale` uses).
fn scale(
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
            let ct = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let kind = PatchType::from_content_type(ct).ok_or_else(|| {
                ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!("the body of the request was in an unknown format: {ct:?}"),
                )
            })?;
            let doc = parse_doc(kind == PatchType::Apply, body)?;
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

fn delete_options(
    q: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &Bytes,
) -> ApiResult<DeleteOptions> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let b: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else if protobuf::is_protobuf(ct) {
        protobuf::decode(body)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
    };
    let grace = match q.get("gracePeriodSeconds") {
        Some(g) => Some(
            g.parse::<i64>()
                .map_err(|_| ApiError::bad_request(format!("invalid gracePeriodSeconds {g:?}")))?,
        ),
        None => b.get("gracePeriodSeconds").and_then(Value::as_i64),
    };
    let s = |p: &str| b.pointer(p).and_then(Value::as_str).map(str::to_string);
    Ok(DeleteOptions {
        grace_seconds: grace,
        uid: s("/preconditions/uid"),
        resource_version: s("/preconditions/resourceVersion"),
    })
}

fn delete_collection(
    sim: &Arc<Sim>,
    res: &'static ResourceDef,
    ns: &str,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &Bytes,
) -> ApiResult<Response> {
    let filter = filter_from(res, ns, q)?;
    let opts = delete_options(q, headers, body)?;
    let page = sim.store.list(res, &filter, None, None);
    let mut deleted = Vec::new();
    sim.store.txn(|tx| {
        for obj in &page.items {
            let n = obj
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let name = obj
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if let Ok(o) = tx.delete(res, n, name, &opts) {
                deleted.push((*o).clone());
            }
        }
    });
    let out = json!({"kind": format!("{}List", res.kind), "apiVersion": res.api_version(),
        "metadata": {"resourceVersion": sim.store.resource_version().to_string()}, "items": deleted});
    Ok(json_response(StatusCode::OK, &out))
}

/// Maps a raw event onto what a filtered watcher sees (selectors can turn MODIFIED into ADDED/DELETED).
fn visible(ev: &WatchEvent, filter: &Filter) -> Option<EventType> {
    if !filter.in_namespace(&ev.object) {
        return None;
    }
    let now = filter.matches_stored(&ev.object);
    match ev.kind {
        EventType::Added | EventType::Deleted => now.then_some(ev.kind),
        EventType::Modified => {
            let before = ev.prev.as_ref().is_some_and(|p| filter.matches_stored(p));
            match (before, now) {
                (true, true) => Some(EventType::Modified),
                (false, true) => Some(EventType::Added),
                (true, false) => Some(EventType::Deleted),
                (false, false) => None,
            }
        }
    }
}

fn event_line(kind: &str, obj: &Value) -> Bytes {
    // Serializing a `Value` cannot fail.
    let raw = serde_json::to_vec(obj).unwrap_or_else(|_| b"null".to_vec());
    event_line_raw(kind, &raw)
}

/// A watch event line around an already serialized object.
fn event_line_raw(kind: &str, raw: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(raw.len() + 32);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(raw);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

fn bookmark(res: &ResourceDef, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    event_line(
        "BOOKMARK",
        &json!({"kind": res.kind, "apiVersion": res.api_version(), "metadata": meta}),
    )
}

fn watch(
    sim: &Arc<Sim>,
    res: &'static ResourceDef,
    filter: Filter,
    q: &HashMap<String, String>,
    as_table: bool,
) -> ApiResult<Response> {
    let initial = q.get("sendInitialEvents").is_some_and(|v| v == "true");
    let rv = q
        .get("resourceVersion")
        .map(String::as_str)
        .unwrap_or_default();
    let from = match rv {
        _ if initial => WatchFrom::Current,
        "" | "0" => WatchFrom::Current,
        n => WatchFrom::After(
            n.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {n:?}")))?,
        ),
    };
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap_or(1800)
        .min(3600);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(256);
    let table = as_table && super::table::supported(res.kind);
    let clock = sim.store.clock.clone();
    let render = move |k: EventType, ev: &WatchEvent| {
        if table {
            let meta = json!({"resourceVersion": ev.rv.to_string()});
            let obj = ev.object.value();
            let t = super::table::render(res.kind, std::iter::once(&obj), meta, clock.now());
            event_line(k.as_str(), &t)
        } else {
            event_line_raw(k.as_str(), ev.object.raw())
        }
    };
    let start = sim.store.watch(res, &filter, from);
    let mut epoch = sim.watch_epoch();
    tokio::spawn(async move {
        let (backlog, mut live, mut seen) = match start {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.send(event_line("ERROR", &e.to_status())).await;
                return;
            }
        };
        for ev in &backlog {
            if let Some(k) = visible(ev, &filter) {
                if tx.send(render(k, ev)).await.is_err() {
                    return;
                }
            }
        }
        if initial && tx.send(bookmark(res, seen, true)).await.is_err() {
            return;
        }
        let deadline = tokio::time::sleep(Duration::from_secs(timeout));
        tokio::pin!(deadline);
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        tick.tick().await;
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                _ = epoch.changed() => return,
                _ = tick.tick() => {
                    if bookmarks && tx.send(bookmark(res, seen, false)).await.is_err() {
                        return;
                    }
                    if tx.is_closed() {
                        return;
                    }
                }
                ev = live.recv() => match ev {
                    Ok(ev) => {
                        seen = seen.max(ev.rv);
                        if ev.res != res.index() {
                            continue;
                        }
                        if let Some(k) = visible(&ev, &filter) {
                            if tx.send(render(k, &ev)).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(RecvError::Lagged(_)) | Err(RecvError::Closed) => return,
                },
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<Bytes, std::convert::Infallible>(b), rx))
    });
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-cache, private"),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::apiserver::object::StoredObject;

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

    #[test]
    fn selector_transitions_in_watches() {
        let f = Filter {
            labels: LabelSelector::parse("app=web").unwrap(),
            ..Default::default()
        };
        let obj = |app: &str| {
            Arc::new(StoredObject::new(
                &json!({"metadata": {"name": "p", "namespace": "a", "labels": {"app": app}}}),
            ))
        };
        let ev = |kind, now: &str, prev: Option<&str>| WatchEvent {
            res: 1,
            kind,
            rv: 5,
            object: obj(now),
            prev: prev.map(obj),
        };
        use EventType::*;
        let cases = [
            (ev(Added, "web", None), Some(Added)),
            (ev(Added, "db", None), None),
            (ev(Modified, "web", Some("web")), Some(Modified)),
            (ev(Modified, "web", Some("db")), Some(Added)),
            (ev(Modified, "db", Some("web")), Some(Deleted)),
            (ev(Modified, "db", Some("db")), None),
            (ev(Deleted, "web", None), Some(Deleted)),
        ];
        for (e, want) in cases {
            assert_eq!(
                visible(&e, &f),
                want,
                "{:?} {:?} prev {:?}",
                e.kind,
                e.object,
                e.prev
            );
        }
        let other_ns = Filter {
            namespace: Some("b".into()),
            ..Default::default()
        };
        assert_eq!(visible(&ev(Added, "web", None), &other_ns), None);
    }

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

    #[test]
    fn continue_tokens_roundtrip_and_reject_garbage() {
        let k = ("ns".to_string(), "name".to_string());
        assert_eq!(decode_continue(&encode_continue(&k)).unwrap(), k);
        assert_eq!(decode_continue("!!!").unwrap_err().code, 400);
    }
}

//! Create, read, update, delete, list and patch of stored objects: bodies, admission, paging.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{json, Value};

use super::*;
use crate::apiserver::error::{ApiError, ApiResult};
use crate::apiserver::patch::{self, PatchType};
use crate::apiserver::resources::ResourceDef;
use crate::apiserver::selectors::{FieldSelector, LabelSelector};
use crate::apiserver::store::{DeleteOptions, Filter, Key, WriteTarget};
use crate::apiserver::validation::{self, Mode};
use crate::apiserver::{openapi, protobuf, Sim};

pub(super) fn parse_body(headers: &HeaderMap, body: &Bytes) -> ApiResult<Value> {
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
pub(super) fn admit(
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
pub(super) fn with_warnings(mut resp: Response, warnings: &[String]) -> Response {
    for w in validation::warning_headers(warnings) {
        if let Ok(v) = axum::http::HeaderValue::from_str(&w) {
            resp.headers_mut().append(header::WARNING, v);
        }
    }
    resp
}

pub(super) fn parse_doc(yaml: bool, body: &Bytes) -> ApiResult<Value> {
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

pub(super) fn filter_from(
    res: &ResourceDef,
    ns: &str,
    q: &HashMap<String, String>,
) -> ApiResult<Filter> {
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

pub(super) fn encode_continue(k: &Key) -> String {
    let raw = serde_json::to_vec(&[&k.0, &k.1]).unwrap_or_default();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

pub(super) fn decode_continue(s: &str) -> ApiResult<Key> {
    let bad = || ApiError::bad_request(format!("invalid continue token {s:?}"));
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|_| bad())?;
    let [ns, name]: [String; 2] = serde_json::from_slice(&raw).map_err(|_| bad())?;
    Ok((ns, name))
}

pub(super) fn list(
    sim: &Arc<Sim>,
    res: &ResourceDef,
    filter: &Filter,
    q: &HashMap<String, String>,
    render: Render,
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
    if render == Render::Metadata {
        let items: Vec<Value> = page.items.iter().map(|i| partial(&i.value())).collect();
        let list = json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
            "metadata": meta, "items": items});
        return Ok(json_response(StatusCode::OK, &list));
    }
    if render == Render::Table && crate::apiserver::table::supported(res.kind) {
        let items: Vec<Value> = page.items.iter().map(|i| i.value()).collect();
        let t =
            crate::apiserver::table::render(res.kind, items.iter(), meta, sim.store.clock.now());
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

/// A PATCH request's type (from its Content-Type) and its parsed body.
pub(super) fn patch_body(headers: &HeaderMap, body: &Bytes) -> ApiResult<(PatchType, Value)> {
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
    Ok((kind, parse_doc(kind == PatchType::Apply, body)?))
}

pub(super) fn patch_object(
    sim: &Arc<Sim>,
    headers: &HeaderMap,
    q: &HashMap<String, String>,
    t: &Target,
    name: &str,
    status: bool,
    body: &Bytes,
) -> ApiResult<Response> {
    let (kind, doc) = patch_body(headers, body)?;
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

pub(super) fn delete_options(
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

pub(super) fn delete_collection(
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_roundtrip_and_reject_garbage() {
        let k = ("ns".to_string(), "name".to_string());
        assert_eq!(decode_continue(&encode_continue(&k)).unwrap(), k);
        assert_eq!(decode_continue("!!!").unwrap_err().code, 400);
    }
}

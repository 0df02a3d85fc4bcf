//! Server-side field validation (`fieldValidation=Strict|Warn|Ignore`), against the kinds' OpenAPI
//! schemas ([`super::openapi`]).
//!
//! Like kube-apiserver decoding into Go structs: fields the schema does not have are dropped from
//! what is stored; with `Strict` they fail the request (400, `strict decoding error: unknown field
//! "spec.x"`), with `Warn` (the default) each one is a `Warning` response header. A value of the
//! wrong JSON type (a string for `replicas`) fails the request whatever the mode. Kinds without a
//! schema (NodeClaim) keep every field.

use serde_json::Value;

use super::error::{ApiError, ApiResult};
use super::openapi::OpenApi;
use super::resources::ResourceDef;

/// The `fieldValidation` query parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Drop unknown fields silently.
    Ignore,
    /// Drop unknown fields and warn about each (the server default).
    #[default]
    Warn,
    /// Fail on unknown fields.
    Strict,
}

impl Mode {
    /// Parses the query parameter (absent or empty: `Warn`).
    pub fn parse(v: Option<&str>) -> ApiResult<Self> {
        match v.unwrap_or_default() {
            "" | "Warn" => Ok(Mode::Warn),
            "Ignore" => Ok(Mode::Ignore),
            "Strict" => Ok(Mode::Strict),
            other => Err(ApiError::bad_request(format!(
                "fieldValidation {other:?} is invalid: valid values are Ignore, Warn, Strict"
            ))),
        }
    }
}

/// What a check found: unknown field paths and type errors.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Findings {
    /// `spec.template.spec.containers[0].imagee`
    pub unknown: Vec<String>,
    /// `json: cannot unmarshal string into Go struct field DeploymentSpec.spec.replicas of type int32`
    pub type_errors: Vec<String>,
}

/// Checks `obj` against the kind's schema and drops unknown fields from it. `None`: no schema.
pub fn check(api: &OpenApi, res: &ResourceDef, obj: &mut Value) -> Option<Findings> {
    let root = api.root(res)?;
    let mut f = Findings::default();
    walk(api, root, obj, "", res.kind, &mut f);
    Some(f)
}

/// Validates a write: prunes unknown fields, fails on type errors and (Strict) unknown fields,
/// returns the warnings to send. `before`: the stored object a patch or update started from; what
/// was already wrong in it is not reported again.
pub fn admit(
    api: &OpenApi,
    res: &ResourceDef,
    obj: &mut Value,
    before: Option<&Value>,
    mode: Mode,
) -> ApiResult<Vec<String>> {
    let Some(mut found) = check(api, res, obj) else {
        return Ok(Vec::new());
    };
    if let Some(old) = before {
        let mut old = old.clone();
        if let Some(known) = check(api, res, &mut old) {
            found.unknown.retain(|u| !known.unknown.contains(u));
            found.type_errors.retain(|t| !known.type_errors.contains(t));
        }
    }
    let prefix = format!(
        "{} in version \"{}\" cannot be handled as a {}",
        res.kind, res.version, res.kind
    );
    if let Some(first) = found.type_errors.first() {
        return Err(ApiError::bad_request(format!("{prefix}: {first}")));
    }
    let unknown: Vec<String> = found
        .unknown
        .iter()
        .map(|u| format!("unknown field \"{u}\""))
        .collect();
    match mode {
        Mode::Strict if !unknown.is_empty() => Err(ApiError::bad_request(format!(
            "{prefix}: strict decoding error: {}",
            unknown.join(", ")
        ))),
        Mode::Warn => Ok(unknown),
        _ => Ok(Vec::new()),
    }
}

/// Follows `$ref` and single-element `allOf` wrappers to the schema itself.
fn deref<'a>(api: &'a OpenApi, mut s: &'a Value) -> (&'a Value, Option<&'a str>) {
    let mut name = None;
    for _ in 0..16 {
        if let Some(r) = s.get("$ref").and_then(Value::as_str) {
            name = r.rsplit('.').next();
            match api.resolve(r) {
                Some(t) => s = t,
                None => break,
            }
        } else if let Some([one]) = s.get("allOf").and_then(Value::as_array).map(Vec::as_slice) {
            s = one;
        } else {
            break;
        }
    }
    (s, name)
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn walk(api: &OpenApi, schema: &Value, v: &mut Value, path: &str, owner: &str, f: &mut Findings) {
    let (s, name) = deref(api, schema);
    if v.is_null() {
        return;
    }
    let mismatch = |f: &mut Findings, v: &Value, want: &str| {
        f.type_errors.push(format!(
            "json: cannot unmarshal {} into Go struct field {owner}.{path} of type {want}",
            json_type(v)
        ));
    };
    if s.get("x-kubernetes-int-or-string").and_then(Value::as_bool) == Some(true) {
        if !(v.is_string() || v.is_i64() || v.is_u64() || v.is_f64()) {
            mismatch(f, v, name.unwrap_or("IntOrString"));
        }
        return;
    }
    if s.get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true)
    {
        return;
    }
    let ty = s.get("type").and_then(Value::as_str).unwrap_or_default();
    let format = s.get("format").and_then(Value::as_str);
    match ty {
        "string" if !v.is_string() => mismatch(f, v, "string"),
        "integer" if !(v.is_i64() || v.is_u64()) => mismatch(f, v, format.unwrap_or("int")),
        "number" if !v.is_number() => mismatch(f, v, format.unwrap_or("float64")),
        "boolean" if !v.is_boolean() => mismatch(f, v, "bool"),
        "array" => {
            let Some(items) = v.as_array_mut() else {
                return mismatch(f, v, "array");
            };
            if let Some(item_schema) = s.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    walk(api, item_schema, item, &format!("{path}[{i}]"), owner, f);
                }
            }
        }
        "object" | ""
            if s.get("properties").is_some() || s.get("additionalProperties").is_some() =>
        {
            let Some(obj) = v.as_object_mut() else {
                return mismatch(f, v, name.unwrap_or("object"));
            };
            let owner = name.unwrap_or(owner);
            let props = s.get("properties").and_then(Value::as_object);
            let extra = s.get("additionalProperties").filter(|a| a.is_object());
            let mut drop = Vec::new();
            for (k, child) in obj.iter_mut() {
                let p = join(path, k);
                match (props.and_then(|m| m.get(k)), extra) {
                    (Some(cs), _) | (None, Some(cs)) => walk(api, cs, child, &p, owner, f),
                    (None, None) if props.is_some() => {
                        f.unknown.push(p);
                        drop.push(k.clone());
                    }
                    (None, None) => {}
                }
            }
            for k in drop {
                obj.remove(&k);
            }
        }
        "object" if !v.is_object() => mismatch(f, v, name.unwrap_or("object")),
        _ => {}
    }
}

/// `Warning` header values (`299 - "<text>"`) for warnings.
pub fn warning_headers(warnings: &[String]) -> Vec<String> {
    warnings
        .iter()
        .map(|w| format!("299 - {}", Value::String(w.clone())))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::apiserver::openapi;
    use crate::apiserver::resources::{find, well_known};
    use serde_json::json;

    #[test]
    fn unknown_fields_are_found_and_pruned() {
        let api = openapi::get();
        let dep = find("apps", "v1", "deployments").unwrap();
        let mut d = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "labels": {"a": "b"}, "bogus": 1},
            "spec": {"replicas": 2, "replicax": 3, "selector": {"matchLabels": {"a": "b"}},
                "strategy": {"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}},
                "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [
                    {"name": "c", "image": "i", "imagee": "x", "resources": {"limits": {"cpu": 1, "memory": "1Gi"}},
                     "ports": [{"containerPort": 80}]}]}}}});
        let f = check(api, dep, &mut d).unwrap();
        assert_eq!(
            f.unknown,
            vec![
                "metadata.bogus",
                "spec.replicax",
                "spec.template.spec.containers[0].imagee"
            ]
        );
        assert!(f.type_errors.is_empty(), "{:?}", f.type_errors);
        assert!(d["spec"].get("replicax").is_none());
        assert!(d["metadata"].get("bogus").is_none());
        assert_eq!(d["spec"]["replicas"], 2);
    }

    #[test]
    fn type_errors_and_modes() {
        let api = openapi::get();
        let dep = find("apps", "v1", "deployments").unwrap();
        let mut d = json!({"metadata": {"name": "d"}, "spec": {"replicas": "two"}});
        let e = admit(api, dep, &mut d, None, Mode::Ignore).unwrap_err();
        assert_eq!(e.code, 400);
        assert!(
            e.message.contains("cannot unmarshal string into Go struct field DeploymentSpec.spec.replicas of type int32"),
            "{}",
            e.message
        );
        let mut d = json!({"metadata": {"name": "d"}, "spec": {"replicax": 1}});
        let e = admit(api, dep, &mut d.clone(), None, Mode::Strict).unwrap_err();
        assert_eq!(
            e.message,
            "Deployment in version \"v1\" cannot be handled as a Deployment: strict decoding error: unknown field \"spec.replicax\""
        );
        let w = admit(api, dep, &mut d, None, Mode::Warn).unwrap();
        assert_eq!(w, vec!["unknown field \"spec.replicax\""]);
        assert_eq!(
            warning_headers(&w),
            vec!["299 - \"unknown field \\\"spec.replicax\\\"\""]
        );
        assert!(d["spec"].get("replicax").is_none());
        // What a patch started from is not reported again.
        let old = json!({"metadata": {"name": "d"}, "spec": {"old": 1}});
        let mut new = json!({"metadata": {"name": "d"}, "spec": {"old": 1, "replicas": 1}});
        assert!(admit(api, dep, &mut new, Some(&old), Mode::Strict).is_ok());
        assert!(Mode::parse(Some("Loud")).is_err());
        // Kinds without a schema keep everything; a Node's status is checked too.
        let claims = well_known::nodeclaims();
        let mut c = json!({"spec": {"anything": {"goes": true}}});
        assert_eq!(check(api, claims, &mut c).unwrap(), Findings::default());
        let mut n = json!({"status": {"capacity": {"cpu": "4", "pods": 110}, "nope": 1}});
        let f = check(api, well_known::nodes(), &mut n).unwrap();
        assert_eq!(f.unknown, vec!["status.nope"]);
    }
}

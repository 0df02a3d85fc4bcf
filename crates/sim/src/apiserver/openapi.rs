//! `/openapi/v3`: OpenAPI v3 documents for the served kinds, and the schemas behind server-side
//! field validation ([`validate`](super::validate)).
//!
//! kubectl's `--validate` (default `strict`) first asks `/openapi/v3/<group-version>` whether the
//! PATCH operation of the object's kind takes a `fieldValidation` query parameter. When it does,
//! kubectl leaves validation to the server and sends `fieldValidation=Strict` with its create,
//! update and patch requests; without any OpenAPI it refuses to send the object at all. So each
//! document here has the operations of every served resource (with `fieldValidation`, and the
//! `x-kubernetes-group-version-kind` kubectl matches on) and the schemas of the kinds, which are
//! k8s-openapi's (`schemars` feature; generated from the Kubernetes OpenAPI spec of the version
//! k8s-openapi is built for, 1.33). `kubectl explain` reads the same documents.
//!
//! Not served: `x-kubernetes-patch-strategy`/`-merge-key` (k8s-openapi's schemas lack them). The
//! PATCH operations therefore do not list `application/strategic-merge-patch+json`, which makes
//! `kubectl apply` compute its strategic merge patch from its compiled-in types, the same metadata
//! a real server's spec carries (the server still accepts strategic merge patches). No
//! `/openapi/v2`.

use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;

use axum::body::Bytes;
use serde_json::{json, Map, Value};
use sha2::Digest;

use super::resources::{ResourceDef, RESOURCES};

/// The generated documents and the schemas.
#[derive(Debug)]
pub struct OpenApi {
    /// `components/schemas` of every served kind (by schema name, e.g. `io.k8s.api.core.v1.Pod`).
    pub definitions: Map<String, Value>,
    /// Schema name of each served resource's kind, by index in [`RESOURCES`].
    pub roots: HashMap<usize, String>,
    /// Documents by path (`api/v1`, `apis/apps/v1`) and the hash in their URL.
    docs: BTreeMap<String, (Bytes, String)>,
}

/// The process-wide documents (generated on first use).
pub fn get() -> &'static OpenApi {
    static O: OnceLock<OpenApi> = OnceLock::new();
    O.get_or_init(build)
}

impl OpenApi {
    /// `/openapi/v3`: the discovery document listing a URL per group-version.
    pub fn index(&self) -> Value {
        let paths: Map<String, Value> = self
            .docs
            .iter()
            .map(|(path, (_, hash))| {
                (
                    path.clone(),
                    json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={hash}")}),
                )
            })
            .collect();
        json!({ "paths": paths })
    }

    /// The document of a group-version path (`api/v1`, `apis/apps/v1`).
    pub fn document(&self, path: &str) -> Option<Bytes> {
        self.docs.get(path).map(|(b, _)| b.clone())
    }

    /// The schema of a resource's kind, when the sim has one.
    pub fn root(&self, res: &ResourceDef) -> Option<&Value> {
        let name = self.roots.get(&res.index())?;
        self.definitions.get(name)
    }

    /// The schema a `$ref` (`#/components/schemas/NAME`) points at.
    pub fn resolve<'a>(&'a self, reference: &str) -> Option<&'a Value> {
        let name = reference.strip_prefix("#/components/schemas/")?;
        self.definitions.get(name)
    }
}

fn build() -> OpenApi {
    let (mut definitions, roots) = kind_schemas();
    for (i, name) in &roots {
        let r = &RESOURCES[*i];
        if let Some(Value::Object(s)) = definitions.get_mut(name) {
            s.insert(
                "x-kubernetes-group-version-kind".into(),
                json!([{"group": r.group, "version": r.version, "kind": r.kind}]),
            );
        }
    }
    let mut by_gv: BTreeMap<String, Vec<&'static ResourceDef>> = BTreeMap::new();
    for r in RESOURCES {
        let path = if r.group.is_empty() {
            format!("api/{}", r.version)
        } else {
            format!("apis/{}/{}", r.group, r.version)
        };
        by_gv.entry(path).or_default().push(r);
    }
    let mut docs = BTreeMap::new();
    for (path, list) in by_gv {
        let doc = document(&path, &list, &definitions, &roots);
        let bytes = serde_json::to_vec(&doc).unwrap_or_default();
        let hash = hex::encode_upper(sha2::Sha256::digest(&bytes));
        docs.insert(path, (Bytes::from(bytes), hash));
    }
    OpenApi {
        definitions,
        roots,
        docs,
    }
}

/// A group-version's document: its resources' operations and the schemas they reach.
fn document(
    path: &str,
    resources: &[&'static ResourceDef],
    definitions: &Map<String, Value>,
    roots: &HashMap<usize, String>,
) -> Value {
    let mut paths = Map::new();
    let mut wanted = Vec::new();
    for r in resources {
        let schema = roots
            .get(&r.index())
            .cloned()
            .unwrap_or_else(|| "io.k8s.apimachinery.pkg.runtime.RawExtension".into());
        wanted.push(schema.clone());
        operations(path, r, &schema, &mut paths);
    }
    let mut components = Map::new();
    let mut todo = wanted;
    while let Some(name) = todo.pop() {
        if components.contains_key(&name) {
            continue;
        }
        let Some(s) = definitions.get(&name) else {
            continue;
        };
        collect_refs(s, &mut todo);
        components.insert(name, s.clone());
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (nodekeeper sim)", "version": "v1.33.0-nodekeeper-sim"},
        "paths": paths,
        "components": {"schemas": components},
    })
}

fn collect_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(r) = m.get("$ref").and_then(Value::as_str) {
                if let Some(n) = r.strip_prefix("#/components/schemas/") {
                    out.push(n.to_string());
                }
            }
            m.values().for_each(|x| collect_refs(x, out));
        }
        Value::Array(a) => a.iter().for_each(|x| collect_refs(x, out)),
        _ => {}
    }
}

fn query(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": {"type": "string", "uniqueItems": true}})
}

fn write_params() -> Vec<Value> {
    vec![
        query("dryRun", "When present, indicates that modifications should not be persisted (not supported by the sim: 400)."),
        query("fieldManager", "A name associated with the actor or entity that is making these changes."),
        query("fieldValidation", "How the server treats unknown and duplicate fields: Ignore, Warn (default) or Strict."),
    ]
}

/// Adds the collection, item and status operations of `r` to `paths`.
fn operations(gv_path: &str, r: &ResourceDef, schema: &str, paths: &mut Map<String, Value>) {
    let reference = json!({"$ref": format!("#/components/schemas/{schema}")});
    let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
    let scope = if r.namespaced {
        "/namespaces/{namespace}"
    } else {
        ""
    };
    let collection = format!("/{gv_path}{scope}/{}", r.plural);
    let item = format!("{collection}/{{name}}");
    let ok = |code: &str| json!({ code: {"description": "OK", "content": {"application/json": {"schema": reference}}} });
    let body = json!({"content": {"application/json": {"schema": reference}, "application/yaml": {"schema": reference}}});
    let op = |action: &str, extra: Value| {
        let mut o = json!({
            "operationId": format!("{action}{}{}", r.kind, if r.namespaced { "Namespaced" } else { "" }),
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk,
            "responses": ok(if action == "post" { "201" } else { "200" }),
        });
        if let (Value::Object(o), Value::Object(e)) = (&mut o, extra) {
            o.extend(e);
        }
        o
    };
    let path_params = |name: bool| {
        let mut ps = Vec::new();
        if name {
            ps.push(json!({"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}));
        }
        if r.namespaced {
            ps.push(json!({"name": "namespace", "in": "path", "required": true, "schema": {"type": "string"}}));
        }
        Value::Array(ps)
    };
    let mut coll = json!({
        "post": op("post", json!({"parameters": write_params(), "requestBody": body})),
        "parameters": path_params(false),
    });
    if !r.virtual_create {
        coll["get"] = op("list", json!({}));
        coll["delete"] = op("deletecollection", json!({}));
    }
    paths.insert(collection, coll);
    if r.virtual_create {
        return;
    }
    let patch_body = json!({"content": {
        "application/json-patch+json": {"schema": {"type": "object"}},
        "application/merge-patch+json": {"schema": {"type": "object"}},
        "application/apply-patch+yaml": {"schema": {"type": "object"}},
    }});
    let mut patch_params = write_params();
    patch_params.push(query(
        "force",
        "Force is going to \"force\" Apply requests.",
    ));
    let item_ops = |suffix: &str| {
        json!({
            "get": op("get", json!({})),
            "put": op("put", json!({"parameters": write_params(), "requestBody": body})),
            "patch": op("patch", json!({"parameters": patch_params, "requestBody": patch_body})),
            "delete": if suffix.is_empty() { op("delete", json!({})) } else { Value::Null },
            "parameters": path_params(true),
        })
    };
    let mut main = item_ops("");
    if let Value::Object(m) = &mut main {
        m.retain(|_, v| !v.is_null());
    }
    paths.insert(item.clone(), main);
    if r.has_status {
        let mut status = item_ops("/status");
        if let Value::Object(m) = &mut status {
            m.retain(|_, v| !v.is_null());
        }
        paths.insert(format!("{item}/status"), status);
    }
}

/// k8s-openapi's schemas of the served kinds, and each resource's schema name.
fn kind_schemas() -> (Map<String, Value>, HashMap<usize, String>) {
    use k8s_openapi::api::{
        admissionregistration::v1 as admission, apps::v1 as apps, authentication::v1 as authn,
        coordination::v1 as coordination, core::v1 as core, events::v1 as events,
        flowcontrol::v1 as flowcontrol, policy::v1 as policy, rbac::v1 as rbac,
        storage::v1 as storage,
    };
    use k8s_openapi::schemars::{generate::SchemaSettings, JsonSchema};

    let mut generator = SchemaSettings::openapi3().into_generator();
    let mut roots = HashMap::new();
    for r in RESOURCES {
        macro_rules! kinds {
            ($( ($g:literal, $k:literal) => $t:ty ),* $(,)?) => {
                match (r.group, r.kind) {
                    $( ($g, $k) => {
                        generator.subschema_for::<$t>();
                        Some(<$t as JsonSchema>::schema_name().into_owned())
                    } )*
                    _ => None,
                }
            };
        }
        let name = kinds! {
            ("", "Node") => core::Node,
            ("", "Pod") => core::Pod,
            ("", "Namespace") => core::Namespace,
            ("", "Event") => core::Event,
            ("", "Service") => core::Service,
            ("", "ConfigMap") => core::ConfigMap,
            ("", "Secret") => core::Secret,
            ("", "ResourceQuota") => core::ResourceQuota,
            ("", "LimitRange") => core::LimitRange,
            ("", "ServiceAccount") => core::ServiceAccount,
            ("rbac.authorization.k8s.io", "Role") => rbac::Role,
            ("rbac.authorization.k8s.io", "RoleBinding") => rbac::RoleBinding,
            ("rbac.authorization.k8s.io", "ClusterRole") => rbac::ClusterRole,
            ("rbac.authorization.k8s.io", "ClusterRoleBinding") => rbac::ClusterRoleBinding,
            ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy") => admission::ValidatingAdmissionPolicy,
            ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding") => admission::ValidatingAdmissionPolicyBinding,
            ("flowcontrol.apiserver.k8s.io", "FlowSchema") => flowcontrol::FlowSchema,
            ("flowcontrol.apiserver.k8s.io", "PriorityLevelConfiguration") => flowcontrol::PriorityLevelConfiguration,
            ("apps", "ReplicaSet") => apps::ReplicaSet,
            ("apps", "Deployment") => apps::Deployment,
            ("apps", "DaemonSet") => apps::DaemonSet,
            ("apps", "StatefulSet") => apps::StatefulSet,
            ("policy", "PodDisruptionBudget") => policy::PodDisruptionBudget,
            ("coordination.k8s.io", "Lease") => coordination::Lease,
            ("events.k8s.io", "Event") => events::Event,
            ("authentication.k8s.io", "TokenReview") => authn::TokenReview,
            ("storage.k8s.io", "VolumeAttachment") => storage::VolumeAttachment,
        };
        if let Some(n) = name {
            roots.insert(r.index(), n);
        }
    }
    let mut defs = generator.take_definitions(true);
    // Kinds k8s-openapi does not have (karpenter's NodeClaim, a CRD on real clusters): any object.
    let missing: Vec<&ResourceDef> = RESOURCES
        .iter()
        .filter(|r| !roots.contains_key(&r.index()))
        .collect();
    for r in missing {
        let name = format!("{}.{}.{}", r.group, r.version, r.kind);
        defs.insert(
            name.clone(),
            json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        );
        roots.insert(r.index(), name);
    }
    (defs, roots)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_resource_has_a_schema_and_documents_list_field_validation() {
        let o = get();
        for r in RESOURCES {
            let s = o
                .root(r)
                .unwrap_or_else(|| panic!("no schema for {}", r.kind));
            if r.group != "karpenter.sh" {
                assert!(s["properties"].get("metadata").is_some(), "{}", r.kind);
                assert_eq!(s["x-kubernetes-group-version-kind"][0]["kind"], r.kind);
            }
        }
        let index = o.index();
        let url = index["paths"]["apis/apps/v1"]["serverRelativeURL"]
            .as_str()
            .unwrap();
        assert!(url.starts_with("/openapi/v3/apis/apps/v1?hash="), "{url}");
        let doc: Value = serde_json::from_slice(&o.document("apis/apps/v1").unwrap()).unwrap();
        let patch =
            &doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
        assert_eq!(
            patch["x-kubernetes-group-version-kind"]["kind"],
            "Deployment"
        );
        assert!(patch["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "fieldValidation" && p["in"] == "query"));
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        assert!(schemas.contains_key("io.k8s.api.core.v1.PodSpec"));
        assert!(schemas.contains_key("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"));
        assert!(
            !schemas.contains_key("io.k8s.api.core.v1.Node"),
            "only what apps/v1 reaches"
        );
        assert!(o.document("apis/nope/v1").is_none());
    }
}

//! Patch application: JSON merge (RFC 7386), JSON patch (RFC 6902), strategic merge and server-side apply.

use serde_json::{Map, Value};

/// Why a patch could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// The patch body is not valid for its type.
    #[error("invalid {kind} patch: {why}")]
    Malformed {
        /// Patch type.
        kind: &'static str,
        /// Parser message.
        why: String,
    },
    /// The patch is valid but does not apply to the object (e.g. JSON patch `test` failed).
    #[error("the {kind} patch does not apply: {why}")]
    DoesNotApply {
        /// Patch type.
        kind: &'static str,
        /// Why.
        why: String,
    },
}

/// Supported patch content types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/merge-patch+json`.
    Merge,
    /// `application/json-patch+json`.
    Json,
    /// `application/strategic-merge-patch+json`.
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply).
    Apply,
}

impl PatchType {
    /// Maps a Content-Type header to a patch type.
    pub fn from_content_type(ct: &str) -> Option<Self> {
        let base = ct.split(';').next().unwrap_or_default().trim();
        match base {
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/json-patch+json" => Some(PatchType::Json),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => {
                Some(PatchType::Apply)
            }
            _ => None,
        }
    }
}

/// Applies a parsed patch document to `target`, returning the patched object.
pub fn apply(kind: PatchType, target: &Value, patch: &Value) -> Result<Value, PatchError> {
    match kind {
        PatchType::Merge => {
            if !patch.is_object() {
                return Err(PatchError::Malformed {
                    kind: "merge",
                    why: "the patch must be a JSON object".into(),
                });
            }
            let mut out = target.clone();
            json_patch::merge(&mut out, patch);
            Ok(out)
        }
        PatchType::Json => {
            let ops: json_patch::Patch =
                serde_json::from_value(patch.clone()).map_err(|e| PatchError::Malformed {
                    kind: "json",
                    why: e.to_string(),
                })?;
            let mut out = target.clone();
            json_patch::patch(&mut out, &ops).map_err(|e| PatchError::DoesNotApply {
                kind: "json",
                why: e.to_string(),
            })?;
            Ok(out)
        }
        PatchType::Strategic | PatchType::Apply => {
            let Value::Object(p) = patch else {
                return Err(PatchError::Malformed {
                    kind: "strategic merge",
                    why: "the patch must be a JSON object".into(),
                });
            };
            let mut out = target.clone();
            strategic_map(&mut out, p, "");
            Ok(out)
        }
    }
}

/// Merge key of a list at a path (`spec.containers` → `name`); `None` means the list is replaced.
fn merge_key(path: &str) -> Option<&'static str> {
    let last = path.rsplit('.').next().unwrap_or(path);
    match last {
        "conditions" => Some("type"),
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "containerStatuses"
        | "initContainerStatuses" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        "ports" if path.contains("containers") => Some("containerPort"),
        "ports" => Some("port"),
        "ownerReferences" => Some("uid"),
        "addresses" if path.starts_with("status") => Some("type"),
        "hostAliases" => Some("ip"),
        "topologySpreadConstraints" => Some("topologyKey"),
        "podIPs" | "hostIPs" => Some("ip"),
        _ => None,
    }
}

/// Lists of scalars merged as sets.
fn is_set_list(path: &str) -> bool {
    path == "metadata.finalizers"
}

fn strategic_map(target: &mut Value, patch: &Map<String, Value>, path: &str) {
    if patch.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut p = patch.clone();
        p.remove("$patch");
        strip_directives(&mut p);
        *target = Value::Object(p);
        return;
    }
    if patch.get("$patch").and_then(Value::as_str) == Some("delete") {
        *target = Value::Null;
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let retain: Option<Vec<String>> = patch.get("$retainKeys").and_then(Value::as_array).map(|a| {
        a.iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    });
    let Value::Object(t) = target else { return };
    for (k, v) in patch {
        if k.starts_with('$') {
            if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
                if let (Some(Value::Array(cur)), Some(del)) = (t.get_mut(field), v.as_array()) {
                    cur.retain(|x| !del.contains(x));
                }
            }
            continue;
        }
        let child = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        match v {
            Value::Null => {
                t.remove(k);
            }
            Value::Object(pm) => {
                let slot = t.entry(k.clone()).or_insert(Value::Null);
                strategic_map(slot, pm, &child);
                if slot.is_null() {
                    t.remove(k);
                }
            }
            Value::Array(pl) => {
                let slot = t.entry(k.clone()).or_insert(Value::Array(Vec::new()));
                strategic_list(slot, pl, &child);
            }
            other => {
                t.insert(k.clone(), other.clone());
            }
        }
    }
    if let Some(keep) = retain {
        t.retain(|k, _| keep.contains(k));
    }
}

fn strategic_list(target: &mut Value, patch: &[Value], path: &str) {
    if is_set_list(path) {
        let cur = target.as_array().cloned().unwrap_or_default();
        let mut out = cur;
        for v in patch {
            if !out.contains(v) {
                out.push(v.clone());
            }
        }
        *target = Value::Array(out);
        return;
    }
    let replace_all = patch
        .iter()
        .any(|v| v.get("$patch").and_then(Value::as_str) == Some("replace"));
    let Some(key) = merge_key(path).filter(|_| !replace_all) else {
        let mut items: Vec<Value> = patch
            .iter()
            .filter(|v| v.get("$patch").is_none())
            .cloned()
            .collect();
        for it in &mut items {
            if let Value::Object(m) = it {
                strip_directives(m);
            }
        }
        *target = Value::Array(items);
        return;
    };
    let mut cur = target.as_array().cloned().unwrap_or_default();
    for item in patch {
        let Some(id) = item.get(key) else {
            continue;
        };
        let pos = cur.iter().position(|c| c.get(key) == Some(id));
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete, item) {
            (Some(i), true, _) => {
                cur.remove(i);
            }
            (None, true, _) => {}
            (Some(i), false, Value::Object(pm)) => strategic_map(&mut cur[i], pm, path),
            (None, false, Value::Object(pm)) => {
                let mut fresh = Value::Object(Map::new());
                strategic_map(&mut fresh, pm, path);
                cur.push(fresh);
            }
            (_, false, _) => {}
        }
    }
    *target = Value::Array(cur);
}

fn strip_directives(m: &mut Map<String, Value>) {
    m.retain(|k, _| !k.starts_with('$'));
    for v in m.values_mut() {
        if let Value::Object(child) = v {
            strip_directives(child);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    type Check = Box<dyn Fn(&Value) -> bool>;

    fn node() -> Value {
        json!({"metadata": {"name": "n1", "labels": {"a": "1"}, "finalizers": ["x"]},
            "spec": {"taints": [{"key": "t1", "effect": "NoSchedule"}], "unschedulable": true},
            "status": {"conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                {"type": "DiskPressure", "status": "False"}]}})
    }

    #[test]
    fn strategic_merge_table() {
        let cases: Vec<(Value, Check)> = vec![
            (
                json!({"spec": {"unschedulable": null}}),
                Box::new(|o| o["spec"].get("unschedulable").is_none()),
            ),
            (
                json!({"metadata": {"labels": {"b": "2"}}}),
                Box::new(|o| o["metadata"]["labels"] == json!({"a":"1","b":"2"})),
            ),
            (
                json!({"spec": {"taints": [{"key": "t2", "effect": "NoExecute"}]}}),
                Box::new(|o| o["spec"]["taints"] == json!([{"key": "t2", "effect": "NoExecute"}])),
            ),
            (
                json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
                Box::new(|o| {
                    o["status"]["conditions"][0]
                        == json!({"type":"Ready","status":"False","reason":"KubeletReady"})
                        && o["status"]["conditions"][1]["type"] == "DiskPressure"
                }),
            ),
            (
                json!({"status": {"conditions": [{"type": "Custom", "status": "True"}]}}),
                Box::new(|o| o["status"]["conditions"].as_array().unwrap().len() == 3),
            ),
            (
                json!({"status": {"conditions": [{"type": "DiskPressure", "$patch": "delete"}]}}),
                Box::new(|o| o["status"]["conditions"].as_array().unwrap().len() == 1),
            ),
            (
                json!({"metadata": {"finalizers": ["y"]}}),
                Box::new(|o| o["metadata"]["finalizers"] == json!(["x", "y"])),
            ),
            (
                json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}}),
                Box::new(|o| o["metadata"]["finalizers"] == json!([])),
            ),
            (
                json!({"spec": {"$retainKeys": ["taints"], "taints": []}}),
                Box::new(|o| o["spec"] == json!({"taints": []})),
            ),
            (
                json!({"metadata": {"labels": {"$patch": "replace", "z": "9"}}}),
                Box::new(|o| o["metadata"]["labels"] == json!({"z": "9"})),
            ),
            (
                json!({"spec": {"$setElementOrder/taints": [{"key": "t1"}]}}),
                Box::new(|o| o["spec"]["taints"][0]["key"] == "t1"),
            ),
        ];
        for (p, check) in cases {
            let out = apply(PatchType::Strategic, &node(), &p).unwrap();
            assert!(check(&out), "patch {p} gave {out}");
        }
    }

    #[test]
    fn containers_merge_by_name() {
        let pod = json!({"spec": {"containers": [{"name": "a", "image": "x:1"}, {"name": "b", "image": "y:1"}]}});
        let out = apply(
            PatchType::Strategic,
            &pod,
            &json!({"spec": {"containers": [{"name": "b", "image": "y:2"}]}}),
        )
        .unwrap();
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "a", "image": "x:1"}, {"name": "b", "image": "y:2"}])
        );
    }

    #[test]
    fn merge_and_json_patch() {
        let out = apply(
            PatchType::Merge,
            &node(),
            &json!({"status": {"conditions": [{"type": "X"}]}}),
        )
        .unwrap();
        assert_eq!(out["status"]["conditions"], json!([{"type": "X"}]));
        let out = apply(
            PatchType::Json,
            &node(),
            &json!([{"op": "replace", "path": "/metadata/labels/a", "value": "2"}]),
        )
        .unwrap();
        assert_eq!(out["metadata"]["labels"]["a"], "2");
        assert!(matches!(
            apply(
                PatchType::Json,
                &node(),
                &json!([{"op": "test", "path": "/metadata/name", "value": "zz"}])
            ),
            Err(PatchError::DoesNotApply { .. })
        ));
        assert!(matches!(
            apply(PatchType::Json, &node(), &json!({"op": "x"})),
            Err(PatchError::Malformed { .. })
        ));
        assert!(matches!(
            apply(PatchType::Merge, &node(), &json!([1])),
            Err(PatchError::Malformed { .. })
        ));
        assert!(matches!(
            apply(PatchType::Strategic, &node(), &json!("s")),
            Err(PatchError::Malformed { .. })
        ));
    }

    #[test]
    fn content_types() {
        assert_eq!(
            PatchType::from_content_type("application/strategic-merge-patch+json; charset=utf-8"),
            Some(PatchType::Strategic)
        );
        assert_eq!(
            PatchType::from_content_type("application/apply-patch+yaml"),
            Some(PatchType::Apply)
        );
        assert_eq!(PatchType::from_content_type("text/plain"), None);
    }
}

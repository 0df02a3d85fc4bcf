//! Defaulting on create, per kind (the subset clients and the simulated loops rely on).

use serde_json::{json, Value};

use super::resources::ResourceDef;

/// Fills defaults into a new object.
pub fn apply(res: &ResourceDef, obj: &mut Value) {
    match (res.group, res.kind) {
        ("", "Pod") => pod(obj),
        ("", "Namespace") if obj.pointer("/status/phase").is_none() => {
            obj["status"] = json!({"phase": "Active"});
        }
        ("apps", "ReplicaSet") | ("apps", "Deployment")
            if obj.get("spec").is_some_and(Value::is_object) =>
        {
            let spec = &mut obj["spec"];
            let mut defaults = vec![("replicas", json!(1))];
            if res.kind == "Deployment" {
                defaults.extend([
                    ("revisionHistoryLimit", json!(10)),
                    ("progressDeadlineSeconds", json!(600)),
                ]);
                if spec.pointer("/strategy/type").is_none() {
                    spec["strategy"] = json!({"type": "RollingUpdate",
                        "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}});
                }
            }
            for (k, v) in defaults {
                if spec.get(k).is_none() {
                    spec[k] = v;
                }
            }
        }
        ("", "Secret") => secret(obj),
        _ => {}
    }
}

/// `stringData` is written into `data` (base64) and dropped; `type` defaults to `Opaque`.
pub fn secret(obj: &mut Value) {
    use base64::Engine;
    if let Some(Value::Object(plain)) = obj.as_object_mut().and_then(|o| o.remove("stringData")) {
        if !obj.get("data").is_some_and(Value::is_object) {
            obj["data"] = json!({});
        }
        for (k, v) in plain {
            let text = v.as_str().unwrap_or_default().to_string();
            obj["data"][k] = json!(base64::engine::general_purpose::STANDARD.encode(text));
        }
    }
    if obj.get("type").is_none_or(Value::is_null) {
        obj["type"] = json!("Opaque");
    }
}

fn pod(obj: &mut Value) {
    if !obj.get("spec").is_some_and(Value::is_object) {
        obj["spec"] = json!({});
    }
    let spec = &mut obj["spec"];
    for (k, v) in [
        ("terminationGracePeriodSeconds", json!(30)),
        ("restartPolicy", json!("Always")),
        ("schedulerName", json!("default-scheduler")),
        ("dnsPolicy", json!("ClusterFirst")),
    ] {
        if spec.get(k).is_none() {
            spec[k] = v;
        }
    }
    if spec.get("containers").is_none() {
        spec["containers"] = json!([]);
    }
    if obj.pointer("/status/phase").is_none() {
        if !obj.get("status").is_some_and(Value::is_object) {
            obj["status"] = json!({});
        }
        obj["status"]["phase"] = json!("Pending");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::apiserver::resources::{find, well_known};

    #[test]
    fn deployment_and_secret_defaults() {
        let mut d = json!({"spec": {"replicas": 0, "strategy": {"type": "Recreate"}}});
        apply(well_known::deployments(), &mut d);
        assert_eq!(d["spec"]["replicas"], 0);
        assert_eq!(d["spec"]["strategy"], json!({"type": "Recreate"}));
        assert_eq!(d["spec"]["revisionHistoryLimit"], 10);
        let mut d = json!({"spec": {}});
        apply(well_known::deployments(), &mut d);
        assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxSurge"], "25%");
        let mut rs = json!({"spec": {}});
        apply(well_known::replicasets(), &mut rs);
        assert_eq!(rs["spec"], json!({"replicas": 1}));
        let mut s = json!({"data": {"a": "YQ=="}, "stringData": {"b": "hello"}});
        apply(find("", "v1", "secrets").unwrap(), &mut s);
        assert_eq!(
            s,
            json!({"data": {"a": "YQ==", "b": "aGVsbG8="}, "type": "Opaque"})
        );
    }
}

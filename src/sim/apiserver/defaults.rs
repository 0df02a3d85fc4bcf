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
            if obj.pointer("/spec/replicas").is_none()
                && obj.get("spec").is_some_and(Value::is_object) =>
        {
            obj["spec"]["replicas"] = json!(1);
        }
        _ => {}
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

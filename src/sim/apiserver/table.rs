//! Server-side `Table` rendering for `kubectl get` of nodes and pods (other kinds are answered as
//! plain JSON, which kubectl prints with its built-in NAME/AGE columns).

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::clock::parse_time;

/// Whether the request asked for a Table (`Accept: application/json;as=Table;...`).
pub fn wanted(accept: &str) -> bool {
    accept.contains("as=Table")
}

/// Whether this kind has table columns.
pub fn supported(kind: &str) -> bool {
    matches!(kind, "Node" | "Pod")
}

fn col(name: &str, ty: &str, priority: u8) -> Value {
    let format = if name == "Name" { "name" } else { "" };
    json!({"name": name, "type": ty, "format": format, "description": "", "priority": priority})
}

/// kubectl-style age: `45s`, `3m10s`, `25m`, `5h`, `3d`.
pub fn age(created: Option<DateTime<Utc>>, now: DateTime<Utc>) -> String {
    let Some(c) = created else {
        return "<unknown>".into();
    };
    let s = (now - c).num_seconds().max(0);
    match s {
        0..120 => format!("{s}s"),
        120..600 => format!("{}m{}s", s / 60, s % 60),
        600..10_800 => format!("{}m", s / 60),
        10_800..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

fn created(o: &Value) -> Option<DateTime<Utc>> {
    o.pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(parse_time)
}

fn cond<'a>(o: &'a Value, t: &str) -> Option<&'a str> {
    o.pointer("/status/conditions")
        .and_then(Value::as_array)?
        .iter()
        .find(|c| c["type"] == t)
        .and_then(|c| c["status"].as_str())
}

fn node_row(n: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let mut status = match cond(n, "Ready") {
        Some("True") => "Ready".to_string(),
        Some("False") => "NotReady".to_string(),
        _ => "Unknown".to_string(),
    };
    if n.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
        status.push_str(",SchedulingDisabled");
    }
    let roles: Vec<&str> = n
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.keys()
                .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                .collect()
        })
        .unwrap_or_default();
    let addr = |t: &str| {
        n.pointer("/status/addresses")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().find(|x| x["type"] == t))
            .and_then(|x| x["address"].as_str())
            .unwrap_or("<none>")
            .to_string()
    };
    let info = |f: &str| {
        n.pointer(&format!("/status/nodeInfo/{f}"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    vec![
        json!(n.pointer("/metadata/name")),
        json!(status),
        json!(if roles.is_empty() {
            "<none>".to_string()
        } else {
            roles.join(",")
        }),
        json!(age(created(n), now)),
        json!(info("kubeletVersion")),
        json!(addr("InternalIP")),
        json!(addr("ExternalIP")),
        json!(info("osImage")),
        json!(info("kernelVersion")),
        json!(info("containerRuntimeVersion")),
    ]
}

fn pod_row(p: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let total = p
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let ready = if cond(p, "Ready") == Some("True") {
        total
    } else {
        0
    };
    let status = if p.pointer("/metadata/deletionTimestamp").is_some() {
        "Terminating"
    } else {
        p.pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("Unknown")
    };
    let s = |ptr: &str| {
        p.pointer(ptr)
            .and_then(Value::as_str)
            .unwrap_or("<none>")
            .to_string()
    };
    vec![
        json!(p.pointer("/metadata/name")),
        json!(format!("{ready}/{total}")),
        json!(status),
        json!(0),
        json!(age(created(p), now)),
        json!(s("/status/podIP")),
        json!(s("/spec/nodeName")),
        json!(s("/status/nominatedNodeName")),
        json!("<none>"),
    ]
}

/// Renders objects of `kind` as a `meta.k8s.io/v1` Table (row objects are PartialObjectMetadata).
pub fn render<'a>(
    kind: &str,
    items: impl Iterator<Item = &'a Value>,
    list_meta: Value,
    now: DateTime<Utc>,
) -> Value {
    let columns = match kind {
        "Node" => vec![
            col("Name", "string", 0),
            col("Status", "string", 0),
            col("Roles", "string", 0),
            col("Age", "string", 0),
            col("Version", "string", 0),
            col("Internal-IP", "string", 1),
            col("External-IP", "string", 1),
            col("OS-Image", "string", 1),
            col("Kernel-Version", "string", 1),
            col("Container-Runtime", "string", 1),
        ],
        _ => vec![
            col("Name", "string", 0),
            col("Ready", "string", 0),
            col("Status", "string", 0),
            col("Restarts", "integer", 0),
            col("Age", "string", 0),
            col("IP", "string", 1),
            col("Node", "string", 1),
            col("Nominated Node", "string", 1),
            col("Readiness Gates", "string", 1),
        ],
    };
    let rows: Vec<Value> = items
        .map(|o| {
            let cells = if kind == "Node" { node_row(o, now) } else { pod_row(o, now) };
            json!({"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                "metadata": o.get("metadata").cloned().unwrap_or(json!({}))}})
        })
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta,
        "columnDefinitions": columns, "rows": rows})
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn node_and_pod_rows() {
        let now = parse_time("2026-01-01T01:00:00Z").unwrap();
        let n = json!({"metadata": {"name": "n1", "creationTimestamp": "2026-01-01T00:59:00Z",
            "labels": {"node-role.kubernetes.io/worker": ""}},
            "spec": {"unschedulable": true}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let t = render("Node", [&n].into_iter(), json!({}), now);
        assert_eq!(t["rows"][0]["cells"][1], "Ready,SchedulingDisabled");
        assert_eq!(t["rows"][0]["cells"][2], "worker");
        assert_eq!(t["rows"][0]["cells"][3], "60s");
        let p = json!({"metadata": {"name": "p", "deletionTimestamp": "x"}, "spec": {"containers": [{}, {}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
        let t = render("Pod", [&p].into_iter(), json!({}), now);
        assert_eq!(t["rows"][0]["cells"][1], "2/2");
        assert_eq!(t["rows"][0]["cells"][2], "Terminating");
        assert_eq!(age(parse_time("2025-12-25T00:00:00Z"), now), "7d");
        assert!(wanted(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        ));
    }
}

//! Server-side `Table` rendering for `kubectl get` of nodes, pods, events, namespaces,
//! deployments, replicasets, configmaps and secrets, with kube-apiserver's columns (other kinds are answered
//! as plain JSON, which kubectl prints with its built-in NAME/AGE columns).

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::clock::parse_time;

/// Whether the request asked for a Table (`Accept: application/json;as=Table;...`).
pub fn wanted(accept: &str) -> bool {
    accept.contains("as=Table")
}

/// Whether this kind has table columns.
pub fn supported(kind: &str) -> bool {
    matches!(
        kind,
        "Node"
            | "Pod"
            | "Event"
            | "Namespace"
            | "Deployment"
            | "ReplicaSet"
            | "ConfigMap"
            | "Secret"
    )
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

fn time_at(o: &Value, ptrs: &[&str]) -> Option<DateTime<Utc>> {
    ptrs.iter()
        .filter_map(|p| o.pointer(p).and_then(Value::as_str))
        .find_map(parse_time)
}

/// kube-apiserver's event row: LAST SEEN (with `(xN over AGE)`), TYPE, REASON, OBJECT, MESSAGE.
fn event_row(e: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let last = time_at(
        e,
        &["/series/lastObservedTime", "/lastTimestamp", "/eventTime"],
    );
    let first = time_at(e, &["/firstTimestamp", "/eventTime"]).or(last);
    let count = e.get("count").and_then(Value::as_i64).unwrap_or(1);
    let mut seen = age(last, now);
    if count > 1 {
        seen = format!("{seen} (x{count} over {})", age(first, now));
    }
    let s = |ptr: &str| e.pointer(ptr).and_then(Value::as_str).unwrap_or_default();
    let object = format!(
        "{}/{}",
        s("/involvedObject/kind").to_lowercase(),
        s("/involvedObject/name")
    );
    let source = match (s("/source/component"), s("/reportingComponent")) {
        ("", r) => r,
        (c, _) => c,
    };
    vec![
        json!(seen),
        json!(s("/type")),
        json!(s("/reason")),
        json!(object),
        json!(s("/involvedObject/fieldPath")),
        json!(source),
        json!(s("/message").trim()),
        json!(age(first, now)),
        json!(count),
        json!(s("/metadata/name")),
    ]
}

fn int_at(o: &Value, ptr: &str) -> i64 {
    o.pointer(ptr).and_then(Value::as_i64).unwrap_or(0)
}

fn containers_images(o: &Value) -> (String, String) {
    let cs = o
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let names: Vec<&str> = cs.iter().filter_map(|c| c["name"].as_str()).collect();
    let images: Vec<&str> = cs.iter().filter_map(|c| c["image"].as_str()).collect();
    (names.join(","), images.join(","))
}

/// A workload's `spec.selector.matchLabels` as `k=v,…`, sorted (kubectl's SELECTOR column, Scale's
/// `status.selector`).
pub(crate) fn selector(o: &Value) -> String {
    let mut parts: Vec<String> = o
        .pointer("/spec/selector/matchLabels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    parts.sort();
    parts.join(",")
}

fn workload_row(kind: &str, o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let (containers, images) = containers_images(o);
    let name = json!(o.pointer("/metadata/name"));
    let desired = o
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let ready = int_at(o, "/status/readyReplicas");
    let head = if kind == "Deployment" {
        vec![
            name,
            json!(format!("{ready}/{desired}")),
            json!(int_at(o, "/status/updatedReplicas")),
            json!(int_at(o, "/status/availableReplicas")),
        ]
    } else {
        vec![
            name,
            json!(desired),
            json!(int_at(o, "/status/replicas")),
            json!(ready),
        ]
    };
    let mut row = head;
    row.extend([
        json!(age(created(o), now)),
        json!(containers),
        json!(images),
        json!(selector(o)),
    ]);
    row
}

fn columns(kind: &str) -> Vec<Value> {
    let c = |specs: &[(&str, &str, u8)]| specs.iter().map(|(n, t, p)| col(n, t, *p)).collect();
    match kind {
        "Node" => c(&[
            ("Name", "string", 0),
            ("Status", "string", 0),
            ("Roles", "string", 0),
            ("Age", "string", 0),
            ("Version", "string", 0),
            ("Internal-IP", "string", 1),
            ("External-IP", "string", 1),
            ("OS-Image", "string", 1),
            ("Kernel-Version", "string", 1),
            ("Container-Runtime", "string", 1),
        ]),
        "Event" => c(&[
            ("Last Seen", "string", 0),
            ("Type", "string", 0),
            ("Reason", "string", 0),
            ("Object", "string", 0),
            ("Subobject", "string", 1),
            ("Source", "string", 1),
            ("Message", "string", 0),
            ("First Seen", "string", 1),
            ("Count", "integer", 1),
            ("Name", "string", 1),
        ]),
        "Namespace" => c(&[
            ("Name", "string", 0),
            ("Status", "string", 0),
            ("Age", "string", 0),
        ]),
        "ConfigMap" => c(&[
            ("Name", "string", 0),
            ("Data", "integer", 0),
            ("Age", "string", 0),
        ]),
        "Secret" => c(&[
            ("Name", "string", 0),
            ("Type", "string", 0),
            ("Data", "integer", 0),
            ("Age", "string", 0),
        ]),
        "Deployment" => c(&[
            ("Name", "string", 0),
            ("Ready", "string", 0),
            ("Up-to-date", "integer", 0),
            ("Available", "integer", 0),
            ("Age", "string", 0),
            ("Containers", "string", 1),
            ("Images", "string", 1),
            ("Selector", "string", 1),
        ]),
        "ReplicaSet" => c(&[
            ("Name", "string", 0),
            ("Desired", "integer", 0),
            ("Current", "integer", 0),
            ("Ready", "integer", 0),
            ("Age", "string", 0),
            ("Containers", "string", 1),
            ("Images", "string", 1),
            ("Selector", "string", 1),
        ]),
        _ => c(&[
            ("Name", "string", 0),
            ("Ready", "string", 0),
            ("Status", "string", 0),
            ("Restarts", "integer", 0),
            ("Age", "string", 0),
            ("IP", "string", 1),
            ("Node", "string", 1),
            ("Nominated Node", "string", 1),
            ("Readiness Gates", "string", 1),
        ]),
    }
}

fn row(kind: &str, o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    match kind {
        "Node" => node_row(o, now),
        "Event" => event_row(o, now),
        "Namespace" => vec![
            json!(o.pointer("/metadata/name")),
            json!(o
                .pointer("/status/phase")
                .and_then(Value::as_str)
                .unwrap_or("Active")),
            json!(age(created(o), now)),
        ],
        "ConfigMap" => {
            let n = |f: &str| o.get(f).and_then(Value::as_object).map_or(0, |m| m.len());
            vec![
                json!(o.pointer("/metadata/name")),
                json!(n("data") + n("binaryData")),
                json!(age(created(o), now)),
            ]
        }
        "Secret" => vec![
            json!(o.pointer("/metadata/name")),
            json!(o.get("type").and_then(Value::as_str).unwrap_or("Opaque")),
            json!(o
                .get("data")
                .and_then(Value::as_object)
                .map_or(0, |m| m.len())),
            json!(age(created(o), now)),
        ],
        "Deployment" | "ReplicaSet" => workload_row(kind, o, now),
        _ => pod_row(o, now),
    }
}

/// Renders objects of `kind` as a `meta.k8s.io/v1` Table (row objects are PartialObjectMetadata).
pub fn render<'a>(
    kind: &str,
    items: impl Iterator<Item = &'a Value>,
    list_meta: Value,
    now: DateTime<Utc>,
) -> Value {
    let rows: Vec<Value> = items
        .map(|o| {
            json!({"cells": row(kind, o, now), "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                "metadata": o.get("metadata").cloned().unwrap_or(json!({}))}})
        })
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta,
        "columnDefinitions": columns(kind), "rows": rows})
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
        let e = json!({"metadata": {"name": "web.1"}, "involvedObject": {"kind": "Pod", "name": "web"},
            "reason": "Scheduled", "type": "Normal", "message": "Successfully assigned",
            "eventTime": "2026-01-01T00:58:00.000000Z", "count": 3, "source": {"component": "default-scheduler"}});
        let t = render("Event", [&e].into_iter(), json!({}), now);
        let cells = &t["rows"][0]["cells"];
        assert_eq!(cells[0], "2m0s (x3 over 2m0s)");
        assert_eq!(cells[3], "pod/web");
        assert_eq!(cells[5], "default-scheduler");
        let d = json!({"metadata": {"name": "d"}, "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "d"}},
            "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}},
            "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}});
        let t = render("Deployment", [&d].into_iter(), json!({}), now);
        assert_eq!(t["rows"][0]["cells"][1], "2/3");
        assert_eq!(t["rows"][0]["cells"][7], "app=d");
        let cm = json!({"metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}});
        assert_eq!(
            render("ConfigMap", [&cm].into_iter(), json!({}), now)["rows"][0]["cells"][1],
            2
        );
    }
}

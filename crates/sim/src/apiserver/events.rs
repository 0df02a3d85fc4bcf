//! `events.k8s.io/v1` Events are mirrored into core `v1` Events (a real apiserver stores both
//! versions once), so `kubectl get events` and `describe` show what kube-rs `Recorder` publishes.

use serde_json::{json, Value};

/// Converts an `events.k8s.io/v1` Event into the equivalent core `v1` Event.
pub fn to_core(ev: &Value) -> Value {
    let mut meta = ev.get("metadata").cloned().unwrap_or(json!({}));
    if let Some(m) = meta.as_object_mut() {
        for f in ["resourceVersion", "uid", "creationTimestamp", "generation"] {
            m.remove(f);
        }
    }
    let time = ev
        .get("deprecatedLastTimestamp")
        .filter(|v| !v.is_null())
        .or_else(|| ev.get("eventTime"))
        .cloned()
        .unwrap_or(Value::Null);
    let count = ev
        .pointer("/series/count")
        .or_else(|| ev.get("deprecatedCount"))
        .cloned()
        .unwrap_or(json!(1));
    let component = ev
        .get("reportingController")
        .cloned()
        .unwrap_or(Value::Null);
    json!({
        "metadata": meta,
        "involvedObject": ev.get("regarding").cloned().unwrap_or(json!({})),
        "related": ev.get("related").cloned().unwrap_or(Value::Null),
        "reason": ev.get("reason").cloned().unwrap_or(Value::Null),
        "message": ev.get("note").cloned().unwrap_or(Value::Null),
        "type": ev.get("type").cloned().unwrap_or(Value::Null),
        "action": ev.get("action").cloned().unwrap_or(Value::Null),
        "eventTime": ev.get("eventTime").cloned().unwrap_or(Value::Null),
        "firstTimestamp": ev.get("deprecatedFirstTimestamp").cloned().unwrap_or(Value::Null),
        "lastTimestamp": time,
        "count": count,
        "source": {"component": component},
        "reportingComponent": ev.get("reportingController").cloned().unwrap_or(Value::Null),
        "reportingInstance": ev.get("reportingInstance").cloned().unwrap_or(Value::Null),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn converts_the_fields_kubectl_shows() {
        let ev = json!({"metadata": {"name": "n1.abc", "namespace": "default", "resourceVersion": "9"},
            "regarding": {"kind": "Node", "name": "n1"}, "reason": "Cordoned", "note": "cordoned by nodekeeper",
            "type": "Normal", "reportingController": "nodekeeper", "eventTime": "2026-01-01T00:00:00.000000Z",
            "series": {"count": 3, "lastObservedTime": "2026-01-01T00:01:00.000000Z"}});
        let core = to_core(&ev);
        assert_eq!(core["involvedObject"]["name"], "n1");
        assert_eq!(core["message"], "cordoned by nodekeeper");
        assert_eq!(core["source"]["component"], "nodekeeper");
        assert_eq!(core["count"], 3);
        assert!(core["metadata"].get("resourceVersion").is_none());
    }
}

//! Create/update validation the real apiserver runs and nodekeeper could trip over:
//! Events (`pkg/apis/core/validation/events.go`: `legacyValidateEvent` for every version, and
//! the strict events.k8s.io/v1 checks on create). Errors are field errors rendered as the real
//! 422 `Status` (`Event.events.k8s.io "n1.x" is invalid: involvedObject.namespace: Invalid value:
//! "": does not match event.namespace`).

use serde_json::{json, Value};

use super::error::ApiError;
use super::resources::{well_known, ResourceDef};
use nodekeeper_core::k8s::validation as v;

/// Longest `reportingInstance` (`ReportingInstanceLengthLimit`).
const REPORTING_INSTANCE_LIMIT: usize = 128;
/// Longest `action`.
const ACTION_LIMIT: usize = 128;
/// Longest `reason`.
const REASON_LIMIT: usize = 128;
/// Longest `message` / `note`.
const NOTE_LIMIT: usize = 1024;

/// One field error (`k8s.io/apimachinery/pkg/util/validation/field.Error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Field path, e.g. `involvedObject.namespace`.
    pub field: String,
    /// `Required` or `Invalid` (with the bad value).
    pub kind: FieldErrorKind,
    /// Detail.
    pub detail: String,
}

/// The field error types used here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// `Required value`.
    Required,
    /// `Invalid value: "<value>"`.
    Invalid(String),
}

impl FieldError {
    fn required(field: &str) -> Self {
        FieldError {
            field: field.into(),
            kind: FieldErrorKind::Required,
            detail: String::new(),
        }
    }

    fn invalid(field: &str, value: &str, detail: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            kind: FieldErrorKind::Invalid(value.into()),
            detail: detail.into(),
        }
    }

    /// `ErrorBody()`: the message without the field.
    pub fn body(&self) -> String {
        let mut s = match &self.kind {
            FieldErrorKind::Required => "Required value".to_string(),
            // %q of a Go string.
            FieldErrorKind::Invalid(value) => format!("Invalid value: {}", json!(value)),
        };
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }

    fn cause_reason(&self) -> &'static str {
        match self.kind {
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::Invalid(_) => "FieldValueInvalid",
        }
    }
}

/// The 422 for `errors` about object `name` of `res` (`apierrors.NewInvalid`).
pub fn invalid(res: &ResourceDef, name: &str, errors: &[FieldError]) -> ApiError {
    let qualified_kind = if res.group.is_empty() {
        res.kind.to_string()
    } else {
        format!("{}.{}", res.kind, res.group)
    };
    let each: Vec<String> = errors
        .iter()
        .map(|e| format!("{}: {}", e.field, e.body()))
        .collect();
    let aggregate = match each.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    let causes: Vec<Value> = errors
        .iter()
        .map(|e| json!({"reason": e.cause_reason(), "message": e.body(), "field": e.field}))
        .collect();
    ApiError::new(
        422,
        "Invalid",
        format!("{qualified_kind} \"{name}\" is invalid: {aggregate}"),
    )
    .with_details(json!({"name": name, "group": res.group, "kind": res.kind, "causes": causes}))
}

fn s<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get(field).and_then(Value::as_str).unwrap_or_default()
}

fn set(obj: &Value, field: &str) -> bool {
    obj.get(field).is_some_and(|v| !v.is_null())
}

/// An Event's fields under their internal (core) names, whatever version it was written in.
struct EventFields<'a> {
    namespace: &'a str,
    involved_namespace: &'a str,
    event_time: bool,
    reporting_controller: &'a str,
    reporting_instance: &'a str,
    action: &'a str,
    reason: &'a str,
    message: &'a str,
}

fn event_fields<'a>(obj: &'a Value, ns: &'a str, v1: bool) -> EventFields<'a> {
    let (involved, message, controller) = if v1 {
        ("regarding", "note", "reportingController")
    } else {
        ("involvedObject", "message", "reportingComponent")
    };
    EventFields {
        namespace: ns,
        involved_namespace: obj
            .get(involved)
            .map(|o| s(o, "namespace"))
            .unwrap_or_default(),
        event_time: set(obj, "eventTime"),
        reporting_controller: s(obj, controller),
        reporting_instance: s(obj, "reportingInstance"),
        action: s(obj, "action"),
        reason: s(obj, "reason"),
        message: s(obj, message),
    }
}

/// `legacyValidateEvent`: every Event, every version, create and update.
fn legacy(e: &EventFields<'_>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mismatch = || {
        FieldError::invalid(
            "involvedObject.namespace",
            e.involved_namespace,
            "does not match event.namespace",
        )
    };
    if !e.event_time {
        // An "old" Event (no eventTime): the namespaces must agree (or "default" for old clients).
        if e.involved_namespace.is_empty() {
            if !e.namespace.is_empty() && e.namespace != "default" {
                errs.push(mismatch());
            }
        } else if e.namespace != e.involved_namespace {
            errs.push(mismatch());
        }
    } else {
        if e.involved_namespace.is_empty()
            && e.namespace != "default"
            && e.namespace != "kube-system"
        {
            errs.push(mismatch());
        }
        if e.reporting_controller.is_empty() {
            errs.push(FieldError::required("reportingController"));
        }
        for m in v::qualified_name(e.reporting_controller) {
            errs.push(FieldError::invalid(
                "reportingController",
                e.reporting_controller,
                m,
            ));
        }
        if e.reporting_instance.is_empty() {
            errs.push(FieldError::required("reportingInstance"));
        }
        if e.reporting_instance.len() > REPORTING_INSTANCE_LIMIT {
            errs.push(FieldError::invalid(
                "reportingInstance",
                "",
                format!("can have at most {REPORTING_INSTANCE_LIMIT} characters"),
            ));
        }
        if e.action.is_empty() {
            errs.push(FieldError::required("action"));
        }
        if e.action.len() > ACTION_LIMIT {
            errs.push(FieldError::invalid(
                "action",
                "",
                format!("can have at most {ACTION_LIMIT} characters"),
            ));
        }
        if e.reason.is_empty() {
            errs.push(FieldError::required("reason"));
        }
        if e.reason.len() > REASON_LIMIT {
            errs.push(FieldError::invalid(
                "reason",
                "",
                format!("can have at most {REASON_LIMIT} characters"),
            ));
        }
        if e.message.len() > NOTE_LIMIT {
            errs.push(FieldError::invalid(
                "message",
                "",
                format!("can have at most {NOTE_LIMIT} characters"),
            ));
        }
    }
    for m in v::dns1123_subdomain(e.namespace) {
        errs.push(FieldError::invalid("namespace", e.namespace, m));
    }
    errs
}

/// The strict checks of an events.k8s.io/v1 create (`ValidateEventCreate` past the legacy part).
fn strict_v1_create(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(series) = obj.get("series").filter(|x| !x.is_null()) {
        if series.get("count").and_then(Value::as_i64).unwrap_or(0) < 2 {
            errs.push(FieldError::invalid(
                "series.count",
                "",
                "should be at least 2",
            ));
        }
        if !set(series, "lastObservedTime") {
            errs.push(FieldError::required("series.lastObservedTime"));
        }
    }
    if !set(obj, "eventTime") {
        errs.push(FieldError::required("eventTime"));
    }
    let type_ = s(obj, "type");
    if type_ != "Normal" && type_ != "Warning" {
        errs.push(FieldError::invalid(
            "type",
            "",
            format!("has invalid value: {type_}"),
        ));
    }
    if set(obj, "deprecatedFirstTimestamp") {
        errs.push(FieldError::invalid(
            "firstTimestamp",
            "",
            "needs to be unset",
        ));
    }
    if set(obj, "deprecatedLastTimestamp") {
        errs.push(FieldError::invalid(
            "lastTimestamp",
            "",
            "needs to be unset",
        ));
    }
    if obj
        .get("deprecatedCount")
        .and_then(Value::as_i64)
        .is_some_and(|c| c != 0)
    {
        errs.push(FieldError::invalid("count", "", "needs to be unset"));
    }
    if let Some(src) = obj.get("deprecatedSource") {
        if !s(src, "component").is_empty() || !s(src, "host").is_empty() {
            errs.push(FieldError::invalid("source", "", "needs to be unset"));
        }
    }
    errs
}

/// Validates a create of `obj` (named `name`, in `ns`) into `res`.
pub fn on_create(res: &ResourceDef, ns: &str, name: &str, obj: &Value) -> Result<(), ApiError> {
    let errs = if std::ptr::eq(res, well_known::new_events()) {
        let mut e = legacy(&event_fields(obj, ns, true));
        e.extend(strict_v1_create(obj));
        e
    } else if std::ptr::eq(res, well_known::events()) {
        legacy(&event_fields(obj, ns, false))
    } else {
        return Ok(());
    };
    match errs.is_empty() {
        true => Ok(()),
        false => Err(invalid(res, name, &errs)),
    }
}

/// Validates an update (the legacy rules: `ValidateEventUpdate` always runs them).
pub fn on_update(res: &ResourceDef, ns: &str, name: &str, obj: &Value) -> Result<(), ApiError> {
    let errs = if std::ptr::eq(res, well_known::new_events()) {
        legacy(&event_fields(obj, ns, true))
    } else if std::ptr::eq(res, well_known::events()) {
        legacy(&event_fields(obj, ns, false))
    } else {
        return Ok(());
    };
    match errs.is_empty() {
        true => Ok(()),
        false => Err(invalid(res, name, &errs)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn node_event() -> Value {
        json!({"metadata": {"name": "n1.abcde"}, "eventTime": "2026-01-01T00:00:00.000000Z",
            "regarding": {"kind": "Node", "name": "n1", "apiVersion": "v1"},
            "reason": "AgentSilent", "action": "MarkUnknown", "note": "x", "type": "Warning",
            "reportingController": "nodekeeper.io/controller", "reportingInstance": "c-1"})
    }

    #[test]
    fn node_events_only_in_default_or_kube_system() {
        let res = well_known::new_events();
        for ns in ["default", "kube-system"] {
            on_create(res, ns, "n1.abcde", &node_event()).unwrap();
        }
        let err = on_create(res, "nodekeeper", "n1.abcde", &node_event()).unwrap_err();
        assert_eq!(err.code, 422);
        assert_eq!(
            err.message,
            "Event.events.k8s.io \"n1.abcde\" is invalid: involvedObject.namespace: Invalid value: \"\": does not match event.namespace"
        );
        let d = err.details.unwrap();
        assert_eq!(d["causes"][0]["field"], "involvedObject.namespace");
        assert_eq!(d["causes"][0]["reason"], "FieldValueInvalid");
        assert_eq!(d["kind"], "Event");
        assert_eq!(d["group"], "events.k8s.io");
        // A namespaced object's Event lives anywhere (legacy checks nothing more with eventTime).
        let mut pod = node_event();
        pod["regarding"] = json!({"kind": "Pod", "name": "p", "namespace": "web"});
        on_create(res, "nodekeeper", "p.x", &pod).unwrap();
    }

    #[test]
    fn v1_field_rules() {
        let res = well_known::new_events();
        let with = |f: &str, v: Value| {
            let mut e = node_event();
            e[f] = v;
            on_create(res, "default", "n1.abcde", &e)
                .unwrap_err()
                .message
        };
        assert!(with("type", json!("Info"))
            .contains("type: Invalid value: \"\": has invalid value: Info"));
        assert!(with("reason", json!("")).contains("reason: Required value"));
        assert!(with("reason", json!("R".repeat(129))).contains("can have at most 128 characters"));
        assert!(with("action", json!("")).contains("action: Required value"));
        assert!(with("note", json!("x".repeat(1025))).contains("message: Invalid value"));
        assert!(with("reportingController", json!("bad name!"))
            .contains("reportingController: Invalid value: \"bad name!\""));
        assert!(with("reportingInstance", json!("i".repeat(129))).contains("reportingInstance"));
        assert!(with("eventTime", Value::Null).contains("eventTime: Required value"));
        assert!(with("deprecatedCount", json!(3)).contains("count: Invalid value"));
        // Several errors: the aggregate form.
        let mut e = node_event();
        e["reason"] = json!("");
        e["action"] = json!("");
        let m = on_create(res, "default", "n1.abcde", &e)
            .unwrap_err()
            .message;
        assert!(
            m.ends_with("[action: Required value, reason: Required value]"),
            "{m}"
        );
    }

    #[test]
    fn core_events_get_the_legacy_rules_only() {
        let res = well_known::events();
        // Old-style (no eventTime) Node event in default: fine; elsewhere: refused.
        let ev =
            json!({"involvedObject": {"kind": "Node", "name": "n1"}, "reason": "x", "type": "Odd"});
        on_create(res, "default", "n1.1", &ev).unwrap();
        assert!(on_create(res, "nodekeeper", "n1.1", &ev).is_err());
        let pod = json!({"involvedObject": {"kind": "Pod", "name": "p", "namespace": "a"}});
        assert!(on_create(res, "b", "p.1", &pod).is_err());
        on_create(res, "a", "p.1", &pod).unwrap();
    }
}

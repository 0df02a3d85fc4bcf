//! API errors rendered as Kubernetes `Status` bodies.

use serde_json::{json, Value};

use super::resources::ResourceDef;

/// An error answered to the client as a `Status` object.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{reason} ({code}): {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// Machine-readable reason (`NotFound`, `Conflict`, ...).
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    /// `details` of the Status (name, kind, causes).
    pub details: Option<Value>,
}

impl ApiError {
    /// A new error without details.
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    /// Adds `details`.
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// 404 for an object.
    pub fn not_found(res: &ResourceDef, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{}\" not found", res.qualified(), name),
        )
        .with_details(json!({"name": name, "group": res.group, "kind": res.plural}))
    }

    /// 409 AlreadyExists.
    pub fn already_exists(res: &ResourceDef, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{}\" already exists", res.qualified(), name),
        )
        .with_details(json!({"name": name, "group": res.group, "kind": res.plural}))
    }

    /// 409 Conflict on a stale resourceVersion or failed precondition.
    pub fn conflict(res: &ResourceDef, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{}\": {}",
                res.qualified(),
                name,
                why
            ),
        )
        .with_details(json!({"name": name, "group": res.group, "kind": res.plural}))
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 422 Invalid.
    pub fn invalid(res: &ResourceDef, name: &str, field: &str, message: &str) -> Self {
        Self::new(
            422,
            "Invalid",
            format!(
                "{} \"{}\" is invalid: {}: {}",
                res.kind, name, field, message
            ),
        )
        .with_details(json!({"name": name, "group": res.group, "kind": res.kind,
            "causes": [{"reason": "FieldValueInvalid", "message": message, "field": field}]}))
    }

    /// 403 from NamespaceLifecycle admission: no new content (creates, evictions) in a namespace
    /// that is being deleted. `res`/`name` are the object being created (`pods`, the pod's name
    /// for an eviction).
    pub fn namespace_terminating(res: &ResourceDef, name: &str, ns: &str) -> Self {
        Self::new(
            403,
            "Forbidden",
            format!(
                "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                res.qualified()
            ),
        )
        .with_details(json!({"name": name, "group": res.group, "kind": res.plural,
            "causes": [{"reason": "NamespaceTerminating",
                "message": format!("namespace {ns} is being terminated"), "field": "metadata.namespace"}]}))
    }

    /// 410 Gone (watch from a compacted resourceVersion).
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The `Status` body.
    pub fn to_status(&self) -> Value {
        let mut s = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code});
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

/// Result alias for API operations.
pub type ApiResult<T> = Result<T, ApiError>;

//! Kubernetes Events the controller records; their reasons are the catalog's ([`crate::controller::catalog`]).
//!
//! Events are `events.k8s.io/v1` objects about a Node, reported by `nodekeeper-controller`, in
//! namespace [`NODE_EVENT_NAMESPACE`] (`default`): the apiserver refuses (422, `legacyValidateEvent`)
//! an Event about a cluster-scoped object in any namespace but `default` or `kube-system`. The
//! controller's own namespace (`[controller] namespace`) holds only its Lease.
//!
//! `regarding.uid` is the Node's real `metadata.uid` (from the node cache, else a GET; left out
//! when the node cannot be found), the controllers' convention `kubectl describe node` matches.
//! Every Event is checked against the apiserver's events.k8s.io/v1 rules before it is sent
//! ([`build`]); agent-supplied reasons are made valid with [`sanitize_reason`].
//!
//! Recording is best effort: a failure is logged and counted, never fails the report.

use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};

use crate::controller::catalog::{EventType, Reason};

/// The namespace of every Event about a Node. The apiserver accepts an Event whose `regarding`
/// object has no namespace only in `default` or `kube-system`; `default` is where kubelets and
/// the node controllers record theirs (and where `kubectl get events` looks by default). The
/// controller needs `create` on `events.k8s.io` `events` here (a Role in `default`).
pub const NODE_EVENT_NAMESPACE: &str = "default";

/// The `reportingController` of every event (a qualified name, as the apiserver requires).
pub const REPORTING_CONTROLLER: &str = "nodekeeper.io/controller";

/// Longest `reason` (events.k8s.io/v1).
pub const MAX_REASON: usize = 128;
/// Longest `action`.
pub const MAX_ACTION: usize = 128;
/// Longest `note`, in bytes.
pub const MAX_NOTE: usize = 1024;
/// Longest `reportingInstance`.
pub const MAX_INSTANCE: usize = 128;

/// The reason of an agent's check event whose own reason has nothing usable left.
pub const FALLBACK_CHECK_REASON: &str = "NodeCheckEvent";

/// The Node an Event is about: its name, and its `metadata.uid` when the caller has the Node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Regarding<'a> {
    /// Node name.
    pub name: &'a str,
    /// Node `metadata.uid` (`None`: the recorder looks it up).
    pub uid: Option<&'a str>,
}

impl<'a> From<&'a str> for Regarding<'a> {
    fn from(name: &'a str) -> Self {
        Regarding { name, uid: None }
    }
}

impl<'a> From<&'a String> for Regarding<'a> {
    fn from(name: &'a String) -> Self {
        Regarding {
            name: name.as_str(),
            uid: None,
        }
    }
}

impl<'a> From<&'a Node> for Regarding<'a> {
    fn from(n: &'a Node) -> Self {
        Regarding {
            name: n.metadata.name.as_deref().unwrap_or_default(),
            uid: n.metadata.uid.as_deref(),
        }
    }
}

/// Why an Event was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// A field breaks the apiserver's events.k8s.io/v1 rules (a bug in the caller: nothing is sent).
    #[error("event {reason:?} about node {node}: {field} {problem}")]
    Invalid {
        /// Node.
        node: String,
        /// The event's reason.
        reason: String,
        /// The offending field.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// The apiserver refused or could not be reached.
    #[error("cannot record event {reason} about node {node}: {source}")]
    Create {
        /// Node.
        node: String,
        /// The event's reason.
        reason: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

/// Whether `reason` is a valid Event reason: 1–128 ASCII alphanumerics, starting with an
/// uppercase letter (`UpperCamelCase`, as the reason catalog and Kubernetes' own reasons are).
pub fn valid_reason(reason: &str) -> bool {
    !reason.is_empty()
        && reason.len() <= MAX_REASON
        && reason.as_bytes()[0].is_ascii_uppercase()
        && reason.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Makes a free-form reason (an agent's check event) valid: every run of ASCII alphanumerics
/// becomes a word with an uppercase first letter (`oom killing` → `OomKilling`, `OOMKilling`
/// stays), a leading digit gets a `Node` prefix, the result is cut to 128 characters; nothing
/// usable left gives [`FALLBACK_CHECK_REASON`].
pub fn sanitize_reason(raw: &str) -> String {
    let mut out = String::new();
    for word in raw.split(|c: char| !c.is_ascii_alphanumeric()) {
        let mut chars = word.chars();
        if let Some(first) = chars.next() {
            out.push(first.to_ascii_uppercase());
            out.extend(chars);
        }
    }
    if out.is_empty() {
        return FALLBACK_CHECK_REASON.to_string();
    }
    if out.as_bytes()[0].is_ascii_digit() {
        out.insert_str(0, "Node");
    }
    // ASCII only: any byte index is a char boundary.
    out.truncate(MAX_REASON);
    out
}

/// `note` cut to at most [`MAX_NOTE`] bytes on a char boundary (ending in `...` when cut).
pub fn truncate_note(note: &str) -> String {
    if note.len() <= MAX_NOTE {
        return note.to_string();
    }
    let mut cut = MAX_NOTE - 3;
    while !note.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &note[..cut])
}

/// `instance` made a valid `reportingInstance`: cut to [`MAX_INSTANCE`] bytes on a char
/// boundary; empty becomes `nodekeeper-controller`.
pub fn reporting_instance(instance: &str) -> String {
    if instance.is_empty() {
        return "nodekeeper-controller".to_string();
    }
    let mut cut = instance.len().min(MAX_INSTANCE);
    while !instance.is_char_boundary(cut) {
        cut -= 1;
    }
    instance[..cut].to_string()
}

/// What one Event says.
#[derive(Debug, Clone, Copy)]
pub struct EventSpec<'a> {
    /// Reason (see [`valid_reason`]).
    pub reason: &'a str,
    /// Normal or Warning.
    pub type_: EventType,
    /// What was done (`Notice`, `Disrupt`, ...), 1–128 characters.
    pub action: &'a str,
    /// Human-readable text (cut to 1024 bytes).
    pub note: &'a str,
}

/// `NODE.<hex nanoseconds>`, as client-go's recorder names Events (a `generateName` of `NODE.` is refused:
/// a generated name's prefix must itself be a DNS subdomain, and may not end in `.`). The node part is cut
/// so the name stays within 253 characters.
fn event_name(node: &str, now: k8s_openapi::jiff::Timestamp) -> String {
    let suffix = format!(".{:x}", now.as_nanosecond().max(0));
    let mut cut = node.len().min(253 - suffix.len());
    while !node.is_char_boundary(cut) {
        cut -= 1;
    }
    let head = node[..cut].trim_end_matches(['.', '-']);
    format!("{head}{suffix}")
}

/// The Event for `spec` about `node` (with `uid` when known), checked against the apiserver's
/// events.k8s.io/v1 rules. `instance` must already be a valid `reportingInstance`.
pub fn build(
    node: &str,
    uid: Option<&str>,
    spec: &EventSpec<'_>,
    instance: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> Result<Event, EventError> {
    let invalid = |field: &'static str, problem: String| EventError::Invalid {
        node: node.to_string(),
        reason: spec.reason.to_string(),
        field,
        problem,
    };
    if !valid_reason(spec.reason) {
        return Err(invalid(
            "reason",
            format!(
                "must be 1-{MAX_REASON} ASCII letters and digits starting with an uppercase letter"
            ),
        ));
    }
    if spec.action.is_empty() || spec.action.len() > MAX_ACTION {
        return Err(invalid(
            "action",
            format!("must be 1-{MAX_ACTION} characters"),
        ));
    }
    if instance.is_empty() || instance.len() > MAX_INSTANCE {
        return Err(invalid(
            "reportingInstance",
            format!("must be 1-{MAX_INSTANCE} characters"),
        ));
    }
    crate::k8s::validation::check(crate::k8s::validation::qualified_name(REPORTING_CONTROLLER))
        .map_err(|e| invalid("reportingController", e))?;
    crate::k8s::validation::check(crate::k8s::validation::dns1123_subdomain(node))
        .map_err(|e| invalid("regarding.name", e))?;
    Ok(Event {
        metadata: ObjectMeta {
            name: Some(event_name(node, now)),
            namespace: Some(NODE_EVENT_NAMESPACE.to_string()),
            ..Default::default()
        },
        event_time: Some(MicroTime(now)),
        action: Some(spec.action.into()),
        reason: Some(spec.reason.into()),
        note: Some(truncate_note(spec.note)),
        type_: Some(spec.type_.as_str().into()),
        reporting_controller: Some(REPORTING_CONTROLLER.into()),
        reporting_instance: Some(instance.to_string()),
        regarding: Some(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.into()),
            uid: uid.map(str::to_string),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// Records Events about Nodes.
#[derive(Clone)]
pub struct Recorder {
    api: Api<Event>,
    nodes: Api<Node>,
    cache: Option<Store<Node>>,
    instance: String,
    /// Events that could not be written (refused, unreachable or invalid).
    pub failures: std::sync::Arc<AtomicU64>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl Recorder {
    /// A recorder writing into [`NODE_EVENT_NAMESPACE`] as replica `instance` (cut to a valid
    /// `reportingInstance`), looking node UIDs up in `cache` first (then with a GET).
    pub fn new(client: kube::Client, instance: &str, cache: Option<Store<Node>>) -> Self {
        Recorder {
            api: Api::namespaced(client.clone(), NODE_EVENT_NAMESPACE),
            nodes: Api::all(client),
            cache,
            instance: reporting_instance(instance),
            failures: Default::default(),
        }
    }

    /// Records `reason` about `node` with `note` (truncated to 1 kB), of the reason's type.
    pub async fn node<'a>(
        &self,
        node: impl Into<Regarding<'a>>,
        reason: Reason,
        action: &str,
        note: &str,
    ) {
        self.node_as(node, reason, reason.event_type(), action, note)
            .await;
    }

    /// As [`Self::node`], of type `type_` (one of the reason's types: an Event the policy decided).
    pub async fn node_as<'a>(
        &self,
        node: impl Into<Regarding<'a>>,
        reason: Reason,
        type_: EventType,
        action: &str,
        note: &str,
    ) {
        self.node_with(node, reason.as_str(), type_, action, note)
            .await;
    }

    /// Records an agent's check event: its reason comes from the user's rules, not the catalog,
    /// and is made valid with [`sanitize_reason`] (action `Check`).
    pub async fn check<'a>(
        &self,
        node: impl Into<Regarding<'a>>,
        raw_reason: &str,
        type_: EventType,
        note: &str,
    ) {
        let reason = sanitize_reason(raw_reason);
        self.node_with(node, &reason, type_, "Check", note).await;
    }

    /// Records an Event. Best effort: failures are logged and counted.
    async fn node_with<'a>(
        &self,
        node: impl Into<Regarding<'a>>,
        reason: &str,
        type_: EventType,
        action: &str,
        note: &str,
    ) {
        let node = node.into();
        let spec = EventSpec {
            reason,
            type_,
            action,
            note,
        };
        if let Err(e) = self.record(node, &spec).await {
            self.failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(node = node.name, reason, error = %e, "cannot record event");
        }
    }

    /// Records one Event, or says why not.
    pub async fn record(
        &self,
        node: Regarding<'_>,
        spec: &EventSpec<'_>,
    ) -> Result<(), EventError> {
        let uid = match node.uid {
            Some(u) => Some(u.to_string()),
            None => self.uid_of(node.name).await,
        };
        let ev = build(
            node.name,
            uid.as_deref(),
            spec,
            &self.instance,
            k8s_openapi::jiff::Timestamp::now(),
        )?;
        self.api
            .create(&PostParams::default(), &ev)
            .await
            .map(|_| ())
            .map_err(|source| EventError::Create {
                node: node.name.to_string(),
                reason: spec.reason.to_string(),
                source,
            })
    }

    /// The node's `metadata.uid`: from the cache, else a GET; `None` when the node is not found.
    async fn uid_of(&self, node: &str) -> Option<String> {
        if let Some(uid) = self
            .cache
            .as_ref()
            .and_then(|c| c.get(&ObjectRef::new(node)))
            .and_then(|n| n.metadata.uid.clone())
        {
            return Some(uid);
        }
        match self.nodes.get_opt(node).await {
            Ok(n) => n.and_then(|n| n.metadata.uid),
            Err(e) => {
                tracing::debug!(node, error = %e, "cannot look the node's uid up; the event goes without it");
                None
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {

    /// Every reason of the catalog is one kube-apiserver accepts.
    #[test]
    fn every_catalog_reason_is_a_valid_reason() {
        for r in crate::controller::catalog::Reason::ALL {
            assert!(super::valid_reason(r.as_str()), "{r:?}");
        }
    }

    #[test]
    fn event_names_are_valid_object_names_as_client_go_makes_them() {
        let t = k8s_openapi::jiff::Timestamp::from_nanosecond(1_700_000_000_123_456_789).unwrap();
        assert_eq!(event_name("ev-0", t), "ev-0.17979cfe3d85cd15");
        let long = "a".repeat(253);
        let n = event_name(&long, t);
        assert_eq!(n.len(), 253);
        assert!(
            crate::k8s::validation::dns1123_subdomain(&n).is_empty(),
            "{n}"
        );
        // A cut that would leave the node part ending in '.' or '-' drops those.
        let dotted = format!("{}.b", "a".repeat(235));
        let n = event_name(&dotted, t);
        assert!(
            crate::k8s::validation::dns1123_subdomain(&n).is_empty(),
            "{n}"
        );
    }

    use super::*;
    use proptest::prelude::*;

    fn spec<'a>(reason: &'a str, action: &'a str, note: &'a str) -> EventSpec<'a> {
        EventSpec {
            reason,
            type_: EventType::Warning,
            action,
            note,
        }
    }

    fn now() -> k8s_openapi::jiff::Timestamp {
        k8s_openapi::jiff::Timestamp::now()
    }

    #[test]
    fn the_constants_are_valid() {
        assert!(crate::k8s::validation::qualified_name(REPORTING_CONTROLLER).is_empty());
        assert!(crate::k8s::validation::dns1123_label(NODE_EVENT_NAMESPACE).is_empty());
    }

    #[test]
    fn node_events_live_in_default_with_the_real_uid() {
        let ev = build(
            "n1",
            Some("0b9d-uid"),
            &spec("AgentSilent", "MarkUnknown", "x"),
            "a",
            now(),
        )
        .unwrap();
        assert_eq!(ev.metadata.namespace.as_deref(), Some("default"));
        let r = ev.regarding.unwrap();
        assert_eq!(r.uid.as_deref(), Some("0b9d-uid"));
        assert_eq!(
            (r.kind.as_deref(), r.name.as_deref(), r.namespace),
            (Some("Node"), Some("n1"), None)
        );
        assert_eq!(ev.type_.as_deref(), Some("Warning"));
        // Unknown uid: left out, never the name.
        let ev = build(
            "n1",
            None,
            &spec("AgentSilent", "MarkUnknown", "x"),
            "a",
            now(),
        )
        .unwrap();
        assert_eq!(ev.regarding.unwrap().uid, None);
    }

    #[test]
    fn invalid_fields_are_refused_before_sending() {
        let long = "A".repeat(129);
        let cases = [
            (spec("", "Check", "n"), "reason"),
            (spec("lowercase", "Check", "n"), "reason"),
            (spec("Has Space", "Check", "n"), "reason"),
            (spec(&long, "Check", "n"), "reason"),
            (spec("Fine", "", "n"), "action"),
        ];
        for (s, field) in cases {
            match build("n1", None, &s, "a", now()) {
                Err(EventError::Invalid { field: f, .. }) => assert_eq!(f, field, "{s:?}"),
                other => panic!("{s:?}: {other:?}"),
            }
        }
        let long_action = "a".repeat(129);
        assert!(build("n1", None, &spec("Fine", &long_action, "n"), "a", now()).is_err());
        assert!(build("n1", None, &spec("Fine", "Check", "n"), "", now()).is_err());
        assert!(build(
            "n1",
            None,
            &spec("Fine", "Check", "n"),
            &"i".repeat(129),
            now()
        )
        .is_err());
        assert!(build("N_1", None, &spec("Fine", "Check", "n"), "a", now()).is_err());
    }

    #[test]
    fn notes_are_cut_on_a_char_boundary() {
        let note = "é".repeat(600); // 1200 bytes
        let cut = truncate_note(&note);
        assert!(cut.len() <= MAX_NOTE, "{}", cut.len());
        assert!(cut.ends_with("..."));
        assert_eq!(truncate_note("short"), "short");
        let exact = "x".repeat(MAX_NOTE);
        assert_eq!(truncate_note(&exact), exact);
    }

    #[test]
    fn instances_are_cut() {
        assert_eq!(reporting_instance(""), "nodekeeper-controller");
        let long = "ü".repeat(100); // 200 bytes
        let r = reporting_instance(&long);
        assert!(r.len() <= MAX_INSTANCE && long.starts_with(&r));
    }

    #[test]
    fn sanitize_table() {
        for (raw, want) in [
            ("OOMKilling", "OOMKilling"),
            ("oom killing", "OomKilling"),
            ("task-hung: blocked", "TaskHungBlocked"),
            ("", FALLBACK_CHECK_REASON),
            ("  --  ", FALLBACK_CHECK_REASON),
            ("ümlaut", "Mlaut"),
            ("42 errors", "Node42Errors"),
        ] {
            assert_eq!(sanitize_reason(raw), want, "{raw:?}");
        }
        assert_eq!(sanitize_reason(&"a".repeat(500)).len(), MAX_REASON);
    }

    /// Created Events: (path, body).
    type Created = std::sync::Arc<std::sync::Mutex<Vec<(String, serde_json::Value)>>>;

    /// A client whose apiserver knows node `n1` (uid `u-123`) when `known`, accepts Events, and
    /// keeps the created Events' bodies and paths.
    fn mock(known: bool) -> (kube::Client, Created) {
        let created: Created = Created::default();
        let log = created.clone();
        let svc = tower::service_fn(move |req: hyper::Request<kube::client::Body>| {
            let log = log.clone();
            async move {
                let (parts, body) = req.into_parts();
                let path = parts.uri.path().to_string();
                let (code, out) = match (parts.method.as_str(), path.as_str()) {
                    ("GET", "/api/v1/nodes/n1") if known => (
                        200,
                        serde_json::json!({"metadata": {"name": "n1", "uid": "u-123"}}),
                    ),
                    ("GET", _) => (
                        404,
                        serde_json::json!({"kind": "Status", "apiVersion": "v1",
                        "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
                    ),
                    ("POST", _) => {
                        let bytes = http_body_util::BodyExt::collect(body)
                            .await
                            .unwrap()
                            .to_bytes();
                        let ev: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                        log.lock().unwrap().push((path.clone(), ev.clone()));
                        (201, ev)
                    }
                    _ => (500, serde_json::json!({})),
                };
                hyper::Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(serde_json::to_vec(&out).unwrap()))
            }
        });
        (kube::Client::new(svc, "nodekeeper"), created)
    }

    #[tokio::test]
    async fn the_uid_is_looked_up_never_invented() {
        let s = spec("AgentSilent", "MarkUnknown", "x");
        // Not in a cache: a GET finds it.
        let (c, created) = mock(true);
        let r = Recorder::new(c, "replica-a", None);
        r.record("n1".into(), &s).await.unwrap();
        // Passed by the caller: used as is.
        r.record(
            Regarding {
                name: "n1",
                uid: Some("from-cache"),
            },
            &s,
        )
        .await
        .unwrap();
        // Unknown node: no uid at all (not the name).
        let (c, unknown) = mock(false);
        Recorder::new(c, "replica-a", None)
            .record("n1".into(), &s)
            .await
            .unwrap();
        let got = created.lock().unwrap().clone();
        assert_eq!(got.len(), 2);
        for (path, _) in &got {
            assert_eq!(path, "/apis/events.k8s.io/v1/namespaces/default/events");
        }
        assert_eq!(got[0].1["regarding"]["uid"], "u-123");
        assert_eq!(got[1].1["regarding"]["uid"], "from-cache");
        assert_eq!(got[0].1["reportingInstance"], "replica-a");
        let none = unknown.lock().unwrap().clone();
        assert_eq!(none[0].1["regarding"].get("uid"), None, "{:?}", none[0].1);
    }

    proptest! {
        #[test]
        fn sanitized_reasons_are_always_valid(raw in "\\PC{0,300}") {
            let r = sanitize_reason(&raw);
            prop_assert!(valid_reason(&r), "{:?} -> {:?}", raw, r);
            prop_assert!(build("n1", None, &spec(&r, "Check", &raw), "a", now()).is_ok());
        }

        #[test]
        fn notes_never_exceed_the_limit(note in "\\PC{0,1500}") {
            let t = truncate_note(&note);
            prop_assert!(t.len() <= MAX_NOTE);
            prop_assert!(note.starts_with(t.trim_end_matches("...")));
        }
    }
}

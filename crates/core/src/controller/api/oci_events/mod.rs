//! OCI Events ingestion through an OCI Notifications HTTPS subscription.
//!
//! - Authentication ([`authenticate`]): a shared secret, in one of the two forms an OCI
//!   Notifications HTTPS subscription can send (it sends no custom header): the last URL path
//!   segment (`<path>/<token>`), or HTTP Basic authentication (`https://<username>:<token>@host<path>`);
//!   a configured header only as an opt-in extra. Compared in constant time. Anything else is 401
//!   with `WWW-Authenticate: Basic` and no body, counted (`nodekeeper_oci_events_unauthorized_total`).
//! - A malformed envelope is 400 naming the field ([`Refusal::Malformed`]); an event type not
//!   handled, or an instance that is no Node, is 200 (the latter logged once per instance).
//! - Subscription confirmation: a message with a `ConfirmationURL` (body) or the
//!   `X-OCI-NS-ConfirmationURL` header is confirmed by a GET of that URL (when enabled).
//! - Events: `com.oraclecloud.computeapi.instancepreemptionaction` (Preemption),
//!   `com.oraclecloud.computeapi.instancemaintenance` (Maintenance; `CANCELED` → Cancelled) and
//!   `…computeapi.maintenancerescheduled` (Maintenance with the new window, hence a new id). The
//!   instance OCID (`data.additionalDetails.instanceId`, else `data.resourceId`) is mapped to a Node
//!   by `spec.providerID` (`oci://<ocid>` or the bare OCID), then handed to the node-state layer as
//!   the same [`NodeEvent`] an agent would send, deduplicated by its deterministic id.

use std::collections::BTreeMap;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::Utc;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::Store;
use serde_json::{json, Value};

use crate::controller::config::OciEventsConfig;
use crate::wire::{event_id, Cloud, EventKind, NodeEvent, NODE_EVENT_VERSION};

pub mod handler;

/// Event type of a preemption.
pub const PREEMPTION: &str = "com.oraclecloud.computeapi.instancepreemptionaction";
/// Event type of a maintenance event.
pub const MAINTENANCE: &str = "com.oraclecloud.computeapi.instancemaintenance";
/// Event type of a rescheduled maintenance.
pub const RESCHEDULED: &str = "com.oraclecloud.computeapi.maintenancerescheduled";
/// Event type of a maintenance that begins now.
pub const MAINTENANCE_BEGIN: &str = "com.oraclecloud.computeapi.instancemaintenance.begin";
/// Event type of a maintenance that ended.
pub const MAINTENANCE_END: &str = "com.oraclecloud.computeapi.instancemaintenance.end";
const CHANNEL: &str = "oci/events";

/// Instances logged as "no Node" at most once each; past this many, the set starts over.
const UNKNOWN_LOGGED_MAX: usize = 4096;

/// The OCI Events endpoint's state.
#[derive(Debug)]
pub struct OciEvents {
    cfg: OciEventsConfig,
    secret: crate::config::Secret,
    store: Store<Node>,
    http: Option<reqwest::Client>,
    allow_loopback: bool,
    /// Deliveries refused for a missing or wrong credential.
    pub unauthorized: std::sync::atomic::AtomicU64,
    unknown_logged: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

/// The secret file could not be read.
#[derive(Debug, thiserror::Error)]
#[error("[controller.oci_events] token_file {}: {source}", path.display())]
pub struct SecretFileError {
    /// The file.
    pub path: std::path::PathBuf,
    /// Cause.
    #[source]
    pub source: std::io::Error,
}

impl OciEvents {
    /// Ingestion with `cfg`, mapping instances through the Node cache; confirmation URLs on
    /// loopback addresses only with `allow_loopback` (`[controller] allow_loopback_destinations`).
    /// Reads `token_file` when set (too short a secret there is an error as in `token`).
    pub fn new(
        cfg: OciEventsConfig,
        store: Store<Node>,
        allow_loopback: bool,
    ) -> Result<Self, SecretFileError> {
        let secret = match &cfg.token_file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| SecretFileError {
                    path: path.clone(),
                    source,
                })?;
                let text = text.trim();
                if text.len() < 16 {
                    return Err(SecretFileError {
                        path: path.clone(),
                        source: std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            "the secret must be at least 16 characters",
                        ),
                    });
                }
                crate::config::Secret::new(text)
            }
            None => cfg.token.clone(),
        };
        Ok(OciEvents {
            cfg,
            secret,
            store,
            allow_loopback,
            unauthorized: Default::default(),
            unknown_logged: Default::default(),
            http: crate::http::guarded_builder(None, allow_loopback)
                .and_then(|b| Ok(b.timeout(std::time::Duration::from_secs(10)).build()?))
                .map_err(|e| {
                    tracing::error!(
                        error = crate::telemetry::error_chain(&e),
                        "no HTTPS client: subscriptions cannot be confirmed"
                    )
                })
                .ok(),
        })
    }

    /// The URL path.
    pub fn path(&self) -> &str {
        &self.cfg.path
    }

    /// Whether this delivery's first log line about `instance` being no Node is still to come.
    fn first_unknown(&self, instance: &str) -> bool {
        let mut seen = crate::sync::lock(&self.unknown_logged);
        if seen.len() >= UNKNOWN_LOGGED_MAX {
            seen.clear();
        }
        seen.insert(instance.to_string())
    }

    /// The node whose `spec.providerID` names `ocid` (one pass over the cache, no copies).
    pub fn node_for(&self, ocid: &str) -> Option<String> {
        self.store
            .find(|n| {
                n.spec
                    .as_ref()
                    .and_then(|s| s.provider_id.as_deref())
                    .is_some_and(|pid| pid.strip_prefix("oci://").unwrap_or(pid) == ocid)
            })
            .and_then(|n| n.metadata.name.clone())
    }
}

/// The credentials a delivery presented.
#[derive(Debug, Clone, Copy, Default)]
pub struct Presented<'a> {
    /// The last path segment after the configured path, if the URL had one.
    pub path_token: Option<&'a str>,
    /// The `Authorization` header.
    pub authorization: Option<&'a str>,
    /// The configured extra header's value (only looked at when one is configured).
    pub header: Option<&'a str>,
}

/// Whether `p` carries the secret (pure): the path segment equals it, or `Authorization: Basic`
/// carries `username:secret`, or (only when `header_enabled`) the extra header equals it. An
/// empty secret authorizes nothing.
pub fn authenticate(p: &Presented<'_>, username: &str, secret: &str, header_enabled: bool) -> bool {
    if secret.is_empty() {
        return false;
    }
    let path_ok = p
        .path_token
        .is_some_and(|t| ct_eq(t.as_bytes(), secret.as_bytes()));
    let basic_ok = p
        .authorization
        .and_then(basic_credentials)
        .is_some_and(|(u, pw)| {
            // Both compared, whatever the first gave: no timing difference between them.
            ct_eq(u.as_bytes(), username.as_bytes()) & ct_eq(pw.as_bytes(), secret.as_bytes())
        });
    let header_ok = header_enabled
        && p.header
            .is_some_and(|h| ct_eq(h.as_bytes(), secret.as_bytes()));
    path_ok | basic_ok | header_ok
}

/// `(user, password)` of an `Authorization: Basic <base64(user:password)>` value.
pub fn basic_credentials(value: &str) -> Option<(String, String)> {
    use base64::Engine;
    let (scheme, rest) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (u, p) = text.split_once(':')?;
    Some((u.to_string(), p.to_string()))
}

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    use sha2::{Digest, Sha256};
    let (x, y) = (Sha256::digest(a), Sha256::digest(b));
    x.iter()
        .zip(y.iter())
        .fold(0u8, |acc, (p, q)| acc | (p ^ q))
        == 0
}

impl OciEvents {
    fn authorized(&self, path_token: Option<&str>, headers: &HeaderMap) -> bool {
        let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let header = self.cfg.header.as_deref();
        authenticate(
            &Presented {
                path_token,
                authorization: get("authorization"),
                header: header.and_then(get),
            },
            &self.cfg.username,
            self.secret.expose(),
            header.is_some(),
        )
    }
}

/// The `WWW-Authenticate` challenge of a 401: HTTP Basic, the scheme OCI Notifications sends.
pub const CHALLENGE: &str = "Basic realm=\"nodekeeper-oci-events\", charset=\"UTF-8\"";

/// Hosts of OCI Notifications' confirmation URLs: `notification.<region>.` one of these (the
/// commercial realm, the government realms).
const OCI_NOTIFICATION_DOMAINS: [&str; 4] = [
    "oraclecloud.com",
    "oci.oraclecloud.com",
    "oraclegovcloud.com",
    "oraclegovcloud.uk",
];

/// The URL to fetch to confirm a subscription, or why it is refused: an `https` URL whose host
/// is an OCI Notifications host (`notification.<region>.oraclecloud.com` and the government
/// realms' equivalents), no userinfo, default port; with `allow_loopback` also an `http` or
/// `https` URL on a loopback address or `localhost` (tests and local stand-ins). Pure; the
/// client then refuses redirects and, after DNS, loopback, link-local and metadata addresses.
pub fn confirmation_target(raw: &str, allow_loopback: bool) -> Result<reqwest::Url, &'static str> {
    let url = reqwest::Url::parse(raw).map_err(|_| "not a URL")?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err("a URL with userinfo");
    }
    let loopback = match url.host() {
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        None => return Err("a URL without a host"),
    };
    if loopback && allow_loopback && matches!(url.scheme(), "http" | "https") {
        return Ok(url);
    }
    if url.scheme() != "https" {
        return Err("not an https URL");
    }
    if url.port().is_some() {
        return Err("not on the default https port");
    }
    let Some(url::Host::Domain(host)) = url.host() else {
        return Err("an IP address, not an OCI Notifications host");
    };
    let host = host.to_ascii_lowercase();
    let ok = host.strip_prefix("notification.").is_some_and(|rest| {
        OCI_NOTIFICATION_DOMAINS.iter().any(|d| {
            rest.strip_suffix(d)
                .and_then(|region| region.strip_suffix('.'))
                .is_some_and(|region| {
                    !region.is_empty()
                        && region
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                })
        })
    });
    if ok {
        Ok(url)
    } else {
        Err("not an OCI Notifications host")
    }
}

async fn confirm_subscription(oci: &OciEvents, url: &str) -> Response {
    let shown = crate::http::redact_url(url);
    tracing::info!(url = %shown, "OCI Notifications subscription confirmation");
    if !oci.cfg.confirm_subscriptions {
        return Json(json!({"confirmation": "logged"})).into_response();
    }
    let Some(http) = &oci.http else {
        return (
            StatusCode::BAD_GATEWAY,
            Json(json!({"error": "no HTTPS client"})),
        )
            .into_response();
    };
    let target = match confirmation_target(url, oci.allow_loopback) {
        Ok(t) => t,
        Err(why) => {
            tracing::warn!(url = %shown, why, "refused a subscription confirmation URL");
            return (
                StatusCode::BAD_REQUEST,
                Json(json!({"error": format!("confirmation URL refused: {why}")})),
            )
                .into_response();
        }
    };
    if let Err(why) = crate::http::check_destination(&target, oci.allow_loopback) {
        tracing::warn!(url = %shown, why, "refused a subscription confirmation URL");
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "confirmation URL refused"})),
        )
            .into_response();
    }
    let res = match http.get(target).send().await {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(format!("HTTP {}", r.status().as_u16())),
        Err(e) => Err(crate::telemetry::error_chain(&e.without_url())),
    };
    match res {
        Ok(()) => Json(json!({"confirmation": "confirmed"})).into_response(),
        Err(e) => {
            // The cause stays in the log: the caller learns nothing of what is behind the URL.
            tracing::warn!(url = %shown, error = %e, "cannot confirm the subscription");
            (
                StatusCode::BAD_GATEWAY,
                Json(json!({"error": "confirmation failed"})),
            )
                .into_response()
        }
    }
}

/// A parsed OCI event.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// Instance OCID.
    pub instance: String,
    /// The node event.
    pub event: NodeEvent,
}

/// Why an envelope is not turned into a node event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Not an OCI Events envelope nodekeeper can read: answered 400 naming `field`.
    #[error("{field}: {why}")]
    Malformed {
        /// The envelope's field at fault, e.g. `eventType`, `data.resourceId`.
        field: &'static str,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A well-formed event nodekeeper does not act on (another event type): answered 200.
    #[error("{0}")]
    Ignored(String),
}

/// Where a maintenance stands, from its event type and `lifecycleState` (the SDK's
/// `InstanceMaintenanceEventLifecycleStateEnum`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaintenanceStep {
    /// Announced for `timeWindowStart`: act before it.
    Scheduled,
    /// Under way (`.begin`, or STARTED / PROCESSING): act now if the notice was missed.
    Now,
    /// Over or withdrawn (`.end`, or SUCCEEDED / FAILED / CANCELED): withdraw the notice.
    Over,
}

/// The maintenance step of `etype` in `state` (pure); `None` for a preemption.
pub fn maintenance_step(etype: &str, state: &str) -> Option<MaintenanceStep> {
    Some(match (etype, state) {
        (PREEMPTION, _) => return None,
        (MAINTENANCE_BEGIN, _) => MaintenanceStep::Now,
        (MAINTENANCE_END, _) => MaintenanceStep::Over,
        (_, "CANCELED" | "SUCCEEDED" | "FAILED") => MaintenanceStep::Over,
        (_, "STARTED" | "PROCESSING") => MaintenanceStep::Now,
        _ => MaintenanceStep::Scheduled,
    })
}

/// Maps an OCI Events envelope to a node event (Err: malformed, or not handled).
pub fn parse(v: &Value) -> Result<Parsed, Refusal> {
    let bad = |field, why| Refusal::Malformed { field, why };
    if !v.is_object() {
        return Err(bad("body", "not a JSON object"));
    }
    let etype = match v.get("eventType") {
        Some(Value::String(t)) if !t.is_empty() => t.as_str(),
        Some(_) => return Err(bad("eventType", "not a non-empty string")),
        None => return Err(bad("eventType", "missing")),
    };
    let handled = matches!(
        etype,
        PREEMPTION | MAINTENANCE | RESCHEDULED | MAINTENANCE_BEGIN | MAINTENANCE_END
    );
    if !handled {
        return Err(Refusal::Ignored(format!(
            "event type {etype} is not handled"
        )));
    }
    let data = match v.get("data") {
        Some(d) if d.is_object() => d,
        Some(_) => return Err(bad("data", "not an object")),
        None => return Err(bad("data", "missing")),
    };
    let details = match data.get("additionalDetails") {
        None | Some(Value::Null) => json!({}),
        Some(d) if d.is_object() => d.clone(),
        Some(_) => return Err(bad("data.additionalDetails", "not an object")),
    };
    let s = |x: &Value, k: &str| x.get(k).and_then(Value::as_str).map(str::to_string);
    let resource = s(data, "resourceId").unwrap_or_default();
    let instance = s(&details, "instanceId").unwrap_or_else(|| resource.clone());
    if !instance.starts_with("ocid1.instance.") {
        return Err(match etype {
            PREEMPTION => bad(
                "data.resourceId",
                "not an instance OCID (ocid1.instance...)",
            ),
            _ => bad(
                "data.additionalDetails.instanceId",
                "not an instance OCID (ocid1.instance...)",
            ),
        });
    }
    let mut detail = BTreeMap::new();
    detail.insert("eventType".to_string(), etype.to_string());
    for k in [
        "lifecycleState",
        "maintenanceCategory",
        "instanceAction",
        "preemptionAction",
        "timeWindowStart",
    ] {
        if let Some(x) = s(&details, k) {
            detail.insert(k.to_string(), crate::text::truncate(&x, 128));
        }
    }
    // An empty value is no window (OCI leaves unset strings empty, e.g. `correlationToken`).
    let window = s(&details, "timeWindowStart").filter(|w| !w.is_empty());
    let not_before = match window.as_deref() {
        None => None,
        Some(w) => Some(
            chrono::DateTime::parse_from_rfc3339(w)
                .map_err(|_| {
                    bad(
                        "data.additionalDetails.timeWindowStart",
                        "not an RFC 3339 time",
                    )
                })?
                .with_timezone(&Utc),
        ),
    };
    let state = s(&details, "lifecycleState").unwrap_or_default();
    let (kind, key, not_before) = match maintenance_step(etype, &state) {
        None => (EventKind::Preemption, instance.clone(), not_before),
        Some(step) => {
            // One maintenance (its event OCID) in one window: the scheduled notice, its begin and
            // its end share the id, so a begin after the notice changes nothing and an end
            // withdraws it; a rescheduled window is a new notice.
            let key = format!("{resource}|{}", window.clone().unwrap_or_default());
            let notice = || event_id(Some(Cloud::Oci), CHANNEL, &EventKind::Maintenance, &key);
            match step {
                MaintenanceStep::Scheduled => (EventKind::Maintenance, key, not_before),
                MaintenanceStep::Now => {
                    let now = Utc::now();
                    let at = not_before.map_or(now, |t| t.min(now));
                    (EventKind::Maintenance, key, Some(at))
                }
                MaintenanceStep::Over => (EventKind::Cancelled { of: notice() }, key, None),
            }
        }
    };
    let id = event_id(Some(Cloud::Oci), CHANNEL, &kind, &key);
    Ok(Parsed {
        instance,
        event: NodeEvent {
            version: NODE_EVENT_VERSION,
            id,
            kind,
            cloud: Some(Cloud::Oci),
            source: CHANNEL.into(),
            not_before,
            deadline: None,
            detected_at: Utc::now(),
            detail,
        },
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn only_oci_notifications_hosts_over_https_confirm_a_subscription() {
        let cases: [(&str, bool, Result<(), &str>); 16] = [
            ("https://notification.us-phoenix-1.oraclecloud.com/20181201/subscriptions/ocid1.x/confirmation?token=t", false, Ok(())),
            ("https://notification.eu-frankfurt-1.oci.oraclecloud.com/c?token=t", false, Ok(())),
            ("https://NOTIFICATION.us-langley-1.oraclegovcloud.com/c", false, Ok(())),
            ("https://notification.uk-gov-london-1.oraclegovcloud.uk/c", false, Ok(())),
            ("http://notification.us-phoenix-1.oraclecloud.com/c", false, Err("not an https URL")),
            ("https://notification.us-phoenix-1.oraclecloud.com:8443/c", false, Err("not on the default https port")),
            ("https://notification.oraclecloud.com/c", false, Err("not an OCI Notifications host")),
            ("https://notification.x.oraclecloud.com.evil.example/c", false, Err("not an OCI Notifications host")),
            ("https://evil.example/notification.us-phoenix-1.oraclecloud.com", false, Err("not an OCI Notifications host")),
            ("https://u:p@notification.us-phoenix-1.oraclecloud.com/c", false, Err("a URL with userinfo")),
            ("http://127.0.0.1:8080/confirm", false, Err("not an https URL")),
            ("https://127.0.0.1/confirm", false, Err("an IP address, not an OCI Notifications host")),
            ("https://169.254.169.254/latest/meta-data", true, Err("an IP address, not an OCI Notifications host")),
            ("http://127.0.0.1:8080/confirm", true, Ok(())),
            ("http://localhost:8080/confirm", true, Ok(())),
            ("file:///etc/passwd", true, Err("a URL without a host")),
        ];
        for (url, allow, want) in cases {
            assert_eq!(
                confirmation_target(url, allow).map(|_| ()),
                want,
                "{url} allow_loopback={allow}"
            );
        }
    }

    #[test]
    fn only_the_secret_in_a_form_oci_can_send_authenticates() {
        use base64::Engine;
        const SECRET: &str = "0123456789abcdef-secret";
        let basic = |u: &str, p: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )
        };
        let good = basic("nodekeeper", SECRET);
        let wrong_user = basic("admin", SECRET);
        let wrong_pass = basic("nodekeeper", "0123456789abcdef-secreT");
        let lower = format!("basic {}", good.trim_start_matches("Basic "));
        let p = |path_token, authorization, header| Presented {
            path_token,
            authorization,
            header,
        };
        // (presented, header enabled, want)
        let cases: [(Presented<'_>, bool, bool); 13] = [
            (p(Some(SECRET), None, None), false, true),
            (p(Some("wrong"), None, None), false, false),
            (p(Some(""), None, None), false, false),
            (p(None, Some(&good), None), false, true),
            (p(None, Some(&lower), None), false, true),
            (p(Some("wrong"), Some(&good), None), false, true),
            (p(None, Some(&wrong_user), None), false, false),
            (p(None, Some(&wrong_pass), None), false, false),
            (p(None, Some("Bearer x"), None), false, false),
            (p(None, Some("Basic !!notbase64"), None), false, false),
            (p(None, None, Some(SECRET)), false, false),
            (p(None, None, Some(SECRET)), true, true),
            (p(None, None, None), true, false),
        ];
        for (i, (presented, header_enabled, want)) in cases.iter().enumerate() {
            assert_eq!(
                authenticate(presented, "nodekeeper", SECRET, *header_enabled),
                *want,
                "case {i}: {presented:?}"
            );
        }
        // An empty secret (misconfigured) authorizes nothing, not even an empty credential.
        assert!(!authenticate(
            &p(Some(""), Some(&basic("nodekeeper", "")), Some("")),
            "nodekeeper",
            "",
            true
        ));
        assert_eq!(
            basic_credentials(&basic("u", "p:with:colons")),
            Some(("u".into(), "p:with:colons".into()))
        );
    }

    #[test]
    fn an_unknown_instance_is_logged_once_and_the_secret_file_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "  from-a-secret-0123456789\n").unwrap();
        let cfg = OciEventsConfig {
            enabled: true,
            token_file: Some(file),
            ..Default::default()
        };
        let (store, _writer) = kube::runtime::reflector::store::<Node>();
        let oci = OciEvents::new(cfg.clone(), store.clone(), false).unwrap();
        assert_eq!(oci.secret.expose(), "from-a-secret-0123456789");
        assert!(oci.first_unknown("ocid1.instance.oc1..a"));
        assert!(!oci.first_unknown("ocid1.instance.oc1..a"));
        assert!(oci.first_unknown("ocid1.instance.oc1..b"));
        let missing = OciEventsConfig {
            token_file: Some(dir.path().join("missing")),
            ..cfg.clone()
        };
        let err = OciEvents::new(missing, store.clone(), false).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
        let short = dir.path().join("short");
        std::fs::write(&short, "tiny").unwrap();
        let err = OciEvents::new(
            OciEventsConfig {
                token_file: Some(short),
                ..cfg
            },
            store,
            false,
        )
        .unwrap_err();
        assert!(err.to_string().contains("16 characters"), "{err}");
        assert!(!err.to_string().contains("tiny"), "the secret is not shown");
    }

    #[test]
    fn malformed_envelopes_name_the_field_and_other_types_are_ignored() {
        let bad = |v: Value| match parse(&v) {
            Err(Refusal::Malformed { field, .. }) => field,
            other => panic!("{v}: {other:?}"),
        };
        assert_eq!(bad(json!([1])), "body");
        assert_eq!(bad(json!({"data": {}})), "eventType");
        assert_eq!(bad(json!({"eventType": 5})), "eventType");
        assert_eq!(bad(json!({"eventType": PREEMPTION})), "data");
        assert_eq!(bad(json!({"eventType": PREEMPTION, "data": "x"})), "data");
        assert_eq!(
            bad(json!({"eventType": PREEMPTION, "data": {"resourceId": "ocid1.volume.oc1..x"}})),
            "data.resourceId"
        );
        assert_eq!(
            bad(
                json!({"eventType": MAINTENANCE, "data": {"resourceId": "ocid1.instancemaintenanceevent.oc1..x"}})
            ),
            "data.additionalDetails.instanceId"
        );
        assert_eq!(
            bad(
                json!({"eventType": MAINTENANCE, "data": {"additionalDetails": {
                "instanceId": "ocid1.instance.oc1..x", "timeWindowStart": "tomorrow"}}})
            ),
            "data.additionalDetails.timeWindowStart"
        );
        assert_eq!(
            bad(
                json!({"eventType": PREEMPTION, "data": {"resourceId": "ocid1.instance.oc1..x", "additionalDetails": 3}})
            ),
            "data.additionalDetails"
        );
        // Another event type, even without data: 200, ignored.
        assert!(matches!(
            parse(&json!({"eventType": "com.oraclecloud.objectstorage.createbucket"})),
            Err(Refusal::Ignored(_))
        ));
    }

    #[test]
    fn maintenance_steps_follow_the_event_type_then_the_lifecycle_state() {
        use MaintenanceStep::*;
        let cases: [(&str, &str, Option<MaintenanceStep>); 12] = [
            (PREEMPTION, "", None),
            (MAINTENANCE, "SCHEDULED", Some(Scheduled)),
            (MAINTENANCE, "", Some(Scheduled)),
            (MAINTENANCE, "STARTED", Some(Now)),
            (MAINTENANCE, "PROCESSING", Some(Now)),
            (MAINTENANCE, "SUCCEEDED", Some(Over)),
            (MAINTENANCE, "FAILED", Some(Over)),
            (MAINTENANCE, "CANCELED", Some(Over)),
            (RESCHEDULED, "SCHEDULED", Some(Scheduled)),
            // The type decides for begin and end, whatever the state says.
            (MAINTENANCE_BEGIN, "SUCCESSFUL", Some(Now)),
            (MAINTENANCE_BEGIN, "SCHEDULED", Some(Now)),
            (MAINTENANCE_END, "SCHEDULED", Some(Over)),
        ];
        for (etype, state, want) in cases {
            assert_eq!(maintenance_step(etype, state), want, "{etype} {state}");
        }
    }

    #[test]
    fn begin_acts_now_unless_noticed_and_end_withdraws_the_notice() {
        let m = |etype: &str, state: &str, window: &str| {
            json!({"eventType": etype, "source": "ComputeApi",
            "data": {"resourceId": "ocid1.instancemaintenanceevent.oc1.x", "additionalDetails": {
                "instanceId": "ocid1.instance.oc1.phx.abc", "lifecycleState": state,
                "timeWindowStart": window}}})
        };
        let future = "2099-01-01T00:00:00Z";
        let sched = parse(&m(MAINTENANCE, "SCHEDULED", future)).unwrap().event;
        assert_eq!(
            sched.not_before.unwrap().to_rfc3339(),
            "2099-01-01T00:00:00+00:00"
        );
        // The begin of the same maintenance: the same notice (a duplicate when it was seen),
        // and due now when it was missed.
        let begin = parse(&m(MAINTENANCE_BEGIN, "SUCCESSFUL", future))
            .unwrap()
            .event;
        assert_eq!(
            (begin.id.as_str(), &begin.kind),
            (sched.id.as_str(), &EventKind::Maintenance)
        );
        assert!(begin.not_before.unwrap() <= Utc::now());
        let started = parse(&m(MAINTENANCE, "STARTED", future)).unwrap().event;
        assert_eq!(started.id, sched.id);
        assert!(started.not_before.unwrap() <= Utc::now());
        // A window already past stays the time to act.
        let past = parse(&m(MAINTENANCE_BEGIN, "", "2020-01-01T00:00:00Z"))
            .unwrap()
            .event;
        assert_eq!(
            past.not_before.unwrap().to_rfc3339(),
            "2020-01-01T00:00:00+00:00"
        );
        // The end withdraws that notice, like CANCELED / SUCCEEDED on the scheduled type.
        let end = parse(&m(MAINTENANCE_END, "SUCCESSFUL", future))
            .unwrap()
            .event;
        assert_eq!(
            end.kind,
            EventKind::Cancelled {
                of: sched.id.clone()
            }
        );
        let canceled = parse(&m(MAINTENANCE, "CANCELED", future)).unwrap().event;
        assert_eq!(canceled.kind, end.kind);
        // A rescheduled window is another notice.
        let moved = parse(&m(RESCHEDULED, "SCHEDULED", "2099-02-01T00:00:00Z"))
            .unwrap()
            .event;
        assert_eq!(moved.kind, EventKind::Maintenance);
        assert_ne!(moved.id, sched.id);
    }

    #[test]
    fn samples_map_to_events_with_stable_ids() {
        let pre = json!({"eventType": PREEMPTION, "source": "ComputeApi", "eventID": "e1",
            "data": {"resourceId": "ocid1.instance.oc1.phx.abc", "additionalDetails": {"preemptionAction": "TERMINATE"}}});
        let a = parse(&pre).unwrap();
        let b = parse(&pre).unwrap();
        assert_eq!(a.instance, "ocid1.instance.oc1.phx.abc");
        assert_eq!(a.event.kind, EventKind::Preemption);
        assert_eq!(a.event.id, b.event.id);
        let m = |state: &str| {
            json!({"eventType": MAINTENANCE, "source": "ComputeApi",
            "data": {"resourceId": "ocid1.instancemaintenanceevent.oc1.x", "additionalDetails": {
                "instanceId": "ocid1.instance.oc1.phx.abc", "lifecycleState": state,
                "maintenanceCategory": "FLEXIBLE", "instanceAction": "None",
                "timeWindowStart": "2023-09-18T12:00:00.000Z", "startWindowDuration": "P1D"}}})
        };
        let sched = parse(&m("SCHEDULED")).unwrap();
        assert_eq!(sched.event.kind, EventKind::Maintenance);
        assert!(sched.event.not_before.is_some());
        let cancel = parse(&m("CANCELED")).unwrap();
        assert_eq!(
            cancel.event.kind,
            EventKind::Cancelled {
                of: sched.event.id.clone()
            }
        );
        assert!(parse(&json!({"eventType": "com.oraclecloud.other", "data": {"resourceId": "ocid1.instance.x"}})).is_err());
    }
}

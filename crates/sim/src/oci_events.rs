//! `nodekeeper sim oci-event`: posts an OCI Events envelope (as an OCI Notifications HTTPS
//! subscription would deliver it) to the controller, for tests and the demo.
//!
//! Delivered as OCI Notifications can (its "HTTPS (Custom URL)" subscription documentation): a POST of
//! the JSON message, with no custom header and no query; the secret either in the URL's path or as
//! HTTP Basic authentication from the URL's `user:password@` ([`Credential`]).
//!
//! Envelopes follow OCI's documented Events samples: the instance OCID is `data.resourceId`
//! for preemption and `data.additionalDetails.instanceId` for maintenance.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

// OCI Events event types, from Oracle's documentation ("Compute Events", "Instance Maintenance
// Events"); the stand-in's own copy, never the controller's.
const PREEMPTION: &str = "com.oraclecloud.computeapi.instancepreemptionaction";
const MAINTENANCE: &str = "com.oraclecloud.computeapi.instancemaintenance";
const RESCHEDULED: &str = "com.oraclecloud.computeapi.maintenancerescheduled";
const MAINTENANCE_BEGIN: &str = "com.oraclecloud.computeapi.instancemaintenance.begin";
const MAINTENANCE_END: &str = "com.oraclecloud.computeapi.instancemaintenance.end";

/// Which event to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OciEventKind {
    /// `instancepreemptionaction` (TERMINATE).
    Preemption,
    /// `instancemaintenance`, lifecycleState SCHEDULED.
    Maintenance,
    /// `instancemaintenance`, lifecycleState CANCELED.
    MaintenanceCanceled,
    /// `maintenancerescheduled` with a new window.
    Rescheduled,
    /// `instancemaintenance.begin`, lifecycleState STARTED.
    MaintenanceBegin,
    /// `instancemaintenance.end`, lifecycleState SUCCEEDED.
    MaintenanceEnd,
}

impl OciEventKind {
    /// Every value, in the order the command line lists them.
    pub const ALL: [OciEventKind; 6] = [
        OciEventKind::Preemption,
        OciEventKind::Maintenance,
        OciEventKind::MaintenanceCanceled,
        OciEventKind::Rescheduled,
        OciEventKind::MaintenanceBegin,
        OciEventKind::MaintenanceEnd,
    ];

    /// The spelling on the command line.
    pub fn name(self) -> &'static str {
        match self {
            OciEventKind::Preemption => "preemption",
            OciEventKind::Maintenance => "maintenance",
            OciEventKind::MaintenanceCanceled => "maintenance-canceled",
            OciEventKind::Rescheduled => "rescheduled",
            OciEventKind::MaintenanceBegin => "maintenance-begin",
            OciEventKind::MaintenanceEnd => "maintenance-end",
        }
    }
}

impl std::fmt::Display for OciEventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for OciEventKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        OciEventKind::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| format!("unknown OCI event kind `{s}` (expected preemption, maintenance, maintenance-canceled, rescheduled, maintenance-begin or maintenance-end)"))
    }
}

/// Arguments of `nodekeeper sim oci-event` (parsed, with their defaults, by the binary's `cli::sim`).
#[derive(Debug, Clone)]
pub struct OciEventArgs {
    /// The controller's OCI events URL, e.g. `https://127.0.0.1:8443/v1/oci-events`.
    pub url: String,
    /// The shared secret (the last path segment, or the Basic password with `basic_user`).
    pub token: String,
    /// Send the secret with HTTP Basic authentication as this user.
    pub basic_user: Option<String>,
    /// The event.
    pub kind: OciEventKind,
    /// Instance OCID (the node's `spec.providerID` without `oci://`).
    pub instance: String,
    /// Maintenance window start (RFC 3339).
    pub window_start: String,
    /// CA of the controller's certificate (https).
    pub ca_file: Option<PathBuf>,
    /// Name the controller's certificate carries.
    pub server_name: String,
}

/// The OCI Events envelope for `kind` about `instance`.
pub fn envelope(kind: OciEventKind, instance: &str, window_start: &str) -> Value {
    let (etype, state) = match kind {
        OciEventKind::Preemption => (PREEMPTION, ""),
        OciEventKind::Maintenance => (MAINTENANCE, "SCHEDULED"),
        OciEventKind::MaintenanceCanceled => (MAINTENANCE, "CANCELED"),
        OciEventKind::Rescheduled => (RESCHEDULED, "SCHEDULED"),
        OciEventKind::MaintenanceBegin => (MAINTENANCE_BEGIN, "STARTED"),
        OciEventKind::MaintenanceEnd => (MAINTENANCE_END, "SUCCEEDED"),
    };
    let compartment = "ocid1.compartment.oc1..sim";
    let data = if kind == OciEventKind::Preemption {
        json!({"compartmentId": compartment, "resourceId": instance,
            "additionalDetails": {"preemptionAction": "TERMINATE"}})
    } else {
        let mut details = json!({"instanceId": instance, "lifecycleState": state,
            "maintenanceCategory": "FLEXIBLE", "instanceAction": "REBOOT_MIGRATION",
            "startWindowDuration": "P1D"});
        if !window_start.is_empty() {
            details["timeWindowStart"] = json!(window_start);
        }
        json!({"compartmentId": compartment, "resourceId": "ocid1.instancemaintenanceevent.oc1.sim",
            "additionalDetails": details})
    };
    // CloudEvents 0.1, as OCI Events' envelope reference lists its fields.
    json!({"eventType": etype, "cloudEventsVersion": "0.1", "eventTypeVersion": "2.0",
        "source": "ComputeApi", "eventID": format!("sim-{:016x}", rand::random::<u64>()),
        "eventTime": chrono::Utc::now().to_rfc3339(), "contentType": "application/json",
        "extensions": {"compartmentId": compartment}, "data": data})
}

/// How a delivery carries the secret: the two forms an OCI Notifications HTTPS subscription has.
#[derive(Debug, Clone, Copy)]
pub enum Credential<'a> {
    /// Appended to the URL's path as its last segment (`<url>/<secret>`).
    Path(&'a str),
    /// HTTP Basic authentication, as OCI sends the `user:password@` of the subscription's URL.
    Basic {
        /// User name.
        user: &'a str,
        /// Password: the secret.
        password: &'a str,
    },
}

/// The URL to post to, the userinfo removed, and the credential: the URL's own `user:password@`
/// when it has one, else `cred`, with [`Credential::Path`] appended to the path.
pub fn delivery_url(
    url: &reqwest::Url,
    cred: Credential<'_>,
) -> (reqwest::Url, Option<(String, String)>) {
    let mut u = url.clone();
    if !u.username().is_empty() {
        let user = u.username().to_string();
        let password = u.password().unwrap_or_default().to_string();
        let _ = u.set_username("");
        let _ = u.set_password(None);
        return (u, Some((user, password)));
    }
    match cred {
        Credential::Path(secret) => {
            if let Ok(mut segs) = u.path_segments_mut() {
                segs.pop_if_empty().push(secret);
            }
            (u, None)
        }
        Credential::Basic { user, password } => (u, Some((user.to_string(), password.to_string()))),
    }
}

/// Posts `body` to `url` as OCI Notifications does (POST, JSON, no custom header), with `cred`;
/// returns the status and the answer.
pub async fn post(
    client: &reqwest::Client,
    url: &reqwest::Url,
    cred: Credential<'_>,
    body: &Value,
) -> Result<(u16, String), reqwest::Error> {
    let (target, basic) = delivery_url(url, cred);
    let mut req = client.post(target).json(body);
    if let Some((user, password)) = basic {
        req = req.basic_auth(user, Some(password));
    }
    let resp = req.send().await?;
    let code = resp.status().as_u16();
    Ok((code, resp.text().await?))
}

/// `nodekeeper sim oci-event`: with `--ca-file`, only that CA is trusted and the certificate must
/// carry `--server-name` (the agent's client); without it, the system's roots and the URL's host.
pub async fn run(args: OciEventArgs) -> Result<u8, Box<dyn std::error::Error + Send + Sync>> {
    let url = reqwest::Url::parse(&args.url)?;
    let (builder, url) = match &args.ca_file {
        Some(ca) => nodekeeper_core::http::pin_server_name(
            nodekeeper_core::http::pinned_builder(ca)?,
            &url,
            &args.server_name,
        )?,
        None => (nodekeeper_core::http::builder(None)?.no_proxy(), url),
    };
    let client = builder.timeout(Duration::from_secs(10)).build()?;
    let body = envelope(args.kind, &args.instance, &args.window_start);
    let cred = match &args.basic_user {
        Some(user) => Credential::Basic {
            user,
            password: &args.token,
        },
        None => Credential::Path(&args.token),
    };
    let (code, answer) = post(&client, &url, cred, &body).await?;
    println!("{code} {answer}");
    Ok(if (200..300).contains(&code) { 0 } else { 1 })
}

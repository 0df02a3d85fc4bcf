//! Azure Scheduled Events: `GET /metadata/scheduledevents` with `Metadata: true`. The document
//! carries a `DocumentIncarnation` that changes whenever the event list changes; events simply
//! disappear when finished or cancelled. [`AzureSource::ack`] approves an event (`StartRequests`)
//! so the platform may start it early: an operation the controller can ask for later.

use std::time::Duration;

use chrono::Utc;
use futures::future::BoxFuture;
use reqwest::Method;
use serde::{Deserialize, Serialize};

use super::http::Http;
use super::{
    parse_json, parse_time, Cloud, EventKind, EventSource, InstanceIdentity, Notice, NoticeTracker,
    ParseError, PollOutcome, SourceError, SourcesConfig,
};

/// Scheduled Events path (the `api-version` query is added).
pub const EVENTS_PATH: &str = "/metadata/scheduledevents";
/// Instance compute metadata path.
pub const COMPUTE_PATH: &str = "/metadata/instance/compute?api-version=2021-02-01&format=json";
/// Header every request must carry.
pub const METADATA_HEADER: (&str, &str) = ("Metadata", "true");

/// One event of the Scheduled Events document.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ScheduledEvent {
    /// Unique id (a GUID).
    pub event_id: String,
    /// `Reboot`, `Redeploy`, `Freeze`, `Preempt` or `Terminate`.
    pub event_type: String,
    /// `VirtualMachine`.
    #[serde(default)]
    pub resource_type: String,
    /// VM names affected (empty: all).
    #[serde(default)]
    pub resources: Vec<String>,
    /// `Scheduled` or `Started`.
    #[serde(default)]
    pub event_status: String,
    /// RFC 2822 time; empty once started.
    #[serde(default)]
    pub not_before: String,
    /// Free text.
    #[serde(default)]
    pub description: String,
    /// `Platform` or `User`.
    #[serde(default)]
    pub event_source: String,
    /// Expected duration (-1: unknown).
    #[serde(default)]
    pub duration_in_seconds: i64,
}

/// The Scheduled Events document.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ScheduledEvents {
    /// Changes whenever `events` changes.
    pub document_incarnation: u64,
    /// Pending events.
    #[serde(default)]
    pub events: Vec<ScheduledEvent>,
}

fn kind_of(event_type: &str) -> Result<EventKind, ParseError> {
    Ok(match event_type {
        "Preempt" => EventKind::Preemption,
        "Terminate" => EventKind::Termination,
        "Reboot" => EventKind::Reboot,
        "Redeploy" => EventKind::Redeploy,
        "Freeze" => EventKind::Freeze,
        other => return Err(ParseError::value("azure EventType", other)),
    })
}

/// Parses the document and returns its incarnation and the notices that concern `vm_name`
/// (`None`: all events).
pub fn parse_scheduled_events(
    body: &[u8],
    vm_name: Option<&str>,
) -> Result<(u64, Vec<Notice>), ParseError> {
    const WHAT: &str = "azure scheduledevents";
    let doc: ScheduledEvents = parse_json(WHAT, body)?;
    let mut out = Vec::new();
    for e in doc.events {
        let mine = match vm_name {
            Some(name) => {
                e.resources.is_empty() || e.resources.iter().any(|r| r.eq_ignore_ascii_case(name))
            }
            None => true,
        };
        if !mine {
            continue;
        }
        let mut n = Notice::new(e.event_id.clone(), kind_of(&e.event_type)?)
            .with("event_id", &e.event_id)
            .with("event_type", &e.event_type)
            .with("event_source", &e.event_source)
            .with("incarnation", doc.document_incarnation.to_string());
        if !e.not_before.trim().is_empty() {
            n.not_before = Some(parse_time(WHAT, &e.not_before)?);
        }
        if e.duration_in_seconds > 0 {
            n.detail.insert(
                "duration_seconds".to_string(),
                e.duration_in_seconds.to_string(),
            );
        }
        out.push(n);
    }
    Ok((doc.document_incarnation, out))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Compute {
    vm_id: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    location: Option<String>,
    #[serde(default)]
    zone: Option<String>,
    #[serde(default)]
    vm_size: Option<String>,
    #[serde(default)]
    priority: Option<String>,
}

/// Parses `/metadata/instance/compute` (`vmId`, `name`, `location`, `zone`, `vmSize`, `priority`).
pub fn parse_identity(body: &[u8]) -> Result<InstanceIdentity, ParseError> {
    let c: Compute = parse_json("azure instance/compute", body)?;
    let preemptible = match c.priority.as_deref() {
        Some("Spot" | "Low") => Some(true),
        Some("Regular") => Some(false),
        _ => None,
    };
    Ok(InstanceIdentity {
        cloud: Some(Cloud::Azure),
        instance_id: c.vm_id,
        name: c.name,
        region: c.location,
        zone: c.zone.filter(|z| !z.is_empty()),
        instance_type: c.vm_size,
        preemptible,
        ..InstanceIdentity::default()
    })
}

/// Approves `event_id` without a running source (e.g. when the controller asks for it while the
/// source is owned by its driver task): see [`AzureSource::ack`].
pub async fn ack_event(cfg: &SourcesConfig, event_id: &str) -> Result<(), SourceError> {
    AzureSource::new(cfg)?.ack(event_id).await
}

/// The Azure Scheduled Events source.
#[derive(Debug)]
pub struct AzureSource {
    http: Http,
    events_path: String,
    vm_name: Option<String>,
    incarnation: Option<u64>,
    identity_tried: bool,
    tracker: NoticeTracker,
}

impl AzureSource {
    /// A source reading `cfg.endpoint`.
    pub fn new(cfg: &SourcesConfig) -> Result<Self, SourceError> {
        Ok(Self {
            http: Http::new(&cfg.endpoint, cfg.request_timeout)?,
            events_path: format!("{EVENTS_PATH}?api-version={}", cfg.azure.api_version),
            vm_name: Some(cfg.azure.vm_name.clone()).filter(|n| !n.is_empty()),
            incarnation: None,
            identity_tried: false,
            tracker: NoticeTracker::new(Some(Cloud::Azure)),
        })
    }

    /// The last `DocumentIncarnation` seen.
    pub fn incarnation(&self) -> Option<u64> {
        self.incarnation
    }

    /// Approves `event_id` (`{"StartRequests":[{"EventId":…}]}`), letting the platform start it
    /// now. Approval applies to every VM the event lists.
    pub async fn ack(&self, event_id: &str) -> Result<(), SourceError> {
        let body = serde_json::json!({ "StartRequests": [{ "EventId": event_id }] });
        let req = self
            .http
            .request(Method::POST, &self.events_path)
            .header(METADATA_HEADER.0, METADATA_HEADER.1)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string());
        self.http
            .send(req, Duration::ZERO)
            .await?
            .require_ok()
            .map(drop)
    }

    async fn poll_events(&mut self) -> PollOutcome {
        if self.vm_name.is_none() && !self.identity_tried {
            // The VM name filters events meant for other VMs of the same set.
            self.identity_tried = true;
            if let Err(e) = self.read_identity().await {
                tracing::warn!(
                    "cannot read the Azure VM name; reporting events for every VM listed: {e}"
                );
            }
        }
        let req = self
            .http
            .request(Method::GET, &self.events_path)
            .header(METADATA_HEADER.0, METADATA_HEADER.1);
        let resp = match self
            .http
            .send(req, Duration::ZERO)
            .await
            .and_then(|r| r.require_ok())
        {
            Ok(r) => r,
            Err(e) => return PollOutcome::failed(e),
        };
        match parse_scheduled_events(&resp.body, self.vm_name.as_deref()) {
            Ok((incarnation, notices)) => {
                self.incarnation = Some(incarnation);
                let events = self
                    .tracker
                    .observe("azure/scheduledevents", notices, Utc::now());
                PollOutcome {
                    events,
                    errors: Vec::new(),
                }
            }
            Err(e) => PollOutcome::failed(resp.parse_error(e)),
        }
    }

    async fn read_identity(&mut self) -> Result<InstanceIdentity, SourceError> {
        let req = self
            .http
            .request(Method::GET, COMPUTE_PATH)
            .header(METADATA_HEADER.0, METADATA_HEADER.1);
        let resp = self.http.send(req, Duration::ZERO).await?.require_ok()?;
        let id = parse_identity(&resp.body).map_err(|e| resp.parse_error(e))?;
        if self.vm_name.is_none() {
            self.vm_name.clone_from(&id.name);
        }
        Ok(id)
    }
}

impl EventSource for AzureSource {
    fn name(&self) -> &'static str {
        "azure"
    }
    fn cloud(&self) -> Cloud {
        Cloud::Azure
    }
    fn poll(&mut self) -> BoxFuture<'_, PollOutcome> {
        Box::pin(self.poll_events())
    }
    fn identity(&mut self) -> BoxFuture<'_, Result<InstanceIdentity, SourceError>> {
        Box::pin(self.read_identity())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const SAMPLE: &[u8] = br#"{"DocumentIncarnation":3,"Events":[
        {"EventId":"602d9444-d2cd-49c7-8624-8643e7171297","EventType":"Preempt","ResourceType":"VirtualMachine",
         "Resources":["vm-a"],"EventStatus":"Scheduled","NotBefore":"Mon, 19 Sep 2016 18:29:47 GMT",
         "Description":"","EventSource":"Platform","DurationInSeconds":-1},
        {"EventId":"other","EventType":"Reboot","Resources":["vm-b"],"EventStatus":"Scheduled","NotBefore":""}]}"#;

    #[test]
    fn sample_filters_by_vm_name() {
        let (inc, n) = parse_scheduled_events(SAMPLE, Some("vm-a")).unwrap();
        assert_eq!(inc, 3);
        assert_eq!(n.len(), 1);
        assert_eq!(n[0].kind, EventKind::Preemption);
        assert_eq!(
            n[0].not_before.unwrap().to_rfc3339(),
            "2016-09-19T18:29:47+00:00"
        );
        let (_, all) = parse_scheduled_events(SAMPLE, None).unwrap();
        assert_eq!(all.len(), 2);
    }

    #[test]
    fn unknown_event_type_is_an_error() {
        let body = br#"{"DocumentIncarnation":1,"Events":[{"EventId":"x","EventType":"Explode"}]}"#;
        assert!(matches!(
            parse_scheduled_events(body, None),
            Err(ParseError::Value { .. })
        ));
    }
}

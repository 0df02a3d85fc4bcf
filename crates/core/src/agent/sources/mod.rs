//! Metadata sources: pollers of each cloud's instance-metadata service that turn preemption,
//! termination, maintenance and rebalance notices into [`NodeEvent`]s.
//!
//! Sources are pure producers: they never act on a notice. Each one implements [`EventSource`],
//! one file per cloud. The shared [`NoticeTracker`] gives every notice a deterministic id (so a
//! re-poll never yields a second event for the same notice) and turns a notice that disappears
//! into one [`EventKind::Cancelled`] event. Response parsers are pure functions (bytes → typed
//! value or [`ParseError`]) and never panic.

pub mod aws;
pub mod azure;
pub mod config;
pub mod detect;
pub mod driver;
pub mod gcp;
pub mod http;
pub mod oci;
pub mod tracker;

use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use serde::Serialize;

use crate::text::truncate;

pub use crate::wire::{Cloud, EventKind, InstanceIdentity, NodeEvent, NODE_EVENT_VERSION};
pub use config::SourcesConfig;
pub use tracker::{Notice, NoticeTracker};

/// A pure parser of one notice channel's body.
pub type NoticeParser = fn(&[u8]) -> Result<Vec<Notice>, ParseError>;

/// A response body that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Not valid UTF-8.
    #[error("{what}: body is not UTF-8")]
    Utf8 {
        /// What was being parsed.
        what: &'static str,
    },
    /// Not the JSON shape expected.
    #[error("{what}: invalid JSON: {message}")]
    Json {
        /// What was being parsed.
        what: &'static str,
        /// serde_json's message (with line and column), cut to 200 characters: serde_json quotes
        /// a mistyped value in full, and every error text here stays bounded whatever the body
        /// (so it is text, not the `serde_json::Error`, whose own Display is unbounded).
        message: String,
    },
    /// A field holds a value outside its documented set.
    #[error("{what}: unexpected value `{value}`")]
    Value {
        /// What was being parsed.
        what: &'static str,
        /// The value, truncated.
        value: String,
    },
    /// A timestamp in an unknown format.
    #[error("{what}: cannot parse time `{value}`")]
    Time {
        /// What was being parsed.
        what: &'static str,
        /// The value, truncated.
        value: String,
    },
}

impl ParseError {
    /// A [`ParseError::Value`] with the value truncated to 80 characters.
    pub fn value(what: &'static str, value: &str) -> Self {
        ParseError::Value {
            what,
            value: truncate(value, 80),
        }
    }
    /// A [`ParseError::Time`] with the value truncated to 80 characters.
    pub fn time(what: &'static str, value: &str) -> Self {
        ParseError::Time {
            what,
            value: truncate(value, 80),
        }
    }
}

/// Decodes a JSON body, mapping failures to [`ParseError`].
pub fn parse_json<T: serde::de::DeserializeOwned>(
    what: &'static str,
    body: &[u8],
) -> Result<T, ParseError> {
    serde_json::from_slice(body).map_err(|e| ParseError::Json {
        what,
        message: truncate(&e.to_string(), 200),
    })
}

/// Decodes a plain-text body (trimmed).
pub fn parse_text<'a>(what: &'static str, body: &'a [u8]) -> Result<&'a str, ParseError> {
    std::str::from_utf8(body)
        .map(str::trim)
        .map_err(|_| ParseError::Utf8 { what })
}

/// Why a poll (or part of it) failed. The source keeps working after any of these.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// Could not connect, or the connection broke. The message carries the whole cause chain
    /// (reqwest's own Display is only its first line).
    #[error("{url}: request failed: {}", crate::telemetry::error_chain(.source))]
    Transport {
        /// The URL requested.
        url: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// No complete answer within the timeout.
    #[error("{url}: no answer within {timeout:?}")]
    Timeout {
        /// The URL requested.
        url: String,
        /// The timeout.
        timeout: std::time::Duration,
    },
    /// An HTTP status the protocol does not expect.
    #[error("{url}: unexpected HTTP status {status}: {body}")]
    Status {
        /// The URL requested.
        url: String,
        /// The status code.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// The body is larger than any valid answer.
    #[error("{url}: response larger than {limit} bytes")]
    TooLarge {
        /// The URL requested.
        url: String,
        /// The limit.
        limit: usize,
    },
    /// The body could not be parsed.
    #[error("{url}: {source}")]
    Parse {
        /// The URL requested.
        url: String,
        /// What was wrong.
        source: ParseError,
    },
    /// The HTTP client could not be built.
    #[error("cannot build HTTP client for {base}: {source}")]
    Client {
        /// The base URL the client was for.
        base: String,
        /// Cause.
        #[source]
        source: crate::http::TlsError,
    },
    /// A request could not be built (e.g. a path that makes no URL).
    #[error("invalid request: {0}")]
    Request(#[source] reqwest::Error),
    /// The source is misconfigured, or stopped.
    #[error("{0}")]
    Config(String),
}

impl SourceError {
    /// A stable short label for metrics and reports.
    pub fn label(&self) -> &'static str {
        match self {
            SourceError::Transport { .. } => "transport",
            SourceError::Timeout { .. } => "timeout",
            SourceError::Status { .. } => "status",
            SourceError::TooLarge { .. } => "too_large",
            SourceError::Parse { .. } => "parse",
            SourceError::Client { .. } | SourceError::Request(_) | SourceError::Config(_) => {
                "config"
            }
        }
    }
}

/// The result of one poll: new events, and the errors of the channels that failed (the other
/// channels' results are still delivered).
#[derive(Debug, Default)]
pub struct PollOutcome {
    /// New events (notices first seen, and cancellations).
    pub events: Vec<NodeEvent>,
    /// Failures of individual requests in this poll.
    pub errors: Vec<SourceError>,
}

impl PollOutcome {
    /// An outcome with only an error.
    pub fn failed(e: SourceError) -> Self {
        Self {
            events: Vec::new(),
            errors: vec![e],
        }
    }
}

/// One producer of [`NodeEvent`]s from a cloud's instance-metadata service.
pub trait EventSource: Send {
    /// Short name, e.g. `aws`.
    fn name(&self) -> &'static str;
    /// The cloud this source reads.
    fn cloud(&self) -> Cloud;
    /// Polls once and returns only what changed since the last poll. Long-polling sources may
    /// block here until something changes or their long-poll timeout passes.
    fn poll(&mut self) -> BoxFuture<'_, PollOutcome>;
    /// Reads the instance identity.
    fn identity(&mut self) -> BoxFuture<'_, Result<InstanceIdentity, SourceError>>;
    /// Whether [`EventSource::poll`] waits for changes itself (no sleep needed between polls).
    fn long_polls(&self) -> bool {
        false
    }
    /// The pause between polls when this source reads some path more often than
    /// `[sources] poll_interval` (each poll then reads only what is due); `None`: that interval.
    fn poll_interval(&self) -> Option<Duration> {
        None
    }
}

/// Builds the source for `cloud` from the configuration.
pub fn build(cloud: Cloud, cfg: &SourcesConfig) -> Result<Box<dyn EventSource>, SourceError> {
    Ok(match cloud {
        Cloud::Oci => Box::new(oci::OciSource::new(cfg)?),
        Cloud::Aws => Box::new(aws::AwsSource::new(cfg)?),
        Cloud::Azure => Box::new(azure::AzureSource::new(cfg)?),
        Cloud::Gcp => Box::new(gcp::GcpSource::new(cfg)?),
    })
}

/// Result of [`poll_once`]: which cloud, its identity, and the events seen.
#[derive(Debug, Default, Serialize)]
pub struct OnceReport {
    /// The cloud used (none: detection found none, or `cloud = "none"`).
    pub cloud: Option<Cloud>,
    /// The instance identity, when it could be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<InstanceIdentity>,
    /// Events pending now.
    pub events: Vec<NodeEvent>,
    /// Errors, as text.
    pub errors: Vec<String>,
    /// What this source cannot see, in words.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Detects the cloud (unless configured), reads the identity and polls once. For
/// `nodekeeper agent --once` and debugging on a node.
pub async fn poll_once(cfg: &SourcesConfig) -> OnceReport {
    let mut report = OnceReport::default();
    let Some(cloud) = detect::resolve(cfg).await else {
        return report;
    };
    report.cloud = Some(cloud);
    if cloud == Cloud::Oci && cfg.oci.poll_paths.is_empty() {
        report.notes.push(oci::NO_NOTICE_PATHS.to_string());
    }
    let mut source = match build(cloud, cfg) {
        Ok(s) => s,
        Err(e) => {
            report.errors.push(e.to_string());
            return report;
        }
    };
    match source.identity().await {
        Ok(id) => report.identity = Some(id),
        Err(e) => report.errors.push(e.to_string()),
    }
    // Long-polling sources answer their first poll at once with the current values.
    let out = source.poll().await;
    report.events = out.events;
    report
        .errors
        .extend(out.errors.iter().map(ToString::to_string));
    report
}

/// Parses the timestamp formats the metadata services use: RFC 3339 (`2017-09-18T08:22:00Z`),
/// RFC 2822 (`Mon, 19 Sep 2016 18:29:47 GMT`) and AWS maintenance (`21 Jan 2019 09:00:43 GMT`).
pub fn parse_time(what: &'static str, s: &str) -> Result<DateTime<Utc>, ParseError> {
    let s = s.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    if let Ok(t) = DateTime::parse_from_rfc2822(s) {
        return Ok(t.with_timezone(&Utc));
    }
    chrono::NaiveDateTime::parse_from_str(s, "%d %b %Y %H:%M:%S GMT")
        .map(|t| t.and_utc())
        .map_err(|_| ParseError::time(what, s))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_transport_error_keeps_its_source_and_shows_the_whole_chain() {
        let url = "http://127.0.0.1:1/";
        let client = crate::http::builder(None).unwrap().build().unwrap();
        let source = client.get(url).send().await.unwrap_err();
        let chain = crate::telemetry::error_chain(&source);
        let e = SourceError::Transport {
            url: url.into(),
            source,
        };
        assert_eq!(e.to_string(), format!("{url}: request failed: {chain}"));
        assert!(std::error::Error::source(&e).is_some());
        assert_eq!(crate::telemetry::error_chain(&e), e.to_string());
    }

    #[test]
    fn node_event_json_shape_round_trips() {
        let mut t = NoticeTracker::new(Some(Cloud::Aws));
        let n = Notice::new("terminate@t", EventKind::Preemption).with("action", "terminate");
        let e = t.observe("aws/spot", vec![n], Utc::now()).remove(0);
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["version"], 1);
        assert_eq!(v["kind"], serde_json::json!({"type": "preemption"}));
        assert_eq!(v["cloud"], "aws");
        assert_eq!(v["detail"]["action"], "terminate");
        assert!(v.get("deadline").is_none(), "unknown times are omitted");
        let back: NodeEvent = serde_json::from_value(v).unwrap();
        assert_eq!(back, e);
        let c = t.observe("aws/spot", vec![], Utc::now()).remove(0);
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(
            v["kind"],
            serde_json::json!({"type": "cancelled", "of": e.id})
        );
    }

    #[test]
    fn times_in_all_three_formats() {
        for s in [
            "2016-09-19T18:29:47Z",
            "Mon, 19 Sep 2016 18:29:47 GMT",
            "19 Sep 2016 18:29:47 GMT",
        ] {
            assert_eq!(
                parse_time("t", s).unwrap().timestamp(),
                1_474_309_787,
                "{s}"
            );
        }
        assert!(matches!(
            parse_time("t", "tomorrow"),
            Err(ParseError::Time { .. })
        ));
        assert_eq!("gcp".parse::<Cloud>().unwrap(), Cloud::Gcp);
        assert!("mars".parse::<Cloud>().is_err());
    }
}

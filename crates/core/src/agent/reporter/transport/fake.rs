//! A scripted transport for the reporter loop's tests: answers from a script (then 200 with an
//! empty response), and records when each POST came (tokio's clock) and what it carried.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use tokio::time::Instant;

use super::{Answer, ReportTransport, TransportError};
use crate::wire::NodeReport;

/// The body of an accepted report: an empty [`crate::wire::ReportResponse`].
const ACCEPTED: &[u8] = br#"{"accepted":true,"acknowledged_events":[],"commands":[]}"#;

/// The `Warning` of [`Script::Deprecated`], as the controller words it.
pub(crate) const DEPRECATED: &str =
    "299 - \"report version 1 is deprecated; upgrade the agent (docs/install.md)\"";

/// One scripted answer.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Script {
    /// 200 with an empty [`crate::wire::ReportResponse`].
    Ok,
    /// A transport error (the controller unreachable).
    Down,
    /// 503 with `Retry-After` of this many seconds (a controller shedding load).
    Busy(u64),
    /// 400 for the report's version (an older controller than the agent, during an upgrade).
    OldController,
    /// 200 with a `Warning` header (a newer controller deprecating the agent's report version).
    Deprecated,
}

/// What the fake saw.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// When each POST came.
    pub at: Vec<Instant>,
    /// The reports, decoded.
    pub reports: Vec<NodeReport>,
}

/// The fake; clone the `seen` handle before boxing it.
#[derive(Debug, Default)]
pub(crate) struct FakeTransport {
    pub script: Mutex<VecDeque<Script>>,
    pub seen: Arc<Mutex<Seen>>,
}

impl FakeTransport {
    pub(crate) fn new(script: &[Script]) -> Self {
        FakeTransport {
            script: Mutex::new(script.iter().copied().collect()),
            seen: Arc::default(),
        }
    }
}

impl ReportTransport for FakeTransport {
    fn post<'a>(
        &'a self,
        _token: &'a str,
        body: Vec<u8>,
    ) -> BoxFuture<'a, Result<Answer, TransportError>> {
        {
            let mut seen = self.seen.lock().unwrap();
            seen.at.push(Instant::now());
            seen.reports.push(serde_json::from_slice(&body).unwrap());
        }
        let step = self
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Script::Ok);
        Box::pin(async move {
            match step {
                Script::Ok => Ok(Answer {
                    status: 200,
                    body: ACCEPTED.to_vec().into(),
                    retry_after: None,
                    warning: None,
                }),
                Script::Down => Err("connection refused".into()),
                Script::Deprecated => Ok(Answer {
                    status: 200,
                    body: ACCEPTED.to_vec().into(),
                    retry_after: None,
                    warning: Some(DEPRECATED.into()),
                }),
                Script::OldController => Ok(Answer {
                    status: 400,
                    body: br#"{"error":"unsupported report version 2; this controller accepts report versions 1","accepted_versions":[1]}"#
                        .to_vec()
                        .into(),
                    retry_after: None,
                    warning: None,
                }),
                Script::Busy(secs) => Ok(Answer {
                    status: 503,
                    body: br#"{"error":"too many reports in flight"}"#.to_vec().into(),
                    retry_after: Some(std::time::Duration::from_secs(secs)),
                    warning: None,
                }),
            }
        })
    }
}

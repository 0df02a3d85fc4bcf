//! AWS EC2 IMDSv2: a session token (PUT `/latest/api/token` with a TTL header, refreshed before
//! it expires and on 401), then the Spot interruption notice, the rebalance recommendation and
//! scheduled maintenance events. 404 on a notice path means nothing is pending. The Spot notice
//! (2 minutes ahead) is read every `[sources.aws] spot_poll_interval`, the other two every
//! `[sources] poll_interval`.

use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use reqwest::Method;
use serde::Deserialize;

use super::http::{Http, Response};
use super::{
    parse_json, parse_text, parse_time, Cloud, EventKind, EventSource, InstanceIdentity, Notice,
    NoticeTracker, ParseError, PollOutcome, SourceError, SourcesConfig,
};

/// Token endpoint.
pub const TOKEN_PATH: &str = "/latest/api/token";
/// Header carrying the requested token TTL in seconds.
pub const TTL_HEADER: &str = "X-aws-ec2-metadata-token-ttl-seconds";
/// Header carrying the token on every GET.
pub const TOKEN_HEADER: &str = "X-aws-ec2-metadata-token";
/// Spot interruption notice.
pub const SPOT_PATH: &str = "/latest/meta-data/spot/instance-action";
/// Rebalance recommendation.
pub const REBALANCE_PATH: &str = "/latest/meta-data/events/recommendations/rebalance";
/// Scheduled maintenance events.
pub const SCHEDULED_PATH: &str = "/latest/meta-data/events/maintenance/scheduled";
/// `spot` or `on-demand`.
pub const LIFECYCLE_PATH: &str = "/latest/meta-data/instance-life-cycle";
/// Instance identity document.
pub const IDENTITY_PATH: &str = "/latest/dynamic/instance-identity/document";

#[derive(Deserialize)]
struct SpotAction {
    action: String,
    time: String,
}

/// Parses `spot/instance-action`: `{"action":"terminate|stop|hibernate","time":"…"}`.
pub fn parse_spot_action(body: &[u8]) -> Result<Vec<Notice>, ParseError> {
    const WHAT: &str = "aws spot/instance-action";
    let a: SpotAction = parse_json(WHAT, body)?;
    if !matches!(a.action.as_str(), "terminate" | "stop" | "hibernate") {
        return Err(ParseError::value(WHAT, &a.action));
    }
    let at = parse_time(WHAT, &a.time)?;
    // Keyed by the action alone: an instance gets one interruption notice, and its `time` is not
    // part of its identity. Amazon's EC2 metadata mock (AEMM) serves `time` as the request's time
    // plus 2 minutes unless told a fixed one, so a key with the time looked like a new notice (and
    // the withdrawal of the previous one) at every poll.
    let mut n = Notice::new(a.action.clone(), EventKind::Preemption).with("action", &a.action);
    n.deadline = Some(at);
    n.not_before = Some(at);
    Ok(vec![n])
}

#[derive(Deserialize)]
struct Rebalance {
    #[serde(rename = "noticeTime")]
    notice_time: String,
}

/// Parses `events/recommendations/rebalance`: `{"noticeTime":"…"}`.
pub fn parse_rebalance(body: &[u8]) -> Result<Vec<Notice>, ParseError> {
    const WHAT: &str = "aws rebalance recommendation";
    let r: Rebalance = parse_json(WHAT, body)?;
    let at = parse_time(WHAT, &r.notice_time)?;
    // One recommendation per instance: keyed by nothing that changes (AEMM serves `noticeTime` as
    // the request's time unless told a fixed one; see `parse_spot_action`).
    Ok(vec![
        Notice::new("rebalance", EventKind::Rebalance).with("notice_time", at.to_rfc3339())
    ])
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Scheduled {
    code: String,
    #[serde(default)]
    description: String,
    event_id: String,
    not_before: String,
    #[serde(default)]
    not_after: Option<String>,
    #[serde(default)]
    state: String,
}

/// Parses `events/maintenance/scheduled`: a JSON array of `{NotBefore, Code, Description,
/// EventId, NotAfter, State}`. Events in state `canceled` or `completed` are not notices.
pub fn parse_scheduled(body: &[u8]) -> Result<Vec<Notice>, ParseError> {
    const WHAT: &str = "aws events/maintenance/scheduled";
    let events: Vec<Scheduled> = parse_json(WHAT, body)?;
    let mut out = Vec::new();
    for e in events {
        if matches!(e.state.as_str(), "canceled" | "completed") {
            continue;
        }
        let kind = match e.code.as_str() {
            "instance-reboot" | "system-reboot" => EventKind::Reboot,
            "instance-stop" | "instance-retirement" => EventKind::Termination,
            "system-maintenance" => EventKind::Maintenance,
            other => return Err(ParseError::value(WHAT, other)),
        };
        let mut n = Notice::new(e.event_id.clone(), kind)
            .with("code", &e.code)
            .with("event_id", &e.event_id)
            .with("description", crate::text::truncate(&e.description, 200));
        n.not_before = Some(parse_time(WHAT, &e.not_before)?);
        n.deadline = match e.not_after.as_deref().filter(|s| !s.is_empty()) {
            Some(s) => Some(parse_time(WHAT, s)?),
            None => None,
        };
        out.push(n);
    }
    Ok(out)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct IdentityDocument {
    instance_id: String,
    #[serde(default)]
    region: Option<String>,
    #[serde(default)]
    availability_zone: Option<String>,
    #[serde(default)]
    instance_type: Option<String>,
    #[serde(default)]
    pending_time: Option<String>,
}

/// Parses the instance identity document and the `instance-life-cycle` answer (`spot` or
/// `on-demand`; `None` when unavailable).
pub fn parse_identity(
    document: &[u8],
    lifecycle: Option<&[u8]>,
) -> Result<InstanceIdentity, ParseError> {
    const WHAT: &str = "aws instance-identity document";
    let d: IdentityDocument = parse_json(WHAT, document)?;
    let preemptible = match lifecycle
        .map(|b| parse_text("aws instance-life-cycle", b))
        .transpose()?
    {
        Some("spot") => Some(true),
        Some("on-demand" | "scheduled") => Some(false),
        Some(other) => return Err(ParseError::value("aws instance-life-cycle", other)),
        None => None,
    };
    Ok(InstanceIdentity {
        cloud: Some(Cloud::Aws),
        instance_id: d.instance_id,
        region: d.region,
        zone: d.availability_zone,
        instance_type: d.instance_type,
        preemptible,
        created_at: d
            .pending_time
            .as_deref()
            .and_then(|t| parse_time(WHAT, t).ok()),
        ..InstanceIdentity::default()
    })
}

/// The AWS IMDSv2 source.
#[derive(Debug)]
pub struct AwsSource {
    http: Http,
    ttl: Duration,
    token: Option<(String, Instant)>,
    tracker: NoticeTracker,
    cadence: Cadence,
    spot_every: Duration,
}

/// When the slower paths (rebalance, scheduled events) are due: each poll reads the Spot notice,
/// and these only once `every` has passed since they were last read.
#[derive(Debug)]
struct Cadence {
    every: Duration,
    next: Option<tokio::time::Instant>,
}

impl Cadence {
    /// Whether the slower paths are due at `now`; if so, the next time is `now + every`.
    fn due(&mut self, now: tokio::time::Instant) -> bool {
        if self.next.is_some_and(|next| now < next) {
            return false;
        }
        self.next = Some(now + self.every);
        true
    }
}

impl AwsSource {
    /// A source reading `cfg.endpoint`.
    pub fn new(cfg: &SourcesConfig) -> Result<Self, SourceError> {
        Ok(Self {
            http: Http::new(&cfg.endpoint, cfg.request_timeout)?,
            ttl: cfg.aws.token_ttl,
            token: None,
            tracker: NoticeTracker::new(Some(Cloud::Aws)),
            cadence: Cadence {
                every: cfg.poll_interval,
                next: None,
            },
            spot_every: cfg.aws.spot_poll_interval.min(cfg.poll_interval),
        })
    }

    /// Refresh this long before the token expires: a tenth of the TTL, at most a minute.
    fn margin(&self) -> Duration {
        (self.ttl / 10).min(Duration::from_secs(60))
    }

    async fn token(&mut self) -> Result<String, SourceError> {
        if let Some((tok, at)) = &self.token {
            if at.elapsed() + self.margin() < self.ttl {
                return Ok(tok.clone());
            }
        }
        let req = self
            .http
            .request(Method::PUT, TOKEN_PATH)
            .header(TTL_HEADER, self.ttl.as_secs().to_string());
        let resp = self.http.send(req, Duration::ZERO).await?.require_ok()?;
        let tok = parse_text("aws token", &resp.body).map_err(|e| resp.parse_error(e))?;
        if tok.is_empty() || !tok.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(resp.parse_error(ParseError::value("aws token", "<not a token>")));
        }
        self.token = Some((tok.to_string(), Instant::now()));
        Ok(tok.to_string())
    }

    /// GET with the token; on 401 the token is dropped, renewed and the GET retried once.
    async fn get(&mut self, path: &str) -> Result<Response, SourceError> {
        let resp = self.get_once(path).await?;
        if resp.status != 401 {
            return Ok(resp);
        }
        tracing::debug!(path, "IMDSv2 token refused; renewing it");
        self.token = None;
        self.get_once(path).await
    }

    async fn get_once(&mut self, path: &str) -> Result<Response, SourceError> {
        let tok = self.token().await?;
        let req = self
            .http
            .request(Method::GET, path)
            .header(TOKEN_HEADER, tok);
        self.http.send(req, Duration::ZERO).await
    }

    async fn channel(
        &mut self,
        out: &mut PollOutcome,
        channel: &str,
        path: &str,
        parse: super::NoticeParser,
    ) {
        let notices = self.get(path).await.and_then(|resp| resp.notices(parse));
        self.tracker.record(out, channel, notices);
    }

    async fn poll_all(&mut self) -> PollOutcome {
        let mut out = PollOutcome::default();
        self.channel(&mut out, "aws/spot", SPOT_PATH, parse_spot_action)
            .await;
        if self.cadence.due(tokio::time::Instant::now()) {
            self.channel(&mut out, "aws/rebalance", REBALANCE_PATH, parse_rebalance)
                .await;
            self.channel(&mut out, "aws/scheduled", SCHEDULED_PATH, parse_scheduled)
                .await;
        }
        out
    }

    async fn read_identity(&mut self) -> Result<InstanceIdentity, SourceError> {
        let doc = self.get(IDENTITY_PATH).await?.require_ok()?;
        let lc = self.get(LIFECYCLE_PATH).await?;
        let lifecycle = (lc.status == 200).then_some(&lc.body[..]);
        parse_identity(&doc.body, lifecycle).map_err(|e| doc.parse_error(e))
    }
}

impl EventSource for AwsSource {
    fn name(&self) -> &'static str {
        "aws"
    }
    fn cloud(&self) -> Cloud {
        Cloud::Aws
    }
    fn poll(&mut self) -> BoxFuture<'_, PollOutcome> {
        Box::pin(self.poll_all())
    }
    fn identity(&mut self) -> BoxFuture<'_, Result<InstanceIdentity, SourceError>> {
        Box::pin(self.read_identity())
    }
    fn poll_interval(&self) -> Option<Duration> {
        (self.spot_every < self.cadence.every).then_some(self.spot_every)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn spot_action_sample() {
        let n =
            parse_spot_action(br#"{"action":"terminate","time":"2017-09-18T08:22:00Z"}"#).unwrap();
        assert_eq!(n.len(), 1);
        assert_eq!(n[0].kind, EventKind::Preemption);
        assert_eq!(
            n[0].deadline.unwrap().to_rfc3339(),
            "2017-09-18T08:22:00+00:00"
        );
        assert!(
            parse_spot_action(br#"{"action":"explode","time":"2017-09-18T08:22:00Z"}"#).is_err()
        );
    }

    #[test]
    fn scheduled_sample() {
        let body = br#"[{"NotBefore":"21 Jan 2019 09:00:43 GMT","Code":"system-reboot","Description":"scheduled reboot","EventId":"instance-event-0d59937288b749b32","NotAfter":"21 Jan 2019 09:17:23 GMT","State":"active"},
                        {"NotBefore":"21 Jan 2019 09:00:43 GMT","Code":"instance-stop","EventId":"e2","State":"canceled"}]"#;
        let n = parse_scheduled(body).unwrap();
        assert_eq!(n.len(), 1);
        assert_eq!(n[0].kind, EventKind::Reboot);
        assert_eq!(n[0].key, "instance-event-0d59937288b749b32");
        assert_eq!(
            n[0].not_before.unwrap().to_rfc3339(),
            "2019-01-21T09:00:43+00:00"
        );
    }

    /// What AEMM v1.13.0 serves: `json.MarshalIndent` with tabs, the day of the month not padded
    /// (Go layout `2 Jan 2006 15:04:05 GMT`), and `NotBeforeDeadline`, which AWS's API also has.
    #[test]
    fn scheduled_as_aemm_serves_it() {
        let body = b"[\n\t{\n\t\t\"Code\": \"system-maintenance\",\n\t\t\"Description\": \"The instance is scheduled for system-maintenance\",\n\t\t\"State\": \"active\",\n\t\t\"EventId\": \"instance-event-1234567890abcdef0\",\n\t\t\"NotBefore\": \"5 Mar 2027 06:07:08 GMT\",\n\t\t\"NotAfter\": \"12 Mar 2027 06:07:08 GMT\",\n\t\t\"NotBeforeDeadline\": \"14 Mar 2027 06:07:08 GMT\"\n\t}\n]";
        let n = parse_scheduled(body).unwrap();
        assert_eq!(n.len(), 1);
        assert_eq!(n[0].kind, EventKind::Maintenance);
        assert_eq!(n[0].key, "instance-event-1234567890abcdef0");
        assert_eq!(
            n[0].not_before.unwrap().to_rfc3339(),
            "2027-03-05T06:07:08+00:00"
        );
        assert_eq!(
            n[0].deadline.unwrap().to_rfc3339(),
            "2027-03-12T06:07:08+00:00"
        );
    }

    #[test]
    fn a_spot_notice_whose_time_moves_is_the_same_notice() {
        let a =
            parse_spot_action(br#"{"action":"terminate","time":"2027-03-05T06:07:08Z"}"#).unwrap();
        let b =
            parse_spot_action(br#"{"action":"terminate","time":"2027-03-05T06:07:09Z"}"#).unwrap();
        assert_eq!(a[0].key, b[0].key);
        assert_ne!(a[0].deadline, b[0].deadline);
        let stop =
            parse_spot_action(br#"{"action":"stop","time":"2027-03-05T06:07:08Z"}"#).unwrap();
        assert_ne!(a[0].key, stop[0].key);
        let r1 = parse_rebalance(br#"{"noticeTime":"2027-03-05T06:07:08Z"}"#).unwrap();
        let r2 = parse_rebalance(br#"{"noticeTime":"2027-03-05T06:07:09Z"}"#).unwrap();
        assert_eq!(r1[0].key, r2[0].key);
    }

    #[test]
    fn the_slower_paths_are_due_once_per_interval() {
        let t0 = tokio::time::Instant::now();
        let ms = Duration::from_millis;
        let mut c = Cadence {
            every: ms(1000),
            next: None,
        };
        let due: Vec<bool> = (0..=25).map(|i| c.due(t0 + ms(100 * i))).collect();
        let at: Vec<usize> = (0..due.len()).filter(|&i| due[i]).collect();
        assert_eq!(
            at,
            vec![0, 10, 20],
            "the first poll reads all, then every 1 s"
        );
        // a late poll (the driver backed off) reads them at once, and the next 1 s after it
        assert!(c.due(t0 + ms(3500)));
        assert!(!c.due(t0 + ms(4400)));
        assert!(c.due(t0 + ms(4500)));
    }

    #[test]
    fn identity_sample() {
        let doc = br#"{"instanceId":"i-0abc","region":"us-east-1","availabilityZone":"us-east-1a","instanceType":"m5.large"}"#;
        let id = parse_identity(doc, Some(b"spot")).unwrap();
        assert_eq!(id.instance_id, "i-0abc");
        assert_eq!(id.preemptible, Some(true));
        assert!(parse_identity(doc, Some(b"weird")).is_err());
    }
}

//! GCP metadata server: `instance/preempted` and `instance/maintenance-event`, each watched by a
//! long poll (`?wait_for_change=true&last_etag=…&timeout_sec=…`) with `Metadata-Flavor: Google`.
//! Brief 503s during maintenance are retried. Each key has its own task so a change on one is
//! reported without waiting for the other's long poll to end.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::future::BoxFuture;
use reqwest::Method;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::driver::Backoff;
use super::http::{Http, Response};
use super::{
    parse_text, Cloud, EventKind, EventSource, InstanceIdentity, Notice, NoticeTracker, ParseError,
    PollOutcome, SourceError, SourcesConfig,
};

/// Base of the v1 metadata API.
pub const BASE: &str = "/computeMetadata/v1/";
/// Header every request must carry.
pub const FLAVOR_HEADER: (&str, &str) = ("Metadata-Flavor", "Google");
/// `TRUE` once the instance is being preempted.
pub const PREEMPTED_KEY: &str = "instance/preempted";
/// `NONE`, `MIGRATE_ON_HOST_MAINTENANCE` or `TERMINATE_ON_HOST_MAINTENANCE`.
pub const MAINTENANCE_KEY: &str = "instance/maintenance-event";
/// The keys watched by long polls.
const WATCHED: [&str; 2] = [PREEMPTED_KEY, MAINTENANCE_KEY];
/// 503s retried quietly before one is reported.
const QUIET_503_RETRIES: u32 = 3;

/// Parses `instance/preempted`: `TRUE` is a preemption notice, `FALSE` none.
pub fn parse_preempted(body: &[u8]) -> Result<Vec<Notice>, ParseError> {
    const WHAT: &str = "gcp instance/preempted";
    match parse_text(WHAT, body)? {
        "TRUE" => Ok(vec![Notice::new("TRUE", EventKind::Preemption)]),
        "FALSE" => Ok(Vec::new()),
        other => Err(ParseError::value(WHAT, other)),
    }
}

/// Parses `instance/maintenance-event`.
pub fn parse_maintenance_event(body: &[u8]) -> Result<Vec<Notice>, ParseError> {
    const WHAT: &str = "gcp instance/maintenance-event";
    let v = parse_text(WHAT, body)?;
    let kind = match v {
        "NONE" => return Ok(Vec::new()),
        "MIGRATE_ON_HOST_MAINTENANCE" => EventKind::Maintenance,
        "TERMINATE_ON_HOST_MAINTENANCE" => EventKind::Termination,
        other => return Err(ParseError::value(WHAT, other)),
    };
    Ok(vec![Notice::new(v, kind).with("maintenance_event", v)])
}

/// Identity fields read one by one (never the recursive document, which holds user attributes).
pub const IDENTITY_KEYS: [&str; 5] = [
    "instance/id",
    "instance/name",
    "instance/zone",
    "instance/machine-type",
    "instance/scheduling/preemptible",
];

/// Builds the identity from the plain-text answers of [`IDENTITY_KEYS`] (missing keys are skipped).
pub fn parse_identity(fields: &BTreeMap<&str, Vec<u8>>) -> Result<InstanceIdentity, ParseError> {
    let text = |k: &'static str| -> Result<Option<String>, ParseError> {
        fields
            .get(k)
            .map(|b| parse_text(k, b).map(str::to_string))
            .transpose()
    };
    let last = |s: String| s.rsplit('/').next().unwrap_or_default().to_string();
    let id = text("instance/id")?.unwrap_or_default();
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseError::value("gcp instance/id", &id));
    }
    let zone = text("instance/zone")?.map(last);
    let preemptible = match text("instance/scheduling/preemptible")?.as_deref() {
        Some("TRUE") => Some(true),
        Some("FALSE") => Some(false),
        Some(other) => {
            return Err(ParseError::value(
                "gcp instance/scheduling/preemptible",
                other,
            ))
        }
        None => None,
    };
    Ok(InstanceIdentity {
        cloud: Some(Cloud::Gcp),
        instance_id: id,
        name: text("instance/name")?,
        region: zone
            .as_deref()
            .and_then(|z| z.rsplit_once('-'))
            .map(|(r, _)| r.to_string()),
        zone,
        instance_type: text("instance/machine-type")?.map(last),
        preemptible,
        ..InstanceIdentity::default()
    })
}

type Update = (&'static str, Result<Vec<u8>, SourceError>);

/// The GCP source.
#[derive(Debug)]
pub struct GcpSource {
    http: Http,
    long_poll: Duration,
    max_backoff: Duration,
    tracker: NoticeTracker,
    rx: Option<mpsc::Receiver<Update>>,
    /// Keys that answered at least once.
    seen: BTreeSet<&'static str>,
    tasks: Vec<JoinHandle<()>>,
}

impl GcpSource {
    /// A source reading `cfg.endpoint`.
    pub fn new(cfg: &SourcesConfig) -> Result<Self, SourceError> {
        Ok(Self {
            http: Http::new(&cfg.endpoint, cfg.request_timeout)?,
            long_poll: cfg.gcp.long_poll_timeout,
            max_backoff: cfg.max_backoff,
            tracker: NoticeTracker::new(Some(Cloud::Gcp)),
            rx: None,
            seen: BTreeSet::new(),
            tasks: Vec::new(),
        })
    }

    fn start(&mut self) -> &mut mpsc::Receiver<Update> {
        self.rx.get_or_insert_with(|| {
            let (tx, rx) = mpsc::channel(16);
            for key in WATCHED {
                let w = Watcher {
                    http: self.http.clone(),
                    key,
                    long_poll: self.long_poll,
                    max: self.max_backoff,
                };
                self.tasks.push(tokio::spawn(w.run(tx.clone())));
            }
            rx
        })
    }

    fn apply(&mut self, out: &mut PollOutcome, (key, update): Update) {
        self.seen.insert(key);
        let (channel, parse): (&str, super::NoticeParser) = match key {
            PREEMPTED_KEY => ("gcp/preempted", parse_preempted),
            _ => ("gcp/maintenance-event", parse_maintenance_event),
        };
        let url = self.http.url(&format!("{BASE}{key}"));
        let notices =
            update.and_then(|b| parse(&b).map_err(|source| SourceError::Parse { url, source }));
        self.tracker.record(out, channel, notices);
    }

    async fn next(&mut self) -> PollOutcome {
        let wait = self.long_poll + self.http.timeout();
        let first = match tokio::time::timeout(wait, self.start().recv()).await {
            Ok(Some(u)) => u,
            Ok(None) => {
                return PollOutcome::failed(SourceError::Config("gcp watchers stopped".to_string()))
            }
            Err(_) => return PollOutcome::default(),
        };
        let mut out = PollOutcome::default();
        self.apply(&mut out, first);
        // At start, wait for every key's first answer so one poll shows the whole current state.
        while self.seen.len() < WATCHED.len() {
            let Some(rx) = self.rx.as_mut() else { break };
            match tokio::time::timeout(self.http.timeout(), rx.recv()).await {
                Ok(Some(u)) => self.apply(&mut out, u),
                Ok(None) | Err(_) => break,
            }
        }
        while let Some(u) = self.rx.as_mut().and_then(|rx| rx.try_recv().ok()) {
            self.apply(&mut out, u);
        }
        out
    }

    async fn read_identity(&mut self) -> Result<InstanceIdentity, SourceError> {
        let mut fields = BTreeMap::new();
        for key in IDENTITY_KEYS {
            let req = self
                .http
                .request(Method::GET, &format!("{BASE}{key}"))
                .header(FLAVOR_HEADER.0, FLAVOR_HEADER.1);
            let resp = self.http.send(req, Duration::ZERO).await?;
            match resp.status {
                200 => {
                    fields.insert(key, resp.body.to_vec());
                }
                404 => {}
                _ => return Err(resp.unexpected()),
            }
        }
        parse_identity(&fields).map_err(|source| SourceError::Parse {
            url: self.http.url(BASE),
            source,
        })
    }
}

impl Drop for GcpSource {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl EventSource for GcpSource {
    fn name(&self) -> &'static str {
        "gcp"
    }
    fn cloud(&self) -> Cloud {
        Cloud::Gcp
    }
    fn poll(&mut self) -> BoxFuture<'_, PollOutcome> {
        Box::pin(self.next())
    }
    fn identity(&mut self) -> BoxFuture<'_, Result<InstanceIdentity, SourceError>> {
        Box::pin(self.read_identity())
    }
    fn long_polls(&self) -> bool {
        true
    }
}

/// Long-polls one key and sends each new value (or error) to the source.
struct Watcher {
    http: Http,
    key: &'static str,
    long_poll: Duration,
    max: Duration,
}

impl Watcher {
    fn path(&self, etag: Option<&str>) -> String {
        match etag {
            None => format!("{BASE}{}", self.key),
            Some(e) => format!(
                "{BASE}{}?wait_for_change=true&last_etag={}&timeout_sec={}",
                self.key,
                urlencode(e),
                self.long_poll.as_secs().max(1)
            ),
        }
    }

    async fn fetch(&self, etag: Option<&str>) -> Result<Response, SourceError> {
        let req = self
            .http
            .request(Method::GET, &self.path(etag))
            .header(FLAVOR_HEADER.0, FLAVOR_HEADER.1);
        let extra = if etag.is_some() {
            self.long_poll
        } else {
            Duration::ZERO
        };
        self.http.send(req, extra).await
    }

    async fn run(self, tx: mpsc::Sender<Update>) {
        let me = &self;
        watch_key(
            self.key,
            self.max,
            move |etag: Option<String>| async move { me.fetch(etag.as_deref()).await },
            tx,
        )
        .await;
    }
}

/// The loop of one [`Watcher`], over `fetch` (given the last ETag: `None` asks at once, `Some`
/// long-polls for a change): a 200 with a new value is sent and long-polled from; a 200 with
/// the same ETag (the long poll timed out) is asked again at once; a 200 without an ETag is
/// polled again after 200 ms; the first [`QUIET_503_RETRIES`] 503s in a row are retried after
/// the backoff without a message; other failures are sent and retried after the backoff
/// (200 ms doubling up to `max`, reset by a 200).
async fn watch_key<F, Fut>(key: &'static str, max: Duration, fetch: F, tx: mpsc::Sender<Update>)
where
    F: Fn(Option<String>) -> Fut,
    Fut: std::future::Future<Output = Result<Response, SourceError>>,
{
    let mut etag: Option<String> = None;
    let mut backoff = Backoff::new(Duration::from_millis(200), max);
    let mut quiet_503 = 0;
    loop {
        let result = fetch(etag.clone()).await;
        let update = match result {
            Ok(r) if r.status == 200 => {
                backoff.reset();
                quiet_503 = 0;
                if r.etag.is_some() && r.etag == etag {
                    continue; // long poll timed out without a change
                }
                etag = r.etag.clone();
                if etag.is_none() {
                    // Without an ETag a long poll cannot be resumed; fall back to polling.
                    tokio::time::sleep(backoff.base()).await;
                }
                Ok(r.body.to_vec())
            }
            Ok(r) if r.status == 503 && quiet_503 < QUIET_503_RETRIES => {
                quiet_503 += 1;
                tokio::time::sleep(backoff.next_delay()).await;
                continue;
            }
            Ok(r) => Err(r.unexpected()),
            Err(e) => Err(e),
        };
        let failed = update.is_err();
        if tx.send((key, update)).await.is_err() {
            return;
        }
        if failed {
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn values() {
        assert_eq!(parse_preempted(b"TRUE\n").unwrap().len(), 1);
        assert!(parse_preempted(b"FALSE").unwrap().is_empty());
        assert!(parse_preempted(b"maybe").is_err());
        assert_eq!(
            parse_maintenance_event(b"MIGRATE_ON_HOST_MAINTENANCE").unwrap()[0].kind,
            EventKind::Maintenance
        );
        assert_eq!(
            parse_maintenance_event(b"TERMINATE_ON_HOST_MAINTENANCE").unwrap()[0].kind,
            EventKind::Termination
        );
        assert!(parse_maintenance_event(b"NONE").unwrap().is_empty());
    }

    #[test]
    fn identity() {
        let mut f: BTreeMap<&str, Vec<u8>> = BTreeMap::new();
        f.insert("instance/id", b"1234567890".to_vec());
        f.insert("instance/zone", b"projects/42/zones/us-central1-a".to_vec());
        f.insert(
            "instance/machine-type",
            b"projects/42/machineTypes/e2-medium".to_vec(),
        );
        f.insert("instance/scheduling/preemptible", b"TRUE".to_vec());
        let id = parse_identity(&f).unwrap();
        assert_eq!(id.zone.as_deref(), Some("us-central1-a"));
        assert_eq!(id.region.as_deref(), Some("us-central1"));
        assert_eq!(id.instance_type.as_deref(), Some("e2-medium"));
        assert_eq!(id.preemptible, Some(true));
        assert_eq!(urlencode("a b/c"), "a%20b%2Fc");
    }

    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use tokio::time::Instant;

    /// A scripted answer: `Some((status, etag))`, or `None` for a failed request.
    type Answer = Option<(u16, Option<&'static str>)>;

    /// Runs [`watch_key`] over `script` until the script is used up; returns each request's
    /// time and the ETag it long-polled from, and each message's time and whether it was an
    /// error.
    async fn watch(
        script: &[Answer],
        max: Duration,
    ) -> (Vec<(Duration, Option<String>)>, Vec<(Duration, bool)>) {
        let t0 = Instant::now();
        let left = Arc::new(Mutex::new(script.iter().copied().collect::<VecDeque<_>>()));
        let asked = Arc::new(Mutex::new(Vec::new()));
        let done = Arc::new(tokio::sync::Notify::new());
        let fetch = {
            let (left, asked, done) = (left.clone(), asked.clone(), done.clone());
            move |etag: Option<String>| {
                asked.lock().unwrap().push((t0.elapsed(), etag));
                let next = left.lock().unwrap().pop_front();
                let done = done.clone();
                async move {
                    let Some(answer) = next else {
                        done.notify_one();
                        return std::future::pending().await;
                    };
                    match answer {
                        Some((status, etag)) => Ok(Response {
                            url: "u".into(),
                            status,
                            etag: etag.map(str::to_string),
                            body: bytes::Bytes::from_static(b"NONE"),
                        }),
                        None => Err(SourceError::Config("refused".into())),
                    }
                }
            }
        };
        let (tx, mut rx) = mpsc::channel(64);
        let task = tokio::spawn(watch_key(MAINTENANCE_KEY, max, fetch, tx));
        let mut messages = Vec::new();
        loop {
            // Messages first: the ones sent before the script ran out are all taken.
            tokio::select! {
                biased;
                m = rx.recv() => messages.push((t0.elapsed(), m.unwrap().1.is_err())),
                _ = done.notified() => break,
            }
        }
        task.abort();
        let asked = asked.lock().unwrap().clone();
        assert_eq!(asked.len(), script.len() + 1);
        (asked, messages)
    }

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn within(gap: Duration, d: Duration) -> bool {
        gap >= d / 2 && gap <= d + MS(1)
    }

    /// Long polls: a change is sent and long-polled from (its ETag); a timed-out long poll (same
    /// ETag) is asked again at once without a message.
    #[tokio::test(start_paused = true)]
    async fn a_timed_out_long_poll_is_resumed_at_once_from_the_last_etag() {
        let script = [
            Some((200, Some("e1"))),
            Some((200, Some("e1"))),
            Some((200, Some("e2"))),
        ];
        let (asked, messages) = watch(&script, MS(30_000)).await;
        let etags: Vec<Option<&str>> = asked.iter().map(|(_, e)| e.as_deref()).collect();
        assert_eq!(etags, [None, Some("e1"), Some("e1"), Some("e2")]);
        assert!(asked.iter().all(|(t, _)| t.is_zero()), "{asked:?}");
        assert_eq!(messages, [(Duration::ZERO, false), (Duration::ZERO, false)]);
    }

    /// Failures: each is sent, then retried after 200 ms doubling (jittered into [d/2, d]) up
    /// to the cap; a 200 resets the backoff.
    #[tokio::test(start_paused = true)]
    async fn failures_are_sent_and_retried_with_a_doubling_backoff_reset_by_a_200() {
        let script = [None, None, None, None, None, Some((200, Some("e"))), None];
        let (asked, messages) = watch(&script, MS(1_000)).await;
        let gaps: Vec<Duration> = asked.windows(2).map(|w| w[1].0 - w[0].0).collect();
        for (i, d) in [200u64, 400, 800, 1_000, 1_000].iter().enumerate() {
            assert!(within(gaps[i], MS(*d)), "gap {i}: {:?} for {d} ms", gaps[i]);
        }
        assert_eq!(
            gaps[5],
            Duration::ZERO,
            "a change is long-polled from at once"
        );
        assert!(within(gaps[6], MS(200)), "reset: {:?}", gaps[6]);
        let errors: Vec<bool> = messages.iter().map(|(_, e)| *e).collect();
        assert_eq!(errors, [true, true, true, true, true, false, true]);
    }

    /// 503s (maintenance): three in a row are retried quietly after the backoff; the fourth is
    /// reported. A 200 in between restarts the quiet count.
    #[tokio::test(start_paused = true)]
    async fn brief_503s_are_retried_quietly_three_times() {
        let s503 = Some((503, None));
        let script = [s503, s503, s503, s503, Some((200, Some("e"))), s503];
        let (asked, messages) = watch(&script, MS(60_000)).await;
        let gaps: Vec<Duration> = asked.windows(2).map(|w| w[1].0 - w[0].0).collect();
        for (i, d) in [200u64, 400, 800, 1_600].iter().enumerate() {
            assert!(within(gaps[i], MS(*d)), "gap {i}: {:?} for {d} ms", gaps[i]);
        }
        assert_eq!(gaps[4], Duration::ZERO);
        assert!(within(gaps[5], MS(200)), "{:?}", gaps[5]);
        let errors: Vec<bool> = messages.iter().map(|(_, e)| *e).collect();
        assert_eq!(
            errors,
            [true, false],
            "only the fourth 503 and the 200 are sent"
        );
        assert_eq!(
            messages[0].0, asked[3].0,
            "the fourth 503 is sent when it arrives"
        );
    }

    /// Without an ETag a long poll cannot resume: the value is sent 200 ms later and asked
    /// again right after (plain polling every 200 ms).
    #[tokio::test(start_paused = true)]
    async fn without_an_etag_it_polls_every_200_ms() {
        let script = [Some((200, None)), Some((200, None)), Some((200, None))];
        let (asked, messages) = watch(&script, MS(60_000)).await;
        let times: Vec<Duration> = asked.iter().map(|(t, _)| *t).collect();
        assert_eq!(times, [MS(0), MS(200), MS(400), MS(600)]);
        assert!(asked.iter().all(|(_, e)| e.is_none()));
        let sent: Vec<Duration> = messages.iter().map(|(t, _)| *t).collect();
        assert_eq!(sent, [MS(200), MS(400), MS(600)]);
    }
}

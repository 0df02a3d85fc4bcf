//! Webhook notifications against a local axum receiver on 127.0.0.1: body, template, signature,
//! event filter, retry on 500, queue bound, and `[[controller.notify]]` validation.
#![allow(clippy::unwrap_used)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use nodekeeper_core::config::Env;
use nodekeeper_core::config_file::Config;
use nodekeeper_core::controller::act::notify::{
    Notification, Notifier, NotifyConfig, Payload, Phase, EVENT_HEADER,
};
use nodekeeper_core::controller::act::provider::webhook::SIGNATURE_HEADER;
use tokio::sync::{Notify, Semaphore};

const SECRET: &str = "notify-secret-key";

#[derive(Debug, Clone)]
struct Got {
    headers: HeaderMap,
    body: Bytes,
}

impl Got {
    fn header(&self, k: &str) -> Option<String> {
        self.headers.get(k).map(|v| v.to_str().unwrap().to_string())
    }
    fn payload(&self) -> Payload {
        serde_json::from_slice(&self.body).unwrap()
    }
    fn text(&self) -> String {
        String::from_utf8(self.body.to_vec()).unwrap()
    }
}

struct Receiver {
    /// Statuses to answer, in order; 200 when exhausted.
    statuses: Mutex<VecDeque<u16>>,
    /// Requests wait for a permit here when set (a stuck receiver).
    gate: Option<Semaphore>,
    /// Signalled when a request arrives.
    arrived: Notify,
    got: Mutex<Vec<Got>>,
}

impl Receiver {
    fn new(statuses: &[u16], gated: bool) -> Arc<Self> {
        Arc::new(Receiver {
            statuses: Mutex::new(statuses.iter().copied().collect()),
            gate: gated.then(|| Semaphore::new(0)),
            arrived: Notify::new(),
            got: Mutex::new(Vec::new()),
        })
    }
    fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }
}

async fn handle(State(r): State<Arc<Receiver>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    r.got.lock().unwrap().push(Got { headers, body });
    r.arrived.notify_one();
    if let Some(g) = &r.gate {
        let _permit = g.acquire().await.unwrap();
    }
    let s = r.statuses.lock().unwrap().pop_front().unwrap_or(200);
    StatusCode::from_u16(s).unwrap()
}

async fn serve(r: Arc<Receiver>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().route("/hook", post(handle)).with_state(r);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/hook")
}

fn target(url: &str) -> NotifyConfig {
    let mut c = NotifyConfig::new(url);
    c.backoff = Duration::from_millis(10);
    c.timeout = Duration::from_secs(5);
    c
}

fn note(node: &str, phase: Phase, message: &str) -> Notification {
    Notification {
        node: node.into(),
        action: "drain".into(),
        phase,
        reason: "repair:Ready=False".into(),
        message: message.into(),
    }
}

/// Independent HMAC check (the hmac crate directly, not nodekeeper's `sign`).
fn signature(body: &[u8]) -> String {
    use hmac::{Hmac, KeyInit, Mac};
    let mut mac = <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

#[tokio::test]
async fn default_body_signature_template_and_event_filter() {
    let all = Receiver::new(&[], false);
    let failed_only = Receiver::new(&[], false);
    let mut a = target(&serve(all.clone()).await);
    a.secret = SECRET.into();
    let mut b = target(&serve(failed_only.clone()).await);
    b.events = vec![Phase::Failed];
    b.template =
        Some(r#"{"text": "nodekeeper {action} on {node}: {result} ({reason}) {message}"}"#.into());
    let n = Notifier::start(&[a, b], true).unwrap();

    n.notify(note("n1", Phase::Started, ""));
    n.notify(note("n1", Phase::Finished, "3 pods evicted"));
    n.notify(note(
        "n2",
        Phase::Failed,
        "pod \"shop/web-1\" blocked by PDB shop/web",
    ));
    assert!(n.flush(Duration::from_secs(10)).await);

    let got = all.got();
    assert_eq!(got.len(), 3);
    let phases: Vec<String> = got.iter().map(|g| g.payload().phase).collect();
    assert_eq!(phases, ["started", "finished", "failed"]);
    for g in &got {
        let p = g.payload();
        assert_eq!(p.version, 1);
        assert_eq!(p.action, "drain");
        assert_eq!(p.reason, "repair:Ready=False");
        assert_eq!(g.header("content-type").unwrap(), "application/json");
        assert_eq!(g.header(SIGNATURE_HEADER).unwrap(), signature(&g.body));
        assert_eq!(g.header(EVENT_HEADER).unwrap(), p.phase);
        assert_eq!(g.header("idempotency-key").unwrap(), p.id);
        assert!((chrono::Utc::now() - p.time).num_seconds() < 30);
    }
    let p = got[1].payload();
    assert_eq!(
        (p.node.as_str(), p.result.as_str(), p.message.as_str()),
        ("n1", "succeeded", "3 pods evicted")
    );
    assert_ne!(got[0].payload().id, got[1].payload().id);

    // The filtered, templated, unsigned target: only the failure, JSON-escaped into the template.
    let got = failed_only.got();
    assert_eq!(got.len(), 1);
    assert!(got[0].header(SIGNATURE_HEADER).is_none());
    assert_eq!(got[0].header("content-type").unwrap(), "application/json");
    let v: serde_json::Value = serde_json::from_str(&got[0].text()).unwrap();
    assert_eq!(
        v["text"],
        "nodekeeper drain on n2: failed (repair:Ready=False) pod \"shop/web-1\" blocked by PDB shop/web"
    );
    let s = n.stats();
    assert_eq!((s[0].sent, s[0].failed, s[0].dropped), (3, 0, 0));
    assert_eq!((s[1].sent, s[1].failed, s[1].dropped), (1, 0, 0));
    // Targets are named without their path (webhook URLs often carry a token).
    assert!(
        s[0].target.starts_with("notify[0] http://127.0.0.1:") && !s[0].target.contains("/hook")
    );
    let m = n.metrics_text();
    for line in [
        "nodekeeper_notifications_total{target=\"0\",outcome=\"sent\"} 3",
        "nodekeeper_notifications_total{target=\"1\",outcome=\"sent\"} 1",
        "nodekeeper_notifications_total{target=\"1\",outcome=\"dropped\"} 0",
        "nodekeeper_notification_queue_length{target=\"0\"} 0",
    ] {
        assert!(m.lines().any(|l| l == line), "missing {line} in\n{m}");
    }
    assert!(!m.contains("n1") && !m.contains("127.0.0.1"), "{m}");
}

#[tokio::test]
async fn text_template_is_plain_text() {
    let r = Receiver::new(&[], false);
    let mut t = target(&serve(r.clone()).await);
    t.template = Some("{node} {action} {phase} -> {result}: {message}".into());
    let n = Notifier::start(&[t], true).unwrap();
    n.notify(note("gpu-3", Phase::Failed, "said \"no\""));
    assert!(n.flush(Duration::from_secs(10)).await);
    let got = r.got();
    assert_eq!(got[0].text(), "gpu-3 drain failed -> failed: said \"no\"");
    assert_eq!(
        got[0].header("content-type").unwrap(),
        "text/plain; charset=utf-8"
    );
}

#[tokio::test]
async fn retries_500_with_the_same_body_and_id_then_gives_up_on_4xx_and_exhaustion() {
    let r = Receiver::new(&[500, 503, 200], false);
    let mut t = target(&serve(r.clone()).await);
    t.secret = SECRET.into();
    t.max_attempts = 3;
    let n = Notifier::start(&[t], true).unwrap();
    n.notify(note("n1", Phase::Finished, "ok"));
    assert!(n.flush(Duration::from_secs(10)).await);
    let got = r.got();
    assert_eq!(got.len(), 3, "two failures then success");
    assert!(got.iter().all(|g| g.body == got[0].body
        && g.header("idempotency-key") == got[0].header("idempotency-key")
        && g.header(SIGNATURE_HEADER).unwrap() == signature(&g.body)));
    let s = &n.stats()[0];
    assert_eq!((s.sent, s.retries, s.failed), (1, 2, 0));

    // 400: permanent, not retried.
    r.statuses.lock().unwrap().extend([400]);
    n.notify(note("n2", Phase::Failed, "x"));
    assert!(n.flush(Duration::from_secs(10)).await);
    assert_eq!(r.got().len(), 4);
    let s = &n.stats()[0];
    assert_eq!((s.sent, s.retries, s.failed), (1, 2, 1));

    // 429 is retried; three 503s use up max_attempts = 3.
    r.statuses.lock().unwrap().extend([429, 503, 503]);
    n.notify(note("n3", Phase::Started, ""));
    assert!(n.flush(Duration::from_secs(10)).await);
    assert_eq!(r.got().len(), 7);
    let s = &n.stats()[0];
    assert_eq!((s.sent, s.retries, s.failed), (1, 4, 2));
    assert!(n
        .metrics_text()
        .contains("nodekeeper_notification_retries_total{target=\"0\"} 4\n"));
}

#[tokio::test]
async fn unreachable_target_is_retried_then_counted_failed() {
    let (_held, addr) = crate::support::refused_addr();
    let mut t = target(&format!("http://{addr}/hook"));
    t.max_attempts = 2;
    let n = Notifier::start(&[t], true).unwrap();
    n.notify(note("n1", Phase::Started, ""));
    assert!(n.flush(Duration::from_secs(10)).await);
    let s = &n.stats()[0];
    assert_eq!((s.sent, s.retries, s.failed), (0, 1, 1));
}

#[tokio::test]
async fn queue_is_bounded_drops_the_oldest_and_notify_never_blocks() {
    let r = Receiver::new(&[], true);
    let mut t = target(&serve(r.clone()).await);
    t.queue_size = 3;
    let n = Notifier::start(&[t], true).unwrap();
    n.notify(note("n0", Phase::Started, "m0"));
    // m0 is in flight, held by the stuck receiver.
    tokio::time::timeout(Duration::from_secs(10), r.arrived.notified())
        .await
        .unwrap();
    let start = Instant::now();
    for i in 1..=10 {
        n.notify(note(&format!("n{i}"), Phase::Started, &format!("m{i}")));
    }
    assert!(
        start.elapsed() < Duration::from_millis(200),
        "notify must not wait for delivery: {:?}",
        start.elapsed()
    );
    let s = &n.stats()[0];
    assert_eq!((s.queued, s.in_flight, s.dropped), (3, 1, 7));
    r.gate.as_ref().unwrap().add_permits(100);
    assert!(n.flush(Duration::from_secs(10)).await);
    let messages: Vec<String> = r.got().iter().map(|g| g.payload().message).collect();
    assert_eq!(messages, ["m0", "m8", "m9", "m10"]);
    let s = &n.stats()[0];
    assert_eq!((s.sent, s.dropped, s.queued), (4, 7, 0));
}

#[tokio::test]
async fn no_targets_and_no_runtime() {
    let n = Notifier::start(&[], true).unwrap();
    n.notify(note("n1", Phase::Started, ""));
    assert!(n.stats().is_empty());
    let e =
        std::thread::spawn(|| Notifier::start(&[NotifyConfig::new("http://127.0.0.1:1/")], true))
            .join()
            .unwrap()
            .unwrap_err();
    assert!(e.to_string().contains("tokio runtime"), "{e}");
}

const BASE: &str = "[controller]\nlisten = \"127.0.0.1:8443\"\ninsecure_plain_http = true\n";

fn load(extra: &str) -> Result<nodekeeper_core::config_file::Loaded, String> {
    Config::load_str(
        std::path::Path::new("c.toml"),
        &format!("{BASE}{extra}"),
        &Env::default(),
    )
    .map_err(|e| e.to_string())
}

#[test]
fn config_is_validated_with_locations_and_the_secret_is_redacted() {
    let e = load(
        r#"
[[controller.notify]]
url = "ftp://hooks.example/x"
template = "{node} {bogus}"
queue_size = 0
max_attempts = 0

[[controller.notify]]
url = "http://127.0.0.1:9/"
events = []
"#,
    )
    .unwrap_err();
    for want in [
        "c.toml:6:7: error: scheme `ftp` is not supported",
        "c.toml:7:12: error: unknown placeholder {bogus}",
        "c.toml:8:14: error: must be at least 1",
        "c.toml:9:16: error: must be at least 1",
        "c.toml:13:10: error: must name at least one of started, finished, failed",
    ] {
        assert!(e.contains(want), "missing {want:?} in\n{e}");
    }
    assert!(
        e.contains("controller.notify[0].url") && e.contains("controller.notify[1].events"),
        "{e}"
    );

    let e = load("[[controller.notify]]\nurl = \"http://127.0.0.1:9/\"\nevents = [\"stopped\"]\n")
        .unwrap_err();
    assert!(e.contains("c.toml:6:") && e.contains("stopped"), "{e}");

    let l = load(
        "[[controller.notify]]\nurl = \"http://127.0.0.1:9/\"\nevents = [\"failed\"]\nsecret = \"topsecret-value\"\n",
    )
    .unwrap();
    let c = l.config.controller.controller.as_ref().unwrap();
    assert_eq!(c.notify.len(), 1);
    assert_eq!(c.notify[0].events, [Phase::Failed]);
    assert_eq!(c.notify[0].secret.expose(), "topsecret-value");
    assert_eq!(c.notify[0].queue_size, 256);
    let out = l.config.to_redacted_toml();
    assert!(!out.contains("topsecret-value"), "{out}");
    assert!(out.contains("[[controller.notify]]"), "{out}");
    assert!(!format!("{:?}", c.notify[0]).contains("topsecret-value"));
}

/// Probe 4: a target answering 307 to another host made the controller re-POST the signed body,
/// `x-nodekeeper-signature` included, there. Now a 3xx is the answer (a failure, retried like a
/// 5xx): the other host receives nothing.
#[tokio::test]
async fn a_redirect_is_not_followed_and_the_signed_body_goes_nowhere_else() {
    let elsewhere = Receiver::new(&[], false);
    let other = serve(elsewhere.clone()).await;
    let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let c = calls.clone();
    let app = Router::new().route(
        "/hook",
        post(move || {
            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let to = other.clone();
            async move { (StatusCode::TEMPORARY_REDIRECT, [("location", to)]) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let mut t = target(&format!("http://{addr}/hook"));
    t.secret = SECRET.into();
    t.max_attempts = 2;
    let n = Notifier::start(&[t], true).unwrap();
    n.notify(note("n1", Phase::Started, "x"));
    assert!(n.flush(Duration::from_secs(10)).await);
    assert!(elsewhere.got().is_empty(), "the signed body was re-sent");
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(n.stats()[0].failed, 1);
}

/// Probe 3, for URLs from the configuration: a notification or webhook-provider URL naming a
/// metadata, link-local or unspecified address is refused at its key (loopback stays allowed
/// for local receivers); the clients refuse names resolving to them too (`http::tests`).
#[test]
fn webhook_urls_naming_metadata_or_link_local_addresses_are_refused() {
    for (url, why) in [
        (
            "http://169.254.169.254/latest/meta-data/",
            "a cloud metadata address",
        ),
        ("http://[fd00:ec2::254]/", "a cloud metadata address"),
        ("http://169.254.10.1:8080/hook", "link-local"),
        ("http://0.0.0.0:9/hook", "unspecified"),
    ] {
        let notify = format!("[[controller.notify]]\nurl = \"{url}\"\n");
        let e = load(&notify).unwrap_err();
        assert!(
            e.contains("c.toml:5:") && e.contains("refused") && e.contains(why),
            "{url}: {e}"
        );
        let provider =
            format!("[controller.provider]\nkind = \"webhook\"\nurl = \"{url}\"\nsecret = \"s\"\n");
        let e = load(&provider).unwrap_err();
        assert!(e.contains("refused") && e.contains(why), "{url}: {e}");
    }
    assert!(load("[[controller.notify]]\nurl = \"http://127.0.0.1:9/\"\n").is_ok());
}

/// Probe 3 for configured URLs: a notification target on loopback is refused when the
/// notifier starts, unless `[controller] allow_loopback_destinations` opts in.
#[tokio::test]
async fn a_loopback_notification_target_needs_the_opt_in() {
    let e = Notifier::start(&[NotifyConfig::new("http://127.0.0.1:9/hook")], false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("refused") && e.contains("loopback"), "{e}");
    assert!(Notifier::start(&[NotifyConfig::new("http://127.0.0.1:9/hook")], true).is_ok());
    assert!(Notifier::start(&[NotifyConfig::new("https://hooks.example.com/x")], false).is_ok());
}

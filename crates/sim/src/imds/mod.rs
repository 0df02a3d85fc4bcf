//! Cloud instance-metadata emulators for OCI, AWS, Azure and GCP, for tests, the demo and
//! benchmarks. Each one enforces its cloud's access rules the way the real service does (see
//! `docs/sources.md`), answers 404 where nothing is pending, and has an admin API under
//! `/admin/` to inject notices, cancellations, latency and errors:
//!
//! | request | effect |
//! |---|---|
//! | `POST /admin/preempt` `{"in_secs":120}` | a preemption / Spot interruption notice |
//! | `POST /admin/maintenance` `{"in_secs":600,"code":"…"}` | a maintenance event |
//! | `POST /admin/rebalance` | an AWS rebalance recommendation |
//! | `POST /admin/cancel` `{"what":"preempt\|maintenance\|rebalance\|all"}` | withdraw notices |
//! | `POST /admin/latency` `{"ms":300}` | delay every metadata answer |
//! | `POST /admin/errors` `{"status":503,"count":2}` or `{"garbage":true,"count":1}` | fail the next answers |
//! | `POST /admin/expire-tokens` | AWS: invalidate every IMDSv2 token |
//! | `GET /admin/acks` | Azure: the event ids approved with `StartRequests` |
//!
//! The same operations are methods of [`ImdsEmulator`] for in-process tests.

mod admin;
pub mod aws;
pub mod azure;
pub mod gcp;
pub mod oci;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use nodekeeper_core::wire::Cloud;

/// Arguments of `nodekeeper sim imds` (parsed, with their defaults, by the binary's `cli::sim`).
#[derive(Debug, Clone)]
pub struct ImdsArgs {
    /// Which cloud's metadata API to serve.
    pub cloud: Cloud,
    /// Address to listen on.
    pub listen: String,
}

/// `nodekeeper sim imds`: serves until `shutdown` is cancelled (SIGTERM or SIGINT, at the binary edge).
pub async fn run(
    args: ImdsArgs,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<u8, Box<dyn std::error::Error + Send + Sync>> {
    let cloud = args.cloud;
    let addr: SocketAddr = args.listen.parse().map_err(|e| {
        format!(
            "--listen `{}` is not an address (IP:PORT): {e}",
            args.listen
        )
    })?;
    let emu = ImdsEmulator::start(cloud, addr).await?;
    println!("{} metadata emulator listening on {}", cloud, emu.url());
    shutdown.cancelled().await;
    Ok(0)
}

/// A pending notice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// Emulator-assigned id (Azure EventId, AWS EventId).
    pub id: String,
    /// When the announced action happens.
    pub at: DateTime<Utc>,
    /// Cloud-specific code (AWS maintenance code, Azure event type, GCP maintenance value).
    pub code: String,
    /// AWS keeps cancelled maintenance events listed with `State: canceled`.
    pub canceled: bool,
    /// Azure: approved with `StartRequests`.
    pub started: bool,
}

/// Injected failures for the next answers.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Status to answer with (ignored when `garbage`).
    pub status: u16,
    /// Answer 200 with a body that is not what the protocol says.
    pub garbage: bool,
    /// How many answers to spoil.
    pub remaining: u32,
}

/// The emulator's mutable state, shared by the cloud routes and the admin API.
#[derive(Debug, Default)]
pub struct Inner {
    /// Preemption / Spot interruption.
    pub preempt: Option<Pending>,
    /// Maintenance event.
    pub maintenance: Option<Pending>,
    /// AWS rebalance recommendation.
    pub rebalance: Option<Pending>,
    /// Delay before each metadata answer.
    pub latency: Duration,
    /// Injected failures.
    pub faults: Faults,
    /// AWS tokens and their expiry.
    pub tokens: HashMap<String, Instant>,
    /// Azure: approved event ids.
    pub acks: Vec<String>,
    /// Azure `DocumentIncarnation` (bumped whenever a notice changes).
    pub incarnation: u64,
    /// Counter for ids.
    pub seq: u64,
    /// Metadata requests served (admin excluded).
    pub requests: u64,
    /// The same, per path.
    pub requests_by_path: HashMap<String, u64>,
}

/// State plus a change signal for long polls.
#[derive(Debug)]
pub struct Shared {
    /// Which cloud is emulated.
    pub cloud: Cloud,
    inner: Mutex<Inner>,
    changed: watch::Sender<u64>,
}

impl Shared {
    fn new(cloud: Cloud) -> Self {
        let inner = Inner {
            incarnation: 1,
            ..Inner::default()
        };
        Self {
            cloud,
            inner: Mutex::new(inner),
            changed: watch::channel(0).0,
        }
    }

    /// Reads the state.
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Changes the state and wakes long polls.
    pub fn update<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let r = {
            let mut g = self.lock();
            f(&mut g)
        };
        self.changed.send_modify(|v| *v += 1);
        r
    }

    /// A receiver that sees every later change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn next_id(inner: &mut Inner, prefix: &str) -> String {
        inner.seq += 1;
        format!("{prefix}-{:08x}", inner.seq)
    }
}

/// What [`ImdsEmulator::cancel`] withdraws.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CancelWhat {
    /// The preemption notice.
    Preempt,
    /// The maintenance event.
    Maintenance,
    /// The rebalance recommendation.
    Rebalance,
    /// Everything.
    All,
}

/// A running emulator. Stops when dropped.
#[derive(Debug)]
pub struct ImdsEmulator {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: CancellationToken,
}

impl ImdsEmulator {
    /// Binds `addr` (port 0 picks a free port) and serves `cloud`'s metadata API.
    pub async fn start(cloud: Cloud, addr: SocketAddr) -> std::io::Result<Self> {
        let shared = Arc::new(Shared::new(cloud));
        let app = router(shared.clone());
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        // The one server (`nodekeeper_core::serve`); a long poll in flight is dropped on stop,
        // as a metadata service going away would drop it.
        tokio::spawn(nodekeeper_core::serve::serve(
            listener,
            app,
            None,
            nodekeeper_core::serve::ServeLimits::streaming(),
            Default::default(),
            stop.clone(),
        ));
        Ok(Self { shared, addr, stop })
    }

    /// `http://ADDR`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The shared state (for assertions).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Announces a preemption happening `after` from now.
    pub fn preempt(&self, after: Duration) {
        admin::preempt(&self.shared, after);
    }

    /// Announces a maintenance event `after` from now; `code` is cloud-specific (empty: default).
    pub fn maintenance(&self, after: Duration, code: &str) {
        admin::maintenance(&self.shared, after, code);
    }

    /// Announces an AWS rebalance recommendation.
    pub fn rebalance(&self) {
        admin::rebalance(&self.shared);
    }

    /// Withdraws notices.
    pub fn cancel(&self, what: CancelWhat) {
        admin::cancel(&self.shared, what);
    }

    /// Delays every metadata answer by `d`.
    pub fn set_latency(&self, d: Duration) {
        self.shared.update(|i| i.latency = d);
    }

    /// Answers the next `count` metadata requests with `status`.
    pub fn inject_errors(&self, status: u16, count: u32) {
        self.shared.update(|i| {
            i.faults = Faults {
                status,
                garbage: false,
                remaining: count,
            }
        });
    }

    /// Answers the next `count` metadata requests with 200 and a garbage body.
    pub fn inject_garbage(&self, count: u32) {
        self.shared.update(|i| {
            i.faults = Faults {
                status: 200,
                garbage: true,
                remaining: count,
            }
        });
    }

    /// AWS: invalidates every token (the next GET with an old token gets 401).
    pub fn expire_tokens(&self) {
        self.shared.update(|i| i.tokens.clear());
    }

    /// Azure: event ids approved with `StartRequests`.
    pub fn acks(&self) -> Vec<String> {
        self.shared.lock().acks.clone()
    }

    /// Metadata requests served so far (admin excluded).
    pub fn requests(&self) -> u64 {
        self.shared.lock().requests
    }

    /// Requests served so far for `path`.
    pub fn requests_to(&self, path: &str) -> u64 {
        self.shared
            .lock()
            .requests_by_path
            .get(path)
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for ImdsEmulator {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The whole app: the cloud's routes behind the fault layer, plus `/admin/`.
pub fn router(shared: Arc<Shared>) -> Router {
    let cloud_routes = match shared.cloud {
        Cloud::Oci => oci::router(),
        Cloud::Aws => aws::router(),
        Cloud::Azure => azure::router(),
        Cloud::Gcp => gcp::router(),
    };
    cloud_routes
        .layer(axum::middleware::from_fn_with_state(shared.clone(), faults))
        .with_state(shared.clone())
        .nest("/admin", admin::router().with_state(shared))
}

/// Latency and injected failures, applied to every metadata request.
async fn faults(State(shared): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let (latency, fault) = {
        let mut g = shared.lock();
        g.requests += 1;
        *g.requests_by_path
            .entry(req.uri().path().to_string())
            .or_default() += 1;
        let fault = (g.faults.remaining > 0).then(|| {
            g.faults.remaining -= 1;
            g.faults.clone()
        });
        (g.latency, fault)
    };
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    match fault {
        Some(f) if f.garbage => (
            StatusCode::OK,
            Body::from(&b"\x00\xff{\"garbage\": [1, 2"[..]),
        )
            .into_response(),
        Some(f) => StatusCode::from_u16(f.status)
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
            .into_response(),
        None => next.run(req).await,
    }
}

/// A plain-text answer.
pub(crate) fn text(status: StatusCode, body: impl Into<String>) -> Response {
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "text/plain")],
        body.into(),
    )
        .into_response()
}

/// A JSON answer.
pub(crate) fn json(value: &serde_json::Value) -> Response {
    (
        StatusCode::OK,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

/// Whether the request carries any proxy-forwarding header (the real services reject those).
pub(crate) fn forwarded(headers: &axum::http::HeaderMap) -> bool {
    ["forwarded", "x-forwarded-for", "x-forwarded-host"]
        .iter()
        .any(|h| headers.contains_key(*h))
}

/// The value of query parameter `key` (no percent-decoding beyond `%XX` of ASCII).
pub(crate) fn query_param(uri: &axum::http::Uri, key: &str) -> Option<String> {
    uri.query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

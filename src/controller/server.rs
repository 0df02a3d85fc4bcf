//! The report API: `POST /v1/reports`, `GET /livez`, `/readyz`, `/metrics`, and the OCI Events
//! endpoint, over HTTPS (rustls, certificate and key from files) or, when configured explicitly,
//! plain HTTP.

use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio_util::sync::CancellationToken;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use super::auth::{AuthError, Authenticator};
use super::metrics;
use super::nodestate::NodeStates;
use super::oci_events::OciEvents;

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Listen failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address.
        addr: String,
        /// Cause.
        source: std::io::Error,
    },
    /// TLS material unusable.
    #[error("TLS {path}: {why}")]
    Tls {
        /// File.
        path: String,
        /// Why.
        why: String,
    },
}

/// Shared state of the handlers.
#[derive(Debug)]
pub struct App {
    /// Token validation.
    pub auth: Authenticator,
    /// Node state.
    pub states: Arc<NodeStates>,
    /// The Node cache is synced.
    pub ready: AtomicBool,
    /// This replica leads.
    pub leader: tokio::sync::watch::Receiver<bool>,
    /// OCI Events ingestion, when enabled.
    pub oci: Option<OciEvents>,
    /// The disruption engine's metrics (when it runs).
    pub engine: Option<Arc<super::metrics::EngineMetrics>>,
    /// The disruption engine (when it runs): OCI Events notices wait until it stored them.
    pub disruption: Option<Arc<super::engine::Engine>>,
    /// Webhook notifications (`[[controller.notify]]`), when configured.
    pub notifier: Option<Arc<super::notify::Notifier>>,
    /// Forbidden reports (another node).
    pub forbidden: AtomicU64,
    /// Unauthenticated requests.
    pub unauthenticated: AtomicU64,
    /// Open and refused connections of the report API (`/metrics`).
    pub connections: Arc<ConnectionStats>,
    /// Set when a task the controller cannot live without died: `/livez` then fails with it.
    pub dead: std::sync::OnceLock<String>,
}

/// Connection counts of [`bind`]'s server, for `/metrics`.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    /// Connections open now.
    pub open: AtomicU64,
    /// Connections closed right after `accept` because `max_connections` were open.
    pub refused: AtomicU64,
    /// The limit in force.
    pub max: AtomicU64,
}

/// Counts one open connection while alive.
struct OpenConnection(Arc<ConnectionStats>);

impl OpenConnection {
    fn new(stats: &Arc<ConnectionStats>) -> Self {
        stats.open.fetch_add(1, Ordering::Relaxed);
        OpenConnection(stats.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The router.
pub fn router(app: Arc<App>, max_body: usize) -> Router {
    let mut r = Router::new()
        .route("/v1/reports", post(report))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", {
            let registry = Arc::new(registry(&app));
            get(move || metrics(registry.clone()))
        });
    if let Some(oci) = &app.oci {
        let base = oci.path().trim_end_matches('/').to_string();
        r = r.route(&base, post(super::oci_events::handle)).route(
            &format!("{base}/{{token}}"),
            post(super::oci_events::handle_with_path_token),
        );
    }
    r.layer(DefaultBodyLimit::max(max_body)).with_state(app)
}

/// How long a report waits for its notices to be stored on the Node; those not stored by then
/// are left unacknowledged (the agent's request timeout is 5 s by default).
pub const REPORT_RECORD_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

fn err(code: StatusCode, msg: impl Into<String>) -> Response {
    (code, Json(serde_json::json!({"error": msg.into()}))).into_response()
}

async fn report(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    let authz = headers.get("authorization").and_then(|v| v.to_str().ok());
    let caller = match app.auth.authenticate(authz).await {
        Ok(c) => c,
        Err(e @ AuthError::Unauthenticated(_)) => {
            app.unauthenticated.fetch_add(1, Ordering::Relaxed);
            return err(StatusCode::UNAUTHORIZED, e.to_string());
        }
        Err(e @ AuthError::Forbidden(_)) => return err(StatusCode::FORBIDDEN, e.to_string()),
        Err(e @ AuthError::Upstream(_)) => {
            return err(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
        }
    };
    let report = match crate::report::parse_body(&body) {
        Ok(r) => r,
        Err(e) => return err(StatusCode::BAD_REQUEST, e.to_string()),
    };
    if report.node != caller.node {
        app.forbidden.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(caller_node = %caller.node, report_node = %report.node, pod = ?caller.pod,
            "rejected a report about another node");
        return err(
            StatusCode::FORBIDDEN,
            format!(
                "token is bound to node {}; a report about {} is not allowed",
                caller.node, report.node
            ),
        );
    }
    let events = report.events.clone();
    match app.states.handle(report).await {
        Ok(mut resp) => {
            if let Some(engine) = &app.disruption {
                // Acknowledged only once stored: a controller killed after the answer loses
                // nothing (the agent resends what is not acknowledged).
                let handled: Vec<_> = events
                    .into_iter()
                    .filter(|e| resp.acknowledged_events.contains(&e.id))
                    .collect();
                resp.acknowledged_events = engine
                    .recorded_ids(&caller.node, &handled, &app.leader, REPORT_RECORD_WAIT)
                    .await;
            }
            Json(resp).into_response()
        }
        Err(e) => err(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

async fn livez(State(app): State<Arc<App>>) -> Response {
    match app.dead.get() {
        None => "ok".into_response(),
        Some(why) => err(StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

async fn readyz(State(app): State<Arc<App>>) -> Response {
    if app.ready.load(Ordering::Relaxed) {
        "ok".into_response()
    } else {
        err(StatusCode::SERVICE_UNAVAILABLE, "node cache not synced yet")
    }
}

/// The controller's metrics registry: the report API's counters, then each component's
/// (notifier, engine) registered into it. `/metrics` encodes it.
pub fn registry(app: &Arc<App>) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ApiMetrics(app.clone())));
    if let Some(n) = &app.notifier {
        n.register(&mut registry);
    }
    if let Some(m) = &app.engine {
        m.register(&mut registry);
    }
    registry
}

/// The report API's counters (kept as atomics by their owners), read at encode time.
struct ApiMetrics(Arc<App>);

impl std::fmt::Debug for ApiMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiMetrics")
    }
}

impl Collector for ApiMetrics {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let app = &self.0;
        let c = &app.states.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let counters = [
            (
                "nodekeeper_reports_total",
                "Reports accepted.",
                g(&c.reports),
            ),
            (
                "nodekeeper_report_replays_total",
                "Report replays ignored.",
                g(&c.replays),
            ),
            (
                "nodekeeper_reports_forbidden_total",
                "Reports refused: about another node than the token's.",
                g(&app.forbidden),
            ),
            (
                "nodekeeper_reports_unauthenticated_total",
                "Requests without a valid token.",
                g(&app.unauthenticated),
            ),
            (
                "nodekeeper_token_reviews_total",
                "TokenReviews sent to the API server.",
                g(&app.auth.reviews),
            ),
            (
                "nodekeeper_node_writes_total",
                "Node writes.",
                g(&c.node_writes),
            ),
            (
                "nodekeeper_node_write_failures_total",
                "Node writes that failed.",
                g(&c.write_failures),
            ),
            (
                "nodekeeper_node_events_total",
                "Events recorded about Nodes.",
                g(&c.node_events),
            ),
            (
                "nodekeeper_labels_removed_total",
                "Migration labels removed from Nodes.",
                g(&c.labels_removed),
            ),
            (
                "nodekeeper_nodes_marked_stale_total",
                "Nodes marked stale (agent not reporting).",
                g(&c.stale_marked),
            ),
        ];
        for (name, help, v) in counters {
            metrics::encode_counter(&mut enc, name, help, v)?;
        }
        let leader = i64::from(*app.leader.borrow());
        metrics::encode_gauge(
            &mut enc,
            "nodekeeper_leader",
            "1 while this replica leads.",
            leader,
        )?;
        let conns = &app.connections;
        metrics::encode_gauge(
            &mut enc,
            "nodekeeper_connections_open",
            "Connections of the report API open now.",
            g(&conns.open) as i64,
        )?;
        metrics::encode_gauge(
            &mut enc,
            "nodekeeper_connections_max",
            "The limit of open connections (max_connections).",
            g(&conns.max) as i64,
        )?;
        metrics::encode_counter(
            &mut enc,
            "nodekeeper_connections_refused_total",
            "Connections closed at accept because max_connections were open.",
            g(&conns.refused),
        )
    }
}

async fn metrics(registry: Arc<Registry>) -> Response {
    (
        [("content-type", metrics::CONTENT_TYPE)],
        metrics::encode(&registry),
    )
        .into_response()
}

/// Loads a rustls server config from PEM files.
pub fn tls_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig, ServerError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let tls_err = |p: &Path, why: String| ServerError::Tls {
        path: p.display().to_string(),
        why,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| tls_err(cert, e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| tls_err(cert, e.to_string()))?;
    if certs.is_empty() {
        return Err(tls_err(cert, "no certificate in the file".into()));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| tls_err(key, e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err(cert, e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| tls_err(cert, e.to_string()))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

/// Limits that keep slow or greedy clients (slow-loris, connection floods) from tying up the
/// server; every one ends the offending connection or request, never the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// The TLS handshake must finish within this (else the connection is closed).
    pub tls_handshake_timeout: Duration,
    /// An HTTP/1 request head must arrive within this (else the connection is closed).
    pub header_read_timeout: Duration,
    /// A request (body read and handling) must finish within this (else 408).
    pub request_timeout: Duration,
    /// Open connections at most; further ones are closed right after `accept`.
    pub max_connections: usize,
    /// HTTP/2 streams per connection at most.
    pub max_h2_streams: u32,
}

/// Default of [`ServeLimits::max_connections`] and `[controller] max_connections`: agents keep
/// their connection open, so this bounds the nodes one replica can serve (docs/controller.md).
pub const DEFAULT_MAX_CONNECTIONS: usize = 16_384;

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            tls_handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(15),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_h2_streams: 64,
        }
    }
}

/// Binds `addr` to serve `router` (over TLS when `tls` is set) until `cancel`, within `limits`,
/// counting connections into `stats`; returns the address and the accept loop for the caller to
/// run (the controller supervises it).
pub async fn bind(
    addr: &str,
    router: Router,
    tls: Option<rustls::ServerConfig>,
    limits: ServeLimits,
    stats: Arc<ConnectionStats>,
    cancel: CancellationToken,
) -> Result<
    (
        std::net::SocketAddr,
        impl Future<Output = ()> + Send + 'static,
    ),
    ServerError,
> {
    stats
        .max
        .store(limits.max_connections as u64, Ordering::Relaxed);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind {
            addr: addr.into(),
            source,
        })?;
    let local = listener.local_addr().map_err(|source| ServerError::Bind {
        addr: addr.into(),
        source,
    })?;
    let deadline = limits.request_timeout;
    let router = router.layer(axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            request_deadline(deadline, req, next)
        },
    ));
    let acceptor = tls.map(|cfg| tokio_rustls::TlsAcceptor::from(Arc::new(cfg)));
    Ok((
        local,
        accept_loop(listener, router, acceptor, limits, stats, cancel),
    ))
}

/// Raises this process's soft limit of open files to its hard limit (as the Go runtime does at
/// start): container runtimes may start processes with a soft limit of 1,024, far below one
/// connection per agent. Returns the limit now in force.
pub fn raise_open_files_limit() -> Result<u64, nix::errno::Errno> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok(hard.max(soft))
}

/// Answers 408 when a request (including reading its body) takes longer than `limit`.
async fn request_deadline(
    limit: Duration,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = req.uri().path().to_string();
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(r) => r,
        Err(_) => {
            tracing::warn!(path, ?limit, "request not completed in time");
            err(
                StatusCode::REQUEST_TIMEOUT,
                format!("request not completed within {limit:?}"),
            )
        }
    }
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    router: Router,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    limits: ServeLimits,
    stats: Arc<ConnectionStats>,
    cancel: CancellationToken,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    loop {
        let (tcp, peer) = tokio::select! {
            _ = cancel.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            let refused = stats.refused.fetch_add(1, Ordering::Relaxed) + 1;
            if refused.is_power_of_two() {
                tracing::warn!(%peer, refused, max = limits.max_connections, "connection limit reached: closing new connections");
            }
            drop(tcp);
            continue;
        };
        let svc = hyper_util::service::TowerToHyperService::new(router.clone());
        let acceptor = acceptor.clone();
        let cancel = cancel.clone();
        let open = OpenConnection::new(&stats);
        tokio::spawn(async move {
            let _slot = (slot, open);
            match acceptor {
                None => {
                    serve_conn(hyper_util::rt::TokioIo::new(tcp), svc, limits, cancel, peer).await
                }
                Some(acceptor) => {
                    let tls = match tokio::time::timeout(
                        limits.tls_handshake_timeout,
                        acceptor.accept(tcp),
                    )
                    .await
                    {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    };
                    serve_conn(hyper_util::rt::TokioIo::new(tls), svc, limits, cancel, peer).await
                }
            }
        });
    }
}

type Svc = hyper_util::service::TowerToHyperService<Router>;

async fn serve_conn<I>(
    io: I,
    svc: Svc,
    limits: ServeLimits,
    cancel: CancellationToken,
    peer: std::net::SocketAddr,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let mut builder =
        hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    builder
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(hyper_util::rt::TokioTimer::new())
        .max_concurrent_streams(limits.max_h2_streams)
        .keep_alive_interval(limits.header_read_timeout)
        .keep_alive_timeout(limits.header_read_timeout);
    let conn = builder.serve_connection(io, svc);
    tokio::select! {
        r = conn => if let Err(e) = r { tracing::debug!(%peer, error = %e, "connection ended with an error") },
        _ = cancel.cancelled() => {}
    }
}

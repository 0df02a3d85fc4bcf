//! The one way nodekeeper serves HTTP (the controller's report API, the sim's API servers, test
//! servers): a TCP listener, TLS (rustls, HTTP/2 and HTTP/1.1 by ALPN, or HTTP/1.1 only; TLS 1.3
//! session resumption by tickets) or plain HTTP, an axum router, limits that keep slow or greedy
//! clients from tying up the server, and a graceful shutdown when a cancellation token fires.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use tokio_util::sync::CancellationToken;

/// Errors starting a server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Listen failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address.
        addr: String,
        /// Cause.
        source: std::io::Error,
    },
    /// TLS material unusable.
    #[error("TLS {}: {source}", path.display())]
    Tls {
        /// File.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: TlsFileError,
    },
}

/// What is wrong with a certificate or key file.
#[derive(Debug, thiserror::Error)]
pub enum TlsFileError {
    /// Unreadable, or not PEM.
    #[error("{0}")]
    Pem(#[from] rustls_pki_types::pem::Error),
    /// rustls refused the certificate or the key.
    #[error("{0}")]
    Rustls(#[from] rustls::Error),
    /// No certificate at all.
    #[error("no certificate in the file")]
    NoCertificate,
}

/// Loads a rustls server config (HTTP/2 and HTTP/1.1 by ALPN) from PEM files.
pub fn tls_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig, ServeError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let tls_err = |p: &Path| {
        let path = p.to_path_buf();
        move |e: TlsFileError| ServeError::Tls { path, source: e }
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| tls_err(cert)(e.into()))?
        .collect::<Result<_, _>>()
        .map_err(|e| tls_err(cert)(e.into()))?;
    if certs.is_empty() {
        return Err(tls_err(cert)(TlsFileError::NoCertificate));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| tls_err(key)(e.into()))?;
    server_config(certs, key_der).map_err(|e| tls_err(cert)(e.into()))
}

/// A rustls server config (ring; HTTP/2 and HTTP/1.1 by ALPN) for `chain` and `key`, issuing
/// session tickets (stateless, keys rotated every 6 h), so a client that reconnects resumes its
/// session (no certificate signature or chain check) instead of a full handshake; a server with
/// [`ServeLimits::http2`] off offers HTTP/1.1 only.
pub fn server_config(
    chain: Vec<rustls_pki_types::CertificateDer<'static>>,
    key: rustls_pki_types::PrivateKeyDer<'static>,
) -> Result<rustls::ServerConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    cfg.ticketer = rustls::crypto::ring::Ticketer::new()?;
    Ok(cfg)
}

/// Connection counts of a server, for `/metrics`.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    /// Connections open now.
    pub open: AtomicU64,
    /// Connections closed right after `accept` because `max_connections` were open.
    pub refused: AtomicU64,
    /// The limit in force.
    pub max: AtomicU64,
    /// Connections accepted (within the limit) since the start: with TLS, each is a handshake.
    pub accepted: AtomicU64,
    /// TLS handshakes that resumed an earlier session (a ticket) rather than a full handshake.
    pub resumed: AtomicU64,
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

/// Limits that keep slow or greedy clients (slow-loris, connection floods) from tying up the
/// server; every one ends the offending connection or request, never the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// The TLS handshake must finish within this (else the connection is closed).
    pub tls_handshake_timeout: Duration,
    /// An HTTP/1 request head must arrive within this, counted from the end of the TLS handshake
    /// or of the previous response, else the connection is closed: so it is also how long an idle
    /// keep-alive connection is kept. `None`: hyper's defaults (no timer).
    pub header_read_timeout: Option<Duration>,
    /// An HTTP/2 connection is pinged this often and closed when a ping is not answered within
    /// it. `None`: no pings.
    pub h2_keep_alive: Option<Duration>,
    /// Offer HTTP/2 (ALPN `h2`; prior knowledge on plain HTTP). Off: HTTP/1.1 only.
    pub http2: bool,
    /// A request (body read and handling) must finish within this (else 408). `None`: no
    /// deadline (long-lived requests such as watches).
    pub request_timeout: Option<Duration>,
    /// Open connections at most; further ones are closed right after `accept`.
    pub max_connections: usize,
    /// HTTP/2 streams per connection at most.
    pub max_h2_streams: u32,
    /// When the token fires, each connection is asked to finish (HTTP/2 GOAWAY; HTTP/1 closes
    /// after the response in flight) and dropped after this at most. Zero: dropped at once.
    pub shutdown_grace: Duration,
}

/// Default of [`ServeLimits::max_connections`] and `[controller] max_connections`: agents close
/// their connection between reports, but one agent with HTTP/2 (`[controller] http2`) keeps one
/// open, so this bounds the nodes one replica can serve then (docs/controller.md).
pub const DEFAULT_MAX_CONNECTIONS: usize = 16_384;

/// Default of `[controller] idle_timeout`, the report API's [`ServeLimits::header_read_timeout`]:
/// shorter than the agents' heartbeat (10 s), so a connection is not held between reports
/// (docs/controller.md "Benchmark"), and longer than the reporter's own idle limit (1 s), so the
/// agent, not the server, closes it and never sends into a connection being closed.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(3);

impl Default for ServeLimits {
    /// The report API's limits.
    fn default() -> Self {
        ServeLimits {
            tls_handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            h2_keep_alive: Some(Duration::from_secs(10)),
            http2: false,
            request_timeout: Some(Duration::from_secs(15)),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_h2_streams: 64,
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

impl ServeLimits {
    /// For servers of long-lived requests (the sim's API servers with their watches): only the
    /// TLS handshake timeout and the connection count; hyper's defaults otherwise (HTTP/2 with 200
    /// streams); connections dropped at once on shutdown.
    pub fn streaming() -> Self {
        ServeLimits {
            header_read_timeout: None,
            h2_keep_alive: None,
            http2: true,
            request_timeout: None,
            max_h2_streams: 200,
            shutdown_grace: Duration::ZERO,
            ..ServeLimits::default()
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
    ServeError,
> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind {
            addr: addr.into(),
            source,
        })?;
    let local = listener.local_addr().map_err(|source| ServeError::Bind {
        addr: addr.into(),
        source,
    })?;
    Ok((
        local,
        serve(listener, router, tls.map(Arc::new), limits, stats, cancel),
    ))
}

/// Serves `router` on `listener` (over TLS when `tls` is set) until `cancel`, within `limits`,
/// counting connections into `stats`. The accept loop ends when `cancel` fires; each open
/// connection then shuts down gracefully within [`ServeLimits::shutdown_grace`].
pub fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: ServeLimits,
    stats: Arc<ConnectionStats>,
    cancel: CancellationToken,
) -> impl Future<Output = ()> + Send + 'static {
    stats
        .max
        .store(limits.max_connections as u64, Ordering::Relaxed);
    let router = with_deadline(router, limits.request_timeout);
    let router = if limits.http2 {
        router
    } else {
        router.layer(axum::middleware::from_fn(close_after_error))
    };
    let tls = match tls {
        Some(t) if !limits.http2 && t.alpn_protocols.iter().any(|p| p == b"h2") => {
            let mut t = (*t).clone();
            t.alpn_protocols.retain(|p| p != b"h2");
            Some(Arc::new(t))
        }
        t => t,
    };
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    accept_loop(listener, router, acceptor, limits, stats, cancel)
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

/// `router` answering 408 to a request not completed within `deadline` (when set).
fn with_deadline(router: Router, deadline: Option<Duration>) -> Router {
    match deadline {
        Some(deadline) => router.layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                request_deadline(deadline, req, next)
            },
        )),
        None => router,
    }
}

/// On an HTTP/1.1-only server (the report API), an error answer (4xx, 5xx) to an HTTP/1.x request
/// carries `Connection: close`, and hyper closes the connection after it: the handler may have
/// refused before reading the request's body (413, 401, a follower's 503), and a client reusing
/// the connection would send its next request into one the server is closing (broken pipes under
/// load). Errors are rare; the client's next request opens a connection, resuming its TLS session.
async fn close_after_error(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let h1 = req.version() < axum::http::Version::HTTP_2;
    let mut resp = next.run(req).await;
    if h1 && (resp.status().is_client_error() || resp.status().is_server_error()) {
        resp.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    resp
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
            (
                StatusCode::REQUEST_TIMEOUT,
                Json(serde_json::json!({
                    "error": format!("request not completed within {limit:?}")
                })),
            )
                .into_response()
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
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        let counts = stats.clone();
        tokio::spawn(async move {
            let _slot = (slot, open);
            match acceptor {
                None => {
                    serve_conn(hyper_util::rt::TokioIo::new(tcp), svc, limits, cancel, peer).await
                }
                Some(acceptor) => {
                    let Some(tls) = handshake(&acceptor, tcp, &limits, &counts, peer).await else {
                        return;
                    };
                    serve_conn(hyper_util::rt::TokioIo::new(tls), svc, limits, cancel, peer).await
                }
            }
        });
    }
}

/// The server side of a TLS handshake on `io`, given up after `tls_handshake_timeout` (a client
/// that connects and sends nothing holds a connection slot until then); counts resumed sessions.
async fn handshake<I>(
    acceptor: &tokio_rustls::TlsAcceptor,
    io: I,
    limits: &ServeLimits,
    counts: &ConnectionStats,
    peer: std::net::SocketAddr,
) -> Option<tokio_rustls::server::TlsStream<I>>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    match tokio::time::timeout(limits.tls_handshake_timeout, acceptor.accept(io)).await {
        Ok(Ok(s)) => {
            if s.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
                counts.resumed.fetch_add(1, Ordering::Relaxed);
            }
            Some(s)
        }
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            None
        }
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
    if !limits.http2 {
        builder = builder.http1_only();
    }
    builder
        .http2()
        .max_concurrent_streams(limits.max_h2_streams);
    if let Some(t) = limits.header_read_timeout {
        builder
            .http1()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(t);
    }
    if let Some(t) = limits.h2_keep_alive {
        builder
            .http2()
            .timer(hyper_util::rt::TokioTimer::new())
            .keep_alive_interval(t)
            .keep_alive_timeout(t);
    }
    let conn = builder.serve_connection(io, svc);
    tokio::pin!(conn);
    let ended = |r: Result<(), Box<dyn std::error::Error + Send + Sync>>| {
        if let Err(e) = r {
            tracing::debug!(%peer, error = %e, "connection ended with an error");
        }
    };
    tokio::select! {
        r = conn.as_mut() => return ended(r),
        _ = cancel.cancelled() => {}
    }
    if limits.shutdown_grace.is_zero() {
        return;
    }
    conn.as_mut().graceful_shutdown();
    match tokio::time::timeout(limits.shutdown_grace, conn).await {
        Ok(r) => ended(r),
        Err(_) => {
            tracing::debug!(%peer, "connection not finished within the shutdown grace: dropped")
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use tokio::io::AsyncWriteExt;
    use tokio::time::Instant;
    use tower::ServiceExt;

    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;
    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[tokio::test]
    async fn an_error_answer_over_http1_closes_the_connection_and_a_success_keeps_it() {
        let router = Router::new()
            .route("/ok", axum::routing::get(|| async { "ok" }))
            .route(
                "/no",
                axum::routing::get(|| async { StatusCode::UNAUTHORIZED }),
            );
        let cancel = CancellationToken::new();
        let stats = Arc::new(ConnectionStats::default());
        let (addr, run) = bind(
            "127.0.0.1:0",
            router,
            None,
            ServeLimits::default(),
            stats.clone(),
            cancel.clone(),
        )
        .await
        .unwrap();
        tokio::spawn(run);
        let client = crate::http::builder(None)
            .unwrap()
            .no_proxy()
            .build()
            .unwrap();
        let get = |path: &str| client.get(format!("http://{addr}{path}")).send();
        let ok = get("/ok").await.unwrap();
        assert_eq!(ok.status(), 200);
        assert!(ok.headers().get("connection").is_none());
        let no = get("/no").await.unwrap();
        assert_eq!(no.status(), 401);
        assert_eq!(no.headers()["connection"], "close");
        drop((ok, no));
        // The first connection was kept for the second request, which closed it: a third opens
        // a new one.
        assert_eq!(get("/ok").await.unwrap().status(), 200);
        assert_eq!(stats.accepted.load(Ordering::Relaxed), 2);
        cancel.cancel();
    }

    /// A router whose `/slow/N` answers after N ms.
    fn slow() -> Router {
        Router::new().route(
            "/slow/{ms}",
            axum::routing::get(
                |axum::extract::Path(ms): axum::extract::Path<u64>| async move {
                    tokio::time::sleep(MS(ms)).await;
                    "done"
                },
            ),
        )
    }

    async fn get(router: &Router, path: &str) -> (StatusCode, Duration) {
        let t0 = Instant::now();
        let req = axum::http::Request::get(path)
            .body(axum::body::Body::empty())
            .unwrap();
        let status = router.clone().oneshot(req).await.unwrap().status();
        (status, t0.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_is_cut_with_408_at_exactly_its_deadline() {
        let r = with_deadline(slow(), Some(S(15)));
        assert_eq!(get(&r, "/slow/14999").await, (StatusCode::OK, MS(14_999)));
        assert_eq!(
            get(&r, "/slow/15001").await,
            (StatusCode::REQUEST_TIMEOUT, S(15))
        );
        let unlimited = with_deadline(slow(), None);
        assert_eq!(
            get(&unlimited, "/slow/60000").await,
            (StatusCode::OK, S(60))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_never_finishes_its_headers_is_closed_at_the_header_timeout() {
        let limits = ServeLimits::default();
        let timeout = limits.header_read_timeout.unwrap();
        let (mut client, server) = tokio::io::duplex(4096);
        let svc = hyper_util::service::TowerToHyperService::new(slow());
        let peer = "127.0.0.1:1".parse().unwrap();
        // Half a request line, then nothing (the connection stays open).
        client.write_all(b"GET /slow/1 HTTP/1.1\r\n").await.unwrap();
        let t0 = Instant::now();
        let cancel = CancellationToken::new();
        serve_conn(
            hyper_util::rt::TokioIo::new(server),
            svc,
            limits,
            cancel,
            peer,
        )
        .await;
        let took = t0.elapsed();
        assert!(took >= timeout && took <= timeout + MS(1), "{took:?}");
        drop(client);
    }

    /// A self-signed server config for `localhost`, and a client config trusting it.
    fn tls_pair() -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let der = cert.der().clone();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![der.clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        (Arc::new(server), Arc::new(client))
    }

    /// A client that connects and sends nothing is let go at exactly the handshake timeout; a
    /// client that shakes hands gets its stream.
    #[tokio::test(start_paused = true)]
    async fn a_silent_tls_client_is_dropped_at_the_handshake_timeout() {
        let (server, client) = tls_pair();
        let acceptor = tokio_rustls::TlsAcceptor::from(server);
        let limits = ServeLimits::default();
        let counts = ConnectionStats::default();
        let peer = "127.0.0.1:1".parse().unwrap();

        let (silent, io) = tokio::io::duplex(16 * 1024);
        let t0 = Instant::now();
        assert!(handshake(&acceptor, io, &limits, &counts, peer)
            .await
            .is_none());
        assert_eq!(t0.elapsed(), limits.tls_handshake_timeout);
        drop(silent);

        let (c, io) = tokio::io::duplex(16 * 1024);
        let connector = tokio_rustls::TlsConnector::from(client);
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let t0 = Instant::now();
        let (server_side, client_side) = tokio::join!(
            handshake(&acceptor, io, &limits, &counts, peer),
            connector.connect(name, c)
        );
        assert!(server_side.is_some() && client_side.is_ok());
        assert!(t0.elapsed() < limits.tls_handshake_timeout);
    }

    #[tokio::test(start_paused = true)]
    async fn on_shutdown_a_busy_connection_gets_the_grace_then_is_dropped() {
        let limits = ServeLimits::default();
        let grace = limits.shutdown_grace;
        let (mut client, server) = tokio::io::duplex(4096);
        let svc = hyper_util::service::TowerToHyperService::new(slow());
        let peer = "127.0.0.1:1".parse().unwrap();
        // A whole request whose answer takes a minute.
        client
            .write_all(b"GET /slow/60000 HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let cancel = CancellationToken::new();
        let t0 = Instant::now();
        let stop = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(S(1)).await;
            stop.cancel();
        });
        serve_conn(
            hyper_util::rt::TokioIo::new(server),
            svc,
            limits,
            cancel,
            peer,
        )
        .await;
        let took = t0.elapsed();
        let want = S(1) + grace;
        assert!(took >= want && took <= want + MS(2), "{took:?}");
        drop(client);
    }
}

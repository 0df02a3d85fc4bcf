//! The one way a command builds its Kubernetes client configuration: `--kubeconfig FILE` (and
//! `--context`), else what kube-rs infers (`$KUBECONFIG`, `~/.kube/config`, in-cluster).

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};

/// Why no client configuration could be built; each names the file or server.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The named kubeconfig could not be read or used.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// File (`(default)` for the default kubeconfig with an explicit context).
        path: String,
        /// Cause.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Nothing to infer a configuration from.
    #[error("kubeconfig (default): no Kubernetes configuration found: {source}")]
    Infer {
        /// Cause.
        #[source]
        source: kube::config::InferConfigError,
    },
    /// The client could not be built.
    #[error("cannot build a Kubernetes client for {server}: {source}")]
    Client {
        /// API server URL.
        server: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

/// The client configuration of `kubeconfig` (with `context`, default: its current one), else
/// the default kubeconfig with `context`, else the inferred configuration.
pub async fn config(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<kube::Config, ClientError> {
    let opts = KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    match (kubeconfig, context) {
        (Some(p), _) => {
            let path = p.display().to_string();
            let kc = Kubeconfig::read_from(p).map_err(|source| ClientError::Kubeconfig {
                path: path.clone(),
                source,
            })?;
            kube::Config::from_custom_kubeconfig(kc, &opts)
                .await
                .map_err(|source| ClientError::Kubeconfig { path, source })
        }
        (None, Some(_)) => kube::Config::from_kubeconfig(&opts)
            .await
            .map_err(|source| ClientError::Kubeconfig {
                path: "(default)".into(),
                source,
            }),
        (None, None) => kube::Config::infer()
            .await
            .map_err(|source| ClientError::Infer { source }),
    }
}

/// The HTTP/2 flow-control windows of the controller's client, client-go's: a stream (a watch, a
/// list) may have 4 MiB sent and not yet read; the connection's window is so large that streams the
/// controller reads slowly (a watch during a burst) never use it up and stall the others (a cordon)
/// on the same connection. A window is credit, not memory: what is buffered is at most what the
/// streams were sent and not yet read, 4 MiB each.
#[cfg(feature = "controller")]
const H2_STREAM_WINDOW: u32 = 4 << 20;
#[cfg(feature = "controller")]
const H2_CONNECTION_WINDOW: u32 = 1 << 30;

/// A client of `cfg` that speaks HTTP/2 to a server that offers it (ALPN `h2`, as kube-apiserver
/// does), else HTTP/1.1; or an error naming its server.
///
/// kube-rs 5's own client offers HTTP/1.1 only, so every request in flight needs a connection of its
/// own: at 1,000 nodes the controller opened 322 TLS connections in 11 s of preemption notices, each
/// a handshake on kube-apiserver's cores too (docs/comparison.md#http2). Over HTTP/2 every request
/// is a stream of one connection. The layers are kube-rs's own (base URI, 429/503/504 retry when
/// `cfg.default_retry`, authentication with token-file reloading, extra headers), its timeouts too;
/// the connection is pinged every 30 s while requests are open and dropped when 15 s pass without
/// the answer (client-go's HTTP/2 health check), so a dead connection fails its requests and the
/// next ones open a new one.
#[cfg(feature = "controller")]
pub fn client(cfg: kube::Config) -> Result<kube::Client, ClientError> {
    use std::time::Duration;

    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::rt::{TokioExecutor, TokioTimer};
    use kube::client::{retry::RetryPolicy, ConfigExt};
    use tower::{retry::RetryLayer, BoxError, ServiceBuilder};

    let server = cfg.cluster_url.to_string();
    let err = |source| ClientError::Client {
        server: server.clone(),
        source,
    };
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    let tls = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(cfg.rustls_client_config().map_err(err)?)
        .https_or_http();
    let tls = match &cfg.tls_server_name {
        Some(name) => {
            let name = rustls_pki_types::ServerName::try_from(name.clone()).map_err(|e| {
                err(kube::Error::RustlsTls(
                    kube::client::RustlsTlsError::InvalidServerName(e),
                ))
            })?;
            tls.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
        }
        None => tls,
    };
    let mut connector =
        hyper_timeout::TimeoutConnector::new(tls.enable_all_versions().wrap_connector(tcp));
    connector.set_connect_timeout(cfg.connect_timeout);
    connector.set_read_timeout(cfg.read_timeout);
    connector.set_write_timeout(cfg.write_timeout);
    connector.set_reset_reader_on_write(cfg.reset_reader_on_write);
    let http = hyper_util::client::legacy::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(Duration::from_secs(30))
        .http2_keep_alive_timeout(Duration::from_secs(15))
        .http2_initial_stream_window_size(H2_STREAM_WINDOW)
        .http2_initial_connection_window_size(H2_CONNECTION_WINDOW)
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(cfg.base_uri_layer())
        .option_layer(
            cfg.default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(cfg.auth_layer().map_err(err)?)
        .layer(cfg.extra_headers_layer().map_err(err)?)
        .map_err(BoxError::from)
        .service(http);
    Ok(kube::client::ClientBuilder::new(service, cfg.default_namespace).build())
}

#[cfg(all(test, feature = "controller"))]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use axum::http::{HeaderMap, Request, StatusCode, Version};
    use axum::routing::get;
    use tokio_util::sync::CancellationToken;

    use super::client;
    use crate::serve::{bind, server_config, ConnectionStats, ServeLimits};

    const TOKEN: &str = "a-token";

    /// A TLS server for `localhost` on 127.0.0.1 (HTTP/2 by ALPN when `http2`, else HTTP/1.1
    /// only): `/slow` answers after 50 ms to a request with the bearer token, 401 otherwise;
    /// `/busy` answers 429 the first time, 200 after. Returns the client configuration (the URL's
    /// host is the IP, the certificate's name comes from `tls_server_name`) and the connection counts.
    async fn server(http2: bool) -> (kube::Config, Arc<ConnectionStats>, CancellationToken) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let tls = server_config(
            vec![cert.der().clone()],
            rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
        let busy = Arc::new(AtomicU64::new(0));
        let router = axum::Router::new()
            .route(
                "/slow",
                get(|headers: HeaderMap| async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    match headers.get("authorization") {
                        Some(v) if v == format!("Bearer {TOKEN}").as_str() => StatusCode::OK,
                        _ => StatusCode::UNAUTHORIZED,
                    }
                }),
            )
            .route(
                "/busy",
                get(move || async move {
                    match busy.fetch_add(1, Ordering::Relaxed) {
                        0 => StatusCode::TOO_MANY_REQUESTS,
                        _ => StatusCode::OK,
                    }
                }),
            );
        let limits = ServeLimits {
            http2,
            max_h2_streams: 200,
            ..ServeLimits::streaming()
        };
        let stats = Arc::new(ConnectionStats::default());
        let cancel = CancellationToken::new();
        let (addr, serving) = bind(
            "127.0.0.1:0",
            router,
            Some(tls),
            limits,
            stats.clone(),
            cancel.clone(),
        )
        .await
        .unwrap();
        tokio::spawn(serving);
        let mut cfg = kube::Config::new(format!("https://{addr}").parse().unwrap());
        cfg.root_cert = Some(vec![cert.der().to_vec()]);
        cfg.tls_server_name = Some("localhost".into());
        cfg.auth_info.token = Some(TOKEN.to_string().into());
        (cfg, stats, cancel)
    }

    /// One request, then 64 at once; each one's status and HTTP version. (Requests that start
    /// together on a client with no connection yet each open one: which protocol a connection
    /// speaks is known only once its TLS handshake is done.)
    async fn at_once(c: &kube::Client) -> Vec<(StatusCode, Version)> {
        let req = Request::get("/slow")
            .body(kube::client::Body::empty())
            .unwrap();
        assert_eq!(c.send(req).await.unwrap().status(), StatusCode::OK);
        let calls = (0..64).map(|_| {
            let req = Request::get("/slow")
                .body(kube::client::Body::empty())
                .unwrap();
            async move {
                let resp = c.send(req).await.unwrap();
                (resp.status(), resp.version())
            }
        });
        futures::future::join_all(calls).await
    }

    #[tokio::test]
    async fn requests_in_flight_share_one_http2_connection() {
        let (cfg, stats, cancel) = server(true).await;
        let c = client(cfg).unwrap();
        let answers = at_once(&c).await;
        assert!(answers
            .iter()
            .all(|a| *a == (StatusCode::OK, Version::HTTP_2)));
        assert_eq!(stats.accepted.load(Ordering::Relaxed), 1);
        cancel.cancel();
    }

    /// The same client still talks to a server that offers HTTP/1.1 only (one connection per
    /// request in flight: what the HTTP/2 test would see without HTTP/2).
    #[tokio::test]
    async fn a_server_without_http2_gets_http1_with_a_connection_per_request_in_flight() {
        let (cfg, stats, cancel) = server(false).await;
        let c = client(cfg).unwrap();
        let answers = at_once(&c).await;
        assert!(answers
            .iter()
            .all(|a| *a == (StatusCode::OK, Version::HTTP_11)));
        assert!(stats.accepted.load(Ordering::Relaxed) > 1);
        cancel.cancel();
    }

    /// kube-rs's retry of 429 stays on unless the configuration turns it off (the drain's client).
    #[tokio::test]
    async fn a_429_is_retried_only_when_the_configuration_says_so() {
        for (retry, want) in [
            (true, StatusCode::OK),
            (false, StatusCode::TOO_MANY_REQUESTS),
        ] {
            let (mut cfg, _, cancel) = server(true).await;
            cfg.default_retry = retry;
            let req = Request::get("/busy")
                .body(kube::client::Body::empty())
                .unwrap();
            let got = client(cfg).unwrap().send(req).await.unwrap().status();
            assert_eq!(got, want, "default_retry = {retry}");
            cancel.cancel();
        }
    }
}

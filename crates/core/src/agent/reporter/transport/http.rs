//! The real transport: reqwest over rustls through [`crate::http`].

use futures::future::BoxFuture;

use super::{Answer, ReportTransport, TransportError};
use crate::agent::reporter::{ReporterConfig, ReporterError};

/// POSTs to the controller over HTTPS (or plain HTTP for tests and local demos).
#[derive(Debug)]
pub struct HttpTransport {
    client: reqwest::Client,
    /// The URL requested (the configured one, with `server_name` as its host when they differ).
    target: reqwest::Url,
}

impl HttpTransport {
    /// The client for `cfg` requesting `endpoint`: with `ca_file`, only that CA is trusted and
    /// the certificate must be valid for `server_name` (default: the URL's host); without it, the
    /// system's roots (plain `http://` URLs also work: tests, local demos). Requests time out
    /// after `timeout` (connect to last body byte). A connection is kept for `idle_timeout` (1 s)
    /// after a report (a burst of changes reuses it), then closed: the controller holds no
    /// connection between heartbeats, and the next report reconnects, resuming the TLS session
    /// (the client's rustls config, built once, keeps the session tickets). Below the
    /// controller's `idle_timeout` (3 s), so the agent closes an idle connection before the
    /// server does and never sends a report into one the server is closing.
    pub fn new(cfg: &ReporterConfig, endpoint: &str) -> Result<Self, ReporterError> {
        let target = reqwest::Url::parse(endpoint).map_err(|source| ReporterError::Url {
            url: cfg.url.clone(),
            source,
        })?;
        let tls = |source| ReporterError::Client {
            url: cfg.url.clone(),
            source,
        };
        let builder = match &cfg.ca_file {
            Some(ca) => crate::http::pinned_builder(ca).map_err(tls)?,
            None => crate::http::builder(None).map_err(tls)?.no_proxy(),
        };
        let (builder, target) = match (&cfg.server_name, target.scheme()) {
            (Some(name), "https") => {
                crate::http::pin_server_name(builder, &target, name).map_err(tls)?
            }
            _ => (builder, target),
        };
        let client = builder
            .timeout(cfg.timeout)
            .pool_idle_timeout(cfg.idle_timeout)
            .build()
            .map_err(|e| tls(e.into()))?;
        Ok(HttpTransport { client, target })
    }
}

impl ReportTransport for HttpTransport {
    fn post<'a>(
        &'a self,
        token: &'a str,
        body: Vec<u8>,
    ) -> BoxFuture<'a, Result<Answer, TransportError>> {
        Box::pin(async move {
            let resp = self
                .client
                .post(self.target.clone())
                .bearer_auth(token)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body)
                .send()
                .await?;
            let status = resp.status().as_u16();
            let retry_after = super::retry_after(
                resp.headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok()),
            );
            let warning = resp
                .headers()
                .get(reqwest::header::WARNING)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let body = resp.bytes().await?;
            Ok(Answer {
                status,
                body,
                retry_after,
                warning,
            })
        })
    }
}

//! The small HTTP client all sources share: no proxy, no redirects, a timeout around the whole
//! exchange (headers and body), and a body size limit.

use std::time::Duration;

use bytes::{Bytes, BytesMut};

use super::SourceError;

/// Largest body accepted from a metadata service; real answers are a few KiB.
pub const MAX_BODY: usize = 1 << 20;

/// An HTTP answer, status not yet judged.
#[derive(Debug, Clone)]
pub struct Response {
    /// The URL requested.
    pub url: String,
    /// HTTP status code.
    pub status: u16,
    /// The `ETag` header, if any.
    pub etag: Option<String>,
    /// The body.
    pub body: Bytes,
}

impl Response {
    /// A [`SourceError::Status`] for this answer.
    pub fn unexpected(&self) -> SourceError {
        let text = String::from_utf8_lossy(&self.body[..self.body.len().min(200)]).into_owned();
        SourceError::Status {
            url: self.url.clone(),
            status: self.status,
            body: crate::text::truncate(text.trim(), 120),
        }
    }
    /// This answer if its status is 200, else a [`SourceError::Status`].
    pub fn require_ok(self) -> Result<Self, SourceError> {
        match self.status {
            200 => Ok(self),
            _ => Err(self.unexpected()),
        }
    }

    /// The usual notice channel contract: 404 = nothing pending, 200 = parse the body, anything
    /// else is an error.
    pub fn notices<F>(&self, parse: F) -> Result<Vec<super::Notice>, SourceError>
    where
        F: FnOnce(&[u8]) -> Result<Vec<super::Notice>, super::ParseError>,
    {
        match self.status {
            404 => Ok(Vec::new()),
            200 => parse(&self.body).map_err(|e| self.parse_error(e)),
            _ => Err(self.unexpected()),
        }
    }

    /// A [`SourceError::Parse`] for this answer.
    pub fn parse_error(&self, source: super::ParseError) -> SourceError {
        SourceError::Parse {
            url: self.url.clone(),
            source,
        }
    }
}

/// A client bound to one metadata endpoint.
#[derive(Debug, Clone)]
pub struct Http {
    client: reqwest::Client,
    base: String,
    timeout: Duration,
}

impl Http {
    /// A client for `base` (e.g. `http://169.254.169.254`) with a per-request `timeout`.
    pub fn new(base: &str, timeout: Duration) -> Result<Self, SourceError> {
        let client = crate::http::plain_builder()
            .map_err(|source| SourceError::Client {
                base: base.to_string(),
                source,
            })?
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(timeout)
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| SourceError::Client {
                base: base.to_string(),
                source: e.into(),
            })?;
        Ok(Self {
            client,
            base: base.trim_end_matches('/').to_string(),
            timeout,
        })
    }

    /// The full URL of `path` (which starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// The per-request timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A request builder for `method` on `path`.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.client.request(method, self.url(path))
    }

    /// Sends `req` and reads the whole body, all within `self.timeout + extra`.
    pub async fn send(
        &self,
        req: reqwest::RequestBuilder,
        extra: Duration,
    ) -> Result<Response, SourceError> {
        let req = req.build().map_err(SourceError::Request)?;
        let url = req.url().to_string();
        let timeout = self.timeout + extra;
        match tokio::time::timeout(timeout, self.exchange(req, &url)).await {
            Ok(r) => r,
            Err(_) => Err(SourceError::Timeout { url, timeout }),
        }
    }

    async fn exchange(&self, req: reqwest::Request, url: &str) -> Result<Response, SourceError> {
        let transport = |source: reqwest::Error| SourceError::Transport {
            url: url.to_string(),
            source,
        };
        let mut resp = self.client.execute(req).await.map_err(transport)?;
        let status = resp.status().as_u16();
        let etag = resp
            .headers()
            .get(reqwest::header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let mut body = BytesMut::new();
        while let Some(chunk) = resp.chunk().await.map_err(transport)? {
            if body.len() + chunk.len() > MAX_BODY {
                return Err(SourceError::TooLarge {
                    url: url.to_string(),
                    limit: MAX_BODY,
                });
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Response {
            url: url.to_string(),
            status,
            etag,
            body: body.freeze(),
        })
    }
}

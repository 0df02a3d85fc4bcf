//! The real POST: reqwest over rustls through [`crate::http`].

use futures::future::BoxFuture;

use super::{PostRequest, TransportError, WebhookPost};
use crate::controller::act::notify::EVENT_HEADER;
use crate::controller::act::provider::webhook::SIGNATURE_HEADER;

/// POSTs with one client per target (its `ca_file`, its `timeout`).
#[derive(Debug)]
pub struct HttpPost(pub reqwest::Client);

impl WebhookPost for HttpPost {
    fn post<'a>(&'a self, req: PostRequest<'a>) -> BoxFuture<'a, Result<u16, TransportError>> {
        Box::pin(async move {
            let mut r = self
                .0
                .post(req.url)
                .header(reqwest::header::CONTENT_TYPE, req.content_type)
                .header(EVENT_HEADER, req.event)
                .header("Idempotency-Key", req.idempotency_key);
            if let Some(sig) = req.signature {
                r = r.header(SIGNATURE_HEADER, sig);
            }
            match r.body(req.body.to_vec()).send().await {
                Ok(resp) => Ok(resp.status().as_u16()),
                // (the URL may carry a token in its query: not in logs)
                Err(e) => Err(Box::new(e.without_url()) as TransportError),
            }
        })
    }
}

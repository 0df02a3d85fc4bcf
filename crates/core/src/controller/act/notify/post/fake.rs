//! A scripted POST for the delivery tests: answers statuses from a script (then 200; 0 stands for
//! a transport error) and records when each POST came (tokio's clock) with its idempotency key.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use tokio::time::Instant;

use super::{PostRequest, TransportError, WebhookPost};

/// The fake; keep a clone of `seen` before boxing it.
#[derive(Debug, Default)]
pub(crate) struct FakePost {
    pub script: Mutex<VecDeque<u16>>,
    pub seen: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl FakePost {
    pub(crate) fn new(script: &[u16]) -> Self {
        FakePost {
            script: Mutex::new(script.iter().copied().collect()),
            seen: Arc::default(),
        }
    }
}

impl WebhookPost for FakePost {
    fn post<'a>(&'a self, req: PostRequest<'a>) -> BoxFuture<'a, Result<u16, TransportError>> {
        self.seen
            .lock()
            .unwrap()
            .push((Instant::now(), req.idempotency_key.to_string()));
        let status = self.script.lock().unwrap().pop_front().unwrap_or(200);
        Box::pin(async move {
            match status {
                0 => Err("connection refused".into()),
                s => Ok(s),
            }
        })
    }
}

//! A hand-written recording fake provider for tests of the decision and action code.

use std::collections::BTreeMap;
use std::sync::Mutex;

use futures::future::BoxFuture;

use super::{CallError, NodeProvider, ProviderError, ReplacementRequest, ReplacementTicket};

/// Records every call; launches one replacement per distinct `request_id`; readiness is set by the
/// test with [`FakeProvider::make_ready`]; the next request can be made to fail with
/// [`FakeProvider::fail_next`].
#[derive(Debug, Default)]
pub struct FakeProvider {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    requests: Vec<ReplacementRequest>,
    launched: BTreeMap<String, ReplacementTicket>,
    ready: BTreeMap<String, String>,
    retired: Vec<ReplacementRequest>,
    fail_next: Option<String>,
}

impl FakeProvider {
    /// An empty fake.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic in another test thread poisons the lock; the data is still usable.
        crate::sync::lock(&self.state)
    }

    /// Every request received, in order (duplicates included).
    pub fn requests(&self) -> Vec<ReplacementRequest> {
        self.state().requests.clone()
    }

    /// How many distinct replacements were launched.
    pub fn launched(&self) -> usize {
        self.state().launched.len()
    }

    /// Marks the replacement for `request_id` Ready as node `new_node`.
    pub fn make_ready(&self, request_id: &str, new_node: &str) {
        self.state()
            .ready
            .insert(request_id.to_string(), new_node.to_string());
    }

    /// Every `retire` call received, in order (duplicates included).
    pub fn retired(&self) -> Vec<ReplacementRequest> {
        self.state().retired.clone()
    }

    /// The next `request_replacement` fails with a permanent error carrying `message`.
    pub fn fail_next(&self, message: &str) {
        self.state().fail_next = Some(message.to_string());
    }
}

impl NodeProvider for FakeProvider {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn request_replacement<'a>(
        &'a self,
        req: &'a ReplacementRequest,
    ) -> BoxFuture<'a, Result<ReplacementTicket, ProviderError>> {
        Box::pin(async move {
            let mut s = self.state();
            s.requests.push(req.clone());
            if let Some(why) = s.fail_next.take() {
                return Err(ProviderError::Permanent {
                    provider: "fake",
                    node: req.node.clone(),
                    source: CallError::Ruled(why),
                });
            }
            let ticket =
                s.launched
                    .entry(req.request_id.clone())
                    .or_insert_with(|| ReplacementTicket {
                        provider: "fake".into(),
                        request_id: req.request_id.clone(),
                        node: req.node.clone(),
                        pool: req.pool.clone(),
                        reference: Some(format!("fake-{}", req.request_id)),
                        requested_at: None,
                        existing_nodes: Vec::new(),
                    });
            Ok(ticket.clone())
        })
    }

    fn replacement_ready<'a>(
        &'a self,
        ticket: &'a ReplacementTicket,
    ) -> BoxFuture<'a, Result<Option<String>, ProviderError>> {
        Box::pin(async move { Ok(self.state().ready.get(&ticket.request_id).cloned()) })
    }

    fn retire<'a>(
        &'a self,
        req: &'a ReplacementRequest,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            self.state().retired.push(req.clone());
            Ok(())
        })
    }
}

//! The `none` provider: never replaces a node, for users who only want cordon/drain.

use futures::future::BoxFuture;

use super::{NodeProvider, ProviderError, ReplacementRequest, ReplacementTicket};

/// Accepts every request and never reports a replacement.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoReplacement;

impl NodeProvider for NoReplacement {
    fn name(&self) -> &'static str {
        "none"
    }

    fn request_replacement<'a>(
        &'a self,
        req: &'a ReplacementRequest,
    ) -> BoxFuture<'a, Result<ReplacementTicket, ProviderError>> {
        Box::pin(async move {
            tracing::info!(node = %req.node, reason = %req.reason, "provider `none`: no replacement requested");
            Ok(ReplacementTicket {
                provider: self.name().to_string(),
                request_id: req.request_id.clone(),
                node: req.node.clone(),
                pool: req.pool.clone(),
                reference: None,
                requested_at: None,
                existing_nodes: Vec::new(),
            })
        })
    }

    fn replacement_ready<'a>(
        &'a self,
        _ticket: &'a ReplacementTicket,
    ) -> BoxFuture<'a, Result<Option<String>, ProviderError>> {
        Box::pin(async { Ok(None) })
    }
}

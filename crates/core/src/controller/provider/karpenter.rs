//! The `karpenter` provider: deletes the node's NodeClaim (`karpenter.sh/v1`, `nodeclaims`) and
//! reports a new Ready node of the same NodePool that did not exist when the replacement was asked.
//!
//! Idempotency: the NodeClaim is annotated with the request id before it is deleted; a claim that is
//! already deleting, or already gone, is never deleted again, and a second request with the same id
//! returns the ticket of the first.

use std::collections::BTreeMap;
use std::sync::Mutex;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject};
use kube::Client;
use serde_json::json;

use super::{
    new_ready_node, NodeProvider, ProviderError, ReplacementRequest, ReplacementTicket, POOL_LABEL,
};

/// Annotation put on the NodeClaim with the id of the request that deletes it.
pub const REQUEST_ANNOTATION: &str = "nodekeeper.io/replacement-request";

const NAME: &str = "karpenter";

/// The NodeClaim resource (`karpenter.sh/v1`).
pub fn nodeclaim_resource() -> ApiResource {
    ApiResource {
        group: "karpenter.sh".into(),
        version: "v1".into(),
        api_version: "karpenter.sh/v1".into(),
        kind: "NodeClaim".into(),
        plural: "nodeclaims".into(),
    }
}

/// Replaces nodes by deleting their Karpenter NodeClaim.
pub struct Karpenter {
    client: Client,
    tickets: Mutex<BTreeMap<String, ReplacementTicket>>,
}

impl Karpenter {
    /// A provider using `client` (a default kube client is fine: only lists, patches and deletes).
    pub fn new(client: Client) -> Self {
        Self {
            client,
            tickets: Mutex::new(BTreeMap::new()),
        }
    }

    fn claims(&self) -> Api<DynamicObject> {
        Api::all_with(self.client.clone(), &nodeclaim_resource())
    }

    fn remembered(&self, id: &str) -> Option<ReplacementTicket> {
        self.tickets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    fn remember(&self, t: &ReplacementTicket) {
        self.tickets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(t.request_id.clone(), t.clone());
    }

    /// The NodeClaim backing `node`: `status.nodeName == node`, else a claim named like the node.
    async fn find_claim(&self, node: &str) -> Result<Option<DynamicObject>, ProviderError> {
        let list = self
            .claims()
            .list(&ListParams::default())
            .await
            .map_err(|source| kube_err("listing NodeClaims", node, source))?;
        let by_status = list
            .items
            .iter()
            .find(|c| c.data.pointer("/status/nodeName").and_then(|v| v.as_str()) == Some(node));
        let by_name = list
            .items
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(node));
        Ok(by_status.or(by_name).cloned())
    }

    /// Names of the nodes of `pool` that exist now.
    async fn pool_nodes(&self, pool: Option<&str>, node: &str) -> Result<Vec<Node>, ProviderError> {
        let lp = match pool {
            Some(p) => ListParams::default().labels(&format!("{POOL_LABEL}={p}")),
            None => ListParams::default(),
        };
        Api::<Node>::all(self.client.clone())
            .list(&lp)
            .await
            .map(|l| l.items)
            .map_err(|source| kube_err("listing nodes", node, source))
    }

    /// The pool of `node`: from the request, else from the node's label.
    async fn pool_of(&self, req: &ReplacementRequest) -> Result<Option<String>, ProviderError> {
        if req.pool.is_some() {
            return Ok(req.pool.clone());
        }
        let node = Api::<Node>::all(self.client.clone())
            .get_opt(&req.node)
            .await
            .map_err(|source| kube_err("reading node", &req.node, source))?;
        Ok(node
            .and_then(|n| n.metadata.labels)
            .and_then(|l| l.get(POOL_LABEL).cloned()))
    }

    async fn request(&self, req: &ReplacementRequest) -> Result<ReplacementTicket, ProviderError> {
        if let Some(t) = self.remembered(&req.request_id) {
            return Ok(t);
        }
        let pool = self.pool_of(req).await?;
        let claim = self.find_claim(&req.node).await?;
        let Some(claim) = claim else {
            return Err(ProviderError::Permanent {
                provider: NAME,
                node: req.node.clone(),
                message: "no NodeClaim has this node (status.nodeName or name)".into(),
            });
        };
        let claim_name = claim.metadata.name.clone().unwrap_or_default();
        let pool = pool.or_else(|| claim.metadata.labels.as_ref()?.get(POOL_LABEL).cloned());
        let existing = self
            .pool_nodes(pool.as_deref(), &req.node)
            .await?
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect();
        let requested_at = match claim.metadata.deletion_timestamp {
            Some(ts) => {
                tracing::info!(node = %req.node, nodeclaim = %claim_name, "NodeClaim already deleting");
                Some(ts.0.to_string())
            }
            None => self.delete_claim(req, &claim_name).await?,
        };
        let ticket = ReplacementTicket {
            provider: NAME.into(),
            request_id: req.request_id.clone(),
            node: req.node.clone(),
            pool,
            reference: Some(claim_name),
            requested_at,
            existing_nodes: existing,
        };
        self.remember(&ticket);
        Ok(ticket)
    }

    /// Annotates the claim with the request id, then deletes it. Returns the deletion timestamp.
    async fn delete_claim(
        &self,
        req: &ReplacementRequest,
        claim: &str,
    ) -> Result<Option<String>, ProviderError> {
        let api = self.claims();
        let patch = json!({"metadata": {"annotations": {REQUEST_ANNOTATION: req.request_id}}});
        match api
            .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(None),
            Err(source) => return Err(kube_err("annotating NodeClaim", &req.node, source)),
        }
        tracing::info!(node = %req.node, nodeclaim = claim, request = %req.request_id, reason = %req.reason, "deleting NodeClaim");
        match api.delete(claim, &DeleteParams::default()).await {
            Ok(either) => Ok(either
                .left()
                .and_then(|c| c.metadata.deletion_timestamp)
                .map(|t| t.0.to_string())),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(None),
            Err(source) => Err(kube_err("deleting NodeClaim", &req.node, source)),
        }
    }

    async fn ready(&self, t: &ReplacementTicket) -> Result<Option<String>, ProviderError> {
        let nodes = self.pool_nodes(t.pool.as_deref(), &t.node).await?;
        Ok(new_ready_node(nodes, t))
    }
}

fn kube_err(action: &'static str, node: &str, source: kube::Error) -> ProviderError {
    ProviderError::Kube {
        provider: NAME,
        action,
        node: node.to_string(),
        source,
    }
}

impl NodeProvider for Karpenter {
    fn name(&self) -> &'static str {
        NAME
    }

    fn request_replacement<'a>(
        &'a self,
        req: &'a ReplacementRequest,
    ) -> BoxFuture<'a, Result<ReplacementTicket, ProviderError>> {
        Box::pin(self.request(req))
    }

    fn replacement_ready<'a>(
        &'a self,
        ticket: &'a ReplacementTicket,
    ) -> BoxFuture<'a, Result<Option<String>, ProviderError>> {
        Box::pin(self.ready(ticket))
    }
}

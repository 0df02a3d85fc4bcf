//! The `karpenter` provider, in two halves so that Karpenter never drains a node nodekeeper is
//! draining (docs/karpenter.md):
//!
//! 1. [`NodeProvider::request_replacement`] **adds capacity at once**: it annotates the node's
//!    NodeClaim (`karpenter.sh/v1`, `nodeclaims`) with the request id and creates a NodeClaim of the
//!    same NodePool with the same spec (requirements, NodeClass, taints, expiry), named after the
//!    request (`<claim>-nk<hash>`), which Karpenter launches like its own. It carries
//!    `karpenter.sh/do-not-disrupt` so consolidation does not take it while it is still empty. When
//!    no workload pod is left on the node (a repair whose drain step emptied it) nothing is created:
//!    Karpenter provisioned for the evicted pods already; a request made before the drain
//!    (`[repair] prespin`) creates it all the same.
//! 2. [`NodeProvider::retire`], called by the controller once its drain of the old node is over,
//!    **deletes the old NodeClaim**: Karpenter's termination (taint `karpenter.sh/disrupted`, its own
//!    drain, instance deletion) then finds nothing left to evict. It also lifts the
//!    `do-not-disrupt` of the new claim and its node.
//! 3. [`NodeProvider::abandon`], for a replacement asked for before a drain (`[repair] prespin`)
//!    whose repair was released: the new claim loses its `do-not-disrupt` and stays Karpenter's.
//!
//! A new Ready node of the same NodePool that did not exist at the request is the replacement.
//! Idempotency: the new claim's name derives from the request id (a second create answers 409);
//! a claim that is already deleting, or already gone, is never deleted again; a second request with
//! the same id returns the ticket of the first.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::ObjectMeta;
use kube::core::{ApiResource, DynamicObject};
use kube::Client;
use serde_json::json;
use sha2::Digest;

use super::{
    new_ready_node, CallError, NodeProvider, ProviderError, ReplacementRequest, ReplacementTicket,
    POOL_LABEL,
};

/// Karpenter's annotation that keeps a node (or NodeClaim) out of its voluntary disruptions
/// (consolidation, drift); its own termination of a deleted NodeClaim is not affected.
pub const DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";

/// Label on a NodeClaim nodekeeper created: the node it replaces.
pub const REPLACES_LABEL: &str = "nodekeeper.io/replaces";

/// Annotation on a NodeClaim nodekeeper created: the id of the request that created it.
pub const CREATED_BY_REQUEST_ANNOTATION: &str = "nodekeeper.io/created-by-request";

/// How long an abandoned replacement's claim not launched yet is waited for.
const ABANDON_WAIT: Duration = Duration::from_secs(60);

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
        crate::sync::lock(&self.tickets).get(id).cloned()
    }

    fn remember(&self, t: &ReplacementTicket) {
        crate::sync::lock(&self.tickets).insert(t.request_id.clone(), t.clone());
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
                source: CallError::Ruled(
                    "no NodeClaim has this node (status.nodeName or name)".into(),
                ),
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
                // Karpenter (or someone) is already taking it away; it brings capacity for the
                // pods it leaves pending.
                tracing::info!(node = %req.node, nodeclaim = %claim_name, "NodeClaim already deleting");
                Some(ts.0.to_string())
            }
            None => {
                self.annotate(
                    &self.claims(),
                    &claim_name,
                    &req.node,
                    REQUEST_ANNOTATION,
                    Some(&req.request_id),
                )
                .await?;
                if req.prespin || self.has_workload(&req.node).await? {
                    self.launch_twin(req, &claim).await?
                } else {
                    // Nothing left to move (e.g. a repair whose drain step emptied the node): the
                    // capacity its pods needed was provisioned by Karpenter for them already.
                    tracing::info!(node = %req.node, "no workload pods left: no replacement NodeClaim");
                    None
                }
            }
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

    /// Whether pods that must move still run on `node`: not DaemonSet pods, not mirror pods, not
    /// finished, not terminating.
    async fn has_workload(&self, node: &str) -> Result<bool, ProviderError> {
        let pods = Api::<Pod>::all(self.client.clone())
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
            .map_err(|source| kube_err("listing the node's pods", node, source))?;
        Ok(pods.items.iter().any(|p| {
            let daemon = p
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.kind == "DaemonSet" && o.controller == Some(true));
            let mirror = has_annotation(&p.metadata, "kubernetes.io/config.mirror");
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            let finished = matches!(phase, Some("Succeeded" | "Failed"));
            !daemon && !mirror && !finished && p.metadata.deletion_timestamp.is_none()
        }))
    }

    /// Creates the NodeClaim that replaces `old` (same NodePool, spec, owner and NodePool hash,
    /// so Karpenter launches it and does not see it as drifted); 409 (already created by an earlier
    /// attempt) counts as done. Returns its creation time.
    async fn launch_twin(
        &self,
        req: &ReplacementRequest,
        old: &DynamicObject,
    ) -> Result<Option<String>, ProviderError> {
        let name = twin_name(
            old.metadata.name.as_deref().unwrap_or(&req.node),
            &req.request_id,
        );
        let twin = twin_of(old, &name, req);
        tracing::info!(node = %req.node, nodeclaim = %name, request = %req.request_id, reason = %req.reason, "creating replacement NodeClaim");
        match self.claims().create(&PostParams::default(), &twin).await {
            Ok(c) => Ok(c.metadata.creation_timestamp.map(|t| t.0.to_string())),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(self
                .claims()
                .get_opt(&name)
                .await
                .map_err(|source| kube_err("reading replacement NodeClaim", &req.node, source))?
                .and_then(|c| c.metadata.creation_timestamp)
                .map(|t| t.0.to_string())),
            Err(source) => Err(kube_err(
                "creating replacement NodeClaim",
                &req.node,
                source,
            )),
        }
    }

    /// Lifts the `do-not-disrupt` of the replacement's claim and node, then deletes the old node's
    /// NodeClaim (once: not when already deleting or gone). The deletion comes last: Karpenter
    /// removes a NotReady node at once when its NodeClaim goes, and the engine retries a failed
    /// retire only while the node is there, so every step that may fail runs before it.
    async fn retire_node(&self, req: &ReplacementRequest) -> Result<(), ProviderError> {
        // Not waiting for a claim still launching: by the end of a drain it normally has (an
        // abandonment, which may come a second after the request, waits).
        self.free_twins(req).await?;
        let api = self.claims();
        if let Some(claim) = self.find_claim(&req.node).await? {
            let name = claim.metadata.name.clone().unwrap_or_default();
            if claim.metadata.deletion_timestamp.is_none() {
                tracing::info!(node = %req.node, nodeclaim = %name, request = %req.request_id, "drain over: deleting the old NodeClaim");
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                    Err(source) => return Err(kube_err("deleting NodeClaim", &req.node, source)),
                }
            }
        }
        Ok(())
    }

    /// A pre-spun replacement no longer wanted (the repair was released before its `replace`):
    /// lifts the `do-not-disrupt` of the new claim and node, so that Karpenter's consolidation
    /// may take it like any other, and the request's mark from the old claim. Deletes nothing:
    /// the pods the drain moved may run there already. A claim not launched yet is waited for
    /// (up to [`ABANDON_WAIT`]): a launch in flight may still create its node from the claim as it
    /// was, mark included (the KWOK provider's `toNode` copies the claim's annotations).
    async fn abandon_twins(&self, req: &ReplacementRequest) -> Result<(), ProviderError> {
        let until = tokio::time::Instant::now() + ABANDON_WAIT;
        while !self.free_twins(req).await? && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        if let Some(claim) = self.find_claim(&req.node).await? {
            let marked = claim
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(REQUEST_ANNOTATION));
            if marked == Some(&req.request_id) {
                let name = claim.metadata.name.clone().unwrap_or_default();
                self.annotate(&self.claims(), &name, &req.node, REQUEST_ANNOTATION, None)
                    .await?;
            }
        }
        tracing::info!(node = %req.node, request = %req.request_id, "replacement abandoned: its NodeClaim is Karpenter's to keep or consolidate");
        crate::sync::lock(&self.tickets).remove(&req.request_id);
        Ok(())
    }

    /// Lifts `do-not-disrupt` from every NodeClaim created to replace `req.node`, and from its
    /// node: the one registered (`status.nodeName`) or, before registration, the node of the
    /// pool with its `status.providerID` (Karpenter's KWOK provider creates it at launch). Whether
    /// every such claim was launched (had a provider id) when looked at.
    async fn free_twins(&self, req: &ReplacementRequest) -> Result<bool, ProviderError> {
        let api = self.claims();
        let twins = api
            .list(&ListParams::default().labels(&format!("{REPLACES_LABEL}={}", req.node)))
            .await
            .map_err(|source| kube_err("listing replacement NodeClaims", &req.node, source))?;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let mut launched = true;
        for twin in twins.items {
            let name = twin.metadata.name.clone().unwrap_or_default();
            if has_annotation(&twin.metadata, DO_NOT_DISRUPT) {
                self.annotate(&api, &name, &req.node, DO_NOT_DISRUPT, None)
                    .await?;
            }
            let status = |k: &str| twin.data.pointer(k).and_then(|v| v.as_str());
            let node = match (status("/status/nodeName"), status("/status/providerID")) {
                (Some(n), _) => nodes
                    .get_opt(n)
                    .await
                    .map_err(|source| kube_err("reading replacement node", &req.node, source))?,
                (None, Some(id)) => {
                    let pool = twin
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(POOL_LABEL));
                    self.pool_nodes(pool.map(String::as_str), &req.node)
                        .await?
                        .into_iter()
                        .find(|n| {
                            n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(id)
                        })
                }
                (None, None) => {
                    launched = false;
                    None
                }
            };
            if let Some(n) = node.filter(|n| has_annotation(&n.metadata, DO_NOT_DISRUPT)) {
                let node_name = n.metadata.name.clone().unwrap_or_default();
                self.annotate(&nodes, &node_name, &req.node, DO_NOT_DISRUPT, None)
                    .await?;
            }
        }
        Ok(launched)
    }

    /// Sets (`Some`) or removes (`None`) one annotation of `name` (404: nothing to do).
    async fn annotate<K>(
        &self,
        api: &Api<K>,
        name: &str,
        node: &str,
        key: &str,
        value: Option<&str>,
    ) -> Result<(), ProviderError>
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let patch = json!({"metadata": {"annotations": {key: value}}});
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(source) => Err(kube_err("annotating", node, source)),
        }
    }

    async fn ready(&self, t: &ReplacementTicket) -> Result<Option<String>, ProviderError> {
        let nodes = self.pool_nodes(t.pool.as_deref(), &t.node).await?;
        Ok(new_ready_node(nodes, t))
    }
}

/// Labels of the old claim that belong to its instance, not to its shape, and are not copied:
/// the hostname (Karpenter's one restricted label; its launch records the provider's value on
/// the claim, e.g. the KWOK provider's claim name, and its registration copies claim labels onto
/// the Node, so a copy would give the new node the old one's hostname and every pod with a
/// hostname anti-affinity to the old node's pods would refuse it) and Karpenter's lifecycle marks.
pub const PER_INSTANCE_LABELS: [&str; 3] = [
    "kubernetes.io/hostname",
    "karpenter.sh/registered",
    "karpenter.sh/initialized",
];

/// The replacement claim's name: the old claim's, then `-nk` and 10 hex digits of the request id
/// (cut so that the whole stays a valid name of at most 63 characters, as Node names from it must).
pub fn twin_name(old: &str, request_id: &str) -> String {
    let digest = hex::encode(sha2::Sha256::digest(request_id.as_bytes()));
    let suffix = format!("-nk{}", &digest[..10]);
    let keep = 63 - suffix.len();
    let base: String = old.chars().take(keep).collect();
    format!("{}{suffix}", base.trim_end_matches(['-', '.']))
}

/// The NodeClaim that replaces `old`: its spec, labels (but [`PER_INSTANCE_LABELS`]) and NodePool
/// hash annotations, owner references; labelled with the node it replaces, annotated with the request that created it and
/// `do-not-disrupt`; no status, no finalizers (Karpenter adds its own).
pub fn twin_of(old: &DynamicObject, name: &str, req: &ReplacementRequest) -> DynamicObject {
    let mut labels = old.metadata.labels.clone().unwrap_or_default();
    labels.retain(|k, _| !PER_INSTANCE_LABELS.contains(&k.as_str()));
    labels.insert(REPLACES_LABEL.into(), req.node.clone());
    let mut annotations: BTreeMap<String, String> = old
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| k.starts_with("karpenter.sh/nodepool-hash"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    annotations.insert(CREATED_BY_REQUEST_ANNOTATION.into(), req.request_id.clone());
    annotations.insert(DO_NOT_DISRUPT.into(), "true".into());
    let mut twin = DynamicObject::new(name, &nodeclaim_resource());
    twin.metadata = ObjectMeta {
        name: Some(name.to_string()),
        labels: Some(labels),
        annotations: Some(annotations),
        owner_references: old.metadata.owner_references.clone(),
        ..ObjectMeta::default()
    };
    twin.data = json!({ "spec": old.data.get("spec").cloned().unwrap_or_else(|| json!({})) });
    twin
}

fn has_annotation(m: &ObjectMeta, key: &str) -> bool {
    m.annotations.as_ref().is_some_and(|a| a.contains_key(key))
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

    fn retire<'a>(
        &'a self,
        req: &'a ReplacementRequest,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(self.retire_node(req))
    }

    fn abandon<'a>(
        &'a self,
        req: &'a ReplacementRequest,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(self.abandon_twins(req))
    }
}

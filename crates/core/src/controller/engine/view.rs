//! The cluster as the policy sees it: Nodes from the cache (or the engine's fresher patch answers)
//! with what only the engine knows (notices, drains, nodes seen Ready).

use super::*;

/// Converts a Kubernetes time.
pub(crate) fn time(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> DateTime<Utc> {
    DateTime::from_timestamp(t.0.as_second(), t.0.subsec_nanosecond().max(0) as u32)
        .unwrap_or_default()
}

/// A Node as the policy sees it (without notices, drain and pods).
pub fn node_view(n: &Node) -> Option<NodeView> {
    let name = n.metadata.name.clone()?;
    let created_at = n
        .metadata
        .creation_timestamp
        .as_ref()
        .map(time)
        .unwrap_or_default();
    let spec = n.spec.as_ref();
    let status = n.status.as_ref();
    let conditions: Vec<ConditionView> = status
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| {
            cs.iter()
                .map(|c| ConditionView {
                    type_: c.type_.clone(),
                    status: c.status.clone(),
                    last_transition_time: c
                        .last_transition_time
                        .as_ref()
                        .map(time)
                        .unwrap_or(created_at),
                    reason: c.reason.clone().unwrap_or_default(),
                    message: c.message.clone().unwrap_or_default(),
                    last_heartbeat_time: c.last_heartbeat_time.as_ref().map(time),
                })
                .collect()
        })
        .unwrap_or_default();
    let ready = conditions.iter().find(|c| c.type_ == "Ready");
    let annotations = n.metadata.annotations.clone().unwrap_or_default();
    let became_ready = became_ready(created_at, ready, &annotations);
    Some(NodeView {
        name,
        labels: n.metadata.labels.clone().unwrap_or_default(),
        annotations,
        created_at,
        deleting: n.metadata.deletion_timestamp.is_some(),
        unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
        taints: spec
            .and_then(|s| s.taints.as_ref())
            .map(|ts| {
                ts.iter()
                    .map(|t| TaintView {
                        key: t.key.clone(),
                        value: t.value.clone().unwrap_or_default(),
                        effect: t.effect.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        conditions,
        became_ready,
        boot_id: status
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.boot_id.clone())
            .filter(|b| !b.is_empty()),
        agent_boot_id: None,
        notices: Vec::new(),
        drain: Default::default(),
        pods: Vec::new(),
    })
}

impl Engine {
    /// One node as the policy sees it now (the cache or our fresher patch result, its notices,
    /// its drain), without building the whole cluster.
    pub fn node_now(&self, name: &str) -> Option<NodeView> {
        let cached = self
            .store
            .get(&kube::runtime::reflector::ObjectRef::<Node>::new(name))?;
        self.view_of(&cached)
    }

    /// One cached Node as the policy sees it: our fresher patch answer if there is one, with
    /// what only the engine knows ([`Self::complete`]).
    pub(super) fn view_of(&self, cached: &Node) -> Option<NodeView> {
        let fresh = self.actor.fresher(cached);
        let mut v = node_view(fresh.as_deref().unwrap_or(cached))?;
        self.complete(&mut v);
        Some(v)
    }

    /// Adds what only the engine knows to a node built by [`node_view`].
    pub(super) fn complete(&self, v: &mut NodeView) {
        v.notices = self.notices(&v.name);
        v.agent_boot_id = lock(&self.agent_boots).get(&v.name).cloned();
        v.drain = self.drains.view(&v.name);
        let mut seen = lock(&self.seen_ready);
        if v.is_ready() && !seen.contains(&v.name) {
            seen.insert(v.name.clone());
        }
        v.became_ready |= seen.contains(&v.name);
    }

    /// `v` and the other nodes of its Karpenter NodePool as the policy sees them now (only `v`
    /// when it has none).
    pub(super) fn pool_of(&self, v: NodeView) -> Vec<NodeView> {
        let Some(pool) = v.labels.get(POOL_LABEL).cloned() else {
            return vec![v];
        };
        let mut out: Vec<NodeView> = self
            .store
            .state()
            .iter()
            .filter(|n| {
                n.metadata.name.as_deref() != Some(v.name.as_str())
                    && n.metadata.labels.as_ref().and_then(|l| l.get(POOL_LABEL)) == Some(&pool)
            })
            .filter_map(|n| self.view_of(n))
            .collect();
        out.push(v);
        out
    }

    /// The cluster as of now.
    pub fn view(&self, now: DateTime<Utc>) -> ClusterView {
        let nodes: Vec<NodeView> = self
            .store
            .state()
            .iter()
            .filter_map(|n| self.view_of(n))
            .collect();
        let alive: BTreeMap<String, ()> = nodes.iter().map(|n| (n.name.clone(), ())).collect();
        self.prune_notices(&alive, now);
        self.drains.retain(|n| alive.contains_key(n));
        self.actor.retain(|n| alive.contains_key(n));
        lock(&self.seen_ready).retain(|n| alive.contains_key(n));
        lock(&self.agent_boots).retain(|n, _| alive.contains_key(n));
        self.order.retain(|n| alive.contains_key(n));
        ClusterView {
            nodes,
            nodepools: self.nodepool_budgets(),
        }
    }

    /// The budgets of the cached NodePools (none without `[budgets] source = "nodepool"`).
    pub(super) fn nodepool_budgets(
        &self,
    ) -> BTreeMap<String, crate::controller::policy::nodepool::PoolBudgets> {
        self.nodepools
            .as_ref()
            .map(crate::controller::state::nodepools::budgets)
            .unwrap_or_default()
    }
}

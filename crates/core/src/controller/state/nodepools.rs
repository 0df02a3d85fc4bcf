//! The NodePool cache of `[budgets] source = "nodepool"`: a reflector on Karpenter's NodePools
//! (`karpenter.sh/v1`, `nodepools`, via `DynamicObject`), started with the engine; the engine
//! reads each NodePool's `spec.disruption.budgets` into the policy's
//! [`ClusterView::nodepools`](crate::controller::policy::view::ClusterView) (parsed by the pure
//! [`crate::controller::policy::nodepool`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use kube::api::{Api, ListParams};
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::reflector::{store::Writer, Store};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use tokio_util::sync::CancellationToken;

use crate::controller::cluster::supervise::Tasks;
use crate::controller::policy::nodepool::{read_budgets, PoolBudgets};

/// The NodePool resource (`karpenter.sh/v1`).
pub fn nodepool_resource() -> ApiResource {
    ApiResource {
        group: "karpenter.sh".into(),
        version: "v1".into(),
        api_version: "karpenter.sh/v1".into(),
        kind: "NodePool".into(),
        plural: "nodepools".into(),
    }
}

/// Why the NodePools cannot be watched.
#[derive(Debug, thiserror::Error)]
pub enum NodePoolsError {
    /// The API server does not serve `karpenter.sh/v1` `nodepools` (Karpenter is not installed).
    #[error(
        "[budgets] source = \"nodepool\" needs Karpenter's NodePool CRD, but the API server does \
         not serve karpenter.sh/v1 nodepools (404): install Karpenter or set source = \"config\""
    )]
    CrdMissing {
        /// The 404.
        #[source]
        source: kube::Error,
    },
    /// Listing NodePools failed otherwise (forbidden: the ClusterRole needs list and watch on
    /// `karpenter.sh` `nodepools`).
    #[error("[budgets] source = \"nodepool\": cannot list karpenter.sh/v1 nodepools")]
    List {
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

/// Checks that NodePools can be listed, then watches them in the supervised task
/// `nodepool watch` (a change wakes the engine).
pub async fn watch(
    client: kube::Client,
    tasks: &mut Tasks,
    cancel: CancellationToken,
    wake: Arc<tokio::sync::Notify>,
) -> Result<Store<DynamicObject>, NodePoolsError> {
    let res = nodepool_resource();
    let api: Api<DynamicObject> = Api::all_with(client, &res);
    match api.list(&ListParams::default().limit(1)).await {
        Ok(_) => {}
        // An API group the server does not serve answers a plain-text "404 page not found"
        // (no Status object, so reason is not NotFound): the code is what tells.
        Err(kube::Error::Api(s)) if s.code == 404 => {
            return Err(NodePoolsError::CrdMissing {
                source: kube::Error::Api(s),
            })
        }
        Err(source) => return Err(NodePoolsError::List { source }),
    }
    let writer = Writer::new(res);
    let store = writer.as_reader();
    let stream = reflector(
        writer,
        watcher(
            api,
            watcher::Config::default().timeout(crate::k8s::watch_timeout_secs()),
        )
        .default_backoff(),
    )
    .applied_objects();
    tasks.spawn("nodepool watch", async move {
        let mut s = std::pin::pin!(stream);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                item = s.next() => match item {
                    Some(Err(e)) => tracing::warn!(error = %e, "nodepool watch error"),
                    Some(Ok(_)) => wake.notify_one(),
                    None => return,
                },
            }
        }
    });
    Ok(store)
}

/// The budgets of every cached NodePool, by name.
pub fn budgets(store: &Store<DynamicObject>) -> BTreeMap<String, PoolBudgets> {
    store
        .state()
        .iter()
        .filter_map(|o| {
            let name = o.metadata.name.clone()?;
            let b = read_budgets(&name, o.data.pointer("/spec/disruption/budgets"));
            Some((name, b))
        })
        .collect()
}

//! The cluster the demo plays on: the embedded sim, or a real API server ([`super::real`]).

use std::path::Path;
use std::sync::Arc;

use super::agents::{Credentials, SimCredentials};
use super::real::RealCluster;
use super::DemoError;
use crate::apiserver::TestCluster;
use nodekeeper_core::controller::act::provider::ProviderConfig;

/// The demo's cluster.
pub enum Backend {
    /// The sim API server with its control loops (kubelets, scheduler, Karpenter-like
    /// provisioner); nodekeeper runs with the sim's tokens.
    Sim(TestCluster),
    /// A real control plane with KWOK; nodekeeper runs as its ServiceAccounts.
    Real(Arc<RealCluster>),
}

impl Backend {
    /// The admin client: seeding, faults, watching.
    pub fn admin(&self) -> kube::Client {
        match self {
            Backend::Sim(c) => c.client.clone(),
            Backend::Real(c) => c.admin.clone(),
        }
    }

    /// One line naming the API server.
    pub fn describe(&self) -> String {
        match self {
            Backend::Sim(c) => format!("sim API server {}", c.url),
            Backend::Real(c) => format!("kube-apiserver {} at {}", c.version, c.server),
        }
    }

    /// The controller's client: on a real cluster, as the `nodekeeper-controller`
    /// ServiceAccount.
    pub async fn controller_client(&self) -> Result<kube::Client, DemoError> {
        match self {
            Backend::Sim(c) => Ok(c.client.clone()),
            Backend::Real(c) => c.controller_client().await,
        }
    }

    /// The replacement provider: Karpenter (the sim's Karpenter-like loop) or the webhook to
    /// the real backend's cloud stand-in; `user` wins when it names one.
    pub fn provider(&self, user: &ProviderConfig) -> ProviderConfig {
        match (self, user) {
            (Backend::Sim(_), ProviderConfig::None) => ProviderConfig::Karpenter,
            // No Karpenter in this cluster (yet): its cloud stand-in answers instead.
            (Backend::Real(c), ProviderConfig::None | ProviderConfig::Karpenter) => c.provider(),
            (_, p) => p.clone(),
        }
    }

    /// Sets `node`'s Ready condition as its kubelet would.
    pub async fn set_ready(&self, node: &str, status: &str) -> Result<(), String> {
        match self {
            Backend::Sim(c) => super::cluster::set_ready(&c.admin_url(""), node, status).await,
            Backend::Real(c) => c.set_ready(node, status).await,
        }
    }

    /// How a fault reaches the cluster, for the timeline.
    pub fn fault_path(&self) -> &'static str {
        match self {
            Backend::Sim(_) => "injected through the sim's admin API",
            Backend::Real(_) => "posted to the node's status as its kubelet would",
        }
    }

    /// How a replaced node goes and its successor comes, for the timeline.
    pub fn replacement_path(&self) -> &'static str {
        match self {
            Backend::Sim(_) => "NodeClaim deleted, new node Ready",
            Backend::Real(_) => {
                "webhook → cloud stand-in: new KWOK node Ready, old one terminated once drained"
            }
        }
    }

    /// Where the agents' tokens come from (`kubeconfig`: the sim's, written by the demo).
    pub fn credentials(&self, kubeconfig: &Path) -> Arc<dyn Credentials> {
        match self {
            Backend::Sim(c) => {
                Arc::new(SimCredentials::new(c.sim.clone(), kubeconfig.to_path_buf()))
            }
            Backend::Real(c) => c.clone(),
        }
    }
}

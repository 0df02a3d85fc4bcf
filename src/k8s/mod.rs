//! Kubernetes helpers shared by the agent, the controller and the sim.

/// Label and field selectors in their query-string syntax (`k=v,k2 in (a,b),!k3`).
pub use crate::sim::apiserver::selectors;

//! Kubernetes helpers shared by the agent, the controller and the sim.

pub mod selectors;
pub mod validation;

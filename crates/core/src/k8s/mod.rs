//! Kubernetes helpers shared by the agent, the controller, the commands and the sim.

pub mod client;
pub mod selectors;
pub mod validation;

//! The node agent.

pub mod crio;
pub mod sources;

//! The node agent.

pub mod checks;
pub mod crio;

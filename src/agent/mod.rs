//! The node agent.

pub mod crio;

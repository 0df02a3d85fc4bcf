//! How the engine's decisions reach the cluster: the actor ([`actions`]), drains ([`drain`]),
//! replacement requests ([`provider`]) and notifications ([`notify`]).

pub mod actions;
pub mod drain;
pub mod notify;
pub mod provider;

//! How the engine's decisions reach the cluster: the actor ([`actions`]), drains ([`drain`]),
//! replacement requests ([`provider`]), notifications ([`notify`]) and the record of it all
//! ([`history`]).

pub mod actions;
pub mod drain;
pub mod history;
pub mod notify;
pub mod provider;

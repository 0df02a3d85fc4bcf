pub mod drain;
pub mod provider;

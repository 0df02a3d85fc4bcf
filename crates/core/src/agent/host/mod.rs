//! The agent's boundary to the host's service managers, over the system D-Bus.
//!
//! - [`systemd`]: the systemd manager ([`systemd::UnitManager`]: unit status, restart with job
//!   tracking), used by the CRI-O apply engine and the unit health checks.
//! - [`logind`]: the shutdown watcher (a logind delay inhibitor lock and `PrepareForShutdown`).
//! - [`fake`]: a scripted [`systemd::UnitManager`] for unit tests.

pub mod fake;
pub mod logind;
pub mod systemd;

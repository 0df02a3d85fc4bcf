//! Post-bootstrap CRI-O configuration: validated drop-ins, atomic writes, restart over systemd
//! D-Bus only on change, rollback on failure.
//!
//! - [`config`]: the `[crio]` section ([`CrioConfig`], [`DropIn`]);
//! - [`lint`]: validation of `[crio]` (names, TOML, `short_name_mode`, version gates, unknown keys);
//! - [`apply`]: plan and apply, with rollback;
//! - [`runtime`]: what the running CRI-O says on its socket (CRI version, live configuration);
//! - [`state`]: ownership record and the transaction in flight;
//! - [`fsops`](crate::agent::fsops): atomic file operations.

pub mod apply;
pub mod config;
pub mod lint;
pub mod runtime;
pub mod state;

pub use config::{CrioConfig, DropIn};

//! The agent's boundary to the host's service managers, over the system D-Bus.
//!
//! - [`systemd`]: the systemd manager ([`systemd::UnitManager`]: unit status, restart with job
//!   tracking), used by the CRI-O apply engine and the unit health checks.
//! - [`logind`]: the shutdown watcher (a logind delay inhibitor lock and `PrepareForShutdown`).
//! - [`journal`]: a unit's own last error line, where the journal is readable;
//! - [`fake`]: a scripted [`systemd::UnitManager`] for unit tests.

pub mod fake;
pub mod journal;
pub mod logind;
pub mod systemd;

/// The system bus nodekeeper dials when `DBUS_SYSTEM_BUS_ADDRESS` is unset: systemd's and
/// dbus-broker's socket, `/run/dbus/system_bus_socket`. The D-Bus library default,
/// `/var/run/dbus/…`, reaches it only through the `/var/run → /run` link a host has and a
/// `FROM scratch` agent image has not: the DaemonSet mounts the host's `/run/dbus` at `/run/dbus`.
pub const DEFAULT_SYSTEM_BUS: &str = "unix:path=/run/dbus/system_bus_socket";

/// The system bus address: `DBUS_SYSTEM_BUS_ADDRESS` (the standard D-Bus variable, read here as
/// the D-Bus library would), else [`DEFAULT_SYSTEM_BUS`].
pub fn system_bus_address() -> String {
    std::env::var("DBUS_SYSTEM_BUS_ADDRESS")
        .ok()
        .filter(|a| !a.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_SYSTEM_BUS.to_string())
}

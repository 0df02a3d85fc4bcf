//! The systemd manager over the system D-Bus (zbus): unit status and restarts tracked to the end of
//! their job.
//!
//! The restart follows the documented recipe: `Subscribe()`, add the `JobRemoved` match rule,
//! only then `RestartUnit(unit, "replace")`, wait for the `JobRemoved` of that job, and read the
//! unit's `ActiveState`/`SubState`, all within one timeout.

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use zbus::{Connection, OwnedObjectPath};

/// D-Bus error name systemd answers for a unit that does not exist.
const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";
/// D-Bus error name systemd answers to a second `Subscribe()` from the same connection.
const ALREADY_SUBSCRIBED: &str = "org.freedesktop.systemd1.AlreadySubscribed";

/// `org.freedesktop.systemd1.Manager`, the parts nodekeeper uses.
#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1"
)]
pub trait Manager {
    /// Ask the manager to emit job and unit signals to this connection.
    fn subscribe(&self) -> zbus::Result<()>;
    /// Load `name` (if needed) and return its object path; never fails for unknown names.
    fn load_unit(&self, name: &str) -> zbus::Result<OwnedObjectPath>;
    /// Queue a restart job for `name`; returns the job's object path.
    fn restart_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    /// Clear the failed state of `name` and its start-rate counter.
    fn reset_failed_unit(&self, name: &str) -> zbus::Result<()>;
    /// Queue a start job for `name`; returns the job's object path.
    fn start_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    /// A job finished: its id, object path, unit and result (`done`, `failed`, ...).
    #[zbus(signal)]
    fn job_removed(
        &self,
        id: u32,
        job: OwnedObjectPath,
        unit: String,
        result: String,
    ) -> zbus::Result<()>;
    /// `initializing`, `starting`, `running`, `degraded`, `maintenance` or `stopping`.
    #[zbus(property(emits_changed_signal = "false"))]
    fn system_state(&self) -> zbus::Result<String>;
}

/// `org.freedesktop.systemd1.Unit`, read without a property cache (values are always fresh).
#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Unit",
    default_service = "org.freedesktop.systemd1"
)]
pub trait Unit {
    /// `loaded`, `not-found`, `masked`, `error`, ...
    #[zbus(property(emits_changed_signal = "false"))]
    fn load_state(&self) -> zbus::Result<String>;
    /// `active`, `failed`, `activating`, `inactive`, ...
    #[zbus(property(emits_changed_signal = "false"))]
    fn active_state(&self) -> zbus::Result<String>;
    /// Unit-type specific state, e.g. `running`, `dead`, `failed`, `start-pre`.
    #[zbus(property(emits_changed_signal = "false"))]
    fn sub_state(&self) -> zbus::Result<String>;
    /// CLOCK_REALTIME µs of the last entry into the active state.
    #[zbus(property(emits_changed_signal = "false"))]
    fn active_enter_timestamp(&self) -> zbus::Result<u64>;
}

/// `org.freedesktop.systemd1.Service`, the service-specific properties nodekeeper reads.
#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Service",
    default_service = "org.freedesktop.systemd1"
)]
pub trait Service {
    /// Number of automatic restarts (`Restart=`) since the unit was loaded.
    #[zbus(property(emits_changed_signal = "false"), name = "NRestarts")]
    fn n_restarts(&self) -> zbus::Result<u32>;
    /// PID of the main process, 0 if none.
    #[zbus(property(emits_changed_signal = "false"), name = "MainPID")]
    fn main_pid(&self) -> zbus::Result<u32>;
    /// Why the service last failed: `success`, `exit-code`, `start-limit-hit`, `timeout`, ...
    #[zbus(property(emits_changed_signal = "false"))]
    fn result(&self) -> zbus::Result<String>;
}

/// Errors talking to systemd; each names the bus address or the unit and the method.
#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    /// The system bus could not be reached (no socket, refused, authentication failed).
    #[error("cannot connect to the system D-Bus at {address}: {source}")]
    Connect {
        /// The bus address tried.
        address: String,
        /// The underlying zbus error.
        #[source]
        source: zbus::Error,
    },
    /// systemd does not know the unit (`LoadState` `not-found`, or `NoSuchUnit`).
    #[error("systemd unit {unit} not found")]
    NoSuchUnit {
        /// The unit name.
        unit: String,
    },
    /// A D-Bus call failed.
    #[error("systemd {method} on unit {unit} failed: {source}")]
    Call {
        /// The unit name.
        unit: String,
        /// The D-Bus method or property.
        method: &'static str,
        /// The underlying zbus error.
        #[source]
        source: zbus::Error,
    },
    /// The operation did not finish in time.
    #[error("systemd restart of unit {unit} did not finish within {}", humantime::format_duration(*.timeout))]
    Timeout {
        /// The unit name.
        unit: String,
        /// The time allowed.
        timeout: Duration,
    },
}

/// The state of one unit, as systemd reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitStatus {
    /// `LoadState`: `loaded`, `not-found`, `masked`, ...
    pub load_state: String,
    /// `ActiveState`: `active`, `failed`, `activating`, ...
    pub active_state: String,
    /// `SubState`: `running`, `dead`, `failed`, ...
    pub sub_state: String,
    /// `NRestarts` of the Service interface (automatic restarts), 0 for other unit types.
    pub n_restarts: u32,
}

/// The end of a restart job and the unit's state right after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartOutcome {
    /// The job result from `JobRemoved`: `done`, `failed`, `timeout`, `canceled`, `dependency`,
    /// `skipped`.
    pub job_result: String,
    /// The unit's state read after the job was removed.
    pub status: UnitStatus,
}

impl RestartOutcome {
    /// True when the job finished `done` and the unit is `active`.
    pub fn succeeded(&self) -> bool {
        self.job_result == "done" && self.status.active_state == "active"
    }
}

/// The narrow systemd interface the CRI-O apply engine (and the unit checks) use.
pub trait UnitManager {
    /// LoadState/ActiveState/SubState/NRestarts of `unit` (after `LoadUnit`, so unloaded units are
    /// found); a unit whose LoadState is `not-found` is [`SystemdError::NoSuchUnit`].
    fn status(&self, unit: &str) -> impl Future<Output = Result<UnitStatus, SystemdError>> + Send;
    /// Restart `unit` (`RestartUnit(unit, "replace")`), wait for the `JobRemoved` of that job and
    /// read the unit's state, all within `timeout` ([`SystemdError::Timeout`] otherwise).
    fn restart(
        &self,
        unit: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<RestartOutcome, SystemdError>> + Send;
    /// Clear the unit's failed state and its start-rate counter (`ResetFailedUnit`), so a restart
    /// right after several failed ones is not refused by `StartLimitBurst` (default: 5 starts in
    /// 10 s). The default implementation does nothing.
    fn reset_failed(&self, unit: &str) -> impl Future<Output = Result<(), SystemdError>> + Send {
        let _ = unit;
        async { Ok(()) }
    }
}

/// A connection to a systemd manager on a D-Bus bus.
#[derive(Debug, Clone)]
pub struct Systemd {
    conn: Connection,
}

impl Systemd {
    /// Connect to the system bus at [`super::system_bus_address`].
    pub async fn connect_system() -> Result<Self, SystemdError> {
        Self::connect_address(&super::system_bus_address()).await
    }

    /// Connect to the bus at `addr` (a D-Bus address such as `unix:path=/run/dbus/system_bus_socket`).
    pub async fn connect_address(addr: &str) -> Result<Self, SystemdError> {
        Self::connect(zbus::connection::Builder::address(addr), addr.to_string()).await
    }

    async fn connect(
        builder: zbus::connection::Builder<'_>,
        address: String,
    ) -> Result<Self, SystemdError> {
        let conn = builder
            .build()
            .await
            .map_err(|source| SystemdError::Connect { address, source })?;
        Ok(Self { conn })
    }

    /// The underlying D-Bus connection (for other proxies on the same bus).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The manager proxy.
    pub async fn manager(&self) -> zbus::Result<ManagerProxy<'static>> {
        ManagerProxy::new(&self.conn).await
    }

    /// `SystemState` of the manager (`running` once boot finished).
    pub async fn system_state(&self) -> zbus::Result<String> {
        self.manager().await?.system_state().await
    }

    /// Reboots the machine the orderly way: `StartUnit("reboot.target", "replace-irreversibly")`
    /// (units stop normally, shutdown inhibitors apply). Returns once the job is queued.
    pub async fn reboot(&self) -> Result<(), SystemdError> {
        const UNIT: &str = "reboot.target";
        let manager = self.manager().await.map_err(call_err(UNIT, "StartUnit"))?;
        manager
            .start_unit(UNIT, "replace-irreversibly")
            .await
            .map_err(call_err(UNIT, "StartUnit"))?;
        Ok(())
    }

    /// The unit proxy for `unit`, after `LoadUnit`; errors if the unit is `not-found`.
    pub async fn unit(&self, unit: &str) -> Result<UnitProxy<'static>, SystemdError> {
        let path = self.load_unit(unit).await?;
        unit_proxy(&self.conn, unit, path).await
    }

    async fn load_unit(&self, unit: &str) -> Result<OwnedObjectPath, SystemdError> {
        let manager = self.manager().await.map_err(call_err(unit, "LoadUnit"))?;
        manager
            .load_unit(unit)
            .await
            .map_err(call_err(unit, "LoadUnit"))
    }

    async fn read_status(
        &self,
        unit: &str,
        path: OwnedObjectPath,
    ) -> Result<UnitStatus, SystemdError> {
        let proxy = unit_proxy(&self.conn, unit, path.clone()).await?;
        let load_state = proxy
            .load_state()
            .await
            .map_err(call_err(unit, "Get(LoadState)"))?;
        if load_state == "not-found" {
            return Err(SystemdError::NoSuchUnit {
                unit: unit.to_string(),
            });
        }
        let active_state = proxy
            .active_state()
            .await
            .map_err(call_err(unit, "Get(ActiveState)"))?;
        let sub_state = proxy
            .sub_state()
            .await
            .map_err(call_err(unit, "Get(SubState)"))?;
        let n_restarts = self.n_restarts(unit, path).await?;
        Ok(UnitStatus {
            load_state,
            active_state,
            sub_state,
            n_restarts,
        })
    }

    async fn n_restarts(&self, unit: &str, path: OwnedObjectPath) -> Result<u32, SystemdError> {
        if !unit.ends_with(".service") {
            return Ok(0);
        }
        let proxy = ServiceProxy::builder(&self.conn)
            .path(path)
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .map_err(call_err(unit, "Get(NRestarts)"))?;
        proxy
            .n_restarts()
            .await
            .map_err(call_err(unit, "Get(NRestarts)"))
    }

    async fn subscribe(&self, manager: &ManagerProxy<'_>, unit: &str) -> Result<(), SystemdError> {
        match manager.subscribe().await {
            Err(zbus::Error::MethodError(name, _, _)) if name.as_str() == ALREADY_SUBSCRIBED => {
                Ok(())
            }
            other => other.map_err(call_err(unit, "Subscribe")),
        }
    }

    async fn restart_untimed(&self, unit: &str) -> Result<RestartOutcome, SystemdError> {
        let manager = self.manager().await.map_err(call_err(unit, "Subscribe"))?;
        self.subscribe(&manager, unit).await?;
        // The match rule is in place once the stream exists: no JobRemoved can be missed.
        let mut removed = manager
            .receive_job_removed()
            .await
            .map_err(call_err(unit, "AddMatch(JobRemoved)"))?;
        let job = manager
            .restart_unit(unit, "replace")
            .await
            .map_err(|source| unit_call_err(unit, "RestartUnit", source))?;
        let job_result = loop {
            let Some(signal) = removed.next().await else {
                return Err(SystemdError::Call {
                    unit: unit.to_string(),
                    method: "JobRemoved",
                    source: zbus::Error::Failure(
                        "the bus connection closed before the job finished".into(),
                    ),
                });
            };
            let args = signal.args().map_err(call_err(unit, "JobRemoved"))?;
            if args.job == job {
                break args.result;
            }
        };
        let path = self.load_unit(unit).await?;
        let status = self.read_status(unit, path).await?;
        Ok(RestartOutcome { job_result, status })
    }
}

impl UnitManager for Systemd {
    async fn status(&self, unit: &str) -> Result<UnitStatus, SystemdError> {
        let path = self.load_unit(unit).await?;
        self.read_status(unit, path).await
    }

    async fn restart(&self, unit: &str, timeout: Duration) -> Result<RestartOutcome, SystemdError> {
        tokio::time::timeout(timeout, self.restart_untimed(unit))
            .await
            .map_err(|_| SystemdError::Timeout {
                unit: unit.to_string(),
                timeout,
            })?
    }

    async fn reset_failed(&self, unit: &str) -> Result<(), SystemdError> {
        let manager = self
            .manager()
            .await
            .map_err(call_err(unit, "ResetFailedUnit"))?;
        manager
            .reset_failed_unit(unit)
            .await
            .map_err(|source| unit_call_err(unit, "ResetFailedUnit", source))
    }
}

async fn unit_proxy(
    conn: &Connection,
    unit: &str,
    path: OwnedObjectPath,
) -> Result<UnitProxy<'static>, SystemdError> {
    UnitProxy::builder(conn)
        .path(path)
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await
        .map_err(call_err(unit, "Unit proxy"))
}

/// A failed call about `unit`; systemd's `NoSuchUnit` reply becomes [`SystemdError::NoSuchUnit`].
fn unit_call_err(unit: &str, method: &'static str, source: zbus::Error) -> SystemdError {
    match &source {
        zbus::Error::MethodError(name, _, _) if name.as_str() == NO_SUCH_UNIT => {
            SystemdError::NoSuchUnit {
                unit: unit.to_string(),
            }
        }
        _ => SystemdError::Call {
            unit: unit.to_string(),
            method,
            source,
        },
    }
}

fn call_err<'a>(
    unit: &'a str,
    method: &'static str,
) -> impl FnOnce(zbus::Error) -> SystemdError + 'a {
    move |source| SystemdError::Call {
        unit: unit.to_string(),
        method,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(active: &str) -> UnitStatus {
        UnitStatus {
            load_state: "loaded".into(),
            active_state: active.into(),
            sub_state: "running".into(),
            n_restarts: 0,
        }
    }

    #[test]
    fn succeeded_needs_done_and_active() {
        let ok = RestartOutcome {
            job_result: "done".into(),
            status: status("active"),
        };
        assert!(ok.succeeded());
        let failed_job = RestartOutcome {
            job_result: "failed".into(),
            status: status("active"),
        };
        assert!(!failed_job.succeeded());
        let inactive = RestartOutcome {
            job_result: "done".into(),
            status: status("activating"),
        };
        assert!(!inactive.succeeded());
    }

    #[test]
    fn errors_name_unit_and_address() {
        let e = SystemdError::Timeout {
            unit: "crio.service".into(),
            timeout: Duration::from_secs(90),
        };
        assert_eq!(
            e.to_string(),
            "systemd restart of unit crio.service did not finish within 1m 30s"
        );
        let e = SystemdError::Connect {
            address: "unix:path=/nonexistent".into(),
            source: zbus::Error::Address("x".into()),
        };
        assert!(e
            .to_string()
            .starts_with("cannot connect to the system D-Bus at unix:path=/nonexistent: "));
    }
}

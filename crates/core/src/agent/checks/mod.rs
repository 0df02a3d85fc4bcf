//! Node health checks: one [`HealthCheck`] trait, one file per check, a flap guard
//! ([`debounce::Debounce`]) applied uniformly to every result, and a runner ([`Checks`]) the
//! agent loop calls on each tick.
//!
//! Every check reports node conditions ([`CheckResult`]: type, status, reason, message). The
//! kernel-log check can also report temporary [`CheckEvent`]s. The catalog of condition types and
//! reasons is documented in `docs/checks.md`.

pub mod config;
pub mod debounce;
pub mod disk;
pub mod kmsg;
pub mod memory;
pub mod pids;
mod runner;
pub mod runtime;
pub mod systemd_unit;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;

pub use crate::wire::{CheckEvent, CheckResult, ConditionStatus, EventSeverity};
pub use config::ChecksConfig;
pub use runner::{CheckFailure, Checks, Round};

/// What one run of one check produced.
#[derive(Debug, Default)]
pub struct CheckOutput {
    /// Conditions, one per condition type the check owns.
    pub conditions: Vec<CheckResult>,
    /// Temporary events seen since the previous run.
    pub events: Vec<CheckEvent>,
    /// Non-fatal problems (e.g. malformed kernel-log records skipped); the run still counts.
    pub problems: Vec<CheckError>,
}

impl From<Vec<CheckResult>> for CheckOutput {
    fn from(conditions: Vec<CheckResult>) -> Self {
        Self {
            conditions,
            events: Vec::new(),
            problems: Vec::new(),
        }
    }
}

/// Why a check could not produce a result. Each variant names what it was reading.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// A host file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A host file was read but its content is not what the kernel writes.
    #[error("cannot parse {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The kernel log could not be opened or read.
    #[error("kernel log {path}: {source}")]
    Kmsg {
        /// The device or file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The check did not finish in time.
    #[error("did not finish within {}", humantime::format_duration(*.timeout))]
    Timeout {
        /// The check's name.
        check: String,
        /// The time allowed (`[checks] check_timeout`).
        timeout: std::time::Duration,
    },
    /// The systemd manager could not be reached (no system bus, refused, ...).
    #[error("{source}")]
    Systemd {
        /// The connection error, naming the bus address.
        #[source]
        source: crate::agent::host::systemd::SystemdError,
    },
    /// A systemd unit could not be queried.
    #[error("systemd unit {unit}: {source}")]
    Unit {
        /// The unit, e.g. `kubelet.service`.
        unit: String,
        /// What failed (boxed: with the unit's name it would make every `CheckError` large).
        #[source]
        source: Box<crate::agent::host::systemd::SystemdError>,
    },
}

/// The future a [`HealthCheck`] returns (boxed so checks can live in one `Vec<Box<dyn _>>`).
pub type CheckFuture<'a> =
    Pin<Box<dyn Future<Output = Result<CheckOutput, CheckError>> + Send + 'a>>;

/// One health check. Implementations only observe; they never act on the node.
pub trait HealthCheck: Send {
    /// Stable name, e.g. `memory`; used in logs and [`CheckFailure`]s.
    fn name(&self) -> &str;
    /// The condition types this check reports, so a failed run can mark them `Unknown`.
    fn condition_types(&self) -> Vec<String>;
    /// Runs the check once.
    fn check(&mut self) -> CheckFuture<'_>;
}

/// Where the host's `/proc`, `/sys` and file systems are mounted (`/` on the host itself,
/// e.g. `/host` in a container with host mounts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoot(PathBuf);

impl HostRoot {
    /// A host root at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self(root.into())
    }

    /// The host path `abs` (absolute on the host) as seen from this process.
    pub fn join(&self, abs: impl AsRef<Path>) -> PathBuf {
        let abs = abs.as_ref();
        let rel = abs.strip_prefix("/").unwrap_or(abs);
        if rel.as_os_str().is_empty() {
            self.0.clone()
        } else {
            self.0.join(rel)
        }
    }

    /// The root itself.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Default for HostRoot {
    fn default() -> Self {
        Self::new("/")
    }
}

/// Reads a host file into a string with a [`CheckError::Read`] naming it.
pub(crate) fn read_host_file(path: &Path) -> Result<String, CheckError> {
    std::fs::read_to_string(path).map_err(|source| CheckError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// `1.5 GiB`-style rendering for messages.
pub(crate) fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_root_joins_absolute_paths() {
        assert_eq!(
            HostRoot::default().join("/proc/meminfo"),
            PathBuf::from("/proc/meminfo")
        );
        assert_eq!(
            HostRoot::new("/host").join("/proc/meminfo"),
            PathBuf::from("/host/proc/meminfo")
        );
        assert_eq!(HostRoot::new("/host").join("/"), PathBuf::from("/host"));
        assert_eq!(
            HostRoot::new("/host").join("var/lib"),
            PathBuf::from("/host/var/lib")
        );
    }

    #[test]
    fn human_bytes_picks_a_unit() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }
}

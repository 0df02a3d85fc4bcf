//! Disk check: free bytes **and** free inodes (statvfs) on each configured path, under
//! `host_root`. Two conditions, each aggregated over the paths:
//! - space: `DiskSpaceLow` (True), `DiskSpaceOk` (False);
//! - inodes: `InodesLow` (True), `InodesOk` (False);
//! - either, when no path is low but one cannot be read: `DiskPathNotFound` or `DiskStatFailed`
//!   (Unknown).

use std::path::PathBuf;

use nix::errno::Errno;

use super::config::DiskConfig;
use super::{human_bytes, CheckFuture, CheckResult, ConditionStatus, HealthCheck, HostRoot};

/// Space and inode figures of one file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsUsage {
    /// Bytes available to unprivileged users.
    pub free_bytes: u64,
    /// Size in bytes.
    pub total_bytes: u64,
    /// Inodes available to unprivileged users.
    pub free_inodes: u64,
    /// Total inodes (0: the file system has no inode limit, e.g. btrfs).
    pub total_inodes: u64,
}

/// What statvfs said about one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathState {
    /// Figures read.
    Usage(FsUsage),
    /// The path does not exist (on this host, or not mounted into the container).
    NotFound,
    /// statvfs failed for another reason.
    Failed(Errno),
}

/// Calls statvfs on `path`.
pub fn stat_path(path: &std::path::Path) -> PathState {
    match nix::sys::statvfs::statvfs(path) {
        Ok(s) => {
            let frsize = s.fragment_size();
            PathState::Usage(FsUsage {
                free_bytes: s.blocks_available().saturating_mul(frsize),
                total_bytes: s.blocks().saturating_mul(frsize),
                free_inodes: s.files_available(),
                total_inodes: s.files(),
            })
        }
        Err(Errno::ENOENT) | Err(Errno::ENOTDIR) => PathState::NotFound,
        Err(e) => PathState::Failed(e),
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        100.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// The disk check.
#[derive(Debug, Clone)]
pub struct DiskCheck {
    config: DiskConfig,
    host: HostRoot,
}

struct Verdict {
    low: Vec<String>,
    ok: Vec<String>,
    unknown: Vec<(&'static str, String)>,
}

impl Verdict {
    fn new() -> Self {
        Self {
            low: Vec::new(),
            ok: Vec::new(),
            unknown: Vec::new(),
        }
    }

    fn into_result(self, condition_type: &str, low_reason: &str, ok_reason: &str) -> CheckResult {
        let unknown_text = self.unknown.iter().map(|(_, m)| m.clone());
        if !self.low.is_empty() {
            let msg = self
                .low
                .into_iter()
                .chain(unknown_text)
                .collect::<Vec<_>>()
                .join("; ");
            return CheckResult::new(condition_type, ConditionStatus::True, low_reason, msg);
        }
        if let Some((reason, _)) = self.unknown.first() {
            let reason = *reason;
            let msg = unknown_text.chain(self.ok).collect::<Vec<_>>().join("; ");
            return CheckResult::new(condition_type, ConditionStatus::Unknown, reason, msg);
        }
        CheckResult::new(
            condition_type,
            ConditionStatus::False,
            ok_reason,
            self.ok.join("; "),
        )
    }
}

impl DiskCheck {
    /// A check of `config.paths` under `host`.
    pub fn new(config: DiskConfig, host: &HostRoot) -> Self {
        Self {
            config,
            host: host.clone(),
        }
    }

    /// The two conditions for per-path states (pure; `states` pairs each configured host path
    /// with what statvfs said).
    pub fn evaluate(&self, states: &[(PathBuf, PathState)]) -> Vec<CheckResult> {
        let c = &self.config;
        let (mut space, mut inodes) = (Verdict::new(), Verdict::new());
        for (path, state) in states {
            let p = path.display();
            let u = match state {
                PathState::Usage(u) => u,
                PathState::NotFound => {
                    let m = format!(
                        "{p}: path not found under host root {}",
                        self.host.path().display()
                    );
                    space.unknown.push(("DiskPathNotFound", m.clone()));
                    inodes.unknown.push(("DiskPathNotFound", m));
                    continue;
                }
                PathState::Failed(e) => {
                    let m = format!("{p}: statvfs failed: {e}");
                    space.unknown.push(("DiskStatFailed", m.clone()));
                    inodes.unknown.push(("DiskStatFailed", m));
                    continue;
                }
            };
            let pct = percent(u.free_bytes, u.total_bytes);
            let text = format!(
                "{p}: {} free of {} ({pct:.1}%)",
                human_bytes(u.free_bytes),
                human_bytes(u.total_bytes)
            );
            let low = (c.min_free_bytes.0 > 0 && u.free_bytes < c.min_free_bytes.0)
                || (c.min_free_percent > 0.0 && pct < c.min_free_percent);
            if low { &mut space.low } else { &mut space.ok }.push(text);
            let ipct = percent(u.free_inodes, u.total_inodes);
            let itext = if u.total_inodes == 0 {
                format!("{p}: no inode limit")
            } else {
                format!(
                    "{p}: {} inodes free of {} ({ipct:.1}%)",
                    u.free_inodes, u.total_inodes
                )
            };
            let ilow = c.min_free_inodes_percent > 0.0 && ipct < c.min_free_inodes_percent;
            if ilow {
                &mut inodes.low
            } else {
                &mut inodes.ok
            }
            .push(itext);
        }
        vec![
            space.into_result(&c.condition_type, "DiskSpaceLow", "DiskSpaceOk"),
            inodes.into_result(&c.inode_condition_type, "InodesLow", "InodesOk"),
        ]
    }

    /// statvfs on every configured path.
    pub fn read(&self) -> Vec<(PathBuf, PathState)> {
        self.config
            .paths
            .iter()
            .map(|p| (p.clone(), stat_path(&self.host.join(p))))
            .collect()
    }
}

impl HealthCheck for DiskCheck {
    fn name(&self) -> &str {
        "disk"
    }

    fn condition_types(&self) -> Vec<String> {
        vec![
            self.config.condition_type.clone(),
            self.config.inode_condition_type.clone(),
        ]
    }

    fn check(&mut self) -> CheckFuture<'_> {
        Box::pin(async move { Ok(self.evaluate(&self.read()).into()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::checks::config::ByteSize;
    use ConditionStatus::{False, True, Unknown};

    const GIB: u64 = 1 << 30;

    fn usage(free_gib: u64, total_gib: u64, free_inodes: u64, total_inodes: u64) -> PathState {
        PathState::Usage(FsUsage {
            free_bytes: free_gib * GIB,
            total_bytes: total_gib * GIB,
            free_inodes,
            total_inodes,
        })
    }

    fn eval(cfg: DiskConfig, states: Vec<(&str, PathState)>) -> (CheckResult, CheckResult) {
        let states: Vec<_> = states
            .into_iter()
            .map(|(p, s)| (PathBuf::from(p), s))
            .collect();
        let mut r = DiskCheck::new(cfg, &HostRoot::new("/host")).evaluate(&states);
        let inodes = r.pop().expect("two results");
        (r.pop().expect("two results"), inodes)
    }

    #[test]
    fn thresholds_table() {
        let pct = DiskConfig {
            min_free_percent: 10.0,
            min_free_inodes_percent: 5.0,
            ..Default::default()
        };
        let bytes = DiskConfig {
            min_free_bytes: ByteSize(5 * GIB),
            min_free_percent: 0.0,
            ..Default::default()
        };
        let cases = [
            (
                pct.clone(),
                usage(20, 100, 50, 100),
                (False, "DiskSpaceOk"),
                (False, "InodesOk"),
            ),
            (
                pct.clone(),
                usage(9, 100, 4, 100),
                (True, "DiskSpaceLow"),
                (True, "InodesLow"),
            ),
            (
                pct.clone(),
                usage(10, 100, 5, 100),
                (False, "DiskSpaceOk"),
                (False, "InodesOk"),
            ),
            (
                pct.clone(),
                usage(50, 100, 0, 0),
                (False, "DiskSpaceOk"),
                (False, "InodesOk"),
            ),
            (
                bytes.clone(),
                usage(4, 1000, 1, 1),
                (True, "DiskSpaceLow"),
                (False, "InodesOk"),
            ),
            (
                bytes.clone(),
                usage(5, 1000, 1, 1),
                (False, "DiskSpaceOk"),
                (False, "InodesOk"),
            ),
        ];
        for (cfg, state, want_space, want_inodes) in cases {
            let (s, i) = eval(cfg, vec![("/", state.clone())]);
            assert_eq!(
                (s.status, s.reason.as_str()),
                want_space,
                "{state:?}: {s:?}"
            );
            assert_eq!(
                (i.status, i.reason.as_str()),
                want_inodes,
                "{state:?}: {i:?}"
            );
            assert_eq!(s.condition_type, "NodekeeperDiskPressure");
            assert_eq!(i.condition_type, "NodekeeperInodePressure");
        }
    }

    #[test]
    fn missing_path_is_unknown_unless_another_is_low() {
        let cfg = DiskConfig::default();
        let (s, i) = eval(
            cfg.clone(),
            vec![
                ("/", usage(50, 100, 50, 100)),
                ("/var/lib/kubelet", PathState::NotFound),
            ],
        );
        assert_eq!((s.status, s.reason.as_str()), (Unknown, "DiskPathNotFound"));
        assert_eq!(i.status, Unknown);
        assert!(
            s.message
                .contains("/var/lib/kubelet: path not found under host root /host"),
            "{}",
            s.message
        );
        assert!(
            s.message.contains("/: 50.0 GiB free of 100.0 GiB (50.0%)"),
            "{}",
            s.message
        );
        let (s, _) = eval(
            cfg.clone(),
            vec![("/", usage(1, 100, 50, 100)), ("/x", PathState::NotFound)],
        );
        assert_eq!((s.status, s.reason.as_str()), (True, "DiskSpaceLow"));
        assert!(s.message.contains("/x: path not found"), "{}", s.message);
        let (s, _) = eval(cfg, vec![("/x", PathState::Failed(Errno::EACCES))]);
        assert_eq!((s.status, s.reason.as_str()), (Unknown, "DiskStatFailed"));
        assert!(
            s.message.contains("Permission denied") || s.message.contains("EACCES"),
            "{}",
            s.message
        );
    }
}

//! `state_dir/crio-state.json`: which drop-ins nodekeeper owns, and the transaction in flight.
//!
//! The transaction record (`pending`) is written **before** the drop-in directory is touched,
//! with a backup of every file about to change under `state_dir/crio-backup/`. A run killed at
//! any point therefore leaves enough behind for the next run to finish the change, restart the
//! unit, and still roll back to the last good files if that restart fails.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::agent::fsops::{self, FsError};

/// Schema version of the state file.
pub const STATE_VERSION: u32 = 1;
/// File name of the state file inside `state_dir`.
pub const STATE_FILE: &str = "crio-state.json";

/// The persisted state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// Schema version.
    pub version: u32,
    /// Drop-in file name → sha256 of the content nodekeeper last wrote.
    pub owned: BTreeMap<String, String>,
    /// A change whose restart has not been confirmed yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<Pending>,
}

/// An unfinished change: what to roll back to.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Pending {
    /// File name → whether a previous version existed (and is saved in the backup dir).
    pub files: BTreeMap<String, bool>,
    /// `owned` as it was before the change.
    pub owned_before: BTreeMap<String, String>,
}

/// Errors reading or writing the state.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// I/O.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// The file exists but is not a state file nodekeeper can read.
    #[error("cannot parse {}: {source} (move it away to start over; nodekeeper will then own no drop-ins)", path.display())]
    Parse {
        /// The state file.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
    /// Written by a newer nodekeeper.
    #[error("{} has schema version {found}, this nodekeeper reads {STATE_VERSION}", path.display())]
    Version {
        /// The state file.
        path: PathBuf,
        /// The version found.
        found: u32,
    },
}

/// Where the state, backups and temp files live.
#[derive(Debug, Clone)]
pub struct StatePaths {
    /// `state_dir`.
    pub dir: PathBuf,
}

impl StatePaths {
    /// The state file.
    pub fn file(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }
    /// Temp files (same filesystem as the drop-in directory).
    pub fn tmp_dir(&self) -> PathBuf {
        self.dir.join("tmp")
    }
    /// Backups of the files a pending change replaced.
    pub fn backup_dir(&self) -> PathBuf {
        self.dir.join("crio-backup")
    }
    /// The exclusive lock taken for the duration of an apply.
    pub fn lock_file(&self) -> PathBuf {
        self.dir.join("crio.lock")
    }

    /// Loads the state; a missing file is the empty state.
    pub fn load(&self) -> Result<State, StateError> {
        let path = self.file();
        let Some(bytes) = fsops::read_opt(&path)? else {
            return Ok(State {
                version: STATE_VERSION,
                ..State::default()
            });
        };
        let state: State = serde_json::from_slice(&bytes).map_err(|source| StateError::Parse {
            path: path.clone(),
            source,
        })?;
        if state.version != STATE_VERSION {
            return Err(StateError::Version {
                path,
                found: state.version,
            });
        }
        Ok(state)
    }

    /// Saves the state atomically.
    pub fn save(&self, state: &State) -> Result<(), StateError> {
        fsops::ensure_dir(&self.dir)?;
        let bytes = serde_json::to_vec_pretty(state).map_err(|source| StateError::Parse {
            path: self.file(),
            source,
        })?;
        fsops::atomic_write(&self.file(), &bytes, &self.tmp_dir())?;
        Ok(())
    }

    /// Saves `bytes` as the backup of drop-in `name`.
    pub fn save_backup(&self, name: &str, bytes: &[u8]) -> Result<(), FsError> {
        let dir = self.backup_dir();
        fsops::ensure_dir(&dir)?;
        fsops::atomic_write(&dir.join(name), bytes, &self.tmp_dir())
    }

    /// Reads the backup of drop-in `name`.
    pub fn read_backup(&self, name: &str) -> Result<Option<Vec<u8>>, FsError> {
        fsops::read_opt(&self.backup_dir().join(name))
    }

    /// Removes all backups (after a confirmed change or a completed rollback).
    pub fn clear_backups(&self) -> Result<(), FsError> {
        let dir = self.backup_dir();
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(FsError {
                op: "remove backups in",
                path: dir,
                source,
            }),
        }
    }
}

/// Hex sha256 of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

/// Joins an absolute host path under an optional root (`--root DIR`).
pub fn under_root(root: Option<&Path>, path: &Path) -> PathBuf {
    match root {
        Some(r) => r.join(path.strip_prefix("/").unwrap_or(path)),
        None => path.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_version_check() {
        let d = tempfile::tempdir().unwrap();
        let p = StatePaths {
            dir: d.path().join("s"),
        };
        assert_eq!(p.load().unwrap().owned.len(), 0);
        let mut s = p.load().unwrap();
        s.owned.insert("a.conf".into(), digest(b"x"));
        s.pending = Some(Pending {
            files: [("a.conf".to_string(), false)].into(),
            owned_before: BTreeMap::new(),
        });
        p.save(&s).unwrap();
        assert_eq!(p.load().unwrap(), s);
        std::fs::write(p.file(), br#"{"version":9,"owned":{}}"#).unwrap();
        assert!(matches!(
            p.load(),
            Err(StateError::Version { found: 9, .. })
        ));
        std::fs::write(p.file(), b"{garbage").unwrap();
        let e = p.load().unwrap_err().to_string();
        assert!(e.contains("crio-state.json"), "{e}");
    }

    #[test]
    fn root_prefix() {
        assert_eq!(
            under_root(Some(Path::new("/tmp/r")), Path::new("/etc/crio")),
            PathBuf::from("/tmp/r/etc/crio")
        );
        assert_eq!(
            under_root(None, Path::new("/etc/crio")),
            PathBuf::from("/etc/crio")
        );
    }
}

//! `state_dir/crio-state.json`: which drop-ins nodekeeper owns, and the transaction in flight.
//!
//! The transaction record (`pending`) is written **before** the drop-in directory is touched,
//! with a backup of every file about to change under `state_dir/crio-backup/`. A run killed at
//! any point therefore leaves enough behind for the next run to finish the change, restart the
//! unit, and still roll back to the last good files if that restart fails.
//!
//! The file is data, not paths: every name it holds (`owned`, `pending.files`,
//! `pending.owned_before`, and so the backups) must be a drop-in file name
//! ([`valid_name`](crate::agent::crio::lint::valid_name)); a file naming anything else is refused
//! whole on load, before any name is joined to a directory.

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

impl State {
    /// Parses a state file's bytes (`path` names it in errors): JSON, the schema version, then
    /// every name ([`State::invalid_name`]).
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<State, StateError> {
        let path = path.to_path_buf();
        let state: State = serde_json::from_slice(bytes).map_err(|source| StateError::Parse {
            path: path.clone(),
            source,
        })?;
        if state.version != STATE_VERSION {
            return Err(StateError::Version {
                path,
                found: state.version,
            });
        }
        if let Some((field, name)) = state.invalid_name() {
            return Err(StateError::Name {
                path,
                field,
                name: name.chars().take(80).collect(),
            });
        }
        Ok(state)
    }

    /// The first name that is not a drop-in file name, and where it is.
    pub fn invalid_name(&self) -> Option<(&'static str, &str)> {
        fn bad<'a, V>(
            field: &'static str,
            names: &'a BTreeMap<String, V>,
        ) -> Option<(&'static str, &'a str)> {
            names
                .keys()
                .find(|n| !crate::agent::crio::lint::valid_name(n))
                .map(|n| (field, n.as_str()))
        }
        bad("owned", &self.owned).or_else(|| {
            let p = self.pending.as_ref()?;
            bad("pending.files", &p.files).or_else(|| bad("pending.owned_before", &p.owned_before))
        })
    }
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
    /// A name in the file is not a drop-in file name (a path, a hidden file, another suffix).
    #[error("{}: {field} names `{name}`, which is not a drop-in file name \
             (^[0-9A-Za-z._-]+\\.conf$); refusing the state file: check who wrote it, then move it \
             away to start over (nodekeeper will then own no drop-ins)", path.display())]
    Name {
        /// The state file.
        path: PathBuf,
        /// Where in the file (`owned`, `pending.files`, `pending.owned_before`).
        field: &'static str,
        /// The name, cut to 80 characters.
        name: String,
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
        State::parse(&path, &bytes)
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
        let path = backup_path(&dir, name)?;
        fsops::ensure_dir(&dir)?;
        fsops::atomic_write(&path, bytes, &self.tmp_dir())
    }

    /// Reads the backup of drop-in `name`.
    pub fn read_backup(&self, name: &str) -> Result<Option<Vec<u8>>, FsError> {
        fsops::read_opt(&backup_path(&self.backup_dir(), name)?)
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

/// `dir/name` for a drop-in file name only (the state file's names are checked on load; this
/// keeps a backup inside its directory whatever the caller passes).
fn backup_path(dir: &Path, name: &str) -> Result<PathBuf, FsError> {
    if crate::agent::crio::lint::valid_name(name) {
        return Ok(dir.join(name));
    }
    Err(FsError {
        op: "refuse a backup name outside",
        path: dir.to_path_buf(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("`{}` is not a drop-in file name", name.escape_debug()),
        ),
    })
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

    /// Probe 7: a state file naming paths (traversal, absolute, hidden, another suffix) in any
    /// of its maps is refused on load with the file, the field and the remedy; nothing outside
    /// the state directory is read. The backups refuse such names too.
    #[test]
    fn names_that_are_not_drop_in_file_names_are_refused_on_load() {
        let d = tempfile::tempdir().unwrap();
        let p = StatePaths {
            dir: d.path().join("s"),
        };
        std::fs::create_dir_all(&p.dir).unwrap();
        let victim = d.path().join("victim.conf");
        std::fs::write(&victim, "secret").unwrap();
        let names = [
            "../../../../victim.txt",
            "../victim.conf",
            "/etc/passwd.conf",
            "sub/a.conf",
            ".hidden.conf",
            "a.txt",
            "",
        ];
        for name in names {
            for field in ["owned", "pending.files", "pending.owned_before"] {
                let mut s = State {
                    version: STATE_VERSION,
                    ..State::default()
                };
                s.owned.insert("ok.conf".into(), digest(b"x"));
                match field {
                    "owned" => {
                        s.owned.insert(name.into(), digest(b"x"));
                    }
                    "pending.files" => {
                        s.pending = Some(Pending {
                            files: [(name.to_string(), true)].into(),
                            owned_before: BTreeMap::new(),
                        })
                    }
                    _ => {
                        s.pending = Some(Pending {
                            files: BTreeMap::new(),
                            owned_before: [(name.to_string(), digest(b"x"))].into(),
                        })
                    }
                }
                std::fs::write(p.file(), serde_json::to_vec(&s).unwrap()).unwrap();
                let e = p.load().unwrap_err();
                let text = e.to_string();
                assert!(
                    matches!(&e, StateError::Name { field: f, .. } if *f == field),
                    "{name:?} in {field}: {text}"
                );
                assert!(
                    text.contains("crio-state.json") && text.contains("move it"),
                    "{text}"
                );
            }
            assert!(p.read_backup(name).is_err(), "{name:?}");
            assert!(p.save_backup(name, b"x").is_err(), "{name:?}");
        }
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "secret");
        // A valid state still loads.
        let mut s = p.load().unwrap_or_default();
        s.version = STATE_VERSION;
        s.owned = [("10-a.conf".to_string(), digest(b"x"))].into();
        p.save(&s).unwrap();
        assert_eq!(p.load().unwrap(), s);
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

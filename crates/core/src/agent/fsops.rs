//! The agent's durable file writes (CRI-O drop-ins and state, the reporter's event queue): every
//! change lands by `rename(2)` of a fully written, fsynced temp file, followed by an fsync of the
//! directory, so a power-off (an OCI preemption is one) leaves the old or the new file, never a
//! partial one. For drop-ins the temp file lives **outside** the drop-in directory (CRI-O loads
//! every regular file in it, whatever its name).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// A file-system failure, naming the path and the operation.
#[derive(Debug, thiserror::Error)]
#[error("cannot {op} {}: {source}{}", path.display(), hint(source))]
pub struct FsError {
    /// What was being done (`write`, `rename into place`, ...).
    pub op: &'static str,
    /// The path concerned.
    pub path: PathBuf,
    /// The OS error.
    pub source: io::Error,
}

fn hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc_exdev) if libc_exdev == nix::errno::Errno::EXDEV as i32 => {
            " (state_dir and dropin_dir must be on the same filesystem for atomic renames)"
        }
        Some(code) if code == nix::errno::Errno::EROFS as i32 => " (read-only filesystem)",
        Some(code)
            if code == nix::errno::Errno::EACCES as i32
                || code == nix::errno::Errno::EPERM as i32 =>
        {
            " (permission denied: run as root, or check ReadWritePaths= of the unit)"
        }
        _ => "",
    }
}

fn ctx<T>(op: &'static str, path: &Path, r: io::Result<T>) -> Result<T, FsError> {
    r.map_err(|source| FsError {
        op,
        path: path.to_path_buf(),
        source,
    })
}

/// Reads a file; `Ok(None)` if it does not exist.
pub fn read_opt(path: &Path) -> Result<Option<Vec<u8>>, FsError> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(FsError {
            op: "read",
            path: path.to_path_buf(),
            source: e,
        }),
    }
}

/// Creates `dir` (and parents) if missing.
pub fn ensure_dir(dir: &Path) -> Result<(), FsError> {
    ctx("create directory", dir, fs::create_dir_all(dir))
}

/// fsyncs a directory so renames and unlinks in it are durable.
pub fn sync_dir(dir: &Path) -> Result<(), FsError> {
    ctx(
        "fsync directory",
        dir,
        File::open(dir).and_then(|f| f.sync_all()),
    )
}

/// Atomically replaces `dest` with `bytes`: temp file in `tmp_dir` (same filesystem), fsync,
/// rename over `dest`, fsync `dest`'s directory. On error the temp file is removed and `dest`
/// is untouched.
pub fn atomic_write(dest: &Path, bytes: &[u8], tmp_dir: &Path) -> Result<(), FsError> {
    ensure_dir(tmp_dir)?;
    let file_name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".to_string());
    let tmp = tmp_dir.join(format!(".{file_name}.{}.tmp", std::process::id()));
    let result = write_and_rename(&tmp, dest, bytes);
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

fn write_and_rename(tmp: &Path, dest: &Path, bytes: &[u8]) -> Result<(), FsError> {
    let mut f = ctx(
        "create temp file",
        tmp,
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(tmp),
    )?;
    ctx("write temp file", tmp, f.write_all(bytes))?;
    ctx("fsync temp file", tmp, f.sync_all())?;
    drop(f);
    // Match what CRI-O's own packaging uses for drop-ins.
    set_mode(tmp, 0o644)?;
    ctx("rename into place", dest, fs::rename(tmp, dest))?;
    if let Some(parent) = dest.parent() {
        sync_dir(parent)?;
    }
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> Result<(), FsError> {
    use std::os::unix::fs::PermissionsExt;
    ctx(
        "set permissions of",
        path,
        fs::set_permissions(path, fs::Permissions::from_mode(mode)),
    )
}

/// Removes `path` (missing is fine) and fsyncs its directory.
pub fn remove(path: &Path) -> Result<(), FsError> {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(FsError {
                op: "remove",
                path: path.to_path_buf(),
                source: e,
            })
        }
    }
    match path.parent() {
        Some(parent) => sync_dir(parent),
        None => Ok(()),
    }
}

/// Removes leftover temp files of earlier runs that were killed mid-write (only `*.tmp` in `tmp_dir`).
pub fn clean_tmp(tmp_dir: &Path) -> Result<(), FsError> {
    let entries = match fs::read_dir(tmp_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(FsError {
                op: "list",
                path: tmp_dir.to_path_buf(),
                source: e,
            })
        }
    };
    for entry in entries.flatten() {
        let p = entry.path();
        if p.extension().is_some_and(|x| x == "tmp") {
            let _ = fs::remove_file(&p);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("dropins");
        let tmp = d.path().join("state/tmp");
        fs::create_dir_all(&dir).unwrap();
        let dest = dir.join("a.conf");
        atomic_write(&dest, b"one", &tmp).unwrap();
        atomic_write(&dest, b"two", &tmp).unwrap();
        assert_eq!(fs::read(&dest).unwrap(), b"two");
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        assert_eq!(fs::read_dir(&tmp).unwrap().count(), 0);
    }

    #[test]
    fn write_into_missing_dir_fails_cleanly() {
        let d = tempfile::tempdir().unwrap();
        let tmp = d.path().join("tmp");
        let err = atomic_write(&d.path().join("nope/a.conf"), b"x", &tmp).unwrap_err();
        assert_eq!(err.op, "rename into place");
        assert!(err.to_string().contains("nope/a.conf"), "{err}");
        assert_eq!(fs::read_dir(&tmp).unwrap().count(), 0, "temp file removed");
    }
}

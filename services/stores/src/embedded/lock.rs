//! One process tree per data directory. Two servers on the same files corrupt them: two
//! FalkorDBs each rewrite the append-only file from their own memory, two NATS servers each
//! own the stream's blocks. A second `kgmesh up` on a data dir already in use is refused.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, flock};
use rustix::io::{Errno, FdFlags, fcntl_setfd};

/// The lock file's name inside the directory it guards.
const LOCK_FILE: &str = "kgmesh.lock";

/// An exclusive lock on a directory, held until dropped, and by every process started while
/// it is held: a server left running by a killed parent still holds it, so the directory is
/// not taken from under it.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

/// Why a directory could not be locked.
#[derive(Debug)]
pub enum DirLockError {
    /// Another process holds it.
    InUse {
        /// The directory.
        dir: PathBuf,
        /// The process that took the lock, as it wrote it (it or a server it started holds it).
        holder: Option<u32>,
    },
    /// The lock file could not be opened or locked.
    Io {
        /// The directory.
        dir: PathBuf,
        /// The system's reason.
        reason: String,
    },
}

impl fmt::Display for DirLockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DirLockError::InUse { dir, holder } => {
                write!(f, "{} is in use by another process", dir.display())?;
                if let Some(pid) = holder {
                    write!(f, " (pid {pid}, or a server it started)")?;
                }
                write!(
                    f,
                    ": another kgmesh on the same data dir; stop it, or pass another --data-dir"
                )
            }
            DirLockError::Io { dir, reason } => {
                write!(f, "cannot lock {}: {reason}", dir.display())
            }
        }
    }
}

impl std::error::Error for DirLockError {}

impl DirLock {
    /// Locks `dir` (which must exist) without waiting.
    pub fn acquire(dir: &Path) -> Result<DirLock, DirLockError> {
        let io = |err: &dyn fmt::Display| DirLockError::Io {
            dir: dir.to_path_buf(),
            reason: err.to_string(),
        };
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(dir.join(LOCK_FILE))
            .map_err(|err| io(&err))?;
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(Errno::WOULDBLOCK) => {
                let mut text = String::new();
                let holder = file
                    .read_to_string(&mut text)
                    .ok()
                    .and_then(|_| text.trim().parse().ok());
                return Err(DirLockError::InUse {
                    dir: dir.to_path_buf(),
                    holder,
                });
            }
            Err(err) => return Err(io(&err)),
        }
        // Inherited by the servers spawned from here on (see the type's comment).
        fcntl_setfd(&file, FdFlags::empty()).map_err(|err| io(&err))?;
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| write!(file, "{}", std::process::id()))
            .map_err(|err| io(&err))?;
        Ok(DirLock { _file: file })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_locked_once_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let held = DirLock::acquire(dir.path()).unwrap();
        let err = DirLock::acquire(dir.path()).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, DirLockError::InUse { holder: Some(pid), .. } if pid == std::process::id()),
            "{text}"
        );
        assert!(text.contains("pass another --data-dir"), "{text}");
        drop(held);
        DirLock::acquire(dir.path()).unwrap();
    }
}

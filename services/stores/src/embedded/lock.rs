//! One process tree per data directory. Two servers on the same files corrupt them: two
//! FalkorDBs each rewrite the append-only file from their own memory, two NATS servers each
//! own the stream's blocks. A second `kgmesh up` on a data dir already in use is refused.
//!
//! A `kgmesh up` that was killed (SIGKILL, the OOM killer) leaves its servers holding the lock
//! until they stop; on Linux they are told to as it dies ([`super::Supervised`]).
//! [`DirLock::claim`] waits for them rather than refusing at once, and names them when they
//! do not stop.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{FlockOperation, flock};
use rustix::io::{Errno, FdFlags, fcntl_setfd};

/// The lock file's name inside the directory it guards.
const LOCK_FILE: &str = "kgmesh.lock";
/// How long [`DirLock::claim`] waits for the servers of a killed kgmesh to stop. They stop in
/// well under a second when signalled; FalkorDB flushes its append-only file first.
pub const ABANDONED_PATIENCE: Duration = Duration::from_secs(15);

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
    /// The process that took the lock has exited, and servers it started still hold it after
    /// [`ABANDONED_PATIENCE`].
    Abandoned {
        /// The directory.
        dir: PathBuf,
        /// The process that took the lock.
        holder: u32,
        /// The processes holding the lock, as `(pid, command name)`; empty where they cannot be
        /// listed (not Linux, or `/proc` unreadable).
        servers: Vec<(u32, String)>,
    },
    /// Processes work in it without holding its lock: servers of a kgmesh from before the lock
    /// existed (left running when it was killed), or started by hand.
    UsedUnlocked {
        /// The directory.
        dir: PathBuf,
        /// The processes, as `(pid, command name)`.
        processes: Vec<(u32, String)>,
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
            DirLockError::Abandoned {
                dir,
                holder,
                servers,
            } => {
                write!(
                    f,
                    "{} is still locked by servers of a kgmesh that has exited (pid {holder})",
                    dir.display()
                )?;
                if servers.is_empty() {
                    return write!(f, ": stop the servers it started, then start again");
                }
                let (listed, pids) = listed_processes(servers);
                write!(f, ": {listed}; stop them (`kill {pids}`), then start again")
            }
            DirLockError::UsedUnlocked { dir, processes } => {
                let (listed, pids) = listed_processes(processes);
                write!(
                    f,
                    "{} is in use by {listed} without its lock: a server of an older kgmesh that \
                     was left running, or one started by hand, and two servers on one store's \
                     files corrupt them; stop it (`kill {pids}`), then start again",
                    dir.display(),
                )
            }
            DirLockError::Io { dir, reason } => {
                write!(f, "cannot lock {}: {reason}", dir.display())
            }
        }
    }
}

/// `pid 1 (redis-server), pid 2 (nats-server)` and `1 2`.
fn listed_processes(processes: &[(u32, String)]) -> (String, String) {
    let listed: Vec<String> = processes
        .iter()
        .map(|(pid, name)| format!("pid {pid} ({name})"))
        .collect();
    let pids: Vec<String> = processes.iter().map(|(pid, _)| pid.to_string()).collect();
    (listed.join(", "), pids.join(" "))
}

impl std::error::Error for DirLockError {}

impl DirLock {
    /// Locks `dir` (which must exist). When the process that holds the lock has exited, its
    /// servers are stopping (or were left running): waits up to [`ABANDONED_PATIENCE`] for
    /// them, then answers [`DirLockError::Abandoned`] naming them. A live holder is refused
    /// at once.
    pub async fn claim(dir: &Path) -> Result<DirLock, DirLockError> {
        DirLock::claim_within(dir, ABANDONED_PATIENCE).await
    }

    async fn claim_within(dir: &Path, patience: Duration) -> Result<DirLock, DirLockError> {
        let deadline = Instant::now() + patience;
        let mut logged = false;
        loop {
            match DirLock::acquire(dir) {
                Err(DirLockError::InUse {
                    holder: Some(holder),
                    ..
                }) if process_exited(holder) => {
                    if Instant::now() >= deadline {
                        return Err(DirLockError::Abandoned {
                            dir: dir.to_path_buf(),
                            holder,
                            servers: lock_holders(&dir.join(LOCK_FILE)),
                        });
                    }
                    if !std::mem::replace(&mut logged, true) {
                        tracing::info!(
                            dir = %dir.display(),
                            holder,
                            "waiting for the servers of a kgmesh that exited to stop"
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => return other,
            }
        }
    }

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
        let processes = unlocked_users(dir);
        if !processes.is_empty() {
            return Err(DirLockError::UsedUnlocked {
                dir: dir.to_path_buf(),
                processes,
            });
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

/// Whether `pid` is gone (a zombie counts: it has exited, its parent has not reaped it yet).
fn process_exited(pid: u32) -> bool {
    #[cfg(target_os = "linux")]
    {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            // The state follows the command name, which is in parentheses and may hold any byte.
            Ok(stat) => stat
                .rfind(')')
                .and_then(|end| stat.get(end + 2..end + 3))
                .is_some_and(|state| state == "Z"),
            Err(_) => true,
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let Some(pid) = i32::try_from(pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        else {
            return true;
        };
        matches!(rustix::process::test_kill_process(pid), Err(Errno::SRCH))
    }
}

/// The store servers kgmesh starts, by command name.
const STORE_SERVERS: &[&str] = &["redis-server", "nats-server", "postgres"];

/// The store servers other than this process that work in `dir` without its lock, as `(pid,
/// command name)`: given `dir` as an argument (NATS's `-sd`, FalkorDB's `--dir`, PostgreSQL's
/// `-D`, as given or relative to the server's working directory), or running in it (FalkorDB
/// changes into its `--dir`). A lock holder passes [`DirLock::acquire`]'s flock first, so what
/// is found here predates the lock (an older kgmesh's servers) or was started by hand. Other
/// programs are left out: a `kgmesh mcp` given the data dir, or a shell in it, is no server.
fn unlocked_users(dir: &Path) -> Vec<(u32, String)> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::ffi::OsStrExt as _;
        let (Ok(dir), Ok(processes)) = (dir.canonicalize(), std::fs::read_dir("/proc")) else {
            return Vec::new();
        };
        let Some(leaf) = dir.file_name() else {
            return Vec::new();
        };
        let names_dir = |cwd: &Path, arg: &[u8]| {
            let arg = Path::new(std::ffi::OsStr::from_bytes(arg));
            // Only a path ending in the directory's own name is resolved: one lookup per
            // candidate, not per argument of every process.
            arg.file_name() == Some(leaf)
                && cwd
                    .join(arg)
                    .canonicalize()
                    .is_ok_and(|resolved| resolved == dir)
        };
        let mut users: Vec<(u32, String)> = processes
            .filter_map(Result::ok)
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| pid != std::process::id())
            .filter_map(|pid| {
                let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .map(|name| name.trim().to_owned())
                    .ok()
                    .filter(|name| STORE_SERVERS.contains(&name.as_str()))?;
                let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?;
                let in_dir = cwd == dir;
                let named = std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|line| {
                    line.split(|byte| *byte == 0)
                        .skip(1)
                        .any(|arg| !arg.is_empty() && names_dir(&cwd, arg))
                });
                (in_dir || named).then_some((pid, name))
            })
            .collect();
        users.sort();
        users
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = dir;
        Vec::new()
    }
}

/// The processes with `lock_file` open, as `(pid, command name)`: the servers that inherited it.
fn lock_holders(lock_file: &Path) -> Vec<(u32, String)> {
    #[cfg(target_os = "linux")]
    {
        let Ok(lock_file) = lock_file.canonicalize() else {
            return Vec::new();
        };
        let Ok(processes) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let mut holders: Vec<(u32, String)> = processes
            .filter_map(Result::ok)
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| pid != std::process::id())
            .filter(|pid| {
                std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
                    fds.filter_map(Result::ok)
                        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|to| to == lock_file))
                })
            })
            .map(|pid| {
                let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .map(|name| name.trim().to_owned())
                    .unwrap_or_default();
                (pid, name)
            })
            .collect();
        holders.sort();
        holders
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = lock_file;
        Vec::new()
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

    /// A pid that no longer runs: a child that was reaped.
    fn exited_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    /// Refused, not waited for: a wait would end in `Abandoned`.
    #[tokio::test]
    async fn a_live_holder_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let _held = DirLock::acquire(dir.path()).unwrap();
        let err = DirLock::claim_within(dir.path(), Duration::ZERO)
            .await
            .unwrap_err();
        assert!(
            matches!(err, DirLockError::InUse { holder: Some(pid), .. } if pid == std::process::id()),
            "{err}"
        );
    }

    #[tokio::test]
    async fn the_lock_of_an_exited_holder_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let held = DirLock::acquire(dir.path()).unwrap();
        std::fs::write(dir.path().join(LOCK_FILE), exited_pid().to_string()).unwrap();
        let servers_stop = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            drop(held);
        });
        DirLock::claim_within(dir.path(), Duration::from_secs(10))
            .await
            .unwrap();
        servers_stop.await.unwrap();
    }

    /// A server left running by a kgmesh from before the lock existed holds no lock: it is
    /// found by its arguments or its working directory, and named, and the lock is not taken.
    /// Other programs given the directory, or working in it, are no servers.
    #[cfg(target_os = "linux")]
    #[test]
    fn servers_working_in_the_directory_without_its_lock_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("nats");
        std::fs::create_dir(&store).unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let other = elsewhere.path().join("nats");
        std::fs::create_dir(&other).unwrap();
        // A program called `nats-server` (Python under that name) that sleeps.
        let python = std::process::Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .unwrap();
        let python = String::from_utf8(python.stdout).unwrap();
        let server = elsewhere.path().join("nats-server");
        std::os::unix::fs::symlink(python.trim(), &server).unwrap();
        let sleeping = |program: &Path, cwd: &Path, args: &[&std::ffi::OsStr]| {
            std::process::Command::new(program)
                .args(["-c", "import time; time.sleep(30)"])
                .args(args)
                .current_dir(cwd)
                .spawn()
                .unwrap()
        };
        let wait_started = || std::thread::sleep(Duration::from_millis(200));

        // As NATS was started: the directory as an argument, relative to where it runs.
        let mut by_argument = sleeping(&server, dir.path(), &["-sd".as_ref(), "nats".as_ref()]);
        wait_started();
        let err = DirLock::acquire(&store).unwrap_err();
        let text = err.to_string();
        let DirLockError::UsedUnlocked { processes, .. } = err else {
            panic!("{text}");
        };
        assert_eq!(
            processes,
            vec![(by_argument.id(), "nats-server".to_owned())],
            "{text}"
        );
        assert!(
            text.contains(&format!("stop it (`kill {}`)", by_argument.id())),
            "{text}"
        );
        by_argument.kill().unwrap();
        by_argument.wait().unwrap();
        // As FalkorDB runs: in the directory.
        let mut inside = sleeping(&server, &store, &[]);
        wait_started();
        assert!(matches!(
            DirLock::acquire(&store),
            Err(DirLockError::UsedUnlocked { .. })
        ));
        inside.kill().unwrap();
        inside.wait().unwrap();

        // Not servers, or a server of another directory that only ends the same.
        let python = Path::new("python3");
        let others = [
            sleeping(python, dir.path(), &["-sd".as_ref(), "nats".as_ref()]),
            sleeping(python, &store, &[]),
            sleeping(&server, dir.path(), &["-sd".as_ref(), other.as_os_str()]),
        ];
        wait_started();
        let held = DirLock::acquire(&store);
        for mut child in others {
            child.kill().unwrap();
            child.wait().unwrap();
        }
        held.unwrap();
    }

    /// A server that inherited the lock outlives the process that took it: named in the error.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn servers_left_holding_the_lock_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let held = DirLock::acquire(dir.path()).unwrap();
        let mut server = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        drop(held);
        let holder = exited_pid();
        std::fs::write(dir.path().join(LOCK_FILE), holder.to_string()).unwrap();
        let err = DirLock::claim_within(dir.path(), Duration::from_millis(300))
            .await
            .unwrap_err();
        let text = err.to_string();
        let DirLockError::Abandoned {
            holder: named,
            servers,
            ..
        } = err
        else {
            panic!("{text}");
        };
        assert_eq!(named, holder);
        assert_eq!(servers, vec![(server.id(), "sleep".to_owned())], "{text}");
        assert!(
            text.contains(&format!("stop them (`kill {}`)", server.id())),
            "{text}"
        );
        server.kill().unwrap();
        server.wait().unwrap();
        DirLock::claim_within(dir.path(), Duration::from_secs(1))
            .await
            .unwrap();
    }
}

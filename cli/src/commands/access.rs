//! `kgmesh ns|principal|group|grant|deny`: who may read what.

use clap::{ArgGroup, Subcommand, ValueEnum};
use serde_json::json;

use super::Remote;

#[derive(Subcommand)]
pub(crate) enum NsCommand {
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
    /// Delete a namespace and everything in it: files, versions, branches, releases,
    /// environments, grants, denies, its TBox, graph and vectors. No token reaches it from the
    /// first moment; the stored content goes at the next blob sweep. Run it again to finish a
    /// deletion that stopped halfway.
    Delete {
        name: String,
        /// Confirm: the namespace cannot be restored.
        #[arg(long)]
        yes: bool,
        /// Return once the request is made, without waiting for the indexer to remove the
        /// graph and vectors (`GET /api/v1/namespaces/{ns}/purge` reports it).
        #[arg(long)]
        no_wait: bool,
        /// How long to wait for the indexer, in seconds.
        #[arg(long, default_value_t = 300)]
        timeout_seconds: u64,
        #[command(flatten)]
        remote: Remote,
    },
}

/// How often `ns delete` asks whether the indexer is done.
const PURGE_POLL: std::time::Duration = std::time::Duration::from_millis(500);

pub(crate) async fn ns(command: NsCommand) -> anyhow::Result<()> {
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
            remote.print(&v)
        }
        NsCommand::List { remote } => {
            let v = remote.client()?.get(&["namespaces"], &[]).await?;
            remote.print(&v)
        }
        NsCommand::Delete {
            name,
            yes,
            no_wait,
            timeout_seconds,
            remote,
        } => {
            if !yes {
                anyhow::bail!(
                    "deleting namespace `{name}` removes every file, grant, TBox, graph and vector \
                     in it for good; run again with --yes to confirm"
                );
            }
            let client = remote.client()?;
            let mut deleted = client.delete(&["namespaces", &name]).await?;
            if !no_wait {
                let deadline =
                    std::time::Instant::now() + std::time::Duration::from_secs(timeout_seconds);
                loop {
                    let purge = client.get(&["namespaces", &name, "purge"], &[]).await?;
                    if purge["done"] == json!(true) {
                        deleted["purge"] = purge;
                        break;
                    }
                    if std::time::Instant::now() >= deadline {
                        anyhow::bail!(
                            "namespace `{name}` is deleted, but the indexer has not removed its \
                             graph and vectors within {timeout_seconds} s (is it running?); \
                             `kgmesh ns delete {name} --yes` again asks it again"
                        );
                    }
                    tokio::time::sleep(PURGE_POLL).await;
                }
            }
            remote.print(&deleted)
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Kind {
    User,
    Agent,
    Service,
}

#[derive(Subcommand)]
pub(crate) enum PrincipalCommand {
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
    /// Disable a principal: none of its tokens, nor those of agents acting for it, works from
    /// the next call on. Its grants, groups and tokens are kept for `enable`.
    Disable {
        principal_id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Enable a disabled principal again, with the grants, groups and tokens it had.
    Enable {
        principal_id: String,
        #[command(flatten)]
        remote: Remote,
    },
}

pub(crate) async fn principal(command: PrincipalCommand) -> anyhow::Result<()> {
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
            remote.print(&v)
        }
        PrincipalCommand::List { remote } => {
            let v = remote.client()?.get(&["principals"], &[]).await?;
            remote.print(&v)
        }
        PrincipalCommand::Disable {
            principal_id,
            remote,
        } => set_principal_disabled(&principal_id, true, &remote).await,
        PrincipalCommand::Enable {
            principal_id,
            remote,
        } => set_principal_disabled(&principal_id, false, &remote).await,
    }
}

async fn set_principal_disabled(
    principal_id: &str,
    disabled: bool,
    remote: &Remote,
) -> anyhow::Result<()> {
    let v = remote
        .client()?
        .patch(
            &["principals", principal_id],
            json!({ "disabled": disabled }),
        )
        .await?;
    remote.print(&v)
}

#[derive(Subcommand)]
pub(crate) enum GroupCommand {
    /// Create a group.
    Create {
        name: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// List groups with their members.
    List {
        #[command(flatten)]
        remote: Remote,
    },
    /// Add a principal to a group.
    AddMember {
        group_id: String,
        principal_id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Remove a principal from a group; its group grants stop on the next call.
    RemoveMember {
        group_id: String,
        principal_id: String,
        #[command(flatten)]
        remote: Remote,
    },
}

pub(crate) async fn group(command: GroupCommand) -> anyhow::Result<()> {
    match command {
        GroupCommand::Create { name, remote } => {
            let v = remote
                .client()?
                .post(&["groups"], json!({"name": name}))
                .await?;
            remote.print(&v)
        }
        GroupCommand::List { remote } => {
            let v = remote.client()?.get(&["groups"], &[]).await?;
            remote.print(&v)
        }
        GroupCommand::AddMember {
            group_id,
            principal_id,
            remote,
        } => {
            let v = remote
                .client()?
                .post(
                    &["groups", &group_id, "members"],
                    json!({"principalId": principal_id}),
                )
                .await?;
            remote.print(&v)
        }
        GroupCommand::RemoveMember {
            group_id,
            principal_id,
            remote,
        } => {
            let v = remote
                .client()?
                .delete(&["groups", &group_id, "members", &principal_id])
                .await?;
            remote.print(&v)
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum PermissionArg {
    Read,
    Write,
    Admin,
}

#[derive(Subcommand)]
pub(crate) enum GrantCommand {
    /// Grant (or change) a permission to a principal or a group.
    #[command(group(ArgGroup::new("subject").required(true).args(["principal", "group"])))]
    Put {
        /// The principal that receives the grant.
        #[arg(long)]
        principal: Option<String>,
        /// The group that receives the grant (every member gets it).
        #[arg(long)]
        group: Option<String>,
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
    /// List grants: every grant, one principal's, or one group's.
    List {
        #[arg(long, conflicts_with = "group")]
        principal: Option<String>,
        #[arg(long)]
        group: Option<String>,
        #[command(flatten)]
        remote: Remote,
    },
}

pub(crate) async fn grant(command: GrantCommand) -> anyhow::Result<()> {
    match command {
        GrantCommand::Put {
            principal,
            group,
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
                    json!({"principalId": principal, "groupId": group, "namespace": namespace,
                           "permission": permission, "pathPrefix": prefix}),
                )
                .await?;
            remote.print(&v)
        }
        GrantCommand::Delete { grant_id, remote } => {
            let v = remote.client()?.delete(&["grants", &grant_id]).await?;
            remote.print(&v)
        }
        GrantCommand::List {
            principal,
            group,
            remote,
        } => {
            let v = remote
                .client()?
                .get(
                    &["grants"],
                    &[
                        ("principal", principal.unwrap_or_default()),
                        ("group", group.unwrap_or_default()),
                    ],
                )
                .await?;
            remote.print(&v)
        }
    }
}

#[derive(Subcommand)]
pub(crate) enum DenyCommand {
    /// Deny a folder or one file; a deny wins over every grant. Without
    /// --principal or --group it applies to everyone.
    #[command(group(ArgGroup::new("target").required(true).args(["prefix", "file_id"])))]
    Put {
        #[arg(long)]
        namespace: String,
        #[arg(long, conflicts_with = "group")]
        principal: Option<String>,
        #[arg(long)]
        group: Option<String>,
        /// The folder to deny, e.g. `hr/`.
        #[arg(long)]
        prefix: Option<String>,
        /// The id of the file to deny (`kgmesh file list` shows ids; a path is refused).
        #[arg(long)]
        file_id: Option<String>,
        #[command(flatten)]
        remote: Remote,
    },
    /// List the denies of a namespace.
    List {
        #[arg(long)]
        namespace: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Remove a deny.
    Delete {
        deny_id: String,
        #[command(flatten)]
        remote: Remote,
    },
}

pub(crate) async fn deny(command: DenyCommand) -> anyhow::Result<()> {
    match command {
        DenyCommand::Put {
            namespace,
            principal,
            group,
            prefix,
            file_id,
            remote,
        } => {
            let v = remote
                .client()?
                .post(
                    &["denies"],
                    json!({"namespace": namespace, "principalId": principal, "groupId": group,
                           "pathPrefix": prefix, "fileId": file_id}),
                )
                .await?;
            remote.print(&v)
        }
        DenyCommand::List { namespace, remote } => {
            let v = remote
                .client()?
                .get(&["denies"], &[("namespace", namespace)])
                .await?;
            remote.print(&v)
        }
        DenyCommand::Delete { deny_id, remote } => {
            let v = remote.client()?.delete(&["denies", &deny_id]).await?;
            remote.print(&v)
        }
    }
}

//! `kgmesh approvals`: list, inspect, approve or reject proposals of governed
//! actions (admin REST `/api/v1/approvals`, with an admin token). Approving
//! re-checks the action against live data, then runs its effect once.

use clap::Subcommand;
use serde_json::json;

use super::Remote;

#[derive(Subcommand)]
pub(crate) enum ApprovalsCommand {
    /// List proposals, newest first.
    List {
        /// Only this state: pending, approved, rejected, executed,
        /// effect_failed, unknown, precondition_failed, effect_misconfigured.
        #[arg(long)]
        state: Option<String>,
        /// Most proposals to show (default 100, at most 1000).
        #[arg(long)]
        limit: Option<u32>,
        #[command(flatten)]
        remote: Remote,
    },
    /// One proposal with its arguments, effect template and audit trail.
    Show {
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Approve: re-check against live data, then run the effect once.
    Approve {
        id: String,
        /// Why (kept in the audit trail).
        #[arg(long, default_value = "")]
        reason: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Reject: nothing runs.
    Reject {
        id: String,
        /// Why (kept in the audit trail).
        #[arg(long, default_value = "")]
        reason: String,
        #[command(flatten)]
        remote: Remote,
    },
}

pub(crate) async fn approvals(command: ApprovalsCommand) -> anyhow::Result<()> {
    match command {
        ApprovalsCommand::List {
            state,
            limit,
            remote,
        } => {
            let query = [
                ("state", state.unwrap_or_default()),
                ("limit", limit.map(|n| n.to_string()).unwrap_or_default()),
            ];
            let v = remote.client()?.get(&["approvals"], &query).await?;
            remote.print(&v)
        }
        ApprovalsCommand::Show { id, remote } => {
            let v = remote.client()?.get(&["approvals", &id], &[]).await?;
            remote.print(&v)
        }
        ApprovalsCommand::Approve { id, reason, remote } => {
            let v = remote
                .client()?
                .post(&["approvals", &id, "approve"], json!({ "reason": reason }))
                .await?;
            remote.print(&v)
        }
        ApprovalsCommand::Reject { id, reason, remote } => {
            let v = remote
                .client()?
                .post(&["approvals", &id, "reject"], json!({ "reason": reason }))
                .await?;
            remote.print(&v)
        }
    }
}

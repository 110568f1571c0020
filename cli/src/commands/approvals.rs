//! `kgmesh approvals`: list, inspect, approve or reject proposals of governed
//! actions (admin REST `/api/v1/approvals`, with an admin token). Approving
//! re-checks the action against live data, then runs its effect once.

use std::process::ExitCode;

use clap::Subcommand;
use serde_json::{Value, json};

use super::Remote;

#[derive(Subcommand)]
pub(crate) enum ApprovalsCommand {
    /// List proposals, newest first.
    List {
        /// Only this state: pending, approved, rejected, executed,
        /// effect_failed, unknown, precondition_failed, effect_misconfigured.
        #[arg(long)]
        state: Option<String>,
        /// Most proposals to show: 1-1000 (default 100).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
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
    /// Approve: re-check against live data, then run the effect once. Exits 0 when the
    /// effect ran (`executed`), 3 when the proposal ended otherwise (refused by the
    /// re-check, effect failed, misconfigured or unknown), 75 when the effect is still
    /// running when the answer comes, or when no answer came (the gateway or the approval
    /// service stopped mid-call: the approval may stand); `approvals show` tells the outcome.
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

/// The proposal's end, as an exit code and, unless it executed, the line saying why.
fn approval_exit(decided: &Value) -> (ExitCode, Option<String>) {
    let state = decided["state"].as_str().unwrap_or_default();
    let detail = decided["outcomeDetail"].as_str().unwrap_or_default();
    match state {
        "executed" => (ExitCode::SUCCESS, None),
        // Sent, no answer yet: the run goes on in the approval service.
        "approved" => (
            ExitCode::from(75),
            Some(
                "the effect is still running: `kgmesh approvals show` tells its outcome".to_owned(),
            ),
        ),
        _ => (
            ExitCode::from(3),
            Some(if detail.is_empty() {
                format!("the proposal ended `{state}`: the effect did not run to success")
            } else {
                format!("the proposal ended `{state}`: {detail}")
            }),
        ),
    }
}

/// Whether a decision that failed may still have been recorded: the gateway or the approval
/// service stopped answering after the request went out (a 5xx, a broken connection, a
/// timeout). A refusal (4xx) or a connection never made means it was not.
fn decision_may_stand(err: &anyhow::Error) -> bool {
    if let Some(refused) = err.downcast_ref::<kgmesh::client::Refused>() {
        return refused.status.is_server_error();
    }
    err.chain()
        .find_map(|cause| cause.downcast_ref::<reqwest::Error>())
        .is_some_and(|cause| !cause.is_connect() && !cause.is_builder())
}

pub(crate) async fn approvals(command: ApprovalsCommand) -> anyhow::Result<ExitCode> {
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
            remote.print(&v)?;
        }
        ApprovalsCommand::Show { id, remote } => {
            let v = remote.client()?.get(&["approvals", &id], &[]).await?;
            remote.print(&v)?;
        }
        ApprovalsCommand::Approve { id, reason, remote } => {
            let decided = remote
                .client()?
                .post(&["approvals", &id, "approve"], json!({ "reason": reason }))
                .await;
            let v = match decided {
                Ok(v) => v,
                Err(err) if decision_may_stand(&err) => {
                    eprintln!("error: {err:#}");
                    eprintln!(
                        "the approval may have been recorded and its effect may be running: `kgmesh approvals show {id}` tells where it stands"
                    );
                    return Ok(ExitCode::from(75));
                }
                Err(err) => return Err(err),
            };
            remote.print(&v)?;
            let (code, why) = approval_exit(&v);
            if let Some(why) = why {
                eprintln!("{why}");
            }
            return Ok(code);
        }
        ApprovalsCommand::Reject { id, reason, remote } => {
            let v = remote
                .client()?
                .post(&["approvals", &id, "reject"], json!({ "reason": reason }))
                .await?;
            remote.print(&v)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_without_an_answer_may_stand_and_a_refusal_does_not() {
        let refused = |status: u16| {
            anyhow::Error::new(kgmesh::client::Refused {
                status: reqwest::StatusCode::from_u16(status).unwrap(),
                path: "/api/v1/approvals/p/approve".to_owned(),
                detail: String::new(),
            })
        };
        assert!(decision_may_stand(&refused(503)));
        assert!(decision_may_stand(&refused(500)));
        assert!(!decision_may_stand(&refused(409)));
        assert!(!decision_may_stand(&refused(404)));
        assert!(!decision_may_stand(&anyhow::anyhow!("no token")));
    }

    #[test]
    fn only_an_executed_effect_exits_zero() {
        assert_eq!(
            approval_exit(&json!({"state": "executed"})),
            (ExitCode::SUCCESS, None)
        );
        assert_eq!(
            approval_exit(&json!({"state": "approved"})).0,
            ExitCode::from(75)
        );
        for state in [
            "effect_failed",
            "effect_misconfigured",
            "precondition_failed",
            "unknown",
        ] {
            let (code, why) = approval_exit(&json!({"state": state, "outcomeDetail": "HTTP 500"}));
            assert_eq!(code, ExitCode::from(3), "{state}");
            assert_eq!(
                why.as_deref(),
                Some(format!("the proposal ended `{state}`: HTTP 500").as_str())
            );
        }
    }
}

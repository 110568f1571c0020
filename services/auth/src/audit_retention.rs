//! Keeping the audit log to an age (`[audit] retention_days`). Every tool call and admin change
//! adds an event, and without a limit the table grows for as long as the deployment runs. With
//! one, events older than the limit are deleted at start and then hourly, oldest first, in
//! batches, so no statement holds the table long while tool calls keep recording.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::service::AuthService;

/// How often the audit log is trimmed to its retention.
pub const AUDIT_RETENTION_EVERY: Duration = Duration::from_secs(3600);

/// Deletes the audit events older than `keep` now, then every [`AUDIT_RETENTION_EVERY`], until
/// `shutdown`. A failed round is logged and tried again at the next: until then the log only
/// keeps more than it must.
pub async fn run_audit_retention(
    service: AuthService,
    keep: Duration,
    shutdown: CancellationToken,
) {
    let keep_ms = i64::try_from(keep.as_millis()).unwrap_or(i64::MAX);
    loop {
        let before_ms = kg_common::caller::now_ms().saturating_sub(keep_ms);
        match service.prune_audit(before_ms).await {
            Ok(0) => {}
            Ok(removed) => tracing::info!(
                removed,
                retention_days = keep.as_secs() / 86_400,
                "audit events past their retention deleted"
            ),
            Err(err) => tracing::warn!(
                error = %kg_common::error::detail(&err),
                "deleting audit events past their retention failed; trying again in an hour"
            ),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(AUDIT_RETENTION_EVERY) => {}
        }
    }
}

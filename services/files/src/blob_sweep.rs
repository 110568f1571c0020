//! Removing the blobs no version needs any more: those of deleted files and of versions an
//! upload replaced, unless a preview branch or a release still names them. Without it, every
//! edit kept a full copy of the file's previous content for ever, and a file deleted because
//! it should never have been uploaded stayed on disk.
//!
//! Kept: the current version of every file not deleted, every version a branch holds (not its
//! delete markers), and every version a release names, found through the registry's or a
//! branch's record of it. Blobs are shared by content, across files and namespaces, so a blob
//! goes only when none of these names it. A blob is stored before its version is registered:
//! [`BlobStore::sweep`](kg_stores::blobs::BlobStore::sweep) spares what was written or uploaded
//! again within the grace period.

use std::collections::HashSet;
use std::time::Duration;

use kg_common::caller::require_admin;
use kg_proto::v1::{CallerContext, SweepBlobsResponse};
use kg_stores::blobs::Swept;
use sqlx::Row as _;
use tokio_util::sync::CancellationToken;

use crate::error::{FilesError, Result};
use crate::service::FilesService;
use crate::version_prune::PrunedVersions;

/// The shortest grace a sweep may keep: an upload stores its blob just before it registers
/// the version that names it.
pub const MIN_BLOB_SWEEP_GRACE: Duration = Duration::from_secs(60);

/// Every blob key a version still needs (see the module's comment).
const REFERENCED_BLOBS: &str = "\
    SELECT v.blob_key FROM kg_files f JOIN kg_file_versions v ON v.version_id = f.version_id \
     WHERE f.status <> 'deleted' \
    UNION SELECT blob_key FROM kg_branch_files WHERE deleted = 0 \
    UNION SELECT v.blob_key FROM kg_release_files r JOIN kg_file_versions v ON v.version_id = r.version_id \
    UNION SELECT b.blob_key FROM kg_release_files r JOIN kg_branch_files b ON b.version_id = r.version_id";

/// When the sweep runs and what it spares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobSweep {
    /// Pause between sweeps; the first runs one pause after the start.
    pub every: Duration,
    /// How long an unreferenced blob is kept after it was written or uploaded again.
    pub grace: Duration,
}

impl Default for BlobSweep {
    fn default() -> Self {
        BlobSweep {
            every: Duration::from_secs(3600),
            grace: Duration::from_secs(3600),
        }
    }
}

impl FilesService {
    /// An admin's sweep, now: `grace_seconds` as [`SweepBlobsRequest`](kg_proto::v1::SweepBlobsRequest)
    /// says (0 for [`MIN_BLOB_SWEEP_GRACE`], never less).
    pub async fn sweep_blobs_for(
        &self,
        caller: &CallerContext,
        grace_seconds: u64,
    ) -> Result<SweepBlobsResponse> {
        require_admin(caller).map_err(|_| FilesError::SweepDenied)?;
        let grace = match grace_seconds {
            0 => MIN_BLOB_SWEEP_GRACE,
            seconds if seconds < MIN_BLOB_SWEEP_GRACE.as_secs() => {
                let least = MIN_BLOB_SWEEP_GRACE.as_secs();
                return Err(FilesError::Invalid(format!(
                    "the grace must be at least {least} seconds (0 means {least}), got {seconds}: \
                     an upload stores its blob just before it registers the version"
                )));
            }
            seconds => Duration::from_secs(seconds),
        };
        let pruned = self.prune_versions().await?;
        let swept = self.sweep_blobs(grace).await?;
        tracing::info!(
            principal = %caller.principal_id,
            removed = swept.removed,
            removed_bytes = swept.removed_bytes,
            versions_removed = pruned.versions,
            version_links_removed = pruned.links,
            grace_seconds = grace.as_secs(),
            "an admin swept the blob store"
        );
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        Ok(SweepBlobsResponse {
            removed: count(swept.removed),
            removed_bytes: count(swept.removed_bytes),
            kept: count(swept.kept),
            within_grace: count(swept.young),
            versions_removed: count(pruned.versions),
            version_metadata_removed: count(pruned.metadata),
            version_links_removed: count(pruned.links),
        })
    }

    /// Removes the blobs no version needs that are older than `grace`.
    pub async fn sweep_blobs(&self, grace: Duration) -> Result<Swept> {
        let rows = sqlx::query(REFERENCED_BLOBS)
            .fetch_all(self.store.sql().pool())
            .await?;
        let referenced = rows
            .iter()
            .map(|row| row.try_get::<String, _>(0))
            .collect::<std::result::Result<HashSet<String>, _>>()?;
        let swept = self.blobs.sweep(referenced, grace).await?;
        let metrics = kg_common::metrics::metrics();
        metrics.blobs_swept.inc_by(swept.removed);
        metrics.blob_bytes_swept.inc_by(swept.removed_bytes);
        metrics
            .blob_sweep_completed
            .set(kg_common::caller::now_ms() / 1000);
        Ok(swept)
    }
}

/// Prunes the registry's unnamed versions and sweeps the blob store as `sweep` says until
/// `shutdown`. Every replica may run it: they share the blob directory, and a removal is
/// ordered against every put by its lock file; a prune holds each namespace it removes from.
pub async fn run_blob_sweep(service: FilesService, sweep: BlobSweep, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(sweep.every) => {}
        }
        match service.prune_versions().await {
            Ok(pruned) if pruned != PrunedVersions::default() => tracing::info!(
                versions_removed = pruned.versions,
                version_metadata_removed = pruned.metadata,
                version_links_removed = pruned.links,
                "registry rows of versions nothing names were removed"
            ),
            Ok(_) => {}
            Err(err) => tracing::warn!(
                error = %kg_common::error::detail(&err),
                "pruning the registry's unnamed versions failed; trying again at the next sweep"
            ),
        }
        match service.sweep_blobs(sweep.grace).await {
            Ok(swept) if swept.removed > 0 => tracing::info!(
                removed = swept.removed,
                removed_bytes = swept.removed_bytes,
                kept = swept.kept,
                within_grace = swept.young,
                "blobs no version needs were removed"
            ),
            Ok(_) => {}
            Err(err) => tracing::warn!(
                error = %kg_common::error::detail(&err),
                "sweeping the blob store failed; trying again at the next sweep"
            ),
        }
    }
}

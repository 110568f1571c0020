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

use kg_stores::blobs::Swept;
use sqlx::Row as _;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::service::FilesService;

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
    /// Removes the blobs no version needs that are older than `grace`.
    pub async fn sweep_blobs(&self, grace: Duration) -> Result<Swept> {
        let rows = sqlx::query(REFERENCED_BLOBS)
            .fetch_all(self.store.sql().pool())
            .await?;
        let referenced = rows
            .iter()
            .map(|row| row.try_get::<String, _>(0))
            .collect::<std::result::Result<HashSet<String>, _>>()?;
        Ok(self.blobs.sweep(referenced, grace).await?)
    }
}

/// Sweeps the blob store as `sweep` says until `shutdown`. Every replica may run it: they share
/// the blob directory, and a removal is ordered against every put by its lock file.
pub async fn run_blob_sweep(service: FilesService, sweep: BlobSweep, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(sweep.every) => {}
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

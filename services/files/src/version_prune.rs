//! Removing the registry rows of versions nothing names any more: the row (hash, size, blob
//! key) of every version an upload replaced, and the title, tags, dates and links of those
//! versions and of a deleted file's last version. Without it the registry grew by one row per
//! upload and one per link of every version for ever, though nothing read them: the link
//! graph, titles and file tools read the versions a file, a branch or a release names.
//!
//! Kept: every version a live file, a preview branch (its delete markers too) or a release
//! names; a deleted file's last version keeps its own row, through which the file's row still
//! finds its blob key. Each batch of a namespace is removed in one transaction that holds the
//! namespace (exclusive; uploads and releases hold it shared) and checks every row again, so a
//! version an upload or a release names meanwhile stays. Content uploaded again after its
//! version went is registered and indexed again like new content.

use std::collections::BTreeMap;

use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Row as _};

use crate::error::Result;
use crate::links::placeholders;
use crate::service::FilesService;
use crate::store::FilesStore;

/// Versions looked at per batch, in version id order.
const PRUNE_BATCH: usize = 500;

/// Registry rows one prune removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrunedVersions {
    /// Version rows (hash, size, blob key).
    pub versions: u64,
    /// Versions whose title, tags and dates went (`kg_file_version_meta` rows).
    pub metadata: u64,
    /// Links of those versions.
    pub links: u64,
}

/// SQL true when no preview branch or release names version `{v}` (a column).
fn unnamed_by_branch_or_release(v: &str) -> String {
    format!(
        "NOT EXISTS (SELECT 1 FROM kg_branch_files b WHERE b.version_id = {v}) \
         AND NOT EXISTS (SELECT 1 FROM kg_release_files r WHERE r.version_id = {v})"
    )
}

/// SQL true when nothing can read version `{v}`'s title and links: no live file, branch or
/// release names it.
fn metadata_unread(v: &str) -> String {
    format!(
        "NOT EXISTS (SELECT 1 FROM kg_files f WHERE f.version_id = {v} AND f.status <> 'deleted') \
         AND {}",
        unnamed_by_branch_or_release(v)
    )
}

/// SQL true when no file row (deleted or not), branch or release names version `{v}`.
fn row_unnamed(v: &str) -> String {
    format!(
        "NOT EXISTS (SELECT 1 FROM kg_files f WHERE f.version_id = {v}) AND {}",
        unnamed_by_branch_or_release(v)
    )
}

/// A batch's versions by namespace, and the last version id it holds (where the next starts).
type Batch = (BTreeMap<String, Vec<String>>, Option<String>);

fn by_namespace(rows: &[AnyRow]) -> Result<Batch> {
    let mut grouped: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut last = None;
    for row in rows {
        let version_id: String = row.try_get("version_id")?;
        grouped
            .entry(row.try_get("namespace")?)
            .or_default()
            .push(version_id.clone());
        last = Some(version_id);
    }
    Ok((grouped, last))
}

/// What one pass of the prune removes.
#[derive(Debug, Clone, Copy)]
enum Pass {
    /// Titles, tags, dates and links of versions nothing can read.
    Metadata,
    /// Rows of versions no file, branch or release names.
    VersionRows,
}

/// Which count of [`PrunedVersions`] a delete adds to.
#[derive(Debug, Clone, Copy)]
enum Removed {
    Links,
    Metadata,
    Versions,
}

impl Pass {
    /// The versions to look at: `$1` is the version id to start after, `$2` the batch size.
    fn candidates(self) -> String {
        match self {
            Pass::Metadata => format!(
                "SELECT m.namespace, m.version_id FROM kg_file_version_meta m \
                 WHERE m.version_id > $1 AND {} ORDER BY m.version_id LIMIT $2",
                metadata_unread("m.version_id")
            ),
            Pass::VersionRows => format!(
                "SELECT f.namespace, v.version_id FROM kg_file_versions v \
                 JOIN kg_files f ON f.file_id = v.file_id \
                 WHERE v.version_id > $1 AND {} ORDER BY v.version_id LIMIT $2",
                row_unnamed("v.version_id")
            ),
        }
    }

    /// The deletes of `count` of a namespace's candidates (`$1` the namespace, then the version
    /// ids), each checking its rows again, with the count each adds to.
    fn deletes(self, count: usize) -> Vec<(Removed, String)> {
        let marks = placeholders(2, count);
        match self {
            // The links first: they are found through their version's metadata row.
            Pass::Metadata => vec![
                (
                    Removed::Links,
                    format!(
                        "DELETE FROM kg_file_version_links WHERE version_id IN (\
                         SELECT m.version_id FROM kg_file_version_meta m \
                         WHERE m.namespace = $1 AND m.version_id IN ({marks}) AND {})",
                        metadata_unread("m.version_id")
                    ),
                ),
                (
                    Removed::Metadata,
                    format!(
                        "DELETE FROM kg_file_version_meta WHERE namespace = $1 \
                         AND version_id IN ({marks}) AND {}",
                        metadata_unread("kg_file_version_meta.version_id")
                    ),
                ),
            ],
            Pass::VersionRows => vec![(
                Removed::Versions,
                format!(
                    "DELETE FROM kg_file_versions WHERE version_id IN ({marks}) \
                     AND file_id IN (SELECT file_id FROM kg_files WHERE namespace = $1) AND {}",
                    row_unnamed("kg_file_versions.version_id")
                ),
            )],
        }
    }
}

impl FilesStore {
    /// Runs `pass` over every version it finds, a batch at a time, each namespace's share of a
    /// batch in one transaction holding the namespace, and counts what it removed in `pruned`.
    async fn prune(&self, pass: Pass, pruned: &mut PrunedVersions) -> Result<()> {
        let pool = self.sql().pool();
        let candidates = pass.candidates();
        let mut after = String::new();
        loop {
            let rows = sqlx::query(AssertSqlSafe(candidates.clone()))
                .bind(&after)
                .bind(i64::try_from(PRUNE_BATCH).unwrap_or(i64::MAX))
                .fetch_all(pool)
                .await?;
            let (grouped, last) = by_namespace(&rows)?;
            for (namespace, version_ids) in grouped {
                let mut tx = pool.begin().await?;
                self.hold_namespace_exclusive(&mut tx, &namespace).await?;
                for (counted, sql) in pass.deletes(version_ids.len()) {
                    let mut query = sqlx::query(AssertSqlSafe(sql)).bind(namespace.as_str());
                    for id in &version_ids {
                        query = query.bind(id.as_str());
                    }
                    let rows = query.execute(&mut *tx).await?.rows_affected();
                    match counted {
                        Removed::Links => pruned.links += rows,
                        Removed::Metadata => pruned.metadata += rows,
                        Removed::Versions => pruned.versions += rows,
                    }
                }
                tx.commit().await?;
            }
            match last {
                Some(last) if rows.len() == PRUNE_BATCH => after = last,
                _ => return Ok(()),
            }
        }
    }
}

impl FilesService {
    /// Removes the registry rows of versions nothing names any more (see the module's comment);
    /// the blob sweep runs it before it looks for blobs no version needs.
    pub async fn prune_versions(&self) -> Result<PrunedVersions> {
        let mut pruned = PrunedVersions::default();
        self.store.prune(Pass::Metadata, &mut pruned).await?;
        self.store.prune(Pass::VersionRows, &mut pruned).await?;
        let metrics = kg_common::metrics::metrics();
        metrics.registry_versions_pruned.inc_by(pruned.versions);
        metrics.registry_version_links_pruned.inc_by(pruned.links);
        Ok(pruned)
    }
}

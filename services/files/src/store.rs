//! SQL access for the file registry. Every read takes the caller's access
//! filter and applies it in the `WHERE` clause.

use kg_common::access::{SqlColumns, SqlPredicate, sql_predicate};
use kg_proto::v1::{AccessFilter, FileInfo, FileStatus};
use kg_stores::sql::SqlStore;
use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Row as _};

use crate::error::{FilesError, Result};

pub(crate) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// The registry columns the access predicate reads.
const COLUMNS: SqlColumns<'static> = SqlColumns {
    path: "path",
    file_id: "file_id",
    enabled: "enabled",
    hidden: "hidden",
};

/// The access predicate of management reads (`get_file`, `list_files`, branch and release
/// counts): [`sql_predicate`] of `filter`, except that where `filter.enabled_only` holds,
/// disabled files still pass under `filter.write_prefixes` (writers manage them there) and
/// nowhere else: `enabled = 1 OR <path under a write prefix>`. Callers set
/// `write_prefixes` with [`crate::service::read_filter`].
pub(crate) fn manage_predicate(
    filter: &AccessFilter,
    columns: SqlColumns<'_>,
    first_param: usize,
) -> SqlPredicate {
    if !filter.enabled_only || filter.write_prefixes.is_empty() {
        return sql_predicate(filter, columns, first_param);
    }
    let everything_else = AccessFilter {
        enabled_only: false,
        ..filter.clone()
    };
    let mut predicate = sql_predicate(&everything_else, columns, first_param);
    if filter.write_prefixes.iter().any(String::is_empty) {
        return predicate;
    }
    let mut enabled = vec![format!("{} = 1", columns.enabled)];
    for prefix in &filter.write_prefixes {
        let n = first_param + predicate.params.len();
        predicate.params.push(prefix.clone());
        enabled.push(format!("substr({}, 1, length(${n})) = ${n}", columns.path));
    }
    predicate.text = format!("({} AND ({}))", predicate.text, enabled.join(" OR "));
    predicate
}

const FILE_COLUMNS: &str = "file_id, namespace, path, version_id, content_sha256, size, mime, status, status_reason, enabled, hidden, chunk_count, created_at_ms, updated_at_ms";

pub(crate) fn status_str(s: FileStatus) -> &'static str {
    match s {
        FileStatus::Pending => "pending",
        FileStatus::Indexed => "indexed",
        FileStatus::Failed => "failed",
        FileStatus::Deleted => "deleted",
        FileStatus::Stored => "stored",
        FileStatus::Unspecified => "unspecified",
    }
}

fn status_from(s: &str) -> FileStatus {
    match s {
        "pending" => FileStatus::Pending,
        "indexed" => FileStatus::Indexed,
        "failed" => FileStatus::Failed,
        "deleted" => FileStatus::Deleted,
        "stored" => FileStatus::Stored,
        _ => FileStatus::Unspecified,
    }
}

/// A file's flags as one write left them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FlagsSnapshot {
    pub(crate) enabled: bool,
    pub(crate) hidden: bool,
    /// The file's count of flag changes, which orders its flags for the indexer.
    pub(crate) version: i64,
}

fn flags_from(row: &AnyRow) -> Result<FlagsSnapshot> {
    Ok(FlagsSnapshot {
        enabled: row.try_get::<i64, _>("enabled")? != 0,
        hidden: row.try_get::<i64, _>("hidden")? != 0,
        version: row.try_get("flags_version")?,
    })
}

fn file_from(row: &AnyRow) -> Result<FileInfo> {
    Ok(FileInfo {
        file_id: row.try_get("file_id")?,
        namespace: row.try_get("namespace")?,
        path: row.try_get("path")?,
        version_id: row.try_get("version_id")?,
        content_sha256: row.try_get("content_sha256")?,
        size: row.try_get("size")?,
        mime: row.try_get("mime")?,
        status: status_from(&row.try_get::<String, _>("status")?) as i32,
        status_reason: row.try_get("status_reason")?,
        enabled: row.try_get::<i64, _>("enabled")? != 0,
        hidden: row.try_get::<i64, _>("hidden")? != 0,
        chunk_count: row.try_get("chunk_count")?,
        created_at_ms: row.try_get("created_at_ms")?,
        updated_at_ms: row.try_get("updated_at_ms")?,
    })
}

/// The blob key of the row's current version, as a column of a `kg_files` query.
const BLOB_KEY_COLUMN: &str = "(SELECT v.blob_key FROM kg_file_versions v WHERE v.version_id = kg_files.version_id) AS blob_key";

/// The files (rows for [`replayed_from`]) matching `condition`, by file id, `LIMIT $2`.
fn replayed_select(condition: &str) -> String {
    format!(
        "SELECT {FILE_COLUMNS}, COALESCE({}, '') AS blob_key, flags_version, \
         index_requested_at_ms FROM kg_files WHERE {condition} ORDER BY file_id LIMIT $2",
        BLOB_KEY_COLUMN.trim_end_matches(" AS blob_key")
    )
}

fn replayed_from(row: &AnyRow) -> Result<Replayed> {
    Ok(Replayed {
        current: readable_from(row)?,
        flags_version: row.try_get("flags_version")?,
        index_requested_at_ms: row.try_get("index_requested_at_ms")?,
    })
}

/// A file the caller may read, with the blob of its current version.
#[derive(Debug, Clone)]
pub(crate) struct Readable {
    pub file: FileInfo,
    pub blob_key: String,
}

fn readable_from(row: &AnyRow) -> Result<Readable> {
    Ok(Readable {
        file: file_from(row)?,
        blob_key: row.try_get("blob_key")?,
    })
}

/// A registry row as a replay into a new event stream publishes it.
#[derive(Debug, Clone)]
pub(crate) struct Replayed {
    pub current: Readable,
    /// The file's count of flag changes.
    pub flags_version: i64,
    /// When its current version was last queued to be indexed again (0: never).
    pub index_requested_at_ms: i64,
}

/// Which file a lookup names.
pub(crate) enum FileSelector<'a> {
    Path(&'a str),
    Id(&'a str),
}

/// Which files a reindex takes, beyond its folder.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReindexScope {
    /// Only files whose indexing failed.
    pub failed_only: bool,
    /// Hidden files too (for callers who see them).
    pub include_hidden: bool,
}

/// An indexing outcome of one version.
pub(crate) struct Outcome<'a> {
    pub file_id: &'a str,
    pub version_id: &'a str,
    pub status: FileStatus,
    pub reason: &'a str,
    pub chunk_count: i64,
    /// The request to index the version again that this answers (0: the upload's own).
    pub answers_request_at_ms: i64,
}

/// One page of a listing.
pub(crate) struct Page {
    pub files: Vec<FileInfo>,
    pub total: i64,
}

#[derive(Clone)]
pub(crate) struct FilesStore {
    sql: SqlStore,
}

impl FilesStore {
    /// A probe of the database, for the service's health.
    pub(crate) fn health_probe(&self) -> kg_common::grpc::StoreProbe {
        self.sql.health_probe()
    }

    pub(crate) async fn open(sql: SqlStore) -> Result<Self> {
        sql.migrate(&MIGRATOR).await?;
        Ok(Self { sql })
    }

    /// The SQL store, for the per-version link tables (see `crate::links`).
    pub(crate) fn sql(&self) -> &SqlStore {
        &self.sql
    }

    /// The file at `selector` in `namespace`, if `filter` lets the caller see it
    /// ([`manage_predicate`]).
    pub(crate) async fn get(
        &self,
        namespace: &str,
        selector: FileSelector<'_>,
        filter: &AccessFilter,
    ) -> Result<Option<FileInfo>> {
        self.get_with_deleted(namespace, selector, filter, false)
            .await
    }

    /// Like [`Self::get`]; with `deleted`, a deleted file's row too (a delete sent again).
    pub(crate) async fn get_with_deleted(
        &self,
        namespace: &str,
        selector: FileSelector<'_>,
        filter: &AccessFilter,
        deleted: bool,
    ) -> Result<Option<FileInfo>> {
        let predicate = manage_predicate(filter, COLUMNS, 3);
        let live = if deleted {
            ""
        } else {
            "status <> 'deleted' AND "
        };
        let key_column = match selector {
            FileSelector::Path(_) => "path",
            FileSelector::Id(_) => "file_id",
        };
        let sql = format!(
            "SELECT {FILE_COLUMNS} FROM kg_files WHERE namespace = $1 AND {key_column} = $2 AND {live}{}",
            predicate.text
        );
        let key = match selector {
            FileSelector::Path(p) | FileSelector::Id(p) => p,
        };
        let mut query = sqlx::query(AssertSqlSafe(sql)).bind(namespace).bind(key);
        for p in &predicate.params {
            query = query.bind(p);
        }
        let row = query.fetch_optional(self.sql.pool()).await?;
        row.as_ref().map(file_from).transpose()
    }

    /// Like [`Self::get`], plus the blob key of the current version.
    pub(crate) async fn get_readable(
        &self,
        namespace: &str,
        selector: FileSelector<'_>,
        filter: &AccessFilter,
    ) -> Result<Option<Readable>> {
        let predicate = sql_predicate(filter, COLUMNS, 3);
        let (key_column, key) = match selector {
            FileSelector::Path(p) => ("path", p),
            FileSelector::Id(id) => ("file_id", id),
        };
        let sql = format!(
            "SELECT {FILE_COLUMNS}, {BLOB_KEY_COLUMN} FROM kg_files WHERE namespace = $1 AND {key_column} = $2 AND status <> 'deleted' AND {}",
            predicate.text
        );
        let mut query = sqlx::query(AssertSqlSafe(sql)).bind(namespace).bind(key);
        for p in &predicate.params {
            query = query.bind(p);
        }
        let row = query.fetch_optional(self.sql.pool()).await?;
        row.as_ref().map(readable_from).transpose()
    }

    /// Up to `limit` visible (never hidden) readable files under
    /// `folder_prefix` after `after_path`, in path order, with their blobs.
    pub(crate) async fn scan_visible(
        &self,
        namespace: &str,
        folder_prefix: &str,
        after_path: &str,
        limit: u32,
        filter: &AccessFilter,
    ) -> Result<Vec<Readable>> {
        let predicate = sql_predicate(filter, COLUMNS, 3);
        self.readable_page(
            namespace,
            folder_prefix,
            "status <> 'deleted' AND hidden = 0",
            &predicate,
            after_path,
            limit,
        )
        .await
    }

    /// Up to `limit` files under `folder_prefix` after `after_path` meeting `conditions` and
    /// `predicate` (whose parameters start at `$3`), in path order, with their blobs.
    async fn readable_page(
        &self,
        namespace: &str,
        folder_prefix: &str,
        conditions: &str,
        predicate: &SqlPredicate,
        after_path: &str,
        limit: u32,
    ) -> Result<Vec<Readable>> {
        let after_param = 3 + predicate.params.len();
        let sql = format!(
            "SELECT {FILE_COLUMNS}, {BLOB_KEY_COLUMN} FROM kg_files WHERE namespace = $1 AND substr(path, 1, length($2)) = $2 AND {conditions} AND {} AND path > ${after_param} ORDER BY path LIMIT {limit}",
            predicate.text
        );
        let mut query = sqlx::query(AssertSqlSafe(sql))
            .bind(namespace)
            .bind(folder_prefix);
        for p in &predicate.params {
            query = query.bind(p);
        }
        let rows = query.bind(after_path).fetch_all(self.sql.pool()).await?;
        rows.iter().map(readable_from).collect()
    }

    /// Paths of every visible readable file under `folder_prefix` (for
    /// totals that need a filter SQL cannot express).
    pub(crate) async fn visible_paths(
        &self,
        namespace: &str,
        folder_prefix: &str,
        filter: &AccessFilter,
    ) -> Result<Vec<String>> {
        let predicate = sql_predicate(filter, COLUMNS, 3);
        let sql = format!(
            "SELECT path FROM kg_files WHERE namespace = $1 AND substr(path, 1, length($2)) = $2 AND status <> 'deleted' AND hidden = 0 AND {}",
            predicate.text
        );
        let mut query = sqlx::query(AssertSqlSafe(sql))
            .bind(namespace)
            .bind(folder_prefix);
        for p in &predicate.params {
            query = query.bind(p);
        }
        let rows = query.fetch_all(self.sql.pool()).await?;
        rows.iter()
            .map(|r| r.try_get::<String, _>("path").map_err(Into::into))
            .collect()
    }

    /// How many visible readable files are under `folder_prefix`.
    pub(crate) async fn count_visible(
        &self,
        namespace: &str,
        folder_prefix: &str,
        filter: &AccessFilter,
    ) -> Result<i64> {
        let predicate = sql_predicate(filter, COLUMNS, 3);
        let sql = format!(
            "SELECT COUNT(*) AS n FROM kg_files WHERE namespace = $1 AND substr(path, 1, length($2)) = $2 AND status <> 'deleted' AND hidden = 0 AND {}",
            predicate.text
        );
        let mut query = sqlx::query(AssertSqlSafe(sql))
            .bind(namespace)
            .bind(folder_prefix);
        for p in &predicate.params {
            query = query.bind(p);
        }
        Ok(query.fetch_one(self.sql.pool()).await?.try_get("n")?)
    }

    /// The registry row for a path regardless of access (for writers, who must check it
    /// with `FilesService::may_overwrite` before anything of it reaches the caller).
    pub(crate) async fn by_path_unfiltered(
        &self,
        namespace: &str,
        path: &str,
    ) -> Result<Option<FileInfo>> {
        let sql = format!("SELECT {FILE_COLUMNS} FROM kg_files WHERE namespace = $1 AND path = $2");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(namespace)
            .bind(path)
            .fetch_optional(self.sql.pool())
            .await?;
        row.as_ref().map(file_from).transpose()
    }

    /// A page of files under `folder_prefix`, ordered by path, after `after_path`, that
    /// `filter` lets the caller see ([`manage_predicate`]).
    pub(crate) async fn list(
        &self,
        namespace: &str,
        folder_prefix: &str,
        after_path: &str,
        limit: u32,
        include_hidden: bool,
        filter: &AccessFilter,
    ) -> Result<Page> {
        let predicate = manage_predicate(filter, COLUMNS, 3);
        let hidden = if include_hidden {
            ""
        } else {
            " AND hidden = 0"
        };
        let base = format!(
            "FROM kg_files WHERE namespace = $1 AND substr(path, 1, length($2)) = $2 AND status <> 'deleted'{hidden} AND {}",
            predicate.text
        );
        let after_param = 3 + predicate.params.len();
        let page_sql = format!(
            "SELECT {FILE_COLUMNS} {base} AND path > ${after_param} ORDER BY path LIMIT {}",
            limit
        );
        let count_sql = format!("SELECT COUNT(*) AS n {base}");

        let mut page = sqlx::query(AssertSqlSafe(page_sql))
            .bind(namespace)
            .bind(folder_prefix);
        let mut count = sqlx::query(AssertSqlSafe(count_sql))
            .bind(namespace)
            .bind(folder_prefix);
        for p in &predicate.params {
            page = page.bind(p);
            count = count.bind(p);
        }
        page = page.bind(after_path);
        let rows = page.fetch_all(self.sql.pool()).await?;
        let total: i64 = count.fetch_one(self.sql.pool()).await?.try_get("n")?;
        Ok(Page {
            files: rows.iter().map(file_from).collect::<Result<_>>()?,
            total,
        })
    }

    /// Up to `limit` files under `folder_prefix` after `after_path`, in path order, that
    /// `filter` lets the caller manage ([`manage_predicate`]), with the blob of their current
    /// version: what a reindex queues. `failed_only` keeps the files whose indexing failed.
    pub(crate) async fn reindex_page(
        &self,
        namespace: &str,
        folder_prefix: &str,
        after_path: &str,
        limit: u32,
        scope: ReindexScope,
        filter: &AccessFilter,
    ) -> Result<Vec<Readable>> {
        let predicate = manage_predicate(filter, COLUMNS, 3);
        let status = if scope.failed_only {
            "status = 'failed'"
        } else {
            "status <> 'deleted'"
        };
        let hidden = if scope.include_hidden {
            ""
        } else {
            " AND hidden = 0"
        };
        self.readable_page(
            namespace,
            folder_prefix,
            &format!("{status}{hidden}"),
            &predicate,
            after_path,
            limit,
        )
        .await
    }

    /// Marks `version_id` of the file pending again (queued to be indexed), if it is still the
    /// file's current version; the row's flags then, or `None` when it no longer is.
    pub(crate) async fn mark_pending(
        &self,
        file_id: &str,
        version_id: &str,
        requested_at_ms: i64,
    ) -> Result<Option<FlagsSnapshot>> {
        let row = sqlx::query(
            "UPDATE kg_files SET status = 'pending', status_reason = '', index_requested_at_ms = $3, \
             queued_at_ms = NULL WHERE file_id = $1 AND version_id = $2 AND status <> 'deleted' \
             RETURNING enabled, hidden, flags_version",
        )
        .bind(file_id)
        .bind(version_id)
        .bind(requested_at_ms)
        .fetch_optional(self.sql.pool())
        .await?;
        row.as_ref().map(flags_from).transpose()
    }

    /// Puts back the status a reindex found (its event could not be queued), unless the
    /// version changed or was requested again since. Outcomes of any earlier request count
    /// again: the one that failed to queue will never answer.
    pub(crate) async fn restore_status(
        &self,
        found: &FileInfo,
        requested_at_ms: i64,
    ) -> Result<()> {
        sqlx::query(
            "UPDATE kg_files SET status = $1, status_reason = $2, index_requested_at_ms = 0 \
             WHERE file_id = $3 AND version_id = $4 AND status = 'pending' \
             AND index_requested_at_ms = $5",
        )
        .bind(status_str(found.status()))
        .bind(&found.status_reason)
        .bind(&found.file_id)
        .bind(&found.version_id)
        .bind(requested_at_ms)
        .execute(self.sql.pool())
        .await?;
        Ok(())
    }

    /// Inserts a new file row or points an existing one at a new version. Returns the row's
    /// flags as this write left them: a flags change that raced the upload is either in them
    /// or has a higher version. With `refuse_hidden` (a caller who may not see hidden files),
    /// a row hidden by the time of the write is left as it was: `WriteDenied`.
    pub(crate) async fn upsert_version(
        &self,
        file: &FileInfo,
        blob_key: &str,
        refuse_hidden: bool,
    ) -> Result<FlagsSnapshot> {
        let mut tx = self.sql.begin_write().await?;
        self.hold_namespace(&mut tx, &file.namespace).await?;
        let updated = sqlx::query(
            "UPDATE kg_files SET version_id = $1, content_sha256 = $2, size = $3, mime = $4, status = $5, status_reason = '', chunk_count = 0, index_requested_at_ms = 0, updated_at_ms = $6, queued_at_ms = NULL WHERE file_id = $7",
        )
        .bind(&file.version_id)
        .bind(&file.content_sha256)
        .bind(file.size)
        .bind(&file.mime)
        .bind(status_str(file.status()))
        .bind(file.updated_at_ms)
        .bind(&file.file_id)
        .execute(&mut *tx)
        .await?;
        if updated.rows_affected() == 0 {
            sqlx::query(
                "INSERT INTO kg_files (file_id, namespace, path, version_id, content_sha256, size, mime, status, status_reason, enabled, hidden, chunk_count, created_at_ms, updated_at_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, '', $9, $10, 0, $11, $12)",
            )
            .bind(&file.file_id)
            .bind(&file.namespace)
            .bind(&file.path)
            .bind(&file.version_id)
            .bind(&file.content_sha256)
            .bind(file.size)
            .bind(&file.mime)
            .bind(status_str(file.status()))
            .bind(i64::from(file.enabled))
            .bind(i64::from(file.hidden))
            .bind(file.created_at_ms)
            .bind(file.updated_at_ms)
            .execute(&mut *tx)
            .await?;
        }
        // After the first write: on SQLite this transaction is the writer now, so a purge
        // committed before it is seen, and none can commit until it ends.
        self.refuse_if_purging(&mut tx, &file.namespace).await?;
        let exists = sqlx::query("SELECT version_id FROM kg_file_versions WHERE version_id = $1")
            .bind(&file.version_id)
            .fetch_optional(&mut *tx)
            .await?;
        if exists.is_none() {
            sqlx::query(
                "INSERT INTO kg_file_versions (version_id, file_id, content_sha256, blob_key, size, mime, created_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(&file.version_id)
            .bind(&file.file_id)
            .bind(&file.content_sha256)
            .bind(blob_key)
            .bind(file.size)
            .bind(&file.mime)
            .bind(file.updated_at_ms)
            .execute(&mut *tx)
            .await?;
        }
        // Inside the transaction, after the row's write: on PostgreSQL a concurrent flags
        // change waits for this commit and then counts one more.
        let flags =
            sqlx::query("SELECT enabled, hidden, flags_version FROM kg_files WHERE file_id = $1")
                .bind(&file.file_id)
                .fetch_one(&mut *tx)
                .await?;
        let flags = flags_from(&flags)?;
        // The caller checked the row it read before; a hide may have landed since. Dropping
        // the transaction rolls the write back.
        if refuse_hidden && flags.hidden {
            return Err(FilesError::WriteDenied(file.namespace.clone()));
        }
        tx.commit().await?;
        Ok(flags)
    }

    /// Records an indexing outcome, only if it is about the current version and, while the
    /// version waits to be indexed again, answers that newest request (`answers_request_at_ms`;
    /// 0 for the upload's own, and for the indexer's own backfills, which apply once it is
    /// answered).
    pub(crate) async fn set_status(&self, outcome: &Outcome<'_>, now_ms: i64) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE kg_files SET status = $1, status_reason = $2, chunk_count = $3, updated_at_ms = $4 \
             WHERE file_id = $5 AND version_id = $6 AND status <> 'deleted' \
             AND (status <> 'pending' OR index_requested_at_ms <= $7)",
        )
        .bind(status_str(outcome.status))
        .bind(outcome.reason)
        .bind(outcome.chunk_count)
        .bind(now_ms)
        .bind(outcome.file_id)
        .bind(outcome.version_id)
        .bind(outcome.answers_request_at_ms)
        .execute(self.sql.pool())
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Sets the flags given (`None` keeps one as it is) in one statement, so two changes at
    /// once to different flags both stay, and counts the change. `None` when no such file.
    pub(crate) async fn set_flags(
        &self,
        file_id: &str,
        enabled: Option<bool>,
        hidden: Option<bool>,
        now_ms: i64,
    ) -> Result<Option<FlagsSnapshot>> {
        let row = sqlx::query(
            "UPDATE kg_files SET enabled = COALESCE($1, enabled), hidden = COALESCE($2, hidden), \
             flags_version = flags_version + 1, updated_at_ms = $3 WHERE file_id = $4 \
             RETURNING enabled, hidden, flags_version",
        )
        .bind(enabled.map(i64::from))
        .bind(hidden.map(i64::from))
        .bind(now_ms)
        .bind(file_id)
        .fetch_optional(self.sql.pool())
        .await?;
        row.as_ref().map(flags_from).transpose()
    }

    /// Up to `limit` registry rows after `after_file_id`, in file id order, of every namespace
    /// and status (deleted ones too), with the blob of their current version: what a replay
    /// into a new event stream publishes. Unfiltered: only the service itself replays, for no
    /// caller.
    /// Records that the indexing event of `file_id`'s current version `version_id` was accepted
    /// by the stream.
    pub(crate) async fn mark_queued(&self, file_id: &str, version_id: &str) -> Result<()> {
        sqlx::query(
            "UPDATE kg_files SET queued_at_ms = $1 WHERE file_id = $2 AND version_id = $3 \
             AND status = 'pending' AND queued_at_ms IS NULL",
        )
        .bind(kg_common::caller::now_ms())
        .bind(file_id)
        .bind(version_id)
        .execute(self.sql.pool())
        .await?;
        Ok(())
    }

    /// Pending files whose indexing event was never accepted by the stream and that were
    /// written (uploaded, or asked to be indexed again) before `before_ms`: a process stopped
    /// between its registry write and its publish left them.
    pub(crate) async fn unqueued(&self, before_ms: i64, limit: u32) -> Result<Vec<Replayed>> {
        let rows = sqlx::query(AssertSqlSafe(replayed_select(
            "status = 'pending' AND queued_at_ms IS NULL \
             AND updated_at_ms < $1 AND index_requested_at_ms < $1",
        )))
        .bind(before_ms)
        .bind(i64::from(limit))
        .fetch_all(self.sql.pool())
        .await?;
        rows.iter().map(replayed_from).collect()
    }

    pub(crate) async fn replay_page(
        &self,
        after_file_id: &str,
        limit: u32,
    ) -> Result<Vec<Replayed>> {
        let rows = sqlx::query(AssertSqlSafe(replayed_select("file_id > $1")))
            .bind(after_file_id.to_owned())
            .bind(i64::from(limit))
            .fetch_all(self.sql.pool())
            .await?;
        rows.iter().map(replayed_from).collect()
    }

    /// Whether the registry marks `file_id` deleted now.
    pub(crate) async fn is_deleted(&self, file_id: &str) -> Result<bool> {
        let row = sqlx::query("SELECT status FROM kg_files WHERE file_id = $1")
            .bind(file_id.to_owned())
            .fetch_optional(self.sql.pool())
            .await?;
        Ok(match row {
            Some(row) => row.try_get::<String, _>(0)? == status_str(FileStatus::Deleted),
            None => false,
        })
    }

    /// The incarnation (creation time, Unix ns) of `stream` last recorded, if any.
    pub(crate) async fn bus_stream_created(&self, stream: &str) -> Result<Option<i64>> {
        let row = sqlx::query("SELECT created_ns FROM kg_bus_streams WHERE stream = $1")
            .bind(stream.to_owned())
            .fetch_optional(self.sql.pool())
            .await?;
        Ok(row.map(|row| row.try_get(0)).transpose()?)
    }

    /// Records `created_ns` as the incarnation of `stream` the registry is published into.
    pub(crate) async fn record_bus_stream(&self, stream: &str, created_ns: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO kg_bus_streams (stream, created_ns) VALUES ($1, $2) \
             ON CONFLICT (stream) DO UPDATE SET created_ns = excluded.created_ns",
        )
        .bind(stream.to_owned())
        .bind(created_ns)
        .execute(self.sql.pool())
        .await?;
        Ok(())
    }

    pub(crate) async fn mark_deleted(&self, file_id: &str, now_ms: i64) -> Result<()> {
        sqlx::query("UPDATE kg_files SET status = 'deleted', status_reason = '', updated_at_ms = $1 WHERE file_id = $2")
            .bind(now_ms)
            .bind(file_id)
            .execute(self.sql.pool())
            .await?;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// The race an upload's first check cannot see: a hide lands between the upload reading
    /// the row and writing it. For a caller who may not see hidden files the write is then
    /// refused and rolled back; the row keeps its version and its flags.
    #[tokio::test]
    async fn an_upload_meeting_a_hide_that_landed_first_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("files.db").display());
        let store = FilesStore::open(SqlStore::connect(&url).await.unwrap())
            .await
            .unwrap();
        let v1 = FileInfo {
            namespace: "ns".into(),
            file_id: "f1".into(),
            version_id: "f1-v1".into(),
            path: "docs/a.md".into(),
            content_sha256: "h1".into(),
            mime: "text/markdown".into(),
            status: FileStatus::Pending as i32,
            enabled: true,
            ..Default::default()
        };
        store.upsert_version(&v1, "blob-1", true).await.unwrap();
        let hidden = store.set_flags("f1", None, Some(true), 2).await.unwrap();
        assert_eq!(hidden.map(|f| (f.hidden, f.version)), Some((true, 1)));

        let v2 = FileInfo {
            version_id: "f1-v2".into(),
            content_sha256: "h2".into(),
            ..v1.clone()
        };
        let refused = store.upsert_version(&v2, "blob-2", true).await;
        assert!(
            matches!(refused, Err(FilesError::WriteDenied(_))),
            "{refused:?}"
        );
        let row = store
            .by_path_unfiltered("ns", "docs/a.md")
            .await
            .unwrap()
            .unwrap();
        assert_eq!((row.version_id.as_str(), row.hidden), ("f1-v1", true));

        // A caller who may see hidden files writes it, and keeps it hidden.
        let flags = store.upsert_version(&v2, "blob-2", false).await.unwrap();
        assert_eq!((flags.hidden, flags.version), (true, 1));
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn disabled_files_pass_only_under_write_prefixes() {
        let mixed = AccessFilter {
            allow_prefixes: strings(&["docs/", "team/"]),
            write_prefixes: strings(&["team/"]),
            deny_file_ids: strings(&["f9"]),
            enabled_only: true,
            visible_only: true,
            ..Default::default()
        };
        let p = manage_predicate(&mixed, COLUMNS, 3);
        assert_eq!(
            p.text,
            "((hidden = 0 AND (substr(path, 1, length($3)) = $3 OR substr(path, 1, length($4)) = $4) AND file_id <> $5) AND (enabled = 1 OR substr(path, 1, length($6)) = $6))"
        );
        assert_eq!(p.params, strings(&["docs/", "team/", "f9", "team/"]));

        // A reader: exactly the read predicate.
        let reader = AccessFilter {
            write_prefixes: Vec::new(),
            ..mixed.clone()
        };
        let p = manage_predicate(&reader, COLUMNS, 3);
        assert_eq!(p, sql_predicate(&reader, COLUMNS, 3));
        assert!(p.text.contains("enabled = 1"));

        // Writes everywhere: disabled files everywhere.
        let writer = AccessFilter {
            write_prefixes: strings(&[""]),
            ..mixed.clone()
        };
        assert!(
            !manage_predicate(&writer, COLUMNS, 3)
                .text
                .contains("enabled")
        );

        // Nothing readable stays nothing, whatever the write prefixes.
        let nothing = AccessFilter {
            allow_prefixes: Vec::new(),
            ..mixed
        };
        assert!(
            manage_predicate(&nothing, COLUMNS, 1)
                .text
                .starts_with("((1 = 0) AND")
        );
    }
}

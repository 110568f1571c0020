//! The files domain: upload (blob + registry + event), lookups and listings
//! under the caller's access filter, flags and deletes, and indexing status.

use std::sync::Arc;

use kg_common::access::{normalize_folder_prefix, normalize_path, validate_namespace};
use kg_common::caller::{access_for, now_ms};
use kg_proto::v1::{
    AccessFilter, CallerContext, FileChangeOp, FileChanged, FileIndexed, FileInfo, FileStatus,
    ListFilesResponse, Permission, ReindexRequest, ReindexResponse, UploadResponse,
};
use kg_stores::blobs::BlobStore;
use kg_stores::events;
use sha2::{Digest as _, Sha256};

use crate::error::{FilesError, Result, retry_lost_race};
use crate::limits::QueryLimits;
use crate::query::sql::SqlEngine;
use crate::store::{FileSelector, FilesStore, Outcome, ReindexScope};
use crate::versions::VersionStore;

/// Default and largest page of `ListFiles`.
const DEFAULT_PAGE: u32 = 100;
const MAX_PAGE: u32 = 1000;
/// Default and largest page of `Reindex`: a call stays well inside a gateway's deadline.
const DEFAULT_REINDEX_PAGE: u32 = 1000;
const MAX_REINDEX_PAGE: u32 = 5000;
/// Unqueued versions queued again per sweep (the rest at the next one).
const UNQUEUED_PAGE: u32 = 500;

/// The files service's state.
#[derive(Clone)]
pub struct FilesService {
    pub(crate) store: FilesStore,
    pub(crate) blobs: BlobStore,
    pub(crate) jetstream: async_nats::jetstream::Context,
    pub(crate) max_upload_bytes: usize,
    pub(crate) versions: VersionStore,
    pub(crate) limits: Arc<QueryLimits>,
    pub(crate) sql: Arc<SqlEngine>,
}

/// A version id derived from the file and its content: the same bytes at the
/// same file always get the same id, so re-uploads and redeliveries dedupe.
pub(crate) fn version_id(file_id: &str, content_sha256: &str) -> String {
    let digest = Sha256::digest(format!("{file_id}\0{content_sha256}").as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Uuid::new_v8(bytes).to_string()
}

pub(crate) fn guess_mime(path: &str, given: &str) -> String {
    if !given.trim().is_empty() && given != "application/octet-stream" {
        return given.trim().to_owned();
    }
    let lower = path.to_ascii_lowercase();
    // Types the indexer understands first; mime_guess for the rest.
    for (ext, mime) in [
        (".md", "text/markdown"),
        (".markdown", "text/markdown"),
        (".txt", "text/plain"),
        (".csv", "text/csv"),
        (".tsv", "text/tab-separated-values"),
        (".json", "application/json"),
    ] {
        if lower.ends_with(ext) {
            return mime.to_owned();
        }
    }
    mime_guess::from_path(path)
        .first_or_octet_stream()
        .essence_str()
        .to_owned()
}

/// The prefixes the caller may write in the namespace of `access`: the write prefixes auth
/// resolved, each inside a readable prefix. None below write permission, and none when auth
/// named none (fail closed): `permission` is the highest level held anywhere in the
/// namespace, not a level held on every readable path.
pub(crate) fn write_prefixes(access: &AccessFilter) -> Vec<String> {
    if access.permission < Permission::Write as i32 {
        return Vec::new();
    }
    access
        .write_prefixes
        .iter()
        .filter(|w| {
            access
                .allow_prefixes
                .iter()
                .any(|a| w.starts_with(a.as_str()))
        })
        .cloned()
        .collect()
}

/// The filter of `get_file` and `list_files` (and of branch and release counts): `access`
/// with `write_prefixes` set to what the caller may write. Writers manage files, so the
/// store's management predicate lets disabled files through under those prefixes, and only
/// there ([`crate::store::manage_predicate`]).
pub(crate) fn read_filter(access: &AccessFilter) -> AccessFilter {
    AccessFilter {
        write_prefixes: write_prefixes(access),
        ..access.clone()
    }
}

impl FilesService {
    /// A probe of the registry's database, for the health service.
    pub fn store_probe(&self) -> kg_common::grpc::StoreProbe {
        self.store.health_probe()
    }

    /// Opens the registry (running migrations), the blob store and JetStream.
    pub async fn new(
        sql: kg_stores::sql::SqlStore,
        blobs: BlobStore,
        jetstream: async_nats::jetstream::Context,
        max_upload_bytes: usize,
    ) -> Result<Self> {
        events::ensure_streams(&jetstream).await?;
        let limits = QueryLimits::default();
        Ok(Self {
            versions: VersionStore::new(sql.clone()),
            store: FilesStore::open(sql).await?,
            blobs,
            jetstream,
            max_upload_bytes,
            sql: Arc::new(SqlEngine::new(limits.sql_memory_bytes)?),
            limits: Arc::new(limits),
        })
    }

    /// Replaces the budgets of `FindFiles` and `QueryFile`.
    pub fn with_query_limits(mut self, limits: QueryLimits) -> Result<Self> {
        self.sql = Arc::new(SqlEngine::new(limits.sql_memory_bytes)?);
        self.limits = Arc::new(limits);
        Ok(self)
    }

    /// The budgets of `FindFiles` and `QueryFile`.
    pub fn query_limits(&self) -> &QueryLimits {
        &self.limits
    }

    /// The caller's access to `namespace` if it may write `path`: under one of its write
    /// prefixes and outside every denied folder.
    pub(crate) fn writable<'a>(
        caller: &'a CallerContext,
        namespace: &str,
        path: &str,
    ) -> Result<&'a AccessFilter> {
        let access = access_for(caller, namespace)?;
        let under = |prefixes: &[String]| prefixes.iter().any(|p| path.starts_with(p.as_str()));
        if !under(&write_prefixes(access)) || under(&access.deny_prefixes) {
            return Err(FilesError::WriteDenied(namespace.to_owned()));
        }
        Ok(access)
    }

    /// Refuses a write over the existing file `file_id` (at a path [`Self::writable`]
    /// allowed) unless the caller may see it: its id is not denied, and it is not hidden
    /// from a caller who does not see hidden files. The refusal is the one of any write the
    /// caller may not make, naming nothing of the file.
    pub(crate) fn may_overwrite(
        access: &AccessFilter,
        namespace: &str,
        file_id: &str,
        hidden: bool,
    ) -> Result<()> {
        if access.deny_file_ids.iter().any(|f| f == file_id) || (access.visible_only && hidden) {
            return Err(FilesError::WriteDenied(namespace.to_owned()));
        }
        Ok(())
    }

    /// Stores a file's content; returns the registry row and whether it changed.
    pub async fn upload(
        &self,
        caller: &CallerContext,
        namespace: &str,
        path: &str,
        content: &[u8],
        mime: &str,
    ) -> Result<UploadResponse> {
        validate_namespace(namespace)?;
        let path = normalize_path(path)?;
        let access = Self::writable(caller, namespace, &path)?;
        self.refuse_while_purging(namespace).await?;
        if content.len() > self.max_upload_bytes {
            return Err(FilesError::TooLarge {
                size: content.len(),
                limit: self.max_upload_bytes,
            });
        }
        let content_sha256 = hex::encode(Sha256::digest(content));
        // Two uploads of one new path at once both find no row and make a file id each; the
        // second insert then breaks UNIQUE(namespace, path). It reads the path again and
        // joins the first one's file id, so a client's retry after a timeout never fails.
        retry_lost_race(|| {
            self.upload_once(access, namespace, &path, content, mime, &content_sha256)
        })
        .await
    }

    async fn upload_once(
        &self,
        access: &AccessFilter,
        namespace: &str,
        path: &str,
        content: &[u8],
        mime: &str,
        content_sha256: &str,
    ) -> Result<UploadResponse> {
        let path = path.to_owned();
        let content_sha256 = content_sha256.to_owned();
        let existing = self.store.by_path_unfiltered(namespace, &path).await?;
        // Before anything of the row reaches the caller (its metadata, or "unchanged" as
        // an answer to "is this its content?").
        if let Some(current) = &existing {
            Self::may_overwrite(access, namespace, &current.file_id, current.hidden)?;
        }
        if let Some(current) = &existing
            && current.content_sha256 == content_sha256
            && current.status() != FileStatus::Deleted
        {
            if current.status() == FileStatus::Failed {
                return self.retry_failed(current, content).await;
            }
            return Ok(UploadResponse {
                file: Some(current.clone()),
                changed: false,
                requeued: false,
            });
        }
        let blob_key = self.blobs.put(content).await?;
        let now = now_ms();
        let file_id = existing
            .as_ref()
            .map(|f| f.file_id.clone())
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let mut file = FileInfo {
            namespace: namespace.to_owned(),
            version_id: version_id(&file_id, &content_sha256),
            file_id,
            path: path.clone(),
            content_sha256,
            size: i64::try_from(content.len()).unwrap_or(i64::MAX),
            mime: guess_mime(&path, mime),
            status: FileStatus::Pending as i32,
            status_reason: String::new(),
            enabled: existing.as_ref().is_none_or(|f| f.enabled),
            hidden: existing.as_ref().is_some_and(|f| f.hidden),
            created_at_ms: existing.as_ref().map_or(now, |f| f.created_at_ms),
            updated_at_ms: now,
            chunk_count: 0,
        };
        let flags = self
            .store
            .upsert_version(&file, &blob_key, access.visible_only)
            .await?;
        // The flags the row holds now: a flags change since `existing` was read is in them.
        file.enabled = flags.enabled;
        file.hidden = flags.hidden;
        self.publish(&file, &blob_key, FileChangeOp::Upsert, flags.version)
            .await?;
        Ok(UploadResponse {
            file: Some(file),
            changed: true,
            requeued: false,
        })
    }

    /// The same content again over a version whose indexing failed: the upload is the retry
    /// the failure's reason asks for, so the version is queued to be indexed again. Its blob
    /// is stored again first, in case a lost blob was the failure.
    async fn retry_failed(&self, current: &FileInfo, content: &[u8]) -> Result<UploadResponse> {
        let blob_key = self.blobs.put(content).await?;
        let Some(file) = self.requeue(current, &blob_key, now_ms()).await? else {
            // Replaced or deleted since it was read: the caller's next upload sees the change.
            return Err(FilesError::Busy(
                "the file changed while this upload ran; upload it again".to_owned(),
            ));
        };
        Ok(UploadResponse {
            file: Some(file),
            changed: false,
            requeued: true,
        })
    }

    /// Marks `current`'s version pending and publishes it to be rebuilt (see
    /// `FileChanged.rebuild_at_ms`); the file as it now stands, or `None` when that version is
    /// no longer the file's. When the publish fails, the status found is put back.
    async fn requeue(
        &self,
        current: &FileInfo,
        blob_key: &str,
        rebuild_at_ms: i64,
    ) -> Result<Option<FileInfo>> {
        let Some(flags) = self
            .store
            .mark_pending(&current.file_id, &current.version_id, rebuild_at_ms)
            .await?
        else {
            return Ok(None);
        };
        let file = FileInfo {
            enabled: flags.enabled,
            hidden: flags.hidden,
            status: FileStatus::Pending as i32,
            status_reason: String::new(),
            ..current.clone()
        };
        let event = FileChanged {
            rebuild_at_ms,
            ..change_event(&file, blob_key, FileChangeOp::Upsert, flags.version)
        };
        // The id names the request, so the stream keeps it beside the version's first upsert.
        let msg_id = format!("{}:rebuild:{rebuild_at_ms}", file.version_id);
        if let Err(err) = events::publish_file_change(&self.jetstream, &event, &msg_id).await {
            tracing::error!(error = %err.detail(), file_id = %file.file_id, "could not queue a file to be indexed again");
            self.store.restore_status(current, rebuild_at_ms).await?;
            return Err(FilesError::QueueUnavailable);
        }
        self.note_queued(&file).await;
        Ok(Some(file))
    }

    /// Queues the current version of the files under `folder_prefix` the caller manages
    /// (with `failed_only`, of those whose indexing failed) to be indexed again, `limit` at
    /// most after `cursor`, in path order: a bounded call whatever the namespace's size.
    /// Each is marked pending, then its event is published; a failed publish puts its status
    /// back and stops the call.
    pub async fn reindex(
        &self,
        caller: &CallerContext,
        request: &ReindexRequest,
    ) -> Result<ReindexResponse> {
        let namespace = request.namespace.as_str();
        validate_namespace(namespace)?;
        let folder_prefix = normalize_folder_prefix(&request.folder_prefix)?;
        let limit = match request.limit {
            0 => DEFAULT_REINDEX_PAGE,
            n if n > MAX_REINDEX_PAGE => {
                return Err(FilesError::Invalid(format!(
                    "limit {n} is over the maximum of {MAX_REINDEX_PAGE}"
                )));
            }
            n => n,
        };
        let after = decode_cursor(&request.cursor, &folder_prefix)?;
        let access = access_for(caller, namespace)?;
        let admin_here = access.permission >= Permission::Admin as i32
            && access
                .admin_prefixes
                .iter()
                .any(|admin| folder_prefix.starts_with(admin.as_str()));
        if !admin_here {
            return Err(FilesError::ReindexDenied {
                namespace: namespace.to_owned(),
                folder: if folder_prefix.is_empty() {
                    "/".to_owned()
                } else {
                    folder_prefix
                },
            });
        }
        let scope = ReindexScope {
            failed_only: request.failed_only,
            include_hidden: !access.visible_only,
        };
        let page = self
            .store
            .reindex_page(
                namespace,
                &folder_prefix,
                &after,
                limit,
                scope,
                &read_filter(access),
            )
            .await?;
        let rebuild_at_ms = now_ms();
        let mut queued: Vec<FileInfo> = Vec::with_capacity(page.len());
        for found in &page {
            match self
                .requeue(&found.file, &found.blob_key, rebuild_at_ms)
                .await
            {
                Ok(Some(file)) => queued.push(file),
                Ok(None) => {}
                Err(FilesError::QueueUnavailable) => {
                    return Err(FilesError::ReindexInterrupted {
                        queued: queued.len(),
                    });
                }
                Err(err) => return Err(err),
            }
        }
        let next_cursor = match page.last() {
            Some(last) if page.len() == limit as usize => {
                encode_cursor(&folder_prefix, &last.file.path)
            }
            _ => String::new(),
        };
        tracing::info!(namespace, folder = %folder_prefix, failed_only = request.failed_only, queued = queued.len(), "files queued to be indexed again");
        Ok(ReindexResponse {
            queued: i64::try_from(queued.len()).unwrap_or(i64::MAX),
            next_cursor,
            files: queued,
        })
    }

    /// Publishes a change of `file`, whose flags are those of the file's `flags_version`th
    /// flags change.
    async fn publish(
        &self,
        file: &FileInfo,
        blob_key: &str,
        op: FileChangeOp,
        flags_version: i64,
    ) -> Result<()> {
        let event = change_event(file, blob_key, op, flags_version);
        let op_name = match op {
            FileChangeOp::Upsert => "upsert",
            FileChangeOp::Delete => "delete",
            FileChangeOp::Flags => "flags",
            FileChangeOp::Unspecified => "unspecified",
        };
        // Every upload has an id of its own (a retry inside this publish keeps it): content
        // going back to an earlier version within the stream's duplicate window, or coming
        // back after a delete, is the same version, and the stream dropped it as a duplicate,
        // leaving the row pending for good. Each flags change too: two in one millisecond
        // shared one before.
        let msg_id = match op {
            FileChangeOp::Upsert => {
                format!("{}:{op_name}:{}", file.version_id, uuid::Uuid::now_v7())
            }
            FileChangeOp::Flags => format!("{}:{op_name}:v{flags_version}", file.file_id),
            _ => format!("{}:{op_name}:{}", file.version_id, file.updated_at_ms),
        };
        if let Err(err) = events::publish_file_change(&self.jetstream, &event, &msg_id).await {
            tracing::error!(error = %err.detail(), file_id = %file.file_id, "could not publish file change");
            if op == FileChangeOp::Upsert {
                let reason = "could not be queued for indexing; upload it again";
                let outcome = Outcome {
                    file_id: &file.file_id,
                    version_id: &file.version_id,
                    status: FileStatus::Failed,
                    reason,
                    chunk_count: 0,
                    answers_request_at_ms: 0,
                };
                let _ = self.store.set_status(&outcome, now_ms()).await;
            }
            return Err(FilesError::QueueUnavailable);
        }
        if op == FileChangeOp::Upsert {
            self.note_queued(file).await;
        }
        Ok(())
    }

    /// Records that `file`'s indexing event is in the stream. Not recording it only means the
    /// version is queued once more later ([`Self::queue_unqueued`]), so a failure is logged.
    pub(crate) async fn note_queued(&self, file: &FileInfo) {
        if let Err(err) = self
            .store
            .mark_queued(&file.file_id, &file.version_id)
            .await
        {
            tracing::warn!(error = %kg_common::error::detail(&err), file_id = %file.file_id, "could not record that a version was queued; it will be queued again");
        }
    }

    /// Queues again the pending versions whose event never reached the stream and that were
    /// written before `before_ms` (a process stopped between the registry write and the
    /// publish: the file stayed pending for good, and uploading the same content again changed
    /// nothing). The number queued.
    pub async fn queue_unqueued(&self, before_ms: i64) -> Result<usize> {
        let stuck = self.store.unqueued(before_ms, UNQUEUED_PAGE).await?;
        for row in &stuck {
            let file = &row.current.file;
            let mut event = change_event(
                file,
                &row.current.blob_key,
                FileChangeOp::Upsert,
                row.flags_version,
            );
            let msg_id = if row.index_requested_at_ms > 0 {
                // The reindex's own id: if its publish did reach the stream, this is dropped.
                event.rebuild_at_ms = row.index_requested_at_ms;
                format!("{}:rebuild:{}", file.version_id, row.index_requested_at_ms)
            } else {
                format!("{}:upsert:{}", file.version_id, uuid::Uuid::now_v7())
            };
            events::publish_file_change(&self.jetstream, &event, &msg_id).await?;
            self.note_queued(file).await;
        }
        if !stuck.is_empty() {
            tracing::warn!(
                queued = stuck.len(),
                "queued again versions whose indexing event never reached the stream"
            );
        }
        Ok(stuck.len())
    }

    /// One file by path or id, if the caller may see it.
    pub async fn get_file(
        &self,
        caller: &CallerContext,
        namespace: &str,
        path: Option<&str>,
        file_id: Option<&str>,
    ) -> Result<FileInfo> {
        validate_namespace(namespace)?;
        let filter = read_filter(access_for(caller, namespace)?);
        let (selector, shown) = match (path, file_id) {
            (Some(p), None) => {
                let p = normalize_path(p)?;
                let found = self
                    .store
                    .get(namespace, FileSelector::Path(&p), &filter)
                    .await?;
                (found, p)
            }
            (None, Some(id)) => (
                self.store
                    .get(namespace, FileSelector::Id(id), &filter)
                    .await?,
                id.to_owned(),
            ),
            _ => {
                return Err(FilesError::Invalid(
                    "pass exactly one of path or fileId".to_owned(),
                ));
            }
        };
        selector.ok_or_else(|| FilesError::NotFound(format!("{namespace}/{shown}")))
    }

    /// A page of files, ordered by path.
    pub async fn list_files(
        &self,
        caller: &CallerContext,
        namespace: &str,
        folder_prefix: &str,
        limit: u32,
        cursor: &str,
        include_hidden: bool,
    ) -> Result<ListFilesResponse> {
        validate_namespace(namespace)?;
        let access = access_for(caller, namespace)?;
        let filter = read_filter(access);
        let limit = match limit {
            0 => DEFAULT_PAGE,
            n if n > MAX_PAGE => {
                return Err(FilesError::Invalid(format!(
                    "limit {n} is over the maximum of {MAX_PAGE}"
                )));
            }
            n => n,
        };
        let folder_prefix = normalize_folder_prefix(folder_prefix)?;
        let after = decode_cursor(cursor, &folder_prefix)?;
        // Hidden files are for people who manage the namespace.
        let include_hidden = include_hidden && access.permission >= Permission::Write as i32;
        let page = self
            .store
            .list(
                namespace,
                &folder_prefix,
                &after,
                limit,
                include_hidden,
                &filter,
            )
            .await?;
        let next_cursor = if page.files.len() == limit as usize {
            page.files
                .last()
                .map(|f| encode_cursor(&folder_prefix, &f.path))
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok(ListFilesResponse {
            files: page.files,
            next_cursor,
            total: page.total,
        })
    }

    /// Changes `enabled` / `hidden` and tells every lane.
    pub async fn set_flags(
        &self,
        caller: &CallerContext,
        namespace: &str,
        file_id: &str,
        enabled: Option<bool>,
        hidden: Option<bool>,
    ) -> Result<FileInfo> {
        let mut file = self
            .get_file(caller, namespace, None, Some(file_id))
            .await?;
        Self::writable(caller, namespace, &file.path)?;
        file.updated_at_ms = now_ms();
        // Only the flags asked for change, in one statement: a concurrent change of the other
        // flag is kept, not overwritten with what `file` read before it.
        let flags = self
            .store
            .set_flags(&file.file_id, enabled, hidden, file.updated_at_ms)
            .await?
            .ok_or_else(|| FilesError::NotFound(format!("{namespace}/{file_id}")))?;
        file.enabled = flags.enabled;
        file.hidden = flags.hidden;
        self.publish(&file, "", FileChangeOp::Flags, flags.version)
            .await?;
        Ok(file)
    }

    /// Deletes a file from the registry and every lane. Deleting a deleted file sends the
    /// delete again: the registry marks a file deleted before the event goes out, so when
    /// publishing failed (`unavailable`), the caller's retry is what still takes the file
    /// out of the graph and vector lanes.
    pub async fn delete_file(
        &self,
        caller: &CallerContext,
        namespace: &str,
        file_id: &str,
    ) -> Result<bool> {
        validate_namespace(namespace)?;
        let filter = read_filter(access_for(caller, namespace)?);
        let mut file = self
            .store
            .get_with_deleted(namespace, FileSelector::Id(file_id), &filter, true)
            .await?
            .ok_or_else(|| FilesError::NotFound(format!("{namespace}/{file_id}")))?;
        Self::writable(caller, namespace, &file.path)?;
        file.updated_at_ms = now_ms();
        if file.status() != FileStatus::Deleted {
            self.store
                .mark_deleted(&file.file_id, file.updated_at_ms)
                .await?;
        }
        // A delete's flags are never applied: its flags version does not matter.
        self.publish(&file, "", FileChangeOp::Delete, 0).await?;
        Ok(true)
    }

    /// Applies an indexing outcome published by the indexer. Returns whether it changed
    /// anything (a status row, or for a branch upload its metadata and links).
    pub async fn apply_indexed(&self, event: &FileIndexed) -> Result<bool> {
        let status = match FileStatus::try_from(event.status) {
            Ok(s @ (FileStatus::Indexed | FileStatus::Failed | FileStatus::Stored)) => s,
            _ => return Ok(false),
        };
        // A branch upload shares its version id with main when main holds the same content
        // under the same file id; main's row must stay pending until main's graph is written.
        if event.branch_only {
            return self.store_version_links(event).await;
        }
        // Before the status: a version reads as indexed only once its links are stored.
        self.store_version_links(event).await?;
        let outcome = Outcome {
            file_id: &event.file_id,
            version_id: &event.version_id,
            status,
            reason: &event.reason,
            chunk_count: event.chunk_count,
            answers_request_at_ms: event.rebuild_at_ms,
        };
        self.store.set_status(&outcome, now_ms()).await
    }
}

/// The change event of `file`'s current version.
pub(crate) fn change_event(
    file: &FileInfo,
    blob_key: &str,
    op: FileChangeOp,
    flags_version: i64,
) -> FileChanged {
    FileChanged {
        namespace: file.namespace.clone(),
        file_id: file.file_id.clone(),
        version_id: file.version_id.clone(),
        path: file.path.clone(),
        mime: file.mime.clone(),
        blob_key: blob_key.to_owned(),
        content_sha256: file.content_sha256.clone(),
        size: file.size,
        op: op as i32,
        enabled: file.enabled,
        hidden: file.hidden,
        changed_at_ms: file.updated_at_ms,
        requeued: false,
        flags_version,
        rebuild_at_ms: 0,
    }
}

/// A listing's cursor: the folder it lists and the last path returned. Bound to the folder:
/// resumed under another one, its path would end that listing early or skip files.
fn encode_cursor(folder_prefix: &str, path: &str) -> String {
    hex::encode(format!("{folder_prefix}\n{path}").as_bytes())
}

fn decode_cursor(cursor: &str, folder_prefix: &str) -> Result<String> {
    if cursor.is_empty() {
        return Ok(String::new());
    }
    // A path holds no control character; one in a forged cursor (a NUL, which PostgreSQL
    // refuses in text) is refused here, not by the store as an internal error.
    let (folder, path) = hex::decode(cursor)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|text| {
            let (folder, path) = text.split_once('\n')?;
            let clean = |s: &str| !s.chars().any(char::is_control);
            (clean(folder) && clean(path)).then(|| (folder.to_owned(), path.to_owned()))
        })
        .ok_or_else(|| {
            FilesError::Invalid(
                "cursor is not one this service returned; start without a cursor".to_owned(),
            )
        })?;
    if folder != folder_prefix {
        return Err(FilesError::Invalid(
            "cursor belongs to a listing of another folder; repeat the folderPrefix of the call \
             that returned it, or start without a cursor"
                .to_owned(),
        ));
    }
    Ok(path)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn writes_only_under_write_prefixes_and_fail_closed() {
        let access = AccessFilter {
            namespace: "ns".into(),
            allow_prefixes: strings(&["docs/", "team/"]),
            write_prefixes: strings(&["team/", "elsewhere/"]),
            deny_prefixes: strings(&["team/locked/"]),
            permission: Permission::Write as i32,
            ..Default::default()
        };
        let caller = CallerContext {
            access: vec![access.clone()],
            ..Default::default()
        };
        // A write prefix outside every readable one is ignored.
        assert_eq!(write_prefixes(&access), strings(&["team/"]));
        assert!(FilesService::writable(&caller, "ns", "team/a.md").is_ok());
        for refused in ["docs/a.md", "team/locked/a.md", "elsewhere/a.md", "a.md"] {
            let err = FilesService::writable(&caller, "ns", refused).unwrap_err();
            assert!(
                matches!(err, FilesError::WriteDenied(_)),
                "{refused}: {err}"
            );
        }

        // Below write, or no write prefixes named: nothing is writable.
        let reader = AccessFilter {
            permission: Permission::Read as i32,
            ..access.clone()
        };
        assert!(write_prefixes(&reader).is_empty());
        let unnamed = AccessFilter {
            write_prefixes: Vec::new(),
            permission: Permission::Admin as i32,
            ..access.clone()
        };
        assert!(write_prefixes(&unnamed).is_empty());

        // A denied or (for a caller who does not see them) hidden file is not overwritten.
        assert!(FilesService::may_overwrite(&access, "ns", "f1", true).is_ok());
        let denied = AccessFilter {
            deny_file_ids: strings(&["f1"]),
            visible_only: true,
            ..access
        };
        assert!(FilesService::may_overwrite(&denied, "ns", "f1", false).is_err());
        assert!(FilesService::may_overwrite(&denied, "ns", "f2", true).is_err());
        assert!(FilesService::may_overwrite(&denied, "ns", "f2", false).is_ok());
    }

    #[test]
    fn version_ids_are_content_addressed_uuids() {
        let a = version_id("f1", "abc");
        assert_eq!(a, version_id("f1", "abc"));
        assert_ne!(a, version_id("f2", "abc"));
        assert_ne!(a, version_id("f1", "abd"));
        assert!(uuid::Uuid::parse_str(&a).is_ok());
    }

    #[test]
    fn a_list_cursor_holds_a_path_of_its_folder() {
        assert_eq!(
            decode_cursor(&encode_cursor("notes/", "notes/a.md"), "notes/").unwrap(),
            "notes/a.md"
        );
        for forged in ["zz", "00", "6e6f74657300", &hex::encode("notes/a.md")] {
            let err = decode_cursor(forged, "notes/").unwrap_err();
            assert!(err.to_string().contains("start without a cursor"), "{err}");
        }
        // Another folder's cursor, the whole namespace's included, is refused.
        for other in ["", "pg/", "notes/sub/"] {
            let err = decode_cursor(&encode_cursor("notes/", "notes/a.md"), other).unwrap_err();
            assert!(err.to_string().contains("another folder"), "{other}: {err}");
        }
    }

    #[test]
    fn mime_is_guessed_from_the_path() {
        assert_eq!(guess_mime("a/b.md", ""), "text/markdown");
        assert_eq!(guess_mime("x.CSV", "application/octet-stream"), "text/csv");
        assert_eq!(guess_mime("x.bin", "image/png"), "image/png");
    }

    #[test]
    fn cursors_round_trip_and_garbage_is_refused() {
        assert_eq!(
            decode_cursor(&encode_cursor("", "a/b.md"), "").ok(),
            Some("a/b.md".to_owned())
        );
        assert!(decode_cursor("zz", "").is_err());
    }
}

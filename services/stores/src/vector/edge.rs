//! [`EdgeIndex`]: the vector index as an embedded qdrant-edge shard in a directory.
//!
//! qdrant-edge is synchronous, so every call runs on tokio's blocking pool. Writes are
//! serialised by our own mutex and flushed before they return: the shard does not
//! replay its WAL on load, and its `flush` panics when it meets a concurrent writer.
//! One process holds one shard per directory (a second `open` shares it), because two
//! shards on the same files would overwrite each other.
//!
//! qdrant-edge has no background optimizer either: without one, every point stays in a plain
//! (brute-force) segment and deletes are never vacuumed. Each shard runs
//! [`optimize_in_background`]: once after it opens, then after writes settle (no write for
//! [`OptimizeSchedule::idle`]) or after [`OptimizeSchedule::every_points`] written points.
//!
//! An index is two shards: chunk points in the directory itself, file points in its
//! [`FILE_SHARD_DIR`] subdirectory. A file search in one shard with both had to filter
//! `kind = file` out of every point: at 100k chunks and 6.7k files the filtered plain scan
//! took 1.6 ms p50 per similar-files lookup, HNSW over the file shard alone 0.27 ms (recall
//! 0.987 against the exact answer). Opening an index moves file points still in the chunk
//! shard (written before the split) into the file shard.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use kg_proto::v1::AccessFilter;
use qdrant_edge::{
    ConditionalInsertOperation, CountRequest, CreateIndex, DEFAULT_VECTOR_NAME, Distance,
    EdgeConfig, EdgeShard, EdgeVectorParams, FieldIndexOperations, Filter, NamedQuery, Payload,
    PayloadFieldSchema, PayloadOps, PayloadSchemaType, PointId, PointInsertOperations,
    PointOperations, PointStructPersisted, QueryEnum, QueryRequest, ScoringQuery, ScrollRequest,
    SetPayloadOp, UpdateMode, UpdateOperation, VectorInternal, VectorStructInternal,
    VectorStructPersisted, WithPayloadInterface, WithVector,
};
use serde_json::{Map, Value};

use super::filter;
use super::{
    FieldValue, HIT_FIELDS, PointKind, Scope, UPSERT_BATCH, VectorError, VectorHit, VectorPoint,
    payload_fields, schema, validate_point, validate_query,
};

/// The file qdrant-edge writes its configuration to; its presence means "a shard exists".
const EDGE_CONFIG_FILE: &str = "edge_config.json";

/// The file shard's directory, inside the chunk shard's (qdrant-edge only touches its own
/// `segments`, `wal` and `temp_segments` there).
pub const FILE_SHARD_DIR: &str = "file-points";

/// Vectors below which (in KB, about 660 vectors of 384 dimensions) the file shard is
/// scanned rather than indexed, and its searches scan rather than walk HNSW. The engine's
/// default of 20 MB would leave every file set up to ~13k files to a filtered scan.
const FILE_SHARD_THRESHOLD_KB: usize = 1_000;

/// What a shard holds; decides the configuration of a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ShardRole {
    Chunks,
    Files,
}

/// Payload fields with an index: the ones filters test (not `anchoredPath`, whose
/// text match must stay a substring test).
pub(crate) const INDEXED_FIELDS: [(&str, IndexType); 8] = [
    (schema::NAMESPACE, IndexType::Keyword),
    (schema::KIND, IndexType::Keyword),
    (schema::FILE_ID, IndexType::Keyword),
    (schema::FOLDER_PREFIXES, IndexType::Keyword),
    (schema::COLLECTIONS, IndexType::Keyword),
    (schema::ENABLED, IndexType::Bool),
    (schema::HIDDEN, IndexType::Bool),
    // The indexer's lookup of stored vectors by the text they were embedded from.
    (schema::EMBED_HASH, IndexType::Keyword),
];

/// The payload index types the schema uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IndexType {
    Keyword,
    Bool,
}

/// Open shards by canonical directory, so one process never loads a directory twice.
static OPEN_SHARDS: LazyLock<Mutex<HashMap<PathBuf, Weak<Shard>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

#[derive(Debug)]
struct Shard {
    shard: EdgeShard,
    /// Serialises update + flush + optimize (see the module comment).
    writes: Mutex<()>,
    dir: PathBuf,
    dimension: usize,
    /// Writes not yet optimized, for [`optimize_in_background`].
    pending: Mutex<Pending>,
    /// Wakes the background optimizer: after a write, and when the shard is dropped.
    wake: Arc<tokio::sync::Notify>,
}

impl Drop for Shard {
    fn drop(&mut self) {
        // Lets the background optimizer see the shard is gone and end.
        self.wake.notify_one();
    }
}

/// When the background optimizer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OptimizeSchedule {
    /// Quiet time after the last write: an ingest writes file by file, and an HNSW build
    /// holds the write lock, so it waits for the writes to settle.
    pub(crate) idle: Duration,
    /// Points written since the last run that start one even while writes go on, so a
    /// long ingest is searched through HNSW long before it ends.
    pub(crate) every_points: usize,
}

impl OptimizeSchedule {
    pub(crate) const DEFAULT: OptimizeSchedule = OptimizeSchedule {
        idle: Duration::from_secs(5),
        every_points: 50_000,
    };
}

/// Writes since the last optimizer run.
#[derive(Debug, Default)]
struct Pending {
    points: usize,
    last_write: Option<Instant>,
    /// Optimizer runs so far (a test reads it).
    runs: u64,
}

/// The embedded vector index. Cheap to clone; clones share the shards.
#[derive(Debug, Clone)]
pub struct EdgeIndex {
    chunks: Arc<Shard>,
    files: Arc<Shard>,
}

fn engine(err: impl std::fmt::Display) -> VectorError {
    VectorError::internal(err)
}

impl EdgeIndex {
    /// Opens the shard in `dir` (created when missing) for `dimension`-sized vectors with
    /// cosine distance, and makes sure its payload indexes exist.
    pub async fn open(dir: impl Into<PathBuf>, dimension: usize) -> Result<Self, VectorError> {
        if dimension == 0 {
            return Err(VectorError::invalid("dimension", "must be at least 1"));
        }
        Self::open_scheduled(dir.into(), dimension, OptimizeSchedule::DEFAULT).await
    }

    pub(crate) async fn open_scheduled(
        dir: PathBuf,
        dimension: usize,
        schedule: OptimizeSchedule,
    ) -> Result<Self, VectorError> {
        let (chunks, files, opened) = blocking(move || {
            let (chunks, chunks_opened) = open_shard(&dir, dimension, ShardRole::Chunks)?;
            let file_dir = chunks.dir.join(FILE_SHARD_DIR);
            let (files, files_opened) = open_shard(&file_dir, dimension, ShardRole::Files)?;
            Ok((chunks, files, [chunks_opened, files_opened]))
        })
        .await?;
        for (shard, opened) in [&chunks, &files].into_iter().zip(opened) {
            if opened {
                tokio::spawn(optimize_in_background(
                    Arc::downgrade(shard),
                    Arc::clone(&shard.wake),
                    schedule,
                ));
            }
        }
        let index = EdgeIndex { chunks, files };
        index.ensure_collection().await?;
        let moved = index.move_file_points().await?;
        if moved > 0 {
            tracing::info!(
                moved,
                dir = %index.dir().display(),
                "vector index: file points moved into their own shard"
            );
        }
        Ok(index)
    }

    /// Vector dimension.
    pub fn dimension(&self) -> usize {
        self.chunks.dimension
    }

    /// The index directory (the chunk shard's).
    pub fn dir(&self) -> &Path {
        &self.chunks.dir
    }

    fn shard_of(&self, kind: PointKind) -> &Arc<Shard> {
        match kind {
            PointKind::Chunk => &self.chunks,
            PointKind::File => &self.files,
        }
    }

    fn shards(&self) -> [&Arc<Shard>; 2] {
        [&self.chunks, &self.files]
    }

    /// Creates the payload indexes that are missing (the shards themselves exist once open).
    pub async fn ensure_collection(&self) -> Result<(), VectorError> {
        for shard in self.shards() {
            write(shard, create_payload_indexes).await?;
        }
        Ok(())
    }

    /// Moves file points out of the chunk shard into the file shard, a page at a time: each
    /// page is written to the file shard before it is deleted from the chunk shard, so an
    /// interrupted move loses nothing and the next open finishes it. Returns the points moved.
    async fn move_file_points(&self) -> Result<usize, VectorError> {
        let (chunks, files) = (Arc::clone(&self.chunks), Arc::clone(&self.files));
        let moved = blocking(move || {
            let only_files = filter::to_edge(&filter::kind_clause(PointKind::File));
            let mut moved = 0;
            loop {
                let request = ScrollRequest {
                    offset: None,
                    limit: Some(UPSERT_BATCH),
                    filter: Some(only_files.clone()),
                    with_payload: Some(WithPayloadInterface::Bool(true)),
                    with_vector: WithVector::Bool(true),
                    order_by: None,
                };
                let (records, _) = chunks.shard.scroll(request).map_err(engine)?;
                if records.is_empty() {
                    return Ok(moved);
                }
                let mut ids = Vec::with_capacity(records.len());
                let mut batch = Vec::with_capacity(records.len());
                for record in records {
                    ids.push(record.id);
                    batch.push(PointStructPersisted {
                        id: record.id,
                        vector: VectorStructPersisted::Single(dense_vector(record.vector)?),
                        payload: record.payload,
                    });
                }
                let count = ids.len();
                // Insert-only: a point already in the file shard was written there by this
                // version (or copied by a move that stopped midway), so it is never older.
                let insert_missing = ConditionalInsertOperation {
                    points_op: PointInsertOperations::PointsList(batch),
                    condition: Filter::default(),
                    update_mode: Some(UpdateMode::InsertOnly),
                };
                locked_write(&files, |shard| {
                    shard
                        .update(UpdateOperation::PointOperation(
                            PointOperations::UpsertPointsConditional(insert_missing),
                        ))
                        .map_err(engine)
                })?;
                locked_write(&chunks, |shard| {
                    shard
                        .update(UpdateOperation::PointOperation(
                            PointOperations::DeletePoints { ids },
                        ))
                        .map_err(engine)
                })?;
                moved += count;
            }
        })
        .await?;
        if moved > 0 {
            wrote(&self.files, moved);
            wrote(&self.chunks, moved);
        }
        Ok(moved)
    }

    /// Inserts or replaces points, [`UPSERT_BATCH`] per engine call, each in its kind's
    /// shard, then flushes.
    pub async fn upsert(&self, points: Vec<VectorPoint>) -> Result<(), VectorError> {
        for point in &points {
            validate_point(point, self.dimension())?;
        }
        for (kind, points) in by_kind(points) {
            if points.is_empty() {
                continue;
            }
            let shard = self.shard_of(kind);
            let written = points.len();
            write(shard, move |shard| upsert_points(shard, &points)).await?;
            wrote(shard, written);
        }
        Ok(())
    }

    /// [`super::VectorIndex::replace_file`]: in each shard, under its write lock, the
    /// shard's new points are written and then the file's others deleted.
    pub async fn replace_file(
        &self,
        namespace: &str,
        file_id: &str,
        points: Vec<VectorPoint>,
    ) -> Result<(), VectorError> {
        let keep = super::replacement_ids(namespace, file_id, &points, self.dimension())?;
        let stale = filter::to_edge(&filter::file_points_except(namespace, file_id, &keep));
        for (kind, points) in by_kind(points) {
            let shard = self.shard_of(kind);
            let (stale, written) = (stale.clone(), points.len());
            write(shard, move |shard| {
                upsert_points(shard, &points)?;
                shard
                    .update(UpdateOperation::PointOperation(
                        PointOperations::DeletePointsByFilter(stale),
                    ))
                    .map_err(engine)
            })
            .await?;
            wrote(shard, written);
        }
        Ok(())
    }

    /// Deletes every point of a file, in both shards.
    pub async fn delete_file(&self, namespace: &str, file_id: &str) -> Result<(), VectorError> {
        self.delete_where(&filter::file_clause(namespace, file_id))
            .await
    }

    /// Deletes every point of a namespace, in both shards.
    pub async fn delete_namespace(&self, namespace: &str) -> Result<(), VectorError> {
        self.delete_where(&filter::namespace_clause(namespace))
            .await
    }

    async fn delete_where(&self, clause: &filter::Clause) -> Result<(), VectorError> {
        let selected = filter::to_edge(clause);
        for shard in self.shards() {
            let selected = selected.clone();
            write(shard, move |shard| {
                shard
                    .update(UpdateOperation::PointOperation(
                        PointOperations::DeletePointsByFilter(selected),
                    ))
                    .map_err(engine)
            })
            .await?;
            wrote(shard, 1);
        }
        Ok(())
    }

    /// Sets the enabled and hidden flags on every point of a file.
    pub async fn set_file_flags(
        &self,
        namespace: &str,
        file_id: &str,
        enabled: bool,
        hidden: bool,
    ) -> Result<(), VectorError> {
        let set_flags = file_flags_update(namespace, file_id, enabled, hidden);
        for shard in self.shards() {
            let set_flags = set_flags.clone();
            write(shard, move |shard| shard.update(set_flags).map_err(engine)).await?;
            wrote(shard, 1);
        }
        Ok(())
    }

    /// The `limit` nearest points that `access` and `scope` admit, best first.
    pub async fn search(
        &self,
        access: &AccessFilter,
        scope: &Scope,
        vector: Vec<f32>,
        limit: usize,
    ) -> Result<Vec<VectorHit>, VectorError> {
        validate_query(&vector, self.dimension(), limit)?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        let request = QueryRequest {
            prefetches: Vec::new(),
            query: Some(ScoringQuery::Vector(QueryEnum::Nearest(NamedQuery {
                query: VectorInternal::from(vector),
                using: None,
            }))),
            filter: Some(filter::to_edge(&filter::scoped_clause(access, scope))),
            score_threshold: None,
            limit,
            offset: 0,
            params: None,
            with_vector: WithVector::Bool(false),
            with_payload: WithPayloadInterface::Fields(
                HIT_FIELDS.iter().map(|f| filter::json_path(f)).collect(),
            ),
        };
        let shard = Arc::clone(self.shard_of(scope.kind()));
        let points = blocking(move || shard.shard.query(request).map_err(engine)).await?;
        points
            .into_iter()
            .map(|point| {
                let payload = point.payload.unwrap_or_default();
                super::hit_from(
                    |key| {
                        payload
                            .0
                            .get(key)
                            .and_then(Value::as_str)
                            .map(str::to_owned)
                    },
                    point.score,
                )
            })
            .collect()
    }

    /// How many points `access` and `scope` admit (exact count).
    pub async fn count(&self, access: &AccessFilter, scope: &Scope) -> Result<u64, VectorError> {
        let request = CountRequest {
            filter: Some(filter::to_edge(&filter::scoped_clause(access, scope))),
            exact: true,
        };
        let shard = Arc::clone(self.shard_of(scope.kind()));
        let n = blocking(move || shard.shard.count(request).map_err(engine)).await?;
        Ok(n as u64)
    }

    /// The file vector of `file_id` when its file point passes `access` (see
    /// [`VectorIndex::file_vector`](super::VectorIndex::file_vector)).
    pub async fn file_vector(
        &self,
        access: &AccessFilter,
        file_id: &str,
    ) -> Result<Option<Vec<f32>>, VectorError> {
        let request = ScrollRequest {
            offset: None,
            limit: Some(1),
            filter: Some(filter::to_edge(&filter::file_point_clause(access, file_id))),
            with_payload: Some(WithPayloadInterface::Bool(false)),
            with_vector: WithVector::Bool(true),
            order_by: None,
        };
        let shard = Arc::clone(&self.files);
        let (records, _) = blocking(move || shard.shard.scroll(request).map_err(engine)).await?;
        let Some(record) = records.into_iter().next() else {
            return Ok(None);
        };
        dense_vector(record.vector).map(Some)
    }

    /// The vectors of the chunk points `selection` picks, by embed hash, a page of
    /// [`UPSERT_BATCH`] per engine call (see
    /// [`VectorIndex::stored_chunk_vectors`](super::VectorIndex::stored_chunk_vectors)).
    pub(crate) async fn stored_vectors(
        &self,
        selection: &filter::Clause,
    ) -> Result<HashMap<String, Vec<f32>>, VectorError> {
        let selected = filter::to_edge(selection);
        let shard = Arc::clone(&self.chunks);
        blocking(move || {
            let mut stored = HashMap::new();
            let mut offset = None;
            loop {
                let request = ScrollRequest {
                    offset,
                    limit: Some(UPSERT_BATCH),
                    filter: Some(selected.clone()),
                    with_payload: Some(WithPayloadInterface::Fields(vec![filter::json_path(
                        schema::EMBED_HASH,
                    )])),
                    with_vector: WithVector::Bool(true),
                    order_by: None,
                };
                let (records, next) = shard.shard.scroll(request).map_err(engine)?;
                for record in records {
                    let hash = record
                        .payload
                        .as_ref()
                        .and_then(|payload| payload.0.get(schema::EMBED_HASH))
                        .and_then(Value::as_str)
                        .map(str::to_owned);
                    // A point without a hash or a dense vector is embedded again, not an error.
                    if let (Some(hash), Ok(vector)) = (hash, dense_vector(record.vector)) {
                        stored.insert(hash, vector);
                    }
                }
                match next {
                    Some(next) => offset = Some(next),
                    None => return Ok(stored),
                }
            }
        })
        .await
    }

    /// Runs the shard optimizers (merge small segments, build HNSW, vacuum deletes)
    /// until none has work, now. The background optimizer does this after writes settle;
    /// this is for callers that need it done before they go on. Returns whether anything
    /// changed.
    pub async fn optimize(&self) -> Result<bool, VectorError> {
        let mut changed = false;
        for shard in self.shards() {
            changed |= write(shard, |shard| shard.optimize().map_err(engine)).await?;
        }
        Ok(changed)
    }
}

/// Creates the payload indexes of [`INDEXED_FIELDS`] that `shard` lacks (any edge shard:
/// the sparse index uses it too). The caller holds the shard's write lock.
pub(crate) fn create_payload_indexes(shard: &EdgeShard) -> Result<(), VectorError> {
    for (field, kind) in INDEXED_FIELDS {
        let field_type = match kind {
            IndexType::Keyword => PayloadSchemaType::Keyword,
            IndexType::Bool => PayloadSchemaType::Bool,
        };
        shard
            .update(UpdateOperation::FieldIndexOperation(
                FieldIndexOperations::CreateIndex(CreateIndex {
                    field_name: filter::json_path(field),
                    field_schema: Some(PayloadFieldSchema::FieldType(field_type)),
                }),
            ))
            .map_err(engine)?;
    }
    Ok(())
}

/// The update that sets a file's enabled and hidden flags on every point of it (any edge
/// shard: the sparse index uses it too).
pub(crate) fn file_flags_update(
    namespace: &str,
    file_id: &str,
    enabled: bool,
    hidden: bool,
) -> UpdateOperation {
    let mut flags = Map::new();
    flags.insert(schema::ENABLED.to_owned(), Value::Bool(enabled));
    flags.insert(schema::HIDDEN.to_owned(), Value::Bool(hidden));
    UpdateOperation::PayloadOperation(PayloadOps::SetPayload(SetPayloadOp {
        payload: Payload(flags),
        points: None,
        filter: Some(filter::to_edge(&filter::file_clause(namespace, file_id))),
        key: None,
    }))
}

/// The chunk points and the file points, each for its shard.
fn by_kind(points: Vec<VectorPoint>) -> [(PointKind, Vec<VectorPoint>); 2] {
    let (file_points, chunk_points): (Vec<_>, Vec<_>) = points
        .into_iter()
        .partition(|point| point.kind == PointKind::File);
    [
        (PointKind::Chunk, chunk_points),
        (PointKind::File, file_points),
    ]
}

/// Upserts points into one shard, [`UPSERT_BATCH`] per engine call. The caller holds the
/// shard's write lock.
fn upsert_points(shard: &EdgeShard, points: &[VectorPoint]) -> Result<(), VectorError> {
    for batch in points.chunks(UPSERT_BATCH) {
        let batch = batch.iter().map(to_persisted).collect();
        shard
            .update(UpdateOperation::PointOperation(
                PointOperations::UpsertPoints(PointInsertOperations::PointsList(batch)),
            ))
            .map_err(engine)?;
    }
    Ok(())
}

/// Records `points` written to `shard` for its background optimizer and wakes it.
fn wrote(shard: &Shard, points: usize) {
    let mut pending = shard.pending.lock().unwrap_or_else(PoisonError::into_inner);
    pending.points = pending.points.saturating_add(points.max(1));
    pending.last_write = Some(Instant::now());
    drop(pending);
    shard.wake.notify_one();
}

/// Runs a write on the blocking pool under the shard's write lock, then flushes it to disk.
async fn write<T, F>(shard: &Arc<Shard>, op: F) -> Result<T, VectorError>
where
    F: FnOnce(&EdgeShard) -> Result<T, VectorError> + Send + 'static,
    T: Send + 'static,
{
    let shard = Arc::clone(shard);
    blocking(move || locked_write(&shard, op)).await
}

/// A write under the shard's write lock, then a flush; on the calling (blocking) thread.
fn locked_write<T>(
    shard: &Shard,
    op: impl FnOnce(&EdgeShard) -> Result<T, VectorError>,
) -> Result<T, VectorError> {
    let _guard = shard.writes.lock().unwrap_or_else(PoisonError::into_inner);
    let out = op(&shard.shard)?;
    shard.shard.flush();
    Ok(out)
}

/// The dense vector of a record read back with its vector.
fn dense_vector(vector: Option<VectorStructInternal>) -> Result<Vec<f32>, VectorError> {
    match vector {
        Some(VectorStructInternal::Single(vector)) => Ok(vector),
        Some(VectorStructInternal::Named(mut named)) => match named.remove(DEFAULT_VECTOR_NAME) {
            Some(VectorInternal::Dense(vector)) => Ok(vector),
            _ => Err(engine("a point without a dense vector")),
        },
        _ => Err(engine("a point without a dense vector")),
    }
}

async fn blocking<T, F>(f: F) -> Result<T, VectorError>
where
    F: FnOnce() -> Result<T, VectorError> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| VectorError::internal(format!("vector index task failed: {e}")))?
}

/// The background optimizer of one shard: runs once when the shard has been open and quiet
/// for the idle time (a shard written by an earlier process may never have been optimized),
/// then whenever writes settle. Ends
/// when the shard is dropped; holds it only while it runs.
async fn optimize_in_background(
    shard: Weak<Shard>,
    wake: Arc<tokio::sync::Notify>,
    schedule: OptimizeSchedule,
) {
    let mut due = true;
    loop {
        if !due {
            wake.notified().await;
        }
        due = false;
        // Wait for the writes to settle, or for enough of them.
        loop {
            let Some(strong) = shard.upgrade() else {
                return;
            };
            let (points, quiet_for) = {
                let pending = strong
                    .pending
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let quiet_for = pending.last_write.map_or(schedule.idle, |at| at.elapsed());
                (pending.points, quiet_for)
            };
            drop(strong);
            if points >= schedule.every_points || quiet_for >= schedule.idle {
                break;
            }
            tokio::time::sleep(schedule.idle.saturating_sub(quiet_for)).await;
        }
        let Some(strong) = shard.upgrade() else {
            return;
        };
        let points = {
            let mut pending = strong
                .pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            std::mem::take(&mut pending.points)
        };
        let started = Instant::now();
        let run = tokio::task::spawn_blocking(move || {
            let _guard = strong.writes.lock().unwrap_or_else(PoisonError::into_inner);
            let changed = strong.shard.optimize();
            if matches!(changed, Ok(true)) {
                strong.shard.flush();
            }
            let info = strong.shard.info();
            strong
                .pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .runs += 1;
            (changed, info)
        })
        .await;
        let seconds = started.elapsed().as_secs_f64();
        match run {
            Ok((Ok(true), info)) => tracing::info!(
                seconds,
                points_since_last = points,
                segments = info.segments_count,
                points = info.points_count,
                indexed_vectors = info.indexed_vectors_count,
                "vector index optimized"
            ),
            Ok((Ok(false), _)) => {
                tracing::debug!(seconds, "vector index optimizer: nothing to do")
            }
            // The next write retries; searches keep working on the unoptimized segments.
            Ok((Err(err), _)) => {
                tracing::warn!(error = %err, "vector index optimizer failed")
            }
            Err(err) => tracing::warn!(error = %err, "vector index optimizer task failed"),
        }
    }
}

/// The shard of `dir`, and whether this call opened it (rather than sharing one already open).
fn open_shard(
    dir: &Path,
    dimension: usize,
    role: ShardRole,
) -> Result<(Arc<Shard>, bool), VectorError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| engine(format!("cannot create {}: {e}", dir.display())))?;
    let dir = dir
        .canonicalize()
        .map_err(|e| engine(format!("cannot resolve {}: {e}", dir.display())))?;
    let mut open = OPEN_SHARDS.lock().unwrap_or_else(PoisonError::into_inner);
    open.retain(|_, shard| shard.strong_count() > 0);
    if let Some(shard) = open.get(&dir).and_then(Weak::upgrade) {
        check_dimension(shard.dimension, dimension)?;
        return Ok((shard, false));
    }
    let shard = if dir.join(EDGE_CONFIG_FILE).exists() {
        let shard = EdgeShard::load(&dir, None).map_err(engine)?;
        let existing = shard
            .config()
            .vectors
            .get(DEFAULT_VECTOR_NAME)
            .map(|v| (v.size, v.distance));
        match existing {
            Some((size, Distance::Cosine)) => check_dimension(size, dimension)?,
            Some((size, distance)) => {
                return Err(VectorError::Incompatible {
                    existing: format!("dimension {size} ({distance:?})"),
                    wanted: format!("dimension {dimension} (Cosine)"),
                });
            }
            None => {
                return Err(VectorError::Incompatible {
                    existing: "no unnamed dense vector".to_owned(),
                    wanted: format!("dimension {dimension} (Cosine)"),
                });
            }
        }
        shard
    } else {
        let mut config = EdgeConfig {
            vectors: HashMap::from([(
                DEFAULT_VECTOR_NAME.to_owned(),
                EdgeVectorParams {
                    size: dimension,
                    distance: Distance::Cosine,
                    // Memory-mapped: the page cache keeps hot vectors, RAM stays bounded.
                    on_disk: Some(true),
                    multivector_config: None,
                    datatype: None,
                    quantization_config: None,
                    hnsw_config: None,
                },
            )]),
            ..EdgeConfig::default()
        };
        if role == ShardRole::Files {
            config.hnsw_config.full_scan_threshold = FILE_SHARD_THRESHOLD_KB;
            config.optimizers.indexing_threshold = Some(FILE_SHARD_THRESHOLD_KB);
        }
        EdgeShard::new(&dir, config).map_err(engine)?
    };
    let shard = Arc::new(Shard {
        shard,
        writes: Mutex::new(()),
        dir: dir.clone(),
        dimension,
        // Opening counts as a write: the first run waits for the quiet time too, so a
        // process that opens a shard for a moment never starts one.
        pending: Mutex::new(Pending {
            last_write: Some(Instant::now()),
            ..Pending::default()
        }),
        wake: Arc::new(tokio::sync::Notify::new()),
    });
    open.insert(dir, Arc::downgrade(&shard));
    Ok((shard, true))
}

fn check_dimension(existing: usize, wanted: usize) -> Result<(), VectorError> {
    if existing == wanted {
        Ok(())
    } else {
        Err(VectorError::Incompatible {
            existing: format!("dimension {existing} (Cosine)"),
            wanted: format!("dimension {wanted} (Cosine)"),
        })
    }
}

fn to_persisted(point: &VectorPoint) -> PointStructPersisted {
    let payload: Map<String, Value> = payload_fields(point)
        .into_iter()
        .map(|(key, value)| {
            let value = match value {
                FieldValue::Str(s) => Value::String(s),
                FieldValue::Bool(b) => Value::Bool(b),
                FieldValue::List(items) => {
                    Value::Array(items.into_iter().map(Value::String).collect())
                }
            };
            (key.to_owned(), value)
        })
        .collect();
    PointStructPersisted {
        id: PointId::Uuid(point.id()),
        vector: VectorStructPersisted::Single(point.vector.clone()),
        payload: Some(Payload(payload)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// The indexed payload fields, the same in both shards.
    fn indexed(index: &EdgeIndex) -> Vec<String> {
        let keys = |shard: &Shard| {
            let mut keys: Vec<String> = shard
                .shard
                .info()
                .payload_schema
                .keys()
                .map(ToString::to_string)
                .collect();
            keys.sort();
            keys
        };
        let chunks = keys(&index.chunks);
        assert_eq!(chunks, keys(&index.files));
        chunks
    }

    fn readable(namespace: &str) -> AccessFilter {
        AccessFilter {
            namespace: namespace.into(),
            allow_prefixes: vec![String::new()],
            enabled_only: true,
            visible_only: true,
            ..Default::default()
        }
    }

    fn points_of_kind(shard: &Shard, kind: PointKind) -> usize {
        shard
            .shard
            .count(CountRequest {
                filter: Some(filter::to_edge(&filter::kind_clause(kind))),
                exact: true,
            })
            .unwrap()
    }

    /// An index written before file points had a shard of their own keeps them with the
    /// chunks: opening it moves them, and every search and count finds them where they are.
    #[tokio::test]
    async fn file_points_left_in_the_chunk_shard_move_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let point = |kind: PointKind, i: usize| VectorPoint {
            text_hash: None,
            embed_hash: None,
            namespace: "alpha".into(),
            kind,
            chunk_key: format!("c{i}"),
            file_id: format!("f{i}"),
            path: format!("docs/{i}.md"),
            enabled: true,
            hidden: false,
            collections: Vec::new(),
            document_date: None,
            vector: vec![1.0 + i as f32, (i % 7) as f32, (i % 3) as f32],
        };
        let mut old_layout: Vec<VectorPoint> =
            (0..600).map(|i| point(PointKind::File, i)).collect();
        old_layout.extend((0..40).map(|i| point(PointKind::Chunk, i)));
        let index = EdgeIndex::open(dir.path(), 3).await.unwrap();
        write(&index.chunks, move |shard| {
            upsert_points(shard, &old_layout)
        })
        .await
        .unwrap();
        assert_eq!(points_of_kind(&index.chunks, PointKind::File), 600);
        // A newer version of one file, already in the file shard, outlives the move.
        let newer = VectorPoint {
            vector: vec![0.0, 0.0, 1.0],
            ..point(PointKind::File, 17)
        };
        index.upsert(vec![newer]).await.unwrap();
        drop(index);

        let index = EdgeIndex::open(dir.path(), 3).await.unwrap();
        assert_eq!(points_of_kind(&index.chunks, PointKind::File), 0);
        assert_eq!(points_of_kind(&index.chunks, PointKind::Chunk), 40);
        assert_eq!(points_of_kind(&index.files, PointKind::File), 600);
        assert_eq!(points_of_kind(&index.files, PointKind::Chunk), 0);
        let access = readable("alpha");
        assert_eq!(index.count(&access, &Scope::files()).await.unwrap(), 600);
        assert_eq!(index.count(&access, &Scope::chunks()).await.unwrap(), 40);
        assert_eq!(
            index.file_vector(&access, "f17").await.unwrap(),
            Some(vec![0.0, 0.0, 1.0])
        );
        let own = point(PointKind::File, 18).vector;
        let hits = index
            .search(&access, &Scope::files(), own, 1)
            .await
            .unwrap();
        assert_eq!(hits[0].file_id, "f18");
        assert_eq!(hits[0].chunk_key, None);
        // Nothing is left to move; new file points go straight to the file shard.
        assert_eq!(index.move_file_points().await.unwrap(), 0);
        index
            .upsert(vec![point(PointKind::File, 600)])
            .await
            .unwrap();
        assert_eq!(points_of_kind(&index.files, PointKind::File), 601);
        assert_eq!(points_of_kind(&index.chunks, PointKind::File), 0);
        // A file's flags and its deletion reach both shards.
        index
            .set_file_flags("alpha", "f3", false, false)
            .await
            .unwrap();
        assert_eq!(index.count(&access, &Scope::files()).await.unwrap(), 600);
        assert_eq!(index.count(&access, &Scope::chunks()).await.unwrap(), 39);
        index.delete_file("alpha", "f5").await.unwrap();
        assert_eq!(points_of_kind(&index.files, PointKind::File), 600);
        assert_eq!(points_of_kind(&index.chunks, PointKind::Chunk), 39);
    }

    #[tokio::test]
    async fn payload_indexes_exist_and_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let mut want: Vec<String> = INDEXED_FIELDS
            .iter()
            .map(|(f, _)| (*f).to_owned())
            .collect();
        want.sort();
        let index = EdgeIndex::open(dir.path(), 3).await.unwrap();
        assert_eq!(indexed(&index), want);
        // Idempotent.
        index.ensure_collection().await.unwrap();
        assert_eq!(indexed(&index), want);
        drop(index);
        let index = EdgeIndex::open(dir.path(), 3).await.unwrap();
        assert_eq!(indexed(&index), want);
        assert!(!indexed(&index).contains(&schema::ANCHORED_PATH.to_owned()));
    }

    /// A shard written and left alone ends up optimized: HNSW over its vectors (here with
    /// a 1 KB threshold, so a few hundred small vectors qualify), without any call.
    #[tokio::test]
    async fn background_optimizer_indexes_settled_writes() {
        let dir = tempfile::tempdir().unwrap();
        let schedule = OptimizeSchedule {
            idle: Duration::from_millis(200),
            every_points: usize::MAX,
        };
        let index = EdgeIndex::open_scheduled(dir.path().to_path_buf(), 8, schedule)
            .await
            .unwrap();
        index
            .chunks
            .shard
            .set_optimizers_config(qdrant_edge::EdgeOptimizersConfig {
                indexing_threshold: Some(1),
                ..Default::default()
            })
            .unwrap();
        let points: Vec<VectorPoint> = (0..600)
            .map(|i| VectorPoint {
                text_hash: None,
                embed_hash: None,
                namespace: "alpha".into(),
                kind: super::super::PointKind::Chunk,
                chunk_key: format!("c{i}"),
                file_id: format!("f{}", i / 10),
                path: format!("docs/{}.md", i / 10),
                enabled: true,
                hidden: false,
                collections: Vec::new(),
                document_date: None,
                vector: (0..8)
                    .map(|d| ((i * 7 + d * 13) % 17) as f32 + 1.0)
                    .collect(),
            })
            .collect();
        let probe = points[123].vector.clone();
        // Upserts alone never build HNSW (without the background task this loop times out);
        // not asserted right here, since under load the task may already have run.
        index.upsert(points).await.unwrap();

        // The run is counted after the optimized segments are swapped in, so the index can be
        // complete a moment before the count moves: wait for both.
        let deadline = Instant::now() + Duration::from_secs(120);
        while index.chunks.shard.info().indexed_vectors_count < 600
            || index.chunks.pending.lock().unwrap().runs == 0
        {
            assert!(
                Instant::now() < deadline,
                "never optimized: {:?}",
                index.chunks.shard.info()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(index.chunks.pending.lock().unwrap().points, 0);

        let access = readable("alpha");
        let hits = index
            .search(&access, &super::super::Scope::chunks(), probe, 1)
            .await
            .unwrap();
        assert_eq!(hits.len(), 1);
        assert!(hits[0].score > 0.999, "{:?}", hits[0]);

        // The optimizer holds the shard only while it runs: dropping the index ends it once
        // any run in flight (a late wake-up may start one more) returns.
        let weak = Arc::downgrade(&index.chunks);
        drop(index);
        let deadline = Instant::now() + Duration::from_secs(60);
        while weak.upgrade().is_some() {
            assert!(
                Instant::now() < deadline,
                "the optimizer kept the shard alive"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

//! [`SparseIndex`]: chunk points with a sparse BM25 vector, for the `qdrant_sparse` backend
//! of the full-text lane (`[retrieval] fulltext_backend`).
//!
//! The term statistics live in Qdrant: each chunk point holds the BM25 term-frequency part
//! of its terms (computed by the indexer), and the sparse vector is configured with
//! `modifier: idf`, so the engine multiplies every query term by
//! `ln(1 + (N - df + 0.5) / (df + 0.5))` at search time, Lucene's idf. The score of a
//! query vector with value 1 per query term is then plain Okapi BM25.
//!
//! Terms are [`tokenize`]d (lower-cased runs of letters, digits and `_`, no stemming:
//! what the docs-qa baseline does, and metric names such as `scrape_series_added` stay
//! whole) and mapped to dimension ids by [`term_id`], the 32-bit FNV-1a hash of the token.
//! A hash keeps the ids stable across processes without a shared vocabulary; two tokens
//! that collide share a dimension, which only blurs their idf.
//!
//! Storage: its own qdrant-edge shard directory or server collection, next to the dense
//! one, with the same point ids, payload schema and access filter ([`super::filter`]),
//! so the filter applies inside the engine exactly as for dense search. Not the dense
//! collection itself: its points are rewritten whole by the dense writer, it needs a
//! dimension (there is none when embeddings are off, and sparse vectors are written
//! then too), and an existing collection cannot gain a sparse vector. IDF counts every
//! point of the shard or collection, i.e. all namespaces together.
//!
//! Searching needs a Qdrant server: the pinned qdrant-edge 0.6.0 stores sparse vectors
//! (writes, flags, deletes and filtered counts work and are tested) but panics when asked
//! to score one; [`edge_cannot_search`] says so instead. qdrant-edge 0.9.0 fixes it.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

use kg_proto::v1::AccessFilter;
use qdrant_client::Qdrant;
use qdrant_client::qdrant::{
    self as client, CollectionExistsRequest, CreateCollection, GetCollectionInfoRequest,
    NamedVectors, PayloadIncludeSelector, PointStruct, Query, QueryPoints, SparseVectorConfig,
    SparseVectorParams, UpsertPoints, VectorInput, WithPayloadSelector, value::Kind,
    with_payload_selector::SelectorOptions,
};
use qdrant_edge::{
    CountRequest, EdgeConfig, EdgeShard, EdgeSparseVectorParams, Modifier, Payload, PointId,
    PointInsertOperations, PointOperations, PointStructPersisted, UpdateOperation, VectorPersisted,
    VectorStructPersisted,
};
use serde_json::{Map, Value};

use super::filter;
use super::server::{
    client_error, delete_file_request, delete_namespace_request, field_index_requests,
    prune_file_request, set_flags_request,
};
use super::{
    FieldValue, HIT_FIELDS, MAX_SEARCH_LIMIT, PointKind, Scope, UPSERT_BATCH, VectorError,
    VectorHit, VectorPoint, payload_fields, validate_point,
};

/// Name of the sparse vector in the shard or collection.
pub const SPARSE_VECTOR: &str = "bm25";
/// The qdrant-edge configuration file; its presence means "a shard exists".
const EDGE_CONFIG_FILE: &str = "edge_config.json";
/// Per-request deadline sent to a Qdrant server.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Which index serves the `fulltext` lane (`[retrieval] fulltext_backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FulltextBackend {
    /// FalkorDB's full-text index on `Chunk.text` (RediSearch scoring).
    #[default]
    Falkordb,
    /// Sparse BM25 vectors in Qdrant ([`SparseIndex`]), idf computed by the engine.
    QdrantSparse,
}

/// Lower-cased runs of letters, digits and `_` (the `\w+` of the docs-qa baseline).
pub fn tokenize(text: &str) -> Vec<String> {
    crate::chunk_text::words(text)
        .map(str::to_lowercase)
        .collect()
}

/// The dimension of a token: 32-bit FNV-1a of its UTF-8 bytes (stable across builds).
pub fn term_id(token: &str) -> u32 {
    token.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// Term frequencies of a text by dimension, sorted by id.
pub fn term_counts(text: &str) -> BTreeMap<u32, u32> {
    let mut counts = BTreeMap::new();
    for token in tokenize(text) {
        *counts.entry(term_id(&token)).or_insert(0) += 1;
    }
    counts
}

/// A sparse vector: unique dimension ids in ascending order with their weights.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SparseVector {
    /// Dimension ids, ascending, unique.
    pub indices: Vec<u32>,
    /// One weight per id.
    pub values: Vec<f32>,
}

impl SparseVector {
    /// From (id, weight) pairs sorted by id with unique ids (a `BTreeMap` gives that).
    pub fn from_sorted(pairs: impl IntoIterator<Item = (u32, f32)>) -> Self {
        let (indices, values) = pairs.into_iter().unzip();
        SparseVector { indices, values }
    }

    /// Whether it has no term.
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }

    fn validate(&self, what: &'static str) -> Result<(), VectorError> {
        if self.indices.len() != self.values.len() {
            return Err(VectorError::invalid(
                what,
                "indices and values differ in length",
            ));
        }
        if self.indices.windows(2).any(|w| w[0] >= w[1]) {
            return Err(VectorError::invalid(
                what,
                "indices are not ascending and unique",
            ));
        }
        if self.values.iter().any(|v| !v.is_finite()) {
            return Err(VectorError::invalid(what, "contains NaN or infinity"));
        }
        Ok(())
    }
}

/// The query vector: every query term with its count in the query (1 for most), so the
/// engine's idf-weighted dot product is the BM25 score of the query.
pub fn query_vector(query: &str) -> SparseVector {
    SparseVector::from_sorted(term_counts(query).into_iter().map(|(id, n)| (id, n as f32)))
}

/// One chunk's sparse vector with the chunk point's payload.
#[derive(Debug, Clone, PartialEq)]
pub struct SparsePoint {
    /// The namespace (tenant).
    pub namespace: String,
    /// The chunk key.
    pub chunk_key: String,
    /// The file id.
    pub file_id: String,
    /// The normalised path.
    pub path: String,
    /// The file's enabled flag.
    pub enabled: bool,
    /// The file's hidden flag.
    pub hidden: bool,
    /// The file's collections.
    pub collections: Vec<String>,
    /// The file's document date, if known.
    pub document_date: Option<String>,
    /// The BM25 term weights (without idf).
    pub vector: SparseVector,
    /// The chunk's [`text_hash`](crate::chunk_text::text_hash).
    pub text_hash: Option<String>,
}

impl SparsePoint {
    /// The same point as the dense chunk point, without a dense vector: one payload schema
    /// and one point id for both.
    fn as_chunk_point(&self) -> VectorPoint {
        VectorPoint {
            namespace: self.namespace.clone(),
            kind: PointKind::Chunk,
            chunk_key: self.chunk_key.clone(),
            file_id: self.file_id.clone(),
            path: self.path.clone(),
            enabled: self.enabled,
            hidden: self.hidden,
            collections: self.collections.clone(),
            document_date: self.document_date.clone(),
            vector: Vec::new(),
            text_hash: self.text_hash.clone(),
            embed_hash: None,
        }
    }

    fn validate(&self) -> Result<VectorPoint, VectorError> {
        let point = self.as_chunk_point();
        validate_point(&point, 0)?;
        self.vector.validate("sparse vector")?;
        Ok(point)
    }
}

/// The sparse BM25 index: an embedded qdrant-edge shard or a Qdrant server collection.
/// Cheap to clone.
#[derive(Debug, Clone)]
pub enum SparseIndex {
    /// Embedded shard in its own directory.
    Edge(EdgeSparse),
    /// Collection on a Qdrant server.
    Server(ServerSparse),
}

impl SparseIndex {
    /// Opens (or creates) the embedded shard in `dir`.
    pub async fn open_edge(dir: impl Into<PathBuf>) -> Result<Self, VectorError> {
        Ok(SparseIndex::Edge(EdgeSparse::open(dir).await?))
    }

    /// A server collection; creates it (and its payload indexes) when missing.
    pub async fn connect_server(
        url: &str,
        api_key: Option<String>,
        collection: &str,
    ) -> Result<Self, VectorError> {
        let index = ServerSparse::connect(url, api_key, collection)?;
        index.ensure_collection().await?;
        Ok(SparseIndex::Server(index))
    }

    /// Inserts or replaces chunk points; nothing is written when any point is invalid.
    /// Points without a term are skipped: no query can reach them.
    pub async fn upsert(&self, points: Vec<SparsePoint>) -> Result<(), VectorError> {
        let checked = checked_points(points)?;
        if checked.is_empty() {
            return Ok(());
        }
        match self {
            SparseIndex::Edge(i) => i.upsert(checked).await,
            SparseIndex::Server(i) => i.upsert(checked).await,
        }
    }

    /// Makes `points` the file's points, as [`super::VectorIndex::replace_file`] does for
    /// dense vectors: writes them, then deletes the file's others (a chunk without a term
    /// among them). Nothing is written when any point is invalid or of another file.
    pub async fn replace_file(
        &self,
        namespace: &str,
        file_id: &str,
        points: Vec<SparsePoint>,
    ) -> Result<(), VectorError> {
        // Every point must be of the file, a wordless one too; only the written ones stay.
        let chunks: Vec<VectorPoint> = points.iter().map(SparsePoint::as_chunk_point).collect();
        super::replacement_ids(namespace, file_id, &chunks, 0)?;
        let checked = checked_points(points)?;
        let keep: Vec<uuid::Uuid> = checked.iter().map(|(chunk, _)| chunk.id()).collect();
        match self {
            SparseIndex::Edge(i) => {
                let stale = filter::to_edge(&filter::file_points_except(namespace, file_id, &keep));
                i.write(move |shard| {
                    upsert_edge_points(shard, &checked)?;
                    shard
                        .update(UpdateOperation::PointOperation(
                            PointOperations::DeletePointsByFilter(stale),
                        ))
                        .map_err(engine)
                })
                .await
            }
            SparseIndex::Server(i) => {
                if !checked.is_empty() {
                    i.upsert(checked).await?;
                }
                i.prune_file(namespace, file_id, &keep).await
            }
        }
    }

    /// Deletes every point of a file.
    pub async fn delete_file(&self, namespace: &str, file_id: &str) -> Result<(), VectorError> {
        match self {
            SparseIndex::Edge(i) => i.delete_file(namespace, file_id).await,
            SparseIndex::Server(i) => i.delete_file(namespace, file_id).await,
        }
    }

    /// Deletes every point of a namespace (it is being deleted).
    pub async fn delete_namespace(&self, namespace: &str) -> Result<(), VectorError> {
        match self {
            SparseIndex::Edge(i) => i.delete_where(&filter::namespace_clause(namespace)).await,
            SparseIndex::Server(i) => i.delete_namespace(namespace).await,
        }
    }

    /// Sets the enabled and hidden flags on every point of a file.
    pub async fn set_file_flags(
        &self,
        namespace: &str,
        file_id: &str,
        enabled: bool,
        hidden: bool,
    ) -> Result<(), VectorError> {
        match self {
            SparseIndex::Edge(i) => i.set_file_flags(namespace, file_id, enabled, hidden).await,
            SparseIndex::Server(i) => i.set_file_flags(namespace, file_id, enabled, hidden).await,
        }
    }

    /// The `limit` best BM25 matches of `query` that `access` and `scope` admit, best
    /// first; the score is BM25 with the engine's idf.
    pub async fn search(
        &self,
        access: &AccessFilter,
        scope: &Scope,
        query: SparseVector,
        limit: usize,
    ) -> Result<Vec<VectorHit>, VectorError> {
        query.validate("query vector")?;
        if limit > MAX_SEARCH_LIMIT {
            return Err(VectorError::invalid(
                "limit",
                format!("{limit} is over the maximum of {MAX_SEARCH_LIMIT}"),
            ));
        }
        if limit == 0 || query.is_empty() {
            return Ok(Vec::new());
        }
        match self {
            SparseIndex::Edge(i) => i.search(),
            SparseIndex::Server(i) => i.search(access, scope, query, limit).await,
        }
    }

    /// How many points `access` and `scope` admit (exact; embedded shard only, the server
    /// collection answers through the dense index's count).
    pub async fn count(&self, access: &AccessFilter, scope: &Scope) -> Result<u64, VectorError> {
        match self {
            SparseIndex::Edge(i) => i.count(access, scope).await,
            SparseIndex::Server(i) => i.count(access, scope).await,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Embedded shard
// ---------------------------------------------------------------------------------------

/// Open sparse shards by canonical directory, so one process never loads one twice.
static OPEN_SPARSE: LazyLock<Mutex<HashMap<PathBuf, Weak<EdgeSparseShard>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

#[derive(Debug)]
struct EdgeSparseShard {
    shard: EdgeShard,
    /// Serialises update + flush (the shard does not replay its WAL on load, and its
    /// flush panics next to a concurrent writer; see `edge.rs`).
    writes: Mutex<()>,
}

/// The sparse index in an embedded qdrant-edge shard.
#[derive(Debug, Clone)]
pub struct EdgeSparse {
    inner: Arc<EdgeSparseShard>,
}

fn engine(err: impl std::fmt::Display) -> VectorError {
    VectorError::internal(err)
}

async fn blocking<T, F>(f: F) -> Result<T, VectorError>
where
    F: FnOnce() -> Result<T, VectorError> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| VectorError::internal(format!("sparse index task failed: {e}")))?
}

/// Why the embedded shard cannot serve sparse searches (see [`EdgeSparse`]).
pub fn edge_cannot_search() -> VectorError {
    VectorError::Incompatible {
        existing: "qdrant-edge 0.6.0, which cannot search sparse vectors".to_owned(),
        wanted: "a Qdrant server ([vector] qdrant_url) or qdrant-edge 0.9".to_owned(),
    }
}

fn edge_sparse_params() -> EdgeSparseVectorParams {
    EdgeSparseVectorParams {
        full_scan_threshold: None,
        on_disk: Some(true),
        modifier: Some(Modifier::Idf),
        datatype: None,
    }
}

fn open_sparse_shard(dir: &Path) -> Result<Arc<EdgeSparseShard>, VectorError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| engine(format!("cannot create {}: {e}", dir.display())))?;
    let dir = dir
        .canonicalize()
        .map_err(|e| engine(format!("cannot resolve {}: {e}", dir.display())))?;
    let mut open = OPEN_SPARSE.lock().unwrap_or_else(PoisonError::into_inner);
    open.retain(|_, shard| shard.strong_count() > 0);
    if let Some(shard) = open.get(&dir).and_then(Weak::upgrade) {
        return Ok(shard);
    }
    let shard = if dir.join(EDGE_CONFIG_FILE).exists() {
        let shard = EdgeShard::load(&dir, None).map_err(engine)?;
        let modifier = shard
            .config()
            .sparse_vectors
            .get(SPARSE_VECTOR)
            .map(|p| p.modifier);
        if modifier != Some(Some(Modifier::Idf)) {
            return Err(VectorError::Incompatible {
                existing: format!("no `{SPARSE_VECTOR}` sparse vector with the idf modifier"),
                wanted: format!("sparse vector `{SPARSE_VECTOR}` (idf)"),
            });
        }
        shard
    } else {
        let config = EdgeConfig {
            sparse_vectors: HashMap::from([(SPARSE_VECTOR.to_owned(), edge_sparse_params())]),
            ..EdgeConfig::default()
        };
        EdgeShard::new(&dir, config).map_err(engine)?
    };
    let shard = Arc::new(EdgeSparseShard {
        shard,
        writes: Mutex::new(()),
    });
    open.insert(dir, Arc::downgrade(&shard));
    Ok(shard)
}

impl EdgeSparse {
    /// Opens the shard in `dir` (created when missing) with its payload indexes.
    pub async fn open(dir: impl Into<PathBuf>) -> Result<Self, VectorError> {
        let dir = dir.into();
        let inner = blocking(move || open_sparse_shard(&dir)).await?;
        let index = EdgeSparse { inner };
        index.write(super::edge::create_payload_indexes).await?;
        Ok(index)
    }

    async fn upsert(&self, points: Vec<(VectorPoint, SparseVector)>) -> Result<(), VectorError> {
        self.write(move |shard| upsert_edge_points(shard, &points))
            .await
    }

    async fn delete_file(&self, namespace: &str, file_id: &str) -> Result<(), VectorError> {
        self.delete_where(&filter::file_clause(namespace, file_id))
            .await
    }

    async fn delete_where(&self, clause: &filter::Clause) -> Result<(), VectorError> {
        let selected = filter::to_edge(clause);
        self.write(move |shard| {
            shard
                .update(UpdateOperation::PointOperation(
                    PointOperations::DeletePointsByFilter(selected),
                ))
                .map_err(engine)
        })
        .await
    }

    async fn set_file_flags(
        &self,
        namespace: &str,
        file_id: &str,
        enabled: bool,
        hidden: bool,
    ) -> Result<(), VectorError> {
        let set_flags = super::edge::file_flags_update(namespace, file_id, enabled, hidden);
        self.write(move |shard| shard.update(set_flags).map_err(engine))
            .await
    }

    /// qdrant-edge 0.6.0 cannot score a sparse vector: `EdgeShard::search` looks up the
    /// distance of every queried vector name among the dense vectors and panics
    /// ("vector config exist") on a sparse one. 0.9.0 answers `Dot` for sparse names
    /// (`EdgeConfig::get_distance`). Until the workspace moves to it, refuse instead of
    /// panicking on the blocking pool.
    fn search(&self) -> Result<Vec<VectorHit>, VectorError> {
        Err(edge_cannot_search())
    }

    async fn count(&self, access: &AccessFilter, scope: &Scope) -> Result<u64, VectorError> {
        let request = CountRequest {
            filter: Some(filter::to_edge(&filter::scoped_clause(access, scope))),
            exact: true,
        };
        let inner = Arc::clone(&self.inner);
        let n = blocking(move || inner.shard.count(request).map_err(engine)).await?;
        Ok(n as u64)
    }

    async fn write<T, F>(&self, op: F) -> Result<T, VectorError>
    where
        F: FnOnce(&EdgeShard) -> Result<T, VectorError> + Send + 'static,
        T: Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        blocking(move || {
            let _guard = inner.writes.lock().unwrap_or_else(PoisonError::into_inner);
            let out = op(&inner.shard)?;
            inner.shard.flush();
            Ok(out)
        })
        .await
    }
}

/// The points worth writing, each checked: those with at least one term.
fn checked_points(
    points: Vec<SparsePoint>,
) -> Result<Vec<(VectorPoint, SparseVector)>, VectorError> {
    let mut checked = Vec::with_capacity(points.len());
    for point in points {
        let chunk = point.validate()?;
        if !point.vector.is_empty() {
            checked.push((chunk, point.vector));
        }
    }
    Ok(checked)
}

fn upsert_edge_points(
    shard: &EdgeShard,
    points: &[(VectorPoint, SparseVector)],
) -> Result<(), VectorError> {
    for batch in points.chunks(UPSERT_BATCH) {
        let batch = batch
            .iter()
            .map(|(point, vector)| edge_point(point, vector))
            .collect();
        shard
            .update(UpdateOperation::PointOperation(
                PointOperations::UpsertPoints(PointInsertOperations::PointsList(batch)),
            ))
            .map_err(engine)?;
    }
    Ok(())
}

fn edge_point(point: &VectorPoint, vector: &SparseVector) -> PointStructPersisted {
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
        vector: VectorStructPersisted::Named(HashMap::from([(
            SPARSE_VECTOR.to_owned(),
            VectorPersisted::Sparse(qdrant_edge::SparseVector {
                indices: vector.indices.clone(),
                values: vector.values.clone(),
            }),
        )])),
        payload: Some(Payload(payload)),
    }
}

// ---------------------------------------------------------------------------------------
// Qdrant server
// ---------------------------------------------------------------------------------------

/// The sparse index in a Qdrant server collection.
#[derive(Clone)]
pub struct ServerSparse {
    client: Arc<Qdrant>,
    collection: String,
}

impl std::fmt::Debug for ServerSparse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client holds the API key: never print it.
        f.debug_struct("ServerSparse")
            .field("collection", &self.collection)
            .finish_non_exhaustive()
    }
}

impl ServerSparse {
    /// A lazy client for `collection` on the server at `url` (gRPC, usually port 6334).
    pub fn connect(
        url: &str,
        api_key: Option<String>,
        collection: &str,
    ) -> Result<Self, VectorError> {
        if collection.is_empty() {
            return Err(VectorError::invalid("collection", "empty name"));
        }
        let client = Qdrant::from_url(url)
            .api_key(api_key)
            .timeout(REQUEST_TIMEOUT)
            .skip_compatibility_check()
            .build()
            .map_err(client_error)?;
        Ok(ServerSparse {
            client: Arc::new(client),
            collection: collection.to_owned(),
        })
    }

    /// Creates the collection and payload indexes when missing; checks that an existing
    /// collection has the sparse vector with the idf modifier.
    pub async fn ensure_collection(&self) -> Result<(), VectorError> {
        let exists = self
            .client
            .collection_exists(CollectionExistsRequest {
                collection_name: self.collection.clone(),
            })
            .await
            .map_err(client_error)?;
        if exists {
            let info = self
                .client
                .collection_info(GetCollectionInfoRequest {
                    collection_name: self.collection.clone(),
                })
                .await
                .map_err(client_error)?;
            let sparse = info
                .result
                .and_then(|r| r.config)
                .and_then(|c| c.params)
                .and_then(|p| p.sparse_vectors_config);
            check_server_sparse(sparse.as_ref())?;
        } else {
            self.client
                .create_collection(create_sparse_collection_request(&self.collection))
                .await
                .map_err(client_error)?;
        }
        for request in field_index_requests(&self.collection) {
            self.client
                .create_field_index(request)
                .await
                .map_err(client_error)?;
        }
        Ok(())
    }

    async fn upsert(&self, points: Vec<(VectorPoint, SparseVector)>) -> Result<(), VectorError> {
        for request in sparse_upsert_requests(&self.collection, &points) {
            self.client
                .upsert_points(request)
                .await
                .map_err(client_error)?;
        }
        Ok(())
    }

    async fn delete_file(&self, namespace: &str, file_id: &str) -> Result<(), VectorError> {
        self.client
            .delete_points(delete_file_request(&self.collection, namespace, file_id))
            .await
            .map_err(client_error)?;
        Ok(())
    }

    async fn prune_file(
        &self,
        namespace: &str,
        file_id: &str,
        keep: &[uuid::Uuid],
    ) -> Result<(), VectorError> {
        self.client
            .delete_points(prune_file_request(
                &self.collection,
                namespace,
                file_id,
                keep,
            ))
            .await
            .map_err(client_error)?;
        Ok(())
    }

    async fn delete_namespace(&self, namespace: &str) -> Result<(), VectorError> {
        self.client
            .delete_points(delete_namespace_request(&self.collection, namespace))
            .await
            .map_err(client_error)?;
        Ok(())
    }

    async fn set_file_flags(
        &self,
        namespace: &str,
        file_id: &str,
        enabled: bool,
        hidden: bool,
    ) -> Result<(), VectorError> {
        self.client
            .set_payload(set_flags_request(
                &self.collection,
                namespace,
                file_id,
                enabled,
                hidden,
            ))
            .await
            .map_err(client_error)?;
        Ok(())
    }

    async fn search(
        &self,
        access: &AccessFilter,
        scope: &Scope,
        query: SparseVector,
        limit: usize,
    ) -> Result<Vec<VectorHit>, VectorError> {
        let response = self
            .client
            .query(sparse_query_request(
                &self.collection,
                access,
                scope,
                query,
                limit,
            ))
            .await
            .map_err(client_error)?;
        response
            .result
            .into_iter()
            .map(|point| {
                super::hit_from(
                    |key| match point.payload.get(key).and_then(|v| v.kind.as_ref()) {
                        Some(Kind::StringValue(s)) => Some(s.clone()),
                        _ => None,
                    },
                    point.score,
                )
            })
            .collect()
    }

    async fn count(&self, access: &AccessFilter, scope: &Scope) -> Result<u64, VectorError> {
        let response = self
            .client
            .count(client::CountPoints {
                collection_name: self.collection.clone(),
                filter: Some(filter::to_client(&filter::scoped_clause(access, scope))),
                exact: Some(true),
                ..Default::default()
            })
            .await
            .map_err(client_error)?;
        Ok(response.result.map(|r| r.count).unwrap_or(0))
    }
}

fn check_server_sparse(config: Option<&SparseVectorConfig>) -> Result<(), VectorError> {
    let modifier = config
        .and_then(|c| c.map.get(SPARSE_VECTOR))
        .map(|p| p.modifier);
    if modifier == Some(Some(client::Modifier::Idf as i32)) {
        Ok(())
    } else {
        Err(VectorError::Incompatible {
            existing: format!("no `{SPARSE_VECTOR}` sparse vector with the idf modifier"),
            wanted: format!("sparse vector `{SPARSE_VECTOR}` (idf)"),
        })
    }
}

pub(crate) fn create_sparse_collection_request(collection: &str) -> CreateCollection {
    CreateCollection {
        collection_name: collection.to_owned(),
        sparse_vectors_config: Some(SparseVectorConfig {
            map: HashMap::from([(
                SPARSE_VECTOR.to_owned(),
                SparseVectorParams {
                    index: None,
                    modifier: Some(client::Modifier::Idf as i32),
                },
            )]),
        }),
        ..Default::default()
    }
}

fn to_value(value: FieldValue) -> client::Value {
    match value {
        FieldValue::Str(s) => client::Value::from(s),
        FieldValue::Bool(b) => client::Value::from(b),
        FieldValue::List(items) => client::Value::from(items),
    }
}

pub(crate) fn sparse_upsert_requests(
    collection: &str,
    points: &[(VectorPoint, SparseVector)],
) -> Vec<UpsertPoints> {
    points
        .chunks(UPSERT_BATCH)
        .map(|batch| UpsertPoints {
            collection_name: collection.to_owned(),
            wait: Some(true),
            points: batch
                .iter()
                .map(|(point, vector)| PointStruct {
                    id: Some(client::PointId::from(point.id().to_string())),
                    payload: payload_fields(point)
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), to_value(v)))
                        .collect(),
                    vectors: Some(client::Vectors::from(NamedVectors {
                        vectors: HashMap::from([(
                            SPARSE_VECTOR.to_owned(),
                            client::Vector::new_sparse(
                                vector.indices.clone(),
                                vector.values.clone(),
                            ),
                        )]),
                    })),
                })
                .collect(),
            ..Default::default()
        })
        .collect()
}

pub(crate) fn sparse_query_request(
    collection: &str,
    access: &AccessFilter,
    scope: &Scope,
    query: SparseVector,
    limit: usize,
) -> QueryPoints {
    QueryPoints {
        collection_name: collection.to_owned(),
        query: Some(Query::new_nearest(VectorInput::new_sparse(
            query.indices,
            query.values,
        ))),
        using: Some(SPARSE_VECTOR.to_owned()),
        filter: Some(filter::to_client(&filter::scoped_clause(access, scope))),
        limit: Some(limit as u64),
        with_payload: Some(WithPayloadSelector {
            selector_options: Some(SelectorOptions::Include(PayloadIncludeSelector {
                fields: HIT_FIELDS.iter().map(|f| (*f).to_owned()).collect(),
            })),
        }),
        ..Default::default()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn everything() -> AccessFilter {
        AccessFilter {
            namespace: "demo".into(),
            allow_prefixes: vec![String::new()],
            ..Default::default()
        }
    }

    /// BM25 term weights as the indexer writes them (k1 1.2, b 0.75, average length 8).
    fn point(file: &str, path: &str, text: &str) -> SparsePoint {
        let counts = term_counts(text);
        let len: u32 = counts.values().sum();
        let norm = 1.2 * (0.25 + 0.75 * len as f32 / 8.0);
        SparsePoint {
            text_hash: Some(crate::chunk_text::text_hash(text)),
            namespace: "demo".into(),
            chunk_key: format!("{file}#0"),
            file_id: file.into(),
            path: path.into(),
            enabled: true,
            hidden: false,
            collections: Vec::new(),
            document_date: None,
            vector: SparseVector::from_sorted(
                counts
                    .into_iter()
                    .map(|(id, tf)| (id, tf as f32 * 2.2 / (tf as f32 + norm))),
            ),
        }
    }

    #[test]
    fn tokens_are_lowercased_word_runs_and_ids_are_stable() {
        assert_eq!(
            tokenize("Rotate scrape_series_added, NOW! (v2.0)"),
            vec!["rotate", "scrape_series_added", "now", "v2", "0"]
        );
        // FNV-1a test vectors: a stable hash, not the process-seeded std one.
        assert_eq!(term_id(""), 0x811c_9dc5);
        assert_eq!(term_id("a"), 0xe40c_292c);
        assert_eq!(term_id("foobar"), 0xbf9c_f968);
        let q = query_vector("keys keys rotate");
        assert_eq!(q.indices.len(), 2);
        assert!(q.indices.windows(2).all(|w| w[0] < w[1]));
        let keys = q
            .indices
            .iter()
            .position(|&i| i == term_id("keys"))
            .unwrap();
        assert_eq!(q.values[keys], 2.0);
    }

    #[tokio::test]
    async fn edge_points_follow_their_file_and_the_access_filter_applies_in_the_engine() {
        let dir = tempfile::tempdir().unwrap();
        let index = SparseIndex::open_edge(dir.path()).await.unwrap();
        let mut points = vec![
            point("rare", "ops/rare.md", "rotate the keys with vault"),
            point("secret", "secret/vault.md", "vault vault holds the keys"),
        ];
        for i in 0..6 {
            points.push(point(
                &format!("common{i}"),
                &format!("ops/common{i}.md"),
                "rotate the keys every quarter and rotate the keys again",
            ));
        }
        index.upsert(points).await.unwrap();
        assert_eq!(
            index.count(&everything(), &Scope::chunks()).await.unwrap(),
            8
        );

        // A denied folder or file is left out by the engine's filter.
        let denied = AccessFilter {
            deny_prefixes: vec!["secret/".into()],
            deny_file_ids: vec!["common0".into()],
            ..everything()
        };
        assert_eq!(index.count(&denied, &Scope::chunks()).await.unwrap(), 6);

        // Flags and deletes follow the file.
        index
            .set_file_flags("demo", "rare", false, false)
            .await
            .unwrap();
        let enabled_only = AccessFilter {
            enabled_only: true,
            ..everything()
        };
        assert_eq!(
            index.count(&enabled_only, &Scope::chunks()).await.unwrap(),
            7
        );
        index.delete_file("demo", "secret").await.unwrap();
        assert_eq!(
            index.count(&everything(), &Scope::chunks()).await.unwrap(),
            7
        );

        // Reopening keeps the points and checks the idf configuration.
        drop(index);
        let index = SparseIndex::open_edge(dir.path()).await.unwrap();
        assert_eq!(
            index.count(&everything(), &Scope::chunks()).await.unwrap(),
            7
        );
        let other = AccessFilter {
            namespace: "other".into(),
            ..everything()
        };
        assert_eq!(index.count(&other, &Scope::chunks()).await.unwrap(), 0);

        // A deleted namespace's points go, another's stay.
        let mut elsewhere = point("else", "else.md", "the other namespace's vault");
        elsewhere.namespace = "other".into();
        index.upsert(vec![elsewhere]).await.unwrap();
        index.delete_namespace("demo").await.unwrap();
        assert_eq!(
            index.count(&everything(), &Scope::chunks()).await.unwrap(),
            0
        );
        assert_eq!(index.count(&other, &Scope::chunks()).await.unwrap(), 1);

        // qdrant-edge 0.6.0 cannot score sparse vectors: a clear refusal, not a panic.
        let err = index
            .search(&everything(), &Scope::chunks(), query_vector("vault"), 5)
            .await
            .unwrap_err();
        assert!(matches!(err, VectorError::Incompatible { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn a_replace_writes_the_new_chunks_then_removes_the_files_others() {
        let dir = tempfile::tempdir().unwrap();
        let index = SparseIndex::open_edge(dir.path()).await.unwrap();
        let chunk = |file: &str, n: usize, text: &str| SparsePoint {
            chunk_key: format!("{file}#{n}"),
            ..point(file, &format!("{file}.md"), text)
        };
        let count_of = |file: &str| {
            let (index, others) = (
                index.clone(),
                AccessFilter {
                    deny_file_ids: vec![file.to_owned()],
                    ..everything()
                },
            );
            async move {
                let all = index.count(&everything(), &Scope::chunks()).await.unwrap();
                all - index.count(&others, &Scope::chunks()).await.unwrap()
            }
        };
        index
            .upsert(vec![
                chunk("a", 0, "rotate the keys"),
                chunk("a", 1, "the vault holds the keys"),
                chunk("a", 2, "an old section"),
                chunk("b", 0, "another file"),
            ])
            .await
            .unwrap();
        assert_eq!(count_of("a").await, 3);
        // The new version keeps chunk 0, leaves chunk 1 without a word, drops chunk 2 and
        // adds chunk 3: a#0 and a#3 remain, and b is untouched.
        let new_version = vec![
            chunk("a", 0, "rotate the keys"),
            chunk("a", 1, "—"),
            chunk("a", 3, "a new section"),
        ];
        index
            .replace_file("demo", "a", new_version.clone())
            .await
            .unwrap();
        assert_eq!((count_of("a").await, count_of("b").await), (2, 1));
        // A point of another file, or an invalid one, changes nothing.
        for stray in [chunk("b", 1, "b's new chunk"), chunk("b", 2, "—")] {
            let mut mixed = new_version.clone();
            mixed.push(stray);
            let err = index.replace_file("demo", "a", mixed).await.unwrap_err();
            assert!(matches!(err, VectorError::InvalidInput { .. }), "{err:?}");
        }
        let mut invalid = vec![chunk("a", 4, "more")];
        invalid[0].path = "/abs.md".into();
        assert!(index.replace_file("demo", "a", invalid).await.is_err());
        assert_eq!((count_of("a").await, count_of("b").await), (2, 1));
        // An empty version removes the file's points.
        index.replace_file("demo", "a", Vec::new()).await.unwrap();
        assert_eq!((count_of("a").await, count_of("b").await), (0, 1));
    }

    #[tokio::test]
    async fn invalid_points_and_queries_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let index = SparseIndex::open_edge(dir.path()).await.unwrap();
        let mut bad = point("f", "/abs.md", "text");
        assert!(index.upsert(vec![bad.clone()]).await.is_err());
        bad.path = "ok.md".into();
        bad.vector = SparseVector {
            indices: vec![2, 1],
            values: vec![1.0, 1.0],
        };
        assert!(index.upsert(vec![bad]).await.is_err());
        assert!(
            index
                .search(
                    &everything(),
                    &Scope::chunks(),
                    query_vector("x"),
                    MAX_SEARCH_LIMIT + 1
                )
                .await
                .is_err()
        );
        // A chunk without a word is skipped, an empty query finds nothing.
        index.upsert(vec![point("e", "e.md", "—")]).await.unwrap();
        assert_eq!(
            index.count(&everything(), &Scope::chunks()).await.unwrap(),
            0
        );
        assert!(
            index
                .search(&everything(), &Scope::chunks(), query_vector("…"), 5)
                .await
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn server_requests_name_the_sparse_vector_and_carry_the_access_filter() {
        let create = create_sparse_collection_request("kgmesh-bm25");
        assert!(create.vectors_config.is_none());
        let params = create
            .sparse_vectors_config
            .as_ref()
            .and_then(|c| c.map.get(SPARSE_VECTOR))
            .unwrap();
        assert_eq!(params.modifier, Some(client::Modifier::Idf as i32));
        assert!(check_server_sparse(create.sparse_vectors_config.as_ref()).is_ok());
        assert!(check_server_sparse(None).is_err());

        let p = point("f1", "guides/a.md", "rotate keys");
        let chunk = p.validate().unwrap();
        let requests = sparse_upsert_requests("kgmesh-bm25", &[(chunk.clone(), p.vector.clone())]);
        let first = &requests[0].points[0];
        assert_eq!(
            first.id.as_ref().and_then(|id| id.point_id_options.clone()),
            Some(client::point_id::PointIdOptions::Uuid(
                chunk.id().to_string()
            ))
        );
        assert!(
            first
                .payload
                .contains_key(crate::vector::schema::FOLDER_PREFIXES)
        );

        let access = AccessFilter {
            deny_file_ids: vec!["f9".into()],
            ..everything()
        };
        let q = sparse_query_request(
            "kgmesh-bm25",
            &access,
            &Scope::chunks(),
            query_vector("a b"),
            7,
        );
        assert_eq!(q.using.as_deref(), Some(SPARSE_VECTOR));
        assert_eq!(q.limit, Some(7));
        assert_eq!(
            q.filter,
            Some(filter::to_client(&filter::scoped_clause(
                &access,
                &Scope::chunks()
            )))
        );
    }
}

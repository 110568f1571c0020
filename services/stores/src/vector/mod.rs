//! The vector index: Qdrant, embedded or as a server, behind one interface.
//!
//! Both backends use the tenant field `namespace`, the same payload schema ([`schema`]) and
//! the same filters ([`filter`]):
//! - [`EdgeIndex`]: `qdrant-edge`, in-process Qdrant shards in a directory (the default
//!   for `kgmesh up` and tests): one for chunk points, one for file points, so a
//!   similar-files search walks an HNSW graph of files alone. Its API is synchronous; every
//!   call runs on tokio's blocking pool.
//! - [`ServerIndex`]: a Qdrant server through `qdrant-client` (production), one collection
//!   for both kinds.
//!
//! Points are chunks (`kind = "chunk"`) and whole files (`kind = "file"`, for
//! `similarFiles`). A point's id is derived from (kind, namespace, key), so re-indexing
//! the same chunk overwrites its point instead of adding one.

mod edge;
mod error;
pub mod filter;
mod server;
pub mod sparse;

use std::collections::HashMap;

use kg_proto::v1::AccessFilter;
use sha2::{Digest, Sha256};
use uuid::Uuid;

pub use edge::EdgeIndex;
pub use error::VectorError;
pub use server::ServerIndex;

/// Points written per engine call; bounds request size and lock hold time.
pub const UPSERT_BATCH: usize = 256;
/// Most embed hashes one [`VectorIndex::stored_vectors_by_hash`] request names.
pub const HASHES_PER_LOOKUP: usize = 256;
/// Largest `limit` a search accepts.
pub const MAX_SEARCH_LIMIT: usize = 10_000;

/// Payload field names. One schema for both backends.
pub mod schema {
    /// Tenant field: the namespace name.
    pub const NAMESPACE: &str = "namespace";
    /// "chunk" or "file".
    pub const KIND: &str = "kind";
    /// The chunk key (chunk points only).
    pub const CHUNK_KEY: &str = "chunkKey";
    /// The file id.
    pub const FILE_ID: &str = "fileId";
    /// The normalised file path inside the namespace.
    pub const PATH: &str = "path";
    /// The folder of the path: "" at the root, else `a/b/`.
    pub const FOLDER_PATH: &str = "folderPath";
    /// Every ancestor folder of the path (`a/`, `a/b/`): the keyword field that folder
    /// prefixes of the access filter match exactly.
    pub const FOLDER_PREFIXES: &str = "folderPrefixes";
    /// [`PATH_ANCHOR`](super::PATH_ANCHOR) followed by the path; never indexed, so a
    /// text match on it is a plain substring test, which the anchor turns into a prefix test.
    pub const ANCHORED_PATH: &str = "anchoredPath";
    /// The file's enabled flag.
    pub const ENABLED: &str = "enabled";
    /// The file's hidden flag (missing counts as visible).
    pub const HIDDEN: &str = "hidden";
    /// The file's collections.
    pub const COLLECTIONS: &str = "collections";
    /// The file's document date as written by the indexer (ISO 8601).
    pub const DOCUMENT_DATE: &str = "documentDate";
    /// The chunk's [`text_hash`](crate::chunk_text::text_hash) (chunk points written since
    /// it existed).
    pub const TEXT_HASH: &str = "textHash";
    /// What the chunk's vector was embedded from, as an
    /// [`embed_hash`](crate::chunk_text::embed_hash) (chunk points written since it
    /// existed): a later version of the file reuses the vector of an equal hash.
    pub const EMBED_HASH: &str = "embedHash";
}

/// Starts [`schema::ANCHORED_PATH`]. A control character: `normalize_path` refuses them,
/// so it occurs in no stored path and only at the start of the anchored one.
pub const PATH_ANCHOR: char = '\u{1}';

/// What a point stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PointKind {
    /// One chunk of a file.
    Chunk,
    /// A whole file (file-level vector for similar files).
    File,
}

impl PointKind {
    /// The payload value.
    pub fn as_str(self) -> &'static str {
        match self {
            PointKind::Chunk => "chunk",
            PointKind::File => "file",
        }
    }
}

/// One vector with its payload, as the indexer writes it.
#[derive(Debug, Clone, PartialEq)]
pub struct VectorPoint {
    /// The namespace (tenant).
    pub namespace: String,
    /// Chunk or file.
    pub kind: PointKind,
    /// The chunk key; required for chunks, ignored for files.
    pub chunk_key: String,
    /// The file id.
    pub file_id: String,
    /// The normalised path (see `kg_common::access::normalize_path`).
    pub path: String,
    /// The file's enabled flag.
    pub enabled: bool,
    /// The file's hidden flag.
    pub hidden: bool,
    /// The file's collections.
    pub collections: Vec<String>,
    /// The file's document date, if known.
    pub document_date: Option<String>,
    /// The embedding; its length must be the index dimension.
    pub vector: Vec<f32>,
    /// The chunk's [`text_hash`](crate::chunk_text::text_hash); ignored for files.
    pub text_hash: Option<String>,
    /// The [`embed_hash`](crate::chunk_text::embed_hash) of what `vector` was embedded
    /// from; ignored for files.
    pub embed_hash: Option<String>,
}

impl VectorPoint {
    /// The key the point id is derived from: the chunk key, or the file id for files.
    pub fn key(&self) -> &str {
        match self.kind {
            PointKind::Chunk => &self.chunk_key,
            PointKind::File => &self.file_id,
        }
    }

    /// The stable point id.
    pub fn id(&self) -> Uuid {
        point_id(&self.namespace, self.kind, self.key())
    }
}

/// The stable id of a point: a UUID (version 8) from SHA-256 of (kind, namespace, key).
pub fn point_id(namespace: &str, kind: PointKind, key: &str) -> Uuid {
    let mut hasher = Sha256::new();
    for part in ["kgmesh-vector-v1", kind.as_str(), namespace, key] {
        hasher.update(part.as_bytes());
        hasher.update([0u8]);
    }
    let digest = hasher.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    Uuid::new_v8(bytes)
}

/// What a search or count looks at, besides the access filter.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Scope {
    /// Chunk or file points (default: chunks).
    pub kind: Option<PointKind>,
    /// Only points in at least one of these collections; empty = no constraint.
    pub collections: Vec<String>,
    /// Points of these files are left out (e.g. the file whose neighbours are asked for).
    pub exclude_file_ids: Vec<String>,
}

impl Scope {
    /// Chunk points, no other constraint.
    pub fn chunks() -> Self {
        Scope {
            kind: Some(PointKind::Chunk),
            ..Default::default()
        }
    }

    /// File points, no other constraint.
    pub fn files() -> Self {
        Scope {
            kind: Some(PointKind::File),
            ..Default::default()
        }
    }

    fn kind(&self) -> PointKind {
        self.kind.unwrap_or(PointKind::Chunk)
    }
}

/// One search result.
#[derive(Debug, Clone, PartialEq)]
pub struct VectorHit {
    /// The chunk key (`None` for file points).
    pub chunk_key: Option<String>,
    /// The file id.
    pub file_id: String,
    /// The file path.
    pub path: String,
    /// Cosine similarity.
    pub score: f32,
    /// The chunk's text hash, when the point was written with one.
    pub text_hash: Option<String>,
}

/// A payload value: the three shapes the schema uses, convertible to either backend.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum FieldValue {
    Str(String),
    Bool(bool),
    List(Vec<String>),
}

/// The payload of a point, in schema order. The single definition both backends write.
pub(crate) fn payload_fields(point: &VectorPoint) -> Vec<(&'static str, FieldValue)> {
    use FieldValue::{Bool, List, Str};
    let mut fields = vec![
        (schema::NAMESPACE, Str(point.namespace.clone())),
        (schema::KIND, Str(point.kind.as_str().to_owned())),
        (schema::FILE_ID, Str(point.file_id.clone())),
        (schema::PATH, Str(point.path.clone())),
        (
            schema::FOLDER_PATH,
            Str(kg_common::access::folder_of(&point.path).to_owned()),
        ),
        (schema::FOLDER_PREFIXES, List(folder_prefixes(&point.path))),
        (
            schema::ANCHORED_PATH,
            Str(format!("{PATH_ANCHOR}{}", point.path)),
        ),
        (schema::ENABLED, Bool(point.enabled)),
        (schema::HIDDEN, Bool(point.hidden)),
        (schema::COLLECTIONS, List(point.collections.clone())),
    ];
    if point.kind == PointKind::Chunk {
        fields.push((schema::CHUNK_KEY, Str(point.chunk_key.clone())));
        if let Some(hash) = &point.text_hash {
            fields.push((schema::TEXT_HASH, Str(hash.clone())));
        }
        if let Some(hash) = &point.embed_hash {
            fields.push((schema::EMBED_HASH, Str(hash.clone())));
        }
    }
    if let Some(date) = &point.document_date {
        fields.push((schema::DOCUMENT_DATE, Str(date.clone())));
    }
    fields
}

/// Every ancestor folder of a normalised path: `a/b/c.md` -> `a/`, `a/b/`.
pub fn folder_prefixes(path: &str) -> Vec<String> {
    path.match_indices('/')
        .map(|(i, _)| path[..=i].to_owned())
        .collect()
}

/// Checks the points of a [`VectorIndex::replace_file`]: each valid and of that file. Returns
/// their ids, the ones the replacement keeps.
pub(crate) fn replacement_ids(
    namespace: &str,
    file_id: &str,
    points: &[VectorPoint],
    dimension: usize,
) -> Result<Vec<Uuid>, VectorError> {
    points
        .iter()
        .map(|point| {
            validate_point(point, dimension)?;
            if point.namespace != namespace || point.file_id != file_id {
                return Err(VectorError::invalid(
                    "point",
                    format!(
                        "a point of file `{}` in namespace `{}` cannot replace the points of \
                         file `{file_id}` in namespace `{namespace}`",
                        point.file_id, point.namespace
                    ),
                ));
            }
            Ok(point.id())
        })
        .collect()
}

/// Checks a point before it is written: the filters rely on normalised paths.
pub(crate) fn validate_point(point: &VectorPoint, dimension: usize) -> Result<(), VectorError> {
    kg_common::access::validate_namespace(&point.namespace)
        .map_err(|e| VectorError::invalid("namespace", e.to_string()))?;
    match kg_common::access::normalize_path(&point.path) {
        Ok(normal) if normal == point.path => {}
        Ok(normal) => {
            return Err(VectorError::invalid(
                "path",
                format!("`{}` is not normalised (expected `{normal}`)", point.path),
            ));
        }
        Err(e) => return Err(VectorError::invalid("path", e.to_string())),
    }
    if point.file_id.is_empty() {
        return Err(VectorError::invalid("file id", "empty"));
    }
    if point.kind == PointKind::Chunk && point.chunk_key.is_empty() {
        return Err(VectorError::invalid("chunk key", "empty for a chunk point"));
    }
    if point.vector.len() != dimension {
        return Err(VectorError::invalid(
            "vector",
            format!(
                "{} dimensions, the index has {dimension}",
                point.vector.len()
            ),
        ));
    }
    if point.vector.iter().any(|v| !v.is_finite()) {
        return Err(VectorError::invalid("vector", "contains NaN or infinity"));
    }
    Ok(())
}

pub(crate) fn validate_query(
    vector: &[f32],
    dimension: usize,
    limit: usize,
) -> Result<(), VectorError> {
    if vector.len() != dimension {
        return Err(VectorError::invalid(
            "query vector",
            format!("{} dimensions, the index has {dimension}", vector.len()),
        ));
    }
    if vector.iter().any(|v| !v.is_finite()) {
        return Err(VectorError::invalid(
            "query vector",
            "contains NaN or infinity",
        ));
    }
    if limit > MAX_SEARCH_LIMIT {
        return Err(VectorError::invalid(
            "limit",
            format!("{limit} is over the maximum of {MAX_SEARCH_LIMIT}"),
        ));
    }
    Ok(())
}

/// Where the vectors live; chosen by configuration.
#[derive(Debug, Clone)]
pub enum VectorIndex {
    /// Embedded qdrant-edge shard.
    Edge(EdgeIndex),
    /// Qdrant server.
    Server(ServerIndex),
}

impl VectorIndex {
    /// Vector dimension of the index.
    pub fn dimension(&self) -> usize {
        match self {
            VectorIndex::Edge(i) => i.dimension(),
            VectorIndex::Server(i) => i.dimension(),
        }
    }

    /// Creates the collection and its payload indexes when missing; checks the
    /// dimension and distance when present. Idempotent.
    pub async fn ensure_collection(&self) -> Result<(), VectorError> {
        match self {
            VectorIndex::Edge(i) => i.ensure_collection().await,
            VectorIndex::Server(i) => i.ensure_collection().await,
        }
    }

    /// Inserts or replaces points, in batches of [`UPSERT_BATCH`]. Nothing is written
    /// when any point is invalid.
    pub async fn upsert(&self, points: Vec<VectorPoint>) -> Result<(), VectorError> {
        match self {
            VectorIndex::Edge(i) => i.upsert(points).await,
            VectorIndex::Server(i) => i.upsert(points).await,
        }
    }

    /// Deletes every point (chunks and file vector) of a file.
    pub async fn delete_file(&self, namespace: &str, file_id: &str) -> Result<(), VectorError> {
        match self {
            VectorIndex::Edge(i) => i.delete_file(namespace, file_id).await,
            VectorIndex::Server(i) => i.delete_file(namespace, file_id).await,
        }
    }

    /// Makes `points` the file's points: writes them, then deletes the file's points that
    /// are not among them. Searches never find the file without points while a new version
    /// replaces the old (unchanged chunks keep their point ids), and a crash between the
    /// two steps leaves the new points beside stale ones, which the next replace removes.
    /// Nothing is written when any point is invalid or belongs to another file.
    pub async fn replace_file(
        &self,
        namespace: &str,
        file_id: &str,
        points: Vec<VectorPoint>,
    ) -> Result<(), VectorError> {
        match self {
            VectorIndex::Edge(i) => i.replace_file(namespace, file_id, points).await,
            VectorIndex::Server(i) => i.replace_file(namespace, file_id, points).await,
        }
    }

    /// Deletes every point of a namespace (it is being deleted).
    pub async fn delete_namespace(&self, namespace: &str) -> Result<(), VectorError> {
        match self {
            VectorIndex::Edge(i) => i.delete_namespace(namespace).await,
            VectorIndex::Server(i) => i.delete_namespace(namespace).await,
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
            VectorIndex::Edge(i) => i.set_file_flags(namespace, file_id, enabled, hidden).await,
            VectorIndex::Server(i) => i.set_file_flags(namespace, file_id, enabled, hidden).await,
        }
    }

    /// The `limit` nearest points to `vector` that `access` and `scope` admit, best first.
    pub async fn search(
        &self,
        access: &AccessFilter,
        scope: &Scope,
        vector: Vec<f32>,
        limit: usize,
    ) -> Result<Vec<VectorHit>, VectorError> {
        match self {
            VectorIndex::Edge(i) => i.search(access, scope, vector, limit).await,
            VectorIndex::Server(i) => i.search(access, scope, vector, limit).await,
        }
    }

    /// How many points `access` and `scope` admit (exact).
    pub async fn count(&self, access: &AccessFilter, scope: &Scope) -> Result<u64, VectorError> {
        match self {
            VectorIndex::Edge(i) => i.count(access, scope).await,
            VectorIndex::Server(i) => i.count(access, scope).await,
        }
    }

    /// The vectors of a file's chunk points, by the [`schema::EMBED_HASH`] they were written
    /// with (points written without one are left out): what a new version of the file can
    /// reuse instead of embedding the same text again. The indexer's own read, so no access
    /// filter; a vector of another length than the index's is left out too.
    pub async fn stored_chunk_vectors(
        &self,
        namespace: &str,
        file_id: &str,
    ) -> Result<HashMap<String, Vec<f32>>, VectorError> {
        self.stored_vectors(&filter::file_chunks_clause(namespace, file_id))
            .await
    }

    /// The vectors of any chunk points of the namespace written with one of `hashes`: a
    /// text the file's own points lack may be stored under another file (a copy, or a file
    /// moved to another path). Asks [`HASHES_PER_LOOKUP`] hashes at a time; otherwise as
    /// [`VectorIndex::stored_chunk_vectors`].
    pub async fn stored_vectors_by_hash(
        &self,
        namespace: &str,
        hashes: &[String],
    ) -> Result<HashMap<String, Vec<f32>>, VectorError> {
        let mut stored = HashMap::new();
        for batch in hashes.chunks(HASHES_PER_LOOKUP) {
            stored.extend(
                self.stored_vectors(&filter::namespace_chunks_by_hash(namespace, batch))
                    .await?,
            );
        }
        Ok(stored)
    }

    async fn stored_vectors(
        &self,
        selection: &filter::Clause,
    ) -> Result<HashMap<String, Vec<f32>>, VectorError> {
        let mut stored = match self {
            VectorIndex::Edge(i) => i.stored_vectors(selection).await?,
            VectorIndex::Server(i) => i.stored_vectors(selection).await?,
        };
        let dimension = self.dimension();
        stored.retain(|_, vector| vector.len() == dimension);
        Ok(stored)
    }

    /// The file-level vector of `file_id` (the normalised mean of its chunk vectors), when
    /// the file has a file point that `access` admits. `None` for an unknown, unreadable
    /// or (under `enabled_only`) disabled file, and for a file indexed without embeddings.
    pub async fn file_vector(
        &self,
        access: &AccessFilter,
        file_id: &str,
    ) -> Result<Option<Vec<f32>>, VectorError> {
        match self {
            VectorIndex::Edge(i) => i.file_vector(access, file_id).await,
            VectorIndex::Server(i) => i.file_vector(access, file_id).await,
        }
    }

    /// The `limit` files most similar to `file_id`, best first: a search over file points
    /// only, nearest to the file's own file vector, leaving the file itself out. `access`
    /// (and the collections of `scope`) filter inside the engine, for the source file as
    /// well: an unreadable source file, or one without a file point, has no neighbours
    /// (`Ok(None)`, so a caller can tell "no vector" from "no similar file").
    pub async fn similar_files(
        &self,
        access: &AccessFilter,
        scope: &Scope,
        namespace: &str,
        file_id: &str,
        limit: usize,
    ) -> Result<Option<Vec<VectorHit>>, VectorError> {
        if access.namespace != namespace {
            return Err(VectorError::invalid(
                "namespace",
                format!(
                    "`{namespace}` is not the namespace of the access filter (`{}`)",
                    access.namespace
                ),
            ));
        }
        let Some(vector) = self.file_vector(access, file_id).await? else {
            return Ok(None);
        };
        // The source file leaves the answer here, not through a `must_not` on its id: the
        // engine checked that clause on every candidate it walked, and at 100k chunks the check
        // cost more than the scoring (perf). A file has one file point: one hit more suffices.
        let scope = Scope {
            kind: Some(PointKind::File),
            ..scope.clone()
        };
        let asked = limit.saturating_add(1).min(MAX_SEARCH_LIMIT);
        let mut hits = self.search(access, &scope, vector, asked).await?;
        hits.retain(|hit| hit.file_id != file_id);
        hits.truncate(limit);
        Ok(Some(hits))
    }

    /// Compacts and indexes now. The embedded shard also does this by itself once writes
    /// settle (see [`EdgeIndex`]), and a Qdrant server optimizes on its own; this is for
    /// callers that need it done before they go on. Returns whether anything changed.
    pub async fn optimize(&self) -> Result<bool, VectorError> {
        match self {
            VectorIndex::Edge(i) => i.optimize().await,
            VectorIndex::Server(_) => Ok(false),
        }
    }
}

impl From<EdgeIndex> for VectorIndex {
    fn from(index: EdgeIndex) -> Self {
        VectorIndex::Edge(index)
    }
}

impl From<ServerIndex> for VectorIndex {
    fn from(index: ServerIndex) -> Self {
        VectorIndex::Server(index)
    }
}

/// Reads a hit from a payload map (shared by both backends through a getter).
pub(crate) fn hit_from(
    get_str: impl Fn(&str) -> Option<String>,
    score: f32,
) -> Result<VectorHit, VectorError> {
    let file_id = get_str(schema::FILE_ID)
        .ok_or_else(|| VectorError::internal("a point without fileId in its payload"))?;
    let path = get_str(schema::PATH)
        .ok_or_else(|| VectorError::internal("a point without path in its payload"))?;
    Ok(VectorHit {
        chunk_key: get_str(schema::CHUNK_KEY),
        file_id,
        path,
        score,
        text_hash: get_str(schema::TEXT_HASH),
    })
}

/// The payload fields a search returns.
pub(crate) const HIT_FIELDS: [&str; 4] = [
    schema::CHUNK_KEY,
    schema::FILE_ID,
    schema::PATH,
    schema::TEXT_HASH,
];

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn point(path: &str) -> VectorPoint {
        VectorPoint {
            text_hash: None,
            embed_hash: None,
            namespace: "demo".into(),
            kind: PointKind::Chunk,
            chunk_key: "c1".into(),
            file_id: "f1".into(),
            path: path.into(),
            enabled: true,
            hidden: false,
            collections: vec!["hr".into()],
            document_date: Some("2024-05-01".into()),
            vector: vec![0.1, 0.2, 0.3],
        }
    }

    #[test]
    fn folder_prefixes_are_the_ancestors() {
        assert_eq!(folder_prefixes("a/b/c.md"), vec!["a/", "a/b/"]);
        assert!(folder_prefixes("c.md").is_empty());
    }

    #[test]
    fn point_ids_are_stable_and_separate_kinds_and_namespaces() {
        let a = point_id("demo", PointKind::Chunk, "k");
        assert_eq!(a, point_id("demo", PointKind::Chunk, "k"));
        assert_ne!(a, point_id("demo", PointKind::File, "k"));
        assert_ne!(a, point_id("other", PointKind::Chunk, "k"));
        assert_ne!(a, point_id("demo", PointKind::Chunk, "k2"));
        assert_eq!(a.get_version_num(), 8);
    }

    #[test]
    fn payload_follows_the_schema() {
        let fields = payload_fields(&point("guides/setup/intro.md"));
        let get = |k: &str| fields.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
        assert_eq!(
            get(schema::FOLDER_PATH),
            Some(FieldValue::Str("guides/setup/".into()))
        );
        assert_eq!(
            get(schema::FOLDER_PREFIXES),
            Some(FieldValue::List(vec![
                "guides/".into(),
                "guides/setup/".into()
            ]))
        );
        assert_eq!(
            get(schema::ANCHORED_PATH),
            Some(FieldValue::Str("\u{1}guides/setup/intro.md".into()))
        );
        assert_eq!(get(schema::CHUNK_KEY), Some(FieldValue::Str("c1".into())));
        assert_eq!(get(schema::KIND), Some(FieldValue::Str("chunk".into())));
        let file = VectorPoint {
            kind: PointKind::File,
            document_date: None,
            ..point("a.md")
        };
        let fields = payload_fields(&file);
        assert!(!fields.iter().any(|(n, _)| *n == schema::CHUNK_KEY));
        assert!(!fields.iter().any(|(n, _)| *n == schema::DOCUMENT_DATE));
    }

    #[test]
    fn invalid_points_are_refused() {
        assert!(validate_point(&point("a/b.md"), 3).is_ok());
        for bad in ["/a/b.md", "a//b.md", "a/../b.md", "a/\u{1}b.md", ""] {
            assert!(validate_point(&point(bad), 3).is_err(), "{bad:?}");
        }
        assert!(validate_point(&point("a.md"), 4).is_err());
        let nan = VectorPoint {
            vector: vec![0.0, f32::NAN, 1.0],
            ..point("a.md")
        };
        assert!(validate_point(&nan, 3).is_err());
        let keyless = VectorPoint {
            chunk_key: String::new(),
            ..point("a.md")
        };
        assert!(validate_point(&keyless, 3).is_err());
        let bad_ns = VectorPoint {
            namespace: "Bad NS".into(),
            ..point("a.md")
        };
        assert!(validate_point(&bad_ns, 3).is_err());
        assert!(validate_query(&[0.0; 3], 3, MAX_SEARCH_LIMIT + 1).is_err());
        assert!(validate_query(&[0.0; 2], 3, 1).is_err());
    }
}

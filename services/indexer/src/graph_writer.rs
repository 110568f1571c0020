//! Writes one file's chunks and outline into its namespace graph in FalkorDB.
//!
//! Idempotent on re-delivery: a file whose FileRef already carries the event's
//! version id, chunk count and path is left alone. Otherwise the new version is written
//! beside the old one and the old one is pruned after, in UNWIND batches: a chunk or section
//! whose key the graph already holds for the file keeps its node (and the MENTIONS on it)
//! and takes the new properties, the others are created, edges are reconciled, and only
//! then are the nodes the version no longer has deleted. So a reader never finds the file
//! without chunks while it is rewritten. `versionId`/`chunkCount` are set last: a crash
//! part-way leaves a FileRef without a version, and the re-delivered event redoes the write
//! and prunes what the interrupted one left. Folder nodes for every ancestor folder (the
//! root is [`ROOT_FOLDER`]) hang together by HAS_CHILD edges down to the FileRef.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, OnceLock};

use kg_common::access::{folder_of, validate_namespace};
use kg_common::error::{ErrorCode, ErrorExt};
use kg_stores::StoreError;
use kg_stores::chunk_text::{text_hash, word_count};
use kg_stores::graph::{GraphStore, Params, Rows, assign_properties};
use serde_json::{Value, json};

use crate::document::DocumentMeta;

/// Chunks created or updated per query; keeps one query's parameter text around a few MB at most.
const CHUNK_BATCH: usize = 200;
/// Edges or outline nodes created, updated or deleted per query.
const EDGE_BATCH: usize = 1000;
/// Nodes deleted per query, so deleting a huge file never builds one giant transaction.
const DELETE_BATCH: usize = 1000;

/// The file a set of chunks belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRecord {
    pub namespace: String,
    pub file_id: String,
    pub version_id: String,
    /// Normalised path inside the namespace (`guides/intro.md`).
    pub path: String,
    /// File name (last path segment).
    pub name: String,
    /// Folder of `path`: "" at the root, else `a/b/` (see `kg_common::access::folder_of`).
    pub folder_path: String,
    pub enabled: bool,
    pub hidden: bool,
    pub title: Option<String>,
    pub document_date: Option<String>,
    pub mime: String,
}

/// One chunk of the file, as the chunker produced it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkRecord {
    pub chunk_key: String,
    /// 0-based position in the file; NEXT_CHUNK edges follow this order.
    pub index: u32,
    pub text: String,
    pub context_header: String,
    pub char_start: u64,
    pub char_end: u64,
    pub line_start: u32,
    pub line_end: u32,
    pub page_start: Option<u32>,
    pub page_end: Option<u32>,
    pub token_count: u32,
    /// Outline key of the deepest section the chunk starts in.
    pub section_key: Option<String>,
}

/// One outline section of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutlineRecord {
    pub outline_key: String,
    pub title: String,
    pub depth: u32,
    /// 0-based position in document order.
    pub order: u32,
    pub parent_key: Option<String>,
    pub line_start: u32,
    pub line_end: u32,
    pub char_start: u64,
    pub char_end: u64,
    pub page_start: Option<u32>,
    pub page_end: Option<u32>,
    /// Keys of the chunks this section covers (COVERS edges).
    pub covers: Vec<String>,
}

/// What [`write_file`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The graph already held this version: nothing was written.
    Unchanged,
    /// The file's chunks and outline were (re)written.
    Written {
        /// Chunks the version has, created or kept from the stored version.
        chunks: usize,
        /// Outline sections the version has, created or kept.
        sections: usize,
    },
}

/// Why a graph write failed.
#[derive(Debug, thiserror::Error)]
pub enum GraphWriteError {
    /// The records contradict each other (a bug upstream; retrying cannot help).
    #[error("invalid graph write for file `{file_id}`: {reason}")]
    InvalidRecord {
        /// The file being written.
        file_id: String,
        /// What is inconsistent.
        reason: String,
    },
    /// The namespace name is not valid.
    #[error(transparent)]
    Name(#[from] kg_common::access::NameError),
    /// FalkorDB failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// FalkorDB answered with rows of an unexpected shape.
    #[error("unexpected graph reply: {0}")]
    UnexpectedReply(&'static str),
    /// The event bus holds no TBox for a namespace whose graph was written with one: NATS lost
    /// its state, and the ontology service has not put the TBox back yet.
    #[error(
        "the event bus holds no TBox for namespace `{namespace}`, but its graph was written with \
         one; waiting for the ontology service to put it back"
    )]
    TboxNotOnBus {
        /// The namespace.
        namespace: String,
    },
}

impl ErrorExt for GraphWriteError {
    fn code(&self) -> ErrorCode {
        match self {
            GraphWriteError::InvalidRecord { .. } => ErrorCode::InvalidArgument,
            GraphWriteError::Name(err) => err.code(),
            GraphWriteError::Store(err) => err.code(),
            GraphWriteError::UnexpectedReply(_) => ErrorCode::Internal,
            GraphWriteError::TboxNotOnBus { .. } => ErrorCode::Unavailable,
        }
    }
}

kg_common::impl_status_from!(GraphWriteError);

/// Writes `file` with its `chunks` and `outline`, replacing what the graph held for it;
/// the FileRef gets no type, tags, effective window or collections (see [`write_document`]).
pub async fn write_file(
    graph: &GraphStore,
    file: &FileRecord,
    chunks: &[ChunkRecord],
    outline: &[OutlineRecord],
) -> Result<WriteOutcome, GraphWriteError> {
    write_document(graph, file, &DocumentMeta::default(), chunks, outline).await
}

/// [`write_file`], with the document's metadata on the FileRef: `docType`, `tags`,
/// `effectiveFrom`, `effectiveTo` and `collections` (title and documentDate come from `file`).
/// The metadata is a function of the version's content, so an unchanged version keeps it.
pub async fn write_document(
    graph: &GraphStore,
    file: &FileRecord,
    meta: &DocumentMeta,
    chunks: &[ChunkRecord],
    outline: &[OutlineRecord],
) -> Result<WriteOutcome, GraphWriteError> {
    validate_namespace(&file.namespace)?;
    let folder = validate(file, chunks, outline)?;
    let ns = file.namespace.as_str();
    ensure_indexes_once(graph, ns).await?;

    if is_current(graph, file, chunks).await? {
        tracing::debug!(namespace = ns, file_id = %file.file_id, version_id = %file.version_id, "graph already current");
        return Ok(WriteOutcome::Unchanged);
    }

    upsert_file_ref(graph, file, meta).await?;
    link_folders(graph, file, &folder).await?;

    let stored_chunks = stored_nodes(graph, file, &CHUNK_NODES).await?;
    let stored_sections = stored_nodes(graph, file, &OUTLINE_NODES).await?;
    let mut ordered: Vec<&ChunkRecord> = chunks.iter().collect();
    ordered.sort_by_key(|c| c.index);
    let chunk_plan = plan_nodes(
        &CHUNK_NODES,
        ordered.iter().map(|c| (c.chunk_key.as_str(), chunk_row(c))),
        &stored_chunks,
    );
    let section_plan = plan_nodes(
        &OUTLINE_NODES,
        outline
            .iter()
            .map(|o| (o.outline_key.as_str(), section_row(o))),
        &stored_sections,
    );
    update_chunks(graph, file, &chunk_plan.update).await?;
    create_chunks(graph, file, &chunk_plan.create).await?;
    update_sections(graph, file, &section_plan.update).await?;
    create_sections(graph, file, &section_plan.create).await?;
    let kept = KeptNodes {
        chunks: chunk_plan.kept,
        sections: section_plan.kept,
    };
    link_version(graph, file, &ordered, outline, &kept).await?;

    let wanted_sections: HashSet<&str> = outline.iter().map(|o| o.outline_key.as_str()).collect();
    let wanted_chunks: HashSet<&str> = chunks.iter().map(|c| c.chunk_key.as_str()).collect();
    prune_nodes(
        graph,
        file,
        &OUTLINE_NODES,
        &stored_sections,
        &wanted_sections,
    )
    .await?;
    prune_nodes(graph, file, &CHUNK_NODES, &stored_chunks, &wanted_chunks).await?;

    // Last: only now does a re-delivered event for this version become a no-op.
    let mut params = Params::new();
    params.insert("fileId".into(), json!(file.file_id));
    params.insert("versionId".into(), json!(file.version_id));
    params.insert("chunkCount".into(), json!(chunks.len()));
    graph
        .query(
            ns,
            "MATCH (f:FileRef {fileId: $fileId}) SET f.versionId = $versionId, f.chunkCount = $chunkCount",
            &params,
        )
        .await?;
    tracing::info!(
        namespace = ns,
        file_id = %file.file_id,
        version_id = %file.version_id,
        chunks = chunks.len(),
        sections = outline.len(),
        "file written to graph"
    );
    Ok(WriteOutcome::Written {
        chunks: chunks.len(),
        sections: outline.len(),
    })
}

/// Removes the file's FileRef, chunks and outline. Folder nodes stay, even when
/// they become empty. Returns whether a FileRef existed.
pub async fn delete_file(
    graph: &GraphStore,
    ns: &str,
    file_id: &str,
) -> Result<bool, GraphWriteError> {
    validate_namespace(ns)?;
    let params = file_params(file_id);
    // Clear the version first: if we stop half-way, a later write of any version redoes everything.
    let mut cleared = params.clone();
    let clear = assign_properties(
        "f",
        &[("versionId", Value::Null), ("chunkCount", Value::Null)],
        &mut cleared,
    );
    graph
        .query(
            ns,
            &format!("MATCH (f:FileRef {{fileId: $fileId}}) {clear}"),
            &cleared,
        )
        .await?;
    delete_in_batches(graph, ns, "Chunk", file_id).await?;
    delete_in_batches(graph, ns, "OutlineNode", file_id).await?;
    let rows = graph
        .query(
            ns,
            "MATCH (f:FileRef {fileId: $fileId}) DETACH DELETE f RETURN count(f)",
            &params,
        )
        .await?;
    let existed = first_int(&rows)? > 0;
    tracing::info!(namespace = ns, file_id, existed, "file deleted from graph");
    Ok(existed)
}

/// Sets `enabled` and `hidden` on the file's FileRef, Chunk and OutlineNode nodes, in one query so readers never see a mix. Returns whether the file exists.
pub async fn set_flags(
    graph: &GraphStore,
    ns: &str,
    file_id: &str,
    enabled: bool,
    hidden: bool,
) -> Result<bool, GraphWriteError> {
    validate_namespace(ns)?;
    let mut params = file_params(file_id);
    params.insert("enabled".into(), json!(enabled));
    params.insert("hidden".into(), json!(hidden));
    let rows = graph
        .query(
            ns,
            "MATCH (f:FileRef {fileId: $fileId}) SET f.enabled = $enabled, f.hidden = $hidden \
             WITH f OPTIONAL MATCH (c:Chunk {fileId: $fileId}) SET c.enabled = $enabled, c.hidden = $hidden \
             WITH f, count(c) AS chunks \
             OPTIONAL MATCH (o:OutlineNode {fileId: $fileId}) SET o.enabled = $enabled, o.hidden = $hidden \
             RETURN count(DISTINCT f)",
            &params,
        )
        .await?;
    // No FileRef: MATCH yields no row at all.
    let exists = match rows.rows.first() {
        Some(_) => first_int(&rows)? > 0,
        None => false,
    };
    tracing::info!(
        namespace = ns,
        file_id,
        enabled,
        hidden,
        exists,
        "file flags set"
    );
    Ok(exists)
}

/// (server, namespace) pairs whose indexes this process already ensured.
fn ensured() -> &'static Mutex<HashSet<String>> {
    static ENSURED: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    ENSURED.get_or_init(|| Mutex::new(HashSet::new()))
}

/// Forgets that `ns`'s indexes were ensured on `graph`'s server: the next write checks them
/// again (a rebuild, after which the graph may have been lost with them).
pub(crate) fn forget_namespace(graph: &GraphStore, ns: &str) {
    let key = format!("{}\u{0}{ns}", graph.server_identity());
    if let Ok(mut set) = ensured().lock() {
        set.remove(&key);
    }
}

async fn ensure_indexes_once(graph: &GraphStore, ns: &str) -> Result<(), StoreError> {
    let key = format!("{}\u{0}{ns}", graph.server_identity());
    let known = ensured()
        .lock()
        .map(|set| set.contains(&key))
        .unwrap_or(false);
    if known {
        return Ok(());
    }
    graph.ensure_indexes(ns).await?;
    if let Ok(mut set) = ensured().lock() {
        set.insert(key);
    }
    Ok(())
}

/// Checks the records against each other; returns the normalised folder path.
fn validate(
    file: &FileRecord,
    chunks: &[ChunkRecord],
    outline: &[OutlineRecord],
) -> Result<String, GraphWriteError> {
    let invalid = |reason: String| GraphWriteError::InvalidRecord {
        file_id: file.file_id.clone(),
        reason,
    };
    if file.file_id.is_empty() || file.version_id.is_empty() || file.path.is_empty() {
        return Err(invalid("file id, version id and path must be set".into()));
    }
    let folder = normalize_folder(&file.folder_path);
    if folder != folder_of(&file.path) {
        return Err(invalid(format!(
            "folder path `{}` is not the folder of `{}`",
            file.folder_path, file.path
        )));
    }
    let mut chunk_keys = HashSet::new();
    let mut indexes = HashSet::new();
    for chunk in chunks {
        if !chunk_keys.insert(chunk.chunk_key.as_str()) {
            return Err(invalid(format!(
                "chunk key `{}` appears twice",
                chunk.chunk_key
            )));
        }
        if !indexes.insert(chunk.index) {
            return Err(invalid(format!(
                "chunk index {} appears twice",
                chunk.index
            )));
        }
    }
    let outline_keys: HashSet<&str> = outline.iter().map(|o| o.outline_key.as_str()).collect();
    if outline_keys.len() != outline.len() {
        return Err(invalid("an outline key appears twice".into()));
    }
    for chunk in chunks {
        if let Some(section) = &chunk.section_key
            && !outline_keys.contains(section.as_str())
        {
            return Err(invalid(format!(
                "chunk `{}` names unknown section `{section}`",
                chunk.chunk_key
            )));
        }
    }
    for section in outline {
        if let Some(parent) = &section.parent_key
            && (!outline_keys.contains(parent.as_str()) || parent == &section.outline_key)
        {
            return Err(invalid(format!(
                "section `{}` names unknown parent `{parent}`",
                section.outline_key
            )));
        }
        if let Some(missing) = section
            .covers
            .iter()
            .find(|k| !chunk_keys.contains(k.as_str()))
        {
            return Err(invalid(format!(
                "section `{}` covers unknown chunk `{missing}`",
                section.outline_key
            )));
        }
    }
    Ok(folder)
}

/// "" for the root, else `a/b/`, whatever slashes the caller used.
fn normalize_folder(folder: &str) -> String {
    let trimmed = folder.trim_matches('/');
    if trimmed.is_empty() {
        String::new()
    } else {
        format!("{trimmed}/")
    }
}

/// `folderPath` of the root Folder node. Not "": FalkorDB's range index does not index empty
/// strings, so `MERGE (:Folder {folderPath: ''})` would never find the node it created.
pub const ROOT_FOLDER: &str = "/";

/// `a/b/` -> ["/", "a/", "a/b/"]: every Folder node from the root down.
fn folder_chain(folder: &str) -> Vec<String> {
    let mut chain = vec![ROOT_FOLDER.to_owned()];
    let mut current = String::new();
    for segment in folder.split('/').filter(|s| !s.is_empty()) {
        current.push_str(segment);
        current.push('/');
        chain.push(current.clone());
    }
    chain
}

fn file_params(file_id: &str) -> Params {
    let mut params = Params::new();
    params.insert("fileId".into(), json!(file_id));
    params
}

/// Whether the graph already holds exactly this version: its id, path and chunks. The chunk
/// keys are compared, not only their count: a chunk key digests the chunk's text and offsets,
/// so a version cut again under other `[indexer] chunk_*` settings (or another chunker) is
/// written again even when it keeps its number of chunks.
pub(crate) async fn is_current(
    graph: &GraphStore,
    file: &FileRecord,
    chunks: &[ChunkRecord],
) -> Result<bool, StoreError> {
    let params = file_params(&file.file_id);
    let rows = graph
        .query(
            &file.namespace,
            "MATCH (f:FileRef {fileId: $fileId}) RETURN f.versionId, f.chunkCount, f.vfsPath",
            &params,
        )
        .await?;
    let Some(row) = rows.rows.first() else {
        return Ok(false);
    };
    let version = row.first().and_then(Value::as_str);
    let count = row.get(1).and_then(Value::as_u64);
    let path = row.get(2).and_then(Value::as_str);
    if version != Some(file.version_id.as_str())
        || count != u64::try_from(chunks.len()).ok()
        || path != Some(file.path.as_str())
    {
        return Ok(false);
    }
    let stored = graph
        .query(
            &file.namespace,
            "MATCH (c:Chunk {fileId: $fileId}) RETURN c.chunkKey",
            &params,
        )
        .await?;
    let stored: HashSet<&str> = stored
        .rows
        .iter()
        .filter_map(|row| row.first().and_then(Value::as_str))
        .collect();
    Ok(stored.len() == chunks.len()
        && chunks
            .iter()
            .all(|chunk| stored.contains(chunk.chunk_key.as_str())))
}

async fn upsert_file_ref(
    graph: &GraphStore,
    file: &FileRecord,
    meta: &DocumentMeta,
) -> Result<(), StoreError> {
    let mut params = file_params(&file.file_id);
    // versionId/chunkCount are cleared until the write completes, and the version's blob
    // fields until `backfill::mark_written` sets them for the version written. The chunks are
    // replaced and their mentions with them, so the entity stamp goes too: the entities of
    // this version are extracted again, even when the version id is the one they were stamped
    // for (chunked with other settings, or rebuilt). A property the new version lacks (its
    // date, say) is removed: several removals at once need `assign_properties` on FalkorDB 4.16.
    let properties = [
        ("vfsPath", json!(file.path)),
        ("name", json!(file.name)),
        ("folderPath", json!(folder_of(&file.path))),
        ("enabled", json!(file.enabled)),
        ("hidden", json!(file.hidden)),
        ("title", json!(file.title)),
        ("documentDate", json!(file.document_date)),
        ("mime", json!(file.mime)),
        ("docType", json!(meta.doc_type)),
        ("tags", json!(meta.tags)),
        ("effectiveFrom", json!(meta.effective_from)),
        ("effectiveTo", json!(meta.effective_to)),
        ("collections", json!(meta.collections)),
        ("versionId", Value::Null),
        ("chunkCount", Value::Null),
        ("entityStamp", Value::Null),
        ("blobKey", Value::Null),
        ("contentSha256", Value::Null),
        ("size", Value::Null),
    ];
    let assign = assign_properties("f", &properties, &mut params);
    params.insert("path".into(), json!(file.path));
    params.insert("enabled".into(), json!(file.enabled));
    params.insert("hidden".into(), json!(file.hidden));
    // The stored version's nodes take the new path and flags in the same query (one
    // transaction): until they are replaced or pruned, access filters read them as the
    // FileRef now says, so a move or a hide never leaves old chunks readable under the old
    // path.
    graph
        .query(
            &file.namespace,
            &format!(
                "MERGE (f:FileRef {{fileId: $fileId}}) {assign} \
                 WITH f OPTIONAL MATCH (c:Chunk {{fileId: $fileId}}) \
                 SET c.path = $path, c.enabled = $enabled, c.hidden = $hidden \
                 WITH f, count(c) AS chunks OPTIONAL MATCH (o:OutlineNode {{fileId: $fileId}}) \
                 SET o.path = $path, o.enabled = $enabled, o.hidden = $hidden \
                 RETURN count(o)"
            ),
            &params,
        )
        .await?;
    Ok(())
}

async fn link_folders(
    graph: &GraphStore,
    file: &FileRecord,
    folder: &str,
) -> Result<(), StoreError> {
    let chain = folder_chain(folder);
    let edges: Vec<Value> = chain.windows(2).map(|w| json!([w[0], w[1]])).collect();
    let mut params = file_params(&file.file_id);
    params.insert("folders".into(), json!(chain));
    params.insert("edges".into(), json!(edges));
    let parent = chain.last().map_or(ROOT_FOLDER, String::as_str);
    params.insert("folder".into(), json!(parent));
    let ns = file.namespace.as_str();
    graph
        .query(
            ns,
            "UNWIND $folders AS fp MERGE (:Folder {folderPath: fp})",
            &params,
        )
        .await?;
    if !edges.is_empty() {
        graph
            .query(
                ns,
                "UNWIND $edges AS e \
                 MATCH (a:Folder {folderPath: e[0]}), (b:Folder {folderPath: e[1]}) \
                 MERGE (a)-[:HAS_CHILD]->(b)",
                &params,
            )
            .await?;
    }
    // A moved file leaves its old folder.
    graph
        .query(
            ns,
            "MATCH (f:FileRef {fileId: $fileId}) \
             OPTIONAL MATCH (old:Folder)-[r:HAS_CHILD]->(f) WHERE old.folderPath <> $folder DELETE r \
             WITH DISTINCT f \
             MATCH (d:Folder {folderPath: $folder}) MERGE (d)-[:HAS_CHILD]->(f)",
            &params,
        )
        .await?;
    Ok(())
}

async fn delete_in_batches(
    graph: &GraphStore,
    ns: &str,
    label: &str,
    file_id: &str,
) -> Result<(), GraphWriteError> {
    let query = format!(
        "MATCH (n:{label} {{fileId: $fileId}}) WITH n LIMIT {DELETE_BATCH} DETACH DELETE n RETURN count(n)"
    );
    let params = file_params(file_id);
    loop {
        let rows = graph.query(ns, &query, &params).await?;
        let deleted = first_int(&rows)?;
        if deleted < DELETE_BATCH as i64 {
            return Ok(());
        }
    }
}

/// A label of a file's nodes and the property that keys them.
struct NodeKind {
    label: &'static str,
    key: &'static str,
    /// The properties a version sets on the node besides the file's path and flags (which
    /// `upsert_file_ref` sets on every stored node), as named in its rows; a kept node whose
    /// stored values all equal the new version's is not written again. A chunk's text is
    /// compared by its hash.
    compared: &'static [&'static str],
}

const CHUNK_NODES: NodeKind = NodeKind {
    label: "Chunk",
    key: "chunkKey",
    compared: &[
        "chunkIndex",
        "textHash",
        "wordCount",
        "contextHeader",
        "splitWords",
        "charStart",
        "charEnd",
        "lineStart",
        "lineEnd",
        "pageStart",
        "pageEnd",
        "tokenCount",
        "sectionKey",
    ],
};
const OUTLINE_NODES: NodeKind = NodeKind {
    label: "OutlineNode",
    key: "outlineKey",
    compared: &[
        "title",
        "depth",
        "order",
        "parentKey",
        "lineStart",
        "lineEnd",
        "charStart",
        "charEnd",
        "pageStart",
        "pageEnd",
    ],
};

/// An edge type between two of a file's node kinds.
struct EdgeKind {
    from: NodeKind,
    rel: &'static str,
    to: NodeKind,
}

const NEXT_CHUNK: EdgeKind = EdgeKind {
    from: CHUNK_NODES,
    rel: "NEXT_CHUNK",
    to: CHUNK_NODES,
};
const HAS_SUBSECTION: EdgeKind = EdgeKind {
    from: OUTLINE_NODES,
    rel: "HAS_SUBSECTION",
    to: OUTLINE_NODES,
};
const COVERS: EdgeKind = EdgeKind {
    from: OUTLINE_NODES,
    rel: "COVERS",
    to: CHUNK_NODES,
};

/// The file's stored `kind` nodes: key -> the values of `kind.compared`, in that order.
async fn stored_nodes(
    graph: &GraphStore,
    file: &FileRecord,
    kind: &NodeKind,
) -> Result<HashMap<String, Vec<Value>>, StoreError> {
    let values: Vec<String> = kind.compared.iter().map(|p| format!("n.{p}")).collect();
    let rows = graph
        .query(
            &file.namespace,
            &format!(
                "MATCH (n:{} {{fileId: $fileId}}) RETURN n.{}, [{}]",
                kind.label,
                kind.key,
                values.join(", ")
            ),
            &file_params(&file.file_id),
        )
        .await?;
    Ok(rows
        .rows
        .into_iter()
        .filter_map(|row| {
            let mut row = row.into_iter();
            match (row.next(), row.next()) {
                (Some(Value::String(key)), Some(Value::Array(values))) => Some((key, values)),
                _ => None,
            }
        })
        .collect())
}

/// Whether the stored node's `kind.compared` values differ from `row`'s (one of the rows
/// [`chunk_row`] or [`section_row`] builds).
fn differs(kind: &NodeKind, stored: &[Value], row: &Value) -> bool {
    kind.compared.len() != stored.len()
        || kind
            .compared
            .iter()
            .zip(stored)
            .any(|(name, value)| row.get(*name).unwrap_or(&Value::Null) != value)
}

/// The words of a chunk's header and text that the full-text index would read glued (each
/// field is indexed on its own, so they are split apart, never joined).
fn split_words_of(c: &ChunkRecord) -> String {
    let header = kg_stores::graph::split_words(&c.context_header);
    let text = kg_stores::graph::split_words(&c.text);
    match (header.is_empty(), text.is_empty()) {
        (true, _) => text,
        (false, true) => header,
        (false, false) => format!("{header} {text}"),
    }
}

fn chunk_row(c: &ChunkRecord) -> Value {
    json!({
        "chunkKey": c.chunk_key,
        "chunkIndex": c.index,
        "text": c.text,
        "textHash": text_hash(&c.text),
        "wordCount": word_count(&c.context_header, &c.text),
        "contextHeader": c.context_header,
        "splitWords": split_words_of(c),
        "charStart": c.char_start,
        "charEnd": c.char_end,
        "lineStart": c.line_start,
        "lineEnd": c.line_end,
        "pageStart": c.page_start,
        "pageEnd": c.page_end,
        "tokenCount": c.token_count,
        "sectionKey": c.section_key,
    })
}

fn section_row(o: &OutlineRecord) -> Value {
    json!({
        "outlineKey": o.outline_key,
        "title": o.title,
        "depth": o.depth,
        "order": o.order,
        "parentKey": o.parent_key,
        "lineStart": o.line_start,
        "lineEnd": o.line_end,
        "charStart": o.char_start,
        "charEnd": o.char_end,
        "pageStart": o.page_start,
        "pageEnd": o.page_end,
    })
}

/// `$fileId`, `$path`, `$enabled`, `$hidden` and the batch's rows as `$rows`.
fn node_batch_params(file: &FileRecord, rows: &[Value]) -> Params {
    let mut params = file_params(&file.file_id);
    params.insert("path".into(), json!(file.path));
    params.insert("enabled".into(), json!(file.enabled));
    params.insert("hidden".into(), json!(file.hidden));
    params.insert("rows".into(), Value::Array(rows.to_vec()));
    params
}

/// What writing a version does with its nodes of one kind, against the stored ones.
struct NodePlan<'a> {
    /// Rows of the nodes the graph lacks.
    create: Vec<Value>,
    /// Rows of the stored nodes whose compared properties change.
    update: Vec<Value>,
    /// Keys of the stored nodes the version keeps, changed or not.
    kept: HashSet<&'a str>,
}

fn plan_nodes<'a>(
    kind: &NodeKind,
    rows: impl Iterator<Item = (&'a str, Value)>,
    stored: &HashMap<String, Vec<Value>>,
) -> NodePlan<'a> {
    let mut plan = NodePlan {
        create: Vec::new(),
        update: Vec::new(),
        kept: HashSet::new(),
    };
    for (key, row) in rows {
        match stored.get(key) {
            None => plan.create.push(row),
            Some(values) => {
                plan.kept.insert(key);
                if differs(kind, values, &row) {
                    plan.update.push(row);
                }
            }
        }
    }
    plan
}

async fn create_chunks(
    graph: &GraphStore,
    file: &FileRecord,
    rows: &[Value],
) -> Result<(), StoreError> {
    for batch in rows.chunks(CHUNK_BATCH) {
        graph
            .query(
                &file.namespace,
                "MATCH (f:FileRef {fileId: $fileId}) \
                 UNWIND $rows AS ch \
                 CREATE (:Chunk {chunkKey: ch.chunkKey, fileId: $fileId, path: $path, enabled: $enabled, hidden: $hidden, \
                     chunkIndex: ch.chunkIndex, text: ch.text, textHash: ch.textHash, wordCount: ch.wordCount, \
                     contextHeader: ch.contextHeader, splitWords: ch.splitWords, \
                     charStart: ch.charStart, charEnd: ch.charEnd, lineStart: ch.lineStart, lineEnd: ch.lineEnd, \
                     pageStart: ch.pageStart, pageEnd: ch.pageEnd, tokenCount: ch.tokenCount, \
                     sectionKey: ch.sectionKey})-[:PART_OF]->(f)",
                &node_batch_params(file, batch),
            )
            .await?;
    }
    Ok(())
}

/// Gives stored chunks the new version's properties (their path and flags are already the
/// file's: `upsert_file_ref`). A null (no page, no section) removes the property, one removal
/// per SET clause: see `assign_properties` for why on FalkorDB 4.16.
async fn update_chunks(
    graph: &GraphStore,
    file: &FileRecord,
    rows: &[Value],
) -> Result<(), GraphWriteError> {
    for batch in rows.chunks(CHUNK_BATCH) {
        let updated = graph
            .query(
                &file.namespace,
                "UNWIND $rows AS ch \
                 MATCH (c:Chunk {chunkKey: ch.chunkKey}) WHERE c.fileId = $fileId \
                 SET c.chunkIndex = ch.chunkIndex, c.text = ch.text, c.textHash = ch.textHash, \
                     c.wordCount = ch.wordCount, c.contextHeader = ch.contextHeader, \
                     c.splitWords = ch.splitWords, \
                     c.charStart = ch.charStart, c.charEnd = ch.charEnd, c.lineStart = ch.lineStart, \
                     c.lineEnd = ch.lineEnd, c.tokenCount = ch.tokenCount, c.pageStart = ch.pageStart \
                 WITH c, ch SET c.pageEnd = ch.pageEnd \
                 WITH c, ch SET c.sectionKey = ch.sectionKey \
                 RETURN count(c)",
                &node_batch_params(file, batch),
            )
            .await?;
        expect_updated(&updated, batch.len())?;
    }
    Ok(())
}

async fn create_sections(
    graph: &GraphStore,
    file: &FileRecord,
    rows: &[Value],
) -> Result<(), StoreError> {
    for batch in rows.chunks(EDGE_BATCH) {
        graph
            .query(
                &file.namespace,
                "UNWIND $rows AS s \
                 CREATE (:OutlineNode {outlineKey: s.outlineKey, fileId: $fileId, path: $path, enabled: $enabled, hidden: $hidden, \
                     title: s.title, depth: s.depth, order: s.order, parentKey: s.parentKey, \
                     lineStart: s.lineStart, lineEnd: s.lineEnd, charStart: s.charStart, charEnd: s.charEnd, \
                     pageStart: s.pageStart, pageEnd: s.pageEnd})",
                &node_batch_params(file, batch),
            )
            .await?;
    }
    Ok(())
}

/// [`update_chunks`] for outline sections.
async fn update_sections(
    graph: &GraphStore,
    file: &FileRecord,
    rows: &[Value],
) -> Result<(), GraphWriteError> {
    for batch in rows.chunks(EDGE_BATCH) {
        let updated = graph
            .query(
                &file.namespace,
                "UNWIND $rows AS s \
                 MATCH (o:OutlineNode {outlineKey: s.outlineKey}) WHERE o.fileId = $fileId \
                 SET o.title = s.title, o.depth = s.depth, o.order = s.order, \
                     o.lineStart = s.lineStart, o.lineEnd = s.lineEnd, o.charStart = s.charStart, \
                     o.charEnd = s.charEnd, o.parentKey = s.parentKey \
                 WITH o, s SET o.pageStart = s.pageStart \
                 WITH o, s SET o.pageEnd = s.pageEnd \
                 RETURN count(o)",
                &node_batch_params(file, batch),
            )
            .await?;
        expect_updated(&updated, batch.len())?;
    }
    Ok(())
}

/// A stored node that vanishes between the read of the file's keys and its update was
/// deleted by a concurrent writer: the write is retried, never finished without it.
fn expect_updated(rows: &Rows, expected: usize) -> Result<(), GraphWriteError> {
    if first_int(rows)? == i64::try_from(expected).unwrap_or(i64::MAX) {
        Ok(())
    } else {
        Err(GraphWriteError::UnexpectedReply(
            "a stored node of the file vanished while it was rewritten",
        ))
    }
}

/// Keys of the stored nodes the version being written keeps.
struct KeptNodes<'a> {
    chunks: HashSet<&'a str>,
    sections: HashSet<&'a str>,
}

/// The version's NEXT_CHUNK (in chunk order), HAS_SUBSECTION and COVERS edges, reconciled
/// with the ones its kept nodes already have.
async fn link_version(
    graph: &GraphStore,
    file: &FileRecord,
    ordered: &[&ChunkRecord],
    outline: &[OutlineRecord],
    kept: &KeptNodes<'_>,
) -> Result<(), StoreError> {
    let next_chunks: Vec<(&str, &str)> = ordered
        .windows(2)
        .map(|w| (w[0].chunk_key.as_str(), w[1].chunk_key.as_str()))
        .collect();
    let subsections: Vec<(&str, &str)> = outline
        .iter()
        .filter_map(|o| {
            o.parent_key
                .as_deref()
                .map(|parent| (parent, o.outline_key.as_str()))
        })
        .collect();
    let covers: Vec<(&str, &str)> = outline
        .iter()
        .flat_map(|o| {
            o.covers
                .iter()
                .map(move |c| (o.outline_key.as_str(), c.as_str()))
        })
        .collect();
    let (chunks, sections) = (&kept.chunks, &kept.sections);
    reconcile_edges(graph, file, &NEXT_CHUNK, &next_chunks, chunks, chunks).await?;
    reconcile_edges(
        graph,
        file,
        &HAS_SUBSECTION,
        &subsections,
        sections,
        sections,
    )
    .await?;
    reconcile_edges(graph, file, &COVERS, &covers, sections, chunks).await
}

/// Makes the file's `kind` edges exactly `wanted` (pairs of keys): creates the missing ones,
/// then deletes the stored ones not wanted. Only an edge between two kept nodes (`kept_from`,
/// `kept_to`: the stored nodes the new version keeps) can be stored already and stay; an
/// edge of a pruned node goes with it, so a file with no kept nodes reads no edges.
async fn reconcile_edges(
    graph: &GraphStore,
    file: &FileRecord,
    kind: &EdgeKind,
    wanted: &[(&str, &str)],
    kept_from: &HashSet<&str>,
    kept_to: &HashSet<&str>,
) -> Result<(), StoreError> {
    let (from, rel, to) = (&kind.from, kind.rel, &kind.to);
    let mut stored: HashSet<(String, String)> = HashSet::new();
    if !kept_from.is_empty() && !kept_to.is_empty() {
        let rows = graph
            .query(
                &file.namespace,
                &format!(
                    "MATCH (a:{} {{fileId: $fileId}})-[:{rel}]->(b:{}) WHERE b.fileId = $fileId \
                     RETURN a.{}, b.{}",
                    from.label, to.label, from.key, to.key
                ),
                &file_params(&file.file_id),
            )
            .await?;
        stored = rows
            .rows
            .iter()
            .filter_map(|row| match (row.first(), row.get(1)) {
                (Some(Value::String(a)), Some(Value::String(b)))
                    if kept_from.contains(a.as_str()) && kept_to.contains(b.as_str()) =>
                {
                    Some((a.clone(), b.clone()))
                }
                _ => None,
            })
            .collect();
    }
    let wanted_set: HashSet<(&str, &str)> = wanted.iter().copied().collect();
    let create: Vec<Value> = wanted
        .iter()
        .filter(|(a, b)| !stored.contains(&((*a).to_owned(), (*b).to_owned())))
        .map(|(a, b)| json!([a, b]))
        .collect();
    let mut stale: Vec<&(String, String)> = stored
        .iter()
        .filter(|(a, b)| !wanted_set.contains(&(a.as_str(), b.as_str())))
        .collect();
    stale.sort();
    let stale: Vec<Value> = stale.into_iter().map(|(a, b)| json!([a, b])).collect();
    let ends = format!(
        "(a:{} {{{}: pr[0], fileId: $fileId}}), (b:{} {{{}: pr[1], fileId: $fileId}})",
        from.label, from.key, to.label, to.key
    );
    link_pairs(
        graph,
        file,
        &create,
        &format!("UNWIND $pairs AS pr MATCH {ends} CREATE (a)-[:{rel}]->(b)"),
    )
    .await?;
    link_pairs(
        graph,
        file,
        &stale,
        &format!("UNWIND $pairs AS pr MATCH {ends} MATCH (a)-[r:{rel}]->(b) DELETE r"),
    )
    .await
}

/// Deletes the file's stored `kind` nodes whose keys the new version does not have.
async fn prune_nodes(
    graph: &GraphStore,
    file: &FileRecord,
    kind: &NodeKind,
    stored: &HashMap<String, Vec<Value>>,
    wanted: &HashSet<&str>,
) -> Result<(), StoreError> {
    let mut stale: Vec<&str> = stored
        .keys()
        .map(String::as_str)
        .filter(|key| !wanted.contains(key))
        .collect();
    stale.sort_unstable();
    let query = format!(
        "UNWIND $keys AS k MATCH (n:{} {{{}: k}}) WHERE n.fileId = $fileId DETACH DELETE n",
        kind.label, kind.key
    );
    for batch in stale.chunks(DELETE_BATCH) {
        let mut params = file_params(&file.file_id);
        params.insert("keys".into(), json!(batch));
        graph.query(&file.namespace, &query, &params).await?;
    }
    Ok(())
}

/// Runs `query` over `pairs` (as `$pairs`) in batches.
async fn link_pairs(
    graph: &GraphStore,
    file: &FileRecord,
    pairs: &[Value],
    query: &str,
) -> Result<(), StoreError> {
    for batch in pairs.chunks(EDGE_BATCH) {
        let mut params = file_params(&file.file_id);
        params.insert("pairs".into(), Value::Array(batch.to_vec()));
        graph.query(&file.namespace, query, &params).await?;
    }
    Ok(())
}

fn first_int(rows: &Rows) -> Result<i64, GraphWriteError> {
    rows.rows
        .first()
        .and_then(|row| row.first())
        .and_then(Value::as_i64)
        .ok_or(GraphWriteError::UnexpectedReply("expected one integer row"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn file() -> FileRecord {
        FileRecord {
            namespace: "demo".into(),
            file_id: "f1".into(),
            version_id: "v1".into(),
            path: "guides/ops/run.md".into(),
            name: "run.md".into(),
            folder_path: "guides/ops/".into(),
            enabled: true,
            hidden: false,
            title: None,
            document_date: None,
            mime: "text/markdown".into(),
        }
    }

    fn chunk(key: &str, index: u32, section: Option<&str>) -> ChunkRecord {
        ChunkRecord {
            chunk_key: key.into(),
            index,
            text: format!("text of {key}"),
            context_header: "Run".into(),
            char_start: 0,
            char_end: 1,
            line_start: 1,
            line_end: 1,
            page_start: None,
            page_end: None,
            token_count: 3,
            section_key: section.map(str::to_owned),
        }
    }

    fn section(key: &str, parent: Option<&str>, covers: &[&str]) -> OutlineRecord {
        OutlineRecord {
            outline_key: key.into(),
            title: key.to_uppercase(),
            depth: if parent.is_some() { 2 } else { 1 },
            order: 0,
            parent_key: parent.map(str::to_owned),
            line_start: 1,
            line_end: 2,
            char_start: 0,
            char_end: 1,
            page_start: None,
            page_end: None,
            covers: covers.iter().map(|c| (*c).to_owned()).collect(),
        }
    }

    #[test]
    fn folder_chains_run_from_the_root() {
        assert_eq!(folder_chain(""), ["/"]);
        assert_eq!(folder_chain("a/b/"), ["/", "a/", "a/b/"]);
        assert_eq!(normalize_folder("/a/b"), "a/b/");
        assert_eq!(normalize_folder("/"), "");
    }

    #[test]
    fn consistent_records_pass() {
        let chunks = [chunk("c1", 0, Some("s1")), chunk("c2", 1, Some("s2"))];
        let outline = [
            section("s1", None, &["c1", "c2"]),
            section("s2", Some("s1"), &["c2"]),
        ];
        assert_eq!(validate(&file(), &chunks, &outline).unwrap(), "guides/ops/");
        let root = FileRecord {
            path: "top.md".into(),
            folder_path: String::new(),
            ..file()
        };
        assert_eq!(validate(&root, &[], &[]).unwrap(), "");
    }

    #[test]
    fn contradictions_are_refused_as_invalid_argument() {
        let cases: Vec<(FileRecord, Vec<ChunkRecord>, Vec<OutlineRecord>, &str)> = vec![
            (
                FileRecord {
                    folder_path: "elsewhere/".into(),
                    ..file()
                },
                vec![],
                vec![],
                "is not the folder of",
            ),
            (
                file(),
                vec![chunk("c1", 0, None), chunk("c1", 1, None)],
                vec![],
                "appears twice",
            ),
            (
                file(),
                vec![chunk("c1", 0, None), chunk("c2", 0, None)],
                vec![],
                "index 0 appears twice",
            ),
            (
                file(),
                vec![chunk("c1", 0, Some("nope"))],
                vec![],
                "unknown section",
            ),
            (
                file(),
                vec![],
                vec![section("s1", Some("s9"), &[])],
                "unknown parent",
            ),
            (
                file(),
                vec![],
                vec![section("s1", Some("s1"), &[])],
                "unknown parent",
            ),
            (
                file(),
                vec![],
                vec![section("s1", None, &["c9"])],
                "covers unknown chunk",
            ),
            (
                FileRecord {
                    version_id: String::new(),
                    ..file()
                },
                vec![],
                vec![],
                "must be set",
            ),
        ];
        for (file, chunks, outline, expected) in cases {
            let err = validate(&file, &chunks, &outline).unwrap_err();
            assert_eq!(err.code(), ErrorCode::InvalidArgument);
            assert!(
                err.to_string().contains(expected),
                "{err} should mention {expected}"
            );
        }
    }
}

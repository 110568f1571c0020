//! Fixtures shared by the graph-lane tests: a real FalkorDB, files written by the indexer's
//! graph writer, and entities, mentions and relations in the indexer's graph shape
//! (Entity / MENTIONS / REL / INSTANCE_OF, the full-text index on Entity name and aliasText).

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use kg_indexer::document::DocumentMeta;
use kg_indexer::graph_writer::{ChunkRecord, FileRecord, write_document};
use kg_proto::v1::{AccessFilter, CallerContext, Permission, SearchRequest, SearchResponse};
use kg_retrieval::RetrievalService;
use kg_stores::embedded::{EmbeddedFalkor, find_venv};
use kg_stores::graph::{GraphStore, Params};
use serde_json::{Value, json};

pub struct Env {
    pub store: GraphStore,
    pub service: RetrievalService,
    _falkor: EmbeddedFalkor,
    _dir: tempfile::TempDir,
}

pub async fn start() -> Env {
    let venv = find_venv().expect("the dev-deps virtualenv (run deploy/scripts/dev-deps.sh)");
    let dir = tempfile::tempdir().unwrap();
    let falkor = EmbeddedFalkor::start(&venv, dir.path()).await.unwrap();
    let store = GraphStore::connect(&falkor.url).await.unwrap();
    Env {
        service: RetrievalService::new(store.clone()),
        store,
        _falkor: falkor,
        _dir: dir,
    }
}

/// A reader of the whole namespace, narrowed by `edit`.
pub fn caller(ns: &str, edit: impl FnOnce(&mut AccessFilter)) -> CallerContext {
    let mut access = AccessFilter {
        namespace: ns.into(),
        allow_prefixes: vec![String::new()],
        enabled_only: true,
        permission: Permission::Read as i32,
        ..Default::default()
    };
    edit(&mut access);
    let now = kg_common::caller::now_ms();
    CallerContext {
        principal_id: "tester".into(),
        access: vec![access],
        issued_at_ms: now,
        expires_at_ms: now + kg_common::caller::CONTEXT_TTL_MS,
        ..Default::default()
    }
}

/// A reader denied everything under `secret/`.
pub fn restricted(ns: &str) -> CallerContext {
    caller(ns, |a| a.deny_prefixes = vec!["secret/".into()])
}

/// Writes a file whose chunks have `texts` (keys `<file_id>#<i>`) with `meta` on its FileRef.
pub async fn write(
    store: &GraphStore,
    ns: &str,
    file_id: &str,
    path: &str,
    texts: &[&str],
    meta: DocumentMeta,
) {
    let file = FileRecord {
        namespace: ns.into(),
        file_id: file_id.into(),
        version_id: "v1".into(),
        path: path.into(),
        name: path.rsplit('/').next().unwrap().into(),
        folder_path: kg_common::access::folder_of(path).to_owned(),
        enabled: true,
        hidden: false,
        title: None,
        document_date: meta.document_date.clone(),
        mime: "text/markdown".into(),
    };
    let chunks: Vec<ChunkRecord> = texts
        .iter()
        .enumerate()
        .map(|(i, text)| ChunkRecord {
            chunk_key: format!("{file_id}#{i}"),
            index: i as u32,
            text: (*text).to_owned(),
            context_header: path.into(),
            char_start: 0,
            char_end: text.chars().count() as u64,
            line_start: 1,
            line_end: 1,
            page_start: None,
            page_end: None,
            token_count: 10,
            section_key: None,
        })
        .collect();
    write_document(store, &file, &meta, &chunks, &[])
        .await
        .unwrap();
}

pub async fn run(store: &GraphStore, ns: &str, cypher: &str, params: Params) {
    store.query(ns, cypher, &params).await.unwrap();
}

/// The entity full-text index, as the indexer's TBox sync creates it.
pub async fn entity_index(store: &GraphStore, ns: &str) {
    run(
        store,
        ns,
        "CALL db.idx.fulltext.createNodeIndex('Entity', 'name', 'aliasText')",
        Params::new(),
    )
    .await;
}

/// An entity `ent:<type>:<name lowercased>` with its type node; returns the key.
pub async fn entity(
    store: &GraphStore,
    ns: &str,
    type_id: &str,
    name: &str,
    aliases: &[&str],
) -> String {
    let norm = name.to_lowercase();
    let key = format!("ent:{type_id}:{norm}");
    let mut params = Params::new();
    params.insert("key".into(), json!(key));
    params.insert("name".into(), json!(name));
    params.insert("norm".into(), json!(norm));
    params.insert("typeId".into(), json!(type_id));
    params.insert("label".into(), json!(format!("{type_id} label")));
    params.insert("aliases".into(), json!(aliases));
    params.insert("aliasText".into(), json!(aliases.join(" | ")));
    run(
        store,
        ns,
        "MERGE (t:EntityType {typeId: $typeId}) SET t.label = $label, t.side = 'instance' \
         MERGE (e:Entity {entityKey: $key}) SET e.name = $name, e.normName = $norm, \
             e.typeId = $typeId, e.aliases = $aliases, e.aliasText = $aliasText, e.declared = true \
         MERGE (e)-[:INSTANCE_OF]->(t)",
        params,
    )
    .await;
    key
}

/// `chunk_key` mentions `entity_key` (file id from the chunk key's prefix).
pub async fn mention(store: &GraphStore, ns: &str, chunk_key: &str, entity_key: &str) {
    let mut params = Params::new();
    params.insert("c".into(), json!(chunk_key));
    params.insert("e".into(), json!(entity_key));
    run(
        store,
        ns,
        "MATCH (c:Chunk {chunkKey: $c}), (e:Entity {entityKey: $e}) \
         CREATE (c)-[:MENTIONS {method: 'gazetteer', quote: e.name, charStart: 0, charEnd: 1, \
             fileId: c.fileId}]->(e)",
        params,
    )
    .await;
}

/// A REL stated by chunk `chunk_key`'s file.
pub async fn rel(
    store: &GraphStore,
    ns: &str,
    from: &str,
    type_id: &str,
    to: &str,
    chunk_key: &str,
) {
    let mut params = Params::new();
    params.insert("a".into(), json!(from));
    params.insert("b".into(), json!(to));
    params.insert("t".into(), json!(type_id));
    params.insert("c".into(), json!(chunk_key));
    run(
        store,
        ns,
        "MATCH (a:Entity {entityKey: $a}), (b:Entity {entityKey: $b}), (c:Chunk {chunkKey: $c}) \
         CREATE (a)-[:REL {relationTypeId: $t, fileId: c.fileId, chunkKey: $c, path: c.path, \
             enabled: true, hidden: false, versionId: 'v1'}]->(b)",
        params,
    )
    .await;
}

pub fn search(ns: &str, query: &str, lanes: &[&str]) -> SearchRequest {
    SearchRequest {
        namespace: ns.into(),
        query: query.into(),
        lanes: lanes.iter().map(|l| (*l).to_owned()).collect(),
        top_k: 32,
        ..Default::default()
    }
}

pub fn keys(response: &SearchResponse) -> Vec<&str> {
    response.hits.iter().map(|h| h.chunk_key.as_str()).collect()
}

pub fn lane<'a>(response: &'a SearchResponse, name: &str) -> &'a kg_proto::v1::LaneTrace {
    response.lanes.iter().find(|l| l.lane == name).unwrap()
}

pub fn no_secret(response: &SearchResponse) {
    assert!(
        response
            .hits
            .iter()
            .all(|h| !h.file_id.starts_with("secret")),
        "denied file leaked: {:?}",
        keys(response)
    );
}

pub fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

//! Writes what entity extraction found in one file version into its namespace graph.
//!
//! Runs after the graph writer stored the file's chunks. Idempotent per (file version, TBox,
//! path): the FileRef's `entityStamp` records what was written last, and a write with the same
//! stamp does nothing. Otherwise the file's old MENTIONS, the REL edges it stated and its
//! candidate sightings are removed, then the new ones are created in UNWIND batches. The
//! FileRef's `entityKeys` lists the entities the file touched, so their orphans (no mention
//! left, not declared by the TBox) are removed even after the chunks were replaced. The stamp is
//! set last: a crash part-way leaves it unset and the redelivered event redoes the write.

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use kg_common::access::validate_namespace;
use kg_stores::StoreError;
use kg_stores::graph::{GraphStore, Params};
use serde_json::{Value, json};

use kg_proto::v1::Tbox;
use kg_stores::tbox::TboxBucket;

use crate::entities::llm::{LlmExtractor, LlmOutcome};
use crate::entities::{Extraction, Extractor, extractor_for};
use crate::graph_writer::{ChunkRecord, FileRecord, GraphWriteError};

/// Rows per UNWIND query.
const BATCH: usize = 1000;
/// Server-side limit of the check for a namespace's EntityType nodes (one label scan).
const TYPES_CHECK_TIMEOUT_MS: u64 = 5_000;

/// Range indexes for entity lookups besides `Entity.entityKey` (in `kg_stores::graph`).
const INDEXES: &[&str] = &[
    "CREATE INDEX FOR (n:EntityType) ON (n.typeId)",
    "CREATE INDEX FOR (n:CandidateEntity) ON (n.candidateKey)",
    "CREATE INDEX FOR (n:Entity) ON (n.typeId)",
    // kg_entity_search: names and declared aliases (`aliasText`, the aliases joined by " | ").
    "CALL db.idx.fulltext.createNodeIndex('Entity', 'name', 'aliasText')",
];

/// What [`write_entities`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntityWriteOutcome {
    /// The graph already held this file version's entities for this TBox.
    Unchanged,
    /// Mentions, relations and candidates were (re)written.
    Written {
        mentions: usize,
        relations: usize,
        candidates: usize,
    },
}

/// Key of the last entity write of a file: what changes it makes the write run again
/// (turning the LLM extractor on, or changing its model, included).
fn stamp(file: &FileRecord, extractor: &Extractor, llm: Option<&LlmExtractor>) -> String {
    let mut stamp = format!("{}|{}|{}", file.version_id, extractor.stamp(), file.path);
    if let Some(llm) = llm {
        stamp.push('|');
        stamp.push_str(&llm.stamp());
    }
    stamp
}

/// Whether an `entityStamp` (see [`stamp`]) was written for `version_id` under the TBox whose
/// [`crate::entities::tbox_stamp`] is `tbox`, whatever the path or LLM part after them.
pub(crate) fn stamp_is_for(entity_stamp: &str, version_id: &str, tbox: &str) -> bool {
    entity_stamp
        .strip_prefix(version_id)
        .and_then(|rest| rest.strip_prefix('|'))
        .and_then(|rest| rest.strip_prefix(tbox))
        .is_some_and(|tail| tail.starts_with('|'))
}

/// What [`index_entities_with`] did, and what the LLM pass cost when it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityIndexReport {
    pub outcome: EntityWriteOutcome,
    /// `None` when the LLM extractor is off or the write was unchanged (no call made).
    pub llm: Option<LlmOutcome>,
}

fn file_params(file_id: &str) -> Params {
    let mut params = Params::new();
    params.insert("fileId".into(), json!(file_id));
    params
}

/// (server, namespace, TBox stamp) already synchronised by this process.
fn synced() -> &'static Mutex<HashSet<String>> {
    static SYNCED: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    SYNCED.get_or_init(|| Mutex::new(HashSet::new()))
}

/// Forgets which TBoxes were synchronised into `namespace`'s graph on `graph`'s server: the
/// next entity write synchronises again (a rebuild, after which the graph may have been lost).
pub(crate) fn forget_namespace(graph: &GraphStore, namespace: &str) {
    let prefix = format!("{}\u{0}{namespace}\u{0}", graph.server_identity());
    if let Ok(mut synced) = synced().lock() {
        synced.retain(|key| !key.starts_with(&prefix));
    }
}

/// Creates the entity indexes and writes the TBox's EntityType nodes and declared entities,
/// once per process, namespace and TBox version. A type or declared instance that left the
/// TBox is removed (an undeclared entity stays while some chunk mentions it).
pub async fn sync_tbox(
    graph: &GraphStore,
    namespace: &str,
    extractor: &Extractor,
) -> Result<(), GraphWriteError> {
    validate_namespace(namespace)?;
    let key = format!(
        "{}\u{0}{namespace}\u{0}{}",
        graph.server_identity(),
        extractor.stamp()
    );
    if synced().lock().map(|s| s.contains(&key)).unwrap_or(false) {
        return Ok(());
    }
    let none = Params::new();
    for index in INDEXES {
        match graph.query(namespace, index, &none).await {
            Ok(_) => {}
            Err(StoreError::GraphQuery { detail }) if detail.contains("already indexed") => {}
            Err(err) => return Err(err.into()),
        }
    }
    let types: Vec<Value> = extractor
        .types()
        .iter()
        .map(|t| json!({"typeId": t.type_id, "label": t.label, "side": t.side}))
        .collect();
    let type_ids: Vec<&str> = extractor
        .types()
        .iter()
        .map(|t| t.type_id.as_str())
        .collect();
    let mut params = Params::new();
    params.insert("types".into(), Value::Array(types));
    params.insert("typeIds".into(), json!(type_ids));
    graph
        .query(
            namespace,
            "UNWIND $types AS t MERGE (et:EntityType {typeId: t.typeId}) \
             SET et.label = t.label, et.side = t.side",
            &params,
        )
        .await?;
    graph
        .query(
            namespace,
            "MATCH (et:EntityType) WHERE NOT et.typeId IN $typeIds DETACH DELETE et",
            &params,
        )
        .await?;
    let declared: Vec<Value> = extractor
        .declared()
        .iter()
        .map(|e| entity_row(&e.entity_key, &e.name, &e.type_id, &e.aliases))
        .collect();
    for batch in declared.chunks(BATCH) {
        let mut params = Params::new();
        params.insert("entities".into(), Value::Array(batch.to_vec()));
        graph
            .query(
                namespace,
                "UNWIND $entities AS e MERGE (n:Entity {entityKey: e.entityKey}) \
                 SET n.name = e.name, n.normName = e.normName, n.typeId = e.typeId, \
                     n.aliases = e.aliases, n.aliasText = e.aliasText, n.declared = true \
                 WITH n, e MATCH (et:EntityType {typeId: e.typeId}) MERGE (n)-[:INSTANCE_OF]->(et)",
                &params,
            )
            .await?;
    }
    let keys: Vec<&str> = extractor
        .declared()
        .iter()
        .map(|e| e.entity_key.as_str())
        .collect();
    let mut params = Params::new();
    params.insert("keys".into(), json!(keys));
    let rows = graph
        .query(
            namespace,
            "MATCH (n:Entity) WHERE n.declared = true AND NOT n.entityKey IN $keys \
             SET n.declared = false RETURN n.entityKey",
            &params,
        )
        .await?;
    let undeclared: Vec<String> = rows
        .rows
        .iter()
        .filter_map(|r| r.first().and_then(Value::as_str).map(str::to_owned))
        .collect();
    delete_orphans(graph, namespace, &undeclared).await?;
    if let Ok(mut set) = synced().lock() {
        set.insert(key);
    }
    Ok(())
}

fn entity_row(key: &str, name: &str, type_id: &str, aliases: &[String]) -> Value {
    json!({
        "entityKey": key,
        "name": name,
        "normName": crate::entities::normalize_name(name),
        "typeId": type_id,
        "aliases": aliases,
        "aliasText": aliases.join(" | "),
    })
}

/// Writes `found` (extracted from `file`'s chunks with `extractor`) after the graph writer
/// stored the chunks. Calls [`sync_tbox`] first.
pub async fn write_entities(
    graph: &GraphStore,
    file: &FileRecord,
    extractor: &Extractor,
    found: &Extraction,
) -> Result<EntityWriteOutcome, GraphWriteError> {
    write_stamped(graph, file, extractor, &stamp(file, extractor, None), found).await
}

/// The file's entity stamp and entity-key list as the graph holds them.
async fn read_entity_state(
    graph: &GraphStore,
    file: &FileRecord,
) -> Result<Vec<Value>, GraphWriteError> {
    let rows = graph
        .query(
            &file.namespace,
            "MATCH (f:FileRef {fileId: $fileId}) RETURN f.entityStamp, f.entityKeys",
            &file_params(&file.file_id),
        )
        .await?;
    rows.rows
        .into_iter()
        .next()
        .ok_or_else(|| GraphWriteError::InvalidRecord {
            file_id: file.file_id.clone(),
            reason: "entities written before the file's chunks".into(),
        })
}

async fn write_stamped(
    graph: &GraphStore,
    file: &FileRecord,
    extractor: &Extractor,
    stamp: &str,
    found: &Extraction,
) -> Result<EntityWriteOutcome, GraphWriteError> {
    let ns = file.namespace.as_str();
    sync_tbox(graph, ns, extractor).await?;
    let row = read_entity_state(graph, file).await?;
    if row.first().and_then(Value::as_str) == Some(stamp) {
        return Ok(EntityWriteOutcome::Unchanged);
    }
    // No list at all: this file never had an entity write, so there is nothing to clear.
    let first_write = row.get(1).is_none_or(Value::is_null);
    let old_keys = string_list(row.get(1));
    let new_keys: BTreeSet<String> = found.entities.keys().cloned().collect();
    // Remember both sets until the write completes, so a crash leaks no orphan.
    let touched: BTreeSet<String> = old_keys
        .iter()
        .cloned()
        .chain(new_keys.iter().cloned())
        .collect();
    set_file_props(graph, ns, &file.file_id, None, &touched).await?;

    if !first_write {
        clear_file(graph, ns, &file.file_id, &old_keys).await?;
    }
    create_mentions(graph, file, found).await?;
    create_relations(graph, file, found).await?;
    write_candidates(graph, ns, &file.file_id, found).await?;
    let gone: Vec<String> = old_keys.difference(&new_keys).cloned().collect();
    delete_orphans(graph, ns, &gone).await?;

    set_file_props(graph, ns, &file.file_id, Some(stamp), &new_keys).await?;
    tracing::debug!(
        namespace = ns,
        file_id = %file.file_id,
        mentions = found.mentions.len(),
        relations = found.relations.len(),
        candidates = found.candidates.len(),
        "entities written"
    );
    Ok(EntityWriteOutcome::Written {
        mentions: found.mentions.len(),
        relations: found.relations.len(),
        candidates: found.candidates.len(),
    })
}

/// The indexer's one call per upsert: reads the namespace's published TBox (cached; none
/// means only the candidate heuristics run), extracts on the blocking pool, writes.
pub async fn index_entities(
    graph: &GraphStore,
    tboxes: &TboxBucket,
    file: &FileRecord,
    chunks: &[ChunkRecord],
) -> Result<EntityWriteOutcome, GraphWriteError> {
    Ok(index_entities_with(graph, tboxes, file, chunks, None)
        .await?
        .outcome)
}

/// [`index_entities`], plus the LLM extractor when one is configured. The LLM is asked only
/// when the write would change something (a redelivered or unchanged file costs no tokens).
pub async fn index_entities_with(
    graph: &GraphStore,
    tboxes: &TboxBucket,
    file: &FileRecord,
    chunks: &[ChunkRecord],
    llm: Option<&LlmExtractor>,
) -> Result<EntityIndexReport, GraphWriteError> {
    let tbox = published_tbox(graph, tboxes, &file.namespace).await?;
    let extractor = extractor_for(tbox.as_deref());
    let stamp = stamp(file, &extractor, llm);
    if llm.is_some() {
        let row = read_entity_state(graph, file).await?;
        if row.first().and_then(Value::as_str) == Some(stamp.as_str()) {
            return Ok(EntityIndexReport {
                outcome: EntityWriteOutcome::Unchanged,
                llm: None,
            });
        }
    }
    let work = extractor.clone();
    let owned = chunks.to_vec();
    let mut found = tokio::task::spawn_blocking(move || work.extract(&owned))
        .await
        .map_err(|_| GraphWriteError::UnexpectedReply("entity extraction task failed"))?;
    let llm_outcome = match llm {
        Some(llm) => {
            let mut outcome = llm.extract(&extractor, chunks).await;
            found.merge(std::mem::take(&mut outcome.extraction));
            Some(outcome)
        }
        None => None,
    };
    let outcome = write_stamped(graph, file, &extractor, &stamp, &found).await?;
    Ok(EntityIndexReport {
        outcome,
        llm: llm_outcome,
    })
}

/// The namespace's published TBox as the event bus holds it (through the read cache), or
/// none. Only a namespace's deletion removes a TBox from the bus, and it deletes the graph
/// too; so a graph holding EntityType nodes (written from a TBox) while the bus holds none
/// means the bus lost its state, and its empty bucket, made again before the ontology service
/// put the TBox back, must not be read as "no TBox": that would extract the file without it
/// and remove the namespace's types. [`GraphWriteError::TboxNotOnBus`] then: retry.
pub async fn published_tbox(
    graph: &GraphStore,
    tboxes: &TboxBucket,
    namespace: &str,
) -> Result<Option<Arc<Tbox>>, GraphWriteError> {
    let tbox = tboxes.get_cached(namespace).await?;
    if tbox.is_some() {
        return Ok(tbox);
    }
    // Read-only: a namespace without a graph yet answers no rows and gets no graph.
    let typed = graph
        .ro_query(
            namespace,
            "MATCH (t:EntityType) RETURN t.typeId LIMIT 1",
            &Params::new(),
            TYPES_CHECK_TIMEOUT_MS,
        )
        .await?;
    if typed.rows.is_empty() {
        Ok(None)
    } else {
        Err(GraphWriteError::TboxNotOnBus {
            namespace: namespace.to_owned(),
        })
    }
}

/// Removes what a file contributed: its mentions, the relations it stated, its candidate
/// sightings and the entities left without any mention. Call before the graph writer deletes
/// the FileRef (which holds the list of the file's entities).
pub async fn delete_file_entities(
    graph: &GraphStore,
    ns: &str,
    file_id: &str,
) -> Result<(), GraphWriteError> {
    validate_namespace(ns)?;
    let rows = graph
        .query(
            ns,
            "MATCH (f:FileRef {fileId: $fileId}) RETURN f.entityKeys",
            &file_params(file_id),
        )
        .await?;
    let old_keys = string_list(rows.rows.first().and_then(|r| r.first()));
    clear_file(graph, ns, file_id, &old_keys).await?;
    let keys: Vec<String> = old_keys.into_iter().collect();
    delete_orphans(graph, ns, &keys).await?;
    set_file_props(graph, ns, file_id, None, &BTreeSet::new()).await?;
    Ok(())
}

/// Sets `enabled`/`hidden` on the REL edges the file stated, so the access predicate on the
/// edge follows a flag change at once.
pub async fn set_relation_flags(
    graph: &GraphStore,
    ns: &str,
    file_id: &str,
    enabled: bool,
    hidden: bool,
) -> Result<(), GraphWriteError> {
    validate_namespace(ns)?;
    let mut params = file_params(file_id);
    params.insert("enabled".into(), json!(enabled));
    params.insert("hidden".into(), json!(hidden));
    graph
        .query(
            ns,
            "MATCH (f:FileRef {fileId: $fileId}) WHERE f.entityKeys IS NOT NULL \
             UNWIND f.entityKeys AS k \
             MATCH (s:Entity {entityKey: k}) WITH s \
             MATCH (s)-[r:REL {fileId: $fileId}]->(:Entity) \
             SET r.enabled = $enabled, r.hidden = $hidden",
            &params,
        )
        .await?;
    Ok(())
}

fn string_list(value: Option<&Value>) -> BTreeSet<String> {
    value
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

async fn set_file_props(
    graph: &GraphStore,
    ns: &str,
    file_id: &str,
    stamp: Option<&str>,
    keys: &BTreeSet<String>,
) -> Result<(), StoreError> {
    let mut params = file_params(file_id);
    params.insert("stamp".into(), json!(stamp));
    params.insert("keys".into(), json!(keys));
    graph
        .query(
            ns,
            "MATCH (f:FileRef {fileId: $fileId}) SET f.entityStamp = $stamp, f.entityKeys = $keys",
            &params,
        )
        .await?;
    Ok(())
}

/// Deletes the file's MENTIONS (from its current chunks), the REL edges it stated (found from
/// the entities it touched) and its candidate sightings.
async fn clear_file(
    graph: &GraphStore,
    ns: &str,
    file_id: &str,
    old_keys: &BTreeSet<String>,
) -> Result<(), StoreError> {
    let params = file_params(file_id);
    graph
        .query(
            ns,
            "MATCH (c:Chunk {fileId: $fileId})-[m:MENTIONS]->(:Entity) DELETE m",
            &params,
        )
        .await?;
    let keys: Vec<&String> = old_keys.iter().collect();
    for batch in keys.chunks(BATCH) {
        let mut params = file_params(file_id);
        params.insert("keys".into(), json!(batch));
        graph
            .query(
                ns,
                "UNWIND $keys AS k MATCH (s:Entity {entityKey: k}) WITH s \
                 MATCH (s)-[r:REL {fileId: $fileId}]->(:Entity) DELETE r",
                &params,
            )
            .await?;
    }
    let rows = graph
        .query(
            ns,
            "MATCH (:FileRef {fileId: $fileId})-[p:PROPOSES]->(ce:CandidateEntity) \
             SET ce.count = ce.count - p.count, ce.files = ce.files - 1 \
             WITH p, ce.candidateKey AS k DELETE p RETURN k",
            &params,
        )
        .await?;
    let old_candidates: Vec<String> = rows
        .rows
        .iter()
        .filter_map(|r| r.first().and_then(Value::as_str).map(str::to_owned))
        .collect();
    recount_candidates(graph, ns, &old_candidates).await
}

async fn create_mentions(
    graph: &GraphStore,
    file: &FileRecord,
    found: &Extraction,
) -> Result<(), StoreError> {
    for batch in found.mentions.chunks(BATCH) {
        // Each entity once per batch, then mentions grouped by chunk pointing at the
        // entity's position in that list: one index lookup per chunk and per entity.
        let keys: Vec<&str> = batch
            .iter()
            .map(|m| m.entity_key.as_str())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let entities: Vec<Value> = keys
            .iter()
            .filter_map(|k| found.entities.get(*k))
            .map(|e| entity_row(&e.entity_key, &e.name, &e.type_id, &e.aliases))
            .collect();
        if entities.len() != keys.len() {
            return Err(StoreError::InvalidInput {
                what: "entity extraction",
                reason: "a mention names an entity the extraction does not hold".into(),
            });
        }
        let mut chunks: Vec<(String, Vec<Value>)> = Vec::new();
        for m in batch {
            let position = keys
                .binary_search(&m.entity_key.as_str())
                .unwrap_or_default();
            let row = json!([
                position,
                m.method.as_str(),
                m.quote,
                m.char_start,
                m.char_end,
                m.entity_key
            ]);
            match chunks.last_mut() {
                Some((key, rows)) if *key == m.chunk_key => rows.push(row),
                _ => chunks.push((m.chunk_key.clone(), vec![row])),
            }
        }
        let chunks: Vec<Value> = chunks
            .into_iter()
            .map(|(key, rows)| json!([key, rows]))
            .collect();
        let mut params = file_params(&file.file_id);
        params.insert("entities".into(), Value::Array(entities));
        params.insert("chunks".into(), Value::Array(chunks));
        // Entities and their mentions in one query (one write transaction): a concurrent
        // orphan sweep never sees an entity this batch is about to mention.
        let rows = graph
            .query(
                &file.namespace,
                "UNWIND range(0, size($entities) - 1) AS i WITH i, $entities[i] AS x \
                 MERGE (e:Entity {entityKey: x.entityKey}) \
                 ON CREATE SET e.name = x.name, e.normName = x.normName, e.typeId = x.typeId, \
                     e.aliases = x.aliases, e.aliasText = x.aliasText, e.declared = false \
                 WITH i, e ORDER BY i \
                 WITH collect(e) AS es \
                 UNWIND $chunks AS ch \
                 MATCH (c:Chunk {chunkKey: ch[0]}) WHERE c.fileId = $fileId \
                 UNWIND ch[1] AS m \
                 WITH c, m, es[m[0]] AS e WHERE e.entityKey = m[5] \
                 CREATE (c)-[:MENTIONS {method: m[1], quote: m[2], charStart: m[3], charEnd: m[4], \
                     fileId: $fileId}]->(e) \
                 RETURN count(e)",
                &params,
            )
            .await?;
        // Every mention must land on its own entity; anything else is retried, never kept.
        let created = rows
            .rows
            .first()
            .and_then(|r| r.first())
            .and_then(Value::as_u64);
        if created != u64::try_from(batch.len()).ok() {
            return Err(StoreError::GraphQuery {
                detail: format!(
                    "{} of {} mentions written for file {}",
                    created.unwrap_or(0),
                    batch.len(),
                    file.file_id
                ),
            });
        }
    }
    let typed: Vec<Value> = found
        .entities
        .values()
        .filter(|e| !e.declared)
        .map(|e| json!([e.entity_key, e.type_id]))
        .collect();
    for batch in typed.chunks(BATCH) {
        let mut params = Params::new();
        params.insert("pairs".into(), Value::Array(batch.to_vec()));
        graph
            .query(
                &file.namespace,
                "UNWIND $pairs AS p MATCH (e:Entity {entityKey: p[0]}), (et:EntityType {typeId: p[1]}) \
                 MERGE (e)-[:INSTANCE_OF]->(et)",
                &params,
            )
            .await?;
    }
    Ok(())
}

async fn create_relations(
    graph: &GraphStore,
    file: &FileRecord,
    found: &Extraction,
) -> Result<(), StoreError> {
    let rows: Vec<Value> = found
        .relations
        .iter()
        .map(|r| {
            json!({
                "relationTypeId": r.relation_type_id,
                "source": r.source_key,
                "target": r.target_key,
                "chunkKey": r.chunk_key,
            })
        })
        .collect();
    for batch in rows.chunks(BATCH) {
        let mut params = file_params(&file.file_id);
        params.insert("rels".into(), Value::Array(batch.to_vec()));
        params.insert("path".into(), json!(file.path));
        params.insert("enabled".into(), json!(file.enabled));
        params.insert("hidden".into(), json!(file.hidden));
        params.insert("versionId".into(), json!(file.version_id));
        graph
            .query(
                &file.namespace,
                "UNWIND $rels AS r \
                 MATCH (a:Entity {entityKey: r.source}), (b:Entity {entityKey: r.target}) \
                 CREATE (a)-[:REL {relationTypeId: r.relationTypeId, fileId: $fileId, chunkKey: r.chunkKey, \
                     path: $path, enabled: $enabled, hidden: $hidden, versionId: $versionId}]->(b)",
                &params,
            )
            .await?;
    }
    Ok(())
}

/// Creates the file's PROPOSES edges and adds their sightings to each candidate's totals.
async fn write_candidates(
    graph: &GraphStore,
    ns: &str,
    file_id: &str,
    found: &Extraction,
) -> Result<(), StoreError> {
    let rows: Vec<Value> = found
        .candidates
        .iter()
        .map(|c| {
            json!({"key": c.candidate_key, "name": c.name, "kind": c.kind.as_str(), "count": c.count})
        })
        .collect();
    for batch in rows.chunks(BATCH) {
        let mut params = file_params(file_id);
        params.insert("cands".into(), Value::Array(batch.to_vec()));
        graph
            .query(
                ns,
                "MATCH (f:FileRef {fileId: $fileId}) UNWIND $cands AS c \
                 MERGE (ce:CandidateEntity {candidateKey: c.key}) \
                 ON CREATE SET ce.name = c.name, ce.kind = c.kind, ce.count = 0, ce.files = 0 \
                 CREATE (f)-[:PROPOSES {count: c.count}]->(ce) \
                 SET ce.count = ce.count + c.count, ce.files = ce.files + 1",
                &params,
            )
            .await?;
    }
    Ok(())
}

/// Removes the candidates among `keys` that no file proposes any more. `count` (sightings over
/// all files) and `files` are kept up to date where PROPOSES edges are created and deleted, so
/// no write ever re-aggregates a popular candidate's edges.
async fn recount_candidates(
    graph: &GraphStore,
    ns: &str,
    keys: &[String],
) -> Result<(), StoreError> {
    for batch in keys.chunks(BATCH) {
        let mut params = Params::new();
        params.insert("keys".into(), json!(batch));
        graph
            .query(
                ns,
                "UNWIND $keys AS k MATCH (ce:CandidateEntity {candidateKey: k}) \
                 WHERE ce.files <= 0 DETACH DELETE ce",
                &params,
            )
            .await?;
    }
    Ok(())
}

/// Deletes the entities among `keys` that no chunk mentions and the TBox does not declare.
async fn delete_orphans(graph: &GraphStore, ns: &str, keys: &[String]) -> Result<(), StoreError> {
    for batch in keys.chunks(BATCH) {
        let mut params = Params::new();
        params.insert("keys".into(), json!(batch));
        graph
            .query(
                ns,
                "UNWIND $keys AS k MATCH (e:Entity {entityKey: k}) \
                 WHERE coalesce(e.declared, false) = false \
                 OPTIONAL MATCH (e)<-[m:MENTIONS]-() \
                 WITH e, count(m) AS mentions WHERE mentions = 0 DETACH DELETE e",
                &params,
            )
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::stamp_is_for;

    #[test]
    fn a_stamp_is_current_only_for_its_version_and_tbox() {
        let stamp = "v1|12@1700|docs/a.md";
        assert!(stamp_is_for(stamp, "v1", "12@1700"));
        assert!(stamp_is_for(
            "v1|12@1700|docs/a.md|llm:model",
            "v1",
            "12@1700"
        ));
        // Another version, another TBox, or a TBox whose stamp only starts the same way.
        assert!(!stamp_is_for(stamp, "v2", "12@1700"));
        assert!(!stamp_is_for(stamp, "v1", "1@1700"));
        assert!(!stamp_is_for(stamp, "v1", "12@170"));
        assert!(!stamp_is_for("v1|none|docs/a.md", "v1", "12@1700"));
        assert!(!stamp_is_for("v12|12@1700|docs/a.md", "v1", "12@1700"));
    }
}

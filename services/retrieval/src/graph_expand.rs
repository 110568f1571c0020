//! The graph_expand lane: from the entities of the best full-text hits to other readable
//! chunks that mention them.
//!
//! Seeds are the first [`SEED_HITS`] full-text hits of the same request with distinct texts
//! (the full-text lane runs for them when it was not requested). Every entity a seed mentions
//! gets an idf-like weight `ln(1 + N / df)`, where `N` is the number of chunks the caller may
//! read and `df` the number of those that mention the entity (counted only up to
//! [`crate::roles::ROLE_DEGREE_CAP`], which already makes it `ignore`), so a rare entity pulls
//! harder than a common one. Entities whose role is `ignore` (see [`crate::roles`]) are dropped
//! outright, and each remaining entity contributes at most [`PER_ENTITY_CAP`] chunks, so one
//! ubiquitous entity cannot flood the lane. A candidate's score is the sum of the weights of the seed
//! entities it mentions; seeds themselves are left out (the full-text lane already has them).
//! Access predicates (chunk and FileRef) and the search filters sit inside the Cypher.

use kg_common::access::cypher_predicate;
use kg_proto::v1::AccessFilter;
use kg_stores::graph::{GraphStore, Params};
use serde_json::Value;

use crate::bm25;
use crate::error::{Result, RetrievalError};
use crate::filters::LaneFilters;
use crate::fusion::LaneHit;
use crate::lanes::{self, LANE_POOL, LaneSettings};
use crate::roles::{Role, seed_role_degrees};

/// Full-text hits whose entities seed the expansion.
pub(crate) const SEED_HITS: usize = 5;
/// Most chunks one seed entity contributes.
pub(crate) const PER_ENTITY_CAP: usize = 25;
/// Server-side limit on one query of this lane.
const TIMEOUT_MS: u64 = 5_000;

/// Runs the lane. `fulltext_hits` are the full-text lane's hits of this request when it
/// already ran; otherwise the full-text lane runs here for the seeds.
pub(crate) async fn graph_expand(
    store: &GraphStore,
    namespace: &str,
    access: &AccessFilter,
    query_text: &str,
    filters: &LaneFilters,
    fulltext_hits: Option<&[LaneHit]>,
    settings: LaneSettings,
) -> Result<Vec<LaneHit>> {
    let owned;
    let fulltext_hits = match fulltext_hits {
        Some(hits) => hits,
        None => {
            owned =
                lanes::fulltext(store, namespace, access, query_text, filters, settings).await?;
            owned.as_slice()
        }
    };
    let seeds = seed_keys(fulltext_hits);
    if seeds.is_empty() {
        return Ok(Vec::new());
    }
    // The seeds' entities with their degrees in one query, beside the readable chunk count
    // (the full-text lane's, from the same cache). A count of every chunk would make each
    // hit's score, which the caller sees, a measure of the chunks it may not read.
    let readable = cypher_predicate(access, "node", "path", "acl_node_");
    let (entities, corpus) = tokio::try_join!(
        seed_role_degrees(store, namespace, access, &seeds, settings.statistics_ttl),
        bm25::stats(store, namespace, &readable, &[], settings.statistics_ttl)
    )?;
    let total = corpus.docs.max(1);
    let weighted: Vec<Value> = entities
        .iter()
        .filter(|(_, df)| Role::of(*df) != Role::Ignore)
        .map(|(key, df)| {
            let weight = (1.0 + total as f64 / *df as f64).ln();
            Value::Array(vec![Value::from(key.as_str()), Value::from(weight)])
        })
        .collect();
    if weighted.is_empty() {
        return Ok(Vec::new());
    }

    let chunk = cypher_predicate(access, "c", "path", "acl_c_");
    let file = cypher_predicate(access, "f", "vfsPath", "acl_f_");
    let mut params = Params::new();
    params.extend(chunk.params);
    params.extend(file.params);
    let filter_clauses = filters.where_clauses("c", "f", &mut params);
    let relation = filters.relation_stage("c", "x, c", access, &mut params);
    params.insert("ents".into(), Value::Array(weighted));
    params.insert("seeds".into(), strings(&seeds));
    params.insert("cap".into(), Value::from(PER_ENTITY_CAP as i64));
    params.insert("pool".into(), Value::from(LANE_POOL as i64));
    let cypher = format!(
        "UNWIND $ents AS x \
         MATCH (e:Entity {{entityKey: x[0]}}) WITH x, e \
         MATCH (e)<-[:MENTIONS]-(c:Chunk) \
         WHERE {chunk} AND NOT c.chunkKey IN $seeds \
         MATCH (c)-[:PART_OF]->(f:FileRef) WHERE {file}{filter_clauses} \
         {relation} \
         WITH DISTINCT x, c ORDER BY c.path, c.chunkIndex, c.chunkKey \
         WITH x, collect(c)[0..$cap] AS cs \
         UNWIND cs AS c \
         WITH c, sum(x[1]) AS score \
         RETURN c.chunkKey, c.fileId, score, c.path, c.textHash \
         ORDER BY score DESC, c.path, c.chunkIndex, c.chunkKey \
         LIMIT $pool",
        chunk = chunk.text,
        file = file.text,
    );
    let rows = store
        .ro_query(namespace, &cypher, &params, TIMEOUT_MS)
        .await?;
    rows.rows
        .iter()
        .map(|row| hit(row, "graph_expand"))
        .collect()
}

/// The first [`SEED_HITS`] full-text hits with distinct texts: a copy of a seed's text
/// mentions the same entities, so it would only take the place of a seed that adds some.
fn seed_keys(fulltext_hits: &[LaneHit]) -> Vec<String> {
    let mut texts = std::collections::HashSet::new();
    fulltext_hits
        .iter()
        .filter(|h| texts.insert(h.text_identity()))
        .take(SEED_HITS)
        .map(|h| h.chunk_key.clone())
        .collect()
}

pub(crate) fn strings(values: &[String]) -> Value {
    Value::Array(values.iter().map(|v| Value::from(v.as_str())).collect())
}

/// A `[chunkKey, fileId, score, path, textHash]` row as a lane hit (the last two may be
/// null: a chunk indexed before `textHash` existed).
pub(crate) fn hit(row: &[Value], lane: &str) -> Result<LaneHit> {
    match (
        row.first().and_then(Value::as_str),
        row.get(1).and_then(Value::as_str),
        row.get(2).and_then(Value::as_f64),
    ) {
        (Some(key), Some(file_id), Some(score)) => Ok(LaneHit {
            chunk_key: key.to_owned(),
            file_id: file_id.to_owned(),
            raw_score: score,
            match_share: None,
            path: row
                .get(3)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            text_hash: row.get(4).and_then(Value::as_str).map(str::to_owned),
        }),
        _ => Err(RetrievalError::UnexpectedReply(format!(
            "{lane} row {row:?}"
        ))),
    }
}

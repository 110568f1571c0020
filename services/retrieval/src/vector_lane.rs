//! The vector lane: the query embedded by the deployment's embedder, the nearest chunk points
//! from the vector index with the caller's access filter and the collections filter INSIDE
//! the engine (qdrant-edge or a Qdrant server).
//!
//! Filters the point payload cannot answer exactly (folder prefix, document dates, effective
//! window, relation types) are checked in the graph for the candidates, together with the
//! access predicate again, so a stale point of a deleted or disabled file never surfaces.
//! When those filters reject most candidates the pool widens in rounds
//! ([`FIRST_POOL`] × [`WIDEN_FACTOR`]ⁿ up to [`MAX_POOL`]) instead of returning fewer hits;
//! [`Widening`] reports the final pool and whether the cap stopped it. A search that folds
//! copies of a text into one hit widens the same way when copies leave fewer than
//! [`MIN_DISTINCT_TEXTS`] distinct texts in the pool.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use kg_common::access::cypher_predicate;
use kg_embed::SharedEmbedder;
use kg_proto::v1::AccessFilter;
use kg_stores::graph::{GraphStore, Params};
use kg_stores::vector::{Scope, VectorIndex};
use serde_json::Value;

use crate::error::{Result, RetrievalError};
use crate::filters::LaneFilters;
use crate::fusion::LaneHit;
use crate::lanes::{LANE_POOL, distinct_texts, keep_distinct_texts};

/// Candidates asked for in the first round.
pub(crate) const FIRST_POOL: usize = LANE_POOL;
/// Each widening round multiplies the pool by this.
pub(crate) const WIDEN_FACTOR: usize = 4;
/// The largest pool one search asks the engine for.
pub(crate) const MAX_POOL: usize = 6_400;
/// When copies are folded, a pool holding fewer distinct texts than this (the largest
/// `top_k`) widens: on npm's docs a question about the `workspace` option found 100 points
/// holding 12 texts, the option's description pasted into dozens of command pages.
pub(crate) const MIN_DISTINCT_TEXTS: usize = 32;
/// Server-side limit on the graph check of one round.
const CHECK_TIMEOUT_MS: u64 = 5_000;
/// Most texts whose vectors [`VectorLane::embed_cached`] keeps (about 1.5 KiB each at 384
/// dimensions); past it the cache starts over.
const CACHED_TEXTS: usize = 8_192;

/// How far the lane widened its candidate pool (reported in `trace.vectorWidening`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Widening {
    /// The pool of the last round.
    pub(crate) pool: usize,
    /// Rounds run (1 = no widening).
    pub(crate) rounds: u32,
    /// The last round hit [`MAX_POOL`] and still kept fewer than wanted.
    pub(crate) cap_reached: bool,
}

/// The vector index and the embedder that wrote it.
#[derive(Clone)]
pub(crate) struct VectorLane {
    index: VectorIndex,
    embedder: SharedEmbedder,
    /// Vectors of short texts embedded before (entity names), shared by the clones.
    cache: Arc<Mutex<HashMap<String, Vec<f32>>>>,
}

impl std::fmt::Debug for VectorLane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VectorLane")
            .field("model", &self.embedder.model_id())
            .field("dimension", &self.index.dimension())
            .finish()
    }
}

impl VectorLane {
    /// Refuses an embedder whose vectors do not fit the index.
    pub(crate) fn new(index: VectorIndex, embedder: SharedEmbedder) -> Result<Self> {
        if index.dimension() != embedder.dims() {
            return Err(RetrievalError::Config(format!(
                "the vector index holds {}-dimensional vectors but the embedder `{}` makes {}",
                index.dimension(),
                embedder.model_id(),
                embedder.dims()
            )));
        }
        Ok(Self {
            index,
            embedder,
            cache: Arc::default(),
        })
    }

    /// Embeds `texts` with the embedder that wrote the index, each text once per process:
    /// EntitySearch embeds the same entity names on every call, and a debug-build MiniLM
    /// takes hundreds of milliseconds per batch. A text's vector depends on the text and the
    /// model only, so a cached one is never stale.
    pub(crate) async fn embed_cached(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>> {
        let mut out: Vec<Option<Vec<f32>>> = {
            let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            texts.iter().map(|t| cache.get(t).cloned()).collect()
        };
        let mut missing: Vec<String> = Vec::new();
        for (text, vector) in texts.iter().zip(&out) {
            if vector.is_none() && !missing.contains(text) {
                missing.push(text.clone());
            }
        }
        if !missing.is_empty() {
            let vectors = self
                .embedder
                .embed_query(missing.clone())
                .await
                .map_err(|e| RetrievalError::Unavailable(format!("embedding: {e}")))?;
            if vectors.len() != missing.len() {
                return Err(RetrievalError::UnexpectedReply(format!(
                    "the embedder returned {} vectors for {} texts",
                    vectors.len(),
                    missing.len()
                )));
            }
            let fresh: HashMap<String, Vec<f32>> = missing.into_iter().zip(vectors).collect();
            for (text, slot) in texts.iter().zip(out.iter_mut()) {
                if slot.is_none() {
                    *slot = fresh.get(text).cloned();
                }
            }
            let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            if cache.len() + fresh.len() > CACHED_TEXTS {
                cache.clear();
            }
            cache.extend(fresh);
        }
        out.into_iter()
            .map(|v| {
                v.ok_or_else(|| RetrievalError::UnexpectedReply("a text was not embedded".into()))
            })
            .collect()
    }

    /// The query's vector, for [`VectorLane::search_vector`].
    pub(crate) async fn embed_query(&self, query: &str) -> Result<Vec<f32>> {
        let vectors = self
            .embedder
            .embed_query(vec![query.to_owned()])
            .await
            .map_err(|e| RetrievalError::Unavailable(format!("query embedding: {e}")))?;
        vectors.into_iter().next().ok_or_else(|| {
            RetrievalError::UnexpectedReply("the embedder returned no vector".into())
        })
    }

    /// Up to `want` chunks nearest to `query` that the caller may read and the filters admit;
    /// with `collapse`, up to `want` distinct texts with their copies (see
    /// [`MIN_DISTINCT_TEXTS`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn search(
        &self,
        graph: &GraphStore,
        namespace: &str,
        access: &AccessFilter,
        query: &str,
        filters: &LaneFilters,
        want: usize,
        collapse: bool,
    ) -> Result<(Vec<LaneHit>, Widening)> {
        let vector = self.embed_query(query).await?;
        self.search_vector(graph, namespace, access, &vector, filters, want, collapse)
            .await
    }

    /// [`VectorLane::search`] with the query already embedded.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn search_vector(
        &self,
        graph: &GraphStore,
        namespace: &str,
        access: &AccessFilter,
        vector: &[f32],
        filters: &LaneFilters,
        want: usize,
        collapse: bool,
    ) -> Result<(Vec<LaneHit>, Widening)> {
        let scope = Scope {
            collections: filters.collections.clone(),
            ..Scope::chunks()
        };
        let post_filtered = needs_graph_check(filters);
        let mut pool = if post_filtered {
            FIRST_POOL.max(want)
        } else {
            want
        };
        let mut rounds = 0;
        loop {
            rounds += 1;
            let hits = self
                .index
                .search(access, &scope, vector.to_vec(), pool)
                .await
                .map_err(|e| RetrievalError::Unavailable(format!("vector search: {e}")))?;
            let engine_exhausted = hits.len() < pool;
            let candidates: Vec<LaneHit> = hits
                .into_iter()
                .filter_map(|hit| {
                    hit.chunk_key.map(|chunk_key| LaneHit {
                        chunk_key,
                        file_id: hit.file_id,
                        raw_score: f64::from(hit.score),
                        match_share: None,
                        path: hit.path,
                        text_hash: hit.text_hash,
                    })
                })
                .collect();
            let kept = if post_filtered {
                let admitted =
                    admitted_keys(graph, namespace, access, filters, &candidates).await?;
                candidates
                    .into_iter()
                    .filter(|hit| admitted.contains(&hit.chunk_key))
                    .collect()
            } else {
                candidates
            };
            let mut kept: Vec<LaneHit> = kept;
            let enough = kept.len() >= want
                && (!collapse || distinct_texts(&kept) >= want.min(MIN_DISTINCT_TEXTS));
            if enough || engine_exhausted || pool >= MAX_POOL {
                let widening = Widening {
                    pool,
                    rounds,
                    cap_reached: !enough && !engine_exhausted && pool >= MAX_POOL,
                };
                if collapse {
                    keep_distinct_texts(&mut kept, want);
                } else {
                    kept.truncate(want);
                }
                return Ok((kept, widening));
            }
            pool = (pool * WIDEN_FACTOR).min(MAX_POOL);
        }
    }
}

/// Whether a filter needs the graph: the payload carries collections exactly, the rest not.
pub(crate) fn needs_graph_check(filters: &LaneFilters) -> bool {
    !filters.folder_prefix.is_empty()
        || filters.date_from.is_some()
        || filters.date_to.is_some()
        || filters.effective_at.is_some()
        || !filters.relation_type_ids.is_empty()
}

/// The candidates whose chunk and file the caller may read and the filters admit.
pub(crate) async fn admitted_keys(
    graph: &GraphStore,
    namespace: &str,
    access: &AccessFilter,
    filters: &LaneFilters,
    candidates: &[LaneHit],
) -> Result<HashSet<String>> {
    if candidates.is_empty() {
        return Ok(HashSet::new());
    }
    let mut params = Params::new();
    let chunk = cypher_predicate(access, "c", "path", "acl_c_");
    let file = cypher_predicate(access, "f", "vfsPath", "acl_f_");
    params.extend(chunk.params);
    params.extend(file.params);
    params.insert(
        "keys".into(),
        Value::Array(
            candidates
                .iter()
                .map(|h| Value::from(h.chunk_key.as_str()))
                .collect(),
        ),
    );
    let clauses = filters.where_clauses("c", "f", &mut params);
    let relation = filters.relation_stage("c", "c", access, &mut params);
    // Access predicates before the first WITH (see kg_common::access on FalkorDB 4.16).
    let cypher = format!(
        "UNWIND $keys AS key \
         MATCH (c:Chunk {{chunkKey: key}}) WHERE {chunk} \
         MATCH (c)-[:PART_OF]->(f:FileRef) WHERE {file}{clauses} \
         {relation} \
         RETURN c.chunkKey",
        chunk = chunk.text,
        file = file.text,
    );
    let rows = graph
        .ro_query(namespace, &cypher, &params, CHECK_TIMEOUT_MS)
        .await?;
    Ok(rows
        .rows
        .iter()
        .filter_map(|row| row.first().and_then(Value::as_str).map(str::to_owned))
        .collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn only_filters_the_payload_cannot_answer_need_the_graph() {
        let mut filters = LaneFilters::default();
        assert!(!needs_graph_check(&filters));
        filters.collections = vec!["policies".into()];
        assert!(!needs_graph_check(&filters));
        filters.effective_at = Some("2026-01-01".into());
        assert!(needs_graph_check(&filters));
    }

    #[test]
    fn the_pool_cap_is_a_power_of_the_widening_factor_times_the_first_pool() {
        let mut pool = FIRST_POOL;
        while pool < MAX_POOL {
            pool *= WIDEN_FACTOR;
        }
        assert_eq!(pool, MAX_POOL, "rounds land exactly on the cap");
    }
}

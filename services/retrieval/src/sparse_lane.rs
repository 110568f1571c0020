//! The full-text lane on the `qdrant_sparse` backend: the query's terms as a sparse vector
//! (value = count in the query), scored by Qdrant as BM25 (idf from the engine's
//! `modifier: idf`, term-frequency weights written by the indexer), with the caller's
//! access filter and the collections filter INSIDE the engine.
//!
//! Filters the payload cannot answer exactly (folder prefix, dates, effective window,
//! relation types) are checked in the graph for the candidates, with the access predicate
//! again, widening the pool in rounds like the vector lane so a restrictive filter does not
//! return fewer hits than exist.

use kg_proto::v1::AccessFilter;
use kg_stores::graph::GraphStore;
use kg_stores::vector::Scope;
use kg_stores::vector::sparse::{SparseIndex, query_vector};

use crate::error::{Result, RetrievalError};
use crate::filters::LaneFilters;
use crate::fusion::LaneHit;
use crate::vector_lane::{FIRST_POOL, MAX_POOL, WIDEN_FACTOR, admitted_keys, needs_graph_check};

/// The sparse BM25 index the indexer writes.
#[derive(Debug, Clone)]
pub(crate) struct SparseLane {
    index: SparseIndex,
}

impl SparseLane {
    pub(crate) fn new(index: SparseIndex) -> Self {
        Self { index }
    }

    /// Up to `want` chunks by BM25 score that the caller may read and the filters admit.
    pub(crate) async fn search(
        &self,
        graph: &GraphStore,
        namespace: &str,
        access: &AccessFilter,
        query: &str,
        filters: &LaneFilters,
        want: usize,
    ) -> Result<Vec<LaneHit>> {
        let vector = query_vector(query);
        if vector.is_empty() {
            return Ok(Vec::new());
        }
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
        loop {
            let hits = self
                .index
                .search(access, &scope, vector.clone(), pool)
                .await
                .map_err(|e| RetrievalError::Unavailable(format!("sparse search: {e}")))?;
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
            let kept: Vec<LaneHit> = if post_filtered {
                let admitted =
                    admitted_keys(graph, namespace, access, filters, &candidates).await?;
                candidates
                    .into_iter()
                    .filter(|hit| admitted.contains(&hit.chunk_key))
                    .collect()
            } else {
                candidates
            };
            if kept.len() >= want || engine_exhausted || pool >= MAX_POOL {
                return Ok(kept.into_iter().take(want).collect());
            }
            pool = (pool * WIDEN_FACTOR).min(MAX_POOL);
        }
    }
}

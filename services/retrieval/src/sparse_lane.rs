//! The full-text lane on the `qdrant_sparse` backend: the query's terms as a sparse vector
//! (value = count in the query), scored by Qdrant as BM25 (idf from the engine's
//! `modifier: idf`, term-frequency weights written by the indexer), with the caller's
//! access filter and the collections filter INSIDE the engine.
//!
//! Filters the payload cannot answer exactly are checked in the graph, and the pool widens
//! in rounds when they, or folded copies of a text, leave too few hits, as in the vector
//! lane ([`crate::widening`]).

use kg_proto::v1::AccessFilter;
use kg_stores::graph::GraphStore;
use kg_stores::vector::Scope;
use kg_stores::vector::sparse::{SparseIndex, query_vector};

use crate::error::{Result, RetrievalError};
use crate::filters::LaneFilters;
use crate::fusion::LaneHit;
use crate::widening::PoolSearch;

/// The sparse BM25 index the indexer writes.
#[derive(Debug, Clone)]
pub(crate) struct SparseLane {
    index: SparseIndex,
}

impl SparseLane {
    pub(crate) fn new(index: SparseIndex) -> Self {
        Self { index }
    }

    /// Up to `want` chunks by BM25 score that the caller may read and the filters admit;
    /// with `collapse`, up to `want` distinct texts with their copies.
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
    ) -> Result<Vec<LaneHit>> {
        let vector = query_vector(query);
        if vector.is_empty() {
            return Ok(Vec::new());
        }
        let scope = Scope {
            collections: filters.collections.clone(),
            ..Scope::chunks()
        };
        let search = PoolSearch {
            graph,
            namespace,
            access,
            filters,
            want,
            collapse,
        };
        let (hits, _widening) = search
            .run(|pool| {
                let (scope, vector) = (&scope, vector.clone());
                async move {
                    self.index
                        .search(access, scope, vector, pool)
                        .await
                        .map_err(RetrievalError::Vector)
                }
            })
            .await?;
        Ok(hits)
    }
}

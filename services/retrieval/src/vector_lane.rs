//! The vector lane: the query embedded by the deployment's embedder, the nearest chunk points
//! from the vector index with the caller's access filter and the collections filter INSIDE
//! the engine (qdrant-edge or a Qdrant server).
//!
//! Filters the point payload cannot answer exactly are checked in the graph, and the pool
//! widens in rounds when they, or folded copies of a text, leave too few hits
//! ([`crate::widening`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use kg_embed::SharedEmbedder;
use kg_proto::v1::AccessFilter;
use kg_stores::graph::GraphStore;
use kg_stores::vector::{Scope, VectorIndex};

use crate::error::{Result, RetrievalError};
use crate::filters::LaneFilters;
use crate::fusion::LaneHit;
use crate::widening::{PoolSearch, Widening};

/// Most texts whose vectors [`VectorLane::embed_cached`] keeps (about 1.5 KiB each at 384
/// dimensions); past it the cache starts over.
const CACHED_TEXTS: usize = 8_192;

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
                .map_err(RetrievalError::Embed)?;
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
            .map_err(RetrievalError::Embed)?;
        vectors.into_iter().next().ok_or_else(|| {
            RetrievalError::UnexpectedReply("the embedder returned no vector".into())
        })
    }

    /// Up to `want` chunks nearest to `query` that the caller may read and the filters admit;
    /// with `collapse`, up to `want` distinct texts with their copies (see
    /// [`crate::widening::MIN_DISTINCT_TEXTS`]).
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
        let search = PoolSearch {
            graph,
            namespace,
            access,
            filters,
            want,
            collapse,
        };
        search
            .run(|pool| {
                let (scope, vector) = (&scope, vector.to_vec());
                async move {
                    self.index
                        .search(access, scope, vector, pool)
                        .await
                        .map_err(RetrievalError::Vector)
                }
            })
            .await
    }
}

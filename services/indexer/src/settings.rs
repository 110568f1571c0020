//! What `kgmesh up` configures for the indexer: embeddings, the vector index and
//! concurrency, and how that becomes a [`Vectors`] lane.

use std::path::Path;

use kg_embed::EmbeddingConfig;
use kg_stores::vector::sparse::{FulltextBackend, SparseIndex};
use kg_stores::vector::{EdgeIndex, ServerIndex, VectorError, VectorIndex};

use crate::vector_writer::{VectorWriteError, Vectors};

/// Default Qdrant collection on a server.
pub const DEFAULT_COLLECTION: &str = "kgmesh";

/// The indexer's deployment settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexerSettings {
    /// `[embedding]`.
    pub embedding: EmbeddingConfig,
    /// A Qdrant server (gRPC URL, usually port 6334); embedded qdrant-edge when unset.
    pub qdrant_url: Option<String>,
    /// Environment variable with the Qdrant API key.
    pub qdrant_api_key_env: Option<String>,
    /// Collection on the Qdrant server.
    pub collection: String,
    /// Events indexed at once.
    pub concurrency: usize,
    /// Which index serves the full-text lane (`[retrieval] fulltext_backend`).
    pub fulltext_backend: FulltextBackend,
    /// `[indexer.llm]`: the optional LLM extractor, off by default.
    pub llm: crate::entities::llm::LlmConfig,
    /// `[indexer] chunk_*`: how versions are cut into chunks.
    pub chunk: crate::document::ChunkOptions,
}

impl Default for IndexerSettings {
    fn default() -> Self {
        Self {
            embedding: EmbeddingConfig::default(),
            qdrant_url: None,
            qdrant_api_key_env: None,
            collection: DEFAULT_COLLECTION.to_owned(),
            concurrency: 4,
            fulltext_backend: FulltextBackend::default(),
            llm: crate::entities::llm::LlmConfig::default(),
            chunk: crate::document::ChunkOptions::default(),
        }
    }
}

impl IndexerSettings {
    /// Loads the embedder and opens the vector index (qdrant-edge in `edge_dir`
    /// unless a server is configured); `None` when embeddings are off.
    pub async fn open_vectors(&self, edge_dir: &Path) -> Result<Option<Vectors>, VectorWriteError> {
        let Some(embedder) = kg_embed::build(&self.embedding).await? else {
            return Ok(None);
        };
        let dims = embedder.dims();
        let index: VectorIndex = match &self.qdrant_url {
            Some(url) => {
                let key = match &self.qdrant_api_key_env {
                    Some(var) => {
                        Some(std::env::var(var).map_err(|_| VectorError::InvalidInput {
                            what: "qdrant api key",
                            reason: format!("environment variable `{var}` is unset"),
                        })?)
                    }
                    None => None,
                };
                let index = ServerIndex::connect(url, key, &self.collection, dims)?;
                index.ensure_collection().await?;
                index.into()
            }
            None => EdgeIndex::open(edge_dir, dims).await?.into(),
        };
        Ok(Some(Vectors::new(index, embedder)?))
    }

    /// Opens the sparse BM25 index when the full-text backend is `qdrant_sparse`: the
    /// collection `<collection>-bm25` on the Qdrant server, whether or not embeddings are
    /// on; `None` with the FalkorDB backend. Without a server it refuses: the embedded
    /// qdrant-edge 0.6.0 cannot search sparse vectors (its shard would go in `edge_dir`).
    pub async fn open_sparse(&self, _edge_dir: &Path) -> Result<Option<SparseIndex>, VectorError> {
        if self.fulltext_backend != FulltextBackend::QdrantSparse {
            return Ok(None);
        }
        let index = match &self.qdrant_url {
            Some(url) => {
                SparseIndex::connect_server(
                    url,
                    self.qdrant_api_key()?,
                    &format!("{}-bm25", self.collection),
                )
                .await?
            }
            // qdrant-edge 0.6.0 cannot score sparse vectors: fail at startup rather than
            // serve a full-text lane that fails on every search.
            None => return Err(kg_stores::vector::sparse::edge_cannot_search()),
        };
        Ok(Some(index))
    }

    /// The LLM extractor when `[indexer.llm] enabled`; `None` otherwise.
    pub fn open_llm(
        &self,
    ) -> Result<
        Option<std::sync::Arc<crate::entities::llm::LlmExtractor>>,
        crate::entities::llm::LlmError,
    > {
        Ok(crate::entities::llm::LlmExtractor::from_config(&self.llm)?.map(std::sync::Arc::new))
    }

    fn qdrant_api_key(&self) -> Result<Option<String>, VectorError> {
        match &self.qdrant_api_key_env {
            Some(var) => Ok(Some(std::env::var(var).map_err(|_| {
                VectorError::InvalidInput {
                    what: "qdrant api key",
                    reason: format!("environment variable `{var}` is unset"),
                }
            })?)),
            None => Ok(None),
        }
    }
}

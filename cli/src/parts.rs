//! How each service is built from the settings, shared by `kgmesh up` (every service in one
//! process) and `kgmesh serve` (one per process), so the two cannot drift apart.

use kg_stores::blobs::BlobStore;
use kg_stores::graph::GraphStore;
use kg_stores::sql::SqlStore;
use kg_stores::vector::sparse::SparseIndex;

use crate::mesh::MeshOptions;

/// Largest file the files service stores.
const MAX_FILE_BYTES: usize = 64 * 1024 * 1024;

/// The files service over its registry, blobs and event stream.
pub(crate) async fn files_service(
    options: &MeshOptions,
    sql: SqlStore,
    blobs: BlobStore,
    jetstream: async_nats::jetstream::Context,
) -> anyhow::Result<kg_files::FilesService> {
    let mut files = kg_files::FilesService::new(sql, blobs, jetstream, MAX_FILE_BYTES).await?;
    if let Some(max) = options.max_query_file_bytes {
        files = files.with_query_limits(kg_files::QueryLimits {
            max_query_file_bytes: max,
            ..kg_files::QueryLimits::default()
        })?;
    }
    Ok(files)
}

/// The indexer's settings with the vector lanes it writes.
pub(crate) fn indexer_config(
    options: &MeshOptions,
    vectors: Option<kg_indexer::Vectors>,
    sparse: Option<SparseIndex>,
) -> anyhow::Result<kg_indexer::IndexerConfig> {
    use anyhow::Context as _;
    Ok(kg_indexer::IndexerConfig {
        concurrency: options.indexer.concurrency,
        chunk: options.indexer.chunk.clone(),
        vectors,
        sparse: sparse.map(kg_indexer::sparse::SparseTerms::new),
        llm: options
            .indexer
            .open_llm()
            .context("cannot start the LLM extractor")?,
        ..kg_indexer::IndexerConfig::default()
    })
}

/// The retrieval service; the vector lane embeds queries with the embedder that wrote the
/// index.
pub(crate) fn retrieval_service(
    options: &MeshOptions,
    graph: GraphStore,
    vectors: Option<&kg_indexer::Vectors>,
    sparse: Option<SparseIndex>,
) -> anyhow::Result<kg_retrieval::RetrievalService> {
    let mut service = kg_retrieval::RetrievalService::new(graph)
        .with_fulltext_stemming(options.fulltext_stemming)
        .with_fusion_fulltext_full_match(options.fusion_fulltext_full_match)
        .with_collapse_duplicates(options.collapse_duplicates)
        .with_statistics_ttl(options.statistics_ttl);
    if let Some(vectors) = vectors {
        service = service.with_vectors(vectors.index.clone(), vectors.embedder.clone())?;
    }
    if let Some(sparse) = sparse {
        service = service.with_sparse(sparse);
    }
    Ok(service)
}

/// The graph service: published TBoxes (kg_ontology) from JetStream KV, and the indexer's
/// vector index for similar hops and similarFiles.
pub(crate) async fn graph_service(
    graph: GraphStore,
    jetstream: &async_nats::jetstream::Context,
    vectors: Option<&kg_indexer::Vectors>,
) -> anyhow::Result<kg_graph::GraphService> {
    let mut service = kg_graph::GraphService::new(graph)
        .with_tbox(kg_stores::tbox::TboxBucket::open(jetstream).await?);
    if let Some(vectors) = vectors {
        service = service.with_vectors(vectors.index.clone());
    }
    Ok(service)
}

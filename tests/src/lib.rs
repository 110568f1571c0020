//! kg-e2e: end-to-end tests of kgmesh. The tests in `tests/` start the whole
//! mesh in-process on real stores (FalkorDB, NATS JetStream, SQLite or
//! PostgreSQL from the dev-deps virtualenv) through the same composition as
//! `kgmesh up`; the MCP-client tests live in `tests/python`.

use std::net::SocketAddr;

use kgmesh::{Mesh, MeshOptions};

/// Starts a mesh in a fresh temp dir on a free port. Keep the returned dir
/// alive for as long as the mesh runs.
pub async fn start_mesh() -> anyhow::Result<(Mesh, tempfile::TempDir)> {
    let dir = tempfile::tempdir()?;
    let mesh = Mesh::start(MeshOptions {
        data_dir: dir.path().join("data"),
        http_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        database_url: None,
        falkordb_url: None,
        nats_url: None,
        allowed_hosts: Vec::new(),
        allowed_origins: Vec::new(),
        public_base_url: None,
        http_tls: None,
        max_query_file_bytes: None,
        blob_sweep: Some(Default::default()),
        audit_retention: None,
        max_upload_bytes: None,
        fulltext_stemming: false,
        fusion_fulltext_full_match: kg_retrieval::DEFAULT_FUSION_FULLTEXT_FULL_MATCH,
        collapse_duplicates: true,
        statistics_ttl: kg_retrieval::DEFAULT_STATISTICS_TTL,
        approval: Default::default(),
        indexer: Default::default(),
    })
    .await?;
    Ok((mesh, dir))
}

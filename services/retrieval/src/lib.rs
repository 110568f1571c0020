//! kg-retrieval: the retrieval service. It serves `kg.v1.Retrieval` over one namespace at a
//! time: Search runs the requested lanes (full-text, vector, graph_expand from the hits'
//! entities, the opt-in co_annotation lane with its grounding report) and fuses them with
//! reciprocal rank fusion; EntitySearch finds entities by name, alias and vector. It only
//! reads (FalkorDB, the vector and sparse indexes), with the caller's access predicate and
//! the search filters inside every query, and never calls another service. Entry point:
//! [`serve`]; in-process callers use [`RetrievalService::search_for`].

// The FalkorDB driver's query future nests deeply; computing its layout needs more than
// the default query depth.
#![recursion_limit = "256"]

mod bm25;
mod co_annotation;
mod config;
mod deadline;
mod entity_search;
mod error;
mod filters;
mod fusion;
mod graph_expand;
mod grpc;
mod lanes;
pub mod roles;
mod scope_cache;
mod service;
mod sparse_lane;
mod vector_lane;
mod widening;

use kg_common::caller::{CallerContextLayer, ContextVerifier};
use kg_proto::v1::retrieval_server::RetrievalServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::service::Routes;

pub use config::RetrievalConfig;
pub use entity_search::{EVIDENCE as ENTITY_EVIDENCE_CAP, LIMIT as ENTITY_LIMIT_CAP};
pub use error::{Result, RetrievalError};
pub use service::{DEFAULT_FUSION_FULLTEXT_FULL_MATCH, DEFAULT_STATISTICS_TTL, RetrievalService};

/// The gRPC service name, as the health service reports it.
pub const SERVICE_NAME: &str = "kg.v1.Retrieval";

/// Connects to FalkorDB and serves the retrieval service on `listener` until `shutdown` fires.
pub async fn serve(
    config: RetrievalConfig,
    verifier: ContextVerifier,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<()> {
    let service = RetrievalService::connect(&config).await?;
    serve_with(service, verifier, listener, shutdown).await
}

/// Serves an already built [`RetrievalService`] (tests, or a process sharing one FalkorDB handle).
pub async fn serve_with(
    service: RetrievalService,
    verifier: ContextVerifier,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<()> {
    kg_common::grpc::serve(
        listener,
        CallerContextLayer::new(verifier, &[]),
        Routes::new(RetrievalServer::new(service)),
        &[SERVICE_NAME],
        shutdown,
    )
    .await?;
    Ok(())
}

//! kg-graph: the graph service. It serves `kg.v1.Graph` over one namespace graph at a time:
//! chunk packages (Packages), Open by chunk/outline/entity key or file id, Outline, and
//! kg_cypher (Cypher: one read-only statement, parsed, access-rewritten and printed back).
//! It also serves Hop (typed navigation), FileEntities, FileTriples, Ontology (the published TBox)
//! and Candidates (names the entity heuristics saw, for drafting a TBox; admin API only).
//! It reads FalkorDB (the indexer writes it) and the `KG_TBOX` bucket, applies the
//! caller's access predicate inside every Cypher `WHERE`, and never calls another service.
//! Entry point: [`serve`]; in-process callers use [`GraphService`]'s `*_for` methods.

mod candidates;
mod caps;
mod config;
pub mod cypher;
mod entities;
mod error;
mod grpc;
mod hop;
mod ontology;
mod open;
mod outline;
mod packages;
mod rows;
mod service;
mod similar;
mod triples;

use kg_common::caller::{CallerContextLayer, ContextVerifier};
use kg_proto::v1::graph_server::GraphServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::service::Routes;

pub use config::GraphConfig;
pub use error::{GraphError, Result};
pub use service::GraphService;

/// The gRPC service name, as the health service reports it.
pub const SERVICE_NAME: &str = "kg.v1.Graph";

/// Connects to FalkorDB and serves the graph service on `listener` until `shutdown` fires.
pub async fn serve(
    config: GraphConfig,
    verifier: ContextVerifier,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<()> {
    let service = GraphService::connect(&config).await?;
    serve_with(service, verifier, listener, shutdown).await
}

/// Serves an already built [`GraphService`] (tests, or a process sharing one FalkorDB handle).
pub async fn serve_with(
    service: GraphService,
    verifier: ContextVerifier,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<()> {
    kg_common::grpc::serve(
        listener,
        CallerContextLayer::new(verifier, &[]),
        Routes::new(GraphServer::new(service)),
        &[SERVICE_NAME],
        shutdown,
    )
    .await?;
    Ok(())
}

//! kg-approval: proposals of governed actions, the human decisions on them and
//! the execution of approved effects with honest outcomes (executed, unknown,
//! effect_failed). It is a separate process no model can address: MCP can only
//! submit proposals through the ontology service; deciding needs an admin.
//! Owns the `approval_proposals` / `approval_events` tables (SQLite or
//! PostgreSQL); asks the ontology service (CheckAction) before any effect runs.

mod effect;
mod error;
mod grpc;
mod secret;
mod service;
mod signature;
mod store;

use kg_common::caller::{CallerContextLayer, ContextVerifier};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use effect::{
    DEFAULT_MAX_ATTEMPTS, DEFAULT_TIMEOUT_MS, MAX_ATTEMPTS_CAP, SecretSource, TIMEOUT_CAP_MS,
};
pub use error::{ApprovalError, Result};
pub use kg_proto::v1::approval_server::{Approval, ApprovalServer};
pub use secret::{MIN_SECRET_BYTES, load_signing_secret};
pub use service::{
    ApprovalConfig, ApprovalService, DEFAULT_LIST_LIMIT, DEFAULT_RUN_LEASE, DEFAULT_STOP_GRACE,
    MAX_LIST_LIMIT,
};
pub use signature::{
    IDEMPOTENCY_HEADER, PROPOSAL_HEADER, SIGNATURE_HEADER, SignatureError, canonical_json,
    idempotency_key, sha256_hex, sign, verify,
};

/// gRPC service name (health checks).
pub const SERVICE_NAME: &str = "kg.v1.Approval";

/// Serves the approval gRPC API on `listener` until `shutdown`. Every RPC needs
/// a caller context signed by a key `verifier` trusts.
pub async fn serve(
    service: ApprovalService,
    verifier: ContextVerifier,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), kg_common::grpc::ServeError> {
    let leases = tokio::spawn({
        let service = service.clone();
        let shutdown = shutdown.clone();
        async move { service.keep_leases(shutdown).await }
    });
    // From the stop on, beside the server's own drain (which waits for decisions still waiting
    // on their effect): effects still running after the grace are settled, not abandoned, and
    // within the time a supervisor gives a stopping process (`up`: 8 s; Kubernetes: 30 s).
    let stopping = shutdown.clone();
    let settle_on_stop = tokio::spawn({
        let service = service.clone();
        let shutdown = shutdown.clone();
        async move {
            shutdown.cancelled().await;
            service.drain_on_stop().await;
        }
    });
    let routes = tonic::service::Routes::new(ApprovalServer::new(service.clone()));
    let served = kg_common::grpc::serve(
        listener,
        CallerContextLayer::new(verifier, &[]),
        routes,
        &[SERVICE_NAME],
        shutdown,
    )
    .await;
    leases.abort();
    if stopping.is_cancelled() {
        let _ = settle_on_stop.await;
    } else {
        // The server failed on its own (no stop asked): nothing to settle for a stop.
        settle_on_stop.abort();
    }
    served
}

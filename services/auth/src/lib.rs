//! kg-auth: principals, namespaces, groups, grants, denies, personal access
//! tokens and the audit log.
//!
//! Owns the auth tables in SQL (SQLite or PostgreSQL) and the ed25519 key that
//! signs caller contexts. `Authorize` turns a PAT into a signed
//! [`kg_proto::v1::CallerContext`] on every call, and is the only RPC served
//! without a caller context. It remembers what it resolved per token only while
//! the store's access epoch is unchanged (see `cache`), so no permission it
//! remembers outlives a revocation. Trims the audit log to its configured retention (see
//! `audit_retention`). Never reads another service's store.

mod audit_retention;
mod cache;
mod error;
mod grpc;
mod pat;
mod resolve;
mod service;
mod store;

use kg_common::caller::{CallerContextLayer, ContextVerifier};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use audit_retention::{AUDIT_RETENTION_EVERY, run_audit_retention};
pub use error::{AuthError, Result};
pub use pat::{PAT_PREFIX, looks_valid};
pub use service::{AuthService, DenyTarget, Subject};
pub use store::ROLE_GROUP_PREFIX;

/// gRPC paths callable without a caller context: the token is the credential.
pub const UNAUTHENTICATED_PATHS: &[&str] = &["/kg.v1.Auth/Authorize", "/kg.v1.Auth/SigningKey"];

/// Serves the auth gRPC API on `listener` until `shutdown`; its health answers
/// NOT_SERVING for `kg.v1.Auth` while the auth tables' database is unreachable.
pub async fn serve(
    service: AuthService,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), kg_common::grpc::ServeError> {
    let verifier = ContextVerifier::new(vec![service.public_key()]);
    let probe = service.store_probe();
    let routes = tonic::service::Routes::new(kg_proto::v1::auth_server::AuthServer::new(service));
    kg_common::grpc::serve_probed(
        listener,
        CallerContextLayer::new(verifier, UNAUTHENTICATED_PATHS),
        routes,
        &["kg.v1.Auth"],
        Some(probe),
        shutdown,
    )
    .await
}

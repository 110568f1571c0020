//! [`GraphError`]: every way a graph read can fail, each with its stable code.

use kg_common::access::NameError;
use kg_common::caller::CallerError;
use kg_common::error::{ErrorCode, ErrorExt};
use kg_common::grpc::ServeError;
use kg_stores::StoreError;

/// Errors of the graph service. Messages of client-visible variants are safe to show.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// The request names an impossible value (a cap over its maximum, a bad cursor).
    #[error("{0}")]
    InvalidArgument(String),
    /// The key or file does not exist, or the caller may not read it (never told apart).
    #[error("{0}")]
    NotFound(String),
    /// No caller context, or the namespace is not in the caller's access list.
    #[error(transparent)]
    Caller(#[from] CallerError),
    /// The namespace name is malformed.
    #[error(transparent)]
    Name(#[from] NameError),
    /// FalkorDB failed; its text stays in the logs.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The vector index failed (similar files); its text stays in the logs.
    #[error(transparent)]
    Vector(#[from] kg_stores::vector::VectorError),
    /// FalkorDB answered with a row of an unexpected shape.
    #[error("unexpected graph reply: {0}")]
    UnexpectedReply(String),
    /// A store this request needs is not wired into this process (e.g. no TBox bucket).
    #[error("{0}")]
    Unavailable(String),
    /// The gRPC server stopped with an error.
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// A kg_cypher statement broke a rule; the message names it and the fix.
    #[error(transparent)]
    Refused(crate::cypher::core::Refusal),
    /// Another kg_cypher statement held the graph for longer than the bounded wait.
    #[error("{0}")]
    Busy(String),
    /// A kg_cypher statement ran out of time.
    #[error("{0}")]
    Timeout(String),
}

impl GraphError {
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        GraphError::InvalidArgument(message.into())
    }
}

impl ErrorExt for GraphError {
    fn code(&self) -> ErrorCode {
        match self {
            GraphError::InvalidArgument(_) | GraphError::Refused(_) => ErrorCode::InvalidArgument,
            GraphError::Busy(_) => ErrorCode::Busy,
            GraphError::Timeout(_) => ErrorCode::Timeout,
            GraphError::NotFound(_) => ErrorCode::NotFound,
            GraphError::Unavailable(_) => ErrorCode::Unavailable,
            GraphError::Caller(err) => err.code(),
            GraphError::Name(err) => err.code(),
            GraphError::Store(err) => err.code(),
            GraphError::Vector(err) => err.code(),
            GraphError::UnexpectedReply(_) | GraphError::Serve(_) => ErrorCode::Internal,
        }
    }
}

kg_common::impl_status_from!(GraphError);

/// Shorthand for results of this crate.
pub type Result<T, E = GraphError> = std::result::Result<T, E>;

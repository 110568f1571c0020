//! [`RetrievalError`]: every way a search can fail, each with its stable code.

use kg_common::access::NameError;
use kg_common::caller::CallerError;
use kg_common::error::{ErrorCode, ErrorExt};
use kg_common::grpc::ServeError;
use kg_stores::StoreError;

/// Errors of the retrieval service. Messages of client-visible variants are safe to show.
#[derive(Debug, thiserror::Error)]
pub enum RetrievalError {
    /// The request names an impossible value (unknown lane, top_k over its maximum).
    #[error("{0}")]
    InvalidArgument(String),
    /// No caller context, or the namespace is not in the caller's access list.
    #[error(transparent)]
    Caller(#[from] CallerError),
    /// The namespace name or folder prefix is malformed.
    #[error(transparent)]
    Name(#[from] NameError),
    /// FalkorDB failed; its text stays in the logs.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// FalkorDB answered with a row of an unexpected shape.
    #[error("unexpected graph reply: {0}")]
    UnexpectedReply(String),
    /// The gRPC server stopped with an error.
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// A backing service (the embedder, the vector index) failed; the lane soft-fails.
    #[error("{0}")]
    Unavailable(String),
    /// The service was built with parts that do not fit together.
    #[error("{0}")]
    Config(String),
}

impl RetrievalError {
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        RetrievalError::InvalidArgument(message.into())
    }
}

impl ErrorExt for RetrievalError {
    fn code(&self) -> ErrorCode {
        match self {
            RetrievalError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            RetrievalError::Caller(err) => err.code(),
            RetrievalError::Name(err) => err.code(),
            RetrievalError::Store(err) => err.code(),
            RetrievalError::Unavailable(_) => ErrorCode::Unavailable,
            RetrievalError::UnexpectedReply(_)
            | RetrievalError::Serve(_)
            | RetrievalError::Config(_) => ErrorCode::Internal,
        }
    }
}

kg_common::impl_status_from!(RetrievalError);

/// Shorthand for results of this crate.
pub type Result<T, E = RetrievalError> = std::result::Result<T, E>;

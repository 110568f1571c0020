//! [`VectorError`]: the errors of the vector index, mapped to stable codes.
//!
//! Engine and server text stays in `Internal` variants (masked by kg-common before it
//! leaves a service) or rides along as the `source` of `Unavailable`/`Timeout`.

use kg_common::error::{ErrorCode, ErrorExt};

use crate::error::BoxError;

/// Errors of both vector index backends.
#[derive(Debug, thiserror::Error)]
pub enum VectorError {
    /// The Qdrant server cannot be reached.
    #[error("vector index is unavailable")]
    Unavailable {
        /// The client error, for logs.
        #[source]
        source: BoxError,
    },
    /// The Qdrant server did not answer in time.
    #[error("vector index timed out")]
    Timeout {
        /// The client error, for logs.
        #[source]
        source: BoxError,
    },
    /// A point or request the index cannot accept; the reason is ours.
    #[error("invalid {what}: {reason}")]
    InvalidInput {
        /// What was invalid.
        what: &'static str,
        /// Why, in our words.
        reason: String,
    },
    /// The index on disk or on the server was built for other vectors.
    #[error(
        "vector index was created for {existing}, not {wanted}; use another directory or collection, \
         or delete the old one and re-index"
    )]
    Incompatible {
        /// What the existing index holds, e.g. "dimension 384 (Cosine)".
        existing: String,
        /// What this process asked for.
        wanted: String,
    },
    /// Any other engine or server failure. Coded `Internal`.
    #[error("vector index failed: {detail}")]
    Internal {
        /// The engine text.
        detail: String,
    },
}

impl VectorError {
    pub(crate) fn internal(detail: impl std::fmt::Display) -> Self {
        VectorError::Internal {
            detail: detail.to_string(),
        }
    }

    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        VectorError::InvalidInput {
            what,
            reason: reason.into(),
        }
    }
}

impl ErrorExt for VectorError {
    fn code(&self) -> ErrorCode {
        match self {
            VectorError::Unavailable { .. } => ErrorCode::Unavailable,
            VectorError::Timeout { .. } => ErrorCode::Timeout,
            VectorError::InvalidInput { .. } => ErrorCode::InvalidArgument,
            VectorError::Incompatible { .. } => ErrorCode::FailedPrecondition,
            VectorError::Internal { .. } => ErrorCode::Internal,
        }
    }
}

kg_common::impl_status_from!(VectorError);

//! [`EmbedError`]: why texts could not be embedded, with stable codes.

use kg_common::error::{ErrorCode, ErrorExt};

/// Errors of every embedding provider. No variant ever carries an API key.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// The configuration cannot work; the message says what to change.
    #[error("embedding configuration: {0}")]
    Config(String),
    /// The local model files are missing or unreadable.
    #[error("embedding model: {0}")]
    Model(String),
    /// The model failed while running.
    #[error("embedding failed: {0}")]
    Inference(String),
    /// The endpoint could not be reached or timed out.
    #[error("embedding endpoint unavailable: {0}")]
    Unavailable(String),
    /// The endpoint answered with an error status.
    #[error("embedding endpoint answered {status}: {detail}")]
    Status {
        /// HTTP status code.
        status: u16,
        /// The start of the body, with the API key masked.
        detail: String,
    },
    /// The endpoint answered something that is not an embeddings response.
    #[error("embedding endpoint sent an invalid response: {0}")]
    InvalidResponse(String),
}

impl EmbedError {
    /// Whether trying the same texts again later may succeed.
    pub fn retryable(&self) -> bool {
        match self {
            EmbedError::Unavailable(_) | EmbedError::Inference(_) => true,
            EmbedError::Status { status, .. } => *status == 429 || *status >= 500,
            EmbedError::Config(_) | EmbedError::Model(_) | EmbedError::InvalidResponse(_) => false,
        }
    }
}

impl ErrorExt for EmbedError {
    fn code(&self) -> ErrorCode {
        match self {
            EmbedError::Config(_) | EmbedError::Model(_) => ErrorCode::FailedPrecondition,
            EmbedError::Unavailable(_) => ErrorCode::Unavailable,
            EmbedError::Status { status: 429, .. } => ErrorCode::Unavailable,
            EmbedError::Status { .. }
            | EmbedError::Inference(_)
            | EmbedError::InvalidResponse(_) => ErrorCode::Internal,
        }
    }
}

kg_common::impl_status_from!(EmbedError);

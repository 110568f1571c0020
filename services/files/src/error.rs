use kg_common::{ErrorCode, ErrorExt};

/// Errors of the files service. Messages of non-internal variants are shown to clients.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    /// Bad input; the message says what to change.
    #[error("{0}")]
    Invalid(String),
    /// Unknown file (or one the caller may not read: the same answer).
    #[error("file not found: {0}")]
    NotFound(String),
    /// The caller lacks write permission.
    #[error("writing to namespace `{0}` needs write permission on that path")]
    WriteDenied(String),
    /// Upload over the size limit.
    #[error("file is {size} bytes; the limit is {limit} bytes")]
    TooLarge {
        /// Bytes sent.
        size: usize,
        /// Configured limit.
        limit: usize,
    },
    /// The event could not be queued for indexing.
    #[error("the file was stored but could not be queued for indexing; upload it again")]
    QueueUnavailable,
    /// Caller context problems.
    #[error(transparent)]
    Caller(#[from] kg_common::caller::CallerError),
    /// Names and paths.
    #[error(transparent)]
    Name(#[from] kg_common::access::NameError),
    /// A store failed.
    #[error("store: {0}")]
    Store(#[from] kg_stores::StoreError),
    /// A query failed.
    #[error("sql: {0}")]
    Sql(#[from] sqlx::Error),
}

impl ErrorExt for FilesError {
    fn code(&self) -> ErrorCode {
        match self {
            FilesError::Invalid(_) => ErrorCode::InvalidArgument,
            FilesError::NotFound(_) => ErrorCode::NotFound,
            FilesError::WriteDenied(_) => ErrorCode::PermissionDenied,
            FilesError::TooLarge { .. } => ErrorCode::PayloadTooLarge,
            FilesError::QueueUnavailable => ErrorCode::Unavailable,
            FilesError::Caller(e) => e.code(),
            FilesError::Name(e) => e.code(),
            FilesError::Store(e) => e.code(),
            FilesError::Sql(sqlx::Error::PoolTimedOut | sqlx::Error::Io(_)) => {
                ErrorCode::Unavailable
            }
            FilesError::Sql(_) => ErrorCode::Internal,
        }
    }
}

kg_common::impl_status_from!(FilesError);

/// `Result` of this crate.
pub type Result<T, E = FilesError> = std::result::Result<T, E>;

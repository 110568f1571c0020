use kg_common::{ErrorCode, ErrorExt};

/// Errors of the auth service. Messages of non-internal variants are shown to clients.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// Missing, malformed, unknown, revoked or expired token. One message for
    /// all of them, so a probe learns nothing about which.
    #[error(
        "invalid token: it is missing, malformed, revoked, expired or from another deployment, or its principal is disabled"
    )]
    InvalidToken,
    /// The caller may not read a namespace it asked for.
    #[error("namespace `{0}` is not readable by this caller")]
    NamespaceDenied(String),
    /// Bad input; the message says what to change.
    #[error("{0}")]
    Invalid(String),
    /// Allowed to an admin only; the message says what this caller may do instead.
    #[error("{0}")]
    Denied(String),
    /// The named thing does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// Already exists.
    #[error("{0} already exists")]
    AlreadyExists(String),
    /// The thing exists but is in a state that forbids the call (e.g. rotating a revoked PAT).
    #[error("{0}")]
    FailedPrecondition(String),
    /// Stored data could not be decoded.
    #[error("corrupt row: {0}")]
    Corrupt(String),
    /// Caller context problems (missing, not admin).
    #[error(transparent)]
    Caller(#[from] kg_common::caller::CallerError),
    /// Names and paths.
    #[error(transparent)]
    Name(#[from] kg_common::access::NameError),
    /// The SQL store failed.
    #[error("sql store: {0}")]
    Store(#[from] kg_stores::StoreError),
    /// A query failed.
    #[error("sql: {0}")]
    Sql(#[source] sqlx::Error),
    /// The database could not be reached (no connection within the pool's timeout, or the
    /// connection broke). The driver's words ride as the source, for the log only.
    #[error("the database is unreachable; retry shortly")]
    SqlUnreachable(#[source] sqlx::Error),
    /// Key material could not be loaded.
    #[error("signing key: {0}")]
    Key(String),
}

impl ErrorExt for AuthError {
    fn code(&self) -> ErrorCode {
        match self {
            AuthError::InvalidToken => ErrorCode::Unauthenticated,
            AuthError::NamespaceDenied(_) | AuthError::Denied(_) => ErrorCode::PermissionDenied,
            AuthError::Invalid(_) => ErrorCode::InvalidArgument,
            AuthError::NotFound(_) => ErrorCode::NotFound,
            AuthError::AlreadyExists(_) => ErrorCode::AlreadyExists,
            AuthError::FailedPrecondition(_) => ErrorCode::FailedPrecondition,
            AuthError::Caller(e) => e.code(),
            AuthError::Name(e) => e.code(),
            AuthError::Store(e) => e.code(),
            AuthError::SqlUnreachable(_) => ErrorCode::Unavailable,
            AuthError::Sql(_) | AuthError::Key(_) | AuthError::Corrupt(_) => ErrorCode::Internal,
        }
    }
}

impl From<sqlx::Error> for AuthError {
    fn from(err: sqlx::Error) -> Self {
        if kg_stores::sql::is_unreachable(&err) {
            Self::SqlUnreachable(err)
        } else {
            Self::Sql(err)
        }
    }
}

kg_common::impl_status_from!(AuthError);

/// `Result` of this crate.
pub type Result<T, E = AuthError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// A database that does not answer is an outage the caller may retry, said in our words:
    /// the driver's text (which can name the server) stays in the log. Files and approval sort
    /// sqlx errors the same way (`kg_stores::sql::is_unreachable`).
    #[test]
    fn an_unreachable_database_is_unavailable_in_our_words() {
        let err = AuthError::from(sqlx::Error::PoolTimedOut);
        assert_eq!(err.code(), ErrorCode::Unavailable);
        let status = kg_common::error::to_status(&err);
        assert_eq!(
            status.message(),
            "the database is unreachable; retry shortly"
        );
        assert!(kg_common::error::detail(&err).contains("pool timed out"));
        assert_eq!(
            AuthError::from(sqlx::Error::RowNotFound).code(),
            ErrorCode::Internal
        );
    }
}

use kg_common::{ErrorCode, ErrorExt};

/// Errors of the approval service. Messages of non-internal variants are shown to clients.
#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    /// Bad input; the message says what to change.
    #[error("{0}")]
    Invalid(String),
    /// No such proposal.
    #[error("proposal `{0}` not found")]
    NotFound(String),
    /// The proposal was decided already (or is not in a state the call needs).
    #[error("proposal `{id}` is {state}, not pending: it cannot be decided again")]
    AlreadyDecided {
        /// The proposal.
        id: String,
        /// Its current state.
        state: &'static str,
    },
    /// Four-eyes rule: the approver is the proposer (or acts for them).
    #[error(
        "four_eyes: proposal `{id}` was proposed by `{proposer}`, who may not approve it; another admin must approve it (the proposer may still reject it)"
    )]
    FourEyes {
        /// The proposal.
        id: String,
        /// The user (or principal) behind it.
        proposer: String,
    },
    /// `execute_now` for an action that needs a human approval.
    #[error(
        "`{object}.{action}` needs a human approval: it cannot run at once; submit it as a pending proposal"
    )]
    ApprovalRequired {
        /// Object name.
        object: String,
        /// Action name.
        action: String,
    },
    /// A decision asked by anyone but a person through the admin API: an agent (or a
    /// context minted for another tool) may never approve.
    #[error(
        "only a person decides proposals, through the admin API or `kgmesh approvals` with an admin user's token; {0} may not"
    )]
    NotAPerson(String),
    /// The ontology service could not be asked; nothing ran.
    #[error(
        "the ontology service is unavailable, so the action could not be re-checked; nothing ran and the proposal is unchanged: retry shortly"
    )]
    OntologyUnavailable,
    /// The ontology service answered with an error we pass on (its message is client-safe).
    #[error("ontology: {message}")]
    Ontology {
        /// Its stable code.
        code: ErrorCode,
        /// Its message.
        message: String,
    },
    /// Caller context problems (missing, not admin).
    #[error(transparent)]
    Caller(#[from] kg_common::caller::CallerError),
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
    /// Stored data could not be decoded.
    #[error("corrupt row: {0}")]
    Corrupt(String),
    /// The service is configured wrongly (start-up).
    #[error("approval configuration: {0}")]
    Config(String),
    /// A background task failed.
    #[error("internal: {0}")]
    Internal(String),
}

impl ErrorExt for ApprovalError {
    fn code(&self) -> ErrorCode {
        match self {
            ApprovalError::Invalid(_) => ErrorCode::InvalidArgument,
            ApprovalError::NotFound(_) => ErrorCode::NotFound,
            ApprovalError::AlreadyDecided { .. } => ErrorCode::FailedPrecondition,
            ApprovalError::ApprovalRequired { .. }
            | ApprovalError::FourEyes { .. }
            | ApprovalError::NotAPerson(_) => ErrorCode::PermissionDenied,
            ApprovalError::OntologyUnavailable => ErrorCode::Unavailable,
            ApprovalError::Ontology { code, .. } => *code,
            ApprovalError::Caller(e) => e.code(),
            ApprovalError::Store(e) => e.code(),
            ApprovalError::SqlUnreachable(_) => ErrorCode::Unavailable,
            ApprovalError::Sql(_)
            | ApprovalError::Corrupt(_)
            | ApprovalError::Config(_)
            | ApprovalError::Internal(_) => ErrorCode::Internal,
        }
    }
}

impl From<sqlx::Error> for ApprovalError {
    fn from(err: sqlx::Error) -> Self {
        if kg_stores::sql::is_unreachable(&err) {
            Self::SqlUnreachable(err)
        } else {
            Self::Sql(err)
        }
    }
}

kg_common::impl_status_from!(ApprovalError);

/// `Result` of this crate.
pub type Result<T, E = ApprovalError> = std::result::Result<T, E>;

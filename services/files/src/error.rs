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
    /// A lookup target (branch, release, environment) that does not resolve.
    #[error("{0} not found")]
    TargetNotFound(String),
    /// Creating a branch, release or environment that already exists.
    #[error("{0}")]
    Exists(String),
    /// Releases and environments are managed by admins of the whole namespace.
    #[error(
        "managing releases and environments of namespace `{0}` needs admin permission on the whole namespace (an admin grant on a folder is not enough)"
    )]
    AdminDenied(String),
    /// Sweeping the blob store, shared by every namespace, is for the deployment's admins.
    #[error(
        "sweeping the blob store needs an admin of the deployment (blobs are shared by content across namespaces)"
    )]
    SweepDenied,
    /// Deleting a namespace is for the deployment's admins.
    #[error("deleting a namespace needs an admin of the deployment")]
    PurgeDenied,
    /// A write into a namespace whose deletion has not finished.
    #[error(
        "namespace `{0}` is being deleted: nothing can be written to it until the indexer has removed its graph and vectors; create it again once `kgmesh ns delete {0}` has finished"
    )]
    NamespacePurging(String),
    /// A namespace's rows were removed but the indexer could not be asked to remove the rest.
    #[error(
        "the files of namespace `{0}` were removed from the registry, but the event bus refused the request to remove its graph and vectors; run the deletion again"
    )]
    PurgeUnqueued(String),
    /// A knowledge graph page over the payload limit even before its links.
    #[error(
        "the knowledge graph page is {bytes} bytes, over the {limit}-byte limit; narrow it with root_path or root_file_version_id and a lower max_depth, filters (search, type, tags) or a lower pagination.limit"
    )]
    GraphTooLarge {
        /// Estimated JSON bytes of the page's nodes.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// Upload over the size limit.
    #[error("file is {size} bytes; the limit is {limit} bytes")]
    TooLarge {
        /// Bytes sent.
        size: usize,
        /// Configured limit.
        limit: usize,
    },
    /// The file is over the size limit of the requested query format.
    #[error(
        "file is {size} bytes, over the {limit}-byte limit of format `{format}`; read it with format text and startLine/endLine"
    )]
    QueryTooLarge {
        /// File size.
        size: i64,
        /// The limit.
        limit: u64,
        /// The format asked for.
        format: String,
    },
    /// The file content does not parse as the format needs.
    #[error("{0}")]
    BadContent(String),
    /// A query or pattern would cost more than its budget allows.
    #[error("{0}")]
    TooCostly(String),
    /// A query ran out of time.
    #[error("{0}")]
    Timeout(String),
    /// Every query slot is taken; retry shortly.
    #[error("{0}")]
    Busy(String),
    /// A query engine failed on our side; the detail stays in the logs.
    #[error("query engine: {0}")]
    Engine(String),
    /// Reading a blob or a temp file failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// The event could not be queued for indexing.
    #[error("the file was stored but could not be queued for indexing; upload it again")]
    QueueUnavailable,
    /// A reindex stopped when an event could not be queued; the files before it are queued.
    #[error(
        "queued {queued} files of this page to be indexed again, then the event bus refused the next one; send the same request again (files already queued are indexed once more, which changes nothing)"
    )]
    ReindexInterrupted {
        /// Files queued before the failure.
        queued: usize,
    },
    /// A reindex needs admin permission on the folder it names.
    #[error(
        "re-indexing `{folder}` in namespace `{namespace}` needs admin permission on that folder or above it"
    )]
    ReindexDenied {
        /// The namespace.
        namespace: String,
        /// The folder asked for ("" shown as "/").
        folder: String,
    },
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
    Sql(#[source] sqlx::Error),
    /// The database could not be reached (no connection within the pool's timeout, or the
    /// connection broke). The driver's words ride as the source, for the log only.
    #[error("the database is unreachable; retry shortly")]
    SqlUnreachable(#[source] sqlx::Error),
}

impl FilesError {
    /// A unique constraint refused a write (both SQL backends): another writer got there
    /// first, and the caller may read again and retry.
    pub(crate) fn is_unique_violation(&self) -> bool {
        matches!(self, FilesError::Sql(sqlx::Error::Database(db)) if db.is_unique_violation())
    }
}

/// Tries of a write that lost a race for a unique name ([`retry_lost_race`]).
const RACE_ATTEMPTS: u32 = 3;

/// Runs `write` again, up to [`RACE_ATTEMPTS`] tries in all, while it fails on a unique
/// constraint: another writer took the name first, and the next try reads it and joins it.
/// The loser of one race waits for the winner's commit, so a second try is normally enough.
pub(crate) async fn retry_lost_race<T, F, Fut>(mut write: F) -> Result<T, FilesError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, FilesError>>,
{
    let mut tries = 1;
    loop {
        match write().await {
            Err(err) if tries < RACE_ATTEMPTS && err.is_unique_violation() => tries += 1,
            other => return other,
        }
    }
}

impl ErrorExt for FilesError {
    fn code(&self) -> ErrorCode {
        match self {
            FilesError::Invalid(_) => ErrorCode::InvalidArgument,
            FilesError::NotFound(_) | FilesError::TargetNotFound(_) => ErrorCode::NotFound,
            FilesError::WriteDenied(_)
            | FilesError::AdminDenied(_)
            | FilesError::SweepDenied
            | FilesError::PurgeDenied
            | FilesError::ReindexDenied { .. } => ErrorCode::PermissionDenied,
            FilesError::Exists(_) => ErrorCode::AlreadyExists,
            FilesError::GraphTooLarge { .. } => ErrorCode::PayloadTooLarge,
            FilesError::TooLarge { .. } | FilesError::QueryTooLarge { .. } => {
                ErrorCode::PayloadTooLarge
            }
            FilesError::BadContent(_) | FilesError::NamespacePurging(_) => {
                ErrorCode::FailedPrecondition
            }
            FilesError::TooCostly(_) => ErrorCode::ResourceExhausted,
            FilesError::Timeout(_) => ErrorCode::Timeout,
            FilesError::Busy(_) => ErrorCode::Busy,
            FilesError::Engine(_) | FilesError::Io(_) => ErrorCode::Internal,
            FilesError::QueueUnavailable
            | FilesError::ReindexInterrupted { .. }
            | FilesError::PurgeUnqueued(_) => ErrorCode::Unavailable,
            FilesError::Caller(e) => e.code(),
            FilesError::Name(e) => e.code(),
            FilesError::Store(e) => e.code(),
            FilesError::SqlUnreachable(_) => ErrorCode::Unavailable,
            FilesError::Sql(_) => ErrorCode::Internal,
        }
    }
}

impl From<sqlx::Error> for FilesError {
    fn from(err: sqlx::Error) -> Self {
        if kg_stores::sql::is_unreachable(&err) {
            Self::SqlUnreachable(err)
        } else {
            Self::Sql(err)
        }
    }
}

kg_common::impl_status_from!(FilesError);

/// `Result` of this crate.
pub type Result<T, E = FilesError> = std::result::Result<T, E>;

//! [`StoreError`]: one error type for every store, mapped to stable codes.
//!
//! Driver text is kept for logs only: the `Display` of the variants a client may see
//! (`Unavailable`, `Timeout`, `NotFound`, `InvalidInput`, `AlreadyExists`) never contains it;
//! it rides along as the error `source` (print with `{:#}` in anyhow, or call
//! [`StoreError::detail`]). `Internal`-coded variants may show it, since kg-common masks
//! their message before it leaves a service.

use std::fmt;

use kg_common::error::{ErrorCode, ErrorExt};

/// A boxed driver error kept as the `source` of a [`StoreError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Which store an error came from; part of the client-safe message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// FalkorDB.
    Graph,
    /// SQLite or PostgreSQL through sqlx.
    Sql,
    /// NATS JetStream.
    Events,
    /// The local blob directory.
    Blobs,
}

impl fmt::Display for StoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StoreKind::Graph => "graph store",
            StoreKind::Sql => "sql store",
            StoreKind::Events => "event bus",
            StoreKind::Blobs => "blob store",
        })
    }
}

/// Errors of every store in this crate.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be reached (connection refused or dropped, pool closed).
    #[error("{store} is unavailable")]
    Unavailable {
        /// Which store.
        store: StoreKind,
        /// The driver error, for logs.
        #[source]
        source: BoxError,
    },
    /// The store did not answer in time (query timeout, pool wait, ack wait).
    #[error("{store} timed out")]
    Timeout {
        /// Which store.
        store: StoreKind,
        /// The driver error, for logs.
        #[source]
        source: BoxError,
    },
    /// The thing asked for does not exist; `what` is a client-safe noun ("blob", "row").
    #[error("{what} not found")]
    NotFound {
        /// What was missing.
        what: String,
    },
    /// The caller passed a value the store cannot accept (a malformed blob key, a parameter
    /// FalkorDB cannot encode, an unsafe subject token). The reason is ours, not the driver's.
    #[error("invalid {what}: {reason}")]
    InvalidInput {
        /// What was invalid.
        what: &'static str,
        /// Why, in our words.
        reason: String,
    },
    /// A unique constraint rejected an insert.
    #[error("{what} already exists")]
    AlreadyExists {
        /// What already existed, client-safe.
        what: String,
        /// The driver error, for logs.
        #[source]
        source: BoxError,
    },
    /// FalkorDB rejected a Cypher query (syntax, type or runtime error). Coded `Internal`;
    /// a service that runs caller-written Cypher (kg_cypher) matches this variant and decides
    /// itself what to show.
    #[error("graph query failed: {detail}")]
    GraphQuery {
        /// FalkorDB's message.
        detail: String,
    },
    /// Any other store failure (SQL error, migration failure, I/O, bad reply).
    #[error("{store} failed: {detail}")]
    Internal {
        /// Which store.
        store: StoreKind,
        /// The driver text.
        detail: String,
    },
    /// A full-text index FalkorDB is still building (after a restart, or just recreated): a
    /// search over it would miss nodes without an error. Coded `Unavailable`; the message is
    /// client-safe.
    #[error(
        "the full-text index on {label} is still being built (FalkorDB restarted, or the index \
         was recreated); retry in a few seconds"
    )]
    IndexBuilding {
        /// The indexed label (`Chunk`, `Entity`).
        label: String,
    },
    /// The database holds migrations of this service that this release does not know: a
    /// newer release upgraded it. Coded `FailedPrecondition`.
    #[error(
        "the database was upgraded by a newer kgmesh (migrations {} are unknown to this \
         release); run that release or a newer one, or restore a backup taken before the upgrade",
        versions.iter().map(i64::to_string).collect::<Vec<_>>().join(", ")
    )]
    SchemaNewer {
        /// The unknown versions.
        versions: Vec<i64>,
    },
    /// No virtualenv with the embedded servers was found.
    #[error(
        "python virtualenv with the embedded servers not found ({detail}); run deploy/scripts/dev-deps.sh \
         or set KGMESH_VENV"
    )]
    VenvMissing {
        /// Where we looked.
        detail: String,
    },
    /// An embedded server (for tests and `kgmesh up`) could not be started.
    #[error("embedded {server} did not start: {detail}")]
    Embedded {
        /// "falkordb", "nats-server" or "postgres".
        server: &'static str,
        /// What went wrong, including the tail of its log file when there is one.
        detail: String,
    },
}

impl StoreError {
    /// Full text for logs: the message plus every source in the chain.
    pub fn detail(&self) -> String {
        kg_common::error::detail(self)
    }

    /// The store could not be reached or refused the call; callers may retry.
    pub fn unavailable(store: StoreKind, source: impl Into<BoxError>) -> Self {
        StoreError::Unavailable {
            store,
            source: source.into(),
        }
    }

    pub(crate) fn timeout(store: StoreKind, source: impl Into<BoxError>) -> Self {
        StoreError::Timeout {
            store,
            source: source.into(),
        }
    }

    /// The store answered something this code cannot use; `detail` is for logs only.
    pub fn internal(store: StoreKind, detail: impl fmt::Display) -> Self {
        StoreError::Internal {
            store,
            detail: detail.to_string(),
        }
    }

    pub(crate) fn embedded(server: &'static str, detail: impl fmt::Display) -> Self {
        StoreError::Embedded {
            server,
            detail: detail.to_string(),
        }
    }
}

impl ErrorExt for StoreError {
    fn code(&self) -> ErrorCode {
        match self {
            StoreError::Unavailable { .. } | StoreError::IndexBuilding { .. } => {
                ErrorCode::Unavailable
            }
            StoreError::Timeout { .. } => ErrorCode::Timeout,
            StoreError::SchemaNewer { .. } => ErrorCode::FailedPrecondition,
            StoreError::NotFound { .. } => ErrorCode::NotFound,
            StoreError::InvalidInput { .. } => ErrorCode::InvalidArgument,
            StoreError::AlreadyExists { .. } => ErrorCode::AlreadyExists,
            StoreError::GraphQuery { .. }
            | StoreError::Internal { .. }
            | StoreError::VenvMissing { .. }
            | StoreError::Embedded { .. } => ErrorCode::Internal,
        }
    }
}

kg_common::impl_status_from!(StoreError);

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn client_visible_messages_hide_driver_text() {
        let secret = "connect to postgres://admin:hunter2@db:5432 refused";
        let errors = [
            StoreError::unavailable(StoreKind::Sql, secret),
            StoreError::timeout(StoreKind::Graph, secret),
            StoreError::AlreadyExists {
                what: "user".into(),
                source: secret.into(),
            },
        ];
        for err in errors {
            assert!(!err.to_string().contains("hunter2"), "{err}");
            assert!(
                err.detail().contains("hunter2"),
                "detail keeps the driver text"
            );
            let status = tonic::Status::from(err);
            assert!(!status.message().contains("hunter2"));
        }
    }

    #[test]
    fn internal_errors_are_masked_in_status() {
        let err = StoreError::internal(StoreKind::Sql, "syntax error at or near \"SELEC\"");
        assert_eq!(err.code(), ErrorCode::Internal);
        let status = tonic::Status::from(err);
        assert!(!status.message().contains("SELEC"));
        assert_eq!(status.code(), tonic::Code::Internal);
    }

    #[test]
    fn codes_follow_the_table() {
        assert_eq!(
            StoreError::unavailable(StoreKind::Events, "x").code(),
            ErrorCode::Unavailable
        );
        assert_eq!(
            StoreError::timeout(StoreKind::Events, "x").code(),
            ErrorCode::Timeout
        );
        assert_eq!(
            StoreError::NotFound {
                what: "blob".into()
            }
            .code(),
            ErrorCode::NotFound
        );
        assert_eq!(
            StoreError::InvalidInput {
                what: "blob key",
                reason: "x".into()
            }
            .code(),
            ErrorCode::InvalidArgument
        );
        assert_eq!(
            StoreError::GraphQuery { detail: "x".into() }.code(),
            ErrorCode::Internal
        );
        assert_eq!(
            StoreError::embedded("nats-server", "x").code(),
            ErrorCode::Internal
        );
    }
}

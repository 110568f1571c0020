//! [`RetrievalError`]: every way a search can fail, each with its stable code.

use kg_common::access::NameError;
use kg_common::caller::CallerError;
use kg_common::error::{ErrorCode, ErrorExt};
use kg_common::grpc::ServeError;
use kg_embed::EmbedError;
use kg_stores::StoreError;
use kg_stores::vector::VectorError;

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
    /// The embedder failed. Its text (an endpoint address, the start of an answer) is kept
    /// for the log ([`RetrievalError::detail`]); the message names only what failed.
    #[error("{}", embed_summary(.0))]
    Embed(#[source] EmbedError),
    /// The vector index (dense or sparse) failed. Its client-visible variants hold no engine
    /// text, and the `Internal` one is masked before it leaves the service.
    #[error(transparent)]
    Vector(#[from] VectorError),
    /// The service was built with parts that do not fit together.
    #[error("{0}")]
    Config(String),
    /// The namespace graph holds `label` nodes but not their full-text index, so a full-text
    /// search would find nothing whatever the query; never reported as "no hits".
    #[error(
        "the full-text index on {label} is missing in this namespace, so text search cannot run \
         there; re-index the namespace to rebuild it"
    )]
    IndexMissing {
        /// The indexed label (`Chunk`, `Entity`).
        label: &'static str,
    },
    /// The call needs a part this deployment does not have (entity search by vector without
    /// an embedder).
    #[error("{0}")]
    FailedPrecondition(String),
    /// A lane or side was still running when the time the caller allows ran out
    /// ([`crate::deadline`]).
    #[error("did not finish within the {budget_ms} ms the call allows")]
    OutOfTime {
        /// The time it had.
        budget_ms: u64,
    },
}

/// Stable trace code of a lane or side whose full-text index is missing.
pub(crate) const INDEX_MISSING: &str = "index_missing";

impl RetrievalError {
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        RetrievalError::InvalidArgument(message.into())
    }

    /// The error with its sources, for the server log only: the embedder's text (its API key
    /// already masked) and driver errors ride along as sources, never in the message.
    pub(crate) fn detail(&self) -> String {
        kg_common::error::detail(self)
    }

    /// The code a soft-failed lane reports in its trace: [`INDEX_MISSING`] for a missing
    /// index (more telling than its `failed_precondition`), else the error code.
    pub(crate) fn trace_code(&self) -> &'static str {
        match self {
            RetrievalError::IndexMissing { .. } => INDEX_MISSING,
            other => other.code().as_str(),
        }
    }

    /// What a trace says about a soft-failed lane or side (`what`: "the fulltext lane").
    /// Only messages written for the caller pass through; anything else may hold store or
    /// embedder detail (an address, a query), so it stays in the log and the caller gets
    /// the code.
    pub(crate) fn trace_message(&self, what: &str) -> String {
        match self {
            RetrievalError::IndexMissing { .. }
            | RetrievalError::FailedPrecondition(_)
            | RetrievalError::Store(StoreError::IndexBuilding { .. }) => self.to_string(),
            RetrievalError::OutOfTime { .. } => format!("{what} {self}"),
            other if other.code().retryable() => format!(
                "{what} failed ({}); retry shortly, the details are in the server log",
                other.code().as_str()
            ),
            other => format!(
                "{what} failed ({}); the details are in the server log",
                other.code().as_str()
            ),
        }
    }
}

impl ErrorExt for RetrievalError {
    fn code(&self) -> ErrorCode {
        match self {
            RetrievalError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            RetrievalError::Caller(err) => err.code(),
            RetrievalError::Name(err) => err.code(),
            RetrievalError::Store(err) => err.code(),
            RetrievalError::Embed(err) => err.code(),
            RetrievalError::Vector(err) => err.code(),
            RetrievalError::IndexMissing { .. } | RetrievalError::FailedPrecondition(_) => {
                ErrorCode::FailedPrecondition
            }
            RetrievalError::OutOfTime { .. } => ErrorCode::Timeout,
            RetrievalError::UnexpectedReply(_)
            | RetrievalError::Serve(_)
            | RetrievalError::Config(_) => ErrorCode::Internal,
        }
    }
}

/// What a client may read of an embedder failure: the kind and, for an HTTP endpoint, its
/// status, never the endpoint or its answer.
fn embed_summary(err: &EmbedError) -> String {
    match err {
        EmbedError::Config(_) | EmbedError::Model(_) => {
            "the embedder is not set up correctly; the details are in the server log".to_owned()
        }
        EmbedError::Unavailable(_) => {
            "the embedding endpoint is unavailable; retry shortly".to_owned()
        }
        EmbedError::Status { status, .. } => {
            format!("the embedding endpoint answered HTTP {status}")
        }
        EmbedError::Inference(_) | EmbedError::InvalidResponse(_) => {
            "the embedder failed; the details are in the server log".to_owned()
        }
    }
}

kg_common::impl_status_from!(RetrievalError);

/// Shorthand for results of this crate.
pub type Result<T, E = RetrievalError> = std::result::Result<T, E>;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn backend_text_stays_in_the_log_and_codes_follow_the_backend() {
        let cases = [
            (
                RetrievalError::Embed(EmbedError::Unavailable(
                    "error sending request for url (http://10.1.2.3:8081/v1/embeddings)".into(),
                )),
                ErrorCode::Unavailable,
                "10.1.2.3",
            ),
            (
                RetrievalError::Embed(EmbedError::Status {
                    status: 429,
                    detail: "{\"error\":\"quota of team-7 exceeded\"}".into(),
                }),
                ErrorCode::Unavailable,
                "team-7",
            ),
            (
                RetrievalError::Embed(EmbedError::InvalidResponse("<html>proxy</html>".into())),
                ErrorCode::Internal,
                "proxy",
            ),
            (
                RetrievalError::Vector(VectorError::Internal {
                    detail: "qdrant: 500 segment /var/lib/q failed".into(),
                }),
                ErrorCode::Internal,
                "/var/lib/q",
            ),
        ];
        for (err, code, secret) in cases {
            assert_eq!(err.code(), code, "{err:?}");
            assert!(err.detail().contains(secret), "the log keeps it: {err:?}");
            let shown = tonic::Status::from(err);
            assert!(!shown.message().contains(secret), "{}", shown.message());
        }
    }

    #[test]
    fn a_lane_that_failed_for_a_while_says_to_retry() {
        let dead = RetrievalError::Store(StoreError::unavailable(
            kg_stores::error::StoreKind::Graph,
            "connection refused 10.0.0.9:6379",
        ));
        assert_eq!(
            dead.trace_message("the fulltext lane"),
            "the fulltext lane failed (unavailable); retry shortly, the details are in the server log"
        );
        let building = RetrievalError::Store(StoreError::IndexBuilding {
            label: "Chunk".into(),
        });
        assert_eq!(building.trace_code(), "unavailable");
        assert!(
            building
                .trace_message("the fulltext lane")
                .starts_with("the full-text index on Chunk is still being built"),
        );
        let broken = RetrievalError::UnexpectedReply("row [1]".into());
        assert_eq!(
            broken.trace_message("the fulltext lane"),
            "the fulltext lane failed (internal); the details are in the server log"
        );
    }
}

//! The single table of stable error codes, and the one place a `tonic::Status` is built.
//!
//! Every crate's error type names an [`ErrorCode`] through [`ErrorExt`]; the code
//! decides the gRPC code, the admin-REST status, whether a retry may help, and
//! whether the message may be shown to a client. The gateway reads the code back
//! from status metadata, never from message text.

use std::fmt;

use tonic::metadata::MetadataValue;

/// Metadata key carrying the stable error code on every non-OK status.
pub const ERROR_CODE_METADATA_KEY: &str = "x-kg-error-code";
/// Metadata key carrying "true"/"false": may the same call succeed if retried.
pub const RETRYABLE_METADATA_KEY: &str = "x-kg-retryable";

/// Stable error codes shared by every service, the gateway and MCP clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The request is malformed or names an impossible value.
    InvalidArgument,
    /// No valid credential or caller context.
    Unauthenticated,
    /// The caller is known but may not do this.
    PermissionDenied,
    /// The thing named does not exist (or the caller may not know it exists).
    NotFound,
    /// Creating something that already exists.
    AlreadyExists,
    /// The system is not in a state that allows the call.
    FailedPrecondition,
    /// A cap or quota was exceeded (over a hard maximum, too many results).
    ResourceExhausted,
    /// The answer would be larger than the payload limit.
    PayloadTooLarge,
    /// A dependency is down or unreachable; retry later.
    Unavailable,
    /// A bounded queue is full; retry later.
    Busy,
    /// The call ran out of time.
    Timeout,
    /// A fault on our side; details are in the logs, never in the message.
    Internal,
}

impl ErrorCode {
    /// Every code, for tables and exhaustive tests.
    pub const ALL: [ErrorCode; 12] = [
        ErrorCode::InvalidArgument,
        ErrorCode::Unauthenticated,
        ErrorCode::PermissionDenied,
        ErrorCode::NotFound,
        ErrorCode::AlreadyExists,
        ErrorCode::FailedPrecondition,
        ErrorCode::ResourceExhausted,
        ErrorCode::PayloadTooLarge,
        ErrorCode::Unavailable,
        ErrorCode::Busy,
        ErrorCode::Timeout,
        ErrorCode::Internal,
    ];

    /// The stable snake_case string clients see as `code`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::NotFound => "not_found",
            ErrorCode::AlreadyExists => "already_exists",
            ErrorCode::FailedPrecondition => "failed_precondition",
            ErrorCode::ResourceExhausted => "resource_exhausted",
            ErrorCode::PayloadTooLarge => "PAYLOAD_TOO_LARGE",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Busy => "busy",
            ErrorCode::Timeout => "timeout",
            ErrorCode::Internal => "internal",
        }
    }

    /// Parses the string form back; unknown strings are `None`.
    pub fn parse(code: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == code)
    }

    /// The gRPC code a status with this error carries.
    pub fn grpc_code(self) -> tonic::Code {
        match self {
            ErrorCode::InvalidArgument => tonic::Code::InvalidArgument,
            ErrorCode::Unauthenticated => tonic::Code::Unauthenticated,
            ErrorCode::PermissionDenied => tonic::Code::PermissionDenied,
            ErrorCode::NotFound => tonic::Code::NotFound,
            ErrorCode::AlreadyExists => tonic::Code::AlreadyExists,
            ErrorCode::FailedPrecondition => tonic::Code::FailedPrecondition,
            ErrorCode::ResourceExhausted | ErrorCode::PayloadTooLarge => {
                tonic::Code::ResourceExhausted
            }
            ErrorCode::Unavailable | ErrorCode::Busy => tonic::Code::Unavailable,
            ErrorCode::Timeout => tonic::Code::DeadlineExceeded,
            ErrorCode::Internal => tonic::Code::Internal,
        }
    }

    /// The HTTP status of the admin REST API for this error.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidArgument => 400,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::PermissionDenied => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::AlreadyExists | ErrorCode::FailedPrecondition => 409,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::ResourceExhausted | ErrorCode::Busy => 429,
            ErrorCode::Unavailable => 503,
            ErrorCode::Timeout => 504,
            ErrorCode::Internal => 500,
        }
    }

    /// Whether the same call may succeed later without changes.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::Unavailable | ErrorCode::Busy | ErrorCode::Timeout
        )
    }

    /// Server faults are logged at error level and their detail is masked.
    pub fn is_server_fault(self) -> bool {
        matches!(self, ErrorCode::Internal)
    }

    /// Best-effort reverse mapping for statuses that carry no code metadata
    /// (transport failures, other servers).
    pub fn from_grpc_code(code: tonic::Code) -> ErrorCode {
        match code {
            tonic::Code::InvalidArgument | tonic::Code::OutOfRange => ErrorCode::InvalidArgument,
            tonic::Code::Unauthenticated => ErrorCode::Unauthenticated,
            tonic::Code::PermissionDenied => ErrorCode::PermissionDenied,
            tonic::Code::NotFound => ErrorCode::NotFound,
            tonic::Code::AlreadyExists => ErrorCode::AlreadyExists,
            tonic::Code::FailedPrecondition | tonic::Code::Aborted => ErrorCode::FailedPrecondition,
            tonic::Code::ResourceExhausted => ErrorCode::ResourceExhausted,
            tonic::Code::Unavailable | tonic::Code::Cancelled => ErrorCode::Unavailable,
            tonic::Code::DeadlineExceeded => ErrorCode::Timeout,
            _ => ErrorCode::Internal,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Implemented by every crate's error type.
pub trait ErrorExt: std::error::Error {
    /// The stable code of this error.
    fn code(&self) -> ErrorCode;
}

/// Message shown to clients for server faults; the detail stays in the logs.
pub const INTERNAL_MESSAGE: &str = "internal error; the details are in the server log";

/// Builds the `tonic::Status` for an error. The only builder of error statuses.
pub fn to_status<E: ErrorExt + ?Sized>(err: &E) -> tonic::Status {
    let code = err.code();
    let message = if code.is_server_fault() {
        tracing::error!(error = %detail(err), code = %code, "request failed");
        INTERNAL_MESSAGE.to_owned()
    } else {
        err.to_string()
    };
    status_with_code(code, message)
}

/// An error's message and every source in its chain, for logs only: driver and endpoint text
/// rides along as a source and never in a client-visible message.
pub fn detail<E: std::error::Error + ?Sized>(err: &E) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

/// A status for a code and a client-safe message.
pub fn status_with_code(code: ErrorCode, message: impl Into<String>) -> tonic::Status {
    let mut status = tonic::Status::new(code.grpc_code(), message);
    let metadata = status.metadata_mut();
    metadata.insert(
        ERROR_CODE_METADATA_KEY,
        MetadataValue::from_static(code.as_str()),
    );
    metadata.insert(
        RETRYABLE_METADATA_KEY,
        MetadataValue::from_static(if code.retryable() { "true" } else { "false" }),
    );
    status
}

/// Reads the stable code of a status: its metadata when present, else the gRPC code.
pub fn code_of(status: &tonic::Status) -> ErrorCode {
    status
        .metadata()
        .get(ERROR_CODE_METADATA_KEY)
        .and_then(|v| v.to_str().ok())
        .and_then(ErrorCode::parse)
        .unwrap_or_else(|| ErrorCode::from_grpc_code(status.code()))
}

/// Implements `From<$t> for tonic::Status` through [`to_status`].
#[macro_export]
macro_rules! impl_status_from {
    ($t:ty) => {
        impl From<$t> for ::tonic::Status {
            fn from(err: $t) -> ::tonic::Status {
                $crate::error::to_status(&err)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Demo(&'static str, ErrorCode);

    impl ErrorExt for Demo {
        fn code(&self) -> ErrorCode {
            self.1
        }
    }

    #[test]
    fn every_code_round_trips_through_a_status() {
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
            let status = to_status(&Demo("boom at postgres://secret@db", code));
            assert_eq!(code_of(&status), code);
            assert_eq!(status.code(), code.grpc_code());
            assert!((100..600).contains(&code.http_status()));
        }
    }

    #[test]
    fn internal_detail_is_masked() {
        let status = to_status(&Demo(
            "connection to postgres://u:pw@h failed",
            ErrorCode::Internal,
        ));
        assert_eq!(status.message(), INTERNAL_MESSAGE);
        let status = to_status(&Demo("namespace `x` is unknown", ErrorCode::NotFound));
        assert_eq!(status.message(), "namespace `x` is unknown");
    }

    #[test]
    fn statuses_without_metadata_map_by_grpc_code() {
        let status = tonic::Status::unavailable("tcp connect error");
        assert_eq!(code_of(&status), ErrorCode::Unavailable);
        assert!(code_of(&status).retryable());
    }
}

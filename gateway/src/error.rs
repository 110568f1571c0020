//! The gateway's own errors (start-up and serving), and the one error shape
//! clients see from tool calls and the admin REST API.

use kg_common::error::{ERROR_CODE_METADATA_KEY, INTERNAL_MESSAGE, code_of};
use kg_common::sanitize::sanitize_text;
use kg_common::{ErrorCode, ErrorExt};
use serde_json::{Value, json};

/// Why the gateway could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The configuration is invalid; the message lists every problem.
    #[error("invalid gateway configuration: {0}")]
    Config(String),
    /// The HTTP server failed.
    #[error("http server failed: {0}")]
    Serve(#[source] std::io::Error),
    /// The stdio MCP server failed to start or stopped abnormally.
    #[error("stdio MCP server failed: {0}")]
    Stdio(String),
}

impl ErrorExt for GatewayError {
    fn code(&self) -> ErrorCode {
        match self {
            GatewayError::Config(_) => ErrorCode::InvalidArgument,
            GatewayError::Serve(_) | GatewayError::Stdio(_) => ErrorCode::Internal,
        }
    }
}

kg_common::impl_status_from!(GatewayError);

/// Longest error message a client is shown, in characters.
const MAX_MESSAGE_CHARS: usize = 2000;

/// A client-visible failure: a stable code and a message safe to show.
/// Built only through the constructors below, so internal detail never leaks.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ClientError {
    pub(crate) code: ErrorCode,
    pub(crate) message: String,
}

impl ClientError {
    /// A code with a client-safe message; server faults get the generic message. Every
    /// message is sanitised and capped here, the one way out: a backend's message can quote
    /// a stored value (a JSONata error quotes the string it could not convert).
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        let message = if code.is_server_fault() {
            INTERNAL_MESSAGE.to_owned()
        } else {
            sanitize_text(&message.into(), MAX_MESSAGE_CHARS)
        };
        Self { code, message }
    }

    /// Bad arguments; the message says what to change.
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, message)
    }

    /// A status from backend `service`. Statuses carrying our code metadata have
    /// client-safe messages already; bare ones come from the transport.
    pub(crate) fn from_status(service: &str, status: &tonic::Status) -> Self {
        if broke_off(status) {
            tracing::warn!(service, grpc_code = ?status.code(), message = status.message(), cause = %causes(status), "backend connection broke off mid-call");
            return Self::new(
                ErrorCode::Unavailable,
                format!("the {service} service stopped answering mid-call; retry shortly"),
            );
        }
        let code = code_of(status);
        if code.is_server_fault() {
            tracing::error!(service, grpc_code = ?status.code(), message = status.message(), cause = %causes(status), "backend call failed");
            return Self::new(code, "");
        }
        if status.metadata().get(ERROR_CODE_METADATA_KEY).is_some() {
            return Self::new(code, status.message());
        }
        tracing::warn!(service, grpc_code = ?status.code(), message = status.message(), cause = %causes(status), "backend unreachable or failed");
        let message = match code {
            ErrorCode::Unavailable => {
                format!("the {service} service is unavailable; retry shortly")
            }
            ErrorCode::Timeout => {
                format!("the {service} service did not answer in time; retry shortly")
            }
            // The transport's own words (a decode error, a size limit) are logged above,
            // not shown: they are not written for the caller.
            _ => format!(
                "the {service} service failed ({}); the details are in the gateway log",
                code.as_str()
            ),
        };
        Self::new(code, message)
    }

    /// The `{code, message, retryable}` body.
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "code": self.code.as_str(),
            "message": self.message,
            "retryable": self.code.retryable(),
        })
    }
}

/// Whether a status is the client transport's own report of a connection that broke under the
/// call (the backend stopped, was killed or evicted), rather than an answer from the backend:
/// no code of ours, and a transport error beneath it.
fn broke_off(status: &tonic::Status) -> bool {
    status.metadata().get(ERROR_CODE_METADATA_KEY).is_none()
        && matches!(
            status.code(),
            tonic::Code::Unknown | tonic::Code::Cancelled | tonic::Code::Internal
        )
        && std::error::Error::source(status).is_some()
}

/// The transport's chain of causes under a status ("tcp connect error" alone hides the
/// address and the OS error beneath it), for the log; empty when there is none.
fn causes(status: &tonic::Status) -> String {
    let mut chain = Vec::new();
    let mut source = std::error::Error::source(status);
    while let Some(err) = source {
        chain.push(err.to_string());
        source = err.source();
    }
    chain.join(": ")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use kg_common::error::status_with_code;

    #[tokio::test]
    async fn an_unreachable_backend_is_logged_with_the_cause_beneath_the_status() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let channel = kg_common::grpc::channel(&addr).unwrap();
        let status = kg_proto::v1::auth_client::AuthClient::new(channel)
            .signing_key(kg_proto::v1::SigningKeyRequest {})
            .await
            .unwrap_err();
        let cause = causes(&status);
        assert!(cause.to_lowercase().contains("refused"), "{cause}");
    }

    /// A backend that stops mid-call (the process killed, a pod evicted) breaks the connection
    /// under the call: that is an outage to retry, not an internal error.
    #[tokio::test]
    async fn a_backend_that_stops_mid_call_is_unavailable_and_retryable() {
        use tokio::io::AsyncReadExt as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            // The connection preface and the request's first frames, then gone.
            let mut buf = vec![0u8; 64];
            let _ = socket.read(&mut buf).await;
            drop(socket);
        });
        let channel = kg_common::grpc::channel(&addr).unwrap();
        let status = kg_proto::v1::auth_client::AuthClient::new(channel)
            .signing_key(kg_proto::v1::SigningKeyRequest {})
            .await
            .unwrap_err();
        let err = ClientError::from_status("files", &status);
        assert_eq!(err.code, ErrorCode::Unavailable, "{status:?}");
        assert!(err.message.contains("retry shortly"), "{}", err.message);
    }

    #[test]
    fn a_backend_message_quoting_stored_text_is_sanitised_and_capped() {
        let quoted = format!(
            "the JSONata expression failed: Cannot convert '{}\u{202E}evil\u{E0041}' to number",
            "x".repeat(70_000)
        );
        let err = ClientError::from_status(
            "files",
            &status_with_code(ErrorCode::InvalidArgument, quoted),
        );
        assert_eq!(err.code, ErrorCode::InvalidArgument);
        assert_eq!(err.message.chars().count(), MAX_MESSAGE_CHARS + 1);
        assert!(err.message.ends_with('…'));
        let short = ClientError::invalid("bad '\u{202E}value\u{200B}'");
        assert_eq!(short.message, "bad 'value'");
    }

    #[test]
    fn coded_statuses_keep_their_message_and_internal_is_masked() {
        let err = ClientError::from_status(
            "graph",
            &status_with_code(ErrorCode::NotFound, "chunk `c1` not found"),
        );
        assert_eq!(err.code, ErrorCode::NotFound);
        assert_eq!(err.message, "chunk `c1` not found");

        let err = ClientError::from_status(
            "graph",
            &tonic::Status::internal("postgres://u:pw@db exploded"),
        );
        assert_eq!(err.code, ErrorCode::Internal);
        assert_eq!(err.message, INTERNAL_MESSAGE);

        let err = ClientError::from_status(
            "retrieval",
            &tonic::Status::unavailable("tcp connect error"),
        );
        assert_eq!(
            err.to_json(),
            json!({
                "code": "unavailable",
                "message": "the retrieval service is unavailable; retry shortly",
                "retryable": true,
            })
        );

        let err = ClientError::from_status(
            "retrieval",
            &tonic::Status::resource_exhausted("decoded message length too large: 5000 > 4096"),
        );
        assert_eq!(
            err.code,
            ErrorCode::from_grpc_code(tonic::Code::ResourceExhausted)
        );
        assert!(!err.message.contains("5000"), "{}", err.message);
        assert!(
            err.message.starts_with("the retrieval service failed ("),
            "{}",
            err.message
        );
    }
}

//! kg-gateway: the only door agents and admins use. It owns the MCP server
//! (Streamable HTTP at `/mcp`, and stdio), the tool registry and the fan-out
//! behind each tool, `/health`, `/metrics`, protected-resource metadata and the
//! admin REST API, and the audit trail of every tool call. It authorizes every
//! request with auth and talks gRPC to auth, files, retrieval and graph with
//! the signed caller context; it never touches a store. It serves plain HTTP, or HTTPS with
//! its own certificate (`[http_tls]`).
//! Entry points: [`serve`], [`serve_stdio`], [`router`].

mod audit;
mod config;
mod error;
mod http;
mod mcp;
mod metrics;
mod state;
pub mod tbox_json;
mod tls;

use axum::serve::{ListenerExt as _, TapIo};
use rmcp::ServiceExt as _;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

pub use config::{BackendAddrs, DEFAULT_MAX_UPLOAD_BYTES, GatewayConfig};
pub use error::GatewayError;
pub use http::router;
pub use state::GatewayState;

/// Serves the HTTP gateway on `listener` until `shutdown` fires, then closes
/// MCP sessions and drains in-flight requests.
pub async fn serve(
    config: GatewayConfig,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), GatewayError> {
    let https = config.https.clone();
    let state = GatewayState::new(config, shutdown.child_token())?;
    if let Ok(addr) = listener.local_addr() {
        let scheme = if https.is_some() { "https" } else { "http" };
        tracing::info!(%addr, scheme, "gateway listening; MCP at /mcp");
    }
    match https {
        Some(files) => {
            let listener = tls::TlsListener::spawn(listener, &files, shutdown.child_token())?;
            axum::serve(listener, router(state))
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await
        }
        None => {
            axum::serve(nodelay(listener), router(state))
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await
        }
    }
    .map_err(GatewayError::Serve)
}

/// Accepted connections with TCP_NODELAY: rmcp answers a POST as a stream (headers, then the
/// event), and under Nagle the second write waits for the client's delayed ACK, ~40 ms per
/// MCP call on Linux.
fn nodelay(listener: TcpListener) -> TapIo<TcpListener, fn(&mut TcpStream)> {
    fn set_nodelay(tcp: &mut TcpStream) {
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::debug!(error = %err, "TCP_NODELAY not set on an accepted connection");
        }
    }
    listener.tap_io(set_nodelay)
}

/// Serves MCP over stdin/stdout with a fixed PAT, authorized on every tool
/// call. stdout carries only JSON-RPC frames; diagnostics go to stderr.
pub async fn serve_stdio(config: GatewayConfig, token: String) -> Result<(), GatewayError> {
    serve_stdio_with_role(config, token, None).await
}

/// [`serve_stdio`] with the role the launcher asserts for generated tools
/// (`--role`; None: read tools only).
pub async fn serve_stdio_with_role(
    config: GatewayConfig,
    token: String,
    role: Option<String>,
) -> Result<(), GatewayError> {
    let role = role.unwrap_or_default();
    if !role.is_empty() {
        kg_common::caller::check_role_name(&role)
            .map_err(|problem| GatewayError::Config(format!("--role {problem}")))?;
    }
    let state = GatewayState::new(config, CancellationToken::new())?;
    // A token auth refuses fails every call: say so now, to the person starting the server,
    // rather than to the model on each call. Auth not answering yet is no verdict: each call
    // is authorized as it comes anyway.
    match state
        .authorize(&token, kg_common::caller::MCP_TOOL, Some(&role))
        .await
    {
        Err(err) if err.code == kg_common::ErrorCode::Unauthenticated => {
            return Err(GatewayError::Stdio(format!(
                "the token (KGMESH_TOKEN or --token) is not accepted by this mesh: {}",
                err.message
            )));
        }
        Err(err) => tracing::warn!(code = %err.code, "could not check the token at start"),
        Ok(_) => {}
    }
    let server = mcp::McpServer::for_launcher(state, mcp::ToolRegistry::builtin(), token, role);
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|err| GatewayError::Stdio(err.to_string()))?;
    let reason = running
        .waiting()
        .await
        .map_err(|err| GatewayError::Stdio(err.to_string()))?;
    tracing::info!(?reason, "stdio MCP session ended");
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use axum::serve::Listener as _;

    use super::*;

    #[tokio::test]
    async fn accepted_connections_have_tcp_nodelay() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut accepted = nodelay(listener);
        let _client = TcpStream::connect(addr).await.unwrap();
        let (stream, _) = accepted.accept().await;
        assert!(stream.nodelay().unwrap());
    }
}

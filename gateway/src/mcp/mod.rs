//! The MCP server: one `ServerHandler` over a data-driven tool registry, used
//! by both the Streamable HTTP service and the stdio transport.

mod args;
mod package;
mod registry;
mod search;
mod tools;

use std::sync::Arc;
use std::time::Instant;

use kg_common::ErrorCode;
use kg_common::metrics::{ToolLabels, metrics};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};

pub(crate) use registry::ToolRegistry;

use crate::error::ClientError;
use crate::state::{Caller, GatewayState};

const INSTRUCTIONS: &str = "kgmesh knowledge graph. Start with kg_namespaces to see what you may read, kg_search to find chunks \
that answer a question, kg_open to read a chunk, section, entity's mentions or file by key, and kg_outline for a file's table of contents. \
Quote the citation field of each package you use.";

/// Where a tool call's credentials come from.
#[derive(Clone)]
enum Credentials {
    /// Authorized per HTTP request by the bearer middleware; the caller rides
    /// in the request's `http::request::Parts` extensions.
    Http,
    /// A fixed PAT (stdio): authorized with auth on every tool call.
    Token(Arc<str>),
}

/// The gateway's MCP server.
#[derive(Clone)]
pub(crate) struct McpServer {
    state: GatewayState,
    registry: ToolRegistry,
    credentials: Credentials,
}

impl McpServer {
    /// A server whose callers were authorized by the HTTP middleware.
    pub(crate) fn for_http(state: GatewayState, registry: ToolRegistry) -> Self {
        Self {
            state,
            registry,
            credentials: Credentials::Http,
        }
    }

    /// A server that authorizes `token` on every tool call.
    pub(crate) fn for_token(state: GatewayState, registry: ToolRegistry, token: String) -> Self {
        Self {
            state,
            registry,
            credentials: Credentials::Token(token.into()),
        }
    }

    async fn caller(
        &self,
        tool: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<Caller, ClientError> {
        match &self.credentials {
            Credentials::Http => context
                .extensions
                .get::<http::request::Parts>()
                .and_then(|parts| parts.extensions.get::<Caller>())
                .cloned()
                // Fail closed: no authorized caller means no access at all.
                .ok_or_else(|| {
                    ClientError::new(
                        ErrorCode::Unauthenticated,
                        "no authorized caller: send a valid bearer token",
                    )
                }),
            Credentials::Token(token) => self.state.authorize(token, tool).await,
        }
    }
}

/// The tool result for a failure: `isError` with `{code, message, retryable}`.
pub(crate) fn error_result(err: &ClientError) -> CallToolResult {
    CallToolResult::structured_error(err.to_json())
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("kgmesh", env!("CARGO_PKG_VERSION"))
                    .with_title("kgmesh knowledge graph"),
            )
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.registry.tools()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.registry.get(name).map(|e| e.tool.clone())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let Some(entry) = self.registry.get(&request.name) else {
            return Err(McpError::invalid_params(
                format!(
                    "unknown tool `{}`: call tools/list for the tools this server offers",
                    request.name
                ),
                None,
            ));
        };
        let tool = entry.tool.name.to_string();
        let started = Instant::now();
        let args = request.arguments.unwrap_or_default();
        let (principal, outcome) = match self.caller(&tool, &context).await {
            Ok(caller) => {
                let outcome = tools::run(&self.state, &caller, entry.kind, &args).await;
                (caller.principal_id().to_owned(), outcome)
            }
            Err(err) => (String::new(), Err(err)),
        };
        let failure = outcome.as_ref().err().map(|e| e.code);
        let result = match outcome {
            Ok(value) => CallToolResult::structured(value),
            Err(err) => error_result(&err),
        };
        record(&tool, &principal, failure, started, &result);
        Ok(CallToolResponse::Complete(result))
    }
}

/// Metrics and one log line per call: never the text, the arguments or a token.
fn record(
    tool: &str,
    principal: &str,
    failure: Option<ErrorCode>,
    started: Instant,
    result: &CallToolResult,
) {
    let elapsed = started.elapsed();
    let outcome_label = failure.map_or("ok", ErrorCode::as_str);
    let labels = ToolLabels {
        tool: tool.to_owned(),
        outcome: outcome_label.to_owned(),
    };
    metrics().tool_calls.get_or_create(&labels).inc();
    metrics()
        .tool_latency
        .get_or_create(&labels)
        .observe(elapsed.as_secs_f64());
    let result_bytes: usize = result
        .content
        .iter()
        .filter_map(|c| c.as_text())
        .map(|t| t.text.len())
        .sum();
    tracing::info!(
        tool,
        principal,
        outcome = outcome_label,
        latency_ms = elapsed.as_secs_f64() * 1000.0,
        result_bytes,
        "tool call"
    );
}

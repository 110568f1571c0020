//! The MCP server: one `ServerHandler` over a data-driven tool registry, used
//! by both the Streamable HTTP service and the stdio transport. Every tool call
//! with an authorized caller is metered, logged and audited.

mod args;
mod package;
mod registry;
mod search;
mod tools;

use std::sync::Arc;
use std::time::Instant;

use kg_common::ErrorCode;
use kg_common::metrics::{ToolLabels, metrics};
use kg_proto::v1::AuditEvent;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};

pub(crate) use registry::ToolRegistry;

use crate::audit::Transport;
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

    fn transport(&self) -> Transport {
        match self.credentials {
            Credentials::Http => Transport::Http,
            Credentials::Token(_) => Transport::Stdio,
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
        let at_ms = kg_common::caller::now_ms();
        let args = request.arguments.unwrap_or_default();
        // A call without an authorized caller is refused before it is a tool
        // call: there is no one to audit it for.
        let (caller, outcome) = match self.caller(&tool, &context).await {
            Ok(caller) => {
                let outcome = tools::run(&self.state, &caller, entry.kind, &args).await;
                (Some(caller), outcome)
            }
            Err(err) => (
                None,
                tools::Outcome {
                    result: Err(err),
                    namespaces: Vec::new(),
                },
            ),
        };
        let failure = outcome.result.as_ref().err().map(|e| e.code);
        let result = match outcome.result {
            Ok(value) => CallToolResult::structured(value),
            Err(err) => error_result(&err),
        };
        let summary = CallSummary {
            tool,
            failure,
            latency: started.elapsed(),
            result_bytes: result_bytes(&result),
        };
        summary.log(caller.as_ref().map_or("", Caller::principal_id));
        if let Some(caller) = &caller {
            self.state.audit.record(
                caller,
                summary.audit_event(at_ms, outcome.namespaces, self.transport()),
            );
        }
        Ok(CallToolResponse::Complete(result))
    }
}

/// Bytes of the result text the client receives.
fn result_bytes(result: &CallToolResult) -> usize {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text())
        .map(|t| t.text.len())
        .sum()
}

/// What is known of a finished call: never the text, the arguments or a token.
struct CallSummary {
    tool: String,
    failure: Option<ErrorCode>,
    latency: std::time::Duration,
    result_bytes: usize,
}

impl CallSummary {
    fn outcome(&self) -> &'static str {
        self.failure.map_or("ok", ErrorCode::as_str)
    }

    /// Metrics and one log line.
    fn log(&self, principal: &str) {
        let labels = ToolLabels {
            tool: self.tool.clone(),
            outcome: self.outcome().to_owned(),
        };
        metrics().tool_calls.get_or_create(&labels).inc();
        metrics()
            .tool_latency
            .get_or_create(&labels)
            .observe(self.latency.as_secs_f64());
        tracing::info!(
            tool = %self.tool,
            principal,
            outcome = self.outcome(),
            latency_ms = self.latency.as_secs_f64() * 1000.0,
            result_bytes = self.result_bytes,
            "tool call"
        );
    }

    /// The audit event; who called and the request id are filled in by the sink.
    fn audit_event(&self, at_ms: i64, namespaces: Vec<String>, transport: Transport) -> AuditEvent {
        AuditEvent {
            at_ms,
            tool: self.tool.clone(),
            namespaces,
            outcome: self.outcome().to_owned(),
            latency_us: i64::try_from(self.latency.as_micros()).unwrap_or(i64::MAX),
            result_bytes: i64::try_from(self.result_bytes).unwrap_or(i64::MAX),
            transport: transport.as_str().to_owned(),
            ..Default::default()
        }
    }
}

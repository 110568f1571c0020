//! The MCP server: one `ServerHandler` over a data-driven tool registry, used
//! by both the Streamable HTTP service and the stdio transport. Every tool call
//! with an authorized caller is metered, logged and audited.

pub(crate) mod args;
mod cypher;
mod entity_search;
mod files;
mod generated;
pub(crate) mod knowledge_graph;
mod navigation;
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
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, RequestId, ServerCapabilities, ServerConfig,
    ServerJsonRpcMessage, ServerResult, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde::Serialize;
use serde_json::value::RawValue;

pub(crate) use generated::Generated;
pub(crate) use registry::ToolRegistry;

use crate::audit::Transport;
use crate::error::ClientError;
use crate::state::{Caller, GatewayState, SpeculativeCaller};

const INSTRUCTIONS: &str = "kgmesh knowledge graph. Start with kg_namespaces to see what you may read, kg_search to find chunks \
that answer a question, kg_open to read a chunk, section, entity's mentions or file by key, and kg_outline for a file's table of contents. \
kg_files finds files by folder, path glob or content regex; kg_file reads one file's metadata or runs SQL (CSV/TSV), a regex or line window (text), \
JSONPath, JSONata or Jinja (JSON) over it. Quote the citation field of each package you use.";

/// Largest response message a client is expected to accept: 1 MiB (the MCP
/// Python SDK refuses larger SSE events).
const MAX_RESPONSE_BYTES: usize = 1024 * 1024;
/// Room for the JSON-RPC envelope and SSE framing around a tool result.
const RESPONSE_ENVELOPE_BYTES: usize = 8 * 1024;
/// Most bytes a tool result may take on the wire (see [`wire_len`]); a larger
/// answer becomes a PAYLOAD_TOO_LARGE error.
pub(crate) const MAX_RESULT_BYTES: usize = MAX_RESPONSE_BYTES - RESPONSE_ENVELOPE_BYTES;

/// Bytes of JSON text as a JSON string literal, without the quotes, as serde_json writes it:
/// `"` and `\\` and the short control escapes take two bytes, other control bytes six
/// (`\\u00XX`), everything else (UTF-8 included) itself. Counted, not rendered: results are
/// up to a megabyte and this runs on every call.
fn escaped_len(text: &str) -> usize {
    text.bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0x00..=0x1f => 6,
            _ => 1,
        })
        .sum()
}

/// Wire bytes of a result `value`: the client receives it twice, as
/// structuredContent and as the escaped text of the content block.
pub(crate) fn wire_len(value: &serde_json::Value) -> usize {
    let text = value.to_string();
    text.len() + escaped_len(&text)
}

/// Where a tool call's credentials come from.
#[derive(Clone)]
enum Credentials {
    /// Authorized per HTTP request by the bearer middleware; the caller rides
    /// in the request's `http::request::Parts` extensions.
    Http,
    /// A stdio launcher's: a fixed PAT, authorized with auth on every tool call, and the
    /// role it asserts (`--role`; empty: none), which auth signs into the context.
    Launcher { token: Arc<str>, role: Arc<str> },
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

    /// A server that authorizes `token` on every tool call, as `role` (the launcher's
    /// assertion; empty: no role, read tools only).
    pub(crate) fn for_launcher(
        state: GatewayState,
        registry: ToolRegistry,
        token: String,
        role: String,
    ) -> Self {
        Self {
            state,
            registry,
            credentials: Credentials::Launcher {
                token: token.into(),
                role: role.into(),
            },
        }
    }

    fn transport(&self) -> Transport {
        match self.credentials {
            Credentials::Http => Transport::Http,
            Credentials::Launcher { .. } => Transport::Stdio,
        }
    }

    async fn caller(&self, context: &RequestContext<RoleServer>) -> Result<Caller, ClientError> {
        self.caller_of(request_parts(context)).await
    }

    /// The caller of a request whose HTTP parts (when it came over HTTP) are `parts`. Its
    /// context is minted for MCP on either transport, whatever the tool: one the MCP client
    /// named could otherwise pass for another purpose (the admin API's).
    async fn caller_of(&self, parts: Option<&http::request::Parts>) -> Result<Caller, ClientError> {
        match &self.credentials {
            Credentials::Http => {
                if let Some(caller) = parts.and_then(|p| p.extensions.get::<Caller>()) {
                    return Ok(caller.clone());
                }
                match parts.and_then(|p| p.extensions.get::<SpeculativeCaller>()) {
                    Some(speculative) => speculative.confirmed().await,
                    // Fail closed: no authorized caller means no access at all.
                    None => Err(ClientError::new(
                        ErrorCode::Unauthenticated,
                        "no authorized caller: send a valid bearer token",
                    )),
                }
            }
            Credentials::Launcher { token, role } => {
                self.state
                    .authorize(token, kg_common::caller::MCP_TOOL, Some(role))
                    .await
            }
        }
    }

    /// Whether `name` is one of the built-in tools (not a generated one).
    pub(crate) fn is_builtin(&self, name: &str) -> bool {
        self.registry.get(name).is_some()
    }

    /// Runs built-in tool `request.name` to its answer: the caller authorized (or refused),
    /// the tool run, the result capped, the call metered, logged and audited. The request
    /// comes back when no built-in tool has that name.
    pub(crate) async fn call_builtin(
        &self,
        request: CallToolRequestParams,
        parts: Option<&http::request::Parts>,
    ) -> Result<ToolAnswer, CallToolRequestParams> {
        let Some(entry) = self.registry.get(&request.name) else {
            return Err(request);
        };
        let tool = entry.tool.name.to_string();
        let started = Instant::now();
        let at_ms = kg_common::caller::now_ms();
        let args = request.arguments.unwrap_or_default();
        // A call without an authorized caller is refused before it is a tool
        // call: there is no one to audit it for.
        let (caller, outcome) = self.run_builtin(entry, &args, parts).await;
        let (result, failure) = finish(outcome.result);
        let summary = CallSummary {
            tool,
            failure,
            latency: started.elapsed(),
            result_bytes: result.text_len(),
        };
        summary.log(caller.as_ref().map_or("", Caller::principal_id));
        if let Some(caller) = &caller {
            self.state.audit.record(
                caller,
                summary.audit_event(at_ms, outcome.namespaces, self.transport()),
            );
        }
        Ok(result)
    }

    /// Runs a built-in tool for an authorized caller, and the caller it ran for.
    ///
    /// A read-only tool may run ahead of auth's answer: its backend work starts on the
    /// caller auth returned last time, and its result is kept only when the fresh caller
    /// grants exactly the same access; otherwise the tool runs again under the fresh
    /// caller, and a refusal is the answer. Anything else waits for the answer.
    async fn run_builtin(
        &self,
        entry: &registry::ToolEntry,
        args: &serde_json::Map<String, serde_json::Value>,
        parts: Option<&http::request::Parts>,
    ) -> (Option<Caller>, tools::Outcome) {
        let (tool, kind) = (entry.tool.name.as_ref(), entry.kind);
        let refused = |err| tools::Outcome {
            result: Err(err),
            namespaces: Vec::new(),
        };
        let read_only = entry
            .tool
            .annotations
            .as_ref()
            .and_then(|a| a.read_only_hint)
            == Some(true);
        let speculative = parts.and_then(|p| p.extensions.get::<SpeculativeCaller>());
        if read_only && let Some(speculative) = speculative {
            let ahead = tools::run(&self.state, &speculative.ahead, kind, args).await;
            let metrics = crate::metrics::gateway_metrics();
            return match speculative.confirmed().await {
                Ok(fresh) if fresh.same_access(&speculative.ahead) => {
                    metrics.run_ahead_released.inc();
                    (Some(fresh), ahead)
                }
                Ok(fresh) => {
                    metrics.run_ahead_rerun.inc();
                    tracing::debug!(tool, "access changed since the last call: run again");
                    let outcome = tools::run(&self.state, &fresh, kind, args).await;
                    (Some(fresh), outcome)
                }
                Err(err) => {
                    metrics.run_ahead_refused.inc();
                    (None, refused(err))
                }
            };
        }
        match self.caller_of(parts).await {
            Ok(caller) => {
                let outcome = tools::run(&self.state, &caller, kind, args).await;
                (Some(caller), outcome)
            }
            Err(err) => (None, refused(err)),
        }
    }
}

/// The HTTP request parts rmcp puts on a request that came over HTTP.
fn request_parts(context: &RequestContext<RoleServer>) -> Option<&http::request::Parts> {
    context.extensions.get::<http::request::Parts>()
}

/// The tool result for a failure: `isError` with `{code, message, retryable}`.
pub(crate) fn error_result(err: &ClientError) -> CallToolResult {
    json_error(&err.to_json())
}

/// A failure as a tool result: `isError`, and the error JSON as the text block only. Never as
/// structuredContent: the MCP TypeScript SDK (1.x, inside most MCP clients) checks any
/// structuredContent against the tool's outputSchema even when `isError` is set, and an error
/// never matches a result's schema, so the agent would get a protocol error in place of the
/// message that says what to change.
pub(crate) fn json_error(error: &serde_json::Value) -> CallToolResult {
    CallToolResult::error(vec![rmcp::model::ContentBlock::text(error.to_string())])
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(
            Implementation::new("kgmesh", env!("CARGO_PKG_VERSION"))
                .with_title("kgmesh knowledge graph"),
        )
        .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        // Every tool comes in one page, which has no nextCursor: any cursor is not one of
        // ours (the specification's answer to an invalid cursor is -32602).
        if request.and_then(|r| r.cursor).is_some() {
            return Err(McpError::invalid_params(
                "tools/list answers every tool in one page and issues no cursor: send none",
                None,
            ));
        }
        let mut tools = self.registry.tools();
        tools.extend(self.generated_tools(&context).await);
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn on_initialized(&self, context: rmcp::service::NotificationContext<RoleServer>) {
        generated::on_initialized(self, context);
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.registry.get(name).map(|e| e.tool.clone())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let request = match self.call_builtin(request, request_parts(&context)).await {
            Ok(answer) => return Ok(CallToolResponse::Complete(answer.into_call_tool_result())),
            Err(request) => request,
        };
        match self.call_generated(&request, &context).await {
            Some(Ok(result)) => Ok(CallToolResponse::Complete(result)),
            Some(Err(generated::UnknownTool)) | None => Err(unknown_tool(&request.name)),
        }
    }
}

/// Whether `name` has the shape of an MCP tool name (1-128 of `A-Z a-z 0-9 _ - .`); no tool
/// this server offers has another, so no other name goes further.
pub(crate) fn is_tool_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// The protocol error for a call of a tool this server does not offer (JSON-RPC -32602, as
/// the specification lists it). It is not a tool call: it is counted under one label,
/// `unknown_tool`, whatever name was sent (a name per series would let any caller grow
/// `/metrics` without bound), and not audited (the audit log records tool calls; the name
/// is the caller's text).
fn unknown_tool(name: &str) -> McpError {
    metrics()
        .tool_calls
        .get_or_create(&ToolLabels {
            tool: "unknown_tool".to_owned(),
            outcome: ErrorCode::NotFound.as_str().to_owned(),
        })
        .inc();
    // The name as sent, cut and with control characters escaped: it may be anything.
    let mut shown: String = name.chars().take(64).flat_map(char::escape_debug).collect();
    if name.chars().nth(64).is_some() {
        shown.push_str("...");
    }
    McpError::invalid_params(
        format!("unknown tool `{shown}`: call tools/list for the tools this server offers"),
        None,
    )
}

/// A built-in tool call's answer, before it goes on the wire.
#[derive(Debug)]
pub(crate) enum ToolAnswer {
    /// A result: one JSON object, sent as structuredContent and, as its text, in the one
    /// content block.
    Structured(Box<RawValue>),
    /// A failure: `isError`, the error JSON in the text block only (see [`json_error`]).
    Failed(CallToolResult),
}

impl ToolAnswer {
    /// Bytes of the text the client receives in the content block.
    fn text_len(&self) -> usize {
        match self {
            ToolAnswer::Structured(json) => json.get().len(),
            ToolAnswer::Failed(result) => result_bytes(result),
        }
    }

    /// As rmcp's result, for the paths rmcp serializes (stdio, sessionless calls, a
    /// session's calls rmcp routes).
    pub(crate) fn into_call_tool_result(self) -> CallToolResult {
        match self {
            ToolAnswer::Structured(json) => match serde_json::from_str(json.get()) {
                Ok(value) => {
                    let mut result = CallToolResult::success(vec![ContentBlock::text(
                        Box::<str>::from(json).into_string(),
                    )]);
                    result.structured_content = Some(value);
                    result
                }
                Err(err) => {
                    // The text was written by serde_json a moment ago.
                    tracing::error!(error = %err, "a tool result did not parse back");
                    error_result(&ClientError::new(ErrorCode::Internal, ""))
                }
            },
            ToolAnswer::Failed(result) => result,
        }
    }

    /// The JSON-RPC response body answering request `id` in the wire shape of `revision`:
    /// what rmcp would send for [`Self::into_call_tool_result`], written from the result's
    /// JSON text without parsing it back or rendering it again.
    pub(crate) fn response_body(
        self,
        id: RequestId,
        revision: WireRevision,
    ) -> serde_json::Result<Vec<u8>> {
        #[derive(Serialize)]
        struct Response<'a> {
            jsonrpc: &'static str,
            id: RequestId,
            result: StructuredResult<'a>,
        }
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct StructuredResult<'a> {
            #[serde(skip_serializing_if = "Option::is_none")]
            result_type: Option<&'static str>,
            content: [TextBlock<'a>; 1],
            structured_content: &'a RawValue,
            is_error: bool,
        }
        #[derive(Serialize)]
        struct TextBlock<'a> {
            r#type: &'static str,
            text: &'a str,
        }
        match self {
            // Tools answer with objects; anything else takes rmcp's path, which knows what
            // each revision allows.
            ToolAnswer::Structured(json) if json.get().starts_with('{') => {
                serde_json::to_vec(&Response {
                    jsonrpc: "2.0",
                    id,
                    result: StructuredResult {
                        // SEP-2322: 2026-07-28 results say they are complete; older
                        // revisions have no such field.
                        result_type: match revision {
                            WireRevision::Session => None,
                            WireRevision::Sessionless => Some("complete"),
                        },
                        content: [TextBlock {
                            r#type: "text",
                            text: json.get(),
                        }],
                        structured_content: &json,
                        is_error: false,
                    },
                })
            }
            answer => {
                let mut result = ServerResult::CallToolResult(answer.into_call_tool_result());
                if revision == WireRevision::Session {
                    result.strip_result_type_for_legacy_peer();
                    result.strip_non_object_output_for_legacy_peer();
                }
                serde_json::to_vec(&ServerJsonRpcMessage::response(result, id))
            }
        }
    }
}

/// The wire shape of a tool call's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WireRevision {
    /// The revisions with sessions (before 2026-07-28).
    Session,
    /// 2026-07-28: no session, the revision named on each request.
    Sessionless,
}

/// The tool answer and its failure code. No answer over [`MAX_RESULT_BYTES`]
/// on the wire leaves the gateway: tools cut their own lists first, this is
/// the backstop.
fn finish(result: Result<Box<RawValue>, ClientError>) -> (ToolAnswer, Option<ErrorCode>) {
    match result {
        Ok(json) => {
            let text = json.get();
            // Escaping makes a byte at most 6, so most answers need no exact count.
            if text.len() * 7 <= MAX_RESULT_BYTES {
                return (ToolAnswer::Structured(json), None);
            }
            let bytes = text.len() + escaped_len(text);
            if bytes <= MAX_RESULT_BYTES {
                return (ToolAnswer::Structured(json), None);
            }
            let err = ClientError::new(
                ErrorCode::PayloadTooLarge,
                format!(
                    "the result is {bytes} bytes, over the {MAX_RESULT_BYTES}-byte limit of one tool call; ask for less (a lower limit or topK)"
                ),
            );
            (ToolAnswer::Failed(error_result(&err)), Some(err.code))
        }
        Err(err) => (ToolAnswer::Failed(error_result(&err)), Some(err.code)),
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
    fn audit_event(
        &self,
        at_ms: i64,
        mut namespaces: Vec<String>,
        transport: Transport,
    ) -> AuditEvent {
        // Auth keeps a bounded list; the rest are counted so the record stays honest.
        let more = namespaces
            .len()
            .saturating_sub(kg_proto::limits::AUDIT_NAMESPACES);
        namespaces.truncate(kg_proto::limits::AUDIT_NAMESPACES);
        AuditEvent {
            at_ms,
            tool: self.tool.clone(),
            namespaces,
            more_namespaces: u32::try_from(more).unwrap_or(u32::MAX),
            outcome: self.outcome().to_owned(),
            latency_us: i64::try_from(self.latency.as_micros()).unwrap_or(i64::MAX),
            result_bytes: i64::try_from(self.result_bytes).unwrap_or(i64::MAX),
            transport: transport.as_str().to_owned(),
            ..Default::default()
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn finished(value: serde_json::Value) -> (CallToolResult, Option<ErrorCode>) {
        let (answer, failure) = finish(tools::json_text(&value));
        (answer.into_call_tool_result(), failure)
    }

    #[test]
    fn an_unknown_tool_is_one_label_and_its_name_is_cut_and_escaped_in_the_error() {
        let long = format!("q_{}", "y".repeat(5000));
        let forged = "admin:POST /api/v1/grants\n\u{1b}[31m";
        assert!(!is_tool_name(&long) && !is_tool_name(forged) && !is_tool_name(""));
        assert!(is_tool_name("get_customer") && is_tool_name("a.b-c_9"));
        let err = unknown_tool(&long);
        assert_eq!(err.code, rmcp::model::ErrorCode::INVALID_PARAMS);
        assert!(err.message.len() < 200, "{}", err.message);
        assert!(
            err.message.starts_with("unknown tool `q_yyy"),
            "{}",
            err.message
        );
        let err = unknown_tool(forged);
        assert!(!err.message.contains('\u{1b}') && !err.message.contains('\n'));
        let exported = crate::metrics::encode_text();
        assert!(exported.contains("tool=\"unknown_tool\""));
        assert!(!exported.contains("q_yyy") && !exported.contains("admin:POST"));
    }

    #[test]
    fn an_audit_event_lists_what_auth_keeps_and_counts_the_rest() {
        let summary = CallSummary {
            tool: "kg_search".into(),
            failure: None,
            latency: std::time::Duration::from_millis(3),
            result_bytes: 10,
        };
        let many: Vec<String> = (0..70).map(|i| format!("ns-{i:02}")).collect();
        let event = summary.audit_event(1, many.clone(), Transport::Http);
        assert_eq!(event.namespaces, many[..64]);
        assert_eq!(event.more_namespaces, 6);
        let event = summary.audit_event(1, many[..2].to_vec(), Transport::Http);
        assert_eq!((event.namespaces.len(), event.more_namespaces), (2, 0));
    }

    #[test]
    fn no_result_over_the_limit_leaves_the_gateway() {
        let (ok, failure) = finished(json!({"text": "a".repeat(1000)}));
        assert_eq!((ok.is_error, failure), (Some(false), None));

        // Counted twice (structured and text) and escaped: quotes cost double.
        let (fits, failure) = finished(json!({"text": "a".repeat(MAX_RESULT_BYTES / 2 - 40)}));
        assert_eq!((fits.is_error, failure), (Some(false), None));
        let (big, failure) = finished(json!({"text": "\"".repeat(MAX_RESULT_BYTES / 4)}));
        assert_eq!(failure, Some(ErrorCode::PayloadTooLarge));
        assert_eq!(big.is_error, Some(true));
        assert!(result_bytes(&big) < 1000);
        assert!(big.structured_content.is_none());
        let text = big.content[0].as_text().unwrap().text.clone();
        let body: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(body["code"], "PAYLOAD_TOO_LARGE");
        assert_eq!(body["retryable"], false);

        let value = json!({"a": "x\"y", "n": [1, 2]});
        let text = value.to_string();
        assert_eq!(
            wire_len(&value),
            text.len() + serde_json::to_string(&text).unwrap().len() - 2
        );

        for tricky in [
            "",
            "plain",
            "quote \" backslash \\ slash /",
            "\n\r\t\u{8}\u{c}\u{0}\u{1f}\u{7f}",
            "héllo wörld \u{202e} \u{e0041} \u{200b} 漢字",
        ] {
            let rendered = serde_json::to_string(tricky).unwrap();
            assert_eq!(escaped_len(tricky), rendered.len() - 2, "{tricky:?}");
        }

        let (_, failure) = finish(Err(ClientError::invalid("bad")));
        assert_eq!(failure, Some(ErrorCode::InvalidArgument));
    }

    /// What rmcp sends for `answer`: to a session peer its handler strips what older
    /// revisions lack; to a 2026-07-28 request it sends the result as the tool returned it.
    fn rmcp_body(answer: ToolAnswer, id: RequestId, revision: WireRevision) -> serde_json::Value {
        let mut result = ServerResult::CallToolResult(answer.into_call_tool_result());
        if revision == WireRevision::Session {
            result.strip_result_type_for_legacy_peer();
            result.strip_non_object_output_for_legacy_peer();
        }
        serde_json::to_value(ServerJsonRpcMessage::response(result, id)).unwrap()
    }

    #[test]
    fn a_direct_answer_is_what_rmcp_would_send() {
        let answers = || {
            [
                finish(tools::json_text(&json!({
                    "results": [{"text": "quote \" backslash \\ newline \n naïve 東京", "score": 0.5}],
                    "total": 1, "truncated": false, "trace": {"lanes": []},
                }))),
                finish(tools::json_text(&json!({}))),
                finish(Err(ClientError::invalid("bad `topK`: expected 1..=32"))),
                // Not an object: rmcp's path, which moves it into the text for old revisions.
                finish(tools::json_text(&json!([1, 2]))),
            ]
        };
        for ((ours, _), (theirs, _)) in answers().into_iter().zip(answers()) {
            for id in [RequestId::Number(7), RequestId::String("req-1".into())] {
                for revision in [WireRevision::Session, WireRevision::Sessionless] {
                    let body = ours_body(&ours, id.clone(), revision);
                    assert_eq!(
                        body,
                        rmcp_body(clone_answer(&theirs), id.clone(), revision),
                        "{revision:?}"
                    );
                }
            }
        }
        // The two shapes differ where the revisions do.
        let (answer, _) = finish(tools::json_text(&json!({"a": 1})));
        let current = ours_body(&answer, RequestId::Number(1), WireRevision::Sessionless);
        assert_eq!(current["result"]["resultType"], "complete");
        let legacy = ours_body(&answer, RequestId::Number(1), WireRevision::Session);
        assert!(legacy["result"].get("resultType").is_none(), "{legacy}");
        // The structured copy and the text block carry the same JSON.
        let (answer, _) = finish(tools::json_text(&json!({"a": "x\"y", "n": [1, 2]})));
        let body = ours_body(&answer, RequestId::Number(1), WireRevision::Session);
        let text = body["result"]["content"][0]["text"].as_str().unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(text).unwrap(),
            body["result"]["structuredContent"]
        );
    }

    #[test]
    fn rmcp_gets_the_same_numbers_as_the_text() {
        // Scores carry 17 significant digits; a parse that is off by one ulp would make the
        // structured copy and the text disagree (the MCP SDK tests compare them).
        let scores = [0.968_253_968_253_968_1, 0.1 + 0.2, 1.0 / 3.0, 5e-324, 1e300];
        let (answer, _) = finish(tools::json_text(&json!({ "scores": scores })));
        let ToolAnswer::Structured(json) = &answer else {
            panic!("not a result: {answer:?}");
        };
        let text = json.get().to_owned();
        let result = answer.into_call_tool_result();
        assert_eq!(result.content[0].as_text().unwrap().text, text);
        let structured = result.structured_content.unwrap();
        assert_eq!(structured.to_string(), text);
        assert_eq!(structured["scores"][0].as_f64(), Some(scores[0]));
    }

    fn clone_answer(answer: &ToolAnswer) -> ToolAnswer {
        match answer {
            ToolAnswer::Structured(json) => ToolAnswer::Structured(json.clone()),
            ToolAnswer::Failed(result) => ToolAnswer::Failed(result.clone()),
        }
    }

    fn ours_body(answer: &ToolAnswer, id: RequestId, revision: WireRevision) -> serde_json::Value {
        let bytes = clone_answer(answer).response_body(id, revision).unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }
}

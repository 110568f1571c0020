//! Tools generated from the compiled ontology (get_/list_/traverse_/propose_):
//! listed per caller role from Ontology.ListGeneratedTools, run through
//! Ontology.CallGeneratedTool, and `notifications/tools/list_changed` sent to
//! every session when the ontology recompiles (Ontology.WatchCompiled).
//! Roles ride in the signed caller context, which the ontology and approval
//! services read them from: over HTTP the caller's granted roles, over stdio only
//! the role the launcher asserted with `--role` (none: read tools only).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kg_common::ErrorCode;
use kg_proto::v1::ontology_client::OntologyClient;
use kg_proto::v1::{
    CallGeneratedToolRequest, GeneratedTool, ListGeneratedToolsRequest, WatchCompiledRequest,
};
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject, Tool, ToolAnnotations};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{Peer, RoleServer};
use serde_json::{Value, json};
use tokio::sync::watch;
use tonic::transport::Channel;

use super::{CallSummary, McpServer, ToolAnswer, error_result, finish};
use crate::error::{ClientError, GatewayError};

/// Pause before re-subscribing to the compiled version after an error.
const WATCH_RETRY: Duration = Duration::from_secs(2);

/// The gateway's link to the ontology service.
#[derive(Clone)]
pub(crate) struct Generated {
    client: Option<OntologyClient<Channel>>,
    version: watch::Receiver<i64>,
}

impl Generated {
    /// Connects (lazily) to the ontology at `addr`; None disables generated tools.
    pub(crate) fn connect(addr: Option<&str>) -> Result<Self, GatewayError> {
        let (tx, version) = watch::channel(0);
        let Some(addr) = addr else {
            return Ok(Self {
                client: None,
                version,
            });
        };
        let channel = kg_common::grpc::channel(addr).map_err(|err| {
            GatewayError::Config(format!("ontology_addr: cannot use `{addr}`: {err}"))
        })?;
        let client = OntologyClient::new(channel)
            .max_decoding_message_size(kg_common::grpc::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(kg_common::grpc::MAX_MESSAGE_BYTES);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(watch_versions(client.clone(), tx));
        }
        Ok(Self {
            client: Some(client),
            version,
        })
    }

    /// Whether generated tools are served.
    pub(crate) fn enabled(&self) -> bool {
        self.client.is_some()
    }
}

/// Follows Ontology.WatchCompiled until every receiver is gone. The first version a watch
/// reports after the previous one ended is announced even when it did not change: while the
/// ontology was away, `tools/list` answered without the generated tools, and the sessions
/// that listed then must be told to list again.
async fn watch_versions(mut client: OntologyClient<Channel>, tx: watch::Sender<i64>) {
    let mut watched_before = false;
    loop {
        let stream = tokio::select! {
            () = tx.closed() => return,
            r = client.watch_compiled(WatchCompiledRequest {}) => r,
        };
        if let Ok(stream) = stream {
            let mut stream = stream.into_inner();
            let mut again = watched_before;
            loop {
                let next = tokio::select! {
                    () = tx.closed() => return,
                    n = stream.message() => n,
                };
                match next {
                    Ok(Some(v)) => {
                        tx.send_if_modified(|cur| {
                            let changed = again || *cur != v.compiled_version;
                            *cur = v.compiled_version;
                            changed
                        });
                        again = false;
                        watched_before = true;
                    }
                    Ok(None) | Err(_) => break,
                }
            }
        }
        tokio::select! {
            () = tx.closed() => return,
            () = tokio::time::sleep(WATCH_RETRY) => {}
        }
    }
}

fn object(text: &str) -> Arc<JsonObject> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Arc::new(map),
        _ => Arc::new(JsonObject::new()),
    }
}

fn to_tool(t: GeneratedTool) -> Tool {
    let annotations = ToolAnnotations::with_title(t.name.clone())
        .read_only(t.read_only)
        .destructive(false)
        .idempotent(t.read_only)
        .open_world(!t.read_only);
    Tool::new(t.name, t.description, object(&t.input_schema_json))
        .with_raw_output_schema(object(&t.output_schema_json))
        .annotate(annotations)
}

/// A generated tool's error result, `{error, code, message, retryable}` as the ontology
/// writes it, with its metrics/audit code.
fn tool_error(code: &str, message: Value) -> (ToolAnswer, Option<ErrorCode>) {
    (
        ToolAnswer::Failed(super::json_error(&json!({
            "error": code, "code": code, "message": message, "retryable": code == "unavailable"
        }))),
        Some(error_code(code)),
    )
}

/// The metrics/audit code of a generated tool's error.
fn error_code(code: &str) -> ErrorCode {
    match code {
        "denied_role" => ErrorCode::PermissionDenied,
        "not_found" | "unknown_tool" | "unknown_object" => ErrorCode::NotFound,
        "invalid_arguments" => ErrorCode::InvalidArgument,
        "unavailable" => ErrorCode::Unavailable,
        "precondition_failed"
        | "ambiguous_identity"
        | "auto_effects_disabled"
        | "approval_unevaluable" => ErrorCode::FailedPrecondition,
        _ => ErrorCode::Internal,
    }
}

impl McpServer {
    /// The generated tools this caller may see (read tools only without a role).
    pub(super) async fn generated_tools(&self, context: &RequestContext<RoleServer>) -> Vec<Tool> {
        let generated = &self.state.generated;
        let Some(client) = &generated.client else {
            return Vec::new();
        };
        let caller = match self.caller(context).await {
            Ok(caller) => caller,
            Err(err) => {
                tracing::debug!(code = %err.code, "no caller for generated tools");
                return Vec::new();
            }
        };
        match client
            .clone()
            .list_generated_tools(caller.request(ListGeneratedToolsRequest {}))
            .await
        {
            // The ontology service refuses such projects; an older one may not have.
            Ok(r) => r
                .into_inner()
                .tools
                .into_iter()
                .filter(|tool| !kg_common::tool_names::is_reserved(&tool.name))
                .map(to_tool)
                .collect(),
            Err(status) => {
                tracing::warn!(code = ?status.code(), "ontology unavailable: generated tools left out of tools/list");
                Vec::new()
            }
        }
    }

    /// Runs a generated tool: None when generated tools are off, `Err` when the ontology
    /// offers no tool of that name (a protocol error, neither metered by name nor audited,
    /// like an unknown tool with generated tools off).
    pub(super) async fn call_generated(
        &self,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Option<Result<CallToolResult, UnknownTool>> {
        let generated = &self.state.generated;
        let client = generated.client.as_ref()?;
        if !super::is_tool_name(&request.name) {
            return Some(Err(UnknownTool));
        }
        let tool = request.name.to_string();
        let started = Instant::now();
        let at_ms = kg_common::caller::now_ms();
        let caller = match self.caller(context).await {
            Ok(caller) => caller,
            Err(err) => return Some(Ok(error_result(&err))),
        };
        let agent = context
            .peer
            .peer_info()
            .map(|info| info.client_info.name.clone())
            .unwrap_or_default();
        let arguments = request.arguments.clone().unwrap_or_default();
        let answer = match super::args::no_nul_characters(&arguments) {
            Ok(()) => Ok(client
                .clone()
                .call_generated_tool(caller.request(CallGeneratedToolRequest {
                    name: tool.clone(),
                    arguments_json: Value::Object(arguments).to_string(),
                    agent,
                }))
                .await),
            Err(err) => Err(err),
        };
        let (result, failure) = match answer {
            // In the generated tools' own shape: an agent branching on `code` sees one code
            // for every argument mistake.
            Err(refused) => tool_error("invalid_arguments", Value::String(refused.message)),
            Ok(Err(status)) => finish(Err(ClientError::from_status("ontology", &status))),
            Ok(Ok(r)) => match serde_json::from_str::<Value>(&r.into_inner().result_json) {
                Ok(value) => match value.get("error").and_then(Value::as_str) {
                    Some("unknown_tool") => return Some(Err(UnknownTool)),
                    Some(code) => {
                        let message = value.get("message").cloned().unwrap_or(Value::Null);
                        tool_error(code, message)
                    }
                    None => finish(super::tools::json_text(&value)),
                },
                Err(_) => finish(Err(ClientError::new(ErrorCode::Internal, ""))),
            },
        };
        let summary = CallSummary {
            tool,
            failure,
            latency: started.elapsed(),
            result_bytes: result.text_len(),
        };
        summary.log(caller.principal_id());
        self.state.audit.record(
            &caller,
            summary.audit_event(at_ms, Vec::new(), self.transport()),
        );
        Some(Ok(result.into_call_tool_result()))
    }
}

/// The ontology offers no tool of the name asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct UnknownTool;

/// Sends `notifications/tools/list_changed` to `peer` on every recompile,
/// until the session or the gateway ends.
pub(super) fn follow_recompiles(
    generated: &Generated,
    peer: Peer<RoleServer>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    if !generated.enabled() {
        return;
    }
    let mut rx = generated.version.clone();
    rx.borrow_and_update();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                changed = rx.changed() => if changed.is_err() { return },
            }
            if peer.notify_tool_list_changed().await.is_err() {
                return;
            }
        }
    });
}

/// Starts following recompiles for a newly initialized session.
pub(super) fn on_initialized(server: &McpServer, context: NotificationContext<RoleServer>) {
    follow_recompiles(
        &server.state.generated,
        context.peer,
        server.state.shutdown.clone(),
    );
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn propose_tools_are_not_read_only() {
        let tool = to_tool(GeneratedTool {
            name: "propose_order_cancel".into(),
            description: "Propose".into(),
            input_schema_json: r#"{"type":"object"}"#.into(),
            output_schema_json: r#"{"type":"object"}"#.into(),
            read_only: false,
        });
        let a = tool.annotations.unwrap();
        assert_eq!(
            (a.read_only_hint, a.destructive_hint),
            (Some(false), Some(false))
        );
        assert_eq!(tool.input_schema.get("type"), Some(&json!("object")));
        assert_eq!(error_code("denied_role"), ErrorCode::PermissionDenied);
        assert_eq!(error_code("whatever"), ErrorCode::Internal);
    }
}

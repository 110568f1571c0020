//! Built-in tool calls answered on the HTTP request's own task: inside an MCP session, and
//! sessionless (2026-07-28) ones.
//!
//! rmcp serves a session's request through the session's worker task: the request goes
//! to the worker, the worker hands it to the handler, the result comes back through the
//! worker and leaves as a one-event SSE stream. A sessionless request gets a service task
//! and a one-shot transport of its own, and the message is turned into a `Value` once more
//! to check its headers. Either way the typed result needs the answer parsed back from its
//! JSON text and rendered again. For a built-in tool call, which sends no notification and
//! needs nothing from a session, that is task hops and copies for nothing; the Streamable
//! HTTP transport lets a server answer any request with one `application/json` body.
//!
//! So a `tools/call` of a built-in tool, in a live session or as a well-formed 2026-07-28
//! request, is run here through the same [`McpServer::call_builtin`] rmcp's path uses
//! (same authorization, caps, metering and audit) and answered as JSON in its revision's
//! wire shape. Anything else, and anything this layer is unsure of (another method, a
//! generated tool, a progress token or other request metadata, standard headers missing,
//! repeated or disagreeing with the body, an unknown session, a body without a length or
//! over [`MAX_BODY_BYTES`]), goes to rmcp unchanged, which answers or rejects it as
//! before: this layer only ever answers requests rmcp would have served the same way. rmcp
//! ends a session its worker has not heard from for five minutes, so a session whose calls
//! all came here would lapse while in use: a session rmcp has not seen for
//! [`RMCP_TOUCH_EVERY`] gets its next request sent through rmcp.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use kg_common::ErrorCode;
use rmcp::model::{
    ClientJsonRpcMessage, ClientRequest, GetMeta as _, JsonRpcRequest, RequestParamsMeta as _,
};
use rmcp::transport::streamable_http_server::session::SessionManager as _;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

use crate::error::ClientError;
use crate::mcp::{McpServer, WireRevision};

/// Largest tool call answered here; a larger one goes to rmcp (whose limit applies).
pub(super) const MAX_BODY_BYTES: usize = 256 * 1024;

/// How long a session may go without rmcp seeing one of its requests; well inside rmcp's
/// five-minute idle timeout.
const RMCP_TOUCH_EVERY: Duration = Duration::from_secs(60);

/// Sessions tracked at most; past this, the ones rmcp has not seen recently are dropped
/// (their next request goes through rmcp, which is always correct).
const MAX_TRACKED_SESSIONS: usize = 16 * 1024;

/// The protocol revisions with sessions this layer answers for (rmcp's legacy lifecycle).
const SESSION_REVISIONS: [&str; 3] = ["2025-03-26", "2025-06-18", "2025-11-25"];

/// The sessionless revision this layer answers for.
const SESSIONLESS_REVISION: &str = "2026-07-28";

/// The request `_meta` keys a sessionless call may carry here: the client context the
/// revision requires, and the client's name. Others (a log level, a progress token, trace
/// context) go to rmcp.
const SESSIONLESS_META_KEYS: [&str; 3] = [
    "io.modelcontextprotocol/protocolVersion",
    "io.modelcontextprotocol/clientCapabilities",
    "io.modelcontextprotocol/clientInfo",
];

/// What the layer needs: the MCP server, rmcp's sessions, and when rmcp last saw each.
#[derive(Clone)]
pub(crate) struct SessionCalls {
    server: McpServer,
    sessions: Arc<LocalSessionManager>,
    seen_by_rmcp: Arc<Mutex<HashMap<String, Instant>>>,
}

impl SessionCalls {
    pub(crate) fn new(server: McpServer, sessions: Arc<LocalSessionManager>) -> Self {
        Self {
            server,
            sessions,
            seen_by_rmcp: Arc::default(),
        }
    }

    /// Whether rmcp saw `session` recently enough for this layer to answer it.
    fn rmcp_saw_recently(&self, session: &str) -> bool {
        self.seen_by_rmcp
            .lock()
            .ok()
            .and_then(|seen| seen.get(session).copied())
            .is_some_and(|at| at.elapsed() < RMCP_TOUCH_EVERY)
    }

    fn note_rmcp_sees(&self, session: &str) {
        let Ok(mut seen) = self.seen_by_rmcp.lock() else {
            return;
        };
        if seen.len() >= MAX_TRACKED_SESSIONS {
            seen.retain(|_, at| at.elapsed() < RMCP_TOUCH_EVERY);
        }
        if seen.len() < MAX_TRACKED_SESSIONS {
            seen.insert(session.to_owned(), Instant::now());
        }
    }
}

/// The middleware (inside the bearer guard, so the caller is in the request).
pub(crate) async fn answer_builtin_tool_calls(
    State(calls): State<SessionCalls>,
    request: Request,
    next: Next,
) -> Response {
    let Some(candidate) = candidate(&request) else {
        return next.run(request).await;
    };
    if let Candidate::Session(session) = &candidate
        && !calls.rmcp_saw_recently(session)
    {
        calls.note_rmcp_sees(session);
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(bytes) => bytes,
        // The length was checked; a body that disagrees with it is the client's fault.
        Err(_) => {
            return status_text(
                StatusCode::BAD_REQUEST,
                "Bad Request: the body does not match its Content-Length",
            );
        }
    };
    let revision = match candidate {
        Candidate::Session(_) => WireRevision::Session,
        Candidate::Sessionless => WireRevision::Sessionless,
    };
    let Some((id, call)) = builtin_tool_call(&calls.server, &parts.headers, &bytes, revision)
    else {
        return next
            .run(Request::from_parts(parts, Body::from(bytes)))
            .await;
    };
    if let Candidate::Session(session) = &candidate {
        let known = calls
            .sessions
            .has_session(&session.as_str().into())
            .await
            .unwrap_or(false);
        if !known {
            return next
                .run(Request::from_parts(parts, Body::from(bytes)))
                .await;
        }
    }
    let metrics = crate::metrics::gateway_metrics();
    match revision {
        WireRevision::Session => metrics.session_calls_direct.inc(),
        WireRevision::Sessionless => metrics.sessionless_calls_direct.inc(),
    };
    let answer = match calls.server.call_builtin(call, Some(&parts)).await {
        Ok(answer) => answer,
        // Checked by `builtin_tool_call`; the registry does not change while serving.
        Err(call) => {
            tracing::error!(tool = %call.name, "a built-in tool left the registry");
            return crate::http::guard::error_response(&ClientError::new(ErrorCode::Internal, ""));
        }
    };
    match answer.response_body(id, revision) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            Bytes::from(body),
        )
            .into_response(),
        Err(err) => {
            tracing::error!(error = %err, "a tool result did not serialize");
            crate::http::guard::error_response(&ClientError::new(ErrorCode::Internal, ""))
        }
    }
}

/// A request this layer may answer, by how it names its revision.
enum Candidate {
    /// In the session with this id, of a revision with sessions.
    Session(String),
    /// No session, the 2026-07-28 revision named in its header.
    Sessionless,
}

/// Whether a request may be a built-in tool call this layer answers: a POST of JSON with
/// a length up to [`MAX_BODY_BYTES`], accepting JSON and SSE answers, either in a session
/// of a revision with sessions or sessionless with exactly one 2026-07-28 version header.
fn candidate(request: &Request) -> Option<Candidate> {
    if request.method() != Method::POST {
        return None;
    }
    let headers = request.headers();
    let length: usize = headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()?;
    if !(length <= MAX_BODY_BYTES
        && media_type_is(headers.get(header::CONTENT_TYPE), "application/json")
        && accepts(headers, "application/json")
        && accepts(headers, "text/event-stream"))
    {
        return None;
    }
    match headers.get("mcp-session-id") {
        Some(session) => {
            let revision_ok = match headers.get("mcp-protocol-version") {
                None => true,
                Some(value) => value.to_str().is_ok_and(|v| SESSION_REVISIONS.contains(&v)),
            };
            let session = session.to_str().ok()?;
            revision_ok.then(|| Candidate::Session(session.to_owned()))
        }
        None => (only_value(headers, "mcp-protocol-version")? == SESSIONLESS_REVISION)
            .then_some(Candidate::Sessionless),
    }
}

/// The one value of header `name`; `None` when it is absent, repeated or not text.
fn only_value<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    values.next().is_none().then(|| value.to_str().ok())?
}

/// A `tools/call` of a built-in tool this layer may answer in `revision`, and its
/// JSON-RPC id.
fn builtin_tool_call(
    server: &McpServer,
    headers: &HeaderMap,
    body: &[u8],
    revision: WireRevision,
) -> Option<(rmcp::model::RequestId, rmcp::model::CallToolRequestParams)> {
    let ClientJsonRpcMessage::Request(JsonRpcRequest { id, request, .. }) =
        serde_json::from_slice(body).ok()?
    else {
        return None;
    };
    let meta = request.get_meta();
    let meta_ok = match revision {
        // Progress and per-request protocol metadata are rmcp's business.
        WireRevision::Session => meta.is_empty(),
        // The client context 2026-07-28 requires, naming the revision of the header, and
        // nothing else.
        WireRevision::Sessionless => {
            meta.keys()
                .all(|key| SESSIONLESS_META_KEYS.contains(&key.as_str()))
                && meta
                    .protocol_version()
                    .is_some_and(|v| v.as_str() == SESSIONLESS_REVISION)
                && meta
                    .missing_required_keys(&rmcp::model::ProtocolVersion::V_2026_07_28)
                    .is_empty()
        }
    };
    if !meta_ok {
        return None;
    }
    let ClientRequest::CallToolRequest(call) = request else {
        return None;
    };
    let params = call.params;
    if revision == WireRevision::Session && params.meta().is_some_and(|meta| !meta.is_empty()) {
        return None;
    }
    // SEP-2243 headers must agree with the body; rmcp rejects them otherwise. A session
    // may leave them out; 2026-07-28 requires them, so a request without them is rmcp's to
    // refuse.
    let header_is = |name: &str, want: &str| match revision {
        WireRevision::Session => headers
            .get(name)
            .is_none_or(|v| v.to_str().is_ok_and(|v| v == want)),
        WireRevision::Sessionless => only_value(headers, name) == Some(want),
    };
    if !header_is("mcp-method", "tools/call") || !header_is("mcp-name", &params.name) {
        return None;
    }
    if headers
        .keys()
        .any(|name| name.as_str().starts_with("mcp-param"))
    {
        return None;
    }
    server.is_builtin(&params.name).then_some((id, params))
}

pub(super) fn media_type_is(value: Option<&axum::http::HeaderValue>, want: &str) -> bool {
    value.and_then(|v| v.to_str().ok()).is_some_and(|v| {
        v.split(';')
            .next()
            .is_some_and(|essence| essence.trim().eq_ignore_ascii_case(want))
    })
}

fn accepts(headers: &HeaderMap, want: &str) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            item.split(';')
                .next()
                .is_some_and(|essence| essence.trim().eq_ignore_ascii_case(want))
        })
}

fn status_text(status: StatusCode, text: &'static str) -> Response {
    (status, text).into_response()
}

//! Malformed JSON-RPC on `/mcp` answered as JSON-RPC errors that say what to change.
//!
//! rmcp refuses a body that is not one JSON-RPC message with 415 and a plain-text serde
//! message, and a `tools/call` whose `arguments` is not an object with "method not found"
//! (-32601) naming only the method. A client sending JSON-RPC by hand (curl, a script) learns
//! nothing from either. This layer checks the shape of a JSON POST before rmcp reads it:
//! - not JSON: 400, `-32700` (parse error), with where serde stopped;
//! - a batch (an array) or anything but an object: 400, `-32600` (invalid request);
//! - an object whose `jsonrpc` is not "2.0", whose `id` is not a string or an integer, or
//!   whose `method` is missing (and it is no response) or not a string: 400, `-32600`, naming
//!   the member, to the id when it is a valid one;
//! - a `tools/call` without `params.name` as a string, or with `params.arguments` that is
//!   not an object: 200, `-32602` (invalid params) to the request's id.
//!
//! Anything else goes to rmcp unchanged. A body over [`MAX_BODY_BYTES`], or without a
//! length, is left to rmcp, which bounds what it reads.

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

// The body bound is the built-in call path's: MCP requests are far smaller.
use super::session_calls::{MAX_BODY_BYTES, media_type_is};

/// JSON-RPC 2.0 error codes.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const INVALID_PARAMS: i64 = -32602;

/// The middleware (inside the bearer guard: only a caller learns what was wrong).
pub(crate) async fn refuse_malformed_jsonrpc(request: Request, next: Next) -> Response {
    let json = media_type_is(
        request.headers().get(header::CONTENT_TYPE),
        "application/json",
    );
    if request.method() != Method::POST || !json {
        return next.run(request).await;
    }
    let length = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<usize>().ok());
    if length.is_none_or(|length| length > MAX_BODY_BYTES) {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY_BYTES).await else {
        return (
            StatusCode::BAD_REQUEST,
            "Bad Request: the body does not match its Content-Length",
        )
            .into_response();
    };
    match refusal(&bytes) {
        Some(refused) => refused.into_response(),
        None => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
    }
}

/// What is wrong with the JSON-RPC 2.0 envelope of an object: `jsonrpc` must be "2.0", a
/// request or notification names its `method` as a string, an `id` is a string or an integer
/// (MCP forbids null). A response (a `result` or an `error` with an id) has no method.
/// `params` is left to rmcp, which answers a method it does not know.
fn envelope_problem(message: &serde_json::Map<String, Value>) -> Option<String> {
    if message.get("jsonrpc") != Some(&json!("2.0")) {
        return Some("`jsonrpc` must be \"2.0\"".to_owned());
    }
    if let Some(id) = message.get("id")
        && !(id.is_string() || id.is_i64() || id.is_u64())
    {
        return Some(format!("`id` must be a string or an integer, got {id}"));
    }
    let response = message.contains_key("result") || message.contains_key("error");
    match message.get("method") {
        Some(Value::String(_)) => None,
        Some(other) => Some(format!("`method` must be a string, got {other}")),
        None if response => None,
        None => Some("no `method`: name the request or notification".to_owned()),
    }
}

/// Why a body is not a JSON-RPC message rmcp can act on, as the answer to send.
#[derive(Debug, PartialEq)]
struct Refused {
    status: StatusCode,
    id: Value,
    code: i64,
    message: String,
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let body = json!({
            "jsonrpc": "2.0",
            "id": self.id,
            "error": {"code": self.code, "message": self.message},
        });
        (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            Bytes::from(body.to_string()),
        )
            .into_response()
    }
}

fn refusal(body: &[u8]) -> Option<Refused> {
    let message: Value = match serde_json::from_slice(body) {
        Ok(message) => message,
        Err(err) => {
            return Some(Refused {
                status: StatusCode::BAD_REQUEST,
                id: Value::Null,
                code: PARSE_ERROR,
                message: format!(
                    "Parse error: the body is not JSON ({err}); send one JSON-RPC message"
                ),
            });
        }
    };
    let Value::Object(message) = message else {
        let what = if message.is_array() {
            "a batch: kgmesh takes one JSON-RPC message per POST (MCP 2025-06-18 removed batches); send each on its own"
        } else {
            "not a JSON-RPC message; send one JSON object"
        };
        return Some(Refused {
            status: StatusCode::BAD_REQUEST,
            id: Value::Null,
            code: INVALID_REQUEST,
            message: format!("Invalid Request: the body is {what}"),
        });
    };
    if let Some(problem) = envelope_problem(&message) {
        // The id is echoed only when it is one JSON-RPC allows.
        let id = match message.get("id") {
            Some(id) if id.is_string() || id.is_i64() || id.is_u64() => id.clone(),
            _ => Value::Null,
        };
        return Some(Refused {
            status: StatusCode::BAD_REQUEST,
            id,
            code: INVALID_REQUEST,
            message: format!("Invalid Request: {problem}"),
        });
    }
    let method = message.get("method").and_then(Value::as_str);
    if method == Some("initialize") {
        return initialize_refusal(&message);
    }
    if method != Some("tools/call") {
        return None;
    }
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    let invalid_params = |what: &str| {
        Some(Refused {
            status: StatusCode::OK,
            id: id.clone(),
            code: INVALID_PARAMS,
            message: format!("Invalid params: tools/call {what}"),
        })
    };
    let Some(Value::Object(params)) = message.get("params") else {
        return invalid_params(
            "needs params, an object: {\"name\": \"kg_search\", \"arguments\": {...}}",
        );
    };
    if !params.get("name").is_some_and(Value::is_string) {
        return invalid_params("needs params.name, the tool's name as tools/list gives it");
    }
    match params.get("arguments") {
        None | Some(Value::Object(_)) => None,
        Some(_) => invalid_params(
            "params.arguments must be an object of the tool's arguments, or left out",
        ),
    }
}

/// An `initialize` without the params every revision requires: rmcp takes it for some other
/// message and answers "Session ID is required", which sends a client after the wrong thing.
fn initialize_refusal(message: &serde_json::Map<String, Value>) -> Option<Refused> {
    let params = message.get("params").and_then(Value::as_object);
    let missing = match params {
        None => "needs params: {\"protocolVersion\", \"capabilities\", \"clientInfo\"}",
        Some(p) if !p.get("protocolVersion").is_some_and(Value::is_string) => {
            "needs params.protocolVersion, a revision such as \"2025-06-18\""
        }
        Some(p) if !p.get("capabilities").is_some_and(Value::is_object) => {
            "needs params.capabilities, an object ({} for none)"
        }
        Some(p) if !p.get("clientInfo").is_some_and(Value::is_object) => {
            "needs params.clientInfo, an object {\"name\", \"version\"}"
        }
        Some(_) => return None,
    };
    Some(Refused {
        status: StatusCode::BAD_REQUEST,
        id: message.get("id").cloned().unwrap_or(Value::Null),
        code: INVALID_PARAMS,
        message: format!("Invalid params: initialize {missing}"),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn refused(body: &str) -> Refused {
        refusal(body.as_bytes()).unwrap()
    }

    #[test]
    fn what_is_not_one_message_is_refused_before_rmcp() {
        let bad = refused("{bad json");
        assert_eq!(
            (bad.status, bad.code),
            (StatusCode::BAD_REQUEST, PARSE_ERROR)
        );
        assert!(bad.message.contains("line 1 column 2"), "{}", bad.message);

        let batch = refused(r#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]"#);
        assert_eq!(
            (batch.status, batch.code, batch.id),
            (StatusCode::BAD_REQUEST, INVALID_REQUEST, Value::Null)
        );
        assert!(batch.message.contains("one JSON-RPC message per POST"));
        assert_eq!(refused("42").code, INVALID_REQUEST);
    }

    #[test]
    fn a_broken_envelope_is_invalid_request_saying_which_member() {
        for (body, says, id) in [
            (
                r#"{"id":7,"method":"ping"}"#,
                "`jsonrpc` must be \"2.0\"",
                json!(7),
            ),
            (
                r#"{"jsonrpc":"1.0","id":7,"method":"ping"}"#,
                "`jsonrpc`",
                json!(7),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#,
                "`id` must be",
                Value::Null,
            ),
            (
                r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
                "`id` must be",
                Value::Null,
            ),
            (
                r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#,
                "`id` must be",
                Value::Null,
            ),
            (
                r#"{"jsonrpc":"2.0","id":"x","method":5}"#,
                "`method` must be a string",
                json!("x"),
            ),
            (r#"{"jsonrpc":"2.0","id":3}"#, "no `method`", json!(3)),
        ] {
            let refused = refused(body);
            assert_eq!(
                (refused.status, refused.code, refused.id),
                (StatusCode::BAD_REQUEST, INVALID_REQUEST, id),
                "{body}"
            );
            assert!(
                refused.message.contains(says),
                "{body}: {}",
                refused.message
            );
        }
        // A response from the client (to a server request) has no method.
        assert_eq!(refusal(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#), None);
        // An initialize without what every revision requires names the missing member.
        for (body, says) in [
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"initialize"}"#,
                "needs params",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":"x","clientInfo":{}}}"#,
                "params.capabilities",
            ),
        ] {
            let refused = refused(body);
            assert_eq!(
                (refused.code, refused.id),
                (INVALID_PARAMS, json!(1)),
                "{body}"
            );
            assert!(
                refused.message.contains(says),
                "{body}: {}",
                refused.message
            );
        }
        let good = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}"#;
        assert_eq!(refusal(good.as_bytes()), None);
    }

    #[test]
    fn a_tool_call_of_the_wrong_shape_is_invalid_params_to_its_id() {
        let args = refused(
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"kg_search","arguments":"x"}}"#,
        );
        assert_eq!(
            (args.status, args.code, args.id),
            (StatusCode::OK, INVALID_PARAMS, json!(7))
        );
        assert!(args.message.contains("params.arguments must be an object"));
        let unnamed =
            refused(r#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":3}}"#);
        assert!(
            unnamed.message.contains("params.name"),
            "{}",
            unnamed.message
        );
        assert_eq!(unnamed.id, json!("a"));
        let bare = refused(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#);
        assert!(bare.message.contains("needs params"), "{}", bare.message);
    }

    #[test]
    fn well_formed_messages_go_to_rmcp() {
        for body in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"kg_search","arguments":{"query":"q"}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"kg_namespaces"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            // Not ours to judge: rmcp answers what it does not know.
            r#"{"jsonrpc":"2.0","id":1,"method":"nope","params":[]}"#,
        ] {
            assert_eq!(refusal(body.as_bytes()), None, "{body}");
        }
    }
}

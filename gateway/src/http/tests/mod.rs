//! HTTP behaviour of the gateway, driven with `oneshot` on [`super::router`].
//! Auth and files are in-test tonic servers implementing our own contracts
//! behind the real caller-context layer (see [`doubles`]).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod admin_api;
mod audit;
mod doubles;

use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use crate::config::{BackendAddrs, GatewayConfig};
use crate::state::GatewayState;
use doubles::{AuthFixture, GOOD, REVOKED, start_auth};

/// An address nothing listens on (bound, then released).
async fn dead_addr() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    format!("http://{}", listener.local_addr().unwrap())
}

pub(crate) async fn config(auth: &str) -> GatewayConfig {
    let dead = dead_addr().await;
    let mut config = GatewayConfig::new(BackendAddrs {
        auth: auth.to_owned(),
        files: dead.clone(),
        retrieval: dead.clone(),
        graph: dead,
    });
    config.allowed_origins = vec!["https://app.example".into()];
    config
}

/// A config whose auth and files are the doubles of `fixture`.
pub(crate) async fn full_config(fixture: &AuthFixture) -> GatewayConfig {
    let mut config = config(&fixture.addr).await;
    config.backends.files.clone_from(&fixture.addr);
    config
}

fn app(config: GatewayConfig) -> axum::Router {
    super::router(GatewayState::new(config, CancellationToken::new()).unwrap())
}

fn request(method: &str, uri: &str) -> axum::http::request::Builder {
    Request::builder()
        .method(method)
        .uri(uri)
        .header(header::HOST, "localhost:7300")
}

async fn body_json(response: axum::response::Response) -> Value {
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| json!({"raw": String::from_utf8_lossy(&bytes)}))
}

/// JSON-RPC messages of a response that is either JSON or an SSE stream.
async fn rpc_messages(response: axum::response::Response) -> Vec<Value> {
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&bytes);
    if let Ok(v) = serde_json::from_str::<Value>(&text) {
        return vec![v];
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str(d.trim()).ok())
        .collect()
}

fn mcp_post(token: &str, session: Option<&str>, body: Value) -> Request<Body> {
    let mut builder = request("POST", "/mcp")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream");
    if let Some(id) = session {
        builder = builder
            .header("mcp-session-id", id)
            .header("mcp-protocol-version", "2025-06-18");
    }
    let body = body.to_string();
    builder
        .header(header::CONTENT_LENGTH, body.len())
        .body(Body::from(body))
        .unwrap()
}

#[tokio::test]
async fn ready_names_what_it_waits_for() {
    let app = app(config(&dead_addr().await).await);
    let ready = || async {
        let response = app
            .clone()
            .oneshot(request("GET", "/ready").body(Body::empty()).unwrap())
            .await
            .unwrap();
        (response.status(), body_json(response).await)
    };
    assert_eq!(
        ready().await,
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"ok": false, "waitingFor": ["auth"]})
        )
    );
    // An embedded store being restarted by `kgmesh up`, in this process.
    kg_common::readiness::mark_down("falkordb");
    let (status, body) = ready().await;
    kg_common::readiness::mark_up("falkordb");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["waitingFor"], json!(["falkordb", "auth"]));
}

#[tokio::test]
async fn ready_follows_auths_health_which_says_whether_its_database_answers() {
    use tonic_health::ServingStatus;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let (reporter, health) = tonic_health::server::health_reporter();
    let stop = CancellationToken::new();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener),
                stop.clone().cancelled_owned(),
            ),
    );
    let app = app(config(&addr).await);
    let ready = || async {
        let response = app
            .clone()
            .oneshot(request("GET", "/ready").body(Body::empty()).unwrap())
            .await
            .unwrap();
        (response.status(), body_json(response).await)
    };
    reporter
        .set_service_status("kg.v1.Auth", ServingStatus::NotServing)
        .await;
    assert_eq!(
        ready().await,
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"ok": false, "waitingFor": ["auth"]})
        ),
        "auth answers, but cannot reach its database"
    );
    reporter
        .set_service_status("kg.v1.Auth", ServingStatus::Serving)
        .await;
    assert_eq!(ready().await, (StatusCode::OK, json!({"ok": true})));
    stop.cancel();
}

#[tokio::test]
async fn health_metrics_and_metadata_need_no_auth() {
    let app = app(config(&dead_addr().await).await);
    let response = app
        .clone()
        .oneshot(request("GET", "/health").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body_json(response).await, json!({"ok": true}));

    let response = app
        .clone()
        .oneshot(request("GET", "/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let text = body_json(response).await["raw"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(text.contains("kgmesh_audit_dropped_total"), "{text}");
    assert!(text.trim_end().ends_with("# EOF"));

    let response = app
        .clone()
        .oneshot(
            request("GET", "/.well-known/oauth-protected-resource")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        body_json(response).await,
        json!({"resource": "http://localhost:7300/mcp", "bearer_methods_supported": ["header"], "resource_name": "kgmesh"})
    );

    let response = app
        .oneshot(request("GET", "/nope").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(body_json(response).await["code"], "not_found");
}

#[tokio::test]
async fn mcp_without_a_usable_token_is_401_with_a_challenge() {
    let auth = start_auth().await;
    let app = app(config(&auth.addr).await);

    let response = app
        .clone()
        .oneshot(request("POST", "/mcp").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let challenge = response.headers()[header::WWW_AUTHENTICATE]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        challenge,
        "Bearer resource_metadata=\"http://localhost:7300/.well-known/oauth-protected-resource\""
    );
    let body = body_json(response).await;
    assert_eq!(body["code"], "unauthenticated");
    assert_eq!(body["retryable"], false);

    // Not a kgmesh PAT: refused without asking auth.
    let response = app
        .clone()
        .oneshot(
            request("POST", "/mcp")
                .header(header::AUTHORIZATION, "Bearer ghp_abc")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(auth.authorize_calls.load(Ordering::SeqCst), 0);

    // Revoked (auth says unauthenticated): 401 naming invalid_token.
    let response = app
        .clone()
        .oneshot(
            request("POST", "/mcp")
                .header(header::AUTHORIZATION, format!("Bearer {REVOKED}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert!(
        response.headers()[header::WWW_AUTHENTICATE]
            .to_str()
            .unwrap()
            .contains("error=\"invalid_token\"")
    );
    assert_eq!(auth.authorize_calls.load(Ordering::SeqCst), 1);

    // Admin REST sits behind the same guard; /health does not.
    let response = app
        .oneshot(
            request("GET", "/api/v1/namespaces")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);

    // No principal to audit, but each refusal is counted by why (a revoked token still in
    // use shows as `refused`).
    let exported = crate::metrics::encode_text();
    for line in [
        "kgmesh_bearer_refused_total{reason=\"missing\"} 2",
        "kgmesh_bearer_refused_total{reason=\"malformed\"} 1",
        "kgmesh_bearer_refused_total{reason=\"refused\"} 1",
    ] {
        assert!(exported.contains(line), "{line} not in\n{exported}");
    }
}

#[tokio::test]
async fn malformed_json_rpc_is_answered_with_json_rpc_errors() {
    let auth = start_auth().await;
    let app = app(config(&auth.addr).await);
    let raw = |token: &str, body: &str| {
        request("POST", "/mcp")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream")
            .header(header::CONTENT_LENGTH, body.len())
            .body(Body::from(body.to_owned()))
            .unwrap()
    };
    // rmcp answered these with 415 and a plain-text serde message.
    let response = app.clone().oneshot(raw(GOOD, "{bad json")).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body = body_json(response).await;
    assert_eq!(
        (body["error"]["code"].clone(), body["id"].clone()),
        (json!(-32700), Value::Null)
    );
    let batch = r#"[{"jsonrpc":"2.0","id":11,"method":"tools/list"}]"#;
    let response = app.clone().oneshot(raw(GOOD, batch)).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(body_json(response).await["error"]["code"], -32600);
    // rmcp answered this one "method not found" (-32601) naming only the method.
    let call = r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"kg_search","arguments":"x"}}"#;
    let response = app.clone().oneshot(raw(GOOD, call)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = body_json(response).await;
    assert_eq!(
        (body["error"]["code"].clone(), body["id"].clone()),
        (json!(-32602), json!(5))
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("params.arguments"),
        "{body}"
    );
    // The bearer still comes first: without a token nothing about the body is said.
    let response = app.oneshot(raw(REVOKED, "{bad json")).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn bad_origin_and_host_are_403_before_auth() {
    let auth = start_auth().await;
    let app = app(config(&auth.addr).await);
    let response = app
        .clone()
        .oneshot(
            request("POST", "/mcp")
                .header(header::ORIGIN, "https://evil.example")
                .header(header::AUTHORIZATION, format!("Bearer {GOOD}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert_eq!(body_json(response).await["code"], "permission_denied");

    let response = app
        .oneshot(
            Request::builder()
                .method("POST")
                .uri("/mcp")
                .header(header::HOST, "attacker.example")
                .header(header::AUTHORIZATION, format!("Bearer {GOOD}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert_eq!(auth.authorize_calls.load(Ordering::SeqCst), 0);
}

/// A browser app served from an allowed origin can call: its preflight is answered without a
/// bearer, and every answer (a 401 included) carries the headers the page needs to read it.
#[tokio::test]
async fn allowed_origins_get_cors_answers_and_others_do_not() {
    let auth = start_auth().await;
    let app = app(config(&auth.addr).await);
    let preflight = |origin: &str| {
        request("OPTIONS", "/mcp")
            .header(header::ORIGIN, origin)
            .header(header::ACCESS_CONTROL_REQUEST_METHOD, "POST")
            .header(
                header::ACCESS_CONTROL_REQUEST_HEADERS,
                "authorization, content-type, mcp-session-id, mcp-protocol-version",
            )
            .body(Body::empty())
            .unwrap()
    };
    let response = app
        .clone()
        .oneshot(preflight("https://app.example"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers();
    assert_eq!(
        headers[header::ACCESS_CONTROL_ALLOW_ORIGIN],
        "https://app.example"
    );
    let methods = headers[header::ACCESS_CONTROL_ALLOW_METHODS]
        .to_str()
        .unwrap();
    assert!(
        methods.contains("POST") && methods.contains("DELETE"),
        "{methods}"
    );
    let allowed = headers[header::ACCESS_CONTROL_ALLOW_HEADERS]
        .to_str()
        .unwrap();
    assert!(allowed.contains("authorization") && allowed.contains("mcp-session-id"));
    assert!(
        headers
            .get(header::ACCESS_CONTROL_ALLOW_CREDENTIALS)
            .is_none()
    );

    let refused = app
        .clone()
        .oneshot(preflight("https://evil.example"))
        .await
        .unwrap();
    assert!(
        refused
            .headers()
            .get(header::ACCESS_CONTROL_ALLOW_ORIGIN)
            .is_none()
    );

    // No bearer: a 401 the page can read, with the challenge exposed to it.
    let response = app
        .clone()
        .oneshot(
            request("POST", "/mcp")
                .header(header::ORIGIN, "https://app.example")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        response.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN],
        "https://app.example"
    );
    let exposed = response.headers()[header::ACCESS_CONTROL_EXPOSE_HEADERS]
        .to_str()
        .unwrap()
        .to_ascii_lowercase();
    assert!(
        exposed.contains("www-authenticate") && exposed.contains("mcp-session-id"),
        "{exposed}"
    );
    assert_eq!(auth.authorize_calls.load(Ordering::SeqCst), 0);

    // With no allowed origin there is no CORS at all: a preflight is not answered.
    let mut closed = config(&auth.addr).await;
    closed.allowed_origins.clear();
    let response = super::router(GatewayState::new(closed, CancellationToken::new()).unwrap())
        .oneshot(preflight("https://app.example"))
        .await
        .unwrap();
    assert_ne!(response.status(), StatusCode::OK);
    assert!(
        response
            .headers()
            .get(header::ACCESS_CONTROL_ALLOW_ORIGIN)
            .is_none()
    );
}

#[tokio::test]
async fn auth_outage_is_503_and_retryable() {
    let app = app(config(&dead_addr().await).await);
    let response = app
        .oneshot(
            request("POST", "/mcp")
                .header(header::AUTHORIZATION, format!("Bearer {GOOD}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body = body_json(response).await;
    assert_eq!(body["code"], "unavailable");
    assert_eq!(body["retryable"], true);
}

#[tokio::test]
async fn mcp_session_lists_and_calls_tools() {
    let auth = start_auth().await;
    let app = app(config(&auth.addr).await);
    let (session, messages) = initialize(&app).await;
    assert_eq!(messages[0]["result"]["serverInfo"]["name"], "kgmesh");
    assert!(messages[0]["result"]["capabilities"]["tools"].is_object());

    let response = app
        .clone()
        .oneshot(mcp_post(
            GOOD,
            Some(&session),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);

    let response = app
        .clone()
        .oneshot(mcp_post(
            GOOD,
            Some(&session),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        ))
        .await
        .unwrap();
    let messages = rpc_messages(response).await;
    let names: Vec<&str> = messages[0]["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "kg_namespaces",
            "kg_search",
            "kg_open",
            "kg_outline",
            "kg_files",
            "kg_file",
            "kg_hop",
            "kg_ontology",
            "kg_file_entities",
            "kg_file_triples",
            "kg_cypher",
            "get_knowledge_graph",
            "kg_entity_search"
        ]
    );
    assert_eq!(
        messages[0]["result"]["tools"][1]["annotations"]["readOnlyHint"],
        true
    );

    // The caller authorized for this HTTP request reaches the tool.
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "kg_namespaces", "arguments": {}}});
    let response = app
        .clone()
        .oneshot(mcp_post(GOOD, Some(&session), call))
        .await
        .unwrap();
    let result = &rpc_messages(response).await[0]["result"];
    assert_eq!(result["isError"], false);
    assert_eq!(
        result["structuredContent"],
        json!({"namespaces": [{"name": "demo", "permission": "read"}]})
    );
    let text: Value = serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(text, result["structuredContent"]);

    // Validation failures are tool errors with the stable shape.
    let call = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "kg_search", "arguments": {"query": "canary zebra", "topK": 99}}});
    let response = app
        .clone()
        .oneshot(mcp_post(GOOD, Some(&session), call))
        .await
        .unwrap();
    let result = &rpc_messages(response).await[0]["result"];
    assert_eq!(result["isError"], true);
    let error = tool_error(result);
    assert_eq!(error["code"], "invalid_argument");
    assert!(error["message"].as_str().unwrap().contains("32"));

    // An unreadable namespace is an explicit permission error.
    let call = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "kg_outline", "arguments": {"namespace": "secret", "fileId": "canary-file"}}});
    let response = app
        .clone()
        .oneshot(mcp_post(GOOD, Some(&session), call))
        .await
        .unwrap();
    let result = &rpc_messages(response).await[0]["result"];
    assert_eq!(tool_error(result)["code"], "permission_denied");

    // Unknown tool: a protocol error, not a tool result.
    let call = json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "kg_nope", "arguments": {}}});
    let response = app
        .clone()
        .oneshot(mcp_post(GOOD, Some(&session), call))
        .await
        .unwrap();
    let message = &rpc_messages(response).await[0];
    assert!(
        message["error"]["message"]
            .as_str()
            .unwrap()
            .contains("kg_nope")
    );

    // Every HTTP request was authorized again.
    assert_eq!(auth.authorize_calls.load(Ordering::SeqCst), 7);

    // A revoked token cannot ride an existing session.
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "kg_namespaces", "arguments": {}}});
    let response = app
        .oneshot(mcp_post(REVOKED, Some(&session), call))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);

    // One audit event per tool call: the unknown tool and the 401 are not tool calls.
    let audits = auth.recorded.wait_audits(3).await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let audits_now = auth.recorded.audits();
    assert_eq!(audits_now.len(), 3, "{audits_now:?}");
    let by_tool = |tool: &str| audits.iter().find(|e| e.tool == tool).unwrap().clone();
    let ok = by_tool("kg_namespaces");
    assert_eq!(
        (
            ok.outcome.as_str(),
            ok.principal_id.as_str(),
            ok.transport.as_str()
        ),
        ("ok", "usr_test", "http")
    );
    assert!(ok.result_bytes > 0 && !ok.request_id.is_empty() && ok.at_ms > 0);
    let invalid = by_tool("kg_search");
    assert_eq!(invalid.outcome, "invalid_argument");
    assert!(invalid.namespaces.is_empty());
    let denied = by_tool("kg_outline");
    assert_eq!(denied.outcome, "permission_denied");
    assert_eq!(denied.namespaces, ["secret"]);
    // Neither argument text (query, fileId) nor the token is in any event.
    let dump = format!("{audits:?}");
    assert!(!dump.contains("canary") && !dump.contains(GOOD), "{dump}");
}

#[tokio::test]
async fn a_bare_curl_post_with_a_bearer_gets_its_200() {
    // The documented check of a token: a bearer, a JSON body, and curl's own `Accept: */*`
    // (or none at all); a 2024-11-05 client.
    let auth = start_auth().await;
    let app = app(config(&auth.addr).await);
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "test", "version": "1.0"}}})
    .to_string();
    for accept in [Some("*/*"), None] {
        let mut builder = request("POST", "/mcp")
            .header(header::AUTHORIZATION, format!("Bearer {GOOD}"))
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CONTENT_LENGTH, init.len());
        if let Some(accept) = accept {
            builder = builder.header(header::ACCEPT, accept);
        }
        let response = app
            .clone()
            .oneshot(builder.body(Body::from(init.clone())).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "Accept {accept:?}");
        let messages = rpc_messages(response).await;
        assert_eq!(messages[0]["result"]["serverInfo"]["name"], "kgmesh");
    }
    // A client that names one type alone keeps its header, and rmcp's answer to it.
    let response = app
        .clone()
        .oneshot(
            request("POST", "/mcp")
                .header(header::AUTHORIZATION, format!("Bearer {GOOD}"))
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::ACCEPT, "text/html")
                .header(header::CONTENT_LENGTH, init.len())
                .body(Body::from(init))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_ACCEPTABLE);
}

/// Sends `initialize` for `GOOD`: the new session's id and the answer's messages.
async fn initialize(app: &axum::Router) -> (String, Vec<Value>) {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}});
    let response = app
        .clone()
        .oneshot(mcp_post(GOOD, None, init))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let session = response.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    (session, rpc_messages(response).await)
}

/// Opens an MCP session for `GOOD` (initialize, then initialized) and returns its id.
async fn open_session(app: &axum::Router) -> String {
    let (session, _) = initialize(app).await;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let response = app
        .clone()
        .oneshot(mcp_post(GOOD, Some(&session), initialized))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    session
}

/// A tool call in `session`: its HTTP status and JSON-RPC messages.
async fn call_in(
    app: &axum::Router,
    session: &str,
    id: u64,
    tool: &str,
    arguments: Value,
) -> (StatusCode, Vec<Value>) {
    let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": tool, "arguments": arguments}});
    let response = app
        .clone()
        .oneshot(mcp_post(GOOD, Some(session), call))
        .await
        .unwrap();
    let status = response.status();
    (status, rpc_messages(response).await)
}

#[tokio::test]
async fn a_tool_call_runs_beside_auth_and_waits_for_its_answer() {
    let auth = start_auth().await;
    let app = app(full_config(&auth).await);
    let session = open_session(&app).await;
    let file_args = json!({"namespace": "demo", "path": "notes/a.md"});

    let metrics = crate::metrics::gateway_metrics();
    let (released, rerun, refused) = (
        metrics.run_ahead_released.get(),
        metrics.run_ahead_rerun.get(),
        metrics.run_ahead_refused.get(),
    );
    // Auth has answered for this token before: the next call's backend request reaches
    // files while auth is still deciding (the double holds Authorize until it does).
    let (status, _) = call_in(&app, &session, 2, "kg_file", file_args.clone()).await;
    assert_eq!(status, StatusCode::OK);
    auth.recorded.hold_authorize.store(true, Ordering::SeqCst);
    let (status, messages) = call_in(&app, &session, 3, "kg_file", file_args.clone()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        auth.recorded.backend_before_answer.load(Ordering::SeqCst),
        "the backend call waited for Authorize"
    );
    assert_eq!(
        messages[0]["result"]["structuredContent"]["file"]["path"], "notes/a.md",
        "{messages:?}"
    );
    auth.recorded.hold_authorize.store(false, Ordering::SeqCst);

    // A grant made between calls applies to the next call: the answer computed on the
    // earlier access is dropped and the tool runs again.
    let (_, messages) = call_in(&app, &session, 4, "kg_namespaces", json!({})).await;
    assert_eq!(
        messages[0]["result"]["structuredContent"],
        json!({"namespaces": [{"name": "demo", "permission": "read"}]})
    );
    auth.recorded
        .extra_namespaces
        .lock()
        .unwrap()
        .push("docs".into());
    let (_, messages) = call_in(&app, &session, 5, "kg_namespaces", json!({})).await;
    assert_eq!(
        messages[0]["result"]["structuredContent"],
        json!({"namespaces": [
            {"name": "demo", "permission": "read"},
            {"name": "docs", "permission": "read"}
        ]}),
        "{messages:?}"
    );

    // A revocation between calls: the call that ran ahead is answered 401, and without
    // its result; the next one does not run ahead.
    auth.recorded.good_revoked.store(true, Ordering::SeqCst);
    let before = auth.recorded.query_file_calls.load(Ordering::SeqCst);
    let (status, messages) = call_in(&app, &session, 6, "kg_file", file_args.clone()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        !format!("{messages:?}").contains("notes/a.md"),
        "{messages:?}"
    );
    assert_eq!(
        auth.recorded.query_file_calls.load(Ordering::SeqCst),
        before + 1
    );
    let (status, _) = call_in(&app, &session, 7, "kg_file", file_args).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        auth.recorded.query_file_calls.load(Ordering::SeqCst),
        before + 1,
        "a refused token ran ahead again"
    );

    // Counted for operators (other tests in this process may add to the counters).
    assert!(metrics.run_ahead_released.get() > released);
    assert!(metrics.run_ahead_rerun.get() > rerun);
    assert!(metrics.run_ahead_refused.get() > refused);

    // Audit: one event per tool call that auth allowed, each with its own request id.
    let audits = auth.recorded.wait_audits(4).await;
    let ids: std::collections::HashSet<&str> =
        audits.iter().map(|e| e.request_id.as_str()).collect();
    assert_eq!(ids.len(), audits.len(), "{audits:?}");
}

#[tokio::test]
async fn session_tool_calls_are_answered_as_json_on_the_request_task() {
    let auth = start_auth().await;
    let app = app(config(&auth.addr).await);
    let session = open_session(&app).await;
    let content_type = |r: &axum::response::Response| {
        r.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .to_owned()
    };
    let call = |id: u64, meta: Option<Value>| {
        let mut params = json!({"name": "kg_namespaces", "arguments": {}});
        if let Some(meta) = meta {
            params["_meta"] = meta;
        }
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
    };
    let expected = json!({"namespaces": [{"name": "demo", "permission": "read"}]});

    let direct = crate::metrics::gateway_metrics().session_calls_direct.get();
    // rmcp saw the session a moment ago (`notifications/initialized`), so its tool calls
    // are answered here, as JSON.
    for (id, media) in [(2, "application/json"), (3, "application/json")] {
        let response = app
            .clone()
            .oneshot(mcp_post(GOOD, Some(&session), call(id, None)))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(content_type(&response), media);
        let messages = rpc_messages(response).await;
        assert_eq!(messages.len(), 1, "{messages:?}");
        assert_eq!(messages[0]["id"], id);
        assert_eq!(messages[0]["result"]["structuredContent"], expected);
        assert_eq!(messages[0]["result"]["isError"], false);
        // The wire shape of the session's revision: no `resultType`.
        assert!(
            messages[0]["result"].get("resultType").is_none(),
            "{messages:?}"
        );
    }

    assert!(crate::metrics::gateway_metrics().session_calls_direct.get() >= direct + 2);

    // A progress token is rmcp's business: it answers, over SSE.
    let response = app
        .clone()
        .oneshot(mcp_post(
            GOOD,
            Some(&session),
            call(4, Some(json!({"progressToken": "p1"}))),
        ))
        .await
        .unwrap();
    assert_eq!(content_type(&response), "text/event-stream");
    assert_eq!(
        rpc_messages(response).await[0]["result"]["structuredContent"],
        expected
    );

    // A standard header that contradicts the body is left to rmcp (which, in a session
    // of this revision, ignores it).
    let mut request = mcp_post(GOOD, Some(&session), call(5, None));
    request
        .headers_mut()
        .insert("mcp-name", "kg_search".parse().unwrap());
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(content_type(&response), "text/event-stream");

    // An unknown session is rmcp's 404, and an unknown tool its JSON-RPC error.
    let response = app
        .clone()
        .oneshot(mcp_post(GOOD, Some("no-such-session"), call(6, None)))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let unknown = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "kg_nope", "arguments": {}}});
    let response = app
        .clone()
        .oneshot(mcp_post(GOOD, Some(&session), unknown))
        .await
        .unwrap();
    assert!(
        rpc_messages(response).await[0]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("kg_nope")
    );

    // Every tool call answered, wherever, was audited once.
    let audits = auth.recorded.wait_audits(4).await;
    assert!(
        audits
            .iter()
            .all(|e| e.tool == "kg_namespaces" && e.outcome == "ok")
    );
}

#[tokio::test]
async fn a_tools_list_cursor_this_server_never_issued_is_invalid_params() {
    let auth = start_auth().await;
    let app = app(full_config(&auth).await);
    let session = open_session(&app).await;
    let list = |params: Value| json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list", "params": params});
    let response = app
        .clone()
        .oneshot(mcp_post(GOOD, Some(&session), list(json!({}))))
        .await
        .unwrap();
    let listed = rpc_messages(response).await;
    assert!(listed[0]["result"]["tools"].is_array(), "{listed:?}");
    assert!(
        listed[0]["result"].get("nextCursor").is_none(),
        "{listed:?}"
    );
    let response = app
        .clone()
        .oneshot(mcp_post(
            GOOD,
            Some(&session),
            list(json!({"cursor": "bogus"})),
        ))
        .await
        .unwrap();
    let refused = rpc_messages(response).await;
    assert_eq!(refused[0]["error"]["code"], -32602, "{refused:?}");
}

#[tokio::test]
async fn a_session_answers_only_the_principal_that_opened_it() {
    let auth = start_auth().await;
    let app = app(full_config(&auth).await);
    let session = open_session(&app).await;
    let namespaces = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "kg_namespaces", "arguments": {}}});
    let with = |token: &str, method: &str, session: &str| {
        let mut builder = request(method, "/mcp")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header("mcp-session-id", session)
            .header("mcp-protocol-version", "2025-06-18");
        if method == "GET" {
            builder = builder.header(header::ACCEPT, "text/event-stream");
        }
        builder.body(Body::empty()).unwrap()
    };
    // Another principal's token (the agent's) finds no such session, whatever it asks: a
    // tool call (on the direct path and through rmcp alike), its stream, its end.
    for _ in 0..2 {
        let response = app
            .clone()
            .oneshot(mcp_post(doubles::AGENT, Some(&session), namespaces.clone()))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
    }
    for method in ["GET", "DELETE"] {
        let response = app
            .clone()
            .oneshot(with(doubles::AGENT, method, &session))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{method}");
    }
    // The session is untouched for its owner.
    let (status, messages) = call_in(&app, &session, 3, "kg_namespaces", json!({})).await;
    assert_eq!(status, StatusCode::OK);
    assert!(messages[0]["result"].is_object(), "{messages:?}");
    // Its owner ends it; a second DELETE, and one of an id never issued, are 404.
    let response = app
        .clone()
        .oneshot(with(GOOD, "DELETE", &session))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    for id in [session.as_str(), "no-such-session"] {
        let response = app.clone().oneshot(with(GOOD, "DELETE", id)).await.unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{id}");
    }
}

#[tokio::test]
async fn admin_rest_forwards_the_signed_context() {
    let auth = start_auth().await;
    let mut config = config(&auth.addr).await;
    config.max_upload_bytes = 8;
    let app = app(config);
    let response = app
        .clone()
        .oneshot(
            request("GET", "/api/v1/namespaces")
                .header(header::AUTHORIZATION, format!("Bearer {GOOD}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        body_json(response).await,
        json!({"namespaces": [{"name": "seen-by-usr_test", "description": "", "createdAtMs": 1}]})
    );

    // A method an endpoint does not take: JSON like every other refusal (it was empty).
    let response = app
        .clone()
        .oneshot(
            request("DELETE", "/api/v1/namespaces")
                .header(header::AUTHORIZATION, format!("Bearer {GOOD}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    let body = body_json(response).await;
    assert_eq!(body["code"], "invalid_argument", "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("/api/v1/namespaces does not take DELETE"),
        "{body}"
    );

    // Auth's own answer maps through the code table (unimplemented -> 500, masked).
    let response = app
        .clone()
        .oneshot(
            request("GET", "/api/v1/principals")
                .header(header::AUTHORIZATION, format!("Bearer {GOOD}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        body_json(response).await["message"],
        kg_common::error::INTERNAL_MESSAGE
    );

    let response = app
        .clone()
        .oneshot(
            request("POST", "/api/v1/principals")
                .header(header::AUTHORIZATION, format!("Bearer {GOOD}"))
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(r#"{"name":"bot","kind":"robot"}"#))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(
        body_json(response).await["message"]
            .as_str()
            .unwrap()
            .contains("user, agent or service")
    );

    let response = app
        .clone()
        .oneshot(
            request("PUT", "/api/v1/namespaces/demo/files/a.md")
                .header(header::AUTHORIZATION, format!("Bearer {GOOD}"))
                .body(Body::from("far more than eight bytes"))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(body_json(response).await["code"], "PAYLOAD_TOO_LARGE");

    let response = app
        .oneshot(
            request("PUT", "/api/v1/namespaces/demo/files/../etc/passwd")
                .header(header::AUTHORIZATION, format!("Bearer {GOOD}"))
                .body(Body::from("x"))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_principal_is_disabled_and_enabled_with_a_patch() {
    let fixture = start_auth().await;
    let app = app(full_config(&fixture).await);
    let send = async |uri: &str, json: &str| {
        let request = request("PATCH", uri)
            .header(header::AUTHORIZATION, format!("Bearer {GOOD}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(json.to_owned()))
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        (response.status(), body_json(response).await)
    };

    let (status, body) = send("/api/v1/principals/usr_lea", r#"{"disabled": true}"#).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["id"], &body["disabled"], &body["disabledAtMs"]),
        (&json!("usr_lea"), &json!(true), &json!(42))
    );
    assert!(
        fixture
            .recorded
            .saw(&kg_proto::v1::SetPrincipalDisabledRequest {
                id: "usr_lea".into(),
                disabled: true,
            })
    );
    let (status, body) = send("/api/v1/principals/usr_lea", r#"{"disabled": false}"#).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["disabled"], json!(false));
    assert!(body.get("disabledAtMs").is_none(), "{body}");

    let (status, body) = send("/api/v1/principals/usr_nobody", r#"{"disabled": true}"#).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    // The one field is required, and nothing else is taken; a body that is no object is not
    // read positionally into the fields (`[true]` was taken for `{"disabled": true}`).
    for (bad, says) in [
        (r#"{}"#, "missing field `disabled`"),
        (r#"{"disabled": "yes"}"#, "invalid type"),
        (
            r#"{"disabled": true, "isAdmin": true}"#,
            "unknown field `isAdmin`",
        ),
        ("[true]", "must be a JSON object"),
        ("true", "must be a JSON object"),
        (r#""disabled""#, "must be a JSON object"),
    ] {
        let (status, body) = send("/api/v1/principals/usr_lea", bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert_eq!(body["code"], "invalid_argument", "{bad}: {body}");
        let message = body["message"].as_str().unwrap();
        assert!(message.contains(says), "{bad}: {message}");
        assert!(!message.contains("PrincipalChangeBody"), "{bad}: {message}");
    }
    let audits = fixture.recorded.wait_audits(9).await;
    let targets: Vec<(&str, &str)> = audits
        .iter()
        .filter(|a| a.tool == "admin:PATCH /api/v1/principals/{id}")
        .map(|a| (a.target.as_str(), a.outcome.as_str()))
        .collect();
    // Whether each one disabled or enabled, made or refused; bodies that say neither, plain.
    for wanted in [
        ("/api/v1/principals/usr_lea?disabled=true", "ok"),
        ("/api/v1/principals/usr_lea?disabled=false", "ok"),
        ("/api/v1/principals/usr_nobody?disabled=true", "not_found"),
        ("/api/v1/principals/usr_lea", "invalid_argument"),
    ] {
        assert!(targets.contains(&wanted), "{wanted:?} in {targets:?}");
    }
}

#[tokio::test]
async fn a_namespace_deletion_runs_across_the_services_and_holds_its_name() {
    let fixture = start_auth().await;
    let app = app(full_config(&fixture).await);
    let recorded = &fixture.recorded;
    let send = async |method: &str, uri: &str, body: Option<&str>| {
        let builder = request(method, uri).header(header::AUTHORIZATION, format!("Bearer {GOOD}"));
        let request = match body {
            Some(json) => builder
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(json.to_owned())),
            None => builder.body(Body::empty()),
        };
        let response = app.clone().oneshot(request.unwrap()).await.unwrap();
        (response.status(), body_json(response).await)
    };

    // Auth retires it, files purges it, auth forgets it; no ontology service, no TBox step.
    let (status, body) = send("DELETE", "/api/v1/namespaces/live", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (
            &body["retiredAtMs"],
            &body["grantsRemoved"],
            &body["filesRemoved"]
        ),
        (&json!(3), &json!(2), &json!(4))
    );
    assert_eq!(
        body["purge"],
        json!({"requestedAtMs": 7, "purgedAtMs": 0, "done": false})
    );
    assert!(body["tbox"]["skipped"].is_string(), "{body}");
    assert!(recorded.saw(&kg_proto::v1::DeleteNamespaceRequest {
        name: "live".into()
    }));

    // Auth forgot it but the indexer has not reported: files is asked again, auth is not.
    let (status, body) = send("DELETE", "/api/v1/namespaces/purging", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["retiredAtMs"], json!(0));
    assert!(recorded.saw(&kg_proto::v1::PurgeNamespaceRequest {
        namespace: "purging".into()
    }));
    assert!(!recorded.saw(&kg_proto::v1::DeleteNamespaceRequest {
        name: "purging".into()
    }));
    // Purged and reported, or never there: not found.
    for gone in ["purged", "never"] {
        let (status, body) = send("DELETE", &format!("/api/v1/namespaces/{gone}"), None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{gone}: {body}");
        assert!(!recorded.saw(&kg_proto::v1::PurgeNamespaceRequest {
            namespace: gone.into()
        }));
    }
    let (status, _) = send("DELETE", "/api/v1/namespaces/bad.name", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // The name stays taken until the indexer has reported.
    let (status, body) = send("POST", "/api/v1/namespaces", Some(r#"{"name":"purging"}"#)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("still removing its graph and vectors"),
        "{body}"
    );
    assert!(!recorded.saw(&kg_proto::v1::CreateNamespaceRequest {
        name: "purging".into(),
        description: String::new()
    }));
    for free in ["purged", "fresh"] {
        let json = format!(r#"{{"name":"{free}"}}"#);
        let (status, body) = send("POST", "/api/v1/namespaces", Some(&json)).await;
        assert_eq!(status, StatusCode::CREATED, "{free}: {body}");
    }
    let (status, body) = send("GET", "/api/v1/namespaces/purging/purge", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({"namespace": "purging", "requestedAtMs": 5, "purgedAtMs": 0, "done": false})
    );
}

/// Reads JSON-RPC lines until the response with `id` arrives.
async fn read_response<R: tokio::io::AsyncBufRead + Unpin>(
    lines: &mut tokio::io::Lines<R>,
    id: u64,
) -> Value {
    loop {
        let line = tokio::time::timeout(std::time::Duration::from_secs(10), lines.next_line())
            .await
            .expect("timed out waiting for a frame")
            .unwrap()
            .expect("stream ended");
        let message: Value = serde_json::from_str(&line).expect("every line is a JSON-RPC frame");
        if message["id"] == json!(id) {
            return message;
        }
    }
}

async fn stdio_session(token: &str, auth: &AuthFixture) -> (Value, Value) {
    use rmcp::ServiceExt as _;
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};

    let state = GatewayState::new(config(&auth.addr).await, CancellationToken::new()).unwrap();
    let server = crate::mcp::McpServer::for_launcher(
        state,
        crate::mcp::ToolRegistry::builtin(),
        token.to_owned(),
        String::new(),
    );
    let (client, server_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    let (read, mut write) = tokio::io::split(client);
    let mut lines = tokio::io::BufReader::new(read).lines();
    let frames = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    ];
    for frame in &frames {
        write
            .write_all(format!("{frame}\n").as_bytes())
            .await
            .unwrap();
    }
    let init = read_response(&mut lines, 1).await;
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "kg_namespaces", "arguments": {}}});
    write
        .write_all(format!("{call}\n").as_bytes())
        .await
        .unwrap();
    let result = read_response(&mut lines, 2).await;
    (init, result)
}

#[tokio::test]
async fn stdio_authorizes_the_token_on_every_tool_call() {
    let auth = start_auth().await;
    let (init, first) = stdio_session(GOOD, &auth).await;
    assert_eq!(init["result"]["serverInfo"]["name"], "kgmesh");
    assert_eq!(
        first["result"]["structuredContent"],
        json!({"namespaces": [{"name": "demo", "permission": "read"}]})
    );
    // Initialize needs no authorization; the tool call does.
    assert_eq!(auth.authorize_calls.load(Ordering::SeqCst), 1);

    let (_, result) = stdio_session(REVOKED, &auth).await;
    assert_eq!(result["result"]["isError"], true);
    assert_eq!(tool_error(&result["result"])["code"], "unauthenticated");
    assert_eq!(auth.authorize_calls.load(Ordering::SeqCst), 2);

    // Only the authorized call is audited, as a stdio call with its result size.
    let audits = auth.recorded.wait_audits(1).await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(auth.recorded.audits().len(), 1);
    let text = result_text_len(&first);
    assert_eq!(
        (
            audits[0].tool.as_str(),
            audits[0].outcome.as_str(),
            audits[0].transport.as_str()
        ),
        ("kg_namespaces", "ok", "stdio")
    );
    assert_eq!(audits[0].result_bytes, text);
}

/// The `{code, message, retryable}` of an error tool result, read from its text block; an
/// error carries no structuredContent (MCP TypeScript SDK 1.x clients check it against the
/// tool's outputSchema even on errors).
fn tool_error(result: &Value) -> Value {
    assert_eq!(result["isError"], true, "{result}");
    assert!(result.get("structuredContent").is_none(), "{result}");
    serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap()
}

/// Bytes of the text content of a tools/call response.
fn result_text_len(response: &Value) -> i64 {
    response["result"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["text"].as_str())
        .map(|t| t.len() as i64)
        .sum()
}

/// A 2026-07-28 tools/call as its clients send it: no session, the revision in a header and
/// in `_meta`, SEP-2243 headers naming the method and tool. `extra_meta` adds `_meta` keys.
fn sessionless_call(id: u64, tool: &str, extra_meta: Value) -> axum::http::Request<Body> {
    let mut meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "0"}
    });
    if let (Some(meta), Some(extra)) = (meta.as_object_mut(), extra_meta.as_object()) {
        meta.extend(extra.clone());
    }
    let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": tool, "arguments": {}, "_meta": meta}})
    .to_string();
    request("POST", "/mcp")
        .header(header::AUTHORIZATION, format!("Bearer {GOOD}"))
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .header(header::CONTENT_LENGTH, call.len())
        .body(Body::from(call))
        .unwrap()
}

#[tokio::test]
async fn stateless_2026_requests_carry_the_caller_too() {
    let auth = start_auth().await;
    let app = app(config(&auth.addr).await);
    let expected = json!({"namespaces": [{"name": "demo", "permission": "read"}]});
    let direct = || {
        crate::metrics::gateway_metrics()
            .sessionless_calls_direct
            .get()
    };

    // Answered here, on the request's task, as JSON in the revision's shape.
    let before = direct();
    let response = app
        .clone()
        .oneshot(sessionless_call(1, "kg_namespaces", json!({})))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
    assert!(response.headers().get("mcp-session-id").is_none());
    let ours = rpc_messages(response).await;
    assert_eq!(ours.len(), 1, "{ours:?}");
    assert_eq!(ours[0]["result"]["structuredContent"], expected, "{ours:?}");
    assert_eq!(ours[0]["result"]["resultType"], "complete", "{ours:?}");
    assert!(direct() > before, "the call went through rmcp");

    // A `_meta` key this layer does not know (trace context here) leaves the call to rmcp,
    // whose answer is the same message.
    let before = direct();
    let response = app
        .clone()
        .oneshot(sessionless_call(
            1,
            "kg_namespaces",
            json!({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}),
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let theirs = rpc_messages(response).await;
    assert_eq!(ours, theirs);
    assert_eq!(direct(), before, "rmcp's call was answered here");

    // What rmcp refuses is still refused, by rmcp: a missing Mcp-Name header, a `_meta`
    // revision that contradicts the header.
    let mut missing_name = sessionless_call(2, "kg_namespaces", json!({}));
    missing_name.headers_mut().remove("mcp-name");
    let contradicting = sessionless_call(
        3,
        "kg_namespaces",
        json!({"io.modelcontextprotocol/protocolVersion": "2025-11-25"}),
    );
    for refused in [missing_name, contradicting] {
        let before = direct();
        let response = app.clone().oneshot(refused).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert_eq!(direct(), before);
    }
}

#[tokio::test]
async fn serve_answers_on_a_real_listener_and_stops_on_shutdown() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(crate::serve(
        config(&dead_addr().await).await,
        listener,
        shutdown.clone(),
    ));

    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    assert!(raw.ends_with(r#"{"ok":true}"#), "{raw}");

    shutdown.cancel();
    tokio::time::timeout(std::time::Duration::from_secs(10), server)
        .await
        .expect("serve stops after shutdown")
        .unwrap()
        .unwrap();
}

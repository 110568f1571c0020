//! Audit recording seen from the outside: it never delays a tool call, and an
//! agent's event names the user it acted for.

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde_json::json;
use tower::ServiceExt as _;

use super::doubles::{AGENT, start_auth_with};
use super::{app, full_config, mcp_post, rpc_messages};

#[tokio::test]
async fn a_slow_audit_sink_never_delays_the_call() {
    let auth = start_auth_with(Duration::from_secs(2)).await;
    let app = app(full_config(&auth).await);
    // A stateless-style request: one POST, no session.
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
    "name": "kg_namespaces", "arguments": {},
    "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "0"}
    }}});
    let mut request = mcp_post(AGENT, None, call);
    let headers = request.headers_mut();
    headers.insert("mcp-protocol-version", "2026-07-28".parse().unwrap());
    headers.insert("mcp-method", "tools/call".parse().unwrap());
    headers.insert("mcp-name", "kg_namespaces".parse().unwrap());

    let started = Instant::now();
    let response = app.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let messages = rpc_messages(response).await;
    let elapsed = started.elapsed();
    assert_eq!(messages[0]["result"]["isError"], false, "{messages:?}");
    assert!(
        elapsed < Duration::from_secs(1),
        "the call waited for the audit sink: {elapsed:?}"
    );
    assert!(auth.recorded.audits().is_empty());

    // It still arrives, once auth answers, under the agent and its user.
    let audits = auth.recorded.wait_audits(1).await;
    assert_eq!(audits[0].principal_id, "agt_test");
    assert_eq!(audits[0].on_behalf_of, "usr_test");
    assert_eq!(audits[0].outcome, "ok");
}

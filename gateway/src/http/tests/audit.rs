//! Audit recording seen from the outside: it never delays a tool call, and an
//! agent's event names the user it acted for.

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde_json::json;
use tower::ServiceExt as _;

use kg_common::caller::{ContextSigner, now_ms};
use kg_proto::v1::{AuditEvent, CallerContext};

use super::doubles::{AGENT, serve_auth, start_auth_with};
use super::{app, full_config, mcp_post, rpc_messages};
use crate::audit::AuditSink;
use crate::state::Caller;

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

/// Auth restarting (not listening for a while) leaves no gap in the audit log: the event is
/// sent again until auth is back, within its signed context's lifetime.
#[tokio::test]
async fn an_event_sent_while_auth_restarts_is_recorded_once_it_is_back() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let client = kg_proto::v1::auth_client::AuthClient::new(
        kg_common::grpc::channel(&format!("http://{addr}")).unwrap(),
    );
    let sink = AuditSink::new(client, 16);

    let signer = ContextSigner::generate();
    let context = CallerContext {
        principal_id: "agt_restart".into(),
        issued_at_ms: now_ms(),
        expires_at_ms: now_ms() + 60_000,
        ..Default::default()
    };
    let caller = Caller::for_test(signer.sign(&context), context);
    let event = AuditEvent {
        tool: "kg_search".into(),
        outcome: "ok".into(),
        ..Default::default()
    };
    assert!(sink.record(&caller, event));

    // Auth comes back on its address after the first attempts failed.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let auth = serve_auth(listener, signer, Duration::ZERO);
    let audits = tokio::time::timeout(Duration::from_secs(15), auth.recorded.wait_audits(1))
        .await
        .expect("the event was never recorded after auth came back");
    assert_eq!(audits.len(), 1);
    assert_eq!(audits[0].principal_id, "agt_restart");
    assert_eq!(audits[0].tool, "kg_search");
}

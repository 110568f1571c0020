//! The HTTP surface: `/health`, `/metrics`, protected-resource metadata, the
//! Streamable HTTP MCP endpoint and the admin REST API.

mod admin;
mod admin_audit;
mod approvals;
mod dto;
pub(crate) mod guard;
mod jsonrpc_shape;
mod knowledge_graph;
mod namespaces;
mod session_calls;
mod session_owner;
mod tbox;
mod versions;

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::{Next, from_fn, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use kg_common::ErrorCode;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;

use crate::error::ClientError;
use crate::mcp::{McpServer, ToolRegistry};
use crate::state::GatewayState;
use guard::{BearerGuard, refuse_nul_characters, require_bearer};
use session_calls::{SessionCalls, answer_builtin_tool_calls};
use session_owner::{SessionOwners, bind_sessions_to_principals};

/// Builds the whole HTTP application.
pub fn router(state: GatewayState) -> Router {
    let config = state.config.clone();
    let server = McpServer::for_http(state.clone(), ToolRegistry::builtin());
    let sessions = Arc::new(LocalSessionManager::default());
    let mcp = Router::new()
        .route_service(
            "/mcp",
            mcp_service(&state, server.clone(), sessions.clone()),
        )
        .route_layer(from_fn_with_state(
            SessionCalls::new(server, sessions.clone()),
            answer_builtin_tool_calls,
        ))
        .route_layer(from_fn(closed_session_is_no_content))
        .route_layer(from_fn_with_state(
            SessionOwners::new(sessions),
            bind_sessions_to_principals,
        ))
        .route_layer(from_fn(accept_anything_means_both))
        .route_layer(from_fn(jsonrpc_shape::refuse_malformed_jsonrpc))
        .route_layer(from_fn_with_state(
            BearerGuard {
                state: state.clone(),
                tool: kg_common::caller::MCP_TOOL,
                run_ahead: true,
            },
            require_bearer,
        ));
    // The admin API: the bearer first, then no NUL character in the address or a JSON body;
    // each change that passes the bearer is audited, refused or not.
    let admin_api = |routes: Router| {
        routes
            .route_layer(from_fn(refuse_nul_characters))
            .route_layer(from_fn_with_state(
                state.clone(),
                admin_audit::audit_admin_change,
            ))
            .route_layer(from_fn_with_state(
                BearerGuard {
                    state: state.clone(),
                    tool: kg_common::caller::ADMIN_API_TOOL,
                    run_ahead: false,
                },
                require_bearer,
            ))
    };
    let admin = admin_api(admin::routes(state.clone()));
    let namespaces = admin_api(namespaces::routes(state.clone()));
    let approvals = admin_api(approvals::routes(&state));
    let versions = admin_api(versions::routes(state.clone()));
    let tbox = admin_api(tbox::routes(&state));
    let graph = knowledge_graph::routes(state.clone()).route_layer(from_fn_with_state(
        BearerGuard {
            state: state.clone(),
            tool: "get_knowledge_graph",
            run_ahead: false,
        },
        require_bearer,
    ));
    let app = Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route(
            "/.well-known/oauth-protected-resource",
            get(protected_resource),
        )
        .route(
            "/.well-known/oauth-protected-resource/mcp",
            get(protected_resource),
        )
        .with_state(state)
        .merge(mcp)
        .merge(admin)
        .merge(namespaces)
        .merge(versions)
        .merge(graph)
        .merge(approvals)
        .merge(tbox)
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found);
    let app = match cors(&config) {
        Some(cors) => app.layer(cors),
        None => app,
    };
    // A 5xx is logged where it arises, with its cause and at the level it deserves (a 503 from
    // `/ready` during an outage is expected, once per probe); the trace layer's own ERROR line
    // per failed response would name neither.
    app.layer(
        tower_http::trace::TraceLayer::new_for_http()
            .on_failure(tower_http::trace::DefaultOnFailure::new().level(tracing::Level::DEBUG)),
    )
}

/// How long a browser may reuse a preflight's answer.
const CORS_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(600);

/// CORS for the origins `allowed_origins` lists, so a browser app served from one of them can
/// call `/mcp` and the REST API (every call still carries its bearer PAT; no cookie is ever
/// read, so credentials stay off). The layer answers every preflight itself, before the bearer
/// check, and adds its headers to every answer, errors included, so the page can read a 401's
/// `WWW-Authenticate`. A disallowed origin gets no `Access-Control-Allow-Origin` (the browser
/// then blocks the call) and its requests still get 403 from the origin check. Request headers
/// are mirrored because MCP clients may send `Mcp-Param-*` headers named after arguments.
/// None when no origin is allowed: browsers are then refused as before.
fn cors(config: &crate::config::GatewayConfig) -> Option<tower_http::cors::CorsLayer> {
    use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};
    if config.allowed_origins.is_empty() {
        return None;
    }
    let allowed = config.allowed_origins.clone();
    Some(
        CorsLayer::new()
            .allow_origin(AllowOrigin::predicate(move |origin, _| {
                guard::origin_header_is_allowed(origin, &allowed)
            }))
            .allow_methods([
                Method::GET,
                Method::POST,
                Method::PUT,
                Method::PATCH,
                Method::DELETE,
            ])
            .allow_headers(AllowHeaders::mirror_request())
            .expose_headers([
                header::WWW_AUTHENTICATE,
                header::RETRY_AFTER,
                header::LOCATION,
                header::HeaderName::from_static("mcp-session-id"),
                header::HeaderName::from_static("mcp-protocol-version"),
            ])
            .max_age(CORS_MAX_AGE),
    )
}

/// A POST to `/mcp` that names no media type (no `Accept`, or only `*/*`, as curl sends) takes
/// whatever the server answers; rmcp requires JSON and SSE to be named and would answer 406, so
/// a bare `curl -X POST` with a bearer (the documented way to check a token) never saw its 200.
/// A client that names types keeps its own header.
async fn accept_anything_means_both(mut request: Request, next: Next) -> Response {
    if request.method() == Method::POST && accepts_anything(request.headers()) {
        request.headers_mut().insert(
            header::ACCEPT,
            header::HeaderValue::from_static("application/json, text/event-stream"),
        );
    }
    next.run(request).await
}

/// No `Accept` header, or only `*/*` ranges (with or without parameters).
fn accepts_anything(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .flat_map(|value| value.to_str().unwrap_or("-").split(','))
        .all(|range| range.split(';').next().unwrap_or_default().trim() == "*/*")
}

/// rmcp answers a session DELETE with 202 Accepted, though the session is already closed
/// when it answers: 204 says that, and is what the MCP Python SDK expects (it logs
/// "Session termination failed: 202" for anything but 200 and 204).
async fn closed_session_is_no_content(request: Request, next: Next) -> Response {
    let delete = request.method() == Method::DELETE;
    let mut response = next.run(request).await;
    if delete && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::NO_CONTENT;
    }
    response
}

/// rmcp's Streamable HTTP service with our host and origin policy. Its own
/// checks repeat ours (defence in depth); ours run first, before auth.
fn mcp_service(
    state: &GatewayState,
    server: McpServer,
    sessions: Arc<LocalSessionManager>,
) -> StreamableHttpService<McpServer, LocalSessionManager> {
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(state.config.allowed_hosts.clone())
        .with_allowed_origins(rmcp_origins(&state.config.allowed_origins))
        .enforce_origin_validation()
        // Sessionless (2026-07-28) calls answer in plain JSON unless the tool streams
        // notifications first; session clients are unaffected.
        .with_json_response(true)
        .with_cancellation_token(state.shutdown.child_token());
    StreamableHttpService::new(move || Ok(server.clone()), sessions, config)
}

/// Our origin entries in rmcp's syntax: explicit ports, so rmcp's deprecated
/// "no port means any port" rule never applies.
fn rmcp_origins(allowed: &[String]) -> Vec<String> {
    allowed
        .iter()
        .filter_map(|entry| guard::parse_allowed_origin(entry))
        .map(|(origin, port)| match origin {
            guard::Origin::Null => "null".to_owned(),
            guard::Origin::Tuple { scheme, host, .. } => {
                let host = if host.contains(':') {
                    format!("[{host}]")
                } else {
                    host
                };
                match port {
                    guard::AllowedPort::Any => format!("{scheme}://{host}:*"),
                    guard::AllowedPort::Exact(p) => format!("{scheme}://{host}:{p}"),
                }
            }
        })
        .collect()
}

/// Liveness: the process answers.
async fn health() -> impl IntoResponse {
    axum::Json(json!({"ok": true}))
}

/// How long readiness waits for auth.
const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Readiness: every request is authorized by auth first, so a gateway whose auth cannot
/// answer (unreachable, or its database unreachable: auth's health says NOT_SERVING) can
/// serve nothing and should get no traffic. The other backends are not asked: each serves
/// some tools alone, and a load balancer draining every gateway because one lane is down would
/// turn a partial outage into a whole one.
async fn ready(State(state): State<GatewayState>) -> Response {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    let mut auth = state.backends.auth_health.clone();
    let answer = tokio::time::timeout(
        READY_TIMEOUT,
        auth.check(HealthCheckRequest {
            service: "kg.v1.Auth".to_owned(),
        }),
    )
    .await;
    // Parts of this process being restarted (the embedded stores of `kgmesh up`), then auth.
    let mut waiting = kg_common::readiness::down();
    if !matches!(&answer, Ok(Ok(health)) if health.get_ref().status() == ServingStatus::Serving) {
        waiting.push("auth");
    }
    if waiting.is_empty() {
        axum::Json(json!({"ok": true})).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"ok": false, "waitingFor": waiting})),
        )
            .into_response()
    }
}

async fn metrics() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        crate::metrics::encode_text(),
    )
        .into_response()
}

/// RFC 9728 protected-resource metadata for `/mcp`.
async fn protected_resource(
    State(state): State<GatewayState>,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> impl IntoResponse {
    let base = guard::base_url(&state.config, &uri, &headers);
    axum::Json(json!({
        "resource": format!("{base}/mcp"),
        "bearer_methods_supported": ["header"],
        "resource_name": "kgmesh",
    }))
}

/// A known endpoint called with a method it does not take: the same JSON shape as every other
/// refusal (it was an empty 405).
async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let path: String = uri.path().chars().take(200).collect();
    let message = format!(
        "{path} does not take {method}; see the README's admin API for the methods each endpoint takes"
    );
    let mut response =
        guard::error_response(&ClientError::new(ErrorCode::InvalidArgument, message));
    *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    response
}

async fn not_found() -> Response {
    let mut response =
        guard::error_response(&ClientError::new(ErrorCode::NotFound, "no such endpoint"));
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}

#[cfg(test)]
mod tests;

//! Each MCP session belongs to the principal that opened it.
//!
//! rmcp serves any request that names a live `Mcp-Session-Id`, whoever sends it. A session
//! id is no credential (every request is authorized by its own bearer), but a session
//! carries state: its SSE stream, its requests in flight, and whether it lives at all. So
//! another principal holding the id could end it (DELETE), read its stream (GET) or call
//! tools on it. Here the id is bound to the principal whose `initialize` opened it, and a
//! request naming it with another principal's token is answered exactly as an unknown
//! session is (404), so it learns nothing about the session either (the MCP security best
//! practices, "Session Hijacking"). A DELETE of a session rmcp does not hold is 404 too, as
//! the Streamable HTTP transport requires; rmcp itself would accept it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::common::http_header::HEADER_SESSION_ID;
use rmcp::transport::streamable_http_server::session::SessionManager as _;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

use crate::state::{Caller, SpeculativeCaller};

/// Sessions held before the map drops those rmcp has ended (idle for five minutes, or
/// deleted): past this, each new session first prunes.
const PRUNE_ABOVE: usize = 1024;

/// Session id -> the principal that opened it, and rmcp's sessions to prune against.
#[derive(Clone)]
pub(crate) struct SessionOwners {
    owners: Arc<Mutex<HashMap<String, String>>>,
    sessions: Arc<LocalSessionManager>,
}

impl SessionOwners {
    pub(crate) fn new(sessions: Arc<LocalSessionManager>) -> Self {
        Self {
            owners: Arc::default(),
            sessions,
        }
    }

    fn owner(&self, session: &str) -> Option<String> {
        self.owners.lock().ok()?.get(session).cloned()
    }

    async fn bind(&self, session: String, principal: String) {
        let crowded = self
            .owners
            .lock()
            .map(|owners| owners.len() >= PRUNE_ABOVE)
            .unwrap_or(false);
        if crowded {
            let live: Vec<String> = self
                .sessions
                .sessions
                .read()
                .await
                .keys()
                .map(ToString::to_string)
                .collect();
            if let Ok(mut owners) = self.owners.lock() {
                owners.retain(|id, _| live.contains(id));
            }
        }
        if let Ok(mut owners) = self.owners.lock() {
            owners.insert(session, principal);
        }
    }

    fn forget(&self, session: &str) {
        if let Ok(mut owners) = self.owners.lock() {
            owners.remove(session);
        }
    }

    async fn rmcp_holds(&self, session: &str) -> bool {
        self.sessions
            .has_session(&session.to_owned().into())
            .await
            .unwrap_or(false)
    }
}

/// The principal the bearer guard put on the request. A run-ahead caller is the one auth
/// returned for the same token, so its principal is the token's.
fn principal_of(request: &Request) -> Option<String> {
    let extensions = request.extensions();
    extensions
        .get::<Caller>()
        .map(|caller| caller.principal_id().to_owned())
        .or_else(|| {
            extensions
                .get::<SpeculativeCaller>()
                .map(|speculative| speculative.ahead.principal_id().to_owned())
        })
}

/// rmcp's own answer for a session it does not know, so that another principal's session
/// and no session read alike.
fn unknown_session() -> Response {
    (
        StatusCode::NOT_FOUND,
        Body::from("Not Found: Session not found"),
    )
        .into_response()
}

/// The middleware (inside the bearer guard, outside everything that serves a session).
pub(crate) async fn bind_sessions_to_principals(
    State(owners): State<SessionOwners>,
    request: Request,
    next: Next,
) -> Response {
    // Fail closed: the guard always sets a caller; without one, no session is served.
    let Some(principal) = principal_of(&request) else {
        return unknown_session();
    };
    let session = request
        .headers()
        .get(HEADER_SESSION_ID)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let Some(session) = session else {
        // No session named: an `initialize` may open one.
        let response = next.run(request).await;
        if let Some(opened) = response
            .headers()
            .get(HEADER_SESSION_ID)
            .and_then(|value| value.to_str().ok())
        {
            owners.bind(opened.to_owned(), principal).await;
        }
        return response;
    };
    match owners.owner(&session) {
        Some(owner) if owner == principal => {}
        // Another principal's, or one this gateway never opened (rmcp answers those 404
        // anyway, but a DELETE it would accept).
        _ => return unknown_session(),
    }
    let delete = request.method() == Method::DELETE;
    if delete && !owners.rmcp_holds(&session).await {
        owners.forget(&session);
        return unknown_session();
    }
    let response = next.run(request).await;
    if delete && response.status().is_success() {
        owners.forget(&session);
    }
    response
}

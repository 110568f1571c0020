//! The audit record of the admin API's changes. Every request that can change something
//! (any method but GET, HEAD and OPTIONS) that passed the bearer check yields one
//! `AuditEvent`, whether it succeeded or was refused: who, `admin:<METHOD> <route>`, the path
//! it was made on, the namespaces it names, the outcome and its latency. Never a body, a query
//! or a secret. Queued like a tool call's event, so auditing never slows a change.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use kg_common::ErrorCode;
use kg_common::access::validate_namespace;
use kg_proto::v1::AuditEvent;

use crate::audit::Transport;
use crate::state::{Caller, GatewayState};

/// The namespaces a change names in its body rather than its path (a grant's, a deny's),
/// which its handler puts in the response's extensions for the audit event.
#[derive(Debug, Clone, Default)]
pub(crate) struct AuditNamespaces(pub(crate) Vec<String>);

/// What a change did, where its path alone does not say (a principal's PATCH disables or
/// enables it): recorded after the path as a query, `/api/v1/principals/usr_1?disabled=true`.
/// Set by the handler in the response's extensions; never a secret.
#[derive(Debug, Clone)]
pub(crate) struct AuditDetail(pub(crate) String);

/// Records the request in the audit log when it can change something; see the module docs.
pub(crate) async fn audit_admin_change(
    State(state): State<GatewayState>,
    request: Request,
    next: Next,
) -> Response {
    if matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    ) {
        return next.run(request).await;
    }
    // The bearer check runs first and refuses a request without a caller; none, no one to
    // record the change for.
    let Some(caller) = request.extensions().get::<Caller>().cloned() else {
        return next.run(request).await;
    };
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("", MatchedPath::as_str)
        .to_owned();
    let path = request.uri().path().to_owned();
    let tool = format!("admin:{} {route}", request.method());
    let started = Instant::now();
    let response = next.run(request).await;
    let latency = started.elapsed();

    let mut namespaces: Vec<String> = path_namespace(&route, &path).into_iter().collect();
    if let Some(AuditNamespaces(named)) = response.extensions().get::<AuditNamespaces>() {
        for ns in named {
            if !namespaces.contains(ns) {
                namespaces.push(ns.clone());
            }
        }
    }
    let target = match response.extensions().get::<AuditDetail>() {
        Some(AuditDetail(detail)) => format!("{path}?{detail}"),
        None => path,
    };
    let outcome = if response.status().is_success() {
        "ok"
    } else {
        // Set by `guard::error_response`, which renders every refusal of the admin API.
        response
            .extensions()
            .get::<ErrorCode>()
            .map_or("internal", |code| code.as_str())
    };
    let event = AuditEvent {
        at_ms: kg_common::caller::now_ms(),
        tool,
        namespaces,
        outcome: outcome.to_owned(),
        latency_us: i64::try_from(latency.as_micros()).unwrap_or(i64::MAX),
        transport: Transport::Http.as_str().to_owned(),
        target: truncate_chars(&target, kg_proto::limits::AUDIT_TARGET_LEN),
        ..Default::default()
    };
    state.audit.record(&caller, event);
    response
}

/// The `{ns}` segment of `path` under `route` (`/api/v1/namespaces/{ns}/...`), if any and a
/// valid name (auth would refuse an audit event naming anything else).
fn path_namespace(route: &str, path: &str) -> Option<String> {
    route
        .split('/')
        .zip(path.split('/'))
        .find(|(template, _)| *template == "{ns}")
        .map(|(_, ns)| ns.to_owned())
        .filter(|ns| validate_namespace(ns).is_ok())
}

/// `text` cut to at most `max` characters, so auth keeps the event rather than refusing it.
fn truncate_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => text[..cut].to_owned(),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_namespace_comes_from_its_segment_only() {
        let route = "/api/v1/namespaces/{ns}/files/{*path}";
        assert_eq!(
            path_namespace(route, "/api/v1/namespaces/handbook/files/a/ns/b.md").as_deref(),
            Some("handbook")
        );
        assert_eq!(
            path_namespace("/api/v1/grants/{id}", "/api/v1/grants/gr_1"),
            None
        );
        assert_eq!(path_namespace("", "/api/v1/namespaces/x/reindex"), None);
        let long = format!("/api/v1/namespaces/{}/reindex", "n".repeat(300));
        assert_eq!(
            path_namespace("/api/v1/namespaces/{ns}/reindex", &long),
            None,
            "a name auth would refuse is left out, not the whole event"
        );
    }

    #[test]
    fn a_long_target_is_cut_on_a_character() {
        assert_eq!(truncate_chars("/a/éé", 4), "/a/é");
        assert_eq!(truncate_chars("/a", 4), "/a");
    }
}

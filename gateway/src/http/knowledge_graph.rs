//! get_knowledge_graph over REST: `POST /api/v1/namespaces/{ns}/knowledge-graph`
//! takes the MCP tool's arguments as a JSON body (the namespace comes from the
//! URL), `GET` the same route takes the flat ones as query parameters. Both run
//! the MCP tool's validation and call, so the caller's own access and selector
//! apply, and an answer over 512 KiB is a 413 naming how to narrow it.

use axum::Json;
use axum::Router;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Extension, Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::admin::ApiError;
use crate::error::ClientError;
use crate::mcp::knowledge_graph;
use crate::state::{Caller, GatewayState};

type ApiResult = Result<Response, ApiError>;

/// The route; the bearer middleware is added by the caller.
pub(crate) fn routes(state: GatewayState) -> Router {
    Router::new()
        .route(
            "/api/v1/namespaces/{ns}/knowledge-graph",
            get(read_by_query).post(read_by_body),
        )
        .with_state(state)
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::from(ClientError::invalid(message))
}

/// Runs the tool for namespace `ns` with `args` (which may not name another namespace).
async fn run(
    state: &GatewayState,
    caller: &Caller,
    ns: String,
    mut args: Map<String, Value>,
) -> ApiResult {
    for name in ["project_reference", "namespace"] {
        if args
            .get(name)
            .is_some_and(|v| v.as_str() != Some(ns.as_str()))
        {
            return Err(invalid(format!(
                "{name} disagrees with the namespace in the URL; leave it out"
            )));
        }
        args.remove(name);
    }
    args.insert("project_reference".to_owned(), Value::String(ns));
    // REST sends the JSON once: only the 512 KiB limit applies.
    let graph = knowledge_graph::run(state, caller, &args, None).await?;
    Ok(Json(graph).into_response())
}

async fn read_by_body(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    Path(ns): Path<String>,
    body: Result<Json<Value>, JsonRejection>,
) -> ApiResult {
    let args = match body {
        Ok(Json(Value::Object(args))) => args,
        Ok(Json(_)) => return Err(invalid("the body must be a JSON object of arguments")),
        Err(rejection) if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE => {
            return Err(ApiError::from(ClientError::new(
                kg_common::ErrorCode::PayloadTooLarge,
                rejection.body_text(),
            )));
        }
        Err(rejection) => return Err(invalid(rejection.body_text())),
    };
    run(&state, &caller, ns, args).await
}

/// The query form: the flat arguments under short names. `tags` is comma-separated;
/// `selector` is `true`, `false` or one path, folder or glob.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct GraphQuery {
    root_path: Option<String>,
    root_file_version_id: Option<String>,
    max_depth: Option<i64>,
    search: Option<String>,
    r#type: Option<String>,
    tags: Option<String>,
    limit: Option<i64>,
    cursor: Option<String>,
    selector: Option<String>,
    branch_id: Option<String>,
    release_id: Option<String>,
    release_version: Option<String>,
    environment_id: Option<String>,
    environment_name: Option<String>,
}

/// The MCP arguments a query names (at most one lookup target).
fn query_args(q: GraphQuery) -> Result<Map<String, Value>, ApiError> {
    let mut args = Map::new();
    let mut put = |name: &str, value: Option<Value>| {
        if let Some(v) = value {
            args.insert(name.to_owned(), v);
        }
    };
    put("root_path", q.root_path.map(Value::String));
    put(
        "root_file_version_id",
        q.root_file_version_id.map(Value::String),
    );
    put("max_depth", q.max_depth.map(Value::from));
    put(
        "caller_selector",
        q.selector.map(|s| match s.as_str() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => Value::String(s),
        }),
    );
    let mut filters = Map::new();
    if let Some(search) = q.search {
        filters.insert("search".to_owned(), Value::String(search));
    }
    if let Some(kind) = q.r#type {
        filters.insert("type".to_owned(), Value::String(kind));
    }
    if let Some(tags) = q.tags {
        let tags: Vec<Value> = tags
            .split(',')
            .map(|t| Value::String(t.trim().to_owned()))
            .collect();
        filters.insert("tags".to_owned(), Value::Array(tags));
    }
    if !filters.is_empty() {
        args.insert("filters".to_owned(), Value::Object(filters));
    }
    let mut pagination = Map::new();
    if let Some(limit) = q.limit {
        pagination.insert("limit".to_owned(), Value::from(limit));
    }
    if let Some(cursor) = q.cursor {
        pagination.insert("cursor".to_owned(), Value::String(cursor));
    }
    if !pagination.is_empty() {
        args.insert("pagination".to_owned(), Value::Object(pagination));
    }
    let targets = [
        ("preview_branch", "branch_id", q.branch_id),
        ("release", "release_id", q.release_id),
        ("release", "release_version", q.release_version),
        ("environment", "environment_id", q.environment_id),
        ("environment", "environment_name", q.environment_name),
    ];
    let mut named = targets
        .into_iter()
        .filter_map(|(kind, field, value)| value.map(|v| json!({"kind": kind, field: v})));
    if let Some(target) = named.next() {
        if named.next().is_some() {
            return Err(invalid(
                "name one lookup target: branch_id, release_id, release_version, environment_id or environment_name",
            ));
        }
        args.insert("lookup_target".to_owned(), target);
    }
    Ok(args)
}

async fn read_by_query(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    Path(ns): Path<String>,
    query: Result<Query<GraphQuery>, QueryRejection>,
) -> ApiResult {
    let Query(query) = query.map_err(|rejection| invalid(rejection.body_text()))?;
    run(&state, &caller, ns, query_args(query)?).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_query_becomes_the_tool_arguments() {
        let args = query_args(GraphQuery {
            root_path: Some("a.md".into()),
            max_depth: Some(2),
            tags: Some("x, y".into()),
            limit: Some(5),
            selector: Some("false".into()),
            release_version: Some("v1".into()),
            ..GraphQuery::default()
        })
        .ok()
        .unwrap();
        assert_eq!(
            Value::Object(args),
            json!({"root_path": "a.md", "max_depth": 2, "filters": {"tags": ["x", "y"]},
                   "pagination": {"limit": 5}, "caller_selector": false,
                   "lookup_target": {"kind": "release", "release_version": "v1"}})
        );
        let selector = query_args(GraphQuery {
            selector: Some("docs/".into()),
            ..GraphQuery::default()
        })
        .ok()
        .unwrap();
        assert_eq!(selector.get("caller_selector"), Some(&json!("docs/")));
    }

    #[test]
    fn a_query_names_at_most_one_lookup_target() {
        let two = query_args(GraphQuery {
            release_id: Some("r".into()),
            environment_name: Some("prod".into()),
            ..GraphQuery::default()
        });
        assert!(two.is_err());
        assert!(query_args(GraphQuery::default()).ok().unwrap().is_empty());
    }
}

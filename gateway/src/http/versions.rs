//! Admin REST for versions under `/api/v1/namespaces/{ns}`: preview branches
//! (and uploads to one), releases, environments (deploy keeps history). Thin
//! translations to the files service, which enforces write (branches) and
//! admin (releases, deploys) permission.

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Extension, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use kg_common::ErrorCode;
use kg_common::access::validate_namespace;
use kg_proto::v1::{
    Branch, BranchFile, CreateBranchRequest, CreateReleaseRequest, DeployEnvironmentRequest,
    Environment, ListBranchesRequest, ListEnvironmentsRequest, ListReleasesRequest, Release,
    ReleaseTarget, UploadToBranchRequest, release_target,
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::admin::{ApiError, JsonObject, json_body};
use crate::error::ClientError;
use crate::state::{Caller, GatewayState};

type ApiResult = Result<Response, ApiError>;

/// The version routes; the bearer middleware is added by the caller.
pub(crate) fn routes(state: GatewayState) -> Router {
    let upload_limit = state.config.max_upload_bytes;
    Router::new()
        .route(
            "/api/v1/namespaces/{ns}/branches",
            get(list_branches).post(create_branch),
        )
        .route(
            "/api/v1/namespaces/{ns}/branches/{branch}/files/{*path}",
            put(upload_to_branch).layer(DefaultBodyLimit::max(upload_limit)),
        )
        .route(
            "/api/v1/namespaces/{ns}/releases",
            get(list_releases).post(create_release),
        )
        .route(
            "/api/v1/namespaces/{ns}/environments",
            get(list_environments),
        )
        .route(
            "/api/v1/namespaces/{ns}/environments/{env}/deploy",
            post(deploy),
        )
        .with_state(state)
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::from(ClientError::invalid(message))
}

fn backend(status: tonic::Status) -> ApiError {
    ApiError::from(ClientError::from_status("files", &status))
}

fn valid_namespace(ns: &str) -> Result<(), ApiError> {
    validate_namespace(ns).map_err(|err| invalid(err.to_string()))
}

fn created(body: Value) -> Response {
    (StatusCode::CREATED, Json(body)).into_response()
}

fn branch_json(b: &Branch) -> Value {
    json!({"namespace": b.namespace, "branchId": b.branch_id, "name": b.name, "createdAtMs": b.created_at_ms,
           "createdBy": b.created_by, "changedFiles": b.changed_files})
}

fn branch_file_json(f: &BranchFile) -> Value {
    json!({"branchId": f.branch_id, "fileId": f.file_id, "path": f.path, "versionId": f.version_id,
           "contentSha256": f.content_sha256, "size": f.size, "mime": f.mime})
}

fn release_json(r: &Release) -> Value {
    json!({"namespace": r.namespace, "releaseId": r.release_id, "version": r.version,
           "branchId": Some(&r.branch_id).filter(|b| !b.is_empty()), "createdAtMs": r.created_at_ms,
           "createdBy": r.created_by, "fileCount": r.file_count, "note": r.note})
}

fn environment_json(e: &Environment) -> Value {
    let history: Vec<Value> = e
        .history
        .iter()
        .map(|d| {
            json!({"releaseId": d.release_id, "releaseVersion": d.release_version,
                        "deployedAtMs": d.deployed_at_ms, "deployedBy": d.deployed_by})
        })
        .collect();
    json!({"namespace": e.namespace, "environmentId": e.environment_id, "name": e.name,
           "releaseId": e.release_id, "releaseVersion": e.release_version, "updatedAtMs": e.updated_at_ms,
           "history": history})
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBranchBody {
    name: String,
}

async fn create_branch(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    Path(ns): Path<String>,
    body: JsonObject,
) -> ApiResult {
    valid_namespace(&ns)?;
    let body = json_body::<CreateBranchBody>(body)?;
    let branch = state
        .backends
        .files
        .clone()
        .create_branch(caller.request(CreateBranchRequest {
            namespace: ns,
            name: body.name,
        }))
        .await
        .map_err(backend)?
        .into_inner();
    Ok(created(branch_json(&branch)))
}

async fn list_branches(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    Path(ns): Path<String>,
) -> ApiResult {
    valid_namespace(&ns)?;
    let response = state
        .backends
        .files
        .clone()
        .list_branches(caller.request(ListBranchesRequest { namespace: ns }))
        .await
        .map_err(backend)?
        .into_inner();
    let branches: Vec<Value> = response.branches.iter().map(branch_json).collect();
    Ok(Json(json!({ "branches": branches })).into_response())
}

async fn upload_to_branch(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    Path((ns, branch, path)): Path<(String, String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    valid_namespace(&ns)?;
    let content = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::from(ClientError::new(
                ErrorCode::PayloadTooLarge,
                format!(
                    "the file is larger than this gateway accepts ({} bytes)",
                    state.config.max_upload_bytes
                ),
            ))
        } else {
            invalid(rejection.body_text())
        }
    })?;
    let file = state
        .backends
        .files
        .clone()
        .upload_to_branch(caller.request(UploadToBranchRequest {
            namespace: ns,
            branch,
            path,
            content: content.to_vec(),
            mime: String::new(),
        }))
        .await
        .map_err(backend)?
        .into_inner();
    Ok(Json(branch_file_json(&file)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateReleaseBody {
    version: String,
    /// Branch id or name; omitted = main.
    #[serde(default)]
    branch: String,
    #[serde(default)]
    note: String,
}

async fn create_release(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    Path(ns): Path<String>,
    body: JsonObject,
) -> ApiResult {
    valid_namespace(&ns)?;
    let body = json_body::<CreateReleaseBody>(body)?;
    let release = state
        .backends
        .files
        .clone()
        .create_release(caller.request(CreateReleaseRequest {
            namespace: ns,
            version: body.version,
            branch: body.branch,
            note: body.note,
        }))
        .await
        .map_err(backend)?
        .into_inner();
    Ok(created(release_json(&release)))
}

async fn list_releases(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    Path(ns): Path<String>,
) -> ApiResult {
    valid_namespace(&ns)?;
    let response = state
        .backends
        .files
        .clone()
        .list_releases(caller.request(ListReleasesRequest { namespace: ns }))
        .await
        .map_err(backend)?
        .into_inner();
    let releases: Vec<Value> = response.releases.iter().map(release_json).collect();
    Ok(Json(json!({ "releases": releases })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct DeployBody {
    release_id: Option<String>,
    release_version: Option<String>,
}

/// The release a deploy names: exactly one of releaseId or releaseVersion.
fn release_of(body: DeployBody) -> Result<ReleaseTarget, ApiError> {
    let selector = match (body.release_id, body.release_version) {
        (Some(id), None) => release_target::Selector::ReleaseId(id),
        (None, Some(version)) => release_target::Selector::ReleaseVersion(version),
        _ => return Err(invalid("pass exactly one of releaseId or releaseVersion")),
    };
    Ok(ReleaseTarget {
        selector: Some(selector),
    })
}

async fn deploy(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    Path((ns, env)): Path<(String, String)>,
    body: JsonObject,
) -> ApiResult {
    valid_namespace(&ns)?;
    let release = release_of(json_body::<DeployBody>(body)?)?;
    let environment = state
        .backends
        .files
        .clone()
        .deploy_environment(caller.request(DeployEnvironmentRequest {
            namespace: ns,
            environment: env,
            release: Some(release),
        }))
        .await
        .map_err(backend)?
        .into_inner();
    Ok(Json(environment_json(&environment)).into_response())
}

async fn list_environments(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    Path(ns): Path<String>,
) -> ApiResult {
    valid_namespace(&ns)?;
    let response = state
        .backends
        .files
        .clone()
        .list_environments(caller.request(ListEnvironmentsRequest { namespace: ns }))
        .await
        .map_err(backend)?
        .into_inner();
    let environments: Vec<Value> = response.environments.iter().map(environment_json).collect();
    Ok(Json(json!({ "environments": environments })).into_response())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_deploy_names_exactly_one_release() {
        let by_version = release_of(DeployBody {
            release_id: None,
            release_version: Some("v1.2.0".into()),
        })
        .ok()
        .unwrap();
        assert_eq!(
            by_version.selector,
            Some(release_target::Selector::ReleaseVersion("v1.2.0".into()))
        );
        for (id, version) in [(None, None), (Some("a".to_owned()), Some("v1".to_owned()))] {
            assert!(
                release_of(DeployBody {
                    release_id: id,
                    release_version: version
                })
                .is_err()
            );
        }
    }
}

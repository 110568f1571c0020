//! Admin REST under `/api/v1`: thin translations to auth and files RPCs made
//! with the caller's signed context. The services enforce admin and write
//! permission; this layer validates shapes and maps statuses to HTTP.

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, patch, post};
use kg_common::ErrorCode;
use kg_common::access::{normalize_folder_prefix, normalize_path, validate_namespace};
use kg_proto::v1::{
    CreateGroupRequest, CreateNamespaceRequest, CreatePatRequest, CreatePrincipalRequest,
    DeleteDenyRequest, DeleteFileRequest, DeleteGrantRequest, FileInfo, GetFileRequest,
    GroupMemberRequest, ListAuditRequest, ListDeniesRequest, ListFilesRequest, ListGrantsRequest,
    ListGroupsRequest, ListNamespacesRequest, ListPatsRequest, ListPrincipalsRequest,
    PutDenyRequest, PutGrantRequest, ReindexRequest, RevokePatRequest, RotatePatRequest,
    SetFileFlagsRequest, SetPrincipalDisabledRequest, SweepBlobsRequest, UploadRequest,
    get_file_request,
};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use super::dto::{
    AuditEventJson, DenyJson, FileJson, GrantJson, GroupJson, NamespaceJson, PatJson,
    PrincipalJson, parse_kind, parse_permission,
};
use super::guard::error_response;
use crate::error::ClientError;
use crate::state::{Caller, GatewayState};

/// The admin routes; the bearer middleware is added by the caller.
pub(crate) fn routes(state: GatewayState) -> Router {
    let upload_limit = state.config.max_upload_bytes;
    Router::new()
        .route(
            "/api/v1/namespaces",
            get(list_namespaces).post(create_namespace),
        )
        .route(
            "/api/v1/principals",
            get(list_principals).post(create_principal),
        )
        .route("/api/v1/principals/{id}", patch(set_principal_disabled))
        .route("/api/v1/groups", get(list_groups).post(create_group))
        .route("/api/v1/groups/{id}/members", post(add_group_member))
        .route(
            "/api/v1/groups/{id}/members/{principal}",
            delete(remove_group_member),
        )
        .route("/api/v1/grants", get(list_grants).post(put_grant))
        .route("/api/v1/grants/{id}", delete(delete_grant))
        .route("/api/v1/denies", get(list_denies).post(put_deny))
        .route("/api/v1/denies/{id}", delete(delete_deny))
        .route("/api/v1/pats", get(list_pats).post(create_pat))
        .route("/api/v1/pats/{id}", delete(revoke_pat))
        .route("/api/v1/pats/{id}/rotate", post(rotate_pat))
        .route("/api/v1/audit", get(list_audit))
        .route("/api/v1/namespaces/{ns}/files", get(list_files))
        .route("/api/v1/namespaces/{ns}/reindex", post(reindex))
        .route("/api/v1/blobs/sweep", post(sweep_blobs))
        .route(
            "/api/v1/namespaces/{ns}/files/{*path}",
            get(get_file)
                .put(upload)
                .patch(set_file_flags)
                .delete(delete_file)
                .layer(DefaultBodyLimit::max(upload_limit)),
        )
        .with_state(state)
}

/// A REST failure, rendered as `{code, message, retryable}`.
pub(crate) struct ApiError(ClientError);

impl From<ClientError> for ApiError {
    fn from(err: ClientError) -> Self {
        Self(err)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error_response(&self.0)
    }
}

pub(crate) type ApiResult = Result<Response, ApiError>;

pub(crate) fn backend(service: &'static str) -> impl Fn(tonic::Status) -> ApiError {
    move |status| ApiError(ClientError::from_status(service, &status))
}

/// A JSON body as the admin routes take it: an object. It is read as a map first, so an
/// array, a string or a number is refused, rather than read positionally into the fields (serde
/// reads a struct from a sequence too: `[true]` was taken for `{"disabled": true}`).
pub(crate) type JsonObject = Result<Json<Map<String, Value>>, JsonRejection>;

/// The fields of a [`JsonObject`] body as `T`; what is wrong with it is said in terms of the
/// body (`missing field`, `unknown field`, `invalid type`), never of our types.
pub(crate) fn json_body<T: DeserializeOwned>(body: JsonObject) -> Result<T, ApiError> {
    let fields = body.map(|Json(fields)| fields).map_err(|rejection| {
        let (code, message) = match rejection {
            _ if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                (ErrorCode::PayloadTooLarge, rejection.body_text())
            }
            JsonRejection::JsonDataError(_) => (
                ErrorCode::InvalidArgument,
                "the body must be a JSON object of fields ({...}), not an array or a single value"
                    .to_owned(),
            ),
            other => (ErrorCode::InvalidArgument, other.body_text()),
        };
        ApiError(ClientError::new(code, message))
    })?;
    serde_json::from_value(Value::Object(fields)).map_err(|err| {
        ApiError(ClientError::invalid(format!(
            "invalid body: {}",
            in_body_terms(&err)
        )))
    })
}

/// serde's message about a body, with our type names left out: "expected struct
/// PutGrantBody with 5 elements" says nothing to a caller, "expected an object" does.
pub(crate) fn in_body_terms(err: &serde_json::Error) -> String {
    let message = err.to_string();
    let Some(at) = message.find("expected struct ") else {
        return message;
    };
    let rest = &message[at + "expected struct ".len()..];
    let name_end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    let mut rest = &rest[name_end..];
    if let Some(elements) = rest.strip_prefix(" with ") {
        let count_end = elements
            .find(" elements")
            .map_or(0, |i| i + " elements".len());
        rest = &elements[count_end..];
    }
    format!("{}expected an object{rest}", &message[..at])
}

fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    query
        .map(|Query(v)| v)
        .map_err(|rejection| ApiError(ClientError::invalid(rejection.body_text())))
}

pub(crate) fn valid_namespace(ns: &str) -> Result<(), ApiError> {
    validate_namespace(ns).map_err(|err| ApiError(ClientError::invalid(err.to_string())))
}

/// The namespace a change's JSON body names, if it is a valid name (auth would refuse an audit
/// event naming anything else).
fn named_namespace(body: &JsonObject) -> Option<String> {
    body.as_ref()
        .ok()
        .and_then(|Json(fields)| fields.get("namespace")?.as_str())
        .filter(|ns| validate_namespace(ns).is_ok())
        .map(str::to_owned)
}

/// `result` as the response, its audit record naming the namespace from the body (whether
/// the change was made or refused).
fn audited_in(namespace: Option<String>, result: ApiResult) -> Response {
    let mut response = result.into_response();
    if let Some(ns) = namespace {
        response
            .extensions_mut()
            .insert(super::admin_audit::AuditNamespaces(vec![ns]));
    }
    response
}

fn created(body: serde_json::Value) -> Response {
    (StatusCode::CREATED, Json(body)).into_response()
}

pub(crate) fn ok(body: serde_json::Value) -> Response {
    Json(body).into_response()
}

fn to_value<T: serde::Serialize>(value: T) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or(serde_json::Value::Null)
}

async fn list_namespaces(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
) -> ApiResult {
    let response = state
        .backends
        .auth
        .clone()
        .list_namespaces(caller.request(ListNamespacesRequest {}))
        .await
        .map_err(backend("auth"))?
        .into_inner();
    let list: Vec<NamespaceJson> = response.namespaces.into_iter().map(Into::into).collect();
    Ok(ok(json!({ "namespaces": list })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CreateNamespaceBody {
    name: String,
    #[serde(default)]
    description: String,
}

async fn create_namespace(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    body: JsonObject,
) -> ApiResult {
    let body = json_body::<CreateNamespaceBody>(body)?;
    super::namespaces::refuse_while_purging(&state, &caller, &body.name).await?;
    let ns = state
        .backends
        .auth
        .clone()
        .create_namespace(caller.request(CreateNamespaceRequest {
            name: body.name,
            description: body.description,
        }))
        .await
        .map_err(backend("auth"))?
        .into_inner();
    Ok(created(to_value(NamespaceJson::from(ns))))
}

async fn list_principals(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
) -> ApiResult {
    let response = state
        .backends
        .auth
        .clone()
        .list_principals(caller.request(ListPrincipalsRequest {}))
        .await
        .map_err(backend("auth"))?
        .into_inner();
    let list: Vec<PrincipalJson> = response.principals.into_iter().map(Into::into).collect();
    Ok(ok(json!({ "principals": list })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CreatePrincipalBody {
    name: String,
    kind: String,
    #[serde(default)]
    acts_for: Option<String>,
    #[serde(default)]
    is_admin: bool,
}

async fn create_principal(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    body: JsonObject,
) -> ApiResult {
    let body = json_body::<CreatePrincipalBody>(body)?;
    let kind = parse_kind(&body.kind)?;
    let principal = state
        .backends
        .auth
        .clone()
        .create_principal(caller.request(CreatePrincipalRequest {
            name: body.name,
            kind: kind as i32,
            acts_for: body.acts_for.unwrap_or_default(),
            is_admin: body.is_admin,
        }))
        .await
        .map_err(backend("auth"))?
        .into_inner();
    Ok(created(to_value(PrincipalJson::from(principal))))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PrincipalChangeBody {
    /// Required: the one thing a principal's PATCH changes.
    disabled: bool,
}

/// `PATCH /api/v1/principals/{id}` with `{"disabled": true}` shuts a principal out (its
/// tokens, and those of agents acting for it) from the next call on; `false` lets it back in.
async fn set_principal_disabled(
    state: State<GatewayState>,
    caller: Extension<Caller>,
    id: Path<String>,
    body: JsonObject,
) -> Response {
    // Whether it was a disable or an enable, for the audit record, made or refused.
    let detail = body
        .as_ref()
        .ok()
        .and_then(|Json(fields)| fields.get("disabled")?.as_bool())
        .map(|disabled| super::admin_audit::AuditDetail(format!("disabled={disabled}")));
    let mut response = change_principal(state, caller, id, body)
        .await
        .into_response();
    if let Some(detail) = detail {
        response.extensions_mut().insert(detail);
    }
    response
}

async fn change_principal(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: JsonObject,
) -> ApiResult {
    let body = json_body::<PrincipalChangeBody>(body)?;
    let principal = state
        .backends
        .auth
        .clone()
        .set_principal_disabled(caller.request(SetPrincipalDisabledRequest {
            id,
            disabled: body.disabled,
        }))
        .await
        .map_err(backend("auth"))?
        .into_inner();
    Ok(ok(to_value(PrincipalJson::from(principal))))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PrincipalQuery {
    principal: Option<String>,
}

/// An optional id from a query or body: absent, empty and blank mean unset.
fn id_param(value: Option<String>) -> String {
    value.map(|p| p.trim().to_owned()).unwrap_or_default()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantsQuery {
    principal: Option<String>,
    group: Option<String>,
}

async fn list_grants(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    q: Result<Query<GrantsQuery>, QueryRejection>,
) -> ApiResult {
    let q = query(q)?;
    let (principal_id, group_id) = (id_param(q.principal), id_param(q.group));
    if !principal_id.is_empty() && !group_id.is_empty() {
        return Err(ApiError(ClientError::invalid(
            "pass at most one of `principal` and `group`",
        )));
    }
    let response = state
        .backends
        .auth
        .clone()
        .list_grants(caller.request(ListGrantsRequest {
            principal_id,
            group_id,
        }))
        .await
        .map_err(backend("auth"))?
        .into_inner();
    let list: Vec<GrantJson> = response.grants.into_iter().map(Into::into).collect();
    Ok(ok(json!({ "grants": list })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PutGrantBody {
    #[serde(default)]
    principal_id: Option<String>,
    #[serde(default)]
    group_id: Option<String>,
    namespace: String,
    permission: String,
    #[serde(default)]
    path_prefix: String,
}

async fn put_grant(
    state: State<GatewayState>,
    caller: Extension<Caller>,
    body: JsonObject,
) -> Response {
    let namespace = named_namespace(&body);
    audited_in(namespace, grant(state, caller, body).await)
}

async fn grant(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    body: JsonObject,
) -> ApiResult {
    let body = json_body::<PutGrantBody>(body)?;
    let (principal_id, group_id) = (id_param(body.principal_id), id_param(body.group_id));
    if principal_id.is_empty() == group_id.is_empty() {
        return Err(ApiError(ClientError::invalid(
            "pass exactly one of `principalId` and `groupId`: a grant is to one principal or one group",
        )));
    }
    let permission = parse_permission(&body.permission)?;
    let grant = state
        .backends
        .auth
        .clone()
        .put_grant(caller.request(PutGrantRequest {
            principal_id,
            namespace: body.namespace,
            permission: permission as i32,
            path_prefix: body.path_prefix,
            group_id,
        }))
        .await
        .map_err(backend("auth"))?
        .into_inner();
    Ok(ok(to_value(GrantJson::from(grant))))
}

async fn delete_grant(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    Path(grant_id): Path<String>,
) -> ApiResult {
    let response = state
        .backends
        .auth
        .clone()
        .delete_grant(caller.request(DeleteGrantRequest {
            grant_id: grant_id.clone(),
        }))
        .await
        .map_err(backend("auth"))?
        .into_inner();
    if !response.deleted {
        return Err(ApiError(ClientError::new(
            ErrorCode::NotFound,
            format!("grant `{grant_id}` not found"),
        )));
    }
    Ok(ok(json!({ "deleted": true })))
}

async fn list_pats(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    q: Result<Query<PrincipalQuery>, QueryRejection>,
) -> ApiResult {
    let principal_id = id_param(query(q)?.principal);
    let response = state
        .backends
        .auth
        .clone()
        .list_pats(caller.request(ListPatsRequest { principal_id }))
        .await
        .map_err(backend("auth"))?
        .into_inner();
    let list: Vec<PatJson> = response.pats.into_iter().map(Into::into).collect();
    Ok(ok(json!({ "pats": list })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CreatePatBody {
    principal_id: String,
    name: String,
    #[serde(default)]
    expires_at_ms: Option<i64>,
}

async fn create_pat(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    body: JsonObject,
) -> ApiResult {
    let body = json_body::<CreatePatBody>(body)?;
    let response = state
        .backends
        .auth
        .clone()
        .create_pat(caller.request(CreatePatRequest {
            principal_id: body.principal_id,
            name: body.name,
            expires_at_ms: body.expires_at_ms,
        }))
        .await
        .map_err(backend("auth"))?
        .into_inner();
    let pat = response.pat.map(PatJson::from);
    // The token is shown once, here; it is never logged.
    Ok(created(
        json!({ "token": response.token, "pat": to_value(pat) }),
    ))
}

async fn revoke_pat(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    Path(pat_id): Path<String>,
) -> ApiResult {
    let response = state
        .backends
        .auth
        .clone()
        .revoke_pat(caller.request(RevokePatRequest {
            pat_id: pat_id.clone(),
        }))
        .await
        .map_err(backend("auth"))?
        .into_inner();
    if !response.revoked {
        return Err(ApiError(ClientError::new(
            ErrorCode::NotFound,
            format!("PAT `{pat_id}` not found"),
        )));
    }
    Ok(ok(json!({ "revoked": true })))
}

async fn rotate_pat(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    Path(pat_id): Path<String>,
) -> ApiResult {
    let response = state
        .backends
        .auth
        .clone()
        .rotate_pat(caller.request(RotatePatRequest { pat_id }))
        .await
        .map_err(backend("auth"))?
        .into_inner();
    let pat = response.pat.map(PatJson::from);
    // The new token is shown once, here; it is never logged.
    Ok(ok(json!({ "token": response.token, "pat": to_value(pat) })))
}

async fn list_groups(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
) -> ApiResult {
    let response = state
        .backends
        .auth
        .clone()
        .list_groups(caller.request(ListGroupsRequest {}))
        .await
        .map_err(backend("auth"))?
        .into_inner();
    let list: Vec<GroupJson> = response.groups.into_iter().map(Into::into).collect();
    Ok(ok(json!({ "groups": list })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CreateGroupBody {
    name: String,
}

async fn create_group(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    body: JsonObject,
) -> ApiResult {
    let body = json_body::<CreateGroupBody>(body)?;
    let group = state
        .backends
        .auth
        .clone()
        .create_group(caller.request(CreateGroupRequest { name: body.name }))
        .await
        .map_err(backend("auth"))?
        .into_inner();
    Ok(created(to_value(GroupJson::from(group))))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GroupMemberBody {
    principal_id: String,
}

async fn add_group_member(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    Path(group_id): Path<String>,
    body: JsonObject,
) -> ApiResult {
    let body = json_body::<GroupMemberBody>(body)?;
    let group = state
        .backends
        .auth
        .clone()
        .add_group_member(caller.request(GroupMemberRequest {
            group_id,
            principal_id: body.principal_id,
        }))
        .await
        .map_err(backend("auth"))?
        .into_inner();
    Ok(ok(to_value(GroupJson::from(group))))
}

async fn remove_group_member(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    Path((group_id, principal_id)): Path<(String, String)>,
) -> ApiResult {
    let group = state
        .backends
        .auth
        .clone()
        .remove_group_member(caller.request(GroupMemberRequest {
            group_id,
            principal_id,
        }))
        .await
        .map_err(backend("auth"))?
        .into_inner();
    Ok(ok(to_value(GroupJson::from(group))))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeniesQuery {
    namespace: Option<String>,
}

async fn list_denies(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    q: Result<Query<DeniesQuery>, QueryRejection>,
) -> ApiResult {
    let namespace = id_param(query(q)?.namespace);
    if !namespace.is_empty() {
        valid_namespace(&namespace)?;
    }
    let response = state
        .backends
        .auth
        .clone()
        .list_denies(caller.request(ListDeniesRequest { namespace }))
        .await
        .map_err(backend("auth"))?
        .into_inner();
    let list: Vec<DenyJson> = response.denies.into_iter().map(Into::into).collect();
    Ok(ok(json!({ "denies": list })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PutDenyBody {
    namespace: String,
    #[serde(default)]
    principal_id: Option<String>,
    #[serde(default)]
    group_id: Option<String>,
    #[serde(default)]
    path_prefix: Option<String>,
    #[serde(default)]
    file_id: Option<String>,
}

/// Checks a deny's shape: at most one subject, exactly one target.
fn deny_request(body: PutDenyBody) -> Result<PutDenyRequest, ApiError> {
    valid_namespace(&body.namespace)?;
    let principal_id = id_param(body.principal_id);
    let group_id = id_param(body.group_id);
    let path_prefix = id_param(body.path_prefix);
    let file_id = id_param(body.file_id);
    if !principal_id.is_empty() && !group_id.is_empty() {
        return Err(ApiError(ClientError::invalid(
            "pass at most one of `principalId` and `groupId` (neither denies everyone)",
        )));
    }
    if path_prefix.is_empty() == file_id.is_empty() {
        return Err(ApiError(ClientError::invalid(
            "pass exactly one of `pathPrefix` (a folder, e.g. `hr/`) and `fileId`",
        )));
    }
    let path_prefix = if path_prefix.is_empty() {
        path_prefix
    } else {
        let folder = normalize_folder_prefix(&path_prefix)
            .map_err(|err| ApiError(ClientError::invalid(err.to_string())))?;
        if folder.is_empty() {
            return Err(ApiError(ClientError::invalid(
                "pathPrefix must name a folder such as `hr/`; to shut a principal out of a whole namespace, delete its grants",
            )));
        }
        folder
    };
    Ok(PutDenyRequest {
        namespace: body.namespace,
        principal_id,
        group_id,
        path_prefix,
        file_id,
    })
}

async fn put_deny(
    state: State<GatewayState>,
    caller: Extension<Caller>,
    body: JsonObject,
) -> Response {
    let namespace = named_namespace(&body);
    audited_in(namespace, deny(state, caller, body).await)
}

async fn deny(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    body: JsonObject,
) -> ApiResult {
    let request = deny_request(json_body::<PutDenyBody>(body)?)?;
    if !request.file_id.is_empty() {
        // A deny of an id no file has is stored and withdraws nothing (a path passed for an
        // id, a typo): refused, so no one believes a file was withdrawn when it was not.
        let found = state
            .backends
            .files
            .clone()
            .get_file(caller.request(GetFileRequest {
                namespace: request.namespace.clone(),
                selector: Some(get_file_request::Selector::FileId(request.file_id.clone())),
            }))
            .await;
        match found {
            Ok(_) => {}
            Err(status) if status.code() == tonic::Code::NotFound => {
                let id: String = request.file_id.chars().take(80).collect();
                return Err(ApiError(ClientError::new(
                    ErrorCode::NotFound,
                    format!(
                        "no file has the id `{id}` in namespace `{}`: a deny names a file by the \
                         fileId `kgmesh file list` shows (or a folder by pathPrefix)",
                        request.namespace
                    ),
                )));
            }
            Err(status) => return Err(backend("files")(status)),
        }
    }
    let deny = state
        .backends
        .auth
        .clone()
        .put_deny(caller.request(request))
        .await
        .map_err(backend("auth"))?
        .into_inner();
    Ok(created(to_value(DenyJson::from(deny))))
}

async fn delete_deny(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    Path(deny_id): Path<String>,
) -> ApiResult {
    let response = state
        .backends
        .auth
        .clone()
        .delete_deny(caller.request(DeleteDenyRequest {
            deny_id: deny_id.clone(),
        }))
        .await
        .map_err(backend("auth"))?
        .into_inner();
    if !response.deleted {
        return Err(ApiError(ClientError::new(
            ErrorCode::NotFound,
            format!("deny `{deny_id}` not found"),
        )));
    }
    Ok(ok(json!({ "deleted": true })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct AuditQuery {
    principal: Option<String>,
    tool: Option<String>,
    since_ms: Option<i64>,
    until_ms: Option<i64>,
    limit: Option<u32>,
    cursor: Option<String>,
}

async fn list_audit(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    q: Result<Query<AuditQuery>, QueryRejection>,
) -> ApiResult {
    let q = query(q)?;
    if let (Some(since), Some(until)) = (q.since_ms, q.until_ms)
        && since >= until
    {
        return Err(ApiError(ClientError::invalid(
            "sinceMs must be before untilMs (sinceMs is inclusive, untilMs exclusive)",
        )));
    }
    let response = state
        .backends
        .auth
        .clone()
        .list_audit(caller.request(ListAuditRequest {
            principal_id: id_param(q.principal),
            tool: id_param(q.tool),
            since_ms: q.since_ms,
            until_ms: q.until_ms,
            limit: q.limit.unwrap_or(0),
            cursor: q.cursor.unwrap_or_default(),
        }))
        .await
        .map_err(backend("auth"))?
        .into_inner();
    let events: Vec<AuditEventJson> = response.events.into_iter().map(Into::into).collect();
    let next_cursor = Some(response.next_cursor).filter(|c| !c.is_empty());
    Ok(ok(json!({ "events": events, "nextCursor": next_cursor })))
}

/// The upload's mime type from `Content-Type`, ignoring the generic values
/// HTTP clients send by default (the files service then guesses from the path).
fn upload_mime(headers: &HeaderMap) -> String {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return String::new();
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    match essence.as_str() {
        ""
        | "application/octet-stream"
        | "application/x-www-form-urlencoded"
        | "multipart/form-data" => String::new(),
        _ => essence,
    }
}

async fn upload(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    Path((ns, path)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    valid_namespace(&ns)?;
    let path =
        normalize_path(&path).map_err(|err| ApiError(ClientError::invalid(err.to_string())))?;
    let content = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError(ClientError::new(
                ErrorCode::PayloadTooLarge,
                format!(
                    "the file is larger than this gateway accepts ({} bytes)",
                    state.config.max_upload_bytes
                ),
            ))
        } else {
            ApiError(ClientError::invalid(rejection.body_text()))
        }
    })?;
    let response = state
        .backends
        .files
        .clone()
        .upload(caller.request(UploadRequest {
            namespace: ns,
            path,
            content: content.to_vec(),
            mime: upload_mime(&headers),
        }))
        .await
        .map_err(backend("files"))?
        .into_inner();
    Ok(ok(json!({
        "file": to_value(response.file.map(FileJson::from)),
        "changed": response.changed,
        "requeued": response.requeued,
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ListFilesQuery {
    #[serde(default)]
    folder_prefix: String,
    #[serde(default)]
    cursor: String,
    #[serde(default)]
    limit: Option<u32>,
    #[serde(default)]
    include_hidden: bool,
}

async fn list_files(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    Path(ns): Path<String>,
    q: Result<Query<ListFilesQuery>, QueryRejection>,
) -> ApiResult {
    valid_namespace(&ns)?;
    let q = query(q)?;
    let folder_prefix = normalize_folder_prefix(&q.folder_prefix)
        .map_err(|err| ApiError(ClientError::invalid(err.to_string())))?;
    let response = state
        .backends
        .files
        .clone()
        .list_files(caller.request(ListFilesRequest {
            namespace: ns,
            folder_prefix,
            limit: q.limit.unwrap_or(0),
            cursor: q.cursor,
            include_hidden: q.include_hidden,
        }))
        .await
        .map_err(backend("files"))?
        .into_inner();
    let files: Vec<FileJson> = response.files.into_iter().map(Into::into).collect();
    let next_cursor = Some(response.next_cursor).filter(|c| !c.is_empty());
    Ok(ok(
        json!({ "files": files, "nextCursor": next_cursor, "total": response.total }),
    ))
}

async fn get_file(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    Path((ns, path)): Path<(String, String)>,
) -> ApiResult {
    let file = file_by_path(&state, &caller, &ns, &path).await?;
    Ok(ok(json!({ "file": to_value(FileJson::from(file)) })))
}

/// The file at `path` in `ns` (for its id), as the caller sees it.
async fn file_by_path(
    state: &GatewayState,
    caller: &Caller,
    ns: &str,
    path: &str,
) -> Result<FileInfo, ApiError> {
    valid_namespace(ns)?;
    let path =
        normalize_path(path).map_err(|err| ApiError(ClientError::invalid(err.to_string())))?;
    Ok(state
        .backends
        .files
        .clone()
        .get_file(caller.request(GetFileRequest {
            namespace: ns.to_owned(),
            selector: Some(get_file_request::Selector::Path(path)),
        }))
        .await
        .map_err(backend("files"))?
        .into_inner())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FileFlagsBody {
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default)]
    hidden: Option<bool>,
}

async fn set_file_flags(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    Path((ns, path)): Path<(String, String)>,
    body: JsonObject,
) -> ApiResult {
    let body = json_body::<FileFlagsBody>(body)?;
    if body.enabled.is_none() && body.hidden.is_none() {
        return Err(ApiError(ClientError::invalid(
            "pass `enabled` and/or `hidden` (true or false)",
        )));
    }
    let file = file_by_path(&state, &caller, &ns, &path).await?;
    let file = state
        .backends
        .files
        .clone()
        .set_file_flags(caller.request(SetFileFlagsRequest {
            namespace: ns,
            file_id: file.file_id,
            enabled: body.enabled,
            hidden: body.hidden,
        }))
        .await
        .map_err(backend("files"))?
        .into_inner();
    Ok(ok(json!({ "file": to_value(FileJson::from(file)) })))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ReindexBody {
    /// "" (the whole namespace) or a folder.
    #[serde(default, alias = "folder_prefix")]
    folder_prefix: String,
    /// Only files whose indexing failed.
    #[serde(default, alias = "failed_only")]
    failed_only: bool,
    /// Files queued by this call at most (default 1000, at most 5000).
    #[serde(default)]
    limit: u32,
    /// The `nextCursor` of the call before.
    #[serde(default)]
    cursor: String,
}

/// Queues files to be indexed again from their stored content, a page per call:
/// `{"queued": n, "files": [...], "nextCursor": ...}`. An empty body starts on the whole
/// namespace.
async fn reindex(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    Path(ns): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    valid_namespace(&ns)?;
    let body: ReindexBody =
        optional_json_body(body, r#"{"folderPrefix": "handbook/", "failedOnly": true}"#)?;
    let folder_prefix = normalize_folder_prefix(&body.folder_prefix)
        .map_err(|err| ApiError(ClientError::invalid(err.to_string())))?;
    let response = state
        .backends
        .files
        .clone()
        .reindex(caller.request(ReindexRequest {
            namespace: ns,
            folder_prefix,
            failed_only: body.failed_only,
            limit: body.limit,
            cursor: body.cursor,
        }))
        .await
        .map_err(backend("files"))?
        .into_inner();
    let next_cursor = Some(response.next_cursor).filter(|c| !c.is_empty());
    let files: Vec<FileJson> = response.files.into_iter().map(Into::into).collect();
    Ok(ok(json!({
        "queued": response.queued,
        "files": files,
        "nextCursor": next_cursor,
    })))
}

/// A JSON body that may be empty (then every field takes its default), read whatever the
/// content type: a body sent as a form (`curl -d`) is refused rather than dropped in silence,
/// which would do more than asked. `example` shows a valid body in the refusal.
fn optional_json_body<T: serde::de::DeserializeOwned + Default>(
    body: Result<Bytes, BytesRejection>,
    example: &str,
) -> Result<T, ApiError> {
    let body = body.map_err(|rejection| {
        let code = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ErrorCode::PayloadTooLarge
        } else {
            ErrorCode::InvalidArgument
        };
        ApiError(ClientError::new(code, rejection.body_text()))
    })?;
    optional_object(&body, example)
}

/// A body that may be empty (every field then takes its default) or else is a JSON object.
pub(crate) fn optional_object<T: serde::de::DeserializeOwned + Default>(
    body: &[u8],
    example: &str,
) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    let refused = |why: String| {
        ApiError(ClientError::invalid(format!(
            "the body must be a JSON object such as {example}, or empty: {why}"
        )))
    };
    match serde_json::from_slice::<Value>(body) {
        Ok(fields @ Value::Object(_)) => {
            serde_json::from_value(fields).map_err(|err| refused(in_body_terms(&err)))
        }
        Ok(_) => Err(refused("it is not an object".to_owned())),
        Err(err) => Err(refused(err.to_string())),
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SweepBlobsBody {
    /// Keep blobs stored or uploaded again within this many seconds (0 or absent: 60, the
    /// least allowed).
    #[serde(default, alias = "grace_seconds")]
    grace_seconds: u64,
}

/// `POST /api/v1/blobs/sweep`: removes now the blobs no version needs (a deployment admin's).
async fn sweep_blobs(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let body: SweepBlobsBody = optional_json_body(body, r#"{"graceSeconds": 3600}"#)?;
    let swept = state
        .backends
        .files
        .clone()
        .sweep_blobs(caller.request(SweepBlobsRequest {
            grace_seconds: body.grace_seconds,
        }))
        .await
        .map_err(backend("files"))?
        .into_inner();
    Ok(ok(json!({
        "removed": swept.removed,
        "removedBytes": swept.removed_bytes,
        "kept": swept.kept,
        "withinGrace": swept.within_grace,
        "versionsRemoved": swept.versions_removed,
        "versionMetadataRemoved": swept.version_metadata_removed,
        "versionLinksRemoved": swept.version_links_removed,
    })))
}

async fn delete_file(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    Path((ns, path)): Path<(String, String)>,
) -> ApiResult {
    let file = file_by_path(&state, &caller, &ns, &path).await?;
    let response = state
        .backends
        .files
        .clone()
        .delete_file(caller.request(DeleteFileRequest {
            namespace: ns,
            file_id: file.file_id,
        }))
        .await
        .map_err(backend("files"))?
        .into_inner();
    if !response.deleted {
        return Err(ApiError(ClientError::new(
            ErrorCode::NotFound,
            format!("file `{}` not found", file.path),
        )));
    }
    Ok(ok(json!({ "deleted": true })))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {

    #[test]
    fn body_errors_leave_our_type_names_out() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct PutThingBody {
            name: String,
            size: u32,
        }
        let said = |body: serde_json::Value| {
            in_body_terms(&serde_json::from_value::<PutThingBody>(body).unwrap_err())
        };
        assert_eq!(said(json!([])), "invalid length 0, expected an object");
        assert_eq!(
            said(json!("x")),
            "invalid type: string \"x\", expected an object"
        );
        assert_eq!(said(json!({"name": "a"})), "missing field `size`");
    }

    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn generic_content_types_leave_the_mime_to_the_files_service() {
        let mut headers = HeaderMap::new();
        assert_eq!(upload_mime(&headers), "");
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        );
        assert_eq!(upload_mime(&headers), "");
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/Markdown; charset=utf-8"),
        );
        assert_eq!(upload_mime(&headers), "text/markdown");
    }
}

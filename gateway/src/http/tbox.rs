//! Admin REST for a namespace's TBox, so it can be drafted, reviewed and published from
//! anywhere the gateway is reachable (`kgmesh tbox --url`), not only beside the ontology
//! service's gRPC port:
//!
//! - `GET /api/v1/namespaces/{ns}/tbox`: the published TBox;
//! - `GET` / `PUT /api/v1/namespaces/{ns}/tbox/draft`: the draft, or a new one (clears any review);
//! - `POST /api/v1/namespaces/{ns}/tbox/draft/review`: marks the draft reviewed by the caller;
//! - `POST /api/v1/namespaces/{ns}/tbox/publish`: publishes the reviewed draft as the next version;
//! - `GET /api/v1/namespaces/{ns}/tbox/candidates?limit=&kind=`: names the entity heuristics saw
//!   in the caller's readable files that no TBox matcher found, to draft from (graph service).
//!
//! The ontology service checks the caller's signed context (admin for the draft, review and
//! publish; read access for the published TBox) and the TBox itself.

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Extension, Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use kg_common::ErrorCode;
use kg_proto::v1::graph_client::GraphClient;
use kg_proto::v1::ontology_client::OntologyClient;
use kg_proto::v1::{
    CandidatesRequest, EntityCandidate, GetPublishedTboxRequest, GetTboxDraftRequest,
    PublishTboxRequest, PutTboxDraftRequest, ReviewTboxDraftRequest, Tbox, TboxDraft,
};
use serde::{Deserialize, Serialize};
use tonic::transport::Channel;

use super::admin::{ApiError, JsonObject, json_body, valid_namespace};
use crate::error::ClientError;
use crate::state::{Caller, GatewayState};
use crate::tbox_json::{EntityTypeJson, RelationTypeJson, TboxBody};

/// A client of the ontology service, when the gateway has one, and of the graph service.
#[derive(Clone)]
pub(crate) struct TboxState {
    client: Option<OntologyClient<Channel>>,
    graph: GraphClient<Channel>,
}

/// A client of the ontology service, when the gateway is configured with one.
pub(crate) fn ontology_client(state: &GatewayState) -> Option<OntologyClient<Channel>> {
    state
        .config
        .ontology_addr
        .as_deref()
        .and_then(|addr| match kg_common::grpc::channel(addr) {
            Ok(channel) => Some(
                OntologyClient::new(channel)
                    .max_decoding_message_size(kg_common::grpc::MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(kg_common::grpc::MAX_MESSAGE_BYTES),
            ),
            Err(err) => {
                tracing::error!(addr, error = %err, "ontology service address unusable");
                None
            }
        })
}

/// The TBox routes; the bearer middleware is added by the caller.
pub(crate) fn routes(state: &GatewayState) -> Router {
    let client = ontology_client(state);
    Router::new()
        .route("/api/v1/namespaces/{ns}/tbox", get(published))
        .route(
            "/api/v1/namespaces/{ns}/tbox/draft",
            get(draft).put(put_draft),
        )
        .route("/api/v1/namespaces/{ns}/tbox/draft/review", post(review))
        .route("/api/v1/namespaces/{ns}/tbox/publish", post(publish))
        .route("/api/v1/namespaces/{ns}/tbox/candidates", get(candidates))
        .with_state(TboxState {
            client,
            graph: state.backends.graph.clone(),
        })
}

type ApiResult = Result<Response, ApiError>;

impl TboxState {
    fn client(&self) -> Result<OntologyClient<Channel>, ApiError> {
        self.client.clone().ok_or_else(|| {
            ApiError::from(ClientError::new(
                ErrorCode::Unavailable,
                "no ontology service is configured for this gateway (`ontology_addr`)",
            ))
        })
    }
}

fn backend(status: tonic::Status) -> ApiError {
    ApiError::from(ClientError::from_status("ontology", &status))
}

/// The path's namespace, once it passed the namespace rules.
fn namespace(ns: String) -> Result<String, ApiError> {
    valid_namespace(&ns)?;
    Ok(ns)
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DraftJson {
    namespace: String,
    entity_types: Vec<EntityTypeJson>,
    relation_types: Vec<RelationTypeJson>,
    updated_by: String,
    updated_at_ms: i64,
    /// Empty until the draft is reviewed; every later put clears it.
    reviewed_by: String,
    reviewed_at_ms: Option<i64>,
    next_version: i64,
    /// What a review names to apply to exactly this draft (`POST .../review {"digest"}`).
    digest: String,
}

impl From<TboxDraft> for DraftJson {
    fn from(d: TboxDraft) -> Self {
        Self {
            namespace: d.namespace,
            entity_types: d.entity_types.into_iter().map(Into::into).collect(),
            relation_types: d.relation_types.into_iter().map(Into::into).collect(),
            updated_by: d.updated_by,
            updated_at_ms: d.updated_at_ms,
            reviewed_by: d.reviewed_by,
            reviewed_at_ms: d.reviewed_at_ms,
            next_version: d.next_version,
            digest: d.digest,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PublishedJson {
    namespace: String,
    version: i64,
    entity_types: Vec<EntityTypeJson>,
    relation_types: Vec<RelationTypeJson>,
    published_at_ms: i64,
}

impl From<Tbox> for PublishedJson {
    fn from(t: Tbox) -> Self {
        Self {
            namespace: t.namespace,
            version: t.version,
            entity_types: t.entity_types.into_iter().map(Into::into).collect(),
            relation_types: t.relation_types.into_iter().map(Into::into).collect(),
            published_at_ms: t.published_at_ms,
        }
    }
}

async fn published(
    State(state): State<TboxState>,
    Extension(caller): Extension<Caller>,
    Path(ns): Path<String>,
) -> ApiResult {
    let tbox = state
        .client()?
        .get_published_tbox(caller.request(GetPublishedTboxRequest {
            namespace: namespace(ns)?,
        }))
        .await
        .map_err(backend)?
        .into_inner();
    Ok(Json(PublishedJson::from(tbox)).into_response())
}

async fn draft(
    State(state): State<TboxState>,
    Extension(caller): Extension<Caller>,
    Path(ns): Path<String>,
) -> ApiResult {
    let draft = state
        .client()?
        .get_tbox_draft(caller.request(GetTboxDraftRequest {
            namespace: namespace(ns)?,
        }))
        .await
        .map_err(backend)?
        .into_inner();
    Ok(Json(DraftJson::from(draft)).into_response())
}

async fn put_draft(
    State(state): State<TboxState>,
    Extension(caller): Extension<Caller>,
    Path(ns): Path<String>,
    body: JsonObject,
) -> ApiResult {
    let body = json_body::<TboxBody>(body)?;
    let draft = state
        .client()?
        .put_tbox_draft(caller.request(PutTboxDraftRequest {
            namespace: namespace(ns)?,
            entity_types: body.entity_types.into_iter().map(Into::into).collect(),
            relation_types: body.relation_types.into_iter().map(Into::into).collect(),
        }))
        .await
        .map_err(backend)?
        .into_inner();
    Ok(Json(DraftJson::from(draft)).into_response())
}

/// The optional body of `POST .../tbox/draft/review`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ReviewBody {
    /// The draft's `digest` as the reviewer read it: the review is refused (409) if the draft
    /// changed since.
    #[serde(default)]
    digest: String,
}

async fn review(
    State(state): State<TboxState>,
    Extension(caller): Extension<Caller>,
    Path(ns): Path<String>,
    body: Bytes,
) -> ApiResult {
    // No body, or an empty one, reviews whatever the draft is now.
    let body: ReviewBody = super::admin::optional_object(&body, r#"{"digest": "<hex>"}"#)?;
    let draft = state
        .client()?
        .review_tbox_draft(caller.request(ReviewTboxDraftRequest {
            namespace: namespace(ns)?,
            expected_digest: body.digest,
        }))
        .await
        .map_err(backend)?
        .into_inner();
    Ok(Json(DraftJson::from(draft)).into_response())
}

async fn publish(
    State(state): State<TboxState>,
    Extension(caller): Extension<Caller>,
    Path(ns): Path<String>,
) -> ApiResult {
    let tbox = state
        .client()?
        .publish_tbox(caller.request(PublishTboxRequest {
            namespace: namespace(ns)?,
        }))
        .await
        .map_err(backend)?
        .into_inner();
    Ok(Json(PublishedJson::from(tbox)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CandidatesQuery {
    limit: Option<u32>,
    kind: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CandidateJson {
    name: String,
    kind: String,
    files: u64,
    count: u64,
    sample_paths: Vec<String>,
}

impl From<EntityCandidate> for CandidateJson {
    fn from(c: EntityCandidate) -> Self {
        Self {
            name: c.name,
            kind: c.kind,
            files: c.files,
            count: c.count,
            sample_paths: c.sample_paths,
        }
    }
}

async fn candidates(
    State(state): State<TboxState>,
    Extension(caller): Extension<Caller>,
    Path(ns): Path<String>,
    q: Result<Query<CandidatesQuery>, QueryRejection>,
) -> ApiResult {
    let Query(q) = q.map_err(|r| ApiError::from(ClientError::invalid(r.body_text())))?;
    let found = state
        .graph
        .clone()
        .candidates(caller.request(CandidatesRequest {
            namespace: namespace(ns)?,
            limit: q.limit.unwrap_or(0),
            kind: q.kind.unwrap_or_default(),
        }))
        .await
        .map_err(|status| ApiError::from(ClientError::from_status("graph", &status)))?
        .into_inner();
    let list: Vec<CandidateJson> = found.candidates.into_iter().map(Into::into).collect();
    Ok(Json(serde_json::json!({
        "namespace": found.namespace,
        "candidates": list,
        "total": found.total,
        "truncated": found.truncated,
    }))
    .into_response())
}

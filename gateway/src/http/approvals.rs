//! Admin REST for proposals of governed actions: `/api/v1/approvals` (list),
//! `/api/v1/approvals/{id}` (one, with its audit trail), and
//! `POST .../approve` / `POST .../reject` (a human decision). The approval
//! service enforces the admin flag of the caller's signed context; no MCP tool
//! reaches these routes or the RPCs behind them.

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Extension, Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use kg_common::ErrorCode;
use kg_common::sanitize::{reveal_hidden, reveal_hidden_json};
use kg_proto::v1::approval_client::ApprovalClient;
use kg_proto::v1::{
    DecideRequest, GetProposalRequest, ListProposalsRequest, Proposal, ProposalEvent, ProposalState,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tonic::transport::Channel;

use super::admin::ApiError;
use crate::error::ClientError;
use crate::state::{Caller, GatewayState};

/// The gateway plus a client of the approval service, when one is configured.
#[derive(Clone)]
pub(crate) struct ApprovalsState {
    client: Option<ApprovalClient<Channel>>,
}

/// The approval routes; the bearer middleware is added by the caller.
pub(crate) fn routes(state: &GatewayState) -> Router {
    let client = state.config.approval_addr.as_deref().and_then(|addr| {
        match kg_common::grpc::channel(addr) {
            // A page of up to 1,000 proposals with their arguments is over tonic's 4 MiB.
            Ok(channel) => Some(
                ApprovalClient::new(channel)
                    .max_decoding_message_size(kg_common::grpc::MAX_MESSAGE_BYTES),
            ),
            Err(err) => {
                tracing::error!(addr, error = %err, "approval service address unusable");
                None
            }
        }
    });
    Router::new()
        .route("/api/v1/approvals", get(list))
        .route("/api/v1/approvals/{id}", get(show))
        .route("/api/v1/approvals/{id}/approve", post(approve))
        .route("/api/v1/approvals/{id}/reject", post(reject))
        .with_state(ApprovalsState { client })
}

type ApiResult = Result<Response, ApiError>;

impl ApprovalsState {
    fn client(&self) -> Result<ApprovalClient<Channel>, ApiError> {
        self.client.clone().ok_or_else(|| {
            ApiError::from(ClientError::new(
                ErrorCode::Unavailable,
                "no approval service is configured for this gateway",
            ))
        })
    }
}

fn backend(status: tonic::Status) -> ApiError {
    ApiError::from(ClientError::from_status("approval", &status))
}

/// Stable lowercase name of a state, as the CLI and REST use it.
pub(crate) fn state_name(state: ProposalState) -> &'static str {
    match state {
        ProposalState::Pending => "pending",
        ProposalState::Approved => "approved",
        ProposalState::Rejected => "rejected",
        ProposalState::Executed => "executed",
        ProposalState::EffectFailed => "effect_failed",
        ProposalState::Unknown => "unknown",
        ProposalState::PreconditionFailed => "precondition_failed",
        ProposalState::EffectMisconfigured => "effect_misconfigured",
        ProposalState::Unspecified => "unspecified",
    }
}

fn parse_state(value: &str) -> Result<ProposalState, ApiError> {
    [
        ProposalState::Pending,
        ProposalState::Approved,
        ProposalState::Rejected,
        ProposalState::Executed,
        ProposalState::EffectFailed,
        ProposalState::Unknown,
        ProposalState::PreconditionFailed,
        ProposalState::EffectMisconfigured,
    ]
    .into_iter()
    .find(|s| state_name(*s) == value)
    .ok_or_else(|| {
        ApiError::from(ClientError::invalid(format!(
            "state `{value}` is unknown; use pending, approved, rejected, executed, effect_failed, unknown, precondition_failed or effect_misconfigured"
        )))
    })
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct EffectJson {
    method: String,
    url_template: String,
    host: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct EventJson {
    at_ms: i64,
    kind: String,
    actor: String,
    detail: String,
    #[serde(skip_serializing_if = "is_zero")]
    attempt: u32,
    #[serde(skip_serializing_if = "is_zero")]
    http_status: u32,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

impl From<ProposalEvent> for EventJson {
    fn from(e: ProposalEvent) -> Self {
        Self {
            at_ms: e.at_ms,
            kind: e.kind,
            actor: e.actor,
            detail: e.detail,
            attempt: e.attempt,
            http_status: e.http_status,
        }
    }
}

/// A proposal as admins see it: the effect's template and host, never a resolved URL.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ProposalJson {
    id: String,
    object: String,
    action: String,
    arguments: Value,
    arguments_sha256: String,
    policy_version: i64,
    proposer: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    on_behalf_of: String,
    agent: String,
    role: String,
    /// `granted` (a `role:` group) or `asserted` (a stdio launcher's `--role`, which anyone
    /// holding its token may choose).
    role_source: &'static str,
    state: &'static str,
    #[serde(skip_serializing_if = "String::is_empty")]
    refusal: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    outcome_detail: String,
    effect: EffectJson,
    attempts: u32,
    idempotency_key: String,
    execute_now: bool,
    created_at_ms: i64,
    decided_at_ms: Option<i64>,
    #[serde(skip_serializing_if = "String::is_empty")]
    decided_by: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    decision_reason: String,
    finished_at_ms: Option<i64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    events: Vec<EventJson>,
}

impl From<Proposal> for ProposalJson {
    fn from(p: Proposal) -> Self {
        let state = state_name(p.state());
        Self {
            // The approver sees every character the effect would be sent: hidden ones are
            // written out (`⟦U+202E⟧`) rather than shown raw or stripped.
            arguments: reveal_hidden_json(
                serde_json::from_str(&p.arguments_json).unwrap_or(Value::String(p.arguments_json)),
            ),
            id: p.id,
            object: p.object,
            action: p.action,
            arguments_sha256: p.arguments_sha256,
            policy_version: p.policy_version,
            proposer: p.proposer,
            on_behalf_of: p.on_behalf_of,
            agent: p.agent,
            role: reveal_hidden(&p.role).into_owned(),
            role_source: if p.role_asserted {
                "asserted"
            } else {
                "granted"
            },
            state,
            refusal: p.refusal,
            outcome_detail: p.outcome_detail,
            effect: EffectJson {
                method: p.effect_method,
                url_template: p.effect_url_template,
                host: p.effect_host,
            },
            attempts: p.attempts,
            idempotency_key: p.idempotency_key,
            execute_now: p.execute_now,
            created_at_ms: p.created_at_ms,
            decided_at_ms: p.decided_at_ms,
            decided_by: p.decided_by,
            decision_reason: p.decision_reason,
            finished_at_ms: p.finished_at_ms,
            events: p.events.into_iter().map(Into::into).collect(),
        }
    }
}

fn proposal_response(p: Proposal) -> Response {
    Json(serde_json::to_value(ProposalJson::from(p)).unwrap_or(Value::Null)).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    state: Option<String>,
    limit: Option<u32>,
}

async fn list(
    State(state): State<ApprovalsState>,
    Extension(caller): Extension<Caller>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> ApiResult {
    let Query(q) = q.map_err(|r| ApiError::from(ClientError::invalid(r.body_text())))?;
    let filter = match q.state.as_deref().filter(|s| !s.is_empty()) {
        Some(s) => Some(parse_state(s)? as i32),
        None => None,
    };
    let response = state
        .client()?
        .list_proposals(caller.request(ListProposalsRequest {
            state: filter,
            limit: q.limit.unwrap_or(0),
        }))
        .await
        .map_err(backend)?
        .into_inner();
    let list: Vec<ProposalJson> = response.proposals.into_iter().map(Into::into).collect();
    Ok(Json(json!({ "proposals": list, "truncated": response.truncated })).into_response())
}

async fn show(
    State(state): State<ApprovalsState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult {
    let proposal = state
        .client()?
        .get_proposal(caller.request(GetProposalRequest { id }))
        .await
        .map_err(backend)?
        .into_inner();
    Ok(proposal_response(proposal))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DecisionBody {
    #[serde(default)]
    reason: String,
}

/// The optional `{"reason": "..."}` body of a decision.
fn decision_body(body: &Bytes) -> Result<DecisionBody, ApiError> {
    super::admin::optional_object(body, r#"{"reason": "..."}"#)
}

async fn decide(
    state: ApprovalsState,
    caller: Caller,
    id: String,
    approve: bool,
    body: Bytes,
) -> ApiResult {
    let body = decision_body(&body)?;
    let proposal = state
        .client()?
        .decide(caller.request(DecideRequest {
            id: id.clone(),
            approve,
            reason: body.reason,
        }))
        .await
        .map_err(|status| decision_broke_off(&id, status))?
        .into_inner();
    Ok(proposal_response(proposal))
}

/// A decision the approval service did not answer (it stopped mid-call, the deadline passed)
/// may have been recorded, and its effect may be running: the caller is told to look before
/// deciding again, not that the decision failed. A refusal the service answered passes as is.
fn decision_broke_off(id: &str, status: tonic::Status) -> ApiError {
    if status
        .metadata()
        .get(kg_common::error::ERROR_CODE_METADATA_KEY)
        .is_some()
    {
        return backend(status);
    }
    tracing::warn!(grpc_code = ?status.code(), message = status.message(), "a decision got no answer from the approval service");
    ApiError::from(ClientError::new(
        ErrorCode::Unavailable,
        format!(
            "the approval service did not answer the decision on `{}`: it may have been recorded and its effect may be running; `kgmesh approvals show` tells where it stands (a decision made already refuses a second one)",
            kg_common::sanitize::sanitize_text(id, 200)
        ),
    ))
}

async fn approve(
    State(state): State<ApprovalsState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult {
    decide(state, caller, id, true, body).await
}

async fn reject(
    State(state): State<ApprovalsState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult {
    decide(state, caller, id, false, body).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    async fn answer(err: ApiError) -> (axum::http::StatusCode, Value) {
        let response = err.into_response();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    /// A decision the approval service never answered may stand: the caller is sent to look,
    /// not told it failed. One it refused (409: decided already) passes as it was answered.
    #[tokio::test]
    async fn a_decision_without_an_answer_says_it_may_stand() {
        let (status, body) = answer(decision_broke_off(
            "prp_1",
            tonic::Status::unknown("h2 protocol error: connection reset"),
        ))
        .await;
        assert_eq!(status, axum::http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body["code"], "unavailable");
        let message = body["message"].as_str().unwrap();
        assert!(message.contains("may have been recorded"), "{message}");
        assert!(message.contains("approvals show"), "{message}");
        assert!(!message.contains("h2"), "{message}");

        let refused = kg_common::error::status_with_code(
            ErrorCode::FailedPrecondition,
            "proposal `prp_1` is approved, not pending",
        );
        let (status, body) = answer(decision_broke_off("prp_1", refused)).await;
        assert_eq!(status, axum::http::StatusCode::CONFLICT);
        assert!(body["message"].as_str().unwrap().contains("not pending"));
    }

    #[test]
    fn every_state_name_parses_back() {
        for state in [
            ProposalState::Pending,
            ProposalState::Approved,
            ProposalState::Rejected,
            ProposalState::Executed,
            ProposalState::EffectFailed,
            ProposalState::Unknown,
            ProposalState::PreconditionFailed,
            ProposalState::EffectMisconfigured,
        ] {
            assert_eq!(parse_state(state_name(state)).ok(), Some(state));
        }
        assert!(parse_state("approved_on_timeout").is_err());
    }

    #[test]
    fn an_approver_sees_hidden_characters_in_arguments_written_out() {
        let p = Proposal {
            id: "prp_2".into(),
            arguments_json: r#"{"reason":"refund 10\u202e0 EUR","note\u200b":"ok"}"#.into(),
            ..Default::default()
        };
        let v = serde_json::to_value(ProposalJson::from(p)).unwrap();
        assert_eq!(v["arguments"]["reason"], "refund 10⟦U+202E⟧0 EUR");
        assert_eq!(v["arguments"]["note⟦U+200B⟧"], "ok");
    }

    #[test]
    fn proposal_json_shows_template_and_host_only() {
        let p = Proposal {
            id: "prp_1".into(),
            arguments_json: r#"{"order_id":42}"#.into(),
            effect_method: "POST".into(),
            effect_url_template: "https://hooks.example/{id}".into(),
            effect_host: "hooks.example".into(),
            state: ProposalState::Pending as i32,
            ..Default::default()
        };
        let v = serde_json::to_value(ProposalJson::from(p)).unwrap();
        assert_eq!(v["state"], "pending");
        assert_eq!(v["arguments"]["order_id"], 42);
        assert_eq!(v["effect"]["urlTemplate"], "https://hooks.example/{id}");
        assert_eq!(v["effect"]["host"], "hooks.example");
        assert!(v.get("events").is_none());
        assert!(decision_body(&Bytes::from_static(b"")).is_ok());
        assert_eq!(
            decision_body(&Bytes::from_static(br#"{"reason":"ok"}"#))
                .ok()
                .map(|b| b.reason),
            Some("ok".to_owned())
        );
        assert!(decision_body(&Bytes::from_static(br#"{"approved":true}"#)).is_err());
    }
}

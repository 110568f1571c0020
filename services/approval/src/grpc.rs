//! `kg.v1.Approval` over tonic: verified caller in, service call, status out.

use kg_common::caller::{CALLER_METADATA_KEY, CallerError, require_caller};
use kg_common::grpc::time_allowed;
use kg_proto::v1::approval_server::Approval;
use kg_proto::v1::{
    DecideRequest, GetProposalRequest, ListProposalsRequest, ListProposalsResponse, Proposal,
    ProposalState, SignedCallerContext, SubmitProposalRequest,
};
use prost::Message as _;
use tonic::{Request, Response, Status};

use crate::error::ApprovalError;
use crate::service::ApprovalService;

/// The signed context the request came with (already verified by the layer),
/// forwarded unchanged to the ontology service for the live re-check.
fn signed_context<T>(request: &Request<T>) -> Result<SignedCallerContext, Status> {
    let raw = request
        .metadata()
        .get_bin(CALLER_METADATA_KEY)
        .ok_or_else(|| Status::from(ApprovalError::Caller(CallerError::Missing)))?;
    let bytes = raw
        .to_bytes()
        .map_err(|_| Status::from(ApprovalError::Caller(CallerError::Malformed)))?;
    SignedCallerContext::decode(bytes.as_ref())
        .map_err(|_| Status::from(ApprovalError::Caller(CallerError::Malformed)))
}

#[tonic::async_trait]
impl Approval for ApprovalService {
    async fn submit(
        &self,
        request: Request<SubmitProposalRequest>,
    ) -> Result<Response<Proposal>, Status> {
        let caller = require_caller(&request)?;
        let signed = signed_context(&request)?;
        let allowed = time_allowed(&request);
        let proposal = self
            .submit(&caller, &signed, request.into_inner(), allowed)
            .await?;
        Ok(Response::new(proposal))
    }

    async fn list_proposals(
        &self,
        request: Request<ListProposalsRequest>,
    ) -> Result<Response<ListProposalsResponse>, Status> {
        let caller = require_caller(&request)?;
        let message = request.into_inner();
        let state = match message.state {
            None => None,
            Some(raw) => match ProposalState::try_from(raw) {
                Ok(ProposalState::Unspecified) | Err(_) => {
                    return Err(
                        ApprovalError::Invalid(format!("unknown proposal state {raw}")).into(),
                    );
                }
                Ok(state) => Some(state),
            },
        };
        let (proposals, truncated) = self.list(&caller, state, message.limit).await?;
        Ok(Response::new(ListProposalsResponse {
            proposals,
            truncated,
        }))
    }

    async fn get_proposal(
        &self,
        request: Request<GetProposalRequest>,
    ) -> Result<Response<Proposal>, Status> {
        let caller = require_caller(&request)?;
        let proposal = self.get(&caller, &request.get_ref().id).await?;
        Ok(Response::new(proposal))
    }

    async fn decide(&self, request: Request<DecideRequest>) -> Result<Response<Proposal>, Status> {
        let caller = require_caller(&request)?;
        let signed = signed_context(&request)?;
        let allowed = time_allowed(&request);
        let message = request.into_inner();
        let proposal = self
            .decide(
                &caller,
                &signed,
                &message.id,
                message.approve,
                &message.reason,
                allowed,
            )
            .await?;
        Ok(Response::new(proposal))
    }
}

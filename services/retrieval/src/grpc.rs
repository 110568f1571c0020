//! The gRPC adapter: read the verified caller, call the domain method, convert.

use kg_common::caller::require_caller;
use kg_common::grpc::time_allowed;
use kg_proto::v1::retrieval_server::Retrieval;
use kg_proto::v1::{EntitySearchRequest, EntitySearchResponse, SearchRequest, SearchResponse};
use tonic::{Request, Response, Status};

use crate::service::RetrievalService;

#[tonic::async_trait]
impl Retrieval for RetrievalService {
    async fn search(
        &self,
        request: Request<SearchRequest>,
    ) -> Result<Response<SearchResponse>, Status> {
        let caller = require_caller(&request)?;
        let allowed = time_allowed(&request);
        Ok(Response::new(
            self.search_within(&caller, request.into_inner(), allowed)
                .await?,
        ))
    }

    async fn entity_search(
        &self,
        request: Request<EntitySearchRequest>,
    ) -> Result<Response<EntitySearchResponse>, Status> {
        let caller = require_caller(&request)?;
        let allowed = time_allowed(&request);
        Ok(Response::new(
            self.entity_search_within(&caller, request.into_inner(), allowed)
                .await?,
        ))
    }
}

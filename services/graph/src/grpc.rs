//! The gRPC adapter: read the verified caller, call the domain method, convert.

use kg_common::caller::require_caller;
use kg_proto::v1::graph_server::Graph;
use kg_proto::v1::{
    CandidatesRequest, CandidatesResponse, CypherRequest, CypherResponse, FileEntitiesRequest,
    FileEntitiesResponse, FileTriplesRequest, FileTriplesResponse, HopRequest, OntologyRequest,
    OntologyResponse, OpenRequest, OutlineRequest, OutlineResponse, PackagesRequest,
    PackagesResponse,
};
use tonic::{Request, Response, Status};

use crate::service::GraphService;

#[tonic::async_trait]
impl Graph for GraphService {
    async fn packages(
        &self,
        request: Request<PackagesRequest>,
    ) -> Result<Response<PackagesResponse>, Status> {
        let caller = require_caller(&request)?;
        Ok(Response::new(
            self.packages_for(&caller, request.into_inner()).await?,
        ))
    }

    async fn open(
        &self,
        request: Request<OpenRequest>,
    ) -> Result<Response<PackagesResponse>, Status> {
        let caller = require_caller(&request)?;
        Ok(Response::new(
            self.open_for(&caller, request.into_inner()).await?,
        ))
    }

    async fn hop(
        &self,
        request: Request<HopRequest>,
    ) -> Result<Response<PackagesResponse>, Status> {
        let caller = require_caller(&request)?;
        Ok(Response::new(
            self.hop_for(&caller, request.into_inner()).await?,
        ))
    }

    async fn outline(
        &self,
        request: Request<OutlineRequest>,
    ) -> Result<Response<OutlineResponse>, Status> {
        let caller = require_caller(&request)?;
        Ok(Response::new(
            self.outline_for(&caller, request.into_inner()).await?,
        ))
    }

    async fn file_entities(
        &self,
        request: Request<FileEntitiesRequest>,
    ) -> Result<Response<FileEntitiesResponse>, Status> {
        let caller = require_caller(&request)?;
        Ok(Response::new(
            self.file_entities_for(&caller, request.into_inner())
                .await?,
        ))
    }

    async fn file_triples(
        &self,
        request: Request<FileTriplesRequest>,
    ) -> Result<Response<FileTriplesResponse>, Status> {
        let caller = require_caller(&request)?;
        Ok(Response::new(
            self.file_triples_for(&caller, request.into_inner()).await?,
        ))
    }

    async fn ontology(
        &self,
        request: Request<OntologyRequest>,
    ) -> Result<Response<OntologyResponse>, Status> {
        let caller = require_caller(&request)?;
        Ok(Response::new(
            self.ontology_for(&caller, request.into_inner()).await?,
        ))
    }

    async fn candidates(
        &self,
        request: Request<CandidatesRequest>,
    ) -> Result<Response<CandidatesResponse>, Status> {
        let caller = require_caller(&request)?;
        Ok(Response::new(
            self.candidates_for(&caller, request.into_inner()).await?,
        ))
    }

    async fn cypher(
        &self,
        request: Request<CypherRequest>,
    ) -> Result<Response<CypherResponse>, Status> {
        let caller = require_caller(&request)?;
        let allowed = kg_common::grpc::time_allowed(&request);
        Ok(Response::new(
            self.cypher_within(&caller, request.into_inner(), allowed)
                .await?,
        ))
    }
}

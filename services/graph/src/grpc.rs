//! The gRPC adapter: read the verified caller, call the domain method, convert.

use kg_common::caller::require_caller;
use kg_proto::v1::graph_server::Graph;
use kg_proto::v1::{
    CypherRequest, CypherResponse, FileEntitiesRequest, FileEntitiesResponse, FileTriplesRequest,
    FileTriplesResponse, HopRequest, OpenRequest, OutlineRequest, OutlineResponse, PackagesRequest,
    PackagesResponse,
};
use tonic::{Request, Response, Status};

use crate::service::GraphService;

fn later_release(rpc: &str) -> Status {
    Status::unimplemented(format!(
        "kg.v1.Graph/{rpc} arrives in a later kgmesh release; this server does not serve it yet"
    ))
}

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
        require_caller(&request)?;
        Err(later_release("Hop"))
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
        require_caller(&request)?;
        Err(later_release("FileEntities"))
    }

    async fn file_triples(
        &self,
        request: Request<FileTriplesRequest>,
    ) -> Result<Response<FileTriplesResponse>, Status> {
        require_caller(&request)?;
        Err(later_release("FileTriples"))
    }

    async fn cypher(
        &self,
        request: Request<CypherRequest>,
    ) -> Result<Response<CypherResponse>, Status> {
        require_caller(&request)?;
        Err(later_release("Cypher"))
    }
}

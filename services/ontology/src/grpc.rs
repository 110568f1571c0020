//! `impl kg_proto::v1::ontology_server::Ontology` for [`OntologyService`]: a
//! few lines per RPC; the logic is in the service.

use std::pin::Pin;

use futures::{Stream, StreamExt as _};
use kg_common::caller::{
    CALLER_METADATA_KEY, access_for, require_admin, require_caller, require_role,
};
use kg_proto::v1::ontology_server::Ontology;
use kg_proto::v1::{
    CallGeneratedToolRequest, CallGeneratedToolResponse, CheckActionRequest, CheckActionResponse,
    CompiledVersion, GetPublishedTboxRequest, GetTboxDraftRequest, ListGeneratedToolsRequest,
    ListGeneratedToolsResponse, PublishTboxRequest, PurgeTboxRequest, PurgeTboxResponse,
    PutTboxDraftRequest, ReloadProjectRequest, ReloadProjectResponse, ReviewTboxDraftRequest,
    SignedCallerContext, Tbox, TboxDraft, WatchCompiledRequest,
};
use prost::Message as _;
use tonic::{Request, Response, Status};

use crate::error::OntologyError;
use crate::service::{Forward, OntologyService, tool_proto};
use crate::tbox::TboxStore;

fn signed_of<T>(request: &Request<T>) -> Option<SignedCallerContext> {
    let value = request.metadata().get_bin(CALLER_METADATA_KEY)?;
    let bytes = value.to_bytes().ok()?;
    SignedCallerContext::decode(bytes.as_ref()).ok()
}

fn tbox_store(service: &OntologyService) -> Result<&TboxStore, Status> {
    service.tbox().ok_or_else(|| {
        OntologyError::Conflict("this ontology service keeps no TBoxes (no SQL store)".into())
            .into()
    })
}

#[tonic::async_trait]
impl Ontology for OntologyService {
    async fn get_published_tbox(
        &self,
        request: Request<GetPublishedTboxRequest>,
    ) -> Result<Response<Tbox>, Status> {
        let caller = require_caller(&request)?;
        let ns = request.into_inner().namespace;
        // An admin publishes a TBox before the namespace exists (the ingest makes it), so an
        // admin reads it back then too; anyone else reads it where it may read.
        if caller.is_admin {
            kg_common::access::validate_namespace(&ns)
                .map_err(|e| Status::from(OntologyError::BadRequest(e.to_string())))?;
        } else {
            access_for(&caller, &ns).map_err(|e| kg_common::error::to_status(&e))?;
        }
        Ok(Response::new(tbox_store(self)?.published(&ns).await?))
    }

    async fn list_generated_tools(
        &self,
        request: Request<ListGeneratedToolsRequest>,
    ) -> Result<Response<ListGeneratedToolsResponse>, Status> {
        let caller = require_caller(&request)?;
        let (tools, compiled_version) = self.tools_for(&caller.roles);
        Ok(Response::new(ListGeneratedToolsResponse {
            tools,
            compiled_version,
        }))
    }

    async fn call_generated_tool(
        &self,
        request: Request<CallGeneratedToolRequest>,
    ) -> Result<Response<CallGeneratedToolResponse>, Status> {
        let caller = require_caller(&request)?;
        let forward = signed_of(&request).map(|signed| Forward {
            signed,
            allowed: kg_common::grpc::time_allowed(&request),
        });
        let r = request.into_inner();
        let result = self
            .call_tool(&r.name, &r.arguments_json, &caller.roles, &r.agent, forward)
            .await;
        Ok(Response::new(CallGeneratedToolResponse {
            result_json: result.to_string(),
        }))
    }

    async fn check_action(
        &self,
        request: Request<CheckActionRequest>,
    ) -> Result<Response<CheckActionResponse>, Status> {
        let caller = require_caller(&request)?;
        let r = request.into_inner();
        // An admin deciding a proposal (through the admin API) re-checks it as the role it
        // was made as; anyone else, an admin's MCP context included, only as a role it holds.
        if require_admin(&caller).is_err() {
            require_role(&caller, &r.role).map_err(|e| kg_common::error::to_status(&e))?;
        }
        Ok(Response::new(
            OntologyService::check_action(self, &r.object, &r.action, &r.arguments_json, &r.role)
                .await?,
        ))
    }

    async fn reload_project(
        &self,
        request: Request<ReloadProjectRequest>,
    ) -> Result<Response<ReloadProjectResponse>, Status> {
        let caller = require_caller(&request)?;
        require_admin(&caller).map_err(|e| kg_common::error::to_status(&e))?;
        match self.reload().await {
            Ok(active) => Ok(Response::new(ReloadProjectResponse {
                compiled_version: active.compiled.policy_version,
                problems: Vec::new(),
                tools: active.compiled.tools.iter().map(tool_proto).collect(),
            })),
            Err(OntologyError::Invalid(problems)) => Ok(Response::new(ReloadProjectResponse {
                compiled_version: self.active().map_or(0, |a| a.compiled.policy_version),
                problems,
                tools: Vec::new(),
            })),
            Err(err) => Err(err.into()),
        }
    }

    type WatchCompiledStream = Pin<Box<dyn Stream<Item = Result<CompiledVersion, Status>> + Send>>;

    async fn watch_compiled(
        &self,
        _request: Request<WatchCompiledRequest>,
    ) -> Result<Response<Self::WatchCompiledStream>, Status> {
        let rx = self.subscribe();
        let end = self.watches_end().cancelled_owned();
        let stream = futures::stream::unfold((rx, true), |(mut rx, first)| async move {
            if !first && rx.changed().await.is_err() {
                return None;
            }
            let v = *rx.borrow_and_update();
            Some((
                Ok(CompiledVersion {
                    compiled_version: v,
                }),
                (rx, false),
            ))
        })
        .take_until(end);
        Ok(Response::new(Box::pin(stream)))
    }

    async fn put_tbox_draft(
        &self,
        request: Request<PutTboxDraftRequest>,
    ) -> Result<Response<TboxDraft>, Status> {
        let caller = require_caller(&request)?;
        require_admin(&caller).map_err(|e| kg_common::error::to_status(&e))?;
        let r = request.into_inner();
        kg_common::access::validate_namespace(&r.namespace)
            .map_err(|e| Status::from(OntologyError::BadRequest(e.to_string())))?;
        let tbox = Tbox {
            namespace: r.namespace,
            version: 0,
            entity_types: r.entity_types,
            relation_types: r.relation_types,
            published_at_ms: 0,
        };
        Ok(Response::new(
            tbox_store(self)?
                .put_draft(&tbox, &caller.principal_id)
                .await?,
        ))
    }

    async fn get_tbox_draft(
        &self,
        request: Request<GetTboxDraftRequest>,
    ) -> Result<Response<TboxDraft>, Status> {
        let caller = require_caller(&request)?;
        require_admin(&caller).map_err(|e| kg_common::error::to_status(&e))?;
        Ok(Response::new(
            tbox_store(self)?
                .draft(&request.into_inner().namespace)
                .await?,
        ))
    }

    async fn review_tbox_draft(
        &self,
        request: Request<ReviewTboxDraftRequest>,
    ) -> Result<Response<TboxDraft>, Status> {
        let caller = require_caller(&request)?;
        require_admin(&caller).map_err(|e| kg_common::error::to_status(&e))?;
        let r = request.into_inner();
        Ok(Response::new(
            tbox_store(self)?
                .review(
                    &r.namespace,
                    &caller.principal_id,
                    Some(r.expected_digest.as_str()).filter(|d| !d.is_empty()),
                )
                .await?,
        ))
    }

    async fn publish_tbox(
        &self,
        request: Request<PublishTboxRequest>,
    ) -> Result<Response<Tbox>, Status> {
        let caller = require_caller(&request)?;
        require_admin(&caller).map_err(|e| kg_common::error::to_status(&e))?;
        Ok(Response::new(
            tbox_store(self)?
                .publish(&request.into_inner().namespace, &caller.principal_id)
                .await?,
        ))
    }

    async fn purge_tbox(
        &self,
        request: Request<PurgeTboxRequest>,
    ) -> Result<Response<PurgeTboxResponse>, Status> {
        let caller = require_caller(&request)?;
        require_admin(&caller).map_err(|e| kg_common::error::to_status(&e))?;
        Ok(Response::new(
            tbox_store(self)?
                .purge(&request.into_inner().namespace)
                .await?,
        ))
    }
}

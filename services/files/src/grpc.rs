//! The thin gRPC adapter of [`FilesService`].

use std::sync::Arc;

use kg_common::caller::{require_admin_api, require_caller};
use kg_proto::v1::files_server::Files;
use kg_proto::v1::get_file_request::Selector;
use kg_proto::v1::*;
use tonic::{Request, Response, Status};

use crate::service::FilesService;

/// The caller of a request that changes what is stored: only with a context minted for the
/// admin API, so one an MCP call carried (to any service) cannot be replayed to write.
fn require_writer<T>(request: &Request<T>) -> Result<Arc<CallerContext>, Status> {
    let caller = require_caller(request)?;
    require_admin_api(&caller).map_err(|e| kg_common::error::to_status(&e))?;
    Ok(caller)
}

#[tonic::async_trait]
impl Files for FilesService {
    async fn upload(
        &self,
        request: Request<UploadRequest>,
    ) -> Result<Response<UploadResponse>, Status> {
        let caller = require_writer(&request)?;
        let r = request.into_inner();
        Ok(Response::new(
            self.upload(&caller, &r.namespace, &r.path, &r.content, &r.mime)
                .await?,
        ))
    }

    async fn get_file(
        &self,
        request: Request<GetFileRequest>,
    ) -> Result<Response<FileInfo>, Status> {
        let caller = require_caller(&request)?;
        let r = request.into_inner();
        let (path, id) = match &r.selector {
            Some(Selector::Path(p)) => (Some(p.as_str()), None),
            Some(Selector::FileId(f)) => (None, Some(f.as_str())),
            None => (None, None),
        };
        Ok(Response::new(
            self.get_file(&caller, &r.namespace, path, id).await?,
        ))
    }

    async fn list_files(
        &self,
        request: Request<ListFilesRequest>,
    ) -> Result<Response<ListFilesResponse>, Status> {
        let caller = require_caller(&request)?;
        let r = request.into_inner();
        Ok(Response::new(
            self.list_files(
                &caller,
                &r.namespace,
                &r.folder_prefix,
                r.limit,
                &r.cursor,
                r.include_hidden,
            )
            .await?,
        ))
    }

    async fn set_file_flags(
        &self,
        request: Request<SetFileFlagsRequest>,
    ) -> Result<Response<FileInfo>, Status> {
        let caller = require_writer(&request)?;
        let r = request.into_inner();
        Ok(Response::new(
            self.set_flags(&caller, &r.namespace, &r.file_id, r.enabled, r.hidden)
                .await?,
        ))
    }

    async fn find_files(
        &self,
        request: Request<FindFilesRequest>,
    ) -> Result<Response<FindFilesResponse>, Status> {
        let caller = require_caller(&request)?;
        Ok(Response::new(
            self.find_files(&caller, request.get_ref()).await?,
        ))
    }

    async fn query_file(
        &self,
        request: Request<QueryFileRequest>,
    ) -> Result<Response<QueryFileResponse>, Status> {
        let caller = require_caller(&request)?;
        Ok(Response::new(
            self.query_file(&caller, request.get_ref()).await?,
        ))
    }

    async fn delete_file(
        &self,
        request: Request<DeleteFileRequest>,
    ) -> Result<Response<DeleteFileResponse>, Status> {
        let caller = require_writer(&request)?;
        let r = request.into_inner();
        Ok(Response::new(DeleteFileResponse {
            deleted: self.delete_file(&caller, &r.namespace, &r.file_id).await?,
        }))
    }
    async fn reindex(
        &self,
        request: Request<ReindexRequest>,
    ) -> Result<Response<ReindexResponse>, Status> {
        let caller = require_writer(&request)?;
        Ok(Response::new(
            self.reindex(&caller, request.get_ref()).await?,
        ))
    }

    async fn sweep_blobs(
        &self,
        request: Request<SweepBlobsRequest>,
    ) -> Result<Response<SweepBlobsResponse>, Status> {
        let caller = require_writer(&request)?;
        Ok(Response::new(
            self.sweep_blobs_for(&caller, request.get_ref().grace_seconds)
                .await?,
        ))
    }

    async fn purge_namespace(
        &self,
        request: Request<PurgeNamespaceRequest>,
    ) -> Result<Response<NamespacePurge>, Status> {
        let caller = require_writer(&request)?;
        Ok(Response::new(
            self.purge_namespace(&caller, &request.get_ref().namespace)
                .await?,
        ))
    }

    async fn get_namespace_purge(
        &self,
        request: Request<GetNamespacePurgeRequest>,
    ) -> Result<Response<NamespacePurge>, Status> {
        let caller = require_writer(&request)?;
        Ok(Response::new(
            self.namespace_purge(&caller, &request.get_ref().namespace)
                .await?,
        ))
    }

    async fn create_branch(
        &self,
        request: Request<CreateBranchRequest>,
    ) -> Result<Response<Branch>, Status> {
        let caller = require_writer(&request)?;
        let r = request.get_ref();
        Ok(Response::new(
            self.create_branch(&caller, &r.namespace, &r.name).await?,
        ))
    }

    async fn list_branches(
        &self,
        request: Request<ListBranchesRequest>,
    ) -> Result<Response<ListBranchesResponse>, Status> {
        let caller = require_caller(&request)?;
        let branches = self
            .list_branches(&caller, &request.get_ref().namespace)
            .await?;
        Ok(Response::new(ListBranchesResponse { branches }))
    }

    async fn upload_to_branch(
        &self,
        request: Request<UploadToBranchRequest>,
    ) -> Result<Response<BranchFile>, Status> {
        let caller = require_writer(&request)?;
        let r = request.get_ref();
        Ok(Response::new(
            self.upload_to_branch(
                &caller,
                &r.namespace,
                &r.branch,
                &r.path,
                &r.content,
                &r.mime,
            )
            .await?,
        ))
    }

    async fn create_release(
        &self,
        request: Request<CreateReleaseRequest>,
    ) -> Result<Response<Release>, Status> {
        let caller = require_writer(&request)?;
        let r = request.get_ref();
        Ok(Response::new(
            self.create_release(&caller, &r.namespace, &r.version, &r.branch, &r.note)
                .await?,
        ))
    }

    async fn list_releases(
        &self,
        request: Request<ListReleasesRequest>,
    ) -> Result<Response<ListReleasesResponse>, Status> {
        let caller = require_caller(&request)?;
        let releases = self
            .list_releases(&caller, &request.get_ref().namespace)
            .await?;
        Ok(Response::new(ListReleasesResponse { releases }))
    }

    async fn deploy_environment(
        &self,
        request: Request<DeployEnvironmentRequest>,
    ) -> Result<Response<Environment>, Status> {
        let caller = require_writer(&request)?;
        let r = request.get_ref();
        let release = r.release.clone().unwrap_or_default();
        Ok(Response::new(
            self.deploy_environment(&caller, &r.namespace, &r.environment, &release)
                .await?,
        ))
    }

    async fn list_environments(
        &self,
        request: Request<ListEnvironmentsRequest>,
    ) -> Result<Response<ListEnvironmentsResponse>, Status> {
        let caller = require_caller(&request)?;
        let environments = self
            .list_environments(&caller, &request.get_ref().namespace)
            .await?;
        Ok(Response::new(ListEnvironmentsResponse { environments }))
    }

    async fn resolve_target(
        &self,
        request: Request<ResolveTargetRequest>,
    ) -> Result<Response<ResolveTargetResponse>, Status> {
        let caller = require_caller(&request)?;
        let r = request.get_ref();
        Ok(Response::new(
            self.resolve_target(
                &caller,
                &r.namespace,
                r.target.as_ref(),
                r.limit,
                &r.after_path,
            )
            .await?,
        ))
    }

    async fn get_knowledge_graph(
        &self,
        request: Request<GetKnowledgeGraphRequest>,
    ) -> Result<Response<GetKnowledgeGraphResponse>, Status> {
        let caller = require_caller(&request)?;
        Ok(Response::new(
            self.get_knowledge_graph(&caller, request.get_ref()).await?,
        ))
    }
}

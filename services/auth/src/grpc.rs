//! The thin gRPC adapter of [`AuthService`].

use kg_common::caller::require_caller;
use kg_proto::v1::auth_server::Auth;
use kg_proto::v1::*;
use tonic::{Request, Response, Status};

use crate::service::AuthService;

#[tonic::async_trait]
impl Auth for AuthService {
    async fn authorize(
        &self,
        request: Request<AuthorizeRequest>,
    ) -> Result<Response<AuthorizeResponse>, Status> {
        let r = request.into_inner();
        Ok(Response::new(
            self.authorize(&r.token, &r.tool, &r.namespaces, &r.request_id)
                .await?,
        ))
    }

    async fn signing_key(
        &self,
        _request: Request<SigningKeyRequest>,
    ) -> Result<Response<SigningKeyResponse>, Status> {
        let key = self.public_key();
        Ok(Response::new(SigningKeyResponse {
            key_id: key.key_id().to_owned(),
            public_key: key.to_bytes().to_vec(),
            deployment_id: self.deployment_id().to_owned(),
        }))
    }

    async fn create_namespace(
        &self,
        request: Request<CreateNamespaceRequest>,
    ) -> Result<Response<Namespace>, Status> {
        let caller = require_caller(&request)?;
        let r = request.into_inner();
        Ok(Response::new(
            self.create_namespace(&caller, &r.name, &r.description)
                .await?,
        ))
    }

    async fn list_namespaces(
        &self,
        request: Request<ListNamespacesRequest>,
    ) -> Result<Response<ListNamespacesResponse>, Status> {
        let caller = require_caller(&request)?;
        Ok(Response::new(ListNamespacesResponse {
            namespaces: self.list_namespaces(&caller).await?,
        }))
    }

    async fn create_principal(
        &self,
        request: Request<CreatePrincipalRequest>,
    ) -> Result<Response<Principal>, Status> {
        let caller = require_caller(&request)?;
        let r = request.into_inner();
        let kind = r.kind();
        Ok(Response::new(
            self.create_principal(&caller, &r.name, kind, &r.acts_for, r.is_admin)
                .await?,
        ))
    }

    async fn list_principals(
        &self,
        request: Request<ListPrincipalsRequest>,
    ) -> Result<Response<ListPrincipalsResponse>, Status> {
        let caller = require_caller(&request)?;
        Ok(Response::new(ListPrincipalsResponse {
            principals: self.list_principals(&caller).await?,
        }))
    }

    async fn put_grant(
        &self,
        request: Request<PutGrantRequest>,
    ) -> Result<Response<Grant>, Status> {
        let caller = require_caller(&request)?;
        let r = request.into_inner();
        let permission = r.permission();
        Ok(Response::new(
            self.put_grant(
                &caller,
                &r.principal_id,
                &r.namespace,
                permission,
                &r.path_prefix,
            )
            .await?,
        ))
    }

    async fn delete_grant(
        &self,
        request: Request<DeleteGrantRequest>,
    ) -> Result<Response<DeleteGrantResponse>, Status> {
        let caller = require_caller(&request)?;
        let r = request.into_inner();
        Ok(Response::new(DeleteGrantResponse {
            deleted: self.delete_grant(&caller, &r.grant_id).await?,
        }))
    }

    async fn list_grants(
        &self,
        request: Request<ListGrantsRequest>,
    ) -> Result<Response<ListGrantsResponse>, Status> {
        let caller = require_caller(&request)?;
        let r = request.into_inner();
        Ok(Response::new(ListGrantsResponse {
            grants: self.list_grants(&caller, &r.principal_id).await?,
        }))
    }

    async fn create_pat(
        &self,
        request: Request<CreatePatRequest>,
    ) -> Result<Response<CreatePatResponse>, Status> {
        let caller = require_caller(&request)?;
        let r = request.into_inner();
        let (token, pat) = self
            .create_pat(&caller, &r.principal_id, &r.name, r.expires_at_ms)
            .await?;
        Ok(Response::new(CreatePatResponse {
            pat: Some(pat),
            token,
        }))
    }

    async fn list_pats(
        &self,
        request: Request<ListPatsRequest>,
    ) -> Result<Response<ListPatsResponse>, Status> {
        let caller = require_caller(&request)?;
        let r = request.into_inner();
        Ok(Response::new(ListPatsResponse {
            pats: self.list_pats(&caller, &r.principal_id).await?,
        }))
    }

    async fn revoke_pat(
        &self,
        request: Request<RevokePatRequest>,
    ) -> Result<Response<RevokePatResponse>, Status> {
        let caller = require_caller(&request)?;
        let r = request.into_inner();
        Ok(Response::new(RevokePatResponse {
            revoked: self.revoke_pat(&caller, &r.pat_id).await?,
        }))
    }
}

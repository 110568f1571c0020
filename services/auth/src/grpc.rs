//! The thin gRPC adapter of [`AuthService`].

use kg_common::caller::require_caller;
use kg_proto::v1::auth_server::Auth;
use kg_proto::v1::*;
use tonic::{Request, Response, Status};

use crate::service::{AuthService, DenyTarget, Subject};

#[tonic::async_trait]
impl Auth for AuthService {
    async fn authorize(
        &self,
        request: Request<AuthorizeRequest>,
    ) -> Result<Response<AuthorizeResponse>, Status> {
        let r = request.into_inner();
        Ok(Response::new(
            self.authorize_as(
                &r.token,
                &r.tool,
                &r.namespaces,
                &r.request_id,
                r.asserted_role.as_deref(),
            )
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

    async fn retire_namespace(
        &self,
        request: Request<RetireNamespaceRequest>,
    ) -> Result<Response<RetireNamespaceResponse>, Status> {
        let caller = require_caller(&request)?;
        Ok(Response::new(
            self.retire_namespace(&caller, &request.into_inner().name)
                .await?,
        ))
    }

    async fn delete_namespace(
        &self,
        request: Request<DeleteNamespaceRequest>,
    ) -> Result<Response<DeleteNamespaceResponse>, Status> {
        let caller = require_caller(&request)?;
        self.delete_namespace(&caller, &request.into_inner().name)
            .await?;
        Ok(Response::new(DeleteNamespaceResponse { deleted: true }))
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

    async fn set_principal_disabled(
        &self,
        request: Request<SetPrincipalDisabledRequest>,
    ) -> Result<Response<Principal>, Status> {
        let caller = require_caller(&request)?;
        let r = request.into_inner();
        Ok(Response::new(
            self.set_principal_disabled(&caller, &r.id, r.disabled)
                .await?,
        ))
    }

    async fn put_grant(
        &self,
        request: Request<PutGrantRequest>,
    ) -> Result<Response<Grant>, Status> {
        let caller = require_caller(&request)?;
        let r = request.into_inner();
        let permission = r.permission();
        let subject = Subject::from_ids(&r.principal_id, &r.group_id)?;
        Ok(Response::new(
            self.put_grant(&caller, &subject, &r.namespace, permission, &r.path_prefix)
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
        let subject = Subject::from_ids(&r.principal_id, &r.group_id)?;
        Ok(Response::new(ListGrantsResponse {
            grants: self.list_grants(&caller, &subject).await?,
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

    async fn rotate_pat(
        &self,
        request: Request<RotatePatRequest>,
    ) -> Result<Response<CreatePatResponse>, Status> {
        let caller = require_caller(&request)?;
        let r = request.into_inner();
        let (token, pat) = self.rotate_pat(&caller, &r.pat_id).await?;
        Ok(Response::new(CreatePatResponse {
            pat: Some(pat),
            token,
        }))
    }

    async fn create_group(
        &self,
        request: Request<CreateGroupRequest>,
    ) -> Result<Response<Group>, Status> {
        let caller = require_caller(&request)?;
        let r = request.into_inner();
        Ok(Response::new(self.create_group(&caller, &r.name).await?))
    }

    async fn list_groups(
        &self,
        request: Request<ListGroupsRequest>,
    ) -> Result<Response<ListGroupsResponse>, Status> {
        let caller = require_caller(&request)?;
        Ok(Response::new(ListGroupsResponse {
            groups: self.list_groups(&caller).await?,
        }))
    }

    async fn add_group_member(
        &self,
        request: Request<GroupMemberRequest>,
    ) -> Result<Response<Group>, Status> {
        let caller = require_caller(&request)?;
        let r = request.into_inner();
        Ok(Response::new(
            self.add_group_member(&caller, &r.group_id, &r.principal_id)
                .await?,
        ))
    }

    async fn remove_group_member(
        &self,
        request: Request<GroupMemberRequest>,
    ) -> Result<Response<Group>, Status> {
        let caller = require_caller(&request)?;
        let r = request.into_inner();
        Ok(Response::new(
            self.remove_group_member(&caller, &r.group_id, &r.principal_id)
                .await?,
        ))
    }

    async fn put_deny(&self, request: Request<PutDenyRequest>) -> Result<Response<Deny>, Status> {
        let caller = require_caller(&request)?;
        let r = request.into_inner();
        let subject = Subject::from_ids(&r.principal_id, &r.group_id)?;
        let target = DenyTarget::from_fields(&r.path_prefix, &r.file_id)?;
        Ok(Response::new(
            self.put_deny(&caller, &r.namespace, &subject, &target)
                .await?,
        ))
    }

    async fn delete_deny(
        &self,
        request: Request<DeleteDenyRequest>,
    ) -> Result<Response<DeleteDenyResponse>, Status> {
        let caller = require_caller(&request)?;
        let r = request.into_inner();
        Ok(Response::new(DeleteDenyResponse {
            deleted: self.delete_deny(&caller, &r.deny_id).await?,
        }))
    }

    async fn list_denies(
        &self,
        request: Request<ListDeniesRequest>,
    ) -> Result<Response<ListDeniesResponse>, Status> {
        let caller = require_caller(&request)?;
        let r = request.into_inner();
        Ok(Response::new(ListDeniesResponse {
            denies: self.list_denies(&caller, &r.namespace).await?,
        }))
    }

    async fn record_audit(
        &self,
        request: Request<RecordAuditRequest>,
    ) -> Result<Response<RecordAuditResponse>, Status> {
        let caller = require_caller(&request)?;
        let event = request
            .into_inner()
            .event
            .ok_or_else(|| crate::AuthError::Invalid("event is required".to_owned()))?;
        self.record_audit(&caller, event).await?;
        Ok(Response::new(RecordAuditResponse {}))
    }

    async fn list_audit(
        &self,
        request: Request<ListAuditRequest>,
    ) -> Result<Response<ListAuditResponse>, Status> {
        let caller = require_caller(&request)?;
        Ok(Response::new(
            self.list_audit(&caller, request.get_ref()).await?,
        ))
    }
}

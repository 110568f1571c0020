//! In-test doubles of auth and files: one tonic server implementing our own
//! Auth and Files contracts behind the real caller-context layer. Admin RPCs
//! echo their request into a plausible answer and record it (as `Debug`), so
//! tests can assert exactly what the gateway forwarded; RecordAudit stores the
//! event under the principal of the verified context, as the real auth does.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kg_common::ErrorCode;
use kg_common::caller::{
    CONTEXT_TTL_MS, CallerContextLayer, ContextSigner, ContextVerifier, now_ms, require_caller,
};
use kg_common::error::status_with_code;
use kg_proto::v1::auth_server::{Auth, AuthServer};
use kg_proto::v1::files_server::{Files, FilesServer};
use kg_proto::v1::*;
use tokio_util::sync::CancellationToken;
use tonic::{Response, Status};

pub(crate) const GOOD: &str = "kg_pat_good0000000000000000000000000000";
pub(crate) const REVOKED: &str = "kg_pat_revoked000000000000000000000000";
/// An agent (`agt_test`) acting for `usr_test`.
pub(crate) const AGENT: &str = "kg_pat_agent000000000000000000000000000";

/// What the doubles saw.
#[derive(Default)]
pub(crate) struct Recorded {
    pub(crate) authorize_calls: Arc<AtomicUsize>,
    /// Every admin request, as `Debug` of the proto message.
    pub(crate) requests: Mutex<Vec<String>>,
    /// Every RecordAudit event, principal taken from the verified context.
    pub(crate) audits: Mutex<Vec<AuditEvent>>,
    /// Namespaces `GOOD` may read besides `demo` (a grant made between calls).
    pub(crate) extra_namespaces: Mutex<Vec<String>>,
    /// `GOOD` is refused from now on (revoked between calls).
    pub(crate) good_revoked: AtomicBool,
    /// Authorize answers only once a QueryFile arrived after it started (or 5 s passed),
    /// and notes in `backend_before_answer` whether one did.
    pub(crate) hold_authorize: AtomicBool,
    pub(crate) backend_before_answer: AtomicBool,
    pub(crate) query_file_calls: AtomicUsize,
}

impl Recorded {
    fn note<T: std::fmt::Debug>(&self, request: &tonic::Request<T>) -> Result<(), Status> {
        // Admin RPCs need a verified context, exactly like the real services.
        require_caller(request)?;
        self.requests
            .lock()
            .unwrap()
            .push(format!("{:?}", request.get_ref()));
        Ok(())
    }

    pub(crate) fn saw<T: std::fmt::Debug>(&self, message: &T) -> bool {
        let wanted = format!("{message:?}");
        self.requests.lock().unwrap().contains(&wanted)
    }

    pub(crate) fn audits(&self) -> Vec<AuditEvent> {
        self.audits.lock().unwrap().clone()
    }

    /// Waits until at least `n` audit events arrived (they are sent in the background).
    pub(crate) async fn wait_audits(&self, n: usize) -> Vec<AuditEvent> {
        for _ in 0..500 {
            let audits = self.audits();
            if audits.len() >= n {
                return audits;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "expected {n} audit events, got {:?}",
            self.audits.lock().unwrap()
        );
    }
}

struct TestAuth {
    signer: ContextSigner,
    recorded: Arc<Recorded>,
    audit_delay: Duration,
}

type Res<T> = Result<Response<T>, Status>;

fn unimplemented<T>() -> Res<T> {
    Err(Status::unimplemented("test double"))
}

fn group(id: &str, members: Vec<String>) -> Group {
    Group {
        id: id.into(),
        name: "editors".into(),
        member_ids: members,
        created_at_ms: 5,
    }
}

#[tonic::async_trait]
impl Auth for TestAuth {
    async fn authorize(&self, request: tonic::Request<AuthorizeRequest>) -> Res<AuthorizeResponse> {
        self.recorded.authorize_calls.fetch_add(1, Ordering::SeqCst);
        if self.recorded.hold_authorize.load(Ordering::SeqCst) {
            let before = self.recorded.query_file_calls.load(Ordering::SeqCst);
            let mut seen = false;
            for _ in 0..500 {
                if self.recorded.query_file_calls.load(Ordering::SeqCst) > before {
                    seen = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            self.recorded
                .backend_before_answer
                .store(seen, Ordering::SeqCst);
        }
        let r = request.into_inner();
        let good_revoked = self.recorded.good_revoked.load(Ordering::SeqCst);
        let (principal_id, kind, on_behalf_of) = match r.token.as_str() {
            GOOD if !good_revoked => ("usr_test", PrincipalKind::User, ""),
            AGENT => ("agt_test", PrincipalKind::Agent, "usr_test"),
            _ => {
                return Err(status_with_code(
                    ErrorCode::Unauthenticated,
                    "invalid token: it is missing, malformed, revoked, expired or from another deployment, or its principal is disabled",
                ));
            }
        };
        let now = now_ms();
        let mut namespaces = vec!["demo".to_owned()];
        if r.token == GOOD {
            namespaces.extend(
                self.recorded
                    .extra_namespaces
                    .lock()
                    .unwrap()
                    .iter()
                    .cloned(),
            );
        }
        let context = CallerContext {
            principal_id: principal_id.into(),
            principal_kind: kind as i32,
            on_behalf_of: on_behalf_of.into(),
            access: namespaces
                .into_iter()
                .map(|namespace| AccessFilter {
                    namespace,
                    allow_prefixes: vec![String::new()],
                    enabled_only: true,
                    permission: Permission::Read as i32,
                    ..Default::default()
                })
                .collect(),
            issued_at_ms: now,
            expires_at_ms: now + CONTEXT_TTL_MS,
            request_id: r.request_id,
            tool: r.tool,
            ..Default::default()
        };
        Ok(Response::new(AuthorizeResponse {
            context: Some(self.signer.sign(&context)),
            decoded: Some(context),
        }))
    }
    async fn signing_key(&self, _: tonic::Request<SigningKeyRequest>) -> Res<SigningKeyResponse> {
        unimplemented()
    }
    async fn create_namespace(
        &self,
        request: tonic::Request<CreateNamespaceRequest>,
    ) -> Res<Namespace> {
        self.recorded.note(&request)?;
        let r = request.into_inner();
        Ok(Response::new(Namespace {
            name: r.name,
            description: r.description,
            created_at_ms: 1,
        }))
    }
    /// Only `live` exists.
    async fn retire_namespace(
        &self,
        request: tonic::Request<RetireNamespaceRequest>,
    ) -> Res<RetireNamespaceResponse> {
        self.recorded.note(&request)?;
        let name = request.into_inner().name;
        if name != "live" {
            return Err(status_with_code(
                ErrorCode::NotFound,
                format!("namespace `{name}` not found"),
            ));
        }
        Ok(Response::new(RetireNamespaceResponse {
            namespace: Some(Namespace {
                name,
                ..Default::default()
            }),
            retired_at_ms: 3,
            grants_removed: 2,
            denies_removed: 1,
        }))
    }
    async fn delete_namespace(
        &self,
        request: tonic::Request<DeleteNamespaceRequest>,
    ) -> Res<DeleteNamespaceResponse> {
        self.recorded.note(&request)?;
        Ok(Response::new(DeleteNamespaceResponse { deleted: true }))
    }
    async fn list_namespaces(
        &self,
        request: tonic::Request<ListNamespacesRequest>,
    ) -> Res<ListNamespacesResponse> {
        // Reached only with a context the layer verified.
        let caller = require_caller(&request)?;
        Ok(Response::new(ListNamespacesResponse {
            namespaces: vec![Namespace {
                name: format!("seen-by-{}", caller.principal_id),
                description: String::new(),
                created_at_ms: 1,
            }],
        }))
    }
    async fn create_principal(&self, _: tonic::Request<CreatePrincipalRequest>) -> Res<Principal> {
        unimplemented()
    }
    async fn list_principals(
        &self,
        _: tonic::Request<ListPrincipalsRequest>,
    ) -> Res<ListPrincipalsResponse> {
        unimplemented()
    }
    async fn set_principal_disabled(
        &self,
        request: tonic::Request<SetPrincipalDisabledRequest>,
    ) -> Res<Principal> {
        self.recorded.note(&request)?;
        let r = request.into_inner();
        if r.id == "usr_nobody" {
            return Err(Status::not_found("principal `usr_nobody`"));
        }
        Ok(Response::new(Principal {
            id: r.id,
            name: "lea".into(),
            kind: PrincipalKind::User as i32,
            disabled_at_ms: if r.disabled { 42 } else { 0 },
            ..Default::default()
        }))
    }
    async fn put_grant(&self, request: tonic::Request<PutGrantRequest>) -> Res<Grant> {
        self.recorded.note(&request)?;
        let r = request.into_inner();
        Ok(Response::new(Grant {
            id: "grant_1".into(),
            principal_id: r.principal_id,
            namespace: r.namespace,
            permission: r.permission,
            path_prefix: r.path_prefix,
            created_at_ms: 7,
            group_id: r.group_id,
        }))
    }
    async fn delete_grant(
        &self,
        _: tonic::Request<DeleteGrantRequest>,
    ) -> Res<DeleteGrantResponse> {
        unimplemented()
    }
    async fn list_grants(
        &self,
        request: tonic::Request<ListGrantsRequest>,
    ) -> Res<ListGrantsResponse> {
        self.recorded.note(&request)?;
        let r = request.into_inner();
        Ok(Response::new(ListGrantsResponse {
            grants: vec![Grant {
                id: "grant_1".into(),
                principal_id: r.principal_id,
                group_id: r.group_id,
                namespace: "demo".into(),
                permission: Permission::Write as i32,
                ..Default::default()
            }],
        }))
    }
    async fn create_pat(&self, _: tonic::Request<CreatePatRequest>) -> Res<CreatePatResponse> {
        unimplemented()
    }
    async fn list_pats(&self, _: tonic::Request<ListPatsRequest>) -> Res<ListPatsResponse> {
        unimplemented()
    }
    async fn revoke_pat(&self, _: tonic::Request<RevokePatRequest>) -> Res<RevokePatResponse> {
        unimplemented()
    }
    async fn rotate_pat(
        &self,
        request: tonic::Request<RotatePatRequest>,
    ) -> Res<CreatePatResponse> {
        self.recorded.note(&request)?;
        let r = request.into_inner();
        if r.pat_id != "pat_1" {
            return Err(status_with_code(ErrorCode::NotFound, "PAT not found"));
        }
        Ok(Response::new(CreatePatResponse {
            pat: Some(Pat {
                id: r.pat_id,
                principal_id: "usr_test".into(),
                name: "laptop".into(),
                prefix: "kg_pat_rota".into(),
                created_at_ms: 9,
                ..Default::default()
            }),
            token: "kg_pat_rotated".into(),
        }))
    }
    async fn create_group(&self, request: tonic::Request<CreateGroupRequest>) -> Res<Group> {
        self.recorded.note(&request)?;
        Ok(Response::new(group("grp_1", Vec::new())))
    }
    async fn list_groups(
        &self,
        request: tonic::Request<ListGroupsRequest>,
    ) -> Res<ListGroupsResponse> {
        self.recorded.note(&request)?;
        Ok(Response::new(ListGroupsResponse {
            groups: vec![group("grp_1", vec!["usr_a".into()])],
        }))
    }
    async fn add_group_member(&self, request: tonic::Request<GroupMemberRequest>) -> Res<Group> {
        self.recorded.note(&request)?;
        let r = request.into_inner();
        Ok(Response::new(group(&r.group_id, vec![r.principal_id])))
    }
    async fn remove_group_member(&self, request: tonic::Request<GroupMemberRequest>) -> Res<Group> {
        self.recorded.note(&request)?;
        Ok(Response::new(group(
            &request.into_inner().group_id,
            Vec::new(),
        )))
    }
    async fn put_deny(&self, request: tonic::Request<PutDenyRequest>) -> Res<Deny> {
        self.recorded.note(&request)?;
        let r = request.into_inner();
        Ok(Response::new(Deny {
            id: "deny_1".into(),
            namespace: r.namespace,
            principal_id: r.principal_id,
            group_id: r.group_id,
            path_prefix: r.path_prefix,
            file_id: r.file_id,
            created_at_ms: 11,
        }))
    }
    async fn delete_deny(
        &self,
        request: tonic::Request<DeleteDenyRequest>,
    ) -> Res<DeleteDenyResponse> {
        self.recorded.note(&request)?;
        Ok(Response::new(DeleteDenyResponse {
            deleted: request.get_ref().deny_id == "deny_1",
        }))
    }
    async fn list_denies(
        &self,
        request: tonic::Request<ListDeniesRequest>,
    ) -> Res<ListDeniesResponse> {
        self.recorded.note(&request)?;
        Ok(Response::new(ListDeniesResponse {
            denies: vec![Deny {
                id: "deny_1".into(),
                namespace: request.into_inner().namespace,
                path_prefix: "hr/".into(),
                ..Default::default()
            }],
        }))
    }
    async fn record_audit(
        &self,
        request: tonic::Request<RecordAuditRequest>,
    ) -> Res<RecordAuditResponse> {
        let caller = require_caller(&request)?;
        tokio::time::sleep(self.audit_delay).await;
        let Some(mut event) = request.into_inner().event else {
            return Err(status_with_code(ErrorCode::InvalidArgument, "no event"));
        };
        // Who called comes from the verified context, never from the event.
        event.principal_id.clone_from(&caller.principal_id);
        event.on_behalf_of.clone_from(&caller.on_behalf_of);
        let mut audits = self.recorded.audits.lock().unwrap();
        event.id = format!("aud_{}", audits.len() + 1);
        audits.push(event);
        Ok(Response::new(RecordAuditResponse {}))
    }
    async fn list_audit(
        &self,
        request: tonic::Request<ListAuditRequest>,
    ) -> Res<ListAuditResponse> {
        self.recorded.note(&request)?;
        let r = request.into_inner();
        let start: usize = r.cursor.parse().unwrap_or(0);
        let limit = if r.limit == 0 { 100 } else { r.limit as usize };
        let matching: Vec<AuditEvent> = self
            .recorded
            .audits()
            .into_iter()
            .filter(|e| r.tool.is_empty() || e.tool == r.tool)
            .filter(|e| r.principal_id.is_empty() || e.principal_id == r.principal_id)
            .collect();
        let events: Vec<AuditEvent> = matching.iter().skip(start).take(limit).cloned().collect();
        let next = start + events.len();
        Ok(Response::new(ListAuditResponse {
            events,
            next_cursor: if next < matching.len() {
                next.to_string()
            } else {
                String::new()
            },
        }))
    }
}

struct TestFiles {
    recorded: Arc<Recorded>,
}

fn file(namespace: &str, path: &str) -> FileInfo {
    FileInfo {
        namespace: namespace.into(),
        file_id: format!("fid:{path}"),
        path: path.into(),
        status: FileStatus::Indexed as i32,
        enabled: true,
        ..Default::default()
    }
}

#[tonic::async_trait]
impl Files for TestFiles {
    async fn upload(&self, _: tonic::Request<UploadRequest>) -> Res<UploadResponse> {
        unimplemented()
    }
    async fn get_file(&self, request: tonic::Request<GetFileRequest>) -> Res<FileInfo> {
        self.recorded.note(&request)?;
        let r = request.into_inner();
        match r.selector {
            Some(get_file_request::Selector::Path(path)) if path != "missing.md" => {
                Ok(Response::new(file(&r.namespace, &path)))
            }
            // Ids starting with `f` exist (`f9`), as in the deny tests.
            Some(get_file_request::Selector::FileId(id)) if id.starts_with('f') => {
                Ok(Response::new(file(&r.namespace, &format!("{id}.md"))))
            }
            _ => Err(status_with_code(ErrorCode::NotFound, "file not found")),
        }
    }
    async fn list_files(&self, _: tonic::Request<ListFilesRequest>) -> Res<ListFilesResponse> {
        unimplemented()
    }
    async fn find_files(&self, _: tonic::Request<FindFilesRequest>) -> Res<FindFilesResponse> {
        unimplemented()
    }
    async fn query_file(
        &self,
        request: tonic::Request<QueryFileRequest>,
    ) -> Res<QueryFileResponse> {
        self.recorded.note(&request)?;
        self.recorded
            .query_file_calls
            .fetch_add(1, Ordering::SeqCst);
        let r = request.into_inner();
        let Some(query_file_request::Selector::Path(path)) = r.selector else {
            return Err(status_with_code(ErrorCode::NotFound, "file not found"));
        };
        Ok(Response::new(QueryFileResponse {
            file: Some(file(&r.namespace, &path)),
            ..Default::default()
        }))
    }
    async fn set_file_flags(&self, request: tonic::Request<SetFileFlagsRequest>) -> Res<FileInfo> {
        self.recorded.note(&request)?;
        let r = request.into_inner();
        let path = r.file_id.trim_start_matches("fid:");
        let mut info = file(&r.namespace, path);
        info.enabled = r.enabled.unwrap_or(info.enabled);
        info.hidden = r.hidden.unwrap_or(info.hidden);
        Ok(Response::new(info))
    }
    async fn delete_file(
        &self,
        request: tonic::Request<DeleteFileRequest>,
    ) -> Res<DeleteFileResponse> {
        self.recorded.note(&request)?;
        Ok(Response::new(DeleteFileResponse { deleted: true }))
    }
    async fn reindex(&self, _: tonic::Request<ReindexRequest>) -> Res<ReindexResponse> {
        unimplemented()
    }
    async fn sweep_blobs(&self, _: tonic::Request<SweepBlobsRequest>) -> Res<SweepBlobsResponse> {
        unimplemented()
    }
    async fn purge_namespace(
        &self,
        request: tonic::Request<PurgeNamespaceRequest>,
    ) -> Res<NamespacePurge> {
        self.recorded.note(&request)?;
        Ok(Response::new(NamespacePurge {
            namespace: request.into_inner().namespace,
            requested_at_ms: 7,
            files_removed: 4,
            ..Default::default()
        }))
    }
    /// `purging` waits for the indexer, `purged` was purged; no other was.
    async fn get_namespace_purge(
        &self,
        request: tonic::Request<GetNamespacePurgeRequest>,
    ) -> Res<NamespacePurge> {
        self.recorded.note(&request)?;
        let namespace = request.into_inner().namespace;
        let purged_at_ms = match namespace.as_str() {
            "purging" => 0,
            "purged" => 9,
            _ => {
                return Err(status_with_code(
                    ErrorCode::NotFound,
                    "a purge of the namespace not found",
                ));
            }
        };
        Ok(Response::new(NamespacePurge {
            namespace,
            requested_at_ms: 5,
            purged_at_ms,
            ..Default::default()
        }))
    }
    async fn create_branch(&self, _: tonic::Request<CreateBranchRequest>) -> Res<Branch> {
        unimplemented()
    }
    async fn list_branches(
        &self,
        _: tonic::Request<ListBranchesRequest>,
    ) -> Res<ListBranchesResponse> {
        unimplemented()
    }
    async fn upload_to_branch(&self, _: tonic::Request<UploadToBranchRequest>) -> Res<BranchFile> {
        unimplemented()
    }
    async fn create_release(&self, _: tonic::Request<CreateReleaseRequest>) -> Res<Release> {
        unimplemented()
    }
    async fn list_releases(
        &self,
        _: tonic::Request<ListReleasesRequest>,
    ) -> Res<ListReleasesResponse> {
        unimplemented()
    }
    async fn deploy_environment(
        &self,
        _: tonic::Request<DeployEnvironmentRequest>,
    ) -> Res<Environment> {
        unimplemented()
    }
    async fn list_environments(
        &self,
        _: tonic::Request<ListEnvironmentsRequest>,
    ) -> Res<ListEnvironmentsResponse> {
        unimplemented()
    }
    async fn resolve_target(
        &self,
        _: tonic::Request<ResolveTargetRequest>,
    ) -> Res<ResolveTargetResponse> {
        unimplemented()
    }
    async fn get_knowledge_graph(
        &self,
        _: tonic::Request<GetKnowledgeGraphRequest>,
    ) -> Res<GetKnowledgeGraphResponse> {
        unimplemented()
    }
}

/// The running doubles (auth and files share one address); stops when dropped.
pub(crate) struct AuthFixture {
    pub(crate) addr: String,
    pub(crate) authorize_calls: Arc<AtomicUsize>,
    pub(crate) recorded: Arc<Recorded>,
    stop: CancellationToken,
}

impl Drop for AuthFixture {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub(crate) async fn start_auth() -> AuthFixture {
    start_auth_with(Duration::ZERO).await
}

/// Doubles whose RecordAudit takes `audit_delay` to answer.
pub(crate) async fn start_auth_with(audit_delay: Duration) -> AuthFixture {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    serve_auth(listener, ContextSigner::generate(), audit_delay)
}

/// The doubles on `listener`, signing with `signer` (contexts signed before they start verify).
pub(crate) fn serve_auth(
    listener: tokio::net::TcpListener,
    signer: ContextSigner,
    audit_delay: Duration,
) -> AuthFixture {
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let verifier = ContextVerifier::new(vec![signer.public_key()]);
    let recorded = Arc::new(Recorded::default());
    let auth = AuthServer::new(TestAuth {
        signer,
        recorded: recorded.clone(),
        audit_delay,
    });
    let files = FilesServer::new(TestFiles {
        recorded: recorded.clone(),
    });
    let stop = CancellationToken::new();
    let shutdown = stop.clone();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .layer(CallerContextLayer::new(
                verifier,
                &["/kg.v1.Auth/Authorize"],
            ))
            .add_service(auth)
            .add_service(files)
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener),
                shutdown.cancelled_owned(),
            )
            .await
            .unwrap();
    });
    AuthFixture {
        addr,
        authorize_calls: recorded.authorize_calls.clone(),
        recorded,
        stop,
    }
}

//! Every service refuses a request without a valid caller context before it
//! reads anything: missing, forged (signed by another key), tampered and
//! expired contexts all get UNAUTHENTICATED.
use kg_common::caller::{CONTEXT_TTL_MS, ContextSigner, attach_caller, now_ms};
use kg_proto::v1::auth_client::AuthClient;
use kg_proto::v1::files_client::FilesClient;
use kg_proto::v1::graph_client::GraphClient;
use kg_proto::v1::retrieval_client::RetrievalClient;
use kg_proto::v1::*;
use prost::Message as _;

fn forged_contexts() -> Vec<(&'static str, Option<SignedCallerContext>)> {
    let now = now_ms();
    let everything = CallerContext {
        principal_id: "intruder".into(),
        is_admin: true,
        access: vec![AccessFilter {
            namespace: "demo".into(),
            allow_prefixes: vec![String::new()],
            permission: Permission::Admin as i32,
            write_prefixes: vec![String::new()],
            ..Default::default()
        }],
        issued_at_ms: now,
        expires_at_ms: now + CONTEXT_TTL_MS,
        ..Default::default()
    };
    let other_key = ContextSigner::generate();
    let forged = other_key.sign(&everything);
    let mut garbage = forged.clone();
    garbage.signature = vec![0; 64];
    let mut tampered = forged.clone();
    tampered.context = CallerContext {
        principal_id: "someone-else".into(),
        ..CallerContext::decode(forged.context.as_slice()).unwrap()
    }
    .encode_to_vec();
    vec![
        ("missing", None),
        ("forged", Some(forged)),
        ("zero signature", Some(garbage)),
        ("tampered", Some(tampered)),
    ]
}

fn request<T>(message: T, context: &Option<SignedCallerContext>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(signed) = context {
        attach_caller(&mut request, signed);
    }
    request
}

fn assert_unauthenticated<T: std::fmt::Debug>(
    what: &str,
    case: &str,
    result: Result<T, tonic::Status>,
) {
    match result {
        Err(status) => assert_eq!(
            status.code(),
            tonic::Code::Unauthenticated,
            "{what} with {case} context: {status:?}"
        ),
        Ok(v) => panic!("{what} with {case} context answered: {v:?}"),
    }
}

#[tokio::test]
async fn services_refuse_calls_without_a_valid_caller_context() {
    let (mesh, dir) = kg_e2e::start_mesh().await.unwrap();
    let grpc = mesh.info.grpc.clone();
    // Kubernetes' gRPC probes ask for the whole server (service ""), with no caller context.
    let mut probed = vec![&grpc.auth, &grpc.files, &grpc.retrieval, &grpc.graph];
    probed.extend(mesh.info.ontology.as_ref());
    probed.extend(mesh.info.approval.as_ref());
    for addr in probed {
        kgmesh::mesh::wait_serving(addr, "", std::time::Duration::from_secs(5))
            .await
            .unwrap_or_else(|err| panic!("probe of {addr}: {err:#}"));
    }
    let channel = |addr: &str| kg_common::grpc::channel(addr).unwrap();
    let mut auth = AuthClient::new(channel(&grpc.auth));
    let mut files = FilesClient::new(channel(&grpc.files));
    let mut retrieval = RetrievalClient::new(channel(&grpc.retrieval));
    let mut graph = GraphClient::new(channel(&grpc.graph));

    for (case, context) in forged_contexts() {
        assert_unauthenticated(
            "auth.CreatePat",
            case,
            auth.create_pat(request(CreatePatRequest::default(), &context))
                .await,
        );
        assert_unauthenticated(
            "auth.ListPrincipals",
            case,
            auth.list_principals(request(ListPrincipalsRequest::default(), &context))
                .await,
        );
        assert_unauthenticated(
            "files.ListFiles",
            case,
            files
                .list_files(request(
                    ListFilesRequest {
                        namespace: "demo".into(),
                        ..Default::default()
                    },
                    &context,
                ))
                .await,
        );
        assert_unauthenticated(
            "files.Upload",
            case,
            files
                .upload(request(
                    UploadRequest {
                        namespace: "demo".into(),
                        path: "x.md".into(),
                        content: b"# x".to_vec(),
                        mime: String::new(),
                    },
                    &context,
                ))
                .await,
        );
        assert_unauthenticated(
            "files.Reindex",
            case,
            files
                .reindex(request(
                    ReindexRequest {
                        namespace: "demo".into(),
                        ..Default::default()
                    },
                    &context,
                ))
                .await,
        );
        assert_unauthenticated(
            "retrieval.Search",
            case,
            retrieval
                .search(request(
                    SearchRequest {
                        namespace: "demo".into(),
                        query: "anything".into(),
                        ..Default::default()
                    },
                    &context,
                ))
                .await,
        );
        assert_unauthenticated(
            "graph.Open",
            case,
            graph
                .open(request(
                    OpenRequest {
                        namespace: "demo".into(),
                        key: Some(open_request::Key::FileId("f".into())),
                        ..Default::default()
                    },
                    &context,
                ))
                .await,
        );
        assert_unauthenticated(
            "graph.Outline",
            case,
            graph
                .outline(request(
                    OutlineRequest {
                        namespace: "demo".into(),
                        file_id: "f".into(),
                        ..Default::default()
                    },
                    &context,
                ))
                .await,
        );
    }

    // Nothing was written by any of those calls.
    let admin_token = mesh.admin_token.clone().unwrap();
    let admin = auth
        .authorize(AuthorizeRequest {
            token: admin_token,
            tool: "test".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let listed = files
        .list_files(request(
            ListFilesRequest {
                namespace: "demo".into(),
                ..Default::default()
            },
            &admin.context,
        ))
        .await;
    // `demo` does not exist, so even the admin has no access entry for it.
    assert_eq!(listed.unwrap_err().code(), tonic::Code::PermissionDenied);

    // A context signed with the mesh's real key but expired is refused too.
    let secret = std::fs::read(dir.path().join("data/secrets/caller-signing.key")).unwrap();
    let real = ContextSigner::from_secret_bytes(&secret.try_into().unwrap());
    let now = now_ms();
    let expired = Some(real.sign(&CallerContext {
        principal_id: "stale".into(),
        is_admin: true,
        issued_at_ms: now - 10 * CONTEXT_TTL_MS,
        expires_at_ms: now - 5 * CONTEXT_TTL_MS,
        ..Default::default()
    }));
    assert_unauthenticated(
        "auth.ListPrincipals",
        "expired",
        auth.list_principals(request(ListPrincipalsRequest::default(), &expired))
            .await,
    );
    assert_unauthenticated(
        "graph.Outline",
        "expired",
        graph
            .outline(request(
                OutlineRequest {
                    namespace: "demo".into(),
                    file_id: "f".into(),
                    ..Default::default()
                },
                &expired,
            ))
            .await,
    );
    // The same key with a live context is accepted: the refusals above are
    // about the context, not a broken service.
    let live = Some(real.sign(&CallerContext {
        principal_id: "live".into(),
        is_admin: true,
        tool: kg_common::caller::ADMIN_API_TOOL.into(),
        issued_at_ms: now,
        expires_at_ms: now + CONTEXT_TTL_MS,
        ..Default::default()
    }));
    auth.list_principals(request(ListPrincipalsRequest::default(), &live))
        .await
        .unwrap();
    mesh.shutdown().await;
}

/// A context is bound to what it was minted for. Every service an MCP call reaches sees the
/// caller's context, so one that replayed it elsewhere could act as the caller: as an admin's,
/// it could write files, mint tokens and grant access. Each operation of the admin API takes
/// only a context minted for the admin API; the MCP context still reads.
#[tokio::test]
async fn an_mcp_context_replayed_to_an_admin_operation_is_refused() {
    let (mesh, _dir) = kg_e2e::start_mesh().await.unwrap();
    let grpc = mesh.info.grpc.clone();
    let channel = |addr: &str| kg_common::grpc::channel(addr).unwrap();
    let mut auth = AuthClient::new(channel(&grpc.auth));
    let mut files = FilesClient::new(channel(&grpc.files));
    let mut approval = kg_proto::v1::approval_client::ApprovalClient::new(channel(
        mesh.info.approval.as_ref().unwrap(),
    ));
    let mut ontology = kg_proto::v1::ontology_client::OntologyClient::new(channel(
        mesh.info.ontology.as_ref().unwrap(),
    ));
    let mut graph = GraphClient::new(channel(&grpc.graph));
    let admin_token = mesh.admin_token.clone().unwrap();
    let minting = auth.clone();
    let mint = move |tool: &'static str| {
        let mut auth = minting.clone();
        let token = admin_token.clone();
        async move {
            let authorized = auth
                .authorize(AuthorizeRequest {
                    token,
                    tool: tool.into(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            let decoded = authorized.decoded.unwrap();
            assert!(decoded.is_admin);
            (authorized.context, decoded.principal_id)
        }
    };
    let (admin_api, admin_id) = mint(kg_common::caller::ADMIN_API_TOOL).await;
    auth.create_namespace(request(
        CreateNamespaceRequest {
            name: "replay".into(),
            description: String::new(),
        },
        &admin_api,
    ))
    .await
    .unwrap();
    auth.put_grant(request(
        PutGrantRequest {
            principal_id: admin_id,
            namespace: "replay".into(),
            permission: Permission::Write as i32,
            ..Default::default()
        },
        &admin_api,
    ))
    .await
    .unwrap();
    // Minted again, with the grant: both may now write, as far as access goes.
    let (admin_api, _) = mint(kg_common::caller::ADMIN_API_TOOL).await;
    let (mcp, _) = mint(kg_common::caller::MCP_TOOL).await;
    let upload = |path: &str| UploadRequest {
        namespace: "replay".into(),
        path: path.into(),
        content: b"# notes".to_vec(),
        mime: String::new(),
    };

    let refusals = [
        (
            "files.Upload",
            files.upload(request(upload("a.md"), &mcp)).await.map(drop),
        ),
        (
            "files.DeleteFile",
            files
                .delete_file(request(
                    DeleteFileRequest {
                        namespace: "replay".into(),
                        file_id: "any".into(),
                    },
                    &mcp,
                ))
                .await
                .map(drop),
        ),
        (
            "files.Reindex",
            files
                .reindex(request(
                    ReindexRequest {
                        namespace: "replay".into(),
                        ..Default::default()
                    },
                    &mcp,
                ))
                .await
                .map(drop),
        ),
        (
            "auth.CreatePat",
            auth.create_pat(request(
                CreatePatRequest {
                    principal_id: "anyone".into(),
                    name: "stolen".into(),
                    expires_at_ms: None,
                },
                &mcp,
            ))
            .await
            .map(drop),
        ),
        (
            "auth.ListPats",
            auth.list_pats(request(ListPatsRequest::default(), &mcp))
                .await
                .map(drop),
        ),
        (
            "auth.RevokePat",
            auth.revoke_pat(request(
                RevokePatRequest {
                    pat_id: "any".into(),
                },
                &mcp,
            ))
            .await
            .map(drop),
        ),
        (
            "auth.ListPrincipals",
            auth.list_principals(request(ListPrincipalsRequest::default(), &mcp))
                .await
                .map(drop),
        ),
        (
            "ontology.ReloadProject",
            ontology
                .reload_project(request(ReloadProjectRequest::default(), &mcp))
                .await
                .map(drop),
        ),
        (
            "approval.ListProposals",
            approval
                .list_proposals(request(ListProposalsRequest::default(), &mcp))
                .await
                .map(drop),
        ),
        (
            "graph.Candidates",
            graph
                .candidates(request(
                    CandidatesRequest {
                        namespace: "replay".into(),
                        ..Default::default()
                    },
                    &mcp,
                ))
                .await
                .map(drop),
        ),
    ];
    for (what, refused) in refusals {
        let status = refused.expect_err(what);
        assert_eq!(
            status.code(),
            tonic::Code::PermissionDenied,
            "{what}: {status:?}"
        );
        assert!(
            status.message().contains("minted for `mcp`"),
            "{what}: {}",
            status.message()
        );
    }

    // Nothing was written; the MCP context still reads, and the admin API still writes.
    let listing = files.clone();
    let list = move |context: Option<SignedCallerContext>| {
        let mut files = listing.clone();
        async move {
            files
                .list_files(request(
                    ListFilesRequest {
                        namespace: "replay".into(),
                        ..Default::default()
                    },
                    &context,
                ))
                .await
                .unwrap()
                .into_inner()
                .files
                .len()
        }
    };
    assert_eq!(list(mcp.clone()).await, 0);
    files
        .upload(request(upload("b.md"), &admin_api))
        .await
        .unwrap();
    assert_eq!(list(mcp).await, 1);
    mesh.shutdown().await;
}

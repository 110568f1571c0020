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
        issued_at_ms: now,
        expires_at_ms: now + CONTEXT_TTL_MS,
        ..Default::default()
    }));
    auth.list_principals(request(ListPrincipalsRequest::default(), &live))
        .await
        .unwrap();
    mesh.shutdown().await;
}

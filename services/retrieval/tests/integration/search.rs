//! Search against a real FalkorDB, with files written by the indexer's graph writer.
//!
//! One FalkorDB per test binary: the scenarios run in sequence inside one test, each in its
//! own namespace, so a failure names the scenario in its panic message.

use kg_common::ErrorExt;
use kg_common::caller::{CONTEXT_TTL_MS, ContextSigner, ContextVerifier, attach_caller, now_ms};
use kg_common::error::ErrorCode;
use kg_indexer::graph_writer::{ChunkRecord, FileRecord, set_flags, write_file};
use kg_proto::v1::retrieval_client::RetrievalClient;
use kg_proto::v1::{
    AccessFilter, CallerContext, EntitySearchRequest, Permission, Ranking, SearchFilters,
    SearchRequest, SearchResponse,
};
use kg_retrieval::RetrievalService;
use kg_stores::embedded::{EmbeddedFalkor, find_venv};
use kg_stores::graph::{GraphStore, Params};
use tokio_util::sync::CancellationToken;

struct Env {
    store: GraphStore,
    service: RetrievalService,
    _falkor: EmbeddedFalkor,
    _dir: tempfile::TempDir,
}

async fn start() -> Env {
    let venv = find_venv().expect("the dev-deps virtualenv (run deploy/scripts/dev-deps.sh)");
    let dir = tempfile::tempdir().unwrap();
    let falkor = EmbeddedFalkor::start(&venv, dir.path()).await.unwrap();
    let store = GraphStore::connect(&falkor.url).await.unwrap();
    Env {
        service: RetrievalService::new(store.clone()),
        store,
        _falkor: falkor,
        _dir: dir,
    }
}

fn caller(ns: &str, edit: impl FnOnce(&mut AccessFilter)) -> CallerContext {
    let mut access = AccessFilter {
        namespace: ns.into(),
        allow_prefixes: vec![String::new()],
        enabled_only: true,
        permission: Permission::Read as i32,
        ..Default::default()
    };
    edit(&mut access);
    let now = now_ms();
    CallerContext {
        principal_id: "tester".into(),
        access: vec![access],
        issued_at_ms: now,
        expires_at_ms: now + CONTEXT_TTL_MS,
        ..Default::default()
    }
}

/// Writes a file whose chunks have `texts`; chunk keys are `<file_id>#<i>`.
async fn write(store: &GraphStore, ns: &str, file_id: &str, path: &str, texts: &[&str]) {
    let folder = kg_common::access::folder_of(path).to_owned();
    let file = FileRecord {
        namespace: ns.into(),
        file_id: file_id.into(),
        version_id: "v1".into(),
        path: path.into(),
        name: path.rsplit('/').next().unwrap().into(),
        folder_path: folder,
        enabled: true,
        hidden: false,
        title: None,
        document_date: None,
        mime: "text/markdown".into(),
    };
    let chunks: Vec<ChunkRecord> = texts
        .iter()
        .enumerate()
        .map(|(i, text)| ChunkRecord {
            chunk_key: format!("{file_id}#{i}"),
            index: i as u32,
            text: (*text).to_owned(),
            context_header: path.into(),
            char_start: 0,
            char_end: text.chars().count() as u64,
            line_start: 1,
            line_end: 1,
            page_start: None,
            page_end: None,
            token_count: 10,
            section_key: None,
        })
        .collect();
    write_file(store, &file, &chunks, &[]).await.unwrap();
}

async fn corpus(store: &GraphStore, ns: &str) {
    write(
        store,
        ns,
        "auth",
        "guides/auth.md",
        &[
            "Personal access tokens start with kg_pat_ and are shown once.",
            "To rotate the signing keys, generate a fresh ed25519 key pair and restart the auth service.",
            "Revoked tokens fail with HTTP 401 on the next call.",
        ],
    )
    .await;
    write(
        store,
        ns,
        "ops",
        "ops/runbook.md",
        &[
            "Rotate the database password every quarter.",
            "Keys for the backup bucket live in the vault.",
        ],
    )
    .await;
    write(
        store,
        ns,
        "secret",
        "private/keys.md",
        &["Production signing material is kept offline."],
    )
    .await;
}

fn search(ns: &str, query: &str) -> SearchRequest {
    SearchRequest {
        namespace: ns.into(),
        query: query.into(),
        ..Default::default()
    }
}

fn hit_keys(response: &SearchResponse) -> Vec<&str> {
    response.hits.iter().map(|h| h.chunk_key.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_against_real_falkordb() {
    let env = start().await;
    fulltext_finds_and_ranks_the_phrase(&env).await;
    access_and_filters_apply_inside_the_query(&env).await;
    hostile_and_invalid_requests(&env).await;
    grpc_search_with_a_signed_context(&env).await;
}

async fn fulltext_finds_and_ranks_the_phrase(env: &Env) {
    let ns = "rank";
    corpus(&env.store, ns).await;
    let who = caller(ns, |_| {});
    let response = env
        .service
        .search_for(&who, search(ns, "how do I rotate the signing keys?"))
        .await
        .unwrap();
    assert_eq!(response.namespace, ns);
    assert_eq!(
        response.hits[0].chunk_key,
        "auth#1",
        "{:?}",
        hit_keys(&response)
    );
    let top = &response.hits[0];
    assert_eq!(top.file_id, "auth");
    assert!(
        (top.display_score - 1.0).abs() < 1e-9,
        "one lane: rank 1 displays 1"
    );
    assert!((top.fused_score - 1.0 / 61.0).abs() < 1e-12);
    assert_eq!(top.lanes.len(), 1);
    assert_eq!(
        (top.lanes[0].lane.as_str(), top.lanes[0].rank),
        ("fulltext", 1)
    );
    assert!(top.lanes[0].raw_score > 0.0);
    let scores: Vec<f64> = response.hits.iter().map(|h| h.display_score).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    assert!(
        response
            .hits
            .iter()
            .all(|h| (0.0..=1.0).contains(&h.display_score))
    );
    // Default lanes: full-text and graph_expand ran (no entities here: nothing to expand),
    // vector soft-failed without aborting the search.
    let lanes: Vec<(&str, bool, &str)> = response
        .lanes
        .iter()
        .map(|l| (l.lane.as_str(), l.ok, l.error_code.as_str()))
        .collect();
    assert_eq!(
        lanes,
        [
            ("fulltext", true, ""),
            ("vector", false, "lane_unavailable"),
            ("graph_expand", true, "")
        ]
    );
    assert_eq!(
        response.lanes[0].hits as usize,
        response.total_candidates as usize
    );
    assert!(
        response.total_candidates >= 4,
        "{}",
        response.total_candidates
    );

    // top_k cuts; total_candidates still counts every candidate.
    let one = env
        .service
        .search_for(
            &who,
            SearchRequest {
                top_k: 1,
                ..search(ns, "rotate signing keys")
            },
        )
        .await
        .unwrap();
    assert_eq!(one.hits.len(), 1);
    assert!(one.total_candidates > 1);
    // min_score drops hits below the display score and out of the total.
    let strict = env
        .service
        .search_for(
            &who,
            SearchRequest {
                ranking: Some(Ranking {
                    min_score: Some(0.99),
                    ..Default::default()
                }),
                ..search(ns, "rotate signing keys")
            },
        )
        .await
        .unwrap();
    assert_eq!(strict.hits.len(), 1);
    assert_eq!(strict.total_candidates, 1);
    // Only unbuilt lanes: an empty, honest answer.
    let vector_only = env
        .service
        .search_for(
            &who,
            SearchRequest {
                lanes: vec!["vector".into()],
                ..search(ns, "rotate")
            },
        )
        .await
        .unwrap();
    assert!(vector_only.hits.is_empty());
    assert_eq!(vector_only.total_candidates, 0);
    assert_eq!(vector_only.lanes.len(), 1);
    assert_eq!(vector_only.lanes[0].error_code, "lane_unavailable");
    // Stop words only, and a namespace without a graph: no hits, no error.
    let nothing = env
        .service
        .search_for(&who, search(ns, "the of and"))
        .await
        .unwrap();
    assert!(nothing.hits.is_empty() && nothing.lanes[0].ok);
    let empty_ns = caller("never_written", |_| {});
    let none = env
        .service
        .search_for(&empty_ns, search("never_written", "rotate"))
        .await
        .unwrap();
    assert!(none.hits.is_empty() && none.lanes[0].ok);
}

async fn access_and_filters_apply_inside_the_query(env: &Env) {
    let ns = "acl";
    corpus(&env.store, ns).await;
    let svc = &env.service;
    let query = "rotate signing keys";

    let everyone = svc
        .search_for(&caller(ns, |_| {}), search(ns, query))
        .await
        .unwrap();
    assert!(hit_keys(&everyone).contains(&"secret#0"));

    // Every list predicate active, yet everything allowed: exactly the unrestricted answer.
    let narrowed = caller(ns, |a| {
        a.allow_prefixes = vec!["guides/".into(), "ops/".into(), "private/".into()];
        a.deny_prefixes = vec!["archive/".into()];
        a.deny_file_ids = vec!["file-other".into()];
    });
    let response = svc.search_for(&narrowed, search(ns, query)).await.unwrap();
    assert_eq!(response.hits, everyone.hits);
    assert_eq!(response.total_candidates, everyone.total_candidates);

    let no_private = caller(ns, |a| a.deny_prefixes = vec!["private/".into()]);
    let response = svc
        .search_for(&no_private, search(ns, query))
        .await
        .unwrap();
    assert!(
        !hit_keys(&response).contains(&"secret#0"),
        "{:?}",
        hit_keys(&response)
    );
    assert_eq!(
        response.total_candidates,
        everyone.total_candidates - 1,
        "totals count readable chunks only"
    );

    let no_auth_file = caller(ns, |a| a.deny_file_ids = vec!["auth".into()]);
    let response = svc
        .search_for(&no_auth_file, search(ns, query))
        .await
        .unwrap();
    assert!(response.hits.iter().all(|h| h.file_id != "auth"));

    let only_ops = caller(ns, |a| a.allow_prefixes = vec!["ops/".into()]);
    let response = svc.search_for(&only_ops, search(ns, query)).await.unwrap();
    assert!(!response.hits.is_empty());
    assert!(response.hits.iter().all(|h| h.file_id == "ops"));

    let nothing = caller(ns, |a| a.allow_prefixes.clear());
    let response = svc.search_for(&nothing, search(ns, query)).await.unwrap();
    assert!(response.hits.is_empty());
    assert_eq!(response.total_candidates, 0);

    // The folder filter narrows inside the query as well.
    let response = svc
        .search_for(
            &caller(ns, |_| {}),
            SearchRequest {
                filters: Some(SearchFilters {
                    folder_prefix: "/guides".into(),
                    ..Default::default()
                }),
                ..search(ns, query)
            },
        )
        .await
        .unwrap();
    assert!(!response.hits.is_empty());
    assert!(
        response.hits.iter().all(|h| h.file_id == "auth"),
        "{:?}",
        hit_keys(&response)
    );

    // A disabled file drops out for enabled-only callers at once.
    assert!(
        set_flags(&env.store, ns, "secret", false, false)
            .await
            .unwrap()
    );
    let response = svc
        .search_for(&caller(ns, |_| {}), search(ns, query))
        .await
        .unwrap();
    assert!(!hit_keys(&response).contains(&"secret#0"));
    let preview = caller(ns, |a| a.enabled_only = false);
    let response = svc.search_for(&preview, search(ns, query)).await.unwrap();
    assert!(hit_keys(&response).contains(&"secret#0"));

    // A namespace outside the caller's list is refused by name.
    let err = svc
        .search_for(&caller(ns, |_| {}), search("other", query))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied);
    assert!(err.to_string().contains("other"));
}

async fn hostile_and_invalid_requests(env: &Env) {
    let ns = "hostile";
    corpus(&env.store, ns).await;
    let who = caller(ns, |_| {});
    for query in [
        "') MATCH (n) DETACH DELETE n //",
        "@text:{rotate} | -keys* ((signing",
        "\"unterminated 'quote \\",
        "rotate\0keys",
        "%%fuzzy%% ~near [1 TO 2] $param {x}",
        "ключи ротация 鍵 🔑",
    ] {
        let response = env.service.search_for(&who, search(ns, query)).await;
        let response = response.unwrap_or_else(|e| panic!("{query:?}: {e}"));
        assert!(response.lanes[0].ok, "{query:?}");
    }
    let rows = env
        .store
        .ro_query(ns, "MATCH (c:Chunk) RETURN count(c)", &Params::new(), 2_000)
        .await
        .unwrap();
    assert_eq!(rows.rows[0][0].as_i64(), Some(6), "the graph is intact");
    let found = env
        .service
        .search_for(&who, search(ns, "@text:{rotate} | -keys*"))
        .await
        .unwrap();
    assert!(
        !found.hits.is_empty(),
        "operators are stripped, the words still search"
    );

    let code = |request: SearchRequest| {
        let service = env.service.clone();
        let who = who.clone();
        async move { service.search_for(&who, request).await.unwrap_err().code() }
    };
    assert_eq!(
        code(SearchRequest {
            top_k: 33,
            ..search(ns, "x")
        })
        .await,
        ErrorCode::InvalidArgument
    );
    assert_eq!(
        code(SearchRequest {
            lanes: vec!["bm25".into()],
            ..search(ns, "x")
        })
        .await,
        ErrorCode::InvalidArgument
    );
    assert_eq!(code(search(ns, "   ")).await, ErrorCode::InvalidArgument);
    assert_eq!(
        code(search("Not A Namespace", "x")).await,
        ErrorCode::InvalidArgument
    );
    let err = env
        .service
        .search_for(
            &who,
            SearchRequest {
                lanes: vec!["bm25".into()],
                ..search(ns, "x")
            },
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("fulltext, vector, graph_expand, co_annotation"),
        "{err}"
    );
}

async fn grpc_search_with_a_signed_context(env: &Env) {
    let ns = "grpc";
    corpus(&env.store, ns).await;
    let signer = ContextSigner::generate();
    let verifier = ContextVerifier::new(vec![signer.public_key()]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(kg_retrieval::serve_with(
        env.service.clone(),
        verifier,
        listener,
        shutdown.clone(),
    ));
    let mut client =
        RetrievalClient::new(kg_common::grpc::channel(&format!("http://{addr}")).unwrap());

    let signed = signer.sign(&caller(ns, |_| {}));
    let mut request = tonic::Request::new(search(ns, "revoked tokens 401"));
    attach_caller(&mut request, &signed);
    let response = client.search(request).await.unwrap().into_inner();
    assert_eq!(response.hits[0].chunk_key, "auth#2");

    let status = client.search(search(ns, "revoked")).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);

    let mut request = tonic::Request::new(EntitySearchRequest {
        namespace: ns.into(),
        text: "auth".into(),
        limit: 5,
        evidence_limit: 0,
        ..Default::default()
    });
    attach_caller(&mut request, &signed);
    // Served now; this corpus holds no entities.
    let found = client.entity_search(request).await.unwrap().into_inner();
    assert!(found.hits.is_empty());

    shutdown.cancel();
    server.await.unwrap().unwrap();
}

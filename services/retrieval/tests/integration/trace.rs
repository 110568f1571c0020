//! The search trace against a real FalkorDB: chunks written without character offsets (as an
//! older indexer did) still found under the access filter, a namespace whose graph breaks mid-test
//! failing alone with a stable code and no store text, the vector lane soft-failing on an
//! unreachable index while the other lanes still answer, and trace.vectorWidening reporting
//! that the pool hit its cap when a filter rejects every candidate.
//!
//! One FalkorDB per test binary; the scenarios run in sequence, each in its own namespace.

use crate::common;

use common::{caller, entity, entity_index, keys, lane, mention, run, search, write};
use std::sync::Arc;
use std::time::Duration;

use kg_common::ErrorExt;
use kg_common::caller::{ContextSigner, ContextVerifier, attach_caller};
use kg_common::error::ErrorCode;
use kg_embed::{HashingEmbedder, SharedEmbedder};
use kg_indexer::document::DocumentMeta;
use kg_proto::v1::retrieval_client::RetrievalClient;
use kg_proto::v1::{SearchFilters, SearchRequest};
use kg_retrieval::RetrievalService;
use kg_stores::embedded::{EmbeddedFalkor, find_venv};
use kg_stores::graph::{GraphStore, Params, graph_name};
use kg_stores::vector::{EdgeIndex, PointKind, ServerIndex, VectorIndex, VectorPoint};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

struct Env {
    store: GraphStore,
    service: RetrievalService,
    falkor: EmbeddedFalkor,
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
        falkor,
        _dir: dir,
    }
}

/// One raw Redis command on its own connection (RESP), returning the first reply line: the
/// graph client cannot write a plain string key over a graph's name, which is the point.
async fn redis(port: u16, args: &[&str]) -> String {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut command = format!("*{}\r\n", args.len());
    for arg in args {
        command.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(command.as_bytes()).await.unwrap();
    let mut reply = Vec::new();
    let mut buf = [0u8; 512];
    while !reply.ends_with(b"\r\n") {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "redis closed the connection after {args:?}");
        reply.extend_from_slice(&buf[..n]);
    }
    String::from_utf8(reply).unwrap().trim_end().to_owned()
}

/// A file as an indexer from before character offsets wrote it: FileRef and chunks with no
/// charStart/charEnd. Chunk keys are `<file_id>#<i>`.
async fn write_without_offsets(
    store: &GraphStore,
    ns: &str,
    file_id: &str,
    path: &str,
    texts: &[&str],
) {
    let chunks: Vec<serde_json::Value> = texts
        .iter()
        .enumerate()
        .map(|(i, text)| json!({"key": format!("{file_id}#{i}"), "index": i, "text": text}))
        .collect();
    let mut params = Params::new();
    params.insert("fileId".into(), json!(file_id));
    params.insert("path".into(), json!(path));
    params.insert("name".into(), json!(path.rsplit('/').next().unwrap()));
    params.insert("folder".into(), json!(kg_common::access::folder_of(path)));
    params.insert("count".into(), json!(texts.len()));
    params.insert("chunks".into(), json!(chunks));
    run(
        store,
        ns,
        "CREATE (f:FileRef {fileId: $fileId, versionId: 'v0', vfsPath: $path, name: $name, \
             folderPath: $folder, enabled: true, hidden: false, mime: 'text/markdown', \
             chunkCount: $count}) \
         WITH f UNWIND $chunks AS ch \
         CREATE (c:Chunk {chunkKey: ch.key, fileId: $fileId, path: $path, enabled: true, \
             hidden: false, chunkIndex: ch.index, text: ch.text, contextHeader: $name, \
             lineStart: 1, lineEnd: 1, tokenCount: 10})-[:PART_OF]->(f)",
        params,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_trace_against_real_falkordb() {
    let env = start().await;
    chunks_without_offsets_are_found_under_the_access_filter(&env).await;
    a_broken_namespace_fails_alone_with_a_stable_code(&env).await;
    a_failing_lane_soft_fails_while_another_answers(&env).await;
    a_lane_out_of_time_soft_fails_within_the_callers_deadline(&env).await;
    vector_widening_reports_the_cap(&env).await;
}

/// Chunks an indexer from before offsets wrote (no charStart/charEnd) stay searchable and
/// under the access filter; the gateway reports them as trace.missingOffsets from their
/// packages (tests/python/test_search_params.py).
async fn chunks_without_offsets_are_found_under_the_access_filter(env: &Env) {
    let ns = "legacy";
    let query = "rotate the signing keys";
    write(
        &env.store,
        ns,
        "fresh",
        "guides/keys.md",
        &["Rotate the signing keys every quarter."],
        DocumentMeta::default(),
    )
    .await;
    write_without_offsets(
        &env.store,
        ns,
        "old",
        "archive/keys.md",
        &[
            "Rotate the signing keys by hand.",
            "Signing keys live in the vault.",
        ],
    )
    .await;
    write_without_offsets(
        &env.store,
        ns,
        "secret",
        "secret/keys.md",
        &["Rotate the signing keys of production offline."],
    )
    .await;
    let lanes = &["fulltext"];

    let everyone = env
        .service
        .search_for(&caller(ns, |_| {}), search(ns, query, lanes))
        .await
        .unwrap();
    let found = keys(&everyone);
    for key in ["fresh#0", "old#0", "old#1", "secret#0"] {
        assert!(found.contains(&key), "{key} not found: {found:?}");
    }
    // A reader denied secret/ does not get its legacy chunk.
    let restricted = env
        .service
        .search_for(
            &caller(ns, |a| a.deny_prefixes = vec!["secret/".into()]),
            search(ns, query, lanes),
        )
        .await
        .unwrap();
    let found = keys(&restricted);
    assert!(!found.contains(&"secret#0"), "{found:?}");
    assert!(
        found.contains(&"old#0") && found.contains(&"fresh#0"),
        "{found:?}"
    );
}

async fn a_broken_namespace_fails_alone_with_a_stable_code(env: &Env) {
    let corpus = &[
        "Rotate the signing keys every quarter.",
        "Revoked tokens fail with 401.",
    ];
    for ns in ["alpha", "beta"] {
        write(
            &env.store,
            ns,
            "auth",
            "guides/auth.md",
            corpus,
            DocumentMeta::default(),
        )
        .await;
    }
    let query = "rotate signing keys";
    let svc = &env.service;
    for ns in ["alpha", "beta"] {
        let ok = svc
            .search_for(&caller(ns, |_| {}), search(ns, query, &[]))
            .await
            .unwrap();
        assert_eq!(
            ok.hits[0].chunk_key, "auth#0",
            "{ns} answers before the break"
        );
    }

    // Mid-test, beta's graph goes away and a plain string takes its key: every query on
    // beta now fails inside FalkorDB (WRONGTYPE), while alpha is untouched.
    let beta = graph_name("beta");
    assert_eq!(
        redis(env.falkor.port, &["GRAPH.DELETE", &beta])
            .await
            .chars()
            .next(),
        Some('+')
    );
    assert_eq!(
        redis(env.falkor.port, &["SET", &beta, "not a graph"]).await,
        "+OK"
    );

    let alpha = svc
        .search_for(&caller("alpha", |_| {}), search("alpha", query, &[]))
        .await
        .unwrap();
    assert_eq!(alpha.hits[0].chunk_key, "auth#0", "alpha still answers");
    assert!(lane(&alpha, "fulltext").ok);

    // Every lane of beta failed: the namespace fails with a stable code, and the text the
    // client sees carries nothing of the store's error.
    let err = svc
        .search_for(&caller("beta", |_| {}), search("beta", query, &[]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Internal, "{err}");
    let status = tonic::Status::from(err);
    assert_eq!(status.code(), tonic::Code::Internal);
    for raw in ["WRONGTYPE", "wrong kind", "kg_ns_beta", "redis"] {
        assert!(
            !status
                .message()
                .to_lowercase()
                .contains(&raw.to_lowercase()),
            "raw store text {raw:?} reached the client: {}",
            status.message()
        );
    }

    // The same over gRPC with a signed context, the way the gateway fans out: alpha answers,
    // beta fails alone with the masked code, and the server keeps serving.
    let signer = ContextSigner::generate();
    let verifier = ContextVerifier::new(vec![signer.public_key()]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(kg_retrieval::serve_with(
        svc.clone(),
        verifier,
        listener,
        shutdown.clone(),
    ));
    let mut client =
        RetrievalClient::new(kg_common::grpc::channel(&format!("http://{addr}")).unwrap());
    let mut both = caller("alpha", |_| {});
    both.access.push(caller("beta", |_| {}).access.remove(0));
    let signed = signer.sign(&both);
    let call = |ns: &str| {
        let mut request = tonic::Request::new(search(ns, query, &[]));
        attach_caller(&mut request, &signed);
        request
    };
    let mut other = client.clone();
    let (a, b) = tokio::join!(other.search(call("alpha")), client.search(call("beta")));
    assert_eq!(a.unwrap().into_inner().hits[0].chunk_key, "auth#0");
    let status = b.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Internal);
    assert!(
        !status.message().contains("WRONGTYPE"),
        "{}",
        status.message()
    );
    shutdown.cancel();
    server.await.unwrap().unwrap();

    // Repaired, beta answers again: the failure was never cached.
    assert_eq!(redis(env.falkor.port, &["DEL", &beta]).await, ":1");
    // The writer remembers the indexes it made per graph; a recreated graph needs them again.
    env.store.ensure_indexes("beta").await.unwrap();
    write(
        &env.store,
        "beta",
        "auth",
        "guides/auth.md",
        corpus,
        DocumentMeta::default(),
    )
    .await;
    let back = svc
        .search_for(&caller("beta", |_| {}), search("beta", query, &[]))
        .await
        .unwrap();
    assert_eq!(back.hits[0].chunk_key, "auth#0");
}

async fn a_failing_lane_soft_fails_while_another_answers(env: &Env) {
    let ns = "lanes";
    write(
        &env.store,
        ns,
        "deal",
        "sales/deal.md",
        &[
            "Acme signed the contract with Zephyr in March.",
            "Lunch is at noon.",
        ],
        DocumentMeta::default(),
    )
    .await;
    entity_index(&env.store, ns).await;
    let acme = entity(&env.store, ns, "org", "Acme", &[]).await;
    let zephyr = entity(&env.store, ns, "org", "Zephyr", &[]).await;
    mention(&env.store, ns, "deal#0", &acme).await;
    mention(&env.store, ns, "deal#0", &zephyr).await;
    let who = caller(ns, |_| {});
    let query = "Acme and Zephyr contract";

    // A vector index that cannot be reached: a Qdrant server on a port nobody listens on.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let dead = ServerIndex::connect(&format!("http://127.0.0.1:{closed}"), None, "kg", 64).unwrap();
    let embedder: SharedEmbedder = Arc::new(HashingEmbedder::new(64));
    let service = RetrievalService::new(env.store.clone())
        .with_vectors(VectorIndex::Server(dead), embedder)
        .unwrap();

    let lanes = &["fulltext", "vector", "graph_expand", "co_annotation"];
    let soft = service
        .search_for(&who, search(ns, query, lanes))
        .await
        .unwrap();
    let vector = lane(&soft, "vector");
    assert!(!vector.ok);
    assert_eq!(vector.hits, 0);
    assert_eq!(
        vector.error_code,
        ErrorCode::Unavailable.as_str(),
        "a stable code, not the driver's text"
    );
    assert!(soft.vector_widening.is_none(), "the lane never ran a round");
    for other in ["fulltext", "graph_expand", "co_annotation"] {
        let trace = lane(&soft, other);
        assert!(
            trace.ok && trace.error_code.is_empty(),
            "{other}: {trace:?}"
        );
    }
    assert_eq!(
        soft.hits[0].chunk_key, "deal#0",
        "the other lanes still answer"
    );
    assert!(soft.hits[0].lanes.iter().all(|l| l.lane != "vector"));
    let grounding = soft
        .grounding
        .as_ref()
        .expect("co_annotation reports grounding");
    assert_eq!(grounding.direct_count, 1);
    // The failed lane does not lower the others' display scores: rank 1 in both
    // full-text and co_annotation is a perfect 1.
    assert!(
        (soft.hits[0].display_score - 1.0).abs() < 1e-9,
        "{:?}",
        soft.hits[0]
    );

    // With the failing lane alone there is no answer to give: the search fails with the
    // lane's stable code rather than pass an outage off as "nothing found".
    vector_alone_fails_showing(&service, &who, "vector index is unavailable").await;

    // An embedding endpoint nobody listens on: the client learns what failed, never the
    // endpoint or the transport's words, which stay in the log.
    let options = kg_embed::OpenAiOptions {
        dims: Some(64),
        max_retries: 0,
        ..kg_embed::OpenAiOptions::new(format!("http://127.0.0.1:{closed}/v1"), "m")
    };
    let unreachable: SharedEmbedder =
        Arc::new(kg_embed::OpenAiEmbedder::connect(options).await.unwrap());
    let dead = ServerIndex::connect(&format!("http://127.0.0.1:{closed}"), None, "kg", 64).unwrap();
    let service = RetrievalService::new(env.store.clone())
        .with_vectors(VectorIndex::Server(dead), unreachable)
        .unwrap();
    vector_alone_fails_showing(
        &service,
        &who,
        "the embedding endpoint is unavailable; retry shortly",
    )
    .await;
    let soft = service
        .search_for(&who, search(ns, query, &["fulltext", "vector"]))
        .await
        .unwrap();
    let vector = lane(&soft, "vector");
    assert_eq!(vector.error_code, ErrorCode::Unavailable.as_str());
    assert!(!vector.message.contains("127.0.0.1"), "{}", vector.message);
}

/// An embedding endpoint that takes connections and never answers (a model server stuck
/// loading, or retrying behind a proxy) would hold the vector lane for its 60 s request
/// timeout and its retries. The lanes share the time the caller allows instead: past it the
/// vector lane soft-fails with `timeout` and the others answer before the caller's deadline,
/// whether the time comes from an in-process call or from the gRPC deadline the gateway sends.
async fn a_lane_out_of_time_soft_fails_within_the_callers_deadline(env: &Env) {
    let ns = "lanes"; // written by a_failing_lane_soft_fails_while_another_answers
    let who = caller(ns, |_| {});
    let query = "Acme and Zephyr contract";
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let options = kg_embed::OpenAiOptions {
        dims: Some(64),
        ..kg_embed::OpenAiOptions::new(format!("http://127.0.0.1:{silent_port}/v1"), "m")
    };
    let stuck: SharedEmbedder = Arc::new(kg_embed::OpenAiEmbedder::connect(options).await.unwrap());
    let index =
        ServerIndex::connect(&format!("http://127.0.0.1:{silent_port}"), None, "kg", 64).unwrap();
    let service = RetrievalService::new(env.store.clone())
        .with_vectors(VectorIndex::Server(index), stuck)
        .unwrap();
    let lanes = &["fulltext", "vector", "graph_expand", "co_annotation"];
    let expect_vector_out_of_time = |response: &kg_proto::v1::SearchResponse, budget_ms: u64| {
        let vector = lane(response, "vector");
        assert!(!vector.ok, "{vector:?}");
        assert_eq!(vector.error_code, ErrorCode::Timeout.as_str());
        assert_eq!(
            vector.message,
            format!("the vector lane did not finish within the {budget_ms} ms the call allows")
        );
        for other in ["fulltext", "graph_expand", "co_annotation"] {
            assert!(
                lane(response, other).ok,
                "{other}: {:?}",
                lane(response, other)
            );
        }
        assert_eq!(
            response.hits[0].chunk_key, "deal#0",
            "the other lanes answer"
        );
    };

    // In process: 1.5 s allowed, a tenth kept back for fusing and answering.
    let soft = service
        .search_within(&who, search(ns, query, lanes), Duration::from_millis(1500))
        .await
        .unwrap();
    expect_vector_out_of_time(&soft, 1350);
    // The vector lane alone has nothing to answer with: the call fails, with `timeout`.
    let err = service
        .search_within(
            &who,
            search(ns, query, &["vector"]),
            Duration::from_millis(500),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Timeout);

    // Over gRPC, from the deadline the caller sends (the gateway sends 20 s). Before lanes
    // had a deadline, the server cancelled the whole call at the caller's deadline.
    let signer = ContextSigner::generate();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(kg_retrieval::serve_with(
        service,
        ContextVerifier::new(vec![signer.public_key()]),
        listener,
        shutdown.clone(),
    ));
    let mut client =
        RetrievalClient::new(kg_common::grpc::channel(&format!("http://{addr}")).unwrap());
    let signed = signer.sign(&who);
    let mut request = tonic::Request::new(search(ns, query, lanes));
    attach_caller(&mut request, &signed);
    request.set_timeout(Duration::from_secs(2));
    let over_grpc = client.search(request).await.unwrap().into_inner();
    expect_vector_out_of_time(&over_grpc, 1800);

    // Entity search in hybrid mode: the vector side runs out of time, the text side answers.
    let mut request = tonic::Request::new(kg_proto::v1::EntitySearchRequest {
        namespace: ns.into(),
        text: "Acme".into(),
        mode: "hybrid".into(),
        ..Default::default()
    });
    attach_caller(&mut request, &signed);
    request.set_timeout(Duration::from_secs(2));
    let entities = client.entity_search(request).await.unwrap().into_inner();
    assert_eq!(entities.mode, "text", "{entities:?}");
    assert_eq!(entities.hits[0].name, "Acme");
    let side = |name: &str| entities.sides.iter().find(|s| s.side == name).unwrap();
    assert!(side("text").ok);
    assert!(!side("vector").ok);
    assert_eq!(side("vector").error_code, ErrorCode::Timeout.as_str());
    assert_eq!(
        side("vector").message,
        "the vector side did not finish within the 1800 ms the call allows"
    );
    shutdown.cancel();
    server.await.unwrap().unwrap();
    held.abort();
}

/// A search of the vector lane alone on the "lanes" namespace fails with `unavailable` and
/// shows the client `message`, which names no address.
async fn vector_alone_fails_showing(
    service: &RetrievalService,
    who: &kg_proto::v1::CallerContext,
    message: &str,
) {
    let err = service
        .search_for(
            who,
            search("lanes", "Acme and Zephyr contract", &["vector"]),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable);
    assert_eq!(tonic::Status::from(err).message(), message);
}

async fn vector_widening_reports_the_cap(env: &Env) {
    const DIMS: usize = 64;
    let ns = "widen";
    // 6,500 chunk points the graph does not hold (stale points of deleted files): the graph
    // check rejects every candidate, so the pool widens round after round until its cap.
    let dir = tempfile::tempdir().unwrap();
    let index: VectorIndex = EdgeIndex::open(dir.path(), DIMS).await.unwrap().into();
    index.ensure_collection().await.unwrap();
    let embedder: SharedEmbedder = Arc::new(HashingEmbedder::new(DIMS));
    let vector = embedder
        .embed(vec!["rotate the signing keys".to_owned()])
        .await
        .unwrap()
        .remove(0);
    for batch in 0..13 {
        let points = (0..500)
            .map(|i| {
                let id = format!("stale{batch}_{i}");
                VectorPoint {
                    text_hash: None,
                    embed_hash: None,
                    namespace: ns.into(),
                    kind: PointKind::Chunk,
                    chunk_key: format!("{id}#0"),
                    path: format!("bulk/{id}.md"),
                    file_id: id,
                    enabled: true,
                    hidden: false,
                    collections: Vec::new(),
                    document_date: None,
                    vector: vector.clone(),
                }
            })
            .collect();
        index.upsert(points).await.unwrap();
    }
    write(
        &env.store,
        ns,
        "live",
        "guides/keys.md",
        &["rotate the signing keys"],
        DocumentMeta::default(),
    )
    .await;
    let service = RetrievalService::new(env.store.clone())
        .with_vectors(index, embedder)
        .unwrap();
    let request = SearchRequest {
        filters: Some(SearchFilters {
            folder_prefix: "rare/".into(),
            ..Default::default()
        }),
        ..search(ns, "rotate the signing keys", &["vector"])
    };
    let capped = service
        .search_for(&caller(ns, |_| {}), request)
        .await
        .unwrap();
    assert!(capped.hits.is_empty(), "{:?}", keys(&capped));
    assert!(lane(&capped, "vector").ok);
    let widening = capped.vector_widening.unwrap();
    assert_eq!(
        (widening.pool, widening.rounds, widening.cap_reached),
        (6_400, 4, true),
        "100 -> 400 -> 1,600 -> 6,400, then the cap stops it"
    );
}

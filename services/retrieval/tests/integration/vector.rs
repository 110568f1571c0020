//! The vector lane against a real FalkorDB and a real qdrant-edge shard: nearest chunks under
//! the caller's access inside the engine, graph-checked filters, and pool widening in rounds
//! when a filter rejects most candidates or copies of one text fill the pool (reported, with the
//! cap, in `vector_widening`).
//! Vectors come from the deterministic test embedder; the lane code is the production one.

use crate::common;

use std::sync::Arc;

use common::*;
use kg_embed::{HashingEmbedder, SharedEmbedder};
use kg_indexer::document::DocumentMeta;
use kg_proto::v1::{SearchFilters, SearchRequest};
use kg_retrieval::RetrievalService;
use kg_stores::vector::{EdgeIndex, PointKind, VectorIndex, VectorPoint};

const NS: &str = "vectors";
const DIMS: usize = 64;

/// Writes a one-chunk file to the graph and its chunk point to the index.
async fn file(
    env: &Env,
    index: &VectorIndex,
    embedder: &SharedEmbedder,
    id: &str,
    path: &str,
    text: &str,
) {
    write(&env.store, NS, id, path, &[text], DocumentMeta::default()).await;
    let vector = embedder
        .embed(vec![text.to_owned()])
        .await
        .unwrap()
        .remove(0);
    index
        .upsert(vec![VectorPoint {
            text_hash: Some(kg_stores::chunk_text::text_hash(text)),
            embed_hash: None,
            namespace: NS.into(),
            kind: PointKind::Chunk,
            chunk_key: format!("{id}#0"),
            file_id: id.into(),
            path: path.into(),
            enabled: true,
            hidden: false,
            collections: Vec::new(),
            document_date: None,
            vector,
        }])
        .await
        .unwrap();
}

fn request(query: &str, filters: Option<SearchFilters>) -> SearchRequest {
    SearchRequest {
        namespace: NS.into(),
        query: query.into(),
        lanes: vec!["vector".into()],
        top_k: 8,
        filters,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vector_lane_respects_access_filters_and_widens() {
    let env = start().await;
    let dir = tempfile::tempdir().unwrap();
    let index: VectorIndex = EdgeIndex::open(dir.path(), DIMS).await.unwrap().into();
    index.ensure_collection().await.unwrap();
    let embedder: SharedEmbedder = Arc::new(HashingEmbedder::new(DIMS));

    file(
        &env,
        &index,
        &embedder,
        "rot",
        "ops/rotate.md",
        "rotate the signing keys every quarter",
    )
    .await;
    file(
        &env,
        &index,
        &embedder,
        "sec",
        "secret/keys.md",
        "rotate the signing keys in the vault",
    )
    .await;
    // 300 near-duplicates outside `rare/`, one file inside it: a folder filter must widen.
    for i in 0..300 {
        let text = format!("rotate the signing keys note {i}");
        file(
            &env,
            &index,
            &embedder,
            &format!("n{i}"),
            &format!("notes/n{i}.md"),
            &text,
        )
        .await;
    }
    file(
        &env,
        &index,
        &embedder,
        "rare",
        "rare/one.md",
        "rotate the signing keys once in rare",
    )
    .await;

    let service = RetrievalService::new(env.store.clone())
        .with_vectors(index.clone(), embedder.clone())
        .unwrap();

    // Access inside the engine: the restricted reader never gets the denied file.
    let everyone = service
        .search_for(
            &caller(NS, |_| {}),
            request("rotate the signing keys vault", None),
        )
        .await
        .unwrap();
    assert!(
        everyone.hits.iter().any(|h| h.file_id == "sec"),
        "{:?}",
        everyone.hits
    );
    let restricted_answer = service
        .search_for(
            &restricted(NS),
            request("rotate the signing keys vault", None),
        )
        .await
        .unwrap();
    assert!(!restricted_answer.hits.is_empty());
    assert!(restricted_answer.hits.iter().all(|h| h.file_id != "sec"));
    let trace = &restricted_answer.lanes[0];
    assert!(trace.ok && trace.lane == "vector", "{trace:?}");
    let widening = restricted_answer.vector_widening.unwrap();
    assert_eq!((widening.rounds, widening.cap_reached), (1, false));

    // A folder filter that rejects almost every candidate: the pool widens until the one
    // file in `rare/` is found, instead of returning nothing.
    let rare = service
        .search_for(
            &restricted(NS),
            request(
                "rotate the signing keys note",
                Some(SearchFilters {
                    folder_prefix: "rare/".into(),
                    ..Default::default()
                }),
            ),
        )
        .await
        .unwrap();
    assert_eq!(rare.hits.len(), 1, "{:?}", rare.hits);
    assert_eq!(rare.hits[0].file_id, "rare");
    let widening = rare.vector_widening.unwrap();
    assert!(widening.rounds > 1, "{widening:?}");
    assert!(!widening.cap_reached);

    // A filter nothing passes: the engine runs out before the cap, nothing leaks.
    let none = service
        .search_for(
            &restricted(NS),
            request(
                "rotate the signing keys",
                Some(SearchFilters {
                    folder_prefix: "secret/".into(),
                    ..Default::default()
                }),
            ),
        )
        .await
        .unwrap();
    assert!(none.hits.is_empty(), "{:?}", none.hits);

    // Without a vector index the lane soft-fails as unavailable.
    let plain = RetrievalService::new(env.store.clone())
        .search_for(&caller(NS, |_| {}), request("rotate", None))
        .await
        .unwrap();
    assert_eq!(plain.lanes[0].error_code, "lane_unavailable");
    assert!(plain.vector_widening.is_none());

    // An embedder that does not fit the index is refused when the service is built.
    let wrong: SharedEmbedder = Arc::new(HashingEmbedder::new(DIMS + 1));
    assert!(
        RetrievalService::new(env.store.clone())
            .with_vectors(index, wrong)
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_filling_the_pool_widen_it_when_they_fold() {
    let env = start().await;
    let dir = tempfile::tempdir().unwrap();
    let index: VectorIndex = EdgeIndex::open(dir.path(), DIMS).await.unwrap().into();
    index.ensure_collection().await.unwrap();
    let embedder: SharedEmbedder = Arc::new(HashingEmbedder::new(DIMS));
    // 150 copies of three texts nearest the question, then 40 distinct texts further away.
    let texts = [
        "set the workspace option",
        "set the workspace option here",
        "set the workspace option there",
    ];
    for i in 0..150 {
        let id = format!("c{i}");
        let path = format!("commands/c{i}.md");
        file(&env, &index, &embedder, &id, &path, texts[i % 3]).await;
    }
    for i in 0..40 {
        let text = format!("set the workspace option with extra{i} words{i} beside it");
        let (id, path) = (format!("d{i}"), format!("guides/d{i}.md"));
        file(&env, &index, &embedder, &id, &path, &text).await;
    }
    let service = RetrievalService::new(env.store.clone())
        .with_vectors(index, embedder)
        .unwrap();
    let reader = caller(NS, |_| {});
    let ask = |collapse: bool| {
        let mut request = request("set the workspace option", None);
        request.top_k = 32;
        request.ranking = Some(kg_proto::v1::Ranking {
            collapse_duplicates: Some(collapse),
            ..Default::default()
        });
        service.search_for(&reader, request)
    };

    // The first 100 points hold 3 texts: the pool widens to 400 and finds the 40 others.
    let folded = ask(true).await.unwrap();
    let widening = folded.vector_widening.unwrap();
    assert_eq!((widening.pool, widening.rounds), (400, 2), "{widening:?}");
    assert!(!widening.cap_reached);
    assert_eq!(folded.hits.len(), 32);
    assert_eq!(folded.total_candidates, 43);
    assert_eq!(folded.duplicates_collapsed, 147);
    let copies: u32 = folded.hits.iter().take(3).map(|h| h.duplicate_count).sum();
    assert_eq!(copies, 147, "the three texts lead, each with its 49 copies");
    assert!(folded.hits[3..].iter().all(|h| h.file_id.starts_with('d')));

    // Without folding the copies are the hits, and nothing widens.
    let apart = ask(false).await.unwrap();
    let widening = apart.vector_widening.unwrap();
    assert_eq!((widening.pool, widening.rounds), (100, 1));
    assert_eq!(apart.hits.len(), 32);
    assert!(apart.hits.iter().all(|h| h.file_id.starts_with('c')));
}

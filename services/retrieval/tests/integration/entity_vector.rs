//! EntitySearch by vector similarity against a real FalkorDB and a real qdrant-edge shard:
//! entities of the readable chunks nearest to the query join the text candidates, ranked by
//! the cosine of their embedded name and aliases; nothing comes from a file the caller may
//! not read. Vectors come from the deterministic test embedder.

use crate::common;

use std::sync::Arc;

use common::*;
use kg_common::ErrorExt;
use kg_common::error::ErrorCode;
use kg_embed::{HashingEmbedder, SharedEmbedder};
use kg_indexer::document::DocumentMeta;
use kg_proto::v1::{CallerContext, EntityHit, EntitySearchRequest, EntitySearchResponse};
use kg_retrieval::RetrievalService;
use kg_stores::vector::{EdgeIndex, PointKind, ServerIndex, VectorIndex, VectorPoint};

const NS: &str = "entvec";
const DIMS: usize = 64;

/// A one-chunk file in the graph, and its chunk point in the index.
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
            text_hash: None,
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

async fn find(service: &RetrievalService, who: &CallerContext, text: &str) -> Vec<EntityHit> {
    service
        .entity_search_for(
            who,
            EntitySearchRequest {
                namespace: NS.into(),
                text: text.into(),
                limit: 0,
                evidence_limit: 0,
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .hits
}

fn names(hits: &[EntityHit]) -> Vec<&str> {
    hits.iter().map(|h| h.name.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entities_are_found_by_vector_similarity_under_access() {
    let env = start().await;
    let s = &env.store;
    entity_index(s, NS).await;
    let dir = tempfile::tempdir().unwrap();
    let index: VectorIndex = EdgeIndex::open(dir.path(), DIMS).await.unwrap().into();
    let embedder: SharedEmbedder = Arc::new(HashingEmbedder::new(DIMS));

    file(
        &env,
        &index,
        &embedder,
        "ci",
        "ops/ci.md",
        "the deployment pipeline ships nightly builds to staging",
    )
    .await;
    file(
        &env,
        &index,
        &embedder,
        "hr",
        "hr/leave.md",
        "holiday allowance and parental leave rules",
    )
    .await;
    file(
        &env,
        &index,
        &embedder,
        "secret",
        "secret/ci.md",
        "private project notes that mention the pipeline once",
    )
    .await;
    let builds = entity(s, NS, "topic", "Nightly Builds", &[]).await;
    let orion = entity(s, NS, "product", "Orion", &["Orion Platform"]).await;
    let leave = entity(s, NS, "topic", "Parental Leave", &[]).await;
    let umbrella = entity(s, NS, "org", "Umbrella", &[]).await;
    mention(s, NS, "ci#0", &builds).await;
    mention(s, NS, "ci#0", &orion).await;
    mention(s, NS, "hr#0", &leave).await;
    mention(s, NS, "secret#0", &umbrella).await;
    // A chunk point whose chunk the graph does not hold (a deleted file) adds nothing.
    index
        .upsert(vec![VectorPoint {
            text_hash: None,
            embed_hash: None,
            namespace: NS.into(),
            kind: PointKind::Chunk,
            chunk_key: "gone#0".into(),
            file_id: "gone".into(),
            path: "ops/gone.md".into(),
            enabled: true,
            hidden: false,
            collections: Vec::new(),
            document_date: None,
            vector: embedder
                .embed(vec!["deployment pipeline nightly builds".into()])
                .await
                .unwrap()
                .remove(0),
        }])
        .await
        .unwrap();

    let query = "how does the deployment pipeline ship builds";
    let full = caller(NS, |_| {});
    let limited = restricted(NS);

    // Text only (no embeddings): the name "Nightly Builds" shares a word, Orion does not.
    assert_eq!(
        names(&find(&env.service, &full, query).await),
        ["Nightly Builds"]
    );

    let service = RetrievalService::new(s.clone())
        .with_vectors(index.clone(), embedder.clone())
        .unwrap();
    // With vectors: the entities of the nearest readable chunks join (in a corpus this small,
    // every chunk is among the nearest); the one found by both text and vector ranks first,
    // the entity of the nearest chunk next, the unrelated leave topic last.
    let hits = find(&service, &full, query).await;
    assert_eq!(names(&hits[..2]), ["Nightly Builds", "Orion"]);
    assert_eq!(hits.last().unwrap().entity_key, leave);
    let orion_hit = &hits[1];
    assert_eq!(orion_hit.entity_key, orion);
    assert_eq!(orion_hit.type_labels, ["product label"]);
    assert_eq!(orion_hit.evidence_chunk_keys, ["ci#0"]);
    assert_eq!((orion_hit.degree, orion_hit.role.as_str()), (1, "bridge"));
    assert!(hits.windows(2).all(|w| w[0].score >= w[1].score));
    // The private file's entity reaches a full reader by vector ...
    assert!(names(&hits).contains(&"Umbrella"), "{:?}", names(&hits));
    // ... and never a caller who may not read it.
    let hits = find(&service, &limited, query).await;
    assert!(
        hits.iter().all(|h| h.entity_key != umbrella),
        "{:?}",
        names(&hits)
    );
    assert!(hits.iter().any(|h| h.entity_key == orion));
    // An exact name still ranks first, vector candidates or not.
    let hits = find(&service, &full, "Parental Leave").await;
    assert_eq!(hits[0].entity_key, leave);

    // A vector index that is down: the text candidates still answer.
    let down =
        VectorIndex::from(ServerIndex::connect("http://127.0.0.1:1", None, "kg", DIMS).unwrap());
    let service = RetrievalService::new(s.clone())
        .with_vectors(down, embedder)
        .unwrap();
    assert_eq!(
        names(&find(&service, &full, query).await),
        ["Nightly Builds"]
    );
}

/// The test embedder, recording every batch it is asked for.
#[derive(Debug)]
struct Recording {
    inner: HashingEmbedder,
    batches: std::sync::Mutex<Vec<Vec<String>>>,
}

#[tonic::async_trait]
impl kg_embed::Embedder for Recording {
    fn model_id(&self) -> &str {
        self.inner.model_id()
    }

    fn dims(&self) -> usize {
        self.inner.dims()
    }

    async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, kg_embed::EmbedError> {
        self.batches.lock().unwrap().push(texts.clone());
        self.inner.embed(texts).await
    }
}

/// A query never shares a batch with entity names (the embedder pads a batch to its longest
/// text: a long query made every name cost as much as the query), and names embedded once
/// are not embedded again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entity_names_are_embedded_apart_from_the_query_and_once() {
    let env = start().await;
    let s = &env.store;
    entity_index(s, NS).await;
    let dir = tempfile::tempdir().unwrap();
    let index: VectorIndex = EdgeIndex::open(dir.path(), DIMS).await.unwrap().into();
    let recording = Arc::new(Recording {
        inner: HashingEmbedder::new(DIMS),
        batches: Default::default(),
    });
    let embedder: SharedEmbedder = recording.clone();
    file(
        &env,
        &index,
        &embedder,
        "ci",
        "ops/ci.md",
        "the pipeline ships nightly builds",
    )
    .await;
    file(
        &env,
        &index,
        &embedder,
        "hr",
        "hr/leave.md",
        "parental leave rules",
    )
    .await;
    let builds = entity(s, NS, "topic", "Nightly Builds", &[]).await;
    let orion = entity(s, NS, "product", "Orion", &["Orion Platform"]).await;
    let leave = entity(s, NS, "topic", "Parental Leave", &[]).await;
    mention(s, NS, "ci#0", &builds).await;
    mention(s, NS, "ci#0", &orion).await;
    mention(s, NS, "hr#0", &leave).await;
    recording.batches.lock().unwrap().clear();
    let service = RetrievalService::new(s.clone())
        .with_vectors(index, embedder)
        .unwrap();
    let full = caller(NS, |_| {});

    let long = "how does the deployment pipeline ship builds ".repeat(10);
    let first = find(&service, &full, long.trim()).await;
    assert_eq!(first.len(), 3, "{:?}", names(&first));
    let batches = std::mem::take(&mut *recording.batches.lock().unwrap());
    assert_eq!(
        batches[0],
        [long.trim()],
        "the query alone first: {batches:?}"
    );
    let mut embedded: Vec<&str> = batches[1..].iter().flatten().map(String::as_str).collect();
    embedded.sort_unstable();
    assert_eq!(
        embedded,
        ["Nightly Builds", "Orion; Orion Platform", "Parental Leave"],
        "then the names, once each and without the query"
    );

    // Same names again: only the new query is embedded, and the ranking is the same.
    let again = find(&service, &full, long.trim()).await;
    assert_eq!(names(&again), names(&first));
    let second = find(&service, &full, "parental leave").await;
    assert_eq!(second[0].entity_key, leave);
    let batches = std::mem::take(&mut *recording.batches.lock().unwrap());
    assert_eq!(
        batches,
        [
            vec![long.trim().to_owned()],
            vec!["parental leave".to_owned()]
        ]
    );
}

async fn find_mode(
    service: &RetrievalService,
    who: &CallerContext,
    text: &str,
    mode: &str,
) -> Result<EntitySearchResponse, kg_retrieval::RetrievalError> {
    service
        .entity_search_for(
            who,
            EntitySearchRequest {
                namespace: NS.into(),
                text: text.into(),
                mode: mode.into(),
                ..Default::default()
            },
        )
        .await
}

fn sides(response: &EntitySearchResponse) -> Vec<(&str, bool, &str)> {
    response
        .sides
        .iter()
        .map(|s| (s.side.as_str(), s.ok, s.error_code.as_str()))
        .collect()
}

/// `mode` picks the sides: vector finds an entity from a paraphrase that shares no word with
/// its name (text finds nothing), text never calls the embedder, hybrid fuses and keeps an
/// exact name first, and the response says which mode answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entity_search_modes() {
    let env = start().await;
    let s = &env.store;
    entity_index(s, NS).await;
    let dir = tempfile::tempdir().unwrap();
    let index: VectorIndex = EdgeIndex::open(dir.path(), DIMS).await.unwrap().into();
    let recording = Arc::new(Recording {
        inner: HashingEmbedder::new(DIMS),
        batches: Default::default(),
    });
    let embedder: SharedEmbedder = recording.clone();
    let text = "the deployment pipeline ships nightly builds to staging";
    file(&env, &index, &embedder, "ci", "ops/ci.md", text).await;
    file(
        &env,
        &index,
        &embedder,
        "hr",
        "hr/leave.md",
        "holiday allowance and parental leave rules",
    )
    .await;
    let orion = entity(s, NS, "product", "Orion", &["Orion Platform"]).await;
    let leave = entity(s, NS, "topic", "Parental Leave", &[]).await;
    mention(s, NS, "ci#0", &orion).await;
    mention(s, NS, "hr#0", &leave).await;
    let service = RetrievalService::new(s.clone())
        .with_vectors(index.clone(), embedder.clone())
        .unwrap();
    let full = caller(NS, |_| {});
    // Shares words with the chunk that mentions Orion, none with any entity name or alias.
    let paraphrase = "how does the deployment pipeline ship to staging";

    recording.batches.lock().unwrap().clear();
    let by_text = find_mode(&service, &full, paraphrase, "text")
        .await
        .unwrap();
    assert!(by_text.hits.is_empty(), "{:?}", names(&by_text.hits));
    assert_eq!(by_text.mode, "text");
    assert_eq!(sides(&by_text), [("text", true, "")]);
    let by_text = find_mode(&service, &full, "Orion", "text").await.unwrap();
    assert_eq!(by_text.hits[0].entity_key, orion);
    assert!(
        recording.batches.lock().unwrap().is_empty(),
        "text mode never calls the embedder"
    );

    let by_vector = find_mode(&service, &full, paraphrase, "vector")
        .await
        .unwrap();
    assert_eq!(
        by_vector.hits[0].entity_key,
        orion,
        "{:?}",
        names(&by_vector.hits)
    );
    assert_eq!(by_vector.mode, "vector");
    assert_eq!(sides(&by_vector), [("vector", true, "")]);
    assert!(!recording.batches.lock().unwrap().is_empty());

    // Omitted with embeddings: hybrid, both sides reported.
    let hybrid = find_mode(&service, &full, paraphrase, "").await.unwrap();
    assert_eq!(hybrid.mode, "hybrid");
    assert_eq!(sides(&hybrid), [("text", true, ""), ("vector", true, "")]);
    assert_eq!(hybrid.hits[0].entity_key, orion);
    // An exact name ranks first in hybrid.
    let exact = find_mode(&service, &full, "Parental Leave", "hybrid")
        .await
        .unwrap();
    assert_eq!(exact.hits[0].entity_key, leave);

    let err = find_mode(&service, &full, "Orion", "fuzzy")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert_eq!(
        err.to_string(),
        "unknown mode `fuzzy`; valid modes: text, vector, hybrid"
    );

    // No embedder: the default is text, vector is refused with a pointer to text, and an
    // explicit hybrid answers from text and says the vector side is unavailable.
    let plain = RetrievalService::new(s.clone());
    let default = find_mode(&plain, &full, "Orion", "").await.unwrap();
    assert_eq!(
        (default.mode.as_str(), default.hits[0].entity_key.as_str()),
        ("text", orion.as_str())
    );
    assert_eq!(sides(&default), [("text", true, "")]);
    let err = find_mode(&plain, &full, paraphrase, "vector")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::FailedPrecondition);
    assert!(
        err.to_string().contains("embeddings are not configured")
            && err.to_string().contains("use mode text"),
        "{err}"
    );
    let asked = find_mode(&plain, &full, "Orion", "hybrid").await.unwrap();
    assert_eq!(asked.mode, "text");
    assert_eq!(
        sides(&asked),
        [("text", true, ""), ("vector", false, "lane_unavailable")]
    );

    // Hybrid whose vector index is down: text answers, the mode says so, the message keeps
    // the store's detail (its address) out.
    let down =
        VectorIndex::from(ServerIndex::connect("http://127.0.0.1:1", None, "kg", DIMS).unwrap());
    let degraded = RetrievalService::new(s.clone())
        .with_vectors(down, embedder)
        .unwrap();
    let fell_back = find_mode(&degraded, &full, "Orion", "").await.unwrap();
    assert_eq!(fell_back.mode, "text");
    assert_eq!(fell_back.hits[0].entity_key, orion);
    assert_eq!(
        sides(&fell_back),
        [("text", true, ""), ("vector", false, "unavailable")]
    );
    let message = &fell_back.sides[1].message;
    assert!(!message.contains("127.0.0.1"), "{message}");
    // Vector alone on the broken index fails instead of answering "no entity".
    let err = find_mode(&degraded, &full, "Orion", "vector")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable);
}

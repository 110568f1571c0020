//! EntitySearch by vector similarity against a real FalkorDB and a real qdrant-edge shard:
//! entities of the readable chunks nearest to the query join the text candidates, ranked by
//! the cosine of their embedded name and aliases; nothing comes from a file the caller may
//! not read. Vectors come from the deterministic test embedder.

use crate::common;

use std::sync::Arc;

use common::*;
use kg_embed::{HashingEmbedder, SharedEmbedder};
use kg_indexer::document::DocumentMeta;
use kg_proto::v1::{CallerContext, EntityHit, EntitySearchRequest};
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

//! Turning embeddings on over a namespace indexed without them: on start the worker re-queues
//! the current versions that lack vectors, writes them once, and a second start embeds
//! nothing. A re-queued (older) upsert never replaces a newer version. Real NATS, FalkorDB
//! and qdrant-edge; a counting wrapper around the test embedder.
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kg_embed::{EmbedError, Embedder, HashingEmbedder};
use kg_indexer::{IndexerConfig, Vectors};
use kg_proto::v1::{AccessFilter, FileChangeOp, FileChanged, Permission};
use kg_stores::blobs::BlobStore;
use kg_stores::events;
use kg_stores::graph::{GraphStore, Params};
use kg_stores::vector::EdgeIndex;
use prost::Message as _;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const NS: &str = "backfill";

#[derive(Debug)]
struct Counting {
    inner: HashingEmbedder,
    texts: AtomicUsize,
}

#[async_trait::async_trait]
impl Embedder for Counting {
    fn model_id(&self) -> &str {
        "test-hashing"
    }
    fn dims(&self) -> usize {
        self.inner.dims()
    }
    async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.texts.fetch_add(texts.len(), Ordering::SeqCst);
        self.inner.embed(texts).await
    }
}

fn everything() -> AccessFilter {
    AccessFilter {
        namespace: NS.into(),
        allow_prefixes: vec![String::new()],
        permission: Permission::Admin as i32,
        ..Default::default()
    }
}

async fn upload(
    js: &async_nats::jetstream::Context,
    blobs: &BlobStore,
    file_id: &str,
    version: &str,
    text: &str,
    changed_at_ms: i64,
    msg_id: &str,
) {
    let blob_key = blobs.put(text.as_bytes()).await.unwrap();
    let event = FileChanged {
        namespace: NS.into(),
        file_id: file_id.into(),
        version_id: version.into(),
        path: format!("docs/{file_id}.md"),
        mime: "text/markdown".into(),
        blob_key,
        op: FileChangeOp::Upsert as i32,
        enabled: true,
        changed_at_ms,
        ..Default::default()
    };
    let subject = events::files_changed_subject(NS).unwrap();
    events::publish(js, &subject, msg_id, event.encode_to_vec())
        .await
        .unwrap();
}

async fn file_refs(graph: &GraphStore) -> Vec<Vec<Value>> {
    graph
        .query(
            NS,
            "MATCH (f:FileRef) RETURN f.fileId, f.versionId, f.vectorStamp ORDER BY f.fileId",
            &Params::new(),
        )
        .await
        .map(|r| r.rows)
        .unwrap_or_default()
}

async fn wait_for(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enabling_embeddings_backfills_current_versions_once() {
    let stores = crate::stores::start().await;
    let (graph, js, blobs) = (
        stores.graph.clone(),
        stores.js.clone(),
        stores.blobs.clone(),
    );
    let dir = &stores.dir;

    // Indexed without embeddings: f1 twice (v1 then v2), f2 once.
    upload(
        &js,
        &blobs,
        "f1",
        "f1-v1",
        "# One\n\nThe first draft.\n",
        1_000,
        "a",
    )
    .await;
    upload(
        &js,
        &blobs,
        "f1",
        "f1-v2",
        "# One\n\nThe final text.\n",
        2_000,
        "b",
    )
    .await;
    upload(
        &js,
        &blobs,
        "f2",
        "f2-v1",
        "# Two\n\nAnother file.\n",
        1_500,
        "c",
    )
    .await;
    let stop = CancellationToken::new();
    let plain = tokio::spawn(kg_indexer::run(
        IndexerConfig::default(),
        graph.clone(),
        blobs.clone(),
        js.clone(),
        stop.clone(),
    ));
    wait_for("plain indexing", async || {
        let refs = file_refs(&graph).await;
        refs.len() == 2 && refs[0][1] == json!("f1-v2") && refs[1][1] == json!("f2-v1")
    })
    .await;
    stop.cancel();
    plain.await.unwrap().unwrap();
    assert!(file_refs(&graph).await.iter().all(|r| r[2].is_null()));

    // Embeddings on: the start re-queues both current versions and writes their vectors.
    let embedder = Arc::new(Counting {
        inner: HashingEmbedder::new(16),
        texts: AtomicUsize::new(0),
    });
    let index = EdgeIndex::open(dir.path().join("vectors"), 16)
        .await
        .unwrap();
    let vectors = Vectors::new(index.into(), embedder.clone()).unwrap();
    let config = IndexerConfig {
        vectors: Some(vectors.clone()),
        ..IndexerConfig::default()
    };
    let stop = CancellationToken::new();
    let with_vectors = tokio::spawn(kg_indexer::run(
        config.clone(),
        graph.clone(),
        blobs.clone(),
        js.clone(),
        stop.clone(),
    ));
    wait_for("the backfill", async || {
        let refs = file_refs(&graph).await;
        refs.len() == 2 && refs.iter().all(|r| !r[2].is_null())
    })
    .await;
    let refs = file_refs(&graph).await;
    assert_eq!(refs[0][1], json!("f1-v2"), "the newest version stays");
    assert_eq!(refs[0][2], json!("f1-v2|test-hashing|16"));
    assert_eq!(refs[1][2], json!("f2-v1|test-hashing|16"));
    for file in ["f1", "f2"] {
        assert!(
            vectors
                .index
                .file_vector(&everything(), file)
                .await
                .unwrap()
                .is_some(),
            "{file} has a file vector"
        );
    }
    let embedded = embedder.texts.load(Ordering::SeqCst);
    assert!(embedded >= 2, "{embedded}");

    // Nothing left to backfill; the old f1-v1 upsert re-queued by hand changes nothing.
    assert_eq!(
        kg_indexer::backfill::backfill_vectors(&graph, &js, &vectors, Some(NS))
            .await
            .unwrap(),
        0
    );
    upload(
        &js,
        &blobs,
        "f1",
        "f1-v1",
        "# One\n\nThe first draft.\n",
        1_000,
        "d",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.cancel();
    with_vectors.await.unwrap().unwrap();
    assert_eq!(file_refs(&graph).await[0][1], json!("f1-v2"));
    assert_eq!(embedder.texts.load(Ordering::SeqCst), embedded);

    // A second start with embeddings embeds nothing.
    let stop = CancellationToken::new();
    let again = tokio::spawn(kg_indexer::run(
        config,
        graph.clone(),
        blobs.clone(),
        js.clone(),
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.cancel();
    again.await.unwrap().unwrap();
    assert_eq!(embedder.texts.load(Ordering::SeqCst), embedded);
}

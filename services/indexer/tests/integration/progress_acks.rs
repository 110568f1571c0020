//! A message that waits in a lane behind a slow file keeps its JetStream delivery: the
//! indexer sends progress acks for every pulled message, queued or running, so with a
//! 2 s ack wait a file queued for more than three ack waits is still delivered once.
//! Real NATS, FalkorDB and qdrant-edge; the slow step is an embedder that stalls once.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kg_embed::{EmbedError, Embedder, HashingEmbedder};
use kg_indexer::{IndexerConfig, Vectors};
use kg_proto::v1::{FileChangeOp, FileChanged};
use kg_stores::blobs::BlobStore;
use kg_stores::events;
use kg_stores::graph::Params;
use kg_stores::vector::EdgeIndex;
use prost::Message as _;
use tokio_util::sync::CancellationToken;

const NS: &str = "progress";
const ACK_WAIT: Duration = Duration::from_secs(2);
/// More than three ack waits.
const STALL: Duration = Duration::from_secs(7);

/// Stalls the first batch that holds the slow file's text, then embeds like the test embedder.
#[derive(Debug)]
struct Stalling {
    inner: HashingEmbedder,
    stalled: AtomicBool,
}

#[async_trait::async_trait]
impl Embedder for Stalling {
    fn model_id(&self) -> &str {
        "test-hashing"
    }
    fn dims(&self) -> usize {
        self.inner.dims()
    }
    async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.iter().any(|t| t.contains("glacier")) && !self.stalled.swap(true, Ordering::SeqCst)
        {
            tokio::time::sleep(STALL).await;
        }
        self.inner.embed(texts).await
    }
}

async fn upload(js: &async_nats::jetstream::Context, blobs: &BlobStore, file_id: &str, text: &str) {
    let blob_key = blobs.put(text.as_bytes()).await.unwrap();
    let event = FileChanged {
        namespace: NS.into(),
        file_id: file_id.into(),
        version_id: format!("{file_id}-v1"),
        path: format!("docs/{file_id}.md"),
        mime: "text/markdown".into(),
        blob_key,
        op: FileChangeOp::Upsert as i32,
        enabled: true,
        changed_at_ms: 1_000,
        ..Default::default()
    };
    let subject = events::files_changed_subject(NS).unwrap();
    events::publish(js, &subject, file_id, event.encode_to_vec())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_queued_behind_a_slow_file_is_delivered_once() {
    let stores = crate::stores::start().await;
    let (graph, js, blobs) = (
        stores.graph.clone(),
        stores.js.clone(),
        stores.blobs.clone(),
    );
    let dir = &stores.dir;
    let index = EdgeIndex::open(dir.path().join("vectors"), 16)
        .await
        .unwrap();
    let embedder = Arc::new(Stalling {
        inner: HashingEmbedder::new(16),
        stalled: AtomicBool::new(false),
    });
    let config = IndexerConfig {
        ack_wait: ACK_WAIT,
        // One lane: the second file waits for the first.
        concurrency: 1,
        vectors: Some(Vectors::new(index.into(), embedder.clone()).unwrap()),
        ..IndexerConfig::default()
    };

    upload(&js, &blobs, "slow", "# Slow\n\nThe glacier moves slowly.\n").await;
    upload(
        &js,
        &blobs,
        "queued",
        "# Queued\n\nThis one waits its turn.\n",
    )
    .await;
    let stop = CancellationToken::new();
    let started = Instant::now();
    let worker = tokio::spawn(kg_indexer::run(
        config,
        graph.clone(),
        blobs.clone(),
        js.clone(),
        stop.clone(),
    ));

    let stream = js.get_stream(events::FILES_STREAM).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let info = loop {
        let info = stream.consumer_info("indexer").await.ok();
        let files = graph
            .query(NS, "MATCH (f:FileRef) RETURN count(f)", &Params::new())
            .await
            .map(|r| r.rows)
            .unwrap_or_default();
        if let Some(info) = info
            && files == vec![vec![serde_json::json!(2)]]
            && info.num_ack_pending == 0
            && info.ack_floor.stream_sequence == 2
        {
            break info;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for both files"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(embedder.stalled.load(Ordering::SeqCst));
    assert!(
        started.elapsed() > STALL,
        "the queued file waited behind the slow one"
    );
    // Let any late redelivery (one ack wait after the last progress ack) show up.
    tokio::time::sleep(ACK_WAIT * 2).await;
    let after = stream.consumer_info("indexer").await.unwrap();
    stop.cancel();
    worker.await.unwrap().unwrap();

    // Two events, two deliveries: nothing was redelivered while it waited or ran.
    assert_eq!(info.delivered.stream_sequence, 2);
    assert_eq!(
        after.delivered.consumer_sequence, 2,
        "deliveries: {:?}, redelivered: {}",
        after.delivered, after.num_redelivered
    );
    assert_eq!(after.num_redelivered, 0);
    assert_eq!(after.num_ack_pending, 0);
}

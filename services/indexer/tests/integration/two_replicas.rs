//! Two indexer replicas share the durable consumer, as two pods of one Deployment do. Each
//! file gets a slow first version and, while it is still being embedded, a fast second one;
//! whichever replica pulls the second version must wait for the first, so every file ends on
//! its second version. Without the shared leases a replica writes the second version while
//! the other is still embedding the first, and the first, finishing last, overwrites it.
//! Real NATS, FalkorDB and qdrant-edge (one index per replica).
use std::sync::Arc;
use std::time::{Duration, Instant};

use kg_embed::HashingEmbedder;
use kg_indexer::{IndexerConfig, Vectors};
use kg_proto::v1::{FileChangeOp, FileChanged};
use kg_stores::blobs::BlobStore;
use kg_stores::events;
use kg_stores::graph::{GraphStore, Params};
use kg_stores::vector::EdgeIndex;
use prost::Message as _;
use tokio_util::sync::CancellationToken;

use crate::stores::SlowOn;

const NS: &str = "replicas";
const FILES: usize = 6;
const SLOW: Duration = Duration::from_millis(1500);

async fn upload(
    js: &async_nats::jetstream::Context,
    blobs: &BlobStore,
    file: usize,
    version: u32,
    text: &str,
) {
    let file_id = format!("f{file}");
    let event = FileChanged {
        namespace: NS.into(),
        file_id: file_id.clone(),
        version_id: format!("{file_id}-v{version}"),
        path: format!("docs/{file_id}.md"),
        mime: "text/markdown".into(),
        blob_key: blobs.put(text.as_bytes()).await.unwrap(),
        op: FileChangeOp::Upsert as i32,
        enabled: true,
        changed_at_ms: 1_000 * i64::from(version),
        ..Default::default()
    };
    let subject = events::files_changed_subject(NS).unwrap();
    // The message id deduplicates: one per version.
    events::publish(js, &subject, &event.version_id, event.encode_to_vec())
        .await
        .unwrap();
}

async fn replica(
    dir: &std::path::Path,
    name: &str,
    graph: &GraphStore,
    blobs: &BlobStore,
    js: &async_nats::jetstream::Context,
    stop: &CancellationToken,
) -> tokio::task::JoinHandle<Result<(), kg_indexer::IndexerError>> {
    let index = EdgeIndex::open(dir.join(name), 16).await.unwrap();
    let embedder = Arc::new(SlowOn {
        marker: "firstversion",
        delay: SLOW,
        inner: HashingEmbedder::new(16),
    });
    let config = IndexerConfig {
        concurrency: 2,
        vectors: Some(Vectors::new(index.into(), embedder).unwrap()),
        ..IndexerConfig::default()
    };
    tokio::spawn(kg_indexer::run(
        config,
        graph.clone(),
        blobs.clone(),
        js.clone(),
        stop.clone(),
    ))
}

/// Each file's version and the text of its chunks.
async fn files(graph: &GraphStore) -> Vec<(String, String)> {
    let rows = graph
        .query(
            NS,
            "MATCH (f:FileRef) OPTIONAL MATCH (c:Chunk {fileId: f.fileId}) \
             RETURN f.fileId, f.versionId, collect(c.text) ORDER BY f.fileId",
            &Params::new(),
        )
        .await
        .map(|r| r.rows)
        .unwrap_or_default();
    rows.into_iter()
        .map(|row| {
            let version = row[1].as_str().unwrap_or_default().to_owned();
            (version, row[2].to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_apply_each_files_versions_in_order() {
    let stores = crate::stores::start().await;
    let (graph, js, blobs) = (
        stores.graph.clone(),
        stores.js.clone(),
        stores.blobs.clone(),
    );
    let dir = &stores.dir;
    let stop = CancellationToken::new();
    let first = replica(dir.path(), "a", &graph, &blobs, &js, &stop).await;
    let second = replica(dir.path(), "b", &graph, &blobs, &js, &stop).await;

    for file in 0..FILES {
        let v1 = format!("# File {file}\n\nThe firstversion text of file {file}.\n");
        upload(&js, &blobs, file, 1, &v1).await;
        // The first version is being embedded (slowly) by one replica when the second lands.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let v2 = format!("# File {file}\n\nThe secondversion text of file {file}.\n");
        upload(&js, &blobs, file, 2, &v2).await;
    }

    let stream = js.get_stream(events::FILES_STREAM).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let info = stream.consumer_info("indexer").await.unwrap();
        if info.num_ack_pending == 0
            && info.num_pending == 0
            && info.ack_floor.stream_sequence == 2 * FILES as u64
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not every event was settled: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A first version still being embedded somewhere would land within SLOW.
    tokio::time::sleep(SLOW * 2).await;
    let indexed = files(&graph).await;
    stop.cancel();
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();

    assert_eq!(indexed.len(), FILES, "{indexed:?}");
    for (file, (version, texts)) in indexed.iter().enumerate() {
        assert_eq!(version, &format!("f{file}-v2"), "file {file}: {texts}");
        assert!(texts.contains("secondversion"), "file {file}: {texts}");
        assert!(!texts.contains("firstversion"), "file {file}: {texts}");
    }
}

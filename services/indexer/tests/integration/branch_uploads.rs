//! A preview-branch upload event: the indexer reports the version's metadata and ordered
//! links in `FileIndexed` (what the files service stores per version id) and writes nothing
//! to the graph, which holds main. Real NATS and FalkorDB.
use std::time::Duration;

use async_nats::jetstream::consumer;
use futures::StreamExt as _;
use kg_indexer::IndexerConfig;
use kg_proto::v1::{FileChangeOp, FileChanged, FileIndexed, FileStatus, VersionLinkKind};
use kg_stores::events;
use kg_stores::graph::Params;
use prost::Message as _;
use tokio_util::sync::CancellationToken;

const NS: &str = "branchy";
const DOC: &str = "---\ntitle: Preview Guide\ntags: [preview, draft]\ndate: 2026-11-01\n---\n# Preview\n\nSee the [setup](../setup.md#install) page and [the site](https://example.com/docs).\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_upload_yields_metadata_and_links_but_no_graph_writes() {
    let stores = crate::stores::start().await;
    let (graph, js, blobs) = (
        stores.graph.clone(),
        stores.js.clone(),
        stores.blobs.clone(),
    );

    let stop = CancellationToken::new();
    let worker = tokio::spawn(kg_indexer::run(
        IndexerConfig::default(),
        graph.clone(),
        blobs.clone(),
        js.clone(),
        stop.clone(),
    ));

    let event = FileChanged {
        namespace: NS.into(),
        file_id: "file-b".into(),
        version_id: "file-b-v-branch".into(),
        path: "guides/preview.md".into(),
        mime: "text/markdown".into(),
        blob_key: blobs.put(DOC.as_bytes()).await.unwrap(),
        op: FileChangeOp::Upsert as i32,
        enabled: true,
        changed_at_ms: 1_000,
        ..Default::default()
    };
    let subject = kg_indexer::branch::branch_subject(NS).unwrap();
    assert_eq!(subject, "kg.files.v1.branchy.branch");
    assert!(kg_indexer::branch::branch_subject("bad ns!").is_err());
    events::publish(&js, &subject, "b1", event.encode_to_vec())
        .await
        .unwrap();

    // Read the indexed event as the files service does.
    let stream = js.get_stream(events::INDEX_STREAM).await.unwrap();
    let reader = stream
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: events::indexed_subject(NS).unwrap(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut messages = reader.messages().await.unwrap();
    let message = tokio::time::timeout(Duration::from_secs(30), messages.next())
        .await
        .expect("an indexed event for the branch upload")
        .unwrap()
        .unwrap();
    let indexed = FileIndexed::decode(message.payload.as_ref()).unwrap();
    assert_eq!(indexed.version_id, "file-b-v-branch");
    assert_eq!(indexed.file_id, "file-b");
    assert_eq!(indexed.status, FileStatus::Indexed as i32);
    assert_eq!(indexed.chunk_count, 1);
    let meta = indexed.meta.unwrap();
    assert_eq!(meta.title, "Preview Guide");
    assert_eq!(meta.tags, ["preview", "draft"]);
    assert_eq!(meta.document_date, "2026-11-01");
    assert_eq!(meta.source_path, "guides/preview.md");
    let links: Vec<(i32, &str)> = indexed
        .links
        .iter()
        .map(|l| (l.kind, l.target_path.as_str()))
        .collect();
    assert_eq!(
        links,
        [
            (VersionLinkKind::Internal as i32, "setup.md"),
            (VersionLinkKind::External as i32, "https://example.com/docs"),
        ]
    );

    // Main's graph is untouched: no file, no chunk of the branch version.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let count = |cypher: &'static str| {
        let graph = graph.clone();
        async move {
            graph
                .query(NS, cypher, &Params::new())
                .await
                .map(|r| r.rows[0][0].as_i64().unwrap())
                .unwrap_or(0)
        }
    };
    assert_eq!(count("MATCH (f:FileRef) RETURN count(f)").await, 0);
    assert_eq!(count("MATCH (c:Chunk) RETURN count(c)").await, 0);

    stop.cancel();
    worker.await.unwrap().unwrap();
}

//! Re-indexing under new settings. Turning embeddings on over a namespace indexed without them:
//! on start the worker re-queues the current versions that lack vectors, writes them once, and
//! a second start embeds nothing. A re-queued (older) upsert never replaces a newer version.
//! Publishing a TBox re-extracts the entities of files indexed before it, at once or at the
//! next start, without embedding again. Real NATS, FalkorDB and qdrant-edge; a counting
//! wrapper around the test embedder.
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kg_embed::{EmbedError, Embedder, HashingEmbedder};
use kg_indexer::{IndexerConfig, Vectors};
use kg_proto::v1::{AccessFilter, FileChangeOp, FileChanged, Permission};
use kg_stores::blobs::BlobStore;
use kg_stores::events;
use kg_stores::graph::{GraphStore, Params};
use kg_stores::vector::{EdgeIndex, Scope};
use prost::Message as _;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub(crate) const NS: &str = "backfill";

#[derive(Debug)]
pub(crate) struct Counting {
    pub(crate) inner: HashingEmbedder,
    pub(crate) texts: AtomicUsize,
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

/// A qdrant-edge index under `dir` fed by a counting 16-dimension test embedder.
pub(crate) async fn counting_vectors(dir: &std::path::Path) -> (Arc<Counting>, Vectors) {
    let embedder = Arc::new(Counting {
        inner: HashingEmbedder::new(16),
        texts: AtomicUsize::new(0),
    });
    let index = EdgeIndex::open(dir.join("vectors"), 16).await.unwrap();
    let vectors = Vectors::new(index.into(), embedder.clone()).unwrap();
    (embedder, vectors)
}

pub(crate) fn everything() -> AccessFilter {
    AccessFilter {
        namespace: NS.into(),
        allow_prefixes: vec![String::new()],
        permission: Permission::Admin as i32,
        ..Default::default()
    }
}

pub(crate) async fn upload(
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

pub(crate) async fn file_refs(graph: &GraphStore) -> Vec<Vec<Value>> {
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

/// Starts an indexer; its stop token and its task.
pub(crate) fn spawn_indexer(
    config: IndexerConfig,
    graph: &GraphStore,
    blobs: &BlobStore,
    js: &async_nats::jetstream::Context,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<Result<(), kg_indexer::IndexerError>>,
) {
    let stop = CancellationToken::new();
    let task = tokio::spawn(kg_indexer::run(
        config,
        graph.clone(),
        blobs.clone(),
        js.clone(),
        stop.clone(),
    ));
    (stop, task)
}

pub(crate) async fn wait_for(what: &str, mut check: impl AsyncFnMut() -> bool) {
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
    let (stop, plain) = spawn_indexer(IndexerConfig::default(), &graph, &blobs, &js);
    wait_for("plain indexing", async || {
        let refs = file_refs(&graph).await;
        refs.len() == 2 && refs[0][1] == json!("f1-v2") && refs[1][1] == json!("f2-v1")
    })
    .await;
    stop.cancel();
    plain.await.unwrap().unwrap();
    assert!(file_refs(&graph).await.iter().all(|r| r[2].is_null()));

    // Embeddings on: the start re-queues both current versions and writes their vectors.
    let (embedder, vectors) = counting_vectors(dir.path()).await;
    let config = IndexerConfig {
        vectors: Some(vectors.clone()),
        ..IndexerConfig::default()
    };
    let (stop, with_vectors) = spawn_indexer(config.clone(), &graph, &blobs, &js);
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
    let tboxes = kg_stores::tbox::TboxBucket::open(&js).await.unwrap();
    assert_eq!(
        kg_indexer::backfill::requeue_stale(&graph, &js, Some(&vectors), &tboxes, Some(NS))
            .await
            .unwrap(),
        kg_indexer::backfill::Requeued::default()
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
    let (stop, again) = spawn_indexer(config, &graph, &blobs, &js);
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.cancel();
    again.await.unwrap().unwrap();
    assert_eq!(embedder.texts.load(Ordering::SeqCst), embedded);
}

/// Indexes `f1` (one version) without embeddings, then turns embeddings on after `between` ran
/// on the stopped namespace, and waits for f1's vectors. Returns the vectors' stamp on f1.
pub(crate) async fn backfill_after(
    between: impl AsyncFnOnce(&GraphStore, &async_nats::jetstream::Context),
) -> Value {
    let stores = crate::stores::start().await;
    let (graph, js, blobs) = (
        stores.graph.clone(),
        stores.js.clone(),
        stores.blobs.clone(),
    );
    let text = "# One\n\nIndexed before embeddings were on.\n";
    upload(&js, &blobs, "f1", "f1-v1", text, 1_000, "a").await;
    let blob_key = json!(blobs.put(text.as_bytes()).await.unwrap());
    let blob_fields = "MATCH (f:FileRef {fileId: 'f1'}) \
                       RETURN f.versionId, f.blobKey, f.contentSha256, f.size";
    let read = async || {
        graph
            .query(NS, blob_fields, &Params::new())
            .await
            .map(|r| r.rows)
            .unwrap_or_default()
    };
    // The version's id is on the FileRef before its content's key: the key comes with the
    // version's last stamps, once everything is written.
    let (stop, plain) = spawn_indexer(IndexerConfig::default(), &graph, &blobs, &js);
    wait_for("plain indexing", async || {
        read()
            .await
            .first()
            .is_some_and(|r| r[0] == json!("f1-v1") && !r[1].is_null())
    })
    .await;
    stop.cancel();
    plain.await.unwrap().unwrap();
    let written = read().await;
    assert_eq!(
        written[0][1], blob_key,
        "the FileRef records where its version's content is"
    );
    between(&graph, &js).await;

    let (_, vectors) = counting_vectors(stores.dir.path()).await;
    let config = IndexerConfig {
        vectors: Some(vectors.clone()),
        ..IndexerConfig::default()
    };
    let (stop, with_vectors) = spawn_indexer(config, &graph, &blobs, &js);
    wait_for("the backfill", async || {
        file_refs(&graph)
            .await
            .first()
            .is_some_and(|r| !r[2].is_null())
    })
    .await;
    stop.cancel();
    with_vectors.await.unwrap().unwrap();
    assert!(
        vectors
            .index
            .file_vector(&everything(), "f1")
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(read().await, written, "and records it again once written");
    file_refs(&graph).await[0][2].clone()
}

/// The backfill builds its upserts from the graph: it needs none of the stream's history, so
/// change events can expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backfill_needs_no_change_event_history() {
    let stamp = backfill_after(async |_, js| {
        let stream = js.get_stream(events::FILES_STREAM).await.unwrap();
        stream.purge().await.unwrap();
    })
    .await;
    assert_eq!(stamp, json!("f1-v1|test-hashing|16"));
}

/// A FileRef written before FileRefs recorded their content is re-queued from the stream's
/// latest upsert of the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_ref_from_an_earlier_release_is_requeued_from_the_stream() {
    let stamp = backfill_after(async |graph, _| {
        // One property a statement: FalkorDB 4.16 removes only one of several set to null.
        for property in ["blobKey", "contentSha256", "size"] {
            let cypher = format!("MATCH (f:FileRef {{fileId: 'f1'}}) SET f.{property} = NULL");
            graph.query(NS, &cypher, &Params::new()).await.unwrap();
        }
        let left = "MATCH (f:FileRef {fileId: 'f1'}) RETURN f.blobKey, f.contentSha256, f.size";
        let rows = graph.query(NS, left, &Params::new()).await.unwrap().rows;
        assert_eq!(
            rows,
            vec![vec![Value::Null; 3]],
            "as an earlier release wrote it"
        );
    })
    .await;
    assert_eq!(stamp, json!("f1-v1|test-hashing|16"));
}

/// A change of `file_id` (v1) other than an upload, as the files service publishes it.
async fn change(
    js: &async_nats::jetstream::Context,
    file_id: &str,
    op: FileChangeOp,
    hidden: bool,
) {
    let event = FileChanged {
        namespace: NS.into(),
        file_id: file_id.into(),
        version_id: format!("{file_id}-v1"),
        path: format!("docs/{file_id}.md"),
        mime: "text/markdown".into(),
        op: op as i32,
        enabled: true,
        hidden,
        changed_at_ms: 2_000,
        ..Default::default()
    };
    events::publish_file_change(js, &event, &format!("{file_id}:{op:?}"))
        .await
        .unwrap();
}

/// The backfill scans the stream, then re-queues what it found. A file deleted or hidden in
/// between stays as that newest change left it: a re-queued event re-indexes only the version
/// the graph holds, with the graph's flags. The stale events are published here by hand, as a
/// scan taken just before the delete and the hide would have made them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeued_upsert_indexes_only_what_the_graph_holds_now() {
    let stores = crate::stores::start().await;
    let (graph, js, blobs) = (
        stores.graph.clone(),
        stores.js.clone(),
        stores.blobs.clone(),
    );
    let gone_text = "# Gone\n\nDeleted after the scan.\n";
    let veiled_text = "# Veiled\n\nHidden after the scan.\n";
    upload(&js, &blobs, "gone", "gone-v1", gone_text, 1_000, "g").await;
    upload(&js, &blobs, "veiled", "veiled-v1", veiled_text, 1_000, "v").await;

    // Indexed without embeddings, then the delete and the hide apply.
    let (stop, plain) = spawn_indexer(IndexerConfig::default(), &graph, &blobs, &js);
    wait_for("plain indexing", async || {
        file_refs(&graph).await.len() == 2
    })
    .await;
    change(&js, "gone", FileChangeOp::Delete, false).await;
    change(&js, "veiled", FileChangeOp::Flags, true).await;
    wait_for("the delete and the hide", async || {
        let hidden = graph
            .query(
                NS,
                "MATCH (f:FileRef {fileId: 'veiled'}) RETURN f.hidden",
                &Params::new(),
            )
            .await
            .map(|r| r.rows)
            .unwrap_or_default();
        file_refs(&graph).await.len() == 1 && hidden.first().is_some_and(|r| r[0] == json!(true))
    })
    .await;
    stop.cancel();
    plain.await.unwrap().unwrap();

    // What a scan from before them re-queues: both files, shown.
    let subject = events::files_changed_subject(NS).unwrap();
    for (file_id, text) in [("gone", gone_text), ("veiled", veiled_text)] {
        let stale = FileChanged {
            namespace: NS.into(),
            file_id: file_id.into(),
            version_id: format!("{file_id}-v1"),
            path: format!("docs/{file_id}.md"),
            mime: "text/markdown".into(),
            blob_key: blobs.put(text.as_bytes()).await.unwrap(),
            op: FileChangeOp::Upsert as i32,
            enabled: true,
            hidden: false,
            changed_at_ms: 1_000,
            requeued: true,
            ..Default::default()
        };
        events::publish(
            &js,
            &subject,
            &format!("{file_id}:stale"),
            stale.encode_to_vec(),
        )
        .await
        .unwrap();
    }

    let index = EdgeIndex::open(stores.dir.path().join("vectors"), 16)
        .await
        .unwrap();
    let vectors = Vectors::new(index.into(), Arc::new(HashingEmbedder::new(16))).unwrap();
    let config = IndexerConfig {
        vectors: Some(vectors.clone()),
        ..IndexerConfig::default()
    };
    let (stop, with_vectors) = spawn_indexer(config, &graph, &blobs, &js);
    wait_for("veiled embedded and every event settled", async || {
        let refs = file_refs(&graph).await;
        let settled = js
            .get_stream(events::FILES_STREAM)
            .await
            .unwrap()
            .consumer_info("indexer")
            .await
            .is_ok_and(|info| info.num_pending == 0 && info.num_ack_pending == 0);
        settled
            && refs
                .iter()
                .any(|r| r[0] == json!("veiled") && !r[2].is_null())
    })
    .await;
    stop.cancel();
    with_vectors.await.unwrap().unwrap();

    let refs = file_refs(&graph).await;
    assert_eq!(refs.len(), 1, "the deleted file came back: {refs:?}");
    assert_eq!(refs[0][0], json!("veiled"));
    let count = |prefix: &str, visible_only: bool| {
        let filter = AccessFilter {
            allow_prefixes: vec![prefix.to_owned()],
            visible_only,
            ..everything()
        };
        let index = vectors.index.clone();
        async move { index.count(&filter, &Scope::chunks()).await.unwrap() }
    };
    assert_eq!(
        count("docs/gone.md", false).await,
        0,
        "the deleted file's vectors came back"
    );
    assert!(
        count("docs/veiled.md", false).await > 0,
        "veiled was embedded"
    );
    assert_eq!(
        count("docs/veiled.md", true).await,
        0,
        "the hidden file was embedded as shown"
    );
}

/// A TBox with one `Organization` type whose instances are `names`.
pub(crate) fn organizations(version: i64, names: &[&str]) -> kg_proto::v1::Tbox {
    kg_proto::v1::Tbox {
        namespace: NS.into(),
        version,
        entity_types: vec![kg_proto::v1::EntityType {
            type_id: "Organization".into(),
            label: "Organization".into(),
            side: "published".into(),
            instances: names
                .iter()
                .map(|name| kg_proto::v1::EntityInstance {
                    name: (*name).into(),
                    aliases: Vec::new(),
                })
                .collect(),
            ..Default::default()
        }],
        relation_types: Vec::new(),
        published_at_ms: 1_700_000_000_000 + version,
    }
}

/// The names of the entities some chunk mentions, sorted.
pub(crate) async fn mentioned(graph: &GraphStore) -> Vec<String> {
    let rows = graph
        .query(
            NS,
            "MATCH (:Chunk)-[:MENTIONS]->(e:Entity) RETURN DISTINCT e.name ORDER BY e.name",
            &Params::new(),
        )
        .await
        .map(|r| r.rows)
        .unwrap_or_default();
    rows.iter()
        .filter_map(|r| r.first().and_then(Value::as_str).map(str::to_owned))
        .collect()
}

/// Files indexed before a TBox was published get its entities without a re-upload: a publish
/// re-indexes the namespace's files while the indexer runs, and a publish it did not see is
/// caught up at its next start. Neither embeds anything again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_tbox_reaches_the_files_indexed_before_it() {
    let stores = crate::stores::start().await;
    let (graph, js, blobs) = (
        stores.graph.clone(),
        stores.js.clone(),
        stores.blobs.clone(),
    );
    let deals = "# Deals\n\nAcme acquired Globex last spring.\n";
    upload(&js, &blobs, "deals", "deals-v1", deals, 1_000, "d").await;
    upload(
        &js,
        &blobs,
        "notes",
        "notes-v1",
        "# Notes\n\nNothing here.\n",
        1_000,
        "n",
    )
    .await;
    let (embedder, vectors) = counting_vectors(stores.dir.path()).await;
    let config = IndexerConfig {
        vectors: Some(vectors),
        ..IndexerConfig::default()
    };
    let (stop, indexer) = spawn_indexer(config.clone(), &graph, &blobs, &js);
    wait_for("both files embedded", async || {
        let refs = file_refs(&graph).await;
        refs.len() == 2 && refs.iter().all(|r| !r[2].is_null())
    })
    .await;
    assert!(mentioned(&graph).await.is_empty());
    let embedded = embedder.texts.load(Ordering::SeqCst);

    let tboxes = kg_stores::tbox::TboxBucket::open(&js).await.unwrap();
    tboxes.put(&organizations(1, &["Acme"])).await.unwrap();
    wait_for("Acme mentioned after the first publish", async || {
        mentioned(&graph).await == ["Acme"]
    })
    .await;
    tboxes.put(&organizations(2, &["Globex"])).await.unwrap();
    wait_for("Globex instead after the second", async || {
        mentioned(&graph).await == ["Globex"]
    })
    .await;
    let stamp = graph
        .query(
            NS,
            "MATCH (f:FileRef {fileId: 'deals'}) RETURN f.entityStamp",
            &Params::new(),
        )
        .await
        .unwrap()
        .rows;
    assert_eq!(
        stamp[0][0],
        json!("deals-v1|2@1700000000002|docs/deals.md"),
        "the entities are stamped with the TBox they come from"
    );
    stop.cancel();
    indexer.await.unwrap().unwrap();

    // Published while no indexer ran: the next start catches up.
    tboxes
        .put(&organizations(3, &["Acme", "Globex"]))
        .await
        .unwrap();
    let (stop, indexer) = spawn_indexer(config, &graph, &blobs, &js);
    wait_for("both mentioned after a start", async || {
        mentioned(&graph).await == ["Acme", "Globex"]
    })
    .await;
    stop.cancel();
    indexer.await.unwrap().unwrap();
    assert_eq!(
        embedder.texts.load(Ordering::SeqCst),
        embedded,
        "re-extracting entities embedded text again"
    );
}

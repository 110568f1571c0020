//! Deletes and flag changes do not wait behind an ingest backlog. The files service publishes
//! them on `changed` (in order with the file's other changes) and again on `removed` or
//! `flags`, which consumers of their own take at once: the file leaves the graph and the
//! vector lane, or is hidden there, while the backlog is still being embedded. An older
//! upload of a deleted file queued behind the backlog does not bring it back; one of a hidden
//! file is written hidden, and the in-order copy of an older flags change does not undo a
//! newer one. Real NATS, FalkorDB and qdrant-edge.
use std::sync::Arc;
use std::time::{Duration, Instant};

use kg_embed::HashingEmbedder;
use kg_indexer::{IndexerConfig, Vectors};
use kg_proto::v1::{AccessFilter, FileChangeOp, FileChanged, FileIndexed};
use kg_stores::blobs::BlobStore;
use kg_stores::events;
use kg_stores::graph::{GraphStore, Params};
use kg_stores::vector::{EdgeIndex, Scope};
use prost::Message as _;
use tokio_util::sync::CancellationToken;

use crate::stores::SlowOn;

const NS: &str = "removals";
const BACKLOG: usize = 6;
const SLOW: Duration = Duration::from_millis(1500);

/// Publishes `file_id`'s change as the files service does; `text` None is a delete.
async fn change(
    js: &async_nats::jetstream::Context,
    blobs: &BlobStore,
    file_id: &str,
    version: i64,
    text: Option<&str>,
) {
    let event = match text {
        Some(text) => FileChanged {
            blob_key: blobs.put(text.as_bytes()).await.unwrap(),
            ..event(file_id, version, FileChangeOp::Upsert)
        },
        None => event(file_id, version, FileChangeOp::Delete),
    };
    publish(js, event).await;
}

/// Hides or shows `file_id`, whose newest version is `version`, as its `flags_version`th
/// flags change.
async fn set_hidden(
    js: &async_nats::jetstream::Context,
    file_id: &str,
    version: i64,
    hidden: bool,
    flags_version: i64,
) {
    let event = FileChanged {
        hidden,
        flags_version,
        ..event(file_id, version, FileChangeOp::Flags)
    };
    publish(js, event).await;
}

/// A change `op` of `file_id` at `version`, enabled and shown.
fn event(file_id: &str, version: i64, op: FileChangeOp) -> FileChanged {
    FileChanged {
        namespace: NS.into(),
        file_id: file_id.into(),
        version_id: format!("{file_id}-v{version}"),
        path: format!("docs/{file_id}.md"),
        mime: "text/markdown".into(),
        op: op as i32,
        enabled: true,
        changed_at_ms: kg_common::caller::now_ms(),
        ..Default::default()
    }
}

async fn publish(js: &async_nats::jetstream::Context, event: FileChanged) {
    // One id per change (as the files service does).
    let msg_id = match event.op() {
        FileChangeOp::Upsert => format!("{}:upsert:{}", event.version_id, event.changed_at_ms),
        FileChangeOp::Flags => format!("{}:flags:v{}", event.file_id, event.flags_version),
        _ => format!("{}:delete:{}", event.version_id, event.changed_at_ms),
    };
    events::publish_file_change(js, &event, &msg_id)
        .await
        .unwrap();
}

/// The file's chunks in the graph.
async fn chunks(graph: &GraphStore, file_id: &str) -> usize {
    let mut params = Params::new();
    params.insert("fileId".into(), file_id.into());
    let rows = graph
        .query(
            NS,
            "MATCH (c:Chunk {fileId: $fileId}) RETURN count(c)",
            &params,
        )
        .await
        .map(|r| r.rows)
        .unwrap_or_default();
    rows.first()
        .and_then(|row| row.first())
        .and_then(serde_json::Value::as_u64)
        .map_or(0, |n| n as usize)
}

/// The secret's chunk points in the vector lane.
async fn secret_points(index: &EdgeIndex) -> u64 {
    let only_the_secret = AccessFilter {
        namespace: NS.into(),
        allow_prefixes: vec!["docs/secret.md".into()],
        ..Default::default()
    };
    index
        .count(&only_the_secret, &Scope::chunks())
        .await
        .unwrap()
}

/// Points of `file_id` a reader who may not see hidden files finds in the vector lane.
async fn visible_points(index: &EdgeIndex, file_id: &str) -> u64 {
    let reader = AccessFilter {
        namespace: NS.into(),
        allow_prefixes: vec![format!("docs/{file_id}.md")],
        visible_only: true,
        ..Default::default()
    };
    index.count(&reader, &Scope::chunks()).await.unwrap()
}

/// The version the graph holds for `file_id`, and how many of its chunks are (hidden, shown).
async fn graph_view(graph: &GraphStore, file_id: &str) -> (Option<String>, u64, u64) {
    let mut params = Params::new();
    params.insert("fileId".into(), file_id.into());
    let rows = graph
        .query(
            NS,
            "MATCH (f:FileRef {fileId: $fileId}) OPTIONAL MATCH (c:Chunk {fileId: $fileId}) \
             RETURN f.versionId, count(CASE WHEN c.hidden THEN 1 END), \
                    count(CASE WHEN NOT c.hidden THEN 1 END)",
            &params,
        )
        .await
        .unwrap()
        .rows;
    let Some(row) = rows.first() else {
        return (None, 0, 0);
    };
    let count = |i: usize| row.get(i).and_then(serde_json::Value::as_u64).unwrap_or(0);
    (
        row.first()
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned),
        count(1),
        count(2),
    )
}

/// Uploads the secret's first version and waits until readers find it in the vector lane.
async fn index_the_secret(
    js: &async_nats::jetstream::Context,
    blobs: &BlobStore,
    index: &EdgeIndex,
) {
    let text = "# Keys\n\nThe leaked key is abc123.\n";
    change(js, blobs, "secret", 1, Some(text)).await;
    wait_for("the secret indexed", Duration::from_secs(30), async || {
        visible_points(index, "secret").await > 0
    })
    .await;
}

/// The versions the indexer reported written, in order.
async fn indexed_versions(js: &async_nats::jetstream::Context) -> Vec<String> {
    let subject = events::indexed_subject(NS).unwrap();
    crate::stores::payloads_on(js, events::INDEX_STREAM, &subject)
        .await
        .iter()
        .map(|payload| FileIndexed::decode(payload.as_slice()).unwrap().version_id)
        .collect()
}

/// Events the main consumer has not settled yet.
async fn unsettled(js: &async_nats::jetstream::Context) -> u64 {
    unsettled_on(js, "indexer").await
}

/// Events `durable` has not settled yet.
async fn unsettled_on(js: &async_nats::jetstream::Context, durable: &str) -> u64 {
    let stream = js.get_stream(events::FILES_STREAM).await.unwrap();
    let info = stream.consumer_info(durable).await.unwrap();
    info.num_pending + info.num_ack_pending as u64
}

async fn wait_for(what: &str, within: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done().await {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One indexer, one file at a time, embedding the backlog's files slowly; its vector index,
/// its stop token and its task.
async fn start_indexer(
    stores: &crate::stores::Stores,
) -> (
    EdgeIndex,
    CancellationToken,
    tokio::task::JoinHandle<Result<(), kg_indexer::IndexerError>>,
) {
    let index = EdgeIndex::open(stores.dir.path().join("vectors"), 16)
        .await
        .unwrap();
    let embedder = Arc::new(SlowOn {
        marker: "backlogtext",
        delay: SLOW,
        inner: HashingEmbedder::new(16),
    });
    let config = IndexerConfig {
        concurrency: 1,
        vectors: Some(Vectors::new(index.clone().into(), embedder).unwrap()),
        ..IndexerConfig::default()
    };
    let (stop, worker) = crate::stores::spawn_indexer(stores, config);
    (index, stop, worker)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delete_does_not_wait_behind_the_ingest_backlog() {
    let stores = crate::stores::start().await;
    let (graph, js, blobs) = (&stores.graph, &stores.js, &stores.blobs);
    let (index, stop, worker) = start_indexer(&stores).await;

    change(
        js,
        blobs,
        "secret",
        1,
        Some("# Keys\n\nThe leaked key is abc123.\n"),
    )
    .await;
    wait_for("the secret indexed", Duration::from_secs(30), async || {
        chunks(graph, "secret").await > 0
    })
    .await;
    assert!(secret_points(&index).await > 0);

    // A backlog of slow files, then an upload of the secret queued behind it, then its delete.
    for file in 0..BACKLOG {
        let text = format!("# File {file}\n\nThe backlogtext of file {file}.\n");
        change(js, blobs, &format!("b{file}"), 1, Some(&text)).await;
    }
    change(
        js,
        blobs,
        "secret",
        2,
        Some("# Keys\n\nThe new key is def456.\n"),
    )
    .await;
    let deleted_at = Instant::now();
    change(js, blobs, "secret", 3, None).await;

    wait_for("the secret removed", SLOW * 2, async || {
        chunks(graph, "secret").await == 0
    })
    .await;
    let took = deleted_at.elapsed();
    assert_eq!(secret_points(&index).await, 0);
    let behind = unsettled(js).await;
    assert!(
        behind >= 2,
        "removed in {took:?} with {behind} events still queued: it must not have waited for them"
    );

    // The backlog drains; the older upload of the secret does not bring it back.
    wait_for(
        "the backlog settled",
        SLOW * (BACKLOG as u32 + 10),
        async || unsettled(js).await == 0,
    )
    .await;
    for file in 0..BACKLOG {
        assert!(chunks(graph, &format!("b{file}")).await > 0, "b{file}");
    }
    assert_eq!(
        chunks(graph, "secret").await,
        0,
        "an older upload resurrected it"
    );
    assert_eq!(secret_points(&index).await, 0);
    // Not even for a moment: the upload older than the removal was skipped, not written and
    // then deleted again by the delete behind it.
    let indexed = indexed_versions(js).await;
    assert!(indexed.contains(&"secret-v1".to_owned()), "{indexed:?}");
    assert!(!indexed.contains(&"secret-v2".to_owned()), "{indexed:?}");

    // Uploaded again after the delete, it is indexed as any new version.
    change(
        js,
        blobs,
        "secret",
        4,
        Some("# Keys\n\nRotated; nothing here.\n"),
    )
    .await;
    wait_for(
        "the new upload indexed",
        Duration::from_secs(30),
        async || chunks(graph, "secret").await > 0,
    )
    .await;
    stop.cancel();
    worker.await.unwrap().unwrap();
}

/// Hiding a file takes effect while a backlog is still queued, and nothing queued before the
/// change shows it again: not an upload of it (written hidden), not the in-order copy of an
/// older flags change. Checked at every step of the drain, not only at its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hiding_a_file_does_not_wait_behind_the_ingest_backlog() {
    let stores = crate::stores::start().await;
    let (graph, js, blobs) = (&stores.graph, &stores.js, &stores.blobs);
    let (index, stop, worker) = start_indexer(&stores).await;
    let backlog = async |from: usize, files: usize| {
        for file in from..from + files {
            let text = format!("# File {file}\n\nThe backlogtext of file {file}.\n");
            change(js, blobs, &format!("b{file}"), 1, Some(&text)).await;
        }
    };
    // Never visible while the drain runs: each check of the wait asserts it.
    let drains_hidden = async |what: &str| {
        wait_for(what, SLOW * (BACKLOG as u32 + 10), async || {
            let (_, _, shown) = graph_view(graph, "secret").await;
            assert_eq!(
                shown, 0,
                "{what}: a hidden file's chunks were shown in the graph"
            );
            assert_eq!(
                visible_points(&index, "secret").await,
                0,
                "{what}: shown in the vector lane"
            );
            unsettled(js).await == 0
        })
        .await;
    };

    index_the_secret(js, blobs, &index).await;

    // A new upload of the secret queued between two halves of a backlog, then it is hidden.
    backlog(0, 2).await;
    change(
        js,
        blobs,
        "secret",
        2,
        Some("# Keys\n\nThe new key is def456.\n"),
    )
    .await;
    backlog(2, BACKLOG - 2).await;
    let hidden_at = Instant::now();
    set_hidden(js, "secret", 2, true, 1).await;
    wait_for("the secret hidden", SLOW * 2, async || {
        let (_, hidden, shown) = graph_view(graph, "secret").await;
        hidden > 0 && shown == 0 && visible_points(&index, "secret").await == 0
    })
    .await;
    let took = hidden_at.elapsed();
    let behind = unsettled(js).await;
    assert!(
        behind >= 2,
        "hidden in {took:?} with {behind} events still queued: it must not have waited for them"
    );
    // The upload behind the first half is written hidden, and stays so through the second.
    drains_hidden("the first drain").await;
    let (version, hidden, _) = graph_view(graph, "secret").await;
    assert_eq!(version.as_deref(), Some("secret-v2"));
    assert!(hidden > 0);
    assert!(indexed_versions(js).await.contains(&"secret-v2".to_owned()));

    // Shown, then hidden again, both at once while a backlog runs: the in-order copy of the
    // show, queued between the two halves, must not show it after the newer hide.
    backlog(10, 2).await;
    set_hidden(js, "secret", 2, false, 2).await;
    wait_for("the secret shown", SLOW * 2, async || {
        visible_points(&index, "secret").await > 0
    })
    .await;
    backlog(12, BACKLOG - 2).await;
    set_hidden(js, "secret", 2, true, 3).await;
    wait_for("the secret hidden again", SLOW * 2, async || {
        visible_points(&index, "secret").await == 0
    })
    .await;
    assert!(
        unsettled(js).await >= 2,
        "the second hide waited for the backlog"
    );
    drains_hidden("the second drain").await;

    stop.cancel();
    worker.await.unwrap().unwrap();
}

/// Two flag changes made at once can reach the stream in the opposite order to the
/// registry's. The one the registry counted later wins, whichever consumer applies which copy
/// first, and an upload that read its flags before it is written with the newer ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flag_changes_published_out_of_order_keep_the_newer_one() {
    let stores = crate::stores::start().await;
    let (graph, js, blobs) = (&stores.graph, &stores.js, &stores.blobs);
    let (index, stop, worker) = start_indexer(&stores).await;
    let settled = async || {
        for durable in ["indexer", "indexer-flags"] {
            if unsettled_on(js, durable).await > 0 {
                return false;
            }
        }
        true
    };
    index_the_secret(js, blobs, &index).await;

    // The registry's second change (hide) is published before its first (show).
    set_hidden(js, "secret", 1, true, 2).await;
    set_hidden(js, "secret", 1, false, 1).await;
    wait_for("both changes settled", Duration::from_secs(30), settled).await;
    let (_, hidden, shown) = graph_view(graph, "secret").await;
    assert!(hidden > 0 && shown == 0, "hidden {hidden}, shown {shown}");
    assert_eq!(visible_points(&index, "secret").await, 0);

    // An upload whose flags were read at the first change, published after both.
    let upload = FileChanged {
        blob_key: blobs
            .put(b"# Keys\n\nThe new key is def456.\n")
            .await
            .unwrap(),
        flags_version: 1,
        ..event("secret", 2, FileChangeOp::Upsert)
    };
    publish(js, upload).await;
    wait_for("the upload indexed", Duration::from_secs(30), async || {
        graph_view(graph, "secret").await.0.as_deref() == Some("secret-v2") && settled().await
    })
    .await;
    let (_, hidden, shown) = graph_view(graph, "secret").await;
    assert!(hidden > 0 && shown == 0, "hidden {hidden}, shown {shown}");
    assert_eq!(visible_points(&index, "secret").await, 0);
    stop.cancel();
    worker.await.unwrap().unwrap();
}

/// The series of `consumer` in the metrics text, if it was exported.
fn pending_events(consumer: &str) -> Option<u64> {
    let prefix = format!("kgmesh_indexer_pending_events{{consumer=\"{consumer}\"}} ");
    kg_common::metrics::encode_text()
        .lines()
        .find_map(|line| line.strip_prefix(&prefix)?.trim().parse().ok())
}

/// Each consumer's backlog is exported as soon as the indexer starts and again as it drains,
/// for an alert on an indexer that falls behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_backlog_of_each_consumer_is_exported() {
    let stores = crate::stores::start().await;
    let (js, blobs) = (&stores.js, &stores.blobs);
    for file in 0..4 {
        let text = format!("# File {file}\n\nThe backlogtext of file {file}.\n");
        change(js, blobs, &format!("b{file}"), 1, Some(&text)).await;
    }
    let (_index, stop, worker) = start_indexer(&stores).await;
    wait_for("the backlog exported", Duration::from_secs(5), async || {
        pending_events("indexer").is_some_and(|n| n >= 2)
    })
    .await;
    wait_for(
        "the removals consumer exported",
        Duration::from_secs(5),
        async || pending_events("indexer-removals") == Some(0),
    )
    .await;
    wait_for(
        "the flags consumer exported",
        Duration::from_secs(5),
        async || pending_events("indexer-flags") == Some(0),
    )
    .await;
    wait_for(
        "the drained backlog exported",
        Duration::from_secs(30),
        async || pending_events("indexer") == Some(0),
    )
    .await;
    stop.cancel();
    worker.await.unwrap().unwrap();
}

//! A deleted namespace's purge: its graph, vectors and flags records go while a backlog of
//! other files is still being embedded, the files service hears it done, an upload of the
//! namespace queued before the purge never brings it back, and one made after it (the
//! namespace created again) is indexed. Another namespace is untouched. Real NATS, FalkorDB
//! and qdrant-edge.
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use kg_common::caller::now_ms;
use kg_embed::HashingEmbedder;
use kg_indexer::{IndexerConfig, Vectors};
use kg_proto::v1::{AccessFilter, FileChangeOp, FileChanged, NamespacePurged};
use kg_stores::events;
use kg_stores::graph::{GraphStore, Params};
use kg_stores::vector::{EdgeIndex, Scope};
use prost::Message as _;
use tokio_util::sync::CancellationToken;

use crate::stores::{SlowOn, Stores};

const DOOMED: &str = "doomed";
const KEPT: &str = "kept";
const SLOW: Duration = Duration::from_millis(1500);
/// Slow files queued before the purge: together longer than its settle time (5 s).
const BACKLOG: u32 = 5;

/// An upsert of `file_id` in `namespace` with `text`, made at `changed_at_ms`.
async fn upsert(stores: &Stores, namespace: &str, file_id: &str, text: &str, changed_at_ms: i64) {
    let event = FileChanged {
        namespace: namespace.into(),
        file_id: file_id.into(),
        version_id: format!("{file_id}-{changed_at_ms}"),
        path: format!("docs/{file_id}.md"),
        mime: "text/markdown".into(),
        op: FileChangeOp::Upsert as i32,
        enabled: true,
        changed_at_ms,
        blob_key: stores.blobs.put(text.as_bytes()).await.unwrap(),
        ..Default::default()
    };
    let msg_id = format!("{}:upsert", event.version_id);
    events::publish_file_change(&stores.js, &event, &msg_id)
        .await
        .unwrap();
}

/// Hides `file_id` of `namespace` (its first flags change).
async fn hide(stores: &Stores, namespace: &str, file_id: &str, version_id: &str) {
    let event = FileChanged {
        namespace: namespace.into(),
        file_id: file_id.into(),
        version_id: version_id.into(),
        path: format!("docs/{file_id}.md"),
        op: FileChangeOp::Flags as i32,
        enabled: true,
        hidden: true,
        flags_version: 1,
        changed_at_ms: now_ms(),
        ..Default::default()
    };
    let msg_id = format!("{file_id}:flags:v1");
    events::publish_file_change(&stores.js, &event, &msg_id)
        .await
        .unwrap();
}

/// The file's chunks in the namespace's graph.
async fn chunks(graph: &GraphStore, namespace: &str, file_id: &str) -> u64 {
    let mut params = Params::new();
    params.insert("fileId".into(), file_id.into());
    graph
        .query(
            namespace,
            "MATCH (c:Chunk {fileId: $fileId}) RETURN count(c)",
            &params,
        )
        .await
        .ok()
        .and_then(|r| r.rows.first()?.first()?.as_u64())
        .unwrap_or(0)
}

/// Chunk points of the namespace in the vector lane.
async fn points(index: &EdgeIndex, namespace: &str) -> u64 {
    let everything = AccessFilter {
        namespace: namespace.into(),
        allow_prefixes: vec![String::new()],
        ..Default::default()
    };
    index.count(&everything, &Scope::chunks()).await.unwrap()
}

/// Entries of the indexer's flags bucket for files of `namespace`.
async fn flags_entries(js: &async_nats::jetstream::Context, namespace: &str) -> usize {
    let bucket = js.get_key_value("kg_indexer_flags").await.unwrap();
    let prefix = hex::encode(format!("{namespace}\u{0}"));
    let keys: Vec<String> = bucket
        .keys()
        .await
        .unwrap()
        .map(Result::unwrap)
        .collect()
        .await;
    keys.iter().filter(|key| key.starts_with(&prefix)).count()
}

/// The purge reports on `KG_INDEX` for `namespace`: the requests they answer.
async fn purge_reports(js: &async_nats::jetstream::Context, namespace: &str) -> Vec<i64> {
    let subject = events::index_purged_subject(namespace).unwrap();
    crate::stores::payloads_on(js, events::INDEX_STREAM, &subject)
        .await
        .iter()
        .map(|payload| {
            NamespacePurged::decode(payload.as_slice())
                .unwrap()
                .requested_at_ms
        })
        .collect()
}

/// Events the main consumer has not settled yet.
async fn unsettled(js: &async_nats::jetstream::Context) -> u64 {
    let stream = js.get_stream(events::FILES_STREAM).await.unwrap();
    let info = stream.consumer_info("indexer").await.unwrap();
    info.num_pending + info.num_ack_pending as u64
}

async fn wait_for(what: &str, within: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done().await {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deleted_namespace_leaves_every_lane_and_its_backlog_stays_out() {
    let stores = crate::stores::start().await;
    let (graph, js) = (&stores.graph, &stores.js);
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
    let stop = CancellationToken::new();
    let worker = tokio::spawn(kg_indexer::run(
        config,
        stores.graph.clone(),
        stores.blobs.clone(),
        stores.js.clone(),
        stop.clone(),
    ));

    let start = now_ms();
    upsert(&stores, DOOMED, "a", "# A\n\nAlpha text.\n", start).await;
    upsert(&stores, DOOMED, "b", "# B\n\nBeta text.\n", start).await;
    upsert(&stores, KEPT, "k", "# K\n\nKept text.\n", start).await;
    wait_for(
        "both namespaces indexed",
        Duration::from_secs(30),
        async || {
            chunks(graph, DOOMED, "a").await > 0
                && chunks(graph, DOOMED, "b").await > 0
                && chunks(graph, KEPT, "k").await > 0
        },
    )
    .await;
    hide(&stores, DOOMED, "a", &format!("a-{start}")).await;
    wait_for("the flags recorded", Duration::from_secs(30), async || {
        flags_entries(js, DOOMED).await == 1
    })
    .await;
    assert!(points(&index, DOOMED).await > 0);

    // A backlog of slow files, then an upload of the doomed namespace behind it, then the
    // namespace's purge. The backlog outlasts the purge's second removal, so only the check
    // of each event against the purge can keep the upload out.
    for file in 0..BACKLOG {
        let text = format!("# File {file}\n\nThe backlogtext of file {file}.\n");
        upsert(&stores, KEPT, &format!("slow{file}"), &text, now_ms()).await;
    }
    upsert(
        &stores,
        DOOMED,
        "c",
        "# C\n\nQueued before the purge.\n",
        now_ms(),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let requested_at_ms = now_ms();
    let purge = NamespacePurged {
        namespace: DOOMED.into(),
        requested_at_ms,
    };
    events::publish(
        js,
        &events::files_purged_subject(DOOMED).unwrap(),
        &format!("purge:{DOOMED}:{requested_at_ms}"),
        purge.encode_to_vec(),
    )
    .await
    .unwrap();

    wait_for("the graph dropped", SLOW * 2, async || {
        !graph.graph_exists(DOOMED).await.unwrap()
    })
    .await;
    assert!(
        unsettled(js).await >= 2,
        "the purge must not wait behind the backlog"
    );
    assert_eq!(points(&index, DOOMED).await, 0);
    assert_eq!(flags_entries(js, DOOMED).await, 0);
    wait_for("the purge reported", Duration::from_secs(30), async || {
        purge_reports(js, DOOMED).await == vec![requested_at_ms]
    })
    .await;

    // The backlog drains; the doomed namespace's queued upload does not bring it back.
    wait_for("the backlog settled", SLOW * (BACKLOG + 5), async || {
        unsettled(js).await == 0
    })
    .await;
    assert!(
        !graph.graph_exists(DOOMED).await.unwrap(),
        "an upload queued before the purge wrote the namespace again"
    );
    assert_eq!(points(&index, DOOMED).await, 0);
    assert!(
        chunks(graph, KEPT, "k").await > 0,
        "another namespace is untouched"
    );
    assert!(points(&index, KEPT).await > 0);

    // Created again, the namespace takes uploads made after the purge.
    upsert(&stores, DOOMED, "a", "# A\n\nA new life.\n", now_ms()).await;
    wait_for(
        "the new namespace indexed",
        Duration::from_secs(30),
        async || chunks(graph, DOOMED, "a").await > 0,
    )
    .await;
    assert!(points(&index, DOOMED).await > 0);
    assert_eq!(chunks(graph, DOOMED, "b").await, 0);

    stop.cancel();
    worker.await.unwrap().unwrap();
}

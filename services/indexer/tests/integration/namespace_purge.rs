//! A deleted namespace's purge: its graph, vectors and flags records go while a backlog of
//! other files is still being embedded, the files service hears it done, an upload of the
//! namespace queued before the purge never brings it back, and one made after it (the
//! namespace created again) is indexed. Another namespace is untouched. An upload already
//! writing when the purge comes (its LLM extraction slow) is waited for, and nothing of the
//! namespace is left after it. Real NATS, FalkorDB and qdrant-edge.
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

use crate::stores::{SlowOn, Stores};

const DOOMED: &str = "doomed";
const KEPT: &str = "kept";
const SLOW: Duration = Duration::from_millis(1500);
/// Slow files queued before the purge.
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

/// Asks for the namespace's purge as the files service does; when it was asked for.
async fn ask_purge(js: &async_nats::jetstream::Context, namespace: &str) -> i64 {
    let requested_at_ms = now_ms();
    let purge = NamespacePurged {
        namespace: namespace.into(),
        requested_at_ms,
    };
    events::publish(
        js,
        &events::files_purged_subject(namespace).unwrap(),
        &format!("purge:{namespace}:{requested_at_ms}"),
        purge.encode_to_vec(),
    )
    .await
    .unwrap();
    requested_at_ms
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
    let (stop, worker) = crate::stores::spawn_indexer(&stores, config);

    let purged_before = crate::stores::metric("kgmesh_namespaces_purged_total");
    let dropped_before = crate::stores::metric("kgmesh_purged_events_dropped_total");
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
    // namespace's purge. The upload runs after the purge has ended (nothing of the namespace
    // was running), so only the check of each event against the purge can keep it out.
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
    let requested_at_ms = ask_purge(js, DOOMED).await;

    // The purge removes the graph, then the vectors, then the flags records: wait for the
    // last, not the first, or a loaded machine catches it between them.
    wait_for(
        "the graph, vectors and flags removed",
        SLOW * 2,
        async || {
            !graph.graph_exists(DOOMED).await.unwrap()
                && points(&index, DOOMED).await == 0
                && flags_entries(js, DOOMED).await == 0
        },
    )
    .await;
    assert!(
        unsettled(js).await >= 2,
        "the purge must not wait behind the backlog"
    );
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
    assert!(crate::stores::metric("kgmesh_namespaces_purged_total") > purged_before);
    assert!(
        crate::stores::metric("kgmesh_purged_events_dropped_total") > dropped_before,
        "the queued upload is counted as dropped"
    );
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

/// What the slow LLM was asked and has answered.
#[derive(Default)]
struct LlmCalls {
    asked: std::sync::atomic::AtomicUsize,
    answered: std::sync::atomic::AtomicUsize,
}

/// Answers every chat completion after `delay`, with no entity: an LLM working on a large file.
async fn slow_llm(delay: Duration) -> (String, Arc<LlmCalls>) {
    use std::sync::atomic::Ordering;
    let calls = Arc::new(LlmCalls::default());
    let counted = Arc::clone(&calls);
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move || {
            let calls = Arc::clone(&counted);
            async move {
                calls.asked.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                calls.answered.fetch_add(1, Ordering::SeqCst);
                axum::Json(serde_json::json!({
                    "id": "chatcmpl-slow",
                    "object": "chat.completion",
                    "created": 1_700_000_000,
                    "model": "extractor-1",
                    "choices": [{
                        "index": 0,
                        "message": {"role": "assistant", "content": "{\"chunks\": []}"},
                        "finish_reason": "stop"
                    }],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
                }))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1"), calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_purge_waits_for_an_upload_already_writing_before_it_reports() {
    use std::sync::atomic::Ordering;
    // The LLM metrics are process-wide (see llm_extractor).
    let _turn = crate::llm_extractor::SERIAL.lock().await;
    let stores = crate::stores::start().await;
    let (graph, js) = (&stores.graph, &stores.js);
    let (endpoint, llm_calls) = slow_llm(SLOW * 4).await;
    let llm = kg_indexer::entities::llm::LlmExtractor::from_config(
        &kg_indexer::entities::llm::LlmConfig {
            enabled: true,
            endpoint: Some(endpoint),
            model: Some("extractor-1".to_owned()),
            max_retries: 0,
            ..Default::default()
        },
    )
    .unwrap()
    .unwrap()
    .with_api_key("sk-test");
    // The LLM extracts only under a published TBox.
    let tbox = kg_proto::v1::Tbox {
        namespace: DOOMED.into(),
        version: 1,
        entity_types: vec![kg_proto::v1::EntityType {
            type_id: "Person".into(),
            label: "Person".into(),
            side: "published".into(),
            ..Default::default()
        }],
        published_at_ms: now_ms(),
        ..Default::default()
    };
    kg_stores::tbox::TboxBucket::open(js)
        .await
        .unwrap()
        .put(&tbox)
        .await
        .unwrap();
    let config = IndexerConfig {
        llm: Some(Arc::new(llm)),
        ..IndexerConfig::default()
    };
    let (stop, worker) = crate::stores::spawn_indexer(&stores, config);

    // The upload is past every check and written to the graph: the LLM has it.
    upsert(
        &stores,
        DOOMED,
        "big",
        "# Big\n\nAda Lovelace wrote it.\n",
        now_ms(),
    )
    .await;
    wait_for("the LLM asked", Duration::from_secs(30), async || {
        llm_calls.asked.load(Ordering::SeqCst) > 0
    })
    .await;
    assert!(chunks(graph, DOOMED, "big").await > 0);
    ask_purge(js, DOOMED).await;
    wait_for("the graph dropped", Duration::from_secs(10), async || {
        !graph.graph_exists(DOOMED).await.unwrap()
    })
    .await;

    // The report waits for the upload to end, which is after the LLM answered.
    wait_for("the purge reported", Duration::from_secs(60), async || {
        !purge_reports(js, DOOMED).await.is_empty()
    })
    .await;
    assert!(
        llm_calls.answered.load(Ordering::SeqCst) > 0,
        "the purge was reported while an upload of the namespace was still running"
    );
    assert!(
        !graph.graph_exists(DOOMED).await.unwrap(),
        "what the upload wrote after the first removal is gone too"
    );

    stop.cancel();
    worker.await.unwrap().unwrap();
}

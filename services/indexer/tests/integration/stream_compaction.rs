//! Trimming `KG_FILES`: the events each consumer acknowledged leave the stream, and nothing
//! else does: not an event no indexer read yet, not a dead letter, not a subject whose consumer
//! does not exist yet. A FileRef of an earlier release gets its version's content fields from
//! the stream before its upsert goes, so the backfill still finds it. Real NATS and FalkorDB.
use async_nats::jetstream::stream::Stream;
use futures::TryStreamExt as _;
use kg_indexer::IndexerConfig;
use kg_indexer::compaction::{Compacted, compact_files_stream};
use kg_proto::v1::{FileChangeOp, FileChanged};
use kg_stores::events;
use kg_stores::graph::Params;
use prost::Message as _;
use serde_json::{Value, json};
use std::collections::BTreeMap;

use crate::stores::metric;
use crate::vector_backfill::{NS, backfill_after, file_refs, spawn_indexer, upload, wait_for};

/// How many events the stream holds on each subject.
async fn subjects(stream: &Stream) -> BTreeMap<String, usize> {
    stream
        .info_with_subjects("kg.files.v1.>")
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

fn counts(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs
        .iter()
        .map(|(subject, count)| (format!("kg.files.v1.{NS}.{subject}"), *count))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_change_events_leave_the_stream_and_nothing_else_does() {
    let stores = crate::stores::start().await;
    let (graph, js, blobs) = (
        stores.graph.clone(),
        stores.js.clone(),
        stores.blobs.clone(),
    );
    let stream = js.get_stream(events::FILES_STREAM).await.unwrap();
    upload(&js, &blobs, "a", "a-v1", "# A\n\nFirst.\n", 1_000, "a1").await;
    upload(&js, &blobs, "b", "b-v1", "# B\n\nSecond.\n", 1_000, "b1").await;
    upload(
        &js,
        &blobs,
        "a",
        "a-v2",
        "# A\n\nFirst, edited.\n",
        2_000,
        "a2",
    )
    .await;
    // A dead letter, as the worker publishes one when it gives up on an event.
    let dead = FileChanged {
        namespace: NS.into(),
        file_id: "broken".into(),
        version_id: "broken-v1".into(),
        op: FileChangeOp::Upsert as i32,
        ..Default::default()
    };
    let dead_subject = events::dead_letter_subject(NS).unwrap();
    events::publish(&js, &dead_subject, "dead", dead.encode_to_vec())
        .await
        .unwrap();

    // No indexer has run: no consumer has read anything, and nothing goes.
    assert_eq!(
        compact_files_stream(&graph, &js).await.unwrap(),
        Compacted::default()
    );
    assert_eq!(
        subjects(&stream).await,
        counts(&[("changed", 3), ("dead", 1)])
    );

    let (stop, indexer) = spawn_indexer(IndexerConfig::default(), &graph, &blobs, &js);
    wait_for("indexing", async || {
        let refs = file_refs(&graph).await;
        refs.len() == 2 && refs[0][1] == json!("a-v2")
    })
    .await;
    stop.cancel();
    indexer.await.unwrap().unwrap();

    // An upload made while no indexer runs is not read yet: it stays. (The metrics are the
    // process's: other tests may add to them meanwhile.)
    upload(&js, &blobs, "c", "c-v1", "# C\n\nThird.\n", 3_000, "c1").await;
    let removed_before = metric("kgmesh_change_events_compacted_total");
    let compacted = compact_files_stream(&graph, &js).await.unwrap();
    assert!(metric("kgmesh_change_events_compacted_total") >= removed_before + 3);
    assert!(metric("kgmesh_change_events_compaction_completed_timestamp_seconds") > 1_700_000_000);
    assert_eq!(
        compacted,
        Compacted {
            events_removed: 3,
            file_refs_completed: 0
        }
    );
    assert_eq!(
        subjects(&stream).await,
        counts(&[("changed", 1), ("dead", 1)])
    );

    // It is indexed at the next start, and goes at the next trim. Sequences go on from where
    // they were: the trim removes events, it does not make the stream again.
    let (stop, indexer) = spawn_indexer(IndexerConfig::default(), &graph, &blobs, &js);
    wait_for("the upload made meanwhile", async || {
        file_refs(&graph).await.len() == 3
    })
    .await;
    stop.cancel();
    indexer.await.unwrap().unwrap();
    let compacted = compact_files_stream(&graph, &js).await.unwrap();
    assert_eq!(compacted.events_removed, 1);
    assert_eq!(subjects(&stream).await, counts(&[("dead", 1)]));
    let mut stream = stream;
    let state = stream.info().await.unwrap().state.clone();
    assert_eq!((state.messages, state.last_sequence), (1, 5));
    assert_eq!(
        compact_files_stream(&graph, &js).await.unwrap(),
        Compacted::default()
    );
}

/// A FileRef written before FileRefs recorded their version's content: the trim gives it the
/// fields from its upsert, then removes the upsert; turning embeddings on still embeds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_ref_of_an_earlier_release_is_completed_before_its_upsert_goes() {
    let stamp = backfill_after(async |graph, js| {
        // One property a statement: FalkorDB 4.16 removes only one of several set to null.
        for property in ["blobKey", "contentSha256", "size"] {
            let cypher = format!("MATCH (f:FileRef {{fileId: 'f1'}}) SET f.{property} = NULL");
            graph.query(NS, &cypher, &Params::new()).await.unwrap();
        }
        let compacted = compact_files_stream(graph, js).await.unwrap();
        assert_eq!(
            compacted,
            Compacted {
                events_removed: 1,
                file_refs_completed: 1
            }
        );
        let stream = js.get_stream(events::FILES_STREAM).await.unwrap();
        assert_eq!(subjects(&stream).await, BTreeMap::new());
        let fields = "MATCH (f:FileRef {fileId: 'f1'}) RETURN f.contentSha256 IS NOT NULL, f.size";
        let rows = graph.query(NS, fields, &Params::new()).await.unwrap().rows;
        assert_eq!(rows, vec![vec![Value::Bool(true), json!(0)]]);
    })
    .await;
    assert_eq!(stamp, json!("f1-v1|test-hashing|16"));
}

/// The floor is what was acknowledged, every event below it: an event delivered and not
/// acknowledged (running, or waiting for a retry) stays, and so does one acknowledged above
/// it. The indexer's main consumer is driven by hand here, to hold those states still.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_delivered_but_not_acknowledged_stays() {
    let stores = crate::stores::start().await;
    let (graph, js, blobs) = (
        stores.graph.clone(),
        stores.js.clone(),
        stores.blobs.clone(),
    );
    for (file, msg_id) in [("a", "a1"), ("b", "b1"), ("c", "c1")] {
        let version = format!("{file}-v1");
        upload(&js, &blobs, file, &version, "# Text\n", 1_000, msg_id).await;
    }
    let spec = kg_stores::consumer::ConsumerSpec {
        stream: events::FILES_STREAM.to_owned(),
        durable: "indexer".to_owned(),
        filter_subject: "kg.files.v1.*.changed".to_owned(),
        max_deliver: 5,
        ack_wait: std::time::Duration::from_secs(60),
    };
    let consumer = kg_stores::consumer::open(&js, &spec).await.unwrap();
    let delivered: Vec<_> = consumer
        .fetch()
        .max_messages(3)
        .messages()
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(delivered.len(), 3);
    delivered[0].ack().await.unwrap();
    delivered[2].ack().await.unwrap();
    let stream = js.get_stream(events::FILES_STREAM).await.unwrap();
    wait_for("the acks", async || {
        let info = stream.consumer_info("indexer").await.unwrap();
        info.ack_floor.stream_sequence == 1 && info.num_ack_pending == 1
    })
    .await;

    let compacted = compact_files_stream(&graph, &js).await.unwrap();
    assert_eq!(compacted.events_removed, 1);
    assert_eq!(subjects(&stream).await, counts(&[("changed", 2)]));
}

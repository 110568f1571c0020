//! NATS losing its state while the indexer runs (restarted without its volume, or a stream
//! deleted by hand): the next change makes the stream again, and the indexer opens its
//! consumer and its KV buckets again and indexes it, without a restart. Sequences count from 1
//! in the new stream, so one applied in the old stream must not make the new events look
//! older than it. A file indexed while the bus lacks its namespace's TBox waits for the ontology
//! service to put it back, rather than fail or lose its entities. Real NATS and FalkorDB.
use std::time::{Duration, Instant};

use kg_indexer::IndexerConfig;
use kg_proto::v1::{FileChangeOp, FileChanged};
use kg_stores::events;
use kg_stores::graph::{GraphStore, Params};

const NS: &str = "lostbus";

async fn upload(stores: &crate::stores::Stores, file_id: &str, version: i64) {
    let event = FileChanged {
        namespace: NS.into(),
        file_id: file_id.into(),
        version_id: format!("{file_id}-v{version}"),
        path: format!("docs/{file_id}.md"),
        mime: "text/markdown".into(),
        blob_key: stores
            .blobs
            .put(format!("# {file_id}\n\nVersion {version} of {file_id}, for Acme.\n").as_bytes())
            .await
            .unwrap(),
        op: FileChangeOp::Upsert as i32,
        enabled: true,
        changed_at_ms: kg_common::caller::now_ms(),
        ..Default::default()
    };
    let msg_id = format!("{}:upsert", event.version_id);
    events::publish_file_change(&stores.js, &event, &msg_id)
        .await
        .unwrap();
}

/// The version the graph holds for `file_id`.
async fn indexed_version(graph: &GraphStore, file_id: &str) -> Option<String> {
    let mut params = Params::new();
    params.insert("fileId".into(), file_id.into());
    let rows = graph
        .query(
            NS,
            "MATCH (f:FileRef {fileId: $fileId}) RETURN f.versionId",
            &params,
        )
        .await
        .ok()?
        .rows;
    rows.first()?.first()?.as_str().map(str::to_owned)
}

async fn wait_for_version(graph: &GraphStore, file_id: &str, version: &str) {
    let within = Duration::from_secs(60);
    let deadline = Instant::now() + within;
    loop {
        let held = indexed_version(graph, file_id).await;
        if held.as_deref() == Some(version) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{file_id}: still {held:?}, not {version}, after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_indexer_follows_streams_and_buckets_made_again_while_it_runs() {
    let stores = crate::stores::start().await;
    let (stop, worker) = crate::stores::spawn_indexer(
        &stores,
        IndexerConfig {
            concurrency: 2,
            ..IndexerConfig::default()
        },
    );
    // Three uploads: the last file's event is applied at sequence 3 of the first stream.
    for file_id in ["a", "b", "kept"] {
        upload(&stores, file_id, 1).await;
    }
    for file_id in ["a", "b", "kept"] {
        wait_for_version(&stores.graph, file_id, &format!("{file_id}-v1")).await;
    }

    // The stream is deleted with its consumers; the indexer's KV buckets stay.
    stores.js.delete_stream(events::FILES_STREAM).await.unwrap();
    // The next change makes it again, and is its sequence 1: older than 3 in number only.
    upload(&stores, "kept", 2).await;
    wait_for_version(&stores.graph, "kept", "kept-v2").await;

    // Everything NATS held is lost: the stream again, and every bucket the indexer keeps.
    stores.js.delete_stream(events::FILES_STREAM).await.unwrap();
    for bucket in [
        "kg_indexer_leases",
        "kg_indexer_applied",
        "kg_indexer_flags",
    ] {
        stores.js.delete_key_value(bucket).await.unwrap();
    }
    upload(&stores, "kept", 3).await;
    upload(&stores, "new", 1).await;
    wait_for_version(&stores.graph, "kept", "kept-v3").await;
    wait_for_version(&stores.graph, "new", "new-v1").await;

    stop.cancel();
    worker.await.unwrap().unwrap();
}

/// How many entity mentions the graph holds for `file_id`.
async fn mentions(graph: &GraphStore, file_id: &str) -> u64 {
    let mut params = Params::new();
    params.insert("fileId".into(), file_id.into());
    let rows = graph
        .query(
            NS,
            "MATCH (:Chunk {fileId: $fileId})-[m:MENTIONS]->(:Entity) RETURN count(m)",
            &params,
        )
        .await
        .unwrap()
        .rows;
    rows.first()
        .and_then(|row| row.first())
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0)
}

/// EntityType nodes in the namespace's graph.
async fn entity_types(graph: &GraphStore) -> u64 {
    let rows = graph
        .query(NS, "MATCH (t:EntityType) RETURN count(t)", &Params::new())
        .await
        .unwrap()
        .rows;
    rows[0][0].as_u64().unwrap()
}

/// Waits until the graph holds mentions of `file_id`: entities are written after its chunks,
/// so the version alone does not say they are there yet.
async fn wait_for_mentions(graph: &GraphStore, file_id: &str) {
    let within = Duration::from_secs(60);
    let deadline = Instant::now() + within;
    while mentions(graph, file_id).await == 0 {
        assert!(
            Instant::now() < deadline,
            "{file_id}: no mentions after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_file_indexed_while_the_bus_lacks_its_tbox_waits_for_it() {
    let stores = crate::stores::start().await;
    let tboxes = kg_stores::tbox::TboxBucket::open(&stores.js).await.unwrap();
    let acme = kg_proto::v1::Tbox {
        namespace: NS.into(),
        ..crate::vector_backfill::organizations(1, &["Acme"])
    };
    tboxes.put(&acme).await.unwrap();
    // One delivery: a delivery that failed for want of the TBox would leave the file failed.
    let (stop, worker) = crate::stores::spawn_indexer(
        &stores,
        IndexerConfig {
            max_deliver: 1,
            ..IndexerConfig::default()
        },
    );
    upload(&stores, "deal", 1).await;
    wait_for_version(&stores.graph, "deal", "deal-v1").await;
    wait_for_mentions(&stores.graph, "deal").await;

    // The bus loses the bucket; the indexer's cached copy (2 s) runs out.
    stores.js.delete_key_value("KG_TBOX").await.unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    upload(&stores, "deal", 2).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        indexed_version(&stores.graph, "deal").await.as_deref(),
        Some("deal-v1"),
        "indexed while its TBox was unreadable"
    );
    // The bucket made again, still empty: the ontology service makes it, then reads SQL and
    // puts the TBox back. The namespace's graph was written with a TBox, so an empty bucket
    // is not read as "no TBox".
    tboxes.ensure().await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        indexed_version(&stores.graph, "deal").await.as_deref(),
        Some("deal-v1"),
        "indexed from a bucket that lost its TBox"
    );
    assert_eq!(
        entity_types(&stores.graph).await,
        1,
        "the namespace's types are kept"
    );
    tboxes.put(&acme).await.unwrap();
    wait_for_version(&stores.graph, "deal", "deal-v2").await;
    wait_for_mentions(&stores.graph, "deal").await;

    stop.cancel();
    worker.await.unwrap().unwrap();
}

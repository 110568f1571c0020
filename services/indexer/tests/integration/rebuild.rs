//! Rebuilds: an upsert marked `rebuild_at_ms` (an operator's reindex, a retried upload)
//! rewrites every store's copy of its version, however current the graph's stamps say it is.
//! Vectors lost while the graph still holds the version come back, which a redelivery of the
//! same version does not do; a graph lost altogether comes back with its full-text index, the
//! TBox's types and the mentions, though this process had made them before. Each rebuild's
//! outcome reaches the files service, beside the version's first, and a TBox published after
//! it re-extracts entities without embedding again. Apart from rebuilds, a
//! version chunked again under other settings keeps its entities, and a new version without
//! the old one's date and type loses them. Real NATS, FalkorDB and qdrant-edge.
use std::sync::atomic::Ordering;
use std::time::Duration;

use kg_indexer::{IndexerConfig, Vectors};
use kg_proto::v1::{FileChangeOp, FileChanged, FileIndexed, FileStatus};
use kg_stores::blobs::BlobStore;
use kg_stores::events;
use kg_stores::graph::{GraphStore, Params};
use kg_stores::vector::Scope;
use prost::Message as _;
use serde_json::{Value, json};

use crate::vector_backfill::{
    NS, counting_vectors, everything, file_refs, mentioned, organizations, spawn_indexer, upload,
    wait_for,
};

const DEALS: &str = "# Deals\n\nAcme acquired Globex last spring.\n";

/// An upsert of `deals-v1` marked as a rebuild asked for at `rebuild_at_ms`.
async fn rebuild(js: &async_nats::jetstream::Context, blobs: &BlobStore, rebuild_at_ms: i64) {
    let event = FileChanged {
        namespace: NS.into(),
        file_id: "deals".into(),
        version_id: "deals-v1".into(),
        path: "docs/deals.md".into(),
        mime: "text/markdown".into(),
        blob_key: blobs.put(DEALS.as_bytes()).await.unwrap(),
        op: FileChangeOp::Upsert as i32,
        enabled: true,
        changed_at_ms: 1_000,
        rebuild_at_ms,
        ..Default::default()
    };
    let subject = events::files_changed_subject(NS).unwrap();
    let msg_id = format!("deals-v1:rebuild:{rebuild_at_ms}");
    events::publish(js, &subject, &msg_id, event.encode_to_vec())
        .await
        .unwrap();
}

async fn chunk_vectors(vectors: &Vectors) -> u64 {
    vectors
        .index
        .count(&everything(), &Scope::chunks())
        .await
        .unwrap()
}

async fn single(graph: &GraphStore, cypher: &str) -> Value {
    graph
        .query(NS, cypher, &Params::new())
        .await
        .ok()
        .and_then(|r| r.rows.into_iter().next())
        .and_then(|row| row.into_iter().next())
        .unwrap_or(Value::Null)
}

/// The outcomes the indexer published for `deals-v1` that reached the stream: the request
/// each answers (its `rebuild_at_ms`, 0 for the upload's own).
async fn indexed_outcomes(js: &async_nats::jetstream::Context) -> Vec<i64> {
    let subject = events::indexed_subject(NS).unwrap();
    crate::stores::payloads_on(js, events::INDEX_STREAM, &subject)
        .await
        .iter()
        .map(|payload| FileIndexed::decode(payload.as_slice()).unwrap())
        .filter(|event| {
            event.version_id == "deals-v1" && event.status == FileStatus::Indexed as i32
        })
        .map(|event| event.rebuild_at_ms)
        .collect()
}

/// The TBox bucket, holding a published TBox whose one organization is Acme.
async fn tbox_of_acme(js: &async_nats::jetstream::Context) -> kg_stores::tbox::TboxBucket {
    let tboxes = kg_stores::tbox::TboxBucket::open(js).await.unwrap();
    tboxes.put(&organizations(1, &["Acme"])).await.unwrap();
    tboxes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_rewrites_what_the_stores_lost() {
    let stores = crate::stores::start().await;
    let (graph, js, blobs) = (
        stores.graph.clone(),
        stores.js.clone(),
        stores.blobs.clone(),
    );
    let tboxes = tbox_of_acme(&js).await;
    upload(&js, &blobs, "deals", "deals-v1", DEALS, 1_000, "d").await;
    let (embedder, vectors) = counting_vectors(stores.dir.path()).await;
    let config = IndexerConfig {
        vectors: Some(vectors.clone()),
        ..IndexerConfig::default()
    };
    let (stop, indexer) = spawn_indexer(config, &graph, &blobs, &js);
    wait_for("deals indexed with Acme", async || {
        let refs = file_refs(&graph).await;
        refs.len() == 1 && !refs[0][2].is_null() && mentioned(&graph).await == ["Acme"]
    })
    .await;
    let chunks = chunk_vectors(&vectors).await;
    assert!(chunks > 0);
    let embedded = embedder.texts.load(Ordering::SeqCst);

    // The vectors lost, the graph kept: a redelivery trusts the graph's stamps and writes
    // nothing; a rebuild writes them again.
    vectors.index.delete_file(NS, "deals").await.unwrap();
    upload(&js, &blobs, "deals", "deals-v1", DEALS, 1_000, "d-again").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(chunk_vectors(&vectors).await, 0);
    rebuild(&js, &blobs, 5_000).await;
    wait_for("the vectors written again", async || {
        chunk_vectors(&vectors).await == chunks
            && !file_refs(&graph)
                .await
                .first()
                .is_some_and(|r| r[2].is_null())
    })
    .await;
    assert!(embedder.texts.load(Ordering::SeqCst) > embedded);
    assert_eq!(mentioned(&graph).await, ["Acme"]);

    // The graph lost: chunks, the full-text index, the TBox's types and the mentions return.
    // The vectors were kept, so the rebuild rewrites them without embedding anything.
    let embedded = embedder.texts.load(Ordering::SeqCst);
    graph.delete_graph(NS).await.unwrap();
    rebuild(&js, &blobs, 6_000).await;
    wait_for("the graph written again", async || {
        file_refs(&graph).await.len() == 1 && mentioned(&graph).await == ["Acme"]
    })
    .await;
    assert_eq!(embedder.texts.load(Ordering::SeqCst), embedded);
    assert_eq!(chunk_vectors(&vectors).await, chunks);
    let hits = single(
        &graph,
        "CALL db.idx.fulltext.queryNodes('Chunk', 'acquired') YIELD node RETURN count(node)",
    )
    .await;
    assert_eq!(hits, json!(1), "the chunk is found by full text again");
    let types = single(&graph, "MATCH (t:EntityType) RETURN collect(t.typeId)").await;
    assert_eq!(types, json!(["Organization"]));
    assert_eq!(
        file_refs(&graph).await[0][1],
        json!("deals-v1"),
        "the version is marked written"
    );
    assert_eq!(
        indexed_outcomes(&js).await,
        [0, 5_000, 6_000],
        "the first outcome and two rebuilds', each naming the request it answers"
    );

    // A TBox published now re-extracts the entities from the latest upsert in the stream, a
    // rebuild's, without embedding anything again.
    let embedded = embedder.texts.load(Ordering::SeqCst);
    tboxes.put(&organizations(2, &["Globex"])).await.unwrap();
    wait_for("Globex instead after the publish", async || {
        mentioned(&graph).await == ["Globex"]
    })
    .await;
    stop.cancel();
    indexer.await.unwrap().unwrap();
    assert_eq!(embedder.texts.load(Ordering::SeqCst), embedded);
}

const HANDBOOK: &str = "# Handbook\n\n## Deploys\n\nShip on Tuesdays, after the review.\n\n\
                        ## Rollback\n\nRoll back by pointing traffic at the old pods.\n\n\
                        ## On call\n\nThe pager rotates every Monday at noon.\n";

/// An edit embeds only the chunks it changed: the file's other chunks keep the vectors its
/// previous version stored, though their keys moved, and its points are the new version's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_embeds_only_the_chunks_it_changed() {
    let stores = crate::stores::start().await;
    let (graph, js, blobs) = (
        stores.graph.clone(),
        stores.js.clone(),
        stores.blobs.clone(),
    );
    let (embedder, vectors) = counting_vectors(stores.dir.path()).await;
    let config = IndexerConfig {
        vectors: Some(vectors.clone()),
        ..IndexerConfig::default()
    };
    let (stop, indexer) = spawn_indexer(config, &graph, &blobs, &js);
    let indexed = |version: &'static str| {
        let graph = graph.clone();
        async move || {
            let refs = file_refs(&graph).await;
            refs.len() == 1 && refs[0][1] == json!(version) && !refs[0][2].is_null()
        }
    };
    upload(
        &js,
        &blobs,
        "handbook",
        "handbook-v1",
        HANDBOOK,
        1_000,
        "h1",
    )
    .await;
    wait_for("the first version indexed", indexed("handbook-v1")).await;
    let chunks = chunk_vectors(&vectors).await;
    assert!(chunks >= 3, "{chunks} chunks");
    assert_eq!(embedder.texts.load(Ordering::SeqCst) as u64, chunks);

    // One section rewritten, and a line added above all of them, which moves every chunk.
    let edited = HANDBOOK
        .replace("# Handbook\n\n", "# Handbook\n\nAsk in #ops first.\n\n")
        .replace("every Monday", "every other Monday");
    upload(&js, &blobs, "handbook", "handbook-v2", &edited, 2_000, "h2").await;
    wait_for("the edit indexed", indexed("handbook-v2")).await;
    let embedded = embedder.texts.load(Ordering::SeqCst) as u64 - chunks;
    let now = chunk_vectors(&vectors).await;
    assert_eq!(
        (embedded, now),
        (2, chunks),
        "the two chunks that changed (the added line's and the rewritten section's) embedded"
    );
    let pager = vectors
        .index
        .search(
            &everything(),
            &Scope::chunks(),
            embedder.inner.vector(
                "Handbook › On call\n\n## On call\n\nThe pager rotates every other Monday at noon.",
            ),
            1,
        )
        .await
        .unwrap();
    assert!(
        pager[0].score > 0.99,
        "the rewritten section's new vector: {pager:?}"
    );
    stop.cancel();
    indexer.await.unwrap().unwrap();
}

/// The same version chunked again under other settings (here a redelivery after the chunk
/// sizes changed) replaces its chunks, and the mentions go with them: its entities must be
/// extracted again, though their stamp names this very version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_chunked_again_keeps_its_entities() {
    let stores = crate::stores::start().await;
    let (graph, js, blobs) = (
        stores.graph.clone(),
        stores.js.clone(),
        stores.blobs.clone(),
    );
    tbox_of_acme(&js).await;
    let text = "# Deals\n\nAcme acquired Globex last spring, after a long courtship.\n\n\
                Acme then sold the logistics arm to a rival that had bid twice before.\n";
    upload(&js, &blobs, "deals", "deals-v1", text, 1_000, "d").await;
    let chunk_count = async || single(&graph, "MATCH (c:Chunk) RETURN count(c)").await;
    let (stop, indexer) = spawn_indexer(IndexerConfig::default(), &graph, &blobs, &js);
    wait_for("deals indexed with Acme", async || {
        mentioned(&graph).await == ["Acme"]
    })
    .await;
    let before = chunk_count().await;
    stop.cancel();
    indexer.await.unwrap().unwrap();

    let small = IndexerConfig {
        chunk: kg_indexer::document::ChunkOptions {
            target_tokens: 8,
            max_tokens: 16,
            overlap_tokens: 0,
        },
        ..IndexerConfig::default()
    };
    let (stop, indexer) = spawn_indexer(small, &graph, &blobs, &js);
    upload(&js, &blobs, "deals", "deals-v1", text, 1_000, "d-again").await;
    // The entity write comes last, after the chunks and the FileRef's version.
    let unlinked = async || {
        single(
            &graph,
            "MATCH (c:Chunk) WHERE c.text CONTAINS 'Acme' AND NOT (c)-[:MENTIONS]->(:Entity) \
             RETURN count(c)",
        )
        .await
    };
    wait_for(
        "deals chunked again, every chunk naming Acme mentioning it",
        async || {
            chunk_count().await != before
                && mentioned(&graph).await == ["Acme"]
                && unlinked().await == json!(0)
        },
    )
    .await;
    stop.cancel();
    indexer.await.unwrap().unwrap();
}

/// The chunk keys of the file's points in the vector index, sorted.
async fn vector_chunk_keys(vectors: &Vectors) -> Vec<String> {
    let hits = vectors
        .index
        .search(&everything(), &Scope::chunks(), vec![0.25; 16], 100)
        .await
        .unwrap();
    let mut keys: Vec<String> = hits.into_iter().filter_map(|h| h.chunk_key).collect();
    keys.sort();
    keys
}

async fn graph_chunk_keys(graph: &GraphStore) -> Vec<String> {
    let mut keys: Vec<String> = graph
        .query(NS, "MATCH (c:Chunk) RETURN c.chunkKey", &Params::new())
        .await
        .unwrap()
        .rows
        .into_iter()
        .filter_map(|row| row.first().and_then(Value::as_str).map(str::to_owned))
        .collect();
    keys.sort();
    keys
}

/// The same version cut again under other chunk settings into as many chunks as before (an
/// overlap switched on changes their texts, not their number) is written again, graph and
/// vectors alike. Judged by its chunk count alone it was "current": the graph kept the old
/// chunks and the vectors were not written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_cut_again_into_as_many_chunks_is_written_again() {
    let stores = crate::stores::start().await;
    let (graph, js, blobs) = (
        stores.graph.clone(),
        stores.js.clone(),
        stores.blobs.clone(),
    );
    let (_embedder, vectors) = counting_vectors(stores.dir.path()).await;
    let cut = |overlap_tokens| IndexerConfig {
        vectors: Some(vectors.clone()),
        chunk: kg_indexer::document::ChunkOptions {
            target_tokens: 16,
            max_tokens: 48,
            overlap_tokens,
        },
        ..IndexerConfig::default()
    };
    let text = "# Rota\n\nThe pager rotates every Monday at noon sharp.\n\n\
                Handovers happen in the ops channel with a short written summary.\n\n\
                Escalate to the secondary after fifteen quiet minutes.\n\n\
                Weekend shifts count double toward the quarterly on-call allowance.\n";

    let (stop, indexer) = spawn_indexer(cut(0), &graph, &blobs, &js);
    upload(&js, &blobs, "rota", "rota-v1", text, 1_000, "r1").await;
    wait_for("rota indexed with its vectors", async || {
        let keys = graph_chunk_keys(&graph).await;
        keys.len() >= 3 && vector_chunk_keys(&vectors).await == keys
    })
    .await;
    let before = graph_chunk_keys(&graph).await;
    stop.cancel();
    indexer.await.unwrap().unwrap();

    let (stop, indexer) = spawn_indexer(cut(6), &graph, &blobs, &js);
    upload(&js, &blobs, "rota", "rota-v1", text, 1_000, "r1-again").await;
    wait_for(
        "rota cut again: new chunks in the graph, and the vectors' keys the graph's",
        async || {
            let keys = graph_chunk_keys(&graph).await;
            keys != before && vector_chunk_keys(&vectors).await == keys
        },
    )
    .await;
    assert_eq!(
        graph_chunk_keys(&graph).await.len(),
        before.len(),
        "the premise: the overlap changes the chunks' texts, not their number"
    );
    stop.cancel();
    indexer.await.unwrap().unwrap();
}

/// A new version without the front matter of the one before loses its date, type and
/// effective date on the FileRef (the date filters read them), and keeps its flags: six
/// properties removed in one write, each in a clause of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_version_without_a_date_loses_the_old_one() {
    let stores = crate::stores::start().await;
    let (graph, js, blobs) = (
        stores.graph.clone(),
        stores.js.clone(),
        stores.blobs.clone(),
    );
    let dated = "---\ndate: 2024-05-01\ntype: runbook\neffective_from: 2024-05-01\n---\n\
                 # Deploys\n\nRoll back with the previous tag.\n";
    upload(&js, &blobs, "deploys", "deploys-v1", dated, 1_000, "v1").await;
    let state = async || {
        single(
            &graph,
            "MATCH (f:FileRef) RETURN [f.versionId, f.documentDate, f.docType, \
             f.effectiveFrom, f.enabled, f.hidden, f.vfsPath]",
        )
        .await
    };
    let (stop, indexer) = spawn_indexer(IndexerConfig::default(), &graph, &blobs, &js);
    wait_for("the dated version", async || {
        state().await[0] == json!("deploys-v1")
    })
    .await;
    let first = state().await;
    assert_eq!(first[1], json!("2024-05-01"), "{first}");
    assert_eq!(first[2], json!("runbook"), "{first}");
    let undated = "# Deploys\n\nRoll back with the previous tag, or redeploy.\n";
    upload(&js, &blobs, "deploys", "deploys-v2", undated, 2_000, "v2").await;
    wait_for("the undated version", async || {
        state().await[0] == json!("deploys-v2")
    })
    .await;
    stop.cancel();
    indexer.await.unwrap().unwrap();
    assert_eq!(
        state().await,
        json!([
            "deploys-v2",
            null,
            null,
            null,
            true,
            false,
            "docs/deploys.md"
        ])
    );
}

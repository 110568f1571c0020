//! The indexer dies in the middle of a 500-file ingest and a new one takes
//! over the durable consumer: every file ends indexed exactly once, with no
//! duplicate chunks and no lost files, in the graph and in the vector index
//! (real all-MiniLM-L6-v2 embeddings into an embedded qdrant-edge shard).
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kg_common::caller::now_ms;
use kg_files::FilesService;
use kg_indexer::IndexerConfig;
use kg_proto::v1::{AccessFilter, CallerContext, FileStatus, Permission};
use kg_stores::blobs::BlobStore;
use kg_stores::embedded::{EmbeddedFalkor, EmbeddedNats, find_venv};
use kg_stores::graph::{GraphStore, Params};
use kg_stores::sql::SqlStore;
use tokio_util::sync::CancellationToken;

const FILES: usize = 500;
const NS: &str = "restart";

fn operator() -> CallerContext {
    let now = now_ms();
    CallerContext {
        principal_id: "test-operator".into(),
        is_admin: true,
        access: vec![AccessFilter {
            namespace: NS.into(),
            allow_prefixes: vec![String::new()],
            permission: Permission::Admin as i32,
            write_prefixes: vec![String::new()],
            ..Default::default()
        }],
        issued_at_ms: now,
        expires_at_ms: now + 3_600_000,
        ..Default::default()
    }
}

fn document(i: usize) -> String {
    format!(
        "# Document {i}\n\nIntro paragraph of document {i} about topic {}.\n\n## Details\n\nDetail text {i}, unique token tok{i:04}.\n\n## More\n\nClosing words for {i}.\n",
        i % 17
    )
}

async fn indexed_count(files: &FilesService, caller: &CallerContext) -> (usize, usize) {
    let (mut indexed, mut failed) = (0, 0);
    let mut cursor = String::new();
    loop {
        let page = files
            .list_files(caller, NS, "", 1000, &cursor, true)
            .await
            .unwrap();
        for f in &page.files {
            match f.status() {
                FileStatus::Indexed => indexed += 1,
                FileStatus::Failed => failed += 1,
                _ => {}
            }
        }
        if page.next_cursor.is_empty() {
            return (indexed, failed);
        }
        cursor = page.next_cursor;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_indexer_loses_and_duplicates_nothing() {
    let venv = find_venv().expect("run deploy/scripts/dev-deps.sh first");
    let dir = tempfile::tempdir().unwrap();
    let falkor = EmbeddedFalkor::start(&venv, &dir.path().join("falkor"))
        .await
        .unwrap();
    let nats = EmbeddedNats::start(&venv, &dir.path().join("nats"))
        .await
        .unwrap();
    let graph = GraphStore::connect(&falkor.url).await.unwrap();
    let js = kg_stores::events::connect(&nats.url).await.unwrap();
    let sql = SqlStore::connect(&format!("sqlite://{}", dir.path().join("r.db").display()))
        .await
        .unwrap();
    let blobs = BlobStore::new(dir.path().join("blobs"));
    let files = FilesService::new(sql, blobs.clone(), js.clone(), 1 << 20)
        .await
        .unwrap();
    let caller = operator();

    let status_stop = CancellationToken::new();
    let status = tokio::spawn(kg_files::run_status_consumer(
        files.clone(),
        js.clone(),
        status_stop.clone(),
    ));

    // First indexer: started, then killed mid-ingest (its future is dropped at
    // whatever await point it is in, unacked messages are redelivered).
    let first_stop = CancellationToken::new();
    // A short ack wait: what the dead worker held comes back quickly. The
    // durable consumer keeps the settings it was created with.
    let vectors = kg_indexer::IndexerSettings::default()
        .open_vectors(&dir.path().join("vectors"))
        .await
        .unwrap()
        .expect("minilm is the default provider");
    let config = IndexerConfig {
        ack_wait: Duration::from_secs(3),
        vectors: Some(vectors.clone()),
        ..IndexerConfig::default()
    };
    let first = tokio::spawn(kg_indexer::run(
        config.clone(),
        graph.clone(),
        blobs.clone(),
        js.clone(),
        first_stop.clone(),
    ));
    for i in 0..FILES {
        files
            .upload(
                &caller,
                NS,
                &format!("docs/{:02}/doc-{i:04}.md", i % 20),
                document(i).as_bytes(),
                "",
            )
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (indexed, _) = indexed_count(&files, &caller).await;
        if indexed >= FILES / 5 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the first indexer made no progress"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.abort();
    let _ = first.await;
    let (at_kill, _) = indexed_count(&files, &caller).await;
    assert!(
        at_kill < FILES,
        "the kill must land mid-ingest (all {FILES} were already indexed)"
    );

    // A new indexer on the same durable consumer finishes the work.
    let second_stop = CancellationToken::new();
    let second = tokio::spawn(kg_indexer::run(
        config,
        graph.clone(),
        blobs.clone(),
        js.clone(),
        second_stop.clone(),
    ));
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let (indexed, failed) = indexed_count(&files, &caller).await;
        assert_eq!(failed, 0, "no file may fail");
        if indexed == FILES {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {indexed}/{FILES} indexed after the restart"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The graph holds every file once and every chunk once.
    let rows = graph
        .ro_query(
            NS,
            "MATCH (f:FileRef) RETURN f.fileId, f.chunkCount",
            &Params::new(),
            10_000,
        )
        .await
        .unwrap();
    assert_eq!(rows.rows.len(), FILES, "one FileRef per file");
    let expected_chunks: i64 = rows.rows.iter().map(|r| r[1].as_i64().unwrap()).sum();
    let chunks = graph
        .ro_query(
            NS,
            "MATCH (c:Chunk)-[:PART_OF]->(:FileRef) RETURN c.chunkKey",
            &Params::new(),
            10_000,
        )
        .await
        .unwrap();
    let keys: BTreeSet<String> = chunks
        .rows
        .iter()
        .map(|r| r[0].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        keys.len(),
        chunks.rows.len(),
        "duplicate chunks in the graph"
    );
    assert_eq!(
        chunks.rows.len() as i64,
        expected_chunks,
        "chunk count differs from the files' chunkCount"
    );
    let orphans = graph
        .ro_query(
            NS,
            "MATCH (c:Chunk) WHERE NOT (c)-[:PART_OF]->(:FileRef) RETURN count(c)",
            &Params::new(),
            10_000,
        )
        .await
        .unwrap();
    assert_eq!(
        orphans.rows[0][0].as_i64(),
        Some(0),
        "chunks without a file"
    );

    // The vector index holds one point per chunk and one per file, none twice.
    let everything = AccessFilter {
        namespace: NS.into(),
        allow_prefixes: vec![String::new()],
        ..Default::default()
    };
    let chunk_points = vectors
        .index
        .count(&everything, &kg_stores::vector::Scope::chunks())
        .await
        .unwrap();
    assert_eq!(chunk_points as i64, expected_chunks, "chunk vectors");
    let file_points = vectors
        .index
        .count(&everything, &kg_stores::vector::Scope::files())
        .await
        .unwrap();
    assert_eq!(file_points as usize, FILES, "file vectors");

    second_stop.cancel();
    status_stop.cancel();
    let _ = second.await;
    let _ = status.await;
}

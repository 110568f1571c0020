//! A new version of a file replacing the stored one in a real FalkorDB: kept chunks and
//! sections keep their nodes (and the mentions on them) and take the new properties, edges
//! end up exactly the new version's, what the version no longer has is pruned, and a reader
//! never finds the file without chunks or under a path it no longer has.
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use kg_indexer::graph_writer::{self, ChunkRecord, FileRecord, OutlineRecord, WriteOutcome};
use kg_stores::embedded::{EmbeddedFalkor, find_venv};
use kg_stores::graph::{GraphStore, Params};
use serde_json::{Value, json};

const NS: &str = "replace";
const FILE: &str = "f-guide";

fn file(version: &str, path: &str) -> FileRecord {
    let (folder, name) = path.rsplit_once('/').map_or(("", path), |(f, n)| (f, n));
    FileRecord {
        namespace: NS.into(),
        file_id: FILE.into(),
        version_id: version.into(),
        path: path.into(),
        name: name.into(),
        folder_path: if folder.is_empty() {
            String::new()
        } else {
            format!("{folder}/")
        },
        enabled: true,
        hidden: false,
        title: Some("Guide".into()),
        document_date: None,
        mime: "text/markdown".into(),
    }
}

fn chunk(key: &str, index: u32, section: Option<&str>, pages: Option<(u32, u32)>) -> ChunkRecord {
    ChunkRecord {
        chunk_key: key.into(),
        index,
        text: format!("the text of {key}"),
        context_header: "Guide".into(),
        char_start: u64::from(index) * 100,
        char_end: u64::from(index) * 100 + 20,
        line_start: index * 3 + 1,
        line_end: index * 3 + 2,
        page_start: pages.map(|p| p.0),
        page_end: pages.map(|p| p.1),
        token_count: 5,
        section_key: section.map(str::to_owned),
    }
}

fn section(key: &str, order: u32, parent: Option<&str>, covers: &[&str]) -> OutlineRecord {
    OutlineRecord {
        outline_key: key.into(),
        title: format!("Section {key}"),
        depth: if parent.is_some() { 2 } else { 1 },
        order,
        parent_key: parent.map(str::to_owned),
        line_start: order * 10 + 1,
        line_end: order * 10 + 9,
        char_start: u64::from(order) * 100,
        char_end: u64::from(order) * 100 + 99,
        page_start: Some(order + 1),
        page_end: Some(order + 2),
        covers: covers.iter().map(|c| (*c).to_owned()).collect(),
    }
}

/// Version 1: chunks a b c d in that order; s1 over them all, s2 (under s1) over c and d,
/// s3 (under s1) over b.
fn version_one() -> (Vec<ChunkRecord>, Vec<OutlineRecord>) {
    (
        vec![
            chunk("ch_a", 0, Some("ol_s1"), Some((1, 1))),
            chunk("ch_b", 1, Some("ol_s3"), Some((1, 2))),
            chunk("ch_c", 2, Some("ol_s2"), Some((2, 3))),
            chunk("ch_d", 3, Some("ol_s2"), Some((3, 3))),
        ],
        vec![
            section("ol_s1", 0, None, &["ch_a", "ch_b", "ch_c", "ch_d"]),
            section("ol_s2", 1, Some("ol_s1"), &["ch_c", "ch_d"]),
            section("ol_s3", 2, Some("ol_s1"), &["ch_b"]),
        ],
    )
}

/// Version 2: b is gone and e is new (a c e d); c lost its pages and its section and has a
/// new header; s2 is gone, s4 is new under s1 and s3 moved under it; s1 has a new title.
fn version_two() -> (Vec<ChunkRecord>, Vec<OutlineRecord>) {
    let mut c = chunk("ch_c", 1, None, None);
    c.context_header = "Guide › Renamed".into();
    let mut s1 = section("ol_s1", 0, None, &["ch_a", "ch_c", "ch_e", "ch_d"]);
    s1.title = "Overview".into();
    let mut s3 = section("ol_s3", 2, Some("ol_s4"), &["ch_d"]);
    s3.page_start = None;
    s3.page_end = None;
    (
        vec![
            chunk("ch_a", 0, Some("ol_s1"), Some((1, 1))),
            c,
            chunk("ch_e", 2, Some("ol_s4"), None),
            chunk("ch_d", 3, Some("ol_s3"), Some((3, 4))),
        ],
        vec![
            s1,
            section("ol_s4", 1, Some("ol_s1"), &["ch_e", "ch_d"]),
            s3,
        ],
    )
}

async fn rows(graph: &GraphStore, cypher: &str) -> Vec<Vec<Value>> {
    let mut params = Params::new();
    params.insert("fileId".into(), json!(FILE));
    graph.query(NS, cypher, &params).await.unwrap().rows
}

/// Pairs of keys joined by `rel` among the file's nodes, sorted.
async fn edges(graph: &GraphStore, rel: &str) -> Vec<(String, String)> {
    let cypher = format!(
        "MATCH (a {{fileId: $fileId}})-[:{rel}]->(b {{fileId: $fileId}}) \
         RETURN coalesce(a.chunkKey, a.outlineKey), coalesce(b.chunkKey, b.outlineKey)"
    );
    let mut pairs: Vec<(String, String)> = rows(graph, &cypher)
        .await
        .into_iter()
        .map(|r| (r[0].as_str().unwrap().into(), r[1].as_str().unwrap().into()))
        .collect();
    pairs.sort();
    pairs
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = list
        .iter()
        .map(|(a, b)| ((*a).into(), (*b).into()))
        .collect();
    pairs.sort();
    pairs
}

/// Internal node ids by key: a node kept across versions keeps its id.
async fn node_ids(graph: &GraphStore) -> Vec<(String, i64)> {
    let mut ids: Vec<(String, i64)> = rows(
        graph,
        "MATCH (n {fileId: $fileId}) WHERE n:Chunk OR n:OutlineNode \
         RETURN coalesce(n.chunkKey, n.outlineKey), ID(n)",
    )
    .await
    .into_iter()
    .map(|r| (r[0].as_str().unwrap().into(), r[1].as_i64().unwrap()))
    .collect();
    ids.sort();
    ids
}

async fn start_falkor() -> (EmbeddedFalkor, GraphStore, tempfile::TempDir) {
    let venv = find_venv().expect("the dev-deps virtualenv (run deploy/scripts/dev-deps.sh)");
    let dir = tempfile::tempdir().unwrap();
    let falkor = EmbeddedFalkor::start(&venv, dir.path()).await.unwrap();
    let graph = GraphStore::connect(&falkor.url).await.unwrap();
    (falkor, graph, dir)
}

#[tokio::test]
async fn a_new_version_keeps_the_nodes_it_shares_with_the_stored_one() {
    let (_falkor, graph, _dir) = start_falkor().await;
    let v1_file = file("v1", "guides/guide.md");
    let (v1_chunks, v1_outline) = version_one();
    graph_writer::write_file(&graph, &v1_file, &v1_chunks, &v1_outline)
        .await
        .unwrap();
    // The entity stage's mentions, on every chunk of version 1.
    rows(
        &graph,
        "MERGE (e:Entity {entityKey: 'en_x'}) WITH e \
         MATCH (c:Chunk {fileId: $fileId}) CREATE (c)-[:MENTIONS {fileId: $fileId}]->(e)",
    )
    .await;
    // What an interrupted write would have left: a chunk and a section of no version.
    rows(
        &graph,
        "MATCH (f:FileRef {fileId: $fileId}) \
         CREATE (:Chunk {chunkKey: 'ch_left', fileId: $fileId, path: 'guides/guide.md', enabled: true})-[:PART_OF]->(f), \
                (:OutlineNode {outlineKey: 'ol_left', fileId: $fileId, path: 'guides/guide.md', enabled: true})",
    )
    .await;
    let ids_before: Vec<(String, i64)> = node_ids(&graph).await;

    let v2_file = file("v2", "archive/guide.md");
    let (v2_chunks, v2_outline) = version_two();
    let outcome = graph_writer::write_file(&graph, &v2_file, &v2_chunks, &v2_outline)
        .await
        .unwrap();
    assert_eq!(
        outcome,
        WriteOutcome::Written {
            chunks: 4,
            sections: 3
        }
    );

    // Kept nodes keep their ids; b, s2 and the leftovers are gone; e and s4 are new.
    let ids_after = node_ids(&graph).await;
    let keys_after: Vec<&str> = ids_after.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys_after,
        ["ch_a", "ch_c", "ch_d", "ch_e", "ol_s1", "ol_s3", "ol_s4"]
    );
    for kept in ["ch_a", "ch_c", "ch_d", "ol_s1", "ol_s3"] {
        let id = |ids: &[(String, i64)]| ids.iter().find(|(k, _)| k == kept).map(|(_, id)| *id);
        assert_eq!(id(&ids_before), id(&ids_after), "{kept} keeps its node");
    }
    // Their mentions stay until the entity stage writes the version's own.
    let mentioned: Vec<Value> = rows(
        &graph,
        "MATCH (c:Chunk {fileId: $fileId})-[:MENTIONS]->(:Entity) RETURN c.chunkKey ORDER BY c.chunkKey",
    )
    .await
    .into_iter()
    .map(|r| r[0].clone())
    .collect();
    assert_eq!(mentioned, [json!("ch_a"), json!("ch_c"), json!("ch_d")]);

    // Every property is the new version's: a null removed exactly its own property.
    let c = rows(
        &graph,
        "MATCH (c:Chunk {chunkKey: 'ch_c'}) RETURN properties(c)",
    )
    .await;
    let mut want = json!({
        "chunkKey": "ch_c", "fileId": FILE, "path": "archive/guide.md", "enabled": true,
        "hidden": false, "chunkIndex": 1, "text": "the text of ch_c",
        "textHash": kg_stores::chunk_text::text_hash("the text of ch_c"),
        "wordCount": kg_stores::chunk_text::word_count("Guide › Renamed", "the text of ch_c"),
        "contextHeader": "Guide › Renamed", "charStart": 100, "charEnd": 120,
        "lineStart": 4, "lineEnd": 5, "tokenCount": 5, "splitWords": "",
    });
    assert_eq!(c[0][0], want, "a kept chunk");
    let s3 = rows(
        &graph,
        "MATCH (o:OutlineNode {outlineKey: 'ol_s3'}) RETURN properties(o)",
    )
    .await;
    want = json!({
        "outlineKey": "ol_s3", "fileId": FILE, "path": "archive/guide.md", "enabled": true,
        "hidden": false, "title": "Section ol_s3", "depth": 2, "order": 2, "parentKey": "ol_s4",
        "lineStart": 21, "lineEnd": 29, "charStart": 200, "charEnd": 299,
    });
    assert_eq!(s3[0][0], want, "a kept section");
    let title = rows(
        &graph,
        "MATCH (o:OutlineNode {outlineKey: 'ol_s1'}) RETURN o.title",
    )
    .await;
    assert_eq!(title[0][0], json!("Overview"));

    // Edges are exactly the new version's, including between nodes both versions have
    // (c -> d and s1 -> s3 were stored and are not wanted).
    assert_eq!(
        edges(&graph, "NEXT_CHUNK").await,
        pairs(&[("ch_a", "ch_c"), ("ch_c", "ch_e"), ("ch_e", "ch_d")])
    );
    assert_eq!(
        edges(&graph, "HAS_SUBSECTION").await,
        pairs(&[("ol_s1", "ol_s4"), ("ol_s4", "ol_s3")])
    );
    assert_eq!(
        edges(&graph, "COVERS").await,
        pairs(&[
            ("ol_s1", "ch_a"),
            ("ol_s1", "ch_c"),
            ("ol_s1", "ch_e"),
            ("ol_s1", "ch_d"),
            ("ol_s4", "ch_e"),
            ("ol_s4", "ch_d"),
            ("ol_s3", "ch_d"),
        ])
    );
    let part_of = rows(
        &graph,
        "MATCH (c:Chunk {fileId: $fileId})-[p:PART_OF]->(:FileRef {fileId: $fileId}) \
         RETURN c.chunkKey, count(p) ORDER BY c.chunkKey",
    )
    .await;
    assert_eq!(
        part_of,
        ["ch_a", "ch_c", "ch_d", "ch_e"].map(|k| vec![json!(k), json!(1)])
    );

    // The same version again changes nothing; back to version 1, everything is its own.
    assert_eq!(
        graph_writer::write_file(&graph, &v2_file, &v2_chunks, &v2_outline)
            .await
            .unwrap(),
        WriteOutcome::Unchanged
    );
    graph_writer::write_file(&graph, &v1_file, &v1_chunks, &v1_outline)
        .await
        .unwrap();
    assert_eq!(
        edges(&graph, "NEXT_CHUNK").await,
        pairs(&[("ch_a", "ch_b"), ("ch_b", "ch_c"), ("ch_c", "ch_d")])
    );
    assert_eq!(
        edges(&graph, "HAS_SUBSECTION").await,
        pairs(&[("ol_s1", "ol_s2"), ("ol_s1", "ol_s3")])
    );
    assert_eq!(
        edges(&graph, "COVERS").await,
        pairs(&[
            ("ol_s1", "ch_a"),
            ("ol_s1", "ch_b"),
            ("ol_s1", "ch_c"),
            ("ol_s1", "ch_d"),
            ("ol_s2", "ch_c"),
            ("ol_s2", "ch_d"),
            ("ol_s3", "ch_b"),
        ])
    );
    let pages = rows(
        &graph,
        "MATCH (c:Chunk {chunkKey: 'ch_c'}) RETURN c.pageStart, c.pageEnd, c.sectionKey, c.contextHeader",
    )
    .await;
    assert_eq!(
        pages[0],
        [json!(2), json!(3), json!("ol_s2"), json!("Guide")]
    );
}

/// Chunks readable in the file, and those whose path is not the FileRef's.
async fn reader_view(graph: &GraphStore) -> (i64, i64) {
    let row = rows(
        graph,
        "MATCH (f:FileRef {fileId: $fileId}) \
         OPTIONAL MATCH (c:Chunk {fileId: $fileId}) WHERE c.enabled = true \
         RETURN count(c), count(CASE WHEN c.path <> f.vfsPath THEN 1 END)",
    )
    .await;
    (row[0][0].as_i64().unwrap(), row[0][1].as_i64().unwrap())
}

#[tokio::test]
async fn a_file_being_rewritten_is_never_found_without_chunks_or_under_its_old_path() {
    let (_falkor, graph, _dir) = start_falkor().await;
    // Two versions of 300 chunks sharing half their keys, each at its own path: a write
    // updates 150 chunks, creates 150 and prunes 150.
    let version = |n: u32, path: &str| {
        let chunks: Vec<ChunkRecord> = (0..300)
            .map(|i| {
                let key = if i % 2 == 0 {
                    format!("ch_shared_{i}")
                } else {
                    format!("ch_v{n}_{i}")
                };
                chunk(&key, i, None, None)
            })
            .collect();
        (file(&format!("v{n}"), path), chunks)
    };
    let versions = [version(1, "guides/a.md"), version(2, "archive/b.md")];
    graph_writer::write_file(&graph, &versions[0].0, &versions[0].1, &[])
        .await
        .unwrap();

    let writing = Arc::new(AtomicBool::new(true));
    let (reads, empty, misplaced) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let reader = {
        let (graph, writing) = (graph.clone(), writing.clone());
        let (reads, empty, misplaced) = (reads.clone(), empty.clone(), misplaced.clone());
        tokio::spawn(async move {
            while writing.load(Ordering::Relaxed) {
                let (count, wrong_path) = reader_view(&graph).await;
                reads.fetch_add(1, Ordering::Relaxed);
                if count == 0 {
                    empty.fetch_add(1, Ordering::Relaxed);
                }
                if wrong_path > 0 {
                    misplaced.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    for round in 1..=30 {
        let (file, chunks) = &versions[round % 2];
        graph_writer::write_file(&graph, file, chunks, &[])
            .await
            .unwrap();
    }
    writing.store(false, Ordering::Relaxed);
    reader.await.unwrap();

    let reads = reads.load(Ordering::Relaxed);
    assert!(
        reads > 30,
        "the reader ran beside the writes ({reads} reads)"
    );
    assert_eq!(
        empty.load(Ordering::Relaxed),
        0,
        "reads that found no chunk, of {reads}"
    );
    assert_eq!(
        misplaced.load(Ordering::Relaxed),
        0,
        "reads that found a chunk under another path than its file's, of {reads}"
    );
    // The last write was version 1: exactly its chunks, in its order.
    let keys: BTreeSet<String> = rows(
        &graph,
        "MATCH (c:Chunk {fileId: $fileId}) RETURN c.chunkKey",
    )
    .await
    .into_iter()
    .map(|r| r[0].as_str().unwrap().to_owned())
    .collect();
    let want: BTreeSet<String> = versions[0].1.iter().map(|c| c.chunk_key.clone()).collect();
    assert_eq!(keys, want);
    assert_eq!(edges(&graph, "NEXT_CHUNK").await.len(), 299);
    assert_eq!(reader_view(&graph).await, (300, 0));
}

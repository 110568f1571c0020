//! Similar files against real stores: FalkorDB for the graph and a qdrant-edge shard for
//! the file vectors. The `similar` hop lands on the first chunks of the most similar
//! readable files; every package carries `similarFiles` clipped at `caps.similar`; neither
//! ever names a file the caller may not read or a disabled one; without a vector index the
//! hop is `UNAVAILABLE` with its reason and packages carry no similar files.

use kg_common::ErrorExt;
use kg_common::caller::{CONTEXT_TTL_MS, now_ms};
use kg_common::error::ErrorCode;
use kg_graph::{GraphError, GraphService};
use kg_proto::v1::open_request::Key;
use kg_proto::v1::{
    AccessFilter, CallerContext, ChunkPackage, HopKind, HopRequest, OpenRequest, PackageCaps,
    PackagesRequest, PackagesResponse, Permission,
};
use kg_stores::embedded::{EmbeddedFalkor, find_venv};
use kg_stores::graph::{GraphStore, Params};
use kg_stores::vector::{EdgeIndex, PointKind, ServerIndex, VectorIndex, VectorPoint};
use serde_json::{Value, json};

const NS: &str = "sim";
const DIM: usize = 4;

/// (file id, path, enabled, chunks, file vector).
type FileRow = (&'static str, &'static str, bool, i64, Option<[f32; DIM]>);

/// The fixture files. `fg` was indexed without embeddings.
const FILES: [FileRow; 7] = [
    ("fa", "docs/a.md", true, 2, Some([1.0, 0.0, 0.0, 0.0])),
    ("fb", "docs/b.md", true, 2, Some([0.9, 0.1, 0.0, 0.0])),
    ("fc", "secret/c.md", true, 1, Some([0.95, 0.05, 0.0, 0.0])),
    ("fd", "docs/off.md", false, 1, Some([1.0, 0.0, 0.0, 0.0])),
    ("fe", "docs/e.md", true, 2, Some([0.0, 1.0, 0.0, 0.0])),
    ("ff", "docs/f.md", true, 1, Some([0.5, 0.5, 0.0, 0.0])),
    ("fg", "docs/g.md", true, 1, None),
];

fn caller(edit: impl Fn(&mut AccessFilter)) -> CallerContext {
    let now = now_ms();
    let mut access = AccessFilter {
        namespace: NS.into(),
        allow_prefixes: vec![String::new()],
        enabled_only: true,
        visible_only: true,
        permission: Permission::Read as i32,
        ..Default::default()
    };
    edit(&mut access);
    CallerContext {
        principal_id: "tester".into(),
        access: vec![access],
        issued_at_ms: now,
        expires_at_ms: now + CONTEXT_TTL_MS,
        ..Default::default()
    }
}

fn full() -> CallerContext {
    caller(|_| {})
}

fn restricted() -> CallerContext {
    caller(|a| a.deny_prefixes = vec!["secret/".into()])
}

async fn write(store: &GraphStore, cypher: &str, params: Value) {
    let params: Params = match params {
        Value::Object(map) => map.into_iter().collect(),
        _ => Params::new(),
    };
    store.query(NS, cypher, &params).await.unwrap();
}

async fn fixture(store: &GraphStore, index: &VectorIndex) {
    let mut points = Vec::new();
    for (file_id, path, enabled, chunks, vector) in FILES {
        write(
            store,
            "CREATE (:FileRef {fileId: $fileId, versionId: 'v1', vfsPath: $path, name: $path, \
             folderPath: '', enabled: $enabled, hidden: false, title: $path, mime: 'text/markdown', \
             chunkCount: $n})",
            json!({"fileId": file_id, "path": path, "enabled": enabled, "n": chunks}),
        )
        .await;
        let prefix = &file_id[1..];
        // Created last chunk first, so "first chunk" must come from chunkIndex, not order.
        for i in (0..chunks).rev() {
            write(
                store,
                "MATCH (f:FileRef {fileId: $fileId}) \
                 CREATE (c:Chunk {chunkKey: $key, fileId: $fileId, path: $path, enabled: $enabled, \
                   chunkIndex: $i, text: $text, contextHeader: $path, charStart: 0, charEnd: 10, \
                   lineStart: 1, lineEnd: 1, tokenCount: 3}) \
                 CREATE (c)-[:PART_OF]->(f)",
                json!({"fileId": file_id, "path": path, "enabled": enabled, "i": i,
                       "key": format!("{prefix}{i}"), "text": format!("chunk {i} of {path}")}),
            )
            .await;
        }
        if let Some(vector) = vector {
            points.push(VectorPoint {
                text_hash: None,
                embed_hash: None,
                namespace: NS.into(),
                kind: PointKind::File,
                chunk_key: String::new(),
                file_id: file_id.into(),
                path: path.into(),
                enabled,
                hidden: false,
                collections: Vec::new(),
                document_date: None,
                vector: vector.to_vec(),
            });
        }
    }
    index.upsert(points).await.unwrap();
}

async fn hop(
    service: &GraphService,
    caller: &CallerContext,
    from: &str,
    limit: u32,
) -> Result<PackagesResponse, GraphError> {
    service
        .hop_for(
            caller,
            HopRequest {
                namespace: NS.into(),
                from_key: from.into(),
                kind: HopKind::Similar as i32,
                limit,
                caps: None,
            },
        )
        .await
}

async fn hop_ok(
    service: &GraphService,
    caller: &CallerContext,
    from: &str,
    limit: u32,
) -> (Vec<String>, u64, bool) {
    let response = hop(service, caller, from, limit)
        .await
        .unwrap_or_else(|err| panic!("similar from {from}: {err}"));
    (
        response
            .packages
            .iter()
            .map(|p| p.chunk_key.clone())
            .collect(),
        response.total,
        response.truncated,
    )
}

async fn open(
    service: &GraphService,
    caller: &CallerContext,
    key: &str,
    similar: Option<u32>,
) -> ChunkPackage {
    let mut response = service
        .open_for(
            caller,
            OpenRequest {
                namespace: NS.into(),
                key: Some(Key::ChunkKey(key.into())),
                limit: 0,
                caps: Some(PackageCaps {
                    similar,
                    ..Default::default()
                }),
            },
        )
        .await
        .unwrap();
    response.packages.remove(0)
}

fn similar_ids(package: &ChunkPackage) -> Vec<&str> {
    package
        .similar_files
        .iter()
        .map(|s| s.file_id.as_str())
        .collect()
}

/// `(total, truncated)` of the package's similarFiles count, when the list was clipped.
fn similar_count(package: &ChunkPackage) -> Option<(i64, bool)> {
    package
        .counts
        .as_ref()?
        .lists
        .iter()
        .find(|c| c.list == "similarFiles")
        .map(|c| (c.total, c.truncated))
}

fn s(keys: &[&str]) -> Vec<String> {
    keys.iter().map(|k| (*k).to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn similar_files_in_hops_and_packages() {
    let venv = find_venv().expect("the dev-deps virtualenv (run deploy/scripts/dev-deps.sh)");
    let dir = tempfile::tempdir().unwrap();
    let falkor = EmbeddedFalkor::start(&venv, &dir.path().join("falkor"))
        .await
        .unwrap();
    let store = GraphStore::connect(&falkor.url).await.unwrap();
    let index = VectorIndex::from(
        EdgeIndex::open(dir.path().join("vectors"), DIM)
            .await
            .unwrap(),
    );
    fixture(&store, &index).await;

    // Without a vector index: the hop says why, packages carry no similar files.
    let bare = GraphService::new(store.clone());
    let err = hop(&bare, &full(), "a1", 0).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable);
    assert!(err.to_string().contains("without embeddings"), "{err}");
    let a0 = open(&bare, &full(), "a0", None).await;
    assert!(a0.similar_files.is_empty() && similar_count(&a0).is_none());
    let a0 = open(&bare, &full(), "a0", Some(0)).await;
    assert!(a0.similar_files.is_empty() && similar_count(&a0).is_none());

    let service = GraphService::new(store.clone()).with_vectors(index.clone());
    // From any chunk of docs/a.md: the first chunk of each similar file, best file first.
    // secret/c.md is nearest; the disabled docs/off.md (identical vector) never appears;
    // docs/g.md has no file vector; a.md itself is left out.
    assert_eq!(
        hop_ok(&service, &full(), "a1", 0).await,
        (s(&["c0", "b0", "f0", "e0"]), 4, false)
    );
    assert_eq!(
        hop_ok(&service, &full(), "a0", 2).await,
        (s(&["c0", "b0"]), 4, true)
    );
    // A caller who may not read secret/ gets neither its chunk nor its place in the total.
    assert_eq!(
        hop_ok(&service, &restricted(), "a1", 0).await,
        (s(&["b0", "f0", "e0"]), 3, false)
    );
    // Unreadable or disabled start chunks are not found; a file without a vector is
    // unavailable with the reason, never an empty answer.
    for (caller, from) in [(restricted(), "c0"), (full(), "d0"), (full(), "nope")] {
        let err = hop(&service, &caller, from, 0).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::NotFound, "from {from}");
    }
    let err = hop(&service, &full(), "g0", 0).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable);
    assert!(err.to_string().contains("no file vector"), "{err}");
    // The hop's packages carry their own similar files.
    let response = hop(&service, &restricted(), "a0", 1).await.unwrap();
    assert_eq!(similar_ids(&response.packages[0]), vec!["fa", "ff", "fe"]);

    // Packages: default cap 4, nothing clipped for the full caller (4 readable others).
    let a0 = open(&service, &full(), "a0", None).await;
    assert_eq!(similar_ids(&a0), vec!["fc", "fb", "ff", "fe"]);
    assert_eq!(a0.similar_files[0].path, "secret/c.md");
    assert!(
        a0.similar_files
            .windows(2)
            .all(|w| w[0].score >= w[1].score && w[0].score <= 1.0 + 1e-6),
        "{:?}",
        a0.similar_files
    );
    assert!(similar_count(&a0).is_none());
    // A smaller cap clips and reports the total.
    let a0 = open(&service, &full(), "a0", Some(2)).await;
    assert_eq!(similar_ids(&a0), vec!["fc", "fb"]);
    assert_eq!(similar_count(&a0), Some((4, true)));
    let a0 = open(&service, &restricted(), "a0", Some(2)).await;
    assert_eq!(similar_ids(&a0), vec!["fb", "ff"]);
    assert_eq!(similar_count(&a0), Some((3, true)));
    // A cap of 0 is an empty list that still reports how many readable files there are.
    let a0 = open(&service, &full(), "a0", Some(0)).await;
    assert!(a0.similar_files.is_empty());
    assert_eq!(similar_count(&a0), Some((4, true)));
    let a0 = open(&service, &restricted(), "a0", Some(0)).await;
    assert!(a0.similar_files.is_empty());
    assert_eq!(similar_count(&a0), Some((3, true)));
    // A file with no similar file to rank reports nothing, even at 0.
    let g0 = open(&service, &full(), "g0", Some(0)).await;
    assert!(g0.similar_files.is_empty() && similar_count(&g0).is_none());
    // Each package gets its own file's neighbours, never its own file.
    let response = service
        .packages_for(
            &restricted(),
            PackagesRequest {
                namespace: NS.into(),
                chunk_keys: s(&["b1", "a0", "g0", "c0"]),
                caps: Some(PackageCaps {
                    similar: Some(16),
                    ..Default::default()
                }),
            },
        )
        .await
        .unwrap();
    let got: Vec<(&str, Vec<&str>)> = response
        .packages
        .iter()
        .map(|p| (p.chunk_key.as_str(), similar_ids(p)))
        .collect();
    assert_eq!(
        got,
        vec![
            ("b1", vec!["fa", "ff", "fe"]),
            ("a0", vec!["fb", "ff", "fe"]),
            ("g0", vec![]),
        ]
    );
    // Over the hard maximum fails closed.
    let err = service
        .open_for(
            &full(),
            OpenRequest {
                namespace: NS.into(),
                key: Some(Key::ChunkKey("a0".into())),
                limit: 0,
                caps: Some(PackageCaps {
                    similar: Some(17),
                    ..Default::default()
                }),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);

    // Disabling a file takes it out at once.
    index.set_file_flags(NS, "fc", false, false).await.unwrap();
    assert_eq!(
        hop_ok(&service, &full(), "a1", 0).await,
        (s(&["b0", "f0", "e0"]), 3, false)
    );

    // A vector index that is down: packages still arrive (without similar files); the
    // hop, whose whole answer is similar files, reports the outage.
    let down =
        VectorIndex::from(ServerIndex::connect("http://127.0.0.1:1", None, "kg", DIM).unwrap());
    let service = GraphService::new(store.clone()).with_vectors(down);
    let a0 = open(&service, &full(), "a0", None).await;
    assert!(a0.similar_files.is_empty());
    assert_eq!(a0.chunk_key, "a0");
    let err = hop(&service, &full(), "a0", 0).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable);
}

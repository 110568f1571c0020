//! The embedded vector index (qdrant-edge) end to end: upsert, search, count, flags,
//! deletes, persistence, batching and optimisation, on a real shard in a temp directory.
use kg_proto::v1::AccessFilter;
use kg_stores::vector::{
    EdgeIndex, PointKind, Scope, UPSERT_BATCH, VectorError, VectorIndex, VectorPoint,
};

const DIM: usize = 4;

fn chunk(file: usize, index: usize, path: &str) -> VectorPoint {
    VectorPoint {
        text_hash: None,
        embed_hash: None,
        namespace: "alpha".into(),
        kind: PointKind::Chunk,
        chunk_key: format!("f{file}-c{index}"),
        file_id: format!("f{file}"),
        path: path.into(),
        enabled: true,
        hidden: false,
        collections: if file.is_multiple_of(2) {
            vec!["even".into()]
        } else {
            vec!["odd".into(), "all".into()]
        },
        document_date: Some("2024-05-01".into()),
        vector: vec![1.0, file as f32, index as f32, 0.5],
    }
}

fn whole(ns: &str) -> AccessFilter {
    AccessFilter {
        namespace: ns.into(),
        allow_prefixes: vec![String::new()],
        enabled_only: true,
        visible_only: true,
        ..Default::default()
    }
}

#[tokio::test]
async fn search_count_flags_delete_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vectors");
    let index = VectorIndex::from(EdgeIndex::open(&path, DIM).await.unwrap());
    assert_eq!(index.dimension(), DIM);

    let mut points = vec![
        chunk(1, 0, "guides/a.md"),
        chunk(1, 1, "guides/a.md"),
        chunk(2, 0, "guides/b.md"),
        chunk(3, 0, "notes/c.md"),
    ];
    // A file-level vector for file 1, and a point in another namespace.
    points.push(VectorPoint {
        kind: PointKind::File,
        chunk_key: String::new(),
        ..chunk(1, 9, "guides/a.md")
    });
    // Same file id and chunk key in another namespace: a separate point.
    points.push(VectorPoint {
        namespace: "beta".into(),
        ..chunk(1, 0, "guides/a.md")
    });
    index.upsert(points.clone()).await.unwrap();

    let access = whole("alpha");
    assert_eq!(index.count(&access, &Scope::chunks()).await.unwrap(), 4);
    assert_eq!(index.count(&access, &Scope::files()).await.unwrap(), 1);
    assert_eq!(
        index.count(&whole("beta"), &Scope::chunks()).await.unwrap(),
        1
    );

    // The exact vector of f2-c0 is the nearest; scores are cosine similarities.
    let hits = index
        .search(&access, &Scope::chunks(), vec![1.0, 2.0, 0.0, 0.5], 10)
        .await
        .unwrap();
    assert_eq!(hits.len(), 4);
    assert_eq!(hits[0].chunk_key.as_deref(), Some("f2-c0"));
    assert_eq!(hits[0].file_id, "f2");
    assert_eq!(hits[0].path, "guides/b.md");
    assert!((hits[0].score - 1.0).abs() < 1e-4, "{}", hits[0].score);
    assert!(hits.windows(2).all(|w| w[0].score >= w[1].score));
    let limited = index
        .search(&access, &Scope::chunks(), vec![1.0, 2.0, 0.0, 0.5], 2)
        .await
        .unwrap();
    assert_eq!(limited.len(), 2);
    let files = index
        .search(&access, &Scope::files(), vec![1.0, 1.0, 9.0, 0.5], 10)
        .await
        .unwrap();
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].chunk_key, None);
    assert_eq!(files[0].file_id, "f1");

    // Scope: collections and excluded files.
    let odd = Scope {
        collections: vec!["all".into()],
        ..Scope::chunks()
    };
    assert_eq!(index.count(&access, &odd).await.unwrap(), 3);
    let not_f1 = Scope {
        exclude_file_ids: vec!["f1".into()],
        ..Scope::chunks()
    };
    assert_eq!(index.count(&access, &not_f1).await.unwrap(), 2);

    // Upserting the same chunk again replaces it.
    index
        .upsert(vec![chunk(1, 0, "guides/a.md")])
        .await
        .unwrap();
    assert_eq!(index.count(&access, &Scope::chunks()).await.unwrap(), 4);

    // Disable f1, hide f2: gone for a reader, still there for an admin view.
    index
        .set_file_flags("alpha", "f1", false, false)
        .await
        .unwrap();
    index
        .set_file_flags("alpha", "f2", true, true)
        .await
        .unwrap();
    let ids = |hits: Vec<kg_stores::vector::VectorHit>| {
        let mut ids: Vec<String> = hits.into_iter().map(|h| h.file_id).collect();
        ids.sort();
        ids.dedup();
        ids
    };
    let reader = index
        .search(&access, &Scope::chunks(), vec![1.0, 1.0, 1.0, 1.0], 10)
        .await
        .unwrap();
    assert_eq!(ids(reader), vec!["f3"]);
    let admin = AccessFilter {
        enabled_only: false,
        visible_only: false,
        ..whole("alpha")
    };
    assert_eq!(index.count(&admin, &Scope::chunks()).await.unwrap(), 4);
    // The flags reach the file-level vector too.
    assert_eq!(index.count(&access, &Scope::files()).await.unwrap(), 0);
    // The other namespace's point with the same file id is untouched.
    assert_eq!(
        index.count(&whole("beta"), &Scope::chunks()).await.unwrap(),
        1
    );

    // Delete f1 entirely (chunks and file vector).
    index.delete_file("alpha", "f1").await.unwrap();
    assert_eq!(index.count(&admin, &Scope::chunks()).await.unwrap(), 2);
    assert_eq!(index.count(&admin, &Scope::files()).await.unwrap(), 0);
    assert_eq!(
        index.count(&whole("beta"), &Scope::chunks()).await.unwrap(),
        1
    );

    // Everything survives closing and reopening the directory.
    drop(index);
    let reopened = EdgeIndex::open(&path, DIM).await.unwrap();
    assert_eq!(reopened.count(&admin, &Scope::chunks()).await.unwrap(), 2);
    assert_eq!(
        ids(reopened
            .search(&access, &Scope::chunks(), vec![1.0, 1.0, 1.0, 1.0], 10)
            .await
            .unwrap()),
        vec!["f3"]
    );
    assert_eq!(
        reopened
            .count(&whole("beta"), &Scope::chunks())
            .await
            .unwrap(),
        1
    );
}

#[tokio::test]
async fn one_shard_per_directory_and_dimension_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let a = EdgeIndex::open(dir.path(), DIM).await.unwrap();
    // A second open in the same process shares the shard: its writes are seen at once.
    let b = EdgeIndex::open(dir.path(), DIM).await.unwrap();
    b.upsert(vec![chunk(1, 0, "a.md")]).await.unwrap();
    assert_eq!(a.count(&whole("alpha"), &Scope::chunks()).await.unwrap(), 1);
    let err = EdgeIndex::open(dir.path(), DIM + 1).await.unwrap_err();
    assert!(matches!(err, VectorError::Incompatible { .. }), "{err:?}");
    drop((a, b));
    // Also checked against the configuration on disk.
    let err = EdgeIndex::open(dir.path(), 8).await.unwrap_err();
    assert!(matches!(err, VectorError::Incompatible { .. }), "{err:?}");
}

#[tokio::test]
async fn invalid_input_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let index = EdgeIndex::open(dir.path(), DIM).await.unwrap();
    let bad_path = chunk(1, 1, "guides//x.md");
    let err = index
        .upsert(vec![chunk(1, 0, "a.md"), bad_path])
        .await
        .unwrap_err();
    assert!(matches!(err, VectorError::InvalidInput { .. }), "{err:?}");
    let short = VectorPoint {
        vector: vec![1.0],
        ..chunk(1, 0, "a.md")
    };
    assert!(index.upsert(vec![short]).await.is_err());
    assert_eq!(
        index
            .count(&whole("alpha"), &Scope::chunks())
            .await
            .unwrap(),
        0
    );
    let err = index
        .search(&whole("alpha"), &Scope::chunks(), vec![1.0, 0.0], 3)
        .await
        .unwrap_err();
    assert!(matches!(err, VectorError::InvalidInput { .. }), "{err:?}");
    let err = index
        .search(&whole("alpha"), &Scope::chunks(), vec![1.0; DIM], 1_000_000)
        .await
        .unwrap_err();
    assert!(matches!(err, VectorError::InvalidInput { .. }), "{err:?}");
}

#[tokio::test]
async fn batches_and_optimisation_keep_filters_exact() {
    let dir = tempfile::tempdir().unwrap();
    let index = EdgeIndex::open(dir.path(), DIM).await.unwrap();
    // Ten files, several batches of chunks; files 0, 3, 6, 9 are under secret/.
    let n = UPSERT_BATCH * 5 + 17;
    let folder = |file: usize| {
        if file.is_multiple_of(3) {
            "secret"
        } else {
            "open"
        }
    };
    let points: Vec<VectorPoint> = (0..n)
        .map(|i| {
            let file = i % 10;
            let mut p = chunk(file, i, &format!("{}/doc-{file}.md", folder(file)));
            p.vector = vec![1.0, (i % 7) as f32, (i % 11) as f32, 1.0];
            p
        })
        .collect();
    let expect = |deleted: &[usize]| {
        (0..n)
            .filter(|i| folder(i % 10) == "open" && !deleted.contains(&(i % 10)))
            .count() as u64
    };
    index.upsert(points).await.unwrap();
    let open_only = AccessFilter {
        deny_prefixes: vec!["secret/".into()],
        ..whole("alpha")
    };
    assert_eq!(
        index
            .count(&whole("alpha"), &Scope::chunks())
            .await
            .unwrap(),
        n as u64
    );
    assert_eq!(
        index.count(&open_only, &Scope::chunks()).await.unwrap(),
        expect(&[])
    );
    // Deleting 30% of the points makes the vacuum optimizer rebuild the segment.
    for file in [1, 2, 4] {
        index
            .delete_file("alpha", &format!("f{file}"))
            .await
            .unwrap();
    }
    assert!(index.optimize().await.unwrap(), "nothing was optimised");
    assert_eq!(
        index.count(&open_only, &Scope::chunks()).await.unwrap(),
        expect(&[1, 2, 4])
    );
    let hits = index
        .search(&open_only, &Scope::chunks(), vec![1.0, 3.0, 5.0, 1.0], 50)
        .await
        .unwrap();
    assert_eq!(hits.len(), 50);
    assert!(hits.iter().all(|h| h.path.starts_with("open/")));
    assert!(
        hits.iter()
            .all(|h| !["f1", "f2", "f4"].contains(&h.file_id.as_str()))
    );
}

#[tokio::test]
async fn a_files_stored_vectors_are_read_by_embed_hash_across_pages() {
    let dir = tempfile::tempdir().unwrap();
    let index = VectorIndex::from(
        EdgeIndex::open(dir.path().join("vectors"), DIM)
            .await
            .unwrap(),
    );
    let hashed = |file: usize, i: usize| VectorPoint {
        embed_hash: Some(format!("h{file}-{i}")),
        ..chunk(file, i, "guides/a.md")
    };
    // More chunks than a page holds, so the read must follow the scroll's offset.
    let many = UPSERT_BATCH + 44;
    let mut points: Vec<VectorPoint> = (0..many).map(|i| hashed(1, i)).collect();
    points.push(chunk(1, many, "guides/a.md")); // written before hashes existed
    points.push(VectorPoint {
        kind: PointKind::File,
        chunk_key: String::new(),
        embed_hash: Some("file-point".into()),
        ..chunk(1, 0, "guides/a.md")
    });
    points.push(hashed(2, 0)); // another file
    points.push(VectorPoint {
        namespace: "beta".into(),
        embed_hash: Some("beta".into()),
        ..chunk(1, 0, "guides/a.md")
    }); // the same file id in another namespace
    index.upsert(points).await.unwrap();

    let stored = index.stored_chunk_vectors("alpha", "f1").await.unwrap();
    assert_eq!(
        stored.len(),
        many,
        "every hashed chunk of the file, nothing else"
    );
    // A cosine index stores unit vectors; the indexer only writes those.
    let unit = |v: Vec<f32>| {
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.into_iter().map(|x| x / norm).collect::<Vec<f32>>()
    };
    let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6);
    for i in [0, many - 1] {
        let want = unit(chunk(1, i, "guides/a.md").vector);
        assert!(close(&stored[&format!("h1-{i}")], &want), "chunk {i}");
    }
    assert!(!stored.contains_key("file-point") && !stored.contains_key("beta"));
    assert!(
        index
            .stored_chunk_vectors("alpha", "f9")
            .await
            .unwrap()
            .is_empty()
    );
}

/// The chunk keys of the file's points in namespace alpha, sorted.
async fn chunk_keys(index: &VectorIndex, file_id: &str) -> Vec<String> {
    let hits = index
        .search(&whole("alpha"), &Scope::chunks(), vec![1.0; DIM], 100)
        .await
        .unwrap();
    let mut keys: Vec<String> = hits
        .into_iter()
        .filter(|hit| hit.file_id == file_id)
        .filter_map(|hit| hit.chunk_key)
        .collect();
    keys.sort();
    keys
}

fn file_point(file: usize, path: &str) -> VectorPoint {
    VectorPoint {
        kind: PointKind::File,
        chunk_key: String::new(),
        ..chunk(file, 9, path)
    }
}

#[tokio::test]
async fn a_replace_keeps_the_files_unchanged_points_and_removes_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let index = VectorIndex::from(EdgeIndex::open(dir.path(), DIM).await.unwrap());
    let elsewhere = VectorPoint {
        namespace: "beta".into(),
        ..chunk(1, 2, "guides/a.md")
    };
    index
        .upsert(vec![
            chunk(1, 0, "guides/a.md"),
            chunk(1, 1, "guides/a.md"),
            chunk(1, 2, "guides/a.md"),
            file_point(1, "guides/a.md"),
            chunk(2, 0, "guides/b.md"),
            elsewhere,
        ])
        .await
        .unwrap();

    // The new version: chunk 0 with another vector, chunk 1 as it was, chunk 2 gone, chunk 3 new.
    let rewritten = VectorPoint {
        vector: vec![0.0, 0.0, 1.0, 0.0],
        ..chunk(1, 0, "guides/a.md")
    };
    index
        .replace_file(
            "alpha",
            "f1",
            vec![
                rewritten,
                chunk(1, 1, "guides/a.md"),
                chunk(1, 3, "guides/a.md"),
                file_point(1, "guides/a.md"),
            ],
        )
        .await
        .unwrap();
    assert_eq!(chunk_keys(&index, "f1").await, ["f1-c0", "f1-c1", "f1-c3"]);
    assert_eq!(chunk_keys(&index, "f2").await, ["f2-c0"]);
    let nearest = index
        .search(
            &whole("alpha"),
            &Scope::chunks(),
            vec![0.0, 0.0, 1.0, 0.0],
            1,
        )
        .await
        .unwrap();
    assert_eq!(nearest[0].chunk_key.as_deref(), Some("f1-c0"));
    assert!(nearest[0].score > 0.999, "{}", nearest[0].score);
    assert_eq!(
        index.count(&whole("alpha"), &Scope::files()).await.unwrap(),
        1
    );
    // The same file id in another namespace is another file.
    assert_eq!(
        index.count(&whole("beta"), &Scope::chunks()).await.unwrap(),
        1
    );

    // A point of another file, or of another dimension, writes nothing and removes nothing.
    let err = index
        .replace_file(
            "alpha",
            "f1",
            vec![chunk(1, 4, "guides/a.md"), chunk(2, 1, "guides/b.md")],
        )
        .await
        .unwrap_err();
    assert!(matches!(err, VectorError::InvalidInput { .. }), "{err:?}");
    assert!(err.to_string().contains("`f2`"), "{err}");
    let short = VectorPoint {
        vector: vec![1.0],
        ..chunk(1, 4, "guides/a.md")
    };
    assert!(
        index
            .replace_file("alpha", "f1", vec![short])
            .await
            .is_err()
    );
    assert_eq!(chunk_keys(&index, "f1").await, ["f1-c0", "f1-c1", "f1-c3"]);

    // A version without points removes the file's, its file point included.
    index.replace_file("alpha", "f1", Vec::new()).await.unwrap();
    assert!(chunk_keys(&index, "f1").await.is_empty());
    assert_eq!(
        index.count(&whole("alpha"), &Scope::files()).await.unwrap(),
        0
    );
    assert_eq!(chunk_keys(&index, "f2").await, ["f2-c0"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_being_replaced_is_never_found_without_points() {
    let dir = tempfile::tempdir().unwrap();
    let index = VectorIndex::from(EdgeIndex::open(dir.path(), DIM).await.unwrap());
    // Two versions that share chunk 0 and differ in the rest.
    let version = |round: usize| -> Vec<VectorPoint> {
        let mut points: Vec<VectorPoint> = (0..4)
            .map(|i| {
                chunk(
                    1,
                    if i == 0 { 0 } else { i + 4 * (round % 2) },
                    "guides/a.md",
                )
            })
            .collect();
        points.push(file_point(1, "guides/a.md"));
        points
    };
    index.upsert(version(0)).await.unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = tokio::spawn({
        let (index, stop) = (index.clone(), stop.clone());
        async move {
            let (mut fewest, mut reads) = (u64::MAX, 0u32);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || reads == 0 {
                let n = index
                    .count(&whole("alpha"), &Scope::chunks())
                    .await
                    .unwrap();
                fewest = fewest.min(n);
                reads += 1;
            }
            (fewest, reads)
        }
    });
    for round in 1..=60 {
        index
            .replace_file("alpha", "f1", version(round))
            .await
            .unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (fewest, reads) = reader.await.unwrap();
    // Between the write and the prune a reader may see both versions' points, never none.
    assert!(fewest >= 4, "a reader saw {fewest} points in {reads} reads");
    assert_eq!(
        index
            .count(&whole("alpha"), &Scope::chunks())
            .await
            .unwrap(),
        4
    );
}

#[tokio::test]
async fn a_namespaces_stored_vectors_are_found_by_hash_in_batches() {
    let dir = tempfile::tempdir().unwrap();
    let index = VectorIndex::from(EdgeIndex::open(dir.path(), DIM).await.unwrap());
    let hashed = |file: usize, i: usize, hash: String| VectorPoint {
        embed_hash: Some(hash),
        ..chunk(file, i, "guides/a.md")
    };
    // More hashes than one request names, in one file, with a copy of the first in another
    // file, the same hash in another namespace, and a file point.
    let many = kg_stores::vector::HASHES_PER_LOOKUP + 44;
    let mut points: Vec<VectorPoint> = (0..many).map(|i| hashed(1, i, format!("h{i}"))).collect();
    points.push(hashed(2, 0, "h0".into()));
    points.push(VectorPoint {
        namespace: "beta".into(),
        ..hashed(3, 0, "only-in-beta".into())
    });
    points.push(VectorPoint {
        embed_hash: Some("file-point".into()),
        ..file_point(1, "guides/a.md")
    });
    index.upsert(points).await.unwrap();

    let mut asked: Vec<String> = (0..many).map(|i| format!("h{i}")).collect();
    asked.extend(["only-in-beta".into(), "file-point".into(), "unknown".into()]);
    let found = index.stored_vectors_by_hash("alpha", &asked).await.unwrap();
    assert_eq!(found.len(), many);
    // Stored normalised (cosine): the same direction as the vector written.
    let written = chunk(1, 7, "guides/a.md").vector;
    let norm = written.iter().map(|v| v * v).sum::<f32>().sqrt();
    let cosine: f32 = written
        .iter()
        .zip(&found["h7"])
        .map(|(a, b)| a * b)
        .sum::<f32>()
        / norm;
    assert!(cosine > 0.9999, "{cosine}");
    assert!(!found.contains_key("only-in-beta") && !found.contains_key("file-point"));
    assert!(
        index
            .stored_vectors_by_hash("alpha", &[])
            .await
            .unwrap()
            .is_empty()
    );
}

//! File-level similarity on a real qdrant-edge shard: reading a file vector back and
//! searching file points only, without the file itself, under the access filter.
use kg_proto::v1::AccessFilter;
use kg_stores::vector::{EdgeIndex, PointKind, Scope, VectorError, VectorIndex, VectorPoint};

const DIM: usize = 4;

fn point(kind: PointKind, file: &str, path: &str, vector: [f32; DIM]) -> VectorPoint {
    VectorPoint {
        text_hash: None,
        embed_hash: None,
        namespace: "alpha".into(),
        kind,
        chunk_key: match kind {
            PointKind::Chunk => format!("{file}-c0"),
            PointKind::File => String::new(),
        },
        file_id: file.into(),
        path: path.into(),
        enabled: true,
        hidden: false,
        collections: vec!["all".into()],
        document_date: None,
        vector: vector.to_vec(),
    }
}

fn file(id: &str, path: &str, vector: [f32; DIM]) -> VectorPoint {
    point(PointKind::File, id, path, vector)
}

fn access(allow: &[&str]) -> AccessFilter {
    AccessFilter {
        namespace: "alpha".into(),
        allow_prefixes: allow.iter().map(|s| (*s).to_owned()).collect(),
        enabled_only: true,
        visible_only: true,
        ..Default::default()
    }
}

fn ids(hits: &[kg_stores::vector::VectorHit]) -> Vec<&str> {
    hits.iter().map(|h| h.file_id.as_str()).collect()
}

async fn similar(
    index: &VectorIndex,
    access: &AccessFilter,
    file_id: &str,
    limit: usize,
) -> Option<Vec<String>> {
    index
        .similar_files(access, &Scope::files(), "alpha", file_id, limit)
        .await
        .unwrap()
        .map(|hits| {
            assert!(
                hits.windows(2).all(|w| w[0].score >= w[1].score),
                "best first: {hits:?}"
            );
            assert!(hits.iter().all(|h| h.chunk_key.is_none()), "{hits:?}");
            ids(&hits).into_iter().map(str::to_owned).collect()
        })
}

#[tokio::test]
async fn similar_files_rank_readable_enabled_file_points_without_the_file_itself() {
    let dir = tempfile::tempdir().unwrap();
    let index = VectorIndex::from(EdgeIndex::open(dir.path(), DIM).await.unwrap());
    let mut points = vec![
        file("f1", "guides/a.md", [1.0, 0.0, 0.0, 0.0]),
        file("f2", "guides/b.md", [0.8, 0.2, 0.0, 0.0]),
        file("f3", "secret/c.md", [0.95, 0.05, 0.0, 0.0]),
        file("f4", "guides/d.md", [0.0, 1.0, 0.0, 0.0]),
        // Identical to f1 but disabled: never similar under enabled_only.
        VectorPoint {
            enabled: false,
            ..file("f5", "guides/e.md", [1.0, 0.0, 0.0, 0.0])
        },
        // Hidden: out for a caller that sees only visible files.
        VectorPoint {
            hidden: true,
            ..file("f8", "guides/h.md", [0.9, 0.1, 0.0, 0.0])
        },
        // A chunk point (not a file point) identical to f1, and a file without a file point.
        point(PointKind::Chunk, "f6", "guides/f.md", [1.0, 0.0, 0.0, 0.0]),
        // The file's own chunk, also identical: kind = file keeps it out.
        point(PointKind::Chunk, "f1", "guides/a.md", [1.0, 0.0, 0.0, 0.0]),
    ];
    // The same file id in another namespace.
    points.push(VectorPoint {
        namespace: "beta".into(),
        ..file("f7", "guides/a.md", [1.0, 0.0, 0.0, 0.0])
    });
    index.upsert(points).await.unwrap();

    let all = access(&[""]);
    // The stored file vector comes back (normalised, as cosine storage keeps it).
    let v = index.file_vector(&all, "f2").await.unwrap().unwrap();
    let norm = (0.8f32 * 0.8 + 0.2 * 0.2).sqrt();
    for (got, want) in v.iter().zip([0.8 / norm, 0.2 / norm, 0.0, 0.0]) {
        assert!((got - want).abs() < 1e-5, "{v:?}");
    }
    // A chunk-only file, an unknown file and a disabled file have no readable file vector.
    assert_eq!(index.file_vector(&all, "f6").await.unwrap(), None);
    assert_eq!(index.file_vector(&all, "nope").await.unwrap(), None);
    assert_eq!(index.file_vector(&all, "f5").await.unwrap(), None);

    for round in 0..2 {
        assert_eq!(
            similar(&index, &all, "f1", 10).await.unwrap(),
            vec!["f3", "f2", "f4"],
            "round {round}"
        );
        assert_eq!(similar(&index, &all, "f1", 1).await.unwrap(), vec!["f3"]);
        assert_eq!(
            similar(&index, &all, "f1", 0).await.unwrap(),
            Vec::<String>::new()
        );

        // A caller limited to guides/ never sees secret/c.md, even though it is nearest.
        let guides = access(&["guides/"]);
        assert_eq!(
            similar(&index, &guides, "f1", 10).await.unwrap(),
            vec!["f2", "f4"]
        );
        // ...and asking from the unreadable file yields nothing, not its neighbours.
        assert_eq!(similar(&index, &guides, "f3", 10).await, None);
        // Denied file ids and prefixes are honoured inside the engine.
        let deny = AccessFilter {
            deny_file_ids: vec!["f3".into()],
            deny_prefixes: vec!["guides/d".into()],
            ..access(&[""])
        };
        assert_eq!(similar(&index, &deny, "f1", 10).await.unwrap(), vec!["f2"]);
        // A caller who may see hidden and disabled files gets them too.
        let everything = AccessFilter {
            enabled_only: false,
            visible_only: false,
            ..access(&[""])
        };
        assert_eq!(
            similar(&index, &everything, "f1", 10).await.unwrap(),
            vec!["f5", "f3", "f8", "f2", "f4"]
        );
        // Collections of the scope narrow the candidates.
        let none = index
            .similar_files(
                &all,
                &Scope {
                    collections: vec!["other".into()],
                    ..Scope::files()
                },
                "alpha",
                "f1",
                10,
            )
            .await
            .unwrap()
            .unwrap();
        assert!(none.is_empty(), "{none:?}");
        // The source file's neighbours in beta are beta's only.
        let beta = AccessFilter {
            namespace: "beta".into(),
            ..access(&[""])
        };
        let hits = index
            .similar_files(&beta, &Scope::files(), "beta", "f7", 10)
            .await
            .unwrap()
            .unwrap();
        assert!(hits.is_empty(), "{hits:?}");
        // Built segments (HNSW, merged) answer the same.
        index.optimize().await.unwrap();
    }

    // The namespace argument must be the access filter's.
    let err = index
        .similar_files(&all, &Scope::files(), "beta", "f1", 10)
        .await
        .unwrap_err();
    assert!(matches!(err, VectorError::InvalidInput { .. }), "{err:?}");

    // Disabling a file takes it out of every neighbour list at once.
    index
        .set_file_flags("alpha", "f3", false, false)
        .await
        .unwrap();
    assert_eq!(
        similar(&index, &all, "f1", 10).await.unwrap(),
        vec!["f2", "f4"]
    );
    // Deleting it removes its vector.
    index.delete_file("alpha", "f2").await.unwrap();
    assert_eq!(index.file_vector(&all, "f2").await.unwrap(), None);
    assert_eq!(similar(&index, &all, "f1", 10).await.unwrap(), vec!["f4"]);
}

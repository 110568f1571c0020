//! The graph service and the indexer's graph writer against a real FalkorDB.
//!
//! One FalkorDB per test binary: the scenarios run in sequence inside one test, each in its
//! own namespace, so a failure names the scenario in its panic message.

use kg_common::ErrorExt;
use kg_common::caller::{CONTEXT_TTL_MS, ContextSigner, ContextVerifier, attach_caller, now_ms};
use kg_common::error::{ErrorCode, code_of};
use kg_graph::{GraphError, GraphService};
use kg_indexer::graph_writer::{
    ChunkRecord, FileRecord, OutlineRecord, WriteOutcome, delete_file, set_flags, write_file,
};
use kg_proto::v1::graph_client::GraphClient;
use kg_proto::v1::open_request::Key;
use kg_proto::v1::{
    AccessFilter, CallerContext, ChunkPackage, HopRequest, OpenRequest, OutlineRequest,
    PackageCaps, PackagesRequest, Permission,
};
use kg_stores::embedded::{EmbeddedFalkor, find_venv};
use kg_stores::graph::{GraphStore, Params};
use serde_json::json;
use tokio_util::sync::CancellationToken;

struct Env {
    store: GraphStore,
    service: GraphService,
    _falkor: EmbeddedFalkor,
    _dir: tempfile::TempDir,
}

async fn start() -> Env {
    let venv = find_venv().expect("the dev-deps virtualenv (run deploy/scripts/dev-deps.sh)");
    let dir = tempfile::tempdir().unwrap();
    let falkor = EmbeddedFalkor::start(&venv, dir.path()).await.unwrap();
    let store = GraphStore::connect(&falkor.url).await.unwrap();
    Env {
        service: GraphService::new(store.clone()),
        store,
        _falkor: falkor,
        _dir: dir,
    }
}

/// A caller reading the whole namespace (enabled files only) after `edit`.
fn caller(ns: &str, edit: impl FnOnce(&mut AccessFilter)) -> CallerContext {
    let mut access = AccessFilter {
        namespace: ns.into(),
        allow_prefixes: vec![String::new()],
        enabled_only: true,
        permission: Permission::Read as i32,
        ..Default::default()
    };
    edit(&mut access);
    let now = now_ms();
    CallerContext {
        principal_id: "tester".into(),
        access: vec![access],
        issued_at_ms: now,
        expires_at_ms: now + CONTEXT_TTL_MS,
        ..Default::default()
    }
}

struct Fixture {
    file: FileRecord,
    chunks: Vec<ChunkRecord>,
    outline: Vec<OutlineRecord>,
}

impl Fixture {
    fn chunk_key(&self, i: usize) -> String {
        self.chunks[i].chunk_key.clone()
    }

    fn outline_key(&self, i: usize) -> String {
        self.outline[i].outline_key.clone()
    }

    async fn write(&self, store: &GraphStore) -> WriteOutcome {
        write_file(store, &self.file, &self.chunks, &self.outline)
            .await
            .unwrap()
    }
}

/// `guides/setup.md`: Install (c0, c1), Configure (c2) with subsection Rotate keys (c3, c4).
fn setup_guide(ns: &str, version: &str) -> Fixture {
    let file_id = "file-setup";
    let key = |kind: &str, i: usize| format!("{kind}_{file_id}_{version}_{i}");
    let texts = [
        "Install the kgmesh binary with cargo install.",
        "Verify the installation by running kgmesh version.",
        "Configuration lives in kgmesh.toml next to the data directory.",
        "To rotate the signing keys, generate a fresh ed25519 key pair and restart the auth service.",
        "Old keys stay valid until every caller context they signed has expired.",
    ];
    let sections = [0usize, 0, 1, 2, 2];
    let chunks = texts
        .iter()
        .enumerate()
        .map(|(i, text)| ChunkRecord {
            chunk_key: key("ch", i),
            index: i as u32,
            text: (*text).to_owned(),
            context_header: [
                "Setup › Install",
                "Setup › Install",
                "Setup › Configure",
                "Setup › Configure › Rotate keys",
                "Setup › Configure › Rotate keys",
            ][i]
                .to_owned(),
            char_start: (i * 100) as u64,
            char_end: (i * 100 + text.chars().count()) as u64,
            line_start: (i * 3 + 1) as u32,
            line_end: (i * 3 + 2) as u32,
            page_start: (i >= 3).then_some(2),
            page_end: (i >= 3).then_some(if i == 3 { 3 } else { 2 }),
            token_count: 12,
            section_key: Some(key("ol", sections[i])),
        })
        .collect();
    let outline = vec![
        OutlineRecord {
            outline_key: key("ol", 0),
            title: "Install".into(),
            depth: 1,
            order: 0,
            parent_key: None,
            line_start: 1,
            line_end: 6,
            char_start: 0,
            char_end: 200,
            page_start: Some(1),
            page_end: Some(1),
            covers: vec![key("ch", 0), key("ch", 1)],
        },
        OutlineRecord {
            outline_key: key("ol", 1),
            title: "Configure".into(),
            depth: 1,
            order: 1,
            parent_key: None,
            line_start: 7,
            line_end: 15,
            char_start: 200,
            char_end: 500,
            page_start: Some(1),
            page_end: Some(3),
            covers: vec![key("ch", 2), key("ch", 3), key("ch", 4)],
        },
        OutlineRecord {
            outline_key: key("ol", 2),
            title: "Rotate keys".into(),
            depth: 2,
            order: 2,
            parent_key: Some(key("ol", 1)),
            line_start: 10,
            line_end: 15,
            char_start: 300,
            char_end: 500,
            page_start: Some(2),
            page_end: Some(3),
            covers: vec![key("ch", 3), key("ch", 4)],
        },
    ];
    Fixture {
        file: FileRecord {
            namespace: ns.into(),
            file_id: file_id.into(),
            version_id: version.into(),
            path: "guides/setup.md".into(),
            name: "setup.md".into(),
            folder_path: "guides/".into(),
            enabled: true,
            hidden: false,
            title: Some("Setup".into()),
            document_date: Some("2024-05-01".into()),
            mime: "text/markdown".into(),
        },
        chunks,
        outline,
    }
}

/// `ops/flat.md`: five top-level sections of one chunk each, for sibling clipping.
fn flat_file(ns: &str) -> Fixture {
    flat_file_of(ns, 5)
}

/// `ops/flat.md` with `n` top-level sections Step 0.., one chunk each.
fn flat_file_of(ns: &str, n: u32) -> Fixture {
    let chunks: Vec<ChunkRecord> = (0..n)
        .map(|i| ChunkRecord {
            chunk_key: format!("ch_flat_{i}"),
            index: i,
            text: format!("Step {i} of the runbook."),
            context_header: format!("Flat › Step {i}"),
            char_start: u64::from(i) * 30,
            char_end: u64::from(i) * 30 + 20,
            line_start: i * 2 + 1,
            line_end: i * 2 + 2,
            page_start: None,
            page_end: None,
            token_count: 6,
            section_key: Some(format!("ol_flat_{i}")),
        })
        .collect();
    let outline = (0..n)
        .map(|i| OutlineRecord {
            outline_key: format!("ol_flat_{i}"),
            title: format!("Step {i}"),
            depth: 1,
            order: i,
            parent_key: None,
            line_start: i * 2 + 1,
            line_end: i * 2 + 2,
            char_start: u64::from(i) * 30,
            char_end: u64::from(i) * 30 + 20,
            page_start: None,
            page_end: None,
            covers: vec![format!("ch_flat_{i}")],
        })
        .collect();
    Fixture {
        file: FileRecord {
            namespace: ns.into(),
            file_id: "file-flat".into(),
            version_id: "v1".into(),
            path: "ops/flat.md".into(),
            name: "flat.md".into(),
            folder_path: "ops/".into(),
            enabled: true,
            hidden: false,
            title: None,
            document_date: None,
            mime: "text/markdown".into(),
        },
        chunks,
        outline,
    }
}

fn keys(packages: &[ChunkPackage]) -> Vec<&str> {
    packages.iter().map(|p| p.chunk_key.as_str()).collect()
}

fn open(ns: &str, key: Key, limit: u32) -> OpenRequest {
    OpenRequest {
        namespace: ns.into(),
        key: Some(key),
        limit,
        caps: None,
    }
}

fn outline_request(ns: &str, file_id: &str) -> OutlineRequest {
    OutlineRequest {
        namespace: ns.into(),
        file_id: file_id.into(),
        ..Default::default()
    }
}

async fn count_nodes_of(store: &GraphStore, ns: &str, file_id: &str) -> i64 {
    let mut params = Params::new();
    params.insert("fileId".into(), file_id.into());
    let rows = store
        .ro_query(
            ns,
            "MATCH (n) WHERE n.fileId = $fileId RETURN count(n)",
            &params,
            2_000,
        )
        .await
        .unwrap();
    rows.rows[0][0].as_i64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graph_service_against_real_falkordb() {
    let env = start().await;
    packages_carry_position_outline_and_citation(&env).await;
    zero_caps_give_empty_lists_and_absent_caps_the_defaults(&env).await;
    open_resolves_each_kind_of_key(&env).await;
    outline_pages_in_document_order(&env).await;
    access_filters_hide_files_everywhere(&env).await;
    narrowed_callers_still_read_everything_allowed(&env).await;
    writes_are_idempotent_replace_and_delete(&env).await;
    grpc_requires_a_signed_context(&env).await;
    store_outage_is_unavailable_without_driver_text(env).await;
}

async fn store_outage_is_unavailable_without_driver_text(env: Env) {
    let Env {
        service,
        _falkor: falkor,
        ..
    } = env;
    drop(falkor);
    let who = caller("down", |_| {});
    let err = service
        .open_for(&who, open("down", Key::FileId("file-setup".into()), 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err:?}");
    let status = tonic::Status::from(err);
    assert!(
        !status.message().contains("127.0.0.1"),
        "{}",
        status.message()
    );
    assert!(
        !status.message().to_lowercase().contains("redis"),
        "{}",
        status.message()
    );
}

/// `(total, truncated)` of a package's clipped list `name`, if it was clipped.
fn clipped(package: &ChunkPackage, name: &str) -> Option<(i64, bool)> {
    package
        .counts
        .as_ref()?
        .lists
        .iter()
        .find(|c| c.list == name)
        .map(|c| (c.total, c.truncated))
}

fn titles(list: &[kg_proto::v1::OutlineRef]) -> Vec<&str> {
    list.iter().map(|s| s.title.as_str()).collect()
}

/// An explicit cap of 0 is an empty list whose total is still reported; an absent cap (no
/// caps at all, or caps with the field unset) is the default, here clipping 11 siblings to 8.
async fn zero_caps_give_empty_lists_and_absent_caps_the_defaults(env: &Env) {
    let ns = "caps";
    let guide = setup_guide(ns, "v1");
    guide.write(&env.store).await;
    let flat = flat_file_of(ns, 12);
    flat.write(&env.store).await;
    let who = caller(ns, |_| {});
    // Rotate keys (one ancestor), Configure (one sibling, one child), Step 6 (11 siblings).
    let chunk_keys = vec![guide.chunk_key(3), guide.chunk_key(2), flat.chunk_key(6)];
    let packages = |caps: Option<PackageCaps>| {
        let chunk_keys = chunk_keys.clone();
        let who = who.clone();
        async move {
            env.service
                .packages_for(
                    &who,
                    PackagesRequest {
                        namespace: ns.into(),
                        chunk_keys,
                        caps,
                    },
                )
                .await
                .unwrap()
                .packages
        }
    };

    let zero = packages(Some(PackageCaps {
        mentions: Some(0),
        rel: Some(0),
        ancestors: Some(0),
        siblings: Some(0),
        children: Some(0),
        similar: Some(0),
    }))
    .await;
    assert_eq!(keys(&zero), chunk_keys);
    let [rotate, configure, step] = [&zero[0], &zero[1], &zero[2]];
    for package in &zero {
        let outline = package.outline.as_ref().unwrap();
        assert!(
            outline.section.is_some(),
            "the section itself is not a list"
        );
        assert!(
            outline.ancestors.is_empty()
                && outline.siblings.is_empty()
                && outline.children.is_empty(),
            "{}: {outline:?}",
            package.chunk_key
        );
        assert!(package.mentions.is_empty() && package.rel_neighbors.is_empty());
        assert!(package.similar_files.is_empty());
    }
    assert_eq!(clipped(rotate, "ancestors"), Some((1, true)));
    assert_eq!(rotate.counts.as_ref().unwrap().lists.len(), 1);
    // The citation still names the whole trail: it never depended on the ancestors cap.
    assert_eq!(
        rotate.text.as_ref().unwrap().citation,
        "caps/guides/setup.md › Configure › Rotate keys (pp. 2–3)"
    );
    assert_eq!(clipped(configure, "siblings"), Some((1, true)));
    assert_eq!(clipped(configure, "children"), Some((1, true)));
    assert_eq!(
        clipped(configure, "ancestors"),
        None,
        "no ancestors to clip"
    );
    assert_eq!(clipped(step, "siblings"), Some((11, true)));
    assert_eq!(step.counts.as_ref().unwrap().lists.len(), 1);

    // Absent caps are the defaults, whether the message or each field is absent.
    let defaults = packages(None).await;
    assert_eq!(packages(Some(PackageCaps::default())).await, defaults);
    let [rotate, configure, step] = [&defaults[0], &defaults[1], &defaults[2]];
    assert_eq!(
        titles(&rotate.outline.as_ref().unwrap().ancestors),
        ["Configure"]
    );
    assert!(rotate.counts.is_none());
    let outline = configure.outline.as_ref().unwrap();
    assert_eq!(titles(&outline.siblings), ["Install"]);
    assert_eq!(titles(&outline.children), ["Rotate keys"]);
    assert!(configure.counts.is_none());
    let siblings: Vec<i64> = step
        .outline
        .as_ref()
        .unwrap()
        .siblings
        .iter()
        .map(|s| s.order)
        .collect();
    assert_eq!(
        siblings,
        [2, 3, 4, 5, 7, 8, 9, 10],
        "the 8 nearest, by default"
    );
    assert_eq!(clipped(step, "siblings"), Some((11, true)));

    // One explicit 0 leaves every other cap at its default.
    let mixed = packages(Some(PackageCaps {
        siblings: Some(0),
        ..Default::default()
    }))
    .await;
    let outline = mixed[1].outline.as_ref().unwrap();
    assert!(outline.siblings.is_empty());
    assert_eq!(titles(&outline.children), ["Rotate keys"]);
    assert_eq!(clipped(&mixed[1], "siblings"), Some((1, true)));
    assert_eq!(clipped(&mixed[1], "children"), None);
    assert_eq!(
        titles(&mixed[0].outline.as_ref().unwrap().ancestors),
        ["Configure"]
    );
    assert_eq!(clipped(&mixed[2], "siblings"), Some((11, true)));

    // Open takes the same caps.
    let opened = env
        .service
        .open_for(
            &who,
            OpenRequest {
                namespace: ns.into(),
                key: Some(Key::ChunkKey(guide.chunk_key(2))),
                limit: 0,
                caps: Some(PackageCaps {
                    children: Some(0),
                    ..Default::default()
                }),
            },
        )
        .await
        .unwrap();
    let outline = opened.packages[0].outline.as_ref().unwrap();
    assert!(outline.children.is_empty());
    assert_eq!(titles(&outline.siblings), ["Install"]);
    assert_eq!(clipped(&opened.packages[0], "children"), Some((1, true)));
}

async fn packages_carry_position_outline_and_citation(env: &Env) {
    let ns = "pkg";
    let guide = setup_guide(ns, "v1");
    assert!(matches!(
        guide.write(&env.store).await,
        WriteOutcome::Written {
            chunks: 5,
            sections: 3
        }
    ));
    let who = caller(ns, |_| {});

    let response = env
        .service
        .packages_for(
            &who,
            PackagesRequest {
                namespace: ns.into(),
                chunk_keys: vec![
                    guide.chunk_key(3),
                    guide.chunk_key(0),
                    "ch_missing".into(),
                    guide.chunk_key(3),
                    guide.chunk_key(2),
                ],
                caps: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        keys(&response.packages),
        [guide.chunk_key(3), guide.chunk_key(0), guide.chunk_key(2)]
    );
    assert_eq!(response.total, 3);

    let rotate = &response.packages[0];
    assert_eq!(rotate.namespace, ns);
    assert_eq!(rotate.file_id, "file-setup");
    assert_eq!(rotate.path, "guides/setup.md");
    let pos = rotate.position.as_ref().unwrap();
    assert_eq!(pos.chunk_index, 3);
    assert_eq!(
        pos.prev_chunk_key.as_deref(),
        Some(guide.chunk_key(2).as_str())
    );
    assert_eq!(
        pos.next_chunk_key.as_deref(),
        Some(guide.chunk_key(4).as_str())
    );
    assert_eq!(
        (pos.char_start, pos.line_start, pos.page_start, pos.page_end),
        (Some(300), Some(10), Some(2), Some(3))
    );
    let text = rotate.text.as_ref().unwrap();
    assert!(text.text.starts_with("To rotate the signing keys"));
    assert_eq!(text.context_header, "Setup › Configure › Rotate keys");
    assert_eq!(
        text.citation,
        "pkg/guides/setup.md › Configure › Rotate keys (pp. 2–3)"
    );
    let outline = rotate.outline.as_ref().unwrap();
    assert_eq!(outline.section.as_ref().unwrap().title, "Rotate keys");
    assert_eq!(outline.ancestors.len(), 1);
    assert_eq!(outline.ancestors[0].outline_key, guide.outline_key(1));
    assert!(outline.siblings.is_empty() && outline.children.is_empty());
    assert_eq!(
        rotate.dates.as_ref().unwrap().document_date.as_deref(),
        Some("2024-05-01")
    );
    assert!(rotate.counts.is_none());

    let install = &response.packages[1];
    let pos = install.position.as_ref().unwrap();
    assert_eq!(pos.prev_chunk_key, None);
    assert_eq!(
        pos.next_chunk_key.as_deref(),
        Some(guide.chunk_key(1).as_str())
    );
    assert_eq!(
        install.text.as_ref().unwrap().citation,
        "pkg/guides/setup.md › Install"
    );

    let configure = &response.packages[2];
    let outline = configure.outline.as_ref().unwrap();
    assert!(outline.ancestors.is_empty());
    assert_eq!(
        outline
            .siblings
            .iter()
            .map(|s| s.title.as_str())
            .collect::<Vec<_>>(),
        ["Install"]
    );
    assert_eq!(
        outline
            .children
            .iter()
            .map(|s| s.title.as_str())
            .collect::<Vec<_>>(),
        ["Rotate keys"]
    );

    // Sibling clipping keeps the nearest sections and reports the total.
    let flat = flat_file(ns);
    flat.write(&env.store).await;
    let response = env
        .service
        .packages_for(
            &who,
            PackagesRequest {
                namespace: ns.into(),
                chunk_keys: vec![flat.chunk_key(2)],
                caps: Some(PackageCaps {
                    siblings: Some(2),
                    ..Default::default()
                }),
            },
        )
        .await
        .unwrap();
    let package = &response.packages[0];
    let siblings: Vec<i64> = package
        .outline
        .as_ref()
        .unwrap()
        .siblings
        .iter()
        .map(|s| s.order)
        .collect();
    assert_eq!(siblings, [1, 3]);
    let counts = &package.counts.as_ref().unwrap().lists;
    assert_eq!(counts.len(), 1);
    assert_eq!(
        (
            counts[0].list.as_str(),
            counts[0].total,
            counts[0].truncated
        ),
        ("siblings", 4, true)
    );

    // Caps over their hard maxima fail closed, naming the cap.
    let err = env
        .service
        .packages_for(
            &who,
            PackagesRequest {
                namespace: ns.into(),
                chunk_keys: vec![guide.chunk_key(0)],
                caps: Some(PackageCaps {
                    ancestors: Some(13),
                    ..Default::default()
                }),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(
        err.to_string().contains("caps.ancestors = 13") && err.to_string().contains("12"),
        "{err}"
    );
    let err = env
        .service
        .packages_for(
            &who,
            PackagesRequest {
                namespace: ns.into(),
                chunk_keys: (0..33).map(|i| format!("k{i}")).collect(),
                caps: None,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
}

async fn open_resolves_each_kind_of_key(env: &Env) {
    let ns = "open";
    let guide = setup_guide(ns, "v1");
    guide.write(&env.store).await;
    let who = caller(ns, |_| {});
    let svc = &env.service;

    let one = svc
        .open_for(&who, open(ns, Key::ChunkKey(guide.chunk_key(1)), 0))
        .await
        .unwrap();
    assert_eq!(keys(&one.packages), [guide.chunk_key(1)]);
    assert_eq!((one.total, one.truncated), (1, false));

    let file = svc
        .open_for(&who, open(ns, Key::FileId("file-setup".into()), 2))
        .await
        .unwrap();
    assert_eq!(
        keys(&file.packages),
        [guide.chunk_key(0), guide.chunk_key(1)]
    );
    assert_eq!((file.total, file.truncated), (5, true));
    let file = svc
        .open_for(&who, open(ns, Key::FileId("file-setup".into()), 0))
        .await
        .unwrap();
    assert_eq!(file.packages.len(), 5, "default limit 8 covers the file");
    assert!(!file.truncated);

    let section = svc
        .open_for(&who, open(ns, Key::OutlineKey(guide.outline_key(1)), 0))
        .await
        .unwrap();
    assert_eq!(
        keys(&section.packages),
        [guide.chunk_key(2), guide.chunk_key(3), guide.chunk_key(4)]
    );
    assert_eq!(section.total, 3);

    let entity = svc
        .open_for(&who, open(ns, Key::EntityKey("ent_nobody".into()), 0))
        .await
        .unwrap();
    assert!(entity.packages.is_empty());
    assert_eq!((entity.total, entity.truncated), (0, false));

    let code = |r: Result<_, GraphError>| {
        r.map(|_: kg_proto::v1::PackagesResponse| ())
            .unwrap_err()
            .code()
    };
    assert_eq!(
        code(
            svc.open_for(&who, open(ns, Key::ChunkKey("ch_nope".into()), 0))
                .await
        ),
        ErrorCode::NotFound
    );
    assert_eq!(
        code(
            svc.open_for(&who, open(ns, Key::FileId("nope".into()), 0))
                .await
        ),
        ErrorCode::NotFound
    );
    assert_eq!(
        code(
            svc.open_for(&who, open(ns, Key::OutlineKey("ol_nope".into()), 0))
                .await
        ),
        ErrorCode::NotFound
    );
    assert_eq!(
        code(
            svc.open_for(&who, open(ns, Key::FileId("file-setup".into()), 33))
                .await
        ),
        ErrorCode::InvalidArgument
    );
    let no_key = OpenRequest {
        namespace: ns.into(),
        ..Default::default()
    };
    assert_eq!(
        code(svc.open_for(&who, no_key).await),
        ErrorCode::InvalidArgument
    );
    // A namespace that holds no graph yet reads as empty, not as an error.
    let empty = caller("nothing_here", |_| {});
    let missing = svc
        .open_for(&empty, open("nothing_here", Key::EntityKey("e".into()), 0))
        .await
        .unwrap();
    assert_eq!(missing.total, 0);
    assert_eq!(
        code(
            svc.open_for(&empty, open("nothing_here", Key::ChunkKey("c".into()), 0))
                .await
        ),
        ErrorCode::NotFound
    );
}

async fn outline_pages_in_document_order(env: &Env) {
    let ns = "outline";
    let guide = setup_guide(ns, "v1");
    guide.write(&env.store).await;
    let who = caller(ns, |_| {});
    let svc = &env.service;

    let first = svc
        .outline_for(
            &who,
            OutlineRequest {
                limit: 2,
                ..outline_request(ns, "file-setup")
            },
        )
        .await
        .unwrap();
    assert_eq!(first.path, "guides/setup.md");
    assert_eq!(first.total, 3);
    let titles: Vec<&str> = first.sections.iter().map(|s| s.title.as_str()).collect();
    assert_eq!(titles, ["Install", "Configure"]);
    assert_eq!(first.sections[1].chunk_count, 3);
    assert_eq!(first.sections[0].page_start, Some(1));
    assert_eq!(first.sections[1].line_start, Some(7));
    assert!(!first.next_cursor.is_empty());

    let second = svc
        .outline_for(
            &who,
            OutlineRequest {
                limit: 2,
                cursor: first.next_cursor.clone(),
                ..outline_request(ns, "file-setup")
            },
        )
        .await
        .unwrap();
    assert_eq!(second.sections.len(), 1);
    let rotate = &second.sections[0];
    assert_eq!(
        (rotate.title.as_str(), rotate.depth, rotate.order),
        ("Rotate keys", 2, 2)
    );
    assert_eq!(
        rotate.parent_key.as_deref(),
        Some(guide.outline_key(1).as_str())
    );
    assert_eq!(rotate.chunk_count, 2);
    assert!(second.next_cursor.is_empty());

    let top = svc
        .outline_for(
            &who,
            OutlineRequest {
                max_depth: Some(1),
                ..outline_request(ns, "file-setup")
            },
        )
        .await
        .unwrap();
    assert_eq!(top.total, 2);
    assert_eq!(top.sections.len(), 2);

    let err = svc
        .outline_for(&who, outline_request(ns, "file-nope"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
    for bad in [
        OutlineRequest {
            cursor: "not-a-cursor!".into(),
            ..outline_request(ns, "file-setup")
        },
        OutlineRequest {
            limit: 201,
            ..outline_request(ns, "file-setup")
        },
        OutlineRequest {
            max_depth: Some(0),
            ..outline_request(ns, "file-setup")
        },
    ] {
        let err = svc.outline_for(&who, bad).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    }
}

async fn access_filters_hide_files_everywhere(env: &Env) {
    let ns = "acl";
    let guide = setup_guide(ns, "v1");
    guide.write(&env.store).await;
    let flat = flat_file(ns);
    flat.write(&env.store).await;
    let svc = &env.service;

    let denied_folder = caller(ns, |a| a.deny_prefixes = vec!["guides/".into()]);
    let denied_file = caller(ns, |a| a.deny_file_ids = vec!["file-setup".into()]);
    let only_ops = caller(ns, |a| a.allow_prefixes = vec!["ops/".into()]);
    let nothing = caller(ns, |a| a.allow_prefixes.clear());
    for (name, who) in [
        ("deny prefix", &denied_folder),
        ("deny file", &denied_file),
        ("allow ops", &only_ops),
        ("no grant", &nothing),
    ] {
        assert_hidden(svc, who, ns, &guide, name).await;
    }
    // The other file stays readable for the same callers.
    let ops = svc
        .open_for(&denied_folder, open(ns, Key::FileId("file-flat".into()), 0))
        .await
        .unwrap();
    assert_eq!(ops.total, 5);

    // Disabling the file hides it from enabled-only callers at once, everywhere.
    assert!(
        set_flags(&env.store, ns, "file-setup", false, false)
            .await
            .unwrap()
    );
    let reader = caller(ns, |_| {});
    assert_hidden(svc, &reader, ns, &guide, "disabled").await;
    // A caller allowed to see disabled files (enabled_only off) still reads it.
    let preview = caller(ns, |a| a.enabled_only = false);
    let seen = svc
        .open_for(&preview, open(ns, Key::FileId("file-setup".into()), 0))
        .await
        .unwrap();
    assert_eq!(seen.total, 5);
    assert!(
        set_flags(&env.store, ns, "file-setup", true, true)
            .await
            .unwrap()
    );
    let back = svc
        .open_for(&reader, open(ns, Key::ChunkKey(guide.chunk_key(0)), 0))
        .await
        .unwrap();
    assert_eq!(
        back.packages.len(),
        1,
        "re-enabled (hidden files stay readable)"
    );
    assert!(
        !set_flags(&env.store, ns, "file-unknown", true, false)
            .await
            .unwrap()
    );

    // A namespace outside the caller's access list is refused by name.
    let err = svc
        .open_for(
            &reader,
            open("elsewhere", Key::ChunkKey(guide.chunk_key(0)), 0),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied);
    assert!(err.to_string().contains("elsewhere"));
    let err = svc
        .outline_for(&reader, outline_request("Bad Name", "x"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
}

/// A caller whose filter uses every list predicate but still allows both files must get
/// exactly what an unrestricted caller gets: this catches predicates FalkorDB mis-evaluates.
async fn narrowed_callers_still_read_everything_allowed(env: &Env) {
    let ns = "narrow";
    let guide = setup_guide(ns, "v1");
    guide.write(&env.store).await;
    let flat = flat_file(ns);
    flat.write(&env.store).await;
    let svc = &env.service;
    let open_caller = caller(ns, |_| {});
    let narrowed = caller(ns, |a| {
        a.allow_prefixes = vec!["guides/".into(), "ops/".into()];
        a.deny_prefixes = vec!["private/".into()];
        a.deny_file_ids = vec!["file-other".into()];
    });
    let all_keys: Vec<String> = guide
        .chunks
        .iter()
        .chain(&flat.chunks)
        .map(|c| c.chunk_key.clone())
        .collect();
    let packages = |who: CallerContext| {
        let keys = all_keys.clone();
        async move {
            svc.packages_for(
                &who,
                PackagesRequest {
                    namespace: ns.into(),
                    chunk_keys: keys,
                    caps: Some(PackageCaps {
                        siblings: Some(2),
                        ..Default::default()
                    }),
                },
            )
            .await
            .unwrap()
        }
    };
    let wide = packages(open_caller.clone()).await;
    assert_eq!(wide.packages.len(), 10);
    assert_eq!(packages(narrowed.clone()).await, wide);
    for key in [
        Key::FileId("file-setup".into()),
        Key::FileId("file-flat".into()),
        Key::OutlineKey(guide.outline_key(1)),
        Key::ChunkKey(guide.chunk_key(3)),
    ] {
        let wide = svc
            .open_for(&open_caller, open(ns, key.clone(), 0))
            .await
            .unwrap();
        let narrow = svc
            .open_for(&narrowed, open(ns, key.clone(), 0))
            .await
            .unwrap();
        assert_eq!(narrow, wide, "{key:?}");
    }
    for file_id in ["file-setup", "file-flat"] {
        let wide = svc
            .outline_for(&open_caller, outline_request(ns, file_id))
            .await
            .unwrap();
        let narrow = svc
            .outline_for(&narrowed, outline_request(ns, file_id))
            .await
            .unwrap();
        assert!(wide.sections.iter().all(|s| s.chunk_count > 0));
        assert_eq!(narrow, wide, "{file_id}");
    }
}

async fn assert_hidden(
    svc: &GraphService,
    who: &CallerContext,
    ns: &str,
    guide: &Fixture,
    case: &str,
) {
    let packages = svc
        .packages_for(
            who,
            PackagesRequest {
                namespace: ns.into(),
                chunk_keys: guide.chunks.iter().map(|c| c.chunk_key.clone()).collect(),
                caps: None,
            },
        )
        .await
        .unwrap();
    assert!(packages.packages.is_empty(), "{case}: packages");
    assert_eq!(packages.total, 0, "{case}: packages total");
    for key in [
        Key::ChunkKey(guide.chunk_key(0)),
        Key::FileId("file-setup".into()),
        Key::OutlineKey(guide.outline_key(1)),
    ] {
        let err = svc
            .open_for(who, open(ns, key.clone(), 0))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::NotFound, "{case}: open {key:?}");
    }
    let err = svc
        .outline_for(who, outline_request(ns, "file-setup"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound, "{case}: outline");
}

async fn writes_are_idempotent_replace_and_delete(env: &Env) {
    let ns = "writes";
    let svc = &env.service;
    let who = caller(ns, |_| {});
    let v1 = setup_guide(ns, "v1");
    assert!(matches!(
        v1.write(&env.store).await,
        WriteOutcome::Written { .. }
    ));
    assert_eq!(v1.write(&env.store).await, WriteOutcome::Unchanged);

    // The folder chain exists from the root down, with the file under its folder.
    let rows = env
        .store
        .ro_query(
            ns,
            "MATCH (root:Folder {folderPath: '/'})-[:HAS_CHILD]->(g:Folder)-[:HAS_CHILD]->(f:FileRef) \
             RETURN g.folderPath, f.fileId, f.versionId, f.chunkCount",
            &Params::new(),
            2_000,
        )
        .await
        .unwrap();
    assert_eq!(
        rows.rows,
        [vec![
            json!("guides/"),
            json!("file-setup"),
            json!("v1"),
            json!(5)
        ]]
    );

    // A new version (moved to another folder, one chunk fewer) replaces chunks and outline.
    let mut v2 = setup_guide(ns, "v2");
    v2.file.path = "archive/old/setup.md".into();
    v2.file.folder_path = "archive/old/".into();
    v2.chunks.pop();
    for section in &mut v2.outline {
        section
            .covers
            .retain(|k| v2.chunks.iter().any(|c| &c.chunk_key == k));
    }
    assert!(matches!(
        v2.write(&env.store).await,
        WriteOutcome::Written {
            chunks: 4,
            sections: 3
        }
    ));
    let old = svc
        .packages_for(
            &who,
            PackagesRequest {
                namespace: ns.into(),
                chunk_keys: v1.chunks.iter().map(|c| c.chunk_key.clone()).collect(),
                caps: None,
            },
        )
        .await
        .unwrap();
    assert!(old.packages.is_empty(), "old chunk keys are gone");
    let err = svc
        .open_for(&who, open(ns, Key::OutlineKey(v1.outline_key(0)), 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound, "old outline keys are gone");
    let now = svc
        .open_for(&who, open(ns, Key::FileId("file-setup".into()), 0))
        .await
        .unwrap();
    assert_eq!(
        keys(&now.packages),
        v2.chunks
            .iter()
            .map(|c| c.chunk_key.as_str())
            .collect::<Vec<_>>()
    );
    assert_eq!(now.packages[0].path, "archive/old/setup.md");
    assert_eq!(
        now.packages[3].position.as_ref().unwrap().next_chunk_key,
        None
    );
    assert_eq!(
        count_nodes_of(&env.store, ns, "file-setup").await,
        1 + 4 + 3
    );
    let parents = env
        .store
        .ro_query(
            ns,
            "MATCH (d:Folder)-[:HAS_CHILD]->(:FileRef {fileId: 'file-setup'}) RETURN d.folderPath",
            &Params::new(),
            2_000,
        )
        .await
        .unwrap();
    assert_eq!(
        parents.rows,
        [vec![json!("archive/old/")]],
        "a moved file leaves its old folder"
    );

    // A write interrupted before its last step is redone on redelivery, not skipped.
    let mut params = Params::new();
    params.insert("fileId".into(), "file-setup".into());
    env.store
        .query(
            ns,
            "MATCH (f:FileRef {fileId: $fileId}) SET f.versionId = null",
            &params,
        )
        .await
        .unwrap();
    assert!(matches!(
        v2.write(&env.store).await,
        WriteOutcome::Written { .. }
    ));
    assert_eq!(
        count_nodes_of(&env.store, ns, "file-setup").await,
        1 + 4 + 3
    );

    assert!(delete_file(&env.store, ns, "file-setup").await.unwrap());
    assert_eq!(count_nodes_of(&env.store, ns, "file-setup").await, 0);
    let err = svc
        .outline_for(&who, outline_request(ns, "file-setup"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
    assert!(!delete_file(&env.store, ns, "file-setup").await.unwrap());
    // After a delete the same version writes again in full.
    assert!(matches!(
        v2.write(&env.store).await,
        WriteOutcome::Written { chunks: 4, .. }
    ));
}

async fn grpc_requires_a_signed_context(env: &Env) {
    let ns = "grpc";
    let guide = setup_guide(ns, "v1");
    guide.write(&env.store).await;
    let signer = ContextSigner::generate();
    let verifier = ContextVerifier::new(vec![signer.public_key()]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(kg_graph::serve_with(
        env.service.clone(),
        verifier,
        listener,
        shutdown.clone(),
    ));
    let channel = kg_common::grpc::channel(&format!("http://{addr}")).unwrap();
    let mut client = GraphClient::new(channel);

    let signed = signer.sign(&caller(ns, |_| {}));
    let mut request = tonic::Request::new(open(ns, Key::OutlineKey(guide.outline_key(2)), 0));
    attach_caller(&mut request, &signed);
    let response = client.open(request).await.unwrap().into_inner();
    assert_eq!(
        keys(&response.packages),
        [guide.chunk_key(3), guide.chunk_key(4)]
    );
    assert_eq!(
        response.packages[0].text.as_ref().unwrap().citation,
        "grpc/guides/setup.md › Configure › Rotate keys (pp. 2–3)"
    );

    let mut request = tonic::Request::new(outline_request(ns, "file-setup"));
    attach_caller(&mut request, &signed);
    let outline = client.outline(request).await.unwrap().into_inner();
    assert_eq!(outline.sections.len(), 3);

    let status = client
        .open(open(ns, Key::ChunkKey(guide.chunk_key(0)), 0))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    let forged = ContextSigner::generate().sign(&caller(ns, |_| {}));
    let mut request = tonic::Request::new(open(ns, Key::ChunkKey(guide.chunk_key(0)), 0));
    attach_caller(&mut request, &forged);
    assert_eq!(
        client.open(request).await.unwrap_err().code(),
        tonic::Code::Unauthenticated
    );

    let mut request = tonic::Request::new(open("other", Key::ChunkKey(guide.chunk_key(0)), 0));
    attach_caller(&mut request, &signed);
    let status = client.open(request).await.unwrap_err();
    assert_eq!(code_of(&status), ErrorCode::PermissionDenied);
    assert!(status.message().contains("other"));

    let mut request = tonic::Request::new(HopRequest {
        namespace: ns.into(),
        from_key: guide.chunk_key(0),
        kind: kg_proto::v1::HopKind::NextChunk as i32,
        limit: 1,
        ..Default::default()
    });
    attach_caller(&mut request, &signed);
    let hop = client.hop(request).await.unwrap().into_inner();
    assert_eq!(keys(&hop.packages), [guide.chunk_key(1)]);
    assert!(hop.truncated);

    shutdown.cancel();
    server.await.unwrap().unwrap();
}

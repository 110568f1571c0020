//! Navigation against a real FalkorDB (and NATS for the TBox): every hop kind, mentions and
//! REL neighbours in packages, FileEntities and FileTriples paged to the end, Ontology, caps
//! over their hard maxima, and a restricted caller that never sees a denied file's chunks,
//! mentions, the REL edges it states, or counts of them.
//!
//! The fixture is written with plain Cypher in the graph schema of the brief, so these
//! tests do not depend on the indexer.

use kg_common::ErrorExt;
use kg_common::caller::{CONTEXT_TTL_MS, now_ms};
use kg_common::error::ErrorCode;
use kg_graph::{GraphError, GraphService};
use kg_proto::v1::open_request::Key;
use kg_proto::v1::{
    AccessFilter, CallerContext, ChunkPackage, EntityType, FileEntitiesRequest, FileTriplesRequest,
    HopKind, HopRequest, OntologyRequest, OpenRequest, PackageCaps, PackagesResponse, Permission,
    RelationType, Tbox,
};
use kg_stores::embedded::{EmbeddedFalkor, EmbeddedNats, find_venv};
use kg_stores::graph::{GraphStore, Params};
use kg_stores::tbox::TboxBucket;
use serde_json::{Value, json};

const NS: &str = "nav";

struct Env {
    service: GraphService,
    store: GraphStore,
    tbox: TboxBucket,
    _falkor: EmbeddedFalkor,
    _nats: EmbeddedNats,
    _dir: tempfile::TempDir,
}

async fn start() -> Env {
    let venv = find_venv().expect("the dev-deps virtualenv (run deploy/scripts/dev-deps.sh)");
    let dir = tempfile::tempdir().unwrap();
    let falkor = EmbeddedFalkor::start(&venv, &dir.path().join("falkor"))
        .await
        .unwrap();
    let nats = EmbeddedNats::start(&venv, &dir.path().join("nats"))
        .await
        .unwrap();
    let store = GraphStore::connect(&falkor.url).await.unwrap();
    let js = kg_stores::events::connect(&nats.url).await.unwrap();
    let tbox = TboxBucket::open(&js).await.unwrap();
    Env {
        service: GraphService::new(store.clone()).with_tbox(tbox.clone()),
        store,
        tbox,
        _falkor: falkor,
        _nats: nats,
        _dir: dir,
    }
}

/// Reads `namespaces` (whole, enabled files only) after `edit` on each filter.
fn caller_of(namespaces: &[&str], edit: impl Fn(&mut AccessFilter)) -> CallerContext {
    let now = now_ms();
    CallerContext {
        principal_id: "tester".into(),
        access: namespaces
            .iter()
            .map(|ns| {
                let mut access = AccessFilter {
                    namespace: (*ns).into(),
                    allow_prefixes: vec![String::new()],
                    enabled_only: true,
                    visible_only: true,
                    permission: Permission::Read as i32,
                    ..Default::default()
                };
                edit(&mut access);
                access
            })
            .collect(),
        issued_at_ms: now,
        expires_at_ms: now + CONTEXT_TTL_MS,
        ..Default::default()
    }
}

fn full() -> CallerContext {
    caller_of(&[NS, "empty"], |_| {})
}

/// May not read `secret/`.
fn restricted() -> CallerContext {
    caller_of(&[NS], |a| a.deny_prefixes = vec!["secret/".into()])
}

async fn write(store: &GraphStore, cypher: &str, params: Value) {
    let params: Params = match params {
        Value::Object(map) => map.into_iter().collect(),
        _ => Params::new(),
    };
    store.query(NS, cypher, &params).await.unwrap();
}

/// Files, chunks, an outline, entity types, entities, mentions and REL edges:
///
/// - `docs/a.md` (fa): a0 {alice, acme}, a1 {bob}, a2 {alice}, a3 {}; sections Intro (a0),
///   Body (a1) with subsections Part 1 (a2) and Part 2 (a3).
/// - `docs/b.md` (fb): b0 {alice, bob, globex}, b1 {globex}.
/// - `secret/c.md` (fc, denied to the restricted caller): c0 {alice, carol, globex}, c1 {}.
/// - `docs/off.md` (fd, disabled): d0 {bob}.
///
/// REL: alice works_for acme (fa), alice knows bob (fb), bob works_for globex (fc),
/// carol knows alice (fc), bob knows alice (fd, disabled).
async fn fixture(store: &GraphStore) {
    let files = [
        ("fa", "docs/a.md", true, 4),
        ("fb", "docs/b.md", true, 2),
        ("fc", "secret/c.md", true, 2),
        ("fd", "docs/off.md", false, 1),
    ];
    for (file_id, path, enabled, chunks) in files {
        write(
            store,
            "CREATE (:FileRef {fileId: $fileId, versionId: 'v1', vfsPath: $path, name: $path, \
             folderPath: '', enabled: $enabled, hidden: false, title: $path, mime: 'text/markdown', \
             chunkCount: $n})",
            json!({"fileId": file_id, "path": path, "enabled": enabled, "n": chunks}),
        )
        .await;
        let prefix = &file_id[1..];
        for i in 0..chunks {
            write(
                store,
                "MATCH (f:FileRef {fileId: $fileId}) \
                 CREATE (c:Chunk {chunkKey: $key, fileId: $fileId, path: $path, enabled: $enabled, \
                   chunkIndex: $i, text: $text, contextHeader: $path, charStart: $i * 100, \
                   charEnd: $i * 100 + 50, lineStart: $i + 1, lineEnd: $i + 1, tokenCount: 10}) \
                 CREATE (c)-[:PART_OF]->(f)",
                json!({"fileId": file_id, "path": path, "enabled": enabled, "i": i,
                       "key": format!("{prefix}{i}"), "text": format!("chunk {i} of {path}")}),
            )
            .await;
            if i > 0 {
                write(
                    store,
                    "MATCH (p:Chunk {chunkKey: $prev}), (c:Chunk {chunkKey: $key}) \
                     CREATE (p)-[:NEXT_CHUNK]->(c)",
                    json!({"prev": format!("{prefix}{}", i - 1), "key": format!("{prefix}{i}")}),
                )
                .await;
            }
        }
    }
    // Outline of docs/a.md.
    for (key, title, depth, order, parent, chunk) in [
        ("oa0", "Intro", 1, 0, None, "a0"),
        ("oa1", "Body", 1, 1, None, "a1"),
        ("oa2", "Part 1", 2, 2, Some("oa1"), "a2"),
        ("oa3", "Part 2", 2, 3, Some("oa1"), "a3"),
    ] {
        write(
            store,
            "MATCH (c:Chunk {chunkKey: $chunk}) \
             CREATE (o:OutlineNode {outlineKey: $key, fileId: 'fa', path: 'docs/a.md', enabled: true, \
               title: $title, depth: $depth, order: $order, parentKey: $parent, lineStart: $order + 1, \
               lineEnd: $order + 1}) \
             CREATE (o)-[:COVERS]->(c) SET c.sectionKey = $key",
            json!({"key": key, "title": title, "depth": depth, "order": order, "parent": parent, "chunk": chunk}),
        )
        .await;
        if let Some(parent) = parent {
            write(
                store,
                "MATCH (p:OutlineNode {outlineKey: $parent}), (o:OutlineNode {outlineKey: $key}) \
                 CREATE (p)-[:HAS_SUBSECTION]->(o)",
                json!({"parent": parent, "key": key}),
            )
            .await;
        }
    }
    for (type_id, label) in [("person", "Person"), ("org", "Organisation")] {
        write(
            store,
            "CREATE (:EntityType {typeId: $typeId, label: $label, side: 'published'})",
            json!({"typeId": type_id, "label": label}),
        )
        .await;
    }
    for (type_id, name) in [
        ("person", "Alice"),
        ("person", "Bob"),
        ("person", "Carol"),
        ("org", "Acme"),
        ("org", "Globex"),
    ] {
        write(
            store,
            "MATCH (t:EntityType {typeId: $typeId}) \
             CREATE (e:Entity {entityKey: $key, name: $name, normName: toLower($name), typeId: $typeId, aliases: []}) \
             CREATE (e)-[:INSTANCE_OF]->(t)",
            json!({"typeId": type_id, "name": name, "key": entity(type_id, name)}),
        )
        .await;
    }
    for (chunk, file_id, key, start) in [
        ("a0", "fa", alice(), 10),
        ("a0", "fa", acme(), 2),
        ("a1", "fa", bob(), 0),
        ("a2", "fa", alice(), 0),
        ("b0", "fb", alice(), 0),
        ("b0", "fb", bob(), 8),
        ("b0", "fb", globex(), 14),
        ("b1", "fb", globex(), 0),
        ("c0", "fc", alice(), 0),
        ("c0", "fc", carol(), 6),
        ("c0", "fc", globex(), 12),
        ("d0", "fd", bob(), 0),
    ] {
        write(
            store,
            "MATCH (c:Chunk {chunkKey: $chunk}), (e:Entity {entityKey: $key}) \
             CREATE (c)-[:MENTIONS {method: 'gazetteer', quote: e.name, charStart: $start, \
               charEnd: $start + size(e.name), fileId: $fileId}]->(e)",
            json!({"chunk": chunk, "key": key, "start": start, "fileId": file_id}),
        )
        .await;
    }
    for (source, rel, target, file_id, path, chunk, enabled) in [
        (alice(), "works_for", acme(), "fa", "docs/a.md", "a0", true),
        (alice(), "knows", bob(), "fb", "docs/b.md", "b0", true),
        (
            bob(),
            "works_for",
            globex(),
            "fc",
            "secret/c.md",
            "c0",
            true,
        ),
        (carol(), "knows", alice(), "fc", "secret/c.md", "c0", true),
        (bob(), "knows", alice(), "fd", "docs/off.md", "d0", false),
    ] {
        write(
            store,
            "MATCH (s:Entity {entityKey: $source}), (t:Entity {entityKey: $target}) \
             CREATE (s)-[:REL {relationTypeId: $rel, fileId: $fileId, chunkKey: $chunk, path: $path, \
               enabled: $enabled, versionId: 'v1'}]->(t)",
            json!({"source": source, "target": target, "rel": rel, "fileId": file_id,
                   "chunk": chunk, "path": path, "enabled": enabled}),
        )
        .await;
    }
}

fn entity(type_id: &str, name: &str) -> String {
    format!("ent:{type_id}:{}", name.to_lowercase())
}
fn alice() -> String {
    entity("person", "Alice")
}
fn bob() -> String {
    entity("person", "Bob")
}
fn carol() -> String {
    entity("person", "Carol")
}
fn acme() -> String {
    entity("org", "Acme")
}
fn globex() -> String {
    entity("org", "Globex")
}

fn keys(response: &PackagesResponse) -> Vec<&str> {
    response
        .packages
        .iter()
        .map(|p| p.chunk_key.as_str())
        .collect()
}

async fn hop(
    env: &Env,
    caller: &CallerContext,
    from: &str,
    kind: HopKind,
    limit: u32,
) -> Result<PackagesResponse, GraphError> {
    env.service
        .hop_for(
            caller,
            HopRequest {
                namespace: NS.into(),
                from_key: from.into(),
                kind: kind as i32,
                limit,
                caps: None,
            },
        )
        .await
}

/// `(keys, total, truncated)` of a hop that must succeed.
async fn hop_ok(
    env: &Env,
    caller: &CallerContext,
    from: &str,
    kind: HopKind,
    limit: u32,
) -> (Vec<String>, u64, bool) {
    let response = hop(env, caller, from, kind, limit)
        .await
        .unwrap_or_else(|err| panic!("{kind:?} from {from}: {err}"));
    (
        keys(&response).into_iter().map(str::to_owned).collect(),
        response.total,
        response.truncated,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn navigation_against_real_stores() {
    let env = start().await;
    fixture(&env.store).await;
    chunk_hops_follow_document_order(&env).await;
    entity_hops_respect_access(&env).await;
    outline_hops(&env).await;
    packages_carry_mentions_and_readable_relations(&env).await;
    zero_caps_empty_entity_lists_but_keep_their_totals(&env).await;
    file_entities_page_to_the_end(&env).await;
    file_triples_page_to_the_end(&env).await;
    ontology_is_the_published_tbox(&env).await;
    caps_over_the_hard_max_fail_closed(&env).await;
}

async fn chunk_hops_follow_document_order(env: &Env) {
    let all = full();
    let next = hop_ok(env, &all, "a0", HopKind::NextChunk, 0).await;
    assert_eq!(
        next,
        (vec!["a1".into(), "a2".into(), "a3".into()], 3, false)
    );
    let next = hop_ok(env, &all, "a0", HopKind::NextChunk, 2).await;
    assert_eq!(next, (vec!["a1".into(), "a2".into()], 3, true));
    // The last `limit` before the chunk, read in document order.
    let prev = hop_ok(env, &all, "a3", HopKind::PrevChunk, 2).await;
    assert_eq!(prev, (vec!["a1".into(), "a2".into()], 3, true));
    assert_eq!(
        hop_ok(env, &all, "a0", HopKind::PrevChunk, 0).await,
        (vec![], 0, false)
    );
    // Unreadable or disabled start chunks are not found, never empty.
    for (caller, from) in [(&restricted(), "c0"), (&all, "d0"), (&all, "nope")] {
        for kind in [HopKind::NextChunk, HopKind::PrevChunk, HopKind::Similar] {
            let err = hop(env, caller, from, kind, 0).await.unwrap_err();
            assert_eq!(err.code(), ErrorCode::NotFound, "{kind:?} from {from}");
        }
    }
    // No file-vector lookup in this process: similar says so instead of answering empty.
    let err = hop(env, &all, "a0", HopKind::Similar, 0).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable);
    let err = hop(env, &all, "a0", HopKind::Unspecified, 0)
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.to_string().contains("outline_siblings"));
}

async fn entity_hops_respect_access(env: &Env) {
    let all = full();
    let rc = restricted();
    let s = |v: &[&str]| v.iter().map(|k| (*k).to_owned()).collect::<Vec<_>>();

    // mentions from an entity: readable chunks mentioning it, by path then position.
    let m = hop_ok(env, &all, &alice(), HopKind::Mentions, 0).await;
    assert_eq!(m, (s(&["a0", "a2", "b0", "c0"]), 4, false));
    let m = hop_ok(env, &rc, &alice(), HopKind::Mentions, 0).await;
    assert_eq!(
        m,
        (s(&["a0", "a2", "b0"]), 3, false),
        "no secret chunk, no count of it"
    );
    let m = hop_ok(env, &rc, &alice(), HopKind::Mentions, 2).await;
    assert_eq!(m, (s(&["a0", "a2"]), 3, true));
    // From a chunk: other chunks sharing its entities, most shared first.
    let m = hop_ok(env, &all, "b0", HopKind::Mentions, 0).await;
    assert_eq!(
        m,
        (s(&["c0", "a0", "a1", "a2", "b1"]), 5, false),
        "c0 shares two"
    );
    let m = hop_ok(env, &rc, "b0", HopKind::Mentions, 0).await;
    assert_eq!(m, (s(&["a0", "a1", "a2", "b1"]), 4, false));
    // An entity only a denied file mentions has no neighbours for that caller.
    assert_eq!(
        hop_ok(env, &rc, &carol(), HopKind::Mentions, 0).await,
        (vec![], 0, false)
    );
    assert_eq!(
        hop_ok(env, &rc, &carol(), HopKind::Rel, 0).await,
        (vec![], 0, false)
    );
    assert_eq!(
        hop_ok(env, &rc, &carol(), HopKind::SameType, 0).await,
        (vec![], 0, false)
    );

    // rel: chunks mentioning entities related to alice by enabled, readable REL edges
    // (acme via fa, bob via fb, carol via fc; bob via the disabled fd never counts).
    let r = hop_ok(env, &all, &alice(), HopKind::Rel, 0).await;
    assert_eq!(r, (s(&["a0", "a1", "b0", "c0"]), 4, false));
    let r = hop_ok(env, &rc, &alice(), HopKind::Rel, 0).await;
    assert_eq!(r, (s(&["a0", "a1", "b0"]), 3, false));
    // globex is related to bob only by a REL the denied file states.
    let r = hop_ok(env, &all, &bob(), HopKind::Rel, 0).await;
    assert_eq!(r, (s(&["a0", "a2", "b0", "b1", "c0"]), 5, false));
    let r = hop_ok(env, &rc, &bob(), HopKind::Rel, 0).await;
    assert_eq!(
        r,
        (s(&["a0", "a2", "b0"]), 3, false),
        "no b1 through the secret REL"
    );

    // same_type: chunks mentioning other persons.
    let t = hop_ok(env, &all, &alice(), HopKind::SameType, 0).await;
    assert_eq!(t, (s(&["a1", "b0", "c0"]), 3, false));
    let t = hop_ok(env, &rc, &alice(), HopKind::SameType, 0).await;
    assert_eq!(t, (s(&["a1", "b0"]), 2, false));
    let t = hop_ok(env, &all, "b1", HopKind::SameType, 0).await;
    assert_eq!(t, (s(&["a0"]), 1, false), "acme is the other org");

    let err = hop(env, &rc, "c0", HopKind::Mentions, 0).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);

    // kg_open by entity key agrees with the mentions hop.
    let open = env
        .service
        .open_for(
            &rc,
            OpenRequest {
                namespace: NS.into(),
                key: Some(Key::EntityKey(alice())),
                limit: 0,
                caps: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(keys(&open), ["a0", "a2", "b0"]);
    assert_eq!(open.total, 3);
}

async fn outline_hops(env: &Env) {
    let all = full();
    let s = |v: &[&str]| v.iter().map(|k| (*k).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        hop_ok(env, &all, "oa1", HopKind::OutlineChild, 0).await,
        (s(&["a2", "a3"]), 2, false)
    );
    assert_eq!(
        hop_ok(env, &all, "oa1", HopKind::OutlineChild, 1).await,
        (s(&["a2"]), 2, true)
    );
    assert_eq!(
        hop_ok(env, &all, "oa2", HopKind::OutlineParent, 0).await,
        (s(&["a1"]), 1, false)
    );
    assert_eq!(
        hop_ok(env, &all, "oa0", HopKind::OutlineParent, 0).await,
        (vec![], 0, false)
    );
    assert_eq!(
        hop_ok(env, &all, "oa2", HopKind::OutlineSiblings, 0).await,
        (s(&["a3"]), 1, false)
    );
    assert_eq!(
        hop_ok(env, &all, "oa0", HopKind::OutlineSiblings, 0).await,
        (s(&["a1"]), 1, false)
    );
    assert_eq!(
        hop_ok(env, &all, "oa3", HopKind::OutlineChild, 0).await,
        (vec![], 0, false)
    );
    let hidden = caller_of(&[NS], |a| a.deny_prefixes = vec!["docs/a".into()]);
    for kind in [
        HopKind::OutlineChild,
        HopKind::OutlineParent,
        HopKind::OutlineSiblings,
    ] {
        let err = hop(env, &hidden, "oa1", kind, 0).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::NotFound, "{kind:?}");
    }
}

async fn open_chunk(
    env: &Env,
    caller: &CallerContext,
    key: &str,
    caps: PackageCaps,
) -> ChunkPackage {
    let mut response = env
        .service
        .open_for(
            caller,
            OpenRequest {
                namespace: NS.into(),
                key: Some(Key::ChunkKey(key.into())),
                limit: 0,
                caps: Some(caps),
            },
        )
        .await
        .unwrap();
    response.packages.remove(0)
}

async fn packages_carry_mentions_and_readable_relations(env: &Env) {
    let a0 = open_chunk(env, &full(), "a0", PackageCaps::default()).await;
    let mentions: Vec<_> = a0
        .mentions
        .iter()
        .map(|m| {
            (
                m.entity_key.clone(),
                m.name.as_str(),
                m.type_label.as_str(),
                m.char_start,
                m.char_end,
            )
        })
        .collect();
    assert_eq!(
        mentions,
        [
            (acme(), "Acme", "Organisation", Some(2), Some(6)),
            (alice(), "Alice", "Person", Some(10), Some(15)),
        ],
        "in text order"
    );
    assert_eq!(a0.mentions[0].method, "gazetteer");
    assert_eq!(a0.mentions[0].quote, "Acme");

    let rels = |p: &ChunkPackage| -> Vec<(String, String, String, String, String)> {
        p.rel_neighbors
            .iter()
            .map(|r| {
                (
                    r.entity_key.clone(),
                    r.relation_type_id.clone(),
                    r.direction.clone(),
                    r.other_entity_key.clone(),
                    r.stated_in_file_id.clone(),
                )
            })
            .collect()
    };
    let st = |e: String, r: &str, d: &str, o: String, f: &str| {
        (e, r.to_owned(), d.to_owned(), o, f.to_owned())
    };
    assert_eq!(
        rels(&a0),
        [
            st(alice(), "knows", "out", bob(), "fb"),
            st(alice(), "knows", "in", carol(), "fc"),
            st(acme(), "works_for", "in", alice(), "fa"),
            st(alice(), "works_for", "out", acme(), "fa"),
        ]
    );
    let carol_edge = &a0.rel_neighbors[1];
    assert_eq!(
        (
            carol_edge.source_entity_key.as_str(),
            carol_edge.target_entity_key.as_str()
        ),
        (carol().as_str(), alice().as_str())
    );
    assert_eq!(carol_edge.stated_in_chunk_key, "c0");
    assert!(a0.counts.is_none(), "nothing was clipped");

    // The restricted caller: no relation the secret file states, and no count of it.
    let a0 = open_chunk(
        env,
        &restricted(),
        "a0",
        PackageCaps {
            rel: Some(2),
            mentions: Some(1),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        rels(&a0),
        [
            st(alice(), "knows", "out", bob(), "fb"),
            st(acme(), "works_for", "in", alice(), "fa"),
        ]
    );
    assert_eq!(a0.mentions.len(), 1);
    let counts = a0.counts.unwrap().lists;
    let count = |name: &str| {
        counts
            .iter()
            .find(|c| c.list == name)
            .map(|c| (c.total, c.truncated))
    };
    assert_eq!(
        count("relNeighbors"),
        Some((3, true)),
        "3 readable edges, not 4"
    );
    assert_eq!(count("mentions"), Some((2, true)));

    // b0 mentions bob, whose works_for globex is stated only by the secret file.
    let b0 = open_chunk(env, &restricted(), "b0", PackageCaps::default()).await;
    assert!(b0.rel_neighbors.iter().all(|r| r.stated_in_file_id != "fc"));
    assert!(
        b0.rel_neighbors.iter().all(|r| r.stated_in_file_id != "fd"),
        "disabled REL"
    );
    let b0 = open_chunk(env, &full(), "b0", PackageCaps::default()).await;
    assert!(
        b0.rel_neighbors
            .iter()
            .any(|r| r.other_entity_key == globex())
    );
    assert!(
        b0.rel_neighbors.iter().all(|r| r.stated_in_file_id != "fd"),
        "disabled REL"
    );
    assert!(b0.similar_files.is_empty());
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

/// Caps of 0 empty mentions and relNeighbors (and the outline lists) yet report the
/// readable totals; absent caps are the defaults; a hop's packages take the same caps.
async fn zero_caps_empty_entity_lists_but_keep_their_totals(env: &Env) {
    let none = PackageCaps {
        mentions: Some(0),
        rel: Some(0),
        ancestors: Some(0),
        siblings: Some(0),
        children: Some(0),
        similar: Some(0),
    };
    let a0 = open_chunk(env, &full(), "a0", none).await;
    assert!(a0.mentions.is_empty() && a0.rel_neighbors.is_empty());
    assert_eq!(clipped(&a0, "mentions"), Some((2, true)));
    assert_eq!(clipped(&a0, "relNeighbors"), Some((4, true)));
    // Intro's one sibling (Body) is counted, not shown.
    assert!(a0.outline.as_ref().unwrap().siblings.is_empty());
    assert_eq!(clipped(&a0, "siblings"), Some((1, true)));
    // Totals stay within what the caller may read: 3 edges, not the secret file's 4th.
    let a0 = open_chunk(env, &restricted(), "a0", none).await;
    assert_eq!(clipped(&a0, "relNeighbors"), Some((3, true)));
    // A list that is empty anyway is not reported as clipped.
    let a3 = open_chunk(env, &full(), "a3", none).await;
    assert!(a3.mentions.is_empty() && clipped(&a3, "mentions").is_none());
    assert!(clipped(&a3, "relNeighbors").is_none());
    assert_eq!(clipped(&a3, "ancestors"), Some((1, true)));

    // Absent caps (the field or the whole message) are the defaults: nothing clipped here.
    let defaults = open_chunk(env, &full(), "a0", PackageCaps::default()).await;
    assert_eq!(
        (defaults.mentions.len(), defaults.rel_neighbors.len()),
        (2, 4)
    );
    assert!(defaults.counts.is_none());
    let bare = env
        .service
        .open_for(
            &full(),
            OpenRequest {
                namespace: NS.into(),
                key: Some(Key::ChunkKey("a0".into())),
                limit: 0,
                caps: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(bare.packages, [defaults]);
    // One explicit 0 leaves the other lists at their defaults.
    let a0 = open_chunk(
        env,
        &full(),
        "a0",
        PackageCaps {
            rel: Some(0),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(a0.mentions.len(), 2);
    assert!(a0.rel_neighbors.is_empty());
    assert_eq!(a0.counts.unwrap().lists.len(), 1);

    // The packages a hop lands on are built with the hop's caps.
    let hopped = env
        .service
        .hop_for(
            &full(),
            HopRequest {
                namespace: NS.into(),
                from_key: "a0".into(),
                kind: HopKind::NextChunk as i32,
                limit: 2,
                caps: Some(PackageCaps {
                    mentions: Some(0),
                    ..Default::default()
                }),
            },
        )
        .await
        .unwrap();
    assert_eq!(keys(&hopped), ["a1", "a2"]);
    for package in &hopped.packages {
        assert!(package.mentions.is_empty());
        assert_eq!(
            clipped(package, "mentions"),
            Some((1, true)),
            "{}",
            package.chunk_key
        );
        assert!(!package.rel_neighbors.is_empty(), "rel keeps its default");
    }
}

async fn file_entities(
    env: &Env,
    caller: &CallerContext,
    file_id: &str,
    limit: u32,
    after: &str,
) -> Result<kg_proto::v1::FileEntitiesResponse, GraphError> {
    env.service
        .file_entities_for(
            caller,
            FileEntitiesRequest {
                namespace: NS.into(),
                file_id: file_id.into(),
                limit,
                after_entity_key: after.into(),
            },
        )
        .await
}

async fn file_entities_page_to_the_end(env: &Env) {
    let rc = restricted();
    let mut after = String::new();
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let page = file_entities(env, &rc, "fa", 2, &after).await.unwrap();
        assert_eq!(page.total, 3);
        let types: Vec<_> = page
            .entity_types
            .iter()
            .map(|t| (t.type_id.as_str(), t.label.as_str()))
            .collect();
        assert_eq!(types, [("org", "Organisation"), ("person", "Person")]);
        seen.extend(
            page.entities
                .iter()
                .map(|e| (e.entity_key.clone(), e.type_label.clone(), e.mention_count)),
        );
        pages += 1;
        if !page.truncated {
            break;
        }
        after = page.entities.last().unwrap().entity_key.clone();
    }
    assert_eq!(pages, 2);
    assert_eq!(
        seen,
        [
            (acme(), "Organisation".to_owned(), 1),
            (alice(), "Person".to_owned(), 2),
            (bob(), "Person".to_owned(), 1),
        ]
    );
    let err = file_entities(env, &rc, "fc", 0, "").await.unwrap_err();
    assert_eq!(
        err.code(),
        ErrorCode::NotFound,
        "a denied file is not found"
    );
    let err = file_entities(env, &full(), "fd", 0, "").await.unwrap_err();
    assert_eq!(
        err.code(),
        ErrorCode::NotFound,
        "a disabled file is not found"
    );
    let empty = file_entities(env, &full(), "fa", 0, &bob()).await.unwrap();
    assert!(empty.entities.is_empty() && !empty.truncated);
}

async fn file_triples(
    env: &Env,
    caller: &CallerContext,
    file_id: &str,
    limit: u32,
    after: Option<&kg_proto::v1::Triple>,
) -> Result<kg_proto::v1::FileTriplesResponse, GraphError> {
    env.service
        .file_triples_for(
            caller,
            FileTriplesRequest {
                namespace: NS.into(),
                file_id: file_id.into(),
                limit,
                after_source_entity_key: after
                    .map(|t| t.source_entity_key.clone())
                    .unwrap_or_default(),
                after_relation_type_id: after
                    .map(|t| t.relation_type_id.clone())
                    .unwrap_or_default(),
                after_target_entity_key: after
                    .map(|t| t.target_entity_key.clone())
                    .unwrap_or_default(),
            },
        )
        .await
}

/// Every triple of the file, one page of `limit` at a time.
async fn all_triples(
    env: &Env,
    caller: &CallerContext,
    file_id: &str,
    limit: u32,
) -> (Vec<(String, String, String)>, u64, usize) {
    let mut after = None;
    let mut out = Vec::new();
    let mut pages = 0;
    let mut total;
    loop {
        let page = file_triples(env, caller, file_id, limit, after.as_ref())
            .await
            .unwrap();
        pages += 1;
        total = page.total;
        out.extend(page.triples.iter().map(|t| {
            (
                t.source_entity_key.clone(),
                t.relation_type_id.clone(),
                t.target_entity_key.clone(),
            )
        }));
        if !page.truncated {
            assert!(page.continue_after.is_none());
            break;
        }
        assert_eq!(page.continue_after.as_ref(), page.triples.last());
        after = page.continue_after;
    }
    (out, total, pages)
}

async fn file_triples_page_to_the_end(env: &Env) {
    let t = |s: String, r: &str, o: String| (s, r.to_owned(), o);
    // docs/a.md mentions alice, acme, bob: alice knows bob (stated by fb) and alice
    // works_for acme (fa); bob knows alice is stated by the disabled fd.
    let (triples, total, pages) = all_triples(env, &restricted(), "fa", 1).await;
    assert_eq!(
        triples,
        [t(alice(), "knows", bob()), t(alice(), "works_for", acme())]
    );
    assert_eq!((total, pages), (2, 2));
    // docs/b.md: bob works_for globex is stated only by the secret file.
    let (triples, total, _) = all_triples(env, &full(), "fb", 0).await;
    assert_eq!(
        triples,
        [t(alice(), "knows", bob()), t(bob(), "works_for", globex())]
    );
    assert_eq!(total, 2);
    let (triples, total, _) = all_triples(env, &restricted(), "fb", 0).await;
    assert_eq!(triples, [t(alice(), "knows", bob())]);
    assert_eq!(total, 1, "no count of the secret triple");
    let err = file_triples(env, &restricted(), "fc", 0, None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
    let err = env
        .service
        .file_triples_for(
            &full(),
            FileTriplesRequest {
                namespace: NS.into(),
                file_id: "fa".into(),
                after_source_entity_key: alice(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.to_string().contains("after_relation_type_id"));
}

async fn ontology_is_the_published_tbox(env: &Env) {
    let request = |ns: &str| OntologyRequest {
        namespace: ns.into(),
    };
    let empty = env
        .service
        .ontology_for(&full(), request("empty"))
        .await
        .unwrap();
    assert!(!empty.published && empty.entity_types.is_empty() && empty.relation_types.is_empty());
    assert_eq!(empty.namespace, "empty");

    let tbox = Tbox {
        namespace: NS.into(),
        version: 4,
        entity_types: vec![EntityType {
            type_id: "person".into(),
            label: "Person".into(),
            ..Default::default()
        }],
        relation_types: vec![RelationType {
            relation_type_id: "works_for".into(),
            label: "works for".into(),
            source_type_id: "person".into(),
            target_type_id: "org".into(),
            ..Default::default()
        }],
        published_at_ms: 123,
    };
    env.tbox.put(&tbox).await.unwrap();
    let got = env
        .service
        .ontology_for(&restricted(), request(NS))
        .await
        .unwrap();
    assert!(got.published);
    assert_eq!((got.version, got.published_at_ms), (4, 123));
    assert_eq!(got.relation_types[0].source_type_id, "person");
    assert_eq!(got.relation_types[0].target_type_id, "org");
    assert_eq!(got.entity_types.len(), 1);

    let err = env
        .service
        .ontology_for(&restricted(), request("empty"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied);
    let bare = GraphService::new(env.store.clone());
    let err = bare.ontology_for(&full(), request(NS)).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable);
}

async fn caps_over_the_hard_max_fail_closed(env: &Env) {
    let all = full();
    let over = |caps: PackageCaps| HopRequest {
        namespace: NS.into(),
        from_key: "a0".into(),
        kind: HopKind::NextChunk as i32,
        limit: 0,
        caps: Some(caps),
    };
    for (caps, name) in [
        (
            PackageCaps {
                mentions: Some(25),
                ..Default::default()
            },
            "caps.mentions",
        ),
        (
            PackageCaps {
                rel: Some(25),
                ..Default::default()
            },
            "caps.rel",
        ),
        (
            PackageCaps {
                similar: Some(17),
                ..Default::default()
            },
            "caps.similar",
        ),
    ] {
        let err = env.service.hop_for(&all, over(caps)).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument);
        assert!(err.to_string().contains(name), "{err}");
    }
    let err = hop(env, &all, "a0", HopKind::NextChunk, 33)
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    let err = file_entities(env, &all, "fa", 201, "").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    let err = file_triples(env, &all, "fa", 201, None).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    // At the hard max is fine.
    let ok = hop(env, &all, "a0", HopKind::NextChunk, 32).await.unwrap();
    assert_eq!(ok.packages.len(), 3);
}

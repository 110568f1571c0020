//! kg_cypher against a real FalkorDB: a table of statements, each either accepted with its
//! exact rewritten form or refused with the rule it breaks, all run as a restricted caller
//! (folder `docs/` only, `docs/secret.md` denied by file id, `private/plan.md` outside the
//! folder, `docs/off.md` disabled). Accepted statements run twice: as the restricted caller,
//! whose rows must hold nothing of the hidden files, and as a whole-namespace caller, whose
//! rows prove that the hidden data is really there for the statement to reach.

use kg_common::caller::{CONTEXT_TTL_MS, now_ms};
use kg_common::error::{ErrorCode, ErrorExt};
use kg_graph::GraphService;
use kg_indexer::graph_writer::{ChunkRecord, FileRecord, OutlineRecord, write_file};
use kg_proto::v1::{AccessFilter, CallerContext, CypherRequest, Permission};
use kg_stores::embedded::{EmbeddedFalkor, find_venv};
use kg_stores::graph::{GraphStore, Params};
use serde_json::{Value, json};

const NS: &str = "cytable";

/// Text that only the hidden files, their entities and their relations carry.
const MARKERS: &[&str] = &[
    "CLASSIFIED",
    "Nightingale",
    "Zephyr",
    "Obsolete",
    "secret",
    "private",
    "off.md",
    "merges_with",
    "acquires",
    "partners_with",
    "file-sec",
    "file-priv",
    "file-off",
];

fn caller(edit: impl FnOnce(&mut AccessFilter)) -> CallerContext {
    let mut access = AccessFilter {
        namespace: NS.into(),
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

fn restricted() -> CallerContext {
    caller(|a| {
        a.allow_prefixes = vec!["docs/".into()];
        a.deny_file_ids = vec!["file-sec".into()];
    })
}

fn file(
    id: &str,
    path: &str,
    enabled: bool,
    texts: &[&str],
    heading: &str,
) -> (FileRecord, Vec<ChunkRecord>, Vec<OutlineRecord>) {
    let (folder, name) = match path.rfind('/') {
        Some(i) => (path[..=i].to_owned(), path[i + 1..].to_owned()),
        None => (String::new(), path.to_owned()),
    };
    let chunks: Vec<ChunkRecord> = texts
        .iter()
        .enumerate()
        .map(|(i, text)| ChunkRecord {
            chunk_key: format!("ch_{id}_{i}"),
            index: i as u32,
            text: (*text).to_owned(),
            context_header: heading.to_owned(),
            char_start: (i * 100) as u64,
            char_end: (i * 100 + text.len()) as u64,
            line_start: i as u32 + 1,
            line_end: i as u32 + 1,
            page_start: None,
            page_end: None,
            token_count: 8,
            section_key: Some(format!("ol_{id}")),
        })
        .collect();
    let outline = vec![OutlineRecord {
        outline_key: format!("ol_{id}"),
        title: heading.to_owned(),
        depth: 1,
        order: 0,
        parent_key: None,
        line_start: 1,
        line_end: texts.len() as u32,
        char_start: 0,
        char_end: 100 * texts.len() as u64,
        page_start: None,
        page_end: None,
        covers: chunks.iter().map(|c| c.chunk_key.clone()).collect(),
    }];
    let record = FileRecord {
        namespace: NS.into(),
        file_id: id.into(),
        version_id: "v1".into(),
        path: path.into(),
        name,
        folder_path: folder,
        enabled,
        hidden: false,
        title: None,
        document_date: None,
        mime: "text/markdown".into(),
    };
    (record, chunks, outline)
}

async fn run(store: &GraphStore, cypher: &str, params: Value) {
    let params: Params = serde_json::from_value(params).unwrap();
    store.query(NS, cypher, &params).await.unwrap();
}

/// Files, then entities with their mentions and relations (schema of the brief).
async fn fixtures(store: &GraphStore) {
    let files = [
        file(
            "file-pub",
            "docs/public.md",
            true,
            &[
                "Acme Corp signs outgoing mail with a DKIM record.",
                "Rotate the DKIM key every year.",
            ],
            "Mail security",
        ),
        file(
            "file-sec",
            "docs/secret.md",
            true,
            &["CLASSIFIED: Project Nightingale merges with Acme Corp."],
            "Nightingale merger",
        ),
        file(
            "file-priv",
            "private/plan.md",
            true,
            &["CLASSIFIED: the Zephyr budget is 42 million."],
            "Zephyr budget",
        ),
        file(
            "file-off",
            "docs/off.md",
            false,
            &["CLASSIFIED: the Obsolete protocol."],
            "Obsolete protocol",
        ),
    ];
    for (record, chunks, outline) in &files {
        write_file(store, record, chunks, outline).await.unwrap();
    }
    for (type_id, label) in [
        ("org", "Organization"),
        ("tech", "Technology"),
        ("project", "Project"),
    ] {
        run(
            store,
            "CREATE (:EntityType {typeId: $id, label: $label, side: 'published'})",
            json!({"id": type_id, "label": label}),
        )
        .await;
    }
    for (key, name, type_id) in [
        ("ent:org:acme corp", "Acme Corp", "org"),
        ("ent:tech:dkim", "DKIM", "tech"),
        ("ent:project:nightingale", "Nightingale", "project"),
        ("ent:project:zephyr", "Zephyr", "project"),
        ("ent:tech:obsolete", "Obsolete", "tech"),
    ] {
        run(store, "MATCH (t:EntityType {typeId: $type}) CREATE (:Entity {entityKey: $key, name: $name, normName: toLower($name), typeId: $type, aliases: []})-[:INSTANCE_OF]->(t)",
            json!({"key": key, "name": name, "type": type_id})).await;
    }
    for (chunk, file_id, entity, quote) in [
        (
            "ch_file-pub_0",
            "file-pub",
            "ent:org:acme corp",
            "Acme Corp",
        ),
        ("ch_file-pub_0", "file-pub", "ent:tech:dkim", "DKIM"),
        ("ch_file-pub_1", "file-pub", "ent:tech:dkim", "DKIM"),
        (
            "ch_file-sec_0",
            "file-sec",
            "ent:project:nightingale",
            "Nightingale",
        ),
        (
            "ch_file-sec_0",
            "file-sec",
            "ent:org:acme corp",
            "Acme Corp",
        ),
        (
            "ch_file-priv_0",
            "file-priv",
            "ent:project:zephyr",
            "Zephyr",
        ),
        ("ch_file-off_0", "file-off", "ent:tech:obsolete", "Obsolete"),
    ] {
        run(store, "MATCH (c:Chunk {chunkKey: $chunk}), (e:Entity {entityKey: $entity}) CREATE (c)-[:MENTIONS {method: 'gazetteer', quote: $quote, charStart: 0, charEnd: 4, fileId: $file}]->(e)",
            json!({"chunk": chunk, "entity": entity, "quote": quote, "file": file_id})).await;
    }
    for (from, rel, to, file_id, path) in [
        (
            "ent:org:acme corp",
            "uses",
            "ent:tech:dkim",
            "file-pub",
            "docs/public.md",
        ),
        (
            "ent:org:acme corp",
            "partners_with",
            "ent:tech:dkim",
            "file-sec",
            "docs/secret.md",
        ),
        (
            "ent:project:nightingale",
            "merges_with",
            "ent:org:acme corp",
            "file-sec",
            "docs/secret.md",
        ),
        (
            "ent:org:acme corp",
            "acquires",
            "ent:project:zephyr",
            "file-priv",
            "private/plan.md",
        ),
    ] {
        run(store, "MATCH (a:Entity {entityKey: $from}), (b:Entity {entityKey: $to}) CREATE (a)-[:REL {relationTypeId: $rel, fileId: $file, chunkKey: 'x', path: $path, enabled: true, versionId: 'v1'}]->(b)",
            json!({"from": from, "to": to, "rel": rel, "file": file_id, "path": path})).await;
    }
}

/// The restricted caller's predicate over `v` (`path` or `vfsPath`).
fn g(v: &str, prop: &str) -> String {
    format!(
        "{v}.enabled = true AND {v}.{prop} STARTS WITH $kg_acl_allow_0 AND {v}.fileId <> $kg_acl_deny_file_0"
    )
}

enum Expect {
    /// Accepted: the exact rewritten text, the restricted caller's rows when pinned, and
    /// whether the whole-namespace caller must see a marker (the statement reaches hidden data).
    Accept {
        rewritten: String,
        rows: Option<Value>,
        reaches_hidden: bool,
    },
    /// Refused with this rule.
    Reject(&'static str),
}

struct Case {
    statement: &'static str,
    params: Value,
    expect: Expect,
}

fn accept(
    statement: &'static str,
    rewritten: String,
    rows: Option<Value>,
    reaches_hidden: bool,
) -> Case {
    Case {
        statement,
        params: json!({}),
        expect: Expect::Accept {
            rewritten,
            rows,
            reaches_hidden,
        },
    }
}

fn reject(statement: &'static str, rule: &'static str) -> Case {
    Case {
        statement,
        params: json!({}),
        expect: Expect::Reject(rule),
    }
}

fn table() -> Vec<Case> {
    let c = g("c", "path");
    let f = g("f", "vfsPath");
    let mut cases = vec![
        // --- accepted: direct reads ---
        accept(
            "MATCH (c:Chunk)-[:PART_OF]->(f:FileRef) WHERE toLower(c.text) CONTAINS 'dkim' RETURN f.vfsPath AS path, c.text AS text ORDER BY text LIMIT 10",
            format!(
                "MATCH (c:Chunk)-[:PART_OF]->(f:FileRef) WHERE {c} AND {f} AND CASE WHEN c IS NOT NULL AND f IS NOT NULL THEN toLower(c.text) CONTAINS 'dkim' ELSE false END RETURN f.vfsPath AS path, c.text AS text ORDER BY text LIMIT 10"
            ),
            Some(json!([
                [
                    "docs/public.md",
                    "Acme Corp signs outgoing mail with a DKIM record."
                ],
                ["docs/public.md", "Rotate the DKIM key every year."]
            ])),
            false,
        ),
        accept(
            "MATCH (c:Chunk) RETURN count(c) AS n LIMIT 1",
            format!("MATCH (c:Chunk) WHERE {c} RETURN count(c) AS n LIMIT 1"),
            Some(json!([[2]])),
            false,
        ),
        accept(
            "MATCH (f:FileRef) RETURN f.vfsPath AS path ORDER BY path LIMIT 50",
            format!("MATCH (f:FileRef) WHERE {f} RETURN f.vfsPath AS path ORDER BY path LIMIT 50"),
            Some(json!([["docs/public.md"]])),
            true,
        ),
        accept(
            "MATCH (f:FileRef) WHERE f.vfsPath = 'docs/secret.md' RETURN f LIMIT 5",
            format!(
                "MATCH (f:FileRef) WHERE {f} AND f.vfsPath = 'docs/secret.md' RETURN f LIMIT 5"
            ),
            Some(json!([])),
            true,
        ),
        accept(
            "MATCH (c:Chunk {fileId: 'file-sec'}) RETURN c.text AS text LIMIT 5",
            format!(
                "MATCH (c:Chunk {{fileId: 'file-sec'}}) WHERE {c} RETURN c.text AS text LIMIT 5"
            ),
            Some(json!([])),
            true,
        ),
        accept(
            "MATCH (f:FileRef) WHERE f.vfsPath = 'docs/secret.md' OR true RETURN f.vfsPath AS path LIMIT 10",
            format!(
                "MATCH (f:FileRef) WHERE {f} AND (f.vfsPath = 'docs/secret.md' OR true) RETURN f.vfsPath AS path LIMIT 10"
            ),
            Some(json!([["docs/public.md"]])),
            true,
        ),
        accept(
            "UNWIND ['docs/secret.md', 'private/plan.md', 'docs/public.md'] AS p MATCH (f:FileRef) WHERE f.vfsPath = p RETURN f.vfsPath AS path LIMIT 10",
            format!(
                "UNWIND ['docs/secret.md', 'private/plan.md', 'docs/public.md'] AS p MATCH (f:FileRef) WHERE {f} AND f.vfsPath = p RETURN f.vfsPath AS path LIMIT 10"
            ),
            Some(json!([["docs/public.md"]])),
            true,
        ),
        accept(
            "match (c:Chunk) // a comment\n return c.chunkIndex as i /* another */ order by i desc limit 1",
            format!("MATCH (c:Chunk) WHERE {c} RETURN c.chunkIndex AS i ORDER BY i DESC LIMIT 1"),
            Some(json!([[1]])),
            false,
        ),
        accept(
            "MATCH (c:Chunk) WHERE c.text CONTAINS \"O'Brien \\\" x\" RETURN c.text AS t LIMIT 1",
            format!(
                "MATCH (c:Chunk) WHERE {c} AND CASE WHEN c IS NOT NULL THEN c.text CONTAINS 'O\\'Brien \" x' ELSE false END RETURN c.text AS t LIMIT 1"
            ),
            Some(json!([])),
            false,
        ),
        accept(
            "MATCH (a:Chunk)-[:NEXT_CHUNK]->(b:Chunk) RETURN a.chunkIndex AS a, b.chunkIndex AS b LIMIT 10",
            format!(
                "MATCH (a:Chunk)-[:NEXT_CHUNK]->(b:Chunk) WHERE {} AND {} RETURN a.chunkIndex AS a, b.chunkIndex AS b LIMIT 10",
                g("a", "path"),
                g("b", "path")
            ),
            Some(json!([[0, 1]])),
            false,
        ),
        accept(
            "MATCH (c:Chunk)-[:PART_OF]->(f:FileRef) RETURN c {.chunkKey, .chunkIndex, path: f.vfsPath} AS chunk ORDER BY c.chunkIndex, f.vfsPath LIMIT 1",
            format!(
                "MATCH (c:Chunk)-[:PART_OF]->(f:FileRef) WHERE {c} AND {f} RETURN c {{.chunkKey, .chunkIndex, path: f.vfsPath}} AS chunk ORDER BY c.chunkIndex, f.vfsPath LIMIT 1"
            ),
            Some(
                json!([[{"chunkKey": "ch_file-pub_0", "chunkIndex": 0, "path": "docs/public.md"}]]),
            ),
            false,
        ),
        accept(
            "MATCH (c:Chunk)-[:PART_OF]->(f:FileRef) RETURN f.vfsPath AS path, collect(c.chunkKey) AS keys LIMIT 10",
            format!(
                "MATCH (c:Chunk)-[:PART_OF]->(f:FileRef) WHERE {c} AND {f} RETURN f.vfsPath AS path, collect(c.chunkKey) AS keys LIMIT 10"
            ),
            None,
            true,
        ),
        // --- accepted: keyset paging ---
        Case {
            statement: "MATCH (c:Chunk) WHERE ID(c) > $afterId RETURN c.chunkKey AS key ORDER BY ID(c) LIMIT 1",
            params: json!({"afterId": -1}),
            expect: Expect::Accept {
                rewritten: format!(
                    "MATCH (c:Chunk) WHERE {c} AND ID(c) > $afterId RETURN c.chunkKey AS key ORDER BY ID(c) LIMIT 1"
                ),
                rows: Some(json!([["ch_file-pub_0"]])),
                reaches_hidden: false,
            },
        },
        // --- accepted: through entities ---
        accept(
            "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity) RETURN DISTINCT e.name AS name ORDER BY name LIMIT 50",
            format!(
                "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity) WHERE {c} RETURN DISTINCT e.name AS name ORDER BY name LIMIT 50"
            ),
            Some(json!([["Acme Corp"], ["DKIM"]])),
            true,
        ),
        accept(
            "MATCH (:Chunk)-[:MENTIONS]->(e:Entity) RETURN DISTINCT e.name AS name ORDER BY name LIMIT 10",
            format!(
                "MATCH (kg_n1:Chunk)-[:MENTIONS]->(e:Entity) WHERE {} RETURN DISTINCT e.name AS name ORDER BY name LIMIT 10",
                g("kg_n1", "path")
            ),
            Some(json!([["Acme Corp"], ["DKIM"]])),
            true,
        ),
        accept(
            "MATCH (e:Entity)<-[:MENTIONS]-(c:Chunk) WHERE e.name = 'Nightingale' RETURN e.name AS name LIMIT 5",
            format!(
                "MATCH (e:Entity)<-[:MENTIONS]-(c:Chunk) WHERE {c} AND e.name = 'Nightingale' RETURN e.name AS name LIMIT 5"
            ),
            Some(json!([])),
            true,
        ),
        accept(
            "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity)<-[:MENTIONS]-(c2:Chunk)-[:PART_OF]->(f:FileRef) RETURN DISTINCT f.vfsPath AS path LIMIT 50",
            format!(
                "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity)<-[:MENTIONS]-(c2:Chunk)-[:PART_OF]->(f:FileRef) WHERE {c} AND {} AND {f} RETURN DISTINCT f.vfsPath AS path LIMIT 50",
                g("c2", "path")
            ),
            Some(json!([["docs/public.md"]])),
            true,
        ),
        accept(
            "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity {name: 'Acme Corp'}) MATCH (e)<-[:MENTIONS]-(c2:Chunk) RETURN DISTINCT c2.text AS text LIMIT 10",
            format!(
                "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity {{name: 'Acme Corp'}}) WHERE {c} MATCH (e)<-[:MENTIONS]-(c2:Chunk) WHERE {} RETURN DISTINCT c2.text AS text LIMIT 10",
                g("c2", "path")
            ),
            Some(json!([[
                "Acme Corp signs outgoing mail with a DKIM record."
            ]])),
            true,
        ),
        accept(
            "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity)-[:INSTANCE_OF]->(t:EntityType) RETURN DISTINCT t.label AS type ORDER BY type LIMIT 50",
            format!(
                "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity)-[:INSTANCE_OF]->(t:EntityType) WHERE {c} RETURN DISTINCT t.label AS type ORDER BY type LIMIT 50"
            ),
            Some(json!([["Organization"], ["Technology"]])),
            false,
        ),
        accept(
            "MATCH (t:EntityType) RETURN t.typeId AS id ORDER BY id LIMIT 50",
            "MATCH (t:EntityType) RETURN t.typeId AS id ORDER BY id LIMIT 50".to_owned(),
            Some(json!([["org"], ["project"], ["tech"]])),
            false,
        ),
        // --- accepted: REL, only where a readable file states it ---
        accept(
            "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity)-[r:REL]->(e2:Entity) RETURN DISTINCT e.name AS source, r.relationTypeId AS rel, e2.name AS target ORDER BY rel LIMIT 50",
            format!(
                "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity)-[r:REL]->(e2:Entity) WHERE {c} AND {} RETURN DISTINCT e.name AS source, r.relationTypeId AS rel, e2.name AS target ORDER BY rel LIMIT 50",
                g("r", "path")
            ),
            Some(json!([["Acme Corp", "uses", "DKIM"]])),
            true,
        ),
        accept(
            "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity)<-[r:REL]-(src:Entity) RETURN DISTINCT src.name AS source, r.relationTypeId AS rel LIMIT 50",
            format!(
                "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity)<-[r:REL]-(src:Entity) WHERE {c} AND {} RETURN DISTINCT src.name AS source, r.relationTypeId AS rel LIMIT 50",
                g("r", "path")
            ),
            Some(json!([["Acme Corp", "uses"]])),
            true,
        ),
        accept(
            "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity)-[:REL]-(x:Entity) RETURN DISTINCT x.name AS name ORDER BY name LIMIT 50",
            format!(
                "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity)-[kg_r1:REL]-(x:Entity) WHERE {c} AND {} RETURN DISTINCT x.name AS name ORDER BY name LIMIT 50",
                g("kg_r1", "path")
            ),
            Some(json!([["Acme Corp"], ["DKIM"]])),
            true,
        ),
        accept(
            "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity)-[r:REL]->(x:Entity) RETURN count(DISTINCT r.relationTypeId) AS n LIMIT 1",
            format!(
                "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity)-[r:REL]->(x:Entity) WHERE {c} AND {} RETURN count(DISTINCT r.relationTypeId) AS n LIMIT 1",
                g("r", "path")
            ),
            Some(json!([[1]])),
            false,
        ),
        accept(
            "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity), (x:Entity)-[r:REL]->(e) RETURN DISTINCT x.name AS name LIMIT 5",
            format!(
                "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity), (x:Entity)-[r:REL]->(e) WHERE {c} AND {} RETURN DISTINCT x.name AS name LIMIT 5",
                g("r", "path")
            ),
            Some(json!([["Acme Corp"]])),
            true,
        ),
        accept(
            "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity)-[r1:REL]->(e2:Entity)-[r2:REL]->(e3:Entity) RETURN e3.name AS name LIMIT 10",
            format!(
                "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity)-[r1:REL]->(e2:Entity)-[r2:REL]->(e3:Entity) WHERE {c} AND {} AND {} RETURN e3.name AS name LIMIT 10",
                g("r1", "path"),
                g("r2", "path")
            ),
            Some(json!([])),
            true,
        ),
        // --- accepted: folders and outline ---
        accept(
            "MATCH (d:Folder)-[:HAS_CHILD]->(f:FileRef) RETURN DISTINCT d.folderPath AS folder ORDER BY folder LIMIT 50",
            format!(
                "MATCH (d:Folder)-[:HAS_CHILD]->(f:FileRef) WHERE {f} RETURN DISTINCT d.folderPath AS folder ORDER BY folder LIMIT 50"
            ),
            Some(json!([["docs/"]])),
            true,
        ),
        accept(
            "MATCH (root:Folder)-[:HAS_CHILD]->(d:Folder)-[:HAS_CHILD]->(f:FileRef) RETURN root.folderPath AS root, d.folderPath AS folder, f.name AS name LIMIT 50",
            format!(
                "MATCH (root:Folder)-[:HAS_CHILD]->(d:Folder)-[:HAS_CHILD]->(f:FileRef) WHERE {f} RETURN root.folderPath AS root, d.folderPath AS folder, f.name AS name LIMIT 50"
            ),
            Some(json!([["/", "docs/", "public.md"]])),
            true,
        ),
        accept(
            "MATCH (d:Folder)-[:HAS_CHILD]->(f:FileRef) WITH DISTINCT d MATCH (p:Folder)-[:HAS_CHILD]->(d) RETURN p.folderPath AS parent LIMIT 10",
            format!(
                "MATCH (d:Folder)-[:HAS_CHILD]->(f:FileRef) WHERE {f} WITH DISTINCT d MATCH (p:Folder)-[:HAS_CHILD]->(d) RETURN p.folderPath AS parent LIMIT 10"
            ),
            Some(json!([["/"]])),
            false,
        ),
        accept(
            "MATCH (o:OutlineNode)-[:COVERS]->(c:Chunk) RETURN DISTINCT o.title AS title ORDER BY title LIMIT 50",
            format!(
                "MATCH (o:OutlineNode)-[:COVERS]->(c:Chunk) WHERE {} AND {c} RETURN DISTINCT o.title AS title ORDER BY title LIMIT 50",
                g("o", "path")
            ),
            Some(json!([["Mail security"]])),
            true,
        ),
        // --- accepted: OPTIONAL MATCH, WITH and aggregates see only readable rows ---
        accept(
            "MATCH (f:FileRef) OPTIONAL MATCH (c:Chunk)-[:PART_OF]->(f) RETURN f.vfsPath AS path, count(c) AS chunks LIMIT 50",
            format!(
                "MATCH (f:FileRef) WHERE {f} OPTIONAL MATCH (c:Chunk)-[:PART_OF]->(f) WHERE {c} RETURN f.vfsPath AS path, count(c) AS chunks LIMIT 50"
            ),
            Some(json!([["docs/public.md", 2]])),
            true,
        ),
        accept(
            "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity) OPTIONAL MATCH (e)<-[:MENTIONS]-(other:Chunk) RETURN e.name AS name, count(DISTINCT other) AS mentions ORDER BY name LIMIT 50",
            format!(
                "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity) WHERE {c} OPTIONAL MATCH (e)<-[:MENTIONS]-(other:Chunk) WHERE {} RETURN e.name AS name, count(DISTINCT other) AS mentions ORDER BY name LIMIT 50",
                g("other", "path")
            ),
            Some(json!([["Acme Corp", 1], ["DKIM", 2]])),
            true,
        ),
        accept(
            "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity) WITH DISTINCT e OPTIONAL MATCH (e)-[r:REL]->(x:Entity) RETURN e.name AS name, count(r) AS rels ORDER BY name LIMIT 50",
            format!(
                "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity) WHERE {c} WITH DISTINCT e OPTIONAL MATCH (e)-[r:REL]->(x:Entity) WHERE {} RETURN e.name AS name, count(r) AS rels ORDER BY name LIMIT 50",
                g("r", "path")
            ),
            Some(json!([["Acme Corp", 1], ["DKIM", 0]])),
            true,
        ),
        accept(
            "MATCH (c:Chunk)-[:PART_OF]->(f:FileRef) WITH f, count(c) AS n WHERE n > 0 RETURN f.name AS name, n LIMIT 50",
            format!(
                "MATCH (c:Chunk)-[:PART_OF]->(f:FileRef) WHERE {c} AND {f} WITH f, count(c) AS n WHERE n > 0 RETURN f.name AS name, n LIMIT 50"
            ),
            Some(json!([["public.md", 2]])),
            true,
        ),
        accept(
            "MATCH (c:Chunk) WITH c.path AS path, count(*) AS n RETURN path, n, CASE WHEN n > 1 THEN 'many' ELSE 'one' END AS amount LIMIT 50",
            format!(
                "MATCH (c:Chunk) WHERE {c} WITH c.path AS path, count(*) AS n RETURN path, n, CASE WHEN n > 1 THEN 'many' ELSE 'one' END AS amount LIMIT 50"
            ),
            Some(json!([["docs/public.md", 2, "many"]])),
            true,
        ),
        accept(
            "MATCH (f:FileRef) RETURN f ORDER BY f.vfsPath LIMIT 1",
            format!("MATCH (f:FileRef) WHERE {f} RETURN f ORDER BY f.vfsPath LIMIT 1"),
            None,
            false,
        ),
        // --- refused ---
        // A property map reading a node of its own MATCH would be compared before the guards.
        reject(
            "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity), (c2:Chunk)-[:MENTIONS]->(x:Entity {name: e.name}) RETURN x.name AS name LIMIT 5",
            "variable",
        ),
        reject("MATCH (c:Chunk) RETURN c.text", "limit"),
        reject("MATCH (c:Chunk) RETURN c.text LIMIT 51", "limit"),
        reject("MATCH (c:Chunk) RETURN c.text LIMIT 0", "limit"),
        reject("MATCH (c:Chunk) RETURN c.text LIMIT $n", "limit"),
        reject("MATCH (c:Chunk) RETURN c.text SKIP 10 LIMIT 10", "no_skip"),
        reject("MATCH (c:Chunk) WITH c SKIP 1 RETURN c LIMIT 1", "no_skip"),
        reject(
            "CREATE (c:Chunk {path: 'docs/x'}) RETURN c LIMIT 1",
            "read_only",
        ),
        reject(
            "MATCH (c:Chunk) SET c.enabled = true RETURN c LIMIT 1",
            "read_only",
        ),
        reject("MATCH (c:Chunk) DETACH DELETE c", "read_only"),
        reject(
            "MATCH (e:Entity) MERGE (e)-[:REL]->(e) RETURN e LIMIT 1",
            "read_only",
        ),
        reject(
            "MATCH (c:Chunk) REMOVE c.enabled RETURN c LIMIT 1",
            "read_only",
        ),
        reject(
            "LOAD CSV FROM 'file:///etc/passwd' AS l RETURN l LIMIT 1",
            "read_only",
        ),
        reject(
            "MATCH (c:Chunk) FOREACH (x IN [1] | SET c.enabled = false) RETURN c LIMIT 1",
            "read_only",
        ),
        reject("EXPLAIN MATCH (c:Chunk) RETURN c LIMIT 1", "read_only"),
        reject(
            "CALL db.labels() YIELD label RETURN label LIMIT 5",
            "no_procedures",
        ),
        reject(
            "CALL db.idx.fulltext.queryNodes('Chunk', 'CLASSIFIED') YIELD node RETURN node.text LIMIT 5",
            "no_procedures",
        ),
        reject(
            "MATCH (c:Chunk) RETURN apoc.text.join([c.text], ',') AS t LIMIT 1",
            "no_procedures",
        ),
        reject(
            "MATCH (c:Chunk) RETURN c LIMIT 1; MATCH (f:FileRef) RETURN f LIMIT 1",
            "one_statement",
        ),
        reject(
            "MATCH (c:Chunk) RETURN c.text AS t LIMIT 1 UNION MATCH (f:FileRef) RETURN f.name AS t LIMIT 1",
            "one_statement",
        ),
        reject("MATCH (n) RETURN n LIMIT 5", "node_label"),
        reject("MATCH (c:Chunk:FileRef) RETURN c LIMIT 5", "node_label"),
        reject("MATCH (s:Secret) RETURN s LIMIT 5", "node_label"),
        reject(
            "MATCH (c:Chunk)-[:PART_OF]->(c:FileRef) RETURN c LIMIT 1",
            "node_label",
        ),
        reject(
            "MATCH (c:Chunk)-[:PART_OF]->(f) WHERE f:FileRef RETURN f LIMIT 1",
            "node_label",
        ),
        reject(
            "MATCH (c:Chunk)-[]->(f:FileRef) RETURN f LIMIT 1",
            "relationship_type",
        ),
        reject(
            "MATCH (c:Chunk)-[:PART_OF|NEXT_CHUNK]->(f:FileRef) RETURN f LIMIT 1",
            "relationship_type",
        ),
        reject(
            "MATCH (c:Chunk)-[:OWNS]->(f:FileRef) RETURN f LIMIT 1",
            "relationship_type",
        ),
        reject(
            "MATCH (a:Chunk)-[:NEXT_CHUNK*1..5]->(b:Chunk) RETURN b LIMIT 1",
            "one_hop",
        ),
        reject(
            "MATCH shortestPath((a:Chunk)-[:NEXT_CHUNK]->(b:Chunk)) RETURN a LIMIT 1",
            "one_hop",
        ),
        reject(
            "MATCH p = (a:Chunk)-[:NEXT_CHUNK]->(b:Chunk) RETURN p LIMIT 1",
            "no_paths",
        ),
        reject(
            "MATCH (c:Chunk) WHERE (c)-[:MENTIONS]->(:Entity) RETURN c LIMIT 1",
            "no_paths",
        ),
        reject("MATCH (e:Entity) RETURN e.name LIMIT 10", "anchor"),
        reject(
            "MATCH (c:Chunk), (e:Entity) RETURN e.name LIMIT 10",
            "anchor",
        ),
        reject(
            "MATCH (e:Entity)-[:INSTANCE_OF]->(t:EntityType)<-[:INSTANCE_OF]-(e2:Entity)<-[:MENTIONS]-(c:Chunk) RETURN e.name LIMIT 10",
            "anchor",
        ),
        reject(
            "MATCH (e:Entity)-[r:REL]->(e2:Entity) RETURN e.name, r.relationTypeId LIMIT 5",
            "anchor",
        ),
        reject("MATCH (d:Folder) RETURN d.folderPath LIMIT 10", "anchor"),
        reject(
            "MATCH (f:FileRef)<-[:HAS_CHILD]-(d:Folder)-[:HAS_CHILD]->(x:Folder) RETURN x.folderPath LIMIT 10",
            "anchor",
        ),
        reject("MATCH (o:OutlineNode) RETURN o.title LIMIT 5", "anchor"),
        reject(
            "MATCH (c:Chunk)-[:PART_OF]->(f:FileRef), (o:OutlineNode)-[:HAS_SUBSECTION]->(o2:OutlineNode) RETURN o.title LIMIT 5",
            "anchor",
        ),
        reject(
            "MATCH (c:Chunk) WHERE c.path STARTS WITH $kg_acl_allow_0 RETURN c LIMIT 1",
            "reserved_name",
        ),
        reject("MATCH (kg_n1:Chunk) RETURN kg_n1 LIMIT 1", "reserved_name"),
        reject(
            "MATCH (c:Chunk) RETURN range(1, 10) AS r LIMIT 1",
            "function",
        ),
        reject(
            "MATCH (c:Chunk) WHERE c.text =~ '.*' RETURN c LIMIT 1",
            "function",
        ),
        reject(
            "MATCH (c:Chunk) WHERE exists((c)-[:PART_OF]->(:FileRef)) RETURN c LIMIT 1",
            "function",
        ),
        reject(
            "MATCH (c:Chunk) WHERE count(c) > 1 RETURN c LIMIT 1",
            "function",
        ),
        reject("MATCH (c:Chunk) RETURN * LIMIT 1", "projection"),
        reject(
            "MATCH (c:Chunk) RETURN c LIMIT 1 MATCH (f:FileRef) RETURN f LIMIT 1",
            "projection",
        ),
        reject("MATCH (c:Chunk)", "projection"),
        reject("MATCH (c:Chunk) WITH c.text RETURN c LIMIT 1", "projection"),
        reject("MATCH (c:Chunk) WITH c RETURN x LIMIT 1", "variable"),
        reject("WITH 1 AS c MATCH (c:Chunk) RETURN c LIMIT 1", "variable"),
        reject(
            "MATCH (c:Chunk) WITH collect(c) AS cs UNWIND cs AS x MATCH (x)-[:PART_OF]->(f:FileRef) RETURN f LIMIT 1",
            "variable",
        ),
        reject(
            "MATCH (c:Chunk)-[r:PART_OF]->(f:FileRef) MATCH (c)-[r:PART_OF]->(f) RETURN f LIMIT 1",
            "variable",
        ),
        reject(
            "MATCH (c:Chunk) RETURN [x IN [1, 2] | x] AS xs LIMIT 1",
            "syntax",
        ),
        reject("MATCH (c:Chunk) RETURN c.text AS `a b` LIMIT 1", "syntax"),
    ];
    cases.shrink_to_fit();
    cases
}

/// A real FalkorDB holding the fixtures, and the graph service over it (keep the first two
/// alive for the test's length).
async fn start_with_fixtures() -> (tempfile::TempDir, EmbeddedFalkor, GraphStore, GraphService) {
    let venv = find_venv().expect("the dev-deps virtualenv (run deploy/scripts/dev-deps.sh)");
    let dir = tempfile::tempdir().unwrap();
    let falkor = EmbeddedFalkor::start(&venv, dir.path()).await.unwrap();
    let store = GraphStore::connect(&falkor.url).await.unwrap();
    store.ensure_indexes(NS).await.unwrap();
    fixtures(&store).await;
    let service = GraphService::new(store.clone());
    (dir, falkor, store, service)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cypher_table_against_real_falkordb() {
    let (_dir, _falkor, store, service) = start_with_fixtures().await;
    let limited = restricted();
    let everyone = caller(|_| {});

    let cases = table();
    let accepted = cases
        .iter()
        .filter(|c| matches!(c.expect, Expect::Accept { .. }))
        .count();
    assert!(
        cases.len() >= 40 && accepted >= 20,
        "{} cases, {accepted} accepted",
        cases.len()
    );
    let mut failures = Vec::new();
    for case in &cases {
        let request = CypherRequest {
            namespace: NS.into(),
            statement: case.statement.into(),
            params_json: case.params.to_string(),
        };
        let result = service.cypher_for(&limited, request.clone()).await;
        match (&case.expect, result) {
            (Expect::Reject(rule), Err(err)) => {
                let message = err.to_string();
                if err.code() != ErrorCode::InvalidArgument
                    || !message.contains(&format!("rule `{rule}`"))
                {
                    failures.push(format!(
                        "{}\n  want rule `{rule}`, got {:?}: {message}",
                        case.statement,
                        err.code()
                    ));
                }
            }
            (Expect::Reject(rule), Ok(resp)) => {
                failures.push(format!(
                    "{}\n  want rule `{rule}`, accepted as {}",
                    case.statement, resp.rewritten_statement
                ));
            }
            (Expect::Accept { .. }, Err(err)) => {
                failures.push(format!("{}\n  refused: {err}", case.statement));
            }
            (
                Expect::Accept {
                    rewritten,
                    rows,
                    reaches_hidden,
                },
                Ok(resp),
            ) => {
                if &resp.rewritten_statement != rewritten {
                    failures.push(format!(
                        "{}\n  rewritten: {}\n  expected:  {rewritten}",
                        case.statement, resp.rewritten_statement
                    ));
                }
                let got: Vec<Value> = resp
                    .rows_json
                    .iter()
                    .map(|r| serde_json::from_str(r).unwrap())
                    .collect();
                let text = resp.rows_json.join("\n");
                if let Some(marker) = MARKERS.iter().find(|m| text.contains(*m)) {
                    failures.push(format!("{}\n  LEAK of `{marker}`: {text}", case.statement));
                }
                if let Some(want) = rows
                    && &Value::Array(got.clone()) != want
                {
                    failures.push(format!(
                        "{}\n  rows: {}\n  want: {want}",
                        case.statement,
                        Value::Array(got)
                    ));
                }
                // The same statement as a whole-namespace caller reaches the hidden data, so
                // the restricted result above is the predicate's doing, not an empty graph.
                let full = service.cypher_for(&everyone, request).await.unwrap();
                let full_text = full.rows_json.join("\n");
                let reached = MARKERS.iter().any(|m| full_text.contains(*m));
                if reached != *reaches_hidden {
                    failures.push(format!("{}\n  whole-namespace caller reached hidden data: {reached}, want {reaches_hidden}: {full_text}", case.statement));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );

    whole_nodes_carry_their_label(&service, &limited).await;
    disabled_file_is_really_in_the_graph(&store).await;
    params_must_be_given(&service, &limited).await;
    busy_when_the_gate_is_held(&service, &limited).await;
    slow_statements_time_out(&service, &limited).await;
    store_refusals_name_no_store(&service, &limited).await;
}

/// A statement the checks accept and FalkorDB refuses at run time: a stable invalid-argument
/// message that says what to check, with neither the store's name nor its own words.
async fn store_refusals_name_no_store(service: &GraphService, caller: &CallerContext) {
    let err = service
        .cypher_for(
            caller,
            CypherRequest {
                namespace: NS.into(),
                statement: "MATCH (c:Chunk) RETURN toInteger(c) AS n LIMIT 1".into(),
                params_json: String::new(),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    let message = err.to_string();
    assert!(message.contains("could not run the statement"), "{message}");
    assert!(
        !message.contains("FalkorDB") && !message.contains("Type mismatch"),
        "{message}"
    );
}

async fn slow_statements_time_out(service: &GraphService, caller: &CallerContext) {
    // 100^4 rows: far more than two seconds of work.
    let xs: Vec<i64> = (0..100).collect();
    let started = std::time::Instant::now();
    let err = service
        .cypher_for(
            caller,
            CypherRequest {
                namespace: NS.into(),
                statement: "UNWIND $xs AS a UNWIND $xs AS b UNWIND $xs AS c UNWIND $xs AS d RETURN count(*) AS n LIMIT 1".into(),
                params_json: json!({ "xs": xs }).to_string(),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Timeout, "{err}");
    assert!(
        started.elapsed()
            < std::time::Duration::from_millis(kg_graph::cypher::QUERY_TIMEOUT_MS + 2_000)
    );
}

async fn whole_nodes_carry_their_label(service: &GraphService, caller: &CallerContext) {
    let resp = service
        .cypher_for(caller, CypherRequest { namespace: NS.into(), statement: "MATCH (c:Chunk)-[:PART_OF]->(f:FileRef) RETURN f, c.chunkIndex AS i ORDER BY i LIMIT 1".into(), params_json: String::new() })
        .await
        .unwrap();
    assert_eq!(resp.columns, vec!["f", "i"]);
    let row: Vec<Value> = serde_json::from_str(&resp.rows_json[0]).unwrap();
    assert_eq!(row[0]["_label"], "FileRef");
    assert_eq!(row[0]["vfsPath"], "docs/public.md");
    assert_eq!(row[1], 0);
}

async fn disabled_file_is_really_in_the_graph(store: &GraphStore) {
    // kg_cypher always adds the enabled check, even for a whole-namespace caller; the
    // disabled file's chunk is there all the same.
    let rows = store
        .ro_query(
            NS,
            "MATCH (c:Chunk {fileId: 'file-off'})-[:MENTIONS]->(e:Entity) RETURN e.name",
            &Params::new(),
            1000,
        )
        .await
        .unwrap();
    assert_eq!(rows.rows, vec![vec![json!("Obsolete")]]);
}

async fn params_must_be_given(service: &GraphService, caller: &CallerContext) {
    let err = service
        .cypher_for(
            caller,
            CypherRequest {
                namespace: NS.into(),
                statement: "MATCH (c:Chunk) WHERE ID(c) > $afterId RETURN c.text LIMIT 1".into(),
                params_json: String::new(),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.to_string().contains("afterId"), "{err}");
}

async fn busy_when_the_gate_is_held(service: &GraphService, caller: &CallerContext) {
    let gate = service.cypher_gate();
    let permit = gate.clone().acquire_owned().await.unwrap();
    // A call allowed 5 s waits its turn for what the statement's own 3 s leave (1.5 s).
    let allowed = std::time::Duration::from_secs(5);
    let started = std::time::Instant::now();
    let err = service
        .cypher_within(
            caller,
            CypherRequest {
                namespace: NS.into(),
                statement: "MATCH (c:Chunk) RETURN count(c) AS n LIMIT 1".into(),
                params_json: String::new(),
            },
            allowed,
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Busy, "{err}");
    assert!(err.code().retryable());
    let waited = kg_graph::cypher::turn_wait(allowed);
    assert_eq!(waited, std::time::Duration::from_millis(1_500));
    assert!(started.elapsed() >= waited);
    // Within the gateway's 20 s a statement waits in line for 16 s.
    assert_eq!(
        kg_graph::cypher::turn_wait(std::time::Duration::from_secs(20)),
        std::time::Duration::from_secs(16)
    );
    drop(permit);
    let count = || CypherRequest {
        namespace: NS.into(),
        statement: "MATCH (c:Chunk) RETURN count(c) AS n LIMIT 1".into(),
        params_json: String::new(),
    };
    // The gate frees up for the next statement.
    service.cypher_for(caller, count()).await.unwrap();
    // A statement queued behind one that holds the graph for 2.5 s waits its turn and runs.
    let permit = gate.clone().acquire_owned().await.unwrap();
    let release = async {
        tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
        drop(permit);
    };
    let (queued, ()) = tokio::join!(
        service.cypher_within(caller, count(), std::time::Duration::from_secs(20)),
        release
    );
    queued.unwrap();
}

/// A condition that fails at run time (a division by zero) only on hidden data would answer,
/// by failing or not, whether that data exists. Each statement below fails for a
/// whole-namespace caller, which proves it reaches the hidden value, and answers the
/// restricted caller with its readable rows, as if the hidden data were absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_failing_on_hidden_data_answers_as_if_it_were_absent() {
    let (_dir, _falkor, _store, service) = start_with_fixtures().await;
    let fails_on = |name: &str| format!("1 / (CASE WHEN e.name = '{name}' THEN 0 ELSE 1 END) = 1");
    let nightingale = fails_on("Nightingale");
    let cases = [
        // Conditions on the entity alone: FalkorDB starts from the entities and filters
        // them before it reaches a chunk and its guard.
        (
            format!(
                "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity) WHERE e.name <> '' AND e.name <> '.' \
                 AND e.normName <> '' AND {nightingale} RETURN DISTINCT e.name AS name ORDER BY name LIMIT 10"
            ),
            json!([["Acme Corp"], ["DKIM"]]),
        ),
        // A property map starts from the entities too; the WITH's WHERE moves down to them.
        (
            format!(
                "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity {{typeId: 'project', aliases: [], \
                 entityKey: 'ent:project:nightingale', normName: 'nightingale'}}) \
                 WITH c, e WHERE {nightingale} RETURN e.name AS name LIMIT 10"
            ),
            json!([]),
        ),
        // Folders: the parents of readable files only.
        (
            "MATCH (d:Folder)-[:HAS_CHILD]->(f:FileRef) WHERE d.folderPath <> '' AND d.folderPath <> '.' \
             AND d.folderPath <> '/' AND 1 / (CASE WHEN d.folderPath STARTS WITH 'priv' THEN 0 ELSE 1 END) = 1 \
             RETURN DISTINCT d.folderPath AS folder ORDER BY folder LIMIT 10"
                .to_owned(),
            json!([["docs/"]]),
        ),
        // From an entity a readable chunk mentions to a hidden chunk that mentions it too:
        // the new chunk's guard and the condition land together, guard first (so already
        // before this change; kept so that it stays so).
        (
            "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity {name: 'Acme Corp'}) WITH e \
             MATCH (e)<-[:MENTIONS]-(c2:Chunk) WHERE 1 / (CASE WHEN c2.text CONTAINS 'CLASSIFIED' THEN 0 ELSE 1 END) = 1 \
             RETURN c2.chunkKey AS chunk LIMIT 10"
                .to_owned(),
            json!([["ch_file-pub_0"]]),
        ),
    ];
    for (statement, readable_rows) in cases {
        let request = CypherRequest {
            namespace: NS.into(),
            statement: statement.clone(),
            params_json: "{}".into(),
        };
        let whole = service.cypher_for(&caller(|_| {}), request.clone()).await;
        assert!(
            whole.is_err(),
            "the statement does not reach the hidden value: {statement}"
        );
        let resp = service
            .cypher_for(&restricted(), request)
            .await
            .unwrap_or_else(|err| panic!("{statement}\n  failed for the restricted caller: {err}"));
        let rows: Vec<Value> = resp
            .rows_json
            .iter()
            .map(|r| serde_json::from_str(r).unwrap())
            .collect();
        assert_eq!(
            Value::Array(rows),
            readable_rows,
            "{statement}\n  as {}",
            resp.rewritten_statement
        );
    }
}

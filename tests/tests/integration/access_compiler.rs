//! One table of access cases, compiled into a Cypher predicate and a SQL predicate
//! (kg-common) and a Qdrant payload filter (kg_stores::vector::filter), run against
//! real FalkorDB, SQLite, PostgreSQL and an embedded Qdrant shard (qdrant-edge):
//! every store must return exactly the files the in-memory rule (`allows`) admits.
use std::collections::BTreeSet;

use kg_common::access::{SqlColumns, allows, cypher_predicate, sql_predicate};
use kg_proto::v1::AccessFilter;
use kg_stores::embedded::{EmbeddedFalkor, EmbeddedPostgres, find_venv};
use kg_stores::graph::{GraphStore, Params};
use kg_stores::sql::SqlStore;
use kg_stores::vector::{EdgeIndex, PointKind, Scope, VectorPoint};
use serde_json::json;
use sqlx::{AssertSqlSafe, Row as _};

/// (namespace, path, file id, enabled, hidden)
const FILES: &[(&str, &str, &str, bool, bool)] = &[
    ("alpha", "readme.md", "f-readme", true, false),
    ("alpha", "guides/intro.md", "f-intro", true, false),
    ("alpha", "guides/secret/keys.md", "f-keys", true, false),
    ("alpha", "guides/setup.md", "f-setup", true, false),
    ("alpha", "guides/old.md", "f-old", false, false),
    ("alpha", "guides/draft.md", "f-draft", true, true),
    ("alpha", "guides_extra/x.md", "f-extra", true, false),
    ("alpha", "notes/100%_done.md", "f-pct", true, false),
    ("beta", "readme.md", "f-beta-readme", true, false),
    ("beta", "team/plan.md", "f-beta-plan", true, false),
];

fn filter(
    ns: &str,
    allow: &[&str],
    deny: &[&str],
    deny_files: &[&str],
    enabled_only: bool,
    visible_only: bool,
) -> AccessFilter {
    AccessFilter {
        namespace: ns.into(),
        allow_prefixes: allow.iter().map(|s| (*s).to_owned()).collect(),
        deny_prefixes: deny.iter().map(|s| (*s).to_owned()).collect(),
        deny_file_ids: deny_files.iter().map(|s| (*s).to_owned()).collect(),
        enabled_only,
        visible_only,
        ..Default::default()
    }
}

/// The table: a name, then one filter per namespace the caller can read.
fn cases() -> Vec<(&'static str, Vec<AccessFilter>)> {
    vec![
        (
            "whole namespace",
            vec![filter("alpha", &[""], &[], &[], false, false)],
        ),
        (
            "allow prefix",
            vec![filter("alpha", &["guides/"], &[], &[], false, false)],
        ),
        (
            "deny prefix inside allow",
            vec![filter(
                "alpha",
                &["guides/"],
                &["guides/secret/"],
                &[],
                false,
                false,
            )],
        ),
        (
            "deny file",
            vec![filter("alpha", &[""], &[], &["f-setup"], false, false)],
        ),
        (
            "disabled file",
            vec![filter("alpha", &[""], &[], &[], true, false)],
        ),
        (
            "hidden file",
            vec![filter("alpha", &[""], &[], &[], false, true)],
        ),
        (
            // What auth hands an agent whose grant is guides/ acting for a user
            // with the whole namespace minus secret/: the intersection.
            "agent ∩ user",
            vec![filter(
                "alpha",
                &["guides/"],
                &["guides/secret/"],
                &[],
                true,
                true,
            )],
        ),
        (
            "empty grants",
            vec![filter("alpha", &[], &[], &[], true, true)],
        ),
        (
            "several namespaces",
            vec![
                filter("alpha", &["notes/"], &[], &[], true, true),
                filter("beta", &["team/"], &[], &["f-beta-readme"], true, true),
            ],
        ),
        (
            "prefix is not a substring match",
            vec![filter(
                "alpha",
                &["guides/"],
                &["guides_extra/"],
                &[],
                true,
                true,
            )],
        ),
        (
            "many prefixes and denies",
            vec![filter(
                "alpha",
                &["guides/", "notes/", "readme.md"],
                &["guides/secret/", "notes/1"],
                &["f-intro", "f-nope"],
                true,
                true,
            )],
        ),
    ]
}

fn expected(filter: &AccessFilter) -> BTreeSet<String> {
    FILES
        .iter()
        .filter(|(ns, ..)| *ns == filter.namespace)
        .filter(|(_, path, id, enabled, hidden)| allows(filter, path, id, *enabled, *hidden))
        .map(|(_, _, id, ..)| (*id).to_owned())
        .collect()
}

async fn load_graph(graph: &GraphStore) {
    for (ns, path, id, enabled, hidden) in FILES {
        let mut params = Params::new();
        params.insert("path".into(), json!(path));
        params.insert("id".into(), json!(id));
        params.insert("enabled".into(), json!(enabled));
        params.insert("hidden".into(), json!(hidden));
        graph
            .query(
                ns,
                "CREATE (f:FileRef {fileId: $id, vfsPath: $path, enabled: $enabled, hidden: $hidden}) \
                 CREATE (:Chunk {chunkKey: 'ch_' + $id, fileId: $id, path: $path, enabled: $enabled, hidden: $hidden})-[:PART_OF]->(f)",
                &params,
            )
            .await
            .unwrap();
    }
}

async fn graph_ids(
    graph: &GraphStore,
    filter: &AccessFilter,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let chunk = cypher_predicate(filter, "c", "path", "acl_c_");
    let file = cypher_predicate(filter, "f", "vfsPath", "acl_f_");
    let mut params = Params::new();
    for (k, v) in chunk.params.iter().chain(&file.params) {
        params.insert(k.clone(), v.clone());
    }
    // Both predicates, and one of them after a WITH, where FalkorDB once
    // evaluated list predicates wrongly.
    let chunks = graph
        .ro_query(
            &filter.namespace,
            &format!(
                "MATCH (c:Chunk) WITH c MATCH (c)-[:PART_OF]->(f:FileRef) WHERE {} RETURN c.fileId",
                chunk.text
            ),
            &params,
            2_000,
        )
        .await
        .unwrap();
    let files = graph
        .ro_query(
            &filter.namespace,
            &format!("MATCH (f:FileRef) WHERE {} RETURN f.fileId", file.text),
            &params,
            2_000,
        )
        .await
        .unwrap();
    let ids = |rows: kg_stores::graph::Rows| {
        rows.rows
            .into_iter()
            .map(|r| r[0].as_str().unwrap().to_owned())
            .collect::<BTreeSet<_>>()
    };
    (ids(chunks), ids(files))
}

async fn load_sql(sql: &SqlStore) {
    sqlx::query(
        "CREATE TABLE access_cases (namespace TEXT NOT NULL, path TEXT NOT NULL, file_id TEXT NOT NULL, enabled BIGINT NOT NULL, hidden BIGINT NOT NULL)",
    )
    .execute(sql.pool())
    .await
    .unwrap();
    for (ns, path, id, enabled, hidden) in FILES {
        sqlx::query("INSERT INTO access_cases VALUES ($1, $2, $3, $4, $5)")
            .bind(*ns)
            .bind(*path)
            .bind(*id)
            .bind(i64::from(*enabled))
            .bind(i64::from(*hidden))
            .execute(sql.pool())
            .await
            .unwrap();
    }
}

async fn sql_ids(sql: &SqlStore, filter: &AccessFilter) -> BTreeSet<String> {
    let columns = SqlColumns {
        path: "path",
        file_id: "file_id",
        enabled: "enabled",
        hidden: "hidden",
    };
    let predicate = sql_predicate(filter, columns, 2);
    let text = format!(
        "SELECT file_id FROM access_cases WHERE namespace = $1 AND {}",
        predicate.text
    );
    let mut query = sqlx::query(AssertSqlSafe(text)).bind(filter.namespace.clone());
    for p in &predicate.params {
        query = query.bind(p.clone());
    }
    query
        .fetch_all(sql.pool())
        .await
        .unwrap()
        .iter()
        .map(|r| r.try_get::<String, _>("file_id").unwrap())
        .collect()
}

/// One chunk point and one file-level point per file, with small distinct vectors.
async fn load_vectors(index: &EdgeIndex) {
    let mut points = Vec::new();
    for (i, (ns, path, id, enabled, hidden)) in FILES.iter().enumerate() {
        let chunk = VectorPoint {
            text_hash: None,
            embed_hash: None,
            namespace: (*ns).to_owned(),
            kind: PointKind::Chunk,
            chunk_key: format!("ch_{id}"),
            file_id: (*id).to_owned(),
            path: (*path).to_owned(),
            enabled: *enabled,
            hidden: *hidden,
            collections: Vec::new(),
            document_date: None,
            vector: vec![1.0, i as f32, (i % 3) as f32, 0.5],
        };
        points.push(VectorPoint {
            kind: PointKind::File,
            chunk_key: String::new(),
            vector: vec![0.5, 1.0, i as f32, (i % 2) as f32],
            ..chunk.clone()
        });
        points.push(chunk);
    }
    index.upsert(points).await.unwrap();
}

/// For chunk and file points: the file ids a search returns and the count.
async fn vector_ids(index: &EdgeIndex, filter: &AccessFilter) -> Vec<(BTreeSet<String>, u64)> {
    let mut out = Vec::new();
    for scope in [Scope::chunks(), Scope::files()] {
        let hits = index
            .search(filter, &scope, vec![1.0, 1.0, 1.0, 1.0], 100)
            .await
            .unwrap();
        let ids: BTreeSet<String> = hits.iter().map(|h| h.file_id.clone()).collect();
        assert_eq!(ids.len(), hits.len(), "one point per file and kind");
        out.push((ids, index.count(filter, &scope).await.unwrap()));
    }
    out
}

#[tokio::test]
async fn cypher_and_sql_predicates_agree_with_the_rule_on_real_stores() {
    let venv = find_venv().expect("run deploy/scripts/dev-deps.sh first");
    let dir = tempfile::tempdir().unwrap();
    let falkor = EmbeddedFalkor::start(&venv, &dir.path().join("falkor"))
        .await
        .unwrap();
    let postgres = EmbeddedPostgres::start(&venv, &dir.path().join("pg"))
        .await
        .unwrap();
    let graph = GraphStore::connect(&falkor.url).await.unwrap();
    let sqlite = SqlStore::connect(&format!("sqlite://{}", dir.path().join("a.db").display()))
        .await
        .unwrap();
    let pg = SqlStore::connect(&postgres.url).await.unwrap();
    load_graph(&graph).await;
    load_sql(&sqlite).await;
    load_sql(&pg).await;
    let vectors = EdgeIndex::open(dir.path().join("vectors"), 4)
        .await
        .unwrap();
    load_vectors(&vectors).await;

    let mut non_trivial = 0;
    for (name, filters) in cases() {
        for filter in &filters {
            let want = expected(filter);
            let (chunks, files) = graph_ids(&graph, filter).await;
            assert_eq!(
                chunks, want,
                "{name}: FalkorDB chunks in {}",
                filter.namespace
            );
            assert_eq!(
                files, want,
                "{name}: FalkorDB files in {}",
                filter.namespace
            );
            assert_eq!(
                sql_ids(&sqlite, filter).await,
                want,
                "{name}: SQLite in {}",
                filter.namespace
            );
            assert_eq!(
                sql_ids(&pg, filter).await,
                want,
                "{name}: PostgreSQL in {}",
                filter.namespace
            );
            for (kind, (ids, count)) in ["chunks", "files"]
                .into_iter()
                .zip(vector_ids(&vectors, filter).await)
            {
                assert_eq!(
                    ids, want,
                    "{name}: Qdrant {kind} search in {}",
                    filter.namespace
                );
                assert_eq!(
                    count,
                    want.len() as u64,
                    "{name}: Qdrant {kind} count in {}",
                    filter.namespace
                );
            }
            let total = FILES.iter().filter(|f| f.0 == filter.namespace).count();
            if !want.is_empty() && want.len() < total {
                non_trivial += 1;
            }
        }
    }
    // The table must exercise real narrowing, not only all-or-nothing.
    assert!(
        non_trivial >= 8,
        "only {non_trivial} cases narrow the result"
    );
}

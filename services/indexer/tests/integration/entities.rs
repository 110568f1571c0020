//! Entity and relation extraction from a published TBox, written to a real FalkorDB, with the
//! TBox read from a real NATS KV bucket: exact mentions, REL provenance, idempotent re-index,
//! replaced versions, flags, deletes, TBox changes and candidate counts.

use std::time::Duration;

use kg_indexer::document::ChunkOptions;
use kg_indexer::entity_writer::{self, EntityWriteOutcome};
use kg_indexer::graph_writer;
use kg_indexer::pipeline::{self, FileMeta, IndexedDocument};
use kg_proto::v1::{EntityInstance, EntityType, RelationType, Tbox};
use kg_stores::graph::{GraphStore, Params};
use kg_stores::tbox::TboxBucket;
use serde_json::{Value, json};

const NS: &str = "ents";

const PEOPLE: &str = "---\ntitle: People\n---\n# People\n\nAda Lovelace works at Acme Corporation. She reviewed ticket OPS-42 with Grace Hopper.\n\n## Partners\n\nGrace Hopper joined Globex in 2019. The Network Operations Center tracks INC-2024-7.\n";
const DEALS_V1: &str = "# Deals\n\nAcme acquired Globex. The Widget Pro launch moved to OPS-43.\n\nGlobex was acquired by Acme Corporation, says the NOC.\n";
const DEALS_V2: &str = "# Deals\n\nAcme and Globex stay separate. Widget Pro ships in May.\n";

/// An entity type with known instances written `"Canonical = Alias = Alias"`.
fn ty(id: &str, instances: &[&str], patterns: &[&str]) -> EntityType {
    EntityType {
        type_id: id.into(),
        label: id.into(),
        aliases: Vec::new(),
        patterns: patterns.iter().map(|s| (*s).to_owned()).collect(),
        side: "published".into(),
        instances: instances
            .iter()
            .map(|forms| {
                let mut forms = forms.split('=').map(|f| f.trim().to_owned());
                EntityInstance {
                    name: forms.next().unwrap_or_default(),
                    aliases: forms.collect(),
                }
            })
            .collect(),
    }
}

fn tbox(version: i64, people: &[&str]) -> Tbox {
    Tbox {
        namespace: NS.into(),
        version,
        entity_types: vec![
            ty("Person", people, &[]),
            ty("Organization", &["Acme Corporation = Acme", "Globex"], &[]),
            ty("Product", &["Widget Pro"], &[]),
            ty("Ticket", &[], &[r"\bOPS-\d+\b"]),
        ],
        relation_types: vec![
            RelationType {
                relation_type_id: "works_at".into(),
                label: "works at".into(),
                source_type_id: "Person".into(),
                target_type_id: "Organization".into(),
                patterns: vec![
                    "{source} works at {target}".into(),
                    "{source} joined {target}".into(),
                ],
            },
            RelationType {
                relation_type_id: "acquired".into(),
                label: "acquired".into(),
                source_type_id: "Organization".into(),
                target_type_id: "Organization".into(),
                patterns: vec![
                    "{source} acquired {target}".into(),
                    "{target} was acquired by {source}".into(),
                ],
            },
        ],
        published_at_ms: 1_700_000_000_000 + version,
    }
}

struct Env {
    graph: GraphStore,
    tboxes: TboxBucket,
}

impl Env {
    async fn index(
        &self,
        file_id: &str,
        version: &str,
        path: &str,
        text: &str,
    ) -> (IndexedDocument, EntityWriteOutcome) {
        let meta = FileMeta {
            namespace: NS.into(),
            file_id: file_id.into(),
            version_id: version.into(),
            path: path.into(),
            mime: "text/markdown".into(),
            enabled: true,
            hidden: false,
        };
        let doc =
            pipeline::index_document(&meta, text.as_bytes(), &ChunkOptions::default()).unwrap();
        graph_writer::write_file(&self.graph, &doc.file, &doc.chunks, &doc.outline)
            .await
            .unwrap();
        let outcome =
            entity_writer::index_entities(&self.graph, &self.tboxes, &doc.file, &doc.chunks)
                .await
                .unwrap();
        (doc, outcome)
    }

    async fn rows(&self, cypher: &str) -> Vec<Vec<Value>> {
        self.graph
            .query(NS, cypher, &Params::new())
            .await
            .unwrap()
            .rows
    }

    async fn count(&self, cypher: &str) -> i64 {
        self.rows(cypher).await[0][0].as_i64().unwrap()
    }

    /// (mentions, REL edges, entities, candidates, PROPOSES edges).
    async fn totals(&self) -> [i64; 5] {
        [
            self.count("MATCH ()-[m:MENTIONS]->() RETURN count(m)")
                .await,
            self.count("MATCH ()-[r:REL]->() RETURN count(r)").await,
            self.count("MATCH (e:Entity) RETURN count(e)").await,
            self.count("MATCH (c:CandidateEntity) RETURN count(c)")
                .await,
            self.count("MATCH ()-[p:PROPOSES]->() RETURN count(p)")
                .await,
        ]
    }

    async fn rels(&self) -> Vec<Vec<Value>> {
        self.rows(
            "MATCH (a:Entity)-[r:REL]->(b:Entity) RETURN a.entityKey, r.relationTypeId, b.entityKey, \
             r.fileId, r.path, r.enabled, r.versionId, r.chunkKey \
             ORDER BY r.fileId, r.relationTypeId, a.entityKey, b.entityKey",
        )
        .await
    }

    async fn candidate(&self, key: &str) -> Option<(String, String, i64)> {
        let rows = self
            .graph
            .query(
                NS,
                "MATCH (c:CandidateEntity {candidateKey: $k}) RETURN c.name, c.kind, c.count",
                &Params::from_iter([("k".to_owned(), json!(key))]),
            )
            .await
            .unwrap()
            .rows;
        rows.first().map(|r| {
            (
                r[0].as_str().unwrap().to_owned(),
                r[1].as_str().unwrap().to_owned(),
                r[2].as_i64().unwrap(),
            )
        })
    }
}

/// The char offsets of the `nth` occurrence of `needle` in `text`.
fn span(text: &str, needle: &str, nth: usize) -> (u64, u64) {
    let byte = text.match_indices(needle).nth(nth).unwrap().0;
    let start = text[..byte].chars().count() as u64;
    (start, start + needle.chars().count() as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entities_and_relations_follow_the_published_tbox() {
    let stores = crate::stores::start().await;
    let (graph, js) = (stores.graph.clone(), stores.js.clone());
    let publisher = TboxBucket::open(&js).await.unwrap();
    // The indexer's handle: another process's view, re-read on every call.
    let tboxes = TboxBucket::open(&js)
        .await
        .unwrap()
        .with_cache_ttl(Duration::ZERO);
    let env = Env { graph, tboxes };

    // No TBox yet: the file is indexed, candidates are proposed, no entity is made.
    let (_, outcome) = env.index("f-people", "p1", "team/people.md", PEOPLE).await;
    assert!(matches!(
        outcome,
        EntityWriteOutcome::Written {
            mentions: 0,
            relations: 0,
            ..
        }
    ));
    assert_eq!(env.count("MATCH (e:Entity) RETURN count(e)").await, 0);
    assert_eq!(
        env.candidate("proper_name:ada lovelace").await,
        Some(("Ada Lovelace".into(), "proper_name".into(), 1))
    );

    publisher
        .put(&tbox(1, &["Ada Lovelace = Ada", "Grace Hopper"]))
        .await
        .unwrap();
    let (people, _) = env.index("f-people", "p1", "team/people.md", PEOPLE).await;
    let (deals, _) = env.index("f-deals", "d1", "news/deals.md", DEALS_V1).await;

    // Exact mentions of people.md: method, quote and offsets into the parsed text.
    let mentions = env
        .rows(
            "MATCH (c:Chunk {fileId: 'f-people'})-[m:MENTIONS]->(e:Entity) \
             RETURN e.entityKey, m.method, m.quote, m.charStart, m.charEnd, m.fileId, c.chunkKey \
             ORDER BY m.charStart, e.entityKey",
        )
        .await;
    let expected = [
        (
            "ent:Person:ada lovelace",
            "gazetteer",
            "Ada Lovelace",
            span(PEOPLE, "Ada Lovelace", 0),
        ),
        (
            "ent:Organization:acme corporation",
            "gazetteer",
            "Acme Corporation",
            span(PEOPLE, "Acme Corporation", 0),
        ),
        (
            "ent:Ticket:ops-42",
            "pattern",
            "OPS-42",
            span(PEOPLE, "OPS-42", 0),
        ),
        (
            "ent:Person:grace hopper",
            "gazetteer",
            "Grace Hopper",
            span(PEOPLE, "Grace Hopper", 0),
        ),
        (
            "ent:Person:grace hopper",
            "gazetteer",
            "Grace Hopper",
            span(PEOPLE, "Grace Hopper", 1),
        ),
        (
            "ent:Organization:globex",
            "gazetteer",
            "Globex",
            span(PEOPLE, "Globex", 0),
        ),
    ];
    let got: Vec<(String, String, String, (u64, u64))> = mentions
        .iter()
        .map(|r| {
            (
                r[0].as_str().unwrap().to_owned(),
                r[1].as_str().unwrap().to_owned(),
                r[2].as_str().unwrap().to_owned(),
                (r[3].as_u64().unwrap(), r[4].as_u64().unwrap()),
            )
        })
        .collect();
    let want: Vec<(String, String, String, (u64, u64))> = expected
        .iter()
        .map(|(k, m, q, s)| ((*k).to_owned(), (*m).to_owned(), (*q).to_owned(), *s))
        .collect();
    assert_eq!(got, want);
    let chars: Vec<char> = PEOPLE.chars().collect();
    for r in &mentions {
        let (s, e) = (
            r[3].as_u64().unwrap() as usize,
            r[4].as_u64().unwrap() as usize,
        );
        assert_eq!(
            chars[s..e].iter().collect::<String>(),
            r[2].as_str().unwrap()
        );
        assert_eq!(r[5], json!("f-people"));
        let chunk = people
            .chunks
            .iter()
            .find(|c| c.chunk_key == r[6].as_str().unwrap())
            .unwrap();
        assert!(chunk.char_start as usize <= s && e <= chunk.char_end as usize);
    }

    // REL edges with the stating file's provenance (both acquisition sentences share one
    // chunk: one edge per chunk and triple).
    let chunk_of = |doc: &IndexedDocument, needle: &str| -> Value {
        json!(
            doc.chunks
                .iter()
                .find(|c| c.text.contains(needle))
                .unwrap()
                .chunk_key
        )
    };
    let rels = env.rels().await;
    assert_eq!(
        rels,
        vec![
            vec![
                json!("ent:Organization:acme corporation"),
                json!("acquired"),
                json!("ent:Organization:globex"),
                json!("f-deals"),
                json!("news/deals.md"),
                json!(true),
                json!("d1"),
                chunk_of(&deals, "Acme acquired"),
            ],
            vec![
                json!("ent:Person:ada lovelace"),
                json!("works_at"),
                json!("ent:Organization:acme corporation"),
                json!("f-people"),
                json!("team/people.md"),
                json!(true),
                json!("p1"),
                chunk_of(&people, "works at"),
            ],
            vec![
                json!("ent:Person:grace hopper"),
                json!("works_at"),
                json!("ent:Organization:globex"),
                json!("f-people"),
                json!("team/people.md"),
                json!(true),
                json!("p1"),
                chunk_of(&people, "joined"),
            ],
        ]
    );

    // Types, declared instances and the entity search index.
    assert_eq!(env.count("MATCH (t:EntityType) RETURN count(t)").await, 4);
    assert_eq!(
        env.rows("MATCH (e:Entity {entityKey: 'ent:Product:widget pro'})-[:INSTANCE_OF]->(t:EntityType) RETURN e.declared, t.label, t.side")
            .await,
        vec![vec![json!(true), json!("Product"), json!("published")]]
    );
    assert_eq!(
        env.rows("MATCH (e:Entity {entityKey: 'ent:Ticket:ops-43'})-[:INSTANCE_OF]->(t:EntityType) RETURN e.name, e.declared, t.typeId")
            .await,
        vec![vec![json!("OPS-43"), json!(false), json!("Ticket")]]
    );
    assert_eq!(
        env.rows(
            "CALL db.idx.fulltext.queryNodes('Entity', 'ada') YIELD node RETURN node.entityKey"
        )
        .await,
        vec![vec![json!("ent:Person:ada lovelace")]],
        "aliases are searchable"
    );

    // Candidates: counted per namespace, TBox names excluded.
    assert_eq!(
        env.candidate("proper_name:ada lovelace").await,
        None,
        "now an entity"
    );
    assert_eq!(
        env.candidate("proper_name:network operations center").await,
        Some(("Network Operations Center".into(), "proper_name".into(), 1))
    );
    assert_eq!(
        env.candidate("identifier:inc-2024-7").await,
        Some(("INC-2024-7".into(), "identifier".into(), 1))
    );
    assert_eq!(env.candidate("acronym:noc").await.map(|c| c.2), Some(1));

    // Re-indexing the same versions changes nothing.
    let before = env.totals().await;
    let (_, again) = env.index("f-people", "p1", "team/people.md", PEOPLE).await;
    assert_eq!(again, EntityWriteOutcome::Unchanged);
    env.index("f-deals", "d1", "news/deals.md", DEALS_V1).await;
    assert_eq!(env.totals().await, before);
    // A forced rewrite (stamp cleared, as after a crash) lands on the same counts.
    env.rows("MATCH (f:FileRef) SET f.entityStamp = null RETURN count(f)")
        .await;
    env.index("f-people", "p1", "team/people.md", PEOPLE).await;
    env.index("f-deals", "d1", "news/deals.md", DEALS_V1).await;
    assert_eq!(env.totals().await, before);

    // A new version of deals.md states no acquisition and no longer mentions OPS-43 or the NOC.
    env.index("f-deals", "d2", "news/deals.md", DEALS_V2).await;
    let rels = env.rels().await;
    assert_eq!(rels.len(), 2);
    assert!(rels.iter().all(|r| r[3] == json!("f-people")));
    assert_eq!(
        env.count("MATCH (e:Entity {entityKey: 'ent:Ticket:ops-43'}) RETURN count(e)")
            .await,
        0
    );
    assert_eq!(
        env.count("MATCH (e:Entity {entityKey: 'ent:Product:widget pro'}) RETURN count(e)")
            .await,
        1
    );
    assert_eq!(env.candidate("acronym:noc").await, None);
    assert_eq!(
        env.count("MATCH (:Chunk {fileId: 'f-deals'})-[m:MENTIONS]->(:Entity {entityKey: 'ent:Organization:globex'}) RETURN count(m)").await,
        1
    );

    // Disabling a file flips the REL edges it stated at once.
    entity_writer::set_relation_flags(&env.graph, NS, "f-people", false, true)
        .await
        .unwrap();
    assert_eq!(
        env.rows("MATCH ()-[r:REL]->() RETURN DISTINCT r.enabled, r.hidden")
            .await,
        vec![vec![json!(false), json!(true)]]
    );
    entity_writer::set_relation_flags(&env.graph, NS, "f-people", true, false)
        .await
        .unwrap();

    // A TBox that no longer declares Grace Hopper: her mentions and the relation she was in go.
    publisher
        .put(&tbox(2, &["Ada Lovelace = Ada"]))
        .await
        .unwrap();
    env.index("f-people", "p1", "team/people.md", PEOPLE).await;
    assert_eq!(
        env.count("MATCH (e:Entity {entityKey: 'ent:Person:grace hopper'}) RETURN count(e)")
            .await,
        0
    );
    assert_eq!(env.rels().await.len(), 1);
    assert_eq!(
        env.candidate("proper_name:grace hopper").await.map(|c| c.2),
        Some(2),
        "an undeclared name becomes a candidate again"
    );

    // Deleting people.md removes what only it contributed.
    entity_writer::delete_file_entities(&env.graph, NS, "f-people")
        .await
        .unwrap();
    graph_writer::delete_file(&env.graph, NS, "f-people")
        .await
        .unwrap();
    assert!(env.rels().await.is_empty());
    assert_eq!(
        env.count("MATCH (e:Entity {entityKey: 'ent:Ticket:ops-42'}) RETURN count(e)")
            .await,
        0
    );
    assert_eq!(
        env.count("MATCH (e:Entity {entityKey: 'ent:Person:ada lovelace'}) RETURN count(e)")
            .await,
        1,
        "declared"
    );
    assert_eq!(env.candidate("proper_name:grace hopper").await, None);
    assert_eq!(
        env.candidate("proper_name:network operations center").await,
        None
    );
    assert_eq!(
        env.count("MATCH ()-[m:MENTIONS {fileId: 'f-people'}]->() RETURN count(m)")
            .await,
        0
    );
}

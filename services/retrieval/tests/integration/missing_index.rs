//! A missing full-text index is a failure, not "no hits" (FalkorDB answers `queryNodes` on a
//! label without an index with no rows): the fulltext lane (and graph_expand, seeded by it)
//! soft-fails with `index_missing` while the vector lane answers, a search of that lane alone
//! fails with FAILED_PRECONDITION, and EntitySearch's text side and the co_annotation lane's
//! span linker do the same over the Entity index. A namespace with nothing ingested is still
//! a plain empty answer. Real FalkorDB and qdrant-edge.

use crate::common;

use std::sync::Arc;

use common::*;
use kg_common::ErrorExt;
use kg_common::error::ErrorCode;
use kg_embed::{HashingEmbedder, SharedEmbedder};
use kg_indexer::document::DocumentMeta;
use kg_proto::v1::{CallerContext, EntitySearchRequest, SearchResponse};
use kg_retrieval::{RetrievalError, RetrievalService};
use kg_stores::graph::{FulltextIndexState, GraphStore, Params};
use kg_stores::vector::{EdgeIndex, PointKind, VectorIndex, VectorPoint};

const NS: &str = "noindex";
const DIMS: usize = 64;

fn lanes(response: &SearchResponse) -> Vec<(&str, bool, &str)> {
    response
        .lanes
        .iter()
        .map(|l| (l.lane.as_str(), l.ok, l.error_code.as_str()))
        .collect()
}

async fn search_in(
    service: &RetrievalService,
    who: &CallerContext,
    ns: &str,
    query: &str,
    lanes: &[&str],
) -> Result<SearchResponse, RetrievalError> {
    service.search_for(who, search(ns, query, lanes)).await
}

/// Drops a full-text index and waits until `db.indexes()` no longer lists it (FalkorDB may
/// finish a drop after the call returns).
async fn drop_index(store: &GraphStore, label: &str) {
    assert_eq!(
        store.fulltext_index_state(NS, label).await.unwrap(),
        FulltextIndexState::Ready
    );
    let cypher = format!("CALL db.idx.fulltext.drop('{label}')");
    run(store, NS, &cypher, Params::new()).await;
    for _ in 0..100 {
        if store.fulltext_index_state(NS, label).await.unwrap() == FulltextIndexState::Missing {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the {label} full-text index is still listed after its drop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_fulltext_index_fails_the_lane_instead_of_finding_nothing() {
    let env = start().await;
    let s = &env.store;
    let dir = tempfile::tempdir().unwrap();
    let index: VectorIndex = EdgeIndex::open(dir.path(), DIMS).await.unwrap().into();
    let embedder: SharedEmbedder = Arc::new(HashingEmbedder::new(DIMS));
    let text = "the deployment pipeline ships nightly builds to staging";
    // The graph writer creates the Chunk full-text index with the first file.
    write(s, NS, "ci", "ops/ci.md", &[text], DocumentMeta::default()).await;
    let vector = embedder
        .embed(vec![text.to_owned()])
        .await
        .unwrap()
        .remove(0);
    index
        .upsert(vec![VectorPoint {
            text_hash: None,
            embed_hash: None,
            namespace: NS.into(),
            kind: PointKind::Chunk,
            chunk_key: "ci#0".into(),
            file_id: "ci".into(),
            path: "ops/ci.md".into(),
            enabled: true,
            hidden: false,
            collections: Vec::new(),
            document_date: None,
            vector,
        }])
        .await
        .unwrap();
    entity_index(s, NS).await;
    let orion = entity(s, NS, "product", "Orion", &[]).await;
    mention(s, NS, "ci#0", &orion).await;
    let service = RetrievalService::new(s.clone())
        .with_vectors(index, embedder)
        .unwrap();
    let full = caller(NS, |_| {});
    let all = ["fulltext", "vector", "graph_expand"];

    // With the index: hits, and a query without hits is an honest empty lane.
    let ok = search_in(&service, &full, NS, "deployment pipeline", &all)
        .await
        .unwrap();
    assert_eq!(ok.hits[0].chunk_key, "ci#0");
    assert!(ok.lanes.iter().all(|l| l.ok), "{:?}", lanes(&ok));
    let none = search_in(&service, &full, NS, "zebra", &["fulltext"])
        .await
        .unwrap();
    assert!(none.hits.is_empty());
    assert_eq!(lanes(&none), [("fulltext", true, "")]);

    drop_index(s, "Chunk").await;

    // Without it: the lanes that need it soft-fail with a stable code, vector still answers.
    let degraded = search_in(&service, &full, NS, "deployment pipeline", &all)
        .await
        .unwrap();
    assert_eq!(
        lanes(&degraded),
        [
            ("fulltext", false, "index_missing"),
            ("vector", true, ""),
            ("graph_expand", false, "index_missing"),
        ]
    );
    assert_eq!(degraded.hits[0].chunk_key, "ci#0");
    // The trace says what to do, and the vector lane that answered carries no message.
    assert!(
        degraded.lanes[0]
            .message
            .contains("full-text index on Chunk is missing in this namespace"),
        "{:?}",
        degraded.lanes[0]
    );
    assert!(degraded.lanes[1].message.is_empty());
    // The lane alone: a failure with a client-safe message, never an empty answer.
    let err = search_in(&service, &full, NS, "deployment pipeline", &["fulltext"])
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::FailedPrecondition);
    let message = tonic::Status::from(err).message().to_owned();
    assert!(
        message.contains("full-text index on Chunk is missing") && !message.contains("graph"),
        "{message}"
    );

    // Nothing ingested: no graph at all, or a graph without chunks, is plain empty.
    let fresh = caller("fresh", |_| {});
    let empty = search_in(&service, &fresh, "fresh", "deployment", &["fulltext"])
        .await
        .unwrap();
    assert!(empty.hits.is_empty());
    assert_eq!(lanes(&empty), [("fulltext", true, "")]);
    run(
        s,
        "fresh",
        "CREATE (:Folder {folderPath: ''})",
        Params::new(),
    )
    .await;
    let empty = search_in(&service, &fresh, "fresh", "deployment", &["fulltext"])
        .await
        .unwrap();
    assert_eq!(lanes(&empty), [("fulltext", true, "")]);
    let entities = |ns: &str, mode: &str| EntitySearchRequest {
        namespace: ns.into(),
        text: "Orion".into(),
        mode: mode.into(),
        ..Default::default()
    };
    let nothing = service
        .entity_search_for(&fresh, entities("fresh", "text"))
        .await
        .unwrap();
    assert!(nothing.hits.is_empty());

    // The Entity index: text mode fails, hybrid answers from vector and says why.
    let found = service
        .entity_search_for(&full, entities(NS, "text"))
        .await
        .unwrap();
    assert_eq!(found.hits[0].entity_key, orion);
    let co = ["co_annotation", "vector"];
    let linked = search_in(&service, &full, NS, "orion pipeline", &co)
        .await
        .unwrap();
    assert_eq!(
        lanes(&linked),
        [("co_annotation", true, ""), ("vector", true, "")]
    );
    let grounding = linked.grounding.as_ref().unwrap();
    assert_eq!(grounding.entities[0].entity_key, orion);
    assert_eq!(grounding.reason, "too_few_bridges");
    drop_index(s, "Entity").await;
    // co_annotation's span linker reads the Entity index: it soft-fails and says so in the
    // lane trace and in the namespace's grounding entry, while vector still answers.
    let unlinked = search_in(&service, &full, NS, "orion pipeline", &co)
        .await
        .unwrap();
    assert_eq!(
        lanes(&unlinked),
        [
            ("co_annotation", false, "index_missing"),
            ("vector", true, "")
        ]
    );
    assert!(
        unlinked.lanes[0]
            .message
            .contains("full-text index on Entity is missing"),
        "{:?}",
        unlinked.lanes[0]
    );
    let grounding = unlinked.grounding.as_ref().unwrap();
    assert_eq!(
        (grounding.namespace.as_str(), grounding.reason.as_str()),
        (NS, "index_missing")
    );
    assert!(grounding.entities.is_empty() && grounding.pair.is_empty());
    assert_eq!(unlinked.hits[0].chunk_key, "ci#0");
    let err = service
        .entity_search_for(&full, entities(NS, "text"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::FailedPrecondition);
    assert!(
        err.to_string()
            .contains("full-text index on Entity is missing"),
        "{err}"
    );
    let hybrid = service
        .entity_search_for(&full, entities(NS, "hybrid"))
        .await
        .unwrap();
    assert_eq!(hybrid.mode, "vector");
    assert_eq!(hybrid.hits[0].entity_key, orion);
    let text_side = &hybrid.sides[0];
    assert_eq!(
        (
            text_side.side.as_str(),
            text_side.ok,
            text_side.error_code.as_str()
        ),
        ("text", false, "index_missing")
    );
    assert!(
        text_side.message.contains("re-index the namespace"),
        "{}",
        text_side.message
    );
}

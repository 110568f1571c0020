//! The graph_expand lane against a real FalkorDB: expansion from the hits' entities,
//! idf weighting, the per-entity cap, `ignore` entities, access and filters.

use crate::common;

use common::*;
use kg_indexer::document::DocumentMeta;
use kg_proto::v1::SearchFilters;
use kg_stores::graph::GraphStore;
use std::time::Duration;

const NS: &str = "expand";

async fn corpus(env: &Env) {
    let s = &env.store;
    write(
        s,
        NS,
        "a",
        "docs/a.md",
        &["Rotate the signing keys with keyctl before the audit."],
        DocumentMeta::default(),
    )
    .await;
    write(
        s,
        NS,
        "b",
        "docs/b.md",
        &[
            "Deployment runbook step one.",
            "Cluster capacity planning notes.",
        ],
        DocumentMeta::default(),
    )
    .await;
    write(
        s,
        NS,
        "secret",
        "secret/s.md",
        &["Private incident write-up."],
        DocumentMeta::default(),
    )
    .await;
    let common_texts: Vec<String> = (0..30)
        .map(|i| format!("Platform overview part {i}."))
        .collect();
    let refs: Vec<&str> = common_texts.iter().map(String::as_str).collect();
    write(
        s,
        NS,
        "common",
        "docs/common.md",
        &refs,
        DocumentMeta::default(),
    )
    .await;
    let noise_texts: Vec<String> = (0..260)
        .map(|i| format!("Footer boilerplate {i}."))
        .collect();
    let refs: Vec<&str> = noise_texts.iter().map(String::as_str).collect();
    write(
        s,
        NS,
        "noise",
        "docs/noise.md",
        &refs,
        DocumentMeta::default(),
    )
    .await;

    let keyctl = entity(s, NS, "tool", "keyctl", &[]).await;
    let platform = entity(s, NS, "product", "Platform", &[]).await;
    let footer = entity(s, NS, "org", "Footer Corp", &[]).await;
    for chunk in ["a#0", "b#0", "secret#0"] {
        mention(s, NS, chunk, &keyctl).await;
    }
    mention(s, NS, "a#0", &platform).await;
    mention(s, NS, "b#1", &platform).await;
    for i in 0..30 {
        mention(s, NS, &format!("common#{i}"), &platform).await;
    }
    mention(s, NS, "a#0", &footer).await;
    for i in 0..260 {
        mention(s, NS, &format!("noise#{i}"), &footer).await;
    }
}

#[tokio::test]
async fn graph_expand_against_real_falkordb() {
    let env = start().await;
    corpus(&env).await;
    let full = caller(NS, |_| {});

    let response = env
        .service
        .search_for(
            &full,
            search(NS, "rotate signing keys", &["fulltext", "graph_expand"]),
        )
        .await
        .unwrap();
    let trace = lane(&response, "graph_expand");
    assert!(trace.ok, "{trace:?}");
    let hits = keys(&response);
    assert_eq!(hits[0], "a#0", "{hits:?}");
    // keyctl (3 readable mentions) outweighs Platform (32): its chunks rank right after.
    let expanded: Vec<&kg_proto::v1::SearchHit> = response
        .hits
        .iter()
        .filter(|h| h.lanes.iter().any(|l| l.lane == "graph_expand"))
        .collect();
    assert!(
        expanded.iter().all(|h| h.chunk_key != "a#0"),
        "seeds are not re-added"
    );
    let rank_of = |key: &str| {
        expanded
            .iter()
            .find(|h| h.chunk_key == key)
            .and_then(|h| h.lanes.iter().find(|l| l.lane == "graph_expand"))
            .map(|l| l.rank)
    };
    assert!(rank_of("b#0").unwrap() <= 2, "{hits:?}");
    assert!(
        rank_of("secret#0").unwrap() <= 2,
        "full reader sees the secret chunk"
    );
    assert!(rank_of("b#1").unwrap() > 2);
    // The ignore-role entity (260 chunks) expands to nothing; Platform gives at most its cap.
    assert!(expanded.iter().all(|h| h.file_id != "noise"), "{hits:?}");
    let platform_hits = expanded
        .iter()
        .filter(|h| h.file_id == "common" || h.chunk_key == "b#1")
        .count();
    assert!(platform_hits <= 25, "per-entity cap: {platform_hits}");
    assert!(platform_hits > 0);

    // graph_expand alone seeds itself from the full-text lane.
    let alone = env
        .service
        .search_for(&full, search(NS, "rotate signing keys", &["graph_expand"]))
        .await
        .unwrap();
    assert_eq!(alone.hits[0].chunk_key, "b#0", "ties fall to the chunk key");
    assert!(!keys(&alone).contains(&"a#0"));

    // A restricted caller: no hit from the denied file, in any lane.
    let limited = env
        .service
        .search_for(
            &restricted(NS),
            search(NS, "rotate signing keys", &["fulltext", "graph_expand"]),
        )
        .await
        .unwrap();
    no_secret(&limited);
    assert!(keys(&limited).contains(&"b#0"));
    // Seeds from a denied file seed nothing.
    let denied_seed = env
        .service
        .search_for(
            &restricted(NS),
            search(NS, "private incident", &["graph_expand"]),
        )
        .await
        .unwrap();
    assert!(denied_seed.hits.is_empty(), "{:?}", keys(&denied_seed));

    // Filters apply inside the lane: the folder narrows expansion to docs/.
    let mut request = search(NS, "rotate signing keys", &["graph_expand"]);
    request.filters = Some(SearchFilters {
        folder_prefix: "docs".into(),
        ..Default::default()
    });
    let narrowed = env.service.search_for(&full, request).await.unwrap();
    no_secret(&narrowed);
    assert_eq!(narrowed.hits[0].chunk_key, "b#0");
}

/// The lane counts an entity's degree only up to one past the `filter` role's maximum, so a
/// hub entity does not cost a walk of all its mentions. The count must stop at readable,
/// distinct chunks: mentions the caller may not read, and second mentions in one chunk, do
/// not bring the entity to the cap; and kg_entity_search still reports the exact degree.
#[tokio::test]
async fn graph_expand_counts_readable_distinct_chunks_up_to_the_ignore_role() {
    const NS: &str = "expand-cap";
    let env = start().await;
    let s = &env.store;
    entity_index(s, NS).await;
    write(
        s,
        NS,
        "seed",
        "docs/seed.md",
        &["Rotate the gateway certificates."],
        DocumentMeta::default(),
    )
    .await;
    let open: Vec<String> = (0..200).map(|i| format!("Gateway note {i}.")).collect();
    let refs: Vec<&str> = open.iter().map(String::as_str).collect();
    write(s, NS, "gw", "docs/gw.md", &refs, DocumentMeta::default()).await;
    let hidden: Vec<String> = (0..100).map(|i| format!("Gateway secret {i}.")).collect();
    let refs: Vec<&str> = hidden.iter().map(String::as_str).collect();
    write(
        s,
        NS,
        "gwsecret",
        "secret/gw.md",
        &refs,
        DocumentMeta::default(),
    )
    .await;
    let gateway = entity(s, NS, "component", "Gateway", &[]).await;
    mention(s, NS, "seed#0", &gateway).await;
    for i in 0..200 {
        // Two mentions in each chunk: 400 edges, 200 chunks.
        mention(s, NS, &format!("gw#{i}"), &gateway).await;
        mention(s, NS, &format!("gw#{i}"), &gateway).await;
    }
    for i in 0..100 {
        mention(s, NS, &format!("gwsecret#{i}"), &gateway).await;
    }
    let query = "rotate gateway certificates";

    // Full reader: 301 readable chunks, over the filter role's 250: ignored, nothing expands.
    let full = env
        .service
        .search_for(&caller(NS, |_| {}), search(NS, query, &["graph_expand"]))
        .await
        .unwrap();
    assert!(lane(&full, "graph_expand").ok);
    assert!(full.hits.is_empty(), "{:?}", keys(&full));

    // Restricted reader: 201 readable chunks (the 100 denied ones and the second mentions do
    // not count), a filter entity that expands to its per-entity cap.
    let limited = env
        .service
        .search_for(&restricted(NS), search(NS, query, &["graph_expand"]))
        .await
        .unwrap();
    no_secret(&limited);
    assert_eq!(limited.hits.len(), 25, "{:?}", keys(&limited));
    assert!(limited.hits.iter().all(|h| h.file_id == "gw"));
    // Each hit's score, which the caller sees, is the entity's weight ln(1 + N / df) over
    // what this reader may read: N = df = 201 chunks. Over every chunk (N = 301) it would
    // tell the reader how many chunks it may not read.
    for hit in &limited.hits {
        let score = hit
            .lanes
            .iter()
            .find(|l| l.lane == "graph_expand")
            .map(|l| l.raw_score)
            .unwrap();
        assert!((score - 2f64.ln()).abs() < 1e-9, "{score}");
    }

    // The reported degree is exact past the cap.
    let found = env
        .service
        .entity_search_for(
            &caller(NS, |_| {}),
            kg_proto::v1::EntitySearchRequest {
                namespace: NS.into(),
                text: "gateway".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let hit = found.hits.iter().find(|h| h.entity_key == gateway).unwrap();
    assert_eq!((hit.degree, hit.role.as_str()), (301, "ignore"));
}

/// The lane's capped degrees are cached per access scope for a minute: a second search by
/// the same reader does not recount (an entity pushed past the `ignore` threshold meanwhile
/// still expands), while a reader with another access scope counts its own, and
/// kg_entity_search's reported degree is never cached.
#[tokio::test]
async fn graph_expand_caches_capped_degrees_per_access_scope() {
    const NS: &str = "expand-cache";
    let env = start().await;
    let s = &env.store;
    let gateway = gateway_mentioned_in_31_chunks(s, NS).await;
    let query = GATEWAY_QUERY;

    // 31 readable chunks: a filter entity, expanded to its per-entity cap.
    let full = caller(NS, |_| {});
    assert_eq!(expanded(&env, &full, NS, query).await, 25);

    // 300 more mentions make it an ignore entity (331 chunks).
    mention_in_300_more_chunks(s, NS, &gateway).await;

    // The same reader within the minute: the cached degree (31), still expanded.
    assert_eq!(expanded(&env, &full, NS, query).await, 25);
    // Another access scope counts afresh: ignore, nothing expands.
    assert_eq!(expanded(&env, &restricted(NS), NS, query).await, 0);
    // The reported degree is counted on every call.
    let found = env
        .service
        .entity_search_for(
            &full,
            kg_proto::v1::EntitySearchRequest {
                namespace: NS.into(),
                text: "gateway".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let hit = found.hits.iter().find(|h| h.entity_key == gateway).unwrap();
    assert_eq!((hit.degree, hit.role.as_str()), (331, "ignore"));
}

#[tokio::test]
async fn old_degrees_serve_while_a_background_recount_replaces_them() {
    const NS: &str = "expand-recount";
    let env = start().await;
    let s = &env.store;
    let gateway = gateway_mentioned_in_31_chunks(s, NS).await;
    let service = env
        .service
        .clone()
        .with_statistics_ttl(Duration::from_secs(1));
    let full = caller(NS, |_| {});
    assert_eq!(expanded_by(&service, &full, NS, GATEWAY_QUERY).await, 25);
    mention_in_300_more_chunks(&env.store, NS, &gateway).await;
    // Past the TTL the first search still expands by the degree it finds (a filter entity),
    // and recounts it after answering; the recount makes the entity `ignore`.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(expanded_by(&service, &full, NS, GATEWAY_QUERY).await, 25);
    let mut hits = 25;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        hits = expanded_by(&service, &full, NS, GATEWAY_QUERY).await;
        if hits == 0 {
            break;
        }
    }
    assert_eq!(hits, 0, "the recounted degree never replaced the old one");
}

const GATEWAY_QUERY: &str = "rotate gateway certificates";

/// A seed chunk naming `Gateway` and 30 more chunks mentioning it (a filter entity); its key.
async fn gateway_mentioned_in_31_chunks(s: &GraphStore, ns: &str) -> String {
    entity_index(s, ns).await;
    write(
        s,
        ns,
        "seed",
        "docs/seed.md",
        &["Rotate the gateway certificates."],
        DocumentMeta::default(),
    )
    .await;
    let notes: Vec<String> = (0..30).map(|i| format!("Gateway note {i}.")).collect();
    let refs: Vec<&str> = notes.iter().map(String::as_str).collect();
    write(s, ns, "gw", "docs/gw.md", &refs, DocumentMeta::default()).await;
    let gateway = entity(s, ns, "component", "Gateway", &[]).await;
    mention(s, ns, "seed#0", &gateway).await;
    for i in 0..30 {
        mention(s, ns, &format!("gw#{i}"), &gateway).await;
    }
    gateway
}

/// 300 more chunks mentioning `gateway`: an ignore entity (331 chunks).
async fn mention_in_300_more_chunks(s: &GraphStore, ns: &str, gateway: &str) {
    let more: Vec<String> = (0..300).map(|i| format!("Gateway log {i}.")).collect();
    let refs: Vec<&str> = more.iter().map(String::as_str).collect();
    write(s, ns, "log", "docs/log.md", &refs, DocumentMeta::default()).await;
    for i in 0..300 {
        mention(s, ns, &format!("log#{i}"), gateway).await;
    }
}

/// How many hits graph_expand alone returns for `who`.
async fn expanded(env: &Env, who: &kg_proto::v1::CallerContext, ns: &str, query: &str) -> usize {
    expanded_by(&env.service, who, ns, query).await
}

/// How many hits graph_expand alone returns for `who` from `service`.
async fn expanded_by(
    service: &kg_retrieval::RetrievalService,
    who: &kg_proto::v1::CallerContext,
    ns: &str,
    query: &str,
) -> usize {
    let response = service
        .search_for(who, search(ns, query, &["graph_expand"]))
        .await
        .unwrap();
    assert!(lane(&response, "graph_expand").ok);
    response.hits.len()
}

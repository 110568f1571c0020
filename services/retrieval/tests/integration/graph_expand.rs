//! The graph_expand lane against a real FalkorDB: expansion from the hits' entities,
//! idf weighting, the per-entity cap, `ignore` entities, access and filters.

use crate::common;

use common::*;
use kg_indexer::document::DocumentMeta;
use kg_proto::v1::SearchFilters;

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

//! EntitySearch against a real FalkorDB: names and aliases, type labels, degree, roles,
//! evidence caps, and no existence leak from files the caller may not read.

use crate::common;

use common::*;
use kg_common::ErrorExt;
use kg_common::error::ErrorCode;
use kg_indexer::document::DocumentMeta;
use kg_proto::v1::{CallerContext, EntityHit, EntitySearchRequest, EntitySearchResponse};
use kg_retrieval::RetrievalService;

const NS: &str = "entities";

async fn find(
    service: &RetrievalService,
    who: &CallerContext,
    text: &str,
    evidence: u32,
) -> Vec<EntityHit> {
    service
        .entity_search_for(
            who,
            EntitySearchRequest {
                namespace: NS.into(),
                text: text.into(),
                limit: 0,
                evidence_limit: evidence,
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .hits
}

/// The whole response of a search with one evidence key per hit, for its counts.
async fn counted(
    service: &RetrievalService,
    who: &CallerContext,
    text: &str,
    limit: u32,
) -> EntitySearchResponse {
    let request = EntitySearchRequest {
        namespace: NS.into(),
        text: text.into(),
        limit,
        evidence_limit: 1,
        ..Default::default()
    };
    service.entity_search_for(who, request).await.unwrap()
}

#[tokio::test]
async fn entity_search_against_real_falkordb() {
    let env = start().await;
    let s = &env.store;
    entity_index(s, NS).await;
    let m = DocumentMeta::default;
    let texts: Vec<String> = (0..30)
        .map(|i| format!("Acme quarterly report part {i}."))
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    write(s, NS, "acme", "docs/acme.md", &refs, m()).await;
    write(
        s,
        NS,
        "globex",
        "docs/globex.md",
        &["Globex launched a product.", "Globex again."],
        m(),
    )
    .await;
    write(
        s,
        NS,
        "secret",
        "secret/s.md",
        &["Umbrella and Globex in private."],
        m(),
    )
    .await;
    let acme = entity(s, NS, "org", "Acme Corporation", &["ACME Corp", "Acme"]).await;
    let globex = entity(s, NS, "org", "Globex", &[]).await;
    let umbrella = entity(s, NS, "org", "Umbrella", &[]).await;
    // Declared but mentioned nowhere: never a hit.
    entity(s, NS, "org", "Ghost Globex", &[]).await;
    for i in 0..30 {
        mention(s, NS, &format!("acme#{i}"), &acme).await;
    }
    mention(s, NS, "globex#0", &globex).await;
    mention(s, NS, "globex#1", &globex).await;
    mention(s, NS, "secret#0", &globex).await;
    mention(s, NS, "secret#0", &umbrella).await;
    let full = caller(NS, |_| {});
    let limited = restricted(NS);
    let sv = &env.service;

    // By alias; type labels, degree and role (30 mentions: filter).
    let hits = find(sv, &full, "ACME corp", 0).await;
    assert_eq!(hits[0].entity_key, acme);
    assert_eq!(hits[0].name, "Acme Corporation");
    assert_eq!(hits[0].type_id, "org");
    assert_eq!(hits[0].type_labels, ["org label"]);
    assert_eq!(hits[0].type_label, "org label");
    assert_eq!((hits[0].degree, hits[0].role.as_str()), (30, "filter"));
    assert!(hits[0].score > 0.0);
    // Default evidence cap 3, in file and chunk order, truncated flagged.
    assert_eq!(hits[0].evidence_chunk_keys, ["acme#0", "acme#1", "acme#2"]);
    assert!(hits[0].evidence_truncated);
    let wide = find(sv, &full, "acme", 8).await;
    assert_eq!(wide[0].evidence_chunk_keys.len(), 8);

    // The exact name ranks first; the unmentioned "Ghost Globex" never shows.
    let hits = find(sv, &full, "Globex", 8).await;
    let keys: Vec<&str> = hits.iter().map(|h| h.entity_key.as_str()).collect();
    assert_eq!(keys, [globex.as_str()]);
    assert_eq!((hits[0].degree, hits[0].role.as_str()), (3, "bridge"));
    assert_eq!(
        hits[0].evidence_chunk_keys,
        ["globex#0", "globex#1", "secret#0"]
    );
    assert!(!hits[0].evidence_truncated);

    // Restricted: degree and evidence count only readable chunks ...
    let hits = find(sv, &limited, "Globex", 8).await;
    assert_eq!(hits[0].degree, 2);
    assert_eq!(hits[0].evidence_chunk_keys, ["globex#0", "globex#1"]);
    // ... and an entity known only from the denied file does not exist for this caller.
    assert!(find(sv, &limited, "Umbrella", 3).await.is_empty());
    assert_eq!(find(sv, &full, "Umbrella", 3).await[0].entity_key, umbrella);
    // A caller without the namespace is refused, not answered empty.
    let other = caller("elsewhere", |_| {});
    let err = sv
        .entity_search_for(
            &other,
            EntitySearchRequest {
                namespace: NS.into(),
                text: "Globex".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied);

    // Caps over the hard maximum fail closed.
    for (limit, evidence, needle) in [(33, 0, "limit = 33"), (0, 9, "evidence_limit = 9")] {
        let err = sv
            .entity_search_for(
                &full,
                EntitySearchRequest {
                    namespace: NS.into(),
                    text: "Globex".into(),
                    limit,
                    evidence_limit: evidence,
                    ..Default::default()
                },
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument);
        assert!(err.to_string().contains(needle), "{err}");
    }
    assert!(find(sv, &full, "nothing like it", 3).await.is_empty());

    // total_candidates counts the readable matches before the cut at limit: "Globex" and
    // "Ghost Globex" match, but only Globex has a mention; Umbrella's is not readable.
    let globex_labs = entity(s, NS, "org", "Globex Labs", &[]).await;
    mention(s, NS, "globex#1", &globex_labs).await;
    let one = counted(sv, &full, "Globex", 1).await;
    assert_eq!((one.hits.len(), one.total_candidates), (1, 2));
    let all = counted(sv, &full, "Globex", 8).await;
    assert_eq!((all.hits.len(), all.total_candidates), (2, 2));
    let hidden = counted(sv, &limited, "Umbrella", 8).await;
    assert_eq!((hidden.hits.len(), hidden.total_candidates), (0, 0));
}

/// The name index ranks every match whoever asks: a caller who may read few of them still
/// finds a readable entity ranked below a whole page of unreadable ones.
#[tokio::test]
async fn readable_matches_below_a_page_of_unreadable_ones_are_found() {
    const DEEP: &str = "entities-deep";
    let env = start().await;
    let s = &env.store;
    entity_index(s, DEEP).await;
    let m = DocumentMeta::default;
    write(s, DEEP, "secret", "secret/s.md", &["Private widgets."], m()).await;
    write(s, DEEP, "public", "docs/p.md", &["The Zulu widget."], m()).await;
    // 210 unreadable matches sort before the readable one (equal scores, then by key).
    for i in 0..210 {
        let hidden = entity(s, DEEP, "org", &format!("Widget {i:03}"), &[]).await;
        mention(s, DEEP, "secret#0", &hidden).await;
    }
    let zulu = entity(s, DEEP, "org", "Widget Zulu", &[]).await;
    mention(s, DEEP, "public#0", &zulu).await;
    let search = |who: CallerContext| {
        let request = EntitySearchRequest {
            namespace: DEEP.into(),
            text: "widget".into(),
            evidence_limit: 1,
            ..Default::default()
        };
        let service = env.service.clone();
        async move { service.entity_search_for(&who, request).await.unwrap() }
    };
    let limited = search(caller(DEEP, |a| a.deny_prefixes = vec!["secret/".into()])).await;
    let keys: Vec<&str> = limited.hits.iter().map(|h| h.entity_key.as_str()).collect();
    assert_eq!(keys, [zulu.as_str()]);
    assert_eq!(limited.total_candidates, 1);
    // The side's count is of readable matches too: 210 unreadable ones are not told of.
    assert_eq!(limited.sides[0].candidates, 1);
    // A caller who reads everything stops after the first page: the top 8 are in it, and
    // total counts the matches read (a lower bound, as the proto says).
    let full = search(caller(DEEP, |_| {})).await;
    assert_eq!(full.hits.len(), 8);
    assert_eq!(full.total_candidates, 200);
}

//! Search filters against a real FalkorDB: collections, folder, documentDate range,
//! effective date, relation types; inside every graph lane, never widening access.

use crate::common;

use common::*;
use kg_common::ErrorExt;
use kg_common::error::ErrorCode;
use kg_indexer::document::DocumentMeta;
use kg_proto::v1::{CallerContext, SearchFilters};
use kg_retrieval::RetrievalService;

const NS: &str = "filters";

fn meta(
    date: Option<&str>,
    collections: &[&str],
    from: Option<&str>,
    to: Option<&str>,
) -> DocumentMeta {
    DocumentMeta {
        document_date: date.map(str::to_owned),
        collections: collections.iter().map(|c| (*c).to_owned()).collect(),
        effective_from: from.map(str::to_owned),
        effective_to: to.map(str::to_owned),
        ..Default::default()
    }
}

async fn corpus(env: &Env) {
    let s = &env.store;
    entity_index(s, NS).await;
    write(
        s,
        NS,
        "p23",
        "docs/p23.md",
        &["Retention policy for backups, 2023 edition."],
        meta(
            Some("2023-05-01"),
            &["policies"],
            Some("2023-01-01"),
            Some("2023-12-31"),
        ),
    )
    .await;
    write(
        s,
        NS,
        "p24",
        "docs/p24.md",
        &["Retention policy for backups, updated."],
        meta(
            Some("2024-05-01"),
            &["policies", "legal"],
            Some("2024-01-01"),
            None,
        ),
    )
    .await;
    write(
        s,
        NS,
        "notes",
        "notes/n.md",
        &["Retention notes about backups."],
        DocumentMeta::default(),
    )
    .await;
    write(
        s,
        NS,
        "secret",
        "secret/s.md",
        &["Retention secret backups plan."],
        meta(
            Some("2024-06-01"),
            &["policies", "legal"],
            None,
            Some("2030-01-01"),
        ),
    )
    .await;

    let backup = entity(s, NS, "system", "Backup", &[]).await;
    let vault = entity(s, NS, "system", "Vault", &[]).await;
    let tape = entity(s, NS, "system", "Tape", &[]).await;
    for chunk in ["p23#0", "p24#0", "notes#0", "secret#0"] {
        mention(s, NS, chunk, &backup).await;
    }
    mention(s, NS, "p24#0", &vault).await;
    mention(s, NS, "p23#0", &tape).await;
    // Vault's relation is stated by a readable file; Tape's only by the denied one.
    let disk = entity(s, NS, "system", "Disk", &[]).await;
    let reel = entity(s, NS, "system", "Reel", &[]).await;
    mention(s, NS, "notes#0", &disk).await;
    mention(s, NS, "secret#0", &reel).await;
    rel(s, NS, &vault, "stores", &disk, "notes#0").await;
    rel(s, NS, &tape, "archives", &reel, "secret#0").await;
}

async fn files(
    service: &RetrievalService,
    who: &CallerContext,
    lanes: &[&str],
    filters: SearchFilters,
) -> Vec<String> {
    let mut request = search(NS, "retention backups", lanes);
    request.filters = Some(filters);
    let response = service.search_for(who, request).await.unwrap();
    assert!(response.lanes.iter().all(|l| l.ok), "{:?}", response.lanes);
    let mut files: Vec<String> = response.hits.iter().map(|h| h.file_id.clone()).collect();
    files.sort();
    files.dedup();
    files
}

#[tokio::test]
async fn filters_against_real_falkordb() {
    let env = start().await;
    corpus(&env).await;
    let full = caller(NS, |_| {});
    let limited = restricted(NS);
    let sv = &env.service;
    let ft = &["fulltext"];
    let f = |edit: fn(&mut SearchFilters)| {
        let mut filters = SearchFilters::default();
        edit(&mut filters);
        filters
    };

    assert_eq!(
        files(sv, &full, ft, f(|_| {})).await,
        ["notes", "p23", "p24", "secret"]
    );
    assert_eq!(
        files(sv, &full, ft, f(|x| x.collections = vec!["legal".into()])).await,
        ["p24", "secret"]
    );
    assert_eq!(
        files(
            sv,
            &limited,
            ft,
            f(|x| x.collections = vec!["legal".into()])
        )
        .await,
        ["p24"]
    );
    assert_eq!(
        files(
            sv,
            &limited,
            ft,
            f(|x| x.collections = vec!["policies".into(), "nope".into()])
        )
        .await,
        ["p23", "p24"]
    );
    assert_eq!(
        files(sv, &full, ft, f(|x| x.folder_prefix = "notes".into())).await,
        ["notes"]
    );
    assert_eq!(
        files(
            sv,
            &full,
            ft,
            f(|x| x.date_from = Some("2024-01-01".into()))
        )
        .await,
        ["p24", "secret"]
    );
    assert_eq!(
        files(sv, &full, ft, f(|x| x.date_to = Some("2023-12-31".into()))).await,
        ["p23"]
    );
    assert_eq!(
        files(
            sv,
            &full,
            ft,
            f(|x| {
                x.date_from = Some("2024-05-01".into());
                x.date_to = Some("2024-05-01".into());
            })
        )
        .await,
        ["p24"]
    );
    assert_eq!(
        files(
            sv,
            &full,
            ft,
            f(|x| x.effective_at = Some("2023-06-01".into()))
        )
        .await,
        ["p23", "secret"]
    );
    // Open ends: p24 has no end, secret no start; notes has no window and never matches.
    assert_eq!(
        files(
            sv,
            &full,
            ft,
            f(|x| x.effective_at = Some("2026-01-01".into()))
        )
        .await,
        ["p24", "secret"]
    );
    assert_eq!(
        files(
            sv,
            &limited,
            ft,
            f(|x| x.effective_at = Some("2026-01-01".into()))
        )
        .await,
        ["p24"]
    );
    // Relation types: Tape's relation is stated only by the denied file.
    assert_eq!(
        files(
            sv,
            &full,
            ft,
            f(|x| x.relation_type_ids = vec!["archives".into()])
        )
        .await,
        ["p23", "secret"]
    );
    assert!(
        files(
            sv,
            &limited,
            ft,
            f(|x| x.relation_type_ids = vec!["archives".into()])
        )
        .await
        .is_empty()
    );
    assert_eq!(
        files(
            sv,
            &limited,
            ft,
            f(|x| x.relation_type_ids = vec!["stores".into(), "archives".into()])
        )
        .await,
        ["notes", "p24"]
    );

    // Inside graph_expand: seeded by p24 ("updated"), it expands through Backup only into
    // files that pass the filter (notes has no collection).
    let expand = |who: &CallerContext, filters: SearchFilters| {
        let mut request = search(NS, "updated", &["graph_expand"]);
        request.filters = Some(filters);
        let who = who.clone();
        async move {
            let response = sv.search_for(&who, request).await.unwrap();
            let mut files: Vec<String> = response.hits.iter().map(|h| h.file_id.clone()).collect();
            files.sort();
            files
        }
    };
    assert_eq!(expand(&full, f(|_| {})).await, ["notes", "p23", "secret"]);
    assert_eq!(
        expand(&full, f(|x| x.collections = vec!["policies".into()])).await,
        ["p23", "secret"]
    );
    assert_eq!(
        expand(&limited, f(|x| x.collections = vec!["policies".into()])).await,
        ["p23"]
    );
    assert_eq!(
        files(
            sv,
            &limited,
            &["fulltext", "graph_expand"],
            f(|x| x.date_from = Some("2024-01-01".into()))
        )
        .await,
        ["p24"]
    );
    // Inside co_annotation: Vault and Backup co-occur in p24 only.
    let mut request = search(NS, "vault backup", &["co_annotation"]);
    request.filters = Some(f(|x| x.collections = vec!["legal".into()]));
    let response = sv.search_for(&full, request).await.unwrap();
    let g = response.grounding.as_ref().unwrap();
    assert_eq!((g.direct_count, g.bridge_count), (1, 0), "{g:?}");
    let mut request = search(NS, "vault backup", &["co_annotation"]);
    request.filters = Some(f(|x| x.collections = vec!["none".into()]));
    let response = sv.search_for(&full, request).await.unwrap();
    assert_eq!(response.grounding.unwrap().reason, "no_evidence");

    // Bad values fail the call with a clear message, before any lane runs.
    for (filters, needle) in [
        (
            f(|x| x.date_from = Some("2024-1-1".into())),
            "filters.dateFrom `2024-1-1` is not a date; expected YYYY-MM-DD",
        ),
        (
            f(|x| x.effective_at = Some("2023-02-29".into())),
            "filters.effectiveAt",
        ),
        (
            f(|x| x.collections = vec![String::new()]),
            "filters.collections contains an empty value",
        ),
        (
            f(|x| {
                x.date_from = Some("2025-01-01".into());
                x.date_to = Some("2024-01-01".into());
            }),
            "is after filters.dateTo",
        ),
    ] {
        let mut request = search(NS, "retention", ft);
        request.filters = Some(filters);
        let err = sv.search_for(&full, request).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument);
        assert!(err.to_string().contains(needle), "{err}");
    }
}

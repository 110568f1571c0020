//! The full-text lane ranks by Okapi BM25 (k1 1.2, b 0.75, Lucene idf) on real FalkorDB:
//! hand-computed scores on a corpus where FalkorDB's own ordering disagrees, statistics over
//! readable chunks only, cached statistics (counted with the server's own command stats),
//! and the lane's limit and truncation.

use std::collections::HashMap;
use std::time::Duration;

use kg_indexer::document::DocumentMeta;
use kg_proto::v1::SearchResponse;
use kg_stores::graph::{GraphStore, Params, exact_term, stemmed_term};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::*;

const K1: f64 = 1.2;
const B: f64 = 0.75;

/// The corpus: one chunk per file, ids are the chunk keys' file part.
const CORPUS: &[(&str, &str)] = &[
    // tf saturation: ten `alpha` are worth far less than ten times one.
    (
        "sat",
        "alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha beta",
    ),
    ("both", "alpha beta gamma"),
    // Length normalisation: both terms, but 64 tokens against an average of 12.875.
    ("long", LONG),
    ("short", "beta"),
    ("f1", "gamma delta epsilon"),
    ("f2", "gamma delta"),
    ("f3", "delta epsilon zeta"),
    ("f4", "alpha zeta"),
];

const LONG: &str = "alpha beta filler0 filler1 filler2 filler3 filler4 filler5 filler6 filler7 \
    filler8 filler9 filler10 filler11 filler12 filler13 filler14 filler15 filler16 filler17 \
    filler18 filler19 filler20 filler21 filler22 filler23 filler24 filler25 filler26 filler27 \
    filler28 filler29 filler30 filler31 filler32 filler33 filler34 filler35 filler36 filler37 \
    filler38 filler39 filler40 filler41 filler42 filler43 filler44 filler45 filler46 filler47 \
    filler48 filler49 filler50 filler51 filler52 filler53 filler54 filler55 filler56 filler57 \
    filler58 filler59";

/// BM25 of one term, written out.
fn term_score(tf: f64, df: f64, n: f64, dl: f64, avgdl: f64) -> f64 {
    let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
    idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * dl / avgdl))
}

/// The lane's scores for "Alpha beta?" over [`CORPUS`], best first, for a given avgdl.
/// Hand-counted over contextHeader (the path: `sat.md` is 2 tokens) and text: N 8; lengths
/// 13, 5, 64, 3, 5, 4, 5, 4 (avgdl 103 / 8); alpha in sat, both, long, f4 (df 4); beta in
/// sat, both, long, short (df 4). Every chunk is shorter than a passage.
fn alpha_beta_scores(avgdl: f64) -> [(&'static str, f64); 5] {
    let n = 8.0;
    let s = |tf_alpha: f64, tf_beta: f64, dl: f64| {
        let mut score = 0.0;
        if tf_alpha > 0.0 {
            score += term_score(tf_alpha, 4.0, n, dl, avgdl);
        }
        if tf_beta > 0.0 {
            score += term_score(tf_beta, 4.0, n, dl, avgdl);
        }
        score
    };
    [
        ("sat#0", s(10.0, 1.0, 13.0)),
        ("both#0", s(1.0, 1.0, 5.0)),
        ("short#0", s(0.0, 1.0, 3.0)),
        ("f4#0", s(1.0, 0.0, 4.0)),
        ("long#0", s(1.0, 1.0, 64.0)),
    ]
}

async fn write_corpus(store: &GraphStore, ns: &str, folder: &str) {
    for (id, text) in CORPUS {
        write(
            store,
            ns,
            &format!("{folder}{id}"),
            &format!("{folder}{id}.md"),
            &[text],
            DocumentMeta::default(),
        )
        .await;
    }
}

async fn fulltext(
    env: &Env,
    ns: &str,
    query: &str,
    who: &kg_proto::v1::CallerContext,
) -> SearchResponse {
    env.service
        .search_for(who, search(ns, query, &["fulltext"]))
        .await
        .unwrap()
}

/// (chunk key, raw lane score), best first.
fn ranked(response: &SearchResponse) -> Vec<(String, f64)> {
    response
        .hits
        .iter()
        .map(|h| (h.chunk_key.clone(), h.lanes[0].raw_score))
        .collect()
}

#[tokio::test]
async fn fulltext_lane_ranks_by_bm25_where_falkordb_scores_disagree() {
    let env = start().await;
    write_corpus(&env.store, "bm", "").await;
    let reader = caller("bm", |_| {});
    let response = fulltext(&env, "bm", "Alpha beta?", &reader).await;

    let expected = alpha_beta_scores(103.0 / 8.0);
    let got = ranked(&response);
    assert_eq!(
        got.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        expected.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        "{got:?}"
    );
    for ((key, score), (_, want)) in got.iter().zip(expected) {
        assert!((score - want).abs() < 1e-9, "{key}: {score} != {want}");
    }

    // The same corpus in FalkorDB's own order (RediSearch scores of the OR query): not BM25's,
    // so the assertions above cannot pass on the index's ranking.
    let rows = env
        .store
        .ro_query(
            "bm",
            "CALL db.idx.fulltext.queryNodes('Chunk', 'alpha|beta') YIELD node, score \
             RETURN node.chunkKey ORDER BY score DESC, node.chunkKey",
            &Params::new(),
            5_000,
        )
        .await
        .unwrap();
    let falkor: Vec<&str> = rows.rows.iter().filter_map(|r| r[0].as_str()).collect();
    assert_eq!(falkor.len(), expected.len());
    assert_ne!(
        falkor,
        expected.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        "the corpus no longer separates BM25 from FalkorDB's scoring"
    );
}

#[tokio::test]
async fn inflections_are_one_term_for_candidates_df_and_tf() {
    let env = start().await;
    for (id, text) in [
        ("a", "running rules"),
        ("b", "rule run"),
        ("c", "log rotation happens daily"),
    ] {
        write(
            &env.store,
            "stem",
            id,
            &format!("{id}.md"),
            &[text],
            DocumentMeta::default(),
        )
        .await;
    }
    let count = |q: String| {
        let store = env.store.clone();
        async move {
            let mut params = Params::new();
            params.insert("q".into(), json!(q));
            store
                .ro_query(
                    "stem",
                    "CALL db.idx.fulltext.queryNodes('Chunk', $q) YIELD node RETURN count(node)",
                    &params,
                    5_000,
                )
                .await
                .unwrap()
                .rows[0][0]
                .as_u64()
                .unwrap()
        }
    };
    // The index stems: a bare word finds every word with its stem, whichever form is asked
    // (what the lane nominates with and counts df by) ...
    assert_eq!(count(stemmed_term("rule")).await, 2);
    assert_eq!(count(stemmed_term("rules")).await, 2);
    assert_eq!(count(stemmed_term("rotate")).await, 1);
    // ... a quoted word only itself.
    assert_eq!(count(exact_term("rule")).await, 1);
    assert_eq!(count(exact_term("rotate")).await, 0);

    // `[retrieval] fulltext_stemming = true`: BM25 counts the same way. Headers `a.md` etc.
    // are two tokens: lengths 4, 4, 6 (avgdl 14 / 3); `rotating` has df 1 (rotation),
    // `rules` df 2 (rules, rule).
    let stems = kg_retrieval::RetrievalService::new(env.store.clone()).with_fulltext_stemming(true);
    let hits = stems
        .search_for(
            &caller("stem", |_| {}),
            search("stem", "Rotating rules", &["fulltext"]),
        )
        .await
        .unwrap();
    let (n, avgdl) = (3.0, 14.0 / 3.0);
    let expected = [
        ("c#0", term_score(1.0, 1.0, n, 6.0, avgdl)),
        ("a#0", term_score(1.0, 2.0, n, 4.0, avgdl)),
        ("b#0", term_score(1.0, 2.0, n, 4.0, avgdl)),
    ];
    let got = ranked(&hits);
    assert_eq!(got.len(), expected.len(), "{got:?}");
    for ((key, score), (want_key, want)) in got.iter().zip(expected) {
        assert_eq!(key, want_key, "{got:?}");
        assert!((score - want).abs() < 1e-9, "{key}: {score} != {want}");
    }

    // The default: exact tokens for candidates, df and tf alike.
    let hits = fulltext(&env, "stem", "Rotating rules", &caller("stem", |_| {})).await;
    let got = ranked(&hits);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, "a#0");
    // `rules` alone (df 1); `rotating` occurs nowhere.
    let want = term_score(1.0, 1.0, n, 4.0, avgdl);
    assert!((got[0].1 - want).abs() < 1e-9, "{} != {want}", got[0].1);
}

/// Asserts the lane's ranking and scores for "Alpha beta?" in `ns` (see [`alpha_beta_scores`]).
async fn assert_alpha_beta(env: &Env, ns: &str, avgdl: f64) {
    let got = ranked(&fulltext(env, ns, "Alpha beta?", &caller(ns, |_| {})).await);
    let expected = alpha_beta_scores(avgdl);
    assert_eq!(got.len(), expected.len(), "{ns}: {got:?}");
    for ((key, score), (want_key, want)) in got.iter().zip(expected) {
        assert_eq!(key, want_key, "{ns}: {got:?}");
        assert!((score - want).abs() < 1e-9, "{ns} {key}: {score} != {want}");
    }
}

#[tokio::test]
async fn avgdl_is_exact_from_stored_word_counts_and_sampled_without_them() {
    let env = start().await;
    // The indexer stores each chunk's length as BM25 counts it, header included.
    write_corpus(&env.store, "wc", "").await;
    let rows = env
        .store
        .ro_query(
            "wc",
            "MATCH (c:Chunk) RETURN c.chunkKey, c.wordCount ORDER BY c.chunkKey",
            &Params::new(),
            5_000,
        )
        .await
        .unwrap();
    let stored: Vec<(&str, i64)> = rows
        .rows
        .iter()
        .map(|r| (r[0].as_str().unwrap(), r[1].as_i64().unwrap()))
        .collect();
    assert_eq!(
        stored,
        [
            ("both#0", 5),
            ("f1#0", 5),
            ("f2#0", 4),
            ("f3#0", 5),
            ("f4#0", 4),
            ("long#0", 64),
            ("sat#0", 13),
            ("short#0", 3)
        ]
    );
    assert_alpha_beta(&env, "wc", 103.0 / 8.0).await;

    // avgdl is read from the stored counts (doubled here), not from the text.
    write_corpus(&env.store, "wc_doubled", "").await;
    env.store
        .query(
            "wc_doubled",
            "MATCH (c:Chunk) SET c.wordCount = c.wordCount * 2",
            &Params::new(),
        )
        .await
        .unwrap();
    assert_alpha_beta(&env, "wc_doubled", 206.0 / 8.0).await;

    // One chunk indexed before the count existed: the texts are counted instead.
    write_corpus(&env.store, "wc_older", "").await;
    env.store
        .query(
            "wc_older",
            "MATCH (c:Chunk {chunkKey: 'f1#0'}) SET c.wordCount = 1000 \
             WITH c MATCH (l:Chunk {chunkKey: 'long#0'}) REMOVE l.wordCount",
            &Params::new(),
        )
        .await
        .unwrap();
    assert_alpha_beta(&env, "wc_older", 103.0 / 8.0).await;
}

#[tokio::test]
async fn statistics_count_only_chunks_the_caller_may_read() {
    let env = start().await;
    // `open` holds the corpus; `mixed` the same corpus plus a folder the restricted caller
    // cannot read, full of the query's terms and long (df, N and avgdl would all move).
    write_corpus(&env.store, "open", "").await;
    write_corpus(&env.store, "mixed", "").await;
    let secret = format!("beta beta {}", "alpha ".repeat(40));
    for i in 0..6 {
        write(
            &env.store,
            "mixed",
            &format!("s{i}"),
            &format!("secret/s{i}.md"),
            &[secret.as_str(), "beta gamma"],
            DocumentMeta::default(),
        )
        .await;
    }
    let open = fulltext(&env, "open", "alpha beta", &caller("open", |_| {})).await;
    let restricted_hits = fulltext(&env, "mixed", "alpha beta", &restricted("mixed")).await;
    assert_eq!(ranked(&restricted_hits), ranked(&open));
    assert_eq!(ranked(&open).len(), 5);
    // A reader of everything does see the secret folder, with other statistics.
    let everyone = fulltext(&env, "mixed", "alpha beta", &caller("mixed", |_| {})).await;
    let everyone = ranked(&everyone);
    assert!(everyone.iter().any(|(k, _)| k.starts_with("s0#")));
    let sat = everyone.iter().find(|(k, _)| k == "sat#0").unwrap().1;
    assert!((sat - ranked(&open)[0].1).abs() > 1e-6);
}

/// Calls of `GRAPH.*` commands the server has answered, from `INFO commandstats`.
async fn graph_calls(store: &GraphStore) -> u64 {
    let port = store
        .server_identity()
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse::<u16>().ok())
        .unwrap();
    let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    socket
        .write_all(b"*2\r\n$4\r\nINFO\r\n$12\r\ncommandstats\r\n")
        .await
        .unwrap();
    // A bulk string: `$<len>\r\n<body>\r\n`.
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = socket.read(&mut buf).await.unwrap();
        assert!(n > 0, "INFO reply cut short");
        reply.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&reply);
        if let Some((head, body)) = text.split_once("\r\n") {
            let len: usize = head.trim_start_matches('$').parse().unwrap();
            if body.len() >= len {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&reply);
    text.lines()
        .filter(|l| l.to_ascii_lowercase().starts_with("cmdstat_graph."))
        .map(|l| {
            let calls = l.split("calls=").nth(1).unwrap();
            calls.split(',').next().unwrap().parse::<u64>().unwrap()
        })
        .sum()
}

#[tokio::test]
async fn cached_statistics_are_not_asked_again() {
    let env = start().await;
    write_corpus(&env.store, "cache", "").await;
    let reader = caller("cache", |_| {});
    let mut asked = Vec::new();
    let mut scores: HashMap<&str, Vec<(String, f64)>> = HashMap::new();
    for query in ["alpha beta", "alpha beta", "beta alpha zeta", "alpha beta"] {
        let before = graph_calls(&env.store).await;
        let response = fulltext(&env, "cache", query, &reader).await;
        asked.push(graph_calls(&env.store).await - before);
        scores.entry(query).or_insert_with(|| ranked(&response));
    }
    // A miss asks N with avgdl (from the stored word counts) and df on top of what a hit
    // asks (the candidates and the search's own offsets lookup); a new term asks its df alone.
    // The first search of the namespace also asks once whether its full-text index is built.
    let hit = asked[1];
    assert!(hit <= 2, "{asked:?}");
    assert_eq!(asked, [hit + 3, hit, hit + 1, hit]);
    // Another reader (another access predicate) has statistics of its own.
    let before = graph_calls(&env.store).await;
    fulltext(&env, "cache", "alpha beta", &restricted("cache")).await;
    assert_eq!(graph_calls(&env.store).await - before, hit + 2);
    assert_eq!(scores["alpha beta"].len(), 5);
}

#[tokio::test]
async fn old_statistics_serve_while_a_background_recount_replaces_them() {
    let env = start().await;
    let service = env
        .service
        .clone()
        .with_statistics_ttl(Duration::from_secs(1));
    let lane = |ns: &'static str| {
        let service = service.clone();
        let reader = caller(ns, |_| {});
        async move {
            let response = service
                .search_for(&reader, search(ns, "alpha beta", &["fulltext"]))
                .await
                .unwrap();
            ranked(&response).into_iter().collect::<HashMap<_, _>>()
        }
    };
    // Four more chunks holding `alpha` move N, avgdl and alpha's df.
    async fn write_extra(store: &GraphStore, ns: &str) {
        for i in 0..4 {
            // Distinct texts: copies would fold into one hit.
            let (id, path) = (format!("x{i}"), format!("x{i}.md"));
            let text = format!("alpha gamma extra{i}");
            write(
                store,
                ns,
                &id,
                &path,
                &[text.as_str()],
                DocumentMeta::default(),
            )
            .await;
        }
    }
    write_corpus(&env.store, "swr", "").await;
    let counted = lane("swr").await;
    assert_eq!(counted.len(), 5, "{counted:?}");
    write_extra(&env.store, "swr").await;
    // The reference: the same chunks in a namespace counted afresh.
    write_corpus(&env.store, "swr_ref", "").await;
    write_extra(&env.store, "swr_ref").await;
    let fresh = lane("swr_ref").await;
    assert_eq!(fresh.len(), 9);
    assert!((fresh["sat#0"] - counted["sat#0"]).abs() > 1e-6);

    // Past the TTL the first search still scores with the counts it finds, and recounts them
    // after it answers; its old chunks score as before the ingest, its new ones are found.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let stale = lane("swr").await;
    assert_eq!(stale.len(), 9, "{stale:?}");
    for (key, score) in &counted {
        assert!(
            (stale[key] - score).abs() < 1e-9,
            "{key}: {} != {score}",
            stale[key]
        );
    }
    // The recount lands without another search waiting for it.
    let mut last = stale;
    for _ in 0..100 {
        if last
            .iter()
            .all(|(key, score)| (fresh[key] - score).abs() < 1e-9)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        last = lane("swr").await;
    }
    for (key, score) in &last {
        assert!(
            (fresh[key] - score).abs() < 1e-9,
            "{key}: {score} != {}",
            fresh[key]
        );
    }
}

#[tokio::test]
async fn identical_texts_fold_into_one_hit_listing_the_copies() {
    let env = start().await;
    // 150 chunks in three files, seven distinct texts: "lambda" plus 0-6 filler words.
    let texts: Vec<String> = (0..50)
        .map(|i| format!("lambda {}", "word ".repeat(i % 7)))
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    for file in ["a", "b", "c"] {
        let path = format!("{file}.md");
        write(
            &env.store,
            "copies",
            file,
            &path,
            &refs,
            DocumentMeta::default(),
        )
        .await;
    }
    let reader = caller("copies", |_| {});
    let request = |collapse: Option<bool>| {
        let mut request = search("copies", "lambda", &["fulltext"]);
        request.ranking = Some(kg_proto::v1::Ranking {
            collapse_duplicates: collapse,
            ..Default::default()
        });
        request
    };
    let check = |response: &SearchResponse| {
        // One hit per text, ranked 1..=7 by the lane, shortest first; the lane's pool holds
        // every copy of its distinct texts.
        assert_eq!(response.hits.len(), 7);
        assert_eq!(response.total_candidates, 7);
        assert_eq!(response.lanes[0].hits, 150);
        assert_eq!(response.duplicates_collapsed, 143);
        let ranks: Vec<u32> = response.hits.iter().map(|h| h.lanes[0].rank).collect();
        assert_eq!(ranks, (1..=7).collect::<Vec<u32>>());
        assert_eq!(
            response.hits[0].chunk_key, "a#0",
            "ties fall to the chunk key"
        );
        let counted: u32 = response.hits.iter().map(|h| h.duplicate_count).sum();
        assert_eq!(counted, 143);
        for hit in &response.hits {
            assert_eq!(hit.duplicates.len(), 5.min(hit.duplicate_count as usize));
            for copy in &hit.duplicates {
                assert_ne!(copy.chunk_key, hit.chunk_key);
                assert_eq!(copy.path, format!("{}.md", copy.file_id));
            }
        }
    };
    check(
        &env.service
            .search_for(&reader, request(None))
            .await
            .unwrap(),
    );
    check(
        &env.service
            .search_for(&reader, request(Some(true)))
            .await
            .unwrap(),
    );

    let apart = env
        .service
        .search_for(&reader, request(Some(false)))
        .await
        .unwrap();
    assert_eq!(apart.hits.len(), 32);
    assert_eq!(apart.total_candidates, 150);
    assert_eq!(apart.duplicates_collapsed, 0);
    assert!(apart.hits.iter().all(|h| h.duplicate_count == 0));

    // Chunks indexed before the stored hash existed still fold: the lane hashes their text.
    env.store
        .query(
            "copies",
            "MATCH (c:Chunk) REMOVE c.textHash",
            &Params::new(),
        )
        .await
        .unwrap();
    check(
        &env.service
            .search_for(&reader, request(None))
            .await
            .unwrap(),
    );

    // A service that does not collapse by default still does when the request asks.
    let service = env.service.clone().with_collapse_duplicates(false);
    assert_eq!(
        service
            .search_for(&reader, request(None))
            .await
            .unwrap()
            .hits
            .len(),
        32
    );
    check(
        &service
            .search_for(&reader, request(Some(true)))
            .await
            .unwrap(),
    );
}

#[tokio::test]
async fn lane_limit_and_truncation_are_unchanged() {
    let env = start().await;
    // 150 chunks hold the term: more than the lane's pool of 100. Each text differs, so none
    // folds into another.
    let texts: Vec<String> = (0..150)
        .map(|i| format!("kappa {}w{i}", "word ".repeat(i % 7)))
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    write(
        &env.store,
        "many",
        "m",
        "m.md",
        &refs,
        DocumentMeta::default(),
    )
    .await;
    let reader = caller("many", |_| {});
    let mut request = search("many", "kappa", &["fulltext"]);
    request.top_k = 32;
    let response = env.service.search_for(&reader, request).await.unwrap();
    assert_eq!(response.hits.len(), 32);
    assert_eq!(response.lanes[0].hits, 100);
    assert_eq!(response.total_candidates, 100);
    let ranks: Vec<u32> = response.hits.iter().map(|h| h.lanes[0].rank).collect();
    assert_eq!(ranks, (1..=32).collect::<Vec<u32>>());
    let scores: Vec<f64> = response.hits.iter().map(|h| h.lanes[0].raw_score).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    // Shortest chunks first (same tf, length normalised), ties by chunk key.
    assert_eq!(response.hits[0].chunk_key, "m#0");
    let mut request = search("many", "kappa", &["fulltext"]);
    request.top_k = 3;
    let response = env.service.search_for(&reader, request).await.unwrap();
    assert_eq!(response.hits.len(), 3);
    // Nothing searchable: no hits, no error.
    let response = fulltext(&env, "many", "the of", &reader).await;
    assert!(response.hits.is_empty());
}

#[tokio::test]
async fn context_headers_are_searched_and_old_indexes_are_rebuilt() {
    let env = start().await;
    let reader = caller("old", |_| {});
    // A namespace indexed by an older release: the full-text index covers `text` only.
    let mut params = Params::new();
    params.insert("header".into(), json!("Operator guide › Upgrades"));
    run(
        &env.store,
        "old",
        "CALL db.idx.fulltext.createNodeIndex('Chunk', 'text')",
        Params::new(),
    )
    .await;
    run(
        &env.store,
        "old",
        "CREATE (f:FileRef {fileId: 'g', versionId: 'v1', vfsPath: 'guide.md', name: 'guide.md', \
             folderPath: '', enabled: true, hidden: false}) \
         CREATE (c:Chunk {chunkKey: 'g#0', fileId: 'g', path: 'guide.md', enabled: true, \
             chunkIndex: 0, text: 'Stop the old nodes first.', contextHeader: $header}) \
         CREATE (c)-[:PART_OF]->(f)",
        params,
    )
    .await;
    let before = fulltext(&env, "old", "upgrades", &reader).await;
    assert!(before.hits.is_empty() && before.lanes[0].ok);
    // The start-up sweep rebuilds it with contextHeader; the chunk is found by its heading.
    assert!(env.store.ensure_all_indexes().await.unwrap() >= 1);
    let after = fulltext(&env, "old", "upgrades", &reader).await;
    assert_eq!(ranked(&after).len(), 1);
    assert_eq!(after.hits[0].chunk_key, "g#0");
    // Text is still indexed, and a second sweep changes nothing.
    assert_eq!(fulltext(&env, "old", "nodes", &reader).await.hits.len(), 1);
    env.store.ensure_all_indexes().await.unwrap();
    assert_eq!(
        fulltext(&env, "old", "upgrades", &reader).await.hits.len(),
        1
    );
}

/// A term in more than 2% of the readable chunks (and over 1,000 of them) is common: while
/// enough chunks hold a rarer query term to fill the pool, only those are candidates, however
/// many common terms another chunk holds. Here, without the cut, the chunks holding all three
/// common terms (weight 3 x 0.73 against the rare term's 1.83) would fill the pool and the
/// top hits. When the rare term cannot fill the pool, the chunks holding every common term
/// join it, and when those cannot fill a page (32) either, every chunk holding any term. A
/// query of common terms alone starts with the chunks holding all of them.
#[tokio::test]
async fn common_terms_nominate_only_when_rarer_nominations_cannot_fill_the_pool() {
    let env = start().await;
    let texts = |n: usize, text: &str| -> Vec<String> {
        (0..n).map(|i| format!("{text} pad{i}")).collect()
    };
    // 3,648 chunks; cone, ctwo, cthree and cfour are common (over 1,000 chunks each),
    // rareword, someword and scarceword are not.
    let files = [
        ("commons", texts(1_200, "cone ctwo cthree")),
        ("rares", texts(400, "rareword")),
        ("some", texts(40, "someword")),
        ("scarce", texts(5, "scarceword")),
        ("others", texts(900, "other")),
        ("cfours", texts(1_100, "cfour")),
        ("pairs", texts(3, "cone cfour")),
    ];
    for (id, chunks) in &files {
        let chunks: Vec<&str> = chunks.iter().map(String::as_str).collect();
        write(
            &env.store,
            "ct",
            id,
            &format!("{id}.md"),
            &chunks,
            DocumentMeta::default(),
        )
        .await;
    }
    let reader = caller("ct", |_| {});
    // The file of each of the top 12 hits.
    let files_of_hits = |query: &'static str| {
        let mut request = search("ct", query, &["fulltext"]);
        request.top_k = 12;
        let (service, reader) = (&env.service, &reader);
        async move {
            let response = service.search_for(reader, request).await.unwrap();
            let files: Vec<String> = response
                .hits
                .iter()
                .map(|h| h.chunk_key.split('#').next().unwrap_or_default().to_owned())
                .collect();
            assert_eq!(files.len(), 12, "{query}: {files:?}");
            files
        }
    };
    let all_in =
        |files: &[String], allowed: &[&str]| files.iter().all(|f| allowed.contains(&f.as_str()));

    let got = files_of_hits("rareword cone ctwo cthree").await;
    assert!(all_in(&got, &["rares"]), "{got:?}");

    // Five chunks cannot fill a pool of 200: the one common term's chunks follow them.
    let got = files_of_hits("scarceword cone").await;
    assert!(all_in(&got[..5], &["scarce"]), "{got:?}");
    assert!(all_in(&got[5..], &["commons", "pairs"]), "{got:?}");

    // Nor can they with two common terms: the chunks holding both fill it.
    let got = files_of_hits("scarceword cone ctwo").await;
    assert!(all_in(&got[..5], &["scarce"]), "{got:?}");
    assert!(all_in(&got[5..], &["commons"]), "{got:?}");

    // Only three chunks hold cone and cfour together: then every chunk with either.
    let got = files_of_hits("scarceword cone cfour").await;
    assert!(all_in(&got[..5], &["scarce"]), "{got:?}");
    assert!(all_in(&got[5..8], &["pairs"]), "{got:?}");
    assert!(all_in(&got[8..], &["commons", "cfours"]), "{got:?}");

    // Forty chunks cannot fill the pool but fill a page: cone's other 1,203 postings are not
    // walked, and the lane's candidates are those forty. Five do not fill a page: the lane
    // walks every posting and keeps its pool of 100.
    let candidates = |query: &'static str| {
        let (service, reader) = (&env.service, &reader);
        async move {
            let request = search("ct", query, &["fulltext"]);
            let response = service.search_for(reader, request).await.unwrap();
            response.total_candidates
        }
    };
    assert_eq!(candidates("someword cone").await, 40);
    let got = files_of_hits("someword cone").await;
    assert!(all_in(&got, &["some"]), "{got:?}");
    assert_eq!(candidates("scarceword cone").await, 100);

    // Common terms alone: the chunks holding all of them, or, too few, any of them.
    let got = files_of_hits("cone ctwo").await;
    assert!(all_in(&got, &["commons"]), "{got:?}");
    let got = files_of_hits("cone cfour").await;
    assert!(all_in(&got[..3], &["pairs"]), "{got:?}");
    assert!(all_in(&got[3..], &["commons", "cfours"]), "{got:?}");
    // Three common terms no chunk holds together: the chunks holding two of them (the three
    // pairs with the rarer cfour first) fill the pool without walking every posting.
    let got = files_of_hits("cone ctwo cfour").await;
    assert!(all_in(&got[..3], &["pairs"]), "{got:?}");
    assert!(all_in(&got[3..], &["commons"]), "{got:?}");
}

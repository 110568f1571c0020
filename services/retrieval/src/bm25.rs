//! Okapi BM25 for the full-text lane. FalkorDB's index finds the candidates; their score is
//! BM25 as the docs-qa baseline computes it (k1 1.2, b 0.75, Lucene idf, lower-cased runs of
//! letters, digits and `_`) over the chunk's contextHeader and text together, the two
//! properties the index covers. RediSearch's own score neither saturates term frequency nor
//! normalises length that way, and cost ~0.05 nDCG@10 on docs-qa. A query term is the exact
//! token, or (`[retrieval] fulltext_stemming = true`) every token with its English stem
//! (Snowball's Porter2, the stemmer FalkorDB's index uses), so `rotation` finds and scores
//! `rotate`: +0.033 nDCG@10 for the lane on docs-qa, more postings to walk. A chunk scores
//! as its best passage of [`PASSAGE_TOKENS`] tokens, so a long section is not outranked by a
//! line that merely names the term ([`best_passage`]).
//!
//! Corpus statistics count only the chunks the caller may read (the chunk's access predicate
//! is inside every statistics query), so a ranking never depends on unreadable text: N and
//! avgdl from the readable chunks (avgdl from their stored `wordCount`, or for chunks indexed
//! before it from a sample of them), df per term from the index with the query
//! that nominates it (the quoted word, or the bare word the index expands to its stem, as tf
//! counts). They are cached in-process per (server, namespace, access predicate) for a
//! minute (`[retrieval] statistics_ttl_seconds`), then recounted in the background while the
//! old counts serve ([`crate::scope_cache`]). A Chunk carries the access properties of its file, so
//! the statistics never traverse to the FileRef: the df of a common term walks tens of
//! thousands of postings, and a traversal for each cost three quarters of the query at 100k
//! chunks.

use std::sync::LazyLock;
use std::time::Duration;

use kg_common::access::CypherPredicate;
use kg_stores::chunk_text::words;
use kg_stores::graph::{GraphStore, Params, exact_term, stemmed_term};
use rust_stemmers::{Algorithm, Stemmer};
use serde_json::Value;

use crate::error::{Result, RetrievalError};
use crate::scope_cache::{Lookup, ScopeCache, scope_key};

/// Term-frequency saturation.
pub(crate) const K1: f64 = 1.2;
/// Length normalisation.
pub(crate) const B: f64 = 0.75;
/// A chunk is scored by its best passage of this many tokens ([`best_passage`]): chunks end at
/// headings, so their lengths spread from a line to a long section, and over whole chunks
/// length normalisation ranks a one-line mention of a term above the section that explains
/// it. The lane alone, nDCG@10 / MRR@8: npm-docs-qa 0.726 / 0.541 -> 0.739 / 0.611;
/// docs-qa, whose chunks are short, 0.784 / 0.639 -> 0.792 / 0.641. 200 tokens changed
/// neither set (few chunks are longer).
pub(crate) const PASSAGE_TOKENS: usize = 100;
/// Passages overlap by half, so a term pair straddling one passage's end is in the next.
pub(crate) const PASSAGE_STRIDE: usize = PASSAGE_TOKENS / 2;
/// Chunks without a stored `wordCount` (indexed before it) measure avgdl on at most this many
/// readable chunks: counting words is the costly part (~0.1 ms a chunk in FalkorDB), and the
/// mean of a thousand is close enough.
pub(crate) const AVGDL_SAMPLE: i64 = 1_000;
/// Cached scopes (server, namespace, access predicate) at most.
const MAX_SCOPES: usize = 256;
/// Cached terms per scope at most.
const MAX_TERMS_PER_SCOPE: usize = 4_096;
/// Server-side limit on one statistics query.
const STATS_TIMEOUT_MS: u64 = 5_000;
/// A token in FalkorDB's regex dialect: what [`term_frequencies`] counts.
const TOKEN_PATTERN: &str = r"[\p{L}\p{N}_]+";

/// The statistics BM25 needs for one query over the chunks one caller may read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Stats {
    /// Readable chunks.
    pub(crate) docs: u64,
    /// Their mean length in tokens (0 when there are none).
    pub(crate) avgdl: f64,
    /// Readable chunks holding each query term, in query-term order.
    pub(crate) df: Vec<u64>,
}

impl Stats {
    /// Lucene's idf of each query term.
    pub(crate) fn idf(&self) -> Vec<f64> {
        self.df.iter().map(|&df| idf(self.docs, df)).collect()
    }
}

/// Lucene's BM25 idf, `ln(1 + (N - df + 0.5) / (df + 0.5))`: never negative. A df above N
/// (the two counted a moment apart) is clamped to N.
pub(crate) fn idf(docs: u64, df: u64) -> f64 {
    let df = df.min(docs) as f64;
    let docs = docs as f64;
    (1.0 + (docs - df + 0.5) / (df + 0.5)).ln()
}

/// The English stemmer, built once (it holds only a function table).
static STEMMER: LazyLock<Stemmer> = LazyLock::new(|| Stemmer::create(Algorithm::English));

/// Porter2 stems these three to a stem that is no prefix of them (`dying` -> `die`); every
/// other word starts with its stem minus the stem's last character, or with the whole stem
/// when that is one character (checked on 42,000 distinct words of the crates' Markdown and
/// every token of docs-qa).
const STEM_EXCEPTIONS: [&str; 3] = ["dying", "lying", "tying"];

/// One query term as BM25 counts it: every token with the same English stem, or (stemming
/// off, `[retrieval] fulltext_stemming = false`) that exact token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Term {
    /// The first query word with this stem (lower-case): what the index is asked for.
    pub(crate) word: String,
    /// The stem tokens are compared by (the word itself when stemming is off).
    pub(crate) stem: String,
    /// Whether the term stands for its stem.
    stemmed: bool,
    /// The stem without its last character (the stem itself when that is one character): a
    /// token that does not start with it cannot have this stem (but [`STEM_EXCEPTIONS`]), so
    /// most tokens are never stemmed. Stemming every token of a 200-chunk pool costs ~20 ms.
    prefix: String,
}

impl Term {
    /// The full-text query for the term: the bare word, which the index expands to its stem,
    /// or the quoted word, which matches only itself.
    pub(crate) fn index_query(&self) -> String {
        if self.stemmed {
            stemmed_term(&self.word)
        } else {
            exact_term(&self.word)
        }
    }
}

/// The query's words (lower-case, as [`kg_stores::graph::fulltext_terms`] gives them) as BM25
/// terms: one per stem (per word when `stemming` is off), in the order they first occur.
pub(crate) fn query_terms(words: Vec<String>, stemming: bool) -> Vec<Term> {
    let mut terms: Vec<Term> = Vec::with_capacity(words.len());
    for word in words {
        let stem = if stemming {
            STEMMER.stem(&word).into_owned()
        } else {
            word.clone()
        };
        if terms.iter().any(|t| t.stem == stem) {
            continue;
        }
        let mut prefix = stem.clone();
        if prefix.chars().nth(1).is_some() {
            prefix.pop();
        }
        terms.push(Term {
            word,
            stem,
            stemmed: stemming,
            prefix,
        });
    }
    terms
}

/// How often each of `terms` occurs in `text` (tokens with the term's stem), and the text's
/// length, both in tokens: lower-cased runs of letters, digits and `_`.
pub(crate) fn term_frequencies(text: &str, terms: &[Term]) -> (Vec<u32>, u32) {
    let tokens = token_terms(text, terms);
    let mut tf = vec![0u32; terms.len()];
    add_counts(&mut tf, tokens.iter());
    (tf, u32::try_from(tokens.len()).unwrap_or(u32::MAX))
}

/// The text's tokens in order, each as the index of the query term it counts for, if any.
pub(crate) fn token_terms(text: &str, terms: &[Term]) -> Vec<Option<u16>> {
    let mut out = Vec::new();
    let mut lower = String::new();
    for token in words(text) {
        if !could_match(token, terms) {
            out.push(None);
            continue;
        }
        lower.clear();
        lower.extend(token.chars().flat_map(char::to_lowercase));
        let mut stem = None;
        let mut matched = None;
        for (i, term) in terms.iter().enumerate() {
            if !term.stemmed {
                if lower == term.word {
                    matched = u16::try_from(i).ok();
                    break;
                }
                continue;
            }
            if !lower.starts_with(&term.prefix) && !STEM_EXCEPTIONS.contains(&lower.as_str()) {
                continue;
            }
            let stem = stem.get_or_insert_with(|| STEMMER.stem(&lower));
            if *stem == term.stem {
                matched = u16::try_from(i).ok();
                break;
            }
        }
        out.push(matched);
    }
    out
}

/// Whether an ASCII token can count for any term, decided without lower-casing it: most
/// tokens count for none, and lower-casing each into a string was most of the lane's CPU
/// (200 chunks of ~550 words: 5.7 ms). A non-ASCII token is always checked in full.
fn could_match(token: &str, terms: &[Term]) -> bool {
    if !token.is_ascii() {
        return true;
    }
    terms.iter().any(|term| {
        if term.stemmed {
            token
                .as_bytes()
                .get(..term.prefix.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(term.prefix.as_bytes()))
                || STEM_EXCEPTIONS
                    .iter()
                    .any(|word| token.eq_ignore_ascii_case(word))
        } else {
            token.eq_ignore_ascii_case(&term.word)
        }
    })
}

/// A chunk's BM25 score and its term counts. The score is that of its best passage: the
/// header with [`PASSAGE_TOKENS`] tokens of the body, every [`PASSAGE_STRIDE`] tokens,
/// against the corpus's avgdl capped at a passage. The counts are the whole chunk's, header
/// included (for [`match_share`]).
pub(crate) fn best_passage(
    header: &str,
    text: &str,
    terms: &[Term],
    idf: &[f64],
    avgdl: f64,
) -> (f64, Vec<u32>) {
    let (header_tf, header_len) = term_frequencies(header, terms);
    let tokens = token_terms(text, terms);
    let passage_avgdl = avgdl.min(PASSAGE_TOKENS as f64);
    let mut best = 0.0f64;
    let mut start = 0;
    loop {
        let passage = tokens.iter().skip(start).take(PASSAGE_TOKENS);
        let len = passage.len();
        let mut tf = header_tf.clone();
        add_counts(&mut tf, passage);
        let dl = f64::from(header_len) + len as f64;
        best = best.max(score(&tf, idf, dl, passage_avgdl));
        if start + len >= tokens.len() {
            break;
        }
        start += PASSAGE_STRIDE;
    }
    let mut whole = header_tf;
    add_counts(&mut whole, tokens.iter());
    (best, whole)
}

/// Adds the tokens that count for a query term to its count.
fn add_counts<'a>(tf: &mut [u32], tokens: impl Iterator<Item = &'a Option<u16>>) {
    for term in tokens.flatten() {
        if let Some(count) = tf.get_mut(usize::from(*term)) {
            *count = count.saturating_add(1);
        }
    }
}

/// The share of the query's idf weight held by the terms a chunk contains at all (`tf > 0`),
/// 0..=1: how much of the query the chunk matches, whatever the counts and its length.
pub(crate) fn match_share(tf: &[u32], idf: &[f64]) -> f64 {
    let total: f64 = idf.iter().sum();
    if total <= 0.0 {
        return 0.0;
    }
    let matched: f64 = tf
        .iter()
        .zip(idf)
        .filter(|(tf, _)| **tf > 0)
        .map(|(_, idf)| idf)
        .sum();
    (matched / total).clamp(0.0, 1.0)
}

/// The BM25 score of a chunk of `dl` tokens with term frequencies `tf` (per query term).
pub(crate) fn score(tf: &[u32], idf: &[f64], dl: f64, avgdl: f64) -> f64 {
    let norm = if avgdl > 0.0 {
        K1 * (1.0 - B + B * dl / avgdl)
    } else {
        K1
    };
    tf.iter()
        .zip(idf)
        .filter(|(tf, _)| **tf > 0)
        .map(|(&tf, idf)| {
            let tf = f64::from(tf);
            idf * tf * (K1 + 1.0) / (tf + norm)
        })
        .sum()
}

/// The corpus half of [`Stats`].
#[derive(Debug, Clone, Copy, PartialEq)]
struct Corpus {
    docs: u64,
    avgdl: f64,
}

/// Corpus statistics by scope (one item each, [`CORPUS_ITEM`]).
static CORPUS_CACHE: LazyLock<ScopeCache<Corpus>> =
    LazyLock::new(|| ScopeCache::new(MAX_SCOPES, 1));
/// The one item of a scope in [`CORPUS_CACHE`].
const CORPUS_ITEM: &str = "";
/// Document frequencies by scope, then by the term's full-text query.
static DF_CACHE: LazyLock<ScopeCache<u64>> =
    LazyLock::new(|| ScopeCache::new(MAX_SCOPES, MAX_TERMS_PER_SCOPE));

/// BM25 statistics of `terms` over the chunks `node` (a Chunk access predicate compiled for
/// variable `node`) admits, from the cache when it holds them; otherwise asked from FalkorDB
/// (only the missing parts). Statistics older than `ttl` are still used, and recounted after
/// this search in the background ([`ScopeCache::lookup`]).
pub(crate) async fn stats(
    store: &GraphStore,
    namespace: &str,
    node: &CypherPredicate,
    terms: &[Term],
    ttl: Duration,
) -> Result<Stats> {
    let key = scope_key(store, namespace, &[node]);
    // Keyed by the full-text query df counts: a stemmed `rule` and a quoted one differ.
    let queries: Vec<String> = terms.iter().map(Term::index_query).collect();
    let cached_corpus = CORPUS_CACHE
        .lookup(&key, &[CORPUS_ITEM.to_owned()], ttl)
        .into_iter()
        .next()
        .unwrap_or(Lookup::Missing);
    let cached_df = DF_CACHE.lookup(&key, &queries, ttl);
    let missing: Vec<usize> = (0..terms.len())
        .filter(|&i| cached_df[i].value().is_none())
        .collect();

    let corpus_query = async {
        match cached_corpus.value() {
            Some(corpus) => Ok((corpus, false)),
            None => corpus_stats(store, namespace, node)
                .await
                .map(|c| (c, true)),
        }
    };
    let missing_terms: Vec<String> = missing.iter().map(|&i| queries[i].clone()).collect();
    let df_query = async {
        if missing_terms.is_empty() {
            Ok(Vec::new())
        } else {
            document_frequencies(store, namespace, node, &missing_terms).await
        }
    };
    let ((corpus, corpus_fetched), fetched_df) = tokio::try_join!(corpus_query, df_query)?;

    let mut df: Vec<u64> = cached_df.iter().map(|d| d.value().unwrap_or(0)).collect();
    let mut to_cache = Vec::with_capacity(missing.len());
    for (&i, &count) in missing.iter().zip(&fetched_df) {
        df[i] = count;
        to_cache.push((queries[i].clone(), count));
    }
    // An empty scope is not remembered: its first ingest must count at once.
    if corpus.docs > 0 {
        if corpus_fetched {
            CORPUS_CACHE.put(&key, &[(CORPUS_ITEM.to_owned(), corpus)], ttl);
        }
        DF_CACHE.put(&key, &to_cache, ttl);
    }
    let stale_terms: Vec<String> = queries
        .iter()
        .zip(&cached_df)
        .filter(|(_, cached)| cached.needs_refresh())
        .map(|(query, _)| query.clone())
        .collect();
    if cached_corpus.needs_refresh() || !stale_terms.is_empty() {
        recount_in_background(
            store.clone(),
            namespace.to_owned(),
            node.clone(),
            key,
            cached_corpus.needs_refresh(),
            stale_terms,
            ttl,
        );
    }
    // Counts of different ages may disagree after an ingest; N below a df would make that
    // term's idf meaningless.
    let docs = df.iter().copied().fold(corpus.docs, u64::max);
    Ok(Stats {
        docs,
        avgdl: corpus.avgdl,
        df,
    })
}

/// Recounts a scope's stale statistics (the corpus's when `corpus`, and the df of `terms`)
/// off the request path and caches them. A failure leaves the stale counts in place; the
/// next search past the claim ([`ScopeCache::lookup`]) tries again.
fn recount_in_background(
    store: GraphStore,
    namespace: String,
    node: CypherPredicate,
    key: String,
    corpus: bool,
    terms: Vec<String>,
    ttl: Duration,
) {
    tokio::spawn(async move {
        if corpus {
            match corpus_stats(&store, &namespace, &node).await {
                Ok(counted) if counted.docs > 0 => {
                    CORPUS_CACHE.put(&key, &[(CORPUS_ITEM.to_owned(), counted)], ttl);
                }
                // Emptied: forgotten, so a new ingest is counted at once.
                Ok(_) => CORPUS_CACHE.forget(&key),
                Err(err) => {
                    tracing::warn!(namespace = %namespace, error = %err.detail(), "BM25 corpus statistics: recount failed");
                }
            }
        }
        if !terms.is_empty() {
            match document_frequencies(&store, &namespace, &node, &terms).await {
                Ok(counts) => {
                    let counted: Vec<(String, u64)> = terms.into_iter().zip(counts).collect();
                    DF_CACHE.put(&key, &counted, ttl);
                }
                Err(err) => {
                    tracing::warn!(namespace = %namespace, error = %err.detail(), "BM25 document frequencies: recount failed");
                }
            }
        }
    });
}

fn with_predicate(node: &CypherPredicate) -> Params {
    let mut params = Params::new();
    params.extend(node.params.iter().cloned());
    params
}

/// N and avgdl over the readable chunks. avgdl is exact from the chunks' stored
/// `wordCount` when every readable chunk has one, so a ranking does not depend on which
/// chunks a sample happened to take (ingest order); chunks indexed before it existed are
/// counted from a sample of [`AVGDL_SAMPLE`] texts instead, until they are reprocessed.
async fn corpus_stats(
    store: &GraphStore,
    namespace: &str,
    node: &CypherPredicate,
) -> Result<Corpus> {
    let readable = format!("MATCH (node:Chunk) WHERE {}", node.text);
    let count = format!(
        "{readable} RETURN count(node), count(node.wordCount), sum(coalesce(node.wordCount, 0))"
    );
    let counted = store
        .ro_query(namespace, &count, &with_predicate(node), STATS_TIMEOUT_MS)
        .await?;
    // No row at all: the namespace has no graph yet, so nothing is readable.
    let number = |rows: &kg_stores::graph::Rows, col: usize| match rows.rows.first() {
        None => Ok(0.0),
        Some(row) => row
            .get(col)
            .and_then(Value::as_f64)
            .ok_or_else(|| RetrievalError::UnexpectedReply(format!("BM25 corpus row {row:?}"))),
    };
    let docs = number(&counted, 0)?;
    let counted_docs = number(&counted, 1)?;
    let (words, worded_docs) = if docs > 0.0 && counted_docs >= docs {
        (number(&counted, 2)?, docs)
    } else {
        let mut params = with_predicate(node);
        params.insert("bm25_sample".into(), Value::from(AVGDL_SAMPLE));
        params.insert("bm25_token".into(), Value::from(TOKEN_PATTERN));
        let sample = format!(
            "{readable} WITH node LIMIT $bm25_sample \
             RETURN count(node), sum(size(string.matchRegEx(coalesce(node.contextHeader, '') + ' ' + coalesce(node.text, ''), $bm25_token)))"
        );
        let sampled = store
            .ro_query(namespace, &sample, &params, STATS_TIMEOUT_MS)
            .await?;
        (number(&sampled, 1)?, number(&sampled, 0)?)
    };
    let avgdl = if worded_docs > 0.0 {
        words / worded_docs
    } else {
        0.0
    };
    Ok(Corpus {
        docs: docs.max(0.0) as u64,
        avgdl,
    })
}

/// Readable chunks each full-text query (a [`Term::index_query`]) matches, in order.
async fn document_frequencies(
    store: &GraphStore,
    namespace: &str,
    node: &CypherPredicate,
    terms: &[String],
) -> Result<Vec<u64>> {
    let mut params = with_predicate(node);
    params.insert(
        "bm25_terms".into(),
        Value::Array(terms.iter().map(|t| Value::from(t.as_str())).collect()),
    );
    let cypher = format!(
        "UNWIND range(0, size($bm25_terms) - 1) AS i \
         CALL db.idx.fulltext.queryNodes('Chunk', $bm25_terms[i]) YIELD node \
         WHERE {} \
         RETURN i, count(node)",
        node.text
    );
    let rows = store
        .fulltext_ro_query(namespace, "Chunk", &cypher, &params, STATS_TIMEOUT_MS)
        .await?;
    let mut df = vec![0u64; terms.len()];
    for row in &rows.rows {
        let (Some(i), Some(count)) = (
            row.first().and_then(Value::as_u64),
            row.get(1).and_then(Value::as_u64),
        ) else {
            return Err(RetrievalError::UnexpectedReply(format!(
                "BM25 df row {row:?}"
            )));
        };
        if let Some(slot) = usize::try_from(i).ok().and_then(|i| df.get_mut(i)) {
            *slot = count;
        }
    }
    Ok(df)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn match_share_is_the_held_share_of_the_query_weight() {
        let idf = [3.0, 1.0, 0.0];
        assert!((match_share(&[2, 0, 5], &idf) - 0.75).abs() < 1e-12);
        assert!((match_share(&[0, 7, 0], &idf) - 0.25).abs() < 1e-12);
        assert!((match_share(&[1, 1, 1], &idf) - 1.0).abs() < 1e-12);
        assert_eq!(match_share(&[0, 0, 0], &idf), 0.0);
        assert_eq!(match_share(&[1], &[0.0]), 0.0);
    }

    fn terms(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn tokens_are_lowercased_word_runs_counted_by_stem() {
        let (tf, len) = term_frequencies(
            "Alert: alert_rule ALERTS, alerting; x-alert café rules ruling",
            &query_terms(
                terms(&["alert", "alert_rule", "café", "rule", "missing"]),
                true,
            ),
        );
        assert_eq!(tf, [4, 1, 1, 2, 0]);
        assert_eq!(len, 9);
    }

    #[test]
    fn query_terms_keep_one_word_per_stem_in_order() {
        let got = query_terms(
            terms(&["rules", "rotation", "rule", "rotate", "dying"]),
            true,
        );
        let words: Vec<&str> = got.iter().map(|t| t.word.as_str()).collect();
        let stems: Vec<&str> = got.iter().map(|t| t.stem.as_str()).collect();
        assert_eq!(words, ["rules", "rotation", "dying"]);
        assert_eq!(stems, ["rule", "rotat", "die"]);
        // The stem's exceptions, which do not start with their stem's prefix, still count.
        let (tf, _) = term_frequencies("died dying dies lying", &got);
        assert_eq!(tf, [0, 0, 3]);
        // A one-letter stem is its own prefix: no token is stemmed only to be compared.
        let letter = query_terms(terms(&["x"]), true);
        assert_eq!(letter[0].prefix, "x");
        assert_eq!(term_frequencies("x X xs y", &letter).0, [2]);
    }

    #[test]
    fn without_stemming_a_term_is_its_exact_token() {
        let exact = query_terms(terms(&["rules", "rule", "Rules"]), false);
        let words: Vec<&str> = exact.iter().map(|t| t.word.as_str()).collect();
        assert_eq!(words, ["rules", "rule", "Rules"]);
        let (tf, len) = term_frequencies("Rules rule ruling rules", &exact[..2]);
        assert_eq!((tf, len), (vec![2, 1], 4));
        assert_eq!(exact[0].index_query(), "\"rules\"");
        assert_eq!(
            query_terms(terms(&["rules"]), true)[0].index_query(),
            "rules"
        );
    }

    #[test]
    fn idf_is_lucene_and_never_negative() {
        assert!((idf(10, 2) - (1.0f64 + 8.5 / 2.5).ln()).abs() < 1e-12);
        assert!((idf(10, 10) - (1.0f64 + 0.5 / 10.5).ln()).abs() < 1e-12);
        assert_eq!(idf(3, 9), idf(3, 3));
        assert!(idf(0, 0) > 0.0);
    }

    #[test]
    fn score_saturates_and_normalises_length() {
        let idf = [1.0];
        let one = score(&[1], &idf, 10.0, 10.0);
        let ten = score(&[10], &idf, 10.0, 10.0);
        assert!((one - 1.0).abs() < 1e-12, "{one}");
        assert!(ten < K1 + 1.0 && ten > one);
        assert!(score(&[1], &idf, 40.0, 10.0) < one);
        assert_eq!(score(&[0], &idf, 10.0, 10.0), 0.0);
        // No corpus length: no normalisation rather than a division by zero.
        assert!((score(&[1], &idf, 10.0, 0.0) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn only_tokens_that_may_count_are_lower_cased() {
        let exact = query_terms(terms(&["alert", "café"]), false);
        assert!(could_match("ALERT", &exact));
        assert!(!could_match("alerts", &exact));
        assert!(!could_match("cafe", &exact));
        assert!(could_match("CAFÉ", &exact), "non-ASCII is always checked");
        let stems = query_terms(terms(&["rules", "dying"]), true);
        assert!(could_match("RULING", &stems));
        assert!(could_match("Lying", &stems), "a stem exception");
        assert!(!could_match("role", &stems));
    }

    #[test]
    fn a_long_chunk_scores_as_its_best_passage() {
        let terms = query_terms(terms(&["token", "rotation"]), false);
        let idf = [2.0, 3.0];
        let filler = |n: usize| vec!["word"; n].join(" ");
        let passage = format!("token rotation {}", filler(98));
        // The passage alone, and the same passage deep inside a 1,000-token section.
        let alone = best_passage("Auth", &passage, &terms, &idf, 400.0);
        let inside = format!("{} {passage} {}", filler(500), filler(400));
        let long = best_passage("Auth", &inside, &terms, &idf, 400.0);
        assert!((alone.0 - long.0).abs() < 1e-12, "{alone:?} {long:?}");
        // Over the whole chunk, length normalisation would have cut it to under two thirds.
        let whole = score(&[1, 1], &idf, 1_001.0, 400.0);
        assert!(whole < 0.65 * long.0, "{whole} {}", long.0);
        // The counts are the whole chunk's, header included.
        assert_eq!(long.1, [1, 1]);
        let headed = best_passage("Token rotation", &inside, &terms, &idf, 400.0);
        assert_eq!(headed.1, [2, 2]);
    }

    #[test]
    fn a_chunk_shorter_than_a_passage_is_one_passage() {
        let terms = query_terms(terms(&["alert"]), false);
        let idf = [1.5];
        let (got, tf) = best_passage("Alert", "an alert fires", &terms, &idf, 250.0);
        let expected = score(&[2], &idf, 4.0, PASSAGE_TOKENS as f64);
        assert!((got - expected).abs() < 1e-12, "{got} {expected}");
        assert_eq!(tf, [2]);
        // A corpus of shorter chunks keeps its own avgdl, and an empty body its header.
        let short = best_passage("", "an alert fires", &terms, &idf, 20.0).0;
        assert!((short - score(&[1], &idf, 3.0, 20.0)).abs() < 1e-12);
        assert_eq!(best_passage("Alert", "", &terms, &idf, 20.0).1, [1]);
        assert_eq!(best_passage("", "", &terms, &idf, 20.0).0, 0.0);
    }

    #[test]
    fn passages_overlap_so_terms_across_a_boundary_meet() {
        let terms = query_terms(terms(&["token", "rotation"]), false);
        let idf = [1.0, 1.0];
        let filler = |n: usize| vec!["word"; n].join(" ");
        // The two terms sit at tokens 99 and 100: no passage from 0 holds both, the one
        // from 50 does.
        let text = format!("{} token rotation {}", filler(99), filler(99));
        let (got, _) = best_passage("", &text, &terms, &idf, 100.0);
        let both = score(&[1, 1], &idf, 100.0, 100.0);
        assert!((got - both).abs() < 1e-12, "{got} {both}");
    }
}

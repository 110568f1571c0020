//! The retrieval lanes: their names, and the full-text lane (FalkorDB candidates, BM25 ranking).

use kg_common::access::cypher_predicate;
use kg_proto::v1::AccessFilter;
use kg_stores::StoreError;
use kg_stores::chunk_text::text_hash;
use kg_stores::graph::{FulltextIndexState, GraphStore, Params, Rows, fulltext_terms};
use serde_json::Value;

use crate::bm25;
use crate::error::{Result, RetrievalError};
use crate::fusion::LaneHit;

/// Candidates one lane hands to fusion; top_k is at most 32, the rest feeds total_candidates.
pub(crate) const LANE_POOL: usize = 100;
/// Full-text candidates re-scored by BM25 for the lane's [`LANE_POOL`]: the pool's coarse
/// order (idf-weighted term matches) rarely leaves out a BM25 top hit; on docs-qa 200 and 400
/// candidates rank the same.
pub(crate) const CANDIDATE_POOL: usize = 2 * LANE_POOL;
/// Server-side limit on one lane query.
const LANE_TIMEOUT_MS: u64 = 5_000;
/// A term held by more than this share of the readable chunks is common: it adds to the
/// weight of the chunks a rarer term nominates but does not nominate chunks itself, as in
/// Lucene's CommonTermsQuery. Its postings are most of a query's work (a word in every
/// tenth chunk of 100k has 10,000), and a chunk holding only common terms rarely makes
/// the BM25 top hits when enough chunks hold a rare one. On the 100k-chunk bench, 200
/// queries: the lane's top 8 equal the uncut ones for 98.5%, and its pool query p95 went
/// from 78 to 37 ms. A query of common terms alone first nominates the chunks holding all
/// of them ([`Nomination::tiers`]).
const COMMON_TERM_SHARE: f64 = 0.02;
/// No term is common below this many chunks, so a small namespace is never cut.
const COMMON_TERM_FLOOR: u64 = 1_000;
/// The last nomination tier (every posting of every term) is walked only when the tiers
/// before it nominated fewer chunks than the largest page a search may ask for. What it adds
/// holds no rare term and fewer common ones, so it rarely outranks what they nominated,
/// and beside vector hits fusion weighs it by its small match share. Walking a word held by
/// most chunks (`rs`, in 92% of the 100k bench's) cost 200+ ms. On that bench's 1,000
/// queries the lane's top 8 stayed the same for 999 and fused kg_search's for 992.
const WIDEN_TO_EVERY_POSTING_BELOW: usize = crate::service::TOP_K.1 as usize;
/// The last tier fills the pool from the chunks the tiers before it left out, one query per
/// set of common terms they may hold, when there are at most this many such sets (three
/// common terms); with more it walks every posting grouped.
const MAX_FILL_QUERIES: usize = 8;

/// A retrieval lane by its wire name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Lane {
    Fulltext,
    Vector,
    GraphExpand,
    CoAnnotation,
}

impl Lane {
    pub(crate) const ALL: [Lane; 4] = [
        Lane::Fulltext,
        Lane::Vector,
        Lane::GraphExpand,
        Lane::CoAnnotation,
    ];
    /// co_annotation is opt-in.
    pub(crate) const DEFAULT: [Lane; 3] = [Lane::Fulltext, Lane::Vector, Lane::GraphExpand];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Lane::Fulltext => "fulltext",
            Lane::Vector => "vector",
            Lane::GraphExpand => "graph_expand",
            Lane::CoAnnotation => "co_annotation",
        }
    }

    /// Parses a wire name; the error lists the valid ones.
    pub(crate) fn parse(name: &str) -> Result<Lane> {
        Lane::ALL
            .into_iter()
            .find(|l| l.as_str() == name)
            .ok_or_else(|| {
                let valid: Vec<&str> = Lane::ALL.iter().map(|l| l.as_str()).collect();
                RetrievalError::invalid(format!(
                    "unknown lane `{}`; valid lanes: {}",
                    name.chars().take(64).collect::<String>(),
                    valid.join(", ")
                ))
            })
    }

    /// Whether this release can run the lane.
    pub(crate) fn is_available(self) -> bool {
        matches!(
            self,
            Lane::Fulltext | Lane::Vector | Lane::GraphExpand | Lane::CoAnnotation
        )
    }
}

pub(crate) use crate::filters::LaneFilters;

/// The service's settings the FalkorDB full-text lane reads (and graph_expand, which seeds
/// from it and caches degrees the same way).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LaneSettings {
    /// Query words match and count by their English stem (`[retrieval] fulltext_stemming`).
    pub(crate) stemming: bool,
    /// How long per-scope counts are trusted before they are recounted in the background
    /// (`[retrieval] statistics_ttl_seconds`; [`crate::scope_cache`]).
    pub(crate) statistics_ttl: std::time::Duration,
}

/// Full-text lane: FalkorDB's full-text index on `Chunk.text` and `Chunk.contextHeader`
/// (title › headings) finds the candidates, with the access predicate on the chunk and its
/// FileRef inside the query; they are ranked by Okapi BM25 ([`crate::bm25`]), best first,
/// ties by chunk key.
///
/// RediSearch's score is no BM25 (an OR of terms scores by its best term; no tf saturation
/// or length normalisation), so it only picks the pool: the [`CANDIDATE_POOL`] chunks that
/// hold the most query terms weighted by idf (BM25 without tf and length), its own score
/// breaking ties; common terms nominate only beside a rare one or all together (or all but
/// one), while those fill the pool, and alone only when those do not fill a page
/// ([`COMMON_TERM_SHARE`], [`Nomination::tiers`]).
/// BM25 then re-scores the pool from the chunks' text, every query term counted, each chunk
/// by its best passage ([`bm25::best_passage`]), and the lane keeps its [`LANE_POOL`] best
/// distinct texts with their copies.
pub(crate) async fn fulltext(
    store: &GraphStore,
    namespace: &str,
    access: &AccessFilter,
    query_text: &str,
    filters: &LaneFilters,
    settings: LaneSettings,
) -> Result<Vec<LaneHit>> {
    // Terms hold only word characters: no RediSearch operator can be smuggled in.
    let terms = bm25::query_terms(fulltext_terms(query_text), settings.stemming);
    if terms.is_empty() {
        return Ok(Vec::new());
    }
    let node_predicate = cypher_predicate(access, "node", "path", "acl_node_");
    let file_predicate = cypher_predicate(access, "f", "vfsPath", "acl_f_");
    let stats = bm25::stats(
        store,
        namespace,
        &node_predicate,
        &terms,
        settings.statistics_ttl,
    )
    .await?;
    let idf = stats.idf();

    let mut params = Params::new();
    params.extend(node_predicate.params);
    params.extend(file_predicate.params);
    let folder_clause = filters.where_clauses("node", "f", &mut params);
    let relation = filters.relation_stage("node", "node, i, score", access, &mut params);
    // The chunk's own access predicate decides readability (a Chunk carries the properties
    // it needs, written together with its FileRef's), so the FileRef is matched per posting
    // only when a filter tests it. Otherwise it is matched, and every predicate checked
    // again, for the pool alone: a common term has tens of thousands of postings, and a
    // traversal per posting was half the lane's time at 100k chunks. Postings are grouped
    // by node id, and the text is read only for the pool, for the same reason.
    let file_stage = if filters.needs_file() {
        format!(
            " MATCH (node)-[:PART_OF]->(f:FileRef) WHERE {}{folder_clause}",
            file_predicate.text
        )
    } else {
        folder_clause
    };
    // Every access predicate comes before the first WITH that drops `node`: FalkorDB 4.16
    // evaluates a list predicate (`any(p IN $list WHERE x.path ...)`) over a variable bound
    // after a WITH as false, which would silently hide readable chunks. The re-check after
    // the WITH is over a node matched anew there, and only ever removes rows.
    // A chunk's weight is the sum over the nomination queries it matches. When each chunk
    // matches one query at most, its weight is that query's, and the queries come heaviest
    // first, so no grouping is needed: FalkorDB's grouping costs about 2 µs a posting (64 of
    // the 90 ms a 30,785-posting `mut` took, where the walk itself was 13 ms).
    let pick = |grouped: bool| {
        let order = if grouped {
            "WITH id(node) AS candidate, sum($weights[i]) AS weight, sum(score) AS total \
             ORDER BY weight DESC, total DESC, candidate"
        } else {
            "WITH id(node) AS candidate, i AS heaviest_first, score AS total \
             ORDER BY heaviest_first, total DESC, candidate"
        };
        format!(
            "UNWIND range(0, size($queries) - 1) AS i \
             CALL db.idx.fulltext.queryNodes('Chunk', $queries[i]) YIELD node, score \
             WHERE {node}{file_stage} \
             {relation} \
             {order} \
             LIMIT $pool \
             MATCH (node:Chunk)-[:PART_OF]->(f:FileRef) \
             WHERE id(node) = candidate AND {node} AND {file} \
             RETURN node.chunkKey, node.fileId, node.text, node.contextHeader, node.path, \
                    node.textHash",
            node = node_predicate.text,
            file = file_predicate.text,
        )
    };
    let (grouped, ungrouped) = (pick(true), pick(false));
    let run = |nomination: Nomination, pool: usize| {
        let cypher = if nomination.disjoint {
            &ungrouped
        } else {
            &grouped
        };
        let mut params = params.clone();
        params.insert("queries".into(), Value::from(nomination.queries));
        params.insert("weights".into(), Value::from(nomination.weights));
        params.insert("pool".into(), Value::from(pool as i64));
        async move {
            store
                .fulltext_ro_query(namespace, "Chunk", cypher, &params, LANE_TIMEOUT_MS)
                .await
        }
    };
    // Each tier nominates more candidates than the one before; the first to fill the pool
    // is the pool, and the last is walked only to fill a page. A filling tier nominates
    // only chunks the tier before left out, so its rows follow that tier's.
    let mut rows = Rows::default();
    let tiers = Nomination::tiers(&terms, &idf, &common_terms(&stats));
    let count = tiers.len();
    for (tier, nomination) in tiers.into_iter().enumerate() {
        if nomination.fills {
            let room = CANDIDATE_POOL.saturating_sub(rows.rows.len());
            let more = run(nomination, room).await?;
            rows.rows.extend(more.rows);
        } else {
            rows = run(nomination, CANDIDATE_POOL).await?;
        }
        if rows.rows.len() >= Nomination::enough(tier, count) {
            break;
        }
    }
    if rows.rows.is_empty() {
        missing_index_check(store, namespace, "Chunk").await?;
    }
    let mut hits = rows
        .rows
        .iter()
        .map(|row| {
            let (Some(key), Some(file_id)) = (
                row.first().and_then(Value::as_str),
                row.get(1).and_then(Value::as_str),
            ) else {
                return Err(RetrievalError::UnexpectedReply(format!(
                    "full-text row {:?}",
                    row.get(..2)
                )));
            };
            // The text only scores the chunk here; it never leaves the lane. The header counts
            // as part of the chunk, as in the index.
            let text = row.get(2).and_then(Value::as_str).unwrap_or_default();
            let header = row.get(3).and_then(Value::as_str).unwrap_or_default();
            let (score, tf) = bm25::best_passage(header, text, &terms, &idf, stats.avgdl);
            Ok(LaneHit {
                chunk_key: key.to_owned(),
                file_id: file_id.to_owned(),
                raw_score: score,
                match_share: Some(bm25::match_share(&tf, &idf)),
                path: row
                    .get(4)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                // Hashed here when the chunk was indexed before the stored hash existed, so
                // its copies collapse in this lane too.
                text_hash: Some(
                    row.get(5)
                        .and_then(Value::as_str)
                        .map_or_else(|| text_hash(text), str::to_owned),
                ),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    hits.sort_by(LaneHit::by_score);
    keep_distinct_texts(&mut hits, LANE_POOL);
    Ok(hits)
}

/// Cuts ranked hits after the `pool` best distinct texts, keeping the copies among them:
/// a text pasted into thirty files would otherwise fill a third of the pool, and fusion
/// counts it once anyway when it collapses copies (and lists them from these hits).
pub(crate) fn keep_distinct_texts(hits: &mut Vec<LaneHit>, pool: usize) {
    let end = {
        let mut texts = std::collections::HashSet::new();
        hits.iter()
            .position(|hit| {
                let text = hit.text_identity();
                if texts.contains(text) {
                    return false;
                }
                if texts.len() == pool {
                    return true;
                }
                texts.insert(text);
                false
            })
            .unwrap_or(hits.len())
    };
    hits.truncate(end);
}

/// How many distinct texts the hits hold (a hit without a text hash counts as its own).
pub(crate) fn distinct_texts(hits: &[LaneHit]) -> usize {
    hits.iter()
        .map(LaneHit::text_identity)
        .collect::<std::collections::HashSet<_>>()
        .len()
}

/// Which query terms are common (see [`COMMON_TERM_SHARE`]).
fn common_terms(stats: &bm25::Stats) -> Vec<bool> {
    let cutoff = ((stats.docs as f64 * COMMON_TERM_SHARE) as u64).max(COMMON_TERM_FLOOR);
    stats.df.iter().map(|&df| df > cutoff).collect()
}

/// Full-text queries that nominate pool candidates, each with the weight a chunk it matches
/// earns, so a nominated chunk's weight is the idf of every query term it holds.
#[derive(Debug, Clone, PartialEq)]
struct Nomination {
    queries: Vec<String>,
    weights: Vec<f64>,
    /// Each chunk matches one of the queries at most, and they come heaviest first.
    disjoint: bool,
    /// Nominates only chunks the tier before did not, to add to its candidates.
    fills: bool,
}

impl Nomination {
    /// How many candidates tier `tier` of `tiers` must nominate for the search to stop there:
    /// the pool, except before the last tier, whose postings are walked only to fill a page
    /// ([`WIDEN_TO_EVERY_POSTING_BELOW`]).
    fn enough(tier: usize, tiers: usize) -> usize {
        if tier + 2 == tiers {
            WIDEN_TO_EVERY_POSTING_BELOW
        } else {
            CANDIDATE_POOL
        }
    }

    /// The nominations to try in turn until one nominates [`Nomination::enough`]; each holds
    /// every chunk the one before held, and the last holds every term's postings. Without
    /// common terms that is the only one. Otherwise, first the rare terms' chunks (common
    /// terms only add weight there); then also the chunks holding every common term, the
    /// heaviest of those without a rare one (a query of common terms alone starts here); for
    /// three or more common terms alone, then also the chunks holding all of them but one;
    /// then the rest, which for up to three common terms is a fill ([`Nomination::fill`]):
    /// only the chunks left out, added to the tier before's without grouping. A common term's
    /// postings are tens of thousands of chunks at 100k, and an intersection of them is walked
    /// by skipping, so a query of words like `new from slice` no longer walks them all unless
    /// too few chunks hold them together, or all but one.
    fn tiers(terms: &[bm25::Term], idf: &[f64], common: &[bool]) -> Vec<Nomination> {
        let every_term = Nomination {
            queries: terms.iter().map(bm25::Term::index_query).collect(),
            weights: idf.to_vec(),
            disjoint: terms.len() == 1,
            fills: false,
        };
        if !common.iter().any(|&c| c) {
            return vec![every_term];
        }
        let (mut rare, mut commons) = (Vec::new(), Vec::new());
        for (term, &common) in terms.iter().zip(common) {
            if common {
                commons.push(term.index_query());
            } else {
                rare.push(term.index_query());
            }
        }
        let common_idf: Vec<f64> = idf
            .iter()
            .zip(common)
            .filter(|(_, common)| **common)
            .map(|(w, _)| *w)
            .collect();
        let mut tiers = Vec::with_capacity(3);
        let mut rare_first = Nomination {
            queries: Vec::with_capacity(terms.len() + 1),
            weights: Vec::with_capacity(terms.len() + 1),
            disjoint: false,
            fills: false,
        };
        if !rare.is_empty() {
            let any_rare = format!("({})", rare.join("|"));
            for ((term, &weight), &common) in terms.iter().zip(idf).zip(common) {
                rare_first.queries.push(if common {
                    format!("{any_rare} {}", term.index_query())
                } else {
                    term.index_query()
                });
                rare_first.weights.push(weight);
            }
            tiers.push(rare_first.clone());
        }
        // One common term's chunks are its whole postings list: the last tier.
        if commons.len() >= 2 {
            let mut every_common = rare_first;
            // Chunks that also hold a rare term already earn these weights above.
            let without_rare = if rare.is_empty() {
                String::new()
            } else {
                format!(" -({})", rare.join("|"))
            };
            every_common
                .queries
                .push(format!("{}{without_rare}", commons.join(" ")));
            let all_common: f64 = common_idf.iter().sum();
            every_common.weights.push(all_common);
            every_common.disjoint = rare.is_empty();
            tiers.push(every_common.clone());
            // Common terms alone: a chunk holding all but one of them, and not that one,
            // matches one query here, so the tier needs no grouping; it spares walking
            // their postings when few chunks hold them all.
            if rare.is_empty() && commons.len() >= 3 {
                let mut all_but_one: Vec<(String, f64)> = (0..commons.len())
                    .map(|left_out| {
                        let others: Vec<&str> = commons
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| *i != left_out)
                            .map(|(_, q)| q.as_str())
                            .collect();
                        (
                            format!("{} -({})", others.join(" "), commons[left_out]),
                            all_common - common_idf[left_out],
                        )
                    })
                    .collect();
                all_but_one.sort_by(|a, b| b.1.total_cmp(&a.1));
                let mut coordination = every_common;
                for (query, weight) in all_but_one {
                    coordination.queries.push(query);
                    coordination.weights.push(weight);
                }
                tiers.push(coordination);
            }
        }
        // A single common term alone has one tier: its postings, with nothing to fill.
        let fill = if tiers.is_empty() {
            None
        } else {
            Self::fill(&rare, &commons, &common_idf)
        };
        tiers.push(fill.unwrap_or(every_term));
        tiers
    }

    /// The last tier as a fill: the chunks holding no rare term and a set of common terms
    /// the tiers before did not cover (all of them when there are two or more; all but one
    /// when there are three or more and no rare term), one query per set, so each chunk
    /// matches one query and the sets' weights order it without grouping. None when that
    /// takes more than [`MAX_FILL_QUERIES`] queries.
    fn fill(rare: &[String], commons: &[String], common_idf: &[f64]) -> Option<Nomination> {
        let k = commons.len();
        if k == 0 || k >= usize::BITS as usize {
            return None;
        }
        let covered =
            |size: usize| (size == k && k >= 2) || (size + 1 == k && k >= 3 && rare.is_empty());
        let mut sets: Vec<(String, f64)> = Vec::new();
        for mask in 1usize..(1 << k) {
            let size = mask.count_ones() as usize;
            if covered(size) {
                continue;
            }
            if sets.len() == MAX_FILL_QUERIES {
                return None;
            }
            let (mut held, mut excluded, mut weight) = (Vec::new(), Vec::new(), 0.0);
            for (i, query) in commons.iter().enumerate() {
                if mask & (1 << i) != 0 {
                    held.push(query.as_str());
                    weight += common_idf[i];
                } else {
                    excluded.push(query.as_str());
                }
            }
            excluded.extend(rare.iter().map(String::as_str));
            let query = if excluded.is_empty() {
                held.join(" ")
            } else {
                format!("{} -({})", held.join(" "), excluded.join("|"))
            };
            sets.push((query, weight));
        }
        if sets.is_empty() {
            return None;
        }
        sets.sort_by(|a, b| b.1.total_cmp(&a.1));
        let (queries, weights) = sets.into_iter().unzip();
        Some(Nomination {
            queries,
            weights,
            disjoint: true,
            fills: true,
        })
    }
}

/// Fails with [`RetrievalError::IndexMissing`] when the namespace holds `label` nodes but
/// no full-text index on them, and `Unavailable` while the index is being built (recreated
/// since the search began): FalkorDB answers a query on either with no rows, so an empty
/// result is checked before it is believed. Asked only after an empty result, so a search
/// with hits pays nothing.
pub(crate) async fn missing_index_check(
    store: &GraphStore,
    namespace: &str,
    label: &'static str,
) -> Result<()> {
    match store.fulltext_index_state(namespace, label).await? {
        FulltextIndexState::Ready => Ok(()),
        FulltextIndexState::Missing => Err(RetrievalError::IndexMissing { label }),
        FulltextIndexState::Building => Err(RetrievalError::Store(StoreError::IndexBuilding {
            label: label.to_owned(),
        })),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn lane_names_round_trip_and_unknown_names_list_the_valid_ones() {
        for lane in Lane::ALL {
            assert_eq!(Lane::parse(lane.as_str()).unwrap(), lane);
        }
        let err = Lane::parse("bm25").unwrap_err().to_string();
        assert_eq!(
            err,
            "unknown lane `bm25`; valid lanes: fulltext, vector, graph_expand, co_annotation"
        );
        assert!(!Lane::DEFAULT.contains(&Lane::CoAnnotation));
        assert!(Lane::Fulltext.is_available() && Lane::GraphExpand.is_available());
    }

    #[test]
    fn the_pool_is_cut_after_its_best_distinct_texts_with_their_copies() {
        let hit = |key: &str, text: Option<&str>| LaneHit {
            chunk_key: key.to_owned(),
            file_id: "f".into(),
            raw_score: 1.0,
            match_share: None,
            path: String::new(),
            text_hash: text.map(str::to_owned),
        };
        let mut hits = vec![
            hit("a", Some("x")),
            hit("b", Some("x")),
            hit("c", None),
            hit("d", Some("y")),
            hit("e", Some("x")),
            hit("f", Some("z")),
        ];
        keep_distinct_texts(&mut hits, 3);
        let keys: Vec<&str> = hits.iter().map(|h| h.chunk_key.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c", "d", "e"]);
        keep_distinct_texts(&mut hits, 1);
        assert_eq!(hits.len(), 2);
        keep_distinct_texts(&mut hits, 0);
        assert!(hits.is_empty());
        let hits = vec![hit("a", Some("x")), hit("b", Some("x")), hit("c", None)];
        assert_eq!(distinct_texts(&hits), 2);
    }

    #[test]
    fn common_terms_are_those_in_over_two_percent_and_a_thousand_chunks() {
        let stats = |docs, df: &[u64]| bm25::Stats {
            docs,
            avgdl: 100.0,
            df: df.to_vec(),
        };
        // 2% of 100,000 is 2,000.
        assert_eq!(
            common_terms(&stats(100_000, &[2_000, 2_001, 50])),
            [false, true, false]
        );
        assert_eq!(common_terms(&stats(100_000, &[9_000, 5_000])), [true, true]);
        // A small namespace: never below the floor.
        assert_eq!(common_terms(&stats(1_661, &[1_000, 900])), [false, false]);
        assert_eq!(common_terms(&stats(1_661, &[1_001, 9])), [true, false]);
    }

    #[test]
    fn nomination_tiers_widen_from_rare_terms_to_every_common_term_to_all_postings() {
        let words = |w: &[&str]| w.iter().map(|w| (*w).to_owned()).collect::<Vec<_>>();
        let tiers = |w: &[&str], stemming, idf: &[f64], common: &[bool]| {
            let terms = bm25::query_terms(words(w), stemming);
            Nomination::tiers(&terms, idf, common)
        };
        let queries = |t: &Nomination| t.queries.clone();

        // No common term: one tier, every term alone.
        let t = tiers(&["tokio", "runtime"], true, &[7.0, 2.0], &[false, false]);
        assert_eq!(t.len(), 1);
        assert_eq!(queries(&t[0]), ["tokio", "runtime"]);
        assert_eq!(t[0].weights, [7.0, 2.0]);

        // One common term: beside the rare ones, then its whole postings.
        let t = tiers(
            &["tokio", "runtime", "threads"],
            true,
            &[7.0, 2.0, 3.0],
            &[false, true, false],
        );
        assert_eq!(t.len(), 2);
        assert_eq!(
            queries(&t[0]),
            ["tokio", "(tokio|threads) runtime", "threads"]
        );
        assert_eq!(t[0].weights, [7.0, 2.0, 3.0]);
        // Then it fills: its chunks without a rare term, after the rare terms' chunks.
        assert_eq!(queries(&t[1]), ["runtime -(tokio|threads)"]);
        assert_eq!(t[1].weights, [2.0]);
        assert!(t[1].disjoint && t[1].fills && !t[0].fills);

        // Two common terms and a rare one: the chunks holding both common terms and no rare
        // one join the second tier with both weights (those with the rare term have them).
        let t = tiers(
            &["tokio", "runtime", "threads"],
            false,
            &[7.0, 2.0, 3.0],
            &[true, false, true],
        );
        assert_eq!(t.len(), 3);
        assert_eq!(
            queries(&t[0]),
            [
                "(\"runtime\") \"tokio\"",
                "\"runtime\"",
                "(\"runtime\") \"threads\""
            ]
        );
        assert_eq!(
            queries(&t[1]),
            [
                "(\"runtime\") \"tokio\"",
                "\"runtime\"",
                "(\"runtime\") \"threads\"",
                "\"tokio\" \"threads\" -(\"runtime\")"
            ]
        );
        assert_eq!(t[1].weights, [7.0, 2.0, 3.0, 10.0]);
        // Then the chunks holding one of the two common terms and no rare one, heaviest first.
        assert_eq!(
            queries(&t[2]),
            [
                "\"tokio\" -(\"threads\"|\"runtime\")",
                "\"threads\" -(\"tokio\"|\"runtime\")"
            ]
        );
        assert_eq!(t[2].weights, [7.0, 3.0]);
        assert!(t[2].disjoint && t[2].fills);

        // Only common terms: the chunks holding all of them, then also those holding all but
        // one (each in one query, heaviest first, so no grouping), then every posting.
        let t = tiers(
            &["new", "from", "slice"],
            true,
            &[1.0, 2.0, 3.0],
            &[true; 3],
        );
        assert_eq!(t.len(), 3);
        assert_eq!(queries(&t[0]), ["new from slice"]);
        assert_eq!(t[0].weights, [6.0]);
        assert!(t[0].disjoint);
        assert_eq!(
            queries(&t[1]),
            [
                "new from slice",
                "from slice -(new)",
                "new slice -(from)",
                "new from -(slice)"
            ]
        );
        assert_eq!(t[1].weights, [6.0, 5.0, 4.0, 3.0]);
        assert!(t[1].disjoint);
        assert_eq!(
            queries(&t[2]),
            [
                "slice -(new|from)",
                "from -(new|slice)",
                "new -(from|slice)"
            ]
        );
        assert_eq!(t[2].weights, [3.0, 2.0, 1.0]);
        assert!(t[2].disjoint && t[2].fills);

        // Four common terms alone: the sets left (each term alone, each pair) take ten
        // queries, over the fill's limit, so every posting is walked and grouped.
        let t = tiers(&["a1", "b2", "c3", "d4"], true, &[1.0; 4], &[true; 4]);
        assert_eq!(t.len(), 3);
        assert_eq!(queries(&t[2]), ["a1", "b2", "c3", "d4"]);
        assert!(!t[2].disjoint && !t[2].fills);

        // Two common terms alone: all but one of them is one term's postings, the last tier.
        let t = tiers(&["new", "slice"], true, &[1.0, 3.0], &[true; 2]);
        assert_eq!(t.len(), 2);
        assert_eq!(queries(&t[0]), ["new slice"]);
        assert_eq!(queries(&t[1]), ["slice -(new)", "new -(slice)"]);
        assert!(t[0].disjoint && t[1].disjoint && t[1].fills);

        // One term: its postings, once each.
        let t = tiers(&["new"], true, &[1.0], &[true]);
        assert_eq!(t.len(), 1);
        assert!(t[0].disjoint && !t[0].fills);
    }

    #[test]
    fn every_posting_is_walked_only_when_the_tiers_before_do_not_fill_a_page() {
        // One tier: it is the last, nothing is tried after it.
        assert_eq!(Nomination::enough(0, 1), CANDIDATE_POOL);
        // Rare terms, then every posting: the rare terms' chunks need only fill a page.
        assert_eq!(Nomination::enough(0, 2), 32);
        // Rare terms, every common term, every posting: the intersection is still tried
        // when the rare terms' chunks do not fill the pool.
        assert_eq!(Nomination::enough(0, 3), CANDIDATE_POOL);
        assert_eq!(Nomination::enough(1, 3), 32);
        assert_eq!(
            WIDEN_TO_EVERY_POSTING_BELOW,
            crate::service::TOP_K.1 as usize
        );
    }
}

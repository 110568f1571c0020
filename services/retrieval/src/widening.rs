//! The candidate pool of the two engine lanes (vector, and full-text on the sparse index):
//! the engine applies the caller's access filter and the collections filter itself, the
//! filters its payload cannot answer exactly (folder prefix, document dates, effective
//! window, relation types) are checked in the graph for the candidates, with the access
//! predicate again, so a stale point of a deleted or disabled file never surfaces.
//!
//! When those filters reject most candidates, or (folding copies) copies of a few texts
//! fill the pool, the pool widens in rounds ([`FIRST_POOL`] × [`WIDEN_FACTOR`]ⁿ up to
//! [`MAX_POOL`]) instead of returning fewer hits; [`Widening`] reports the final pool and
//! whether the cap stopped it.

use std::collections::HashSet;

use kg_common::access::cypher_predicate;
use kg_proto::v1::AccessFilter;
use kg_stores::graph::{GraphStore, Params};
use kg_stores::vector::VectorHit;
use serde_json::Value;

use crate::error::Result;
use crate::filters::LaneFilters;
use crate::fusion::LaneHit;
use crate::lanes::{LANE_POOL, distinct_texts, keep_distinct_texts};

/// Candidates asked for in the first round when the graph checks a filter.
pub(crate) const FIRST_POOL: usize = LANE_POOL;
/// Each widening round multiplies the pool by this.
pub(crate) const WIDEN_FACTOR: usize = 4;
/// The largest pool one search asks the engine for.
pub(crate) const MAX_POOL: usize = 6_400;
/// When copies are folded, a pool holding fewer distinct texts than this (the largest
/// `top_k`) widens: on npm's docs a question about the `workspace` option found 100 points
/// holding 12 texts, the option's description pasted into dozens of command pages.
pub(crate) const MIN_DISTINCT_TEXTS: usize = 32;
/// Server-side limit on the graph check of one round.
const CHECK_TIMEOUT_MS: u64 = 5_000;

/// How far a lane widened its candidate pool (reported in `trace.vectorWidening`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Widening {
    /// The pool of the last round.
    pub(crate) pool: usize,
    /// Rounds run (1 = no widening).
    pub(crate) rounds: u32,
    /// The last round hit [`MAX_POOL`] and still kept fewer than wanted.
    pub(crate) cap_reached: bool,
}

/// One engine lane's search over its pool: who asks, what for, and how much.
pub(crate) struct PoolSearch<'a> {
    pub(crate) graph: &'a GraphStore,
    pub(crate) namespace: &'a str,
    pub(crate) access: &'a AccessFilter,
    pub(crate) filters: &'a LaneFilters,
    /// Hits wanted; with `collapse`, distinct texts wanted (with their copies).
    pub(crate) want: usize,
    /// Whether fusion folds copies of a text, so copies do not count toward `want`.
    pub(crate) collapse: bool,
}

impl PoolSearch<'_> {
    /// Runs `engine(pool)` (the engine's best `pool` points, best first, the access and
    /// collections filters applied inside it) in widening rounds until enough of its points
    /// are admitted, the engine has no more, or the pool reaches [`MAX_POOL`].
    pub(crate) async fn run<E, F>(&self, mut engine: E) -> Result<(Vec<LaneHit>, Widening)>
    where
        E: FnMut(usize) -> F,
        F: Future<Output = Result<Vec<VectorHit>>>,
    {
        let post_filtered = needs_graph_check(self.filters);
        let mut pool = if post_filtered {
            FIRST_POOL.max(self.want)
        } else {
            self.want
        };
        let mut rounds = 0;
        loop {
            rounds += 1;
            let points = engine(pool).await?;
            let engine_exhausted = points.len() < pool;
            let mut candidates: Vec<LaneHit> = points.into_iter().filter_map(lane_hit).collect();
            // The engine orders equal scores (copies of a text) by point id.
            candidates.sort_by(LaneHit::by_score);
            let mut kept = if post_filtered {
                let admitted = admitted_keys(
                    self.graph,
                    self.namespace,
                    self.access,
                    self.filters,
                    &candidates,
                )
                .await?;
                candidates
                    .into_iter()
                    .filter(|hit| admitted.contains(&hit.chunk_key))
                    .collect()
            } else {
                candidates
            };
            let enough = kept.len() >= self.want
                && (!self.collapse || distinct_texts(&kept) >= self.want.min(MIN_DISTINCT_TEXTS));
            if enough || engine_exhausted || pool >= MAX_POOL {
                let widening = Widening {
                    pool,
                    rounds,
                    cap_reached: !enough && !engine_exhausted && pool >= MAX_POOL,
                };
                if self.collapse {
                    keep_distinct_texts(&mut kept, self.want);
                } else {
                    kept.truncate(self.want);
                }
                return Ok((kept, widening));
            }
            pool = (pool * WIDEN_FACTOR).min(MAX_POOL);
        }
    }
}

/// A chunk point as a lane hit; file points (no chunk key) are not chunks.
fn lane_hit(point: VectorHit) -> Option<LaneHit> {
    let chunk_key = point.chunk_key?;
    Some(LaneHit {
        chunk_key,
        file_id: point.file_id,
        raw_score: f64::from(point.score),
        match_share: None,
        path: point.path,
        text_hash: point.text_hash,
    })
}

/// Whether a filter needs the graph: the payload carries collections exactly, the rest not.
pub(crate) fn needs_graph_check(filters: &LaneFilters) -> bool {
    !filters.folder_prefix.is_empty()
        || filters.date_from.is_some()
        || filters.date_to.is_some()
        || filters.effective_at.is_some()
        || !filters.relation_type_ids.is_empty()
}

/// The candidates whose chunk and file the caller may read and the filters admit.
pub(crate) async fn admitted_keys(
    graph: &GraphStore,
    namespace: &str,
    access: &AccessFilter,
    filters: &LaneFilters,
    candidates: &[LaneHit],
) -> Result<HashSet<String>> {
    if candidates.is_empty() {
        return Ok(HashSet::new());
    }
    let mut params = Params::new();
    let chunk = cypher_predicate(access, "c", "path", "acl_c_");
    let file = cypher_predicate(access, "f", "vfsPath", "acl_f_");
    params.extend(chunk.params);
    params.extend(file.params);
    params.insert(
        "keys".into(),
        Value::Array(
            candidates
                .iter()
                .map(|h| Value::from(h.chunk_key.as_str()))
                .collect(),
        ),
    );
    let clauses = filters.where_clauses("c", "f", &mut params);
    let relation = filters.relation_stage("c", "c", access, &mut params);
    // Access predicates before the first WITH (see kg_common::access on FalkorDB 4.16).
    let cypher = format!(
        "UNWIND $keys AS key \
         MATCH (c:Chunk {{chunkKey: key}}) WHERE {chunk} \
         MATCH (c)-[:PART_OF]->(f:FileRef) WHERE {file}{clauses} \
         {relation} \
         RETURN c.chunkKey",
        chunk = chunk.text,
        file = file.text,
    );
    let rows = graph
        .ro_query(namespace, &cypher, &params, CHECK_TIMEOUT_MS)
        .await?;
    Ok(rows
        .rows
        .iter()
        .filter_map(|row| row.first().and_then(Value::as_str).map(str::to_owned))
        .collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn only_filters_the_payload_cannot_answer_need_the_graph() {
        let mut filters = LaneFilters::default();
        assert!(!needs_graph_check(&filters));
        filters.collections = vec!["policies".into()];
        assert!(!needs_graph_check(&filters));
        filters.effective_at = Some("2026-01-01".into());
        assert!(needs_graph_check(&filters));
    }

    #[test]
    fn the_pool_cap_is_a_power_of_the_widening_factor_times_the_first_pool() {
        let mut pool = FIRST_POOL;
        while pool < MAX_POOL {
            pool *= WIDEN_FACTOR;
        }
        assert_eq!(pool, MAX_POOL, "rounds land exactly on the cap");
    }

    #[test]
    fn file_points_are_not_lane_hits() {
        let point = |chunk_key: Option<&str>| VectorHit {
            chunk_key: chunk_key.map(str::to_owned),
            file_id: "f1".into(),
            path: "/a.md".into(),
            score: 0.5,
            text_hash: Some("h".into()),
        };
        assert!(lane_hit(point(None)).is_none());
        let hit = lane_hit(point(Some("f1~0"))).unwrap();
        assert_eq!(
            (hit.chunk_key.as_str(), hit.path.as_str(), hit.raw_score),
            ("f1~0", "/a.md", 0.5)
        );
    }
}

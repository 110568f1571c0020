//! The retrieval lanes: their names, and the ones built so far (full-text).

use kg_common::access::cypher_predicate;
use kg_proto::v1::AccessFilter;
use kg_stores::graph::{GraphStore, Params, fulltext_query};
use serde_json::Value;

use crate::error::{Result, RetrievalError};
use crate::fusion::LaneHit;

/// Candidates one lane hands to fusion; top_k is at most 32, the rest feeds total_candidates.
pub(crate) const LANE_POOL: usize = 100;
/// Server-side limit on one lane query.
const LANE_TIMEOUT_MS: u64 = 5_000;

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

/// Full-text lane: FalkorDB's full-text index on `Chunk.text`, the access predicate on the
/// chunk and its FileRef inside the query, best first.
///
/// Each query term is looked up on its own and a chunk's relevance is the sum of its term
/// scores times the share of query terms it contains (the classic coordination factor).
/// RediSearch scores an OR of terms by its best single term, which ranks a short chunk
/// holding one query word above the chunk that holds all of them.
pub(crate) async fn fulltext(
    store: &GraphStore,
    namespace: &str,
    access: &AccessFilter,
    query_text: &str,
    filters: &LaneFilters,
) -> Result<Vec<LaneHit>> {
    // Terms hold only word characters: no RediSearch operator can be smuggled in.
    let Some(terms) = fulltext_query(query_text) else {
        return Ok(Vec::new());
    };
    let terms: Vec<Value> = terms.split('|').map(Value::from).collect();
    let mut params = Params::new();
    let node_predicate = cypher_predicate(access, "node", "path", "acl_node_");
    let file_predicate = cypher_predicate(access, "f", "vfsPath", "acl_f_");
    params.extend(node_predicate.params);
    params.extend(file_predicate.params);
    params.insert("termCount".into(), Value::from(terms.len() as f64));
    params.insert("terms".into(), Value::Array(terms));
    params.insert("pool".into(), Value::from(LANE_POOL as i64));
    let folder_clause = filters.where_clauses("node", "f", &mut params);
    let relation = filters.relation_stage("node", "node, term, score", access, &mut params);
    // Every access predicate comes before the first WITH: FalkorDB 4.16 evaluates a list
    // predicate (`any(p IN $list WHERE x.path ...)`) over a variable bound after a WITH as
    // false, which would silently hide readable chunks.
    let cypher = format!(
        "UNWIND $terms AS term \
         CALL db.idx.fulltext.queryNodes('Chunk', term) YIELD node, score \
         WHERE {node} \
         MATCH (node)-[:PART_OF]->(f:FileRef) WHERE {file}{folder_clause} \
         {relation} \
         WITH node, count(DISTINCT term) AS matched, sum(score) AS total \
         WITH node, total * matched / $termCount AS relevance \
         RETURN node.chunkKey, node.fileId, relevance \
         ORDER BY relevance DESC, node.chunkKey \
         LIMIT $pool",
        node = node_predicate.text,
        file = file_predicate.text,
    );
    let rows = store
        .ro_query(namespace, &cypher, &params, LANE_TIMEOUT_MS)
        .await?;
    rows.rows
        .iter()
        .map(|row| {
            let (Some(key), Some(file_id), Some(score)) = (
                row.first().and_then(Value::as_str),
                row.get(1).and_then(Value::as_str),
                row.get(2).and_then(Value::as_f64),
            ) else {
                return Err(RetrievalError::UnexpectedReply(format!(
                    "full-text row {row:?}"
                )));
            };
            Ok(LaneHit {
                chunk_key: key.to_owned(),
                file_id: file_id.to_owned(),
                raw_score: score,
            })
        })
        .collect()
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
}

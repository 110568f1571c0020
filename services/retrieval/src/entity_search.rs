//! EntitySearch: named-entity entry by text and/or vector similarity over names and aliases.
//!
//! The request's `mode` picks the sides: `text`, `vector` or `hybrid` (both, fused); empty
//! means hybrid when the deployment has embeddings, else text. The response names the mode
//! that produced the hits and reports each side asked for: a hybrid search whose vector side
//! fails answers from text and says so (mode `text`), and the other way round; a single-side
//! search whose side fails fails the call, so an outage never reads as "no entity".
//!
//! Text candidates come from the full-text index on `Entity` name and `aliasText`; each query
//! term is looked up on its own and scored like the full-text lane (sum of term scores times
//! the share of terms matched). The index ranks every match, readable or not, so it is read a
//! page at a time until enough readable ones are found. When the deployment has embeddings,
//! vector candidates join them: the query's nearest readable chunks (the vector lane, access
//! filter inside the engine) name at most [`VECTOR_ENTITIES`] entities, whose name and
//! aliases are embedded at query time; each ranks by the mean of its name's cosine to the
//! query and its nearest mentioning chunk's. Embedding a bounded set per query needs no
//! entity index to keep in step with the TBox and works on any namespace already indexed;
//! its cost is one embedder batch of short strings, cached per process (the same names come
//! back on every call) and never batched with the query: the embedder pads a batch to its
//! longest text, and a long query in a batch of names multiplies its cost. The query vector
//! is the one the vector lane searched with. The two ranked lists fuse by reciprocal
//! rank. Either way an entity whose normalised name or alias equals the whole query gets
//! [`EXACT_BONUS`]. Only entities that a chunk the caller may read mentions are
//! returned, so a search never reveals an entity known only from unreadable files. `degree`
//! counts those readable chunks and sets the role (see [`crate::roles`]); the evidence is the
//! first readable mentioning chunks in file and chunk order.

use std::collections::HashMap;

use kg_common::access::{cypher_predicate, validate_namespace};
use kg_common::caller::access_for;
use kg_proto::v1::entity_search_response::Side;
use kg_proto::v1::{
    AccessFilter, CallerContext, EntityHit, EntitySearchRequest, EntitySearchResponse,
};
use kg_stores::graph::{GraphStore, Params, fulltext_query};
use serde_json::Value;

use crate::deadline::LaneDeadline;
use crate::error::{Result, RetrievalError};
use crate::filters::LaneFilters;
use crate::graph_expand::strings;
use crate::lanes::missing_index_check;
use crate::roles::{Role, degrees};
use crate::service::LANE_UNAVAILABLE;
use crate::vector_lane::VectorLane;

/// Default and hard maximum of hits.
pub const LIMIT: (u32, u32) = (8, 32);
/// Default and hard maximum of evidence chunk keys per hit.
pub const EVIDENCE: (u32, u32) = (3, 8);
/// Added to the score of an entity whose name or alias is exactly the query.
const EXACT_BONUS: f64 = 10.0;
/// Candidates read from the index per round before the readable ones are kept.
const CANDIDATES: usize = 200;
/// Most rounds of text candidates: a caller who may read few of the matches still finds
/// readable ones ranked below the first page of unreadable ones, up to 1,000 matches deep.
const TEXT_ROUNDS: usize = 5;
/// Longest query text accepted, in characters.
const MAX_TEXT_CHARS: usize = 512;
/// Server-side limit on one query.
const TIMEOUT_MS: u64 = 5_000;
/// Nearest readable chunks whose entities become vector candidates.
const VECTOR_CHUNKS: usize = 32;
/// Most entities embedded per query (those of the nearest chunks first).
pub const VECTOR_ENTITIES: usize = 64;
/// The rank constant of the fusion of the text and vector lists (as kg_search's default).
const RRF_K: f64 = 60.0;

/// Which sides an entity search runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Full-text over names and aliases only; never calls the embedder.
    Text,
    /// Entities of the nearest readable chunks, ranked by embedding similarity only.
    Vector,
    /// Both, fused by reciprocal rank.
    Hybrid,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Text, Mode::Vector, Mode::Hybrid];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Mode::Text => "text",
            Mode::Vector => "vector",
            Mode::Hybrid => "hybrid",
        }
    }

    /// The requested mode: empty picks hybrid with embeddings, text without; vector
    /// without embeddings fails with a pointer to text.
    pub(crate) fn parse(value: &str, has_vectors: bool) -> Result<Mode> {
        let value = value.trim();
        if value.is_empty() {
            return Ok(if has_vectors {
                Mode::Hybrid
            } else {
                Mode::Text
            });
        }
        let Some(mode) = Mode::ALL.into_iter().find(|m| m.as_str() == value) else {
            let valid: Vec<&str> = Mode::ALL.iter().map(|m| m.as_str()).collect();
            return Err(RetrievalError::invalid(format!(
                "unknown mode `{}`; valid modes: {}",
                value.chars().take(64).collect::<String>(),
                valid.join(", ")
            )));
        };
        if mode == Mode::Vector && !has_vectors {
            return Err(RetrievalError::FailedPrecondition(
                "mode vector needs embeddings, and embeddings are not configured in this \
                 deployment; use mode text"
                    .into(),
            ));
        }
        Ok(mode)
    }
}

struct Candidate {
    key: String,
    name: String,
    type_id: String,
    labels: Vec<String>,
    score: f64,
    /// The normalised name or an alias equals the whole query.
    exact: bool,
}

/// Runs an entity search for a verified caller.
pub(crate) async fn entity_search(
    store: &GraphStore,
    vectors: Option<&VectorLane>,
    caller: &CallerContext,
    request: EntitySearchRequest,
    deadline: LaneDeadline,
) -> Result<EntitySearchResponse> {
    validate_namespace(&request.namespace)?;
    let access = access_for(caller, &request.namespace)?;
    let text = request.text.trim();
    if text.is_empty() {
        return Err(RetrievalError::invalid("text is empty"));
    }
    if text.chars().count() > MAX_TEXT_CHARS {
        return Err(RetrievalError::invalid(format!(
            "text is longer than {MAX_TEXT_CHARS} characters"
        )));
    }
    let limit = cap("limit", request.limit, LIMIT)?;
    let evidence = cap("evidence_limit", request.evidence_limit, EVIDENCE)?;
    let requested = Mode::parse(&request.mode, vectors.is_some())?;
    let ns = request.namespace.as_str();

    let mut sides = Vec::with_capacity(2);
    let mut first_failure = None;
    let by_text = if requested == Mode::Vector {
        None
    } else {
        match deadline
            .run(readable_text_candidates(store, ns, access, text, limit))
            .await
        {
            Ok((found, degrees)) => {
                sides.push(side_ok("text", found.len()));
                Some((found, degrees))
            }
            Err(err) if requested == Mode::Text => return Err(err),
            Err(err) => {
                tracing::warn!(namespace = ns, error = %err.detail(), "entity search: text side failed");
                sides.push(side_failed("text", &err));
                first_failure = Some(err);
                None
            }
        }
    };
    let by_vector = match (requested, vectors) {
        (Mode::Text, _) => None,
        // Hybrid asked for explicitly on a deployment without embeddings: text answers.
        (_, None) => {
            sides.push(Side {
                side: "vector".into(),
                ok: false,
                error_code: LANE_UNAVAILABLE.into(),
                message: "embeddings are not configured in this deployment".into(),
                candidates: 0,
            });
            None
        }
        (_, Some(lane)) => match deadline
            .run(vector_candidates(store, lane, ns, access, text))
            .await
        {
            Ok(found) => {
                sides.push(side_ok("vector", found.len()));
                Some(found)
            }
            Err(err) if requested == Mode::Vector => return Err(err),
            Err(err) => {
                tracing::warn!(namespace = ns, error = %err.detail(), "entity search: vector side failed");
                sides.push(side_failed("vector", &err));
                first_failure.get_or_insert(err);
                None
            }
        },
    };
    let (by_text, mut degree) = by_text.map_or((None, HashMap::new()), |(t, d)| (Some(t), d));
    let (mode, mut candidates) = match (by_text, by_vector) {
        (Some(t), Some(v)) => (Mode::Hybrid, fuse(t, v)),
        (Some(t), None) => (Mode::Text, t),
        (None, Some(v)) => (Mode::Vector, v),
        (None, None) => {
            return Err(first_failure.unwrap_or_else(|| {
                RetrievalError::UnexpectedReply("entity search ran no side".into())
            }));
        }
    };
    // The text side counted its candidates' degrees already; count the vector side's rest.
    let uncounted: Vec<String> = candidates
        .iter()
        .filter(|c| !degree.contains_key(&c.key))
        .map(|c| c.key.clone())
        .collect();
    if !uncounted.is_empty() {
        degree.extend(degrees(store, ns, access, &uncounted).await?);
    }
    // No readable mention, no hit: the degree map only holds readable entities.
    candidates.retain(|c| degree.contains_key(&c.key));
    candidates.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| degree[&b.key].cmp(&degree[&a.key]))
            .then_with(|| a.key.cmp(&b.key))
    });
    let total_candidates = candidates.len() as u64;
    candidates.truncate(limit);
    let keys: Vec<String> = candidates.iter().map(|c| c.key.clone()).collect();
    let mut chunks = evidence_chunks(store, ns, access, &keys, evidence).await?;
    let hits = candidates
        .into_iter()
        .map(|c| {
            let degree = degree[&c.key];
            let evidence_chunk_keys = chunks.remove(&c.key).unwrap_or_default();
            EntityHit {
                evidence_truncated: (evidence_chunk_keys.len() as u64) < degree,
                evidence_chunk_keys,
                entity_key: c.key,
                name: c.name,
                type_label: c.labels.first().cloned().unwrap_or_default(),
                type_labels: c.labels,
                type_id: c.type_id,
                degree,
                role: Role::of(degree).as_str().to_owned(),
                score: c.score,
            }
        })
        .collect();
    Ok(EntitySearchResponse {
        hits,
        mode: mode.as_str().to_owned(),
        sides,
        total_candidates,
    })
}

fn side_ok(side: &str, candidates: usize) -> Side {
    Side {
        side: side.to_owned(),
        ok: true,
        error_code: String::new(),
        message: String::new(),
        candidates: u32::try_from(candidates).unwrap_or(u32::MAX),
    }
}

/// A failed side: a missing index says what to do; any other failure only its code.
fn side_failed(side: &str, err: &RetrievalError) -> Side {
    let message = err.trace_message(&format!("the {side} side"));
    Side {
        side: side.to_owned(),
        ok: false,
        error_code: err.trace_code().to_owned(),
        message,
        candidates: 0,
    }
}

fn cap(field: &str, value: u32, (default, max): (u32, u32)) -> Result<usize> {
    match value {
        0 => Ok(default as usize),
        v if v > max => Err(RetrievalError::invalid(format!(
            "{field} = {v} is over its hard maximum of {max}"
        ))),
        v => Ok(v as usize),
    }
}

fn norm(text: &str) -> String {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Text candidates with a mention the caller may read, best first, and their degrees. The
/// index ranks every match whoever asks, so it is read a page of [`CANDIDATES`] at a time,
/// keeping the readable ones, until `limit` of them are found, a page comes back short (no
/// more matches), or [`TEXT_ROUNDS`] pages were read.
async fn readable_text_candidates(
    store: &GraphStore,
    ns: &str,
    access: &AccessFilter,
    text: &str,
    limit: usize,
) -> Result<(Vec<Candidate>, HashMap<String, u64>)> {
    let mut found = Vec::new();
    let mut degree = HashMap::new();
    for round in 0..TEXT_ROUNDS {
        let page = candidates(store, ns, text, round * CANDIDATES).await?;
        let full = page.len() == CANDIDATES;
        let keys: Vec<String> = page.iter().map(|c| c.key.clone()).collect();
        let readable = if keys.is_empty() {
            HashMap::new()
        } else {
            degrees(store, ns, access, &keys).await?
        };
        found.extend(page.into_iter().filter(|c| readable.contains_key(&c.key)));
        degree.extend(readable);
        if !full || found.len() >= limit {
            break;
        }
    }
    Ok((found, degree))
}

/// One page of entities matching `text` in the name and alias index, best first, whoever
/// may read them (the caller's access is applied by [`readable_text_candidates`]).
async fn candidates(
    store: &GraphStore,
    ns: &str,
    text: &str,
    skip: usize,
) -> Result<Vec<Candidate>> {
    let Some(terms) = fulltext_query(text) else {
        return Ok(Vec::new());
    };
    let terms: Vec<Value> = terms.split('|').map(Value::from).collect();
    let mut params = Params::new();
    params.insert("termCount".into(), Value::from(terms.len() as f64));
    params.insert("terms".into(), Value::Array(terms));
    params.insert("limit".into(), Value::from(CANDIDATES as i64));
    params.insert("skip".into(), Value::from(skip as i64));
    let rows = store
        .fulltext_ro_query(
            ns,
            "Entity",
            "UNWIND $terms AS term \
             CALL db.idx.fulltext.queryNodes('Entity', term) YIELD node, score \
             WITH node, count(DISTINCT term) AS matched, sum(score) AS total \
             WITH node, total * matched / $termCount AS relevance \
             ORDER BY relevance DESC, node.entityKey SKIP $skip LIMIT $limit \
             OPTIONAL MATCH (node)-[:INSTANCE_OF]->(t:EntityType) \
             RETURN node.entityKey, node.name, node.typeId, node.aliases, relevance, \
                    collect(DISTINCT t.label)",
            &params,
            TIMEOUT_MS,
        )
        .await?;
    if rows.rows.is_empty() && skip == 0 {
        missing_index_check(store, ns, "Entity").await?;
    }
    let wanted = norm(text);
    rows.rows
        .iter()
        .map(|row| {
            let (Some(key), Some(name), Some(relevance)) = (
                row.first().and_then(Value::as_str),
                row.get(1).and_then(Value::as_str),
                row.get(4).and_then(Value::as_f64),
            ) else {
                return Err(RetrievalError::UnexpectedReply(format!(
                    "entity search row {row:?}"
                )));
            };
            let aliases: Vec<&str> = row
                .get(3)
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let exact = norm(name) == wanted || aliases.iter().any(|a| norm(a) == wanted);
            let mut labels: Vec<String> = row
                .get(5)
                .and_then(Value::as_array)
                .map(|l| {
                    l.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            labels.sort();
            Ok(Candidate {
                key: key.to_owned(),
                name: name.to_owned(),
                type_id: row
                    .get(2)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                labels,
                score: relevance + if exact { EXACT_BONUS } else { 0.0 },
                exact,
            })
        })
        .collect()
}

/// Entities mentioned by the readable chunks nearest to `text`, best first by the mean of
/// two cosines to the query: of their embedded name and aliases, and of their nearest
/// mentioning chunk.
async fn vector_candidates(
    store: &GraphStore,
    lane: &VectorLane,
    ns: &str,
    access: &AccessFilter,
    text: &str,
) -> Result<Vec<Candidate>> {
    let query = lane.embed_query(text).await?;
    let (hits, _) = lane
        .search_vector(
            store,
            ns,
            access,
            &query,
            &LaneFilters::default(),
            VECTOR_CHUNKS,
            false,
        )
        .await?;
    if hits.is_empty() {
        return Ok(Vec::new());
    }
    let chunk = cypher_predicate(access, "c", "path", "acl_c_");
    let mut params = Params::new();
    params.extend(chunk.params);
    let chunk_scores: Vec<f64> = hits.iter().map(|h| h.raw_score).collect();
    let keys: Vec<String> = hits.into_iter().map(|h| h.chunk_key).collect();
    params.insert("keys".into(), strings(&keys));
    // The chunk predicate again: a stale point of a deleted or disabled file adds nothing.
    let cypher = format!(
        "UNWIND $keys AS k \
         MATCH (c:Chunk {{chunkKey: k}})-[:MENTIONS]->(e:Entity) WHERE {chunk} \
         OPTIONAL MATCH (e)-[:INSTANCE_OF]->(t:EntityType) \
         RETURN e.entityKey, e.name, e.typeId, e.aliases, collect(DISTINCT t.label), \
                collect(DISTINCT k)",
        chunk = chunk.text,
    );
    let rank: HashMap<&str, usize> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (k.as_str(), i))
        .collect();
    let mut rows = store.ro_query(ns, &cypher, &params, TIMEOUT_MS).await?;
    // The entities of the nearest chunks first, at most VECTOR_ENTITIES of them.
    let nearest = |row: &Vec<Value>| -> usize {
        row.get(5)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter_map(|k| rank.get(k).copied())
            .min()
            .unwrap_or(usize::MAX)
    };
    rows.rows.sort_by_cached_key(|row| {
        (
            nearest(row),
            row.first()
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        )
    });
    rows.rows.truncate(VECTOR_ENTITIES);
    let proximity: Vec<f64> = rows
        .rows
        .iter()
        .map(|row| chunk_scores.get(nearest(row)).copied().unwrap_or(0.0))
        .collect();
    let mut found = Vec::with_capacity(rows.rows.len());
    let mut texts = Vec::with_capacity(rows.rows.len());
    let wanted = norm(text);
    for row in &rows.rows {
        let (Some(key), Some(name)) = (
            row.first().and_then(Value::as_str),
            row.get(1).and_then(Value::as_str),
        ) else {
            return Err(RetrievalError::UnexpectedReply(format!(
                "entity vector candidate row {row:?}"
            )));
        };
        let aliases: Vec<&str> = row
            .get(3)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        texts.push(entity_text(name, &aliases));
        let mut labels: Vec<String> = row
            .get(4)
            .and_then(Value::as_array)
            .map(|l| {
                l.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        labels.sort();
        found.push(Candidate {
            key: key.to_owned(),
            name: name.to_owned(),
            type_id: row
                .get(2)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            labels,
            score: 0.0,
            exact: norm(name) == wanted || aliases.iter().any(|a| norm(a) == wanted),
        });
    }
    if found.is_empty() {
        return Ok(found);
    }
    // One vector per text, in order (embed_cached checks the embedder's count).
    let names = lane.embed_cached(texts).await?;
    // Half how close the name is to the query, half how close its nearest mentioning chunk
    // is: a name alone says little ("Orion"), the chunk alone does not tell its entities apart.
    for ((candidate, vector), chunk) in found.iter_mut().zip(&names).zip(proximity) {
        candidate.score = (f64::from(kg_embed::cosine(&query, vector)) + chunk) / 2.0;
    }
    found.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.key.cmp(&b.key)));
    Ok(found)
}

/// What an entity is embedded from: its name, then its aliases.
fn entity_text(name: &str, aliases: &[&str]) -> String {
    let mut out = name.to_owned();
    for alias in aliases.iter().filter(|a| !a.is_empty() && **a != name) {
        out.push_str("; ");
        out.push_str(alias);
    }
    out
}

/// Reciprocal-rank fusion of the text list (by text score) and the vector list (best
/// first); an exact name or alias match keeps [`EXACT_BONUS`] on top of its fused score.
fn fuse(mut text: Vec<Candidate>, vector: Vec<Candidate>) -> Vec<Candidate> {
    text.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.key.cmp(&b.key)));
    let mut fused: HashMap<String, Candidate> = HashMap::new();
    let mut order = Vec::new();
    for list in [text, vector] {
        for (rank, mut candidate) in list.into_iter().enumerate() {
            let part = 1.0 / (RRF_K + rank as f64 + 1.0);
            match fused.get_mut(&candidate.key) {
                Some(seen) => {
                    seen.score += part;
                    seen.exact |= candidate.exact;
                }
                None => {
                    candidate.score = part;
                    order.push(candidate.key.clone());
                    fused.insert(candidate.key.clone(), candidate);
                }
            }
        }
    }
    order
        .into_iter()
        .filter_map(|key| fused.remove(&key))
        .map(|mut c| {
            if c.exact {
                c.score += EXACT_BONUS;
            }
            c
        })
        .collect()
}

/// Up to `per_entity` readable mentioning chunks per entity, in file and chunk order.
async fn evidence_chunks(
    store: &GraphStore,
    ns: &str,
    access: &AccessFilter,
    keys: &[String],
    per_entity: usize,
) -> Result<std::collections::HashMap<String, Vec<String>>> {
    if keys.is_empty() {
        return Ok(Default::default());
    }
    let chunk = cypher_predicate(access, "c", "path", "acl_c_");
    let file = cypher_predicate(access, "f", "vfsPath", "acl_f_");
    let mut params = Params::new();
    params.extend(chunk.params);
    params.extend(file.params);
    params.insert("keys".into(), strings(keys));
    params.insert("n".into(), Value::from(per_entity as i64));
    let cypher = format!(
        "UNWIND $keys AS k \
         MATCH (e:Entity {{entityKey: k}}) WITH k, e \
         MATCH (e)<-[:MENTIONS]-(c:Chunk) WHERE {chunk} \
         MATCH (c)-[:PART_OF]->(f:FileRef) WHERE {file} \
         WITH DISTINCT k, c ORDER BY c.path, c.chunkIndex, c.chunkKey \
         WITH k, collect(c.chunkKey) AS cs \
         RETURN k, cs[0..$n]",
        chunk = chunk.text,
        file = file.text,
    );
    let rows = store.ro_query(ns, &cypher, &params, TIMEOUT_MS).await?;
    Ok(rows
        .rows
        .iter()
        .filter_map(|row| {
            let key = row.first().and_then(Value::as_str)?;
            let chunks = row
                .get(1)
                .and_then(Value::as_array)?
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect();
            Some((key.to_owned(), chunks))
        })
        .collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn caps_and_normalisation() {
        assert_eq!(cap("limit", 0, LIMIT).unwrap(), 8);
        assert_eq!(cap("limit", 32, LIMIT).unwrap(), 32);
        assert!(
            cap("evidence_limit", 9, EVIDENCE)
                .unwrap_err()
                .to_string()
                .contains("evidence_limit = 9 is over its hard maximum of 8")
        );
        assert_eq!(norm("  Acme-Corp. "), "acme corp");
    }

    #[test]
    fn modes_parse_with_deployment_defaults() {
        assert_eq!(Mode::parse("", true).unwrap(), Mode::Hybrid);
        assert_eq!(Mode::parse(" ", false).unwrap(), Mode::Text);
        assert_eq!(Mode::parse("text", true).unwrap(), Mode::Text);
        assert_eq!(Mode::parse("vector", true).unwrap(), Mode::Vector);
        assert_eq!(Mode::parse("hybrid", false).unwrap(), Mode::Hybrid);
        let unknown = Mode::parse("fuzzy", true).unwrap_err();
        assert_eq!(
            unknown.to_string(),
            "unknown mode `fuzzy`; valid modes: text, vector, hybrid"
        );
        assert_eq!(
            kg_common::ErrorExt::code(&unknown),
            kg_common::error::ErrorCode::InvalidArgument
        );
        let no_vectors = Mode::parse("vector", false).unwrap_err();
        assert_eq!(
            kg_common::ErrorExt::code(&no_vectors),
            kg_common::error::ErrorCode::FailedPrecondition
        );
        assert!(no_vectors.to_string().contains("use mode text"));
    }
}

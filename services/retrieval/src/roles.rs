//! Entity roles from degree, shared by graph_expand, co_annotation and EntitySearch.
//!
//! `degree` is the number of chunks the caller may read that mention the entity. Fixed
//! thresholds (not shares of the namespace) keep a role stable as a corpus grows and make
//! it the same for every caller with the same view:
//! - `bridge`: 1..=[`BRIDGE_MAX_DEGREE`] chunks. Specific enough that two bridges mentioned
//!   together, or one relation apart, are evidence connecting the question's parts.
//! - `filter`: up to [`FILTER_MAX_DEGREE`]. Common enough to narrow a question (a product,
//!   a team) but a co-mention with it connects little.
//! - `ignore`: more than [`FILTER_MAX_DEGREE`]. Boilerplate-level frequency: expanding from it
//!   floods results, so graph_expand and co_annotation skip it.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use kg_common::access::{CypherPredicate, cypher_predicate};
use kg_proto::v1::AccessFilter;
use kg_stores::graph::{GraphStore, Params};
use serde_json::Value;

use crate::error::{Result, RetrievalError};
use crate::scope_cache::{Lookup, ScopeCache, scope_key};

/// Server-side limit on one degree query.
const DEGREE_TIMEOUT_MS: u64 = 5_000;

/// Highest degree of a `bridge` entity.
pub const BRIDGE_MAX_DEGREE: u64 = 25;
/// Highest degree of a `filter` entity; above it the role is `ignore`.
pub const FILTER_MAX_DEGREE: u64 = 250;

/// The role of an entity by how many readable chunks mention it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Bridge,
    Filter,
    Ignore,
}

impl Role {
    pub(crate) fn of(degree: u64) -> Role {
        if degree <= BRIDGE_MAX_DEGREE {
            Role::Bridge
        } else if degree <= FILTER_MAX_DEGREE {
            Role::Filter
        } else {
            Role::Ignore
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Role::Bridge => "bridge",
            Role::Filter => "filter",
            Role::Ignore => "ignore",
        }
    }
}

/// Highest degree [`seed_role_degrees`] counts to: one past [`FILTER_MAX_DEGREE`], enough to
/// tell every role apart and to know every `bridge` and `filter` degree exactly.
pub(crate) const ROLE_DEGREE_CAP: u64 = FILTER_MAX_DEGREE + 1;

/// Degree of each entity in `keys` for this caller: chunks it may read (access predicate on
/// the chunk and its FileRef) that mention the entity. Entities no readable chunk mentions are
/// absent from the map, so callers can drop them without learning they exist. Walks every
/// mention of every entity: for a degree that is reported (kg_entity_search, the grounding).
pub(crate) async fn degrees(
    store: &GraphStore,
    namespace: &str,
    access: &AccessFilter,
    keys: &[String],
) -> Result<HashMap<String, u64>> {
    Ok(count_degrees(store, namespace, access, keys, None)
        .await?
        .into_iter()
        .collect())
}

/// `[entityKey, degree]` for the entities in `keys` with a readable mention, each degree
/// counted up to `cap` when one is given (the walk stops there) and exactly otherwise.
async fn count_degrees(
    store: &GraphStore,
    namespace: &str,
    access: &AccessFilter,
    keys: &[String],
    cap: Option<u64>,
) -> Result<Vec<(String, u64)>> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let mut params = Params::new();
    params.insert(
        "keys".into(),
        Value::Array(keys.iter().map(|k| Value::from(k.as_str())).collect()),
    );
    let (chunk, file) = mention_predicates(access);
    let readable = readable_mentions(chunk, file, &mut params);
    // The entity is bound on its own (index lookup) before the walk: written as one pattern,
    // FalkorDB plans it from a scan of every Chunk.
    let cypher = match cap {
        None => format!(
            "UNWIND $keys AS k MATCH (e:Entity {{entityKey: k}}) WITH k, e \
             {readable} RETURN k, count(DISTINCT c)"
        ),
        Some(cap) => {
            params.insert("cap".into(), Value::from(cap));
            // The subquery's LIMIT stops each entity's walk at the cap.
            format!(
                "UNWIND $keys AS k MATCH (e:Entity {{entityKey: k}}) WITH e \
                 CALL {{ WITH e {readable} WITH DISTINCT c LIMIT $cap RETURN count(c) AS degree }} \
                 RETURN e.entityKey, degree"
            )
        }
    };
    degree_rows(store, namespace, &cypher, &params).await
}

/// Capped degrees ([`seed_role_degrees`]) by access scope, then by entity key.
static ROLE_DEGREES: LazyLock<ScopeCache<u64>> =
    LazyLock::new(|| ScopeCache::new(MAX_CACHED_SCOPES, MAX_CACHED_ENTITIES));
/// Access scopes whose capped degrees are cached at most.
const MAX_CACHED_SCOPES: usize = 256;
/// Cached capped degrees per access scope at most.
const MAX_CACHED_ENTITIES: usize = 4_096;

/// The entities the readable `seeds` chunks mention, each with its [`degrees`] counted only
/// up to [`ROLE_DEGREE_CAP`] (an `ignore` entity reads `ROLE_DEGREE_CAP`), in entity-key
/// order; entities no readable chunk mentions are left out. What graph_expand needs before it
/// expands: a hub entity (mentioned in thousands of chunks) costs a walk of its first
/// mentions, not of all of them, and the lane drops `ignore` entities and weighs the others
/// by their exact degree. Capped degrees are cached per access scope for a minute, then
/// recounted in the background while the old ones serve ([`crate::scope_cache`]): hubs recur across questions, and their walk of [`ROLE_DEGREE_CAP`]
/// chunks was most of the lane's time at 100k chunks; with every degree cached, the seeds'
/// entities are the only query.
pub(crate) async fn seed_role_degrees(
    store: &GraphStore,
    namespace: &str,
    access: &AccessFilter,
    seeds: &[String],
    ttl: Duration,
) -> Result<Vec<(String, u64)>> {
    if seeds.is_empty() {
        return Ok(Vec::new());
    }
    let entities = seed_entities(store, namespace, access, seeds).await?;
    let (chunk, file) = mention_predicates(access);
    let scope = scope_key(store, namespace, &[&chunk, &file]);
    let cached = ROLE_DEGREES.lookup(&scope, &entities, ttl);
    let keys_where = |wanted: fn(Lookup<u64>) -> bool| -> Vec<String> {
        entities
            .iter()
            .zip(&cached)
            .filter(|(_, degree)| wanted(**degree))
            .map(|(key, _)| key.clone())
            .collect()
    };
    let missing = keys_where(|degree| degree.value().is_none());
    let stale = keys_where(Lookup::needs_refresh);
    let counted = count_degrees(store, namespace, access, &missing, Some(ROLE_DEGREE_CAP)).await?;
    ROLE_DEGREES.put(&scope, &counted, ttl);
    if !stale.is_empty() {
        recount_in_background(
            store.clone(),
            namespace.to_owned(),
            access.clone(),
            scope,
            stale,
            ttl,
        );
    }
    let counted: HashMap<String, u64> = counted.into_iter().collect();
    Ok(entities
        .into_iter()
        .zip(cached)
        .filter_map(|(key, cached)| {
            let degree = cached.value().or_else(|| counted.get(&key).copied())?;
            Some((key, degree))
        })
        .collect())
}

/// Recounts the capped degrees of `entities` in `scope` off the request path and caches
/// them; on failure the stale ones stay until a later search claims them again.
fn recount_in_background(
    store: GraphStore,
    namespace: String,
    access: AccessFilter,
    scope: String,
    entities: Vec<String>,
    ttl: Duration,
) {
    tokio::spawn(async move {
        match count_degrees(
            &store,
            &namespace,
            &access,
            &entities,
            Some(ROLE_DEGREE_CAP),
        )
        .await
        {
            Ok(counted) => ROLE_DEGREES.put(&scope, &counted, ttl),
            Err(err) => {
                tracing::warn!(namespace = %namespace, error = %err.detail(), "role degrees: recount failed");
            }
        }
    });
}

/// The distinct entities the readable `seeds` chunks mention, in entity-key order.
async fn seed_entities(
    store: &GraphStore,
    namespace: &str,
    access: &AccessFilter,
    seeds: &[String],
) -> Result<Vec<String>> {
    let seed = cypher_predicate(access, "s", "path", "acl_s_");
    let mut params = Params::new();
    params.extend(seed.params);
    params.insert(
        "seeds".into(),
        Value::Array(seeds.iter().map(|k| Value::from(k.as_str())).collect()),
    );
    let cypher = format!(
        "MATCH (s:Chunk)-[:MENTIONS]->(e:Entity) WHERE s.chunkKey IN $seeds AND {seed} \
         RETURN DISTINCT e.entityKey AS key ORDER BY key",
        seed = seed.text,
    );
    let rows = store
        .ro_query(namespace, &cypher, &params, DEGREE_TIMEOUT_MS)
        .await?;
    rows.rows
        .iter()
        .map(|row| match row.first().and_then(Value::as_str) {
            Some(key) => Ok(key.to_owned()),
            None => Err(RetrievalError::UnexpectedReply(format!(
                "seed entity row {row:?}"
            ))),
        })
        .collect()
}

/// The access predicates on a mentioning chunk `c` and its file `f`.
fn mention_predicates(access: &AccessFilter) -> (CypherPredicate, CypherPredicate) {
    (
        cypher_predicate(access, "c", "path", "acl_c_"),
        cypher_predicate(access, "f", "vfsPath", "acl_f_"),
    )
}

/// The readable chunks `c` (and their files `f`) that mention the entity bound to `e`, with
/// the access predicates' parameters added to `params`.
fn readable_mentions(chunk: CypherPredicate, file: CypherPredicate, params: &mut Params) -> String {
    params.extend(chunk.params);
    params.extend(file.params);
    format!(
        "MATCH (e)<-[:MENTIONS]-(c:Chunk) WHERE {chunk} \
         MATCH (c)-[:PART_OF]->(f:FileRef) WHERE {file}",
        chunk = chunk.text,
        file = file.text,
    )
}

/// `[entityKey, degree]` rows, those of degree 0 left out.
async fn degree_rows(
    store: &GraphStore,
    namespace: &str,
    cypher: &str,
    params: &Params,
) -> Result<Vec<(String, u64)>> {
    let rows = store
        .ro_query(namespace, cypher, params, DEGREE_TIMEOUT_MS)
        .await?;
    rows.rows
        .iter()
        .map(|row| {
            match (
                row.first().and_then(Value::as_str),
                row.get(1).and_then(Value::as_u64),
            ) {
                (Some(key), Some(degree)) => Ok((key.to_owned(), degree)),
                _ => Err(RetrievalError::UnexpectedReply(format!(
                    "degree row {row:?}"
                ))),
            }
        })
        .filter(|r| !matches!(r, Ok((_, 0))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_are_inclusive() {
        assert_eq!(Role::of(1), Role::Bridge);
        assert_eq!(Role::of(BRIDGE_MAX_DEGREE), Role::Bridge);
        assert_eq!(Role::of(BRIDGE_MAX_DEGREE + 1), Role::Filter);
        assert_eq!(Role::of(FILTER_MAX_DEGREE), Role::Filter);
        assert_eq!(Role::of(FILTER_MAX_DEGREE + 1).as_str(), "ignore");
    }
}

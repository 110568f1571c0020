//! The opt-in co_annotation lane: chunks that mention two entities named in the question.
//!
//! 1. Span linker: the question's words (lowercased, split on anything not alphanumeric)
//!    form n-grams of up to [`MAX_GRAM`] words. Candidates come from the full-text index on
//!    `Entity` name and aliases; a candidate is grounded when its name or one of its aliases,
//!    normalised the same way, equals an n-gram. A phrase inside a longer grounded phrase
//!    yields to it ("key rotation" wins over "key").
//! 2. Degree and role (see [`crate::roles`]) count only chunks the caller may read; an entity
//!    no readable chunk mentions is dropped, so the grounding never reveals it exists.
//! 3. The pair: the two entities of different phrases with role bridge or filter, bridges
//!    first, then lower degree. It must hold at least one bridge: two merely common
//!    entities co-occur by chance and prove nothing.
//! 4. Evidence: `directCount` readable chunks mention both; `bridgeCount` readable chunks
//!    (not direct) mention one of the pair and another entity that a REL stated by a
//!    readable file ties to the other. Hits are the direct chunks, then the bridged ones.
//!
//! Reasons when no hit comes out: `no_grounded_entities` (nothing linked), `too_few_bridges`
//! (fewer than two usable entities, or no bridge among them), `no_evidence` (a pair, but
//! neither direct nor bridged chunks). Filters apply to the evidence queries. When the lane
//! fails, the grounding entry's reason is the lane's trace code (`index_missing` when the
//! namespace holds entities but no full-text index on them).

use std::collections::HashSet;

use kg_common::access::cypher_predicate;
use kg_proto::v1::{AccessFilter, GroundedEntity, Grounding};
use kg_stores::graph::{GraphStore, Params, fulltext_query};
use serde_json::Value;

use crate::error::{Result, RetrievalError};
use crate::filters::LaneFilters;
use crate::fusion::LaneHit;
use crate::graph_expand::{hit, strings};
use crate::lanes::{LANE_POOL, missing_index_check};
use crate::roles::{Role, degrees};

/// Longest question phrase the linker tries, in words.
pub(crate) const MAX_GRAM: usize = 6;
/// Entity candidates read from the full-text index.
const CANDIDATES: usize = 200;
/// Most chunks counted for directCount / bridgeCount.
const MAX_COUNTED: usize = 10_000;
/// Raw lane scores: direct co-mentions rank above bridged chunks.
const DIRECT_SCORE: f64 = 2.0;
const BRIDGE_SCORE: f64 = 1.0;
/// Server-side limit on one query of this lane.
const TIMEOUT_MS: u64 = 5_000;

pub(crate) const NO_GROUNDED_ENTITIES: &str = "no_grounded_entities";
pub(crate) const TOO_FEW_BRIDGES: &str = "too_few_bridges";
pub(crate) const NO_EVIDENCE: &str = "no_evidence";

/// A grounded entity with the question span it came from (word indexes, end exclusive).
#[derive(Debug, Clone)]
struct Linked {
    key: String,
    name: String,
    type_id: String,
    phrase: String,
    span: (usize, usize),
    degree: u64,
    role: Role,
}

/// Runs the lane: its hits and the namespace's grounding report.
pub(crate) async fn co_annotation(
    store: &GraphStore,
    namespace: &str,
    access: &AccessFilter,
    query_text: &str,
    filters: &LaneFilters,
) -> Result<(Vec<LaneHit>, Grounding)> {
    let mut grounding = Grounding {
        namespace: namespace.to_owned(),
        ..Default::default()
    };
    let mut linked = link(store, namespace, query_text).await?;
    let keys: Vec<String> = linked.iter().map(|l| l.key.clone()).collect();
    let degree = degrees(store, namespace, access, &keys).await?;
    linked.retain_mut(|l| match degree.get(&l.key) {
        Some(&d) => {
            l.degree = d;
            l.role = Role::of(d);
            true
        }
        None => false,
    });
    grounding.entities = linked
        .iter()
        .map(|l| GroundedEntity {
            entity_key: l.key.clone(),
            name: l.name.clone(),
            type_id: l.type_id.clone(),
            phrase: l.phrase.clone(),
            degree: l.degree,
            role: l.role.as_str().to_owned(),
        })
        .collect();
    if linked.is_empty() {
        grounding.reason = NO_GROUNDED_ENTITIES.to_owned();
        return Ok((Vec::new(), grounding));
    }
    let Some((a, b)) = choose_pair(&linked) else {
        grounding.reason = TOO_FEW_BRIDGES.to_owned();
        return Ok((Vec::new(), grounding));
    };
    grounding.pair = vec![a.clone(), b.clone()];

    let direct = direct(store, namespace, access, filters, &a, &b).await?;
    let seen: HashSet<&str> = direct.iter().map(|h| h.chunk_key.as_str()).collect();
    let bridged: Vec<LaneHit> = bridged(store, namespace, access, filters, &a, &b)
        .await?
        .into_iter()
        .filter(|h| !seen.contains(h.chunk_key.as_str()))
        .collect();
    grounding.direct_count = direct.len() as u64;
    grounding.bridge_count = bridged.len() as u64;
    if direct.is_empty() && bridged.is_empty() {
        grounding.reason = NO_EVIDENCE.to_owned();
    }
    let mut hits = direct;
    hits.extend(bridged);
    hits.truncate(LANE_POOL);
    Ok((hits, grounding))
}

/// Lowercased alphanumeric words.
fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// A word's singular by Harman's S-stemmer: `-ies` to `-y` (not `-eies`, `-aies`), `-es` to
/// `-e` (not `-aes`, `-ees`, `-oes`), then a final `s` dropped (not `-us`, `-ss`). So a
/// question's "rate limits" reaches the entity "Rate limit", while the linker stays as strict
/// as the names are otherwise: no full stemmer, which would also join "universe" with
/// "university". Words of three letters or fewer stay as they are ("its", "gas").
fn singular(word: &str) -> String {
    if word.chars().count() <= 3 {
        return word.to_owned();
    }
    let ends = |suffixes: &[&str]| suffixes.iter().any(|s| word.ends_with(s));
    if word.ends_with("ies") && !ends(&["eies", "aies"]) {
        return format!("{}y", &word[..word.len() - 3]);
    }
    if word.ends_with("es") && !ends(&["aes", "ees", "oes"]) {
        return word[..word.len() - 1].to_owned();
    }
    if word.ends_with('s') && !ends(&["us", "ss"]) {
        return word[..word.len() - 1].to_owned();
    }
    word.to_owned()
}

/// The form names and question phrases are compared in: words as [`words`] gives them, each
/// made [`singular`].
fn match_form(words: &[String]) -> String {
    words
        .iter()
        .map(|w| singular(w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every n-gram of up to [`MAX_GRAM`] words: (joined words, span).
fn grams(words: &[String]) -> Vec<(String, (usize, usize))> {
    let mut out = Vec::new();
    for start in 0..words.len() {
        for end in start + 1..=(start + MAX_GRAM).min(words.len()) {
            out.push((words[start..end].join(" "), (start, end)));
        }
    }
    out
}

/// Span linker: entities whose name or alias equals a question n-gram, word for word up to a
/// plural ([`singular`]), longest spans kept.
async fn link(store: &GraphStore, namespace: &str, query_text: &str) -> Result<Vec<Linked>> {
    let Some(terms) = fulltext_query(query_text) else {
        return Ok(Vec::new());
    };
    let mut params = Params::new();
    params.insert(
        "terms".into(),
        Value::Array(terms.split('|').map(Value::from).collect()),
    );
    params.insert("limit".into(), Value::from(CANDIDATES as i64));
    let rows = store
        .fulltext_ro_query(
            namespace,
            "Entity",
            "UNWIND $terms AS term \
             CALL db.idx.fulltext.queryNodes('Entity', term) YIELD node \
             WITH DISTINCT node \
             RETURN node.entityKey, node.name, node.typeId, node.aliases \
             ORDER BY node.entityKey LIMIT $limit",
            &params,
            TIMEOUT_MS,
        )
        .await?;
    if rows.rows.is_empty() {
        // No candidate may mean no Entity index rather than no entity by these names.
        missing_index_check(store, namespace, "Entity").await?;
    }
    let question = words(query_text);
    let singulars: Vec<String> = question.iter().map(|w| singular(w)).collect();
    let grams = grams(&singulars);
    let mut linked: Vec<Linked> = Vec::new();
    for row in &rows.rows {
        let (Some(key), Some(name)) = (
            row.first().and_then(Value::as_str),
            row.get(1).and_then(Value::as_str),
        ) else {
            return Err(RetrievalError::UnexpectedReply(format!(
                "entity candidate row {row:?}"
            )));
        };
        let type_id = row.get(2).and_then(Value::as_str).unwrap_or_default();
        let mut forms: Vec<String> = vec![match_form(&words(name))];
        if let Some(aliases) = row.get(3).and_then(Value::as_array) {
            forms.extend(
                aliases
                    .iter()
                    .filter_map(Value::as_str)
                    .map(|a| match_form(&words(a))),
            );
        }
        // The longest question phrase this entity matches.
        let best = grams
            .iter()
            .filter(|(gram, _)| forms.iter().any(|f| !f.is_empty() && f == gram))
            .max_by_key(|(_, (s, e))| (e - s, std::cmp::Reverse(*s)));
        if let Some((_, span)) = best {
            linked.push(Linked {
                key: key.to_owned(),
                name: name.to_owned(),
                type_id: type_id.to_owned(),
                phrase: question[span.0..span.1].join(" "),
                span: *span,
                degree: 0,
                role: Role::Ignore,
            });
        }
    }
    let spans: Vec<(usize, usize)> = linked.iter().map(|l| l.span).collect();
    linked.retain(|l| {
        !spans
            .iter()
            .any(|&(s, e)| s <= l.span.0 && l.span.1 <= e && (e - s) > (l.span.1 - l.span.0))
    });
    linked.sort_by(|x, y| x.span.cmp(&y.span).then_with(|| x.key.cmp(&y.key)));
    Ok(linked)
}

/// The pair of entity keys, or None when no pair with a bridge can be formed.
fn choose_pair(linked: &[Linked]) -> Option<(String, String)> {
    let mut usable: Vec<&Linked> = linked.iter().filter(|l| l.role != Role::Ignore).collect();
    usable.sort_by(|x, y| {
        (x.role != Role::Bridge, x.degree, &x.key).cmp(&(y.role != Role::Bridge, y.degree, &y.key))
    });
    let first = *usable.first()?;
    if first.role != Role::Bridge {
        return None;
    }
    let overlaps = |a: (usize, usize), b: (usize, usize)| a.0 < b.1 && b.0 < a.1;
    let second = usable
        .iter()
        .skip(1)
        .find(|l| l.key != first.key && !overlaps(l.span, first.span))?;
    Some((first.key.clone(), second.key.clone()))
}

fn evidence_params(
    access: &AccessFilter,
    filters: &LaneFilters,
    a: &str,
    b: &str,
) -> (Params, String, String, String, String) {
    let chunk = cypher_predicate(access, "c", "path", "acl_c_");
    let file = cypher_predicate(access, "f", "vfsPath", "acl_f_");
    let mut params = Params::new();
    params.extend(chunk.params);
    params.extend(file.params);
    params.insert("a".into(), Value::from(a));
    params.insert("b".into(), Value::from(b));
    params.insert("max".into(), Value::from(MAX_COUNTED as i64));
    let clauses = filters.where_clauses("c", "f", &mut params);
    let relation = filters.relation_stage("c", "c", access, &mut params);
    (params, chunk.text, file.text, clauses, relation)
}

/// Readable chunks mentioning both `a` and `b`.
async fn direct(
    store: &GraphStore,
    namespace: &str,
    access: &AccessFilter,
    filters: &LaneFilters,
    a: &str,
    b: &str,
) -> Result<Vec<LaneHit>> {
    let (params, chunk, file, clauses, relation) = evidence_params(access, filters, a, b);
    let cypher = format!(
        "MATCH (ea:Entity {{entityKey: $a}}), (eb:Entity {{entityKey: $b}}) WITH ea, eb \
         MATCH (ea)<-[:MENTIONS]-(c:Chunk)-[:MENTIONS]->(eb) \
         WHERE {chunk} \
         MATCH (c)-[:PART_OF]->(f:FileRef) WHERE {file}{clauses} \
         {relation} \
         WITH DISTINCT c \
         RETURN c.chunkKey, c.fileId, {DIRECT_SCORE}, c.path, c.textHash \
         ORDER BY c.path, c.chunkIndex, c.chunkKey LIMIT $max"
    );
    let rows = store
        .ro_query(namespace, &cypher, &params, TIMEOUT_MS)
        .await?;
    rows.rows.iter().map(|r| hit(r, "co_annotation")).collect()
}

/// Readable chunks mentioning one of the pair and an entity in a readable REL with the other.
async fn bridged(
    store: &GraphStore,
    namespace: &str,
    access: &AccessFilter,
    filters: &LaneFilters,
    a: &str,
    b: &str,
) -> Result<Vec<LaneHit>> {
    let (mut params, chunk, file, clauses, relation) = evidence_params(access, filters, a, b);
    let edge = cypher_predicate(access, "r", "path", "acl_r_");
    params.extend(edge.params);
    params.insert(
        "pairs".into(),
        Value::Array(vec![
            strings(&[a.into(), b.into()]),
            strings(&[b.into(), a.into()]),
        ]),
    );
    let cypher = format!(
        "UNWIND $pairs AS p \
         MATCH (ea:Entity {{entityKey: p[0]}}), (eb:Entity {{entityKey: p[1]}}) WITH p, ea, eb \
         MATCH (ea)<-[:MENTIONS]-(c:Chunk)-[:MENTIONS]->(m:Entity)-[r:REL]-(eb) \
         WHERE {chunk} AND {edge} AND m.entityKey <> p[0] AND m.entityKey <> p[1] \
         MATCH (c)-[:PART_OF]->(f:FileRef) WHERE {file}{clauses} \
         {relation} \
         WITH DISTINCT c \
         RETURN c.chunkKey, c.fileId, {BRIDGE_SCORE}, c.path, c.textHash \
         ORDER BY c.path, c.chunkIndex, c.chunkKey LIMIT $max",
        edge = edge.text,
    );
    let rows = store
        .ro_query(namespace, &cypher, &params, TIMEOUT_MS)
        .await?;
    rows.rows.iter().map(|r| hit(r, "co_annotation")).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn plurals_meet_their_singular_and_nothing_else_is_stemmed() {
        for (word, expected) in [
            ("limits", "limit"),
            ("policies", "policy"),
            ("rules", "rule"),
            ("apis", "api"),
            ("kubernetes", "kubernete"),
            // Kept: -us, -ss, -aies, -eies, -aes, -ees, -oes, and short words.
            ("status", "status"),
            ("process", "process"),
            ("its", "its"),
            ("gas", "gas"),
            // Not a plural rule: a full stemmer would take these to "univers".
            ("universe", "universe"),
            ("university", "university"),
        ] {
            assert_eq!(singular(word), expected, "{word}");
        }
        let form = |text: &str| match_form(&words(text));
        assert_eq!(form("Rate limits"), form("rate limit"));
        assert_eq!(form("Access Policies"), form("access policy"));
        assert_ne!(form("universities"), form("universe"));
    }

    fn linked(key: &str, span: (usize, usize), degree: u64) -> Linked {
        Linked {
            key: key.into(),
            name: key.into(),
            type_id: "t".into(),
            phrase: String::new(),
            span,
            degree,
            role: Role::of(degree),
        }
    }

    #[test]
    fn grams_cover_every_phrase_up_to_the_cap() {
        let w = words("Who owns Acme-Corp.?");
        assert_eq!(w, ["who", "owns", "acme", "corp"]);
        let g = grams(&w);
        assert!(g.contains(&("acme corp".to_owned(), (2, 4))));
        assert_eq!(g.len(), 4 + 3 + 2 + 1);
        let long = words("a b c d e f g h");
        assert!(grams(&long).iter().all(|(_, (s, e))| e - s <= MAX_GRAM));
    }

    #[test]
    fn pair_prefers_bridges_and_needs_one() {
        let pair = choose_pair(&[
            linked("common", (0, 1), 100),
            linked("rare", (1, 2), 2),
            linked("rarer", (2, 3), 1),
            linked("noise", (3, 4), 10_000),
        ]);
        assert_eq!(pair, Some(("rarer".into(), "rare".into())));
        // Same phrase twice is no pair; ignore-role entities never pair.
        assert_eq!(
            choose_pair(&[linked("x", (0, 2), 1), linked("y", (1, 2), 1)]),
            None
        );
        assert_eq!(
            choose_pair(&[linked("x", (0, 1), 1), linked("n", (1, 2), 9_999)]),
            None
        );
        // Two filters: no bridge, no pair.
        assert_eq!(
            choose_pair(&[linked("a", (0, 1), 100), linked("b", (1, 2), 100)]),
            None
        );
        // A bridge and a filter pair up.
        assert_eq!(
            choose_pair(&[linked("a", (0, 1), 100), linked("b", (1, 2), 3)]),
            Some(("b".into(), "a".into()))
        );
    }
}

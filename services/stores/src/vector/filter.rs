//! The Qdrant target of the access-filter compiler (the Cypher and SQL targets live in
//! `kg_common::access`). Compiled once into a small backend-neutral [`Clause`], then
//! lowered to qdrant-edge's `Filter` and to qdrant-client's `Filter`, so the two
//! backends cannot drift apart.
//!
//! The rule is `kg_common::access::allows`: a path prefix is a plain string prefix.
//! Qdrant has no prefix match on keywords (qdrant-edge 0.6 at least), so:
//! - a prefix ending in `/` (every folder grant or deny) matches the keyword list
//!   `folderPrefixes`, which holds every ancestor folder of the path (`a/`, `a/b/`).
//!   For a normalised path the prefixes ending in `/` are exactly its ancestor folders,
//!   so this is exact, and it uses the keyword index;
//! - any other prefix (a file path such as `readme.md`, or a partial name such as
//!   `notes/1`) is a text match of `\u{1}` + prefix on `anchoredPath` = `\u{1}` + path.
//!   That field has no full-text index, and without one Qdrant evaluates a text match
//!   as a substring test; the anchor, which no stored path contains, pins the substring
//!   to the start, so the test is exactly "path starts with prefix".
//!
//! The rest: `namespace` must match; `enabled_only` -> `enabled == true`;
//! `visible_only` -> NOT `hidden == true` (a missing flag is visible, like the Cypher
//! `coalesce(hidden, false) = false`); denied prefixes and file ids go to `must_not`;
//! an empty allow list, or a denied prefix "", compiles to a contradiction
//! (`namespace == ns` AND NOT `namespace == ns`) that matches nothing.

use kg_proto::v1::AccessFilter;
use qdrant_client::qdrant as client;
use uuid::Uuid;

use super::{PATH_ANCHOR, Scope, schema};

/// One leaf test on a payload field.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Leaf {
    /// The keyword field (or one element of a keyword list) equals the value.
    Keyword(&'static str, String),
    /// The keyword field (or one element of it) is one of the values.
    KeywordAny(&'static str, Vec<String>),
    /// The bool field equals the value.
    Bool(&'static str, bool),
    /// Qdrant text match on an unindexed field: a substring test.
    Substring(&'static str, String),
}

/// A condition: a leaf, a nested clause, or a test on the point id.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    Leaf(Leaf),
    Clause(Clause),
    /// The point's id is one of these.
    Ids(Vec<Uuid>),
}

/// `must` AND (any of `should`, when not empty) AND NOT any of `must_not`.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Clause {
    pub(crate) must: Vec<Node>,
    pub(crate) should: Vec<Node>,
    pub(crate) must_not: Vec<Node>,
}

/// The path tests for a list of prefixes: folder prefixes grouped into one keyword-any.
fn prefix_nodes(prefixes: &[String]) -> Vec<Node> {
    let folders: Vec<String> = prefixes
        .iter()
        .filter(|p| p.ends_with('/'))
        .cloned()
        .collect();
    let mut nodes = Vec::new();
    if !folders.is_empty() {
        nodes.push(Node::Leaf(Leaf::KeywordAny(
            schema::FOLDER_PREFIXES,
            folders,
        )));
    }
    for prefix in prefixes.iter().filter(|p| !p.ends_with('/')) {
        nodes.push(Node::Leaf(Leaf::Substring(
            schema::ANCHORED_PATH,
            format!("{PATH_ANCHOR}{prefix}"),
        )));
    }
    nodes
}

/// Compiles an access filter into the neutral clause.
pub(crate) fn access_clause(filter: &AccessFilter) -> Clause {
    let namespace = || Node::Leaf(Leaf::Keyword(schema::NAMESPACE, filter.namespace.clone()));
    if filter.allow_prefixes.is_empty() || filter.deny_prefixes.iter().any(String::is_empty) {
        // Nothing is readable: a contradiction on an indexed field.
        return Clause {
            must: vec![namespace()],
            should: Vec::new(),
            must_not: vec![namespace()],
        };
    }
    let mut clause = Clause {
        must: vec![namespace()],
        ..Default::default()
    };
    if filter.enabled_only {
        clause
            .must
            .push(Node::Leaf(Leaf::Bool(schema::ENABLED, true)));
    }
    if filter.visible_only {
        clause
            .must_not
            .push(Node::Leaf(Leaf::Bool(schema::HIDDEN, true)));
    }
    if !filter.allow_prefixes.iter().any(String::is_empty) {
        let mut allowed = prefix_nodes(&filter.allow_prefixes);
        if allowed.len() == 1 {
            clause.must.append(&mut allowed);
        } else {
            // Nested, so a scope added to this clause never mixes into the alternatives.
            clause.must.push(Node::Clause(Clause {
                should: allowed,
                ..Default::default()
            }));
        }
    }
    clause.must_not.extend(prefix_nodes(&filter.deny_prefixes));
    if !filter.deny_file_ids.is_empty() {
        clause.must_not.push(Node::Leaf(Leaf::KeywordAny(
            schema::FILE_ID,
            filter.deny_file_ids.clone(),
        )));
    }
    clause
}

/// The access clause narrowed by a search scope.
pub(crate) fn scoped_clause(filter: &AccessFilter, scope: &Scope) -> Clause {
    let mut clause = access_clause(filter);
    clause.must.push(Node::Leaf(Leaf::Keyword(
        schema::KIND,
        scope.kind().as_str().to_owned(),
    )));
    if !scope.collections.is_empty() {
        clause.must.push(Node::Leaf(Leaf::KeywordAny(
            schema::COLLECTIONS,
            scope.collections.clone(),
        )));
    }
    if !scope.exclude_file_ids.is_empty() {
        clause.must_not.push(Node::Leaf(Leaf::KeywordAny(
            schema::FILE_ID,
            scope.exclude_file_ids.clone(),
        )));
    }
    clause
}

/// The file point of one file, when `filter` admits it: the access clause, `kind = file`
/// and the file id, so reading a file's vector back never bypasses the access filter.
pub(crate) fn file_point_clause(filter: &AccessFilter, file_id: &str) -> Clause {
    let mut clause = access_clause(filter);
    clause.must.push(Node::Leaf(Leaf::Keyword(
        schema::KIND,
        super::PointKind::File.as_str().to_owned(),
    )));
    clause.must.push(Node::Leaf(Leaf::Keyword(
        schema::FILE_ID,
        file_id.to_owned(),
    )));
    clause
}

/// Every point of one kind, in any namespace (moving points between shards).
pub(crate) fn kind_clause(kind: super::PointKind) -> Clause {
    Clause {
        must: vec![Node::Leaf(Leaf::Keyword(
            schema::KIND,
            kind.as_str().to_owned(),
        ))],
        ..Default::default()
    }
}

/// Every point of one file, of any kind.
pub(crate) fn file_clause(namespace: &str, file_id: &str) -> Clause {
    Clause {
        must: vec![
            Node::Leaf(Leaf::Keyword(schema::NAMESPACE, namespace.to_owned())),
            Node::Leaf(Leaf::Keyword(schema::FILE_ID, file_id.to_owned())),
        ],
        ..Default::default()
    }
}

/// The points of one file but `keep`: what an older version left once the new one is
/// written. With nothing to keep, every point of the file.
pub(crate) fn file_points_except(namespace: &str, file_id: &str, keep: &[Uuid]) -> Clause {
    let mut clause = file_clause(namespace, file_id);
    if !keep.is_empty() {
        clause.must_not.push(Node::Ids(keep.to_vec()));
    }
    clause
}

/// The chunk points of one file (no access filter: the indexer's own reads).
pub(crate) fn file_chunks_clause(namespace: &str, file_id: &str) -> Clause {
    let mut clause = file_clause(namespace, file_id);
    clause.must.push(Node::Leaf(Leaf::Keyword(
        schema::KIND,
        super::PointKind::Chunk.as_str().to_owned(),
    )));
    clause
}

/// The chunk points of one namespace written with one of these embed hashes (no access
/// filter: the indexer's own reads).
pub(crate) fn namespace_chunks_by_hash(namespace: &str, hashes: &[String]) -> Clause {
    Clause {
        must: vec![
            Node::Leaf(Leaf::Keyword(schema::NAMESPACE, namespace.to_owned())),
            Node::Leaf(Leaf::Keyword(
                schema::KIND,
                super::PointKind::Chunk.as_str().to_owned(),
            )),
            Node::Leaf(Leaf::KeywordAny(schema::EMBED_HASH, hashes.to_vec())),
        ],
        ..Default::default()
    }
}

/// Every point of one namespace, of any kind.
pub(crate) fn namespace_clause(namespace: &str) -> Clause {
    Clause {
        must: vec![Node::Leaf(Leaf::Keyword(
            schema::NAMESPACE,
            namespace.to_owned(),
        ))],
        ..Default::default()
    }
}

/// Compiles `filter` into a qdrant-edge filter.
pub fn access_filter(filter: &AccessFilter) -> qdrant_edge::Filter {
    to_edge(&access_clause(filter))
}

/// Compiles `filter` into a qdrant-client filter, for a Qdrant server.
pub fn access_filter_server(filter: &AccessFilter) -> client::Filter {
    to_client(&access_clause(filter))
}

pub(crate) fn json_path(key: &'static str) -> qdrant_edge::JsonPath {
    // Our keys are plain identifiers: a path of one key, no parsing needed.
    qdrant_edge::JsonPath {
        first_key: key.to_owned(),
        rest: Vec::new(),
    }
}

fn edge_leaf(leaf: &Leaf) -> qdrant_edge::Condition {
    use qdrant_edge::{FieldCondition, Match, MatchText, MatchValue, ValueVariants};
    let (key, r#match) = match leaf {
        Leaf::Keyword(key, value) => (
            key,
            Match::Value(MatchValue {
                value: ValueVariants::String(value.clone()),
            }),
        ),
        Leaf::KeywordAny(key, values) => (key, Match::from(values.clone())),
        Leaf::Bool(key, value) => (key, Match::from(*value)),
        Leaf::Substring(key, text) => (key, Match::Text(MatchText { text: text.clone() })),
    };
    qdrant_edge::Condition::Field(FieldCondition::new_match(json_path(key), r#match))
}

/// Lowers a clause to qdrant-edge.
pub(crate) fn to_edge(clause: &Clause) -> qdrant_edge::Filter {
    let lower = |nodes: &[Node]| -> Option<Vec<qdrant_edge::Condition>> {
        if nodes.is_empty() {
            return None;
        }
        Some(
            nodes
                .iter()
                .map(|node| match node {
                    Node::Leaf(leaf) => edge_leaf(leaf),
                    Node::Clause(inner) => qdrant_edge::Condition::Filter(to_edge(inner)),
                    Node::Ids(ids) => qdrant_edge::Condition::HasId(
                        ids.iter()
                            .map(|id| qdrant_edge::PointId::Uuid(*id))
                            .collect(),
                    ),
                })
                .collect(),
        )
    };
    qdrant_edge::Filter {
        should: lower(&clause.should),
        min_should: None,
        must: lower(&clause.must),
        must_not: lower(&clause.must_not),
    }
}

fn client_leaf(leaf: &Leaf) -> client::Condition {
    use client::r#match::MatchValue;
    // Built by hand: the client's `From<String>` turns a keyword with a space into a
    // full-text match.
    let (key, value) = match leaf {
        Leaf::Keyword(key, value) => (key, MatchValue::Keyword(value.clone())),
        Leaf::KeywordAny(key, values) => (
            key,
            MatchValue::Keywords(client::RepeatedStrings {
                strings: values.clone(),
            }),
        ),
        Leaf::Bool(key, value) => (key, MatchValue::Boolean(*value)),
        Leaf::Substring(key, text) => (key, MatchValue::Text(text.clone())),
    };
    client::Condition::from(client::FieldCondition {
        key: (*key).to_owned(),
        r#match: Some(client::Match {
            match_value: Some(value),
        }),
        ..Default::default()
    })
}

/// Lowers a clause to qdrant-client.
pub(crate) fn to_client(clause: &Clause) -> client::Filter {
    let lower = |nodes: &[Node]| -> Vec<client::Condition> {
        nodes
            .iter()
            .map(|node| match node {
                Node::Leaf(leaf) => client_leaf(leaf),
                Node::Clause(inner) => client::Condition::from(to_client(inner)),
                Node::Ids(ids) => client::Condition::has_id(
                    ids.iter().map(|id| client::PointId::from(id.to_string())),
                ),
            })
            .collect()
    };
    client::Filter {
        should: lower(&clause.should),
        must: lower(&clause.must),
        must_not: lower(&clause.must_not),
        min_should: None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::vector::PointKind;

    fn filter(allow: &[&str], deny: &[&str], deny_files: &[&str]) -> AccessFilter {
        AccessFilter {
            namespace: "alpha".into(),
            allow_prefixes: allow.iter().map(|s| (*s).to_owned()).collect(),
            deny_prefixes: deny.iter().map(|s| (*s).to_owned()).collect(),
            deny_file_ids: deny_files.iter().map(|s| (*s).to_owned()).collect(),
            enabled_only: true,
            visible_only: true,
            ..Default::default()
        }
    }

    /// A canonical text of an edge filter, to compare with the client lowering.
    fn describe_edge(f: &qdrant_edge::Filter) -> String {
        use qdrant_edge::{AnyVariants, Condition, Match, ValueVariants};
        let list = |c: &Option<Vec<Condition>>| -> String {
            c.iter()
                .flatten()
                .map(|c| match c {
                    Condition::Field(fc) => {
                        let m = match fc.r#match.as_ref().unwrap() {
                            Match::Value(v) => match &v.value {
                                ValueVariants::String(s) => format!("={s:?}"),
                                ValueVariants::Bool(b) => format!("={b}"),
                                ValueVariants::Integer(i) => format!("={i}"),
                            },
                            Match::Any(a) => match &a.any {
                                AnyVariants::Strings(s) => {
                                    format!(" in {:?}", s.iter().collect::<Vec<_>>())
                                }
                                AnyVariants::Integers(_) => "in-int".into(),
                            },
                            Match::Text(t) => format!("~{:?}", t.text),
                            other => format!("{other:?}"),
                        };
                        format!("{}{m}", fc.key)
                    }
                    Condition::Filter(inner) => format!("({})", describe_edge(inner)),
                    Condition::HasId(ids) => {
                        let mut ids: Vec<String> =
                            ids.has_id.iter().map(|id| id.to_string()).collect();
                        ids.sort();
                        format!("id in {ids:?}")
                    }
                    other => format!("{other:?}"),
                })
                .collect::<Vec<_>>()
                .join(",")
        };
        format!(
            "must[{}] should[{}] not[{}]",
            list(&f.must),
            list(&f.should),
            list(&f.must_not)
        )
    }

    fn describe_client(f: &client::Filter) -> String {
        use client::condition::ConditionOneOf;
        use client::r#match::MatchValue;
        let list = |c: &[client::Condition]| -> String {
            c.iter()
                .map(|c| match c.condition_one_of.as_ref().unwrap() {
                    ConditionOneOf::Field(fc) => {
                        let m = match fc.r#match.as_ref().unwrap().match_value.as_ref().unwrap() {
                            MatchValue::Keyword(s) => format!("={s:?}"),
                            MatchValue::Boolean(b) => format!("={b}"),
                            MatchValue::Integer(i) => format!("={i}"),
                            MatchValue::Keywords(k) => format!(" in {:?}", k.strings),
                            MatchValue::Text(t) => format!("~{t:?}"),
                            other => format!("{other:?}"),
                        };
                        format!("{}{m}", fc.key)
                    }
                    ConditionOneOf::Filter(inner) => format!("({})", describe_client(inner)),
                    ConditionOneOf::HasId(ids) => {
                        use client::point_id::PointIdOptions;
                        let mut ids: Vec<String> = ids
                            .has_id
                            .iter()
                            .map(|id| match id.point_id_options.as_ref().unwrap() {
                                PointIdOptions::Uuid(uuid) => uuid.clone(),
                                PointIdOptions::Num(n) => n.to_string(),
                            })
                            .collect();
                        ids.sort();
                        format!("id in {ids:?}")
                    }
                    other => format!("{other:?}"),
                })
                .collect::<Vec<_>>()
                .join(",")
        };
        format!(
            "must[{}] should[{}] not[{}]",
            list(&f.must),
            list(&f.should),
            list(&f.must_not)
        )
    }

    #[test]
    fn both_lowerings_say_the_same() {
        let cases = [
            filter(&[""], &[], &[]),
            filter(&["guides/"], &["guides/secret/"], &["f1"]),
            filter(&["guides/", "notes/", "readme.md"], &["notes/1"], &[]),
            filter(&[], &[], &[]),
            filter(&[""], &[""], &[]),
        ];
        for case in &cases {
            let scope = Scope {
                kind: Some(PointKind::File),
                collections: vec!["hr".into()],
                exclude_file_ids: vec!["self".into()],
            };
            let clause = scoped_clause(case, &scope);
            let edge = describe_edge(&to_edge(&clause));
            assert_eq!(edge, describe_client(&to_client(&clause)), "{case:?}");
            assert!(edge.contains("kind=\"file\""), "{edge}");
        }
        // A replacement's leftovers: the file's points but the ones just written.
        let keep = [
            crate::vector::point_id("alpha", PointKind::Chunk, "k1"),
            crate::vector::point_id("alpha", PointKind::File, "f1"),
        ];
        let stale = file_points_except("alpha", "f1", &keep);
        let text = describe_edge(&to_edge(&stale));
        assert_eq!(text, describe_client(&to_client(&stale)));
        assert!(
            text.starts_with("must[namespace=\"alpha\",fileId=\"f1\"]"),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "not[id in [\"{}\", \"{}\"]]",
                keep[1].min(keep[0]),
                keep[1].max(keep[0])
            )),
            "{text}"
        );
        // The indexer's lookup of stored vectors across the namespace.
        let by_hash = namespace_chunks_by_hash("alpha", &["h1".into(), "h 2".into()]);
        let text = describe_edge(&to_edge(&by_hash));
        assert_eq!(text, describe_client(&to_client(&by_hash)));
        assert_eq!(
            text,
            "must[namespace=\"alpha\",kind=\"chunk\",embedHash in [\"h1\", \"h 2\"]] should[] not[]"
        );
        // Nothing to keep: every point of the file.
        assert_eq!(
            file_points_except("alpha", "f1", &[]),
            file_clause("alpha", "f1")
        );
        // A keyword with a space stays a keyword (the client's From<String> would not).
        let by_file = file_clause("alpha", "f 1");
        let text = describe_client(&to_client(&by_file));
        assert_eq!(text, describe_edge(&to_edge(&by_file)));
        assert!(text.contains("fileId=\"f 1\""), "{text}");
    }

    #[test]
    fn prefixes_compile_to_the_documented_scheme() {
        let text = describe_edge(&access_filter(&filter(
            &["guides/", "notes/", "readme.md"],
            &["guides/secret/", "notes/1"],
            &["f-intro"],
        )));
        assert_eq!(
            text,
            "must[namespace=\"alpha\",enabled=true,(must[] should[folderPrefixes in [\"guides/\", \"notes/\"],anchoredPath~\"\\u{1}readme.md\"] not[])] \
             should[] \
             not[hidden=true,folderPrefixes in [\"guides/secret/\"],anchoredPath~\"\\u{1}notes/1\",fileId in [\"f-intro\"]]"
        );
    }

    #[test]
    fn whole_namespace_has_no_path_test_and_empty_grants_match_nothing() {
        let whole = describe_edge(&access_filter(&filter(&["", "x/"], &[], &[])));
        assert_eq!(
            whole,
            "must[namespace=\"alpha\",enabled=true] should[] not[hidden=true]"
        );
        let nothing = describe_edge(&access_filter(&filter(&[], &[], &[])));
        assert_eq!(
            nothing,
            "must[namespace=\"alpha\"] should[] not[namespace=\"alpha\"]"
        );
        let denied_all = describe_edge(&access_filter(&filter(&[""], &[""], &[])));
        assert_eq!(denied_all, nothing);
    }
}

//! kg_cypher: one read-only openCypher statement, safe by construction.
//!
//! [`core`] parses the statement into a tree, refuses anything outside the read subset (each
//! refusal names its rule and the fix), adds the caller's access predicate to every Chunk,
//! FileRef, OutlineNode and REL edge in the clause that binds it, and prints the tree back.
//! This module runs the printed statement with `GRAPH.RO_QUERY`, one at a time per FalkorDB.

pub mod core;
mod run;

use kg_common::access::cypher_predicate;
use kg_proto::v1::AccessFilter;
use serde_json::Value;

use self::core::ast::{Expr, Literal};
use self::core::parser::parse_expression;
use self::core::{Guard, Target};

pub use run::{QUERY_TIMEOUT_MS, ROW_CAP, TEXT_CAP, turn_wait};

/// Prefix of the access predicate's parameters (inside the reserved `kg_` space).
pub const ACL_PARAM_PREFIX: &str = "kg_acl_";

/// The caller's access filter as a [`Guard`]: the enabled-file check is always on.
#[derive(Debug, Clone)]
pub struct AccessGuard {
    access: AccessFilter,
}

impl AccessGuard {
    /// A guard for `access`, with `enabled_only` forced on.
    pub fn new(access: &AccessFilter) -> Self {
        let mut access = access.clone();
        access.enabled_only = true;
        AccessGuard { access }
    }

    /// The parameters every predicate of this guard reads (shared by all variables).
    pub fn params(&self) -> Vec<(String, Value)> {
        cypher_predicate(&self.access, "n", "path", ACL_PARAM_PREFIX).params
    }
}

impl Guard for AccessGuard {
    fn predicate(&self, var: &str, target: Target) -> Expr {
        let text =
            cypher_predicate(&self.access, var, target.path_property(), ACL_PARAM_PREFIX).text;
        // The compiler's output is in our grammar; if it ever were not, deny everything.
        parse_expression(&text).unwrap_or(Expr::Lit(Literal::Bool(false)))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::core::parser::parse_statement;
    use super::core::printer::print_statement;
    use super::core::{Rule, rewrite, verify};
    use super::*;

    fn guard() -> AccessGuard {
        AccessGuard::new(&AccessFilter {
            namespace: "demo".into(),
            allow_prefixes: vec!["docs/".into(), "shared/".into()],
            deny_prefixes: vec!["docs/hr/".into()],
            deny_file_ids: vec!["f9".into()],
            ..Default::default()
        })
    }

    #[test]
    fn the_guard_is_forced_enabled_and_shares_one_parameter_set() {
        let g = guard();
        let text = rewrite(
            "MATCH (c:Chunk)-[:PART_OF]->(f:FileRef) RETURN c.text LIMIT 5",
            &g,
        )
        .unwrap()
        .text;
        assert_eq!(
            text,
            "MATCH (c:Chunk)-[:PART_OF]->(f:FileRef) WHERE c.enabled = true AND \
             (c.path STARTS WITH $kg_acl_allow_0 OR c.path STARTS WITH $kg_acl_allow_1) AND \
             NOT (c.path STARTS WITH $kg_acl_deny_0) AND c.fileId <> $kg_acl_deny_file_0 AND \
             f.enabled = true AND (f.vfsPath STARTS WITH $kg_acl_allow_0 OR f.vfsPath STARTS WITH $kg_acl_allow_1) AND \
             NOT (f.vfsPath STARTS WITH $kg_acl_deny_0) AND f.fileId <> $kg_acl_deny_file_0 RETURN c.text LIMIT 5"
        );
        let names: Vec<String> = g.params().into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "kg_acl_allow_0",
                "kg_acl_allow_1",
                "kg_acl_deny_0",
                "kg_acl_deny_file_0"
            ]
        );
        verify(&text, &g).unwrap();
    }

    #[test]
    fn no_readable_prefix_matches_nothing() {
        let g = AccessGuard::new(&AccessFilter::default());
        let r = rewrite("MATCH (c:Chunk) RETURN c LIMIT 1", &g).unwrap();
        assert_eq!(r.text, "MATCH (c:Chunk) WHERE false RETURN c LIMIT 1");
        assert!(g.params().is_empty());
    }

    #[test]
    fn verify_catches_a_missing_guard() {
        let g = guard();
        assert!(verify("MATCH (c:Chunk) RETURN c LIMIT 1", &g).is_err());
        assert!(
            verify(
                "MATCH (:Chunk)-[:PART_OF]->(f:FileRef) RETURN f LIMIT 1",
                &g
            )
            .is_err()
        );
        let ok = rewrite(
            "MATCH (c:Chunk) OPTIONAL MATCH (c)-[:MENTIONS]->(e:Entity)-[:REL]->(x:Entity) RETURN x LIMIT 1",
            &g,
        )
        .unwrap();
        verify(&ok.text, &g).unwrap();
        // Dropping the REL guard from the optional clause is caught.
        let stripped = ok
            .text
            .replace(" WHERE kg_r1.enabled = true", " WHERE true");
        assert!(verify(&stripped, &g).is_err());
    }

    #[test]
    fn a_condition_that_can_fail_waits_for_the_whole_pattern() {
        let g = guard();
        let r = rewrite(
            "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity) WHERE e.name = 'x' AND 1 / size(e.name) = 1 \
             WITH e, count(c) AS n WHERE n > 1 AND e.name STARTS WITH 'a' RETURN e.name LIMIT 5",
            &g,
        )
        .unwrap();
        // The comparison stays a conjunct of its own (an index can serve it); the division
        // waits for c and e, and the WITH's STARTS WITH for a value the WITH computes.
        assert!(
            r.text.contains(
                "AND (e.name = 'x' AND CASE WHEN c IS NOT NULL AND e IS NOT NULL THEN (1 / size(e.name)) = 1 ELSE false END)"
            ),
            "{}",
            r.text
        );
        assert!(
            r.text.contains(
                "WITH e, count(c) AS n, true AS kg_w1 WHERE n > 1 AND CASE WHEN kg_w1 IS NOT NULL THEN e.name STARTS WITH 'a' ELSE false END"
            ),
            "{}",
            r.text
        );
        verify(&r.text, &g).unwrap();
        // Untied, either condition is caught.
        let untied = r.text.replace(
            "CASE WHEN c IS NOT NULL AND e IS NOT NULL THEN (1 / size(e.name)) = 1 ELSE false END",
            "(1 / size(e.name)) = 1",
        );
        assert!(
            verify(&untied, &g)
                .unwrap_err()
                .contains("can fail before the guards")
        );
        let untied = r.text.replace(
            "CASE WHEN kg_w1 IS NOT NULL THEN e.name STARTS WITH 'a' ELSE false END",
            "e.name STARTS WITH 'a'",
        );
        assert!(
            verify(&untied, &g)
                .unwrap_err()
                .contains("can move before the guards")
        );
    }

    #[test]
    fn refusals_name_the_rule_and_the_fix() {
        let g = guard();
        let skip = rewrite("MATCH (c:Chunk) RETURN c SKIP 5 LIMIT 5", &g).unwrap_err();
        assert_eq!(skip.rule, Rule::Skip);
        assert!(skip.to_string().contains("rule `no_skip`"));
        assert!(skip.message.contains("WHERE ID(n) > $afterId"));
        let limit = rewrite("MATCH (c:Chunk) RETURN c", &g).unwrap_err();
        assert!(limit.message.contains("LIMIT 10"), "{limit}");
        let anchor = rewrite("MATCH (e:Entity) RETURN e LIMIT 1", &g).unwrap_err();
        assert!(
            anchor.message.contains("(c:Chunk)-[:MENTIONS]->(e:Entity)"),
            "{anchor}"
        );
    }

    #[test]
    fn printing_round_trips_awkward_trees() {
        for src in [
            "RETURN 1 - -1 AS a, (1 < 2) = true AS b, -(-1) AS c, 'it\\'s \\\\ \"q\"\\n' AS d LIMIT 1",
            "UNWIND [1, 2.5, null, {a: [1]}] AS `match` RETURN `match`.a[0], NOT NOT true LIMIT 1",
            "MATCH (c:Chunk) RETURN c {.text, .*, k: c.path}, CASE c.path WHEN 'a' THEN 1 END LIMIT 1",
            "MATCH (o:OutlineNode)-[:COVERS]->(c:Chunk) RETURN o.`order` AS n ORDER BY n DESC LIMIT 1",
        ] {
            let tree = parse_statement(src).unwrap();
            let printed = print_statement(&tree);
            assert_eq!(parse_statement(&printed).unwrap(), tree, "{printed}");
        }
    }

    #[test]
    fn hostile_sizes_are_refused_not_overflowed() {
        let g = guard();
        let deep = format!("RETURN {}1{} LIMIT 1", "(".repeat(5000), ")".repeat(5000));
        assert_eq!(rewrite(&deep, &g).unwrap_err().rule, Rule::Size);
        let long = format!("RETURN {} LIMIT 1", vec!["true"; 3000].join(" AND "));
        assert_eq!(rewrite(&long, &g).unwrap_err().rule, Rule::Size);
        let nots = format!("RETURN {}true LIMIT 1", "NOT ".repeat(3000));
        assert_eq!(rewrite(&nots, &g).unwrap_err().rule, Rule::Size);
        let huge = "x".repeat(20_000);
        assert_eq!(rewrite(&huge, &g).unwrap_err().rule, Rule::Size);
    }
}

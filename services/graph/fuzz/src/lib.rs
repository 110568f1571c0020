//! The fuzz target shared by the libFuzzer binary and the stable harness: kg_cypher's core
//! (compiled from the service's own sources) must never panic, every accepted statement's
//! printed form must parse back to the same tree, and that text must carry the access guard
//! on every Chunk, FileRef, OutlineNode and REL it binds.

#[path = "../../src/cypher/core/mod.rs"]
#[allow(dead_code)]
pub mod core;

pub mod generate;

use core::ast::{Expr, Literal};
use core::parser::{parse_expression, parse_statement};
use core::printer::print_statement;
use core::{Guard, Rule, Target};

/// A guard shaped like the real access predicate (enabled flag, allow prefix, denied file).
pub struct FuzzGuard;

impl Guard for FuzzGuard {
    fn predicate(&self, var: &str, target: Target) -> Expr {
        let prop = target.path_property();
        let text = format!(
            "({var}.enabled = true AND ({var}.{prop} STARTS WITH $kg_acl_allow_0 OR {var}.{prop} STARTS WITH $kg_acl_allow_1) AND {var}.fileId <> $kg_acl_deny_file_0)"
        );
        parse_expression(&text).unwrap_or(Expr::Lit(Literal::Bool(false)))
    }
}

/// Counters for the stable harness's report.
#[derive(Debug, Default, Clone, Copy)]
pub struct Outcome {
    /// The input parsed.
    pub parsed: bool,
    /// The input was accepted and rewritten.
    pub accepted: bool,
}

/// Runs one input; panics on a broken property.
pub fn check(data: &[u8]) -> Outcome {
    let src = String::from_utf8_lossy(data);
    let mut outcome = Outcome::default();
    if let Ok(stmt) = parse_statement(&src) {
        outcome.parsed = true;
        let printed = print_statement(&stmt);
        match parse_statement(&printed) {
            Ok(again) => assert_eq!(
                again, stmt,
                "print/parse round trip changed the tree: {printed}"
            ),
            // Printing may add parentheses, which count towards the nesting limit.
            Err(r) if r.rule == Rule::Size => {}
            Err(r) => panic!("printed statement does not parse: {r}\n{printed}"),
        }
    }
    if let Ok(rewritten) = core::rewrite(&src, &FuzzGuard) {
        outcome.accepted = true;
        if let Err(problem) = core::verify(&rewritten.text, &FuzzGuard) {
            panic!("accepted statement escapes the guard: {problem}\ninput: {src}");
        }
        let again = parse_statement(&rewritten.text);
        if let Ok(again) = again {
            assert_eq!(
                again, rewritten.statement,
                "rewritten text parses to another tree"
            );
        }
        assert!(
            rewritten.limit >= 1 && rewritten.limit <= 50,
            "limit out of range"
        );
        assert!(!rewritten.text.contains("SKIP"), "SKIP survived");
        // Nothing the user wrote can name the reserved space.
        for p in &rewritten.params {
            assert!(
                !p.to_ascii_lowercase().starts_with("kg_"),
                "reserved parameter accepted"
            );
        }
    }
    outcome
}

//! The fuzz properties and the input loop, shared by the libFuzzer target, the stable harness
//! (`make fuzz-cypher-stable`, a time budget) and kg-graph's `tests/cypher_fuzz.rs` (a fixed
//! seed and input count inside `cargo test`). It reads the language core as `crate::core` and
//! the generator as `crate::generate`, so each includer provides those two names.

use std::panic;

use crate::core::ast::{Expr, Literal};
use crate::core::parser::{parse_expression, parse_statement};
use crate::core::printer::print_statement;
use crate::core::{Guard, Rule, Target};
use crate::generate::{Rng, mutate, statement};

/// Hand-written statements near the accepted boundary: the first mutation bases.
pub const SEEDS: &[&str] = &[
    "MATCH (c:Chunk)-[:PART_OF]->(f:FileRef) WHERE toLower(c.text) CONTAINS 'dkim' RETURN f.vfsPath AS path, c.text AS text LIMIT 10",
    "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity)-[r:REL]->(e2:Entity) RETURN e.name, r.relationTypeId, e2.name LIMIT 5",
    "MATCH (f:FileRef) OPTIONAL MATCH (c:Chunk)-[:PART_OF]->(f) WITH f, count(c) AS n RETURN f.vfsPath, n ORDER BY n DESC LIMIT 50",
    "MATCH (d:Folder)-[:HAS_CHILD]->(f:FileRef) RETURN d.folderPath, collect(f.name) AS names LIMIT 20",
    "MATCH (o:OutlineNode)-[:COVERS]->(c:Chunk) WHERE ID(c) > $afterId RETURN o {.title, .depth}, ID(c) AS id ORDER BY id LIMIT 10",
    "MATCH (c:Chunk) WITH c LIMIT 100 MATCH (c)-[:NEXT_CHUNK]->(n:Chunk) UNWIND [1, 2] AS k RETURN CASE WHEN k = 1 THEN c.text ELSE n.text END AS t LIMIT 3",
];

/// Accepted inputs kept as mutation bases, at most.
const MAX_CORPUS: usize = 4096;

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

/// What one input did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Outcome {
    /// The input parsed.
    pub parsed: bool,
    /// The input was accepted and rewritten.
    pub accepted: bool,
}

/// Runs one input through parse, print, rewrite and verify; panics on a broken property.
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
    if let Ok(rewritten) = crate::core::rewrite(&src, &FuzzGuard) {
        outcome.accepted = true;
        if let Err(problem) = crate::core::verify(&rewritten.text, &FuzzGuard) {
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

/// Counters of a fuzzing run.
#[derive(Debug, Default, Clone, Copy)]
pub struct Totals {
    /// Inputs checked.
    pub runs: u64,
    /// Inputs that parsed.
    pub parsed: u64,
    /// Inputs accepted, rewritten and verified.
    pub accepted: u64,
}

/// A broken property: the panic message and the input that caused it.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The panic message.
    pub message: String,
    /// The input, lossily decoded.
    pub input: String,
    /// Inputs checked before this one.
    pub after: u64,
}

/// Grammar-generated statements (one in three) and byte mutations of the seeds and of accepted
/// inputs, from a replayable PRNG. `batches` of 256 inputs run while `more()` says so.
pub struct Fuzzer {
    rng: Rng,
    corpus: Vec<Vec<u8>>,
    /// What has run so far.
    pub totals: Totals,
}

impl Fuzzer {
    /// A fuzzer from `seed` (the same seed replays the same inputs).
    pub fn new(seed: u64) -> Self {
        Fuzzer {
            rng: Rng::new(seed),
            corpus: SEEDS.iter().map(|s| s.as_bytes().to_vec()).collect(),
            totals: Totals::default(),
        }
    }

    /// The next input.
    fn input(&mut self) -> Vec<u8> {
        match self.rng.below(3) {
            0 => statement(&mut self.rng).into_bytes(),
            _ => {
                let at = self.rng.below(self.corpus.len());
                let base = self.corpus.get(at).cloned().unwrap_or_default();
                mutate(&mut self.rng, &base)
            }
        }
    }

    /// Checks `count` inputs; stops at the first broken property. The caller silences the
    /// panic hook if it wants a quiet run (the panic is caught and returned either way).
    pub fn run(&mut self, count: u64) -> Result<(), Failure> {
        for _ in 0..count {
            let input = self.input();
            match panic::catch_unwind(|| check(&input)) {
                Ok(outcome) => {
                    self.totals.runs += 1;
                    self.totals.parsed += u64::from(outcome.parsed);
                    self.totals.accepted += u64::from(outcome.accepted);
                    // Accepted inputs sit next to the boundary: keep them as mutation bases.
                    if outcome.accepted && self.corpus.len() < MAX_CORPUS {
                        self.corpus.push(input);
                    }
                }
                Err(payload) => {
                    let message = payload
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_default();
                    return Err(Failure {
                        message,
                        input: String::from_utf8_lossy(&input).into_owned(),
                        after: self.totals.runs,
                    });
                }
            }
        }
        Ok(())
    }
}

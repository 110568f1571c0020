//! The fuzz target shared by the libFuzzer binary and the stable harness: kg_cypher's core
//! (compiled from the service's own sources) must never panic, every accepted statement's
//! printed form must parse back to the same tree, and that text must carry the access guard
//! on every Chunk, FileRef, OutlineNode and REL it binds. The properties live in
//! `harness.rs`, which kg-graph's `tests/cypher_fuzz.rs` also compiles for a bounded run.

#[path = "../../src/cypher/core/mod.rs"]
#[allow(dead_code)]
pub mod core;

pub mod generate;
mod harness;

pub use harness::{FuzzGuard, Fuzzer, Outcome, SEEDS, Totals, check};

//! A bounded run of the kg_cypher fuzz harness inside `cargo test`: the grammar-aware
//! generator and the properties of `services/graph/fuzz` (compiled here from the same source
//! files, so there is no second crate to build) over a fixed seed and input count. Properties:
//! no panic, every parsed statement prints and parses back to the same tree, every accepted
//! statement's rewrite carries the access guard on each Chunk, FileRef, OutlineNode and REL,
//! a LIMIT of 1-50 and no SKIP. `make fuzz-cypher` runs the same harness for a time budget.
//! KG_CYPHER_FUZZ_SEED and KG_CYPHER_FUZZ_INPUTS replay or widen a run.

use kg_graph::cypher::core;

#[path = "../fuzz/src/generate.rs"]
mod generate;
#[path = "../fuzz/src/harness.rs"]
mod harness;

/// Fixed, so a failure replays; the stable harness draws a fresh seed each run.
const SEED: u64 = 0x6b67_6d65_7368;
/// About 3 s in a debug build on one core.
const INPUTS: u64 = 20_000;

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn parse_print_and_rewrite_hold_their_properties_on_generated_statements() {
    let seed = env_number("KG_CYPHER_FUZZ_SEED", SEED);
    let inputs = env_number("KG_CYPHER_FUZZ_INPUTS", INPUTS);
    let started = std::time::Instant::now();
    let mut fuzzer = harness::Fuzzer::new(seed);
    // Expected panics are caught and reported below; the default hook would print each one.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = fuzzer.run(inputs);
    std::panic::set_hook(default_hook);
    let totals = fuzzer.totals;
    if let Err(failure) = result {
        panic!(
            "seed {seed}, after {} inputs: {}\ninput: {:?}",
            failure.after, failure.message, failure.input
        );
    }
    eprintln!(
        "cypher fuzz: {} inputs in {:.1} s (seed {seed}): {} parsed, {} accepted and verified",
        totals.runs,
        started.elapsed().as_secs_f64(),
        totals.parsed,
        totals.accepted
    );
    assert_eq!(totals.runs, inputs);
    // Not vacuous: the generator reaches the parser and the accepted subset.
    assert!(
        totals.parsed * 10 >= inputs,
        "only {} of {inputs} inputs parsed",
        totals.parsed
    );
    assert!(
        totals.accepted * 50 >= inputs,
        "only {} of {inputs} inputs were accepted",
        totals.accepted
    );
}

#[test]
fn the_seed_statements_are_accepted_and_guarded() {
    for seed in harness::SEEDS {
        let outcome = harness::check(seed.as_bytes());
        assert!(
            outcome.parsed && outcome.accepted,
            "seed not accepted: {seed}"
        );
    }
}

#[test]
fn a_rewrite_without_the_guard_is_caught_by_the_check() {
    // The verifier the fuzz property relies on must notice a guard that is missing.
    let plain = "MATCH (c:Chunk) RETURN c.text LIMIT 5";
    assert!(core::verify(plain, &harness::FuzzGuard).is_err());
    let rewritten = core::rewrite(plain, &harness::FuzzGuard);
    assert!(rewritten.is_ok_and(|r| core::verify(&r.text, &harness::FuzzGuard).is_ok()));
}

//! The fuzz target on a stable toolchain: grammar-generated statements and byte mutations of
//! them and of a seed corpus, for a time budget. Usage: `cypher-stable [seconds] [seed]`.

use std::panic;
use std::time::{Duration, Instant};

use kg_graph_fuzz::Fuzzer;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(60);
    let seed: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut fuzzer = Fuzzer::new(seed);
    panic::set_hook(Box::new(|_| {}));
    while Instant::now() < deadline {
        if let Err(failure) = fuzzer.run(256) {
            eprintln!(
                "FAIL (seed {seed}, after {} runs): {}",
                failure.after, failure.message
            );
            eprintln!("input: {:?}", failure.input);
            std::process::exit(1);
        }
    }
    let t = fuzzer.totals;
    println!(
        "cypher-stable: {} inputs in {secs} s (seed {seed}): {} parsed, {} accepted and verified, no panic, no unguarded rewrite",
        t.runs, t.parsed, t.accepted
    );
}

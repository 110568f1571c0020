//! The fuzz target on a stable toolchain: grammar-generated statements and byte mutations of
//! them and of a seed corpus, for a time budget. Usage: `cypher-stable [seconds] [seed]`.

use std::panic;
use std::time::{Duration, Instant};

use kg_graph_fuzz::generate::{Rng, mutate, statement};
use kg_graph_fuzz::{Outcome, check};

const SEEDS: &[&str] = &[
    "MATCH (c:Chunk)-[:PART_OF]->(f:FileRef) WHERE toLower(c.text) CONTAINS 'dkim' RETURN f.vfsPath AS path, c.text AS text LIMIT 10",
    "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity)-[r:REL]->(e2:Entity) RETURN e.name, r.relationTypeId, e2.name LIMIT 5",
    "MATCH (f:FileRef) OPTIONAL MATCH (c:Chunk)-[:PART_OF]->(f) WITH f, count(c) AS n RETURN f.vfsPath, n ORDER BY n DESC LIMIT 50",
    "MATCH (d:Folder)-[:HAS_CHILD]->(f:FileRef) RETURN d.folderPath, collect(f.name) AS names LIMIT 20",
    "MATCH (o:OutlineNode)-[:COVERS]->(c:Chunk) WHERE ID(c) > $afterId RETURN o {.title, .depth}, ID(c) AS id ORDER BY id LIMIT 10",
    "MATCH (c:Chunk) WITH c LIMIT 100 MATCH (c)-[:NEXT_CHUNK]->(n:Chunk) UNWIND [1, 2] AS k RETURN CASE WHEN k = 1 THEN c.text ELSE n.text END AS t LIMIT 3",
];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(60);
    let seed: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut rng = Rng::new(seed);
    let mut corpus: Vec<Vec<u8>> = SEEDS.iter().map(|s| s.as_bytes().to_vec()).collect();
    let (mut runs, mut parsed, mut accepted) = (0u64, 0u64, 0u64);
    panic::set_hook(Box::new(|_| {}));
    while Instant::now() < deadline {
        for _ in 0..256 {
            let input = match rng.below(3) {
                0 => statement(&mut rng).into_bytes(),
                _ => {
                    let base = corpus[rng.below(corpus.len())].clone();
                    mutate(&mut rng, &base)
                }
            };
            let result = panic::catch_unwind(|| check(&input));
            match result {
                Ok(Outcome {
                    parsed: p,
                    accepted: a,
                }) => {
                    runs += 1;
                    parsed += u64::from(p);
                    accepted += u64::from(a);
                    // Keep accepted inputs as mutation bases: they sit next to the boundary.
                    if a && corpus.len() < 4096 {
                        corpus.push(input);
                    }
                }
                Err(payload) => {
                    let msg = payload
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_default();
                    eprintln!("FAIL (seed {seed}, after {runs} runs): {msg}");
                    eprintln!("input: {:?}", String::from_utf8_lossy(&input));
                    std::process::exit(1);
                }
            }
        }
    }
    println!(
        "cypher-stable: {runs} inputs in {secs} s (seed {seed}): {parsed} parsed, {accepted} accepted and verified, no panic, no unguarded rewrite"
    );
}

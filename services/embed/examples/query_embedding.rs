//! `cargo run --release -p kg-embed --features bench --example query_embedding`: one text at a time, as a
//! search embeds its query, through the query encoder (`embed_query`) and through candle
//! (`embed`), at several lengths in word pieces; prints p50 / p95 per length and path.
//! It runs with the matmul thread setting `kgmesh` gives the process.

use std::time::Instant;

use kg_embed::{Embedder as _, MiniLm, MiniLmOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // SAFETY: first thing in main; no other thread exists before the runtime below starts.
    #[allow(unsafe_code)]
    unsafe {
        kg_embed::pin_matmul_threads();
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let model = MiniLm::load(MiniLmOptions::default()).await?;
    // Distinct texts per round, so nothing is served from a cache anywhere.
    let words: Vec<String> = "the indexer splits markdown files into chunks by heading and \
        token budget while tables code blocks and lists stay whole across section boundaries \
        retrieval fuses full text and vector lanes with reciprocal rank fusion"
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let rounds: usize = std::env::var("QUERY_EMBEDDING_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(40);
    let mut out = std::io::stdout().lock();
    use std::io::Write as _;
    writeln!(out, "words  path           p50 ms   p95 ms")?;
    // QUERY_EMBEDDING_WORDS=6,12 times those lengths only.
    let lengths: Vec<usize> = match std::env::var("QUERY_EMBEDDING_WORDS") {
        Ok(list) => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
        Err(_) => vec![2, 6, 12, 24, 48, 96, 180],
    };
    for length in lengths {
        let text = |round: usize| -> String {
            (0..length)
                .map(|i| words[(i * 7 + round) % words.len()].as_str())
                .collect::<Vec<_>>()
                .join(" ")
        };
        for (path, query) in [("query encoder", true), ("candle", false)] {
            let mut times = Vec::with_capacity(rounds);
            for round in 0..rounds + 5 {
                let texts = vec![text(round)];
                let started = Instant::now();
                if query {
                    model.embed_query(texts).await?;
                } else {
                    model.embed(texts).await?;
                }
                if round >= 5 {
                    times.push(started.elapsed().as_secs_f64() * 1000.0);
                }
            }
            times.sort_by(f64::total_cmp);
            writeln!(
                out,
                "{length:5}  {path:13}  {:7.2}  {:7.2}",
                percentile(&times, 0.5),
                percentile(&times, 0.95)
            )?;
        }
    }
    Ok(())
}

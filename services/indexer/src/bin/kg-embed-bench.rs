//! `kg-embed-bench DIR [--batch-size N]`: the embedder alone on the exact chunk texts
//! the indexer embeds for the files under DIR (parsed and chunked with the indexer's
//! default options). Prints one JSON object: files, chunks, parse+chunk seconds,
//! embedding seconds and chunks per second. Used by `make bench-ingest`.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use kg_embed::EmbeddingConfig;
use kg_indexer::IndexerConfig;
use kg_indexer::pipeline::{FileMeta, index_document};
use kg_indexer::vector_writer::embedding_text;

fn mime_of(path: &Path) -> &'static str {
    match path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default()
    {
        "md" | "markdown" => "text/markdown",
        "html" | "htm" => "text/html",
        "csv" => "text/csv",
        "json" => "application/json",
        "pdf" => "application/pdf",
        _ => "text/plain",
    }
}

fn files_under(root: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(root)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        let path = entry.path();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        if entry.file_type()?.is_dir() {
            files_under(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // SAFETY: first thing in main; no other thread exists before the runtime below starts.
    // The embedder then runs with the thread setting `kgmesh` gives it.
    #[allow(unsafe_code)]
    unsafe {
        kg_embed::pin_matmul_threads();
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(bench())
}

async fn bench() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut dir = None;
    let mut config = EmbeddingConfig::default();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--batch-size" => {
                config.batch_size = args.next().ok_or("--batch-size needs a value")?.parse()?;
            }
            "--concurrency" => {
                config.concurrency = args.next().ok_or("--concurrency needs a value")?.parse()?;
            }
            other if dir.is_none() => dir = Some(PathBuf::from(other)),
            other => return Err(format!("unexpected argument `{other}`").into()),
        }
    }
    let dir = dir.ok_or("usage: kg-embed-bench DIR [--batch-size N] [--concurrency N]")?;

    let mut paths = Vec::new();
    files_under(&dir, &mut paths)?;
    let options = IndexerConfig::default().chunk;
    let started = Instant::now();
    let mut texts = Vec::new();
    let mut per_file = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let relative = path
            .strip_prefix(&dir)?
            .to_string_lossy()
            .replace('\\', "/");
        let meta = FileMeta {
            namespace: "bench".into(),
            file_id: format!("f{i}"),
            version_id: format!("v{i}"),
            path: relative,
            mime: mime_of(path).into(),
            enabled: true,
            hidden: false,
        };
        let bytes = std::fs::read(path)?;
        let Ok(doc) = index_document(&meta, &bytes, &options) else {
            continue;
        };
        let file_texts: Vec<String> = doc
            .chunks
            .iter()
            .map(|c| embedding_text(&c.context_header, &c.text))
            .collect();
        texts.extend(file_texts.iter().cloned());
        per_file.push(file_texts);
    }
    let parse_seconds = started.elapsed().as_secs_f64();

    let embedder = kg_embed::build(&config)
        .await?
        .ok_or("the default provider embeds")?;
    // Warm-up outside the timing (first call allocates kernels' buffers).
    embedder
        .embed(texts.iter().take(8).cloned().collect())
        .await?;
    // Per file, as the indexer calls it.
    let started = Instant::now();
    for file_texts in per_file {
        embedder.embed(file_texts).await?;
    }
    let embed_seconds = started.elapsed().as_secs_f64();

    let report = serde_json::json!({
        "model": embedder.model_id(),
        "files": paths.len(),
        "chunks": texts.len(),
        "batch_size": config.batch_size,
        "parse_seconds": parse_seconds,
        "parse_chunks_per_s": texts.len() as f64 / parse_seconds.max(1e-9),
        "embed_seconds": embed_seconds,
        "embed_chunks_per_s": texts.len() as f64 / embed_seconds.max(1e-9),
    });
    writeln!(std::io::stdout(), "{report}")?;
    Ok(())
}

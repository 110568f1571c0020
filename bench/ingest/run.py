#!/usr/bin/env python3
"""`make bench-ingest`: end-to-end ingest throughput next to the embedder alone.

1. Builds a corpus of at least --min-chunks chunks from copies of a Markdown folder
   (default ../shared/bench/docs-qa/docs, the Prometheus docs) in a temp dir.
2. Runs `kg-embed-bench` on it: the indexer's own parser and chunker, then
   all-MiniLM-L6-v2 alone on exactly the texts the indexer embeds (context header +
   chunk text), file by file as the indexer calls it. That gives the chunk count and
   the embedder-alone chunks/s.
3. For each provider (minilm, none): starts `kgmesh up` (release build) in a fresh
   temp dir with KGMESH_EMBEDDING__PROVIDER set, runs `kgmesh ingest` of the corpus and
   waits until every file is indexed (upload, parse, chunk, embed, vector and graph
   writes, status events), then reads the server's peak RSS (VmHWM) from /proc.
4. Prints chunks/s end to end, the ratio to the embedder alone, and peak memory.
   Goals (issue 4): minilm >= 0.8x the embedder alone; none >= 300 chunks/s.

Not part of `make test`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests" / "python"))

from kgmesh_support import Mesh  # noqa: E402

NAMESPACE = "bench-ingest"


def peak_rss_mb(pid: int) -> float:
    """VmHWM: the process's peak resident set, as the kernel counted it."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def children_rss_mb(pid: int) -> float:
    """Current RSS of the stores `up` started (FalkorDB, NATS), for context."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
            if ppid != pid:
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except (OSError, ValueError):
            continue
    return total / 1024


def embed_alone(bench_bin: Path, corpus: Path, batch_size: int) -> dict:
    done = subprocess.run(
        [str(bench_bin), str(corpus), "--batch-size", str(batch_size)],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        sys.exit(f"kg-embed-bench failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def make_corpus(source: Path, target: Path, copies: int) -> None:
    for i in range(copies):
        shutil.copytree(source, target / f"copy-{i + 1}")


def run_provider(binary: Path, corpus: Path, provider: str, chunks: int, concurrency: int) -> dict:
    os.environ["KGMESH_EMBEDDING__PROVIDER"] = provider
    os.environ["KGMESH_INDEXER__CONCURRENCY"] = str(concurrency)
    with tempfile.TemporaryDirectory(prefix=f"kgmesh-bench-{provider}-") as tmp:
        mesh = Mesh(Path(tmp), binary)
        mesh.start()
        try:
            assert mesh.proc is not None
            started = time.monotonic()
            done = mesh.ingest(corpus, NAMESPACE)
            seconds = time.monotonic() - started
            rss = peak_rss_mb(mesh.proc.pid)
            stores = children_rss_mb(mesh.proc.pid)
        finally:
            problems = mesh.stop()
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    return {
        "provider": provider,
        "seconds": seconds,
        "chunks_per_s": chunks / seconds,
        "peak_rss_mb": rss,
        "stores_rss_mb": stores,
        "ingest": last,
        "stop_problems": problems,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=REPO_ROOT.parent / "shared" / "bench" / "docs-qa" / "docs")
    parser.add_argument("--min-chunks", type=int, default=2000)
    parser.add_argument("--providers", default="minilm,none")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=4, help="indexer lanes")
    parser.add_argument("--binary", type=Path, default=REPO_ROOT / "target" / "release" / "kgmesh")
    parser.add_argument("--bench-bin", type=Path, default=REPO_ROOT / "target" / "release" / "kg-embed-bench")
    args = parser.parse_args()
    if not args.corpus.is_dir():
        sys.exit(f"corpus {args.corpus} not found; pass --corpus DIR")
    os.environ["KGMESH_EMBEDDING__BATCH_SIZE"] = str(args.batch_size)

    with tempfile.TemporaryDirectory(prefix="kgmesh-bench-corpus-") as tmp:
        corpus = Path(tmp) / "corpus"
        # One copy first, to learn how many chunks it makes.
        make_corpus(args.corpus, corpus, 1)
        probe = embed_alone(args.bench_bin, corpus, args.batch_size)
        copies = max(1, -(-args.min_chunks // max(1, probe["chunks"])))
        if copies > 1:
            shutil.rmtree(corpus)
            make_corpus(args.corpus, corpus, copies)
        alone = embed_alone(args.bench_bin, corpus, args.batch_size)
        chunks = alone["chunks"]
        print(f"corpus: {args.corpus} x{copies} = {alone['files']} files, {chunks} chunks", flush=True)
        print(
            f"embedder alone ({alone['model']}, batch {args.batch_size}): "
            f"{alone['embed_chunks_per_s']:.1f} chunks/s ({alone['embed_seconds']:.1f} s); "
            f"parse+chunk alone: {alone['parse_chunks_per_s']:.0f} chunks/s",
            flush=True,
        )
        results = []
        for provider in [p.strip() for p in args.providers.split(",") if p.strip()]:
            result = run_provider(args.binary, corpus, provider, chunks, args.concurrency)
            results.append(result)
            ratio = result["chunks_per_s"] / alone["embed_chunks_per_s"]
            extra = f", {ratio:.2f}x the embedder alone" if provider == "minilm" else ""
            print(
                f"end to end, provider {provider}: {result['chunks_per_s']:.1f} chunks/s "
                f"({result['seconds']:.1f} s){extra}; peak RSS of kgmesh {result['peak_rss_mb']:.0f} MB "
                f"(+ stores {result['stores_rss_mb']:.0f} MB at the end)",
                flush=True,
            )
            print(f"  ingest: {result['ingest']}", flush=True)
            for problem in result["stop_problems"]:
                print(f"  stop: {problem}", flush=True)
        print(json.dumps({"corpus_files": alone["files"], "chunks": chunks, "embed_alone": alone, "end_to_end": results}))


if __name__ == "__main__":
    main()

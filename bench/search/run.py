#!/usr/bin/env python3
"""`make bench-search`: kg_search latency at scale, per lane and fused, over gRPC and MCP.

1. Corpus: `kg-search-bench corpus` takes the Markdown and Rust sources of the crates.io
   packages in this checkout's Cargo.lock (from Cargo's registry sources, present on any
   machine that built kgmesh; no network), ordered by a stable hash of their paths, until the
   indexer's own parser and chunker count at least --min-chunks chunks (default 100,000).
   Rust files are copied as `<name>.rs.txt` (plain text for the indexer).
2. Namespace: `kgmesh up` with MiniLM embeddings in a data dir cached under
   target/bench-search/<corpus sha256>/ and `kgmesh ingest` of the corpus; a later run with the
   same corpus restarts that data dir and skips the ingest (--rebuild to redo it).
3. Queries: --queries distinct texts, deterministic from the corpus: the docs-qa questions
   (../shared/bench/docs-qa/queries.jsonl), Markdown headings, first sentences of Rust doc
   comments, and phrases from Rust identifiers (`fn parse_header_value` -> "parse header value").
4. `kg-search-bench run` times every query, after a warm-up, straight to retrieval (+ graph
   packages) over gRPC and through the gateway over MCP, per lane alone and fused, in one
   process; it prints p50/p95/p99/mean per lane and path, the gateway overhead and the goals.

Not part of `make test`. Small: BENCH_ARGS="--min-chunks 2000 --queries 200 --debug".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests" / "python"))

from kgmesh_support import Mesh, MeshError, markdown_headings  # noqa: E402

NAMESPACE = "bench-search"
DOCS_QA_QUERIES = REPO_ROOT.parent / "shared" / "bench" / "docs-qa" / "queries.jsonl"
# Bump when the corpus selection or the query generation changes meaning.
CORPUS_VERSION = "1"
INGEST_TIMEOUT_S = 6 * 3600


class CachedMesh(Mesh):
    """A Mesh that may restart an existing data dir. `up` prints the admin token only on the
    first start, so the cache keeps it and the ready file's empty one is filled in from it."""

    saved_token: str = ""

    def start(self) -> None:  # same as Mesh.start, minus "the data dir must be new"
        if not self.binary.is_file():
            raise MeshError(f"kgmesh binary not found at {self.binary}")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.ready_file.unlink(missing_ok=True)
        command = [
            str(self.binary), "up", "--data-dir", str(self.data_dir),
            "--http-addr", "127.0.0.1:0", "--ready-file", str(self.ready_file),
        ]
        with open(self.stdout_log, "ab") as out, open(self.stderr_log, "ab") as err:
            self.proc = subprocess.Popen(
                command, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                start_new_session=True, env={**os.environ, **self.env},
            )
        self._wait_ready()

    def _read_ready_file(self):  # type: ignore[no-untyped-def]
        ready = super()._read_ready_file()
        if ready is not None and not ready.get("admin_token") and self.saved_token:
            ready["admin_token"] = self.saved_token
        return ready


# ---------------------------------------------------------------------------------------------
# Corpus and cache
# ---------------------------------------------------------------------------------------------


def registry_src() -> Path:
    cargo_home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo"))
    return cargo_home / "registry" / "src"


def corpus_sha256(corpus: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in corpus.rglob("*") if p.is_file()):
        relative = path.relative_to(corpus).as_posix()
        digest.update(relative.encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def build_corpus(args: argparse.Namespace, bench_bin: Path) -> tuple[Path, dict]:
    """The corpus for these inputs, built once under target/bench-search/corpora/<inputs key>."""
    lock = args.lock.resolve()
    inputs = hashlib.sha256(
        f"{CORPUS_VERSION}\0{args.min_chunks}\0{args.max_file_bytes}\0".encode() + lock.read_bytes()
    ).hexdigest()[:16]
    home = args.cache_dir / "corpora" / inputs
    manifest_path = home / "corpus.json"
    if manifest_path.is_file() and not args.rebuild:
        return home / "corpus", json.loads(manifest_path.read_text())
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    started = time.monotonic()
    done = subprocess.run(
        [
            str(bench_bin), "corpus", "--registry", str(args.registry), "--lock", str(lock),
            "--out", str(home / "corpus"), "--min-chunks", str(args.min_chunks),
            "--max-file-bytes", str(args.max_file_bytes),
        ],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        sys.exit(f"kg-search-bench corpus failed:\n{done.stderr[-3000:]}")
    manifest = json.loads(done.stdout.strip().splitlines()[-1])
    manifest["sha256"] = corpus_sha256(home / "corpus")
    manifest["seconds"] = round(time.monotonic() - started, 1)
    manifest_path.write_text(json.dumps(manifest, indent=2))
    return home / "corpus", manifest


# ---------------------------------------------------------------------------------------------
# Queries
# ---------------------------------------------------------------------------------------------

_DOC_LINE = re.compile(r"^\s*//[/!]\s?(.*)$")
_IDENT = re.compile(r"\b(?:fn|struct|enum|trait)\s+([A-Za-z][A-Za-z0-9_]*)")
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+[0-9]*|[A-Z]+[0-9]*|[0-9]+")
_WORDY = re.compile(r"^[A-Za-z][A-Za-z0-9 ,'()/-]*$")


def clean(text: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # [label](url) -> label
    text = re.sub(r"[`*_\[\]<>#]", "", text)
    return re.sub(r"\s+", " ", text).strip()


def first_sentence(text: str) -> str:
    match = re.match(r"(.+?[.!?])(\s|$)", text)
    return (match.group(1) if match else text).rstrip(".!?")


def ident_phrase(name: str) -> str:
    words = [w.lower() for part in name.split("_") for w in _CAMEL.findall(part)]
    return " ".join(words)


def corpus_queries(corpus: Path) -> dict[str, list[str]]:
    kinds: dict[str, set[str]] = {"heading": set(), "doc": set(), "ident": set()}
    for path in sorted(p for p in corpus.rglob("*") if p.is_file()):
        text = path.read_text(encoding="utf-8", errors="replace")
        if path.name.endswith(".rs.txt"):
            block: list[str] = []
            for line in text.splitlines() + [""]:
                match = _DOC_LINE.match(line)
                if match:
                    block.append(match.group(1).strip())
                    continue
                if block:
                    sentence = clean(first_sentence(" ".join(b for b in block if b)))
                    if 4 <= len(sentence.split()) <= 16 and _WORDY.match(sentence):
                        kinds["doc"].add(sentence)
                    block = []
            for name in _IDENT.findall(text):
                phrase = ident_phrase(name)
                if 2 <= len(phrase.split()) <= 5 and len(phrase) >= 8:
                    kinds["ident"].add(phrase)
        else:
            for heading in markdown_headings(text):
                title = clean(heading.title)
                if 2 <= len(title.split()) <= 10 and _WORDY.match(title):
                    kinds["heading"].add(title)
    # A stable order that does not follow the corpus layout.
    key = lambda q: hashlib.sha256(q.encode()).hexdigest()  # noqa: E731
    return {kind: sorted(found, key=key) for kind, found in kinds.items()}


def make_queries(corpus: Path, count: int, out: Path) -> dict[str, int]:
    """`count` distinct queries: every docs-qa question, then doc sentences, headings and
    identifier phrases in a 4:3:3 mix (topped up from whichever kind has more)."""
    chosen: list[tuple[str, str]] = []
    seen: set[str] = set()

    def take(kind: str, text: str) -> None:
        if text.lower() not in seen and len(chosen) < count:
            seen.add(text.lower())
            chosen.append((kind, text))

    if DOCS_QA_QUERIES.is_file():
        for line in DOCS_QA_QUERIES.read_text(encoding="utf-8").splitlines():
            if line.strip():
                take("docs-qa", json.loads(line)["text"])
    pools = corpus_queries(corpus)
    rest = max(0, count - len(chosen))
    shares = {"doc": rest * 4 // 10, "heading": rest * 3 // 10}
    shares["ident"] = rest - shares["doc"] - shares["heading"]
    for kind, share in shares.items():
        for text in pools[kind][:share]:
            take(kind, text)
    for kind in ("doc", "heading", "ident"):  # top up when a kind ran short
        for text in pools[kind]:
            take(kind, text)
    if len(chosen) < count:
        sys.exit(f"the corpus yields only {len(chosen)} distinct queries, fewer than --queries {count}")
    # Interleave kinds so warm-up and every stretch of the run see the same mix.
    chosen.sort(key=lambda kq: hashlib.sha256(kq[1].encode()).hexdigest())
    with open(out, "w", encoding="utf-8") as lines:
        for kind, text in chosen:
            lines.write(json.dumps({"text": text, "kind": kind}) + "\n")
    counts: dict[str, int] = {}
    for kind, _ in chosen:
        counts[kind] = counts.get(kind, 0) + 1
    return counts


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--min-chunks", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=1000, help="distinct queries timed")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=1, help="concurrent clients (1 = sequential)")
    parser.add_argument("--lanes", default="fulltext,vector,graph_expand,co_annotation,fused")
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument(
        "--mcp-protocol", default="2025-06-18", choices=["2025-06-18", "2026-07-28"],
        help="MCP revision of the bench's client: 2025-06-18 opens a session; 2026-07-28 sends "
             "each call on its own, with its version and capabilities in _meta",
    )
    parser.add_argument("--max-file-bytes", type=int, default=256 * 1024)
    parser.add_argument("--registry", type=Path, default=registry_src())
    parser.add_argument(
        "--lock", type=Path, default=REPO_ROOT / "Cargo.lock",
        help="Cargo.lock whose crates make the corpus (default this checkout's). A dependency change "
        "makes a new corpus and a new ~40 min ingest; `git show <commit>:Cargo.lock > old.lock` and "
        "`--lock old.lock` times a new build on the cached namespace of an older lock",
    )
    parser.add_argument("--cache-dir", type=Path, default=REPO_ROOT / "target" / "bench-search")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the corpus and re-ingest")
    parser.add_argument("--debug", action="store_true", help="use target/debug binaries (smoke runs)")
    parser.add_argument("--indexer-concurrency", type=int, default=4)
    parser.add_argument(
        "--embed-max-tokens", type=int, default=256,
        help="MiniLM word pieces embedded per chunk and query (embedding.max_tokens; 256 is the "
             "model's own cap). Lower caps ingest far faster: a latency run on a machine that "
             "cannot spend hours on the ingest; vectors then see only the start of each chunk",
    )
    parser.add_argument("--json", type=Path, help="also write the figures as JSON to this file")
    parser.add_argument(
        "--slowest", type=int, default=0, help="also print this many slowest queries per lane set (gRPC Search)"
    )
    parser.add_argument(
        "--ingest-only", action="store_true",
        help="build and ingest the namespace (or resume an interrupted ingest), then stop",
    )
    parser.add_argument("--kgmesh-bin", type=Path, help="kgmesh binary (default: target/<profile>/kgmesh)")
    parser.add_argument("--bench-bin", type=Path, help="kg-search-bench binary (default: target/<profile>/...)")
    args = parser.parse_args()
    profile = "debug" if args.debug else "release"
    binary = args.kgmesh_bin or REPO_ROOT / "target" / profile / "kgmesh"
    bench_bin = args.bench_bin or REPO_ROOT / "target" / profile / "kg-search-bench"
    for path in (binary, bench_bin):
        if not path.is_file():
            sys.exit(f"{path} not found; build it with `cargo build {'--release ' if profile == 'release' else ''}"
                     "--bin kgmesh --bin kg-search-bench`")

    corpus, manifest = build_corpus(args, bench_bin)
    print(
        f"corpus: {manifest['files']} files ({manifest['markdown_files']} Markdown), {manifest['chunks']} chunks, "
        f"{manifest['bytes'] / 1e6:.1f} MB from {manifest['crates']} crates in Cargo.lock; sha256 {manifest['sha256'][:16]}",
        flush=True,
    )
    # A namespace embedded under another token cap is another namespace.
    suffix = "" if args.embed_max_tokens == 256 else f"-cap{args.embed_max_tokens}"
    home = args.cache_dir / (manifest["sha256"][:16] + suffix)
    marker = home / "ingested.json"
    # Written before the ingest starts: a 100k-chunk MiniLM ingest takes hours on 2 cores, so an
    # interrupted one resumes from its data dir (uploads of unchanged files are no-ops, and
    # JetStream still holds the files not yet indexed) instead of starting over.
    started_marker = home / "ingest-started.json"
    token_file = home / "admin-token"
    if args.rebuild or not (marker.is_file() or started_marker.is_file()):
        shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)

    mesh = CachedMesh(work_dir=home, binary=binary)
    mesh.env = {
        "KGMESH_EMBEDDING__PROVIDER": "minilm",
        "KGMESH_EMBEDDING__MAX_TOKENS": str(args.embed_max_tokens),
        "KGMESH_INDEXER__CONCURRENCY": str(args.indexer_concurrency),
    }
    if token_file.is_file():
        mesh.saved_token = token_file.read_text().strip()
    try:
        mesh.start()
        if not marker.is_file():
            fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(mesh.admin_token)
            earlier = json.loads(started_marker.read_text()) if started_marker.is_file() else None
            if earlier is None:
                started_marker.write_text(json.dumps({"corpus": manifest["sha256"], "seconds_before": 0.0}))
            else:
                print(f"ingest: resuming the interrupted ingest in {home}", flush=True)
            started = time.monotonic()
            done = mesh.run(
                "ingest", str(corpus), "--namespace", NAMESPACE, "--timeout-secs", str(INGEST_TIMEOUT_S),
                json_output=False, timeout=INGEST_TIMEOUT_S + 120,
            )
            if done.returncode != 0:
                raise MeshError(f"ingest failed ({done.returncode}):\n{done.stderr[-3000:]}\n{mesh.log_tail(30)}")
            seconds = time.monotonic() - started
            last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
            resumed = earlier is not None
            marker.write_text(
                json.dumps({"seconds": seconds, "resumed": resumed, "ingest": last, "corpus": manifest}, indent=2)
            )
            rate = "" if resumed else f" ({manifest['chunks'] / seconds:.1f} chunks/s)"
            print(f"ingest: {seconds:.1f} s{' (resumed; this part only)' if resumed else ''}{rate}; {last}", flush=True)
        else:
            ingested = json.loads(marker.read_text())
            print(f"ingest: cached in {home} (took {ingested['seconds']:.1f} s)", flush=True)
        if args.ingest_only:
            return 0

        with tempfile.TemporaryDirectory(prefix="kgmesh-bench-search-") as tmp:
            queries = Path(tmp) / "queries.jsonl"
            mix = make_queries(corpus, args.queries, queries)
            print("queries: " + ", ".join(f"{n} {kind}" for kind, n in sorted(mix.items())), flush=True)
            print(f"embedding: all-MiniLM-L6-v2, {args.embed_max_tokens} word pieces per chunk and query", flush=True)
            command = [
                str(bench_bin), "run", "--data-dir", str(mesh.data_dir), "--namespace", NAMESPACE,
                "--queries", str(queries), "--warmup", str(args.warmup), "--concurrency", str(args.concurrency),
                "--lanes", args.lanes, "--top-k", str(args.top_k), "--mcp-protocol", args.mcp_protocol,
                "--time-embedding", str(args.embed_max_tokens),
            ]
            if args.json:
                command += ["--json", str(args.json.resolve())]
            if args.slowest:
                command += ["--slowest", str(args.slowest)]
            done = subprocess.run(
                command, cwd=REPO_ROOT, env={**os.environ, "KGMESH_TOKEN": mesh.admin_token}, check=False,
            )
            if done.returncode != 0:
                raise MeshError(f"kg-search-bench run exited with {done.returncode}\n{mesh.log_tail(30)}")
        return 0
    except MeshError as err:
        print(f"bench-search failed: {err}", file=sys.stderr)
        return 1
    finally:
        for problem in mesh.stop():
            print(f"stopping the mesh: {problem}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())

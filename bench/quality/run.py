#!/usr/bin/env python3
"""`make bench-quality`: retrieval quality of kg_search on a BEIR-format dataset.

1. Loads a BEIR-format dataset: the corpus as `corpus.jsonl` ({_id, title?, text}), as a folder
   of files (`docs/`, corpus-id = path relative to it), or as `corpus-source.json` naming a folder
   of an installed Python package and the SHA-256 of its files (bench/quality/npm-docs-qa: the
   npm CLI docs that `make deps` installs, so the corpus is not copied into this repository),
   `queries.jsonl` ({_id, text, metadata?}),
   qrels (`qrels.tsv`, or `qrels/test.tsv`), and optionally `answers.jsonl` ({_id, path, phrase})
   for chunk-level scoring. Default: ../shared/bench/docs-qa (the Prometheus documentation).
2. Starts `kgmesh up` in a temp dir and ingests the corpus into one namespace with `kgmesh ingest`.
3. Asks every query through kg_search over MCP (Streamable HTTP, the official SDK), once per lane
   alone and once fused with the default lanes, topK 32.
4. Scores every run with the same code, and also scores the plain BM25 baseline that ships with
   docs-qa (its own chunking and ranking, imported from the dataset's bm25_baseline.py when present),
   so the figures stand side by side (a dataset without its own bm25_baseline.py gets docs-qa's,
   run over its corpus):
   - file level (qrels): files ranked by their best chunk; nDCG@10 and recall@8 with binary gains;
   - chunk level (answers): a chunk is a hit when it comes from the gold path and contains the gold
     phrase once whitespace is normalised; hit@8 and MRR@8.
   A lane the server reports as unavailable is printed as such, not scored as zero.
5. `--tbox FILE` publishes that TBox on the namespace before the ingest (without one the index has
   no entities, and graph_expand no mentions to walk).
6. `--fulltext-backend falkordb,qdrant_sparse` repeats steps 2-3 once per full-text backend
   (`[retrieval] fulltext_backend`, set through KGMESH_RETRIEVAL__FULLTEXT_BACKEND on a fresh mesh)
   and labels each run with its backend, so both stand next to BM25 in one table.

Not part of `make test`.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import random
import re
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests" / "python"))

import anyio  # noqa: E402

from kgmesh_support import Mesh, MeshError, call_tool, mcp_http  # noqa: E402

DEFAULT_DATASET = REPO_ROOT.parent / "shared" / "bench" / "docs-qa"
NAMESPACE = "bench-quality"
LANES = ["fulltext", "vector", "graph_expand"]
TOP_K = 32
NDCG_K = 10
RECALL_K = 8
HIT_K = 8
# Sign flips of a paired randomization test; seeded, so a run's p-values repeat.
RANDOMIZATIONS = 20_000


class BenchError(RuntimeError):
    """The bench cannot produce a trustworthy number; the message says why."""


# ---------------------------------------------------------------------------------------------
# Dataset
# ---------------------------------------------------------------------------------------------


@dataclass
class Dataset:
    root: Path
    corpus_dir: Path
    queries: list[dict[str, Any]]
    qrels: dict[str, set[str]]
    answers: dict[str, dict[str, str]]
    # Whether a corpus-id is the file's path under corpus_dir (docs/, corpus-source.json) rather
    # than a corpus.jsonl id written out as `<id>.md`.
    ids_are_paths: bool = True


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def load_qrels(root: Path) -> dict[str, set[str]]:
    for candidate in (root / "qrels.tsv", root / "qrels" / "test.tsv"):
        if candidate.is_file():
            qrels: dict[str, set[str]] = defaultdict(set)
            with open(candidate, encoding="utf-8") as rows:
                for i, row in enumerate(rows):
                    parts = row.rstrip("\n").split("\t")
                    if i == 0 and parts[0] == "query-id":
                        continue
                    if len(parts) >= 3 and float(parts[2]) > 0:
                        qrels[parts[0]].add(parts[1])
            return dict(qrels)
    raise BenchError(f"{root} has no qrels.tsv or qrels/test.tsv")


def corpus_digest(folder: Path, suffix: str) -> tuple[int, str]:
    """How many `suffix` files `folder` holds, and the SHA-256 over their relative paths and bytes
    in path order: the same digest means the same corpus, byte for byte."""
    digest = hashlib.sha256()
    files = sorted(p for p in folder.rglob(f"*{suffix}") if p.is_file())
    for path in files:
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return len(files), digest.hexdigest()


def package_corpus(root: Path, source_file: Path, work: Path) -> Path:
    """The folder a `corpus-source.json` names inside an installed Python package, checked
    against the digest the questions were written for. When the folder holds other files too
    (npm's node_modules: code beside the Markdown), the corpus files are copied under `work`
    with their relative paths, so only they are ingested."""
    source = json.loads(source_file.read_text(encoding="utf-8"))
    spec = importlib.util.find_spec(source["python_package"])
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise BenchError(
            f"{root}: Python package `{source['python_package']}` is not installed; "
            f"run `make deps` ({source.get('installed_by', 'see the dataset README')})"
        )
    folder = Path(locations[0]) / source["path"]
    if not folder.is_dir():
        raise BenchError(f"{root}: {folder} does not exist; the installed package is not the expected version")
    files, digest = corpus_digest(folder, source.get("suffix", ".md"))
    if (files, digest) != (source["files"], source["sha256"]):
        raise BenchError(
            f"{root}: {folder} holds {files} files with digest {digest}, not the {source['files']} "
            f"files with digest {source['sha256']} the questions were written for"
        )
    suffix = source.get("suffix", ".md")
    if all(p.name.endswith(suffix) for p in folder.rglob("*") if p.is_file()):
        return folder
    out = work / "corpus"
    for path in folder.rglob(f"*{suffix}"):
        if path.is_file():
            target = out / path.relative_to(folder)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    return out


def materialise_corpus(root: Path, work: Path) -> tuple[Path, bool]:
    """A folder of files to ingest, and whether a corpus-id is a file's path in it: the dataset's
    docs/ as is, the package folder its corpus-source.json names (or its corpus files), or
    corpus.jsonl written out as one Markdown file per document named by its id (the corpus-id is
    then `<id>.md`)."""
    docs = root / "docs"
    if docs.is_dir():
        return docs, True
    if (root / "corpus-source.json").is_file():
        return package_corpus(root, root / "corpus-source.json", work), True
    corpus = root / "corpus.jsonl"
    if not corpus.is_file():
        raise BenchError(f"{root} has none of docs/, corpus-source.json or corpus.jsonl")
    out = work / "corpus"
    for doc in load_jsonl(corpus):
        target = out / f"{doc['_id']}.md"
        target.parent.mkdir(parents=True, exist_ok=True)
        title = doc.get("title") or ""
        target.write_text((f"# {title}\n\n" if title else "") + doc["text"] + "\n", encoding="utf-8")
    return out, False


def corpus_id(path: str, dataset: Dataset) -> str:
    """The qrels id of an ingested path: folders keep paths; corpus.jsonl files are `<id>.md`."""
    if dataset.ids_are_paths:
        return path
    return path[:-3] if path.endswith(".md") else path


def load_dataset(root: Path, work: Path) -> Dataset:
    queries = load_jsonl(root / "queries.jsonl")
    qrels = load_qrels(root)
    answers_path = root / "answers.jsonl"
    answers = {a["_id"]: a for a in load_jsonl(answers_path)} if answers_path.is_file() else {}
    queries = [q for q in queries if q["_id"] in qrels]
    if not queries:
        raise BenchError("no query has a qrels row")
    corpus_dir, ids_are_paths = materialise_corpus(root, work)
    return Dataset(root, corpus_dir, queries, qrels, answers, ids_are_paths=ids_are_paths)


# ---------------------------------------------------------------------------------------------
# Scoring (one implementation for every run, the baseline included)
# ---------------------------------------------------------------------------------------------


def norm_ws(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


@dataclass
class Ranked:
    """One query's ranked chunks: (corpus-id, chunk text)."""

    chunks: list[tuple[str, str]]


def file_ranking(ranked: Ranked) -> list[str]:
    seen: list[str] = []
    for path, _ in ranked.chunks:
        if path not in seen:
            seen.append(path)
    return seen


def ndcg(files: list[str], relevant: set[str], k: int) -> float:
    dcg = sum(1 / math.log2(i + 2) for i, f in enumerate(files[:k]) if f in relevant)
    ideal = sum(1 / math.log2(i + 2) for i in range(min(k, len(relevant))))
    return dcg / ideal if ideal else 0.0


@dataclass
class Scores:
    n: int = 0
    ndcg: float = 0.0
    recall: float = 0.0
    hit: float = 0.0
    mrr: float = 0.0
    chunk_n: int = 0

    def add(self, ranked: Ranked, relevant: set[str], answer: dict[str, str] | None) -> None:
        files = file_ranking(ranked)
        self.n += 1
        self.ndcg += ndcg(files, relevant, NDCG_K)
        self.recall += len(relevant & set(files[:RECALL_K])) / len(relevant)
        if answer is not None:
            self.chunk_n += 1
            phrase = norm_ws(answer["phrase"])
            for rank, (path, text) in enumerate(ranked.chunks[:HIT_K], start=1):
                if path == answer["path"] and phrase in norm_ws(text):
                    self.hit += 1
                    self.mrr += 1 / rank
                    break

    def row(self) -> str:
        chunk = (
            f"{self.hit / self.chunk_n:>8.3f}{self.mrr / self.chunk_n:>8.3f}" if self.chunk_n else f"{'-':>8}{'-':>8}"
        )
        return f"{self.n:>4}{self.ndcg / self.n:>9.3f}{self.recall / self.n:>8.3f}{chunk}"


def per_query_scores(dataset: Dataset, by_query: dict[str, Ranked]) -> dict[str, Scores]:
    """One Scores per question, for paired comparisons between runs."""
    scores: dict[str, Scores] = {}
    for query in dataset.queries:
        qid = query["_id"]
        scores[qid] = Scores()
        scores[qid].add(by_query.get(qid, Ranked([])), dataset.qrels[qid], dataset.answers.get(qid))
    return scores


def paired_randomization(diffs: list[float]) -> float:
    """Two-sided p of a mean per-question difference under random sign flips (the paired
    randomization test IR evaluation uses; Smucker et al. 2007)."""
    if not diffs:
        return 1.0
    observed = abs(sum(diffs) / len(diffs))
    rng = random.Random(0)
    extreme = sum(
        abs(sum(d if rng.random() < 0.5 else -d for d in diffs) / len(diffs)) >= observed - 1e-12
        for _ in range(RANDOMIZATIONS)
    )
    return (extreme + 1) / (RANDOMIZATIONS + 1)


def format_p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def print_paired(dataset: Dataset, runs: dict[str, dict[str, Ranked]], subject: str) -> None:
    """`subject` against every other run, question by question: mean difference, questions
    better and worse, and the paired randomization p, for nDCG@10 and MRR@8."""
    if subject not in runs:
        return
    mine = per_query_scores(dataset, runs[subject])
    ids = [q["_id"] for q in dataset.queries]
    print(f"\npaired, {subject} against each run ({len(ids)} questions; p: two-sided randomization test)")
    for name, by_query in runs.items():
        if name == subject:
            continue
        theirs = per_query_scores(dataset, by_query)
        cells = []
        for label, value in (("nDCG@10", lambda s: s.ndcg), ("MRR@8", lambda s: s.mrr)):
            diffs = [value(mine[q]) - value(theirs[q]) for q in ids]
            better = sum(d > 1e-9 for d in diffs)
            worse = sum(d < -1e-9 for d in diffs)
            cells.append(
                f"{label} {sum(diffs) / len(diffs):+.3f} ({better} better, {worse} worse, "
                f"p {format_p(paired_randomization(diffs))})"
            )
        print(f"  - {name:<30}" + "; ".join(cells))


def score_runs(dataset: Dataset, runs: dict[str, dict[str, Ranked]]) -> dict[str, dict[str, Scores]]:
    """runs: name -> query id -> ranking. Returns name -> query kind ('all' included) -> scores."""
    table: dict[str, dict[str, Scores]] = {}
    for name, by_query in runs.items():
        kinds: dict[str, Scores] = defaultdict(Scores)
        for query in dataset.queries:
            ranked = by_query.get(query["_id"], Ranked([]))
            kind = (query.get("metadata") or {}).get("kind", "all")
            answer = dataset.answers.get(query["_id"])
            for bucket in {"all", kind}:
                kinds[bucket].add(ranked, dataset.qrels[query["_id"]], answer)
        table[name] = dict(kinds)
    return table


# ---------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------


def baseline_module(dataset: Dataset) -> Any | None:
    """The dataset's own bm25_baseline.py, or docs-qa's reading this dataset's corpus."""
    script = dataset.root / "bm25_baseline.py"
    borrowed = not script.is_file()
    if borrowed:
        script = DEFAULT_DATASET / "bm25_baseline.py"
        if not script.is_file():
            return None
    spec = importlib.util.spec_from_file_location("bm25_baseline", script)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if borrowed:
        # The script reads the Markdown under its DOCS folder when load_corpus runs.
        module.DOCS = str(dataset.corpus_dir)
    return module


def bm25_run(dataset: Dataset) -> dict[str, Ranked] | None:
    """The BM25 baseline of [`baseline_module`], ranked by the same harness."""
    module = baseline_module(dataset)
    if module is None:
        return None
    files = module.load_corpus()
    chunks: list[tuple[str, str]] = []
    for path, text in files.items():
        for piece in module.chunk(text):
            chunks.append((corpus_id(path, dataset), piece))
    index = module.BM25([module.tokenize(text) for _, text in chunks])
    run: dict[str, Ranked] = {}
    for query in dataset.queries:
        scores = index.scores(module.tokenize(query["text"]))
        order = sorted(range(len(chunks)), key=lambda i: -scores[i])[:TOP_K]
        run[query["_id"]] = Ranked([chunks[i] for i in order])
    return run


@dataclass
class LaneRun:
    name: str
    lanes: list[str] | None
    ranked: dict[str, Ranked] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    unavailable: set[str] = field(default_factory=set)
    # Per question, per hit: the lanes that ranked it, their ranks and own scores (hit `lanes`).
    lane_ranks: dict[str, list[list[dict[str, Any]]]] = field(default_factory=dict)


async def kg_runs(mesh: Mesh, dataset: Dataset, lane_runs: list[LaneRun]) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        for run in lane_runs:
            for query in dataset.queries:
                arguments: dict[str, Any] = {"query": query["text"], "namespaces": [NAMESPACE], "topK": TOP_K}
                if run.lanes is not None:
                    arguments["lanes"] = run.lanes
                start = time.perf_counter()
                outcome = await call_tool(client, "kg_search", arguments)
                run.latencies.append(time.perf_counter() - start)
                if outcome.is_error:
                    raise BenchError(f"kg_search {run.name} {query['_id']} failed: {outcome.data}")
                data = outcome.data
                for lane in (data.get("trace") or {}).get("lanes", []):
                    if isinstance(lane, dict) and not lane.get("ok", True):
                        run.unavailable.add(f"{lane.get('lane')}: {lane.get('errorCode', 'failed')}")
                run.ranked[query["_id"]] = Ranked(
                    [
                        (corpus_id(hit["path"], dataset), hit.get("text", ""))
                        for hit in data.get("results", [])
                    ]
                )
                run.lane_ranks[query["_id"]] = [hit.get("lanes", []) for hit in data.get("results", [])]


def pick_binary(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit).resolve()
    release = REPO_ROOT / "target" / "release" / "kgmesh"
    return release if release.is_file() else REPO_ROOT / "target" / "debug" / "kgmesh"


def print_table(table: dict[str, dict[str, Scores]], notes: dict[str, str]) -> None:
    kinds = sorted({k for by_kind in table.values() for k in by_kind} - {"all"})
    header = f"{'run':<34}{'kind':<14}{'n':>4}{'nDCG@10':>9}{'R@8':>8}{'hit@8':>8}{'MRR@8':>8}  notes"
    print("\n" + header)
    for name, by_kind in table.items():
        for kind in ["all", *kinds]:
            if kind in by_kind:
                note = notes.get(name, "") if kind == "all" else ""
                print(f"{name:<34}{kind:<14}{by_kind[kind].row()}  {note}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", type=Path, default=DEFAULT_DATASET, help="BEIR-format dataset folder")
    parser.add_argument("--binary", help="kgmesh binary (default: target/release/kgmesh, else target/debug)")
    parser.add_argument("--lanes", default=",".join(LANES), help="lanes to score alone, comma-separated")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (mesh logs)")
    parser.add_argument("--json", type=Path, help="also write the scores as JSON to this file")
    parser.add_argument(
        "--dump-runs", type=Path,
        help="also write every run's rankings (query id -> [[corpus-id, chunk text], ...]) as JSON, "
        "for offline analysis such as fusion experiments",
    )
    parser.add_argument(
        "--dump-lanes", type=Path,
        help="also write, for every kgmesh run, each hit's lane ranks and the lanes' own scores "
        "(run -> query id -> [[{lane, rank, score}, ...] per hit]), e.g. to replay score-aware fusion",
    )
    parser.add_argument(
        "--tbox", type=Path,
        help="a TBox (YAML, as `kgmesh tbox draft --file` takes) published on the namespace before the "
        "ingest, so entities are extracted and graph_expand has something to walk",
    )
    parser.add_argument(
        "--fulltext-backend",
        default="",
        help="full-text backends to compare, comma-separated (falkordb, qdrant_sparse); "
        "one fresh mesh each. Default: the server's configured backend",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kgmesh-bench-quality-"))
    mesh: Mesh | None = None
    try:
        dataset = load_dataset(args.dataset.resolve(), work)
        files = sum(1 for p in dataset.corpus_dir.rglob("*") if p.is_file())
        print(f"dataset: {dataset.root} ({files} files, {len(dataset.queries)} queries, {len(dataset.answers)} answers)")
        binary = pick_binary(args.binary)
        print(f"kgmesh: {binary}", flush=True)
        backends = [b for b in args.fulltext_backend.split(",") if b] or [""]
        lane_runs: list[LaneRun] = []
        for backend in backends:
            label = f" [{backend}]" if backend else ""
            env = {"KGMESH_RETRIEVAL__FULLTEXT_BACKEND": backend} if backend else {}
            mesh = Mesh(work_dir=work / f"mesh-{backend or 'default'}", binary=binary, env=env)
            try:
                mesh.start()
            except MeshError as err:
                if len(backends) == 1:
                    raise
                # One backend that cannot start (e.g. qdrant_sparse without a Qdrant server)
                # must not hide the others' figures.
                print(f"fulltext backend {backend}: the mesh did not start: {str(err)[:600]}", file=sys.stderr)
                mesh.stop()
                mesh = None
                continue
            if args.tbox is not None:
                mesh.publish_tbox(NAMESPACE, args.tbox.resolve())
                print(f"tbox: {args.tbox} published", flush=True)
            started = time.perf_counter()
            mesh.ingest(dataset.corpus_dir, NAMESPACE)
            print(f"ingest{label}: {time.perf_counter() - started:.1f} s", flush=True)
            backend_runs = [LaneRun(f"kgmesh {lane}{label}", [lane]) for lane in args.lanes.split(",") if lane]
            backend_runs.append(LaneRun(f"kgmesh fused{label}", None))
            anyio.run(kg_runs, mesh, dataset, backend_runs)
            lane_runs.extend(backend_runs)
            problems = mesh.stop()
            mesh = None
            if problems:
                print("stopping the mesh: " + "; ".join(problems), file=sys.stderr)
        runs: dict[str, dict[str, Ranked]] = {}
        notes: dict[str, str] = {}
        baseline = bm25_run(dataset)
        if baseline is not None:
            runs["BM25 baseline"] = baseline
            notes["BM25 baseline"] = "bm25_baseline.py chunking + ranking"
        for run in lane_runs:
            runs[run.name] = run.ranked
            ordered = sorted(run.latencies)
            p50 = ordered[len(ordered) // 2] * 1000
            notes[run.name] = f"p50 {p50:.1f} ms over MCP" + (
                f"; not run: {', '.join(sorted(run.unavailable))}" if run.unavailable else ""
            )
        table = score_runs(dataset, runs)
        if args.dump_runs:
            args.dump_runs.write_text(
                json.dumps({name: {qid: r.chunks for qid, r in by_q.items()} for name, by_q in runs.items()})
            )
        if args.dump_lanes:
            args.dump_lanes.write_text(json.dumps({run.name: run.lane_ranks for run in lane_runs}))
        print_table(table, notes)
        print(
            "\nfile level: nDCG@10, R@8 (files ranked by their best chunk); chunk level: hit@8, MRR@8 "
            "(gold path + gold phrase, whitespace normalised)"
        )
        for run in lane_runs:
            if run.name.startswith("kgmesh fused"):
                print_paired(dataset, runs, run.name)
        if args.json:
            args.json.write_text(
                json.dumps(
                    {
                        name: {
                            kind: {
                                "n": s.n,
                                "ndcg10": s.ndcg / s.n,
                                "recall8": s.recall / s.n,
                                "hit8": s.hit / s.chunk_n if s.chunk_n else None,
                                "mrr8": s.mrr / s.chunk_n if s.chunk_n else None,
                            }
                            for kind, s in by_kind.items()
                        }
                        for name, by_kind in table.items()
                    },
                    indent=2,
                )
            )
        return 0
    except (BenchError, MeshError) as err:
        print(f"bench-quality failed: {err}", file=sys.stderr)
        if mesh is not None and mesh.proc is not None:
            print(mesh.log_tail(30), file=sys.stderr)
        return 1
    finally:
        if mesh is not None:
            problems = mesh.stop()
            if problems:
                print("stopping the mesh: " + "; ".join(problems), file=sys.stderr)
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

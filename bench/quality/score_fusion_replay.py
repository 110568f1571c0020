#!/usr/bin/env python3
"""Offline replay of score-based fusion rules against kg_search's rank fusion, over the three sets.

kg_search fuses ranks (RRF, with full-text hits graded by the share of the query's idf weight
they hold; `fusion_replay.py`). Two rules that use the lanes' own scores were asked whether they
give docs-qa a margin over its vector lane without costing the other sets:

- a convex combination of the lanes' normalised scores (BM25 divided by the query's best; cosine
  min-max scaled from the list's lowest, from 0, or from 0.2), with and without the grading,
  for full-text weights 0.1-0.6;
- rank fusion plus a boost from the same file: a chunk adds `beta` times its file's best other
  chunk's fused score (`max`), or their sum (`sum`), since the harness ranks files by their best
  chunk;
- rank fusion where a graded full-text hit (under the full share) also earns `gamma` unless the
  vector lane's top 8 or 16 holds its file (lane agreement);
- rank fusion where the whole full-text lane earns `gamma` when none of its top 3 hits holds at
  least a share `t` of the question's idf weight (a question the index has no words for).

The lanes' scores come from `--dump-lanes` (each lane-alone run's hits carry their lane's score);
their ranked chunks from `--dump-runs`. Run after `make bench-quality-pooled`:

    .venv/bin/python bench/quality/score_fusion_replay.py target/bench-quality
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fusion_replay  # noqa: E402
import run as quality  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SETS = [
    ("docs-qa", ROOT.parent / "shared" / "bench" / "docs-qa"),
    ("npm-docs-qa", ROOT / "bench" / "quality" / "npm-docs-qa"),
    ("npm-libs-qa", ROOT / "bench" / "quality" / "npm-libs-qa"),
]
FULL_MATCH = 0.5
FULLTEXT_WEIGHTS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
BOOSTS = [0.1, 0.2, 0.3, 0.5, 1.0]

# One lane's hits for one question: (corpus-id, text, the lane's own score).
Scored = list[tuple[str, str, float]]
Run = dict[str, list[list[str]]]


class JudgedSet:
    def __init__(self, runs_file: Path, lanes_file: Path, dataset_dir: Path) -> None:
        runs = json.loads(runs_file.read_text(encoding="utf-8"))
        lanes = json.loads(lanes_file.read_text(encoding="utf-8"))
        self.dataset = quality.load_dataset(dataset_dir.resolve(), Path(tempfile.mkdtemp()))
        self.ids = [q["_id"] for q in self.dataset.queries]

        def run_named(prefix: str) -> str:
            return next(name for name in runs if name.startswith(prefix))

        def scored(prefix: str, lane: str) -> dict[str, Scored]:
            name = run_named(prefix)
            return {
                q: [
                    (cid, text, next(entry["score"] for entry in ranks if entry["lane"] == lane))
                    for (cid, text), ranks in zip(hits, lanes[name][q])
                ]
                for q, hits in runs[name].items()
            }

        self.fulltext = scored("kgmesh fulltext", "fulltext")
        self.vector = scored("kgmesh vector", "vector")
        self.real_fused: Run = runs[run_named("kgmesh fused")]
        self.vector_run: Run = runs[run_named("kgmesh vector")]
        self.share = fusion_replay.idf_share(self.dataset)

    def ndcg(self, run: Run) -> float:
        return sum(
            quality.ndcg(
                quality.file_ranking(quality.Ranked([tuple(c) for c in run[q]])),
                self.dataset.qrels[q],
                quality.NDCG_K,
            )
            for q in self.ids
        ) / len(self.ids)

    def graded(self, q: str, text: str) -> float:
        return fusion_replay.match_weight(self.share(q, text), FULL_MATCH)


def convex(js: JudgedSet, weight: float, cosine_floor: float | None, grade: bool) -> Run:
    out: Run = {}
    for q in js.ids:
        combined: dict[tuple[str, str], float] = {}
        fulltext = js.fulltext.get(q, [])
        if fulltext:
            best = max(score for _, _, score in fulltext) or 1.0
            for cid, text, score in fulltext:
                earned = js.graded(q, text) if grade else 1.0
                combined[(cid, text)] = combined.get((cid, text), 0.0) + weight * earned * score / best
        vector = js.vector.get(q, [])
        if vector:
            best = max(score for _, _, score in vector)
            low = min(score for _, _, score in vector) if cosine_floor is None else cosine_floor
            for cid, text, score in vector:
                scaled = (score - low) / ((best - low) or 1.0)
                combined[(cid, text)] = combined.get((cid, text), 0.0) + (1 - weight) * scaled
        out[q] = [list(key) for key in sorted(combined, key=lambda key: -combined[key])[: quality.TOP_K]]
    return out


def lane_lists(js: JudgedSet, q: str, fulltext: Scored) -> list[Scored]:
    """Weighted full-text hits beside the vector lane's (weight 1), for RRF as the service fuses."""
    return [fulltext, [(cid, text, 1.0) for cid, text, _ in js.vector.get(q, [])]]


def file_boost(js: JudgedSet, beta: float, mode: str) -> Run:
    out: Run = {}
    for q in js.ids:
        graded = [(cid, text, js.graded(q, text)) for cid, text, _ in js.fulltext.get(q, [])]
        fused, first = fusion_replay.rrf_scores(lane_lists(js, q, graded))
        by_file: dict[str, list[float]] = {}
        for (cid, _), score in fused.items():
            by_file.setdefault(cid, []).append(score)

        def boosted(key: tuple[str, str]) -> float:
            others = sorted(by_file[key[0]], reverse=True)
            others.remove(fused[key])
            extra = sum(others) if mode == "sum" else (others[0] if others else 0.0)
            return fused[key] + beta * extra

        order = sorted(fused, key=lambda key: (-boosted(key), first[key]))
        out[q] = [list(key) for key in order[: quality.TOP_K]]
    return out


def agreement(js: JudgedSet, gamma: float, depth: int) -> Run:
    out: Run = {}
    for q in js.ids:
        vector_files = {cid for cid, _, _ in js.vector.get(q, [])[:depth]}
        weighted = []
        for cid, text, _ in js.fulltext.get(q, []):
            earned = js.graded(q, text)
            if earned < 1.0 and cid not in vector_files:
                earned *= gamma
            weighted.append((cid, text, earned))
        out[q] = fusion_replay.rrf(lane_lists(js, q, weighted))
    return out


def lane_gate(js: JudgedSet, gamma: float, share: float) -> Run:
    out: Run = {}
    for q in js.ids:
        fulltext = js.fulltext.get(q, [])
        best = max((js.share(q, text) for _, text, _ in fulltext[:3]), default=0.0)
        lane = 1.0 if best >= share else gamma
        graded = [(cid, text, lane * js.graded(q, text)) for cid, text, _ in fulltext]
        out[q] = fusion_replay.rrf(lane_lists(js, q, graded))
    return out


def load_sets(runs: Path) -> dict[str, JudgedSet]:
    """The three judged sets with the dumps `make bench-quality-pooled` wrote into `runs`."""
    return {name: JudgedSet(runs / f"{name}.json", runs / f"{name}.lanes.json", folder) for name, folder in SETS}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", type=Path, help="the folder `make bench-quality-pooled` wrote")
    args = parser.parse_args()
    sets = load_sets(args.runs)
    total = sum(len(js.ids) for js in sets.values())

    def row(label: str, make: Callable[[JudgedSet], Run]) -> None:
        scores = {name: js.ndcg(make(js)) for name, js in sets.items()}
        pooled = sum(scores[name] * len(js.ids) for name, js in sets.items()) / total
        cells = "  ".join(f"{scores[name]:.3f}" for name in scores)
        print(f"  {label:<40} {cells}  {pooled:.3f}")

    print(f"nDCG@{quality.NDCG_K}; columns: " + ", ".join(sets) + ", pooled")
    row("real runs: vector lane", lambda js: js.vector_run)
    row("real runs: kg_search fused", lambda js: js.real_fused)
    row("replay: rank fusion, graded", lambda js: agreement(js, 1.0, 0))
    for floor in (None, 0.0, 0.2):
        for grade in (False, True):
            for weight in FULLTEXT_WEIGHTS:
                label = (
                    f"convex w {weight:.1f}, cosine from {'min' if floor is None else floor}"
                    f"{', graded' if grade else ''}"
                )
                row(label, lambda js, w=weight, f=floor, g=grade: convex(js, w, f, g))
    for mode in ("max", "sum"):
        for beta in BOOSTS:
            row(f"rank fusion + file boost {mode} {beta}", lambda js, b=beta, m=mode: file_boost(js, b, m))
    for depth in (8, 16):
        for gamma in (0.0, 0.5):
            row(f"agreement: vector top {depth}, gamma {gamma}", lambda js, d=depth, g=gamma: agreement(js, g, d))
    for share in (0.3, 0.4, 0.5, 0.6):
        for gamma in (0.0, 0.5):
            row(f"lane gate: share {share}, gamma {gamma}", lambda js, t=share, g=gamma: lane_gate(js, g, t))
    return 0


if __name__ == "__main__":
    sys.exit(main())

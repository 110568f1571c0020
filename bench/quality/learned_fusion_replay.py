#!/usr/bin/env python3
"""Offline replay of a learned fusion rule, fitted on two judged sets and scored on the third.

kg_search fuses ranks by a rule chosen by hand (RRF, full-text hits graded by the share of the
question's idf weight they hold; `fusion_replay.py`). This asks whether a rule fitted to the
judgements does better on a set it has not seen: a logistic regression over each candidate
chunk's lane signals (the candidates are the two lanes' top 32; a chunk is relevant when its
file is judged so), trained on the candidates of two sets and used to rank the third's
(leave one set out). The features:

- `rrf_vector`: 60 / (60 + the vector lane's rank), 0 when the lane did not return the chunk;
- `graded`: the same for the full-text rank, times the service's grading (`match_weight`);
- `share`: the share of the question's idf weight the chunk's terms hold;
- `cosine`: the vector lane's score (for a chunk it did not return, its lowest score less
  0.02), and `cosine_gap`, that score less the question's best;
- with `+query`, two features of the question: the best share among the full-text lane's
  top 3, and the vector lane's best cosine.

L2-regularised (C, as scikit-learn's `LogisticRegression`; the intercept is not penalised),
fitted by Newton's method. The dumps come from `make bench-quality-pooled`:

    .venv/bin/python bench/quality/learned_fusion_replay.py target/bench-quality
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fusion_replay  # noqa: E402
import run as quality  # noqa: E402
import score_fusion_replay as replay  # noqa: E402

FEATURES = ["rrf_vector", "graded", "share", "cosine", "cosine_gap", "top3_share", "best_cosine"]
FEATURE_SETS = {
    "graded, rrf_vector, cosine": ["graded", "rrf_vector", "cosine"],
    "+ share, cosine_gap": ["graded", "rrf_vector", "share", "cosine", "cosine_gap"],
    "+ share, cosine_gap, +query": FEATURES,
}
REGULARISATION = [0.1, 1.0, 10.0]

Candidates = tuple[list[tuple[str, str]], list[dict[str, float]], list[int]]


def candidates(js: replay.JudgedSet, q: str) -> Candidates:
    """The union of the two lanes' hits for one question: keys, features, relevance labels."""
    fulltext = js.fulltext.get(q, [])
    vector = js.vector.get(q, [])
    ranks: dict[tuple[str, str], dict[str, tuple[int, float]]] = {}
    for lane, hits in (("fulltext", fulltext), ("vector", vector)):
        for rank, (cid, text, score) in enumerate(hits, start=1):
            ranks.setdefault((cid, text), {})[lane] = (rank, score)
    best_cosine = max((score for *_, score in vector), default=0.0)
    low_cosine = min((score for *_, score in vector), default=0.0)
    top3_share = max((js.share(q, text) for _, text, _ in fulltext[:3]), default=0.0)
    keys, rows, labels = [], [], []
    for key, lanes in ranks.items():
        share = js.share(q, key[1])
        fulltext_rank = lanes.get("fulltext", (0, 0.0))[0]
        vector_rank, cosine = lanes.get("vector", (0, low_cosine - 0.02))
        rows.append({
            "rrf_vector": 60 / (60 + vector_rank) if vector_rank else 0.0,
            "graded": 60 / (60 + fulltext_rank) * fusion_replay.match_weight(share, replay.FULL_MATCH)
            if fulltext_rank else 0.0,
            "share": share,
            "cosine": cosine,
            "cosine_gap": cosine - best_cosine,
            "top3_share": top3_share,
            "best_cosine": best_cosine,
        })
        keys.append(key)
        labels.append(1 if key[0] in js.dataset.qrels[q] else 0)
    return keys, rows, labels


def solve(matrix: list[list[float]], vector: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (the Newton step's small linear system)."""
    n = len(vector)
    a = [row[:] + [vector[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            factor = a[r][col] / a[col][col]
            for c in range(col, n + 1):
                a[r][c] -= factor * a[col][c]
    out = [0.0] * n
    for r in range(n - 1, -1, -1):
        out[r] = (a[r][n] - sum(a[r][c] * out[c] for c in range(r + 1, n))) / a[r][r]
    return out


def fit(rows: list[list[float]], labels: list[int], c: float, iterations: int = 50) -> list[float]:
    """Weights (intercept last) minimising C * log loss + |w|² / 2 by Newton's method."""
    width = len(rows[0]) + 1
    weights = [0.0] * width
    design = [row + [1.0] for row in rows]
    for _ in range(iterations):
        gradient = [weights[j] if j < width - 1 else 0.0 for j in range(width)]
        hessian = [[(1.0 if i == j and i < width - 1 else 0.0) for j in range(width)] for i in range(width)]
        for x, y in zip(design, labels):
            z = sum(w * v for w, v in zip(weights, x))
            p = 1 / (1 + math.exp(-z)) if z >= 0 else math.exp(z) / (1 + math.exp(z))
            for i in range(width):
                gradient[i] += c * (p - y) * x[i]
                scale = c * p * (1 - p) * x[i]
                for j in range(width):
                    hessian[i][j] += scale * x[j]
        step = solve(hessian, gradient)
        weights = [w - s for w, s in zip(weights, step)]
        if max(abs(s) for s in step) < 1e-8:
            break
    return weights


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", type=Path, help="the folder make bench-quality-pooled wrote (target/bench-quality)")
    args = parser.parse_args()
    sets = replay.load_sets(args.runs)
    data = {name: {q: candidates(js, q) for q in js.ids} for name, js in sets.items()}
    total = sum(len(js.ids) for js in sets.values())

    def service_rule(row: dict[str, float]) -> float:
        return row["graded"] + row["rrf_vector"]

    def ranked(name: str, score) -> replay.Run:
        out: replay.Run = {}
        for q, (keys, rows, _) in data[name].items():
            order = sorted(range(len(keys)), key=lambda i: -score(rows[i]))
            out[q] = [list(keys[i]) for i in order[: quality.TOP_K]]
        return out

    def report(label: str, by_set: dict[str, float]) -> None:
        pooled = sum(by_set[name] * len(sets[name].ids) for name in sets) / total
        cells = "".join(f"{by_set[name]:>13.3f}" for name in sets)
        print(f"  {label:<40}{cells}{pooled:>10.3f}")

    print(f"nDCG@{quality.NDCG_K}, each set scored by a model fitted on the other two")
    print(f"  {'rule':<40}" + "".join(f"{name:>13}" for name in sets) + f"{'pooled':>10}")
    report("vector lane", {name: js.ndcg(js.vector_run) for name, js in sets.items()})
    report("the service's rule (replayed)", {name: js.ndcg(ranked(name, service_rule)) for name, js in sets.items()})
    for label, features in FEATURE_SETS.items():
        for c in REGULARISATION:
            by_set = {}
            for held_out, js in sets.items():
                rows, labels = [], []
                for name in sets:
                    if name == held_out:
                        continue
                    for _, feature_rows, feature_labels in data[name].values():
                        rows.extend([row[f] for f in features] for row in feature_rows)
                        labels.extend(feature_labels)
                weights = fit(rows, labels, c)

                def learned(row: dict[str, float], weights=weights, features=features) -> float:
                    return sum(w * row[f] for w, f in zip(weights, features))

                by_set[held_out] = js.ndcg(ranked(held_out, learned))
            report(f"{label}, C {c}", by_set)
    return 0


if __name__ == "__main__":
    sys.exit(main())

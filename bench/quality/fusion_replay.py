#!/usr/bin/env python3
"""Offline replay of kg_search's fusion over a `make bench-quality --dump-runs` file.

`run.py --dump-runs runs.json` writes each lane's ranked chunks per query (the fulltext lane
alone keeps every hit). This script fuses the fulltext and vector lists again with RRF (k 60,
weights 1), as the retrieval service does, and scores each variant with run.py's own scoring:

- every full-text hit fused whole;
- full-text hits graded by the share of the query's idf weight their terms carry: a hit holding
  at least the full share earns its rank's whole contribution, one holding less
  `(held / full)²` of it (`[retrieval] fusion_fulltext_full_match`, the service's rule), for a
  sweep of full shares;
- the rule before it, for the same sweep: hits under the share cut from fusion altogether;
- a two-fold check of the graded rule: the share picked on odd-numbered questions, scored on
  even-numbered ones, and the reverse, so a margin is not only a setting fitted to the
  questions it is scored on;
- the real runs' fused list against the vector lane's, question by question: wins, ties,
  losses, and a paired randomization test of the nDCG difference (two-sided).

The replay uses each lane's top 32 (what the dump holds) and idf from the dataset's own
chunking (its bm25_baseline.py, or docs-qa's for a set without one) with the lane's stop words,
so it approximates the service (within 0.003 nDCG@10 of the real fused runs on both sets);
the sweep's shape is the point.

    .venv/bin/python bench/quality/fusion_replay.py runs.json [--dataset DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run as quality  # noqa: E402

RRF_K = 60
SHARES = [round(0.30 + 0.05 * i, 2) for i in range(9)]
# The full-text lane's stop words (services/stores/src/graph/fulltext.rs) are not query terms.
STOP_WORDS_FILE = Path(__file__).resolve().parents[2] / "services" / "stores" / "src" / "graph" / "fulltext.rs"


def stop_words() -> set[str]:
    source = STOP_WORDS_FILE.read_text(encoding="utf-8")
    block = re.search(r"STOP_WORDS[^=]*=\s*&\[(.*?)\];", source, re.S)
    return set(re.findall(r'"([^"]+)"', block.group(1))) if block else set()


def tokens(text: str) -> list[str]:
    return re.findall(r"[\w]+", text.lower())


def rrf_scores(
    lists: list[list[tuple[str, str, float]]],
) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], int]]:
    """RRF over lists of (corpus-id, text, weight): a hit at rank r earns weight / (k + r).
    Each chunk's fused score, and its rank in the first list holding it (the tie-break)."""
    fused: dict[tuple[str, str], float] = {}
    first: dict[tuple[str, str], int] = {}
    for ranked in lists:
        seen: set[tuple[str, str]] = set()
        rank = 0
        for corpus_id, text, weight in ranked:
            key = (corpus_id, text)
            if key in seen:
                continue
            seen.add(key)
            rank += 1
            fused[key] = fused.get(key, 0.0) + weight / (RRF_K + rank)
            first.setdefault(key, rank)
    return fused, first


def rrf(lists: list[list[tuple[str, str, float]]]) -> list[list[str]]:
    """The top chunks of [`rrf_scores`], best first."""
    fused, first = rrf_scores(lists)
    order = sorted(fused, key=lambda key: (-fused[key], first[key]))
    return [list(key) for key in order[: quality.TOP_K]]


def idf_share(dataset: quality.Dataset) -> Callable[[str, str], float]:
    """`share(query_id, text)`: the share of the question's idf weight (its terms less the lane's
    stop words, idf over the dataset's own chunking) that the text's terms hold."""
    baseline = quality.baseline_module(dataset)
    if baseline is None:
        sys.exit("no bm25_baseline.py to chunk the dataset with")
    chunks = [set(baseline.tokenize(piece)) for text in baseline.load_corpus().values() for piece in baseline.chunk(text)]
    df = Counter(term for chunk in chunks for term in chunk)
    n = len(chunks)
    stops = stop_words()

    def idf(term: str) -> float:
        return math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))

    query_terms = {q["_id"]: set(tokens(q["text"])) - stops for q in dataset.queries}

    def share(query_id: str, text: str) -> float:
        terms = query_terms[query_id]
        total = sum(idf(t) for t in terms)
        return sum(idf(t) for t in terms & set(tokens(text))) / total if total else 0.0

    return share


def match_weight(share: float, full: float) -> float:
    """The service's `fusion::match_weight`."""
    if full <= 0 or share >= full:
        return 1.0
    return (max(share, 0.0) / full) ** 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dump", type=Path, help="the --dump-runs file of a bench-quality run")
    parser.add_argument("--dataset", type=Path, default=quality.DEFAULT_DATASET)
    args = parser.parse_args()
    dump = json.loads(args.dump.read_text())
    fulltext = next(name for name in dump if name.startswith("kgmesh fulltext"))
    vector = next(name for name in dump if name.startswith("kgmesh vector"))
    dataset = quality.load_dataset(args.dataset.resolve(), Path(tempfile.mkdtemp()))

    share = idf_share(dataset)

    ids = [q["_id"] for q in dataset.queries]

    def vector_list(q: str) -> list[tuple[str, str, float]]:
        return [(cid, text, 1.0) for cid, text in dump[vector][q]]

    def graded(full: float) -> dict[str, list[list[str]]]:
        return {
            q: rrf([[(cid, t, match_weight(share(q, t), full)) for cid, t in dump[fulltext][q]], vector_list(q)])
            for q in ids
        }

    def cut(min_share: float) -> dict[str, list[list[str]]]:
        return {
            q: rrf([[(cid, t, 1.0) for cid, t in dump[fulltext][q] if share(q, t) >= min_share], vector_list(q)])
            for q in ids
        }

    def ndcg(run: dict[str, list[list[str]]], queries: list[str]) -> float:
        return sum(
            quality.ndcg(quality.file_ranking(quality.Ranked([tuple(c) for c in run[q]])), dataset.qrels[q], quality.NDCG_K)
            for q in queries
        ) / len(queries)

    every = graded(0.0)
    by_share = {s: graded(s) for s in SHARES}
    cut_by_share = {s: cut(s) for s in SHARES}
    print(f"nDCG@{quality.NDCG_K} over {len(ids)} questions (replay of each lane's top {quality.TOP_K})")
    print(f"  fulltext alone              {ndcg(dump[fulltext], ids):.3f}")
    print(f"  vector alone                {ndcg(dump[vector], ids):.3f}")
    print(f"  every full-text hit fused   {ndcg(every, ids):.3f}")
    print("  full share   graded (the rule)   cut below it (the rule before)")
    for s in SHARES:
        print(f"  {s:>10.2f}   {ndcg(by_share[s], ids):>17.3f}   {ndcg(cut_by_share[s], ids):>29.3f}")
    folds = [ids[0::2], ids[1::2]]
    for i, held_out in enumerate(folds):
        picked_on = folds[1 - i]
        best = max(SHARES, key=lambda s: ndcg(by_share[s], picked_on))
        print(
            f"  two-fold {i + 1}: share {best:.2f} picked on the other half; held-out half: graded "
            f"{ndcg(by_share[best], held_out):.3f}, every hit fused {ndcg(every, held_out):.3f}, "
            f"vector {ndcg(dump[vector], held_out):.3f}"
        )
    real_fused = next((name for name in dump if name.startswith("kgmesh fused")), None)
    if real_fused is not None:
        diffs = [ndcg(dump[real_fused], [q]) - ndcg(dump[vector], [q]) for q in ids]
        observed = sum(diffs) / len(diffs)
        wins = sum(d > 1e-9 for d in diffs)
        losses = sum(d < -1e-9 for d in diffs)
        print(
            f"  real runs, fused - vector: {observed:+.3f} nDCG@{quality.NDCG_K}; {wins} questions better, "
            f"{losses} worse, {len(diffs) - wins - losses} equal; paired randomization p = "
            f"{quality.paired_randomization(diffs):.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

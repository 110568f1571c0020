"""Paired comparison of one run against the others over several judged sets at once.

Each set alone has about 60 questions, too few for a paired test to tell a margin of a few
hundredths of nDCG@10 from chance. This pools the questions of every set given (each question
counts once, whichever set it is from) and runs the same paired randomization test `run.py`
prints per set, next to each set's own figures.

`make bench-quality-pooled` runs both sets' benches and then this over their `--dump-runs`
files; by hand:

    .venv/bin/python bench/quality/pooled.py \\
        ../shared/bench/docs-qa docs-qa.json bench/quality/npm-docs-qa npm-docs-qa.json

Every run named in all the files is compared with `--subject` (default `kgmesh fused`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run

MEASURES: list[tuple[str, Callable[[run.Scores], float]]] = [
    ("nDCG@10", lambda s: s.ndcg),
    ("R@8", lambda s: s.recall),
    ("hit@8", lambda s: s.hit),
    ("MRR@8", lambda s: s.mrr),
]


def load_runs(path: Path) -> dict[str, dict[str, run.Ranked]]:
    dumped = json.loads(path.read_text(encoding="utf-8"))
    return {
        name: {qid: run.Ranked([(cid, text) for cid, text in chunks]) for qid, chunks in by_query.items()}
        for name, by_query in dumped.items()
    }


def cell(label: str, diffs: list[float]) -> str:
    better = sum(d > 1e-9 for d in diffs)
    worse = sum(d < -1e-9 for d in diffs)
    mean = sum(diffs) / len(diffs)
    p = run.format_p(run.paired_randomization(diffs))
    return f"{label} {mean:+.3f} ({better}/{worse}, p {p})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pairs", nargs="+", help="DATASET RUNS_JSON, repeated")
    parser.add_argument("--subject", default="kgmesh fused", help="the run compared with the others")
    args = parser.parse_args()
    if len(args.pairs) % 2:
        parser.error("give a dataset folder and a --dump-runs file for each set")
    sets: list[tuple[str, run.Dataset, dict[str, dict[str, run.Ranked]]]] = []
    with tempfile.TemporaryDirectory(prefix="kgq-pooled-") as work:
        for i in range(0, len(args.pairs), 2):
            root, dump = Path(args.pairs[i]).resolve(), Path(args.pairs[i + 1])
            try:
                dataset = run.load_dataset(root, Path(work) / str(i))
            except run.BenchError as err:
                print(f"error: {err}", file=sys.stderr)
                return 2
            runs = load_runs(dump)
            missing = [q["_id"] for q in dataset.queries if q["_id"] not in runs.get(args.subject, {})]
            if args.subject not in runs or missing:
                print(f"error: {dump} has no `{args.subject}` ranking for {root.name}'s questions", file=sys.stderr)
                return 2
            sets.append((root.name, dataset, runs))
    others = [name for name in sets[0][2] if name != args.subject and all(name in r for _, _, r in sets)]
    total = sum(len(d.queries) for _, d, _ in sets)
    print(f"{args.subject} against each run; (better/worse questions, two-sided paired randomization p)")
    for other in others:
        print(f"\n{other}")
        pooled: dict[str, list[float]] = {label: [] for label, _ in MEASURES}
        for name, dataset, runs in sets:
            mine = run.per_query_scores(dataset, runs[args.subject])
            theirs = run.per_query_scores(dataset, runs[other])
            ids = [q["_id"] for q in dataset.queries]
            cells = []
            for label, value in MEASURES:
                diffs = [value(mine[q]) - value(theirs[q]) for q in ids]
                pooled[label].extend(diffs)
                cells.append(cell(label, diffs))
            print(f"  {name:<14}{len(dataset.queries):>4}  " + "; ".join(cells))
        print(f"  {'pooled':<14}{total:>4}  " + "; ".join(cell(label, pooled[label]) for label, _ in MEASURES))
    return 0


if __name__ == "__main__":
    sys.exit(main())

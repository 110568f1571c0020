"""The judged sets kept in this repository (bench/quality/npm-docs-qa and npm-libs-qa) still score
what they were written for (no binary needed): each corpus is the installed npm files it names,
byte for byte, and every answer phrase is verbatim in a file its question counts as relevant. A
Node.js wheel bump that changes those files fails here, not as quietly wrong figures in
`make bench-quality-npm` or `make bench-quality-libs`."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "bench" / "quality"))

import run as quality  # noqa: E402

NPM_DOCS_QA = REPO_ROOT / "bench" / "quality" / "npm-docs-qa"
NPM_LIBS_QA = REPO_ROOT / "bench" / "quality" / "npm-libs-qa"
KINDS = {"paraphrased", "lexical", "exact", "navigational"}
# Each kept set: its folder, question count and kinds.
SETS = [
    pytest.param(NPM_DOCS_QA, 59, {"paraphrased": 24, "lexical": 20, "exact": 10, "navigational": 5}, id="npm-docs-qa"),
    pytest.param(NPM_LIBS_QA, 60, {"paraphrased": 24, "lexical": 20, "exact": 10, "navigational": 6}, id="npm-libs-qa"),
]


@pytest.mark.parametrize(("root", "questions", "kinds"), SETS)
def test_the_corpus_is_the_one_the_questions_were_written_for(
    root: Path, questions: int, kinds: dict, tmp_path: Path
) -> None:
    dataset = quality.load_dataset(root, tmp_path)
    source = json.loads((root / "corpus-source.json").read_text(encoding="utf-8"))
    assert quality.corpus_digest(dataset.corpus_dir, ".md") == (source["files"], source["sha256"])
    assert dataset.ids_are_paths, "corpus-ids are paths under the package folder"
    # Only the corpus files are ingested: npm's node_modules holds code beside the Markdown.
    ingested = [p for p in dataset.corpus_dir.rglob("*") if p.is_file()]
    assert len(ingested) == source["files"], sorted(p.name for p in ingested if p.suffix != ".md")[:5]


@pytest.mark.parametrize(("root", "questions", "kinds"), SETS)
def test_the_questions_are_judged_and_their_phrases_verbatim(
    root: Path, questions: int, kinds: dict, tmp_path: Path
) -> None:
    dataset = quality.load_dataset(root, tmp_path)
    ids = [query["_id"] for query in dataset.queries]
    assert len(ids) == len(set(ids)) == questions
    assert Counter(query["metadata"]["kind"] for query in dataset.queries) == kinds
    assert set(dataset.answers) == set(ids) == set(dataset.qrels)
    for query in dataset.queries:
        qid = query["_id"]
        assert query["metadata"]["kind"] in KINDS, qid
        relevant = dataset.qrels[qid]
        assert 1 <= len(relevant) <= 3, f"{qid}: {sorted(relevant)}"
        assert all((dataset.corpus_dir / path).is_file() for path in relevant), qid
        answer = dataset.answers[qid]
        assert answer["path"] in relevant, qid
        assert 6 <= len(answer["phrase"].split()) <= 15, qid
        text = (dataset.corpus_dir / answer["path"]).read_text(encoding="utf-8")
        verbatim = quality.norm_ws(answer["phrase"]) in quality.norm_ws(text)
        assert verbatim, f"{qid}: phrase not verbatim in {answer['path']}"


def test_a_changed_corpus_is_refused(tmp_path: Path) -> None:
    source = json.loads((NPM_DOCS_QA / "corpus-source.json").read_text(encoding="utf-8"))
    for name in ("queries.jsonl", "qrels.tsv", "answers.jsonl"):
        (tmp_path / name).write_bytes((NPM_DOCS_QA / name).read_bytes())
    (tmp_path / "corpus-source.json").write_text(json.dumps({**source, "sha256": "0" * 64}), encoding="utf-8")
    with pytest.raises(quality.BenchError, match="not the 83 files with digest 0000"):
        quality.load_dataset(tmp_path, tmp_path / "work")


def test_the_paired_test_tells_a_consistent_gain_from_noise() -> None:
    assert quality.paired_randomization([]) == 1.0
    assert quality.paired_randomization([0.0] * 30) == 1.0
    # Twenty questions all a little better: no sign flip reaches the observed mean but all
    # positive (and all negative, two-sided), 2 in 2^20.
    assert quality.paired_randomization([0.1] * 20) < 0.001
    # Equal gains and losses average to nothing.
    assert quality.paired_randomization([0.5, -0.5] * 10) == 1.0
    # One large gain among ties is no evidence.
    assert quality.paired_randomization([1.0] + [0.0] * 29) > 0.9
    assert quality.format_p(0.00005) == "<0.001"
    assert quality.format_p(0.0786) == "0.079"

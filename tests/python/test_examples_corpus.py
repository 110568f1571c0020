"""The example corpus keeps the properties the end-to-end tests rely on (no binary needed):
each searched phrase lives in exactly one file, the runbook outline is the one the tests expect,
links resolve except the one broken on purpose, and the files are clean UTF-8 with LF endings."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from kgmesh_support import (
    EXAMPLES_DIR,
    RUNBOOK,
    RUNBOOK_OUTLINE,
    TARGETS,
    Target,
    heading_trail,
    markdown_headings,
    read_example,
)

TEXT_SUFFIXES = {".md", ".txt", ".csv", ".json"}
# The one link that points nowhere, so link checkers and the link graph have a dangling edge.
INTENTIONALLY_BROKEN = {("handbook/security/incident-response.md", "../templates/postmortem.md")}
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def ingested_text_files() -> list[Path]:
    """Every text file `kgmesh ingest examples/` sends to `demo`."""
    return sorted(path for path in EXAMPLES_DIR.rglob("*") if path.is_file() and path.suffix in TEXT_SUFFIXES)


def corpus_files() -> list[Path]:
    # examples/shop is another corpus with its own rules; it is still ingested into demo.
    return [path for path in ingested_text_files() if path.relative_to(EXAMPLES_DIR).parts[0] != "shop"]


def rel(path: Path) -> str:
    return path.relative_to(EXAMPLES_DIR).as_posix()


def github_slug(title: str) -> str:
    slug = re.sub(r"[^\w\- ]", "", title.strip().lower())
    return slug.replace(" ", "-")


def test_corpus_is_clean_utf8_with_lf() -> None:
    files = corpus_files()
    assert len([f for f in files if f.suffix == ".md"]) >= 8
    for path in files:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
        assert b"\r" not in raw, f"{rel(path)} has CR line endings"
        assert text.endswith("\n"), f"{rel(path)} does not end with a newline"


@pytest.mark.parametrize("target", TARGETS, ids=[t.id for t in TARGETS])
def test_each_searched_phrase_is_in_exactly_one_file(target: Target) -> None:
    files = ingested_text_files()
    holders = [rel(p) for p in files if target.phrase.lower() in p.read_text(encoding="utf-8").lower()]
    assert holders == [target.path]
    query_holders = [
        rel(p)
        for p in files
        if all(word in p.read_text(encoding="utf-8").lower() for word in target.query.lower().split())
    ]
    assert query_holders == [target.path], f"every word of {target.query!r} occurs in {query_holders}"


def test_runbook_outline_matches_the_file() -> None:
    headings = markdown_headings(read_example(RUNBOOK.path))
    assert [(h.title, h.depth) for h in headings] == list(RUNBOOK_OUTLINE)
    content = read_example(RUNBOOK.path)
    phrase_at = content.index(RUNBOOK.phrase)
    assert [h.title for h in heading_trail(content, phrase_at)] == [
        "Deploy runbook",
        "Production rollout",
        "Blue-green cutover",
    ]
    # The fenced bash block's comment lines look like headings and must not count as ones.
    assert "# build the release images from the tagged commit" in content


def test_relative_links_resolve_except_the_broken_one() -> None:
    broken: set[tuple[str, str]] = set()
    external = 0
    for path in corpus_files():
        if path.suffix != ".md":
            continue
        for href in _LINK.findall(path.read_text(encoding="utf-8")):
            if href.startswith("https://"):
                external += 1
                continue
            target, _, anchor = href.partition("#")
            resolved = (path.parent / target).resolve()
            if not resolved.exists():
                broken.add((rel(path), href))
                continue
            if anchor:
                slugs = {github_slug(h.title) for h in markdown_headings(resolved.read_text(encoding="utf-8"))}
                assert anchor in slugs, f"{rel(path)} links to #{anchor}, which {href} does not have"
    assert broken == INTENTIONALLY_BROKEN
    assert external >= 2


def test_offices_page_has_non_ascii_beyond_the_bmp() -> None:
    text = read_example("handbook/offices.md")
    assert any(ord(ch) > 0xFFFF for ch in text), "the emoji checks code-point offsets"
    assert "Zürich" in text and "東京" in text
    # The searched phrase comes after multi-byte text, so byte and code-point offsets differ there.
    before = text[: text.index(TARGETS[1].phrase)]
    assert len(before.encode("utf-8")) > len(before)


def test_data_files_parse() -> None:
    with open(EXAMPLES_DIR / "data" / "regions.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert "Market Value (AUD)" in rows[0]
    assert float(rows[0]["Market Value (AUD)"]) == 1250000.50
    assert any('"soft launch"' in row["Notes"] for row in rows)
    catalogue = json.loads((EXAMPLES_DIR / "data" / "services.json").read_text(encoding="utf-8"))
    assert {service["name"] for service in catalogue["services"]} >= {"petal-api", "stem-scheduler"}

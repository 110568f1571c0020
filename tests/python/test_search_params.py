"""kg_search and kg_entity_search parameters and trace fields end to end, over Streamable HTTP
with the official MCP SDK, on the session mesh (no embeddings).

A small corpus of our own goes into three fresh namespaces after a TBox with declared
organisations, people and a `works_at` relation template is published for each, so the
indexer writes entities, mentions and REL edges. The tests cover kg_entity_search (type
labels, degree, role, evidence packages, limits), every filter, co_annotation grounding,
ranking.rrfK / laneWeights / minScore, interleaving by rank over several namespaces, caps over
the hard max failing closed, tokenBudget, trace.missingOffsets for chunks that lost their
offsets, and a namespace whose graph breaks mid-test soft-failing while the others answer.
Last, the plan of every graph query the indexer and the read tools send (no scan of a whole
label but four named ones).
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from kgmesh_support import (
    Mesh,
    MeshError,
    Principal,
    call_ok,
    call_tool,
    expect_rejected,
    falkordb_port,
    graph_key,
    mcp_http,
    redis,
)

pytestmark = pytest.mark.anyio

NS = "sparams"
NS_TWIN = "sparams-twin"
NS_FRAGILE = "sparams-fragile"
# Twelve entities of one name family, each mentioned by three files of its own.
NS_MANY = "sparams-many"
MANY_NAMES = ["Alpha", "Bravo", "Charlie", "Delta", "Echo", "Foxtrot", "Golf", "Hotel", "India", "Juliet", "Kilo", "Lima"]
# An entity whose key would be over the 256 bytes every service takes if written whole.
LONG_NAME = "Consolidated " + " ".join(f"Turbine Blade Works Division {n}" for n in range(1, 11))

TBOX = """\
entity_types:
  - type_id: org
    label: Organization
    instances:
      - name: Acme
        aliases: [Acme Corporation]
      - name: Zephyr
  - type_id: person
    label: Person
    instances:
      - name: Dana Scully
relation_types:
  - relation_type_id: works_at
    label: works at
    source_type_id: person
    target_type_id: org
    patterns: ["{source} works at {target}"]
"""

CORPUS = {
    "contracts/acme-zephyr.md": """\
---
title: Acme and Zephyr supply contract
date: 2024-03-15
collections: [legal]
effective_from: 2024-04-01
effective_to: 2025-03-31
---
# Supply contract

Acme signed the quarterly supply contract with Zephyr. The contract covers turbine blades.
""",
    "people/staff.md": """\
---
title: Staff directory
date: 2023-06-01
collections: [hr]
---
# Staff

Dana Scully works at Acme. She negotiates the turbine blades orders.
""",
    "notes/turbines.md": """\
---
title: Turbine notes
date: 2022-01-10
---
# Turbine notes

Zephyr tests turbine blades in a wind tunnel every spring.
""",
}

QUERY = "turbine blades"


def _write_corpus(root: Path) -> None:
    for path, text in CORPUS.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def _publish_and_ingest(mesh: Mesh, tbox: Path, root: Path, namespaces: list[str]) -> None:
    """Per namespace: the TBox drafted, reviewed and published, then the corpus ingested."""
    try:
        for ns in namespaces:
            mesh.publish_tbox(ns, tbox)
            mesh.ingest(root, ns)
    except MeshError as err:
        pytest.fail(str(err), pytrace=False)


@pytest.fixture(scope="module")
def many(mesh: Mesh, tmp_path_factory: pytest.TempPathFactory) -> str:
    """NS_MANY: a TBox of twelve `Fabrikam <name>` plants, each mentioned by three files, and
    one entity of a very long name, mentioned by two."""
    work = tmp_path_factory.mktemp("search-many")
    instances = "\n".join(f"      - name: Fabrikam {name}" for name in MANY_NAMES)
    tbox = work / "tbox.yaml"
    tbox.write_text(
        f"entity_types:\n  - type_id: plant\n    label: Plant\n    instances:\n{instances}\n"
        f"  - type_id: works\n    label: Works\n    instances:\n      - name: {LONG_NAME}\n",
        encoding="utf-8",
    )
    root = work / "corpus"
    for part in ("north", "south"):
        target = root / "works" / f"{part}.md"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"# The {part} site\n\n{LONG_NAME} runs the {part} site.\n", encoding="utf-8")
    for name in MANY_NAMES:
        for visit in range(3):
            target = root / "plants" / f"{name.lower()}-{visit}.md"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(f"# Visit {visit}\n\nFabrikam {name} passed inspection number {visit}.\n", encoding="utf-8")
    _publish_and_ingest(mesh, tbox, root, [NS_MANY])
    return NS_MANY


@pytest.fixture(scope="module")
def corpus(mesh: Mesh, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The TBox published and the corpus ingested into NS, NS_TWIN and NS_FRAGILE."""
    work = tmp_path_factory.mktemp("search-params")
    tbox = work / "tbox.yaml"
    tbox.write_text(TBOX, encoding="utf-8")
    root = work / "corpus"
    _write_corpus(root)
    _publish_and_ingest(mesh, tbox, root, [NS, NS_TWIN, NS_FRAGILE])
    return NS


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def paths(result: dict[str, Any]) -> list[str]:
    return [hit["path"] for hit in result["results"]]


async def search(client: Any, **arguments: Any) -> dict[str, Any]:
    arguments.setdefault("namespaces", [NS])
    return await call_ok(client, "kg_search", arguments)


# ---------------------------------------------------------------------------------------------
# kg_entity_search
# ---------------------------------------------------------------------------------------------


async def test_entity_search_returns_types_degree_role_and_evidence(mesh: Mesh, corpus: str) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        found = await call_ok(client, "kg_entity_search", {"text": "Acme", "namespaces": [corpus]})
        acme = next((h for h in found["hits"] if h["name"] == "Acme"), None)
        assert acme is not None, found
        assert acme["namespace"] == corpus
        assert acme["entityKey"] == "ent:org:acme"
        assert acme["typeId"] == "org" and "Organization" in acme["typeLabels"], acme
        # Mentioned by the contract and the staff directory.
        assert acme["degree"] == 2, acme
        assert acme["role"] == "bridge", "two mentioning chunks is far under the bridge limit"
        evidence = {p["path"] for p in acme["evidence"]}
        assert evidence == {"contracts/acme-zephyr.md", "people/staff.md"}, acme["evidence"]
        for package in acme["evidence"]:
            assert "Acme" in package["text"], package
            assert package["citation"].startswith(f"{corpus}/{package['path']}"), package
        assert acme["evidenceTruncated"] is False
        # No embeddings on this mesh: the default mode is text, and the trace says so.
        [ns_trace] = found["trace"]["namespaces"]
        assert (ns_trace["namespace"], ns_trace["ok"], ns_trace["mode"]) == (corpus, True, "text"), ns_trace
        assert [(s["side"], s["ok"]) for s in ns_trace["sides"]] == [("text", True)], ns_trace

        # By alias, and with evidence capped at one package.
        alias = await call_ok(
            client, "kg_entity_search", {"text": "Acme Corporation", "namespaces": [corpus], "evidenceLimit": 1}
        )
        hit = next(h for h in alias["hits"] if h["entityKey"] == "ent:org:acme")
        assert len(hit["evidence"]) == 1 and hit["evidenceTruncated"] is True, hit
        assert hit["degree"] == 2

        person = await call_ok(client, "kg_entity_search", {"text": "Dana Scully", "namespaces": [corpus], "limit": 1})
        assert len(person["hits"]) == 1
        dana = person["hits"][0]
        assert (dana["entityKey"], dana["typeLabels"]) == ("ent:person:dana scully", ["Person"])

        nothing = await call_ok(client, "kg_entity_search", {"text": "Initech", "namespaces": [corpus]})
        assert nothing["hits"] == []

        for bad in ({"limit": 33}, {"evidenceLimit": 9}, {"limit": 0}, {"caps": {"mentions": 25}}):
            await expect_rejected(
                client, "kg_entity_search", {"text": "Acme", "namespaces": [corpus], **bad}, {"invalid_argument"}
            )


async def _entity_names(client: Any, namespace: str) -> set[str]:
    found = await call_ok(client, "kg_entity_search", {"text": "Acme Zephyr Dana Scully", "namespaces": [namespace]})
    return {hit["name"] for hit in found["hits"]}


async def _wait_for_entity_names(client: Any, namespace: str, want: set[str]) -> None:
    deadline = time.monotonic() + 60
    while (names := await _entity_names(client, namespace)) != want:
        assert time.monotonic() < deadline, f"entities {names} after the publish, expected {want}"
        await anyio.sleep(0.25)


async def test_a_tbox_published_after_the_ingest_reaches_the_files(
    mesh: Mesh, make_principal: Callable[..., Principal], tmp_path: Path
) -> None:
    """The order an adopter takes (ingest, read the candidates, then publish a TBox) gets the
    files their entities without a re-upload, and a later publish that drops a name removes it."""
    namespace = "sparams-late"
    root = tmp_path / "corpus"
    _write_corpus(root)
    mesh.ingest(root, namespace)
    tbox = tmp_path / "tbox.yaml"

    # The names the heuristics saw, counted over the caller's readable files only.
    listed = mesh.cli("tbox", "candidates", "--namespace", namespace)
    dana = next((c for c in listed["candidates"] if c["name"] == "Dana Scully"), None)
    assert dana == {"name": "Dana Scully", "kind": "proper_name", "files": 1, "count": 1,
                    "samplePaths": ["people/staff.md"]}, listed  # fmt: skip
    assert listed["total"] == len(listed["candidates"]) and listed["truncated"] is False, listed
    contracts_reader = make_principal("candidates-contracts")
    mesh.grant(contracts_reader.id, namespace, "read", prefix="contracts/")
    theirs = mesh.cli("tbox", "candidates", "--namespace", namespace, token=contracts_reader.token)
    assert all(c["samplePaths"] == ["contracts/acme-zephyr.md"] for c in theirs["candidates"]), theirs
    for bad, says in ((["--kind", "person"], "proper_name, acronym, identifier"), (["--limit", "1001"], "1000")):
        refused = mesh.run("tbox", "candidates", "--namespace", namespace, *bad)
        assert refused.returncode == 1 and "invalid_argument" in refused.stderr and says in refused.stderr, refused

    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        assert await _entity_names(client, namespace) == set()
        tbox.write_text(TBOX, encoding="utf-8")
        mesh.publish_tbox(namespace, tbox)
        await _wait_for_entity_names(client, namespace, {"Acme", "Zephyr", "Dana Scully"})
        contract = next(
            f for f in (await call_ok(client, "kg_files", {"namespace": namespace}))["files"]
            if f["path"] == "contracts/acme-zephyr.md"
        )
        entities = await call_ok(client, "kg_file_entities", {"namespace": namespace, "fileId": contract["fileId"]})
        assert {e["name"] for e in entities["entities"]} >= {"Acme", "Zephyr"}, entities
        # A name the TBox declares is no candidate any more.
        after = mesh.cli("tbox", "candidates", "--namespace", namespace)["candidates"]
        assert "Dana Scully" not in {c["name"] for c in after}, after

        tbox.write_text(TBOX.replace("      - name: Zephyr\n", ""), encoding="utf-8")
        mesh.publish_tbox(namespace, tbox)
        await _wait_for_entity_names(client, namespace, {"Acme", "Dana Scully"})


async def test_entity_search_reads_more_evidence_than_one_packages_call_holds(mesh: Mesh, many: str) -> None:
    """Twelve hits of three evidence chunks each is 36 keys, over the 32 one graph Packages call
    may name: every hit still gets its evidence. total and truncated count the matches."""
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        found = await call_ok(
            client, "kg_entity_search", {"text": "Fabrikam", "namespaces": [many], "limit": 12, "evidenceLimit": 3}
        )
        assert sorted(h["name"] for h in found["hits"]) == sorted(f"Fabrikam {n}" for n in MANY_NAMES), found["hits"]
        [ns_trace] = found["trace"]["namespaces"]
        assert "evidence" not in ns_trace, ns_trace
        for hit in found["hits"]:
            name = hit["name"].split()[-1].lower()
            assert hit["degree"] == 3 and hit["evidenceTruncated"] is False, hit
            assert sorted(p["path"] for p in hit["evidence"]) == [f"plants/{name}-{v}.md" for v in range(3)], hit
        assert (found["total"], found["truncated"]) == (12, False), found
        assert "missingOffsets" not in found["trace"]

        first = await call_ok(client, "kg_entity_search", {"text": "Fabrikam", "namespaces": [many], "limit": 5})
        assert len(first["hits"]) == 5 and (first["total"], first["truncated"]) == (12, True), first
        one = await call_ok(client, "kg_entity_search", {"text": "Fabrikam Kilo", "namespaces": [many], "limit": 1})
        assert one["hits"][0]["name"] == "Fabrikam Kilo", one["hits"]


async def test_a_long_entity_name_keeps_a_key_every_tool_takes(mesh: Mesh, many: str) -> None:
    """A name too long to key whole is cut and hashed by the indexer: kg_entity_search returns a
    key that kg_open and kg_hop take (before, they refused it as over 256 bytes)."""
    assert len(f"ent:works:{LONG_NAME.lower()}".encode()) > 256
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        found = await call_ok(client, "kg_entity_search", {"text": "Consolidated", "namespaces": [many], "limit": 1})
        [hit] = found["hits"]
        assert hit["name"] == LONG_NAME and hit["degree"] == 2, hit
        key = hit["entityKey"]
        assert len(key.encode()) <= 256 and key.startswith("ent:works:consolidated turbine blade works"), key
        opened = await call_ok(client, "kg_open", {"namespace": many, "entityKey": key})
        assert sorted(p["path"] for p in opened["packages"]) == ["works/north.md", "works/south.md"], opened
        north = next(p for p in opened["packages"] if p["path"] == "works/north.md")
        hopped = await call_ok(client, "kg_hop", {"namespace": many, "fromKey": key, "kind": "mentions"})
        assert {p["path"] for p in hopped["packages"]} >= {"works/south.md"}, hopped
        from_chunk = await call_ok(client, "kg_hop", {"namespace": many, "fromKey": north["chunkKey"], "kind": "mentions"})
        assert [p["path"] for p in from_chunk["packages"]] == ["works/south.md"], from_chunk


async def test_entity_search_mode_argument(mesh: Mesh, corpus: str) -> None:
    """`mode` over MCP on a mesh without embeddings: text answers, vector is refused with a
    pointer to text, hybrid falls back to text and says why, an unknown mode is rejected."""
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        text = await call_ok(client, "kg_entity_search", {"text": "Acme", "namespaces": [corpus], "mode": "text"})
        assert text["hits"][0]["entityKey"] == "ent:org:acme", text["hits"]
        assert text["trace"]["namespaces"][0]["mode"] == "text"

        vector = await call_tool(client, "kg_entity_search", {"text": "Acme", "namespaces": [corpus], "mode": "vector"})
        error = vector.error()
        assert error["code"] == "failed_precondition", error
        assert "embeddings are not configured" in error["message"] and "use mode text" in error["message"], error

        hybrid = await call_ok(client, "kg_entity_search", {"text": "Acme", "namespaces": [corpus], "mode": "hybrid"})
        [ns_trace] = hybrid["trace"]["namespaces"]
        assert ns_trace["mode"] == "text", ns_trace
        assert [(s["side"], s["ok"], s.get("errorCode")) for s in ns_trace["sides"]] == [
            ("text", True, None),
            ("vector", False, "lane_unavailable"),
        ], ns_trace
        assert hybrid["hits"][0]["entityKey"] == "ent:org:acme"

        await expect_rejected(
            client, "kg_entity_search", {"text": "Acme", "namespaces": [corpus], "mode": "fuzzy"}, {"invalid_argument"}
        )


async def test_entity_search_counts_only_readable_mentions(
    mesh: Mesh, corpus: str, make_principal: Callable[..., Principal]
) -> None:
    reader = make_principal("notes-reader")
    mesh.grant(reader.id, corpus, "read", prefix="notes/")
    async with mcp_http(mesh.mcp_url, reader.token) as client:
        acme = await call_ok(client, "kg_entity_search", {"text": "Acme", "namespaces": [corpus]})
        assert all(h["entityKey"] != "ent:org:acme" for h in acme["hits"]), "no readable chunk mentions Acme"
        zephyr = await call_ok(client, "kg_entity_search", {"text": "Zephyr", "namespaces": [corpus]})
        hit = next(h for h in zephyr["hits"] if h["entityKey"] == "ent:org:zephyr")
        assert hit["degree"] == 1, "the contract's mention is not readable"
        assert [p["path"] for p in hit["evidence"]] == ["notes/turbines.md"]


async def test_a_search_over_more_namespaces_than_an_audit_event_lists_is_still_audited(
    mesh: Mesh, corpus: str, make_principal: Callable[..., Principal]
) -> None:
    """A search naming no namespace covers every readable one; for a caller with 65 of them the
    audit event lists 64 and counts the rest (before, auth refused the event and it was lost)."""
    wide = make_principal("wide-reader")
    names = [corpus] + [f"sparams-wide-{i:02d}" for i in range(64)]
    for ns in names[1:]:
        mesh.cli("ns", "create", ns)
    for ns in names:
        mesh.grant(wide.id, ns, "read")
    async with mcp_http(mesh.mcp_url, wide.token) as client:
        await call_tool(client, "kg_search", {"query": QUERY})
    deadline = time.monotonic() + 10
    while True:
        listed = mesh.cli("audit", "--tool", "kg_search", "--principal", wide.id, "--limit", "10")
        if listed["events"] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    [event] = listed["events"]
    assert len(event["namespaces"]) == 64 and event["moreNamespaces"] == 1, event
    assert set(event["namespaces"]) < set(names), event


# ---------------------------------------------------------------------------------------------
# Filters
# ---------------------------------------------------------------------------------------------


async def test_every_filter_narrows_the_search(mesh: Mesh, corpus: str) -> None:
    everything = set(CORPUS)
    cases: list[tuple[dict[str, Any], set[str]]] = [
        ({}, everything),
        ({"collections": ["legal"]}, {"contracts/acme-zephyr.md"}),
        ({"collections": ["hr", "legal"]}, {"contracts/acme-zephyr.md", "people/staff.md"}),
        ({"collections": ["nothing"]}, set()),
        ({"folderPrefix": "notes/"}, {"notes/turbines.md"}),
        ({"folderPrefix": "/people"}, {"people/staff.md"}),
        ({"dateFrom": "2024-01-01"}, {"contracts/acme-zephyr.md"}),
        ({"dateTo": "2023-12-31"}, {"people/staff.md", "notes/turbines.md"}),
        ({"dateFrom": "2023-01-01", "dateTo": "2023-12-31"}, {"people/staff.md"}),
        ({"effectiveAt": "2024-06-01"}, {"contracts/acme-zephyr.md"}),
        ({"effectiveAt": "2026-01-01"}, set()),
        # Chunks whose entities take part in a works_at relation: Dana Scully and Acme do,
        # Zephyr alone (the turbine notes) does not.
        ({"relationTypeIds": ["works_at"]}, {"people/staff.md", "contracts/acme-zephyr.md"}),
        ({"relationTypeIds": ["owns"]}, set()),
        ({"collections": ["legal"], "folderPrefix": "notes/"}, set()),
    ]
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        for filters, expected in cases:
            result = await search(client, query=QUERY, lanes=["fulltext"], filters=filters)
            assert set(paths(result)) == expected, (filters, paths(result))
            assert result["total"] == len(result["results"]), (filters, result["total"])
        # The graph lanes honour the filters too.
        co = await search(
            client, query="Acme and Zephyr", lanes=["co_annotation"], filters={"folderPrefix": "notes/"}
        )
        assert co["results"] == [], co["results"]
        for bad in (
            {"dateFrom": "2024-02-30"},
            {"dateFrom": "2025-01-01", "dateTo": "2024-01-01"},
            {"folderPrefix": "a/../b"},
            {"collections": ["c"] * 65},
            {"unknown": 1},
        ):
            await expect_rejected(
                client, "kg_search", {"query": QUERY, "namespaces": [corpus], "filters": bad}, {"invalid_argument"}
            )
        # A refusal names the field as the caller spelled it.
        for bad, field in (
            ({"dateFrom": "2024-02-30"}, "filters.dateFrom"),
            ({"dateFrom": "2025-01-01", "dateTo": "2024-01-01"}, "filters.dateTo"),
            ({"effectiveAt": "soon"}, "filters.effectiveAt"),
            ({"folderPrefix": "a/../b"}, "filters.folderPrefix"),
            ({"relationTypeIds": ["r"] * 65}, "filters.relationTypeIds"),
        ):
            outcome = await call_tool(
                client, "kg_search", {"query": QUERY, "namespaces": [corpus], "lanes": ["fulltext"], "filters": bad}
            )
            error = outcome.error()
            assert error["code"] == "invalid_argument" and field in error["message"], (bad, error)


async def test_packages_carry_dates_and_every_package_tool_takes_a_token_budget(mesh: Mesh, corpus: str) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        result = await search(client, query=QUERY, lanes=["fulltext"])
        dates = {hit["path"]: hit["dates"] for hit in result["results"]}
        assert dates["contracts/acme-zephyr.md"] == {
            "documentDate": "2024-03-15",
            "effectiveFrom": "2024-04-01",
            "effectiveTo": "2025-03-31",
            "collections": ["legal"],
        }, dates
        assert dates["people/staff.md"]["collections"] == ["hr"], dates
        assert "effectiveFrom" not in dates["people/staff.md"], dates
        # kg_open and kg_hop take tokenBudget as kg_search does.
        file_id = next(hit["fileId"] for hit in result["results"] if hit["path"] == "contracts/acme-zephyr.md")
        opened = await call_ok(client, "kg_open", {"namespace": corpus, "fileId": file_id, "tokenBudget": 1})
        assert opened["tokenBudget"]["budget"] == 1 and opened["tokenBudget"]["truncated"], opened
        first = opened["packages"][0]
        assert first.get("textTruncated") or first.get("textOmitted"), first
        assert opened["packages"][0]["dates"]["collections"] == ["legal"], opened["packages"][0]
        found = await call_ok(client, "kg_entity_search", {"text": "Acme", "namespaces": [corpus], "tokenBudget": 1})
        assert found["trace"]["tokenBudget"]["budget"] == 1, found["trace"]
        assert found["trace"]["tokenBudget"]["truncated"], found["trace"]


# ---------------------------------------------------------------------------------------------
# co_annotation grounding
# ---------------------------------------------------------------------------------------------


async def test_co_annotation_grounding_reports_roles_pair_and_counts(mesh: Mesh, corpus: str) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        default = await search(client, query="Acme and Zephyr contract")
        assert "grounding" not in default and "grounding" not in default["trace"], "co_annotation is opt-in"
        assert {lane["lane"] for lane in default["trace"]["lanes"]} == {"fulltext", "vector", "graph_expand"}
        # The tool schema advertises the defaults the service applies.
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        properties = tools["kg_search"].input_schema["properties"]
        assert properties["lanes"]["default"] == [lane["lane"] for lane in default["trace"]["lanes"]], properties["lanes"]
        ranking = properties["ranking"]["properties"]
        assert ranking["rrfK"]["default"] == 60
        assert ranking["laneWeights"]["default"] == {lane: 1 for lane in properties["lanes"]["items"]["enum"]}
        # This mesh has no embeddings: the vector lane says so, in words an agent can act on.
        vector_lane = next(lane for lane in default["trace"]["lanes"] if lane["lane"] == "vector")
        assert (vector_lane["ok"], vector_lane["errorCode"]) == (False, "lane_unavailable"), vector_lane
        assert "needs embeddings" in vector_lane["message"], vector_lane
        assert all("message" not in lane for lane in default["trace"]["lanes"] if lane["ok"])

        direct = await search(client, query="Acme and Zephyr contract", lanes=["co_annotation"])
        [grounding] = direct["grounding"]
        assert grounding["namespace"] == corpus
        entities = {e["entityKey"]: e for e in grounding["entities"]}
        assert {"ent:org:acme", "ent:org:zephyr"} <= set(entities), grounding
        assert entities["ent:org:acme"]["role"] == "bridge" and entities["ent:org:acme"]["degree"] == 2
        assert entities["ent:org:zephyr"]["phrase"].lower() == "zephyr"
        assert sorted(grounding["pair"]) == ["ent:org:acme", "ent:org:zephyr"], grounding
        assert grounding["directCount"] == 1, "only the contract mentions both"
        assert "reason" not in grounding, grounding
        assert paths(direct)[0] == "contracts/acme-zephyr.md", paths(direct)
        [lane] = direct["trace"]["lanes"]
        assert (lane["lane"], lane["ok"]) == ("co_annotation", True)

        # Dana Scully and Zephyr share no chunk; the contract mentions Zephyr and Acme, and
        # Acme is in a works_at relation with Dana Scully: one bridge.
        bridged = await search(client, query="Dana Scully and Zephyr", lanes=["co_annotation"])
        [grounding] = bridged["grounding"]
        assert sorted(grounding["pair"]) == ["ent:org:zephyr", "ent:person:dana scully"], grounding
        assert grounding["directCount"] == 0, grounding
        assert grounding["bridgeCount"] >= 1, grounding

        one = await search(client, query="What does Zephyr test?", lanes=["co_annotation"])
        [grounding] = one["grounding"]
        assert grounding["reason"] == "too_few_bridges", grounding
        assert grounding["pair"] == [] and one["results"] == []

        none = await search(client, query="wind tunnel schedule", lanes=["co_annotation"])
        [grounding] = none["grounding"]
        assert grounding["reason"] == "no_grounded_entities" and grounding["entities"] == [], grounding


# ---------------------------------------------------------------------------------------------
# Ranking
# ---------------------------------------------------------------------------------------------


async def test_ranking_rrf_k_lane_weights_and_min_score(mesh: Mesh, corpus: str) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        plain = await search(client, query=QUERY, lanes=["fulltext"])
        assert len(plain["results"]) >= 2, paths(plain)
        # One lane: rank r displays (k + 1) / (k + r).
        assert plain["results"][0]["score"] == pytest.approx(1.0)
        assert plain["results"][1]["score"] == pytest.approx(61 / 62)
        # Each hit says which lanes ranked it, where, and the lane's own score before fusion.
        assert [[(lane["lane"], lane["rank"]) for lane in r["lanes"]] for r in plain["results"]] == [
            [("fulltext", i)] for i in range(1, len(plain["results"]) + 1)
        ]
        bm25 = [r["lanes"][0]["score"] for r in plain["results"]]
        assert bm25 == sorted(bm25, reverse=True) and bm25[-1] > 0, bm25
        small_k = await search(client, query=QUERY, lanes=["fulltext"], ranking={"rrfK": 1})
        assert paths(small_k) == paths(plain), "k changes scores, not a single lane's order"
        assert small_k["results"][1]["score"] == pytest.approx(2 / 3)

        strict = await search(client, query=QUERY, lanes=["fulltext"], ranking={"minScore": 0.99})
        assert [r["chunkKey"] for r in strict["results"]] == [plain["results"][0]["chunkKey"]]
        assert strict["total"] == 1 and strict["truncated"] is False
        assert all(r["score"] >= 0.99 for r in strict["results"])

        # Two lanes; weighting one of them to zero leaves the other's order.
        lanes = ["fulltext", "co_annotation"]
        query = "Acme and Zephyr turbine blades"
        fulltext_only = await search(client, query=query, lanes=["fulltext"])
        co_only = await search(client, query=query, lanes=["co_annotation"])
        assert co_only["results"], "the contract mentions both organisations"
        muted = await search(client, query=query, lanes=lanes, ranking={"laneWeights": {"co_annotation": 0}})
        n = len(fulltext_only["results"])
        assert [r["chunkKey"] for r in muted["results"]][:n] == [r["chunkKey"] for r in fulltext_only["results"]]
        loud = await search(
            client, query=query, lanes=lanes, ranking={"laneWeights": {"fulltext": 0, "co_annotation": 5}}
        )
        assert loud["results"][0]["chunkKey"] == co_only["results"][0]["chunkKey"]
        assert loud["results"][0]["score"] == pytest.approx(1.0)
        # The contract names both organisations: co_annotation ranks it first with its direct
        # score (2); where the full-text lane ranked it too, the rank is the one its own list has.
        contract = loud["results"][0]
        ranked_by = {lane["lane"]: lane for lane in contract["lanes"]}
        assert (ranked_by["co_annotation"]["rank"], ranked_by["co_annotation"]["score"]) == (1, 2.0), contract["lanes"]
        fulltext_keys = [r["chunkKey"] for r in fulltext_only["results"]]
        if contract["chunkKey"] in fulltext_keys:
            assert ranked_by["fulltext"]["rank"] == fulltext_keys.index(contract["chunkKey"]) + 1, contract["lanes"]
        elif "fulltext" in ranked_by:
            assert ranked_by["fulltext"]["rank"] > len(fulltext_keys), contract["lanes"]
        for bad in ({"rrfK": 0}, {"minScore": 1.5}, {"laneWeights": {"bm25": 1}}, {"laneWeights": {"fulltext": -1}}):
            await expect_rejected(
                client, "kg_search", {"query": QUERY, "namespaces": [corpus], "ranking": bad}, {"invalid_argument"}
            )


# ---------------------------------------------------------------------------------------------
# Several namespaces
# ---------------------------------------------------------------------------------------------


async def test_namespaces_interleave_by_rank(mesh: Mesh, corpus: str) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        first = await search(client, query=QUERY, lanes=["fulltext"], namespaces=[NS])
        twin = await search(client, query=QUERY, lanes=["fulltext"], namespaces=[NS_TWIN])
        assert len(first["results"]) == len(twin["results"]) == 3
        both = await search(client, query=QUERY, lanes=["fulltext"], namespaces=[NS, NS_TWIN], topK=5)
        got = [(r["namespace"], r["chunkKey"]) for r in both["results"]]
        a = [(NS, r["chunkKey"]) for r in first["results"]]
        b = [(NS_TWIN, r["chunkKey"]) for r in twin["results"]]
        # Rank 1 of each namespace, then rank 2 of each, ...: never ordered by raw score.
        assert got == [a[0], b[0], a[1], b[1], a[2]], got
        assert both["total"] == first["total"] + twin["total"] and both["truncated"] is True
        assert [n["namespace"] for n in both["trace"]["namespaces"]] == [NS, NS_TWIN]
        assert all(n["ok"] for n in both["trace"]["namespaces"])
        assert {(lane["namespace"], lane["lane"]) for lane in both["trace"]["lanes"]} == {
            (NS, "fulltext"),
            (NS_TWIN, "fulltext"),
        }


# ---------------------------------------------------------------------------------------------
# Caps and tokenBudget
# ---------------------------------------------------------------------------------------------


async def test_caps_over_the_hard_max_fail_closed(mesh: Mesh, corpus: str) -> None:
    over = [
        {"topK": 33},
        {"tokenBudget": 0},
        {"caps": {"mentions": 25}},
        {"caps": {"rel": 25}},
        {"caps": {"ancestors": 13}},
        {"caps": {"siblings": 25}},
        {"caps": {"children": 25}},
        {"caps": {"similar": 17}},
    ]
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        for extra in over:
            outcome_code = await expect_rejected(
                client, "kg_search", {"query": QUERY, "namespaces": [corpus], **extra}, {"invalid_argument"}
            )
            assert outcome_code in {"invalid_argument", "invalid_params"}
        # Exactly at every hard max is accepted.
        at_max = await search(
            client,
            query=QUERY,
            topK=32,
            caps={"mentions": 24, "rel": 24, "ancestors": 12, "siblings": 24, "children": 24, "similar": 16},
        )
        assert at_max["results"]
        # A cap under the list's length cuts it and says how many there were.
        one = await search(client, query="Acme supply contract", lanes=["fulltext"], caps={"mentions": 1})
        contract = next(r for r in one["results"] if r["path"] == "contracts/acme-zephyr.md")
        assert len(contract["mentions"]) == 1, contract["mentions"]
        assert contract["counts"]["mentions"] == {"total": 2, "truncated": True}, contract.get("counts")
        # 0 is "none of this list", not "the default": empty, with the total still counted.
        zero = await search(client, query="Acme supply contract", lanes=["fulltext"], caps={"mentions": 0})
        contract = next(r for r in zero["results"] if r["path"] == "contracts/acme-zephyr.md")
        assert contract.get("mentions", []) == [], contract["mentions"]
        assert contract["counts"]["mentions"] == {"total": 2, "truncated": True}, contract.get("counts")


async def test_token_budget_truncates_then_omits_in_order(mesh: Mesh, corpus: str) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        full = await search(client, query=QUERY, lanes=["fulltext"])
        assert "tokenBudget" not in full["trace"]
        tokens = [r["position"]["tokenCount"] for r in full["results"]]
        assert len(tokens) == 3 and all(t > 1 for t in tokens), tokens

        budget = tokens[0] + tokens[1] // 2
        cut = await search(client, query=QUERY, lanes=["fulltext"], tokenBudget=budget)
        assert [r["chunkKey"] for r in cut["results"]] == [r["chunkKey"] for r in full["results"]], "order is kept"
        first, second, third = cut["results"]
        assert first["text"] == full["results"][0]["text"] and "textTruncated" not in first
        assert second["textTruncated"] is True and "textOmitted" not in second
        assert 0 < len(second["text"]) < len(full["results"][1]["text"])
        assert full["results"][1]["text"].startswith(second["text"])
        assert third["text"] == "" and third["textOmitted"] is True
        report = cut["trace"]["tokenBudget"]
        assert report == {"budget": budget, "used": budget, "omitted": 1, "truncated": True}, report

        roomy = await search(client, query=QUERY, lanes=["fulltext"], tokenBudget=sum(tokens))
        assert [r["text"] for r in roomy["results"]] == [r["text"] for r in full["results"]]
        assert roomy["trace"]["tokenBudget"] == {
            "budget": sum(tokens),
            "used": sum(tokens),
            "omitted": 0,
            "truncated": False,
        }


# ---------------------------------------------------------------------------------------------
# Graph damage: chunks without offsets, and a namespace whose graph breaks
# ---------------------------------------------------------------------------------------------


async def test_missing_offsets_and_a_broken_namespace_soft_fails(mesh: Mesh, corpus: str) -> None:
    port = falkordb_port(mesh)
    key = graph_key(NS_FRAGILE)
    backup = f"{key}_backup_{port}"
    # Chunks of the turbine notes lose their offsets, as an indexer from before offsets wrote them.
    stripped = redis(
        port,
        "GRAPH.QUERY",
        key,
        "MATCH (c:Chunk) WHERE c.path = 'notes/turbines.md' SET c.charStart = NULL, c.charEnd = NULL RETURN count(c)",
    )
    assert not isinstance(stripped, RuntimeError), stripped
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        result = await search(client, query=QUERY, lanes=["fulltext"], namespaces=[NS_FRAGILE, NS])
        reported = result["trace"]["missingOffsets"]
        assert [(m["namespace"], m["path"]) for m in reported] == [(NS_FRAGILE, "notes/turbines.md")], reported
        notes = [r for r in result["results"] if (r["namespace"], r["path"]) == (NS_FRAGILE, "notes/turbines.md")]
        assert notes and reported[0]["chunkKeys"] == [r["chunkKey"] for r in notes]
        assert reported[0]["fileId"] == notes[0]["fileId"]
        assert "turbine blades" in notes[0]["text"], "the package still carries its text"
        elsewhere = await search(client, query=QUERY, lanes=["fulltext"], namespaces=[NS])
        assert "missingOffsets" not in elsewhere["trace"]
        # Every tool that returns packages reports them: entity evidence, kg_open and kg_hop.
        zephyr = await call_ok(client, "kg_entity_search", {"text": "Zephyr", "namespaces": [NS_FRAGILE, NS]})
        evidence = [
            p for h in zephyr["hits"] for p in h["evidence"] if (p["namespace"], p["path"]) == (NS_FRAGILE, "notes/turbines.md")
        ]
        assert evidence, zephyr["hits"]
        assert [(m["namespace"], m["path"], m["chunkKeys"]) for m in zephyr["trace"]["missingOffsets"]] == [
            (NS_FRAGILE, "notes/turbines.md", [evidence[0]["chunkKey"]])
        ], zephyr["trace"]
        opened = await call_ok(client, "kg_open", {"namespace": NS_FRAGILE, "chunkKey": notes[0]["chunkKey"]})
        assert [m["path"] for m in opened["trace"]["missingOffsets"]] == ["notes/turbines.md"], opened
        healthy = await call_ok(client, "kg_open", {"namespace": NS, "chunkKey": elsewhere["results"][0]["chunkKey"]})
        assert "trace" not in healthy, healthy

        # Keep a copy, then replace the graph with a plain string: every query on it fails.
        copied = redis(port, "GRAPH.COPY", key, backup)
        assert not isinstance(copied, RuntimeError), copied
        try:
            assert not isinstance(redis(port, "GRAPH.DELETE", key), RuntimeError)
            assert redis(port, "SET", key, "not a graph") == "OK"

            outcome = await call_tool(
                client, "kg_search", {"query": QUERY, "namespaces": [NS, NS_FRAGILE], "lanes": ["fulltext"]}
            )
            assert not outcome.is_error, outcome.data
            broken = outcome.data
            assert {r["namespace"] for r in broken["results"]} == {NS}, "the healthy namespace still answers"
            assert len(broken["results"]) == 3
            trace = {n["namespace"]: n for n in broken["trace"]["namespaces"]}
            assert trace[NS] == {"namespace": NS, "ok": True}
            assert trace[NS_FRAGILE] == {
                "namespace": NS_FRAGILE,
                "ok": False,
                "errorCode": "internal",
                "stage": "search",
                "message": "internal error; the details are in the server log",
            }, trace
            for raw in ("WRONGTYPE", "wrong kind", graph_key(NS_FRAGILE), "redis"):
                assert raw.lower() not in outcome.raw.lower(), f"store text {raw!r} reached the agent"

            # Entity search soft-fails the same way.
            entities = await call_ok(client, "kg_entity_search", {"text": "Acme", "namespaces": [NS, NS_FRAGILE]})
            assert {h["namespace"] for h in entities["hits"]} == {NS}
            by_ns = {n["namespace"]: n for n in entities["trace"]["namespaces"]}
            assert by_ns[NS_FRAGILE]["ok"] is False and by_ns[NS_FRAGILE]["errorCode"] == "internal"

            # Only the broken namespace: nothing left to answer, so the call fails, closed.
            await expect_rejected(
                client, "kg_search", {"query": QUERY, "namespaces": [NS_FRAGILE]}, {"internal"}
            )
        finally:
            redis(port, "DEL", key)
            redis(port, "GRAPH.COPY", backup, key)
            redis(port, "GRAPH.DELETE", backup)
        restored = await search(client, query=QUERY, lanes=["fulltext"], namespaces=[NS_FRAGILE])
        assert len(restored["results"]) == 3



# ---------------------------------------------------------------------------------------------
# Query plans
# ---------------------------------------------------------------------------------------------

# A plan that starts from every node of one of these labels walks the whole namespace, however
# small the answer: FalkorDB plans `(c:Chunk)-[:MENTIONS]->(e:Entity {entityKey: $key})` from a
# scan of every Chunk (2 s at 100k chunks for a key nobody mentions) unless the entity is bound
# by its index in a clause of its own. Results cannot show it and a small graph hides the cost,
# so the plans themselves are checked.
SCANNED_LABELS = ("Chunk", "Entity", "OutlineNode", "FileRef", "EntityType")
# Queries whose work is the whole label by design, each with why.
WHOLE_LABEL_QUERIES: dict[str, str] = {
    "MATCH (et:EntityType) WHERE NOT et.typeId IN $typeIds": "a TBox publish drops the types it no longer "
    "declares; the label holds the TBox's own types",
    "MATCH (n:Entity) WHERE n.declared = true AND NOT n.entityKey IN $keys": "a TBox publish un-declares the "
    "entities it dropped, once per publish",
    "RETURN count(node), count(node.wordCount)": "BM25's N and avgdl are over every readable chunk by "
    "definition; cached per caller scope for a minute (bm25::STATS_TTL)",
    "WITH fulltext, statuses, n LIMIT 1": "is the namespace's full-text index on Chunk or Entity built, and "
    "does the label have any node: the scan stops at the first",
    "MATCH (f:FileRef) WHERE f.versionId IS NOT NULL": "which files are stale: every file's stamps, once "
    "per TBox publish and once per indexer start",
    "MATCH (f:FileRef)-[p:PROPOSES]->(ce:CandidateEntity)": "`kgmesh tbox candidates` counts every readable "
    "file's candidates; an admin API call, not a tool",
}
# Index creation has no plan to check.
SCHEMA_CHANGE = re.compile(r"(CREATE|DROP) (FULLTEXT |VECTOR )?INDEX|CALL db\.idx\.fulltext\.(create|drop)", re.I)
FULL_SCAN = re.compile(r"(Node By Label Scan \| \(\w*:(?:" + "|".join(SCANNED_LABELS) + r")\)|All Node Scan)")


class GraphMonitor:
    """The commands FalkorDB receives while open, from Redis's MONITOR feed."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.lines: list[str] = []
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self._stream = self._sock.makefile("rb")
        self._thread = threading.Thread(target=self._read, daemon=True)

    def __enter__(self) -> GraphMonitor:
        self._sock.sendall(b"*1\r\n$7\r\nMONITOR\r\n")
        assert self._stream.readline() == b"+OK\r\n", "MONITOR refused"
        self._sock.settimeout(None)
        self._thread.start()
        return self

    def _read(self) -> None:
        for line in self._stream:
            self.lines.append(line.decode("ascii", errors="replace").rstrip("\r\n"))

    def __exit__(self, *_: object) -> None:
        # A marker sent after the calls: once the feed shows it, every earlier command is in.
        marker = f"plan-audit-{threading.get_ident()}-{len(self.lines)}"
        redis(self.port, "ECHO", marker)
        deadline = time.monotonic() + 30
        while not any(marker in line for line in self.lines) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=5)

    def graph_queries(self, graph: str) -> list[str]:
        """Distinct query texts (parameters included) sent to `graph`, in order."""
        seen: dict[str, None] = {}
        for line in self.lines:
            args = monitor_args(line)
            if len(args) >= 3 and args[0].upper() in ("GRAPH.QUERY", "GRAPH.RO_QUERY") and args[1] == graph:
                seen.setdefault(args[2], None)
        return list(seen)


def monitor_args(line: str) -> list[str]:
    """The quoted arguments of one MONITOR line, unescaped (Redis writes bytes outside
    printable ASCII as \\xHH)."""
    args: list[str] = []
    start = line.find('] "')
    i = start + 2 if start >= 0 else len(line)
    while i < len(line):
        if line[i] != '"':
            i += 1
            continue
        raw = bytearray()
        i += 1
        while i < len(line) and line[i] != '"':
            if line[i] == "\\" and i + 1 < len(line):
                nxt = line[i + 1]
                if nxt == "x":
                    raw.append(int(line[i + 2 : i + 4], 16))
                    i += 4
                    continue
                raw += {"n": b"\n", "r": b"\r", "t": b"\t", "a": b"\a", "b": b"\b"}.get(nxt, nxt.encode())
                i += 2
                continue
            raw += line[i].encode()
            i += 1
        args.append(raw.decode(errors="replace"))
        i += 1
    return args


async def _sweep_graph_tools(client: Any, namespace: str) -> None:
    """Every read tool that queries the graph, with chunk, entity and outline keys."""
    ns = [namespace]
    for lanes in (["fulltext", "graph_expand"], ["co_annotation"]):
        for query in ("Acme and Zephyr contract", "Dana Scully and Zephyr"):
            await call_ok(client, "kg_search", {"query": query, "namespaces": ns, "lanes": lanes})
    for filters in (
        {"relationTypeIds": ["works_at"]},
        {"collections": ["legal"], "folderPrefix": "contracts/", "dateFrom": "2020-01-01", "effectiveAt": "2024-06-01"},
    ):
        await call_ok(client, "kg_search", {"query": QUERY, "namespaces": ns, "filters": filters})
    for text in ("Acme", "Initech"):
        await call_ok(client, "kg_entity_search", {"text": text, "namespaces": ns})
    hits = (await call_ok(client, "kg_search", {"query": "Acme", "namespaces": ns, "lanes": ["fulltext"]}))["results"]
    assert hits, "the sweep needs a readable chunk"
    chunk_key, file_id = hits[0]["chunkKey"], hits[0]["fileId"]
    for kind in ("next_chunk", "prev_chunk", "mentions", "rel", "same_type"):
        await call_ok(client, "kg_hop", {"namespace": namespace, "fromKey": chunk_key, "kind": kind})
    for entity in ("ent:org:acme", "ent:org:nobody"):
        for kind in ("mentions", "rel", "same_type"):
            await call_tool(client, "kg_hop", {"namespace": namespace, "fromKey": entity, "kind": kind})
        await call_tool(client, "kg_open", {"namespace": namespace, "entityKey": entity})
    await call_ok(client, "kg_open", {"namespace": namespace, "chunkKey": chunk_key})
    await call_ok(client, "kg_open", {"namespace": namespace, "fileId": file_id})
    outline = await call_ok(client, "kg_outline", {"namespace": namespace, "fileId": file_id})
    for section in outline["sections"][:2]:
        await call_ok(client, "kg_open", {"namespace": namespace, "outlineKey": section["outlineKey"]})
        for kind in ("outline_child", "outline_parent", "outline_siblings"):
            await call_tool(client, "kg_hop", {"namespace": namespace, "fromKey": section["outlineKey"], "kind": kind})
    await call_ok(client, "kg_file_entities", {"namespace": namespace, "fileId": file_id})
    await call_ok(client, "kg_file_triples", {"namespace": namespace, "fileId": file_id})


async def test_no_query_plans_a_scan_of_the_namespace(
    mesh: Mesh, make_principal: Callable[..., Principal], tmp_path: Path
) -> None:
    """Each query the indexer sends while a TBox is published and the corpus ingested, and
    each query the read tools send, as a full reader and as one limited to two folders (whose
    access predicate has parameters), is planned from an index or a bound node."""
    namespace = "sparams-plans"
    tbox = tmp_path / "tbox.yaml"
    tbox.write_text(TBOX, encoding="utf-8")
    root = tmp_path / "corpus"
    _write_corpus(root)
    reader = make_principal("plans-reader")
    port = falkordb_port(mesh)
    with GraphMonitor(port) as monitor:
        mesh.publish_tbox(namespace, tbox)
        mesh.ingest(root, namespace)
        # Published again over indexed files, without one name: the indexer reads every file's
        # stamps and extracts them all again.
        tbox.write_text(TBOX.replace("      - name: Zephyr\n", ""), encoding="utf-8")
        mesh.publish_tbox(namespace, tbox)
        async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
            await _wait_for_entity_names(client, namespace, {"Acme", "Dana Scully"})
        for kind in ("", "acronym"):
            mesh.cli("tbox", "candidates", "--namespace", namespace, *(["--kind", kind] if kind else []))
        for prefix in ("contracts/", "people/"):
            mesh.grant(reader.id, namespace, "read", prefix=prefix)
        for token in (mesh.admin_token, reader.token):
            async with mcp_http(mesh.mcp_url, token) as client:
                await _sweep_graph_tools(client, namespace)
    # The check itself: the shape that took 2 s at 100k chunks (kg_hop from an entity key, before
    # the entity was bound first) is caught on this small graph.
    regressed = redis(
        port,
        "GRAPH.EXPLAIN",
        graph_key(namespace),
        "CYPHER key='ent:org:acme' MATCH (c:Chunk)-[:MENTIONS]->(e:Entity {entityKey: $key}) "
        "WHERE c.enabled = true RETURN e.typeId LIMIT 1",
    )
    assert isinstance(regressed, list) and any(FULL_SCAN.search(step) for step in regressed), regressed
    queries = monitor.graph_queries(graph_key(namespace))
    # The ingest writes files, chunks, outlines, entities, mentions and relations; the sweep
    # reaches the full-text, expansion, co-annotation, filter, package, hop, open, outline and
    # file-entity queries. Far fewer means the feed was not read.
    assert len(queries) >= 40, f"only {len(queries)} graph queries seen: {queries}"
    scans: list[str] = []
    for query in queries:
        if SCHEMA_CHANGE.match(query) or any(allowed in query for allowed in WHOLE_LABEL_QUERIES):
            continue
        plan = redis(port, "GRAPH.EXPLAIN", graph_key(namespace), query)
        assert isinstance(plan, list), f"EXPLAIN failed: {plan} for {query[:300]}"
        scanned = [step.strip() for step in plan if FULL_SCAN.search(step)]
        if scanned:
            scans.append(f"{scanned} <- {query[:600]}")
    assert not scans, "queries planned from a scan of the namespace:\n" + "\n".join(scans)


async def test_every_word_is_found_by_full_text_whatever_stands_beside_it(mesh: Mesh, tmp_path: Path) -> None:
    """FalkorDB's full-text index reads `word\\nnext` (a line break, a backslash, a no-break
    space, an em dash between them) as one token, so the words that end or start a line of a
    wrapped paragraph were found by no full-text search."""
    namespace = "sparams-glued"
    folder = tmp_path / "glued"
    folder.mkdir()
    (folder / "wrapped.md").write_text(
        "# Wrapped\n\nlemonade marzipan\nnutmeg oregano\r\npaprika quince\n"
        "back\\slash nbsp\u00a0word em\u2014dash\n"
    )
    mesh.ingest(folder, namespace)
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        missed = []
        for word in ["lemonade", "marzipan", "nutmeg", "oregano", "paprika", "quince", "slash", "nbsp", "dash"]:
            found = await call_ok(client, "kg_search", {"query": word, "namespaces": [namespace], "lanes": ["fulltext"]})
            if [hit["path"] for hit in found["results"]] != ["wrapped.md"]:
                missed.append(word)
        assert missed == [], f"full text did not find {missed}"

"""Issue 6 arguments the other MCP tests leave out: kg_cypher over MCP (rows under a folder grant,
paging by `WHERE ID(n) > $afterId` to the end, each refusal naming its rule and the fix), and
get_knowledge_graph's preview_branch target (by id, and main as a null id), root_file_version_id
with every max_depth, filters.type / tags / search, and every caller_selector form.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kgmesh_support import EXAMPLES_DIR, Mesh, Principal, call_ok, call_tool, mcp_http

pytestmark = pytest.mark.anyio

ONBOARDING = "handbook/onboarding.md"
GLOSSARY = "handbook/glossary.md"
PAGE = 5
PAGED = (
    "MATCH (c:Chunk) WHERE ID(c) > $afterId AND c.path STARTS WITH 'handbook/' "
    f"RETURN ID(c) AS id, c.chunkKey AS key, c.path AS path ORDER BY id LIMIT {PAGE}"
)


async def cypher(client: Any, namespace: str, statement: str, **params: Any) -> dict[str, Any]:
    arguments: dict[str, Any] = {"namespace": namespace, "statement": statement}
    if params:
        arguments["params"] = params
    return await call_ok(client, "kg_cypher", arguments)


async def refused(client: Any, namespace: str, statement: str, rule: str, *hints: str) -> None:
    """The statement is refused as invalid_argument; the message names `rule` and each hint."""
    outcome = await call_tool(client, "kg_cypher", {"namespace": namespace, "statement": statement})
    error = outcome.error()
    assert error["code"] == "invalid_argument", (statement, error)
    for word in (rule, *hints):
        assert word in error["message"], f"{statement!r}: {error['message']!r} lacks {word!r}"


async def test_kg_cypher_pages_by_id_to_the_end(mesh: Mesh, demo: str) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        counted = await cypher(
            client, demo, "MATCH (c:Chunk) WHERE c.path STARTS WITH 'handbook/' RETURN count(c) AS n LIMIT 1"
        )
        total = counted["rows"][0][0]
        assert total > PAGE, f"handbook/ has {total} chunks: too few to page"
        keys: list[str] = []
        after = -1
        for _ in range(200):
            page = await cypher(client, demo, PAGED, afterId=after)
            assert page["columns"] == ["id", "key", "path"] and page["rowCount"] == len(page["rows"]) <= PAGE
            ids = [row[0] for row in page["rows"]]
            assert ids == sorted(ids) and all(i > after for i in ids)
            assert all(row[2].startswith("handbook/") for row in page["rows"])
            keys += [row[1] for row in page["rows"]]
            if page["rowCount"] < PAGE:
                break
            after = ids[-1]
        assert len(keys) == len(set(keys)) == total


async def test_kg_cypher_rows_stay_inside_the_callers_grant(
    mesh: Mesh, demo: str, make_principal: Callable[..., Principal]
) -> None:
    reader = make_principal("cypher-reader")
    mesh.grant(reader.id, demo, "read", prefix="handbook/security/")
    statement = "MATCH (c:Chunk)-[:PART_OF]->(f:FileRef) RETURN DISTINCT f.vfsPath AS path LIMIT 50"
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as admin:
        everything = {row[0] for row in (await cypher(admin, demo, statement))["rows"]}
    async with mcp_http(mesh.mcp_url, reader.token) as client:
        result = await cypher(client, demo, statement)
        mine = {row[0] for row in result["rows"]}
        assert mine == {p for p in everything if p.startswith("handbook/security/")} and mine, (mine, everything)
        # The access predicate is in the statement that ran, on both variables.
        rewritten = result["rewrittenStatement"]
        assert rewritten != statement and rewritten.count("kg_acl_") >= 2, rewritten
        # The same through an entity-free path, and paging: nothing outside the grant.
        page = await cypher(client, demo, PAGED, afterId=-1)
        assert page["rows"] and all(row[2].startswith("handbook/security/") for row in page["rows"]), page
    stranger = make_principal("cypher-stranger")
    async with mcp_http(mesh.mcp_url, stranger.token) as client:
        denied = await call_tool(client, "kg_cypher", {"namespace": demo, "statement": statement})
        assert denied.error()["code"] == "permission_denied", denied.data


async def test_kg_cypher_refusals_name_the_rule_and_the_fix(mesh: Mesh, demo: str) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        await refused(client, demo, "MATCH (c:Chunk) RETURN c.text SKIP 5 LIMIT 5", "no_skip", "afterId")
        await refused(client, demo, "MATCH (c:Chunk) RETURN c.text LIMIT 51", "limit")
        await refused(client, demo, "MATCH (c:Chunk) RETURN c.text", "limit")
        await refused(client, demo, "CREATE (c:Chunk {text: 'x'}) RETURN c LIMIT 1", "read_only")
        await refused(client, demo, "MATCH (n) RETURN n LIMIT 1", "node_label")
        await refused(client, demo, "MATCH (c:Chunk)-[:NEXT_CHUNK*1..3]->(d:Chunk) RETURN d.text LIMIT 1", "one_hop")
        await refused(client, demo, "MATCH (e:Entity) RETURN e.name LIMIT 5", "anchor")
        await refused(client, demo, "MATCH (c:Chunk) WHERE c.path = $kg_acl_allow_0 RETURN c.text LIMIT 1", "reserved")
        await refused(client, demo, "CALL db.labels() YIELD label RETURN label LIMIT 1", "no_procedures")


def graph_paths(graph: dict[str, Any]) -> dict[str, str]:
    return {n["file_version_id"]: n["path"] for n in graph["nodes"]}


async def kg(client: Any, namespace: str, **arguments: Any) -> dict[str, Any]:
    graph = await call_ok(
        client, "get_knowledge_graph", {"project_reference": namespace, "pagination": {"limit": 200}, **arguments}
    )
    assert graph["page_info"]["next"] is None, "the demo graph fits in one page of 200"
    return graph


def internal(graph: dict[str, Any]) -> None:
    """Every edge joins two nodes of the answer; every broken link starts at one."""
    versions = graph_paths(graph)
    for edge in graph["edges"]:
        assert edge["source_file_version_id"] in versions and edge["target_file_version_id"] in versions, edge
    for link in graph["broken_links"] + graph["external_links"]:
        assert link["source_file_version_id"] in versions, link


async def test_preview_branch_targets(mesh: Mesh, demo: str, tmp_path: Path) -> None:
    branch = mesh.cli("branch", "create", "--namespace", demo, "--name", f"kg-args-{secrets.token_hex(3)}")
    changed = tmp_path / "glossary.md"
    changed.write_text((EXAMPLES_DIR / GLOSSARY).read_text(encoding="utf-8") + "\nA branch-only line.\n")
    uploaded = mesh.cli(
        "branch", "upload", "--namespace", demo, "--branch", branch["branchId"], "--path", GLOSSARY,
        "--file", str(changed),
    )  # fmt: skip
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        main = await kg(client, demo)
        explicit_main = await kg(client, demo, lookup_target={"kind": "preview_branch", "branch_id": None})
        assert explicit_main == main
        bare_main = await kg(client, demo, lookup_target={"kind": "preview_branch"})
        assert bare_main == main
        on_branch = await kg(client, demo, lookup_target={"kind": "preview_branch", "branch_id": branch["branchId"]})
        mains, branched = graph_paths(main), graph_paths(on_branch)
        assert sorted(mains.values()) == sorted(branched.values()), "the branch changes a version, not the files"
        assert uploaded["versionId"] in branched and branched[uploaded["versionId"]] == GLOSSARY
        assert uploaded["versionId"] not in mains
        internal(on_branch)
        missing = {"kind": "preview_branch", "branch_id": "00000000-0000-7000-8000-000000000000"}
        outcome = await call_tool(client, "get_knowledge_graph", {"project_reference": demo, "lookup_target": missing})
        assert outcome.error()["code"] == "not_found", outcome.data


async def test_roots_depths_filters_and_selectors(mesh: Mesh, demo: str) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        whole = await kg(client, demo)
        everything = set(graph_paths(whole).values())
        root = next(n for n in whole["nodes"] if n["path"] == ONBOARDING)
        previous: set[str] = set()
        for depth in range(4):
            by_id = await kg(client, demo, root_file_version_id=root["file_version_id"], max_depth=depth)
            by_path = await kg(client, demo, root_path=ONBOARDING, max_depth=depth)
            assert by_id == by_path, depth
            reached = set(graph_paths(by_id).values())
            assert by_id["nodes"][0]["path"] == ONBOARDING and previous <= reached <= everything, depth
            if depth == 0:
                assert reached == {ONBOARDING}
            if depth == 1:
                assert reached > {ONBOARDING}, "onboarding links to other files"
            internal(by_id)
            previous = reached

        def nodes(graph: dict[str, Any]) -> set[str]:
            internal(graph)
            return set(graph_paths(graph).values())

        references = await kg(client, demo, filters={"type": "REFERENCE"})
        assert {GLOSSARY, "handbook/offices.md"} <= nodes(references)
        assert all(n["type"] == "reference" for n in references["nodes"]), references["nodes"]
        tagged = await kg(client, demo, filters={"tags": ["onboarding"]})
        assert nodes(tagged) == {ONBOARDING, GLOSSARY}
        both = await kg(client, demo, filters={"tags": ["onboarding", "glossary"]})
        assert nodes(both) == {GLOSSARY}
        searched = await kg(client, demo, filters={"search": "Security/"})
        assert nodes(searched) and all("security/" in p for p in nodes(searched))
        titled = await kg(client, demo, filters={"search": "larkspur ARCHITECTURE"})
        assert nodes(titled) == {"engineering/architecture.md"}

        handbook = {p for p in everything if p.startswith("handbook/")}
        security = {p for p in handbook if p.startswith("handbook/security/")}
        selectors: list[tuple[Any, set[str]]] = [
            (True, everything),
            (False, set()),
            ("handbook/", handbook),
            ("handbook/**", handbook),
            (GLOSSARY, {GLOSSARY}),
            ([GLOSSARY, "support/"], {GLOSSARY} | {p for p in everything if p.startswith("support/")}),
            ({"handbook/": True, "handbook/security/": False}, handbook - security),
            ({"engineering/": False}, {p for p in everything if not p.startswith("engineering/")}),
        ]
        for selector, wanted in selectors:
            graph = await kg(client, demo, caller_selector=selector)
            assert nodes(graph) == wanted and graph["total_nodes"] == len(wanted), selector
        # A selector narrows a rooted walk too: the root itself may be selected away.
        rooted = await kg(client, demo, root_path=ONBOARDING, max_depth=2, caller_selector="handbook/")
        assert nodes(rooted) <= handbook and ONBOARDING in nodes(rooted)

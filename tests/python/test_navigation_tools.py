"""Navigation tools over Streamable HTTP with the official MCP SDK: kg_hop (chunk and outline
kinds against the deploy runbook), kg_ontology, kg_file_entities and kg_file_triples (shapes,
paging to the end, argument errors), and a caller without a grant getting permission_denied
and nothing else. Entity-dependent answers are checked for shape and paging whatever the
indexer extracted; the entity hops themselves are proved against FalkorDB in
services/graph/tests/integration/navigation.rs."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kgmesh_support import (
    DEMO_NAMESPACE,
    RUNBOOK,
    Mesh,
    Principal,
    assert_no_content_leak,
    call_ok,
    call_tool,
    check_package,
    expect_rejected,
    mcp_http,
    outline_pages,
    search_target,
)

pytestmark = pytest.mark.anyio

NAVIGATION_TOOLS = ("kg_hop", "kg_ontology", "kg_file_entities", "kg_file_triples")
HOP_KINDS = {
    "next_chunk",
    "prev_chunk",
    "similar",
    "mentions",
    "rel",
    "same_type",
    "outline_child",
    "outline_parent",
    "outline_siblings",
}


async def _runbook_hit(mesh: Mesh) -> dict[str, Any]:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as admin:
        return await search_target(admin, RUNBOOK, namespaces=[DEMO_NAMESPACE])


async def test_tools_are_listed_read_only_with_schemas(mesh: Mesh) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    for name in NAVIGATION_TOOLS:
        tool = tools.get(name)
        assert tool is not None, f"tools/list lacks {name}: {sorted(tools)}"
        assert tool.annotations is not None and tool.annotations.read_only_hint is True, name
        assert tool.input_schema.get("additionalProperties") is False, name
        assert isinstance(tool.output_schema, dict) and tool.output_schema.get("type") == "object", name
        assert tool.description and len(tool.description) > 80, name
    hop = tools["kg_hop"].input_schema
    assert set(hop["properties"]["kind"]["enum"]) == HOP_KINDS
    assert set(hop["required"]) == {"namespace", "fromKey", "kind"}
    assert hop["properties"]["limit"]["maximum"] == 32
    triples = tools["kg_file_triples"].input_schema["properties"]
    assert {"afterSourceEntityKey", "afterRelationTypeId", "afterTargetEntityKey"} <= set(triples)
    assert "afterEntityKey" in tools["kg_file_entities"].input_schema["properties"]


async def test_chunk_hops_walk_the_file_in_order(mesh: Mesh, demo: str) -> None:
    hit = await _runbook_hit(mesh)
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        opened = await call_ok(client, "kg_open", {"namespace": demo, "fileId": hit["fileId"], "limit": 32})
        order = [p["chunkKey"] for p in opened["packages"]]
        assert len(order) >= 3, "the runbook has several chunks"
        first = order[0]

        nxt = await call_ok(client, "kg_hop", {"namespace": demo, "fromKey": first, "kind": "next_chunk"})
        assert [p["chunkKey"] for p in nxt["packages"]] == order[1 : 1 + 8]
        assert nxt["total"] == opened["total"] - 1
        for package in nxt["packages"]:
            check_package(package, namespace=demo, path=RUNBOOK.path)
            for key in ("mentions", "relNeighbors", "similarFiles"):
                assert isinstance(package[key], list), (key, package)

        one = await call_ok(client, "kg_hop", {"namespace": demo, "fromKey": first, "kind": "next_chunk", "limit": 1})
        assert [p["chunkKey"] for p in one["packages"]] == [order[1]]
        assert one["truncated"] is (opened["total"] > 2)

        last = order[-1] if not opened["truncated"] else order[2]
        prev = await call_ok(client, "kg_hop", {"namespace": demo, "fromKey": last, "kind": "prev_chunk", "limit": 2})
        index = order.index(last)
        assert [p["chunkKey"] for p in prev["packages"]] == order[max(0, index - 2) : index]
        assert prev["total"] == index

        none = await call_ok(client, "kg_hop", {"namespace": demo, "fromKey": first, "kind": "prev_chunk"})
        assert none == {"packages": [], "total": 0, "truncated": False}

        await expect_rejected(
            client, "kg_hop", {"namespace": demo, "fromKey": "ch_does_not_exist", "kind": "next_chunk"}, {"not_found"}
        )
        # The session mesh runs without embeddings, so there are no file vectors: similar says so
        # instead of answering empty (test_vector_search.py checks it with MiniLM).
        similar = {"namespace": demo, "fromKey": first, "kind": "similar"}
        await expect_rejected(client, "kg_hop", similar, {"unavailable"})


async def test_outline_hops_follow_the_sections(mesh: Mesh, demo: str) -> None:
    hit = await _runbook_hit(mesh)
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        sections, _ = await outline_pages(client, demo, hit["fileId"])
        by_title = {s["title"]: s for s in sections}
        rollout = by_title["Production rollout"]
        children = [s["outlineKey"] for s in sections if s.get("parentKey") == rollout["outlineKey"]]

        down = await call_ok(
            client, "kg_hop", {"namespace": demo, "fromKey": rollout["outlineKey"], "kind": "outline_child"}
        )
        landed = [p["outline"]["section"]["outlineKey"] for p in down["packages"]]
        assert landed, "the rollout subsections cover chunks"
        assert set(landed) <= set(children), (landed, children)
        assert landed == sorted(landed, key=children.index), "children in document order"

        cutover = by_title["Blue-green cutover"]
        up = await call_ok(
            client, "kg_hop", {"namespace": demo, "fromKey": cutover["outlineKey"], "kind": "outline_parent"}
        )
        # The parent section's chunks: what kg_open by its outlineKey returns.
        parent = await call_ok(client, "kg_open", {"namespace": demo, "outlineKey": rollout["outlineKey"]})
        assert [p["chunkKey"] for p in up["packages"]] == [p["chunkKey"] for p in parent["packages"]]
        assert (up["total"], up["truncated"]) == (parent["total"], parent["truncated"])

        side = await call_ok(
            client, "kg_hop", {"namespace": demo, "fromKey": cutover["outlineKey"], "kind": "outline_siblings"}
        )
        siblings = {k for k in children if k != cutover["outlineKey"]}
        assert {p["outline"]["section"]["outlineKey"] for p in side["packages"]} <= siblings

        await expect_rejected(
            client, "kg_hop", {"namespace": demo, "fromKey": "ol_missing", "kind": "outline_child"}, {"not_found"}
        )


async def test_ontology_is_valid_when_published_or_not(mesh: Mesh, demo: str) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        tbox = await call_ok(client, "kg_ontology", {"namespace": demo})
    assert tbox["namespace"] == demo
    assert isinstance(tbox["published"], bool)
    if not tbox["published"]:
        assert tbox["entityTypes"] == [] and tbox["relationTypes"] == []
    for relation in tbox["relationTypes"]:
        assert {"relationTypeId", "sourceTypeId", "targetTypeId"} <= set(relation), relation


async def test_file_entities_and_triples_page_to_the_end(mesh: Mesh, demo: str) -> None:
    hit = await _runbook_hit(mesh)
    base = {"namespace": demo, "fileId": hit["fileId"]}
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        first = await call_ok(client, "kg_file_entities", base)
        seen: list[str] = []
        after: str | None = None
        for _ in range(500):
            paging = {"afterEntityKey": after} if after else {}
            page = await call_ok(client, "kg_file_entities", {**base, "limit": 1, **paging})
            assert page["total"] == first["total"]
            seen.extend(e["entityKey"] for e in page["entities"])
            if not page["truncated"]:
                assert page["nextAfterEntityKey"] is None
                break
            after = page["nextAfterEntityKey"]
        assert seen == sorted(seen) and len(seen) == first["total"], (seen, first["total"])

        triples: list[tuple[str, str, str]] = []
        cursor: dict[str, str] = {}
        total = None
        for _ in range(500):
            page = await call_ok(client, "kg_file_triples", {**base, "limit": 1, **cursor})
            total = page["total"]
            triples.extend((t["sourceEntityKey"], t["relationTypeId"], t["targetEntityKey"]) for t in page["triples"])
            if not page["truncated"]:
                assert page["continueAfter"] is None
                break
            cursor = page["continueAfter"]
        assert triples == sorted(triples) and len(triples) == total

        await expect_rejected(
            client, "kg_file_triples", {**base, "afterSourceEntityKey": "ent:x:y"}, {"invalid_argument"}
        )
        await expect_rejected(client, "kg_file_entities", {**base, "limit": 201}, {"invalid_argument"})
        over_cap = {"namespace": demo, "fromKey": hit["chunkKey"], "kind": "rel", "caps": {"rel": 25}}
        await expect_rejected(client, "kg_hop", over_cap, {"invalid_argument"})
        await expect_rejected(client, "kg_file_entities", {"namespace": demo, "fileId": "no-such-file"}, {"not_found"})


async def test_a_caller_without_a_grant_gets_nothing(
    mesh: Mesh, demo: str, make_principal: Callable[..., Principal]
) -> None:
    hit = await _runbook_hit(mesh)
    user = make_principal("navigator")
    calls = [
        ("kg_hop", {"namespace": demo, "fromKey": hit["chunkKey"], "kind": "next_chunk"}),
        ("kg_ontology", {"namespace": demo}),
        ("kg_file_entities", {"namespace": demo, "fileId": hit["fileId"]}),
        ("kg_file_triples", {"namespace": demo, "fileId": hit["fileId"]}),
    ]
    async with mcp_http(mesh.mcp_url, user.token) as client:
        for name, arguments in calls:
            denied = await call_tool(client, name, arguments)
            assert denied.error()["code"] == "permission_denied", (name, denied.data)
            assert_no_content_leak(denied, RUNBOOK.phrase, hit["text"][:80])


async def test_open_and_outline_say_why_a_readable_file_has_no_chunks(
    mesh: Mesh, make_principal: Callable[..., Principal], tmp_path: Path
) -> None:
    """A stored image and a file whose indexing failed are there (kg_files lists them) but
    have no chunks: kg_open and kg_outline by fileId say so with the status and its reason,
    rather than "not found"; to a caller who may not read them they stay not found."""
    namespace = f"unindexed-{secrets.token_hex(4)}"
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)
    (folder / "latin1.txt").write_bytes("caf\xe9 na\xefve\n".encode("latin-1"))
    (folder / "ok.md").write_text("# Fine\n\nIndexed text.\n")
    done = mesh.run("ingest", str(folder), "--namespace", namespace, json_output=False, timeout=300)
    assert done.returncode == 3, (done.returncode, done.stdout, done.stderr)  # latin1.txt failed
    outsider = make_principal("outsider")
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        listed = await call_ok(client, "kg_files", {"namespace": namespace})
        ids = {f["path"]: f["fileId"] for f in listed["files"]}
        for path, status in (("logo.png", "stored"), ("latin1.txt", "failed")):
            for tool in ("kg_open", "kg_outline"):
                outcome = await call_tool(client, tool, {"namespace": namespace, "fileId": ids[path]})
                error = outcome.error()
                assert error["code"] == "failed_precondition", (tool, path, error)
                assert f"({path})" in error["message"] and f"status {status}" in error["message"], error
    async with mcp_http(mesh.mcp_url, outsider.token) as client:
        outcome = await call_tool(client, "kg_open", {"namespace": namespace, "fileId": ids["logo.png"]})
        assert outcome.error()["code"] in ("not_found", "permission_denied"), outcome.data
        assert "logo.png" not in outcome.raw, outcome.raw

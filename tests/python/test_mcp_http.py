"""The foundation's proof over Streamable HTTP: the official MCP SDK, an admin PAT, examples/
ingested into `demo`; tools/list, kg_search -> kg_open -> offsets -> kg_outline."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kgmesh_support import (
    CORE_TOOLS,
    DEMO_NAMESPACE,
    RUNBOOK,
    TARGETS,
    Mesh,
    Target,
    call_ok,
    check_core_tools,
    check_package,
    check_runbook_outline,
    check_search_open,
    expect_rejected,
    mcp_http,
    open_chunk,
    read_example,
    search_target,
)

pytestmark = pytest.mark.anyio


async def test_tools_list_has_schemas_and_read_only_hints(mesh: Mesh) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        listed = await client.list_tools()
        check_core_tools(listed.tools)


async def test_default_sdk_mode_connects(mesh: Mesh) -> None:
    # Client() without a mode probes `server/discover` first and falls back to initialize;
    # the gateway must answer that probe in a way the SDK can fall back from.
    async with mcp_http(mesh.mcp_url, mesh.admin_token, mode="auto") as client:
        listed = await client.list_tools()
        assert set(CORE_TOOLS) <= {tool.name for tool in listed.tools}


async def test_session_tool_calls_are_answered_as_json(mesh: Mesh, demo: str) -> None:
    # In a session, rmcp answers through the session's worker as SSE; the gateway answers a
    # built-in tool call on the request's own task as one JSON body instead (both are valid
    # Streamable HTTP answers). The SDK must read both the same way.
    answers: list[tuple[str, str]] = []

    async def note(response: Any) -> None:
        if response.request.method == "POST":
            body = json.loads(response.request.content or b"{}")
            answers.append((body.get("method", ""), response.headers.get("content-type", "")))

    async with mcp_http(mesh.mcp_url, mesh.admin_token, event_hooks={"response": [note]}) as client:
        first = await call_ok(client, "kg_namespaces", {})
        found = await call_ok(client, "kg_search", {"query": "rollback", "namespaces": [demo], "topK": 2})
        again = await call_ok(client, "kg_namespaces", {})
        await client.list_tools()
    assert first == again and demo in [entry["name"] for entry in first["namespaces"]]
    assert found["results"], found
    calls = [media for method, media in answers if method == "tools/call"]
    assert calls and all(media.startswith("application/json") for media in calls), answers
    listed = [media for method, media in answers if method == "tools/list"]
    assert listed and listed[0].startswith("text/event-stream"), answers


async def test_namespaces_lists_demo(mesh: Mesh, demo: str) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        listed = await call_ok(client, "kg_namespaces", {})
    names = [entry["name"] for entry in listed["namespaces"]]
    assert demo in names, names


@pytest.mark.parametrize("target", TARGETS, ids=[t.id for t in TARGETS])
async def test_search_open_and_offsets(mesh: Mesh, demo: str, target: Target) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        hit, _ = await check_search_open(client, target)
    assert hit["citation"].startswith(f"{demo}/{target.path}")


async def test_search_without_namespaces_covers_readable_ones(mesh: Mesh, demo: str) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        await search_target(client, RUNBOOK)


async def test_search_top_k_is_capped(mesh: Mesh, demo: str) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        one = await call_ok(client, "kg_search", {"query": "crew", "namespaces": [demo], "topK": 1})
        assert len(one["results"]) == 1, one
        assert one["total"] >= 1
        # Over the hard maximum fails closed instead of being served.
        await expect_rejected(
            client,
            "kg_search",
            {"query": "crew", "namespaces": [demo], "topK": 33},
            {"invalid_argument", "resource_exhausted"},
        )


async def test_open_follows_next_chunk(mesh: Mesh, demo: str) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        hit = await search_target(client, RUNBOOK, namespaces=[demo])
        position = hit["position"]
        next_key = position.get("nextChunkKey")
        if not next_key:
            # Only the last chunk of a file has no successor: it must end where the text ends.
            content = read_example(RUNBOOK.path)
            assert content[position["charEnd"] :].strip() == "", f"chunk {position} is not last but has no nextChunkKey"
            prev_key = position.get("prevChunkKey")
            assert prev_key, "the runbook is several chunks long; its last chunk must have a predecessor"
            neighbour = await open_chunk(client, demo, prev_key)
            assert neighbour["position"]["nextChunkKey"] == hit["chunkKey"]
            assert neighbour["position"]["chunkIndex"] == position["chunkIndex"] - 1
        else:
            neighbour = await open_chunk(client, demo, next_key)
            assert neighbour["position"]["prevChunkKey"] == hit["chunkKey"]
            assert neighbour["position"]["chunkIndex"] == position["chunkIndex"] + 1
            assert neighbour["position"]["charStart"] > position["charStart"]
        check_package(neighbour, namespace=demo, path=RUNBOOK.path)


async def test_open_by_file_id_returns_exact_chunks(mesh: Mesh, demo: str) -> None:
    # The offices page has umlauts, CJK and an emoji outside the BMP: offsets are code points.
    offices = TARGETS[1]
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        hit = await search_target(client, offices, namespaces=[demo])
        opened = await call_ok(client, "kg_open", {"namespace": demo, "fileId": hit["fileId"]})
    packages = opened["packages"]
    assert packages, "kg_open by fileId returned no packages"
    assert opened["total"] >= len(packages)
    indexes = [package["position"]["chunkIndex"] for package in packages]
    assert indexes == sorted(indexes) and len(set(indexes)) == len(indexes), indexes
    for package in packages:
        assert package["fileId"] == hit["fileId"]
        check_package(package, namespace=demo, path=offices.path)
    if not opened["truncated"]:
        # Every chunk came back: together they reach the end of the file.
        content = read_example(offices.path)
        assert content[max(p["position"]["charEnd"] for p in packages) :].strip() == ""


async def test_open_needs_exactly_one_key(mesh: Mesh, demo: str) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        hit = await search_target(client, RUNBOOK, namespaces=[demo])
        await expect_rejected(
            client,
            "kg_open",
            {"namespace": demo, "chunkKey": hit["chunkKey"], "fileId": hit["fileId"]},
            {"invalid_argument"},
        )
        await expect_rejected(client, "kg_open", {"namespace": demo}, {"invalid_argument"})


async def test_outline_lists_runbook_headings(mesh: Mesh, demo: str) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        hit = await search_target(client, RUNBOOK, namespaces=[demo])
        await check_runbook_outline(client, hit["fileId"])


async def test_unknown_chunk_key_is_not_found(mesh: Mesh, demo: str) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        await expect_rejected(
            client,
            "kg_open",
            {"namespace": DEMO_NAMESPACE, "chunkKey": "no-such-chunk"},
            {"not_found", "invalid_argument"},
        )

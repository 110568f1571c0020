"""get_knowledge_graph over MCP (issue 6): the Markdown link graph of the examples/ corpus, with
its edges written down by hand from the files, a root walk, paging to the end with the cursor,
a release and an environment as lookup targets, and a folder-granted reader who never sees a
node, edge, broken-link label or count from outside the folder.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

import pytest

from kgmesh_support import EXAMPLES_DIR, Mesh, Principal, call_ok, expect_rejected, mcp_http

pytestmark = pytest.mark.anyio

ONBOARDING = "handbook/onboarding.md"

# handbook/onboarding.md, its links in document order (ordinal -> target), read off the file.
ONBOARDING_EDGES = {
    (0, "handbook/security/access-policy.md"),
    (1, "handbook/security/access-policy.md"),
    (2, "handbook/offices.md"),
    (3, "support/faq.md"),
    (4, "engineering/architecture.md"),
    (5, "handbook/glossary.md"),
    (6, "support/faq.md"),
    (7, "engineering/deploy-runbook.md"),
}
ONBOARDING_EXTERNAL = {(8, "https://commonmark.org/help/"), (9, "https://12factor.net/")}
# The one link of the corpus that is broken on purpose.
BROKEN = ("handbook/security/incident-response.md", "handbook/templates/postmortem.md")


# The Markdown part of examples/ (shop/ holds files the indexer refuses, which fail an ingest).
LINKED_FOLDERS = ("handbook", "engineering", "support", "data")


@pytest.fixture(scope="module")
def demo(mesh: Mesh, tmp_path_factory: pytest.TempPathFactory) -> str:
    """examples/{handbook,engineering,support,data} ingested into their own namespace."""
    root = tmp_path_factory.mktemp("kg-corpus")
    for folder in LINKED_FOLDERS:
        shutil.copytree(EXAMPLES_DIR / folder, root / folder)
    mesh.ingest(root, "kggraph")
    return "kggraph"


def by_version(graph: dict[str, Any]) -> dict[str, str]:
    return {n["file_version_id"]: n["path"] for n in graph["nodes"]}


Rows = list[dict[str, Any]]


async def whole_graph(client: Any, **arguments: Any) -> tuple[Rows, Rows, Rows]:
    """Every page of the graph, following page_info.next to the end."""
    nodes: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    broken: list[dict[str, Any]] = []
    cursor = None
    for _ in range(100):
        pagination: dict[str, Any] = {"limit": 3}
        if cursor:
            pagination["cursor"] = cursor
        page = await call_ok(client, "get_knowledge_graph", {**arguments, "pagination": pagination})
        assert page["limit"] == 3 and page["returned_nodes"] == len(page["nodes"]) <= 3
        assert page["page_info"]["self"] == cursor
        nodes += page["nodes"]
        edges += page["edges"]
        broken += page["broken_links"]
        cursor = page["page_info"]["next"]
        assert page["partial"] == (cursor is not None or page["links_truncated"])
        if cursor is None:
            assert page["total_nodes"] == len(nodes)
            return nodes, edges, broken
    raise AssertionError("the cursor never ended")


async def test_the_examples_link_graph_matches_the_files(mesh: Mesh, demo: str) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        graph = await call_ok(
            client, "get_knowledge_graph", {"project_reference": demo, "root_path": ONBOARDING, "max_depth": 1}
        )
        paths = by_version(graph)
        assert graph["nodes"][0]["path"] == ONBOARDING, "the root comes first"
        root = graph["nodes"][0]["file_version_id"]
        edges = {
            (e["ordinal"], paths[e["target_file_version_id"]])
            for e in graph["edges"]
            if e["source_file_version_id"] == root
        }
        assert edges == ONBOARDING_EDGES
        external = {
            (e["ordinal"], e["url"]) for e in graph["external_links"] if e["source_file_version_id"] == root
        }
        assert external == ONBOARDING_EXTERNAL
        assert set(paths.values()) == {ONBOARDING} | {t for _, t in ONBOARDING_EDGES}

        # The whole graph, paged to the end: every node once, the broken link reported.
        nodes, all_edges, broken = await whole_graph(client, project_reference=demo)
        all_paths = [n["path"] for n in nodes]
        assert len(all_paths) == len(set(all_paths))
        assert all_paths == sorted(all_paths)
        versions = {n["file_version_id"]: n["path"] for n in nodes}
        assert {(versions[b["source_file_version_id"]], b["target_path"]) for b in broken} == {BROKEN}
        named = {
            (versions[e["source_file_version_id"]], e["ordinal"], versions[e["target_file_version_id"]])
            for e in all_edges
        }
        assert named >= {(ONBOARDING, o, t) for o, t in ONBOARDING_EDGES}

        too_deep = {"project_reference": demo, "max_depth": 4, "root_path": ONBOARDING}
        await expect_rejected(client, "get_knowledge_graph", too_deep, ["invalid_argument"])
        missing_root = {"project_reference": demo, "root_path": "nope.md"}
        await expect_rejected(client, "get_knowledge_graph", missing_root, ["not_found"])
        await expect_rejected(
            client,
            "get_knowledge_graph",
            {"project_reference": demo, "lookup_target": {"kind": "release", "release_version": "v0-missing"}},
            ["not_found"],
        )


async def test_a_folder_reader_sees_only_the_folder(
    mesh: Mesh, demo: str, make_principal: Callable[..., Principal]
) -> None:
    reader = make_principal("kg-reader")
    mesh.grant(reader.id, demo, "read", prefix="handbook/")
    async with mcp_http(mesh.mcp_url, reader.token) as client:
        nodes, edges, broken = await whole_graph(client, project_reference=demo)
        paths = {n["file_version_id"]: n["path"] for n in nodes}
        assert paths and all(p.startswith("handbook/") for p in paths.values())
        for e in edges:
            assert e["target_file_version_id"] in paths and e["source_file_version_id"] in paths
        assert all(b["target_path"].startswith("handbook/") for b in broken)
        rooted = {"project_reference": demo, "root_path": ONBOARDING, "max_depth": 1}
        graph = await call_ok(client, "get_knowledge_graph", rooted)
        mine = by_version(graph)
        root = graph["nodes"][0]["file_version_id"]
        edges = {
            (e["ordinal"], mine[e["target_file_version_id"]])
            for e in graph["edges"]
            if e["source_file_version_id"] == root
        }
        assert edges == {(o, t) for o, t in ONBOARDING_EDGES if t.startswith("handbook/")}
        text = str(graph)
        assert "support/" not in text and "engineering/" not in text
        # Selecting outside the grant selects nothing.
        selected = {"project_reference": demo, "caller_selector": ["engineering/"]}
        none = await call_ok(client, "get_knowledge_graph", selected)
        assert (none["returned_nodes"], none["total_nodes"], none["edges"], none["broken_links"]) == (0, 0, [], [])


async def test_a_release_and_an_environment_keep_their_snapshot(mesh: Mesh, demo: str) -> None:
    release = mesh.cli("release", "create", "--namespace", demo, "--version", "kg-test-1")
    assert release["version"] == "kg-test-1" and release["fileCount"] > 0
    deployed = mesh.cli("env", "deploy", "--namespace", demo, "--name", "kg-test-prod", "--version", "kg-test-1")
    assert deployed["releaseVersion"] == "kg-test-1"
    assert deployed["history"][0]["releaseVersion"] == "kg-test-1"
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        main = await call_ok(client, "get_knowledge_graph", {"project_reference": demo, "root_path": ONBOARDING})
        for target in (
            {"kind": "release", "release_version": "kg-test-1"},
            {"kind": "release", "release_id": release["releaseId"]},
            {"kind": "environment", "environment_name": "kg-test-prod"},
            {"kind": "environment", "environment_id": deployed["environmentId"]},
        ):
            arguments = {"project_reference": demo, "root_path": ONBOARDING, "lookup_target": target}
            graph = await call_ok(client, "get_knowledge_graph", arguments)
            assert graph["nodes"] == main["nodes"] and graph["edges"] == main["edges"], target

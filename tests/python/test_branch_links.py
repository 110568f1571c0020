"""A file uploaded only to a preview branch (issue 6): `kgmesh branch upload` queues it for the
indexer's metadata-only pass, so get_knowledge_graph on the branch, and on a release cut from
the branch, shows its front-matter title and its link edges, while main's graph never lists it.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path
from typing import Any

import pytest

from kgmesh_support import Mesh, call_ok, mcp_http

pytestmark = pytest.mark.anyio

SETUP = "---\ntitle: Setup\n---\n# Setup\n\nInstall it.\n"
PREVIEW = (
    "---\ntitle: Preview Guide\ntags: [preview]\n---\n# Preview\n\n"
    "See [setup](setup.md#install), [the site](https://example.com/docs) and [later](../todo.md).\n"
)
WAIT_S = 90.0


async def wait_for_title(client: Any, arguments: dict[str, Any], path: str, title: str) -> dict[str, Any]:
    """The graph once `path` shows `title` (indexing is asynchronous)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        graph = await call_ok(client, "get_knowledge_graph", arguments)
        if any(n["path"] == path and n["title"] == title for n in graph["nodes"]):
            return graph
        assert time.monotonic() < deadline, f"{path} never showed the title {title!r}: {graph['nodes']}"
        await asyncio.sleep(0.5)


def check_preview(graph: dict[str, Any], what: str) -> None:
    by_path = {n["path"]: n for n in graph["nodes"]}
    assert set(by_path) == {"guides/preview.md", "guides/setup.md"}, (what, graph["nodes"])
    preview, setup = by_path["guides/preview.md"], by_path["guides/setup.md"]
    assert (preview["title"], preview["tags"]) == ("Preview Guide", ["preview"]), what
    assert setup["title"] == "Setup", what
    source = preview["file_version_id"]
    assert graph["edges"] == [
        {"source_file_version_id": source, "target_file_version_id": setup["file_version_id"], "ordinal": 0}
    ], what
    assert graph["external_links"] == [
        {"source_file_version_id": source, "ordinal": 1, "url": "https://example.com/docs"}
    ], what
    assert graph["broken_links"] == [{"source_file_version_id": source, "ordinal": 2, "target_path": "todo.md"}], what


async def test_a_branch_only_file_has_its_title_and_links(mesh: Mesh, tmp_path: Path) -> None:
    namespace = f"branchlinks-{secrets.token_hex(3)}"
    main_dir = tmp_path / "main"
    (main_dir / "guides").mkdir(parents=True)
    (main_dir / "guides" / "setup.md").write_text(SETUP)
    mesh.ingest(main_dir, namespace)
    preview_file = tmp_path / "preview.md"
    preview_file.write_text(PREVIEW)

    branch = f"preview-{secrets.token_hex(3)}"
    mesh.cli("branch", "create", "--namespace", namespace, "--name", branch)
    uploaded = mesh.cli(
        "branch", "upload", "--namespace", namespace, "--branch", branch, "--path", "guides/preview.md",
        "--file", str(preview_file),
    )
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        on_main = {"project_reference": namespace}
        await wait_for_title(client, on_main, "guides/setup.md", "Setup")
        on_branch = {**on_main, "lookup_target": {"kind": "preview_branch", "branch_id": uploaded["branchId"]}}
        check_preview(await wait_for_title(client, on_branch, "guides/preview.md", "Preview Guide"), "branch")

        version = f"v-{branch}"
        mesh.cli("release", "create", "--namespace", namespace, "--version", version, "--branch", branch)
        in_release = {**on_main, "lookup_target": {"kind": "release", "release_version": version}}
        check_preview(await call_ok(client, "get_knowledge_graph", in_release), "release")

        main = await call_ok(client, "get_knowledge_graph", on_main)
        assert [n["path"] for n in main["nodes"]] == ["guides/setup.md"], main["nodes"]
        assert (main["edges"], main["total_nodes"]) == ([], 1)

"""Recovering a namespace's index from its stored files, the way an operator would, on the session
mesh (no embeddings).

The graph store loses the namespace (a FalkorDB restored without it, a volume lost): kg_search
finds nothing. `kgmesh file reindex --wait` indexes every file again from the blobs the files
service kept, and the same search answers as before. A file whose blob went missing fails its
reindex with a reason that says to upload it again; running the same `kgmesh ingest` again is
that upload (before, the same content was "unchanged" and nothing happened), and it is indexed.
A reindex needs admin on the folder: a writer is told so. Over the admin REST a reindex goes a
page at a time, and a body it cannot read (a form, a misspelt field) is refused, never taken for
"the whole namespace".
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest

from kgmesh_support import Mesh, Principal, call_ok, falkordb_port, graph_key, mcp_http, redis

pytestmark = pytest.mark.anyio

NS = "rebuilt"


def reindex(mesh: Mesh, *extra: str, token: str | None = None) -> tuple[int, dict[str, Any], str]:
    done = mesh.run("file", "reindex", "--namespace", NS, *extra, token=token, timeout=300)
    summary = json.loads(done.stdout) if done.stdout.strip() else {}
    return done.returncode, summary, done.stderr


async def top_paths(mesh: Mesh, query: str) -> list[str]:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        found = await call_ok(client, "kg_search", {"namespaces": [NS], "query": query})
    return [hit["path"] for hit in found["results"]]


def statuses(mesh: Mesh) -> dict[str, tuple[str, str]]:
    listed = mesh.cli("file", "list", "--namespace", NS)
    return {file["path"]: (file["status"], file["statusReason"]) for file in listed["files"]}


async def test_a_lost_graph_is_rebuilt_from_the_stored_files(
    mesh: Mesh, make_principal: Callable[..., Principal], tmp_path: Path
) -> None:
    # Content of this test's own: blobs are shared by content, and one is deleted below.
    marker = secrets.token_hex(6)
    folder = tmp_path / "docs"
    (folder / "ops").mkdir(parents=True)
    (folder / "ops" / "failover.md").write_text(
        f"# Failover\n\nPromote the standby quarry replica, then repoint the writers. ({marker})\n"
    )
    (folder / "ops" / "backups.md").write_text(
        f"# Backups\n\nNightly snapshots of the quarry volume are kept for thirty days. ({marker})\n"
    )
    (folder / "guide.md").write_text(f"# Guide\n\nWelcome to the quarry handbook. ({marker})\n")
    mesh.ingest(folder, NS)
    before = await top_paths(mesh, "promote the standby replica")
    assert before and before[0] == "ops/failover.md", before

    # The graph store loses the namespace: nothing is found any more.
    port = falkordb_port(mesh)
    assert redis(port, "GRAPH.DELETE", graph_key(NS)) is not None
    assert await top_paths(mesh, "promote the standby replica") == []

    # A writer may not reindex; an admin does, and waits for it.
    writer = make_principal("rebuild-writer")
    mesh.grant(writer.id, NS, "write")
    code, _, err = reindex(mesh, token=writer.token)
    assert code != 0 and "admin permission" in err, err
    code, summary, err = reindex(mesh, "--wait")
    assert code == 0, err
    assert summary == {"namespace": NS, "queued": 3, "indexed": 3, "stored": 0, "failed": []}, summary
    assert await top_paths(mesh, "promote the standby replica") == before
    assert {status for status, _ in statuses(mesh).values()} == {"indexed"}

    # One file's blob goes missing: its reindex fails and says what to do.
    blob = hashlib.sha256((folder / "ops" / "backups.md").read_bytes()).hexdigest()
    stored = mesh.data_dir / "blobs" / blob[:2] / blob[2:4] / blob
    assert stored.is_file(), stored
    stored.unlink()
    code, summary, err = reindex(mesh, "--prefix", "ops", "--wait")
    assert code == 3, (code, summary, err)
    assert summary["queued"] == 2 and summary["indexed"] == 1, summary
    assert [entry["path"] for entry in summary["failed"]] == ["ops/backups.md"], summary
    assert "upload the file again" in summary["failed"][0]["reason"], summary
    # Failed files alone: just that one, failing again the same way.
    code, summary, _ = reindex(mesh, "--failed")
    assert (code, summary["queued"]) == (0, 1), summary

    # The same ingest again is the upload the reason asks for: the file is queued again, its
    # blob stored again, and it is indexed; the two current files are left alone.
    done = mesh.run("ingest", str(folder), "--namespace", NS, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["retried"], summary["unchanged"], summary["uploaded"]) == (1, 2, 0), summary
    assert summary["failed"] == [], summary
    assert stored.is_file()
    assert statuses(mesh)["ops/backups.md"] == ("indexed", "")
    found = await top_paths(mesh, "nightly snapshots of the quarry volume")
    assert found[:1] == ["ops/backups.md"], found


def test_the_reindex_rest_pages_and_refuses_a_body_it_cannot_read(mesh: Mesh, tmp_path: Path) -> None:
    namespace = f"rebuilt-rest-{secrets.token_hex(3)}"
    folder = tmp_path / "docs"
    folder.mkdir()
    for name in ("a.md", "b.md", "c.md"):
        (folder / name).write_text(f"# {name}\n\nPage {name} of the rest test.\n")
    mesh.ingest(folder, namespace)
    url = f"{mesh.base_url}/api/v1/namespaces/{namespace}/reindex"
    admin = {"Authorization": f"Bearer {mesh.admin_token}"}
    with httpx2.Client(timeout=60) as http:
        first = http.post(url, headers=admin, json={"limit": 2})
        assert first.status_code == 200, first.text
        page = first.json()
        assert page["queued"] == 2 and [f["path"] for f in page["files"]] == ["a.md", "b.md"], page
        assert all(f["status"] == "pending" for f in page["files"]), page
        rest = http.post(url, headers=admin, json={"limit": 2, "cursor": page["nextCursor"]}).json()
        assert rest["queued"] == 1 and rest["nextCursor"] is None, rest
        # An empty body is the whole namespace; a form body (`curl -d`) is refused, not ignored.
        assert http.post(url, headers=admin).json()["queued"] == 3
        form = http.post(url, headers=admin, data={"failedOnly": "true"})
        assert form.status_code == 400 and "must be a JSON object" in form.json()["message"], form.text
        # An array is not read into the fields one by one.
        listed = http.post(url, headers=admin, json=["handbook/", True])
        assert listed.status_code == 400 and "not an object" in listed.json()["message"], listed.text
        typo = http.post(url, headers=admin, json={"failed": True})
        assert typo.status_code == 400 and "failed" in typo.json()["message"], typo.text
        over = http.post(url, headers=admin, json={"limit": 5001})
        assert over.status_code == 400 and "maximum of 5000" in over.json()["message"], over.text

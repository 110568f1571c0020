"""Deleting a namespace, as an operator does it: `kgmesh ns delete NAME --yes` on the shared mesh.

A namespace with files, a published TBox and a reader is deleted without waiting for the indexer;
`GET /api/v1/namespaces/{ns}/purge` then reports its part done. From then on no token reaches the
namespace, not even an admin's, and no listing shows it. Its FalkorDB graph and its TBox are gone.
Made again under the same name, it starts empty: nothing of the old files is found, and the old
reader's grant is gone. Deleted once more, the command waits for the indexer itself.

Also checked: the confirmation flag, a non-admin refused, and an unknown name. Each deletion is in
the audit log. The name held while the indexer works, and a deletion sent again meanwhile, are
checked against test doubles in the gateway's tests: here the indexer's part takes milliseconds.
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kgmesh_support import (
    Mesh,
    Principal,
    call_ok,
    expect_rejected,
    falkordb_port,
    graph_key,
    mcp_http,
    redis,
)

pytestmark = pytest.mark.anyio


def write_docs(folder: Path, marker: str) -> None:
    folder.mkdir()
    (folder / "ledger.md").write_text(f"# Ledger\n\nThe Quarry Holdings ledger ({marker}).\n")
    (folder / "guide.md").write_text(f"# Guide\n\nHow the Quarry Holdings team works ({marker}).\n")


def publish_tbox(mesh: Mesh, namespace: str, folder: Path) -> None:
    tbox = {"entity_types": [{"type_id": "org", "label": "Organization", "patterns": [r"\bQuarry Holdings\b"]}]}
    path = folder / "tbox.json"
    path.write_text(json.dumps(tbox), encoding="utf-8")
    mesh.publish_tbox(namespace, path)


def purge_status(mesh: Mesh, namespace: str) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{mesh.base_url}/api/v1/namespaces/{namespace}/purge",
        headers={"Authorization": f"Bearer {mesh.admin_token}"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)


def namespaces(mesh: Mesh) -> list[str]:
    return [n["name"] for n in mesh.cli("ns", "list")["namespaces"]]


async def test_a_deleted_namespace_is_gone_from_every_store_and_its_name_starts_anew(
    mesh: Mesh, make_principal, tmp_path: Path
) -> None:
    marker = secrets.token_hex(6)
    ns = f"gone-{marker}"
    write_docs(tmp_path / "old", f"{marker}old")
    mesh.ingest(tmp_path / "old", ns)
    publish_tbox(mesh, ns, tmp_path)
    reader: Principal = make_principal("reader")
    mesh.grant(reader.id, ns, "read")
    search = {"namespaces": [ns], "query": f"{marker}old"}
    async with mcp_http(mesh.mcp_url, reader.token) as client:
        found = await call_ok(client, "kg_search", search)
    assert {hit["path"] for hit in found["results"]} == {"ledger.md", "guide.md"}, found
    port = falkordb_port(mesh)
    assert redis(port, "EXISTS", graph_key(ns)) == 1

    # Not without confirmation, and not by a reader.
    unconfirmed = mesh.run("ns", "delete", ns)
    assert unconfirmed.returncode != 0 and "--yes" in unconfirmed.stderr, unconfirmed.stderr
    refused = mesh.run("ns", "delete", ns, "--yes", token=reader.token)
    assert refused.returncode != 0 and "admin" in refused.stderr, refused.stderr
    assert ns in namespaces(mesh)

    deleted = mesh.cli("ns", "delete", ns, "--yes", "--no-wait")
    assert deleted["namespace"] == ns, deleted
    assert (deleted["filesRemoved"], deleted["grantsRemoved"]) == (2, 1), deleted
    assert deleted["tbox"] == {"versionsRemoved": 1, "draftRemoved": True}, deleted
    assert deleted["purge"]["done"] is False, deleted

    # The indexer's part ends on its own: the purge status says when.
    deadline = time.monotonic() + 60
    while not (status := purge_status(mesh, ns))["done"]:
        assert time.monotonic() < deadline, status
        time.sleep(0.2)
    assert status["purgedAtMs"] >= status["requestedAtMs"] == deleted["purge"]["requestedAtMs"], status

    # Gone from every store, for every token.
    assert ns not in namespaces(mesh)
    assert redis(port, "EXISTS", graph_key(ns)) == 0
    for token in (reader.token, mesh.admin_token):
        async with mcp_http(mesh.mcp_url, token) as client:
            await expect_rejected(client, "kg_search", search, ["permission_denied", "not_found"])
    missing = mesh.run("ns", "delete", ns, "--yes")
    assert missing.returncode != 0 and "not found" in missing.stderr, missing.stderr

    # The same name again: an empty namespace, with no TBox and no reader.
    write_docs(tmp_path / "new", f"{marker}new")
    mesh.ingest(tmp_path / "new", ns)
    tbox = mesh.run("tbox", "published", "--namespace", ns)
    assert tbox.returncode != 0 and "no published TBox" in tbox.stderr, tbox.stderr
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        old = await call_ok(client, "kg_search", search)
        new = await call_ok(client, "kg_search", {"namespaces": [ns], "query": f"{marker}new"})
        files = await call_ok(client, "kg_files", {"namespace": ns})
    assert old["results"] == [], old
    assert {hit["path"] for hit in new["results"]} == {"ledger.md", "guide.md"}, new
    assert sorted(f["path"] for f in files["files"]) == ["guide.md", "ledger.md"], files
    async with mcp_http(mesh.mcp_url, reader.token) as client:
        await expect_rejected(client, "kg_search", search, ["permission_denied", "not_found"])

    # Deleted again, waiting for the indexer this time: the new files, nothing else.
    again = mesh.cli("ns", "delete", ns, "--yes")
    assert (again["filesRemoved"], again["grantsRemoved"]) == (2, 0), again
    assert again["tbox"] == {"versionsRemoved": 0, "draftRemoved": False}, again
    assert again["purge"]["done"] is True, again
    assert redis(port, "EXISTS", graph_key(ns)) == 0

    # Audit events are queued: the last one may take a moment to land.
    deadline = time.monotonic() + 30
    while True:
        audit = mesh.cli("audit", "--tool", "admin:DELETE /api/v1/namespaces/{ns}")
        outcomes = sorted(e["outcome"] for e in audit["events"] if ns in e["namespaces"])
        if len(outcomes) >= 4 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert outcomes == ["not_found", "ok", "ok", "permission_denied"], audit

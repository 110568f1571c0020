"""A deleted file's content leaves the blob store, the way an operator would check it: its own
mesh (no embeddings, no periodic sweep), a file uploaded and deleted, then `kgmesh blobs sweep`.

Within the grace period (60 s at least) the content stays: an upload stores its blob just before
it registers the version. Past it, the sweep removes the deleted file's bytes from disk and
leaves the live file's, which is still found. The registry rows of versions nothing names (a
replaced version's, a deleted file's title and links) go at the first sweep. Sweeping is for the
deployment's admins (blobs are shared by content across namespaces): a namespace's writer is
refused, and so is a grace under 60 s. The sweep is in the audit log.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kgmesh_support import Mesh, call_ok, mcp_http, mesh_with_config

pytestmark = pytest.mark.anyio

NS = "swept"
CONFIG = """[embedding]
provider = "none"

[files]
blob_sweep_every_seconds = 0
"""


@pytest.fixture
def swept_mesh(tmp_path: Path) -> Iterator[Mesh]:
    with mesh_with_config(tmp_path, CONFIG) as running:
        yield running


def blob_path(mesh: Mesh, content: bytes) -> Path:
    key = hashlib.sha256(content).hexdigest()
    return mesh.data_dir / "blobs" / key[:2] / key[2:4] / key


async def test_a_deleted_files_content_is_swept_from_disk(swept_mesh: Mesh, tmp_path: Path) -> None:
    mesh = swept_mesh
    marker = secrets.token_hex(6)
    docs = tmp_path / "docs"
    docs.mkdir()
    kept = f"# Kept\n\nThe quarry ledger stays ({marker}kept).\n".encode()
    leaked = f"# Leaked\n\nA credential that should never have been uploaded ({marker}).\n".encode()
    (docs / "kept.md").write_bytes(kept)
    (docs / "leaked.md").write_bytes(leaked)
    mesh.ingest(docs, NS)
    # A file edited once: its first version (with a link) is replaced.
    edits = tmp_path / "edits"
    edits.mkdir()
    (edits / "edited.md").write_text(f"# Edited\n\nFirst, see [kept](kept.md) ({marker}).\n")
    mesh.ingest(edits, NS)
    (edits / "edited.md").write_text(f"# Edited\n\nSecond, without a link ({marker}).\n")
    mesh.ingest(edits, NS)
    mesh.cli("file", "delete", "--namespace", NS, "--path", "leaked.md")
    assert blob_path(mesh, leaked).is_file(), "deleting a file leaves its bytes until a sweep"

    swept = mesh.cli("blobs", "sweep")
    assert swept["removed"] == 0 and swept["withinGrace"] >= 1, swept
    # The registry's rows of what nothing names go at once: the replaced version's row, title and
    # link, and the deleted file's title (its version's row stays with the file's).
    assert (swept["versionsRemoved"], swept["versionMetadataRemoved"], swept["versionLinksRemoved"]) == (1, 2, 1), swept
    assert blob_path(mesh, leaked).is_file(), "uploaded within the grace: kept"

    # As if uploaded two hours ago.
    hours_ago = time.time() - 2 * 3600
    for content in (kept, leaked):
        os.utime(blob_path(mesh, content), (hours_ago, hours_ago))
    swept = mesh.cli("blobs", "sweep")
    assert swept["removed"] == 1 and swept["removedBytes"] == len(leaked), swept
    assert swept["versionsRemoved"] == swept["versionMetadataRemoved"] == 0, "nothing more to prune"
    assert not blob_path(mesh, leaked).exists()
    assert blob_path(mesh, kept).is_file()
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        found = await call_ok(client, "kg_search", {"namespaces": [NS], "query": f"{marker}kept"})
    assert [hit["path"] for hit in found["results"]][:1] == ["kept.md"]

    writer_id = mesh.create_principal(f"sweeper-{marker}", "user")
    mesh.grant(writer_id, NS, "admin")
    token, _ = mesh.create_pat(writer_id, "sweeps")
    refused = mesh.run("blobs", "sweep", token=token)
    assert refused.returncode != 0 and "needs an admin of the deployment" in refused.stderr, refused.stderr
    refused = mesh.run("blobs", "sweep", "--grace-seconds", "5")
    assert refused.returncode != 0 and "at least 60" in refused.stderr, refused.stderr

    # Audit events are queued: the last one may take a moment to land.
    deadline = time.monotonic() + 30
    while True:
        audit = mesh.cli("audit", "--tool", "admin:POST /api/v1/blobs/sweep")
        outcomes = sorted(event["outcome"] for event in audit["events"])
        if len(outcomes) >= 4 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert outcomes == ["invalid_argument", "ok", "ok", "permission_denied"], audit

"""A NATS that comes back empty while kgmesh runs, the way an operator meets it: `kgmesh up`
against a nats-server of the test's own, which is stopped, has its store removed and is started
again on the same port (a NATS pod restarted without its volume).

Nothing of kgmesh is restarted. The next upload is queued and indexed (before, every upload
failed with `unavailable` until a restart), with the entities of the TBox published before the
loss (the ontology service puts it back into the bus from SQL), and a delete takes its file out
of search.
"""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from kgmesh_support import REPO_ROOT, Mesh, call_ok, kgmesh_bin, mcp_http

pytestmark = pytest.mark.anyio

NS = "busloss"
TBOX = """entity_types:
  - type_id: org
    label: Organization
    instances:
      - name: Quillfeather
"""


class Nats:
    """A nats-server with JetStream on a fixed port, started and stopped by the test."""

    def __init__(self, store: Path, port: int, log: Path) -> None:
        self.store, self.port, self.log = store, port, log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = REPO_ROOT / ".venv" / "bin" / "nats-server"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [str(binary), "-js", "-sd", str(self.store), "-a", "127.0.0.1", "-p", str(self.port)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                assert self.proc.poll() is None, f"nats-server exited: {self.log.read_text()[-2000:]}"
                assert time.monotonic() < deadline, "nats-server did not listen within 20 s"
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def nats(tmp_path: Path) -> Iterator[Nats]:
    server = Nats(tmp_path / "nats-store", free_port(), tmp_path / "nats.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def bus_mesh(tmp_path: Path, nats: Nats) -> Iterator[Mesh]:
    running = Mesh(
        work_dir=tmp_path / "mesh",
        binary=kgmesh_bin(),
        env={"KGMESH_EMBEDDING__PROVIDER": "none"},
        extra_args=["--nats-url", nats.url],
    )
    running.start()
    yield running
    problems = running.stop()
    assert not problems, problems


async def search_paths(mesh: Mesh, query: str) -> list[str]:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        found = await call_ok(client, "kg_search", {"namespaces": [NS], "query": query})
    return [hit["path"] for hit in found["results"]]


async def entity_names(mesh: Mesh, path: str) -> set[str]:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        files = (await call_ok(client, "kg_files", {"namespace": NS}))["files"]
        file_id = next(f["fileId"] for f in files if f["path"] == path)
        entities = await call_ok(client, "kg_file_entities", {"namespace": NS, "fileId": file_id})
    return {entity["name"] for entity in entities["entities"]}


async def test_kgmesh_heals_when_nats_comes_back_empty(bus_mesh: Mesh, nats: Nats, tmp_path: Path) -> None:
    marker = secrets.token_hex(5)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "before.md").write_text(f"# Before\n\nQuillfeather keeps the ledger ({marker}before).\n")
    bus_mesh.ingest(docs, NS)
    tbox = tmp_path / "tbox.yaml"
    tbox.write_text(TBOX)
    bus_mesh.publish_tbox(NS, tbox)
    deadline = time.monotonic() + 60
    while await entity_names(bus_mesh, "before.md") != {"Quillfeather"}:
        assert time.monotonic() < deadline, "the TBox's entity never reached before.md"
        await anyio.sleep(0.5)

    # NATS restarts without its store: every stream, consumer and bucket is gone.
    nats.stop()
    shutil.rmtree(nats.store)
    nats.start()
    # Past the indexer's 2 s TBox cache: the next file is indexed only once the ontology service
    # has put the TBox back (within its 30 s check); until then the indexer retries it.
    await anyio.sleep(3)

    (docs / "after.md").write_text(f"# After\n\nQuillfeather signs the release ({marker}after).\n")
    bus_mesh.ingest(docs, NS)
    assert (await search_paths(bus_mesh, f"{marker}after"))[:1] == ["after.md"]
    assert await entity_names(bus_mesh, "after.md") == {"Quillfeather"}, "indexed without the TBox"

    listed = bus_mesh.cli("file", "list", "--namespace", NS)
    before = next(f for f in listed["files"] if f["path"] == "before.md")
    bus_mesh.cli("file", "delete", "--namespace", NS, "--path", "before.md")
    deadline = time.monotonic() + 60
    while "before.md" in await search_paths(bus_mesh, f"{marker}before"):
        assert time.monotonic() < deadline, f"the deleted {before['fileId']} is still searchable"
        await anyio.sleep(0.5)
    log = bus_mesh.stderr_log.read_text(errors="replace")
    assert "put it back" in log, "the ontology service did not put the TBox back"

"""An embedded store whose process dies while `kgmesh up` runs (a crash, the OOM killer, an
operator's `kill -9`) is started again on its port and data, and nothing is lost: what was
indexed before is still found, and a file uploaded after is indexed. The log says what
happened, `/ready` names the store while it is down, and `up` keeps running and stops every
store it started, the restarted one too.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from kgmesh_support import Mesh, _descendants, call_ok, kgmesh_bin, mcp_http

pytestmark = pytest.mark.anyio

NS = "restarts"
T = TypeVar("T")
# Process name -> the store's name in `up`'s log.
STORES = {"redis-server": "falkordb", "nats-server": "nats-server"}


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    running = Mesh(
        work_dir=tmp_path_factory.mktemp("store-restart"),
        binary=kgmesh_bin(),
        env={"KGMESH_EMBEDDING__PROVIDER": "none"},
    )
    running.start()
    yield running
    problems = running.stop()
    assert not problems, problems


def store_pid(mesh: Mesh, command: str) -> int | None:
    """The live process named `command` that `up` started, if any."""
    assert mesh.proc is not None
    for pid in _descendants(mesh.proc.pid):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if name == command and state != "Z":
            return pid
    return None


def wait_for(check: Callable[[], T | None], seconds: float, what: str) -> T:
    deadline = time.monotonic() + seconds
    while (found := check()) is None:
        assert time.monotonic() < deadline, f"no {what} within {seconds:.0f} s"
        time.sleep(0.2)
    return found


def ready(mesh: Mesh) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"{mesh.base_url}/ready", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


async def search_paths(mesh: Mesh, query: str) -> list[str]:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        found = await call_ok(client, "kg_search", {"namespaces": [NS], "query": query, "lanes": ["fulltext"]})
    return [hit["path"] for hit in found["results"]]


@pytest.mark.parametrize("store", sorted(STORES))
async def test_a_killed_store_is_restarted_and_nothing_is_lost(mesh: Mesh, store: str, tmp_path: Path) -> None:
    marker = secrets.token_hex(5)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / f"{store}-before.md").write_text(f"# Before\n\nThe ledger is kept ({marker}before).\n")
    mesh.ingest(docs, NS)
    # Past FalkorDB's append-only fsync (every second): what was indexed is on disk.
    time.sleep(1.5)

    old = wait_for(lambda: store_pid(mesh, store), 5, f"{store} process of `kgmesh up`")
    assert ready(mesh) == (200, {"ok": True})
    os.kill(old, signal.SIGKILL)
    # Down for at least the half second before the restart: /ready names it meanwhile.
    waiting = wait_for(lambda: answer if (answer := ready(mesh))[0] == 503 else None, 5, "/ready saying 503")
    assert waiting == (503, {"ok": False, "waitingFor": [STORES[store]]}), waiting
    new = wait_for(lambda: (pid if (pid := store_pid(mesh, store)) not in (None, old) else None), 60,
                   f"restarted {store}")
    assert mesh.proc is not None and mesh.proc.poll() is None, f"`kgmesh up` stopped:\n{mesh.log_tail()}"
    wait_for(lambda: True if ready(mesh)[0] == 200 else None, 30, "/ready saying 200 again")

    (docs / f"{store}-after.md").write_text(f"# After\n\nThe release is signed ({marker}after).\n")
    mesh.ingest(docs, NS)
    assert (await search_paths(mesh, f"{marker}after"))[:1] == [f"{store}-after.md"], mesh.log_tail()
    assert (await search_paths(mesh, f"{marker}before"))[:1] == [f"{store}-before.md"], "lost by the restart"
    assert store_pid(mesh, store) == new, "restarted once"

    named = f'store="{STORES[store]}"'
    log = [line for line in mesh.stderr_log.read_text(errors="replace").splitlines() if named in line]
    exited = [line for line in log if "the embedded store exited" in line]
    assert len(exited) == 1 and "ERROR" in exited[0] and "signal: 9" in exited[0], log or mesh.log_tail()
    assert any("the embedded store is running again" in line for line in log), log

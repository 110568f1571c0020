"""The approval service is a separate process of `kgmesh up`.

Proved from the outside, through /proc: `kgmesh up` has exactly one child running
`approval-serve`, with its own pid, holding the approval gRPC socket named in mesh.json.
Approving through the admin CLI still runs the webhook effect (a real local receiver).
Killed, the child is restarted on the same address and approvals work again; the
four-eyes rule (on here) refuses a proposer's own approval with a stable error. When
`kgmesh up` stops (SIGTERM) or dies (SIGKILL), the child does not outlive it.
"""

from __future__ import annotations

import http.server
import json
import os
import secrets
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kgmesh_support import REPO_ROOT, Mesh, Principal, call_tool, kgmesh_bin, mcp_http

SHOP = REPO_ROOT / "examples" / "shop"
BASE_ENV = {"KGMESH_EMBEDDING__PROVIDER": "none"}


class _Receiver(http.server.BaseHTTPRequestHandler):
    received: list[tuple[str, str, str]] = []

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("content-length", "0"))
        self.rfile.read(length)
        _Receiver.received.append(
            (self.path, self.headers.get("X-Shop-Token", ""), self.headers.get("X-Kgmesh-Signature", ""))
        )
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def _proc_stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state) from /proc, or None once the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[1]), fields[0]


def approval_children(parent: int) -> list[int]:
    """Live children of `parent` whose command line runs `approval-serve`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _proc_stat(int(entry.name))
        if stat is None or stat[0] != parent or stat[1] == "Z":
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"approval-serve" in argv:
            found.append(int(entry.name))
    return found


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def listening_inode(port: int) -> str:
    """Inode of the loopback TCP socket listening on `port`."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return fields[9]
    raise AssertionError(f"nothing listens on port {port}")


def holds_socket(pid: int, inode: str) -> bool:
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            if os.readlink(fd) == f"socket:[{inode}]":
                return True
        except OSError:
            continue
    return False


def approval_port(m: Mesh) -> int:
    info = json.loads((m.data_dir / "mesh.json").read_text())
    return int(str(info["approval"]).rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def receiver() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_port
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def shop_up(receiver: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    work = tmp_path_factory.mktemp("approval-process")
    project = work / "shop"
    project.mkdir()
    yaml = (SHOP / "ontology.yaml").read_text().replace("127.0.0.1:8765", f"127.0.0.1:{receiver}")
    (project / "ontology.yaml").write_text(yaml)
    with sqlite3.connect(project / "shop.db") as db:
        db.executescript((SHOP / "seed.sqlite.sql").read_text())
    running = Mesh(
        work_dir=work,
        binary=kgmesh_bin(),
        env={**BASE_ENV, "SHOP_WEBHOOK_TOKEN": "tok-approval", "KGMESH_APPROVAL__FOUR_EYES": "true"},
        extra_args=["--project-dir", str(project)],
    )
    running.start()
    try:
        yield running
    finally:
        problems = running.stop()
        assert not problems, problems


def support_user(m: Mesh, stem: str, *, admin: bool = False) -> Principal:
    """A user in the `role:support` group, with a PAT."""
    name = f"{stem}-{secrets.token_hex(4)}"
    principal_id = m.create_principal(name, "user", admin=admin)
    token, pat_id = m.create_pat(principal_id, f"{name}-pat")
    groups = m.cli("group", "list")
    groups = groups.get("groups", groups) if isinstance(groups, dict) else groups
    group = next((g for g in groups if g["name"] == "role:support"), None)
    if group is None:
        group = m.cli("group", "create", "role:support")
    m.cli("group", "add-member", group["id"], principal_id)
    return Principal(principal_id, name, token, pat_id)


async def propose_cancel(m: Mesh, who: Principal, reason: str) -> str:
    async with mcp_http(m.mcp_url, who.token) as client:
        proposed = await call_tool(client, "propose_order_cancel", {"order_id": 101, "reason": reason})
    assert proposed.data["outcome"] == "pending_approval", proposed.data
    return str(proposed.data["proposal_id"])


def approve_and_expect_effect(m: Mesh, proposal_id: str) -> None:
    _Receiver.received.clear()
    done = m.cli("approvals", "approve", proposal_id, "--reason", "checked")
    assert done["state"] == "executed", done
    assert [(path, token) for path, token, _ in _Receiver.received] == [("/orders/101/cancel", "tok-approval")]
    assert _Receiver.received[0][2], "the effect carries the X-Kgmesh-Signature header"


@pytest.mark.anyio
async def test_approval_runs_in_its_own_process_and_approving_runs_the_effect(shop_up: Mesh) -> None:
    assert shop_up.proc is not None
    up_pid = shop_up.proc.pid
    children = approval_children(up_pid)
    assert len(children) == 1, f"expected one approval-serve child of {up_pid}: {children}"
    (child,) = children
    assert child != up_pid
    # The child is the one holding the approval gRPC socket the gateway and ontology call.
    assert holds_socket(child, listening_inode(approval_port(shop_up)))

    agent_user = support_user(shop_up, "proposer")
    proposal_id = await propose_cancel(shop_up, agent_user, "customer asked")
    approve_and_expect_effect(shop_up, proposal_id)


@pytest.mark.anyio
async def test_four_eyes_refuses_self_approval(shop_up: Mesh) -> None:
    boss = support_user(shop_up, "boss", admin=True)
    proposal_id = await propose_cancel(shop_up, boss, "my own")
    _Receiver.received.clear()
    refused = shop_up.run("approvals", "approve", proposal_id, token=boss.token)
    assert refused.returncode != 0, refused.stdout
    assert "four_eyes" in refused.stderr and boss.id in refused.stderr, refused.stderr
    assert _Receiver.received == []
    still = shop_up.cli("approvals", "show", proposal_id)
    assert still["state"] == "pending", still
    assert "approval_refused" in [e.get("kind") for e in still.get("events", [])], still
    # Another admin may approve it.
    approve_and_expect_effect(shop_up, proposal_id)


@pytest.mark.anyio
async def test_a_killed_approval_process_is_restarted_on_the_same_address(shop_up: Mesh) -> None:
    assert shop_up.proc is not None
    up_pid = shop_up.proc.pid
    (old,) = approval_children(up_pid)
    port = approval_port(shop_up)
    os.kill(old, signal.SIGKILL)
    new = wait_for(lambda: [p for p in approval_children(up_pid) if p != old], 20, "a restarted approval-serve")
    assert len(new) == 1, new
    assert shop_up.proc.poll() is None, "kgmesh up kept running"
    wait_for(lambda: holds_socket(new[0], listening_inode(port)), 10, "the new child to hold the socket")

    proposal_id = await propose_cancel(shop_up, support_user(shop_up, "after-restart"), "again")
    approve_and_expect_effect(shop_up, proposal_id)


def test_no_orphan_after_sigterm_or_sigkill(tmp_path: Path) -> None:
    for how in (signal.SIGTERM, signal.SIGKILL):
        m = Mesh(work_dir=tmp_path / how.name, binary=kgmesh_bin(), env=dict(BASE_ENV))
        m.work_dir.mkdir()
        m.start()
        assert m.proc is not None
        (child,) = approval_children(m.proc.pid)
        if how == signal.SIGTERM:
            problems = m.stop()
            assert not problems, problems
        else:
            # Parent gone without any chance to clean up: the parent-death signal stops the child.
            m.proc.send_signal(signal.SIGKILL)
            m.proc.wait(timeout=10)
            wait_for(lambda: _proc_stat(child) is None or _proc_stat(child)[1] == "Z", 10, "the orphan to stop")
            m.stop()  # the embedded stores got theirs too; this only reaps what is left
        state = _proc_stat(child)
        assert state is None or state[1] == "Z", f"approval-serve {child} outlived kgmesh up ({how.name})"

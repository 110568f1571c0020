"""The same slice over stdio: `kgmesh mcp --stdio --data-dir DIR` with KGMESH_TOKEN, driven by the
SDK's stdio client, and a raw check that its stdout carries JSON-RPC frames and nothing else, also
with an ontology project whose warehouse driver runs (and fails) in the process."""

from __future__ import annotations

import json
import os
import queue
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest

from kgmesh_support import (
    CORE_TOOLS,
    DEMO_NAMESPACE,
    REPO_ROOT,
    RUNBOOK,
    Mesh,
    Principal,
    assert_no_content_leak,
    call_ok,
    call_tool,
    check_core_tools,
    check_runbook_outline,
    check_search_open,
    mcp_stdio,
    mesh_with_config,
    shop_project,
)

FRAME_TIMEOUT_S = 60.0
EXIT_TIMEOUT_S = 10.0


@pytest.mark.anyio
async def test_stdio_slice(mesh: Mesh, demo: str, stdio_errlog: Path) -> None:
    with open(stdio_errlog, "w", encoding="utf-8") as errlog:
        async with mcp_stdio(mesh.binary, mesh.data_dir, mesh.admin_token, errlog) as client:
            listed = await client.list_tools()
            check_core_tools(listed.tools)
            hit, _ = await check_search_open(client, RUNBOOK)
            await check_runbook_outline(client, hit["fileId"])


@pytest.mark.anyio
async def test_stdio_enforces_the_token_grants(
    mesh: Mesh, demo: str, make_principal: Callable[..., Principal], stdio_errlog: Path
) -> None:
    # The stdio server can reach the data dir, but it answers with the token's rights only.
    user = make_principal("stdio-reader")
    with open(stdio_errlog, "w", encoding="utf-8") as errlog:
        async with mcp_stdio(mesh.binary, mesh.data_dir, user.token, errlog) as client:
            denied = await call_tool(client, "kg_search", {"query": RUNBOOK.query, "namespaces": [DEMO_NAMESPACE]})
            assert denied.error()["code"] == "permission_denied", denied.data
            assert_no_content_leak(denied, RUNBOOK.phrase)


def _check_frame(line: bytes) -> dict[str, Any]:
    """One stdout line must be exactly one JSON-RPC 2.0 message."""
    text = line.decode("utf-8").rstrip("\n")
    try:
        message = json.loads(text)
    except json.JSONDecodeError as err:
        raise AssertionError(f"stdout carried a line that is not JSON: {text[:300]!r}") from err
    assert isinstance(message, dict), f"stdout frame is not a JSON object: {text[:300]!r}"
    assert message.get("jsonrpc") == "2.0", f"frame without jsonrpc 2.0: {text[:300]!r}"
    if "method" in message:
        assert isinstance(message["method"], str)
    else:
        assert "id" in message and (("result" in message) != ("error" in message)), f"not a response: {text[:300]!r}"
    return message


def _pump(stream: IO[bytes], lines: queue.Queue[bytes | None]) -> None:
    for line in iter(stream.readline, b""):
        lines.put(line)
    lines.put(None)


@pytest.mark.parametrize("with_project", [False, True], ids=["built-in", "ontology"])
def test_stdio_stdout_is_only_jsonrpc(
    mesh: Mesh, demo: str, stdio_errlog: Path, tmp_path: Path, with_project: bool
) -> None:
    args = [str(mesh.binary), "mcp", "--stdio", "--data-dir", str(mesh.data_dir)]
    project = shop_project(tmp_path) if with_project else None
    if project is not None:
        args += ["--project-dir", str(project), "--role", "support"]
    with open(stdio_errlog, "wb") as errlog:
        server = subprocess.Popen(
            args,
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errlog,
            env={**os.environ, "KGMESH_TOKEN": mesh.admin_token},
            start_new_session=True,
        )
    assert server.stdin is not None and server.stdout is not None
    lines: queue.Queue[bytes | None] = queue.Queue()
    reader = threading.Thread(target=_pump, args=(server.stdout, lines), daemon=True)
    reader.start()

    def send(message: dict[str, Any]) -> None:
        assert server.stdin is not None
        server.stdin.write((json.dumps(message) + "\n").encode("utf-8"))
        server.stdin.flush()

    def read_until_response(request_id: int) -> dict[str, Any]:
        deadline = time.monotonic() + FRAME_TIMEOUT_S
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no response to request {request_id} within {FRAME_TIMEOUT_S:.0f} s"
            try:
                line = lines.get(timeout=remaining)
            except queue.Empty:
                continue
            assert line is not None, f"stdout closed before the response to request {request_id}"
            message = _check_frame(line)
            if message.get("id") == request_id and "method" not in message:
                return message

    try:
        send(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "kgmesh-stdio-frames", "version": "0"},
                },
            }
        )
        initialized = read_until_response(1)
        assert "result" in initialized, initialized
        assert initialized["result"]["capabilities"].get("tools") is not None, initialized["result"]
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        listed = read_until_response(2)
        names = {tool["name"] for tool in listed["result"]["tools"]}
        assert set(CORE_TOOLS) <= names, names
        if project is not None:
            assert {"get_order", "propose_order_cancel"} <= names, names
            calls = [
                ("get_order", {"order_id": 101}),
                ("propose_order_cancel", {"order_id": 101, "reason": "x", "dry_run": True}),
            ]
            for request_id, (name, arguments) in enumerate(calls, start=3):
                send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                      "params": {"name": name, "arguments": arguments}})
                answered = read_until_response(request_id)
                assert not answered["result"].get("isError"), answered
            # The warehouse fails under the driver (its table is gone): the answer is one
            # frame with a stable message, and nothing the driver says reaches stdout.
            with sqlite3.connect(project / "shop.db") as db:
                db.execute("DROP TABLE orders")
            send({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                  "params": {"name": "get_order", "arguments": {"order_id": 101}}})
            failed = read_until_response(9)
            assert failed["result"].get("isError"), failed
            assert "no such table" not in json.dumps(failed), failed

        # Closing stdin ends the session: the server exits on its own, and whatever it still
        # printed is JSON-RPC as well.
        server.stdin.close()
        try:
            code = server.wait(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"`kgmesh mcp --stdio` did not exit within {EXIT_TIMEOUT_S:.0f} s of stdin closing"
            ) from None
        reader.join(timeout=5)
        while True:
            line = lines.get(timeout=5)
            if line is None:
                break
            _check_frame(line)
        assert code == 0, f"`kgmesh mcp --stdio` exited with {code} after a clean session"
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=10)


@pytest.mark.anyio
async def test_a_stdio_server_reaches_the_mesh_again_after_up_restarts(tmp_path: Path) -> None:
    """An MCP host keeps its `kgmesh mcp --stdio` child running; when `up` restarts on the
    same data dir, the child's next calls must reach it again (the services take their
    ports back), not answer "unavailable" until the host is restarted."""
    with mesh_with_config(tmp_path, '[embedding]\nprovider = "none"\n') as running:
        with open(tmp_path / "stdio.err", "w", encoding="utf-8") as errlog:
            async with mcp_stdio(running.binary, running.data_dir, running.admin_token, errlog) as client:
                before = await call_ok(client, "kg_namespaces", {})
                first_ports = json.loads((running.data_dir / "ports.json").read_text())
                problems = running.stop()
                assert not problems, problems
                running.start()
                assert json.loads((running.data_dir / "ports.json").read_text()) == first_ports
                after = await call_ok(client, "kg_namespaces", {})
                assert after == before, (before, after)


def test_a_stdio_server_with_a_token_the_mesh_refuses_says_so_at_start(mesh: Mesh) -> None:
    """A mistyped or revoked KGMESH_TOKEN is reported to whoever starts the server, once,
    instead of the server starting and failing every call the model makes."""
    done = subprocess.run(
        [str(mesh.binary), "mcp", "--stdio", "--data-dir", str(mesh.data_dir)],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=EXIT_TIMEOUT_S * 3,
        env={**os.environ, "KGMESH_TOKEN": "kg_pat_" + "0" * 40},
        check=False,
    )
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert done.stdout == "", done.stdout
    assert "the token (KGMESH_TOKEN or --token) is not accepted by this mesh" in done.stderr, done.stderr
    assert done.stderr.count("stdio MCP server failed") == 1, done.stderr

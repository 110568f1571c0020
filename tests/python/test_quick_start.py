"""The README's quick start: `make up` runs `kgmesh up` with the arguments its Makefile recipe
gives (read from the Makefile, so the two cannot drift apart), on the default embedder, and the
folders it seeds are searchable once the ready file appears.

Every other test ingests with `kgmesh ingest` and a token; `--seed` loads as the local operator
without one, through its own caller context, and nothing else exercised that path.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

from kgmesh_support import (
    READY_TIMEOUT_S,
    REPO_ROOT,
    RUNBOOK,
    Mesh,
    MeshError,
    _descendants,
    call_ok,
    kgmesh_bin,
    mcp_http,
    search_target,
    still_running,
    tail,
)

pytestmark = pytest.mark.anyio

# The harness picks these per test (a temp data dir, a free port); the Makefile's are for people.
HARNESS_FLAGS = ("--data-dir", "--http-addr")


def make_up_arguments() -> list[str]:
    """The `kgmesh up` arguments of the Makefile's `up` recipe, without the harness's flags."""
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^up:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe, "the Makefile has no `up` target"
    commands = [shlex.split(line) for line in recipe.group(1).splitlines()]
    runs = [words for words in commands if len(words) > 1 and words[0].endswith("/kgmesh") and words[1] == "up"]
    assert len(runs) == 1, f"the `up` recipe should run `kgmesh up` once: {recipe.group(1)}"
    words, kept = runs[0][2:], []
    while words:
        word = words.pop(0)
        if word in HARNESS_FLAGS:
            words.pop(0)
        elif word.split("=", 1)[0] not in HARNESS_FLAGS:
            kept.append(word)
    return kept


def seeds(arguments: list[str]) -> list[tuple[str, str]]:
    """The (folder, namespace) pairs of the `--seed DIR:NAMESPACE` arguments."""
    pairs = [arguments[i + 1] for i, word in enumerate(arguments) if word == "--seed"]
    return [tuple(pair.rsplit(":", 1)) for pair in pairs]  # type: ignore[misc]


def visible_files(folder: str) -> list[str]:
    """What `kgmesh ingest` (and `--seed`) load from a folder: files, no dot-file or dot-folder."""
    root = REPO_ROOT / folder
    return sorted(
        path.relative_to(root).as_posix()
        for path in root.rglob("*")
        if path.is_file() and not any(part.startswith(".") for part in path.relative_to(root).parts)
    )


@pytest.fixture(scope="module")
def quick_start(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    mesh = Mesh(
        work_dir=tmp_path_factory.mktemp("kgmesh-quick-start"),
        binary=kgmesh_bin(),
        extra_args=make_up_arguments(),
    )
    try:
        mesh.start()
    except MeshError as err:
        problems = mesh.stop()
        pytest.fail(f"{err}\n{problems}", pytrace=False)
    yield mesh
    problems = mesh.stop()
    assert not problems, problems


def test_make_up_seeds_the_examples() -> None:
    assert seeds(make_up_arguments()) == [("examples", "demo")], make_up_arguments()


async def test_the_seeded_namespace_is_indexed_when_ready(quick_start: Mesh) -> None:
    for folder, namespace in seeds(make_up_arguments()):
        expected = visible_files(folder)
        log = quick_start.stderr_log.read_text(encoding="utf-8", errors="replace")
        assert f"seeded {namespace} from {folder}: {len(expected)} indexed, 0 failed" in log, quick_start.log_tail()
        async with mcp_http(quick_start.mcp_url, quick_start.admin_token) as client:
            listed = await call_ok(client, "kg_files", {"namespace": namespace, "limit": 100})
            statuses = {file["path"]: file["status"] for file in listed["files"]}
            assert sorted(statuses) == expected, statuses
            assert set(statuses.values()) == {"indexed"}, statuses
            # Searchable at once: the ready file is written after the seed, not before it.
            await search_target(client, RUNBOOK, namespaces=[namespace])


def banner_config(mesh: Mesh, client: str) -> dict:
    """The MCP client configuration `kgmesh up` printed for `client` ("Cursor", "Claude Desktop")."""
    prefix = f"  {client}: "
    lines = [line for line in mesh.stdout_log.read_text(encoding="utf-8").splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, mesh.log_tail()
    return json.loads(lines[0][len(prefix) :])["mcpServers"]["kgmesh"]


async def test_the_client_configurations_it_prints_connect(quick_start: Mesh, stdio_errlog: Path) -> None:
    cursor = banner_config(quick_start, "Cursor")
    assert cursor["url"] == quick_start.mcp_url, cursor
    assert cursor["headers"] == {"Authorization": f"Bearer {quick_start.admin_token}"}, cursor
    async with mcp_http(cursor["url"], quick_start.admin_token) as client:
        listed = await call_ok(client, "kg_namespaces", {})
        assert "demo" in [entry["name"] for entry in listed["namespaces"]], listed

    # Claude Desktop starts the command itself: the printed one must work as printed, with a
    # plain PATH (target/debug is not on it) and another working directory.
    claude = banner_config(quick_start, "Claude Desktop")
    assert Path(claude["command"]).is_absolute() and Path(claude["command"]).is_file(), claude
    params = StdioServerParameters(command=claude["command"], args=claude["args"], env=claude["env"], cwd="/")
    with open(stdio_errlog, "w", encoding="utf-8") as errlog:
        async with Client(stdio_client(params, errlog=errlog), mode="legacy") as client:
            listed = await call_ok(client, "kg_namespaces", {})
            assert "demo" in [entry["name"] for entry in listed["namespaces"]], listed


def test_a_bad_seed_fails_before_anything_starts(tmp_path: Path) -> None:
    for seed, problem in (
        ("examples", "expected DIR:NAMESPACE"),
        ("examples:Not A Namespace", "invalid namespace"),
        (f"{tmp_path / 'missing'}:demo", "does not exist"),
    ):
        done = subprocess.run(
            [str(kgmesh_bin()), "up", "--data-dir", str(tmp_path / "data"), "--seed", seed],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 64, (seed, done.returncode, done.stderr)
        assert problem in done.stderr, (seed, done.stderr)
        assert not (tmp_path / "data").exists(), f"{seed}: `kgmesh up` created its data dir before refusing"


def test_a_bad_gateway_setting_or_a_taken_port_fails_before_any_store_starts(tmp_path: Path) -> None:
    config = tmp_path / "kgmesh.toml"
    config.write_text('max_upload_bytes = 999999999999\nallowed_origins = ["not an origin"]\n')
    data = tmp_path / "data"
    done = subprocess.run(
        [str(kgmesh_bin()), "up", "--config", str(config), "--data-dir", str(data)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=30,
    )
    assert done.returncode == 64, (done.returncode, done.stderr)
    # Every problem at once.
    assert "max_upload_bytes: must be between 1 and" in done.stderr, done.stderr
    assert "allowed_origins: `not an origin` is not an origin" in done.stderr, done.stderr
    assert not data.exists(), "`kgmesh up` created its data dir before refusing"

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [str(kgmesh_bin()), "up", "--data-dir", str(data), "--http-addr", f"127.0.0.1:{port}"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=30,
        )
    assert done.returncode != 0 and f"cannot bind the gateway to 127.0.0.1:{port}" in done.stderr, done.stderr
    started = sorted(p.name for p in data.iterdir()) if data.exists() else []
    assert not {"falkordb", "nats", "secrets"} & set(started), f"started or wrote {started} before binding"


def test_an_unreachable_store_is_named_with_its_setting_and_no_secret(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(kgmesh_bin()), "up", "--data-dir", str(tmp_path / "data"), "--http-addr", "127.0.0.1:0",
         "--nats-url", "nats://s3cr3t-token@127.0.0.1:1"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    assert "error: cannot use NATS at nats://***@127.0.0.1:1 (set by --nats-url or `nats_url` in the config)" in (
        done.stderr
    ), done.stderr[-2000:]
    assert "s3cr3t-token" not in done.stderr


def test_a_signal_while_seeding_stops_every_store(tmp_path: Path) -> None:
    # Enough files that the default embedder is still indexing them when the signal comes.
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for n in range(200):
        paragraphs = "\n\n".join(f"Paragraph {p} of note {n}: the quarterly sprocket audit." for p in range(20))
        (corpus / f"note-{n:03}.md").write_text(f"# Note {n}\n\n{paragraphs}\n", encoding="utf-8")
    mesh = Mesh(work_dir=tmp_path / "mesh", binary=kgmesh_bin(), extra_args=["--seed", f"{corpus}:bulk"])
    mesh.start(wait_ready=False)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while "gateway listening" not in tail(mesh.stderr_log, 200):
        assert mesh.proc is not None and mesh.proc.poll() is None, mesh.log_tail()
        assert time.monotonic() < deadline, mesh.log_tail()
        time.sleep(0.2)
    # The stores and the approval child are up; the seed is uploading or waiting on the index.
    problems = mesh.stop()
    assert not problems, f"{problems}\n{mesh.log_tail()}"
    assert "interrupted while seeding bulk" in tail(mesh.stderr_log, 200), mesh.log_tail()
    assert not mesh.ready_file.exists(), "the ready file was written although the seed never finished"


async def test_a_second_mesh_on_the_same_data_dir_is_refused(quick_start: Mesh) -> None:
    assert quick_start.proc is not None
    for command in (["up", "--http-addr", "127.0.0.1:0"], ["stores"]):
        done = subprocess.run(
            [str(kgmesh_bin()), *command, "--data-dir", str(quick_start.data_dir)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1, (command, done.returncode, done.stderr[-2000:])
        assert f"is in use by another process (pid {quick_start.proc.pid}" in done.stderr, done.stderr[-2000:]
        assert "pass another --data-dir" in done.stderr, done.stderr[-2000:]
    # The first mesh never noticed.
    async with mcp_http(quick_start.mcp_url, quick_start.admin_token) as client:
        await search_target(client, RUNBOOK, namespaces=["demo"])


async def test_a_killed_mesh_takes_its_stores_with_it_and_starts_again(tmp_path: Path) -> None:
    """SIGKILL (or the OOM killer): no handler runs. FalkorDB and NATS get their stop signal
    from the kernel as `up` dies (before, they ran on as orphans holding the data dir, and every
    new `up` was refused). Started again at once, `up` waits for them to let go of the data dir."""
    killed = Mesh(work_dir=tmp_path / "killed", binary=kgmesh_bin(), env={"KGMESH_EMBEDDING__PROVIDER": "none"})
    killed.start()
    try:
        marker = secrets.token_hex(5)
        docs = tmp_path / "docs"
        docs.mkdir()
        (docs / "kept.md").write_text(f"# Kept\n\nThe ledger outlives a killed mesh ({marker}).\n")
        killed.ingest(docs, "killed")
        assert killed.proc is not None
        servers = _descendants(killed.proc.pid)
        assert len(servers) >= 3, f"expected FalkorDB, NATS and the approval process below `up`: {servers}"
        killed.proc.kill()
        killed.proc.wait(timeout=10)
        killed.proc = None
        killed.children = {}
        try:
            killed.start()
            left = sorted(pid for pid, started in servers.items() if still_running(pid, started))
            assert not left, f"servers of the killed `up` still run: {left}"
        finally:
            for pid, started in servers.items():
                if still_running(pid, started):
                    os.kill(pid, signal.SIGKILL)
        async with mcp_http(killed.mcp_url, killed.admin_token) as client:
            found = await call_ok(client, "kg_search", {"namespaces": ["killed"], "query": marker})
        assert [hit["path"] for hit in found["results"]][:1] == ["kept.md"], "the file indexed before is gone"
    finally:
        problems = killed.stop()
    assert not problems, problems

"""Fixtures for the kgmesh end-to-end tests.

One `kgmesh up` runs for the whole session in a fresh temp dir, with `examples/` ingested into
the `demo` namespace; every test drives it through the CLI, raw HTTP or the MCP SDK. When a test
fails, the tail of the mesh's log is attached to the report; when the session ends the mesh is
stopped with SIGTERM, and a mesh that does not stop cleanly (or leaves its stores running) fails
the run at teardown.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from kgmesh_support import DEMO_NAMESPACE, EXAMPLES_DIR, Mesh, MeshError, Principal, health, kgmesh_bin

_active_mesh: Mesh | None = None


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    # The SDK runs on anyio; asyncio is the backend every MCP client here uses.
    return "asyncio"


@pytest.fixture(scope="session")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    """`kgmesh up` on a fresh data dir, ready and healthy."""
    global _active_mesh
    # The shared mesh runs without embeddings: its corpora include a 12 MiB text file, and
    # embedding it with MiniLM in a debug build would dominate the suite. The vector lane has
    # its own mesh with MiniLM in test_vector_search.py.
    running = Mesh(
        work_dir=tmp_path_factory.mktemp("kgmesh-up"),
        binary=kgmesh_bin(),
        env={"KGMESH_EMBEDDING__PROVIDER": "none"},
    )
    _active_mesh = running
    failure: str | None = None
    try:
        running.start()
        status, body = health(running.base_url)
        if status != 200:
            failure = f"GET /health answered {status}: {body[:300]!r}\n{running.log_tail()}"
    except MeshError as err:
        failure = str(err)
    if failure is not None:
        problems = running.stop()
        _active_mesh = None
        if problems:
            failure += "\nwhile stopping it:\n- " + "\n- ".join(problems)
        pytest.fail(failure, pytrace=False)
    try:
        yield running
    finally:
        problems = running.stop()
        _active_mesh = None
    if problems:
        summary = "\n- ".join(problems)
        pytest.fail(f"kgmesh up did not shut down cleanly:\n- {summary}\n{running.log_tail()}", pytrace=False)


@pytest.fixture(scope="session")
def demo(mesh: Mesh) -> str:
    """examples/ ingested into the `demo` namespace with the admin token; returns the namespace."""
    failure: str | None = None
    try:
        mesh.ingest(EXAMPLES_DIR, DEMO_NAMESPACE)
    except MeshError as err:
        failure = str(err)
    if failure is not None:
        pytest.fail(failure, pytrace=False)
    return DEMO_NAMESPACE


@pytest.fixture
def make_principal(mesh: Mesh) -> Callable[..., Principal]:
    """Creates a principal with a fresh PAT, e.g. make_principal("alice", kind="user")."""

    def create(stem: str, *, kind: str = "user", acts_for: str | None = None, admin: bool = False) -> Principal:
        name = f"{stem}-{secrets.token_hex(4)}"
        principal_id = mesh.create_principal(name, kind, acts_for=acts_for, admin=admin)
        token, pat_id = mesh.create_pat(principal_id, f"{name}-pat")
        return Principal(principal_id, name, token, pat_id)

    return create


@pytest.fixture
def stdio_errlog(tmp_path: Path) -> Path:
    """Where a stdio server's stderr goes; attached to the report when the test fails."""
    path = tmp_path / "mcp-stdio.stderr.log"
    path.touch()
    return path


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        if _active_mesh is not None and _active_mesh.proc is not None:
            report.sections.append(("kgmesh up log tail", _active_mesh.log_tail()))
        errlog = getattr(item, "funcargs", {}).get("stdio_errlog")
        if isinstance(errlog, Path) and errlog.exists():
            report.sections.append(
                ("kgmesh mcp --stdio stderr", errlog.read_text(errors="replace")[-6000:] or "(empty)")
            )
    return report

"""The MCP TypeScript SDK 1.x client, which most MCP hosts embed, drives the gateway over Streamable
HTTP: tools/list, results in a session (the later ones answered as plain JSON), and tool errors.

That SDK checks any structuredContent against the tool's outputSchema even when `isError` is set,
so an error must reach it as text only; otherwise the host sees a protocol error instead of the
message that says what to change. Node.js and the SDK come from deploy/scripts/dev-deps.sh (a
wheel and npm), installed by `make deps`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kgmesh_support import CORE_TOOLS, REPO_ROOT, Mesh, node_binary

SDK = REPO_ROOT / ".tools" / "mcp-js" / "node_modules" / "@modelcontextprotocol" / "sdk"
SCRIPT = REPO_ROOT / "tests" / "js" / "mcp_ts_client.mjs"


def run_client(mesh: Mesh, namespace: str) -> dict[str, Any]:
    if not SDK.is_dir():
        pytest.fail(f"the MCP TypeScript SDK is missing from {SDK}: run `make deps`", pytrace=False)
    env = {**os.environ, "MCP_URL": mesh.mcp_url, "MCP_TOKEN": mesh.admin_token, "NAMESPACE": namespace, "MCP_SDK": str(SDK)}
    done = subprocess.run(
        [str(node_binary()), str(SCRIPT)], capture_output=True, text=True, timeout=120, env=env, cwd=REPO_ROOT, check=False
    )
    assert done.returncode == 0, f"node exited {done.returncode}: {done.stderr[-2000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_typescript_sdk_reads_results_and_errors(mesh: Mesh, demo: str) -> None:
    seen = run_client(mesh, demo)
    assert "thrown" not in seen, f"the TypeScript SDK threw: {seen['thrown']}"
    assert set(CORE_TOOLS) <= set(seen["tools"]), seen["tools"]
    calls = seen["calls"]
    first, search, again, too_many, unreadable = calls
    for ok in (first, search, again):
        assert not ok["isError"], ok
        assert ok["structured"] == json.loads(ok["text"]), ok
    assert demo in [entry["name"] for entry in first["structured"]["namespaces"]]
    assert first["structured"] == again["structured"]
    assert search["structured"]["results"], search
    assert all(hit["citation"].startswith(f"{demo}/") for hit in search["structured"]["results"])
    for error, code in ((too_many, "invalid_argument"), (unreadable, "permission_denied")):
        assert error["isError"] and error["structured"] is None, error
        body = json.loads(error["text"])
        assert body["code"] == code and body["message"] and body["retryable"] is False, body

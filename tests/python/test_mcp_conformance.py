"""Two MCP tools from npm drive the gateway the way developers and hosts probe a server.

- The MCP Inspector CLI (v2) lists the tools with `--strict`, which reports every schema that
  would not port to a model provider's dialect (Gemini's OpenAPI subset, for one), and calls
  tools in both protocol eras: with a session, and sessionless (2026-07-28).
- The MCP conformance suite, in server mode, runs every scenario that applies to a server
  without the reference "everything" server's fixture tools, prompts and resources. Each of the
  suite's scenarios is classified below, so a new release of the suite with a new scenario
  fails here until someone decides whether it applies.

The suite cannot send a bearer token in server mode, so it reaches the gateway through
`bearer_proxy`, which adds the token and passes everything else (Host, Origin, streams) through
unchanged. Node.js 22 and both packages come from deploy/scripts/dev-deps.sh (`make deps`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from bearer_proxy import bearer_proxy
from kgmesh_support import (
    CORE_TOOLS,
    NODE_MODULES,
    Mesh,
    inspector,
    mesh_with_config,
    run_node,
    schema_portability_problems,
)

CONFORMANCE = NODE_MODULES / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"

# Scenarios a knowledge-graph server answers as the specification says.
APPLICABLE = {
    "server-initialize": "protocol version, capabilities and serverInfo",
    "ping": "an empty result",
    "tools-list": "every tool with its input schema",
    "server-sse-multiple-streams": "several POST requests in flight on one session, each streamed",
    "dns-rebinding-protection": "a foreign Host is refused; an allowed local Host and Origin are served",
}
# Scenarios that call the everything server's fixtures, or capabilities kgmesh does not declare.
NOT_APPLICABLE = {
    "logging-set-level": "kgmesh declares no logging capability: lanes and namespaces report in trace",
    "completion-complete": "no prompts or resource templates to complete",
    "tools-call-error": "fixture tool test_error_handling: to kgmesh an unknown tool, which the "
    "specification makes a protocol error (-32602), not a tool result with isError",
    "tools-call-simple-text": "fixture tool test_simple_text",
    "tools-call-image": "fixture tool test_image_content",
    "tools-call-audio": "fixture tool test_audio_content",
    "tools-call-embedded-resource": "fixture tool test_embedded_resource",
    "tools-call-mixed-content": "fixture tool test_multiple_content_types",
    "tools-call-with-logging": "fixture tool test_tool_with_logging",
    "tools-call-with-progress": "fixture tool test_tool_with_progress",
    "tools-call-sampling": "fixture tool test_sampling; kgmesh never asks the client's model",
    "tools-call-elicitation": "fixture tool test_elicitation; kgmesh never asks the user",
    "elicitation-sep1034-defaults": "fixture elicitation tool",
    "elicitation-sep1330-enums": "fixture elicitation tool",
    "json-schema-2020-12": "fixture tool json_schema_2020_12_tool",
    "server-sse-polling": "fixture tool test_reconnection",
    "resources-list": "kgmesh serves no MCP resources: files are read through tools",
    "resources-read-text": "no MCP resources",
    "resources-read-binary": "no MCP resources",
    "resources-templates-read": "no MCP resources",
    "resources-subscribe": "no MCP resources",
    "resources-unsubscribe": "no MCP resources",
    "prompts-list": "kgmesh serves no prompts",
    "prompts-get-simple": "no prompts",
    "prompts-get-with-args": "no prompts",
    "prompts-get-embedded-resource": "no prompts",
    "prompts-get-with-image": "no prompts",
}
LOCAL_ORIGIN = "http://127.0.0.1:*"


def test_the_inspector_finds_every_tool_schema_portable(mesh: Mesh, tmp_path: Path) -> None:
    tools, problems = schema_portability_problems(mesh, tmp_path)
    assert not problems, f"schema portability problems:\n{problems[-6000:]}"
    assert set(CORE_TOOLS) <= {tool["name"] for tool in tools}
    assert all(tool.get("outputSchema") for tool in tools), "every built-in tool declares its output"


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_the_inspector_calls_tools_with_a_session_and_without(mesh: Mesh, demo: str, tmp_path: Path, era: str) -> None:
    arguments = json.dumps({"query": "refund", "namespaces": [demo], "topK": 3})
    done = inspector(mesh, tmp_path, "--method", "tools/call", "--tool-name", "kg_search", "--tool-args-json", arguments, era=era)
    assert done.returncode == 0, f"inspector exited {done.returncode}\n{done.stderr[-3000:]}"
    result = json.loads(done.stdout)["result"]
    assert result["isError"] is False, result
    hits = result["structuredContent"]["results"]
    assert 1 <= len(hits) <= 3 and all(hit["citation"].startswith(f"{demo}/") for hit in hits), hits
    assert result["structuredContent"] == json.loads(result["content"][0]["text"])

    # Over the hard cap: a tool error the agent can act on, not a protocol error.
    too_many = json.dumps({"query": "refund", "namespaces": [demo], "topK": 33})
    done = inspector(mesh, tmp_path, "--method", "tools/call", "--tool-name", "kg_search", "--tool-args-json", too_many, era=era)
    result = json.loads(done.stdout.splitlines()[0])["result"]
    assert result["isError"] is True, result
    error = json.loads(result["content"][0]["text"])
    assert error["code"] == "invalid_argument" and "topK" in error["message"], error


@pytest.fixture(scope="module")
def origin_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    """A mesh whose operator allowed browser pages on 127.0.0.1 (`allowed_origins`)."""
    toml = f'allowed_origins = ["{LOCAL_ORIGIN}"]\n[embedding]\nprovider = "none"\n'
    with mesh_with_config(tmp_path_factory.mktemp("kgmesh-conformance"), toml) as running:
        yield running


def checks_of(output_dir: Path) -> list[dict[str, Any]]:
    found = sorted(output_dir.rglob("checks.json"))
    assert found, f"the suite wrote no checks.json under {output_dir}"
    checks: list[dict[str, Any]] = []
    for path in found:
        checks.extend(json.loads(path.read_text()))
    return checks


def test_every_conformance_scenario_is_classified(tmp_path: Path) -> None:
    done = run_node(CONFORMANCE, "list", "--server", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    listed = {line.strip()[2:].split(" ")[0] for line in done.stdout.splitlines() if line.strip().startswith("- ")}
    assert listed, done.stdout
    unclassified = listed - APPLICABLE.keys() - NOT_APPLICABLE.keys()
    assert not unclassified, f"new conformance scenarios to classify: {sorted(unclassified)}"
    assert not APPLICABLE.keys() & NOT_APPLICABLE.keys()


@pytest.mark.parametrize("scenario", sorted(APPLICABLE))
def test_the_conformance_suite_passes(origin_mesh: Mesh, tmp_path: Path, scenario: str) -> None:
    upstream = urlparse(origin_mesh.mcp_url)
    assert upstream.hostname and upstream.port
    with bearer_proxy((upstream.hostname, upstream.port), origin_mesh.admin_token) as port:
        done = run_node(
            CONFORMANCE,
            "server",
            "--url",
            f"http://127.0.0.1:{port}/mcp",
            "--scenario",
            scenario,
            "--output-dir",
            str(tmp_path / "results"),
            cwd=tmp_path,
        )
    checks = checks_of(tmp_path / "results")
    failed = [check for check in checks if check.get("status") == "FAILURE"]
    assert done.returncode == 0 and not failed, (
        f"{scenario} ({APPLICABLE[scenario]}): exit {done.returncode}\n"
        f"{json.dumps(failed, indent=1)[:4000]}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    )
    assert any(check.get("status") == "SUCCESS" for check in checks), checks

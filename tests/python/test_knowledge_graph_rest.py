"""get_knowledge_graph over REST (`/api/v1/namespaces/{ns}/knowledge-graph`): POST takes the MCP
tool's arguments as a JSON body, GET the flat ones as query parameters. Both answer what the MCP
tool answers for the same caller, page to the end with page_info.next, apply the caller's own
grants (a folder reader sees only the folder, a principal without a grant gets 403) and map
errors to HTTP statuses (400 invalid_argument, 401 without a token, 404 for a missing root or
lookup target).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import httpx2
import pytest

from kgmesh_support import Mesh, Principal, call_ok, mcp_http

pytestmark = pytest.mark.anyio

ONBOARDING = "handbook/onboarding.md"


def graph_url(mesh: Mesh, namespace: str) -> str:
    return f"{mesh.base_url}/api/v1/namespaces/{namespace}/knowledge-graph"


def rest(
    mesh: Mesh, namespace: str, token: str | None, *, body: Any = None, params: dict[str, Any] | None = None
) -> httpx2.Response:
    """POST with `body` when given, else GET with `params`."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx2.Client(timeout=60.0) as http:
        if body is not None:
            return http.post(graph_url(mesh, namespace), json=body, headers=headers)
        return http.get(graph_url(mesh, namespace), params=params or {}, headers=headers)


def ok(response: httpx2.Response) -> dict[str, Any]:
    assert response.status_code == 200, f"{response.status_code}: {response.text[:500]}"
    data: dict[str, Any] = response.json()
    return data


def failed(response: httpx2.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, f"expected {status}, got {response.status_code}: {response.text[:500]}"
    error: dict[str, Any] = response.json()
    assert error["code"] == code and error["message"], error
    return error


def rest_pages(mesh: Mesh, namespace: str, token: str, **params: Any) -> tuple[list[dict[str, Any]], int]:
    """Every node over GET, three at a time, following page_info.next; returns (nodes, total)."""
    nodes: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(200):
        page = ok(rest(mesh, namespace, token, params={**params, "limit": 3, **({"cursor": cursor} if cursor else {})}))
        assert page["limit"] == 3 and page["returned_nodes"] == len(page["nodes"]) <= 3, page
        assert page["page_info"]["self"] == cursor
        nodes += page["nodes"]
        cursor = page["page_info"]["next"]
        if cursor is None:
            return nodes, page["total_nodes"]
    raise AssertionError("the cursor never ended")


async def test_post_and_get_answer_what_the_mcp_tool_answers(mesh: Mesh, demo: str) -> None:
    rooted = {"root_path": ONBOARDING, "max_depth": 1}
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        by_mcp = await call_ok(client, "get_knowledge_graph", {"project_reference": demo, **rooted})
        whole = await call_ok(client, "get_knowledge_graph", {"project_reference": demo, "pagination": {"limit": 200}})
    by_post = ok(rest(mesh, demo, mesh.admin_token, body=rooted))
    by_get = ok(rest(mesh, demo, mesh.admin_token, params=rooted))
    assert by_post == by_mcp and by_get == by_mcp
    assert by_post["nodes"][0]["path"] == ONBOARDING and by_post["edges"], by_post
    # The namespace may be repeated in the body if it agrees with the URL.
    assert ok(rest(mesh, demo, mesh.admin_token, body={**rooted, "project_reference": demo})) == by_mcp

    nodes, total = rest_pages(mesh, demo, mesh.admin_token)
    assert total == whole["total_nodes"] == len(nodes)
    assert [n["path"] for n in nodes] == [n["path"] for n in whole["nodes"]]

    searched = ok(rest(mesh, demo, mesh.admin_token, params={"search": "ONBOARDING", "limit": 200}))
    assert {n["path"] for n in searched["nodes"]} == {ONBOARDING}, searched["nodes"]
    tagged = ok(rest(mesh, demo, mesh.admin_token, params={"tags": "glossary,onboarding"}))
    assert {n["path"] for n in tagged["nodes"]} == {"handbook/glossary.md"}, tagged["nodes"]


async def test_lookup_targets_and_selectors_over_rest(mesh: Mesh, demo: str) -> None:
    version = f"rest-{secrets.token_hex(3)}"
    release = mesh.cli("release", "create", "--namespace", demo, "--version", version)
    environment = f"rest-env-{secrets.token_hex(3)}"
    mesh.cli("env", "deploy", "--namespace", demo, "--name", environment, "--version", version)
    main = ok(rest(mesh, demo, mesh.admin_token, params={"root_path": ONBOARDING}))
    for params in (
        {"release_version": version},
        {"release_id": release["releaseId"]},
        {"environment_name": environment},
    ):
        graph = ok(rest(mesh, demo, mesh.admin_token, params={"root_path": ONBOARDING, **params}))
        assert (graph["nodes"], graph["edges"]) == (main["nodes"], main["edges"]), params
    body = {"root_path": ONBOARDING, "lookup_target": {"kind": "environment", "environment_name": environment}}
    assert ok(rest(mesh, demo, mesh.admin_token, body=body))["nodes"] == main["nodes"]

    # caller_selector: a folder over GET, a list and an object over POST, false selects nothing.
    folder = ok(rest(mesh, demo, mesh.admin_token, params={"selector": "handbook/", "limit": 200}))
    assert folder["nodes"] and all(n["path"].startswith("handbook/") for n in folder["nodes"])
    body = {"caller_selector": ["handbook/"], "pagination": {"limit": 200}}
    listed = ok(rest(mesh, demo, mesh.admin_token, body=body))
    assert listed["nodes"] == folder["nodes"]
    excluded = ok(rest(mesh, demo, mesh.admin_token, body={"caller_selector": {"handbook/": False}}))
    assert excluded["total_nodes"] > 0 and not any(n["path"].startswith("handbook/") for n in excluded["nodes"])
    nothing = ok(rest(mesh, demo, mesh.admin_token, params={"selector": "false"}))
    assert (nothing["total_nodes"], nothing["nodes"], nothing["edges"]) == (0, [], [])


async def test_the_callers_own_grants_apply(mesh: Mesh, demo: str, make_principal: Callable[..., Principal]) -> None:
    reader = make_principal("kg-rest-reader")
    mesh.grant(reader.id, demo, "read", prefix="handbook/")
    nodes, total = rest_pages(mesh, demo, reader.token)
    assert nodes and total == len(nodes) and all(n["path"].startswith("handbook/") for n in nodes), nodes
    async with mcp_http(mesh.mcp_url, reader.token) as client:
        by_mcp = await call_ok(client, "get_knowledge_graph", {"project_reference": demo, "pagination": {"limit": 200}})
    assert [n["path"] for n in by_mcp["nodes"]] == [n["path"] for n in nodes]
    outside = ok(rest(mesh, demo, reader.token, params={"selector": "engineering/"}))
    assert (outside["total_nodes"], outside["nodes"], outside["broken_links"]) == (0, [], [])
    text = str(ok(rest(mesh, demo, reader.token, body={"root_path": ONBOARDING, "max_depth": 3})))
    assert "engineering/" not in text and "support/" not in text

    stranger = make_principal("kg-rest-stranger")
    failed(rest(mesh, demo, stranger.token, params={}), 403, "permission_denied")
    failed(rest(mesh, demo, stranger.token, body={"root_path": ONBOARDING}), 403, "permission_denied")
    response = rest(mesh, demo, None, params={})
    assert response.status_code == 401 and response.headers.get("WWW-Authenticate", "").lower().startswith("bearer")


async def test_bad_requests_name_the_problem(mesh: Mesh, demo: str) -> None:
    admin = mesh.admin_token
    failed(rest(mesh, demo, admin, params={"max_depth": 4, "root_path": ONBOARDING}), 400, "invalid_argument")
    failed(rest(mesh, demo, admin, params={"limit": 0}), 400, "invalid_argument")
    failed(rest(mesh, demo, admin, params={"no_such": "x"}), 400, "invalid_argument")
    failed(rest(mesh, demo, admin, params={"release_id": "x", "environment_name": "y"}), 400, "invalid_argument")
    failed(rest(mesh, demo, admin, body={"project_reference": "another"}), 400, "invalid_argument")
    failed(rest(mesh, demo, admin, body={"unknown": 1}), 400, "invalid_argument")
    failed(rest(mesh, demo, admin, body=[1, 2]), 400, "invalid_argument")
    failed(rest(mesh, demo, admin, params={"root_path": "handbook/nope.md"}), 404, "not_found")
    failed(rest(mesh, demo, admin, params={"release_version": "v0-missing"}), 404, "not_found")
    failed(rest(mesh, "Not A Namespace", admin, params={}), 400, "invalid_argument")

"""Authentication and authorisation at the gateway: PATs on /mcp (401 with WWW-Authenticate),
revocation, and grants that decide what a valid token may read, checked on every call."""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest

from kgmesh_support import (
    DEMO_NAMESPACE,
    REPO_ROOT,
    RUNBOOK,
    TARGETS,
    Mesh,
    Principal,
    assert_no_content_leak,
    call_ok,
    call_tool,
    check_search_open,
    health,
    mcp_http,
    search_target,
)

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "kgmesh-auth-test", "version": "0"},
    },
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def post_mcp(mesh: Mesh, body: dict[str, Any], authorization: str | None, **headers: str) -> httpx2.Response:
    sent = dict(MCP_HEADERS, **headers)
    if authorization is not None:
        sent["Authorization"] = authorization
    with httpx2.Client(timeout=30.0) as http:
        return http.post(mesh.mcp_url, content=json.dumps(body), headers=sent)


def assert_unauthorized(response: httpx2.Response) -> None:
    assert response.status_code == 401, f"expected 401, got {response.status_code}: {response.text[:300]}"
    challenge = response.headers.get("WWW-Authenticate", "")
    assert challenge.lower().startswith("bearer"), f"401 without a Bearer challenge: {challenge!r}"


def test_health_needs_no_auth(mesh: Mesh) -> None:
    status, body = health(mesh.base_url)
    assert status == 200
    assert json.loads(body).get("ok") is True, body


def test_mcp_without_token_is_401(mesh: Mesh) -> None:
    assert_unauthorized(post_mcp(mesh, INITIALIZE, None))


@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer kg_pat_" + secrets.token_urlsafe(32),
        "Bearer not-a-kgmesh-token",
        "Bearer",
        "Basic YWRtaW46YWRtaW4=",
    ],
    ids=["unknown-pat", "malformed", "empty", "basic-scheme"],
)
def test_mcp_with_bad_token_is_401(mesh: Mesh, authorization: str) -> None:
    assert_unauthorized(post_mcp(mesh, INITIALIZE, authorization))


def test_admin_pat_is_accepted(mesh: Mesh) -> None:
    response = post_mcp(mesh, INITIALIZE, f"Bearer {mesh.admin_token}")
    assert response.status_code == 200, response.text[:300]


def test_revoked_pat_is_401_even_inside_an_open_session(mesh: Mesh, make_principal: Callable[..., Principal]) -> None:
    bot = make_principal("revoked-bot", kind="service")
    bearer = f"Bearer {bot.token}"
    # The token works before revocation, so the 401 afterwards is the revocation's doing.
    opened = post_mcp(mesh, INITIALIZE, bearer)
    assert opened.status_code == 200, opened.text[:300]
    session = {"Mcp-Session-Id": opened.headers["mcp-session-id"]} if "mcp-session-id" in opened.headers else {}
    version = {"MCP-Protocol-Version": "2025-06-18"}
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert post_mcp(mesh, initialized, bearer, **session, **version).status_code in (200, 202)
    tools_list = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    assert post_mcp(mesh, tools_list, bearer, **session, **version).status_code == 200

    listed = mesh.cli("pat", "list")
    listed_text = json.dumps(listed)
    assert bot.pat_id in listed_text, "pat list does not show the new PAT"
    assert bot.token not in listed_text, "pat list must never print a token's secret"

    mesh.cli("pat", "revoke", bot.pat_id)

    assert_unauthorized(post_mcp(mesh, INITIALIZE, bearer))
    # No session or cache outlives the revocation.
    assert_unauthorized(post_mcp(mesh, tools_list, bearer, **session, **version))


def test_a_disabled_principal_is_shut_out_inside_an_open_session_and_let_back_in(
    mesh: Mesh, make_principal: Callable[..., Principal]
) -> None:
    """`principal disable` stops the principal's tokens and its agents' on the next call, even
    inside an open session, and keeps its tokens for `enable`; an admin cannot disable itself."""
    user = make_principal("leaver")
    agent = make_principal("leaver-bot", kind="agent", acts_for=user.id)
    version = {"MCP-Protocol-Version": "2025-06-18"}
    tools_list = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    opened = post_mcp(mesh, INITIALIZE, f"Bearer {user.token}")
    assert opened.status_code == 200, opened.text[:300]
    session = {"Mcp-Session-Id": opened.headers["mcp-session-id"]} if "mcp-session-id" in opened.headers else {}
    assert mesh.run("pat", "list", token=agent.token).returncode == 0

    shown = mesh.cli("principal", "disable", user.id)
    assert shown["id"] == user.id and shown["disabled"] is True and shown["disabledAtMs"] > 0, shown
    assert_unauthorized(post_mcp(mesh, tools_list, f"Bearer {user.token}", **session, **version))
    for token in (user.token, agent.token):
        refused = mesh.run("pat", "list", token=token)
        assert refused.returncode == 1 and "principal is disabled" in refused.stderr, refused.stderr
    listed = {p["id"]: p for p in mesh.cli("principal", "list")["principals"]}
    assert listed[user.id]["disabled"] is True and listed[agent.id]["disabled"] is False, listed
    assert [p["id"] for p in mesh.cli("pat", "list", "--principal", user.id)["pats"]] == [user.pat_id]

    assert mesh.cli("principal", "enable", user.id)["disabled"] is False
    assert post_mcp(mesh, INITIALIZE, f"Bearer {user.token}").status_code == 200
    assert mesh.run("pat", "list", token=agent.token).returncode == 0

    me = next(p for p in mesh.cli("principal", "list")["principals"] if p["name"] == "admin")
    refused = mesh.run("principal", "disable", me["id"])
    assert refused.returncode == 1 and "signed in as" in refused.stderr, refused.stderr
    refused = mesh.run("principal", "disable", "usr_nobody")
    assert refused.returncode == 1 and "not_found" in refused.stderr, refused.stderr


SESSIONLESS = "2026-07-28"


def sessionless_call(mesh: Mesh, tool: str, arguments: dict[str, Any], authorization: str) -> httpx2.Response:
    """One tools/call as a 2026-07-28 client sends it: no initialize, no session; the
    version and capabilities ride in the request's _meta, the version, method and tool name
    in headers (SEP-2243)."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": SESSIONLESS,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments, "_meta": meta},
    }
    headers = {"MCP-Protocol-Version": SESSIONLESS, "Mcp-Method": "tools/call", "Mcp-Name": tool}
    return post_mcp(mesh, body, authorization, **headers)


def test_sessionless_calls_are_authorized_one_by_one(
    mesh: Mesh, demo: str, make_principal: Callable[..., Principal]
) -> None:
    answered = sessionless_call(mesh, "kg_namespaces", {}, f"Bearer {mesh.admin_token}")
    assert answered.status_code == 200, answered.text[:300]
    assert "mcp-session-id" not in answered.headers, "a 2026-07-28 call must not open a session"
    assert answered.headers["content-type"].startswith("application/json"), answered.headers
    names = [entry["name"] for entry in answered.json()["result"]["structuredContent"]["namespaces"]]
    assert demo in names, names

    # Each request is authorized on its own: grants and revocations apply to the next one.
    reader = make_principal("sessionless-reader")
    bearer = f"Bearer {reader.token}"
    ungranted = sessionless_call(mesh, "kg_search", {"query": RUNBOOK.query, "namespaces": [demo]}, bearer)
    assert ungranted.status_code == 200, ungranted.text[:300]
    assert ungranted.json()["result"].get("isError") is True, ungranted.text[:300]
    assert RUNBOOK.phrase not in ungranted.text, "an ungranted search leaked the runbook"
    mesh.grant(reader.id, demo, "read")
    granted = sessionless_call(mesh, "kg_search", {"query": RUNBOOK.query, "namespaces": [demo]}, bearer)
    hits = granted.json()["result"]["structuredContent"]["results"]
    assert any(hit["path"] == RUNBOOK.path for hit in hits), hits
    mesh.cli("pat", "revoke", reader.pat_id)
    assert_unauthorized(sessionless_call(mesh, "kg_namespaces", {}, bearer))
    assert_unauthorized(sessionless_call(mesh, "kg_namespaces", {}, "Bearer kg_pat_" + secrets.token_urlsafe(32)))


def test_session_delete_closes_the_session_with_204(mesh: Mesh) -> None:
    bearer = f"Bearer {mesh.admin_token}"
    opened = post_mcp(mesh, INITIALIZE, bearer)
    assert opened.status_code == 200, opened.text[:300]
    session = {"Mcp-Session-Id": opened.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-06-18"}
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert post_mcp(mesh, initialized, bearer, **session).status_code in (200, 202)
    tools_list = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    assert post_mcp(mesh, tools_list, bearer, **session).status_code == 200
    with httpx2.Client(timeout=30.0) as http:
        # The guard runs first: no token, no termination.
        refused = http.delete(mesh.mcp_url, headers=session)
        assert refused.status_code == 401, refused.text[:300]
        closed = http.delete(mesh.mcp_url, headers=dict(session, Authorization=bearer))
    # 204, not rmcp's 202: the MCP Python SDK warns on anything but 200 and 204.
    assert closed.status_code == 204, f"{closed.status_code}: {closed.text[:300]}"
    assert closed.content == b""
    # The session is gone: the spec's answer to a request on it is 404.
    after = post_mcp(mesh, tools_list, bearer, **session)
    assert after.status_code == 404, f"{after.status_code}: {after.text[:300]}"


def test_cli_rejects_a_revoked_token(mesh: Mesh, make_principal: Callable[..., Principal]) -> None:
    # The admin CLI goes through the same PAT check as /mcp.
    operator = make_principal("operator", admin=True)
    assert mesh.run("ns", "list", token=operator.token).returncode == 0, "an admin PAT could not list namespaces"
    mesh.cli("pat", "revoke", operator.pat_id)
    done = mesh.run("ns", "list", token=operator.token)
    assert done.returncode != 0, f"ns list with a revoked token succeeded: {done.stdout[:300]}"


def test_non_admin_cannot_administer(mesh: Mesh, make_principal: Callable[..., Principal]) -> None:
    user = make_principal("plain-user")
    done = mesh.run(
        "principal", "create", f"sneaky-{secrets.token_hex(4)}", "--kind", "user", "--admin", token=user.token
    )
    assert done.returncode != 0, f"a non-admin PAT created an admin principal: {done.stdout[:300]}"


def test_admin_changes_are_in_the_audit_log_made_or_refused(
    mesh: Mesh, make_principal: Callable[..., Principal]
) -> None:
    """A grant made, one refused and one removed through the admin API (by the CLI) are each in
    the audit log: who, the route, the path it was made on and the namespace from the body."""
    user = make_principal("audited")
    grant_id = mesh.grant(user.id, DEMO_NAMESPACE, "read")
    refused = mesh.run(
        "grant", "put", "--principal", user.id, "--namespace", DEMO_NAMESPACE, "--permission", "admin", token=user.token
    )
    assert refused.returncode != 0, refused.stdout[:300]
    mesh.cli("grant", "delete", grant_id)

    def audited(route: str) -> list[dict[str, Any]]:
        return list(mesh.cli("audit", "--tool", f"admin:{route}", "--limit", "200")["events"])

    # Audit events are written off the call path: give the sink a moment.
    deadline = time.monotonic() + 10
    while True:
        put = audited("POST /api/v1/grants")
        mine = [e for e in put if e["principalId"] == user.id]
        removed = [e for e in audited("DELETE /api/v1/grants/{id}") if e["target"].endswith(grant_id)]
        if (mine and removed) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert [(e["outcome"], e["target"], e["namespaces"]) for e in mine] == [
        ("permission_denied", "/api/v1/grants", [DEMO_NAMESPACE])
    ], mine
    assert any(e["outcome"] == "ok" and e["namespaces"] == [DEMO_NAMESPACE] for e in put), put
    assert [(e["outcome"], e["target"]) for e in removed] == [("ok", f"/api/v1/grants/{grant_id}")], removed
    # Reads are not changes.
    assert mesh.cli("audit", "--tool", "admin:GET /api/v1/audit", "--limit", "1")["events"] == []


def test_anyone_lists_and_revokes_its_own_pats_and_no_one_elses(
    mesh: Mesh, make_principal: Callable[..., Principal]
) -> None:
    alice = make_principal("pat-owner")
    bob = make_principal("pat-neighbour")
    spare_token, spare_id = mesh.create_pat(alice.id, "alice-spare")

    # Alice sees her two PATs, never a secret and never Bob's.
    listed = mesh.cli("pat", "list", token=alice.token)["pats"]
    assert sorted(p["id"] for p in listed) == sorted([alice.pat_id, spare_id]), listed
    assert alice.token not in json.dumps(listed) and spare_token not in json.dumps(listed)
    assert mesh.cli("pat", "list", "--principal", alice.id, token=alice.token)["pats"] == listed
    refused = mesh.run("pat", "list", "--principal", bob.id, token=alice.token)
    assert refused.returncode == 1 and "permission_denied" in refused.stderr, refused.stderr
    assert "leave the principal out to list your own" in refused.stderr, refused.stderr

    # Bob's PAT is "not found" to her, and keeps working.
    refused = mesh.run("pat", "revoke", bob.pat_id, token=alice.token)
    assert refused.returncode == 1 and "not_found" in refused.stderr, refused.stderr
    assert mesh.run("pat", "list", token=bob.token).returncode == 0

    # Her spare one she revokes herself; it fails on its next call, hers still works.
    assert mesh.cli("pat", "revoke", spare_id, token=alice.token) == {"revoked": True}
    assert mesh.run("pat", "list", token=spare_token).returncode == 1
    assert mesh.run("pat", "list", token=alice.token).returncode == 0
    # Creating and rotating stay an admin's.
    assert mesh.run("pat", "create", "--principal", alice.id, "--name", "more", token=alice.token).returncode == 1
    assert mesh.run("pat", "rotate", alice.pat_id, token=alice.token).returncode == 1


def test_a_tbox_is_drafted_reviewed_and_published_over_the_admin_rest(
    mesh: Mesh, make_principal: Callable[..., Principal], tmp_path: Path
) -> None:
    namespace = f"tbox-rest-{secrets.token_hex(3)}"
    mesh.cli("ns", "create", namespace)
    base = f"{mesh.base_url}/api/v1/namespaces/{namespace}/tbox"
    admin = {"Authorization": f"Bearer {mesh.admin_token}"}
    draft = {
        "entityTypes": [{"typeId": "org", "label": "Organization", "instances": [{"name": "Acme"}]}],
        "relationTypes": [{"relationTypeId": "owns", "label": "owns", "sourceTypeId": "org", "targetTypeId": "org",
                           "patterns": ["{source} owns {target}"]}],
    }  # fmt: skip
    with httpx2.Client(timeout=30) as http:
        assert http.get(base, headers=admin).status_code == 404, "nothing is published yet"
        put = http.put(f"{base}/draft", headers=admin, json=draft)
        assert put.status_code == 200, put.text
        shown = http.get(f"{base}/draft", headers=admin).json()
        assert shown["entityTypes"][0]["instances"] == [{"name": "Acme", "aliases": []}], shown
        assert shown["relationTypes"][0]["patterns"] == ["{source} owns {target}"], "a reviewer sees the templates"
        assert shown["reviewedBy"] == "" and shown["nextVersion"] == 1, shown

        unreviewed = http.post(f"{base}/publish", headers=admin)
        assert unreviewed.status_code == 409 and "review it" in unreviewed.json()["message"], unreviewed.text
        typo = http.put(f"{base}/draft", headers=admin, json={"entityTypes": [], "relationTypess": []})
        assert typo.status_code == 400 and "relationTypess" in typo.json()["message"], typo.text
        bad_ns = http.get(f"{mesh.base_url}/api/v1/namespaces/Not_A_Namespace/tbox/draft", headers=admin)
        assert bad_ns.status_code == 400, bad_ns.text
        user = make_principal("tbox-reader")
        mesh.grant(user.id, namespace, "read")
        as_user = {"Authorization": f"Bearer {user.token}"}
        assert http.put(f"{base}/draft", headers=as_user, json=draft).status_code == 403
        assert http.post(f"{base}/draft/review", headers=as_user).status_code == 403
        assert http.get(base, headers=as_user).status_code == 404, "a reader may ask; nothing is published"

        # A review names the draft it read: one put since, and it is refused.
        read_digest = shown["digest"]
        initech = [{"typeId": "org", "label": "Organization", "instances": [{"name": "Initech"}]}]
        changed = {**draft, "entityTypes": initech}
        assert http.put(f"{base}/draft", headers=admin, json=changed).status_code == 200
        stale = http.post(f"{base}/draft/review", headers=admin, json={"digest": read_digest})
        assert stale.status_code == 409 and "changed since you read it" in stale.json()["message"], stale.text
        assert http.get(f"{base}/draft", headers=admin).json()["reviewedBy"] == ""
        assert http.put(f"{base}/draft", headers=admin, json=draft).status_code == 200
        assert http.get(f"{base}/draft", headers=admin).json()["digest"] == read_digest, "the digest is of the content"
        reviewed = http.post(f"{base}/draft/review", headers=admin, json={"digest": read_digest}).json()
        assert reviewed["reviewedBy"].startswith("usr_") and reviewed["reviewedAtMs"] > 0, reviewed
        published = http.post(f"{base}/publish", headers=admin)
        assert published.status_code == 200 and published.json()["version"] == 1, published.text
        # A reader sees what is published (as kg_ontology shows it), never a draft.
        seen = http.get(base, headers=as_user).json()
        assert (seen["version"], seen["entityTypes"][0]["typeId"]) == (1, "org"), seen
        assert http.get(f"{base}/draft", headers=as_user).status_code == 403

    # The CLI takes the same path from a file, with --url like every admin command.
    tbox = tmp_path / "tbox.yaml"
    tbox.write_text("entity_types:\n  - type_id: org\n    label: Organization\n", encoding="utf-8")
    drafted = mesh.cli("tbox", "draft", "--namespace", namespace, "--file", str(tbox))
    assert drafted["nextVersion"] == 2
    stale = mesh.run("tbox", "review", "--namespace", namespace, "--digest", read_digest)
    assert stale.returncode == 1 and "changed since you read it" in stale.stderr, stale.stderr
    mesh.cli("tbox", "review", "--namespace", namespace, "--digest", drafted["digest"])
    assert mesh.cli("tbox", "publish", "--namespace", namespace)["version"] == 2
    assert mesh.cli("tbox", "published", "--namespace", namespace)["entityTypes"][0]["instances"] == []
    tbox.write_text("entity_types:\n  - type_idd: org\n", encoding="utf-8")
    refused = mesh.run("tbox", "draft", "--namespace", namespace, "--file", str(tbox))
    assert refused.returncode != 0 and "type_idd" in refused.stderr, refused.stderr


async def _demo_chunk(mesh: Mesh) -> dict[str, Any]:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as admin:
        return await search_target(admin, RUNBOOK, namespaces=[DEMO_NAMESPACE])


@pytest.mark.anyio
async def test_grants_decide_and_apply_on_the_next_call(
    mesh: Mesh, demo: str, make_principal: Callable[..., Principal]
) -> None:
    chunk = await _demo_chunk(mesh)
    user = make_principal("reader")
    secrets_of_demo = (RUNBOOK.phrase, chunk["text"][:80])
    async with mcp_http(mesh.mcp_url, user.token) as client:
        # A valid token without a grant: an explicit error and no content.
        denied = await call_tool(client, "kg_search", {"query": RUNBOOK.query, "namespaces": [demo]})
        assert denied.error()["code"] == "permission_denied", denied.data
        assert_no_content_leak(denied, *secrets_of_demo)

        denied = await call_tool(client, "kg_open", {"namespace": demo, "chunkKey": chunk["chunkKey"]})
        assert denied.error()["code"] == "permission_denied", denied.data
        assert_no_content_leak(denied, *secrets_of_demo)

        denied = await call_tool(client, "kg_outline", {"namespace": demo, "fileId": chunk["fileId"]})
        assert denied.error()["code"] == "permission_denied", denied.data
        assert_no_content_leak(denied, "Blue-green cutover", "Freeze periods")

        listed = await call_ok(client, "kg_namespaces", {})
        assert demo not in [entry["name"] for entry in listed["namespaces"]], listed

        # Searching "everything readable" must not reach demo either.
        everywhere = await call_tool(client, "kg_search", {"query": RUNBOOK.query})
        if not everywhere.is_error:
            assert all(hit["namespace"] != demo for hit in everywhere.data["results"]), everywhere.data
        assert_no_content_leak(everywhere, *secrets_of_demo)

        # A grant takes effect on the next call of the same session.
        grant_id = mesh.grant(user.id, demo, "read")
        await check_search_open(client, RUNBOOK)
        listed = await call_ok(client, "kg_namespaces", {})
        assert demo in [entry["name"] for entry in listed["namespaces"]], listed

        # And so does taking it away.
        mesh.cli("grant", "delete", grant_id)
        denied = await call_tool(client, "kg_search", {"query": RUNBOOK.query, "namespaces": [demo]})
        assert denied.error()["code"] == "permission_denied", denied.data
        assert_no_content_leak(denied, *secrets_of_demo)


@pytest.mark.anyio
async def test_prefix_grant_reads_only_that_folder(
    mesh: Mesh, demo: str, make_principal: Callable[..., Principal]
) -> None:
    runbook_chunk = await _demo_chunk(mesh)
    user = make_principal("handbook-reader")
    mesh.grant(user.id, demo, "read", prefix="handbook/")
    offices = TARGETS[1]
    async with mcp_http(mesh.mcp_url, user.token) as client:
        # Inside the prefix: the normal slice works.
        await check_search_open(client, offices)

        # Outside it: the runbook is invisible to search and refused by open and outline.
        found = await call_ok(client, "kg_search", {"query": RUNBOOK.query, "namespaces": [demo]})
        assert all(hit["path"].startswith("handbook/") for hit in found["results"]), found["results"]
        assert RUNBOOK.phrase not in json.dumps(found)

        for name, arguments in (
            ("kg_open", {"namespace": demo, "chunkKey": runbook_chunk["chunkKey"]}),
            ("kg_outline", {"namespace": demo, "fileId": runbook_chunk["fileId"]}),
        ):
            refused = await call_tool(client, name, arguments)
            assert refused.error()["code"] in {"permission_denied", "not_found"}, refused.data
            assert_no_content_leak(refused, RUNBOOK.phrase, runbook_chunk["text"][:80], "Blue-green cutover")


def test_a_writer_of_one_folder_writes_only_there(
    mesh: Mesh, demo: str, make_principal: Callable[..., Principal]
) -> None:
    """Read on handbook/ and write on drafts/: auth names the write prefixes in the signed
    context, and the files service writes only under them, whatever the highest level held."""
    user = make_principal("drafts-writer")
    mesh.grant(user.id, demo, "read", prefix="handbook/")
    mesh.grant(user.id, demo, "write", prefix="drafts/")
    files_url = f"{mesh.base_url}/api/v1/namespaces/{demo}/files"
    headers = {"Authorization": f"Bearer {user.token}"}
    with httpx2.Client(timeout=60.0, headers=headers) as http:
        listed = http.get(files_url, params={"folderPrefix": "handbook/"})
        assert listed.status_code == 200, listed.text[:300]
        existing = listed.json()["files"][0]["path"]
        assert existing.startswith("handbook/"), existing

        note = b"# Scratch\n\nA draft that only drafts/ may hold.\n"
        for method, path, kwargs in (
            ("PUT", "handbook/new-note.md", {"content": note}),
            ("PUT", existing, {"content": note}),
            ("PATCH", existing, {"json": {"enabled": False}}),
            ("DELETE", existing, {}),
        ):
            refused = http.request(method, f"{files_url}/{path}", **kwargs)
            assert refused.status_code == 403, f"{method} {path}: {refused.status_code} {refused.text[:300]}"
            assert refused.json()["code"] == "permission_denied", refused.text[:300]
        still = http.get(f"{files_url}/{existing}")
        assert still.status_code == 200 and still.json()["file"]["enabled"] is True, still.text[:300]

        written = http.put(f"{files_url}/drafts/scratch.md", content=note)
        assert written.status_code in (200, 201), written.text[:300]
        removed = http.delete(f"{files_url}/drafts/scratch.md")
        assert removed.status_code in (200, 204), removed.text[:300]


@pytest.mark.anyio
async def test_agent_reads_only_what_its_user_may_read(
    mesh: Mesh, demo: str, make_principal: Callable[..., Principal]
) -> None:
    owner = make_principal("agent-owner")
    agent = make_principal("assistant", kind="agent", acts_for=owner.id)
    mesh.grant(agent.id, demo, "read")
    async with mcp_http(mesh.mcp_url, agent.token) as client:
        # The agent's own grant is not enough while its user has none.
        denied = await call_tool(client, "kg_search", {"query": RUNBOOK.query, "namespaces": [demo]})
        assert denied.error()["code"] == "permission_denied", denied.data
        assert_no_content_leak(denied, RUNBOOK.phrase)

        mesh.grant(owner.id, demo, "read")
        await check_search_open(client, RUNBOOK)


@pytest.mark.anyio
async def test_reader_of_one_namespace_sees_only_that_one(
    mesh: Mesh, demo: str, make_principal: Callable[..., Principal]
) -> None:
    namespace = f"notes-{secrets.token_hex(4)}"
    mesh.cli("ns", "create", namespace)
    assert namespace in json.dumps(mesh.cli("ns", "list")), "ns list does not show the new namespace"
    with tempfile.TemporaryDirectory(prefix="kgmesh-notes-") as folder:
        note = Path(folder) / "kitchen" / "pantry.md"
        note.parent.mkdir()
        note.write_text(
            "# Pantry\n\nThe quince marmalade ledger lists every jar, its date and who made it.\n"
            "The crew on the Friday shift restocks the shelves.\n",
            encoding="utf-8",
        )
        mesh.ingest(Path(folder), namespace)

    user = make_principal("notes-reader")
    mesh.grant(user.id, namespace, "read")
    async with mcp_http(mesh.mcp_url, user.token) as client:
        listed = await call_ok(client, "kg_namespaces", {})
        names = [entry["name"] for entry in listed["namespaces"]]
        assert namespace in names and demo not in names, names

        # Without a namespace list, search covers what the caller may read, and nothing else.
        found = await call_ok(client, "kg_search", {"query": "quince marmalade ledger"})
        assert found["results"] and found["results"][0]["path"] == "kitchen/pantry.md", found["results"]
        assert found["results"][0]["citation"].startswith(f"{namespace}/kitchen/pantry.md")
        # "crew" is all over demo as well; only the note may come back.
        mixed = await call_ok(client, "kg_search", {"query": "crew"})
        assert mixed["results"], "the note mentions the crew, so the search must find it"
        assert all(hit["namespace"] == namespace for hit in mixed["results"]), mixed["results"]

        # Naming a namespace the caller may not read is an error, not a quietly smaller answer.
        denied = await call_tool(client, "kg_search", {"query": RUNBOOK.query, "namespaces": [namespace, demo]})
        assert denied.error()["code"] == "permission_denied", denied.data
        assert_no_content_leak(denied, "The blue-green cutover window is 20 minutes")


@pytest.mark.anyio
async def test_a_nul_character_is_refused_saying_where(mesh: Mesh) -> None:
    """A NUL (U+0000) in any tool argument, admin body or admin address is refused as invalid_argument
    naming where it is, before any store sees it (PostgreSQL refuses it in text, as an internal error)."""
    namespace = f"nul-{secrets.token_hex(3)}"
    mesh.cli("ns", "create", namespace)
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        search = (await call_tool(client, "kg_search", {"query": "turbine\x00", "namespaces": [namespace]})).error()
        assert search["code"] == "invalid_argument" and search["message"].startswith("`query`"), search
        # A list cursor is a hex-encoded path; one that decodes to a NUL is not one the service returned.
        forged = (await call_tool(client, "kg_files", {"namespace": namespace, "cursor": "300a00"})).error()
        assert forged["code"] == "invalid_argument" and "cursor" in forged["message"], forged
    admin = {"Authorization": f"Bearer {mesh.admin_token}", "Content-Type": "application/json"}
    with httpx2.Client(timeout=30.0) as http:
        created = http.post(
            f"{mesh.base_url}/api/v1/namespaces",
            content=json.dumps({"name": f"{namespace}-x", "description": "a\x00b"}),
            headers=admin,
        )
        assert created.status_code == 400, created.text
        assert created.json()["code"] == "invalid_argument" and "`description`" in created.json()["message"]
        audit = http.get(f"{mesh.base_url}/api/v1/audit?tool=%00", headers=admin)
        assert audit.status_code == 400 and audit.json()["code"] == "invalid_argument", audit.text
        listed = http.get(f"{mesh.base_url}/api/v1/namespaces", headers=admin).json()
    assert f"{namespace}-x" not in json.dumps(listed), "nothing was stored"


def test_a_listing_piped_into_a_reader_that_stops_ends_quietly(mesh: Mesh) -> None:
    """`kgmesh ns list | head -1`: the reader is gone before the listing is written; the
    command ends by SIGPIPE as any Unix tool does, not with a panic and exit 101."""
    listing = subprocess.Popen(
        [str(mesh.binary), "ns", "list", "--url", mesh.base_url, "--token", mesh.admin_token],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert listing.stdout is not None and listing.stderr is not None
    listing.stdout.close()
    stderr = listing.stderr.read().decode()
    assert listing.wait(timeout=60) == -signal.SIGPIPE, stderr
    assert "panicked" not in stderr, stderr


def test_an_admin_reads_back_a_tbox_published_before_its_namespace_exists(mesh: Mesh, tmp_path: Path) -> None:
    """Publishing works before the ingest that makes the namespace; reading the published TBox
    back then answered permission_denied to the admin who had just published it."""
    namespace = "tbox-before-namespace"
    tbox = tmp_path / "tbox.yaml"
    tbox.write_text("entity_types:\n  - type_id: org\n    label: Organization\n", encoding="utf-8")
    mesh.publish_tbox(namespace, tbox)
    assert namespace not in [entry["name"] for entry in mesh.cli("ns", "list")["namespaces"]]
    published = mesh.cli("tbox", "published", "--namespace", namespace)
    assert published["entityTypes"][0]["typeId"] == "org", published
    missing = mesh.run("tbox", "published", "--namespace", "tbox-never-published")
    assert missing.returncode == 1 and "no published TBox" in missing.stderr, missing.stderr

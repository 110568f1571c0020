"""Canary leak suite: no tool the gateway serves lets a restricted principal read a byte of a file
it must not see.

An independent `kgmesh up` gets a generated corpus: namespace `canary` with allowed files, a denied
folder, a file denied by id, files denied to one principal and to one group, a disabled file, a
hidden file and folders outside a prefix grant; namespace `vault`, which no restricted principal
may read. Every file carries canary strings of its own (tokens, a path token, made-up entity
names and relations, a bait word). The admin harvests every key of every file before the rules
are applied. Then each restricted principal (reader, prefix reader, agents narrower and broader
than their user, group member, principal without grants) calls every tool in `tools/list` with
arguments generated from its inputSchema, and every response is checked: no canary, no forbidden
key or path, explicit permission_denied for unreadable namespaces, totals equal to what the
principal can open, every returned package openable by the same principal.

KGMESH_CANARY_SEED replays a run's corpus and argument choices (the seed is printed with the
summary; keys differ between runs because the server mints file ids); KGMESH_CANARY_RANDOM sets
the number of random argument sets per tool and principal.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from canary import (
    CANARY_NS,
    CYPHER_PAGED,
    CYPHER_TEMPLATES,
    GARBAGE_CURSORS,
    KG_REFERENCE,
    ORDINARY_QUERIES,
    VAULT_NS,
    WILDCARDS,
    AccessModel,
    ArgGenerator,
    Corpus,
    CorpusFile,
    DenySpec,
    GrantSpec,
    KeyBook,
    LOOKUP_TARGET_KINDS,
    Needles,
    Pools,
    PrincipalSpec,
    Tally,
    Violation,
    admin_files,
    build_corpus,
    caller_selectors,
    fabricate_like,
    key_kind,
    known_files_in,
    lookup_target,
    namespaces_named,
    packages_in,
    prop_role,
    selected,
    wanted_kind,
)
from kgmesh_support import CORE_TOOLS, Mesh, MeshError, call_ok, call_tool, health, kgmesh_bin, mcp_http

pytestmark = pytest.mark.anyio

SEED = int(os.environ.get("KGMESH_CANARY_SEED") or secrets.randbits(32))
RANDOM_CALLS_PER_TOOL = int(os.environ.get("KGMESH_CANARY_RANDOM") or 16)
MIN_RANDOM = 4
# Argument sets per principal (systematic and random together): random ones fill what the
# systematic ones leave, down to MIN_RANDOM per tool. Oracle, namespace and reopen probes come on top.
CALLS_PER_PRINCIPAL = int(os.environ.get("KGMESH_CANARY_BUDGET") or 200)
# Forbidden keys of each kind per forbidden file probed against a made-up control.
ORACLE_KEYS_PER_KIND = 1
# The suite may not silently shrink: fewer calls than this fails it.
MIN_CALLS = 300
# Principals fuzzed at the same time (each has its own MCP session).
PARALLEL_PRINCIPALS = 8
# Admin sessions harvesting keys at the same time.
HARVEST_SESSIONS = 8
OPEN_MAX = 32
OUTLINE_MAX = 200

T = TypeVar("T")


def principal_specs() -> dict[str, PrincipalSpec]:
    whole = GrantSpec(CANARY_NS)
    public = GrantSpec(CANARY_NS, "public/")
    specs = [
        PrincipalSpec("reader", "user", (whole,)),
        PrincipalSpec("folder", "user", (public,)),
        # Agents: narrower than their user, broader than their user (even a namespace the user
        # cannot read), and broad on behalf of a prefix-only user.
        PrincipalSpec("agent-narrow", "agent", (public,), acts_for="reader"),
        PrincipalSpec("agent-broad", "agent", (whole, GrantSpec(VAULT_NS)), acts_for="reader"),
        PrincipalSpec("agent-of-folder", "agent", (whole,), acts_for="folder"),
        PrincipalSpec("member", "user", groups=("crew",)),
        PrincipalSpec("nobody", "user"),
        # Positive control: writers see hidden files.
        PrincipalSpec("writer", "user", (GrantSpec(CANARY_NS, "", "write"),), restricted=False),
    ]
    return {p.label: p for p in specs}


GROUP_GRANTS = {"crew": (GrantSpec(CANARY_NS),)}


def deny_specs(corpus: Corpus) -> tuple[DenySpec, ...]:
    return (
        DenySpec(CANARY_NS, prefix=corpus.secret_folder),
        DenySpec(CANARY_NS, file_role="denied-file"),
        DenySpec(CANARY_NS, file_role="user-denied", principal="reader"),
        DenySpec(CANARY_NS, file_role="group-denied", group="crew"),
    )


@dataclass
class World:
    mesh: Mesh
    corpus: Corpus
    model: AccessModel
    book: KeyBook
    ghost: str  # a namespace that does not exist
    admin_calls: int
    # Per tool: arguments that succeed for the admin on a public file, the base of the probes
    # that swap in an unreadable namespace (so only the namespace can make them fail).
    templates: dict[str, dict[str, Any]]
    # The preview branch, release and environment of `canary` (ids, version string, name).
    versions: dict[str, str] = field(default_factory=dict)
    # Rows the admin gets from each kg_cypher template (the non-vacuity of the cypher probes).
    cypher_admin_rows: dict[str, int] = field(default_factory=dict)

    @property
    def restricted(self) -> list[PrincipalSpec]:
        return [p for p in self.model.principals.values() if p.restricted]

    def file_by_role(self, role: str) -> CorpusFile:
        return self.corpus.one(role)


# ---------------------------------------------------------------------------------------------
# The mesh, the corpus, the harvest and the rules
# ---------------------------------------------------------------------------------------------


async def in_parallel(items: list[T], work: Callable[[Client, T], Awaitable[None]], token: str, url: str) -> None:
    """`work(client, item)` for every item, on a few MCP sessions at once; the first assertion
    that fails is raised as itself (not inside an exception group)."""
    pending = list(items)
    failures: list[AssertionError] = []

    async def worker() -> None:
        async with mcp_http(url, token) as client:
            while pending and not failures:
                item = pending.pop(0)
                try:
                    await work(client, item)
                except AssertionError as err:
                    failures.append(err)

    async with anyio.create_task_group() as group:
        for _ in range(min(HARVEST_SESSIONS, len(items))):
            group.start_soon(worker)
    if failures:
        raise failures[0]


async def harvest(mesh: Mesh, corpus: Corpus, book: KeyBook, rng: random.Random) -> int:
    """As admin, before any rule exists: every key of every file, and the totals the admin sees."""
    calls = 0

    async def one_file(admin: Client, f: CorpusFile) -> None:
        nonlocal calls
        opened = await call_ok(admin, "kg_open", {"namespace": f.namespace, "fileId": f.file_id, "limit": OPEN_MAX})
        assert opened["total"] == f.chunk_count and not opened["truncated"], (
            f"admin kg_open of {f.ref}: total {opened['total']}, files listing says {f.chunk_count} chunks"
        )
        assert all(p["fileId"] == f.file_id for p in opened["packages"]), f"kg_open {f.ref} returned other files"
        book.harvest(opened, f)
        book.open_totals[(f.namespace, "fileId", f.file_id)] = f.chunk_count
        for package in opened["packages"]:
            book.open_totals[(f.namespace, "chunkKey", package["chunkKey"])] = 1
        outline = await call_ok(
            admin, "kg_outline", {"namespace": f.namespace, "fileId": f.file_id, "limit": OUTLINE_MAX}
        )
        f.outline_total = outline["total"]
        assert f.outline_total >= 3, f"{f.ref} has three headings; outline total {f.outline_total}"
        book.harvest(outline, f)
        first = await call_ok(admin, "kg_outline", {"namespace": f.namespace, "fileId": f.file_id, "limit": 1})
        if first.get("nextCursor"):
            book.cursors.add(first["nextCursor"])
        for section in outline["sections"]:
            key = section["outlineKey"]
            by_section = await call_ok(
                admin, "kg_open", {"namespace": f.namespace, "outlineKey": key, "limit": OPEN_MAX}
            )
            book.harvest(by_section, f)
            book.open_totals[(f.namespace, "outlineKey", key)] = by_section["total"]
        found = await call_ok(admin, "kg_search", {"query": f.bait, "namespaces": [f.namespace]})
        assert any(hit["fileId"] == f.file_id for hit in found["results"]), (
            f"admin search for {f.bait!r} does not find {f.ref}"
        )
        book.harvest(found, None)
        calls += 4 + len(outline["sections"])

    await in_parallel(corpus.files, one_file, mesh.admin_token, mesh.mcp_url)
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as admin:
        later = [tool for tool in (await admin.list_tools()).tools if tool.name not in CORE_TOOLS]

    async def later_tools(admin: Client, f: CorpusFile) -> None:
        """Tools added after the foundation: each is called with this file's keys and path, and
        every key-shaped string it returns is remembered as seen in this file."""
        nonlocal calls
        own_keys = [k for k in book.all_keys() if book.files_of(k) == {f.ref}]
        cursors = [*sorted(book.cursors), ""]
        pools = Pools(f.namespace, (f.namespace,), [], own_keys, cursors, [f.bait], [f.path], frozenset({f.file_id}))
        for tool in later:
            gen = ArgGenerator(tool.name, tool.input_schema, pools, rng)
            naming = [n for n, p in gen.properties.items() if prop_role(n, p) in ("key", "path")]
            for values in [gen.base()] + [gen.with_value(n, gen.sensible(n, gen.properties[n])) for n in naming]:
                calls += 1
                try:
                    outcome = await call_tool(admin, tool.name, values)
                except MCPError:
                    continue  # arguments this tool refuses before running
                if not outcome.is_error:
                    book.harvest(outcome.data, f)

    await in_parallel(corpus.files, later_tools, mesh.admin_token, mesh.mcp_url)
    return calls


async def find_templates(mesh: Mesh, corpus: Corpus, book: KeyBook, rng: random.Random) -> dict[str, dict[str, Any]]:
    """For each tool, arguments the admin gets a success for, using keys of the public files."""
    public = corpus.by_role("public")
    refs = {f.ref for f in public}
    keys = [k for k in book.all_keys() if book.files_of(k) <= refs and book.files_of(k)]
    file_ids = frozenset(f.file_id for f in public)
    pools = Pools(CANARY_NS, (CANARY_NS,), [], keys, [""], [public[0].bait], [public[0].path], file_ids)
    templates: dict[str, dict[str, Any]] = {}
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as admin:
        for tool in (await admin.list_tools()).tools:
            gen = ArgGenerator(tool.name, tool.input_schema, pools, rng)
            tries = [gen.base()] + [gen.with_value(n, gen.sensible(n, s)) for n, s in gen.properties.items()]
            tries += list(gen.random(10))
            for values in tries:
                try:
                    works = gen.valid(values) and not (await call_tool(admin, tool.name, values)).is_error
                except MCPError:
                    works = False
                if works:
                    templates[tool.name] = values
                    break
    return templates


def apply_rules(mesh: Mesh, corpus: Corpus, model: AccessModel) -> None:
    """Principals, PATs, groups, grants, denies, disabled and hidden flags, via the admin CLI."""
    suffix = secrets.token_hex(3)
    group_ids: dict[str, str] = {}
    for label, grants in model.group_grants.items():
        created = mesh.cli("group", "create", f"{label}-{suffix}")
        assert isinstance(created, dict) and created.get("id"), f"group create printed {created!r}"
        group_ids[label] = str(created["id"])
        for g in grants:
            mesh.cli(*_grant_args("--group", group_ids[label], g))
    for p in model.principals.values():  # users come before the agents acting for them
        name = f"canary-{p.label}-{suffix}"
        acts_for = model.principals[p.acts_for].id if p.acts_for else None
        p.id = mesh.create_principal(name, p.kind, acts_for=acts_for)
        p.token, _ = mesh.create_pat(p.id, f"{name}-pat")
        for g in p.grants:
            mesh.cli(*_grant_args("--principal", p.id, g))
        for group in p.groups:
            mesh.cli("group", "add-member", group_ids[group], p.id)
    for deny in model.denies:
        args = ["deny", "put", "--namespace", deny.namespace]
        if deny.principal is not None:
            args += ["--principal", model.principals[deny.principal].id]
        if deny.group is not None:
            args += ["--group", group_ids[deny.group]]
        if deny.prefix:
            args += ["--prefix", deny.prefix]
        else:
            args += ["--file-id", corpus.one(deny.file_role).file_id]
        mesh.cli(*args)
    for role in model.disabled_roles:
        f = corpus.one(role)
        mesh.cli("file", "set", "--namespace", f.namespace, "--path", f.path, "--enabled", "false")
    for role in model.hidden_roles:
        f = corpus.one(role)
        mesh.cli("file", "set", "--namespace", f.namespace, "--path", f.path, "--hidden", "true")
    listed = {entry["path"]: entry for entry in admin_files(mesh.base_url, mesh.admin_token, CANARY_NS)}
    for f in corpus.files:
        if f.namespace != CANARY_NS:
            continue
        entry = listed[f.path]
        assert entry["enabled"] == (f.role not in model.disabled_roles), f"enabled flag of {f.ref}: {entry}"
        assert entry["hidden"] == (f.role in model.hidden_roles), f"hidden flag of {f.ref}: {entry}"


def _grant_args(subject_flag: str, subject: str, g: GrantSpec) -> list[str]:
    args = ["grant", "put", subject_flag, subject, "--namespace", g.namespace, "--permission", g.permission]
    return args + (["--prefix", g.prefix] if g.prefix else [])


async def build_world(running: Mesh, tmp_path_factory: pytest.TempPathFactory) -> World:
    """Corpus in, keys harvested, rules applied: the state every test of this module reads."""
    running.start()
    status, body = health(running.base_url)
    assert status == 200, f"GET /health answered {status}: {body[:300]!r}"
    rng = random.Random(SEED)
    corpus = build_corpus(rng)
    folders = corpus.write(tmp_path_factory.mktemp("canary-corpus"))
    book = KeyBook()
    for namespace, folder in folders.items():
        running.cli("ns", "create", namespace)
        publish_tbox(running, namespace, tmp_path_factory.mktemp(f"tbox-{namespace}"))
        running.ingest(folder, namespace)
        by_path = {entry["path"]: entry for entry in admin_files(running.base_url, running.admin_token, namespace)}
        for f in corpus.files:
            if f.namespace != namespace:
                continue
            entry = by_path.get(f.path)
            assert entry is not None, f"{f.ref} is not in the files listing: {sorted(by_path)}"
            assert entry["status"] == "indexed", f"{f.ref} was not indexed: {entry}"
            f.file_id, f.version_id, f.chunk_count = entry["fileId"], entry["versionId"], entry["chunkCount"]
            book.add_file(f)
    admin_calls = await harvest(running, corpus, book, rng)
    templates = await find_templates(running, corpus, book, rng)
    versions = create_versions(running, corpus, book, tmp_path_factory.mktemp("canary-branch"))
    admin_calls += await harvest_graph(running, corpus, book, versions)
    cypher_rows = await admin_cypher_rows(running, corpus)
    model = AccessModel(
        corpus=corpus,
        principals=principal_specs(),
        group_grants=GROUP_GRANTS,
        denies=deny_specs(corpus),
        disabled_roles=frozenset({"disabled"}),
        hidden_roles=frozenset({"hidden"}),
    )
    apply_rules(running, corpus, model)
    ghost = f"nosuch-{secrets.token_hex(4)}"
    return World(running, corpus, model, book, ghost, admin_calls, templates, versions, cypher_rows)


def publish_tbox(mesh: Mesh, namespace: str, folder: Path) -> None:
    """A published TBox whose entity pattern matches the files' made-up two-word names and whose
    relations are the ones their sentences state, so chunks mention entities and REL edges exist:
    the entity and relation tools and kg_cypher's Entity/REL statements have real rows to leak.
    A pattern, not a gazetteer: the TBox is readable by every reader of the namespace (kg_ontology),
    so it must not list names from files some of them may not read."""
    relations = {"acquired": "{source} acquired {target}", "supplies": "{source} supplies {target}"}
    relations["owned_by"] = "{source} is owned by {target}"
    name = r"\b[A-Z][a-z]{5,} [A-Z][a-z]{5,}\b"
    tbox = {
        "entity_types": [{"type_id": "org", "label": "Organization", "patterns": [name]}],
        "relation_types": [
            {"relation_type_id": rid, "label": rid.replace("_", " "), "source_type_id": "org",
             "target_type_id": "org", "patterns": [pattern]}
            for rid, pattern in relations.items()
        ],
    }  # fmt: skip
    path = folder / "tbox.json"
    path.write_text(json.dumps(tbox), encoding="utf-8")
    mesh.publish_tbox(namespace, path)


def create_versions(mesh: Mesh, corpus: Corpus, book: KeyBook, folder: Path) -> dict[str, str]:
    """A preview branch of `canary` where a public file and a denied-folder file have new
    versions (each still carrying only its own canaries), a release of that branch and an
    environment it is deployed to: every lookup_target kind resolves to something."""
    suffix = secrets.token_hex(3)
    branch = mesh.cli("branch", "create", "--namespace", CANARY_NS, "--name", f"canary-preview-{suffix}")
    assert isinstance(branch, dict) and branch.get("branchId"), f"branch create printed {branch!r}"
    uploaded_versions: list[str] = []
    for f in (corpus.by_role("public")[0], corpus.by_role("denied-folder")[0]):
        local = folder / f.path.rsplit("/", 1)[-1]
        local.write_text(f"{f.text}\nA preview line about the {f.bait} review. {f.canaries[2]}\n", encoding="utf-8")
        uploaded = mesh.cli(
            "branch", "upload", "--namespace", CANARY_NS, "--branch", branch["branchId"],
            "--path", f.path, "--file", str(local),
        )  # fmt: skip
        assert uploaded["fileId"] == f.file_id and uploaded["versionId"] != f.version_id, uploaded
        # The branch version is this file's too: a needle for whoever may not read the file.
        book.files_by_id[uploaded["versionId"]] = f
        book.owner[uploaded["versionId"]] = f.ref
        uploaded_versions.append(uploaded["versionId"])
    version = f"canary-{suffix}"
    release = mesh.cli(
        "release", "create", "--namespace", CANARY_NS, "--version", version, "--branch", branch["branchId"]
    )
    assert release["version"] == version and release["fileCount"] >= len(corpus.by_role("public")), release
    name = f"canary-env-{suffix}"
    deployed = mesh.cli("env", "deploy", "--namespace", CANARY_NS, "--name", name, "--release-id", release["releaseId"])
    assert deployed["releaseId"] == release["releaseId"], deployed
    return {
        "branch_id": branch["branchId"],
        "release_id": release["releaseId"],
        "release_version": version,
        "environment_id": deployed["environmentId"],
        "environment_name": name,
        "uploaded": ",".join(uploaded_versions),
    }


def link_sources(corpus: Corpus, paths: dict[str, str]) -> set[str]:
    """Paths of the nodes whose version is the ingested one (its links are the ones the corpus
    wrote); a version uploaded to the preview branch may carry no link data of its own."""
    ingested = {f.version_id for f in corpus.files}
    return {path for version_id, path in paths.items() if version_id in ingested}


def link_ends(paths: dict[str, str], link: dict[str, Any]) -> tuple[str | None, str | None]:
    """(source path, target path) of an edge or link; None for an end that is not a node."""
    return paths.get(link["source_file_version_id"]), paths.get(link.get("target_file_version_id", ""))


async def harvest_graph(mesh: Mesh, corpus: Corpus, book: KeyBook, versions: dict[str, str]) -> int:
    """As admin: every lookup target resolves and shows every canary file, with the links the
    corpus wrote (each file to the public files, one broken, one external)."""
    calls = 0
    public = {f.path for f in corpus.by_role("public")}
    files = {f.path: f for f in corpus.files if f.namespace == CANARY_NS}
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as admin:
        for kind in LOOKUP_TARGET_KINDS:
            arguments: dict[str, Any] = {"project_reference": CANARY_NS, "pagination": {"limit": 200}}
            target = lookup_target(kind, versions)
            if target is not None:
                arguments["lookup_target"] = target
            graph = await call_ok(admin, "get_knowledge_graph", arguments)
            calls += 1
            paths = {n["file_version_id"]: n["path"] for n in graph["nodes"]}
            assert set(paths.values()) == set(files), f"admin graph of {kind}: {sorted(paths.values())}"
            for version_id, path in paths.items():
                book.files_by_id.setdefault(version_id, files[path])
                book.owner.setdefault(version_id, files[path].ref)
            if kind not in ("main", "preview_branch:main"):
                uploaded = set(versions["uploaded"].split(","))
                assert uploaded <= set(paths), f"the {kind} graph does not show the branch versions {uploaded}"
            sources = link_sources(corpus, paths)
            edges = {edge for e in graph["edges"] if (edge := link_ends(paths, e))[0] in sources}
            wanted = {(f, t) for f in sources for t in public if t != f}
            assert edges == wanted, f"admin graph of {kind}: edges {sorted(edges ^ wanted, key=str)} differ"
            broken = sorted(p for b in graph["broken_links"] if (p := link_ends(paths, b)[0]) in sources)
            assert broken == sorted(sources), graph["broken_links"]
    return calls


async def admin_cypher_rows(mesh: Mesh, corpus: Corpus) -> dict[str, int]:
    """Rows the admin gets from each kg_cypher template; those that must list every readable
    file list every enabled file for the admin."""
    rows: dict[str, int] = {}
    enabled = {f.path for f in corpus.files if f.namespace == CANARY_NS}  # before the rules
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as admin:
        for name, statement, column, exact in CYPHER_TEMPLATES:
            result = await call_ok(admin, "kg_cypher", {"namespace": CANARY_NS, "statement": statement})
            rows[name] = result["rowCount"]
            assert rows[name] > 0, f"admin kg_cypher {name} returns no rows: the probe would prove nothing"
            if exact:
                at = result["columns"].index(column)
                found = {row[at] for row in result["rows"]}
                assert found == enabled, f"admin kg_cypher {name}: {sorted(found ^ enabled)} differ"
    return rows


@pytest.fixture(scope="module")
async def world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    """An independent `kgmesh up` for this module, so other tests' data cannot interfere."""
    running = Mesh(work_dir=tmp_path_factory.mktemp("kgmesh-canary"), binary=kgmesh_bin())
    try:
        built = await build_world(running, tmp_path_factory)
    except (MeshError, AssertionError) as err:
        problems = running.stop()
        stopping = "\nwhile stopping it:\n- " + "\n- ".join(problems) if problems else ""
        pytest.fail(f"canary mesh setup failed: {err}{stopping}\n{running.log_tail()}", pytrace=False)
    except BaseException:
        running.stop()
        raise
    try:
        yield built
    finally:
        problems = running.stop()
    if problems:
        pytest.fail("the canary mesh did not shut down cleanly:\n- " + "\n- ".join(problems), pytrace=False)


# ---------------------------------------------------------------------------------------------
# The fuzzer
# ---------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    kind: str  # "ok", "error" (a tool error) or "rpc" (a JSON-RPC error)
    code: str
    data: dict[str, Any]
    raw: str

    @property
    def signature(self) -> tuple[str, str]:
        return (self.kind, self.code)


@dataclass
class PrincipalRun:
    """One restricted principal: what it may read and the strings it must never receive."""

    spec: PrincipalSpec
    world: World
    rng: random.Random
    share: tuple[int, int]  # this principal's part of the values shared out (see ArgGenerator)
    readable: list[CorpusFile] = field(init=False)
    readable_refs: set[str] = field(init=False)
    namespaces: set[str] = field(init=False)
    forbidden_keys: list[str] = field(init=False)
    needles: Needles = field(init=False)
    pools: Pools = field(init=False)
    returned: set[tuple[str, str]] = field(default_factory=set)  # (namespace, chunkKey) of packages
    productive: int = 0  # successful calls that returned packages
    # (tool, property, key kind) -> the made-up control call and its answer.
    controls: dict[tuple[str, str, str], tuple[dict[str, Any], tuple[str, str]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        model, book, corpus = self.world.model, self.world.book, self.world.corpus
        label = self.spec.label
        self.readable = model.readable(label)
        self.readable_refs = {f.ref for f in self.readable}
        self.namespaces = model.namespaces(label)
        forbidden_files = model.forbidden(label)
        self.forbidden_keys, allowed_keys = book.split(self.readable_refs)
        key_origins = [(k, ", ".join(sorted(book.files_of(k)))) for k in self.forbidden_keys]
        self.needles = Needles(forbidden_files, key_origins)
        texts: list[str] = [*ORDINARY_QUERIES, *WILDCARDS]
        for f in forbidden_files:
            texts += [f.bait, f.entities[0], f"{f.entities[0]} acquired {f.entities[1]}", f.canaries[1]]
            texts += [f.path.rsplit("/", 1)[-1], f.title]
        texts += [f.bait for f in self.readable]
        paths = [f.path for f in corpus.files] + ["public/", "team/", corpus.secret_folder, "vault/", ""]
        # Chat references, also across namespaces (`@kg:vault/...` while namespace is canary).
        paths += [f"{KG_REFERENCE}{f.namespace}/{f.path}" for f in corpus.files]
        self.pools = Pools(
            home=CANARY_NS,
            namespaces=(CANARY_NS, VAULT_NS, self.world.ghost),
            forbidden_keys=self.forbidden_keys,
            allowed_keys=allowed_keys,
            cursors=sorted(book.cursors) + list(GARBAGE_CURSORS),
            texts=texts,
            paths=paths,
            file_ids=frozenset(f.file_id for f in corpus.files),
        )

    def oracle_keys(self) -> list[str]:
        """A few forbidden keys of each kind from each forbidden file (or set of files)."""
        book = self.world.book
        picked: dict[tuple[str, str], list[str]] = defaultdict(list)
        for key in self.forbidden_keys:
            slot = (",".join(sorted(book.files_of(key))), key_kind(key))
            if len(picked[slot]) < ORACLE_KEYS_PER_KIND:
                picked[slot].append(key)
        return [key for keys in picked.values() for key in keys]

    def readable_chunks(self, namespaces: set[str]) -> int:
        return sum(f.chunk_count for f in self.readable if f.namespace in namespaces)


class Fuzzer:
    """Calls tools as restricted principals and records every rule a response breaks."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.tally = Tally()
        self.violations: list[Violation] = []
        # Calls made on purpose (caller_selector forms, lookup targets, cypher templates), per tool.
        self.deliberate: Counter[str] = Counter()

    def flag(self, run: PrincipalRun, tool: str, arguments: dict[str, Any], kind: str, detail: str) -> None:
        self.violations.append(Violation(kind, run.spec.label, tool, arguments, detail))

    async def call(self, client: Client, run: PrincipalRun, gen: ArgGenerator, arguments: dict[str, Any]) -> Outcome:
        """One call, and every check that applies to its response."""
        started = time.monotonic()
        try:
            result = await client.call_tool(gen.tool, arguments)
        except MCPError as err:
            outcome = Outcome("rpc", str(err.code), {}, f"{err.code} {err} {getattr(err, 'data', '')}")
        else:
            raw = result.model_dump_json(by_alias=True)
            texts = [block.text for block in result.content if getattr(block, "type", None) == "text"]
            try:
                data = json.loads(texts[0]) if texts else {}
            except json.JSONDecodeError:
                data = {}
            code = str(data.get("code", "?")) if result.is_error else ""
            outcome = Outcome("error" if result.is_error else "ok", code, data, raw)
        seconds = time.monotonic() - started
        self.tally.add(run.spec.label, gen.tool, outcome.code or outcome.kind, seconds)
        self.check(run, gen, arguments, outcome)
        return outcome

    def scan(self, run: PrincipalRun, tool: str, arguments: dict[str, Any], outcome: Outcome) -> None:
        """No canary, forbidden key or forbidden path anywhere in the response."""
        hits = run.needles.find(outcome.raw, arguments)
        if hits:
            found, origin, context = hits[0]
            others = sorted({hit[0] for hit in hits[1:]})
            detail = f"the response ({outcome.kind} {outcome.code}) contains {found!r} from {origin}: …{context}…"
            if others:
                detail += f"\n  and {len(others)} more forbidden strings: {others[:12]}"
            self.flag(run, tool, arguments, "leak", detail)

    async def surface(self, run: PrincipalRun, method: str, arguments: dict[str, Any], request: Any) -> Any:
        """A request other than tools/call (listings, resources, prompts): scanned the same way."""
        started = time.monotonic()
        try:
            result = await request
        except MCPError as err:
            outcome, result = Outcome("rpc", str(err.code), {}, f"{err.code} {err} {getattr(err, 'data', '')}"), None
        else:
            outcome = Outcome("ok", "", {}, result.model_dump_json(by_alias=True))
        self.tally.add(run.spec.label, method, outcome.code or outcome.kind, time.monotonic() - started)
        self.scan(run, method, arguments, outcome)
        return result

    async def surfaces(self, client: Client, run: PrincipalRun) -> list[Any]:
        """Every listing the server offers to this principal, and every resource and prompt: none
        may name forbidden content. Returns the tools."""
        tools: list[Any] = []
        cursor: str | None = None
        for _ in range(20):
            page = await self.surface(run, "tools/list", {}, client.list_tools(cursor=cursor))
            if page is None:
                break
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                break
        instructions = Outcome("ok", "", {}, json.dumps(client.instructions or ""))
        self.scan(run, "initialize", {}, instructions)
        capabilities = client.server_capabilities
        if capabilities.resources is not None:
            listed = await self.surface(run, "resources/list", {}, client.list_resources())
            for resource in (listed.resources if listed else [])[:20]:
                uri = str(resource.uri)
                await self.surface(run, "resources/read", {"uri": uri}, client.read_resource(uri))
            await self.surface(run, "resources/templates/list", {}, client.list_resource_templates())
        if capabilities.prompts is not None:
            prompts = await self.surface(run, "prompts/list", {}, client.list_prompts())
            for prompt in (prompts.prompts if prompts else [])[:20]:
                arguments = {a.name: run.rng.choice(run.pools.texts) for a in prompt.arguments or [] if a.required}
                await self.surface(run, "prompts/get", arguments, client.get_prompt(prompt.name, arguments))
        return sorted(tools, key=lambda t: t.name)

    def check(self, run: PrincipalRun, gen: ArgGenerator, arguments: dict[str, Any], outcome: Outcome) -> None:
        tool = gen.tool
        self.scan(run, tool, arguments, outcome)
        if outcome.kind == "rpc":
            if outcome.code != "-32602":
                self.flag(run, tool, arguments, "json-rpc error", outcome.raw[:500])
            return
        if outcome.kind == "error":
            if outcome.code == "internal":
                self.flag(run, tool, arguments, "internal error", outcome.raw[:500])
            return
        unreadable = sorted(namespaces_named(arguments, gen.properties) - run.namespaces)
        if unreadable:
            detail = f"{unreadable} is not readable, yet the call succeeded: {outcome.raw[:400]}"
            self.flag(run, tool, arguments, "unreadable namespace answered", detail)
        described = {f.ref: f for f in known_files_in(outcome.data, self.world.book.files_by_id)}
        for f in described.values():
            if f.ref not in run.readable_refs:
                self.flag(run, tool, arguments, "unreadable file", f"the result describes {f.ref} ({f.role})")
        for package in packages_in(outcome.data):
            owner = self.world.book.files_by_id.get(str(package.get("fileId")))
            if package.get("namespace") not in run.namespaces or owner is None or owner.ref not in run.readable_refs:
                where = f"{package.get('namespace')}/{package.get('path')} ({package.get('chunkKey')})"
                self.flag(run, tool, arguments, "unreadable package", f"package {where}")
                continue
            run.returned.add((package["namespace"], package["chunkKey"]))
            run.productive += 1
            self.check_counts(run, tool, arguments, package)
        if described.keys() & run.readable_refs:
            run.productive += 1
        self.check_totals(run, gen, arguments, outcome.data)

    # -- get_knowledge_graph and kg_cypher on purpose ------------------------------------------

    def expect_denied(self, run: PrincipalRun, tool: str, arguments: dict[str, Any], outcome: Outcome) -> bool:
        """For a principal that may not read `canary`: the call must be permission_denied.
        Returns whether the principal may read the namespace (and the result is worth checking)."""
        if CANARY_NS in run.namespaces:
            return True
        if outcome.signature != ("error", "permission_denied"):
            detail = f"expected permission_denied, got {outcome.signature}: {outcome.raw[:300]}"
            self.flag(run, tool, arguments, "unreadable namespace", detail)
        return False

    def check_graph(
        self, run: PrincipalRun, arguments: dict[str, Any], outcome: Outcome, scope: set[str], whole: bool
    ) -> dict[str, str]:
        """A graph answer names readable files only; with `whole` (one page, no root) it shows
        exactly `scope`, each file's links to the public files in scope, its broken link and its
        external link. Returns version id -> path of its nodes."""
        tool = "get_knowledge_graph"
        if not self.expect_denied(run, tool, arguments, outcome):
            return {}
        if outcome.kind != "ok":
            self.flag(run, tool, arguments, "graph refused", f"{outcome.signature}: {outcome.raw[:400]}")
            return {}
        data = outcome.data
        paths = {n["file_version_id"]: n["path"] for n in data.get("nodes", [])}
        readable = {f.path for f in run.readable if f.namespace == CANARY_NS}
        if set(paths.values()) - readable:
            self.flag(run, tool, arguments, "unreadable file", f"nodes {sorted(set(paths.values()) - readable)}")
        for kind, links in (("edges", "target_file_version_id"), ("broken_links", None), ("external_links", None)):
            for link in data.get(kind, []):
                ends = [link["source_file_version_id"]] + ([link[links]] if links else [])
                if whole and any(end not in paths for end in ends):
                    self.flag(run, tool, arguments, "graph link", f"{kind} entry {link} leaves the visible nodes")
        if not whole:
            return paths
        if set(paths.values()) != scope or data.get("total_nodes") != len(scope):
            detail = f"nodes {sorted(paths.values())} (total {data.get('total_nodes')}), expected {sorted(scope)}"
            self.flag(run, tool, arguments, "graph scope", detail)
            return paths
        public = {f.path for f in self.world.corpus.by_role("public")}
        sources = link_sources(self.world.corpus, paths)
        edges = {edge for e in data["edges"] if (edge := link_ends(paths, e))[0] in sources}
        wanted = {(a, b) for a in sources for b in public & scope if a != b}
        broken = sorted(p for b in data["broken_links"] if (p := link_ends(paths, b)[0]) in sources)
        external = sorted(p for b in data["external_links"] if (p := link_ends(paths, b)[0]) in sources)
        if edges != wanted or broken != sorted(sources) or external != sorted(sources):
            differ = sorted(edges ^ wanted, key=str)
            detail = f"edges differ by {differ}; broken from {broken}; external from {external}"
            self.flag(run, tool, arguments, "graph links", detail)
        if paths:
            run.productive += 1
        return paths

    async def knowledge_graph(self, client: Client, run: PrincipalRun, gen: ArgGenerator) -> None:
        """get_knowledge_graph with each caller_selector form on main, each lookup_target kind,
        selectors and targets mixed, paged to the end, rooted at readable and forbidden files."""
        world = self.world
        readable = {f.path for f in run.readable if f.namespace == CANARY_NS}
        selectors = [value for _, value in caller_selectors(world.corpus)]
        combos: list[tuple[str, Any]] = [("main", value) for value in selectors]
        combos += [(kind, True) for kind in LOOKUP_TARGET_KINDS[1:]]
        combos += [(kind, selectors[(3 * i + 2) % len(selectors)]) for i, kind in enumerate(LOOKUP_TARGET_KINDS[1:])]
        if CANARY_NS not in run.namespaces:
            combos = combos[: len(selectors)]  # every call is a permission_denied: a few suffice

        def arguments_for(kind: str, selector: Any, **more: Any) -> dict[str, Any]:
            arguments: dict[str, Any] = {"project_reference": CANARY_NS, "caller_selector": selector, **more}
            target = lookup_target(kind, world.versions)
            if target is not None:
                arguments["lookup_target"] = target
            return arguments

        async def call(arguments: dict[str, Any]) -> Outcome:
            self.deliberate[gen.tool] += 1
            return await self.call(client, run, gen, arguments)

        for kind, selector in combos:
            arguments = arguments_for(kind, selector, pagination={"limit": 200})
            scope = {p for p in readable if selected(selector, p)}
            self.check_graph(run, arguments, await call(arguments), scope, whole=True)
        if CANARY_NS not in run.namespaces:
            return
        # Paging to the end: every node once, the same total on every page.
        for kind in ("main", "release_version", "environment_name"):
            seen: list[str] = []
            cursor: str | None = None
            for _ in range(40):
                pagination: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
                arguments = arguments_for(kind, True, pagination=pagination)
                outcome = await call(arguments)
                seen += self.check_graph(run, arguments, outcome, set(), whole=False).values()
                if outcome.kind != "ok":
                    break
                if outcome.data.get("total_nodes") != len(readable):
                    detail = f"total_nodes {outcome.data.get('total_nodes')}, {len(readable)} readable files"
                    self.flag(run, gen.tool, arguments, "graph scope", detail)
                cursor = outcome.data["page_info"]["next"]
                if cursor is None:
                    break
            if sorted(seen) != sorted(readable):
                detail = f"pages showed {seen}, not {sorted(readable)}"
                self.flag(run, gen.tool, {"lookup": kind}, "graph paging", detail)
        # Rooted at a readable file: depth 0 is the root, depth 1 adds the public files it links to.
        public = {f.path for f in world.corpus.by_role("public")} & readable
        root = next((f for f in run.readable if f.namespace == CANARY_NS and f.role != "public"), None)
        for depth, kind in ((0, "main"), (1, "release_id"), (2, "preview_branch"), (3, "environment_id")):
            if root is None:
                break
            arguments = arguments_for(kind, True, root_path=root.path, max_depth=depth)
            paths = set(self.check_graph(run, arguments, await call(arguments), set(), whole=False).values())
            wanted = {root.path} | (public if depth else set())
            if paths != wanted:
                detail = f"rooted nodes {sorted(paths)}, expected {sorted(wanted)}"
                self.flag(run, gen.tool, arguments, "graph scope", detail)
        # Rooted at a forbidden file, by path and by version id: not found, like a missing file.
        for f in [f for f in run.world.model.forbidden(run.spec.label) if f.namespace == CANARY_NS][:3]:
            for root_argument in ({"root_path": f.path}, {"root_file_version_id": f.version_id}):
                arguments = arguments_for("main", True, **root_argument)
                outcome = await call(arguments)
                if outcome.signature != ("error", "not_found"):
                    detail = f"a forbidden root answers {outcome.signature}: {outcome.raw[:300]}"
                    self.flag(run, gen.tool, arguments, "forbidden key answered", detail)

    async def cypher(self, client: Client, run: PrincipalRun, gen: ArgGenerator) -> None:
        """kg_cypher statements that return rows for a reader: their file paths are exactly the
        readable files (or some of them), and paging by id reaches every readable chunk once."""
        readable = {f.path for f in run.readable if f.namespace == CANARY_NS}

        async def call(arguments: dict[str, Any]) -> Outcome:
            self.deliberate[gen.tool] += 1
            return await self.call(client, run, gen, arguments)

        for name, statement, column, exact in CYPHER_TEMPLATES:
            arguments = {"namespace": CANARY_NS, "statement": statement}
            outcome = await call(arguments)
            if not self.expect_denied(run, gen.tool, arguments, outcome):
                continue
            if outcome.kind != "ok":
                self.flag(run, gen.tool, arguments, "cypher refused", f"{name}: {outcome.raw[:400]}")
                continue
            at = outcome.data["columns"].index(column)
            paths = {row[at] for row in outcome.data["rows"]}
            if paths - readable:
                self.flag(run, gen.tool, arguments, "unreadable file", f"{name} rows name {sorted(paths - readable)}")
            elif exact and paths != readable:
                detail = f"{name}: {sorted(paths)}, expected {sorted(readable)}"
                self.flag(run, gen.tool, arguments, "cypher scope", detail)
            if paths:
                run.productive += 1
        if CANARY_NS not in run.namespaces:
            return
        keys: list[str] = []
        paths: set[str] = set()
        after = -1
        for _ in range(60):
            arguments = {"namespace": CANARY_NS, "statement": CYPHER_PAGED, "params": {"afterId": after}}
            outcome = await call(arguments)
            if outcome.kind != "ok":
                self.flag(run, gen.tool, arguments, "cypher refused", outcome.raw[:400])
                return
            rows = outcome.data["rows"]
            keys += [row[2] for row in rows]
            paths |= {row[1] for row in rows}
            if len(rows) < 7:
                break
            after = rows[-1][0]
        chunks = run.readable_chunks({CANARY_NS})
        if len(keys) != len(set(keys)) or len(keys) != chunks or paths != readable:
            detail = f"{len(keys)} rows ({len(set(keys))} keys) over {sorted(paths)}; {chunks} readable chunks"
            self.flag(run, gen.tool, {"statement": CYPHER_PAGED}, "cypher paging", detail)

    def check_counts(self, run: PrincipalRun, tool: str, arguments: dict[str, Any], package: dict[str, Any]) -> None:
        """A package's list counts cover at least what it lists; similar files only readable ones."""
        for name, count in (package.get("counts") or {}).items():
            listed = package.get(name)
            total = count.get("total") if isinstance(count, dict) else None
            if not isinstance(total, int) or (isinstance(listed, list) and total < len(listed)):
                self.flag(run, tool, arguments, "total", f"counts.{name} = {count} but the package lists {listed}")
            elif name == "similarFiles" and total > len(run.readable) - 1:
                detail = f"counts.similarFiles.total {total}; only {len(run.readable) - 1} other files are readable"
                self.flag(run, tool, arguments, "total", detail)

    def check_totals(
        self, run: PrincipalRun, gen: ArgGenerator, arguments: dict[str, Any], data: dict[str, Any]
    ) -> None:
        """Totals are computed over what the principal may read: equal to the admin's count when
        the whole file is readable, never above the readable chunks for a search."""
        tool, book = gen.tool, self.world.book
        total = data.get("total")
        keys = {name: str(arguments[name]) for name in gen.key_props() if name in arguments}
        namespace = str(arguments.get("namespace"))
        if tool == "kg_open" and len(keys) == 1:
            ((name, key),) = keys.items()
            files = book.files_of(key)
            if files and not files & run.readable_refs:
                # A key used as what it is (a chunk key as chunkKey) names one forbidden thing:
                # any success says it exists. Used as something else, only a count would leak.
                as_itself = key in book.owner and wanted_kind(name) == key_kind(key)
                if as_itself or (isinstance(total, int) and total > 0):
                    self.flag(run, tool, arguments, "forbidden key answered", f"succeeded with total {total}")
            expected = book.open_totals.get((namespace, name, key))
            if expected is not None and files <= run.readable_refs and total != expected:
                self.flag(run, tool, arguments, "total", f"total {total}, the admin counted {expected} for {key}")
        elif tool == "kg_outline":
            owner = book.files_by_id.get(str(arguments.get("fileId")))
            if owner is not None and owner.ref not in run.readable_refs:
                self.flag(run, tool, arguments, "forbidden key answered", f"outline of {owner.ref} with total {total}")
            elif owner is not None and "maxDepth" not in arguments and total != owner.outline_total:
                self.flag(run, tool, arguments, "total", f"total {total}, the admin counted {owner.outline_total}")
        elif tool == "kg_files":
            # A folder prefix is a folder: the server reads `team` as `team/`.
            prefix = str(arguments.get("folderPrefix") or "").strip().strip("/")
            prefix = f"{prefix}/" if prefix else ""
            listable = [f for f in run.readable if f.namespace == namespace and f.path.startswith(prefix)]
            filtered = any(arguments.get(name) for name in ("name", "pattern", "cursor"))
            if not isinstance(total, int) or total > len(listable) or (not filtered and total != len(listable)):
                detail = f"total {total}; {len(listable)} readable files in {namespace} under {prefix!r}"
                self.flag(run, tool, arguments, "total", detail)
            scanned = data.get("filesScanned")
            if isinstance(scanned, int) and scanned > len(listable):
                detail = f"filesScanned {scanned}; {len(listable)} readable files in {namespace} under {prefix!r}"
                self.flag(run, tool, arguments, "total", detail)
        elif tool == "kg_search":
            searched = set(arguments.get("namespaces") or run.namespaces)
            bound = run.readable_chunks(searched)
            results = data.get("results") or []
            if not isinstance(total, int) or total > bound or len(results) > total:
                detail = f"total {total} with {len(results)} results; {bound} chunks are readable in {sorted(searched)}"
                self.flag(run, tool, arguments, "total", detail)

    async def oracle(
        self, client: Client, run: PrincipalRun, gen: ArgGenerator, name: str, value: str, made_up: str, slot: str
    ) -> None:
        """A forbidden key or path must get the same answer as one that names nothing (`made_up`,
        of the same shape; its answer is asked once per tool, property and `slot`)."""
        probe = gen.with_value(name, value)
        seen = await self.call(client, run, gen, probe)
        where = (gen.tool, name, slot)
        if where not in run.controls:
            control = gen.with_value(name, made_up)
            run.controls[where] = (control, (await self.call(client, run, gen, control)).signature)
        control, unseen = run.controls[where]
        if seen.signature != unseen:
            detail = (
                f"a forbidden {name} gets {seen.signature}, a made-up one of the same shape ({control[name]}) "
                f"gets {unseen}: the difference tells that the forbidden one exists"
            )
            self.flag(run, gen.tool, probe, "existence oracle", detail)

    async def unreadable_namespace(self, client: Client, run: PrincipalRun, gen: ArgGenerator) -> None:
        """Each unreadable namespace, alone and next to a readable one, in arguments that otherwise
        succeed: an explicit permission_denied, the same for a namespace that exists as for one
        that does not."""
        template = self.world.templates.get(gen.tool) or gen.base()
        for name, schema in gen.properties.items():
            if prop_role(name, schema) != "namespace":
                continue
            is_list = schema.get("type") == "array"
            answers: dict[str, tuple[str, str]] = {}
            for namespace in (VAULT_NS, self.world.ghost, *(() if run.namespaces else (CANARY_NS,))):
                variants: list[Any] = [[namespace], [CANARY_NS, namespace]] if is_list else [namespace]
                for value in variants:
                    arguments = {**template, name: value}
                    outcome = await self.call(client, run, gen, arguments)
                    if outcome.signature != ("error", "permission_denied"):
                        detail = f"expected permission_denied, got {outcome.signature}: {outcome.raw[:300]}"
                        self.flag(run, gen.tool, arguments, "unreadable namespace", detail)
                    answers.setdefault(namespace, outcome.signature)
            if len(set(answers.values())) > 1:
                self.flag(run, gen.tool, template, "existence oracle", f"namespaces answer differently: {answers}")

    async def fuzz(self, run: PrincipalRun) -> None:
        async with mcp_http(self.world.mesh.mcp_url, run.spec.token) as client:
            tools = await self.surfaces(client, run)
            generators = [ArgGenerator(t.name, t.input_schema, run.pools, run.rng, run.share) for t in tools]
            plans = {gen.tool: list(gen.systematic()) for gen in generators}
            # Random sets fill what the systematic ones leave of the budget, so the suite keeps
            # its running time as tools are added (never fewer than MIN_RANDOM per tool).
            spare = CALLS_PER_PRINCIPAL - sum(len(plan) for plan in plans.values())
            per_tool = max(MIN_RANDOM, min(RANDOM_CALLS_PER_TOOL, spare // max(1, len(generators))))
            for gen in generators:
                randoms = min(per_tool, 4 * len(gen.properties))
                for arguments in [*plans[gen.tool], *gen.random(randoms)]:
                    await self.call(client, run, gen, arguments)
                await self.unreadable_namespace(client, run, gen)
            by_tool = {gen.tool: gen for gen in generators}
            if "get_knowledge_graph" in by_tool:
                await self.knowledge_graph(client, run, by_tool["get_knowledge_graph"])
            if "kg_cypher" in by_tool:
                await self.cypher(client, run, by_tool["kg_cypher"])
            # Forbidden keys of every file, in a property that asks for their kind, against a control.
            slots = [(gen, name) for gen in generators for name in gen.key_props()]
            for index, key in enumerate(run.oracle_keys() if slots else []):
                fitting = [(g, n) for g, n in slots if wanted_kind(n) in (None, key_kind(key))] or slots
                gen, name = fitting[index % len(fitting)]
                await self.oracle(client, run, gen, name, key, fabricate_like(key, run.rng), key_kind(key))
            # Forbidden files by path, against a made-up file in the same folder.
            path_slots = [(g, n) for g in generators for n, p in g.properties.items() if prop_role(n, p) == "path"]
            forbidden = [f for f in self.world.model.forbidden(run.spec.label) if f.namespace == CANARY_NS]
            for index, f in enumerate(forbidden if path_slots else []):
                gen, name = path_slots[index % len(path_slots)]
                folder = f.path.rsplit("/", 1)[0]
                made_up = f"{folder}/missing-{run.rng.getrandbits(32):08x}.md"
                await self.oracle(client, run, gen, name, f.path, made_up, folder)
            # Every package this principal was shown must open for it.
            opener = next((g for g in generators if g.tool == "kg_open"), None)
            for namespace, chunk_key in sorted(run.returned) if opener else []:
                arguments = {"namespace": namespace, "chunkKey": chunk_key}
                outcome = await self.call(client, run, opener, arguments)
                if outcome.kind != "ok" or outcome.data.get("total") != 1:
                    detail = f"a package this principal received does not open: {outcome.raw[:400]}"
                    self.flag(run, "kg_open", arguments, "shown but not openable", detail)


async def test_no_tool_leaks_forbidden_content(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    fuzzer = Fuzzer(world)
    principals = world.restricted
    runs = [
        PrincipalRun(p, world, random.Random(f"{SEED}-{p.label}"), (i, len(principals)))
        for i, p in enumerate(principals)
    ]
    started = time.monotonic()
    limiter = anyio.CapacityLimiter(PARALLEL_PRINCIPALS)

    async def one(run: PrincipalRun) -> None:
        async with limiter:
            await fuzzer.fuzz(run)

    async with anyio.create_task_group() as group:
        for run in runs:
            group.start_soon(one, run)
    elapsed = time.monotonic() - started

    kinds = Counter(violation.kind for violation in fuzzer.violations)
    summary = fuzzer.tally.summary(elapsed) + (
        f"\n  seed: {SEED} (KGMESH_CANARY_SEED), keys harvested: {len(world.book.all_keys())}, "
        f"admin calls: {world.admin_calls}, violations: {dict(kinds) or 0}"
        f"\n  deliberate: {dict(sorted(fuzzer.deliberate.items()))}, admin kg_cypher rows: {world.cypher_admin_rows}"
    )
    with capsys.disabled():
        print("\n" + summary)

    server_log = f"\n\n{world.mesh.log_tail(40)}" if {"internal error", "json-rpc error"} & set(kinds) else ""
    assert not fuzzer.violations, (
        f"{len(fuzzer.violations)} violations\n{summary}\n\n{render(fuzzer.violations)}{server_log}"
    )
    assert fuzzer.tally.total >= MIN_CALLS, f"only {fuzzer.tally.total} calls; the suite must make {MIN_CALLS}+"
    # Not vacuous: every principal that may read something was shown some of it while fuzzing.
    for run in runs:
        if run.readable:
            assert run.productive > 0, f"{run.spec.label} may read {len(run.readable)} files but saw none"


def render(violations: list[Violation], per_kind: int = 5) -> str:
    """The first few violations of each kind, so one flood does not hide the others."""
    shown: list[str] = []
    by_kind: dict[str, list[Violation]] = defaultdict(list)
    for violation in violations:
        by_kind[violation.kind].append(violation)
    for kind, found in by_kind.items():
        shown += [v.render() for v in found[:per_kind]]
        if len(found) > per_kind:
            shown.append(f"... and {len(found) - per_kind} more of kind {kind!r}")
    return "\n\n".join(shown)


# ---------------------------------------------------------------------------------------------
# Positive controls: the rules hide what they should and nothing more
# ---------------------------------------------------------------------------------------------


def test_model_gives_every_principal_something_different(world: World) -> None:
    """The scenario is what it claims: each construct narrows access in its own way."""
    model, corpus = world.model, world.corpus
    role_sets = {p.label: sorted({f.role for f in model.readable(p.label)}) for p in model.principals.values()}
    readable = {p.label: {f.ref for f in model.readable(p.label)} for p in model.principals.values()}
    assert role_sets["reader"] == ["group-denied", "public", "team"], role_sets
    assert role_sets["member"] == ["public", "team", "user-denied"], role_sets
    assert role_sets["folder"] == ["group-denied", "public"], role_sets
    user_denied, group_denied = corpus.one("user-denied").ref, corpus.one("group-denied").ref
    assert user_denied not in readable["reader"] and user_denied in readable["member"]
    assert group_denied in readable["reader"] and group_denied not in readable["member"]
    assert readable["agent-narrow"] < readable["reader"] and readable["agent-narrow"] <= readable["folder"]
    assert readable["agent-broad"] == readable["reader"] and model.namespaces("agent-broad") == {CANARY_NS}
    assert readable["agent-of-folder"] == readable["folder"]
    assert readable["nobody"] == set()
    siblings = {
        f.ref: f for f in corpus.files if f.path.startswith(("public-archive/", corpus.secret_folder[:-1] + "-"))
    }
    assert len(siblings) == 2 and set(siblings) <= readable["reader"], sorted(siblings)
    assert not set(siblings) & readable["folder"], "public-archive/ is outside the public/ grant"
    assert corpus.one("hidden").ref in readable["writer"] and corpus.one("hidden").ref not in readable["reader"]
    for role in ("disabled", "denied-file", "denied-folder", "vault"):
        for f in corpus.by_role(role):
            assert all(f.ref not in refs for refs in readable.values()), f"{f.ref} is readable by someone"


async def test_restricted_principals_read_their_allowed_files(world: World) -> None:
    """Each principal finds, opens and outlines every file it may read, with the admin's totals;
    kg_namespaces names exactly the namespaces it may read, with read permission."""
    failures: list[str] = []

    async def check(spec: PrincipalSpec) -> None:
        try:
            await read_allowed_files(world, spec)
        except AssertionError as err:
            failures.append(f"{spec.label}: {err}")

    async with anyio.create_task_group() as group:
        for spec in world.restricted:
            group.start_soon(check, spec)
    assert not failures, "\n\n".join(failures)


async def read_allowed_files(world: World, spec: PrincipalSpec) -> None:
    async with mcp_http(world.mesh.mcp_url, spec.token) as client:
        listed = await call_ok(client, "kg_namespaces", {})
        names = {entry["name"] for entry in listed["namespaces"]}
        assert names == world.model.namespaces(spec.label), f"kg_namespaces lists {sorted(names)}"
        assert all(entry["permission"] == "read" for entry in listed["namespaces"]), listed
        for f in world.model.readable(spec.label):
            found = await call_ok(client, "kg_search", {"query": f.bait, "namespaces": [f.namespace]})
            assert any(hit["fileId"] == f.file_id for hit in found["results"]), (
                f"searched for {f.bait!r} and did not find {f.ref}: {[hit['path'] for hit in found['results']]}"
            )
            opened = await call_ok(client, "kg_open", {"namespace": f.namespace, "fileId": f.file_id, "limit": 1})
            assert opened["total"] == f.chunk_count, f"kg_open {f.ref}: total {opened['total']}, {f.chunk_count} chunks"
            assert opened["truncated"] == (f.chunk_count > 1), opened
            outline = await call_ok(client, "kg_outline", {"namespace": f.namespace, "fileId": f.file_id})
            assert outline["total"] == f.outline_total, f"kg_outline {f.ref}: total {outline['total']}"
            assert f.canaries[0] in outline["sections"][0]["title"], outline["sections"][0]


async def test_hidden_is_for_readers_and_disabled_is_for_everyone(world: World) -> None:
    """The admin and a writer see the hidden file (the index is fine, the rule is about readers);
    nobody, not even the admin, reads the disabled file."""
    hidden, disabled = world.file_by_role("hidden"), world.file_by_role("disabled")
    writer = world.model.principals["writer"]
    for who, token in (("admin", world.mesh.admin_token), ("writer", writer.token)):
        async with mcp_http(world.mesh.mcp_url, token) as client:
            found = await call_ok(client, "kg_search", {"query": hidden.bait, "namespaces": [CANARY_NS]})
            assert any(hit["fileId"] == hidden.file_id for hit in found["results"]), (
                f"{who} does not find the hidden file {hidden.ref}"
            )
            opened = await call_ok(client, "kg_open", {"namespace": CANARY_NS, "fileId": hidden.file_id})
            assert opened["total"] == hidden.chunk_count, f"{who}: {opened['total']}"
            assert hidden.canaries[1] in json.dumps(opened), f"{who} opened the hidden file without its text"

            found = await call_ok(client, "kg_search", {"query": disabled.bait, "namespaces": [CANARY_NS]})
            assert all(hit["fileId"] != disabled.file_id for hit in found["results"]), f"{who} finds {disabled.ref}"
            arguments = {"namespace": CANARY_NS, "fileId": disabled.file_id}
            refused = await call_tool(client, "kg_open", arguments)
            assert refused.is_error, f"{who} opened the disabled file {disabled.ref}"
            needles = Needles([disabled], [])
            for raw, sent in ((refused.raw, arguments), (json.dumps(found), {"query": disabled.bait})):
                leaked = needles.find(raw, sent)
                assert not leaked, f"{who} received text of the disabled file: {leaked}"

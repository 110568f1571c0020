"""The canary leak suite's machinery: a corpus whose forbidden files carry unique canary strings,
the access rules and a model of what each principal may read, the keys of every file harvested
as an admin, argument generation from each tool's inputSchema, and the checks every response
must pass.

Every file gets its own canaries (CANARY-<hex> tokens in its headings and body, a canary in its
path, made-up entity names, relation sentences and a made-up "bait" word), so a byte of any file
that reaches a principal who must not read it is attributable to that file.
"""

from __future__ import annotations

import json
import posixpath
import random
import re
import urllib.request
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import referencing.exceptions

CANARY_NS = "canary"
VAULT_NS = "vault"

# Words every file shares, so ordinary queries rank allowed and forbidden chunks together.
ORDINARY_QUERIES = (
    "harbor schedule",
    "quarterly budget",
    "warehouse inventory",
    "audit",
    "plans",
    "ledger",
    "the",
)
# Globs and regular expressions that match everything, or every canary, wherever a tool takes a
# pattern (file name globs, content regexes) or free text.
WILDCARDS = ("*", "**", "**/*.md", "**/*canary*", ".*", "(?i)canary", "CANARY-[0-9a-f]+", "%")
# Strings no key has: malformed, injection-shaped, wildcard-shaped.
GARBAGE_KEYS = (
    "ch_00000000000000000000",
    "ol_00000000000000000000",
    "not-a-key",
    "x' OR '1'='1",
    "`) RETURN c //",
    "*",
    "ch_%",
    "../secret",
    "00000000-0000-0000-0000-000000000000",
)
GARBAGE_CURSORS = ("", "bzA", "garbage", "eyJvZmZzZXQiOjB9", "////", "bzk5OTk5OTk5OQ")

_SYLLABLES = (
    "zor", "bu", "lon", "vex", "quib", "ble", "fin", "mar", "tok", "yel", "dra", "pex", "oth", "gri",
    "vain", "sul", "tiq", "nom", "bax", "kel", "urn", "fiz", "wob", "plen", "drax", "mol", "quor",
    "zan", "thip", "gor", "lix", "brum", "skel", "vorn", "tup", "jex",
)  # fmt: skip

# Text every file or response contains anyway; made-up words must not occur in it.
_FIXED_TEXT = " ".join(
    (
        "acquired after the review; the harbor schedule lists it under ordinary notes about the quarterly budget",
        "follow operations supplies with parts, see mentions warehouse inventory audit is owned by more charter",
        "overview roadmap groupdeny hidden handbook notes disabled salaries userdeny plans ledger treasury mirror",
        "public team people secret deep vault canary namespace chunkkey fileid path text contextheader citation",
        "position outline mentions relneighbors dates similarfiles counts packages results total truncated trace",
        "sections outlinekey parentkey nextcursor permission_denied invalid_argument not_found message retryable",
        "see also the overview roadmap appendix site https example com nodes edges external_links broken_links",
    )
)
# How a chat names a file: `@kg:<namespace>/<path>`.
KG_REFERENCE = "@kg:"
KEY_RE = re.compile(r"^[a-z][a-z0-9]{0,7}_[0-9a-f]{12,64}$")
# An entity key: "ent:" + type id + ":" + the normalised name (lowercase, single spaces).
ENTITY_KEY_RE = re.compile(r"^ent:[a-z0-9_.-]{1,64}:[a-z0-9][a-z0-9 ]{2,120}$")
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# Fields of a package or outline that always refer to the package's own file.
SAME_FILE_FIELDS = frozenset(
    {"chunkKey", "position", "outline", "section", "ancestors", "siblings", "children", "sections"}
    | {"prevChunkKey", "nextChunkKey", "outlineKey", "parentKey", "sectionKey", "fileId", "versionId"}
)


def is_key(value: str) -> bool:
    return bool(KEY_RE.match(value) or UUID_RE.match(value) or ENTITY_KEY_RE.match(value))


def key_kind(value: str) -> str:
    """`ch`, `ol`, `ent`, ... for prefixed keys; `uuid` for file and version ids."""
    if UUID_RE.match(value):
        return "uuid"
    if ENTITY_KEY_RE.match(value):
        return "ent"
    return value.split("_", 1)[0]


def fabricate_like(key: str, rng: random.Random) -> str:
    """A key of the same shape that names nothing: the control for existence oracles."""
    if UUID_RE.match(key):
        made = str(uuid.UUID(int=rng.getrandbits(128)))
        return f"{made[:14]}{key[14]}{made[15:]}"  # the original's version nibble
    if ENTITY_KEY_RE.match(key):
        # Same type, a made-up name of the same word lengths.
        prefix, name = key.rsplit(":", 1)
        letters = "".join(rng.choice("xqjz") for _ in name)
        return f"{prefix}:{''.join(' ' if c == ' ' else letters[i] for i, c in enumerate(name))}"
    prefix, digits = key.split("_", 1)
    return f"{prefix}_{rng.getrandbits(4 * len(digits)):0{len(digits)}x}"


# ---------------------------------------------------------------------------------------------
# The corpus
# ---------------------------------------------------------------------------------------------


@dataclass
class CorpusFile:
    namespace: str
    path: str
    role: str
    text: str
    title: str
    canaries: tuple[str, ...]  # CANARY-<hex> tokens, one or more in every section
    entities: tuple[str, ...]
    bait: str  # a made-up word only this file contains
    path_token: str
    # Filled in from the admin's view after ingest.
    file_id: str = ""
    version_id: str = ""
    chunk_count: int = -1
    outline_total: int = -1

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.path}"

    @property
    def needles(self) -> tuple[str, ...]:
        """Every string of this file whose presence in a response means the file leaked."""
        # Folders with a canary in their name, as prefixes ("secret-canary-…/"), so that a sibling
        # folder whose name merely starts the same way does not match.
        parts = self.path.split("/")[:-1]
        folders = ["/".join(parts[: i + 1]) + "/" for i, part in enumerate(parts) if "canary-" in part]
        found = [*self.canaries, *self.entities, self.bait, self.path_token, *folders, self.path, self.title]
        return tuple(dict.fromkeys(found))


class Words:
    """Made-up words and names, unique within one corpus."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()
        self.words: list[str] = []

    def hex(self, digits: int = 12) -> str:
        while True:
            made = f"{self.rng.getrandbits(4 * digits):0{digits}x}"
            if made not in self.used:
                self.used.add(made)
                return made

    def token(self) -> str:
        return f"CANARY-{self.hex()}"

    def word(self) -> str:
        while True:
            made = "".join(self.rng.choice(_SYLLABLES) for _ in range(3))
            # Needles are matched as substrings: no word may contain another, or fixed text.
            clashes = made in _FIXED_TEXT or any(made in w or w in made for w in self.words)
            if len(made) >= 7 and made not in self.used and not clashes:
                self.used.add(made)
                self.words.append(made)
                return made

    def name(self) -> str:
        return f"{self.word().capitalize()} {self.word().capitalize()}"

    def reserve(self, *names: str) -> None:
        parts = [part.lower() for name in names for part in name.split()]
        self.used.update(parts)
        self.words.extend(parts)


# (role, namespace, folder, stem)
LAYOUT = (
    ("public", CANARY_NS, "public", "overview"),
    ("public", CANARY_NS, "public", "roadmap"),
    ("group-denied", CANARY_NS, "public", "groupdeny"),
    ("hidden", CANARY_NS, "public", "hidden"),
    ("team", CANARY_NS, "team", "handbook"),
    ("team", CANARY_NS, "team/people", "notes"),
    # Siblings whose names start like a granted or a denied folder: prefixes end at a "/".
    ("team", CANARY_NS, "public-archive", "archive"),
    ("team", CANARY_NS, "{secret}-open", "open"),
    ("disabled", CANARY_NS, "team", "disabled"),
    ("denied-file", CANARY_NS, "team", "salaries"),
    ("user-denied", CANARY_NS, "team", "userdeny"),
    ("denied-folder", CANARY_NS, "{secret}", "plans"),
    ("denied-folder", CANARY_NS, "{secret}/deep", "ledger"),
    ("vault", VAULT_NS, "vault", "treasury"),
    ("vault", VAULT_NS, "public", "mirror"),
)


@dataclass
class Corpus:
    files: list[CorpusFile]
    secret_folder: str  # the denied folder, "secret-<canary>/"

    def by_role(self, role: str) -> list[CorpusFile]:
        return [f for f in self.files if f.role == role]

    def one(self, role: str) -> CorpusFile:
        found = self.by_role(role)
        assert len(found) == 1, f"corpus has {len(found)} files of role {role}"
        return found[0]

    def write(self, root: Path) -> dict[str, Path]:
        """Writes each namespace's files under root/<namespace>/; returns the folders."""
        folders: dict[str, Path] = {}
        for f in self.files:
            target = root / f.namespace / f.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(f.text, encoding="utf-8")
            folders[f.namespace] = root / f.namespace
        return folders


def _document(words: Words, title: str, entities: tuple[str, ...], bait: str, tokens: list[str]) -> str:
    e0, e1, e2 = entities
    t = tokens
    return (
        f"# {title} {t[0]}\n\n"
        f"{e0} acquired {e1} after the {bait} review; the harbor schedule lists it under {t[1]}.\n"
        f"Ordinary notes about the quarterly budget and the harbor schedule follow. {t[2]}\n\n"
        f"## {words.word().capitalize()} operations {t[3]}\n\n"
        f"{e1} supplies {e2} with {bait} parts, see {t[4]}. The harbor schedule mentions the\n"
        f"warehouse inventory and the quarterly budget. {t[5]}\n\n"
        f"### {words.word().capitalize()} audit {t[6]}\n\n"
        f"{e2} is owned by {e0}. {t[7]} More about the harbor schedule, the {bait} audit and ordinary\n"
        f"warehouse inventory notes. {t[8]}\n"
    )


def build_corpus(rng: random.Random) -> Corpus:
    words = Words(rng)
    # The first denied file carries the names this suite is known by.
    words.reserve("Zorbulon Vexcorp", "Quibblefin")
    secret = f"secret-canary-{words.hex(8)}"
    files: list[CorpusFile] = []
    for role, namespace, folder, stem in LAYOUT:
        path_token = f"canary-{words.hex(8)}"
        folder_path = folder.format(secret=secret)
        path = f"{folder_path}/{stem}-{path_token}.md"
        if role == "denied-folder" and not any(f.role == role for f in files):
            entities: tuple[str, ...] = ("Zorbulon Vexcorp", "Quibblefin", words.name())
        else:
            entities = (words.name(), words.name(), words.name())
        bait = words.word()
        title = f"{bait.capitalize()} {stem} charter"
        tokens = [words.token() for _ in range(9)]
        text = _document(words, title, entities, bait, tokens)
        full_title = f"{title} {tokens[0]}"
        files.append(CorpusFile(namespace, path, role, text, full_title, tuple(tokens), entities, bait, path_token))
    _add_links(files)
    return Corpus(files, f"{secret}/")


def _add_links(files: list[CorpusFile]) -> None:
    """Markdown links for get_knowledge_graph: every file links to the public files of its
    namespace (so each principal's graph has edges), to a missing file and to a URL that both
    carry its own path token (so a broken-link label or external link of a file is attributable
    to it). Only public files are linked to: a link's text names its target, and a readable file
    naming a forbidden path would be a leak the suite put there itself."""
    for f in files:
        targets = [t for t in files if t.role == "public" and t.namespace == f.namespace and t is not f]
        if not targets:
            targets = [t for t in files if t.namespace == f.namespace and t is not f]
        here = posixpath.dirname(f.path)
        links = [f"[the {t.path.rsplit('/', 1)[-1][:-3]}]({posixpath.relpath(t.path, here)})" for t in targets]
        links.append(f"[the {f.bait} appendix](missing-{f.path_token}.md)")
        links.append(f"[the site](https://example.com/{f.path_token})")
        f.text += f"\nSee also {', '.join(links)}.\n"


# The lookup_target kinds get_knowledge_graph takes (seed 002): main when omitted, a preview
# branch (by id, or main as an explicit null id), a release by id or by version string, the
# release deployed to an environment by id or by name.
LOOKUP_TARGET_KINDS = (
    "main",
    "preview_branch:main",
    "preview_branch",
    "release_id",
    "release_version",
    "environment_id",
    "environment_name",
)


def lookup_target(kind: str, versions: dict[str, str]) -> dict[str, Any] | None:
    """The lookup_target argument of `kind` for the versions the fixture created."""
    return {
        "main": None,
        "preview_branch:main": {"kind": "preview_branch", "branch_id": None},
        "preview_branch": {"kind": "preview_branch", "branch_id": versions.get("branch_id")},
        "release_id": {"kind": "release", "release_id": versions.get("release_id")},
        "release_version": {"kind": "release", "release_version": versions.get("release_version")},
        "environment_id": {"kind": "environment", "environment_id": versions.get("environment_id")},
        "environment_name": {"kind": "environment", "environment_name": versions.get("environment_name")},
    }[kind]


def caller_selectors(corpus: Corpus) -> list[tuple[str, Any]]:
    """(form, value) for the four caller_selector forms of the schema (boolean, string, list of
    strings, object of booleans), each aimed at forbidden files as well as allowed ones."""
    secret = corpus.secret_folder
    denied = corpus.one("denied-file").path
    return [
        ("boolean", True),
        ("boolean", False),
        ("string", "public/"),
        ("string", "**/*.md"),
        ("string", denied),
        ("list", ["public/", secret, "team/people/"]),
        ("list", [secret, denied]),
        ("object", {"**": True, secret: False}),
        ("object", {"team/": True, "team/people/": False, denied: True}),
        ("object", {secret: False}),
    ]


def _selector_rule(rule: str, path: str) -> bool:
    if rule.endswith("/"):
        return path.startswith(rule)
    if "*" in rule:
        # Only the two globs caller_selectors uses.
        return rule == "**" or (rule == "**/*.md" and path.endswith(".md"))
    return path == rule


def selected(selector: Any, path: str) -> bool:
    """Whether `path` is in the scope of one of caller_selectors' values."""
    if isinstance(selector, bool):
        return selector
    if isinstance(selector, str):
        return _selector_rule(selector, path)
    if isinstance(selector, list):
        return any(_selector_rule(rule, path) for rule in selector)
    includes = [rule for rule, on in selector.items() if on]
    excluded = any(_selector_rule(rule, path) for rule, on in selector.items() if not on)
    included = not includes or any(_selector_rule(rule, path) for rule in includes)
    return included and not excluded


# kg_cypher statements that return rows to a reader with access: (name, statement, the column
# holding a file path, whether the paths must be exactly the readable files). The access
# predicate the server adds is all that keeps forbidden files out of them.
CYPHER_TEMPLATES = (
    ("files", "MATCH (f:FileRef) RETURN f.vfsPath AS path, f.title AS title LIMIT 50", "path", True),
    ("chunks", "MATCH (c:Chunk) RETURN DISTINCT c.path AS path LIMIT 50", "path", True),
    (
        "chunk text",
        "MATCH (c:Chunk)-[:PART_OF]->(f:FileRef) WHERE c.chunkIndex = 0 "
        "RETURN f.vfsPath AS path, c.text AS text LIMIT 50",
        "path",
        True,
    ),
    (
        "entities",
        "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity) "
        "RETURN DISTINCT c.path AS path, e.name AS name, e.entityKey AS key LIMIT 50",
        "path",
        True,
    ),
    (
        "relations",
        "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity)-[r:REL]->(e2:Entity) RETURN r.path AS path, e.name AS source, "
        "r.relationTypeId AS relation, e2.name AS target LIMIT 50",
        "path",
        False,
    ),
    (
        "outline",
        "MATCH (o:OutlineNode)-[:COVERS]->(c:Chunk) "
        "RETURN DISTINCT o.path AS path, o.title AS title, o.outlineKey AS key LIMIT 50",
        "path",
        True,
    ),
    (
        "folders",
        "MATCH (d:Folder)-[:HAS_CHILD]->(f:FileRef) RETURN f.vfsPath AS path, d.folderPath AS folder LIMIT 50",
        "path",
        True,
    ),
    (
        "next chunks",
        "MATCH (c:Chunk)-[:NEXT_CHUNK]->(n:Chunk) RETURN n.path AS path, n.text AS text, n.chunkKey AS key LIMIT 50",
        "path",
        False,
    ),
)
# Paged by id, as kg_cypher's refusal of SKIP suggests; every readable chunk once.
CYPHER_PAGED = (
    "MATCH (c:Chunk) WHERE ID(c) > $afterId RETURN ID(c) AS id, c.path AS path, c.chunkKey AS key ORDER BY id LIMIT 7"
)


# ---------------------------------------------------------------------------------------------
# Principals, rules and the model of what each may read
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GrantSpec:
    namespace: str
    prefix: str = ""
    permission: str = "read"


@dataclass
class PrincipalSpec:
    label: str
    kind: str
    grants: tuple[GrantSpec, ...] = ()
    acts_for: str | None = None
    groups: tuple[str, ...] = ()
    restricted: bool = True  # fuzzed by the suite (the writer is only a positive control)
    id: str = ""
    token: str = ""


@dataclass(frozen=True)
class DenySpec:
    namespace: str
    prefix: str = ""
    file_role: str = ""  # deny by the file id of the corpus file with this role
    principal: str | None = None  # label
    group: str | None = None  # label


@dataclass
class AccessModel:
    """What each principal may read, from the rules the suite applied: grants (own and via
    groups), denies (everyone, principal, group) that win over grants, disabled and hidden files,
    and agents reading only what both they and their user may read."""

    corpus: Corpus
    principals: dict[str, PrincipalSpec]
    group_grants: dict[str, tuple[GrantSpec, ...]]
    denies: tuple[DenySpec, ...]
    disabled_roles: frozenset[str]
    hidden_roles: frozenset[str]

    def _denied(self, p: PrincipalSpec, f: CorpusFile) -> bool:
        for deny in self.denies:
            if deny.namespace != f.namespace:
                continue
            if deny.principal is not None and deny.principal != p.label:
                continue
            if deny.group is not None and deny.group not in p.groups:
                continue
            if deny.prefix and f.path.startswith(deny.prefix):
                return True
            if deny.file_role and f.role == deny.file_role:
                return True
        return False

    def _grants(self, p: PrincipalSpec) -> list[GrantSpec]:
        return [*p.grants, *(g for group in p.groups for g in self.group_grants.get(group, ()))]

    def _own(self, p: PrincipalSpec, f: CorpusFile) -> bool:
        if f.role in self.disabled_roles or self._denied(p, f):
            return False
        grants = [g for g in self._grants(p) if g.namespace == f.namespace and f.path.startswith(g.prefix)]
        if not grants:
            return False
        if f.role in self.hidden_roles:
            return any(g.permission in ("write", "admin") for g in grants)
        return True

    def can_read(self, label: str, f: CorpusFile) -> bool:
        p = self.principals[label]
        if not self._own(p, f):
            return False
        return p.acts_for is None or self.can_read(p.acts_for, f)

    def readable(self, label: str) -> list[CorpusFile]:
        return [f for f in self.corpus.files if self.can_read(label, f)]

    def forbidden(self, label: str) -> list[CorpusFile]:
        return [f for f in self.corpus.files if not self.can_read(label, f)]

    def namespaces(self, label: str) -> set[str]:
        """Namespaces the principal holds any grant on (for an agent: that its user holds too)."""
        p = self.principals[label]
        own = {g.namespace for g in self._grants(p)}
        return own if p.acts_for is None else own & self.namespaces(p.acts_for)


# ---------------------------------------------------------------------------------------------
# Keys harvested as an admin
# ---------------------------------------------------------------------------------------------


@dataclass
class KeyBook:
    """Every key seen in the admin's results, and which file it belongs to.

    A key found in a field that always names the package's own file (chunkKey, prev/next,
    outline keys, fileId) is owned by that file. Any other key-shaped string (entity keys and
    whatever later tools return) is recorded as seen in the file the admin was looking at: it is
    forbidden to a principal only if every file it was seen in is forbidden to that principal."""

    files_by_id: dict[str, CorpusFile] = field(default_factory=dict)
    owner: dict[str, str] = field(default_factory=dict)  # key -> file ref
    seen: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    cursors: set[str] = field(default_factory=set)
    # (namespace, property, key) -> total the admin got from kg_open for that key.
    open_totals: dict[tuple[str, str, str], int] = field(default_factory=dict)

    def add_file(self, f: CorpusFile) -> None:
        self.files_by_id[f.file_id] = f
        self.files_by_id[f.version_id] = f
        self.owner[f.file_id] = f.ref
        self.owner[f.version_id] = f.ref

    def harvest(self, result: Any, context: CorpusFile | None) -> None:
        self._visit(result, owner=None, context=context.ref if context else None)

    def _visit(self, node: Any, owner: str | None, context: str | None) -> None:
        if isinstance(node, dict):
            file_id = node.get("fileId")
            if isinstance(file_id, str) and file_id in self.files_by_id:
                owner = self.files_by_id[file_id].ref
            for name, value in node.items():
                if name in SAME_FILE_FIELDS:
                    self._visit(value, owner, context)
                else:
                    # Lists such as mentions or similarFiles may name other files' keys.
                    self._visit(value, None, owner or context)
        elif isinstance(node, list):
            for item in node:
                self._visit(item, owner, context)
        elif isinstance(node, str) and is_key(node):
            if node in self.owner:
                return
            if owner is not None:
                self.owner[node] = owner
                self.seen.pop(node, None)
            elif context is not None:
                self.seen[node].add(context)

    def files_of(self, key: str) -> set[str]:
        if key in self.owner:
            return {self.owner[key]}
        return set(self.seen.get(key, ()))

    def all_keys(self) -> list[str]:
        return sorted(set(self.owner) | set(self.seen))

    def split(self, readable_refs: set[str]) -> tuple[list[str], list[str]]:
        """(forbidden, allowed) keys for a principal who may read `readable_refs`."""
        forbidden, allowed = [], []
        for key in self.all_keys():
            files = self.files_of(key)
            (allowed if files & readable_refs else forbidden).append(key)
        return forbidden, allowed


def admin_files(base_url: str, token: str, namespace: str) -> list[dict[str, Any]]:
    """The admin REST listing of a namespace's files, hidden ones included."""
    found: list[dict[str, Any]] = []
    cursor = ""
    for _ in range(100):
        url = f"{base_url}/api/v1/namespaces/{namespace}/files?includeHidden=true&limit=200"
        if cursor:
            url += f"&cursor={cursor}"
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            page = json.loads(response.read())
        found.extend(page["files"])
        cursor = page.get("nextCursor") or ""
        if not cursor:
            return found
    raise AssertionError(f"the files listing of {namespace} did not end after 100 pages")


# ---------------------------------------------------------------------------------------------
# Arguments generated from an inputSchema
# ---------------------------------------------------------------------------------------------


def camel_words(name: str) -> list[str]:
    return [w.lower() for w in re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", name)]


def prop_role(name: str, schema: dict[str, Any]) -> str:
    """What a property means, from its name (and a uuid format): namespace, key, cursor, path
    or text."""
    words = camel_words(name)
    lowered = name.lower()
    if "namespace" in lowered:
        return "namespace"
    if "cursor" in lowered:
        return "cursor"
    if {"key", "keys", "id", "ids"} & set(words) or schema.get("format") == "uuid":
        return "key"
    if {"path", "paths", "prefix", "folder"} & set(words):
        return "path"
    return "text"


def wanted_kind(name: str) -> str | None:
    """The key kind a key-like property asks for: ch, ol, ent, uuid (files) or any (None)."""
    words = set(camel_words(name))
    if "chunk" in words:
        return "ch"
    if words & {"outline", "section"}:
        return "ol"
    if "entity" in words:
        return "ent"
    if words & {"file", "version"}:
        return "uuid"
    return None


@dataclass
class Pools:
    """The values one principal's arguments are drawn from."""

    home: str  # the namespace base arguments use
    namespaces: tuple[str, ...]  # readable, unreadable and non-existent
    forbidden_keys: list[str]
    allowed_keys: list[str]
    cursors: list[str]
    texts: list[str]
    paths: list[str]
    file_ids: frozenset[str] = frozenset()  # uuid keys that are file ids (not version ids)

    def keys_of(self, keys: list[str], kind: str | None) -> list[str]:
        if kind is None:
            return keys
        return [k for k in keys if key_kind(k) == kind] or keys


class ArgGenerator:
    """Arguments for one tool and one principal, generated from the tool's inputSchema."""

    def __init__(
        self, tool: str, schema: dict[str, Any], pools: Pools, rng: random.Random, share: tuple[int, int] = (0, 1)
    ) -> None:
        self.tool = tool
        self.schema = schema
        self.pools = pools
        self.rng = rng
        # (i, n): this generator is one of n that split the values of properties that name no
        # content (sizes, flags, formats); each takes every n-th one, starting at the i-th.
        self.share = share
        self.properties: dict[str, dict[str, Any]] = schema.get("properties") or {}
        self.required: list[str] = list(schema.get("required") or [])
        self.validator = jsonschema.validators.validator_for(schema)(schema)

    def valid(self, values: dict[str, Any]) -> bool:
        return self.validator.is_valid(values)

    def key_props(self) -> list[str]:
        return [n for n, s in self.properties.items() if prop_role(n, s) == "key" and _accepts(s, "string")]

    # -- single values --------------------------------------------------------------------

    def sensible(self, name: str, schema: dict[str, Any]) -> Any:
        """An allowed, well-formed value: the base every probe starts from. When the obvious
        choice breaks the property's schema (a pattern, a length), the first candidate that
        fits is used instead."""
        preferred = self._preferred(name, schema)
        if _fits(schema, preferred):
            return preferred
        return next((v for v in self.candidates(name, schema) if _fits(schema, v)), preferred)

    def _preferred(self, name: str, schema: dict[str, Any]) -> Any:
        role = prop_role(name, schema)
        kind = _main_type(schema)
        if kind == "array":
            return [self.sensible(name, schema.get("items") or {})]
        if kind == "string":
            if "enum" in schema:
                return schema["enum"][0]
            if role == "namespace":
                return self.pools.home
            if role == "key":
                keys = self.pools.keys_of(self.pools.allowed_keys, wanted_kind(name))
                keys = [k for k in keys if k in self.pools.file_ids] or keys
                return self.rng.choice(keys) if keys else GARBAGE_KEYS[0]
            if role == "cursor":
                return self.rng.choice(self.pools.cursors)
            if role == "path":
                return self.rng.choice(self.pools.paths)
            return self.rng.choice(self.pools.texts)
        if kind in ("integer", "number"):
            if "default" in schema:
                return schema["default"]
            return schema.get("minimum", 1)
        if kind == "boolean":
            return False
        if kind == "object":
            return {}
        return None

    def candidates(self, name: str, schema: dict[str, Any], depth: int = 0) -> list[Any]:
        """Interesting values of one property: forbidden and allowed keys, unreadable namespaces,
        canary words, boundaries (including out-of-range ones), nested objects."""
        role = prop_role(name, schema)
        kind = _main_type(schema)
        pools = self.pools
        if kind == "array":
            items = schema.get("items") or {}
            if role == "namespace":
                ns = list(pools.namespaces)
                combos = [[n] for n in ns] + [ns[:2], ns[::-1][:2], ns, []]
                return [list(dict.fromkeys(c)) for c in combos]
            singles = self.candidates(name, items, depth + 1)
            picked = self.rng.sample(singles, min(len(singles), 6))
            return [[v] for v in picked] + [picked[:3], []]
        if kind == "string":
            if "enum" in schema:
                return [*schema["enum"], "not-an-enum-value"]
            if role == "namespace":
                return list(pools.namespaces)
            if role == "key":
                want = wanted_kind(name)
                forbidden = pools.keys_of(pools.forbidden_keys, want)
                allowed = pools.keys_of(pools.allowed_keys, want)
                other = [k for k in pools.forbidden_keys if want is not None and key_kind(k) != want]
                return [
                    *self.rng.sample(forbidden, min(5, len(forbidden))),
                    *self.rng.sample(other, min(1, len(other))),
                    *self.rng.sample(allowed, min(2, len(allowed))),
                    *self.rng.sample(GARBAGE_KEYS, 2),
                ]
            # Each principal draws its own sample, so together they cover the pools.
            if role == "cursor":
                return self.rng.sample(pools.cursors, min(5, len(pools.cursors)))
            if role == "path":
                return self.rng.sample(pools.paths, min(10, len(pools.paths)))
            texts = self.rng.sample(pools.texts, min(7, len(pools.texts)))
            if "maxLength" in schema:
                texts.append("x" * (int(schema["maxLength"]) + 1))
            if schema.get("minLength", 0) > 0:
                texts.append("")
            return texts
        if kind in ("integer", "number"):
            return _numbers(schema, kind)
        if kind == "boolean":
            return [True, False]
        if kind == "object":
            if depth > 2:
                return [{}]
            return self._objects(schema, depth)
        return [None]

    def _objects(self, schema: dict[str, Any], depth: int) -> list[dict[str, Any]]:
        props: dict[str, dict[str, Any]] = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        made: list[dict[str, Any]] = [{}]
        if props:
            names = list(props)
            for _ in range(4):
                chosen = self.rng.sample(names, self.rng.randint(1, len(names)))
                made.append({n: self.rng.choice(self.candidates(n, props[n], depth + 1)) for n in chosen})
            made.append({n: self.sensible(n, props[n]) for n in names})
        if isinstance(extra, dict):
            values = self.candidates("value", extra, depth + 1)
            made.append({k: self.rng.choice(values) for k in ("bm25", "vector", "graph", "unknown-lane")})
        return made

    # -- whole argument sets --------------------------------------------------------------

    def base(self) -> dict[str, Any]:
        return {name: self.sensible(name, self.properties.get(name, {})) for name in self.required}

    def with_value(self, name: str, value: Any) -> dict[str, Any]:
        values = self.base()
        if prop_role(name, self.properties.get(name, {})) == "key":
            # One key at a time, so the probe is about this key (a tool may need exactly one).
            for other in self.key_props():
                if other != name and other not in self.required:
                    values.pop(other, None)
        values[name] = value
        return values

    def names_content(self, name: str, schema: dict[str, Any]) -> bool:
        """Whether a property can point at content: a namespace, key, cursor, path or free text
        (not a number, flag, enum or options object)."""
        kind = _main_type(schema)
        if kind == "array":
            return self.names_content(name, schema.get("items") or {})
        return kind == "string" and "enum" not in schema

    def systematic(self) -> Iterator[dict[str, Any]]:
        """Each interesting value of each property, on top of an allowed base. Values of
        properties that name content are all tried; the others are shared out."""
        yield self.base()
        first, step = self.share
        for name, schema in self.properties.items():
            values = self.candidates(name, schema)
            if not self.names_content(name, schema):
                values = values[first::step]
            for value in values:
                yield self.with_value(name, value)

    def random(self, count: int) -> Iterator[dict[str, Any]]:
        """Required properties always, optional ones in random subsets, values drawn at random.
        Optional keys come one at a time most often (a tool may take exactly one), sometimes
        several together."""
        keys = [n for n in self.key_props() if n not in self.required]
        others = [n for n in self.properties if n not in self.required and n not in keys]
        for _ in range(count):
            chosen = self.required + self.rng.sample(others, self.rng.randint(0, len(others)))
            if keys and self.rng.random() < 0.8:
                chosen.append(self.rng.choice(keys))
            else:
                chosen += self.rng.sample(keys, self.rng.randint(0, len(keys)))
            yield {n: self.rng.choice(self.candidates(n, self.properties.get(n, {}))) for n in chosen}


def _fits(schema: dict[str, Any], value: Any) -> bool:
    try:
        return bool(jsonschema.validators.validator_for(schema)(schema).is_valid(value))
    except (jsonschema.exceptions.SchemaError, referencing.exceptions.Unresolvable):
        return True  # a schema this check cannot evaluate on its own (e.g. a $ref to the root)


def _accepts(schema: dict[str, Any], kind: str) -> bool:
    declared = schema.get("type")
    return declared == kind or (isinstance(declared, list) and kind in declared)


def _main_type(schema: dict[str, Any]) -> str:
    declared = schema.get("type")
    if isinstance(declared, list):
        declared = next((t for t in declared if t != "null"), None)
    if declared is None:
        # Untyped: an object if it has properties, else treated as a string.
        return "object" if "properties" in schema else "string"
    return str(declared)


def _numbers(schema: dict[str, Any], kind: str) -> list[Any]:
    low = schema.get("minimum")
    high = schema.get("maximum")
    values: list[Any] = []
    if low is not None:
        values += [low, low - 1]
    if high is not None:
        values += [high, high + 1]
    if "default" in schema:
        values.append(schema["default"])
    if low is not None and high is not None:
        values.append((low + high) // 2 if kind == "integer" else (low + high) / 2)
    if low is None and high is None:
        values += [0, 1, 5, 1000]
    if kind == "integer":
        values = [int(v) for v in values]
    else:
        values += [0.5]
    return list(dict.fromkeys(values))


# ---------------------------------------------------------------------------------------------
# Checking one response
# ---------------------------------------------------------------------------------------------


@dataclass
class Violation:
    kind: str
    principal: str
    tool: str
    arguments: dict[str, Any]
    detail: str

    def render(self) -> str:
        return (
            f"[{self.kind}] principal={self.principal} tool={self.tool}\n"
            f"  arguments: {json.dumps(self.arguments, ensure_ascii=False)[:600]}\n"
            f"  {self.detail}"
        )


class Needles:
    """The strings a principal must never receive, each mapped to the file it comes from."""

    def __init__(self, files: Iterable[CorpusFile], keys: Iterable[tuple[str, str]]) -> None:
        self.origin: dict[str, str] = {}
        for f in files:
            for needle in f.needles:
                self.origin.setdefault(needle.lower(), f"{f.ref} ({f.role})")
        for key, ref in keys:
            self.origin.setdefault(key.lower(), ref)
        ordered = sorted(self.origin, key=len, reverse=True)
        self.pattern = re.compile("|".join(re.escape(n) for n in ordered)) if ordered else None

    def find(self, raw: str, arguments: dict[str, Any]) -> list[tuple[str, str, str]]:
        """(needle, origin, surrounding text) for each needle in `raw` that the caller did not
        send itself (an error may quote the caller's own argument back)."""
        if self.pattern is None:
            return []
        lowered = raw.lower()
        # Offsets of `lowered` index `raw` only while lowering kept every length.
        source = raw if len(raw) == len(lowered) else lowered
        sent = json.dumps(arguments, ensure_ascii=False).lower()
        hits: dict[str, tuple[str, str, str]] = {}
        for match in self.pattern.finditer(lowered):
            needle = match.group(0)
            if needle in hits or needle in sent:
                continue
            start, end = match.span()
            context = source[max(0, start - 100) : end + 100]
            hits[needle] = (source[start:end], self.origin[needle], context)
        return list(hits.values())


def packages_in(node: Any) -> Iterator[dict[str, Any]]:
    """Every chunk package anywhere in a result (a dict with namespace, chunkKey and fileId)."""
    if isinstance(node, dict):
        if {"namespace", "chunkKey", "fileId"} <= set(node):
            yield node
        for value in node.values():
            yield from packages_in(value)
    elif isinstance(node, list):
        for item in node:
            yield from packages_in(item)


def namespaces_named(arguments: dict[str, Any], properties: dict[str, dict[str, Any]]) -> set[str]:
    """Namespaces the arguments name: namespace properties, and `@kg:<namespace>/<path>` chat
    references in properties documented to take them."""
    named: set[str] = set()
    for name, value in arguments.items():
        schema = properties.get(name, {})
        takes_references = KG_REFERENCE in str(schema.get("description", ""))
        for item in value if isinstance(value, list) else [value]:
            if not isinstance(item, str):
                continue
            if prop_role(name, schema) == "namespace":
                named.add(item)
            elif takes_references and item.startswith(KG_REFERENCE):
                named.add(item[len(KG_REFERENCE) :].split("/", 1)[0])
    return named


def known_files_in(node: Any, files_by_id: dict[str, CorpusFile]) -> Iterator[CorpusFile]:
    """Every corpus file a result describes: any object whose fileId is one of the corpus's."""
    if isinstance(node, dict):
        owner = files_by_id.get(str(node.get("fileId")))
        if owner is not None:
            yield owner
        for value in node.values():
            yield from known_files_in(value, files_by_id)
    elif isinstance(node, list):
        for item in node:
            yield from known_files_in(item, files_by_id)


@dataclass
class Tally:
    """How many calls the suite made, per tool and per principal, and how they ended."""

    calls: Counter[tuple[str, str]] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    seconds: Counter[str] = field(default_factory=Counter)  # per tool, summed over calls

    def add(self, principal: str, tool: str, outcome: str, seconds: float) -> None:
        self.calls[(principal, tool)] += 1
        self.outcomes[outcome] += 1
        self.seconds[tool] += seconds

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    def per_tool(self) -> Counter[str]:
        counted: Counter[str] = Counter()
        for (_, tool), n in self.calls.items():
            counted[tool] += n
        return counted

    def per_principal(self) -> Counter[str]:
        counted: Counter[str] = Counter()
        for (principal, _), n in self.calls.items():
            counted[principal] += n
        return counted

    def summary(self, seconds: float) -> str:
        tools = ", ".join(
            f"{t}={n} ({1000 * self.seconds[t] / n:.0f} ms avg)" for t, n in sorted(self.per_tool().items())
        )
        principals = ", ".join(f"{p}={n}" for p, n in sorted(self.per_principal().items()))
        outcomes = ", ".join(f"{o}={n}" for o, n in sorted(self.outcomes.items()))
        return (
            f"canary leak suite: {self.total} calls in {seconds:.1f} s\n"
            f"  per tool: {tools}\n  per principal: {principals}\n  outcomes: {outcomes}"
        )

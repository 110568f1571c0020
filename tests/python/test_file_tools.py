"""kg_files and kg_file over MCP (issue 7): finding files by folder, glob and content regex, and
reading or querying one file as metadata, SQL (CSV/TSV), text (regex or line window), JSONPath,
JSONata and Jinja, with every refusal a stable code and a message that says what to change.

One namespace is ingested for the module with real-looking files: a CSV with quoted headers,
numbers, dates and malformed rows; a TSV; nested JSON; a Markdown guide; a 12 MiB CSV; a folder of
small notes for paging; a file that is hidden; and a private folder that a prefix-granted user must
not be able to tell apart from a missing file.
"""

from __future__ import annotations

import json
import re
import secrets
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from kgmesh_support import Mesh, MeshError, Principal, ToolOutcome, call_ok, call_tool, expect_rejected, mcp_http

pytestmark = pytest.mark.anyio

MIB = 1024 * 1024

HOLDINGS_HEADER = ["Ticker", "Security Name", "Sector", "Market Value (AUD)", "Quantity", "As Of"]
HOLDINGS = [
    ("BHP", "BHP Group, Ltd", "Materials", 152340.50, 1200, "2024-06-28"),
    ("CBA", "Commonwealth Bank", "Financials", 98000.25, 800, "2024-06-28"),
    ("CSL", "CSL Limited", "Health Care", 75500.00, 250, "2024-06-28"),
    ("WBC", "Westpac Banking", "Financials", 45210.75, 1500, "2024-06-28"),
    ("NAB", "National Australia Bank", "Financials", 60300.10, 1700, "2024-06-28"),
    ("WES", "Wesfarmers", "Consumer", 38950.40, 600, "2024-06-27"),
    ("RIO", "Rio Tinto", "Materials", 88120.00, 700, "2024-06-27"),
    ("FMG", "Fortescue", "Materials", 21000.60, 1100, "2024-06-27"),
    ("TLS", "Telstra", "Communication", 12500.00, 3000, "2024-06-27"),
    ("WOW", "Woolworths", "Consumer", 30400.20, 900, "2024-06-26"),
    ("MQG", "Macquarie Group", "Financials", 71000.00, 350, "2024-06-26"),
    ("ANZ", "ANZ Group", "Financials", 50500.50, 1600, "2024-06-26"),
]
# Rows whose field count differs from the header: skipped by SQL and counted.
MALFORMED_LINES = ["BROKEN,only three,fields", "XTRA,Too Many,Materials,1.0,1,2024-06-26,surplus,columns"]

TRADES = [
    ("T-1001", "BHP", "BUY", 100, 45.10, "2024-07-01"),
    ("T-1002", "CBA", "SELL", 40, 120.50, "2024-07-01"),
    ("T-1003", "BHP", "BUY", 60, 44.80, "2024-07-02"),
    ("T-1004", "RIO", "BUY", 25, 118.00, "2024-07-02"),
    ("T-1005", "CBA", "BUY", 10, 121.00, "2024-07-03"),
]

PORTFOLIO = {
    "portfolio": {
        "name": "Southern Growth Fund",
        "manager": {"name": "Ada Lovelace", "since": "2019-03-01"},
        "holdings": [
            {"ticker": "BHP", "weight": 0.30, "tags": ["mining", "dividend"]},
            {"ticker": "CSL", "weight": 0.15, "tags": ["health"]},
            {"ticker": "CBA", "weight": 0.25, "tags": ["bank", "dividend"]},
            {"ticker": "TLS", "weight": 0.10, "tags": []},
            {"ticker": "RIO", "weight": 0.20, "tags": ["mining"]},
        ],
        "benchmarks": {"primary": {"id": "ASX200", "trackingError": 0.021}},
    },
    "asOf": "2024-06-28",
}

GUIDE = """# Operations guide

The ledger reconciliation runs nightly at 02:00 AEST.

## Runbook

1. Check the reconciliation dashboard.
2. If the runbook step fails, page the on-call engineer.
3. Record the incident in the ledger of incidents.

## Contacts

- Treasury desk: treasury@example.com
- Runbook owner: Grace Hopper
"""

BIG_PATH = "archive/ledger-2023.csv"
WIDE_TEXT = "wide/long-lines.txt"
WIDE_CSV = "wide/wide.csv"
# What one response may carry: the MCP Python SDK refuses SSE events over 1 MiB.
RESULT_LIMIT = 1024 * 1024


def wide_line(n: int) -> str:
    return f"row {n:04d} " + "lorem ipsum dolor sit amet " * 60


BIG_HEADER = "entry_id,account,amount,posted_on,memo"


def big_line(i: int) -> str:
    """Line i (0-based, after the header) of the 12 MiB ledger."""
    amount = (i * 37) % 100000 / 100
    return f"{i:08d},ACC-{i % 977:04d},{amount:.2f},2023-{1 + i % 12:02d}-{1 + i % 28:02d},entry {i} settled"


@dataclass
class Corpus:
    namespace: str
    files: dict[str, bytes] = field(default_factory=dict)
    hidden_path: str = "notes/draft-hidden.md"
    private_path: str = "private/salaries.csv"
    note_paths: list[str] = field(default_factory=list)
    big_lines: int = 0

    def text(self, path: str) -> str:
        return self.files[path].decode("utf-8")


def _csv_field(value: object) -> str:
    text = str(value)
    return f'"{text}"' if ("," in text or " " in text or "(" in text) else text


def build_files(corpus: Corpus) -> None:
    header = ",".join(f'"{h}"' if " " in h or "(" in h else h for h in HOLDINGS_HEADER)
    rows = [",".join(_csv_field(v) for v in row) for row in HOLDINGS]
    # The malformed rows sit among good ones, as they would in an export.
    lines = [header, *rows[:5], MALFORMED_LINES[0], *rows[5:9], MALFORMED_LINES[1], *rows[9:]]
    corpus.files["reports/holdings.csv"] = ("\n".join(lines) + "\n").encode()
    tsv = ["trade_id\tticker\tside\tqty\tprice\ttrade_date"] + ["\t".join(str(v) for v in t) for t in TRADES]
    corpus.files["reports/trades.tsv"] = ("\n".join(tsv) + "\n").encode()
    corpus.files["reports/summary.md"] = b"# Quarterly summary\n\nHoldings rose; the quince budget held.\n"
    corpus.files["data/portfolio.json"] = json.dumps(PORTFOLIO, indent=2).encode()
    corpus.files["notes/guide.md"] = GUIDE.encode()
    corpus.files[corpus.hidden_path] = b"# Draft\n\nThe zeppelin overture plan is not public yet.\n"
    corpus.files[corpus.private_path] = b"name,salary\nplatypus ledger keeper,99000\n"
    for i in range(12):
        path = f"pages/note-{i:02d}.txt"
        corpus.note_paths.append(path)
        body = f"Note {i}\nfiled under pages\n" + ("mentions the quince harvest\n" if i % 4 == 0 else "nothing else\n")
        corpus.files[path] = body.encode()
    # Wide enough that a whole answer would be several MiB: the result limit must cut it.
    corpus.files[WIDE_TEXT] = "".join(wide_line(n) + "\n" for n in range(1, 2001)).encode()
    wide_rows = [f"{n},{wide_line(n)}" for n in range(1, 1001)]
    corpus.files[WIDE_CSV] = ("id,payload\n" + "\n".join(wide_rows) + "\n").encode()
    # 12 MiB and a bit: over the 10 MiB query limit, still a well-formed CSV.
    out = [BIG_HEADER]
    size = len(BIG_HEADER) + 1
    i = 0
    while size <= 12 * MIB:
        line = big_line(i)
        out.append(line)
        size += len(line) + 1
        i += 1
    corpus.big_lines = i
    corpus.files[BIG_PATH] = ("\n".join(out) + "\n").encode()


@pytest.fixture(scope="module")
def corpus(mesh: Mesh) -> Corpus:
    namespace = f"files-{secrets.token_hex(4)}"
    built = Corpus(namespace)
    build_files(built)
    with tempfile.TemporaryDirectory(prefix="kgmesh-files-") as folder:
        root = Path(folder)
        for path, content in built.files.items():
            target = root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        try:
            mesh.ingest(root, namespace)
            mesh.cli("file", "set", "--namespace", namespace, "--path", built.hidden_path, "--hidden", "true")
        except MeshError as err:
            pytest.fail(str(err), pytrace=False)
    return built


async def file_call(client: Client, corpus: Corpus, path: str, **arguments: Any) -> dict[str, Any]:
    return await call_ok(client, "kg_file", {"namespace": corpus.namespace, "path": path, **arguments})


async def refused(client: Client, tool: str, arguments: dict[str, Any], code: str) -> str:
    """The call fails with `code`; returns the message."""
    outcome = await call_tool(client, tool, arguments)
    error = outcome.error()
    assert error["code"] == code, f"{tool}({arguments}) failed with {error}, expected {code}"
    assert error["message"], error
    return str(error["message"])


async def list_all(client: Client, arguments: dict[str, Any]) -> tuple[list[dict[str, Any]], list[int]]:
    """Every file of a kg_files listing, following nextCursor; returns (files, totals per page)."""
    files: list[dict[str, Any]] = []
    totals: list[int] = []
    cursor: str | None = None
    for _ in range(100):
        page = await call_ok(client, "kg_files", {**arguments, **({"cursor": cursor} if cursor else {})})
        files.extend(page["files"])
        totals.append(page["total"])
        assert page["stoppedEarly"] is False or page.get("nextCursor"), page
        cursor = page["nextCursor"]
        if cursor is None:
            return files, totals
    raise AssertionError("kg_files kept returning a nextCursor after 100 pages")


# ---------------------------------------------------------------------------------------------
# The tools are listed with their schemas
# ---------------------------------------------------------------------------------------------


async def test_file_tools_are_listed_read_only_with_schemas(mesh: Mesh) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    for name in ("kg_files", "kg_file"):
        tool = tools[name]
        assert tool.annotations is not None and tool.annotations.read_only_hint is True, tool.annotations
        assert tool.annotations.destructive_hint is False and tool.annotations.open_world_hint is False
        assert tool.input_schema["required"] == ["namespace"], tool.input_schema
        assert tool.input_schema.get("additionalProperties") is False
        assert isinstance(tool.output_schema, dict) and tool.output_schema["type"] == "object"
    assert {"folderPrefix", "name", "pattern", "cursor", "limit"} <= set(tools["kg_files"].input_schema["properties"])
    file_props = tools["kg_file"].input_schema["properties"]
    assert {"path", "fileId", "format", "query", "startLine", "endLine", "maxRows"} <= set(file_props)
    assert file_props["format"]["enum"] == ["sql", "text", "jsonpath", "jsonata", "jinja"]
    assert (
        file_props["maxRows"]["maximum"] == 1000
        and tools["kg_files"].input_schema["properties"]["limit"]["maximum"] == 200
    )
    description = tools["kg_files"].description or ""
    assert "folderPrefix" in description and "pattern" in description and "Hidden" in description


# ---------------------------------------------------------------------------------------------
# kg_files
# ---------------------------------------------------------------------------------------------


async def test_listing_pages_with_a_cursor_to_the_end(mesh: Mesh, corpus: Corpus) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        first = await call_ok(client, "kg_files", {"namespace": corpus.namespace, "folderPrefix": "pages/", "limit": 5})
        assert len(first["files"]) == 5 and first["total"] == 12 and first["nextCursor"], first
        assert "matches" not in first["files"][0], "a listing without pattern carries no matches"
        files, totals = await list_all(client, {"namespace": corpus.namespace, "folderPrefix": "pages/", "limit": 5})
        assert totals == [12, 12, 12], totals
        paths = [f["path"] for f in files]
        assert paths == sorted(corpus.note_paths), paths
        for f in files:
            assert f["namespace"] == corpus.namespace and f["fileId"], f
            assert f["size"] == len(corpus.files[f["path"]]), f
            assert f["mime"].startswith("text/"), f
            assert f["status"] in {"indexed", "pending", "failed"}, f

        # The whole namespace, default page size: every visible file once, the hidden one never.
        everything, _ = await list_all(client, {"namespace": corpus.namespace})
        listed = [f["path"] for f in everything]
        assert len(listed) == len(set(listed)), "a file was listed twice across pages"
        visible = sorted(p for p in corpus.files if p != corpus.hidden_path)
        assert sorted(listed) == visible, sorted(set(visible) ^ set(listed))

        # A cursor that this service never issued is refused with a hint, not ignored.
        message = await refused(
            client, "kg_files", {"namespace": corpus.namespace, "cursor": "not-a-cursor"}, "invalid_argument"
        )
        assert "cursor" in message
        # A cursor resumes only the query that returned it: its count of earlier
        # matches would make another query's total wrong and skip files.
        message = await refused(
            client, "kg_files", {"namespace": corpus.namespace, "cursor": first["nextCursor"]}, "invalid_argument"
        )
        assert "other arguments" in message, message
        await refused(client, "kg_files", {"namespace": corpus.namespace, "limit": 201}, "invalid_argument")


async def test_name_glob_and_folder_combine(mesh: Mesh, corpus: Corpus) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        csvs, _ = await list_all(client, {"namespace": corpus.namespace, "name": "*.csv"})
        assert sorted(f["path"] for f in csvs) == sorted(p for p in corpus.files if p.endswith(".csv"))
        in_reports, _ = await list_all(
            client, {"namespace": corpus.namespace, "folderPrefix": "reports/", "name": "*.csv"}
        )
        assert [f["path"] for f in in_reports] == ["reports/holdings.csv"]
        deep = await call_ok(client, "kg_files", {"namespace": corpus.namespace, "name": "reports/**/*.tsv"})
        assert [f["path"] for f in deep["files"]] == ["reports/trades.tsv"] and deep["total"] == 1, deep
        none = await call_ok(client, "kg_files", {"namespace": corpus.namespace, "name": "*.parquet"})
        assert none == {"files": [], "nextCursor": None, "total": 0, "stoppedEarly": False}, none


async def test_content_regex_returns_matching_lines(mesh: Mesh, corpus: Corpus) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        found = await call_ok(
            client, "kg_files", {"namespace": corpus.namespace, "pattern": r"quince (harvest|budget)"}
        )
        by_path = {f["path"]: f for f in found["files"]}
        expected = {p for p, c in corpus.files.items() if re.search(rb"quince (harvest|budget)", c)}
        assert set(by_path) == expected, sorted(by_path)
        assert found["total"] == len(expected)
        assert found["filesScanned"] >= len(expected)
        for path, f in by_path.items():
            lines = corpus.text(path).split("\n")
            assert f["matches"], f
            for match in f["matches"]:
                assert lines[match["lineNumber"] - 1] == match["line"], (path, match)
                assert "quince" in match["line"]
        # The 12 MiB file is over the scan's per-file limit: skipped and said so, never a match.
        assert BIG_PATH not in by_path
        assert "skipped" in found.get("stopReason", ""), found.get("stopReason")

        # Pattern and glob and folder combine.
        narrowed = await call_ok(
            client,
            "kg_files",
            {"namespace": corpus.namespace, "folderPrefix": "pages/", "name": "*-0?.txt", "pattern": "(?i)QUINCE"},
        )
        assert sorted(f["path"] for f in narrowed["files"]) == [
            "pages/note-00.txt",
            "pages/note-04.txt",
            "pages/note-08.txt",
        ]
        assert narrowed["stoppedEarly"] is False and narrowed["nextCursor"] is None, narrowed

        # Pages of a scan follow the cursor like a listing.
        first = await call_ok(client, "kg_files", {"namespace": corpus.namespace, "pattern": "filed under", "limit": 5})
        assert len(first["files"]) == 5 and first["nextCursor"], first
        rest, _ = await list_all(
            client, {"namespace": corpus.namespace, "pattern": "filed under", "limit": 5, "cursor": first["nextCursor"]}
        )
        assert sorted(f["path"] for f in first["files"] + rest) == sorted(corpus.note_paths)

        message = await refused(
            client, "kg_files", {"namespace": corpus.namespace, "pattern": "(unclosed"}, "invalid_argument"
        )
        assert "regular expression" in message
        costly = await refused(
            client, "kg_files", {"namespace": corpus.namespace, "pattern": r"(\w{100}){100}"}, "resource_exhausted"
        )
        assert "too costly" in costly


async def test_hidden_files_never_appear(mesh: Mesh, corpus: Corpus) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        listed = await call_ok(client, "kg_files", {"namespace": corpus.namespace, "folderPrefix": "notes/"})
        assert [f["path"] for f in listed["files"]] == ["notes/guide.md"] and listed["total"] == 1, listed
        found = await call_ok(client, "kg_files", {"namespace": corpus.namespace, "pattern": "zeppelin overture"})
        assert found["files"] == [] and found["total"] == 0, found
        by_name = await call_ok(client, "kg_files", {"namespace": corpus.namespace, "name": "*draft*"})
        assert by_name["files"] == [] and by_name["total"] == 0, by_name


# ---------------------------------------------------------------------------------------------
# kg_file: metadata and SQL
# ---------------------------------------------------------------------------------------------


async def test_metadata_of_a_csv_has_columns_and_types(mesh: Mesh, corpus: Corpus) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        meta = await file_call(client, corpus, "reports/holdings.csv")
        assert meta["format"] is None and meta["truncated"] is False, meta
        assert meta["columns"] == HOLDINGS_HEADER, meta["columns"]
        assert meta["file"]["path"] == "reports/holdings.csv" and meta["file"]["namespace"] == corpus.namespace
        size = len(corpus.files["reports/holdings.csv"])
        assert meta["file"]["size"] == size and meta["result"]["size"] == size, meta
        assert meta["result"]["mime"] == "text/csv" and meta["result"]["tooLarge"] is False
        assert meta["result"]["status"] == meta["file"]["status"] in {"indexed", "pending", "failed"}, meta
        types = dict(zip(HOLDINGS_HEADER, meta["result"]["columnTypes"], strict=True))
        assert types["Market Value (AUD)"] == "DOUBLE" and types["Quantity"] == "BIGINT", types
        assert types["As Of"] in {"DATE", "TIMESTAMP"} and types["Ticker"] == "VARCHAR", types

        # The same file by fileId and by chat reference.
        by_id = await call_ok(client, "kg_file", {"namespace": corpus.namespace, "fileId": meta["file"]["fileId"]})
        assert by_id["file"] == meta["file"]
        by_ref = await file_call(client, corpus, f"@kg:{corpus.namespace}/reports/holdings.csv")
        assert by_ref["file"] == meta["file"]

        # Markdown: no columns.
        guide = await file_call(client, corpus, "notes/guide.md")
        assert "columns" not in guide and guide["result"]["mime"].startswith("text/"), guide


async def test_sql_grouped_aggregate_over_quoted_headers(mesh: Mesh, corpus: Corpus) -> None:
    by_sector: dict[str, list[float]] = defaultdict(list)
    for row in HOLDINGS:
        by_sector[row[2]].append(row[3])
    expected = sorted(((s, round(sum(v), 2), len(v)) for s, v in by_sector.items()), key=lambda r: -r[1])
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        out = await file_call(
            client,
            corpus,
            "reports/holdings.csv",
            format="sql",
            query='SELECT "Sector", round(sum("Market Value (AUD)"), 2) AS mv, count(*) AS n '
            'FROM data GROUP BY "Sector" ORDER BY mv DESC',
        )
        result = out["result"]
        assert out["format"] == "sql" and out["truncated"] is False and result["truncated"] is False, out
        assert result["columns"] == ["Sector", "mv", "n"], result["columns"]
        assert result["types"][1] == "DOUBLE" and result["types"][2] == "BIGINT", result["types"]
        rows = [tuple(r) for r in result["rows"]]
        assert [(s, n) for s, _, n in rows] == [(s, n) for s, _, n in expected], rows
        for (_, got, _), (_, want, _) in zip(rows, expected, strict=True):
            assert got == pytest.approx(want), (got, want)
        assert result["rowCount"] == len(expected)
        # The two malformed rows were skipped and counted, not silently mixed in.
        assert result["malformedRows"] == 2, result
        assert out["columns"] == HOLDINGS_HEADER

        # Dates are dates: compare against a DATE literal and format them back.
        dated = await file_call(
            client,
            corpus,
            "reports/holdings.csv",
            format="sql",
            query='SELECT "Ticker", "As Of" FROM data WHERE "As Of" < DATE \'2024-06-27\' ORDER BY "Ticker"',
        )
        assert [tuple(r) for r in dated["result"]["rows"]] == sorted(
            (r[0], r[5]) for r in HOLDINGS if r[5] < "2024-06-27"
        )

        # WITH works.
        fin = await file_call(
            client,
            corpus,
            "reports/holdings.csv",
            format="sql",
            query="WITH fin AS (SELECT * FROM data WHERE \"Sector\" = 'Financials') "
            'SELECT count(*) AS n, sum("Quantity") AS q FROM fin',
        )
        financials = [r for r in HOLDINGS if r[2] == "Financials"]
        assert fin["result"]["rows"] == [[len(financials), sum(r[4] for r in financials)]], fin["result"]

        # A TSV is a table too.
        tsv = await file_call(
            client,
            corpus,
            "reports/trades.tsv",
            format="sql",
            query="SELECT ticker, sum(qty * price) AS notional FROM data GROUP BY ticker ORDER BY notional DESC",
        )
        notional: dict[str, float] = defaultdict(float)
        for t in TRADES:
            notional[t[1]] += t[3] * t[4]
        want = sorted(notional.items(), key=lambda kv: -kv[1])
        got = [(r[0], r[1]) for r in tsv["result"]["rows"]]
        assert [k for k, _ in got] == [k for k, _ in want]
        assert [v for _, v in got] == pytest.approx([v for _, v in want])


async def test_sql_row_cap_sets_truncated(mesh: Mesh, corpus: Corpus) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        out = await file_call(
            client,
            corpus,
            "reports/holdings.csv",
            format="sql",
            query='SELECT * FROM data ORDER BY "Ticker"',
            maxRows=5,
        )
        assert len(out["result"]["rows"]) == 5 and out["result"]["rowCount"] == 5, out["result"]
        assert out["truncated"] is True and out["result"]["truncated"] is True
        assert [r[0] for r in out["result"]["rows"]] == sorted(r[0] for r in HOLDINGS)[:5]
        await refused(
            client,
            "kg_file",
            {
                "namespace": corpus.namespace,
                "path": "reports/holdings.csv",
                "format": "sql",
                "query": "SELECT 1",
                "maxRows": 1001,
            },
            "invalid_argument",
        )


REFUSED_SQL = [
    ("two statements", 'SELECT * FROM data; SELECT "Ticker" FROM data', "exactly one SQL statement"),
    ("ddl", "CREATE TABLE t AS SELECT * FROM data", "CREATE TABLE"),
    ("drop", "DROP TABLE data", "DROP TABLE"),
    ("dml insert", "INSERT INTO data VALUES ('X', 'Y', 'Z', 1.0, 1, '2024-01-01')", "INSERT"),
    ("dml delete", "DELETE FROM data", "DELETE"),
    ("file function", "SELECT * FROM read_csv('/etc/passwd')", "table functions"),
    ("other table", "SELECT * FROM holdings", "only the table `data`"),
    ("file path table", "SELECT * FROM '/etc/passwd'", "only the table `data`|invalid SQL"),
    ("copy", "COPY data TO '/tmp/leak.csv'", "refused"),
]


@pytest.mark.parametrize(
    ("statement", "needle"), [(s, n) for _, s, n in REFUSED_SQL], ids=[i for i, _, _ in REFUSED_SQL]
)
async def test_sql_refuses_anything_but_one_read_only_query(
    mesh: Mesh, corpus: Corpus, statement: str, needle: str
) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        outcome = await call_tool(
            client,
            "kg_file",
            {"namespace": corpus.namespace, "path": "reports/holdings.csv", "format": "sql", "query": statement},
        )
    error = outcome.error()
    assert error["code"] == "invalid_argument", error
    assert re.search(needle, error["message"]), error["message"]
    assert "root:" not in outcome.raw


async def test_invalid_sql_names_the_position(mesh: Mesh, corpus: Corpus) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        base = {"namespace": corpus.namespace, "path": "reports/holdings.csv", "format": "sql"}
        message = await refused(
            client, "kg_file", {**base, "query": 'SELECT "Ticker" FROM data WHERE'}, "invalid_argument"
        )
        assert re.search(r"Line: 1, Column: \d+", message), message
        message = await refused(
            client, "kg_file", {**base, "query": 'SELECT "Ticker",\n  FROM data GROUP BY'}, "invalid_argument"
        )
        assert re.search(r"Line: \d+, Column: \d+", message), message
        # A column that does not exist: the engine's words, still invalid_argument.
        message = await refused(client, "kg_file", {**base, "query": "SELECT nope FROM data"}, "invalid_argument")
        assert "nope" in message
        # SQL needs a table file.
        message = await refused(
            client, "kg_file", {**base, "path": "notes/guide.md", "query": "SELECT 1"}, "invalid_argument"
        )
        assert "CSV or TSV" in message


# ---------------------------------------------------------------------------------------------
# kg_file: text, JSON
# ---------------------------------------------------------------------------------------------


async def test_text_regex_returns_numbered_lines_with_a_cap(mesh: Mesh, corpus: Corpus) -> None:
    lines = GUIDE.split("\n")
    expected = [(n, line) for n, line in enumerate(lines, start=1) if re.search(r"(?i)runbook", line)]
    assert len(expected) >= 3
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        out = await file_call(client, corpus, "notes/guide.md", format="text", query="(?i)runbook")
        got = [(m["lineNumber"], m["line"]) for m in out["result"]["matches"]]
        assert got == expected, got
        assert out["truncated"] is False
        capped = await file_call(client, corpus, "notes/guide.md", format="text", query="(?i)runbook", maxRows=2)
        assert [(m["lineNumber"], m["line"]) for m in capped["result"]["matches"]] == expected[:2]
        assert capped["truncated"] is True and capped["result"]["truncated"] is True
        assert capped["result"]["totalMatches"] == len(expected)
        # A CSV is text too.
        csv = await file_call(client, corpus, "reports/holdings.csv", format="text", query="^BROKEN")
        assert [m["line"] for m in csv["result"]["matches"]] == [MALFORMED_LINES[0]]

        message = await refused(
            client,
            "kg_file",
            {"namespace": corpus.namespace, "path": "notes/guide.md", "format": "text", "query": r"(\w{100}){100}"},
            "resource_exhausted",
        )
        assert "too costly" in message


async def test_text_line_window(mesh: Mesh, corpus: Corpus) -> None:
    lines = GUIDE.split("\n")
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        out = await file_call(client, corpus, "notes/guide.md", format="text", startLine=5, endLine=8)
        result = out["result"]
        assert (result["startLine"], result["endLine"]) == (5, 8), result
        assert [(x["lineNumber"], x["line"]) for x in result["lines"]] == [(n, lines[n - 1]) for n in range(5, 9)]
        assert out["truncated"] is False
        message = await refused(
            client,
            "kg_file",
            {"namespace": corpus.namespace, "path": "notes/guide.md", "format": "text", "startLine": 9, "endLine": 3},
            "invalid_argument",
        )
        assert "endLine" in message
        message = await refused(
            client,
            "kg_file",
            {"namespace": corpus.namespace, "path": "notes/guide.md", "format": "text"},
            "invalid_argument",
        )
        assert "startLine" in message and "query" in message


async def test_json_queries(mesh: Mesh, corpus: Corpus) -> None:
    holdings = PORTFOLIO["portfolio"]["holdings"]  # type: ignore[index]
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        path = await file_call(
            client,
            corpus,
            "data/portfolio.json",
            format="jsonpath",
            query="$.portfolio.holdings[?@.weight >= 0.2].ticker",
        )
        assert path["format"] == "jsonpath"
        assert path["result"]["result"] == [h["ticker"] for h in holdings if h["weight"] >= 0.2], path["result"]
        nested = await file_call(client, corpus, "data/portfolio.json", format="jsonpath", query="$..trackingError")
        assert nested["result"]["result"] == [0.021]

        ata = await file_call(
            client,
            corpus,
            "data/portfolio.json",
            format="jsonata",
            query='{"manager": portfolio.manager.name, "total": $sum(portfolio.holdings.weight), '
            '"dividend": portfolio.holdings["dividend" in tags].ticker}',
        )
        value = ata["result"]["result"]
        assert value["manager"] == "Ada Lovelace" and value["total"] == pytest.approx(1.0), value
        assert value["dividend"] == ["BHP", "CBA"], value

        jinja = await file_call(
            client,
            corpus,
            "data/portfolio.json",
            format="jinja",
            query="{{ data.portfolio.name }}:{% for h in data.portfolio.holdings %} {{ h.ticker }}={{ h.weight }}"
            "{% endfor %}",
        )
        rendered = "Southern Growth Fund:" + "".join(f" {h['ticker']}={h['weight']}" for h in holdings)
        assert jinja["result"]["result"] == rendered, jinja["result"]

        base = {"namespace": corpus.namespace, "path": "data/portfolio.json"}
        runaway = await refused(
            client,
            "kg_file",
            {
                **base,
                "format": "jinja",
                "query": "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}",
            },
            "resource_exhausted",
        )
        assert "fuel" in runaway
        # Nothing outside the template's data is reachable.
        message = await refused(
            client, "kg_file", {**base, "format": "jinja", "query": "{% include '/etc/passwd' %}"}, "invalid_argument"
        )
        assert "root:" not in message
        message = await refused(
            client, "kg_file", {**base, "format": "jsonpath", "query": "$.portfolio["}, "invalid_argument"
        )
        assert "JSONPath" in message
        message = await refused(
            client, "kg_file", {**base, "format": "jsonata", "query": "portfolio.("}, "invalid_argument"
        )
        assert "JSONata" in message
        message = await refused(
            client,
            "kg_file",
            {"namespace": corpus.namespace, "path": "reports/holdings.csv", "format": "jsonpath", "query": "$"},
            "invalid_argument",
        )
        assert "JSON file" in message


# ---------------------------------------------------------------------------------------------
# kg_file: the 12 MiB file
# ---------------------------------------------------------------------------------------------


async def test_large_file_returns_its_size_and_reads_through_a_window(mesh: Mesh, corpus: Corpus) -> None:
    size = len(corpus.files[BIG_PATH])
    assert size > 12 * MIB
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        meta = await file_call(client, corpus, BIG_PATH)
        assert meta["file"]["size"] == size and meta["result"]["size"] == size, meta
        assert meta["result"]["tooLarge"] is True
        assert meta["columns"] == BIG_HEADER.split(","), meta.get("columns")

        base = {"namespace": corpus.namespace, "path": BIG_PATH}
        for arguments in (
            {"format": "sql", "query": "SELECT count(*) FROM data"},
            {"format": "text", "query": "settled"},
        ):
            outcome = await call_tool(client, "kg_file", {**base, **arguments})
            error = outcome.error()
            assert error["code"] == "PAYLOAD_TOO_LARGE", error
            assert str(size) in error["message"] and "startLine" in error["message"], error
            assert error["retryable"] is False

        # Line 1 is the header; data line i is file line i + 2.
        start = corpus.big_lines - 3
        window = await file_call(client, corpus, BIG_PATH, format="text", startLine=start, endLine=start + 5)
        got = [(x["lineNumber"], x["line"]) for x in window["result"]["lines"]]
        # The window runs past the last line: it stops there.
        assert got == [(n, big_line(n - 2)) for n in range(start, corpus.big_lines + 2)], got[:3]
        assert window["result"]["totalLines"] == corpus.big_lines + 1


async def test_no_answer_exceeds_the_result_limit(mesh: Mesh, corpus: Corpus) -> None:
    def encoded(value: dict[str, Any]) -> int:
        # A result travels twice: as structuredContent and as the escaped text of the content block.
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        return len(text.encode()) + len(json.dumps(text, ensure_ascii=False).encode())

    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        window = await file_call(client, corpus, WIDE_TEXT, format="text", startLine=1, endLine=2000)
        lines = window["result"]["lines"]
        assert window["truncated"] is True and 100 < len(lines) < 2000, len(lines)
        assert [x["lineNumber"] for x in lines] == list(range(1, len(lines) + 1))
        assert lines[-1]["line"] == wide_line(len(lines)) and window["result"]["endLine"] == len(lines)
        assert encoded(window) <= RESULT_LIMIT, encoded(window)

        rows = await file_call(
            client, corpus, WIDE_CSV, format="sql", query="SELECT * FROM data ORDER BY id", maxRows=1000
        )
        got = rows["result"]["rows"]
        assert rows["truncated"] is True and rows["result"]["truncated"] is True and 100 < len(got) < 1000
        assert got[-1] == [len(got), wide_line(len(got))]
        assert encoded(rows) <= RESULT_LIMIT, encoded(rows)

        matches = await file_call(client, corpus, WIDE_TEXT, format="text", query="lorem", maxRows=1000)
        assert matches["truncated"] is True and encoded(matches) <= RESULT_LIMIT
        assert matches["result"]["totalMatches"] == 2000


# ---------------------------------------------------------------------------------------------
# Argument errors say what to change
# ---------------------------------------------------------------------------------------------


async def test_argument_errors_say_what_to_change(mesh: Mesh, corpus: Corpus) -> None:
    ns = corpus.namespace
    cases = [
        ({"namespace": ns}, "pass exactly one of path or fileId"),
        ({"namespace": ns, "path": "reports/holdings.csv", "fileId": "x"}, "pass exactly one of path or fileId"),
        (
            {"namespace": ns, "path": "reports/holdings.csv", "format": "sql"},
            "format sql needs query: one SELECT or WITH statement over the table data",
        ),
        ({"namespace": ns, "path": "data/portfolio.json", "format": "jsonata"}, "format jsonata needs query"),
        ({"namespace": ns, "path": "notes/guide.md", "query": "runbook"}, "query needs a format"),
        (
            {"namespace": ns, "path": "notes/guide.md", "format": "sql", "query": "SELECT 1", "startLine": 2},
            "format text only",
        ),
        ({"namespace": ns, "path": "@kg:elsewhere/notes/guide.md"}, "pass the same namespace in both"),
        ({"namespace": ns, "path": "../etc/passwd"}, "path:"),
    ]
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        for arguments, needle in cases:
            message = await refused(client, "kg_file", arguments, "invalid_argument")
            assert needle in message, (arguments, message)
        # Values the input schema already forbids may be refused by the SDK or the server.
        await expect_rejected(
            client, "kg_file", {"namespace": ns, "path": "a.md", "format": "xml"}, {"invalid_argument"}
        )
        missing = await refused(client, "kg_file", {"namespace": ns, "path": "reports/nope.csv"}, "not_found")
        assert "reports/nope.csv" in missing
        await refused(client, "kg_file", {"namespace": "no-such-ns-here", "path": "a.csv"}, "permission_denied")
        await refused(client, "kg_files", {"namespace": "no-such-ns-here"}, "permission_denied")


async def test_file_tool_calls_are_audited_with_their_namespace(mesh: Mesh, corpus: Corpus) -> None:
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        await file_call(client, corpus, "notes/guide.md")
        await call_ok(client, "kg_files", {"namespace": corpus.namespace, "limit": 1})
    for tool in ("kg_file", "kg_files"):
        # Audit events are written off the call path: give the sink a moment.
        deadline = time.monotonic() + 10
        while True:
            listed = mesh.cli("audit", "--tool", tool, "--limit", "200")
            events = [e for e in listed["events"] if corpus.namespace in e.get("namespaces", [])]
            if events or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert events, f"no audit event of {tool} names {corpus.namespace}: {listed}"
        assert any(e["outcome"] == "ok" for e in events), events
        # Arguments never reach the audit log.
        assert "guide.md" not in json.dumps(listed)


# ---------------------------------------------------------------------------------------------
# Permissions: a file outside the caller's grant is a missing file
# ---------------------------------------------------------------------------------------------


def _shape(outcome: ToolOutcome, *specifics: str) -> tuple[str, str, bool]:
    error = outcome.error()
    message = str(error["message"])
    for specific in specifics:
        message = message.replace(specific, "<X>")
    return str(error["code"]), message, bool(error["retryable"])


async def test_unreadable_file_behaves_exactly_like_a_missing_one(
    mesh: Mesh, corpus: Corpus, make_principal: Callable[..., Principal]
) -> None:
    ns = corpus.namespace
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as admin:
        private = await file_call(admin, corpus, corpus.private_path)
        private_id = private["file"]["fileId"]
        readable, _ = await list_all(admin, {"namespace": ns, "folderPrefix": "reports/"})
        found = await call_ok(admin, "kg_files", {"namespace": ns, "pattern": "platypus ledger"})
        assert [f["path"] for f in found["files"]] == [corpus.private_path], "the admin must see the private file"

    user = make_principal("reports-reader")
    mesh.grant(user.id, ns, "read", prefix="reports/")
    secret = "platypus ledger"
    async with mcp_http(mesh.mcp_url, user.token) as client:
        # kg_files: the private folder is never listed and never counted.
        listed, totals = await list_all(client, {"namespace": ns})
        assert sorted(f["path"] for f in listed) == sorted(f["path"] for f in readable), listed
        assert set(totals) == {len(readable)}, totals
        scan = await call_ok(client, "kg_files", {"namespace": ns, "pattern": secret})
        assert scan["files"] == [] and scan["total"] == 0, scan
        assert secret not in json.dumps(scan)
        private_folder = await call_ok(client, "kg_files", {"namespace": ns, "folderPrefix": "private/"})
        empty_folder = await call_ok(client, "kg_files", {"namespace": ns, "folderPrefix": "nowhere/"})
        assert private_folder == empty_folder == {"files": [], "nextCursor": None, "total": 0, "stoppedEarly": False}
        by_name = await call_ok(client, "kg_files", {"namespace": ns, "name": "*salaries*"})
        assert by_name["files"] == [] and by_name["total"] == 0

        # kg_file: the same error, code and message shape, as a path or id that does not exist.
        for arguments in ({}, {"format": "sql", "query": "SELECT * FROM data"}, {"format": "text", "query": "."}):
            hidden_by_grant = await call_tool(
                client, "kg_file", {"namespace": ns, "path": corpus.private_path, **arguments}
            )
            missing = await call_tool(client, "kg_file", {"namespace": ns, "path": "private/missing.csv", **arguments})
            assert _shape(hidden_by_grant, corpus.private_path) == _shape(missing, "private/missing.csv"), (
                hidden_by_grant.data,
                missing.data,
            )
            assert hidden_by_grant.error()["code"] == "not_found"
            assert secret not in hidden_by_grant.raw
        fake_id = "f" + private_id[1:] if not private_id.startswith("f") else "0" + private_id[1:]
        by_id = await call_tool(client, "kg_file", {"namespace": ns, "fileId": private_id})
        missing_id = await call_tool(client, "kg_file", {"namespace": ns, "fileId": fake_id})
        assert _shape(by_id, private_id) == _shape(missing_id, fake_id), (by_id.data, missing_id.data)
        assert secret not in by_id.raw

        # Inside the grant everything works.
        ok = await file_call(client, corpus, "reports/holdings.csv", format="sql", query="SELECT count(*) FROM data")
        assert ok["result"]["rows"] == [[len(HOLDINGS)]]

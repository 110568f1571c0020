#!/usr/bin/env python3
"""`make bench-files`: the file tools against the tools people would otherwise reach for.

1. Generates a CSV deterministically (default 1,000,000 sales rows, about 50 MB: order_id, region,
   product, order_date, quantity, price) and 10,000 small text notes, a few of which hold a needle.
2. Starts `kgmesh up` in a temp dir (target/release/kgmesh when built, else target/debug/kgmesh, or
   --binary) and ingests both with `kgmesh ingest`.
3. Times one grouped aggregate,
       SELECT region, sum(quantity * price) AS revenue FROM data GROUP BY region ORDER BY 2 DESC
   through kg_file over MCP (Streamable HTTP, the official SDK), through the `sqlite3` shell
   (`.import` of the same CSV file into an in-memory database, then the query: reading included)
   and through DuckDB (the PyPI wheel, installed into this venv when missing; `read_csv` of the
   same file inside the query: reading included). Every engine must return the same answer.
4. Times the first page of kg_files with a content regex over the 10,000 notes.
5. Prints medians and p95 per measure and the ratios kg_file/sqlite3 and kg_file/DuckDB, all
   measured in this one run. Goals (issue 7): faster than sqlite3, within 2x of DuckDB.

kg_file keeps a per-version profile of a CSV (header and inferred types), so its first call on a
file does more work than the next ones; that cold call is reported on its own line. Every call,
cold or warm, reads the CSV again to answer the query.

Not part of `make test`. Use --rows/--notes/--runs for a smaller run (e.g. a debug build).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests" / "python"))

import anyio  # noqa: E402

from kgmesh_support import Mesh, MeshError, call_tool, mcp_http  # noqa: E402

QUERY = "SELECT region, sum(quantity * price) AS revenue FROM data GROUP BY region ORDER BY 2 DESC"
REGIONS = ["Asia Pacific", "Europe", "North America", "Latin America", "Middle East", "Africa", "Oceania", "Nordics"]
PRODUCTS = [f"P-{i:03d}" for i in range(240)]
FIRST_DAY = dt.date(2023, 1, 1)
DAYS = 730
CSV_NS = "bench-sales"
NOTES_NS = "bench-notes"
# One note in NEEDLE_EVERY holds the needle, so a first page of kg_files has to read them all.
NEEDLE_EVERY = 500
NEEDLE_PATTERN = r"needle-[0-9]{4} found"
MIB = 1024 * 1024
# Default limits of a mesh: uploads through the gateway, and files a query format may read.
DEFAULT_UPLOAD_LIMIT = 32 * MIB
DEFAULT_QUERY_LIMIT = 10 * MIB
# The settings a mesh needs to take a larger CSV (passed as KGMESH_* environment when needed).
LIMIT_ENV = {"upload": "KGMESH_MAX_UPLOAD_BYTES", "query": "KGMESH_FILES__MAX_QUERY_FILE_BYTES"}


class BenchError(RuntimeError):
    """The bench cannot produce a trustworthy number; the message says why."""


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------


def generate_csv(path: Path, rows: int, seed: int) -> int:
    """Writes the sales CSV; returns its size in bytes. Same seed, same bytes."""
    rng = random.Random(seed)
    days = [(FIRST_DAY + dt.timedelta(days=d)).isoformat() for d in range(DAYS)]
    with open(path, "w", encoding="utf-8", newline="\n") as out:
        out.write("order_id,region,product,order_date,quantity,price\n")
        batch: list[str] = []
        for i in range(rows):
            batch.append(
                f"ORD-{i:08d},{rng.choice(REGIONS)},{rng.choice(PRODUCTS)},{days[rng.randrange(DAYS)]},"
                f"{rng.randint(1, 50)},{rng.randint(100, 99999) / 100:.2f}\n"
            )
            if len(batch) == 10_000:
                out.write("".join(batch))
                batch.clear()
        out.write("".join(batch))
    return path.stat().st_size


def generate_notes(folder: Path, count: int, seed: int) -> int:
    """Writes `count` small notes in 100 folders; returns how many hold the needle."""
    rng = random.Random(seed)
    words = ["ledger", "invoice", "roster", "pantry", "harbour", "lantern", "quarry", "meadow", "signal", "orchard"]
    needles = 0
    for i in range(count):
        target = folder / f"team-{i % 100:02d}" / f"note-{i:05d}.txt"
        target.parent.mkdir(parents=True, exist_ok=True)
        lines = [f"Note {i}"] + [" ".join(rng.choice(words) for _ in range(12)) for _ in range(8)]
        if i % NEEDLE_EVERY == NEEDLE_EVERY // 2:
            lines.insert(4, f"needle-{i % 10000:04d} found in this note")
            needles += 1
        target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return needles


# ---------------------------------------------------------------------------------------------
# Measures
# ---------------------------------------------------------------------------------------------


@dataclass
class Measure:
    name: str
    seconds: list[float] = field(default_factory=list)
    note: str = ""

    def median_ms(self) -> float:
        return statistics.median(self.seconds) * 1000

    def p95_ms(self) -> float:
        ordered = sorted(self.seconds)
        return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)] * 1000


Answer = list[tuple[str, float]]


def same_answer(name: str, got: Answer, reference: Answer) -> None:
    """Every engine must agree: same regions in the same order, same sums."""
    if [r for r, _ in got] != [r for r, _ in reference]:
        raise BenchError(f"{name} ordered the regions differently: {got} vs {reference}")
    for (region, a), (_, b) in zip(got, reference, strict=True):
        if not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6):
            raise BenchError(f"{name} computed {a} for {region}, the reference says {b}")


def time_runs(name: str, runs: int, once: Callable[[], Answer], reference: Answer | None) -> tuple[Measure, Answer]:
    measure = Measure(name)
    answer: Answer = []
    for _ in range(runs):
        start = time.perf_counter()
        answer = once()
        measure.seconds.append(time.perf_counter() - start)
        if reference is not None:
            same_answer(name, answer, reference)
    return measure, answer


def sqlite_once(csv_path: Path) -> Answer:
    """The sqlite3 shell: `.import` into an in-memory table named data, then the query."""
    script = f".mode csv\n.import '{csv_path}' data\n.mode tabs\n{QUERY};\n"
    done = subprocess.run(
        ["sqlite3", ":memory:"], input=script, capture_output=True, text=True, check=False, timeout=3600
    )
    if done.returncode != 0 or done.stderr.strip():
        raise BenchError(f"sqlite3 failed ({done.returncode}): {done.stderr[-500:]}")
    rows = [line.split("\t") for line in done.stdout.splitlines() if line.strip()]
    return [(region, float(revenue)) for region, revenue in rows]


def ensure_duckdb() -> Any:
    try:
        return importlib.import_module("duckdb")
    except ImportError:
        print("installing the duckdb wheel into this venv (pip install duckdb) ...", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "duckdb"], check=True)
        importlib.invalidate_caches()
        return importlib.import_module("duckdb")


def duckdb_once(duckdb: Any, csv_path: Path) -> Answer:
    """DuckDB: a fresh in-memory connection that reads the CSV inside the query."""
    sql = QUERY.replace("FROM data", f"FROM read_csv('{csv_path}', header = true)")
    con = duckdb.connect(":memory:")
    try:
        rows = con.execute(sql).fetchall()
    finally:
        con.close()
    return [(str(region), float(revenue)) for region, revenue in rows]


async def kg_file_runs(mesh: Mesh, runs: int, reference: Answer) -> tuple[Measure, Measure]:
    """kg_file sql over MCP: one cold call (first on this file version), then `runs` warm calls."""
    arguments = {"namespace": CSV_NS, "path": "sales.csv", "format": "sql", "query": QUERY, "maxRows": 100}
    cold = Measure("kg_file sql over MCP, first call")
    warm = Measure("kg_file sql over MCP")
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        meta = await call_tool(client, "kg_file", {"namespace": CSV_NS, "path": "sales.csv"})
        if meta.is_error:
            raise BenchError(f"kg_file metadata of sales.csv failed: {meta.data}")
        if meta.data["result"].get("tooLarge"):
            raise BenchError(
                f"the mesh refuses SQL over sales.csv ({meta.data['file']['size']} bytes): it is over the query "
                f"size limit. Start kgmesh with a larger limit ({LIMIT_ENV['query']}) or pass fewer --rows."
            )
        for i in range(runs + 1):
            start = time.perf_counter()
            outcome = await call_tool(client, "kg_file", arguments)
            seconds = time.perf_counter() - start
            if outcome.is_error:
                raise BenchError(f"kg_file sql failed: {outcome.data}")
            rows = outcome.data["result"]["rows"]
            same_answer("kg_file", [(str(r), float(v)) for r, v in rows], reference)
            (cold if i == 0 else warm).seconds.append(seconds)
    return cold, warm


async def kg_files_runs(mesh: Mesh, runs: int, notes: int, needles: int) -> Measure:
    """The first page (50 files) of kg_files with a content regex over every note."""
    measure = Measure(f"kg_files first page, regex over {notes} files")
    arguments = {"namespace": NOTES_NS, "pattern": NEEDLE_PATTERN, "limit": 50}
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        for _ in range(runs):
            start = time.perf_counter()
            outcome = await call_tool(client, "kg_files", arguments)
            measure.seconds.append(time.perf_counter() - start)
            if outcome.is_error:
                raise BenchError(f"kg_files failed: {outcome.data}")
            page = outcome.data
    found = len(page["files"])
    measure.note = f"{found} found, filesScanned={page.get('filesScanned')}, stoppedEarly={page['stoppedEarly']}"
    if not page["stoppedEarly"] and found != min(needles, 50):
        raise BenchError(f"kg_files found {found} notes with the needle; {needles} hold it")
    return measure


# ---------------------------------------------------------------------------------------------
# The mesh
# ---------------------------------------------------------------------------------------------


def pick_binary(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit).resolve()
    release = REPO_ROOT / "target" / "release" / "kgmesh"
    return release if release.is_file() else REPO_ROOT / "target" / "debug" / "kgmesh"


def start_mesh(work: Path, binary: Path, csv_bytes: int) -> Mesh:
    """`kgmesh up` with the limits the CSV needs. A mesh that does not know those settings is
    reported, not worked around: the numbers would not be for the requested file."""
    needs: dict[str, str] = {}
    headroom = csv_bytes + MIB
    if csv_bytes > DEFAULT_UPLOAD_LIMIT:
        needs[LIMIT_ENV["upload"]] = str(headroom)
    if csv_bytes > DEFAULT_QUERY_LIMIT:
        needs[LIMIT_ENV["query"]] = str(headroom)
    saved = {key: os.environ.get(key) for key in needs}
    os.environ.update(needs)
    mesh = Mesh(work_dir=work / "mesh", binary=binary)
    try:
        mesh.start()
    except MeshError as err:
        mesh.stop()
        if needs and "unknown" in str(err).lower():
            raise BenchError(
                f"the CSV is {csv_bytes / MIB:.1f} MiB, over the defaults of kgmesh up (uploads "
                f"{DEFAULT_UPLOAD_LIMIT // MIB} MiB, SQL {DEFAULT_QUERY_LIMIT // MIB} MiB), and this kgmesh does not "
                f"accept {', '.join(needs)}; pass fewer --rows or use a kgmesh with those settings.\n{err}"
            ) from err
        raise
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return mesh


def ingest(mesh: Mesh, folder: Path, namespace: str) -> float:
    start = time.perf_counter()
    mesh.ingest(folder, namespace)
    return time.perf_counter() - start


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def print_table(measures: list[Measure]) -> None:
    width = max(len(m.name) for m in measures) + 2
    print(f"\n{'measure':<{width}}{'runs':>5}{'median ms':>12}{'p95 ms':>10}  notes")
    for m in measures:
        print(f"{m.name:<{width}}{len(m.seconds):>5}{m.median_ms():>12.1f}{m.p95_ms():>10.1f}  {m.note}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="CSV rows (1,000,000 is about 50 MB)")
    parser.add_argument("--notes", type=int, default=10_000, help="small files for the kg_files scan")
    parser.add_argument("--runs", type=int, default=7, help="timed runs per measure")
    parser.add_argument("--seed", type=int, default=20240628)
    parser.add_argument("--binary", help="kgmesh binary (default: target/release/kgmesh, else target/debug)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (inputs and mesh logs)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON to this file")
    args = parser.parse_args()
    if args.runs < 1 or args.rows < 1 or args.notes < NEEDLE_EVERY:
        parser.error(f"--runs and --rows must be positive and --notes at least {NEEDLE_EVERY}")
    if shutil.which("sqlite3") is None:
        print("bench-files needs the sqlite3 shell on PATH (apt-get install sqlite3)", file=sys.stderr)
        return 2
    duckdb = ensure_duckdb()
    binary = pick_binary(args.binary)
    work = Path(tempfile.mkdtemp(prefix="kgmesh-bench-files-"))
    mesh: Mesh | None = None
    try:
        csv_dir, notes_dir = work / "csv", work / "notes"
        csv_dir.mkdir()
        csv_path = csv_dir / "sales.csv"
        started = time.perf_counter()
        csv_bytes = generate_csv(csv_path, args.rows, args.seed)
        needles = generate_notes(notes_dir, args.notes, args.seed)
        print(
            f"inputs: sales.csv {args.rows:,} rows, {csv_bytes / 1e6:.1f} MB; {args.notes:,} notes, {needles} with "
            f"the needle ({time.perf_counter() - started:.1f} s)",
            flush=True,
        )
        print(f"kgmesh: {binary}", flush=True)
        mesh = start_mesh(work, binary, csv_bytes)
        print(f"ingest sales.csv: {ingest(mesh, csv_dir, CSV_NS):.1f} s", flush=True)
        print(f"ingest notes: {ingest(mesh, notes_dir, NOTES_NS):.1f} s", flush=True)

        # The reference answer, then each engine the same number of times.
        reference = duckdb_once(duckdb, csv_path)
        sqlite, _ = time_runs("sqlite3 shell, .import + query", args.runs, lambda: sqlite_once(csv_path), reference)
        duck, _ = time_runs("DuckDB, read_csv + query", args.runs, lambda: duckdb_once(duckdb, csv_path), reference)
        cold, warm = anyio.run(kg_file_runs, mesh, args.runs, reference)
        scan = anyio.run(kg_files_runs, mesh, args.runs, args.notes, needles)
        measures = [cold, warm, sqlite, duck, scan]
        print_table(measures)
        vs_sqlite = warm.median_ms() / sqlite.median_ms()
        vs_duck = warm.median_ms() / duck.median_ms()
        print(
            f"\nkg_file / sqlite3 = {vs_sqlite:.2f}x (goal < 1)   kg_file / DuckDB = {vs_duck:.2f}x (goal <= 2)"
            f"   first call: {cold.median_ms() / sqlite.median_ms():.2f}x sqlite3, "
            f"{cold.median_ms() / duck.median_ms():.2f}x DuckDB"
        )
        print(f"answer: {', '.join(f'{r} {v:,.2f}' for r, v in reference)}")
        print(
            f"build: {'release' if 'release' in binary.parts else 'debug'}; {os.cpu_count()} CPUs; DuckDB "
            f"{duckdb.__version__}; csv {csv_bytes / 1e6:.1f} MB"
        )
        if args.json:
            args.json.write_text(
                json.dumps(
                    {
                        "rows": args.rows,
                        "csvBytes": csv_bytes,
                        "notes": args.notes,
                        "binary": str(binary),
                        "measures": {
                            m.name: {
                                "seconds": m.seconds,
                                "medianMs": m.median_ms(),
                                "p95Ms": m.p95_ms(),
                                "note": m.note,
                            }
                            for m in measures
                        },
                        "ratios": {"kgFileOverSqlite3": vs_sqlite, "kgFileOverDuckdb": vs_duck},
                    },
                    indent=2,
                )
            )
        return 0
    except (BenchError, MeshError) as err:
        print(f"bench-files failed: {err}", file=sys.stderr)
        if mesh is not None and mesh.proc is not None:
            print(mesh.log_tail(30), file=sys.stderr)
        return 1
    finally:
        if mesh is not None:
            problems = mesh.stop()
            if problems:
                print("stopping the mesh: " + "; ".join(problems), file=sys.stderr)
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

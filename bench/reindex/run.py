#!/usr/bin/env python3
"""`make bench-reindex`: recovering a namespace from its stored files, timed against its ingest.

1. Starts `kgmesh up` (release build, MiniLM unless --provider none) in a fresh temp dir and
   ingests a folder (default ../shared/bench/docs-qa/docs, the Prometheus docs) with
   `kgmesh ingest`, timed: the baseline.
2. Searches a few questions, deletes the namespace's graph in FalkorDB (as a store lost without
   a backup would), checks that the same questions now find nothing, then runs
   `kgmesh file reindex --wait`, timed, and checks that they find the same top 5 again. The
   vectors were kept, so the chunks embedded and the stored vectors reused are counted too
   (the indexer's /metrics, read through the gateway of the one `up` process).
3. An edit: the file with the most bytes, one paragraph in its middle rewritten, ingested
   again, timed until indexed and counted; against the same edited text ingested as a new
   file of another namespace (every chunk embedded: vectors are never shared between
   namespaces), in the same run; and a copy of it under a new path in the namespace (a copied
   or moved file, which takes the vectors stored under the edited file).
4. Times the queueing alone: one `POST .../reindex` of the namespace, then the wait until no
   file is pending; and the same for --bulk small files in a namespace of their own, a page
   of 1,000 per call.
5. Prints each figure and the reindex / ingest ratio.

Not part of `make test`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests" / "python"))

import httpx2  # noqa: E402

from kgmesh_support import Mesh, call_ok, falkordb_port, graph_key, mcp_http, redis  # noqa: E402

NAMESPACE = "bench-reindex"
BULK_NAMESPACE = "bench-reindex-bulk"
FRESH_NAMESPACE = "bench-reindex-fresh"
QUESTIONS = [
    "How do I configure alerting rules?",
    "What is the difference between a gauge and a counter?",
    "How does remote write work?",
]


async def top_paths(mesh: Mesh) -> list[list[str]]:
    found = []
    async with mcp_http(mesh.mcp_url, mesh.admin_token) as client:
        for question in QUESTIONS:
            result = await call_ok(client, "kg_search", {"namespaces": [NAMESPACE], "query": question})
            found.append([hit["path"] for hit in result["results"][:5]])
    return found


def timed_cli(mesh: Mesh, *args: str) -> tuple[float, Any]:
    started = time.monotonic()
    done = mesh.run(*args, timeout=7200)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"`kgmesh {' '.join(args)}` exited {done.returncode}:\n{done.stderr[-3000:]}")
    return seconds, json.loads(done.stdout) if done.stdout.strip().startswith("{") else done.stdout


def wait_until_none_pending(mesh: Mesh, namespace: str) -> tuple[float, int, int]:
    """Seconds until no file of `namespace` is pending; files; failed files."""
    started = time.monotonic()
    headers = {"Authorization": f"Bearer {mesh.admin_token}"}
    with httpx2.Client(timeout=120) as http:
        while True:
            files: list[dict[str, Any]] = []
            cursor = None
            while True:
                params: dict[str, Any] = {"limit": 1000, "includeHidden": "true"}
                if cursor:
                    params["cursor"] = cursor
                page = http.get(f"{mesh.base_url}/api/v1/namespaces/{namespace}/files", headers=headers, params=params)
                page.raise_for_status()
                body = page.json()
                files += body["files"]
                cursor = body.get("nextCursor")
                if not cursor:
                    break
            if all(file["status"] != "pending" for file in files):
                failed = sum(file["status"] == "failed" for file in files)
                return time.monotonic() - started, len(files), failed
            time.sleep(0.2)


def embed_counters(mesh: Mesh) -> tuple[int, int]:
    """The indexer's chunks embedded and stored vectors reused, so far."""
    with httpx2.Client(timeout=30) as http:
        text = http.get(f"{mesh.base_url}/metrics").text
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("kgmesh_chunks_embedded_total", "kgmesh_chunk_vectors_reused_total"):
            values[name] = int(float(value))
    return values.get("kgmesh_chunks_embedded_total", 0), values.get("kgmesh_chunk_vectors_reused_total", 0)


def edited_copy(docs: Path, into: Path, as_new: bool) -> str:
    """The largest file of `docs` with the middle one of its paragraphs rewritten, written under
    `into` at its own relative path (an edit) or at a new one (`as_new`); the path used."""
    largest = max((p for p in docs.rglob("*.md")), key=lambda p: p.stat().st_size)
    paragraphs = largest.read_text().split("\n\n")
    prose = [i for i, p in enumerate(paragraphs) if p.strip() and not p.lstrip().startswith(("#", "`", "|", "-"))]
    middle = prose[len(prose) // 2]
    paragraphs[middle] = paragraphs[middle].rstrip() + " This sentence was added by the edit benchmark."
    relative = largest.relative_to(docs)
    if as_new:
        relative = relative.with_name(f"edited-copy-{relative.name}")
    target = into / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n\n".join(paragraphs))
    return str(relative)


def queue_all(mesh: Mesh, namespace: str) -> tuple[int, list[float]]:
    """Queues every file of `namespace` a page at a time; files queued and each call's seconds."""
    headers = {"Authorization": f"Bearer {mesh.admin_token}"}
    queued, calls, cursor = 0, [], ""
    with httpx2.Client(timeout=120) as http:
        while True:
            started = time.monotonic()
            answer = http.post(
                f"{mesh.base_url}/api/v1/namespaces/{namespace}/reindex", headers=headers, json={"cursor": cursor}
            )
            calls.append(time.monotonic() - started)
            answer.raise_for_status()
            body = answer.json()
            queued += body["queued"]
            cursor = body.get("nextCursor") or ""
            if not cursor:
                return queued, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=Path, default=REPO_ROOT.parent / "shared" / "bench" / "docs-qa" / "docs")
    parser.add_argument("--bulk", type=int, default=2000, help="small files in the second namespace (0: none)")
    parser.add_argument("--provider", choices=["minilm", "none"], default="minilm")
    parser.add_argument("--binary", type=Path, default=REPO_ROOT / "target" / "release" / "kgmesh")
    args = parser.parse_args()
    if not args.docs.is_dir():
        sys.exit(f"no folder at {args.docs}")

    with tempfile.TemporaryDirectory(prefix="kgmesh-bench-reindex-") as tmp:
        work = Path(tmp)
        mesh = Mesh(
            work_dir=work / "mesh",
            binary=args.binary,
            env={"KGMESH_EMBEDDING__PROVIDER": args.provider, "RUST_LOG": "warn"},
        )
        mesh.work_dir.mkdir()
        mesh.start()
        try:
            ingest_s, ingested = timed_cli(mesh, "ingest", str(args.docs), "--namespace", NAMESPACE)
            before = asyncio.run(top_paths(mesh))
            port = falkordb_port(mesh)
            chunks = redis(port, "GRAPH.QUERY", graph_key(NAMESPACE), "MATCH (c:Chunk) RETURN count(c)")[1][0][0]
            redis(port, "GRAPH.DELETE", graph_key(NAMESPACE))
            lost = asyncio.run(top_paths(mesh))
            embedded_before, reused_before = embed_counters(mesh)
            reindex_s, summary = timed_cli(mesh, "file", "reindex", "--namespace", NAMESPACE, "--wait")
            after = asyncio.run(top_paths(mesh))
            chunks_after = redis(
                port, "GRAPH.QUERY", graph_key(NAMESPACE), "MATCH (c:Chunk) RETURN count(c)"
            )[1][0][0]
            embedded_after, reused_after = embed_counters(mesh)

            edits = {}
            steps = [
                ("edit of", False, NAMESPACE),
                ("the edited text as a new file of another namespace,", False, FRESH_NAMESPACE),
                ("the edited text copied to a new path,", True, NAMESPACE),
            ]
            for label, as_new, namespace in steps:
                folder = work / f"step-{len(edits)}"
                relative = edited_copy(args.docs, folder, as_new)
                counted = embed_counters(mesh)
                started = time.monotonic()
                timed_cli(mesh, "ingest", str(folder), "--namespace", namespace)
                wait_until_none_pending(mesh, namespace)
                seconds = time.monotonic() - started
                now = embed_counters(mesh)
                edits[label] = (relative, seconds, now[0] - counted[0], now[1] - counted[1])

            queued, calls = queue_all(mesh, NAMESPACE)
            drained = wait_until_none_pending(mesh, NAMESPACE)

            print(f"provider {args.provider}, {args.docs}")
            print(f"ingest: {ingested['indexed']} files, {chunks} chunks in {ingest_s:.1f} s")
            print(f"graph deleted: {sum(len(paths) for paths in lost)} results for {len(QUESTIONS)} questions")
            print(
                f"file reindex --wait: {reindex_s:.1f} s ({reindex_s / ingest_s:.2f}x the ingest); "
                f"{summary['indexed']} indexed, {len(summary['failed'])} failed; {chunks_after} chunks; "
                f"same top 5 for every question: {before == after}"
            )
            if args.provider != "none":
                print(
                    f"reindex: {embedded_after - embedded_before} chunks embedded, "
                    f"{reused_after - reused_before} stored vectors reused"
                )
                for label, (relative, seconds, embedded, reused) in edits.items():
                    print(f"{label} {relative}: {seconds:.2f} s to indexed; {embedded} embedded, {reused} reused")
                fresh = edits[steps[1][0]][1]
                print(
                    f"edit / new file: {edits[steps[0][0]][1] / fresh:.2f}x the time; "
                    f"copy / new file: {edits[steps[2][0]][1] / fresh:.2f}x"
                )
            print(
                f"queueing {queued} files: {sum(calls):.3f} s in {len(calls)} call(s); "
                f"indexed again {drained[0]:.1f} s later ({drained[2]} failed)"
            )

            if args.bulk:
                bulk = work / "bulk"
                for i in range(args.bulk):
                    path = bulk / f"f{i // 100:03d}" / f"note-{i:05d}.md"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(f"# Note {i}\n\nA short note, number {i}, about the quarry ledger.\n")
                bulk_ingest_s, _ = timed_cli(mesh, "ingest", str(bulk), "--namespace", BULK_NAMESPACE)
                queued, calls = queue_all(mesh, BULK_NAMESPACE)
                drained = wait_until_none_pending(mesh, BULK_NAMESPACE)
                print(
                    f"bulk: ingest of {args.bulk} small files {bulk_ingest_s:.1f} s; queueing {queued}: "
                    f"{sum(calls):.2f} s in {len(calls)} call(s) ({', '.join(f'{c:.2f}' for c in calls)} s); "
                    f"indexed again {drained[0]:.1f} s later ({drained[0] / bulk_ingest_s:.2f}x the ingest, "
                    f"{drained[2]} failed)"
                )
        finally:
            problems = mesh.stop()
            if problems:
                print("stopping the mesh:", "; ".join(problems), file=sys.stderr)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()

"""The vector lane end to end: its own `kgmesh up` with the default embedder (all-MiniLM-L6-v2
from the wheel, run in process), `examples/handbook` ingested, kg_search over MCP with the
official SDK.

A paraphrased question that shares no content word with its answer is found by the vector
lane alone; a reader whose grant stops at one folder never gets a chunk from another folder
through it; a folder filter reports how the candidate pool widened; and a paragraph pasted into
four files comes back as one result listing the readable copies.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from kgmesh_support import EXAMPLES_DIR, Mesh, MeshError, call_ok, expect_rejected, kgmesh_bin, mcp_http

pytestmark = pytest.mark.anyio

NAMESPACE = "vectors"
# "bees" and "honey" are in offices.md; none of these words is.
PARAPHRASE = "When are the insect colonies on the roof inspected?"
# Pasted under the same heading into four files with different titles and other sections.
DRILL = (
    "Twice a year the evacuation drill starts at the third bell. Leave by the nearest stairwell, "
    "assemble at the bicycle shelter on the north lot, and report to your floor warden by name."
)
DRILL_COPIES = ["handbook/security/drill.md", "notices/lisbon.md", "notices/oslo.md", "notices/porto.md"]


@pytest.fixture(scope="module")
def vector_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    work = tmp_path_factory.mktemp("kgmesh-vectors")
    corpus = work / "corpus"
    shutil.copytree(EXAMPLES_DIR / "handbook", corpus / "handbook")
    for path in DRILL_COPIES:
        title = Path(path).stem.capitalize()
        file = corpus / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(
            f"# {title} office notices\n\n## Fire drill\n\n{DRILL}\n\n"
            f"## Kitchen\n\nThe {title} kitchen closes at four; label what you leave in the fridge.\n"
        )
    mesh = Mesh(work_dir=work / "mesh", binary=kgmesh_bin())
    try:
        mesh.start()
        mesh.ingest(corpus, NAMESPACE)
    except MeshError as err:
        problems = mesh.stop()
        pytest.fail(f"{err}\n{problems}", pytrace=False)
    yield mesh
    mesh.stop()


def paths(result: dict) -> list[str]:
    return [hit["path"] for hit in result["results"]]


async def test_a_paraphrase_is_found_by_the_vector_lane(vector_mesh: Mesh) -> None:
    async with mcp_http(vector_mesh.mcp_url, vector_mesh.admin_token) as client:
        vector = await call_ok(
            client, "kg_search", {"query": PARAPHRASE, "namespaces": [NAMESPACE], "lanes": ["vector"], "topK": 3}
        )
        lanes = {lane["lane"]: lane for lane in vector["trace"]["lanes"]}
        assert lanes["vector"]["ok"], vector["trace"]
        assert paths(vector)[0] == "handbook/offices.md", paths(vector)
        assert "beehive" in vector["results"][0]["text"]
        widening = vector["trace"]["vectorWidening"][0]
        assert widening["rounds"] == 1 and not widening["capReached"], widening

        # Fused with the other lanes, the vector-only answer still makes the default page.
        fused = await call_ok(client, "kg_search", {"query": PARAPHRASE, "namespaces": [NAMESPACE]})
        assert "handbook/offices.md" in paths(fused), paths(fused)


async def test_folder_filters_widen_and_never_leak(vector_mesh: Mesh, tmp_path: Path) -> None:
    principal = vector_mesh.create_principal("vector-reader", "user")
    token, _ = vector_mesh.create_pat(principal, "vector-reader-pat")
    vector_mesh.grant(principal, NAMESPACE, "read", prefix="handbook/security/")
    async with mcp_http(vector_mesh.mcp_url, token) as client:
        result = await call_ok(
            client, "kg_search", {"query": PARAPHRASE, "namespaces": [NAMESPACE], "lanes": ["vector"], "topK": 8}
        )
        assert result["results"], "the reader's own folder still answers"
        assert all(p.startswith("handbook/security/") for p in paths(result)), paths(result)
    async with mcp_http(vector_mesh.mcp_url, vector_mesh.admin_token) as client:
        filtered = await call_ok(
            client,
            "kg_search",
            {
                "query": PARAPHRASE,
                "namespaces": [NAMESPACE],
                "lanes": ["vector"],
                "filters": {"folderPrefix": "handbook/security/"},
            },
        )
        assert filtered["results"]
        assert all(p.startswith("handbook/security/") for p in paths(filtered)), paths(filtered)
        assert filtered["trace"]["vectorWidening"][0]["pool"] >= 8


async def test_similar_files_come_from_file_vectors_and_respect_access(vector_mesh: Mesh) -> None:
    async with mcp_http(vector_mesh.mcp_url, vector_mesh.admin_token) as client:
        hit = (
            await call_ok(
                client, "kg_search", {"query": PARAPHRASE, "namespaces": [NAMESPACE], "lanes": ["vector"], "topK": 1}
            )
        )["results"][0]
        # Every package names similar files (never itself), each readable and ranked.
        similar = hit["similarFiles"]
        assert similar, hit
        assert all(s["path"] != hit["path"] for s in similar), similar
        hop = await call_ok(
            client, "kg_hop", {"namespace": NAMESPACE, "fromKey": hit["chunkKey"], "kind": "similar", "limit": 3}
        )
        hop_paths = [p["path"] for p in hop["packages"]]
        assert hop_paths and hit["path"] not in hop_paths, hop
        assert len(set(hop_paths)) == len(hop_paths), "one package per similar file"
        assert hop["total"] >= len(hop_paths)

    principal = vector_mesh.create_principal("similar-reader", "user")
    token, _ = vector_mesh.create_pat(principal, "similar-reader-pat")
    vector_mesh.grant(principal, NAMESPACE, "read", prefix="handbook/security/")
    async with mcp_http(vector_mesh.mcp_url, token) as client:
        result = await call_ok(
            client, "kg_search", {"query": PARAPHRASE, "namespaces": [NAMESPACE], "lanes": ["vector"], "topK": 8}
        )
        for package in result["results"]:
            for other in package["similarFiles"]:
                assert other["path"].startswith("handbook/security/"), other
            hop = await call_ok(
                client, "kg_hop", {"namespace": NAMESPACE, "fromKey": package["chunkKey"], "kind": "similar"}
            )
            assert all(p["path"].startswith("handbook/security/") for p in hop["packages"]), hop


def drill_results(result: dict) -> list[dict]:
    return [hit for hit in result["results"] if "evacuation drill" in hit["text"]]


async def test_copies_of_a_paragraph_fold_into_one_result(vector_mesh: Mesh) -> None:
    question = {"query": "Where do we assemble during the evacuation drill?", "namespaces": [NAMESPACE]}
    async with mcp_http(vector_mesh.mcp_url, vector_mesh.admin_token) as client:
        # Each lane folds the copies on its own (the vector lane by the hash in its payload),
        # and so does their fusion.
        for lanes in (["fulltext"], ["vector"], None):
            args = question | ({"lanes": lanes} if lanes else {})
            result = await call_ok(client, "kg_search", args)
            drills = drill_results(result)
            assert len(drills) == 1, (lanes, paths(result))
            folded = drills[0]["duplicates"]
            assert folded["count"] == 3, folded
            listed = sorted([drills[0]["path"]] + [c["path"] for c in folded["copies"]])
            assert listed == DRILL_COPIES, folded
            assert all(c["chunkKey"] and c["fileId"] for c in folded["copies"]), folded
            assert result["trace"]["duplicatesCollapsed"][0]["chunks"] >= 3, result["trace"]
            # The other results are not copies of one another.
            assert len({hit["text"] for hit in result["results"]}) == len(result["results"])

        apart = await call_ok(client, "kg_search", question | {"ranking": {"collapseDuplicates": False}})
        assert sorted(hit["path"] for hit in drill_results(apart)) == DRILL_COPIES, paths(apart)
        assert all("duplicates" not in hit for hit in apart["results"])
        assert "duplicatesCollapsed" not in apart["trace"]

        await expect_rejected(
            client, "kg_search", question | {"ranking": {"collapseDuplicates": "yes"}}, {"invalid_argument"}
        )

    # A reader of handbook/security/ gets its copy, and is not told where the others are.
    principal = vector_mesh.create_principal("drill-reader", "user")
    token, _ = vector_mesh.create_pat(principal, "drill-reader-pat")
    vector_mesh.grant(principal, NAMESPACE, "read", prefix="handbook/security/")
    async with mcp_http(vector_mesh.mcp_url, token) as client:
        result = await call_ok(client, "kg_search", question)
        drills = drill_results(result)
        assert [hit["path"] for hit in drills] == ["handbook/security/drill.md"], paths(result)
        assert "duplicates" not in drills[0], drills[0]["duplicates"]

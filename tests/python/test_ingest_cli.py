"""`kgmesh ingest` over a folder where some files cannot go in: each of those is reported with
what to change, every other file is still uploaded and indexed, and the exit code is 3.

One refused upload used to stop the whole ingest at that file, leaving the files after it (in
upload order) out and unreported. A file of a type kgmesh reads no text from (an image) is not
a failure: it is stored without indexing, and running again queues nothing for it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from kgmesh_support import Mesh, Principal

# The gateway's default `max_upload_bytes` (32 MiB); one byte more is refused with 413.
DEFAULT_MAX_UPLOAD_BYTES = 32 * 1024 * 1024


def ingest_json(
    mesh: Mesh, folder: Path, namespace: str, *extra: str, token: str | None = None
) -> tuple[int, dict]:
    done = mesh.run("ingest", str(folder), "--namespace", namespace, *extra, token=token, timeout=300)
    try:
        summary = json.loads(done.stdout)
    except json.JSONDecodeError as err:
        raise AssertionError(f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr[-3000:]}") from err
    return done.returncode, summary


def indexed_paths(mesh: Mesh, namespace: str) -> dict[str, str]:
    listed = mesh.cli("file", "list", "--namespace", namespace)
    return {file["path"]: file["status"] for file in listed["files"]}


def test_files_that_cannot_go_in_are_reported_and_the_rest_are_indexed(mesh: Mesh, tmp_path: Path) -> None:
    namespace = "ingest-partial"
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a-first.md").write_text("# First\n\nThe amber lighthouse keeps its lamp lit.\n")
    # Too large for the gateway: refused with 413 before anything is stored.
    with open(folder / "b-huge.txt", "wb") as huge:
        huge.truncate(DEFAULT_MAX_UPLOAD_BYTES + 1)
    # Not a UTF-8 name: no kgmesh path can hold it.
    with open(os.path.join(os.fsencode(folder), b"c-bad\xffname.md"), "wb") as bad:
        bad.write(b"# Bad name\n")
    (folder / "d-blob.bin").write_bytes(bytes(range(256)) * 4)
    (folder / "z-last.md").write_text("# Last\n\nThe cobalt harbour closes at dusk.\n")

    code, summary = ingest_json(mesh, folder, namespace)
    assert code == 3, (code, summary)
    failed = {entry["path"]: entry["reason"] for entry in summary["failed"]}
    assert sorted(failed) == ["b-huge.txt", "c-bad\ufffdname.md"], summary
    assert failed["b-huge.txt"].startswith("refused: PAYLOAD_TOO_LARGE"), failed
    assert "not UTF-8" in failed["c-bad\ufffdname.md"] and "rename" in failed["c-bad\ufffdname.md"], failed
    assert (summary["indexed"], summary["stored"]) == (2, 1), summary

    listed = mesh.cli("file", "list", "--namespace", namespace)["files"]
    statuses = {file["path"]: file["status"] for file in listed}
    assert statuses["a-first.md"] == statuses["z-last.md"] == "indexed", statuses
    assert statuses["d-blob.bin"] == "stored", statuses
    [blob] = [file for file in listed if file["path"] == "d-blob.bin"]
    assert "unsupported file type `application/octet-stream`" in blob["statusReason"], blob
    assert "b-huge.txt" not in statuses, statuses

    # The same folder again: the good files and the stored one are unchanged (nothing is
    # queued again), the same two are reported.
    code, again = ingest_json(mesh, folder, namespace)
    assert code == 3, (code, again)
    assert (again["unchanged"], again["retried"], again["stored"]) == (3, 0, 1), again
    assert sorted(e["path"] for e in again["failed"]) == sorted(failed), again


def test_a_writer_of_one_folder_uploads_that_folder_and_hears_why_not_the_rest(
    mesh: Mesh, make_principal: Callable[..., Principal], tmp_path: Path
) -> None:
    namespace = "ingest-folder-writer"
    mesh.cli("ns", "create", namespace)
    writer = make_principal("team-writer")
    mesh.grant(writer.id, namespace, "write", prefix="team/")
    # A non-admin lists the namespaces it may read, and only those.
    listed = mesh.cli("ns", "list", token=writer.token)
    assert [entry["name"] for entry in listed["namespaces"]] == [namespace], listed
    folder = tmp_path / "corpus"
    for path in ("other/a.md", "team/b.md", "zz/c.md"):
        file = folder / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(f"# {path}\n\nNotes kept in {path}.\n")

    code, summary = ingest_json(mesh, folder, namespace, token=writer.token)
    assert code == 3, (code, summary)
    failed = {entry["path"]: entry["reason"] for entry in summary["failed"]}
    assert sorted(failed) == ["other/a.md", "zz/c.md"], summary
    assert all(reason.startswith("refused: permission_denied") for reason in failed.values()), failed
    assert summary["indexed"] == 1, summary
    assert indexed_paths(mesh, namespace) == {"team/b.md": "indexed"}


def test_a_writer_hears_what_to_ask_for_when_the_namespace_is_missing(
    mesh: Mesh, make_principal: Callable[..., Principal], tmp_path: Path
) -> None:
    writer = make_principal("no-namespace-writer")
    (tmp_path / "a.md").write_text("# A\n\nText.\n")
    done = mesh.run("ingest", str(tmp_path), "--namespace", "ingest-never-created", token=writer.token)
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "`ingest-never-created` does not exist or this token may not read it" in done.stderr, done.stderr
    assert "kgmesh ns create ingest-never-created" in done.stderr, done.stderr


def write_tree(root: Path, files: dict[str, str]) -> None:
    for path, text in files.items():
        file = root / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text)


def test_into_and_delete_keep_a_namespace_folder_in_step_with_a_local_folder(
    mesh: Mesh, make_principal: Callable[..., Principal], tmp_path: Path
) -> None:
    namespace = "ingest-mirror"
    outside = tmp_path / "outside"
    write_tree(outside, {"keep.md": "# Keep\n\nOutside the mirrored folder.\n"})
    mesh.ingest(outside, namespace)

    docs = tmp_path / "docs"
    write_tree(
        docs,
        {
            "a.md": "# A\n\nThe amber lighthouse.\n",
            "c.md": "# C\n\nThe cobalt harbour.\n",
            "sub/b.md": "# B\n\nThe bronze bell.\n",
        },
    )
    code, first = ingest_json(mesh, docs, namespace, "--into", "/docs/", "--delete")
    assert code == 0 and first["deleted"] == [] and first["indexed"] == 3, first
    mirrored = ["docs/a.md", "docs/c.md", "docs/sub/b.md", "keep.md"]
    assert indexed_paths(mesh, namespace) == dict.fromkeys(mirrored, "indexed")

    # The folder loses two files and gains one: the namespace follows, outside docs/ untouched.
    (docs / "c.md").unlink()
    (docs / "sub" / "b.md").unlink()
    write_tree(docs, {"d.md": "# D\n\nThe damask curtain.\n"})
    code, second = ingest_json(mesh, docs, namespace, "--into", "docs", "--delete")
    assert code == 0, second
    assert second["deleted"] == ["docs/c.md", "docs/sub/b.md"], second
    assert (second["unchanged"], second["uploaded"]) == (1, 1), second
    assert indexed_paths(mesh, namespace) == dict.fromkeys(["docs/a.md", "docs/d.md", "keep.md"], "indexed")

    # A reader of the whole namespace who may write only docs/sub/ mirrors that folder: the
    # files it may not delete are reported, and nothing of them is lost.
    writer = make_principal("sub-writer")
    mesh.grant(writer.id, namespace, "read")
    mesh.grant(writer.id, namespace, "write", prefix="docs/sub/")
    sub = tmp_path / "sub"
    write_tree(sub, {"sub/e.md": "# E\n\nThe emerald gate.\n"})
    code, third = ingest_json(mesh, sub, namespace, "--into", "docs", "--delete", token=writer.token)
    assert code == 3, third
    assert third["deleted"] == [], third
    refused = {entry["path"]: entry["reason"] for entry in third["failed"]}
    assert sorted(refused) == ["docs/a.md", "docs/d.md"], third
    assert all(reason.startswith("not deleted: permission_denied") for reason in refused.values()), refused
    assert indexed_paths(mesh, namespace) == dict.fromkeys(
        ["docs/a.md", "docs/d.md", "docs/sub/e.md", "keep.md"], "indexed"
    )


def test_into_and_delete_refuse_what_they_cannot_mean(mesh: Mesh, tmp_path: Path) -> None:
    write_tree(tmp_path, {"one.md": "# One\n"})
    for extra, problem in (
        (["--into", "docs/../secrets"], "without empty, `.` or `..` parts"),
        (["--into", "a//b"], "without empty, `.` or `..` parts"),
    ):
        done = mesh.run("ingest", str(tmp_path), "--namespace", "ingest-refusals", *extra)
        assert done.returncode == 1 and problem in done.stderr, (extra, done.returncode, done.stderr)
    done = mesh.run("ingest", str(tmp_path / "one.md"), "--namespace", "ingest-refusals", "--delete")
    assert done.returncode == 1 and "--delete needs a folder" in done.stderr, done.stderr
    listed = mesh.cli("ns", "list")
    assert "ingest-refusals" not in [entry["name"] for entry in listed["namespaces"]], listed


def test_excluded_files_are_neither_uploaded_nor_deleted(mesh: Mesh, tmp_path: Path) -> None:
    namespace = "ingest-exclude"
    docs = tmp_path / "docs"
    write_tree(
        docs,
        {
            "guide.md": "# Guide\n\nThe saffron ferry.\n",
            "drafts/idea.md": "# Idea\n\nThe umber kite.\n",
        },
    )
    (docs / "img").mkdir()
    (docs / "img" / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    # Without --exclude the image is stored without indexing (kgmesh reads no text from PNG).
    code, first = ingest_json(mesh, docs, namespace)
    assert code == 0 and first["failed"] == [] and first["stored"] == 1, first

    # Excluded, the image is not sent and the run is clean.
    code, second = ingest_json(mesh, docs, namespace, "--exclude", "*.png")
    assert code == 0 and second["excluded"] == 1 and second["failed"] == [], second

    # The draft leaves the folder but is excluded: --delete keeps it; the image stored by the
    # first run is excluded too, so it stays as well.
    (docs / "drafts" / "idea.md").unlink()
    code, third = ingest_json(mesh, docs, namespace, "--delete", "--exclude", "*.png", "--exclude", "drafts/**")
    assert code == 0 and third["deleted"] == [] and third["excluded"] == 1, third
    assert sorted(indexed_paths(mesh, namespace)) == ["drafts/idea.md", "guide.md", "img/logo.png"]

    # Without the draft pattern, --delete takes it.
    code, fourth = ingest_json(mesh, docs, namespace, "--delete", "--exclude", "*.png")
    assert code == 0 and fourth["deleted"] == ["drafts/idea.md"], fourth

    done = mesh.run("ingest", str(docs), "--namespace", namespace, "--exclude", "a[")
    assert done.returncode == 1 and "--exclude `a[` is not a glob" in done.stderr, done.stderr


def test_hidden_entries_are_left_out_counted_and_kept_by_delete(mesh: Mesh, tmp_path: Path) -> None:
    """A folder's hidden entries (`.git`, `.env`) are not read, so `--delete` must not take the
    namespace's files of those names: it once deleted a `.notes.md` uploaded on its own while
    the folder still held it."""
    namespace = "ingest-hidden"
    docs = tmp_path / "docs"
    write_tree(
        docs,
        {
            "guide.md": "# Guide\n\nThe vermilion sledge.\n",
            ".notes.md": "# Notes\n\nThe hidden orchard.\n",
            ".github/workflow.md": "# Workflow\n\nThe hidden mill.\n",
            "sub/.draft.md": "# Draft\n\nThe hidden quarry.\n",
        },
    )
    # One hidden file uploaded on its own: a single file is taken as named.
    code, single = ingest_json(mesh, docs / ".notes.md", namespace)
    assert code == 0 and single["uploaded"] == 1 and single["hidden"] == 0, single

    code, plan = ingest_json(mesh, docs, namespace, "--delete", "--dry-run")
    assert code == 0 and plan["delete"] == [] and plan["hidden"] == 3, plan
    code, first = ingest_json(mesh, docs, namespace, "--delete")
    assert code == 0 and first["deleted"] == [] and first["uploaded"] == 1 and first["hidden"] == 3, first
    assert sorted(indexed_paths(mesh, namespace)) == [".notes.md", "guide.md"]
    done = mesh.run("ingest", str(docs), "--namespace", namespace, "--delete", json_output=False)
    assert done.returncode == 0, done.stderr
    assert "3 hidden file(s) or folder(s) (named `.*`) left out, --hidden takes them in" in done.stdout, done.stdout

    # --hidden takes them in, and then --delete mirrors them like any other file.
    code, second = ingest_json(mesh, docs, namespace, "--hidden", "--delete")
    assert code == 0 and second["uploaded"] == 2 and second["hidden"] == 0, second
    assert sorted(indexed_paths(mesh, namespace)) == [".github/workflow.md", ".notes.md", "guide.md", "sub/.draft.md"]
    (docs / ".notes.md").unlink()
    code, third = ingest_json(mesh, docs, namespace, "--hidden", "--delete")
    assert code == 0 and third["deleted"] == [".notes.md"], third


def test_a_dry_run_says_what_would_change_and_changes_nothing(mesh: Mesh, tmp_path: Path) -> None:
    namespace = "ingest-dry-run"
    docs = tmp_path / "docs"
    write_tree(docs, {"a.md": "# A\n\nThe azure kettle.\n", "b.md": "# B\n\nThe beryl lantern.\n", "k.md": "# K\n"})
    mesh.ingest(docs, namespace)
    before = mesh.cli("file", "list", "--namespace", namespace)["files"]

    write_tree(docs, {"a.md": "# A\n\nThe azure kettle, mended.\n", "c.md": "# C\n\nThe citrine gate.\n"})
    (docs / "b.md").unlink()
    code, plan = ingest_json(mesh, docs, namespace, "--dry-run", "--delete")
    assert code == 0, plan
    assert plan["dryRun"] is True and plan["namespaceExists"] is True, plan
    assert (plan["upload"], plan["unchanged"], plan["delete"]) == (["a.md", "c.md"], 1, ["b.md"]), plan
    assert mesh.cli("file", "list", "--namespace", namespace)["files"] == before, "a dry run changed the namespace"

    # A namespace that does not exist yet: every file is new, and the namespace is not made.
    code, plan = ingest_json(mesh, docs, "ingest-dry-run-new", "--dry-run")
    assert code == 0 and plan["namespaceExists"] is False and plan["upload"] == ["a.md", "c.md", "k.md"], plan
    listed = mesh.cli("ns", "list")
    assert "ingest-dry-run-new" not in [entry["name"] for entry in listed["namespaces"]], listed

    # A name the server would refuse is refused before anything is planned.
    done = mesh.run("ingest", str(docs), "--namespace", "Bad NS", "--dry-run")
    assert done.returncode == 1 and "invalid namespace `Bad NS`" in done.stderr, done.stderr


def test_content_going_back_to_an_earlier_version_or_coming_back_after_a_delete_is_indexed(
    mesh: Mesh, tmp_path: Path
) -> None:
    """The same content is the same version: its change event used to carry the same message
    id, which JetStream dropped as a duplicate within its 2 minute window, leaving the file
    pending for good and the ingest waiting for it."""
    namespace = "ingest-revert"
    docs = tmp_path / "docs"
    first = {"x.md": "# Doc\n\nThe alabaster heron.\n", "y.md": "# Y\n\nThe cobalt ferry.\n"}
    write_tree(docs, first)
    mesh.ingest(docs, namespace)
    write_tree(docs, {"x.md": "# Doc\n\nThe vermilion stork.\n"})
    mesh.ingest(docs, namespace)
    mesh.cli("file", "delete", "--namespace", namespace, "--path", "y.md")

    # Back to the first content within seconds, and y.md again after its delete.
    write_tree(docs, first)
    code, summary = ingest_json(mesh, docs, namespace, "--timeout-secs", "60")
    assert code == 0, summary
    assert indexed_paths(mesh, namespace) == {"x.md": "indexed", "y.md": "indexed"}, summary


def test_a_name_the_server_would_change_is_skipped_not_uploaded_under_another(mesh: Mesh, tmp_path: Path) -> None:
    """Tab and newline used to vanish from a name in the upload URL, white space around it was
    trimmed and a backslash became a folder: the file landed under another name (overwriting
    `back/slash.md`), and `--delete` then removed that name as one the folder no longer held."""
    namespace = "ingest-odd-names"
    docs = tmp_path / "docs"
    write_tree(docs, {"ok.md": "# Ok\n\nThe saffron bridge.\n", "back/slash.md": "# Real\n\nThe umber tower.\n"})
    odd = ["new\nline.md", "tab\tname.md", " lead.md", "back\\slash.md"]
    # White space inside a path is kept by the server: such a name goes in as it is.
    (docs / "sub").mkdir()
    (docs / "sub" / " inner.md").write_text("# Inner\n\nThe jade kiosk.\n")
    for name in odd:
        (docs / name).write_text("# Odd\n\nThe mauve canal.\n")

    code, summary = ingest_json(mesh, docs, namespace, "--delete")
    assert code == 3, summary
    failed = {entry["path"]: entry["reason"] for entry in summary["failed"]}
    assert sorted(failed) == sorted(name.encode("unicode_escape").decode() for name in odd), failed
    assert "control characters" in failed["new\\nline.md"] and "rename it" in failed["new\\nline.md"], failed
    assert "white space" in failed[" lead.md"], failed
    assert "separator" in failed["back\\\\slash.md"], failed
    stored = {"back/slash.md": "indexed", "ok.md": "indexed", "sub/ inner.md": "indexed"}
    assert indexed_paths(mesh, namespace) == stored, summary

    # Again with --delete: nothing the folder holds is deleted, nothing is uploaded twice.
    code, again = ingest_json(mesh, docs, namespace, "--delete")
    assert code == 3 and again["deleted"] == [] and again["unchanged"] == 3, again
    assert indexed_paths(mesh, namespace) == stored, again


def test_an_ingest_stopped_by_an_outage_exits_75_and_says_to_run_it_again(tmp_path: Path) -> None:
    """A gateway answering 503 (a service behind it away) through the retries: temporary (75,
    as `approvals approve` answers one), not a refusal (1)."""
    import subprocess
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from kgmesh_support import REPO_ROOT, kgmesh_bin

    class Away(BaseHTTPRequestHandler):
        def answer(self) -> None:
            body = b'{"code":"unavailable","message":"the files service is unavailable; retry shortly","retryable":true}'
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PUT = do_POST = answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Away)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        (tmp_path / "a.md").write_text("# A\n\nText.\n")
        done = subprocess.run(
            [str(kgmesh_bin()), "ingest", str(tmp_path), "--namespace", "away",
             "--url", f"http://127.0.0.1:{server.server_address[1]}", "--token", "kg_pat_unused"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False,
        )
    finally:
        server.shutdown()
    assert done.returncode == 75, (done.returncode, done.stderr)
    assert "run the same ingest again to resume" in done.stderr, done.stderr

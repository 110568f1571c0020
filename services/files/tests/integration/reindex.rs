//! Indexing files again from their stored content, on SQLite and PostgreSQL with real NATS.
//! A reindex queues the current version of each file under a folder (hidden files too, never
//! deleted ones), a page per call, marks each pending and publishes an upsert marked as a
//! rebuild under a message id of its own, so the stream keeps it beside the version's first
//! upsert; `failed_only` takes the failed files alone. It needs admin on the folder. An upload
//! of the same content over a failed version queues that version again (the retry its reason
//! asks for); over an indexed one it changes nothing. An outcome answering an earlier request
//! than the file's newest leaves the status alone. With the event bus down, a reindex fails as
//! unavailable and leaves every status as it was.

use kg_common::error::{ErrorCode, ErrorExt};
use kg_files::FilesService;
use kg_proto::v1::{
    CallerContext, FileIndexed, FileInfo, FileStatus, Permission, ReindexRequest, ReindexResponse,
};

use crate::common::{Env, changes, env, writer};

const NS: &str = "rebuild";

/// A caller with admin on `prefixes` of the namespace (and write everywhere).
fn admin_of(prefixes: &[&str]) -> CallerContext {
    let mut caller = writer(NS);
    caller.access[0].permission = Permission::Admin as i32;
    caller.access[0].admin_prefixes = prefixes.iter().map(|p| (*p).to_owned()).collect();
    caller
}

async fn put(files: &FilesService, path: &str, body: &str) -> FileInfo {
    files
        .upload(&admin_of(&[""]), NS, path, body.as_bytes(), "")
        .await
        .unwrap()
        .file
        .unwrap()
}

/// Applies an outcome of `file`'s version answering the request to index it made at
/// `answers_request_at_ms` (0: the upload's own); whether the files service took it.
async fn report(
    files: &FilesService,
    file: &FileInfo,
    status: FileStatus,
    reason: &str,
    answers_request_at_ms: i64,
) -> bool {
    let event = FileIndexed {
        namespace: NS.into(),
        file_id: file.file_id.clone(),
        version_id: file.version_id.clone(),
        status: status as i32,
        reason: reason.into(),
        chunk_count: 3,
        rebuild_at_ms: answers_request_at_ms,
        ..Default::default()
    };
    files.apply_indexed(&event).await.unwrap()
}

/// The newest request to index `file` again, as the indexer reads it off the stream.
async fn newest_request(js: &async_nats::jetstream::Context, file: &FileInfo) -> i64 {
    let events = changes(js, NS, &file.file_id).await;
    events.iter().map(|e| e.rebuild_at_ms).max().unwrap_or(0)
}

/// What the indexer reports once it has handled the file's newest request.
async fn set_status(
    files: &FilesService,
    js: &async_nats::jetstream::Context,
    file: &FileInfo,
    status: FileStatus,
    reason: &str,
) {
    let answers = newest_request(js, file).await;
    assert!(report(files, file, status, reason, answers).await);
}

/// What the indexer reports for a version it could not write.
async fn fail(files: &FilesService, js: &async_nats::jetstream::Context, file: &FileInfo) {
    set_status(
        files,
        js,
        file,
        FileStatus::Failed,
        "the graph was unavailable",
    )
    .await;
}

async fn status_of(files: &FilesService, path: &str) -> (FileStatus, String) {
    let file = files
        .get_file(&admin_of(&[""]), NS, Some(path), None)
        .await
        .unwrap();
    (file.status(), file.status_reason)
}

async fn reindex(
    files: &FilesService,
    caller: &CallerContext,
    folder: &str,
    failed_only: bool,
    limit: u32,
    cursor: &str,
) -> Result<ReindexResponse, kg_files::FilesError> {
    let request = ReindexRequest {
        namespace: NS.into(),
        folder_prefix: folder.into(),
        failed_only,
        limit,
        cursor: cursor.into(),
    };
    files.reindex(caller, &request).await
}

/// How many rebuild upserts of `file` the stream holds, after checking each names the
/// file's current version, its blob and its flags.
async fn rebuilds(js: &async_nats::jetstream::Context, file: &FileInfo) -> usize {
    let events = changes(js, NS, &file.file_id).await;
    let rebuilds: Vec<_> = events.iter().filter(|e| e.rebuild_at_ms != 0).collect();
    for event in &rebuilds {
        assert_eq!(event.version_id, file.version_id);
        assert_eq!(event.content_sha256, file.content_sha256);
        assert_eq!(
            event.blob_key, file.content_sha256,
            "blobs are content-addressed"
        );
        assert!(event.changed_at_ms <= event.rebuild_at_ms, "{event:?}");
    }
    rebuilds.len()
}

async fn scenario(postgres: bool) {
    // Bound by name, the temp dir and PostgreSQL live to the end; NATS is stopped below.
    let Env {
        dir: _dir,
        nats,
        pg: _pg,
        files,
    } = env(postgres).await;
    let js = kg_stores::events::connect(&nats.url).await.unwrap();
    let one = put(&files, "a/one.md", "# One\n").await;
    let two = put(&files, "a/two.md", "# Two\n").await;
    let three = put(&files, "b/three.md", "# Three\n").await;
    let hidden = put(&files, "c/hidden.md", "# Hidden\n").await;
    let gone = put(&files, "d/gone.md", "# Gone\n").await;
    for file in [&one, &two, &hidden, &gone] {
        set_status(&files, &js, file, FileStatus::Indexed, "").await;
    }
    fail(&files, &js, &three).await;
    let admin = admin_of(&[""]);
    files
        .set_flags(&admin, NS, &hidden.file_id, None, Some(true))
        .await
        .unwrap();
    files.delete_file(&admin, NS, &gone.file_id).await.unwrap();

    // Below admin on the folder: refused, naming what to ask for.
    for (caller, folder) in [(writer(NS), "a/"), (admin_of(&["a/"]), "")] {
        let err = reindex(&files, &caller, folder, false, 0, "")
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::PermissionDenied, "{err}");
        assert!(err.to_string().contains("admin permission"), "{err}");
    }
    // A folder's admin reindexes the folder: its two files, nothing else.
    let page = reindex(&files, &admin_of(&["a/"]), "a", false, 0, "")
        .await
        .unwrap();
    assert_eq!((page.queued, page.next_cursor.as_str()), (2, ""));
    assert_eq!(status_of(&files, "a/one.md").await.0, FileStatus::Pending);
    assert_eq!(
        status_of(&files, "c/hidden.md").await.0,
        FileStatus::Indexed
    );
    assert_eq!(rebuilds(&js, &one).await, 1);
    assert_eq!(rebuilds(&js, &hidden).await, 0);
    // A late answer to the upload's own indexing leaves the rebuild pending; the rebuild's
    // answer ends it.
    assert!(!report(&files, &one, FileStatus::Indexed, "", 0).await);
    assert_eq!(status_of(&files, "a/one.md").await.0, FileStatus::Pending);
    let requested = newest_request(&js, &one).await;
    assert!(!report(&files, &one, FileStatus::Indexed, "", requested - 1).await);
    assert!(report(&files, &one, FileStatus::Indexed, "", requested).await);
    assert_eq!(status_of(&files, "a/one.md").await.0, FileStatus::Indexed);
    // Once answered, the indexer's own later passes (a backfill's, which name no request)
    // report again.
    assert!(
        report(
            &files,
            &one,
            FileStatus::Failed,
            "the graph was unavailable",
            0
        )
        .await
    );
    assert!(report(&files, &one, FileStatus::Indexed, "", 0).await);

    // The whole namespace, two a page: four files (hidden included, deleted not).
    let mut queued = 0;
    let mut cursor = String::new();
    let mut pages = 0;
    loop {
        let page = reindex(&files, &admin, "", false, 2, &cursor)
            .await
            .unwrap();
        queued += page.queued;
        pages += 1;
        if page.next_cursor.is_empty() {
            break;
        }
        cursor = page.next_cursor;
    }
    // The second page was full, so a third call finds the end.
    assert_eq!((queued, pages), (4, 3));
    assert_eq!(
        rebuilds(&js, &one).await,
        2,
        "a second request is a second event"
    );
    assert_eq!(rebuilds(&js, &hidden).await, 1);
    assert_eq!(rebuilds(&js, &gone).await, 0);
    let hidden_event = changes(&js, NS, &hidden.file_id).await;
    assert!(
        hidden_event.last().is_some_and(|e| e.hidden),
        "{hidden_event:?}"
    );

    // Failed files only.
    for file in [&one, &two, &hidden] {
        set_status(&files, &js, file, FileStatus::Indexed, "").await;
    }
    fail(&files, &js, &three).await;
    let page = reindex(&files, &admin, "", true, 0, "").await.unwrap();
    assert_eq!(page.queued, 1);
    assert_eq!(rebuilds(&js, &three).await, 2);
    assert_eq!(rebuilds(&js, &one).await, 2);

    // The same content again: over a failed version it is queued again; over an indexed one
    // nothing happens.
    fail(&files, &js, &three).await;
    let again = files
        .upload(&admin, NS, "b/three.md", b"# Three\n", "")
        .await
        .unwrap();
    assert!(!again.changed && again.requeued, "{again:?}");
    assert_eq!(
        again.file.unwrap().status(),
        FileStatus::Pending,
        "the answer says it is queued"
    );
    assert_eq!(status_of(&files, "b/three.md").await.0, FileStatus::Pending);
    assert_eq!(rebuilds(&js, &three).await, 3);
    let same = files
        .upload(&admin, NS, "a/one.md", b"# One\n", "")
        .await
        .unwrap();
    assert!(!same.changed && !same.requeued, "{same:?}");
    assert_eq!(rebuilds(&js, &one).await, 2);
    // New content is a new version, whose own indexing answers no earlier request.
    let renewed = put(&files, "a/two.md", "# Two, renewed\n").await;
    assert!(report(&files, &renewed, FileStatus::Indexed, "", 0).await);

    // Bad input says what to change.
    for (limit, cursor, says) in [(5001, "", "maximum of 5000"), (0, "zz", "cursor")] {
        let err = reindex(&files, &admin, "", false, limit, cursor)
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
        assert!(err.to_string().contains(says), "{err}");
    }

    // The event bus down: unavailable, and every status stays as it was.
    let three_requested = newest_request(&js, &three).await;
    drop(nats);
    let err = reindex(&files, &admin, "a/", false, 0, "")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    assert!(
        err.to_string().contains("send the same request again"),
        "{err}"
    );
    assert_eq!(status_of(&files, "a/one.md").await.0, FileStatus::Indexed);
    assert_eq!(status_of(&files, "a/two.md").await.0, FileStatus::Indexed);
    // The request that failed to queue will never answer, so an earlier one's answer counts.
    assert!(report(&files, &one, FileStatus::Indexed, "", 0).await);
    let reason = "the graph was unavailable";
    assert!(report(&files, &three, FileStatus::Failed, reason, three_requested).await);
    let err = files
        .upload(&admin, NS, "b/three.md", b"# Three\n", "")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    assert_eq!(
        status_of(&files, "b/three.md").await,
        (FileStatus::Failed, "the graph was unavailable".to_owned())
    );
}

#[tokio::test]
async fn reindex_on_sqlite() {
    scenario(false).await;
}

#[tokio::test]
async fn reindex_on_postgres() {
    scenario(true).await;
}

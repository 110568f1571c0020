//! `KG_FILES` made again after NATS lost it (restarted without its volume, or the stream
//! deleted by hand), on SQLite and PostgreSQL with real NATS. The stream held change events no
//! indexer had applied; the registry is the record, so the files service replays it into the
//! new stream: the current version of every live file (a pending reindex keeps its request),
//! a delete for every deleted file, and every file's newest flags change. Once per new stream:
//! the first check of a registry records the stream's incarnation, and a check that finds the
//! same stream replays nothing. A new `KG_INDEX` alone lost only indexing outcomes: the files
//! still pending are queued again, and nothing else. Either way, a preview-branch upload the
//! indexer never reported on is queued again for parsing.

use kg_files::{FilesService, Replay};
use kg_proto::v1::{
    CallerContext, FileChangeOp, FileChanged, FileIndexed, FileInfo, FileStatus, ReindexRequest,
};
use kg_stores::events;

use crate::common::{changes, env, events_on, put_as};

const NS: &str = "replayed";

fn admin() -> CallerContext {
    crate::common::admin(NS)
}

async fn put(files: &FilesService, path: &str, body: &str) -> FileInfo {
    put_as(files, &admin(), NS, path, body).await
}

/// (op, version, hidden, rebuild request) of each change event of `file` in the stream.
async fn events_of(
    js: &async_nats::jetstream::Context,
    file: &FileInfo,
) -> Vec<(FileChangeOp, String, bool, bool)> {
    changes(js, NS, &file.file_id)
        .await
        .into_iter()
        .map(|e: FileChanged| (e.op(), e.version_id, e.hidden, e.rebuild_at_ms != 0))
        .collect()
}

async fn replays_the_registry_into_a_stream_made_again(postgres: bool) {
    let env = env(postgres).await;
    let files = &env.files;
    let js = async_nats::jetstream::new(async_nats::connect(&env.nats.url).await.unwrap());

    let pending = put(files, "docs/pending.md", "# Pending\n\nNot indexed yet.\n").await;
    let hidden = put(files, "docs/hidden.md", "# Hidden\n\nA draft.\n").await;
    files
        .set_flags(&admin(), NS, &hidden.file_id, None, Some(true))
        .await
        .unwrap();
    let deleted = put(files, "docs/deleted.md", "# Deleted\n\nGone.\n").await;
    assert!(
        files
            .delete_file(&admin(), NS, &deleted.file_id)
            .await
            .unwrap()
    );
    let rebuilt = put(files, "again/rebuilt.md", "# Rebuilt\n\nQueued again.\n").await;
    let request = ReindexRequest {
        namespace: NS.into(),
        folder_prefix: "again/".into(),
        ..Default::default()
    };
    assert_eq!(files.reindex(&admin(), &request).await.unwrap().queued, 1);
    // Two preview-branch uploads; the indexer reported on the first one only.
    files.create_branch(&admin(), NS, "preview").await.unwrap();
    let parsed = files
        .upload_to_branch(&admin(), NS, "preview", "b/parsed.md", b"# Parsed\n", "")
        .await
        .unwrap();
    let unparsed = files
        .upload_to_branch(&admin(), NS, "preview", "b/unparsed.md", b"# Not yet\n", "")
        .await
        .unwrap();
    let branch_outcome = |file: &kg_proto::v1::BranchFile| FileIndexed {
        namespace: NS.into(),
        file_id: file.file_id.clone(),
        version_id: file.version_id.clone(),
        status: FileStatus::Indexed as i32,
        branch_only: true,
        meta: Some(kg_proto::v1::VersionMeta {
            source_path: file.path.clone(),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert!(files.apply_indexed(&branch_outcome(&parsed)).await.unwrap());

    // The first check records the stream; a second finds it unchanged.
    assert_eq!(files.replay_if_stream_renewed().await.unwrap(), None);
    assert_eq!(files.replay_if_stream_renewed().await.unwrap(), None);

    // NATS loses the stream and every event in it.
    js.delete_stream(events::FILES_STREAM).await.unwrap();
    let replay = files.replay_if_stream_renewed().await.unwrap();
    assert_eq!(
        replay,
        Some(Replay {
            upserts: 3,
            deletes: 1,
            flags: 1,
            branch_uploads: 1,
            purges: 0,
        })
    );
    let branch_events = async |file: &kg_proto::v1::BranchFile| {
        let subject = format!("kg.files.v1.{NS}.branch");
        events_on(&js, &subject, &file.file_id)
            .await
            .into_iter()
            .map(|e| (e.version_id, e.path))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        branch_events(&unparsed).await,
        [(unparsed.version_id.clone(), "b/unparsed.md".to_owned())],
        "the upload the indexer never reported on is queued again"
    );
    assert_eq!(branch_events(&parsed).await, []);
    use FileChangeOp::{Delete, Flags, Upsert};
    let v = |f: &FileInfo| f.version_id.clone();
    assert_eq!(
        events_of(&js, &pending).await,
        [(Upsert, v(&pending), false, false)]
    );
    assert_eq!(
        events_of(&js, &hidden).await,
        [
            (Upsert, v(&hidden), true, false),
            (Flags, v(&hidden), true, false)
        ]
    );
    assert_eq!(
        events_of(&js, &deleted).await,
        [(Delete, v(&deleted), false, false)]
    );
    assert_eq!(
        events_of(&js, &rebuilt).await,
        [(Upsert, v(&rebuilt), false, true)],
        "the pending reindex keeps its request"
    );

    // Once per stream.
    assert_eq!(files.replay_if_stream_renewed().await.unwrap(), None);
    assert_eq!(events_of(&js, &pending).await.len(), 1);

    // Only KG_INDEX is lost, with the outcomes it held: the files still pending are queued
    // again, and the indexed one is left alone.
    let indexed = FileIndexed {
        namespace: NS.into(),
        file_id: hidden.file_id.clone(),
        version_id: hidden.version_id.clone(),
        status: FileStatus::Indexed as i32,
        chunk_count: 1,
        ..Default::default()
    };
    assert!(files.apply_indexed(&indexed).await.unwrap());
    assert!(
        files
            .apply_indexed(&branch_outcome(&unparsed))
            .await
            .unwrap()
    );
    js.delete_stream(events::INDEX_STREAM).await.unwrap();
    assert_eq!(
        files.replay_if_stream_renewed().await.unwrap(),
        Some(Replay {
            upserts: 2,
            deletes: 0,
            flags: 0,
            branch_uploads: 0,
            purges: 0,
        })
    );
    assert_eq!(events_of(&js, &pending).await.len(), 2);
    assert_eq!(events_of(&js, &rebuilt).await.len(), 2);
    assert_eq!(
        events_of(&js, &hidden).await.len(),
        2,
        "indexed: not queued again"
    );
    assert_eq!(files.replay_if_stream_renewed().await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_the_registry_into_a_stream_made_again_on_sqlite() {
    replays_the_registry_into_a_stream_made_again(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_the_registry_into_a_stream_made_again_on_postgres() {
    replays_the_registry_into_a_stream_made_again(true).await;
}

//! A version registered but never published: the files process stopped (SIGKILL, eviction)
//! between the registry write and the publish of its event. Nothing would ever index it: the file
//! stayed pending for good, and uploading the same content again answered "unchanged". The files
//! service queues such versions again once they are 30 s old (its stream check runs every 30 s);
//! a version whose event reached the stream is never queued twice. SQLite and real NATS.

use kg_common::caller::now_ms;
use kg_proto::v1::{FileChangeOp, FileStatus};
use kg_stores::sql::SqlStore;

use crate::common::{changes, env, put_as};

const NS: &str = "unqueued";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_whose_event_never_reached_the_stream_is_queued_again() {
    let env = env(false).await;
    let files = &env.files;
    let admin = crate::common::admin(NS);
    let js = async_nats::jetstream::new(async_nats::connect(&env.nats.url).await.unwrap());
    let stuck = put_as(
        files,
        &admin,
        NS,
        "docs/stuck.md",
        "# Stuck\n\nNever queued.\n",
    )
    .await;
    let fine = put_as(files, &admin, NS, "docs/fine.md", "# Fine\n\nQueued.\n").await;

    // Each upload's event reached the stream and was recorded: nothing to queue, however late.
    assert_eq!(files.queue_unqueued(now_ms() + 60_000).await.unwrap(), 0);

    // `stuck` as a process stopped before its publish leaves it: pending, no record of an event.
    let sql = SqlStore::connect(&format!(
        "sqlite://{}",
        env.dir.path().join("files.db").display()
    ))
    .await
    .unwrap();
    sqlx::query("UPDATE kg_files SET queued_at_ms = NULL WHERE file_id = $1")
        .bind(&stuck.file_id)
        .execute(sql.pool())
        .await
        .unwrap();

    // Not before it is old enough: an upload between its two steps is not raced.
    assert_eq!(files.queue_unqueued(stuck.updated_at_ms).await.unwrap(), 0);
    assert_eq!(files.queue_unqueued(now_ms() + 1).await.unwrap(), 1);
    let events = changes(&js, NS, &stuck.file_id).await;
    assert_eq!(events.len(), 2, "its first event and the one queued again");
    assert!(
        events
            .iter()
            .all(|e| e.op() == FileChangeOp::Upsert && e.version_id == stuck.version_id)
    );
    assert_eq!(changes(&js, NS, &fine.file_id).await.len(), 1);

    // Recorded as queued now: the next sweep leaves it alone.
    assert_eq!(files.queue_unqueued(now_ms() + 60_000).await.unwrap(), 0);
    let status = files
        .get_file(&admin, NS, None, Some(&stuck.file_id))
        .await
        .unwrap();
    assert_eq!(status.status(), FileStatus::Pending);
}

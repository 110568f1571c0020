//! Replaying the registry into a new `KG_FILES` (or a new `KG_INDEX`). The stream carries change
//! events to the indexers; the registry is the record. When NATS loses its state (restarted without its
//! volume, or the stream deleted by hand), the stream is made again empty: the uploads,
//! deletes and flag changes it held and no indexer had applied yet are gone, and without a
//! replay a deleted or hidden file could stay searchable. Each stream's incarnation (when it
//! was created) is recorded in SQL, so a replay happens once per new stream, whichever
//! service made it again and however often this one restarts. Preview-branch uploads not
//! parsed yet are queued again too, and so are namespace purges the indexer has not reported
//! done.

use std::time::Duration;

use kg_proto::v1::{FileChangeOp, FileStatus};
use kg_stores::events::{self, FILES_STREAM, INDEX_STREAM};
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::service::{FilesService, change_event};
use crate::store::Replayed;

/// How often the files service checks which incarnation of `KG_FILES` it publishes into.
pub const STREAM_CHECK_EVERY: Duration = Duration::from_secs(30);
/// A pending version whose event has not reached the stream this long after it was written
/// was left by a process that stopped mid-upload (a publish takes well under this).
pub const UNQUEUED_AFTER: Duration = Duration::from_secs(30);
/// Registry rows read per page of a replay.
const REPLAY_PAGE: u32 = 500;

/// What a replay published.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replay {
    /// Current versions queued again (the indexer skips what it already holds).
    pub upserts: usize,
    /// Deletes published again (a no-op for a file the indexer already removed).
    pub deletes: usize,
    /// Flag changes published again, one per file that ever had one.
    pub flags: usize,
    /// Preview-branch uploads queued again for parsing: those whose metadata and links the
    /// registry lacks (their parse events, or the outcomes, were in the lost stream).
    pub branch_uploads: usize,
    /// Namespace purges asked for again: those the indexer has not reported done (the request,
    /// or the report, was in the lost stream).
    pub purges: usize,
}

impl FilesService {
    /// Replays the registry into `KG_FILES` if the stream was made again since the last
    /// check (or since the incarnation recorded in SQL); `None` when it was not. The first
    /// check of a registry only records the stream's incarnation. When only `KG_INDEX` was made
    /// again, the indexing outcomes it held are lost: the files still pending are queued again
    /// (their outcomes may have been among them), and nothing else. Either way, every branch
    /// upload not parsed yet is queued again.
    pub async fn replay_if_stream_renewed(&self) -> Result<Option<Replay>> {
        let files_created = events::stream_incarnation(&self.jetstream, FILES_STREAM).await?;
        let index_created = events::stream_incarnation(&self.jetstream, INDEX_STREAM).await?;
        let files_renewed = self.renewed(FILES_STREAM, files_created).await?;
        let index_renewed = self.renewed(INDEX_STREAM, index_created).await?;
        let (stream, incarnation, pending_only) = match (files_renewed, index_renewed) {
            (false, false) => return Ok(None),
            (true, _) => (FILES_STREAM, files_created, false),
            (false, true) => (INDEX_STREAM, index_created, true),
        };
        tracing::warn!(
            stream,
            "an event stream was made again and lost what it held; replaying the registry into KG_FILES"
        );
        let mut replay = Replay::default();
        let mut after = String::new();
        loop {
            let page = self.store.replay_page(&after, REPLAY_PAGE).await?;
            let Some(last) = page.last() else {
                break;
            };
            after = last.current.file.file_id.clone();
            for row in &page {
                if pending_only && row.current.file.status != FileStatus::Pending as i32 {
                    continue;
                }
                self.replay_file(row, incarnation, &mut replay).await?;
            }
        }
        replay.purges = self.republish_unconfirmed_purges().await?;
        // Branch uploads not parsed yet: their events (or outcomes) were in the lost stream,
        // and without them the branch and its releases show the files without title or links.
        let (mut after_branch, mut after_file) = (String::new(), String::new());
        loop {
            let page = self
                .versions
                .unparsed_branch_uploads((&after_branch, &after_file), REPLAY_PAGE)
                .await?;
            let Some(last) = page.last() else {
                break;
            };
            (after_branch, after_file) = (last.file.branch_id.clone(), last.file.file_id.clone());
            for upload in &page {
                let msg_id = format!(
                    "{}:{}:branch:replay:{incarnation}",
                    upload.file.branch_id, upload.file.version_id
                );
                self.publish_branch_upload(
                    &upload.namespace,
                    &upload.file,
                    &upload.blob_key,
                    &msg_id,
                )
                .await?;
                replay.branch_uploads += 1;
            }
        }
        // Recorded last: a replay cut short runs again whole at the next check (the indexer
        // applies each event idempotently, and the stream drops ids it already holds). A full
        // replay answers for both streams.
        self.store
            .record_bus_stream(FILES_STREAM, files_created)
            .await?;
        self.store
            .record_bus_stream(INDEX_STREAM, index_created)
            .await?;
        tracing::info!(
            upserts = replay.upserts,
            deletes = replay.deletes,
            flags = replay.flags,
            branch_uploads = replay.branch_uploads,
            purges = replay.purges,
            pending_only,
            "registry replayed into the event stream"
        );
        Ok(Some(replay))
    }

    /// Whether `stream` was made again since the incarnation recorded for it; the first time a
    /// stream is seen, its incarnation is recorded and it counts as not renewed.
    async fn renewed(&self, stream: &str, created: i64) -> Result<bool> {
        match self.store.bus_stream_created(stream).await? {
            Some(known) => Ok(known != created),
            None => {
                self.store.record_bus_stream(stream, created).await?;
                Ok(false)
            }
        }
    }

    async fn replay_file(
        &self,
        row: &Replayed,
        incarnation: i64,
        replay: &mut Replay,
    ) -> Result<()> {
        let file = &row.current.file;
        if file.status == FileStatus::Deleted as i32 {
            return self.replay_delete(row, incarnation, replay).await;
        }
        let mut event = change_event(
            file,
            &row.current.blob_key,
            FileChangeOp::Upsert,
            row.flags_version,
        );
        // A reindex still waiting keeps its request: the files service takes only its answer.
        if file.status == FileStatus::Pending as i32 {
            event.rebuild_at_ms = row.index_requested_at_ms;
        }
        let msg_id = format!("{}:replay:{incarnation}", file.version_id);
        events::publish_file_change(&self.jetstream, &event, &msg_id).await?;
        if file.status == FileStatus::Pending as i32 {
            self.note_queued(file).await;
        }
        replay.upserts += 1;
        // Deleted since the page was read: the delete's own event may be ahead of this upsert
        // in the stream, and the upsert would bring the file back into search. Delete again.
        if self.store.is_deleted(&file.file_id).await? {
            return self.replay_delete(row, incarnation, replay).await;
        }
        // An upsert of a version the indexer holds leaves its flags as they are: a flags
        // change the old stream lost is published again.
        if row.flags_version > 0 {
            let event = change_event(file, "", FileChangeOp::Flags, row.flags_version);
            let msg_id = format!(
                "{}:replay-flags:v{}:{incarnation}",
                file.file_id, row.flags_version
            );
            events::publish_file_change(&self.jetstream, &event, &msg_id).await?;
            replay.flags += 1;
        }
        Ok(())
    }

    async fn replay_delete(
        &self,
        row: &Replayed,
        incarnation: i64,
        replay: &mut Replay,
    ) -> Result<()> {
        let file = &row.current.file;
        let event = change_event(
            file,
            &row.current.blob_key,
            FileChangeOp::Delete,
            row.flags_version,
        );
        let msg_id = format!("{}:replay-delete:{incarnation}", file.file_id);
        events::publish_file_change(&self.jetstream, &event, &msg_id).await?;
        replay.deletes += 1;
        Ok(())
    }
}

/// Checks every [`STREAM_CHECK_EVERY`] until `shutdown` whether `KG_FILES` was made again,
/// and replays the registry into it when it was ([`FilesService::replay_if_stream_renewed`]).
pub async fn run_stream_check(service: FilesService, shutdown: CancellationToken) {
    loop {
        if let Err(err) = service.replay_if_stream_renewed().await {
            tracing::warn!(error = %kg_common::error::detail(&err), "checking the event stream failed; trying again");
        }
        let before_ms = kg_common::caller::now_ms()
            - i64::try_from(UNQUEUED_AFTER.as_millis()).unwrap_or(i64::MAX);
        if let Err(err) = service.queue_unqueued(before_ms).await {
            tracing::warn!(error = %kg_common::error::detail(&err), "queueing unqueued versions failed; trying again");
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(STREAM_CHECK_EVERY) => {}
        }
    }
}

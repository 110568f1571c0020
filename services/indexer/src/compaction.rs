//! Trimming `KG_FILES` to the events still to be read. Every subject the indexer reads there
//! has one durable consumer, and its ack floor is the stream sequence up to which it has
//! acknowledged every event of its subject: those events are applied, and nothing reads them
//! again. [`compact_files_stream`] removes them, subject by subject, up to that consumer's
//! floor. An event not yet acknowledged (queued, running, waiting for a retry) stays, and so
//! does every dead letter (`kg.files.v1.<ns>.dead`, read by operators only). Sequences do not
//! restart: the flags ledger and the lanes keep ordering events by them.
//!
//! The backfill reads the stream only for FileRefs written before FileRefs recorded their
//! version's content (`blobKey`, `contentSha256`, `size`); so before the upserts go, each such
//! FileRef is given those fields from its version's upsert, while the stream still holds it.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_nats::jetstream::context::ConsumerInfoErrorKind;
use kg_proto::v1::{FileChangeOp, FileChanged};
use kg_stores::StoreError;
use kg_stores::events;
use kg_stores::graph::{GraphStore, Params};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::events_err;
use crate::worker::{CHANGES_CONSUMER, FastPathKind};

/// How often each indexer trims the stream. Every replica does (a trim is idempotent).
pub const COMPACT_EVERY: Duration = Duration::from_secs(3600);
/// How long after start the first trim runs: after the start's backfill check, and soon
/// enough that an indexer restarted more often than hourly still trims.
const FIRST_COMPACTION_AFTER: Duration = Duration::from_secs(60);

/// The indexer's durable consumers of `KG_FILES`, each with the subjects it alone reads.
fn files_consumers() -> [(&'static str, &'static str); 5] {
    [
        CHANGES_CONSUMER,
        FastPathKind::Removals.consumer(),
        FastPathKind::FlagChanges.consumer(),
        crate::purge::PURGES_CONSUMER,
        crate::branch::BRANCH_CONSUMER,
    ]
}

/// What one trim did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Compacted {
    /// Events removed from the stream, every subject together.
    pub events_removed: u64,
    /// FileRefs of an earlier release given their version's content fields from the stream.
    pub file_refs_completed: usize,
}

/// Removes from `KG_FILES` every event each of the indexer's consumers has acknowledged (see
/// the module's comment). A subject whose consumer does not exist yet is left whole: its
/// events have not been read.
pub async fn compact_files_stream(
    graph: &GraphStore,
    js: &async_nats::jetstream::Context,
) -> Result<Compacted, StoreError> {
    let stream = js
        .get_stream(events::FILES_STREAM)
        .await
        .map_err(events_err)?;
    let mut compacted = Compacted::default();
    for (durable, subjects) in files_consumers() {
        // Read before the FileRefs are completed: every upsert up to it is in the stream then.
        let floor = match stream.consumer_info(durable).await {
            Ok(info) => info.ack_floor.stream_sequence,
            Err(err) if err.kind() == ConsumerInfoErrorKind::NotFound => continue,
            Err(err) => return Err(events_err(err)),
        };
        if floor == 0 {
            continue;
        }
        if subjects == CHANGES_CONSUMER.1 {
            compacted.file_refs_completed = complete_file_refs(graph, js).await?;
        }
        // Removes the subjects' events below the sequence given: those at or under the floor.
        let purged = stream
            .purge()
            .filter(subjects)
            .sequence(floor + 1)
            .await
            .map_err(events_err)?;
        compacted.events_removed += purged.purged;
    }
    let metrics = kg_common::metrics::metrics();
    metrics
        .change_events_compacted
        .inc_by(compacted.events_removed);
    metrics
        .change_events_compaction_completed
        .set(kg_common::caller::now_ms() / 1000);
    Ok(compacted)
}

/// Gives every FileRef whose version's content fields are not set (written by an earlier
/// release) those of its version's upsert in the stream; how many it completed. A FileRef
/// whose upsert the stream no longer holds stays as it is: nothing is lost by trimming.
async fn complete_file_refs(
    graph: &GraphStore,
    js: &async_nats::jetstream::Context,
) -> Result<usize, StoreError> {
    let mut wanted: HashMap<String, HashSet<String>> = HashMap::new();
    for ns in graph.namespaces().await? {
        let rows = graph
            .query(
                &ns,
                "MATCH (f:FileRef) WHERE f.versionId IS NOT NULL AND f.blobKey IS NULL \
                 RETURN f.versionId",
                &Params::new(),
            )
            .await?
            .rows;
        let versions: HashSet<String> = rows
            .iter()
            .filter_map(|row| row.first().and_then(Value::as_str).map(str::to_owned))
            .collect();
        if !versions.is_empty() {
            wanted.insert(ns, versions);
        }
    }
    if wanted.is_empty() {
        return Ok(0);
    }
    let mut found: HashMap<String, Vec<FileChanged>> = HashMap::new();
    crate::backfill::scan_changes(js, CHANGES_CONSUMER.1, |event| {
        let is_wanted = event.op() == FileChangeOp::Upsert
            && !event.blob_key.is_empty()
            && wanted
                .get(&event.namespace)
                .is_some_and(|versions| versions.contains(&event.version_id));
        if is_wanted {
            found
                .entry(event.namespace.clone())
                .or_default()
                .push(event);
        }
    })
    .await?;
    let mut completed = 0;
    for (ns, upserts) in found {
        let rows: Vec<Value> = upserts
            .iter()
            .map(|event| {
                json!({
                    "fileId": event.file_id,
                    "versionId": event.version_id,
                    "blobKey": event.blob_key,
                    "sha": event.content_sha256,
                    "size": event.size,
                })
            })
            .collect();
        let mut params = Params::new();
        params.insert("rows".into(), Value::Array(rows));
        // Only while the FileRef still holds that version and lacks the fields: a write that
        // started meanwhile sets them itself when it completes.
        let result = graph
            .query(
                &ns,
                "UNWIND $rows AS r \
                 MATCH (f:FileRef {fileId: r.fileId}) \
                 WHERE f.versionId = r.versionId AND f.blobKey IS NULL \
                 SET f.blobKey = r.blobKey, f.contentSha256 = r.sha, f.size = r.size \
                 RETURN count(f)",
                &params,
            )
            .await?;
        completed += result
            .rows
            .first()
            .and_then(|row| row.first())
            .and_then(Value::as_u64)
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0);
    }
    Ok(completed)
}

/// Trims the stream [`FIRST_COMPACTION_AFTER`] after start, then every [`COMPACT_EVERY`],
/// until `shutdown`. A failed trim is logged and tried again at the next turn: until then the
/// stream only keeps more than it needs.
pub(crate) async fn run(
    graph: GraphStore,
    js: async_nats::jetstream::Context,
    shutdown: CancellationToken,
) {
    let mut wait = FIRST_COMPACTION_AFTER;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        wait = COMPACT_EVERY;
        match compact_files_stream(&graph, &js).await {
            Ok(compacted) if compacted == Compacted::default() => {
                tracing::debug!("KG_FILES holds no acknowledged change event");
            }
            Ok(compacted) => tracing::info!(
                events_removed = compacted.events_removed,
                file_refs_completed = compacted.file_refs_completed,
                "change events every consumer acknowledged removed from KG_FILES"
            ),
            Err(err) => tracing::warn!(
                error = %err.detail(),
                "trimming KG_FILES failed; it is tried again in an hour"
            ),
        }
    }
}

//! Re-indexing what was indexed under older settings: files without vectors from the current
//! embedder, and files whose entities were extracted under an older TBox (or none).
//!
//! The FileRef records which version was embedded by which model (`vectorStamp`) and which TBox its
//! entities come from (`entityStamp`), so the worker re-indexes a version exactly when a stamp is
//! missing or stale. [`requeue_stale`] re-queues the upsert of each file whose current graph
//! version has a stale stamp, built from the FileRef (which also records where its version's
//! content is), or for a FileRef of an earlier release, taken from the `KG_FILES` stream while it
//! still holds the upsert. It runs when the worker starts, and for one namespace each time a TBox
//! is published there ([`watch_tboxes`]). The worker then re-indexes them through its ordinary,
//! ordered, idempotent path: a version already embedded is not embedded again, and an unchanged
//! graph is not rewritten. A re-queued event is marked `requeued`: it only re-indexes the version
//! the graph still holds, with the graph's flags, so a file deleted, replaced or hidden between the
//! scan and the event's turn stays as its newest change left it.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::events_err;
use async_nats::jetstream::{self, consumer};
use futures::StreamExt as _;
use kg_proto::v1::{AccessFilter, FileChangeOp, FileChanged, Permission};
use kg_stores::StoreError;
use kg_stores::events;
use kg_stores::graph::{GraphStore, Params, assign_properties};
use kg_stores::tbox::TboxBucket;
use prost::Message as _;
use serde_json::{Value, json};

use crate::vector_writer::Vectors;
use crate::worker::CHANGES_CONSUMER;

/// How long the stream scan waits for the next message before it calls the scan done: a
/// guard only, as each message says how many are left.
const SCAN_IDLE: Duration = Duration::from_secs(2);

/// `<versionId>|<embedder identity>` (`<model>|<dims>`, then any setting that changes the
/// vectors): what the FileRef's `vectorStamp` must say for a version's vectors to count as
/// written by this embedder.
pub fn vector_stamp(vectors: &Vectors, version_id: &str) -> String {
    format!("{version_id}|{}", vectors.embedder.identity())
}

/// What the graph says about a file.
pub(crate) struct FileState {
    pub(crate) version_id: Option<String>,
    /// `<versionId>|<embedder identity>` of the vectors written, see [`vector_stamp`].
    pub(crate) vector_stamp: Option<String>,
    pub(crate) changed_at_ms: Option<i64>,
    /// `(enabled, hidden)`: the newest flags applied to the file, by its upserts or changes.
    pub(crate) flags: Option<(bool, bool)>,
}

/// The graph's record of a file; `None` when the graph holds no such file.
pub(crate) async fn file_state(
    graph: &GraphStore,
    ns: &str,
    file_id: &str,
) -> Result<Option<FileState>, StoreError> {
    let mut params = Params::new();
    params.insert("fileId".into(), json!(file_id));
    let rows = graph
        .query(
            ns,
            "MATCH (f:FileRef {fileId: $fileId}) \
             RETURN f.versionId, f.vectorStamp, f.changedAtMs, f.enabled, f.hidden",
            &params,
        )
        .await?;
    let Some(row) = rows.rows.into_iter().next() else {
        return Ok(None);
    };
    let text = |i: usize| row.get(i).and_then(Value::as_str).map(str::to_owned);
    let flag = |i: usize| row.get(i).and_then(Value::as_bool);
    Ok(Some(FileState {
        version_id: text(0),
        vector_stamp: text(1),
        changed_at_ms: row.get(2).and_then(Value::as_i64),
        flags: flag(3).zip(flag(4)),
    }))
}

/// After a version is written: when its change happened, where its content is (so the
/// backfill can queue it again from the graph alone, [`requeued_from_graph`]) and (with
/// embeddings) which embedder wrote its vectors. Only while the FileRef still holds that
/// version.
pub(crate) async fn mark_written(
    graph: &GraphStore,
    event: &FileChanged,
    vector_stamp: Option<&str>,
) -> Result<(), StoreError> {
    let mut params = Params::new();
    params.insert("fileId".into(), json!(event.file_id));
    params.insert("versionId".into(), json!(event.version_id));
    params.insert("changedAt".into(), json!(event.changed_at_ms));
    params.insert("blobKey".into(), json!(event.blob_key));
    params.insert("sha".into(), json!(event.content_sha256));
    params.insert("size".into(), json!(event.size));
    params.insert("stamp".into(), json!(vector_stamp));
    let cypher = if vector_stamp.is_some() {
        "MATCH (f:FileRef {fileId: $fileId}) WHERE f.versionId = $versionId \
         SET f.changedAtMs = $changedAt, f.blobKey = $blobKey, f.contentSha256 = $sha, \
         f.size = $size, f.vectorStamp = $stamp"
    } else {
        "MATCH (f:FileRef {fileId: $fileId}) WHERE f.versionId = $versionId \
         SET f.changedAtMs = $changedAt, f.blobKey = $blobKey, f.contentSha256 = $sha, \
         f.size = $size"
    };
    graph.query(&event.namespace, cypher, &params).await?;
    Ok(())
}

/// Marks `event`'s version unwritten in every store's record of it (the FileRef's version,
/// chunk count and stamps), if the graph holds it: the indexing that follows writes it all
/// again, and until it completes the file reads as not indexed.
pub(crate) async fn mark_unwritten(
    graph: &GraphStore,
    event: &FileChanged,
) -> Result<(), StoreError> {
    let mut params = Params::new();
    params.insert("fileId".into(), json!(event.file_id));
    params.insert("versionId".into(), json!(event.version_id));
    let clear = assign_properties(
        "f",
        &["versionId", "chunkCount", "vectorStamp", "entityStamp"].map(|name| (name, Value::Null)),
        &mut params,
    );
    graph
        .query(
            &event.namespace,
            &format!(
                "MATCH (f:FileRef {{fileId: $fileId}}) WHERE f.versionId = $versionId {clear}"
            ),
            &params,
        )
        .await?;
    Ok(())
}

async fn has_file_point(vectors: &Vectors, ns: &str, file_id: &str) -> bool {
    let everything = AccessFilter {
        namespace: ns.to_owned(),
        allow_prefixes: vec![String::new()],
        permission: Permission::Admin as i32,
        ..Default::default()
    };
    matches!(
        vectors.index.file_vector(&everything, file_id).await,
        Ok(Some(_))
    )
}

/// The latest upsert of every file that still exists, per namespace, from the stream.
async fn latest_upserts(
    js: &jetstream::Context,
    namespace: Option<&str>,
) -> Result<BTreeMap<String, HashMap<String, FileChanged>>, StoreError> {
    let filter = match namespace {
        Some(ns) => events::files_changed_subject(ns)?,
        None => CHANGES_CONSUMER.1.to_owned(),
    };
    let mut latest: BTreeMap<String, HashMap<String, FileChanged>> = BTreeMap::new();
    scan_changes(js, &filter, |event| {
        let files = latest.entry(event.namespace.clone()).or_default();
        match event.op() {
            FileChangeOp::Upsert => {
                files.insert(event.file_id.clone(), event);
            }
            FileChangeOp::Delete => {
                files.remove(&event.file_id);
            }
            FileChangeOp::Flags => {
                if let Some(upsert) = files.get_mut(&event.file_id) {
                    upsert.enabled = event.enabled;
                    upsert.hidden = event.hidden;
                }
            }
            FileChangeOp::Unspecified => {}
        }
    })
    .await?;
    Ok(latest)
}

/// Calls `each` with every change event `KG_FILES` holds on `filter`, oldest first, up to the
/// last one it held when the scan began. Events that do not decode are skipped.
pub(crate) async fn scan_changes(
    js: &jetstream::Context,
    filter: &str,
    mut each: impl FnMut(FileChanged),
) -> Result<(), StoreError> {
    let stream = js
        .get_stream(events::FILES_STREAM)
        .await
        .map_err(events_err)?;
    let last = stream
        .get_info()
        .await
        .map_err(events_err)?
        .state
        .last_sequence;
    if last == 0 {
        return Ok(());
    }
    let reader = stream
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: filter.to_owned(),
            deliver_policy: consumer::DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .map_err(events_err)?;
    // Nothing on `filter`: done now, not after waiting for a message that never comes.
    if reader.cached_info().num_pending == 0 {
        return Ok(());
    }
    let mut messages = reader.messages().await.map_err(events_err)?;
    loop {
        let next = match tokio::time::timeout(SCAN_IDLE, messages.next()).await {
            Ok(Some(Ok(message))) => message,
            Ok(Some(Err(err))) => return Err(events_err(err)),
            Ok(None) | Err(_) => break,
        };
        // `pending`: the events on `filter` left after this one when it was delivered.
        let (sequence, pending) = next
            .info()
            .map(|i| (i.stream_sequence, i.pending))
            .unwrap_or((last, 0));
        if let Ok(event) = FileChanged::decode(next.payload.as_ref()) {
            each(event);
        }
        if pending == 0 || sequence >= last {
            break;
        }
    }
    Ok(())
}

/// How many files [`requeue_stale`] re-queued, by what was stale (a file may count in both).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Requeued {
    /// Files without vectors from the configured embedder.
    pub vectors: usize,
    /// Files whose entities come from another TBox than the namespace's published one.
    pub entities: usize,
}

/// The FileRef columns [`requeue_stale`] reads, in order.
const FILE_REF_COLUMNS: &str = "f.fileId, f.versionId, f.vectorStamp, f.entityStamp, f.blobKey, \
     f.vfsPath, f.mime, f.contentSha256, f.size, f.changedAtMs, f.enabled, f.hidden";

/// The upsert of the version a FileRef row ([`FILE_REF_COLUMNS`]) holds, built from the graph
/// alone; `None` for a FileRef whose version's blob fields are not set (written by an earlier
/// release, or while a write is under way).
fn requeued_from_graph(namespace: &str, row: &[Value]) -> Option<FileChanged> {
    let text = |i: usize| row.get(i).and_then(Value::as_str).map(str::to_owned);
    let number = |i: usize| row.get(i).and_then(Value::as_i64).unwrap_or(0);
    Some(FileChanged {
        namespace: namespace.to_owned(),
        file_id: text(0)?,
        version_id: text(1)?,
        blob_key: text(4)?,
        path: text(5)?,
        mime: text(6).unwrap_or_default(),
        content_sha256: text(7).unwrap_or_default(),
        size: number(8),
        changed_at_ms: number(9),
        op: FileChangeOp::Upsert as i32,
        // A re-queued upsert is indexed with the flags the graph holds when the worker runs it.
        enabled: row.get(10).and_then(Value::as_bool).unwrap_or(true),
        hidden: row.get(11).and_then(Value::as_bool).unwrap_or(false),
        ..FileChanged::default()
    })
}

/// Re-queues the upsert of every file whose current graph version lacks vectors from
/// `vectors`' embedder (when embeddings are on) or entities from its namespace's published
/// TBox; all namespaces with a graph, or one. The upsert is built from the FileRef, which
/// records where its version's content is; only for FileRefs written before it did is the
/// `KG_FILES` stream scanned (once per call) for the file's latest upsert. Idempotent: a
/// re-queued event's message id names the version and what it is re-queued for, and the worker
/// skips what is already written.
pub async fn requeue_stale(
    graph: &GraphStore,
    js: &jetstream::Context,
    vectors: Option<&Vectors>,
    tboxes: &TboxBucket,
    namespace: Option<&str>,
) -> Result<Requeued, StoreError> {
    let namespaces = match namespace {
        Some(ns) => vec![ns.to_owned()],
        None => graph.namespaces().await?,
    };
    // Read on first need only (a stale FileRef written before FileRefs recorded their
    // content): it walks every change event the stream holds.
    let mut from_stream: Option<BTreeMap<String, HashMap<String, FileChanged>>> = None;
    let mut queued = Requeued::default();
    for ns in namespaces {
        let rows = match graph
            .query(
                &ns,
                &format!(
                    "MATCH (f:FileRef) WHERE f.versionId IS NOT NULL RETURN {FILE_REF_COLUMNS}"
                ),
                &Params::new(),
            )
            .await
        {
            Ok(rows) => rows.rows,
            // A namespace whose graph is gone has nothing to re-index.
            Err(err) => {
                tracing::warn!(namespace = %ns, error = %err.detail(), "re-indexing skipped a namespace");
                continue;
            }
        };
        let tbox = crate::entities::tbox_stamp(tboxes.get_cached(&ns).await?.as_deref());
        let subject = events::files_changed_subject(&ns)?;
        for row in rows {
            let text = |i: usize| row.get(i).and_then(Value::as_str);
            let (Some(file_id), Some(version_id)) = (text(0), text(1)) else {
                continue;
            };
            let stale_vectors = vectors
                .map(|vectors| (vectors, vector_stamp(vectors, version_id)))
                .filter(|(_, stamp)| text(2) != Some(stamp.as_str()));
            let entities_current = text(3)
                .is_some_and(|stamp| crate::entity_writer::stamp_is_for(stamp, version_id, &tbox));
            if stale_vectors.is_none() && entities_current {
                continue;
            }
            let event = match requeued_from_graph(&ns, &row) {
                Some(event) => event,
                None => {
                    let latest = match &mut from_stream {
                        Some(latest) => latest,
                        empty => empty.insert(latest_upserts(js, namespace).await?),
                    };
                    match latest.get(&ns).and_then(|files| files.get(file_id)) {
                        Some(event) if event.version_id == version_id => event.clone(),
                        _ => continue,
                    }
                }
            };
            let mut reasons = Vec::new();
            if let Some((vectors, stamp)) = stale_vectors {
                // Written before stamps existed (the index's dimension is this embedder's):
                // stamp it instead of embedding it again.
                if text(2).is_none() && has_file_point(vectors, &ns, file_id).await {
                    mark_written(graph, &event, Some(&stamp)).await?;
                } else {
                    reasons.push(format!("backfill:{}", vectors.embedder.identity()));
                    queued.vectors += 1;
                }
            }
            if !entities_current {
                reasons.push(format!("entities:{tbox}"));
                queued.entities += 1;
            }
            if reasons.is_empty() {
                continue;
            }
            let msg_id = format!("{version_id}:{}", reasons.join(":"));
            // Marked, so the worker indexes the version the graph holds when it runs, with the
            // graph's flags: the file may have been deleted or hidden since this scan. Never a
            // rebuild, though the latest upsert may be one: only what is stale is written again.
            let requeued = FileChanged {
                requeued: true,
                rebuild_at_ms: 0,
                ..event
            };
            events::publish(js, &subject, &msg_id, requeued.encode_to_vec()).await?;
        }
    }
    Ok(queued)
}

/// Re-queues what is stale, then follows the published TBoxes until `shutdown`. Once the watch
/// is open, every namespace is checked (what was indexed before embeddings were on, or before
/// a publish no indexer saw); then each publish re-queues its namespace's files indexed under
/// another TBox, so entities follow the TBox without a re-upload. A lost watch is opened again
/// after a pause, and every namespace is checked again, for the publishes it may have missed.
pub async fn watch_tboxes(
    graph: GraphStore,
    js: jetstream::Context,
    vectors: Option<Vectors>,
    tboxes: TboxBucket,
    shutdown: tokio_util::sync::CancellationToken,
) {
    // The first check runs once the watch is open, so a publish during it is not missed.
    let mut missed_some = true;
    loop {
        let mut published = match tboxes.watch().await {
            Ok(stream) => stream,
            Err(err) => {
                tracing::warn!(error = %err.detail(), "watching published TBoxes failed; trying again");
                missed_some = true;
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(WATCH_RETRY) => continue,
                }
            }
        };
        if std::mem::take(&mut missed_some) {
            log_requeued(
                requeue_stale(&graph, &js, vectors.as_ref(), &tboxes, None).await,
                None,
            );
        }
        loop {
            let next = tokio::select! {
                () = shutdown.cancelled() => return,
                next = published.next() => next,
            };
            match next {
                Some(Ok(tbox)) => {
                    let ns = tbox.namespace.as_str();
                    log_requeued(
                        requeue_stale(&graph, &js, vectors.as_ref(), &tboxes, Some(ns)).await,
                        Some(ns),
                    );
                }
                Some(Err(err)) => {
                    tracing::warn!(error = %err.detail(), "a published TBox could not be read");
                }
                None => break,
            }
        }
        missed_some = true;
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(WATCH_RETRY) => {}
        }
    }
}

/// Pause before watching the TBoxes again after the watch failed or ended.
const WATCH_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

pub(crate) fn log_requeued(result: Result<Requeued, StoreError>, namespace: Option<&str>) {
    let namespace = namespace.unwrap_or("*");
    match result {
        Ok(Requeued {
            vectors: 0,
            entities: 0,
        }) => {}
        Ok(queued) => tracing::info!(
            namespace,
            vectors = queued.vectors,
            entities = queued.entities,
            "files re-queued: vectors from another embedder or entities from another TBox"
        ),
        Err(err) => tracing::warn!(
            namespace,
            error = %err.detail(),
            "re-queueing stale files failed; they keep their vectors and entities until the next start or publish"
        ),
    }
}

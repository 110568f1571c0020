//! NATS JetStream: the ingest event streams and their subjects.
//!
//! - `KG_FILES` holds `kg.files.v1.<ns>.changed` (files service publishes, indexer consumes),
//!   `kg.files.v1.<ns>.removed` (a delete again, for the indexer's removals consumer, so it
//!   never waits behind an ingest backlog) and `kg.files.v1.<ns>.dead` (messages the indexer
//!   gave up on), and `kg.files.v1.<ns>.purged` (a namespace being deleted).
//! - `KG_INDEX` holds `kg.index.v1.<ns>.indexed` (indexer publishes when a version is written)
//!   and `kg.index.v1.<ns>.purged` (when a deleted namespace's graph and vectors are gone).
//!
//! Both are file-backed with a 2 minute duplicate window: a publish carries `Nats-Msg-Id` (one id
//! per change or outcome, never the version id alone: content going back to an earlier version is
//! news), so a retried publish is stored once. `KG_FILES` has no age limit: an event stays
//! until the indexer's consumer of its subject acknowledged it, and the indexer then removes it
//! (`kg_indexer::compaction`, hourly); dead letters stay. `KG_INDEX` drops outcomes after
//! [`INDEX_MAX_AGE`]: its one reader, the files service's status consumer, records each in SQL
//! within moments, and the history grew by about 2.3 KB per indexing for ever.

use std::time::Duration;

use async_nats::jetstream::{self, stream};
use kg_proto::v1::{FileChangeOp, FileChanged};
use prost::Message as _;

use crate::error::{StoreError, StoreKind};

/// Stream of file change events and dead letters.
pub const FILES_STREAM: &str = "KG_FILES";
/// Stream of "indexed" notifications.
pub const INDEX_STREAM: &str = "KG_INDEX";
/// How long JetStream remembers message ids for de-duplication.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// How long `KG_INDEX` keeps an indexing outcome, read or not. A files service down longer
/// than this leaves the files whose outcomes went `pending`: `kgmesh file reindex` queues them
/// again.
pub const INDEX_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

/// Connects to NATS (`nats://host:port`) and returns a JetStream context.
pub async fn connect(url: &str) -> Result<jetstream::Context, StoreError> {
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .map_err(|err| match err.kind() {
            async_nats::ConnectErrorKind::TimedOut => StoreError::timeout(StoreKind::Events, err),
            async_nats::ConnectErrorKind::ServerParse => StoreError::InvalidInput {
                what: "event bus url",
                reason: err.to_string(),
            },
            _ => StoreError::unavailable(StoreKind::Events, err),
        })?;
    Ok(jetstream::new(client))
}

/// Creates `KG_FILES` and `KG_INDEX`, or updates them to this configuration. Idempotent.
pub async fn ensure_streams(js: &jetstream::Context) -> Result<(), StoreError> {
    for (name, subjects, max_age) in [
        (FILES_STREAM, "kg.files.v1.>", Duration::ZERO),
        (INDEX_STREAM, "kg.index.v1.>", INDEX_MAX_AGE),
    ] {
        let config = stream::Config {
            name: name.to_owned(),
            subjects: vec![subjects.to_owned()],
            storage: stream::StorageType::File,
            duplicate_window: DUPLICATE_WINDOW,
            max_age,
            ..Default::default()
        };
        js.create_or_update_stream(config)
            .await
            .map_err(|err| match err.kind() {
                jetstream::context::CreateStreamErrorKind::TimedOut => {
                    StoreError::timeout(StoreKind::Events, err)
                }
                jetstream::context::CreateStreamErrorKind::JetStreamUnavailable => {
                    StoreError::unavailable(StoreKind::Events, err)
                }
                _ => StoreError::internal(StoreKind::Events, err),
            })?;
    }
    Ok(())
}

/// When the stream `name` was created, in Unix nanoseconds: its incarnation. A stream made
/// again (NATS lost its state) starts its sequences from 1 and has lost what it held. The
/// streams are made again first when the server has none by that name.
pub async fn stream_incarnation(js: &jetstream::Context, name: &str) -> Result<i64, StoreError> {
    Ok(incarnation_of(&stream(js, name).await?))
}

/// The incarnation of `stream` (see [`stream_incarnation`]).
pub(crate) fn incarnation_of(stream: &jetstream::stream::Stream) -> i64 {
    i64::try_from(stream.cached_info().created.unix_timestamp_nanos()).unwrap_or(i64::MAX)
}

/// The stream `name`, made again with [`ensure_streams`] when the server lost it: NATS
/// restarted without its state, or someone deleted it.
pub(crate) async fn stream(
    js: &jetstream::Context,
    name: &str,
) -> Result<jetstream::stream::Stream, StoreError> {
    match js.get_stream(name).await {
        Ok(stream) => Ok(stream),
        Err(err) if stream_missing(&err) => {
            tracing::warn!(
                stream = name,
                "the event bus has lost the stream; creating it again"
            );
            ensure_streams(js).await?;
            js.get_stream(name)
                .await
                .map_err(|e| StoreError::unavailable(StoreKind::Events, e))
        }
        Err(err) => Err(StoreError::unavailable(StoreKind::Events, err)),
    }
}

/// Whether the server answered that the stream does not exist (rather than not answering).
fn stream_missing(err: &jetstream::context::GetStreamError) -> bool {
    matches!(
        err.kind(),
        jetstream::context::GetStreamErrorKind::JetStream(e)
            if e.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
    )
}

/// `kg.files.v1.<ns>.changed`: a file version was registered, deleted, enabled or disabled.
pub fn files_changed_subject(namespace: &str) -> Result<String, StoreError> {
    Ok(format!("kg.files.v1.{}.changed", token(namespace)?))
}

/// `kg.files.v1.<ns>.removed`: a file was deleted. The same event also goes on `changed`,
/// in order with the file's other changes (and for indexers that predate this subject); here
/// it reaches a consumer of its own, which takes the file out of every lane while `changed`
/// may still hold a backlog of uploads.
pub fn files_removed_subject(namespace: &str) -> Result<String, StoreError> {
    Ok(format!("kg.files.v1.{}.removed", token(namespace)?))
}

/// `kg.files.v1.<ns>.flags`: a file was enabled, disabled, hidden or shown. The same event
/// also goes on `changed`; here it reaches a consumer of its own, so hiding a file does not
/// wait behind a backlog of uploads either. Unlike a removal it leaves the file's queued
/// uploads to run: they are indexed with the newest flags.
pub fn files_flags_subject(namespace: &str) -> Result<String, StoreError> {
    Ok(format!("kg.files.v1.{}.flags", token(namespace)?))
}

/// `kg.files.v1.<ns>.purged`: the namespace is being deleted; the indexer removes its graph,
/// vectors and flags records, and drops its change events made before the request.
pub fn files_purged_subject(namespace: &str) -> Result<String, StoreError> {
    Ok(format!("kg.files.v1.{}.purged", token(namespace)?))
}

/// `kg.index.v1.<ns>.purged`: the indexer removed the namespace's graph and vectors.
pub fn index_purged_subject(namespace: &str) -> Result<String, StoreError> {
    Ok(format!("kg.index.v1.{}.purged", token(namespace)?))
}

/// `kg.index.v1.<ns>.indexed`: a file version's chunks, graph and vectors are written.
pub fn indexed_subject(namespace: &str) -> Result<String, StoreError> {
    Ok(format!("kg.index.v1.{}.indexed", token(namespace)?))
}

/// `kg.files.v1.<ns>.dead`: a change event the indexer gave up on (kept in `KG_FILES`).
pub fn dead_letter_subject(namespace: &str) -> Result<String, StoreError> {
    Ok(format!("kg.files.v1.{}.dead", token(namespace)?))
}

/// A namespace is one subject token: a `.`, `*`, `>` or whitespace in it would change which
/// subscribers see the message, so only `[A-Za-z0-9_-]` is accepted.
fn token(namespace: &str) -> Result<&str, StoreError> {
    let ok = !namespace.is_empty()
        && namespace
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(namespace)
    } else {
        Err(StoreError::InvalidInput {
            what: "namespace",
            reason: "a subject token may only contain letters, digits, '_' and '-'".into(),
        })
    }
}

/// Publishes a file change on `kg.files.v1.<ns>.changed` with `Nats-Msg-Id: msg_id`, a
/// delete again on [`files_removed_subject`] (`<msg_id>:removed`) and a flags change again on
/// [`files_flags_subject`] (`<msg_id>:flags`). That second publish is best effort: the first
/// already applies the change, in order with the file's other changes, so only the first
/// one's failure is an error.
pub async fn publish_file_change(
    js: &jetstream::Context,
    event: &FileChanged,
    msg_id: &str,
) -> Result<(), StoreError> {
    let payload = event.encode_to_vec();
    let subject = files_changed_subject(&event.namespace)?;
    publish(js, &subject, msg_id, payload.clone()).await?;
    let fast_path = match event.op() {
        FileChangeOp::Delete => Some((files_removed_subject(&event.namespace)?, "removed")),
        FileChangeOp::Flags => Some((files_flags_subject(&event.namespace)?, "flags")),
        FileChangeOp::Upsert | FileChangeOp::Unspecified => None,
    };
    if let Some((subject, suffix)) = fast_path
        && let Err(err) = publish(js, &subject, &format!("{msg_id}:{suffix}"), payload).await
    {
        tracing::warn!(error = %err.detail(), file_id = %event.file_id, "could not publish a change's fast path; it applies in order with the file's other changes");
    }
    Ok(())
}

/// Publishes `payload` with `Nats-Msg-Id: msg_id` and waits for the stream's ack. A
/// duplicate inside the window is acked without being stored again.
pub async fn publish(
    js: &jetstream::Context,
    subject: &str,
    msg_id: &str,
    payload: Vec<u8>,
) -> Result<(), StoreError> {
    use jetstream::context::PublishErrorKind;
    let map = |err: jetstream::context::PublishError| match err.kind() {
        PublishErrorKind::TimedOut => StoreError::timeout(StoreKind::Events, err),
        PublishErrorKind::BrokenPipe | PublishErrorKind::StreamNotFound => {
            StoreError::unavailable(StoreKind::Events, err)
        }
        PublishErrorKind::MaxPayloadExceeded => StoreError::InvalidInput {
            what: "event payload",
            reason: "larger than the server's max_payload".into(),
        },
        _ => StoreError::internal(StoreKind::Events, err),
    };
    let payload = bytes::Bytes::from(payload);
    let send = || async {
        let message = jetstream::message::PublishMessage::build()
            .payload(payload.clone())
            .message_id(msg_id);
        js.send_publish(subject.to_owned(), message).await?.await
    };
    match send().await {
        Ok(_) => Ok(()),
        // The server has no stream for the subject: NATS lost its state (restarted without
        // its volume, or a stream was deleted by hand), or is stopping (JetStream answers so
        // while it shuts down). Make the streams where missing and publish once more, rather
        // than refuse every change until a restart of this process.
        Err(err) if err.kind() == PublishErrorKind::StreamNotFound => {
            tracing::warn!(
                subject,
                "the event bus answered that no stream takes this subject (NATS stopping, or \
                 its state lost); making sure the streams exist and publishing again"
            );
            ensure_streams(js).await?;
            send().await.map(|_| ()).map_err(map)
        }
        Err(err) => Err(map(err)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn subjects() {
        assert_eq!(
            files_changed_subject("handbook").unwrap(),
            "kg.files.v1.handbook.changed"
        );
        assert_eq!(
            indexed_subject("team-a_1").unwrap(),
            "kg.index.v1.team-a_1.indexed"
        );
        assert_eq!(dead_letter_subject("x").unwrap(), "kg.files.v1.x.dead");
        assert_eq!(files_removed_subject("x").unwrap(), "kg.files.v1.x.removed");
        assert_eq!(files_flags_subject("x").unwrap(), "kg.files.v1.x.flags");
        assert_eq!(files_purged_subject("x").unwrap(), "kg.files.v1.x.purged");
        assert_eq!(index_purged_subject("x").unwrap(), "kg.index.v1.x.purged");
        for bad in ["", "a.b", "a*", ">", "a b", "ns\n"] {
            assert!(files_changed_subject(bad).is_err(), "{bad:?}");
        }
    }
}

//! NATS JetStream: the ingest event streams and their subjects.
//!
//! - `KG_FILES` holds `kg.files.v1.<ns>.changed` (files service publishes, indexer consumes),
//!   `kg.files.v1.<ns>.removed` (a delete again, for the indexer's removals consumer, so it
//!   never waits behind an ingest backlog) and `kg.files.v1.<ns>.dead` (messages the indexer
//!   gave up on).
//! - `KG_INDEX` holds `kg.index.v1.<ns>.indexed` (indexer publishes when a version is written).
//!
//! Both are file-backed with a 2 minute duplicate window: a publish carries `Nats-Msg-Id`
//! (the file version id), so a retried publish is stored once.

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
    for (name, subjects) in [
        (FILES_STREAM, "kg.files.v1.>"),
        (INDEX_STREAM, "kg.index.v1.>"),
    ] {
        let config = stream::Config {
            name: name.to_owned(),
            subjects: vec![subjects.to_owned()],
            storage: stream::StorageType::File,
            duplicate_window: DUPLICATE_WINDOW,
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
    let message = jetstream::message::PublishMessage::build()
        .payload(payload.into())
        .message_id(msg_id);
    let ack = js
        .send_publish(subject.to_owned(), message)
        .await
        .map_err(map)?;
    ack.await.map_err(map)?;
    Ok(())
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
        for bad in ["", "a.b", "a*", ">", "a b", "ns\n"] {
            assert!(files_changed_subject(bad).is_err(), "{bad:?}");
        }
    }
}

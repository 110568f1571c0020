//! Uploads to a preview branch: metadata and links only.
//!
//! A branch overlays main, so its content must not reach the namespace graph or the vector
//! index (that would overwrite main). The files service publishes a branch upload as a
//! `FileChanged` upsert on `kg.files.v1.<ns>.branch`; this consumer parses the version for
//! its title, dates, tags and ordered links and publishes `FileIndexed` with them, which the
//! files service stores per version id, so `get_knowledge_graph` on the branch has titles and
//! links for branch-only files. Nothing else is written.

use std::sync::Arc;

use kg_common::access::validate_namespace;
use kg_common::caller::now_ms;
use kg_proto::v1::{FileChangeOp, FileChanged, FileIndexed, FileStatus};
use kg_stores::StoreError;
use kg_stores::blobs::BlobStore;
use kg_stores::consumer::{ConsumerSpec, Delivery, Handled};
use kg_stores::events;
use prost::Message as _;
use tokio_util::sync::CancellationToken;

use crate::document::ChunkOptions;
use crate::lanes::{self, LaneHandler};
use crate::pipeline::{self, FileMeta};

/// Subjects of branch uploads, every namespace.
pub const BRANCH_FILTER: &str = "kg.files.v1.*.branch";

/// The branch consumer's durable name and the subjects it reads.
pub(crate) const BRANCH_CONSUMER: (&str, &str) = ("indexer-branch", BRANCH_FILTER);

/// `kg.files.v1.<ns>.branch`: a file version was uploaded to a preview branch of `ns`.
pub fn branch_subject(namespace: &str) -> Result<String, StoreError> {
    validate_namespace(namespace).map_err(|e| StoreError::InvalidInput {
        what: "namespace",
        reason: e.to_string(),
    })?;
    Ok(format!("kg.files.v1.{namespace}.branch"))
}

struct BranchWorker {
    blobs: BlobStore,
    jetstream: async_nats::jetstream::Context,
    chunk: ChunkOptions,
}

/// Consumes branch uploads until `shutdown` (durable `indexer-branch`, one lane).
pub(crate) async fn run(
    blobs: BlobStore,
    jetstream: async_nats::jetstream::Context,
    chunk: ChunkOptions,
    spec: ConsumerSpec,
    shutdown: CancellationToken,
) -> Result<(), StoreError> {
    let spec = ConsumerSpec {
        durable: BRANCH_CONSUMER.0.to_owned(),
        filter_subject: BRANCH_CONSUMER.1.to_owned(),
        ..spec
    };
    let worker = Arc::new(BranchWorker {
        blobs,
        jetstream: jetstream.clone(),
        chunk,
    });
    lanes::run(&jetstream, &spec, &spec.durable, 1, shutdown, worker).await
}

impl LaneHandler for BranchWorker {
    fn key(&self, payload: &[u8]) -> Option<String> {
        FileChanged::decode(payload)
            .ok()
            .map(|event| format!("{}\u{0}{}", event.namespace, event.file_id))
    }

    fn handle<'a>(&'a self, delivery: Delivery<'a>) -> futures::future::BoxFuture<'a, Handled> {
        Box::pin(self.handle(delivery))
    }
}

impl BranchWorker {
    async fn handle(&self, delivery: Delivery<'_>) -> Handled {
        let Ok(event) = FileChanged::decode(delivery.payload) else {
            return Handled::Ack;
        };
        if event.op() != FileChangeOp::Upsert {
            return Handled::Ack;
        }
        // An image or an archive has no metadata or links to read: its content is not fetched.
        if pipeline::document_kind(&event.path, &event.mime).is_err() {
            return Handled::Ack;
        }
        let bytes = match self.blobs.get(&event.blob_key).await {
            Ok(bytes) => bytes,
            Err(StoreError::NotFound { .. }) => {
                tracing::warn!(namespace = %event.namespace, path = %event.path, "branch upload without stored content; no metadata");
                return Handled::Ack;
            }
            Err(err) => return Handled::Retry(err.detail()),
        };
        let meta = FileMeta {
            namespace: event.namespace.clone(),
            file_id: event.file_id.clone(),
            version_id: event.version_id.clone(),
            path: event.path.clone(),
            mime: event.mime.clone(),
            enabled: event.enabled,
            hidden: event.hidden,
        };
        let options = self.chunk.clone();
        let parsed =
            tokio::task::spawn_blocking(move || pipeline::index_document(&meta, &bytes, &options))
                .await;
        let document = match parsed {
            Ok(Ok(document)) => document,
            Ok(Err(err)) => {
                // Main's status is not the branch's to set: the reason goes to the log.
                tracing::warn!(namespace = %event.namespace, path = %event.path, reason = %err, "branch upload not parsed; no metadata");
                return Handled::Ack;
            }
            Err(err) => return Handled::Retry(format!("parse task failed: {err}")),
        };
        let (meta, links) = crate::document::indexed_event_fields(
            &document.file.path,
            &document.meta,
            &document.links,
        );
        let indexed = FileIndexed {
            namespace: event.namespace.clone(),
            file_id: event.file_id.clone(),
            version_id: event.version_id.clone(),
            status: FileStatus::Indexed as i32,
            reason: String::new(),
            // The version's real count: the files service applies it only to a main row of
            // the same version (same content, same chunks).
            chunk_count: i64::try_from(document.chunks.len()).unwrap_or(i64::MAX),
            indexed_at_ms: now_ms(),
            meta: Some(meta),
            links,
            // Tells the files service to store meta and links only: main's row of this
            // version (if pending there) is indexed only once main's graph is written.
            branch_only: true,
            ..Default::default()
        };
        // Its own message id: main's indexed event of the same version is never deduplicated away.
        let msg_id = format!("{}:branch-indexed", event.version_id);
        let published = match events::indexed_subject(&event.namespace) {
            Ok(subject) => {
                events::publish(&self.jetstream, &subject, &msg_id, indexed.encode_to_vec()).await
            }
            Err(err) => Err(err),
        };
        match published {
            Ok(()) => {
                tracing::info!(namespace = %event.namespace, path = %event.path, links = indexed.links.len(), "branch upload: metadata and links published");
                Handled::Ack
            }
            Err(err) => Handled::Retry(err.detail()),
        }
    }
}

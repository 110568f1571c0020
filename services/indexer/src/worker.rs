//! The ingest worker: one durable consumer, one message at a time, acked only
//! after the graph write and the status event are durable.

use std::time::Duration;

use kg_common::caller::now_ms;
use kg_common::{ErrorCode, ErrorExt};
use kg_proto::v1::{FileChangeOp, FileChanged, FileIndexed, FileStatus};
use kg_stores::StoreError;
use kg_stores::blobs::BlobStore;
use kg_stores::consumer::{self, ConsumerSpec, Delivery, Handled};
use kg_stores::events;
use kg_stores::graph::GraphStore;
use prost::Message as _;
use tokio_util::sync::CancellationToken;

use crate::document::ChunkOptions;
use crate::graph_writer;
use crate::pipeline::{self, FileMeta};

/// Settings of the indexer worker.
#[derive(Debug, Clone)]
pub struct IndexerConfig {
    /// Chunk sizes.
    pub chunk: ChunkOptions,
    /// Deliveries of one event before it goes to the dead-letter subject.
    pub max_deliver: i64,
    /// How long one event may take before it is redelivered.
    pub ack_wait: Duration,
}

impl Default for IndexerConfig {
    fn default() -> Self {
        Self {
            chunk: ChunkOptions::default(),
            max_deliver: 5,
            // A crashed worker's message comes back after this long.
            ack_wait: Duration::from_secs(30),
        }
    }
}

/// Why the worker stopped.
#[derive(Debug, thiserror::Error)]
pub enum IndexerError {
    /// A store failed in a way the worker cannot ride out.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ErrorExt for IndexerError {
    fn code(&self) -> ErrorCode {
        match self {
            IndexerError::Store(e) => e.code(),
        }
    }
}

struct Worker {
    graph: GraphStore,
    blobs: BlobStore,
    jetstream: async_nats::jetstream::Context,
    config: IndexerConfig,
}

/// Consumes `kg.files.v1.*.changed` until `shutdown`. Boxed: the worker's
/// future is deep enough to overflow type checking in every caller that spawns it.
pub fn run(
    config: IndexerConfig,
    graph: GraphStore,
    blobs: BlobStore,
    jetstream: async_nats::jetstream::Context,
    shutdown: CancellationToken,
) -> futures::future::BoxFuture<'static, Result<(), IndexerError>> {
    Box::pin(run_worker(config, graph, blobs, jetstream, shutdown))
}

async fn run_worker(
    config: IndexerConfig,
    graph: GraphStore,
    blobs: BlobStore,
    jetstream: async_nats::jetstream::Context,
    shutdown: CancellationToken,
) -> Result<(), IndexerError> {
    events::ensure_streams(&jetstream).await?;
    let spec = ConsumerSpec {
        stream: events::FILES_STREAM.to_owned(),
        durable: "indexer".to_owned(),
        filter_subject: "kg.files.v1.*.changed".to_owned(),
        max_deliver: config.max_deliver,
        ack_wait: config.ack_wait,
    };
    let worker = std::sync::Arc::new(Worker {
        graph,
        blobs,
        jetstream: jetstream.clone(),
        config,
    });
    consumer::run(&jetstream, &spec, shutdown, |delivery| {
        let worker = worker.clone();
        let payload = delivery.payload.to_vec();
        let attempt = delivery.attempt;
        let last_attempt = delivery.last_attempt;
        let subject = delivery.subject.to_owned();
        async move {
            worker
                .handle(Delivery {
                    subject: &subject,
                    payload: &payload,
                    attempt,
                    last_attempt,
                })
                .await
        }
    })
    .await?;
    Ok(())
}

impl Worker {
    async fn handle(&self, delivery: Delivery<'_>) -> Handled {
        let Ok(event) = FileChanged::decode(delivery.payload) else {
            tracing::warn!(
                subject = delivery.subject,
                "dropping undecodable file event"
            );
            return Handled::Ack;
        };
        let result = match event.op() {
            FileChangeOp::Upsert => self.upsert(&event).await,
            FileChangeOp::Delete => {
                graph_writer::delete_file(&self.graph, &event.namespace, &event.file_id)
                    .await
                    .map(|_| ())
                    .map_err(|e| Failure::Retry(e.to_string()))
            }
            FileChangeOp::Flags => graph_writer::set_flags(
                &self.graph,
                &event.namespace,
                &event.file_id,
                event.enabled,
                event.hidden,
            )
            .await
            .map(|_| ())
            .map_err(|e| Failure::Retry(e.to_string())),
            FileChangeOp::Unspecified => Ok(()),
        };
        match result {
            Ok(()) => Handled::Ack,
            Err(Failure::Permanent(reason)) => self.give_up(&event, &reason, false).await,
            Err(Failure::Retry(reason)) if delivery.last_attempt => {
                let reason = format!(
                    "indexing failed after {} attempts: {reason}",
                    delivery.attempt
                );
                self.give_up(&event, &reason, true).await
            }
            Err(Failure::Retry(reason)) => Handled::Retry(reason),
        }
    }

    async fn upsert(&self, event: &FileChanged) -> Result<(), Failure> {
        let bytes = match self.blobs.get(&event.blob_key).await {
            Ok(bytes) => bytes,
            Err(StoreError::NotFound { .. }) => {
                return Err(Failure::Permanent(
                    "the stored content is missing; upload the file again".to_owned(),
                ));
            }
            Err(err) => return Err(Failure::Retry(err.detail())),
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
        let options = self.config.chunk.clone();
        // Parsing and token counting are CPU work: keep them off the async threads.
        let indexed =
            tokio::task::spawn_blocking(move || pipeline::index_document(&meta, &bytes, &options))
                .await
                .map_err(|e| Failure::Retry(format!("indexing task failed: {e}")))?
                .map_err(|e| Failure::Permanent(e.to_string()))?;
        let outcome = graph_writer::write_file(
            &self.graph,
            &indexed.file,
            &indexed.chunks,
            &indexed.outline,
        )
        .await
        .map_err(|e| match e.code() {
            ErrorCode::InvalidArgument => Failure::Permanent(e.to_string()),
            _ => Failure::Retry(e.to_string()),
        })?;
        tracing::info!(
            namespace = %event.namespace,
            path = %event.path,
            chunks = indexed.chunks.len(),
            unchanged = matches!(outcome, graph_writer::WriteOutcome::Unchanged),
            "file indexed"
        );
        self.publish_status(event, FileStatus::Indexed, "", indexed.chunks.len())
            .await
            .map_err(|e| Failure::Retry(e.detail()))?;
        kg_common::metrics::metrics()
            .files_indexed
            .get_or_create(&kg_common::metrics::ToolLabels {
                tool: "indexer".to_owned(),
                outcome: "indexed".to_owned(),
            })
            .inc();
        Ok(())
    }

    /// Records a final failure: status event for users, and the dead-letter
    /// subject when the failure came from running out of retries.
    async fn give_up(&self, event: &FileChanged, reason: &str, dead_letter: bool) -> Handled {
        tracing::warn!(namespace = %event.namespace, path = %event.path, reason, "file not indexed");
        if dead_letter {
            let msg_id = format!("{}:dead:{}", event.version_id, event.changed_at_ms);
            let published = match events::dead_letter_subject(&event.namespace) {
                Ok(subject) => {
                    events::publish(&self.jetstream, &subject, &msg_id, event.encode_to_vec()).await
                }
                Err(err) => Err(err),
            };
            if let Err(err) = published {
                return Handled::Retry(err.detail());
            }
        }
        if event.op() != FileChangeOp::Upsert {
            return Handled::Ack;
        }
        match self
            .publish_status(event, FileStatus::Failed, reason, 0)
            .await
        {
            Ok(()) => {
                kg_common::metrics::metrics()
                    .files_indexed
                    .get_or_create(&kg_common::metrics::ToolLabels {
                        tool: "indexer".to_owned(),
                        outcome: "failed".to_owned(),
                    })
                    .inc();
                Handled::Ack
            }
            Err(err) => Handled::Retry(err.detail()),
        }
    }

    async fn publish_status(
        &self,
        event: &FileChanged,
        status: FileStatus,
        reason: &str,
        chunks: usize,
    ) -> Result<(), StoreError> {
        let indexed = FileIndexed {
            namespace: event.namespace.clone(),
            file_id: event.file_id.clone(),
            version_id: event.version_id.clone(),
            status: status as i32,
            reason: reason.to_owned(),
            chunk_count: i64::try_from(chunks).unwrap_or(i64::MAX),
            indexed_at_ms: now_ms(),
        };
        let msg_id = format!("{}:indexed:{}", event.version_id, status as i32);
        let subject = events::indexed_subject(&event.namespace)?;
        events::publish(&self.jetstream, &subject, &msg_id, indexed.encode_to_vec()).await
    }
}

enum Failure {
    /// Retrying cannot help (bad content): report failed now.
    Permanent(String),
    /// A store hiccup: redeliver with backoff.
    Retry(String),
}

//! The ingest worker: one durable consumer, several files at once on ordered lanes
//! (see `lanes`), each event acked only after its vector and graph writes and the
//! status event are durable. Deletes and flag changes also arrive on consumers of their own,
//! which take them ahead of an ingest backlog.

use std::time::Duration;

use kg_common::caller::now_ms;
use kg_common::{ErrorCode, ErrorExt};
use kg_proto::v1::{FileChangeOp, FileChanged, FileIndexed, FileStatus};
use kg_stores::StoreError;
use kg_stores::blobs::BlobStore;
use kg_stores::consumer::{ConsumerSpec, Delivery, Handled};
use kg_stores::events;
use kg_stores::graph::GraphStore;
use prost::Message as _;
use tokio_util::sync::CancellationToken;

use crate::backfill::FileState;
use crate::document::ChunkOptions;
use crate::flags::{FlagsLedger, NewestFlags};
use crate::graph_writer;
use crate::lanes::{self, LaneHandler};
use crate::pipeline::{self, FileMeta};
use crate::vector_writer::{self, Vectors};

/// Settings of the indexer worker.
#[derive(Debug, Clone)]
pub struct IndexerConfig {
    /// Chunk sizes.
    pub chunk: ChunkOptions,
    /// Deliveries of one event before it goes to the dead-letter subject.
    pub max_deliver: i64,
    /// How long one event may take before it is redelivered.
    pub ack_wait: Duration,
    /// Events handled at once (files on different lanes; one file's events never overlap).
    pub concurrency: usize,
    /// Where chunk and file vectors go; `None` when embeddings are off.
    pub vectors: Option<Vectors>,
    /// Sparse BM25 chunk vectors (the `qdrant_sparse` full-text backend), with or
    /// without embeddings; `None` with the FalkorDB backend.
    pub sparse: Option<crate::sparse::SparseTerms>,
    /// The optional LLM extractor (`[indexer.llm]`); `None` when off.
    pub llm: Option<std::sync::Arc<crate::entities::llm::LlmExtractor>>,
}

impl Default for IndexerConfig {
    fn default() -> Self {
        Self {
            chunk: ChunkOptions::default(),
            max_deliver: 5,
            // A crashed worker's messages (the one it ran, the few pulled ahead) come back
            // after this long; a running one is kept in progress every third of it.
            ack_wait: Duration::from_secs(10),
            concurrency: 4,
            vectors: None,
            sparse: None,
            llm: None,
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
    /// Published TBoxes, for entity extraction.
    tboxes: kg_stores::tbox::TboxBucket,
    /// The newest flags change applied per file.
    flags: FlagsLedger,
    /// Deleted namespaces: their changes made before the purge are dropped.
    purges: std::sync::Arc<crate::purge::Purges>,
    /// (namespace, `rebuild_at_ms`) of the reindex requests this process has begun.
    rebuilds_seen: std::sync::Mutex<std::collections::HashSet<(String, i64)>>,
}

/// Reindex requests a worker remembers having begun (see `Worker::prepare_rebuild`).
const REBUILDS_REMEMBERED: usize = 4096;

/// How long one delivery waits for its namespace's TBox to be readable before it is retried.
/// A bus that lost its state gets its TBoxes back from the ontology service within seconds
/// (`kg_ontology::TBOX_BUS_CHECK_EVERY`); failing at once would spend the file's few deliveries
/// on that wait and leave it failed. The message's progress acks keep it meanwhile.
const TBOX_WAIT: Duration = Duration::from_secs(30);
/// How often that wait asks again.
const TBOX_POLL: Duration = Duration::from_millis(500);

/// The main durable consumer, and the subjects it reads: every change, in order.
pub(crate) const CHANGES_CONSUMER: (&str, &str) = ("indexer", "kg.files.v1.*.changed");

/// Consumes `kg.files.v1.*.changed`, and `kg.files.v1.*.removed` and `kg.files.v1.*.flags`
/// on consumers of their own, until `shutdown`. Boxed: the worker's future is deep enough to
/// overflow type checking in every caller that spawns it.
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
    let tboxes = kg_stores::tbox::TboxBucket::open(&jetstream).await?;
    let flags = FlagsLedger::open(&jetstream).await?;
    let purges = std::sync::Arc::new(crate::purge::Purges::open(&jetstream).await?);
    let spec = ConsumerSpec {
        stream: events::FILES_STREAM.to_owned(),
        durable: CHANGES_CONSUMER.0.to_owned(),
        filter_subject: CHANGES_CONSUMER.1.to_owned(),
        max_deliver: config.max_deliver,
        ack_wait: config.ack_wait,
    };
    let worker = std::sync::Arc::new(Worker {
        graph,
        blobs,
        jetstream: jetstream.clone(),
        config,
        tboxes,
        flags,
        purges,
        rebuilds_seen: std::sync::Mutex::default(),
    });
    let concurrency = worker.config.concurrency;
    // Index definitions can change between releases (the Chunk full-text index gained
    // contextHeader): rebuild them at start, not at each namespace's next write.
    {
        let graph = worker.graph.clone();
        tokio::spawn(async move {
            match graph.ensure_all_indexes().await {
                Ok(namespaces) => tracing::info!(namespaces, "graph indexes checked"),
                Err(err) => {
                    tracing::warn!(error = %err.detail(), "checking graph indexes failed; each namespace is checked again at its next write")
                }
            }
        });
    }
    // Files indexed before embeddings were on, or under an older TBox, are re-indexed through
    // the normal path, and so are a namespace's files each time a TBox is published there.
    // Part of this future, not spawned: a worker that is dropped (killed) leaves no watcher
    // holding its stores.
    let tbox_watch = crate::backfill::watch_tboxes(
        worker.graph.clone(),
        jetstream.clone(),
        worker.config.vectors.clone(),
        worker.tboxes.clone(),
        shutdown.clone(),
    );
    let tbox_watch = async move {
        tbox_watch.await;
        Ok(())
    };
    // Branch uploads: metadata and links only, on their own durable consumer.
    let branch = crate::branch::run(
        worker.blobs.clone(),
        jetstream.clone(),
        worker.config.chunk.clone(),
        spec.clone(),
        shutdown.clone(),
    );
    // Deletes and flag changes again, each on a consumer of its own: on `changed` they wait
    // behind every upload queued before them, so a file removed or hidden during a bulk ingest
    // (a leaked secret, say) would stay searchable until the ingest drained. The shared lease
    // scope keeps one file's events apart across every consumer. A removal, once applied,
    // makes the file's older queued events stale; a flags change leaves them to run, and the
    // flags ledger gives them its newer flags.
    let removals = fast_path(
        &jetstream,
        &spec,
        FastPath {
            worker: std::sync::Arc::clone(&worker),
            kind: FastPathKind::Removals,
        },
        shutdown.clone(),
    );
    let flag_changes = fast_path(
        &jetstream,
        &spec,
        FastPath {
            worker: std::sync::Arc::clone(&worker),
            kind: FastPathKind::FlagChanges,
        },
        shutdown.clone(),
    );
    // Deleted namespaces, on a consumer of their own: a purge never waits behind a backlog.
    let purge = crate::purge::run(
        crate::purge::Purger {
            graph: worker.graph.clone(),
            vectors: worker.config.vectors.clone(),
            sparse: worker.config.sparse.clone(),
            flags: worker.flags.clone(),
            purges: std::sync::Arc::clone(&worker.purges),
            jetstream: jetstream.clone(),
            lease_scope: spec.durable.clone(),
        },
        shutdown.clone(),
    );
    // Change events every consumer acknowledged leave the stream, which otherwise grows by
    // every change ever made.
    let compaction =
        crate::compaction::run(worker.graph.clone(), jetstream.clone(), shutdown.clone());
    let compaction = async move {
        compaction.await;
        Ok(())
    };
    let main = lanes::run(
        &jetstream,
        &spec,
        &spec.durable,
        concurrency,
        shutdown,
        worker,
    );
    tokio::try_join!(
        main,
        branch,
        removals,
        flag_changes,
        purge,
        tbox_watch,
        compaction
    )?;
    Ok(())
}

/// Lanes of each fast-path consumer: a removal or a flags change is a few writes per store.
const FAST_PATH_LANES: usize = 2;

/// The changes that also travel on a subject of their own, ahead of the ingest backlog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FastPathKind {
    /// Deletes, on `kg.files.v1.*.removed`.
    Removals,
    /// Flags changes, on `kg.files.v1.*.flags`.
    FlagChanges,
}

impl FastPathKind {
    /// The one op its subject carries.
    fn op(self) -> FileChangeOp {
        match self {
            FastPathKind::Removals => FileChangeOp::Delete,
            FastPathKind::FlagChanges => FileChangeOp::Flags,
        }
    }

    /// Its durable consumer and the subjects it reads.
    pub(crate) fn consumer(self) -> (&'static str, &'static str) {
        match self {
            FastPathKind::Removals => ("indexer-removals", "kg.files.v1.*.removed"),
            FastPathKind::FlagChanges => ("indexer-flags", "kg.files.v1.*.flags"),
        }
    }
}

/// Runs the fast-path consumer of `handler.kind`, sharing the main consumer's leases.
async fn fast_path(
    jetstream: &async_nats::jetstream::Context,
    main: &ConsumerSpec,
    handler: FastPath,
    shutdown: CancellationToken,
) -> Result<(), StoreError> {
    let (durable, filter_subject) = handler.kind.consumer();
    let spec = ConsumerSpec {
        durable: durable.to_owned(),
        filter_subject: filter_subject.to_owned(),
        ..main.clone()
    };
    lanes::run(
        jetstream,
        &spec,
        &main.durable,
        FAST_PATH_LANES,
        shutdown,
        std::sync::Arc::new(handler),
    )
    .await
}

/// The handler of a fast-path consumer: events of one op only.
struct FastPath {
    worker: std::sync::Arc<Worker>,
    kind: FastPathKind,
}

impl LaneHandler for FastPath {
    fn key(&self, payload: &[u8]) -> Option<String> {
        self.worker.key(payload)
    }

    fn handle<'a>(&'a self, delivery: Delivery<'a>) -> futures::future::BoxFuture<'a, Handled> {
        Box::pin(async move {
            match FileChanged::decode(delivery.payload) {
                Ok(event) if event.op() == self.kind.op() => self.worker.handle(delivery).await,
                _ => {
                    tracing::warn!(
                        subject = delivery.subject,
                        "dropping an event that does not belong on this subject"
                    );
                    Handled::Ack
                }
            }
        })
    }

    fn records_progress(&self) -> bool {
        // The uploads queued before a flags change must still run (with its flags).
        self.kind != FastPathKind::FlagChanges
    }

    fn repair(&self) -> futures::future::BoxFuture<'_, Result<(), StoreError>> {
        LaneHandler::repair(&*self.worker)
    }
}

impl LaneHandler for Worker {
    fn key(&self, payload: &[u8]) -> Option<String> {
        FileChanged::decode(payload)
            .ok()
            .map(|event| format!("{}\u{0}{}", event.namespace, event.file_id))
    }

    fn handle<'a>(&'a self, delivery: Delivery<'a>) -> futures::future::BoxFuture<'a, Handled> {
        Box::pin(Worker::handle(self, delivery))
    }

    fn repair(&self) -> futures::future::BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async {
            self.flags.ensure_bucket(&self.jetstream).await?;
            self.purges.ensure_bucket(&self.jetstream).await
        })
    }
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
        let result = match self.outdated_by_purge(&event).await {
            Ok(true) => Ok(()),
            Ok(false) => match event.op() {
                FileChangeOp::Upsert => self.upsert(&event, delivery.sequence).await,
                FileChangeOp::Delete => self.delete(&event).await,
                FileChangeOp::Flags => self.set_flags(&event, delivery.sequence).await,
                FileChangeOp::Unspecified => Ok(()),
            },
            Err(failure) => Err(failure),
        };
        match result {
            Ok(()) => Handled::Ack,
            Err(Failure::Permanent(reason)) => self.give_up(&event, &reason, false).await,
            Err(Failure::NotIndexed(reason)) => self.keep_unindexed(&event, &reason).await,
            Err(Failure::Retry { reason, detail }) if delivery.last_attempt => {
                tracing::warn!(namespace = %event.namespace, path = %event.path, detail, "last attempt failed");
                // The registry's reason is read by admins and agents: the store's own words
                // (driver text, addresses) stay in the log above.
                let reason = format!(
                    "indexing failed after {} attempts: {reason}",
                    delivery.attempt
                );
                self.give_up(&event, &reason, true).await
            }
            Err(Failure::Retry { detail, .. }) => Handled::Retry(detail),
        }
    }

    /// Whether the event was made before its namespace was deleted (it is dropped then).
    async fn outdated_by_purge(&self, event: &FileChanged) -> Result<bool, Failure> {
        let outdated = self
            .purges
            .outdated(&self.graph, &event.namespace, event.changed_at_ms)
            .await
            .map_err(|e| Failure::retry(&e))?;
        if outdated {
            kg_common::metrics::metrics().purged_events_dropped.inc();
            tracing::info!(namespace = %event.namespace, path = %event.path, "dropping a change made before its namespace was deleted");
        }
        Ok(outdated)
    }

    /// Indexes the event's version; `sequence` is the event's place in the stream.
    async fn upsert(&self, event: &FileChanged, sequence: u64) -> Result<(), Failure> {
        let state = crate::backfill::file_state(&self.graph, &event.namespace, &event.file_id)
            .await
            .map_err(|e| Failure::retry(&e))?;
        // A re-queued event (the vector backfill) re-indexes what the graph holds: the file may
        // have been deleted or replaced since the stream was scanned.
        if event.requeued
            && state.as_ref().and_then(|s| s.version_id.as_deref())
                != Some(event.version_id.as_str())
        {
            tracing::info!(namespace = %event.namespace, path = %event.path, "skipping a re-queued upsert of a version the graph no longer holds");
            return Ok(());
        }
        // An event older than the version the graph holds (a late redelivery, a re-queued
        // backfill) must never replace it.
        if let Some(FileState {
            version_id: Some(version),
            changed_at_ms: Some(changed_at),
            ..
        }) = &state
            && *version != event.version_id
            && *changed_at > event.changed_at_ms
        {
            tracing::info!(namespace = %event.namespace, path = %event.path, "skipping an upsert older than the indexed version");
            return Ok(());
        }
        // An image or an archive is kept by the files service and never indexed: said before
        // its content is fetched, and not as a failure, so nothing retries it.
        if let Err(not_indexed) = pipeline::document_kind(&event.path, &event.mime) {
            return Err(Failure::NotIndexed(not_indexed.to_string()));
        }
        let (enabled, hidden) = self.upsert_flags(event, sequence, state.as_ref()).await?;
        // A rebuild trusts nothing the stores hold of the version: the graph may have been
        // restored from an old dump or lost, the vectors too, or an older release indexed it.
        if event.rebuild_at_ms != 0 {
            self.prepare_rebuild(event)
                .await
                .map_err(|e| Failure::retry(&e))?;
        }
        self.wait_for_tbox(&event.namespace).await?;
        // Re-queued after a TBox publish: this replica may not have seen the publish yet, and
        // the re-queue is made once, so read the TBox now rather than from the cache.
        if event.requeued {
            self.tboxes
                .refresh(&event.namespace)
                .await
                .map_err(|e| Failure::retry(&e))?;
        }
        let bytes = match self.blobs.get(&event.blob_key).await {
            Ok(bytes) => bytes,
            Err(StoreError::NotFound { .. }) => {
                // Often a deployment fault rather than a lost blob: the files service writes
                // where this indexer does not read. The log names the directory (a server
                // path: not for the file's reason, which readers see).
                tracing::warn!(
                    blob_key = %event.blob_key,
                    blob_dir = %self.blobs.root().display(),
                    "the content of an upload is not in this indexer's blob_dir; files and the \
                     indexer must share one blob volume"
                );
                return Err(Failure::Permanent(
                    "the stored content is missing: upload the file again; if every upload \
                     fails so, the indexer does not share the files service's blob_dir"
                        .to_owned(),
                ));
            }
            Err(err) => return Err(Failure::retry(&err)),
        };
        let meta = FileMeta {
            namespace: event.namespace.clone(),
            file_id: event.file_id.clone(),
            version_id: event.version_id.clone(),
            path: event.path.clone(),
            mime: event.mime.clone(),
            enabled,
            hidden,
        };
        let options = self.config.chunk.clone();
        // Parsing and token counting are CPU work: keep them off the async threads.
        let indexed =
            tokio::task::spawn_blocking(move || pipeline::index_document(&meta, &bytes, &options))
                .await
                .map_err(|e| Failure::Retry {
                    reason: "the indexing task failed".to_owned(),
                    detail: format!("indexing task failed: {e}"),
                })?
                .map_err(|e| Failure::Permanent(e.to_string()))?;
        // Vectors first: the graph marks the version done last, so a crash in between
        // redoes both. A version this embedder already wrote is not embedded again.
        let vector_stamp = self
            .config
            .vectors
            .as_ref()
            .map(|v| crate::backfill::vector_stamp(v, &event.version_id));
        let vectors_written = vector_stamp.is_some()
            && state.as_ref().and_then(|s| s.vector_stamp.as_deref()) == vector_stamp.as_deref()
            && graph_is_current(&self.graph, &indexed).await;
        if let Some(vectors) = &self.config.vectors
            && !vectors_written
        {
            let written = vector_writer::write_vectors(vectors, &indexed)
                .await
                .map_err(|e| match e.code() {
                    ErrorCode::InvalidArgument => Failure::Permanent(e.to_string()),
                    // Embedder down or out of retries: redeliver, never drop.
                    _ => Failure::retry(&e),
                })?;
            tracing::debug!(namespace = %event.namespace, path = %event.path, points = written.points, embedded = written.embedded, reused = written.reused, "vectors written");
        }
        if let Some(sparse) = &self.config.sparse
            && !graph_is_current(&self.graph, &indexed).await
        {
            crate::sparse::write_sparse(sparse, &indexed)
                .await
                .map_err(|e| match e.code() {
                    ErrorCode::InvalidArgument => Failure::Permanent(e.to_string()),
                    _ => Failure::retry(&e),
                })?;
        }
        // Checked again before the first write: the namespace may have been deleted while the
        // version was parsed and embedded (what slips past is removed by the purge, which
        // waits for this event to end).
        if self.outdated_by_purge(event).await? {
            return Ok(());
        }
        let outcome = graph_writer::write_document(
            &self.graph,
            &indexed.file,
            &indexed.meta,
            &indexed.chunks,
            &indexed.outline,
        )
        .await
        .map_err(|e| match e.code() {
            ErrorCode::InvalidArgument => Failure::Permanent(e.to_string()),
            _ => Failure::retry(&e),
        })?;
        let entities = crate::entity_writer::index_entities_with(
            &self.graph,
            &self.tboxes,
            &indexed.file,
            &indexed.chunks,
            self.config.llm.as_deref(),
        )
        .await
        .map_err(|e| Failure::retry(&e))?;
        crate::backfill::mark_written(&self.graph, event, vector_stamp.as_deref())
            .await
            .map_err(|e| Failure::retry(&e))?;
        let llm = entities.llm.unwrap_or_default();
        tracing::info!(
            namespace = %event.namespace,
            path = %event.path,
            chunks = indexed.chunks.len(),
            unchanged = matches!(outcome, graph_writer::WriteOutcome::Unchanged),
            llm_requests = llm.requests,
            llm_prompt_tokens = llm.usage.prompt_tokens,
            llm_completion_tokens = llm.usage.completion_tokens,
            llm_failed_batches = llm.failed_batches,
            llm_dropped = llm.dropped,
            "file indexed"
        );
        self.publish_status(event, FileStatus::Indexed, "", Some(&indexed))
            .await
            .map_err(|e| Failure::retry(&e))?;
        kg_common::metrics::metrics()
            .files_indexed
            .get_or_create(&kg_common::metrics::IndexedLabels {
                outcome: "indexed".to_owned(),
            })
            .inc();
        Ok(())
    }

    /// Before a rebuild of `event`'s version: forgets what this process remembers of the
    /// namespace's graph (its indexes and TBox nodes may be gone with a lost graph) once per
    /// reindex request, and marks the version unwritten, so that every store is written again
    /// (and a crash midway redoes it all).
    async fn prepare_rebuild(&self, event: &FileChanged) -> Result<(), StoreError> {
        let first_of_request = self
            .rebuilds_seen
            .lock()
            .map(|mut seen| {
                // Bounded: forgetting an old request only costs one more check of the graph.
                if seen.len() >= REBUILDS_REMEMBERED {
                    seen.clear();
                }
                seen.insert((event.namespace.clone(), event.rebuild_at_ms))
            })
            .unwrap_or(true);
        if first_of_request {
            crate::graph_writer::forget_namespace(&self.graph, &event.namespace);
            crate::entity_writer::forget_namespace(&self.graph, &event.namespace);
        }
        crate::backfill::mark_unwritten(&self.graph, event).await
    }

    /// The flags an upsert is written with. A re-queued event takes the graph's, which are the
    /// newest applied. Any other takes the newer of its own and the file's newest flags change
    /// applied: a change that overtook it on the fast path is newer than the event.
    async fn upsert_flags(
        &self,
        event: &FileChanged,
        sequence: u64,
        state: Option<&FileState>,
    ) -> Result<(bool, bool), Failure> {
        if event.requeued
            && let Some(flags) = state.and_then(|s| s.flags)
        {
            return Ok(flags);
        }
        let newest = self
            .flags
            .newest(&event.namespace, &event.file_id)
            .await
            .map_err(|e| Failure::retry(&e))?;
        Ok(match newest {
            Some(newest) if newest.newer_than(event.flags_version, sequence) => {
                (newest.enabled, newest.hidden)
            }
            _ => (event.enabled, event.hidden),
        })
    }

    /// Waits up to [`TBOX_WAIT`] until the namespace's TBox (or its absence) can be read, so the
    /// entities are extracted with it and never without it for want of a read: a bucket that
    /// NATS lost, or that was made again empty before the ontology service put the namespace's
    /// TBox back, is waited out (see `entity_writer::published_tbox`).
    async fn wait_for_tbox(&self, namespace: &str) -> Result<(), Failure> {
        let deadline = tokio::time::Instant::now() + TBOX_WAIT;
        loop {
            match crate::entity_writer::published_tbox(&self.graph, &self.tboxes, namespace).await {
                Ok(_) => return Ok(()),
                Err(err) if tokio::time::Instant::now() >= deadline => {
                    return Err(Failure::retry(&err));
                }
                Err(err) => {
                    tracing::debug!(namespace, error = %kg_common::error::detail(&err), "the TBox is unreadable; waiting for it");
                    tokio::time::sleep(TBOX_POLL).await;
                }
            }
        }
    }

    /// Removes the file from the graph and the vector index.
    async fn delete(&self, event: &FileChanged) -> Result<(), Failure> {
        // Before the FileRef goes: it lists the entities whose orphans must go too.
        crate::entity_writer::delete_file_entities(&self.graph, &event.namespace, &event.file_id)
            .await
            .map_err(|e| Failure::retry(&e))?;
        graph_writer::delete_file(&self.graph, &event.namespace, &event.file_id)
            .await
            .map_err(|e| Failure::retry(&e))?;
        if let Some(vectors) = &self.config.vectors {
            vectors
                .index
                .delete_file(&event.namespace, &event.file_id)
                .await
                .map_err(|e| Failure::retry(&e))?;
        }
        if let Some(sparse) = &self.config.sparse {
            sparse
                .index
                .delete_file(&event.namespace, &event.file_id)
                .await
                .map_err(|e| Failure::retry(&e))?;
        }
        self.flags
            .forget(&event.namespace, &event.file_id)
            .await
            .map_err(|e| Failure::retry(&e))?;
        Ok(())
    }

    /// Sets enabled/hidden in the graph and on every vector of the file, unless a newer flags
    /// change was applied already (this is the in-order copy of one that took the fast path,
    /// a change made just before another but published after it, or a late redelivery).
    async fn set_flags(&self, event: &FileChanged, sequence: u64) -> Result<(), Failure> {
        let newest = self
            .flags
            .newest(&event.namespace, &event.file_id)
            .await
            .map_err(|e| Failure::retry(&e))?;
        if newest.is_some_and(|newest| newest.newer_than(event.flags_version, sequence)) {
            tracing::info!(namespace = %event.namespace, path = %event.path, "skipping a flags change older than one applied");
            return Ok(());
        }
        graph_writer::set_flags(
            &self.graph,
            &event.namespace,
            &event.file_id,
            event.enabled,
            event.hidden,
        )
        .await
        .map_err(|e| Failure::retry(&e))?;
        crate::entity_writer::set_relation_flags(
            &self.graph,
            &event.namespace,
            &event.file_id,
            event.enabled,
            event.hidden,
        )
        .await
        .map_err(|e| Failure::retry(&e))?;
        if let Some(vectors) = &self.config.vectors {
            vectors
                .index
                .set_file_flags(
                    &event.namespace,
                    &event.file_id,
                    event.enabled,
                    event.hidden,
                )
                .await
                .map_err(|e| Failure::retry(&e))?;
        }
        if let Some(sparse) = &self.config.sparse {
            sparse
                .index
                .set_file_flags(
                    &event.namespace,
                    &event.file_id,
                    event.enabled,
                    event.hidden,
                )
                .await
                .map_err(|e| Failure::retry(&e))?;
        }
        self.flags
            .record(
                &event.namespace,
                &event.file_id,
                NewestFlags {
                    flags_version: event.flags_version,
                    sequence,
                    enabled: event.enabled,
                    hidden: event.hidden,
                },
            )
            .await
            .map_err(|e| Failure::retry(&e))?;
        Ok(())
    }

    /// Reports a version of a type the indexer does not read as stored, with why: the files
    /// service keeps it (listed, a link target), and uploading it again queues nothing.
    async fn keep_unindexed(&self, event: &FileChanged, reason: &str) -> Handled {
        tracing::info!(namespace = %event.namespace, path = %event.path, reason, "file stored, not indexed");
        self.report_final(event, FileStatus::Stored, reason).await
    }

    /// Publishes a final outcome that is not an index (stored, failed) and counts it; a
    /// publish that fails is retried.
    async fn report_final(&self, event: &FileChanged, status: FileStatus, reason: &str) -> Handled {
        match self.publish_status(event, status, reason, None).await {
            Ok(()) => {
                let outcome = if status == FileStatus::Stored {
                    "stored"
                } else {
                    "failed"
                };
                kg_common::metrics::metrics()
                    .files_indexed
                    .get_or_create(&kg_common::metrics::IndexedLabels {
                        outcome: outcome.to_owned(),
                    })
                    .inc();
                Handled::Ack
            }
            Err(err) => Handled::Retry(err.detail()),
        }
    }

    /// Records a final failure: status event for users, and the dead-letter
    /// subject when the failure came from running out of retries.
    async fn give_up(&self, event: &FileChanged, reason: &str, dead_letter: bool) -> Handled {
        tracing::warn!(namespace = %event.namespace, path = %event.path, reason, "file not indexed");
        if dead_letter {
            let msg_id = format!(
                "{}:dead:{}:{}",
                event.version_id, event.changed_at_ms, event.rebuild_at_ms
            );
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
        self.report_final(event, FileStatus::Failed, reason).await
    }

    async fn publish_status(
        &self,
        event: &FileChanged,
        status: FileStatus,
        reason: &str,
        document: Option<&pipeline::IndexedDocument>,
    ) -> Result<(), StoreError> {
        let chunks = document.map_or(0, |d| d.chunks.len());
        // Metadata and links travel with the status, stored per version by the files service.
        let (meta, links) = document
            .map(|d| {
                let (meta, links) =
                    crate::document::indexed_event_fields(&d.file.path, &d.meta, &d.links);
                (Some(meta), links)
            })
            .unwrap_or_default();
        let indexed = FileIndexed {
            namespace: event.namespace.clone(),
            file_id: event.file_id.clone(),
            version_id: event.version_id.clone(),
            status: status as i32,
            reason: reason.to_owned(),
            chunk_count: i64::try_from(chunks).unwrap_or(i64::MAX),
            indexed_at_ms: now_ms(),
            meta,
            links,
            branch_only: false,
            rebuild_at_ms: event.rebuild_at_ms,
        };
        // One outcome per change event (a redelivery of the event dedupes): a rebuild's, or
        // an upload's of content the file held before (a revert, or a path back after a
        // delete: the same version id), is news even when that version's earlier outcome is
        // still in the stream's duplicate window.
        let msg_id = format!(
            "{}:indexed:{}:{}:{}",
            event.version_id, status as i32, event.changed_at_ms, event.rebuild_at_ms
        );
        let subject = events::indexed_subject(&event.namespace)?;
        events::publish(&self.jetstream, &subject, &msg_id, indexed.encode_to_vec()).await
    }
}

/// Whether the graph already holds this exact version (same version id, path and chunk
/// keys), i.e. its vectors were written too. Any doubt answers no.
async fn graph_is_current(graph: &GraphStore, doc: &pipeline::IndexedDocument) -> bool {
    graph_writer::is_current(graph, &doc.file, &doc.chunks)
        .await
        .unwrap_or(false)
}

enum Failure {
    /// Retrying cannot help (bad content): report failed now.
    Permanent(String),
    /// A store hiccup: redeliver with backoff.
    Retry {
        /// What the file's status says if every attempt fails: the error's own message,
        /// which names the store and never the driver's words.
        reason: String,
        /// The whole chain, for the log.
        detail: String,
    },
    /// Not a type the indexer reads (an image, an archive): the file is kept, not indexed.
    NotIndexed(String),
}

impl Failure {
    fn retry<E: std::error::Error + ?Sized>(err: &E) -> Self {
        Failure::Retry {
            reason: err.to_string(),
            detail: kg_common::error::detail(err),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use kg_stores::error::{StoreError, StoreKind};

    use super::Failure;

    #[test]
    fn a_retry_keeps_the_drivers_words_for_the_log_only() {
        let driver = "connection refused by 10.0.0.7:6379 (redis://:hunter2@graph)";
        let Failure::Retry { reason, detail } =
            Failure::retry(&StoreError::unavailable(StoreKind::Graph, driver))
        else {
            panic!("a store error is retried");
        };
        assert_eq!(reason, "graph store is unavailable");
        assert_eq!(detail, format!("graph store is unavailable: {driver}"));
    }
}

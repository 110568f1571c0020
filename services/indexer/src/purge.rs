//! Deleting a namespace, the indexer's part: on `kg.files.v1.<ns>.purged` the namespace's
//! graph, vectors (dense and sparse) and flags records go, and `kg.index.v1.<ns>.purged`
//! reports it to the files service, which lets the name be used again only then.
//!
//! Change events of the namespace may still be queued behind the purge (it travels on a
//! consumer of its own) or running on a replica. So the purge is recorded first, in a KV
//! bucket every replica reads before each event: an event made at or before the request
//! (`changed_at_ms` against `requested_at_ms`, both the files service's clock) is dropped,
//! however late it comes, and even once a namespace of the same name exists again. An event
//! already past that check when the record lands (an upsert checks again just before its first
//! write) still holds its file's lease: the purge removes everything once, waits until no lease
//! of the namespace is held on any replica, and removes everything again before it reports.
//! An event that takes a lease after that wait began reads the record and is dropped.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use kg_common::caller::now_ms;
use kg_proto::v1::NamespacePurged;
use kg_stores::StoreError;
use kg_stores::consumer::{self, ConsumerSpec, Handled};
use kg_stores::error::StoreKind;
use kg_stores::events;
use kg_stores::graph::GraphStore;
use prost::Message as _;
use tokio_util::sync::CancellationToken;

use crate::events_err;
use crate::flags::FlagsLedger;

/// One entry per deleted namespace: when its last purge was asked for.
const PURGES_BUCKET: &str = "kg_indexer_purges";

/// How often the purge asks whether events of the namespace still run.
const RUNNING_POLL: Duration = Duration::from_millis(200);
/// How long a purge delivered to an indexer that died waits to be delivered again. The wait
/// for running events lasts as long as the slowest of them (a large file's LLM extraction),
/// and the purge is kept in progress meanwhile; with 15 minutes here and no progress, an
/// indexer killed during a namespace deletion held it up for those 15 minutes.
const PURGE_ACK_WAIT: Duration = Duration::from_secs(30);

/// The shared record of deleted namespaces, and what this process last saw of it.
pub(crate) struct Purges {
    bucket: kv::Store,
    /// The purge time last seen per namespace: a newer one means the namespace's graph was
    /// dropped (by any replica), so what this process remembers of it must go.
    seen: Mutex<HashMap<String, i64>>,
}

impl Purges {
    /// Opens (or creates) the bucket.
    pub(crate) async fn open(js: &jetstream::Context) -> Result<Self, StoreError> {
        Ok(Purges {
            bucket: Self::bucket(js).await?,
            seen: Mutex::default(),
        })
    }

    /// Makes the bucket again if NATS lost it (the handle addresses it by name). The records
    /// go with the stream whose events they guard; the files service asks again for every
    /// purge not reported done.
    pub(crate) async fn ensure_bucket(&self, js: &jetstream::Context) -> Result<(), StoreError> {
        Self::bucket(js).await.map(|_| ())
    }

    async fn bucket(js: &jetstream::Context) -> Result<kv::Store, StoreError> {
        js.create_or_update_key_value(kv::Config {
            bucket: PURGES_BUCKET.to_owned(),
            description: "indexer: when each deleted namespace's purge was asked for".to_owned(),
            history: 1,
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await
        .map_err(events_err)
    }

    /// When the namespace's last purge was asked for, if it ever was. An entry this code
    /// cannot read is an error, never "none": a deleted namespace's backlog could come back.
    pub(crate) async fn requested_at(&self, namespace: &str) -> Result<Option<i64>, StoreError> {
        let Some(value) = self
            .bucket
            .get(hex::encode(namespace))
            .await
            .map_err(events_err)?
        else {
            return Ok(None);
        };
        std::str::from_utf8(&value)
            .ok()
            .and_then(|text| text.parse().ok())
            .map(Some)
            .ok_or_else(|| {
                StoreError::internal(
                    StoreKind::Events,
                    "an entry of the indexer's purges bucket is malformed",
                )
            })
    }

    /// Whether an event of `namespace` made at `changed_at_ms` was made before the
    /// namespace's last purge. Forgets what this process remembers of the namespace's graph
    /// the first time it sees a purge.
    pub(crate) async fn outdated(
        &self,
        graph: &GraphStore,
        namespace: &str,
        changed_at_ms: i64,
    ) -> Result<bool, StoreError> {
        let Some(requested_at) = self.requested_at(namespace).await? else {
            return Ok(false);
        };
        let first_sight = self
            .seen
            .lock()
            .map(|mut seen| seen.insert(namespace.to_owned(), requested_at) != Some(requested_at))
            .unwrap_or(true);
        if first_sight {
            forget_graph(graph, namespace);
        }
        Ok(changed_at_ms <= requested_at)
    }

    /// Records the purge asked for at `requested_at_ms`, unless a later one is recorded.
    async fn record(&self, namespace: &str, requested_at_ms: i64) -> Result<(), StoreError> {
        if self
            .requested_at(namespace)
            .await?
            .is_some_and(|recorded| recorded >= requested_at_ms)
        {
            return Ok(());
        }
        self.bucket
            .put(
                hex::encode(namespace),
                Bytes::from(requested_at_ms.to_string()),
            )
            .await
            .map_err(events_err)?;
        Ok(())
    }
}

/// What this process remembers of a namespace's graph (indexes made, TBox nodes written).
fn forget_graph(graph: &GraphStore, namespace: &str) {
    crate::graph_writer::forget_namespace(graph, namespace);
    crate::entity_writer::forget_namespace(graph, namespace);
}

/// What the purge consumer removes from.
pub(crate) struct Purger {
    pub graph: GraphStore,
    pub vectors: Option<crate::vector_writer::Vectors>,
    pub sparse: Option<crate::sparse::SparseTerms>,
    pub flags: FlagsLedger,
    pub purges: std::sync::Arc<Purges>,
    pub jetstream: jetstream::Context,
    /// The scope of the lanes' leases (the main consumer's durable name).
    pub lease_scope: String,
}

impl Purger {
    /// Removes everything the indexer wrote for the namespace.
    async fn remove(&self, namespace: &str) -> Result<(), String> {
        self.graph
            .delete_graph(namespace)
            .await
            .map_err(|e| e.detail())?;
        forget_graph(&self.graph, namespace);
        if let Some(vectors) = &self.vectors {
            vectors
                .index
                .delete_namespace(namespace)
                .await
                .map_err(|e| e.to_string())?;
        }
        if let Some(sparse) = &self.sparse {
            sparse
                .index
                .delete_namespace(namespace)
                .await
                .map_err(|e| e.to_string())?;
        }
        self.flags
            .forget_namespace(namespace)
            .await
            .map_err(|e| e.detail())?;
        Ok(())
    }

    /// Waits until no event of the namespace runs on any replica (see the module).
    async fn wait_while_running(&self, namespace: &str) -> Result<(), String> {
        let prefix = format!("{namespace}\u{0}");
        let started = std::time::Instant::now();
        loop {
            let running = crate::lanes::Leases::held(&self.jetstream, &self.lease_scope, &prefix)
                .await
                .map_err(|e| e.detail())?;
            if running == 0 {
                return Ok(());
            }
            tracing::debug!(
                namespace,
                running,
                waited_ms = started.elapsed().as_millis(),
                "waiting for events of a deleted namespace to end"
            );
            tokio::time::sleep(RUNNING_POLL).await;
        }
    }

    async fn purge(&self, event: &NamespacePurged) -> Result<(), String> {
        let namespace = event.namespace.as_str();
        self.purges
            .record(namespace, event.requested_at_ms)
            .await
            .map_err(|e| e.detail())?;
        self.remove(namespace).await?;
        self.wait_while_running(namespace).await?;
        self.remove(namespace).await?;
        let subject = events::index_purged_subject(namespace).map_err(|e| e.detail())?;
        let msg_id = format!("purged:{namespace}:{}", event.requested_at_ms);
        events::publish(&self.jetstream, &subject, &msg_id, event.encode_to_vec())
            .await
            .map_err(|e| e.detail())?;
        kg_common::metrics::metrics().namespaces_purged.inc();
        tracing::info!(
            namespace,
            requested_at_ms = event.requested_at_ms,
            purged_at_ms = now_ms(),
            "deleted namespace's graph, vectors and flags removed"
        );
        Ok(())
    }
}

/// The purge consumer's durable name and the subjects it reads.
pub(crate) const PURGES_CONSUMER: (&str, &str) = ("indexer-purges", "kg.files.v1.*.purged");

/// Consumes `kg.files.v1.*.purged` until `shutdown`.
pub(crate) async fn run(purger: Purger, shutdown: CancellationToken) -> Result<(), StoreError> {
    let spec = ConsumerSpec {
        stream: events::FILES_STREAM.to_owned(),
        durable: PURGES_CONSUMER.0.to_owned(),
        filter_subject: PURGES_CONSUMER.1.to_owned(),
        // A purge must happen: a store that is down is waited for (the backoff caps at 60 s).
        max_deliver: 1000,
        ack_wait: PURGE_ACK_WAIT,
    };
    let jetstream = purger.jetstream.clone();
    let purger = &purger;
    consumer::run(&jetstream, &spec, shutdown, |delivery| {
        let payload = delivery.payload.to_vec();
        async move {
            let Ok(event) = NamespacePurged::decode(payload.as_slice()) else {
                tracing::warn!("dropping an undecodable namespace purge");
                return Handled::Ack;
            };
            match purger.purge(&event).await {
                Ok(()) => Handled::Ack,
                Err(reason) => {
                    tracing::warn!(namespace = %event.namespace, reason, "removing a deleted namespace failed; retrying");
                    Handled::Retry(reason)
                }
            }
        }
    })
    .await
}

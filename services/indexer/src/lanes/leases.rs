//! What keeps one file's events in order across indexer replicas. A lane orders the events
//! of a key inside one process; a second replica pulling from the same durable consumer could
//! run a newer event of the same file at once, and an older one finishing last would win. So
//! before it runs an event a lane takes the key's lease in a JetStream KV bucket (create only
//! if absent, renewed while the event runs, expiring when its holder dies), and the highest
//! stream sequence applied per key is kept in a second bucket that every replica reads.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use crate::events_err;
use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use kg_stores::StoreError;
use tokio_util::sync::CancellationToken;

/// Leases of keys being indexed (one entry per key while an event of it runs).
const LEASE_BUCKET: &str = "kg_indexer_leases";
/// The highest stream sequence applied per key.
const APPLIED_BUCKET: &str = "kg_indexer_applied";
/// A lease not renewed for this long is gone: its holder stopped. After a crash, the file it
/// was indexing waits this long at most before another replica (or the restarted one) runs it.
pub(crate) const LEASE_TTL: Duration = Duration::from_secs(15);
/// How often a running event renews its lease.
pub(crate) const RENEW_EVERY: Duration = Duration::from_secs(5);
/// How often a lane asks again for a lease another replica holds.
const BUSY_RETRY: Duration = Duration::from_millis(100);

/// The shared buckets, and who this replica is.
pub(crate) struct Leases {
    leases: kv::Store,
    applied: kv::Store,
    owner: Bytes,
    /// The incarnation of the stream the consumer reads (see `kg_stores::consumer`).
    incarnation: AtomicI64,
}

/// A lease this replica holds on one key.
pub(crate) struct Lease {
    key: String,
    revision: u64,
}

impl Leases {
    /// Opens (or creates) both buckets, for a consumer of the stream's `incarnation`.
    pub(crate) async fn open(
        js: &jetstream::Context,
        incarnation: i64,
    ) -> Result<Self, StoreError> {
        let (leases, applied) = Self::buckets(js).await?;
        Ok(Leases {
            leases,
            applied,
            owner: Bytes::from(uuid::Uuid::new_v4().to_string()),
            incarnation: AtomicI64::new(incarnation),
        })
    }

    /// The incarnation of the stream the consumer reads now.
    pub(crate) fn incarnation(&self) -> i64 {
        self.incarnation.load(Ordering::SeqCst)
    }

    /// The consumer was opened again on the stream's `incarnation`; returns the one before.
    pub(crate) fn set_incarnation(&self, incarnation: i64) -> i64 {
        self.incarnation.swap(incarnation, Ordering::SeqCst)
    }

    /// Makes both buckets again if NATS lost them. The handles address them by name, so
    /// they work again once the buckets exist.
    pub(crate) async fn ensure_buckets(&self, js: &jetstream::Context) -> Result<(), StoreError> {
        Self::buckets(js).await.map(|_| ())
    }

    async fn buckets(js: &jetstream::Context) -> Result<(kv::Store, kv::Store), StoreError> {
        let bucket = |name: &str, description: &str, max_age| kv::Config {
            bucket: name.to_owned(),
            description: description.to_owned(),
            history: 1,
            max_age,
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        };
        let leases = js
            .create_or_update_key_value(bucket(
                LEASE_BUCKET,
                "indexer replicas: who runs an event of a file now",
                LEASE_TTL,
            ))
            .await
            .map_err(events_err)?;
        let applied = js
            .create_or_update_key_value(bucket(
                APPLIED_BUCKET,
                "indexer replicas: highest stream sequence applied per file",
                Duration::ZERO,
            ))
            .await
            .map_err(events_err)?;
        Ok((leases, applied))
    }

    /// The bucket key of a lane key in `scope` (see [`super::run`]): KV keys allow few
    /// characters.
    pub(crate) fn bucket_key(scope: &str, key: &str) -> String {
        format!("{scope}.{}", hex::encode(key.as_bytes()))
    }

    /// How many leases of `scope` are held now on lane keys starting with `key_prefix`: the
    /// events of those keys running on any replica.
    pub(crate) async fn held(
        js: &jetstream::Context,
        scope: &str,
        key_prefix: &str,
    ) -> Result<usize, StoreError> {
        use futures::TryStreamExt as _;
        let bucket = js.get_key_value(LEASE_BUCKET).await.map_err(events_err)?;
        // Hex keeps byte order: the bucket keys of the prefix's lane keys start with this.
        let prefix = Self::bucket_key(scope, key_prefix);
        bucket
            .keys()
            .await
            .map_err(events_err)?
            .try_filter(|key| std::future::ready(key.starts_with(&prefix)))
            .try_fold(0, |held, _| std::future::ready(Ok(held + 1)))
            .await
            .map_err(events_err)
    }

    /// Waits until this replica holds the lease of `key`; `None` if `shutdown` came first.
    pub(crate) async fn acquire(
        &self,
        key: &str,
        shutdown: &CancellationToken,
    ) -> Result<Option<Lease>, StoreError> {
        loop {
            match self.leases.create(key, self.owner.clone()).await {
                Ok(revision) => {
                    return Ok(Some(Lease {
                        key: key.to_owned(),
                        revision,
                    }));
                }
                Err(err) if err.kind() == kv::CreateErrorKind::AlreadyExists => {}
                Err(err) => return Err(events_err(err)),
            }
            // Another replica runs an event of this file: its message stays ours meanwhile
            // (progress acks), and we run after it.
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(None),
                _ = tokio::time::sleep(BUSY_RETRY) => {}
            }
        }
    }

    /// Keeps `lease` alive for another [`LEASE_TTL`].
    pub(crate) async fn renew(&self, lease: &mut Lease) -> Result<(), StoreError> {
        lease.revision = self
            .leases
            .update(&lease.key, self.owner.clone(), lease.revision)
            .await
            .map_err(events_err)?;
        Ok(())
    }

    /// Gives `lease` up; if that fails it expires after [`LEASE_TTL`].
    pub(crate) async fn release(&self, lease: Lease) {
        if let Err(err) = self
            .leases
            .delete_expect_revision(&lease.key, Some(lease.revision))
            .await
        {
            tracing::warn!(error = %err, "releasing an indexer lease failed; it expires on its own");
        }
    }

    /// The highest stream sequence applied for `key` by any replica in the stream's
    /// `incarnation` (see [`super::run`]); `None` when only an earlier incarnation's is known.
    pub(crate) async fn applied(
        &self,
        key: &str,
        incarnation: i64,
    ) -> Result<Option<u64>, StoreError> {
        let value = self.applied.get(key).await.map_err(events_err)?;
        Ok(value.and_then(|bytes| applied_in(std::str::from_utf8(&bytes).ok()?, incarnation)))
    }

    /// Records that `sequence` was applied for `key` in the stream's `incarnation`, whose newest
    /// applied sequence there was `last` when its lease was taken (and, under the lease, still
    /// is).
    pub(crate) async fn record(
        &self,
        key: &str,
        sequence: u64,
        last: Option<u64>,
        incarnation: i64,
    ) -> Result<(), StoreError> {
        if last.is_some_and(|last| last >= sequence) {
            return Ok(());
        }
        self.applied
            .put(key, Bytes::from(format!("{sequence}@{incarnation}")))
            .await
            .map_err(events_err)?;
        Ok(())
    }
}

/// The sequence of an applied record `<sequence>@<incarnation>` if it is of `incarnation`.
/// A bare `<sequence>` was written before incarnations were recorded, and counts as current.
fn applied_in(record: &str, incarnation: i64) -> Option<u64> {
    match record.split_once('@') {
        None => record.parse().ok(),
        Some((sequence, of)) => (of.parse::<i64>().ok()? == incarnation)
            .then(|| sequence.parse().ok())
            .flatten(),
    }
}

#[cfg(test)]
mod tests {
    use super::applied_in;

    #[test]
    fn an_applied_sequence_counts_only_in_its_streams_incarnation() {
        assert_eq!(applied_in("57@1700", 1700), Some(57));
        assert_eq!(
            applied_in("57@1700", 1800),
            None,
            "the stream was made again"
        );
        assert_eq!(
            applied_in("57", 1800),
            Some(57),
            "written before incarnations"
        );
        assert_eq!(applied_in("x@1700", 1700), None);
        assert_eq!(applied_in("57@x", 1700), None);
    }
}

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
            owner: Bytes::from(owner_identity()),
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
            if let Some(revision) = self.take_over_if_holder_ended(key).await {
                return Ok(Some(Lease {
                    key: key.to_owned(),
                    revision,
                }));
            }
            // Another replica runs an event of this file: its message stays ours meanwhile
            // (progress acks), and we run after it.
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(None),
                _ = tokio::time::sleep(BUSY_RETRY) => {}
            }
        }
    }

    /// Takes the lease of `key` when its holder is a process of this machine that has ended
    /// (an indexer killed and started again), rather than wait out its [`LEASE_TTL`] while the
    /// lane's other files wait behind it. The swap is on the entry's revision, so of two
    /// replicas taking it at once one gets it. The lease's revision, if taken.
    async fn take_over_if_holder_ended(&self, key: &str) -> Option<u64> {
        let entry = self.leases.entry(key).await.ok()??;
        if entry.operation != kv::Operation::Put
            || !holder_ended(std::str::from_utf8(&entry.value).ok()?)
        {
            return None;
        }
        let revision = self
            .leases
            .update(key, self.owner.clone(), entry.revision)
            .await
            .ok()?;
        tracing::info!(
            key,
            "took over the lease of an indexer of this machine that ended"
        );
        Some(revision)
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

/// Who holds a lease: `host|boot id|pid|process start|random`. On Linux the first four let a
/// replica of the same machine (the same kernel and host name: a restarted container keeps
/// both) tell that the holder's process has ended; elsewhere they are empty and a lease is
/// only ever waited out.
fn owner_identity() -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    match (machine(), process_start(std::process::id())) {
        (Some((host, boot)), Some(start)) => {
            format!("{host}|{boot}|{}|{start}|{random}", std::process::id())
        }
        _ => format!("||||{random}"),
    }
}

/// This machine's host name and kernel boot id.
fn machine() -> Option<(String, String)> {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .ok()
            .map(|text| text.trim().to_owned())
            .filter(|text| !text.is_empty() && !text.contains('|'))
    };
    Some((
        read("/proc/sys/kernel/hostname")?,
        read("/proc/sys/kernel/random/boot_id")?,
    ))
}

/// When process `pid` started (clock ticks after boot), while it runs.
fn process_start(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (in parentheses, any bytes): state is the 3rd field of the
    // line, the start time the 22nd.
    let after_name = stat.get(stat.rfind(')')? + 1..)?;
    let mut fields = after_name.split_whitespace();
    if fields.next()? == "Z" {
        return None;
    }
    fields.nth(18).map(str::to_owned)
}

/// Whether `owner` (see [`owner_identity`]) is a process of this machine that has ended: one
/// of another machine, or with no identity, is never judged.
fn holder_ended(owner: &str) -> bool {
    let mut parts = owner.split('|');
    let (Some(host), Some(boot), Some(pid), Some(start)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let Some((my_host, my_boot)) = machine() else {
        return false;
    };
    if host != my_host || boot != my_boot || host.is_empty() {
        return false;
    }
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    process_start(pid).as_deref() != Some(start)
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
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::{applied_in, holder_ended, owner_identity};

    #[cfg(target_os = "linux")]
    #[test]
    fn a_holder_of_this_machine_that_ended_is_told_from_a_live_one() {
        let mine = owner_identity();
        assert!(!holder_ended(&mine), "this process runs: {mine}");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let parts: Vec<&str> = mine.split('|').collect();
        let ended = format!("{}|{}|{pid}|{}|x", parts[0], parts[1], parts[3]);
        assert!(holder_ended(&ended), "{ended}");
        // A pid reused by another process: its start time differs.
        let reused = format!("{}|{}|{}|1|x", parts[0], parts[1], std::process::id());
        assert!(holder_ended(&reused), "{reused}");
        // Another machine's, or one without an identity, is never judged.
        let elsewhere = format!("other-host|{}|{pid}|{}|x", parts[1], parts[3]);
        assert!(!holder_ended(&elsewhere));
        assert!(!holder_ended("||||x"));
        assert!(!holder_ended("a-uuid-of-an-earlier-release"));
    }

    /// An indexer killed while it ran a file, started again on the same machine, takes the
    /// file's lease at once instead of waiting out its TTL; a live holder's is waited for.
    #[cfg(target_os = "linux")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_of_an_ended_indexer_of_this_machine_is_taken_at_once() {
        use super::{LEASE_TTL, Leases};
        use std::time::{Duration, Instant};
        let venv = kg_stores::embedded::find_venv().expect("the dev-deps virtualenv");
        let dir = tempfile::tempdir().unwrap();
        let nats = kg_stores::embedded::EmbeddedNats::start(&venv, dir.path())
            .await
            .unwrap();
        let js = kg_stores::events::connect(&nats.url).await.unwrap();
        let before = Leases::open(&js, 1).await.unwrap();
        let shutdown = tokio_util::sync::CancellationToken::new();
        let held = before.acquire("s.f1", &shutdown).await.unwrap().unwrap();
        // The killed process: its owner string with a pid that has ended.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let ended_pid = child.id();
        child.wait().unwrap();
        let mine = String::from_utf8(before.owner.to_vec()).unwrap();
        let parts: Vec<&str> = mine.split('|').collect();
        let ended = format!("{}|{}|{ended_pid}|{}|x", parts[0], parts[1], parts[3]);
        before
            .leases
            .update("s.f1", ended.into(), held.revision)
            .await
            .unwrap();

        let after = Leases::open(&js, 1).await.unwrap();
        let started = Instant::now();
        let taken = after.acquire("s.f1", &shutdown).await.unwrap().unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        // Now held by a live process: the other waits (here, until it gives up).
        let waiting = {
            let stop = shutdown.child_token();
            let canceller = stop.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(700)).await;
                canceller.cancel();
            });
            before.acquire("s.f1", &stop).await.unwrap()
        };
        assert!(waiting.is_none(), "a live holder's lease was taken");
        after.release(taken).await;
        assert!(LEASE_TTL > Duration::from_secs(2));
    }

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

//! The newest flags change (enabled, hidden) applied per file, with its order.
//!
//! A flags change reaches the indexer twice: in order on `changed`, and at once on `flags`,
//! so hiding a file takes effect while a backlog of uploads is still queued. The uploads of
//! that file queued before the change, and the in-order copy of the change itself, then run
//! after a newer change was applied; and two changes made at once can reach the stream in
//! the opposite order to the registry's. So each event reads this record first: an upload
//! with older flags is written with the record's, and an older flags change is skipped.
//! Flags are ordered by the registry's count of flag changes (`flags_version`), then by the
//! stream. It lives in JetStream KV, beside the lanes' leases, so every replica reads it.

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures::TryStreamExt as _;
use kg_stores::StoreError;

use crate::events_err;
use kg_stores::error::StoreKind;

/// One entry per file whose flags changed since it was last deleted.
const FLAGS_BUCKET: &str = "kg_indexer_flags";

/// A file's flags as its newest applied change set them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NewestFlags {
    /// The registry's count of the file's flag changes when they were read (0 when the
    /// publisher predates it).
    pub flags_version: i64,
    /// The change's sequence in the `KG_FILES` stream.
    pub sequence: u64,
    pub enabled: bool,
    pub hidden: bool,
}

impl NewestFlags {
    /// Whether these flags are newer than those an event at `sequence` carries, read at
    /// `flags_version`. The registry's count decides; the stream only between equal counts,
    /// or when either side has none (0: a publisher that predates it, mid-upgrade).
    pub(crate) fn newer_than(&self, flags_version: i64, sequence: u64) -> bool {
        if self.flags_version > 0 && flags_version > 0 && self.flags_version != flags_version {
            return self.flags_version > flags_version;
        }
        self.sequence > sequence
    }

    /// `<flags_version> <sequence> <enabled> <hidden>`, the flags as 0 or 1.
    fn encode(self) -> Bytes {
        Bytes::from(format!(
            "{} {} {} {}",
            self.flags_version,
            self.sequence,
            u8::from(self.enabled),
            u8::from(self.hidden)
        ))
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut fields = text.split(' ');
        let flags_version = fields.next()?.parse().ok()?;
        let sequence = fields.next()?.parse().ok()?;
        let flag = |field: Option<&str>| match field? {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        };
        let enabled = flag(fields.next())?;
        let hidden = flag(fields.next())?;
        fields.next().is_none().then_some(NewestFlags {
            flags_version,
            sequence,
            enabled,
            hidden,
        })
    }
}

/// The shared record of the newest flags change per file.
#[derive(Clone)]
pub(crate) struct FlagsLedger {
    bucket: kv::Store,
}

impl FlagsLedger {
    /// Opens (or creates) the bucket.
    pub(crate) async fn open(js: &jetstream::Context) -> Result<Self, StoreError> {
        Ok(FlagsLedger {
            bucket: Self::bucket(js).await?,
        })
    }

    /// Makes the bucket again if NATS lost it (the handle addresses it by name).
    pub(crate) async fn ensure_bucket(&self, js: &jetstream::Context) -> Result<(), StoreError> {
        Self::bucket(js).await.map(|_| ())
    }

    async fn bucket(js: &jetstream::Context) -> Result<kv::Store, StoreError> {
        js.create_or_update_key_value(kv::Config {
            bucket: FLAGS_BUCKET.to_owned(),
            description: "indexer: the newest flags change applied per file".to_owned(),
            history: 1,
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await
        .map_err(events_err)
    }

    /// KV keys allow few characters.
    fn key(namespace: &str, file_id: &str) -> String {
        hex::encode(format!("{namespace}\u{0}{file_id}"))
    }

    /// The newest flags change applied to the file, if any since it was last deleted. An
    /// entry this code cannot read is an error, never "none": skipping it could show a file
    /// that was hidden.
    pub(crate) async fn newest(
        &self,
        namespace: &str,
        file_id: &str,
    ) -> Result<Option<NewestFlags>, StoreError> {
        let Some(value) = self
            .bucket
            .get(Self::key(namespace, file_id))
            .await
            .map_err(events_err)?
        else {
            return Ok(None);
        };
        NewestFlags::decode(&value).map(Some).ok_or_else(|| {
            StoreError::internal(
                StoreKind::Events,
                "an entry of the indexer's flags bucket is malformed",
            )
        })
    }

    /// Records `flags` as the file's newest applied change. Callers hold the file's lease.
    pub(crate) async fn record(
        &self,
        namespace: &str,
        file_id: &str,
        flags: NewestFlags,
    ) -> Result<(), StoreError> {
        self.bucket
            .put(Self::key(namespace, file_id), flags.encode())
            .await
            .map_err(events_err)?;
        Ok(())
    }

    /// Drops the entries of every file of the namespace (it is being deleted).
    pub(crate) async fn forget_namespace(&self, namespace: &str) -> Result<(), StoreError> {
        // Hex keeps byte order: every key of the namespace starts with this.
        let prefix = hex::encode(format!("{namespace}\u{0}"));
        let keys: Vec<String> = self
            .bucket
            .keys()
            .await
            .map_err(events_err)?
            .try_filter(|key| std::future::ready(key.starts_with(&prefix)))
            .try_collect()
            .await
            .map_err(events_err)?;
        for key in keys {
            self.bucket.delete(&key).await.map_err(events_err)?;
        }
        Ok(())
    }

    /// Drops the file's entry once it is deleted: every event that could still read the entry
    /// is older than the delete, and those are skipped.
    pub(crate) async fn forget(&self, namespace: &str, file_id: &str) -> Result<(), StoreError> {
        self.bucket
            .delete(Self::key(namespace, file_id))
            .await
            .map_err(events_err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_reads_back_and_a_malformed_one_is_refused() {
        let flags = NewestFlags {
            flags_version: 3,
            sequence: 42,
            enabled: true,
            hidden: false,
        };
        assert_eq!(flags.encode(), Bytes::from("3 42 1 0"));
        assert_eq!(NewestFlags::decode(&flags.encode()), Some(flags));
        for bad in [
            "",
            "3 42",
            "3 42 1",
            "3 42 1 2",
            "x 42 1 0",
            "3 42 1 0 7",
            "3 42 true false",
        ] {
            assert_eq!(NewestFlags::decode(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn the_registry_count_orders_flags_before_the_stream_does() {
        let at = |flags_version, sequence| NewestFlags {
            flags_version,
            sequence,
            enabled: true,
            hidden: true,
        };
        // Published out of order: the higher count wins whatever the sequence.
        assert!(at(5, 10).newer_than(4, 12));
        assert!(!at(4, 12).newer_than(5, 10));
        // Equal counts, or a side without one, go by the stream.
        assert!(at(5, 12).newer_than(5, 10));
        assert!(!at(5, 10).newer_than(5, 12));
        assert!(!at(5, 10).newer_than(0, 12));
        assert!(at(0, 12).newer_than(5, 10));
        // The same event is not newer than itself: a redelivery applies again.
        assert!(!at(5, 10).newer_than(5, 10));
    }

    #[test]
    fn keys_separate_namespace_and_file() {
        assert_ne!(FlagsLedger::key("ab", "c"), FlagsLedger::key("a", "bc"));
        assert!(
            FlagsLedger::key("team-a", "f/1")
                .bytes()
                .all(|b| b.is_ascii_hexdigit())
        );
    }
}

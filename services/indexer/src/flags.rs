//! The newest flags change (enabled, hidden) applied per file, with its stream sequence.
//!
//! A flags change reaches the indexer twice: in order on `changed`, and at once on `flags`,
//! so hiding a file takes effect while a backlog of uploads is still queued. The uploads of
//! that file queued before the change, and the in-order copy of the change itself, then run
//! after a newer change was applied. Each reads this record first: an upload older than the
//! record is written with the record's flags, and a flags change older than it is skipped.
//! It lives in JetStream KV, beside the lanes' leases, so every replica reads the same one.

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use kg_stores::StoreError;

use crate::events_err;
use kg_stores::error::StoreKind;

/// One entry per file whose flags changed since it was last deleted.
const FLAGS_BUCKET: &str = "kg_indexer_flags";

/// A file's flags as its newest applied change set them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NewestFlags {
    /// The change's sequence in the `KG_FILES` stream.
    pub sequence: u64,
    pub enabled: bool,
    pub hidden: bool,
}

impl NewestFlags {
    /// `<sequence> <enabled> <hidden>`, the flags as 0 or 1.
    fn encode(self) -> Bytes {
        Bytes::from(format!(
            "{} {} {}",
            self.sequence,
            u8::from(self.enabled),
            u8::from(self.hidden)
        ))
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut fields = text.split(' ');
        let sequence = fields.next()?.parse().ok()?;
        let flag = |field: Option<&str>| match field? {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        };
        let enabled = flag(fields.next())?;
        let hidden = flag(fields.next())?;
        fields.next().is_none().then_some(NewestFlags {
            sequence,
            enabled,
            hidden,
        })
    }
}

/// The shared record of the newest flags change per file.
pub(crate) struct FlagsLedger {
    bucket: kv::Store,
}

impl FlagsLedger {
    /// Opens (or creates) the bucket.
    pub(crate) async fn open(js: &jetstream::Context) -> Result<Self, StoreError> {
        let bucket = js
            .create_or_update_key_value(kv::Config {
                bucket: FLAGS_BUCKET.to_owned(),
                description: "indexer: the newest flags change applied per file".to_owned(),
                history: 1,
                storage: jetstream::stream::StorageType::File,
                ..Default::default()
            })
            .await
            .map_err(events_err)?;
        Ok(FlagsLedger { bucket })
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
            sequence: 42,
            enabled: true,
            hidden: false,
        };
        assert_eq!(flags.encode(), Bytes::from("42 1 0"));
        assert_eq!(NewestFlags::decode(&flags.encode()), Some(flags));
        for bad in [
            "",
            "42",
            "42 1",
            "42 1 2",
            "x 1 0",
            "42 1 0 7",
            "42 true false",
        ] {
            assert_eq!(NewestFlags::decode(bad.as_bytes()), None, "{bad:?}");
        }
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

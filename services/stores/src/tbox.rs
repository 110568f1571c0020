//! The published TBox of each namespace, in the JetStream KV bucket `KG_TBOX`.
//!
//! Key = namespace, value = a prost-encoded `kg.v1.Tbox`. The ontology service puts a TBox
//! when it is published; the indexer reads it for every file it indexes, through
//! [`TboxBucket::get_cached`], which asks NATS at most once per namespace per cache TTL, and
//! follows [`TboxBucket::watch`] to re-extract the files indexed under an older TBox.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt as _};
use kg_proto::v1::Tbox;
use prost::Message as _;

use crate::error::{StoreError, StoreKind};

/// The KV bucket holding one published TBox per namespace.
pub const TBOX_BUCKET: &str = "KG_TBOX";
/// Revisions kept per namespace, so an operator can see what was published before.
const HISTORY: i64 = 5;
/// Room kept in a NATS message for what travels beside a TBox (subject, headers).
const MESSAGE_HEADROOM: usize = 4 * 1024;
/// Largest encoded TBox when the server's limit is not known: NATS's default message limit
/// (1 MiB) less the headroom.
pub const DEFAULT_MAX_TBOX_BYTES: usize = 1024 * 1024 - MESSAGE_HEADROOM;

/// How long [`TboxBucket::get_cached`] trusts what it read, present or absent.
pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
struct Cached {
    read_at: Instant,
    tbox: Option<Arc<Tbox>>,
}

/// Handle on `KG_TBOX`; cheap to clone (clones share the read cache).
#[derive(Clone)]
pub struct TboxBucket {
    kv: kv::Store,
    /// To make the bucket again ([`TboxBucket::ensure`]).
    js: jetstream::Context,
    /// Largest encoded TBox a put can carry: the server's message limit less headroom.
    max_tbox_bytes: usize,
    ttl: Duration,
    cache: Arc<Mutex<HashMap<String, Cached>>>,
}

impl std::fmt::Debug for TboxBucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TboxBucket")
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// Creates `KG_TBOX` when missing (or updates its configuration) and returns a handle on it.
async fn create_bucket(js: &jetstream::Context) -> Result<kv::Store, StoreError> {
    let config = kv::Config {
        bucket: TBOX_BUCKET.to_owned(),
        description: "published TBox per namespace (kg.v1.Tbox)".to_owned(),
        history: HISTORY,
        storage: jetstream::stream::StorageType::File,
        ..Default::default()
    };
    js.create_or_update_key_value(config).await.map_err(|err| {
        use jetstream::context::CreateKeyValueErrorKind as K;
        match err.kind() {
            K::TimedOut => StoreError::timeout(StoreKind::Events, err),
            K::JetStream => StoreError::unavailable(StoreKind::Events, err),
            _ => StoreError::internal(StoreKind::Events, err),
        }
    })
}

/// Which TBox the bucket holds for a namespace, and the KV revision it is at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// The TBox's own version (`kg.v1.Tbox.version`).
    pub version: i64,
    /// The KV revision of the entry, for [`TboxBucket::replace`].
    pub revision: u64,
}

impl TboxBucket {
    /// Creates the bucket when missing (or updates its configuration) and opens it.
    pub async fn open(js: &jetstream::Context) -> Result<Self, StoreError> {
        let kv = create_bucket(js).await?;
        let max_payload = js.client().server_info().max_payload;
        Ok(TboxBucket {
            kv,
            js: js.clone(),
            max_tbox_bytes: if max_payload == 0 {
                DEFAULT_MAX_TBOX_BYTES
            } else {
                max_payload.saturating_sub(MESSAGE_HEADROOM)
            },
            ttl: DEFAULT_CACHE_TTL,
            cache: Arc::new(Mutex::new(HashMap::new())),
        })
    }

    /// Makes the bucket again if NATS lost it (restarted without its state): this handle
    /// addresses it by name, so it works again at once. Idempotent.
    pub async fn ensure(&self) -> Result<(), StoreError> {
        create_bucket(&self.js).await.map(|_| ())
    }

    /// The namespaces the bucket holds a TBox for.
    pub async fn namespaces(&self) -> Result<Vec<String>, StoreError> {
        let keys = self
            .kv
            .keys()
            .await
            .map_err(|err| StoreError::unavailable(StoreKind::Events, err))?;
        keys.map(|key| key.map_err(|err| StoreError::unavailable(StoreKind::Events, err)))
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect()
    }

    /// The version the bucket holds for `namespace` now, with its revision; `None` when none.
    pub async fn held(&self, namespace: &str) -> Result<Option<Held>, StoreError> {
        let entry = self
            .kv
            .entry(key(namespace)?)
            .await
            .map_err(|err| StoreError::unavailable(StoreKind::Events, err))?;
        match entry {
            Some(entry) if entry.operation == kv::Operation::Put => {
                let tbox = Tbox::decode(entry.value)
                    .map_err(|err| StoreError::internal(StoreKind::Events, err))?;
                Ok(Some(Held {
                    version: tbox.version,
                    revision: entry.revision,
                }))
            }
            _ => Ok(None),
        }
    }

    /// Puts `tbox` for its namespace only if the bucket holds none (`held` is `None`), or
    /// still holds the entry at `held`'s revision: a publish that lands in between is never
    /// overwritten. Returns whether it was put.
    pub async fn replace(&self, tbox: &Tbox, held: Option<Held>) -> Result<bool, StoreError> {
        let key = key(&tbox.namespace)?;
        let value = Bytes::from(tbox.encode_to_vec());
        let put = match held {
            None => match self.kv.create(key, value).await {
                Ok(_) => true,
                Err(err) if err.kind() == kv::CreateErrorKind::AlreadyExists => false,
                Err(err) => return Err(StoreError::unavailable(StoreKind::Events, err)),
            },
            Some(held) => match self.kv.update(key, value, held.revision).await {
                Ok(_) => true,
                Err(err) if err.kind() == kv::UpdateErrorKind::WrongLastRevision => false,
                Err(err) => return Err(StoreError::unavailable(StoreKind::Events, err)),
            },
        };
        if put {
            self.remember(&tbox.namespace, Some(Arc::new(tbox.clone())));
        }
        Ok(put)
    }

    /// The same bucket with another cache TTL for [`TboxBucket::get_cached`].
    pub fn with_cache_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Largest encoded TBox [`TboxBucket::put`] takes: the NATS server's message limit
    /// (`max_payload`, 1 MiB unless configured) less room for the subject and headers.
    pub fn max_tbox_bytes(&self) -> usize {
        self.max_tbox_bytes
    }

    /// Stores `tbox` as the published TBox of `tbox.namespace`; returns the KV revision.
    /// A TBox over [`TboxBucket::max_tbox_bytes`] is refused (`InvalidInput`) before
    /// anything is sent.
    pub async fn put(&self, tbox: &Tbox) -> Result<u64, StoreError> {
        let key = key(&tbox.namespace)?;
        let encoded = tbox.encode_to_vec();
        if encoded.len() > self.max_tbox_bytes {
            return Err(StoreError::InvalidInput {
                what: "tbox",
                reason: format!(
                    "{} bytes encoded, over the {} the event bus carries",
                    encoded.len(),
                    self.max_tbox_bytes
                ),
            });
        }
        let revision = self
            .kv
            .put(key, Bytes::from(encoded))
            .await
            .map_err(|err| {
                use kv::PutErrorKind as K;
                match err.kind() {
                    K::InvalidKey => StoreError::InvalidInput {
                        what: "namespace",
                        reason: "not a valid key".into(),
                    },
                    K::Publish | K::Ack => StoreError::unavailable(StoreKind::Events, err),
                }
            })?;
        // This process sees its own publish at once.
        self.remember(&tbox.namespace, Some(Arc::new(tbox.clone())));
        Ok(revision)
    }

    /// Removes the namespace's TBox and its history from the bucket (the namespace is being
    /// deleted). Removing one the bucket does not hold is not an error.
    pub async fn remove(&self, namespace: &str) -> Result<(), StoreError> {
        let key = key(namespace)?;
        self.kv
            .purge(key)
            .await
            .map_err(|err| StoreError::unavailable(StoreKind::Events, err))?;
        self.remember(namespace, None);
        Ok(())
    }

    /// The published TBox of `namespace`, read from NATS now; `None` when none was published.
    pub async fn get(&self, namespace: &str) -> Result<Option<Tbox>, StoreError> {
        let key = key(namespace)?;
        let value = self.kv.get(key).await.map_err(|err| {
            use kv::EntryErrorKind as K;
            match err.kind() {
                K::TimedOut => StoreError::timeout(StoreKind::Events, err),
                K::InvalidKey => StoreError::InvalidInput {
                    what: "namespace",
                    reason: "not a valid key".into(),
                },
                K::Other => StoreError::unavailable(StoreKind::Events, err),
            }
        })?;
        match value {
            None => Ok(None),
            Some(bytes) => Tbox::decode(bytes)
                .map(Some)
                .map_err(|err| StoreError::internal(StoreKind::Events, err)),
        }
    }

    /// Like [`TboxBucket::get`], but answers from memory when this handle (or a clone) read
    /// the namespace less than the cache TTL ago; absence is cached too.
    pub async fn get_cached(&self, namespace: &str) -> Result<Option<Arc<Tbox>>, StoreError> {
        let fresh = self.cache.lock().ok().and_then(|cache| {
            cache
                .get(namespace)
                .filter(|c| c.read_at.elapsed() < self.ttl)
                .map(|c| c.tbox.clone())
        });
        if let Some(tbox) = fresh {
            return Ok(tbox);
        }
        let tbox = self.get(namespace).await?.map(Arc::new);
        self.remember(namespace, tbox.clone());
        Ok(tbox)
    }

    /// Reads the namespace's TBox from NATS now and keeps it in the read cache, for work that
    /// must not run on a TBox read before the latest publish.
    pub async fn refresh(&self, namespace: &str) -> Result<(), StoreError> {
        let tbox = self.get(namespace).await?.map(Arc::new);
        self.remember(namespace, tbox);
        Ok(())
    }

    /// TBoxes as they are published from now on, one item per put. Each is also put in this
    /// handle's read cache before it is yielded, so what runs after sees it even within the
    /// cache TTL. A removed key is forgotten and not yielded. The stream ends when NATS drops
    /// the watch; the caller watches again (and may have missed puts meanwhile).
    pub async fn watch(
        &self,
    ) -> Result<BoxStream<'static, Result<Arc<Tbox>, StoreError>>, StoreError> {
        let watch = self
            .kv
            .watch_all()
            .await
            .map_err(|err| StoreError::unavailable(StoreKind::Events, err))?;
        let handle = self.clone();
        Ok(watch
            .filter_map(move |entry| {
                let handle = handle.clone();
                async move {
                    let entry = match entry {
                        Ok(entry) => entry,
                        Err(err) => {
                            return Some(Err(StoreError::unavailable(StoreKind::Events, err)));
                        }
                    };
                    if entry.operation != kv::Operation::Put {
                        handle.remember(&entry.key, None);
                        return None;
                    }
                    Some(match Tbox::decode(entry.value) {
                        Ok(tbox) => {
                            let tbox = Arc::new(tbox);
                            handle.remember(&tbox.namespace, Some(tbox.clone()));
                            Ok(tbox)
                        }
                        Err(err) => Err(StoreError::internal(StoreKind::Events, err)),
                    })
                }
            })
            .boxed())
    }

    fn remember(&self, namespace: &str, tbox: Option<Arc<Tbox>>) {
        if let Ok(mut cache) = self.cache.lock() {
            cache.insert(
                namespace.to_owned(),
                Cached {
                    read_at: Instant::now(),
                    tbox,
                },
            );
        }
    }
}

/// The KV key of a namespace: the namespace itself, once it passed the namespace rules.
fn key(namespace: &str) -> Result<&str, StoreError> {
    kg_common::access::validate_namespace(namespace).map_err(|err| StoreError::InvalidInput {
        what: "namespace",
        reason: err.to_string(),
    })?;
    Ok(namespace)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_namespace_rules() {
        assert_eq!(key("handbook").unwrap(), "handbook");
        for bad in ["", "a.b", "A", "a*", "a b", ">"] {
            assert!(key(bad).is_err(), "{bad:?}");
        }
    }
}

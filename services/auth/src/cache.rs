//! What `Authorize` resolved per token, kept only while the store's access epoch
//! (migration 1003) is the one it was read under.
//!
//! Every change to what Authorize reads moves the epoch in the changing
//! statement's own transaction, and every Authorize reads the epoch before it
//! uses anything from here; so the first call after a revocation commits sees a
//! new epoch, drops the whole cache and resolves from the tables again, on every
//! replica. What is cached is never older than the epoch it is filed under: the
//! rows are read after the epoch.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use kg_proto::v1::AccessFilter;

use crate::store::PatOwner;

/// Tokens remembered at once; past it the cache starts over (bounded memory, no
/// eviction bookkeeping on the hot path).
const CAPACITY: usize = 4096;

/// One token's resolution: its owner row, access per namespace and roles.
pub(crate) struct Resolved {
    pub(crate) owner: PatOwner,
    pub(crate) access: BTreeMap<String, AccessFilter>,
    pub(crate) roles: Vec<String>,
    /// When the token was last recorded as used (`i64::MIN`: never), advanced by the
    /// touches made on cache hits; not part of the epoch.
    last_used_at_ms: AtomicI64,
}

impl Resolved {
    pub(crate) fn new(
        owner: PatOwner,
        access: BTreeMap<String, AccessFilter>,
        roles: Vec<String>,
    ) -> Self {
        let last_used = owner.last_used_at_ms.unwrap_or(i64::MIN);
        Self {
            owner,
            access,
            roles,
            last_used_at_ms: AtomicI64::new(last_used),
        }
    }

    /// Whether a use at `now_ms` should be written down, claiming the write when so (one of
    /// several concurrent callers writes).
    pub(crate) fn claim_touch(&self, now_ms: i64, every_ms: i64) -> bool {
        let last = self.last_used_at_ms.load(Ordering::Relaxed);
        last.saturating_add(every_ms) <= now_ms
            && self
                .last_used_at_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

#[derive(Default)]
struct Entries {
    epoch: Option<i64>,
    by_token_hash: HashMap<String, Arc<Resolved>>,
}

/// Resolutions by token hash under one epoch.
#[derive(Default)]
pub(crate) struct AccessCache {
    entries: Mutex<Entries>,
}

impl AccessCache {
    /// The resolution of `token_hash` if it was made under `epoch`. A different epoch empties
    /// the cache first: whatever it held may predate a change.
    pub(crate) fn get(&self, epoch: i64, token_hash: &str) -> Option<Arc<Resolved>> {
        let mut entries = self.lock();
        if entries.epoch != Some(epoch) {
            entries.by_token_hash.clear();
            entries.epoch = Some(epoch);
            return None;
        }
        entries.by_token_hash.get(token_hash).cloned()
    }

    /// Files a resolution made from rows read after the epoch was `epoch`; dropped when the
    /// cache has meanwhile seen another epoch.
    pub(crate) fn insert(&self, epoch: i64, token_hash: String, resolved: Arc<Resolved>) {
        let mut entries = self.lock();
        if entries.epoch != Some(epoch) {
            return;
        }
        if entries.by_token_hash.len() >= CAPACITY {
            entries.by_token_hash.clear();
        }
        entries.by_token_hash.insert(token_hash, resolved);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        // A panic while holding the lock cannot leave a half-written entry (each step is one
        // map call), so a poisoned lock is still a consistent cache.
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use kg_proto::v1::Principal;

    fn resolved(last_used: Option<i64>) -> Arc<Resolved> {
        Arc::new(Resolved::new(
            PatOwner {
                pat_id: "pat_1".into(),
                token_hash: "h".into(),
                expires_at_ms: None,
                revoked_at_ms: None,
                last_used_at_ms: last_used,
                acts_for_disabled_at_ms: None,
                principal: Principal::default(),
            },
            BTreeMap::new(),
            Vec::new(),
        ))
    }

    #[test]
    fn another_epoch_empties_the_cache_and_late_inserts_are_dropped() {
        let cache = AccessCache::default();
        assert!(cache.get(1, "h").is_none());
        cache.insert(1, "h".into(), resolved(None));
        assert!(cache.get(1, "h").is_some());

        // The epoch moved: nothing filed under 1 is served, and a resolution that started
        // under 1 but finishes now is not filed.
        assert!(cache.get(2, "h").is_none());
        cache.insert(1, "h".into(), resolved(None));
        assert!(cache.get(2, "h").is_none());
        cache.insert(2, "h".into(), resolved(None));
        assert!(cache.get(2, "h").is_some());
    }

    #[test]
    fn a_use_is_written_once_per_interval() {
        let entry = resolved(Some(1_000));
        assert!(!entry.claim_touch(1_500, 1_000));
        assert!(entry.claim_touch(2_000, 1_000));
        assert!(!entry.claim_touch(2_500, 1_000));
        assert!(resolved(None).claim_touch(0, 60_000));
    }
}

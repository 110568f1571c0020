//! Counts cached in-process per access scope for a short while: BM25's corpus statistics and
//! document frequencies, and entities' role degrees. A scope is (FalkorDB server, namespace,
//! access predicates with their parameters), so two callers share a cached count only when
//! they read exactly the same chunks, and a count never tells one caller about chunks only
//! another may read. The cache holds numbers only, never text. Counts change only on ingest;
//! an old count shifts scores (and, for degrees, an entity's weight or role), never which
//! chunks a caller may read.
//!
//! A count is trusted for the reader's `ttl` (`[retrieval] statistics_ttl_seconds`, default
//! [`DEFAULT_TTL`]). Past it, it is still served for [`STALE_FACTOR`] times as long, and the
//! first reader to find it so is told to recount it off the request path
//! ([`ScopeCache::lookup`]): a whole-scope count (BM25's N and avgdl, 70-95 ms at 100k
//! chunks) would otherwise stall one search a minute per scope, and every search of an agent
//! that asks less often than once a minute.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use kg_common::access::CypherPredicate;
use kg_stores::graph::GraphStore;
use serde_json::Value;

/// How long a cached count is trusted unless configured.
pub const DEFAULT_TTL: Duration = Duration::from_secs(60);
/// A count is served while it is recounted until it is this many TTLs old; an older one is
/// counted again on the request path.
const STALE_FACTOR: u32 = 10;
/// How long a reader's claim to recount a stale value holds; after it, the next reader
/// claims it again (the recount failed or was lost).
const REFRESH_CLAIM: Duration = Duration::from_secs(30);

/// Values of type `V` by scope key, then by item key, each with the time it was counted.
#[derive(Debug)]
pub(crate) struct ScopeCache<V> {
    scopes: Mutex<HashMap<String, Scope<V>>>,
    max_scopes: usize,
    max_items_per_scope: usize,
}

#[derive(Debug)]
struct Scope<V> {
    items: HashMap<String, Item<V>>,
    used: Instant,
}

#[derive(Debug)]
struct Item<V> {
    value: V,
    counted: Instant,
    /// When a reader was last told to recount it.
    refresh_claimed: Option<Instant>,
}

/// A cached value as [`ScopeCache::lookup`] finds it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Lookup<V> {
    /// Counted within the TTL.
    Fresh(V),
    /// Counted within [`STALE_FACTOR`] TTLs: usable; `refresh` is true for the one reader that
    /// should recount it ([`REFRESH_CLAIM`]).
    Stale { value: V, refresh: bool },
    /// Never counted, or too long ago.
    Missing,
}

impl<V: Copy> Lookup<V> {
    /// The value, fresh or stale.
    pub(crate) fn value(self) -> Option<V> {
        match self {
            Lookup::Fresh(value) | Lookup::Stale { value, .. } => Some(value),
            Lookup::Missing => None,
        }
    }

    /// Whether this reader should recount the value.
    pub(crate) fn needs_refresh(self) -> bool {
        matches!(self, Lookup::Stale { refresh: true, .. })
    }
}

fn fresh(at: Instant, now: Instant, ttl: Duration) -> bool {
    now.saturating_duration_since(at) < ttl
}

fn servable(at: Instant, now: Instant, ttl: Duration) -> bool {
    now.saturating_duration_since(at) < ttl.saturating_mul(STALE_FACTOR)
}

impl<V: Copy> ScopeCache<V> {
    /// An empty cache of at most `max_scopes` scopes with `max_items_per_scope` items each.
    pub(crate) fn new(max_scopes: usize, max_items_per_scope: usize) -> Self {
        Self {
            scopes: Mutex::new(HashMap::new()),
            max_scopes,
            max_items_per_scope,
        }
    }

    /// Each of `items` in `scope`, fresh, stale or missing. A stale item nobody is
    /// recounting is claimed for this reader (`refresh: true`), which should recount it and
    /// [`put`](Self::put) the result; other readers get the stale value alone meanwhile.
    pub(crate) fn lookup(&self, scope: &str, items: &[String], ttl: Duration) -> Vec<Lookup<V>> {
        let now = Instant::now();
        let mut scopes = self.scopes.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(cached) = scopes.get_mut(scope) else {
            return vec![Lookup::Missing; items.len()];
        };
        cached.used = now;
        items
            .iter()
            .map(|item| match cached.items.get_mut(item) {
                Some(cached) if fresh(cached.counted, now, ttl) => Lookup::Fresh(cached.value),
                Some(cached) if servable(cached.counted, now, ttl) => {
                    let claimed = cached
                        .refresh_claimed
                        .is_some_and(|at| now.saturating_duration_since(at) < REFRESH_CLAIM);
                    if !claimed {
                        cached.refresh_claimed = Some(now);
                    }
                    Lookup::Stale {
                        value: cached.value,
                        refresh: !claimed,
                    }
                }
                _ => Lookup::Missing,
            })
            .collect()
    }

    /// Stores `values` in `scope`, counted now. Past the bounds, scopes unused for
    /// [`STALE_FACTOR`] TTLs (then the least recently used one) and items older than the TTL
    /// (then all of the scope's) make room.
    pub(crate) fn put(&self, scope: &str, values: &[(String, V)], ttl: Duration) {
        if values.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut scopes = self.scopes.lock().unwrap_or_else(PoisonError::into_inner);
        if !scopes.contains_key(scope) && scopes.len() >= self.max_scopes {
            scopes.retain(|_, s| servable(s.used, now, ttl));
            if scopes.len() >= self.max_scopes {
                let oldest = scopes
                    .iter()
                    .min_by_key(|(_, s)| s.used)
                    .map(|(k, _)| k.clone());
                if let Some(oldest) = oldest {
                    scopes.remove(&oldest);
                }
            }
        }
        let cached = scopes.entry(scope.to_owned()).or_insert_with(|| Scope {
            items: HashMap::new(),
            used: now,
        });
        cached.used = now;
        if cached.items.len() + values.len() > self.max_items_per_scope {
            cached.items.retain(|_, item| fresh(item.counted, now, ttl));
            if cached.items.len() + values.len() > self.max_items_per_scope {
                cached.items.clear();
            }
        }
        for (item, value) in values.iter().take(self.max_items_per_scope) {
            cached.items.insert(
                item.clone(),
                Item {
                    value: *value,
                    counted: now,
                    refresh_claimed: None,
                },
            );
        }
    }
}

impl<V> ScopeCache<V> {
    /// Drops `scope`'s cached values.
    pub(crate) fn forget(&self, scope: &str) {
        let mut scopes = self.scopes.lock().unwrap_or_else(PoisonError::into_inner);
        scopes.remove(scope);
    }
}

/// The scope key of `predicates` (each with its parameters) over `namespace` on `store`'s
/// server.
pub(crate) fn scope_key(
    store: &GraphStore,
    namespace: &str,
    predicates: &[&CypherPredicate],
) -> String {
    let mut key = format!("{}\u{0}{namespace}", store.server_identity());
    for predicate in predicates {
        let params = Value::Array(
            predicate
                .params
                .iter()
                .map(|(name, value)| Value::Array(vec![Value::from(name.as_str()), value.clone()]))
                .collect(),
        );
        key.push('\u{0}');
        key.push_str(&predicate.text);
        key.push('\u{0}');
        key.push_str(&params.to_string());
    }
    key
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const TTL: Duration = DEFAULT_TTL;

    fn items(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn values_are_per_scope_and_bounded() {
        let cache = ScopeCache::new(4, 3);
        cache.put("a", &[("x".into(), 2u64)], TTL);
        assert_eq!(
            cache.lookup("a", &items(&["x", "y"]), TTL),
            [Lookup::Fresh(2), Lookup::Missing]
        );
        assert_eq!(cache.lookup("b", &items(&["x"]), TTL), [Lookup::Missing]);
        for i in 0..10 {
            cache.put(&format!("s{i}"), &[("x".into(), i)], TTL);
        }
        assert!(cache.scopes.lock().unwrap().len() <= 4);
        // The most recent scopes stay.
        assert_eq!(cache.lookup("s9", &items(&["x"]), TTL), [Lookup::Fresh(9)]);
        cache.put("s9", &[("y".into(), 1), ("z".into(), 1)], TTL);
        cache.put("s9", &[("w".into(), 1)], TTL);
        let scopes = cache.scopes.lock().unwrap();
        assert!(scopes.get("s9").unwrap().items.len() <= 3);
    }

    fn age(cache: &ScopeCache<u64>, scope: &str, item: &str, by: Duration) {
        let mut scopes = cache.scopes.lock().unwrap();
        let cached = scopes.get_mut(scope).unwrap().items.get_mut(item).unwrap();
        cached.counted = Instant::now().checked_sub(by).unwrap();
    }

    #[test]
    fn a_stale_value_is_served_and_one_reader_recounts_it() {
        let cache = ScopeCache::new(4, 4);
        cache.put("a", &[("x".into(), 1u64), ("y".into(), 2)], TTL);
        assert_eq!(
            cache.lookup("a", &items(&["x", "z"]), TTL),
            [Lookup::Fresh(1), Lookup::Missing]
        );
        age(&cache, "a", "x", TTL + Duration::from_secs(1));
        // The first reader claims the recount; the next ones only read.
        let first = cache.lookup("a", &items(&["x", "y"]), TTL);
        assert_eq!(
            first,
            [
                Lookup::Stale {
                    value: 1,
                    refresh: true
                },
                Lookup::Fresh(2)
            ]
        );
        assert!(first[0].needs_refresh());
        assert_eq!(
            cache.lookup("a", &items(&["x"]), TTL),
            [Lookup::Stale {
                value: 1,
                refresh: false
            }]
        );
        // The recount lands: fresh again, and a later expiry is claimed anew.
        cache.put("a", &[("x".into(), 3)], TTL);
        assert_eq!(cache.lookup("a", &items(&["x"]), TTL), [Lookup::Fresh(3)]);
        age(&cache, "a", "x", TTL * 2);
        assert!(cache.lookup("a", &items(&["x"]), TTL)[0].needs_refresh());
    }

    #[test]
    fn a_lapsed_claim_is_handed_to_the_next_reader() {
        let cache = ScopeCache::new(4, 4);
        cache.put("a", &[("x".into(), 1u64)], TTL);
        age(&cache, "a", "x", TTL * 2);
        assert!(cache.lookup("a", &items(&["x"]), TTL)[0].needs_refresh());
        {
            let mut scopes = cache.scopes.lock().unwrap();
            let cached = scopes.get_mut("a").unwrap().items.get_mut("x").unwrap();
            cached.refresh_claimed = Instant::now().checked_sub(REFRESH_CLAIM);
        }
        assert!(cache.lookup("a", &items(&["x"]), TTL)[0].needs_refresh());
    }

    #[test]
    fn a_value_past_max_stale_is_missing() {
        let cache = ScopeCache::new(4, 4);
        cache.put("a", &[("x".into(), 1u64)], TTL);
        age(&cache, "a", "x", TTL * STALE_FACTOR);
        assert_eq!(cache.lookup("a", &items(&["x"]), TTL), [Lookup::Missing]);
        assert_eq!(Lookup::<u64>::Missing.value(), None);
    }
}

//! Counts cached in-process per access scope for a short while: BM25's corpus statistics and
//! document frequencies, and entities' role degrees. A scope is (FalkorDB server, namespace,
//! access predicates with their parameters), so two callers share a cached count only when
//! they read exactly the same chunks, and a count never tells one caller about chunks only
//! another may read. The cache holds numbers only, never text. Counts change only on ingest;
//! a count up to [`TTL`] old shifts scores (and, for degrees, an entity's weight or role)
//! until it expires, never which chunks a caller may read.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use kg_common::access::CypherPredicate;
use kg_stores::graph::GraphStore;
use serde_json::Value;

/// How long a cached count is trusted.
pub(crate) const TTL: Duration = Duration::from_secs(60);

/// Values of type `V` by scope key, then by item key, each with the time it was counted.
#[derive(Debug)]
pub(crate) struct ScopeCache<V> {
    scopes: Mutex<HashMap<String, Scope<V>>>,
    max_scopes: usize,
    max_items_per_scope: usize,
}

#[derive(Debug)]
struct Scope<V> {
    items: HashMap<String, (V, Instant)>,
    used: Instant,
}

fn fresh(at: Instant, now: Instant) -> bool {
    now.saturating_duration_since(at) < TTL
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

    /// The fresh value of each of `items` in `scope` (`None` where missing or stale).
    pub(crate) fn get(&self, scope: &str, items: &[String]) -> Vec<Option<V>> {
        let now = Instant::now();
        let mut scopes = self.scopes.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(cached) = scopes.get_mut(scope) else {
            return vec![None; items.len()];
        };
        cached.used = now;
        items
            .iter()
            .map(|item| {
                cached
                    .items
                    .get(item)
                    .filter(|(_, at)| fresh(*at, now))
                    .map(|(value, _)| *value)
            })
            .collect()
    }

    /// Stores `values` in `scope`, counted now. Past the bounds, stale scopes (then the least
    /// recently used one) and stale items (then all of the scope's) make room.
    pub(crate) fn put(&self, scope: &str, values: &[(String, V)]) {
        if values.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut scopes = self.scopes.lock().unwrap_or_else(PoisonError::into_inner);
        if !scopes.contains_key(scope) && scopes.len() >= self.max_scopes {
            scopes.retain(|_, s| fresh(s.used, now));
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
            cached.items.retain(|_, (_, at)| fresh(*at, now));
            if cached.items.len() + values.len() > self.max_items_per_scope {
                cached.items.clear();
            }
        }
        for (item, value) in values.iter().take(self.max_items_per_scope) {
            cached.items.insert(item.clone(), (*value, now));
        }
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

    fn items(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn values_are_per_scope_and_bounded() {
        let cache = ScopeCache::new(4, 3);
        cache.put("a", &[("x".into(), 2u64)]);
        assert_eq!(cache.get("a", &items(&["x", "y"])), [Some(2), None]);
        assert_eq!(cache.get("b", &items(&["x"])), [None]);
        for i in 0..10 {
            cache.put(&format!("s{i}"), &[("x".into(), i)]);
        }
        assert!(cache.scopes.lock().unwrap().len() <= 4);
        // The most recent scopes stay.
        assert_eq!(cache.get("s9", &items(&["x"])), [Some(9)]);
        cache.put("s9", &[("y".into(), 1), ("z".into(), 1)]);
        cache.put("s9", &[("w".into(), 1)]);
        let scopes = cache.scopes.lock().unwrap();
        assert!(scopes.get("s9").unwrap().items.len() <= 3);
    }

    #[test]
    fn stale_values_are_not_returned() {
        let cache = ScopeCache::new(4, 4);
        cache.put("a", &[("x".into(), 1u64)]);
        {
            let mut scopes = cache.scopes.lock().unwrap();
            let scope = scopes.get_mut("a").unwrap();
            let at = Instant::now().checked_sub(TTL).unwrap();
            scope.items.insert("x".into(), (1, at));
        }
        assert_eq!(cache.get("a", &items(&["x"])), [None]);
    }
}

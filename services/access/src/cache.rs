//! Answers kept for a while, at most so many: a caller presenting the same
//! token on every request costs the API server one review per TTL, and a
//! flood of distinct tokens costs memory no more than the bound.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub(crate) struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (Instant, V)>>,
    capacity: usize,
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
        }
    }

    /// The answer for `key`, while it is fresh.
    pub(crate) fn get(&self, key: &K) -> Option<V> {
        self.get_at(key, Instant::now())
    }

    fn get_at(&self, key: &K, now: Instant) -> Option<V> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .get(key)
            .filter(|(expires, _)| *expires > now)
            .map(|(_, value)| value.clone())
    }

    /// Keeps `value` for `ttl` (a zero TTL keeps nothing). When full, the
    /// expired answers go first, then the one that would expire soonest.
    pub(crate) fn insert(&self, key: K, value: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= self.capacity && !entries.contains_key(&key) {
            entries.retain(|_, (expires, _)| *expires > now);
            if entries.len() >= self.capacity
                && let Some(soonest) = entries
                    .iter()
                    .min_by_key(|(_, (expires, _))| *expires)
                    .map(|(k, _)| k.clone())
            {
                entries.remove(&soonest);
            }
        }
        entries.insert(key, (now + ttl, value));
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_fresh_only() {
        let cache = TtlCache::new(2);
        cache.insert(1, "a", Duration::from_secs(60));
        cache.insert(2, "b", Duration::from_secs(120));
        cache.insert(3, "c", Duration::from_secs(90));
        assert_eq!(cache.len(), 2);
        // The one expiring soonest made room.
        assert_eq!(cache.get(&1), None);
        assert_eq!(cache.get(&2), Some("b"));
        assert_eq!(cache.get(&3), Some("c"));
        cache.insert(4, "d", Duration::ZERO);
        assert_eq!(cache.get(&4), None, "a zero TTL keeps nothing");
        cache.insert(5, "e", Duration::from_secs(30));
        let later = Instant::now() + Duration::from_secs(31);
        assert_eq!(
            cache.get_at(&5, later),
            None,
            "an expired answer is not given"
        );
    }
}

//! Remembers Redis's denies until they expire, so an abusive key costs
//! the gateway a map lookup instead of a Redis round trip.

use std::num::NonZeroU32;
use std::time::Instant;

use dashmap::DashMap;

use crate::{Decision, Key, Quota};

#[derive(Debug, Clone, Copy)]
struct Entry {
    quota: Quota,
    cost: u32,
    until: Instant,
    reset_at: Instant,
}

/// Denies by key, each valid until its `Retry-After` has passed.
///
/// An entry answers only requests with the same quota and at least the same
/// cost: a cheaper request may fit sooner, and must ask Redis.
#[derive(Debug, Default)]
pub(crate) struct DenyCache {
    map: DashMap<Key, Entry>,
}

impl DenyCache {
    pub(crate) fn get(&self, key: &Key, quota: Quota, cost: NonZeroU32) -> Option<Decision> {
        let now = Instant::now();
        let e = *self.map.get(key)?;
        if now >= e.until {
            self.map.remove_if(key, |_, v| v.until <= now);
            return None;
        }
        (e.quota == quota && cost.get() >= e.cost).then(|| {
            Decision::denied(
                quota.limit(),
                quota.window(),
                e.until - now,
                e.reset_at.saturating_duration_since(now),
            )
        })
    }

    /// Records a deny from Redis.
    pub(crate) fn put(&self, key: Key, quota: Quota, cost: NonZeroU32, d: &Decision) {
        let Some(wait) = d.retry_after().filter(|w| !w.is_zero()) else {
            return;
        };
        let now = Instant::now();
        self.map.insert(
            key,
            Entry {
                quota,
                cost: cost.get(),
                until: now + wait,
                reset_at: now + d.reset(),
            },
        );
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn cleanup(&self) {
        let now = Instant::now();
        self.map.retain(|_, e| e.until > now);
        self.map.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn serves_a_deny_until_it_expires_only_for_equal_or_costlier_requests() {
        let c = DenyCache::default();
        let q = Quota::per_minute(10);
        let key = Key::from("k");
        let two = NonZeroU32::new(2).unwrap();
        assert!(c.get(&key, q, two).is_none());
        let d = Decision::denied(
            10,
            q.window(),
            Duration::from_millis(80),
            Duration::from_secs(6),
        );
        c.put(key.clone(), q, two, &d);
        let hit = c.get(&key, q, two).unwrap();
        assert!(!hit.is_allowed());
        assert!(hit.retry_after().unwrap() <= Duration::from_millis(80));
        assert!(
            c.get(&key, q, NonZeroU32::MIN).is_none(),
            "a cheaper request asks Redis"
        );
        assert!(
            c.get(&key, Quota::per_minute(20), two).is_none(),
            "another quota asks Redis"
        );
        std::thread::sleep(Duration::from_millis(100));
        assert!(c.get(&key, q, two).is_none());
        assert_eq!(c.len(), 0, "an expired entry is dropped on read");
    }

    #[test]
    fn never_caches_a_deny_without_a_wait() {
        let c = DenyCache::default();
        let q = Quota::per_minute(1);
        c.put(
            Key::from("k"),
            q,
            NonZeroU32::MIN,
            &Decision::never(1, q.window()),
        );
        assert_eq!(c.len(), 0);
    }
}

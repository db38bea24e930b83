//! Remembers Redis's denies until they expire, so an abusive key costs
//! the gateway a map lookup instead of a Redis round trip.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::bounded::BoundedMap;
use super::keyspace::Budget;
use crate::util::instant::after;
use crate::{decision::Decision, key::Key, quota::Quota};

#[derive(Debug, Clone, Copy)]
struct Entry {
    quota: Quota,
    /// The decision's window: a calendar month's own length.
    window: Duration,
    cost: u32,
    until: Instant,
    reset_at: Instant,
    /// One request is asking Redis now that the deny expired.
    refreshing: bool,
}

/// Denies by key, each valid until its `Retry-After` has passed.
///
/// An entry answers only requests with the same quota and at least the same
/// cost: a cheaper request may fit sooner, and must ask Redis. For smooth
/// algorithms (GCRA, token bucket) one unit comes back at a time, so when a
/// deny expires one request asks Redis while the others, which that unit
/// could not serve anyway, stay denied until the answer is in: no herd.
///
/// Bounded by the rule's `max_keys`: when full, expired entries go first;
/// if none has, the new deny is not cached (Redis answers it instead).
#[derive(Debug)]
pub(crate) struct DenyCache {
    map: BoundedMap<Entry>,
}

impl DenyCache {
    pub(crate) fn new(budget: Arc<Budget>) -> Self {
        Self {
            map: BoundedMap::new(budget),
        }
    }

    /// A cached deny, or `None` when this request must ask Redis.
    pub(crate) fn get(
        &self,
        key: &Key,
        quota: Quota,
        cost: NonZeroU32,
        single_flight: bool,
    ) -> Option<Decision> {
        self.get_at(Instant::now, key, quota, cost, single_flight)
    }

    /// [`get`](Self::get) at the time `now` reads, read only when a deny
    /// of the key is cached: most keys have none.
    fn get_at(
        &self,
        now: impl FnOnce() -> Instant,
        key: &Key,
        quota: Quota,
        cost: NonZeroU32,
        single_flight: bool,
    ) -> Option<Decision> {
        let mut e = self.map.get_mut(key)?;
        if e.quota != quota {
            return None;
        }
        let now = now();
        let deny = |e: &Entry, wait: Duration| {
            let reset = e.reset_at.saturating_duration_since(now);
            Decision::denied(quota.limit(), e.window, wait, reset)
        };
        if now < e.until {
            return (cost.get() >= e.cost).then(|| deny(&e, e.until - now));
        }
        // Past one emission interval more than one unit may be back: ask.
        let interval = quota.emission_interval();
        if single_flight && now < after(e.until, interval) {
            if e.refreshing {
                return Some(deny(&e, interval.max(Duration::from_millis(1))));
            }
            e.refreshing = true;
            return None;
        }
        drop(e);
        self.map.remove_if(key, |v| v.until <= now);
        None
    }

    /// Records a deny from Redis, or an allow that left nothing until
    /// `d.retry_after()`; a fresh entry ends any refresh.
    pub(crate) fn put(&self, key: &Key, quota: Quota, cost: NonZeroU32, d: &Decision) {
        self.put_at(Instant::now(), key, quota, cost, d);
    }

    fn put_at(&self, now: Instant, key: &Key, quota: Quota, cost: NonZeroU32, d: &Decision) {
        let Some(wait) = d.retry_after().filter(|w| !w.is_zero()) else {
            return;
        };
        let entry = Entry {
            quota,
            window: d.window(),
            cost: cost.get(),
            until: after(now, wait),
            reset_at: after(now, d.reset()),
            refreshing: false,
        };
        // A new entry's place may be freed by forgetting expired ones.
        self.map.put(key, entry, |e| e.until > now);
    }

    /// Redis admitted with room to spare, or could not answer: the key's
    /// requests go to Redis again.
    pub(crate) fn forget(&self, key: &Key) {
        self.map.remove(key);
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn cleanup(&self) {
        self.cleanup_at(Instant::now());
    }

    fn cleanup_at(&self, now: Instant) {
        self.map.retain(|e| e.until > now);
        self.map.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::keyspace::KeySpaceFull;

    const TWO: NonZeroU32 = NonZeroU32::new(2).unwrap();

    fn deny(limit: u32, q: Quota, wait_ms: u64, reset: Duration) -> Decision {
        Decision::denied(limit, q.window(), Duration::from_millis(wait_ms), reset)
    }

    #[test]
    fn serves_a_deny_until_it_expires_only_for_equal_or_costlier_requests() {
        let (c, t) = (
            DenyCache::new(Budget::new(1000, KeySpaceFull::Refuse)),
            Instant::now(),
        );
        let q = Quota::per_minute(10);
        let key = Key::from("k");
        assert!(c.get_at(|| t, &key, q, TWO, false).is_none());
        c.put_at(t, &key, q, TWO, &deny(10, q, 80, Duration::from_secs(6)));
        let hit = c
            .get_at(|| t + Duration::from_millis(30), &key, q, TWO, false)
            .unwrap();
        assert!(!hit.is_allowed());
        assert_eq!(hit.retry_after(), Some(Duration::from_millis(50)));
        assert_eq!(hit.reset(), Duration::from_millis(5970));
        assert!(
            c.get_at(|| t, &key, q, NonZeroU32::MIN, false).is_none(),
            "a cheaper request asks Redis"
        );
        assert!(
            c.get_at(|| t, &key, Quota::per_minute(20), TWO, false)
                .is_none(),
            "another quota asks Redis"
        );
        assert!(
            c.get_at(|| t + Duration::from_millis(80), &key, q, TWO, false)
                .is_none()
        );
        assert_eq!(c.len(), 0, "an expired entry is dropped on read");
    }

    #[test]
    fn one_request_refreshes_an_expired_deny_while_the_rest_wait() {
        let (c, t) = (
            DenyCache::new(Budget::new(1000, KeySpaceFull::Refuse)),
            Instant::now(),
        );
        let q = Quota::per_minute(60); // one unit back per second
        let key = Key::from("k");
        c.put_at(
            t,
            &key,
            q,
            NonZeroU32::MIN,
            &deny(60, q, 20, Duration::from_secs(60)),
        );
        let later = t + Duration::from_millis(30);
        assert!(
            c.get_at(|| later, &key, q, NonZeroU32::MIN, true).is_none(),
            "the first asks Redis"
        );
        let held = c
            .get_at(|| later, &key, q, NonZeroU32::MIN, true)
            .expect("the others stay denied");
        assert_eq!(held.retry_after(), Some(Duration::from_secs(1)));
        // Past one more interval another unit may be back: all ask again.
        let much_later = t + Duration::from_millis(1021);
        assert!(
            c.get_at(|| much_later, &key, q, NonZeroU32::MIN, true)
                .is_none()
        );
        // Redis admitted with room: everyone asks again.
        c.put_at(
            t,
            &key,
            q,
            NonZeroU32::MIN,
            &deny(60, q, 20, Duration::from_secs(60)),
        );
        c.forget(&key);
        assert!(c.get_at(|| later, &key, q, NonZeroU32::MIN, true).is_none());
    }

    #[test]
    fn cleanup_drops_only_expired_entries() {
        let (c, t) = (
            DenyCache::new(Budget::new(1000, KeySpaceFull::Refuse)),
            Instant::now(),
        );
        let q = Quota::per_minute(10);
        c.put_at(
            t,
            &Key::from("short"),
            q,
            TWO,
            &deny(10, q, 10, Duration::from_secs(6)),
        );
        c.put_at(
            t,
            &Key::from("long"),
            q,
            TWO,
            &deny(10, q, 500, Duration::from_secs(6)),
        );
        c.cleanup_at(t + Duration::from_millis(100));
        assert_eq!(c.len(), 1);
        assert!(
            c.get_at(
                || t + Duration::from_millis(100),
                &Key::from("long"),
                q,
                TWO,
                false
            )
            .is_some()
        );
    }

    #[test]
    fn never_caches_a_deny_without_a_wait() {
        let c = DenyCache::new(Budget::new(1000, KeySpaceFull::Refuse));
        let q = Quota::per_minute(1);
        c.put(
            &Key::from("k"),
            q,
            NonZeroU32::MIN,
            &Decision::never(1, q.window()),
        );
        assert_eq!(c.len(), 0);
    }
}

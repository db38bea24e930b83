//! What Redis last told this gateway of each key, so that the local
//! fallback starts a key from it: a key Redis has counted keeps its usage
//! (and a refused key its refusal) when Redis stops answering, and only a
//! key never seen starts from a whole local share.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::bounded::BoundedMap;
use super::keyspace::Budget;
use crate::util::instant::after;
use crate::{algorithm::Algorithm, key::Key, quota::Quota};

/// One key's usage as Redis last answered, independent of any share.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The fraction of the quota's capacity in use, 0 to 1.
    used: f64,
    /// When Redis answered.
    at: Instant,
    /// When the key is whole again: nothing of `used` counts after.
    whole_at: Instant,
}

impl Entry {
    /// The units of `share` still in use at `now`, rounded up (a fallback
    /// never hands out a unit Redis had counted): a calendar share's count
    /// in the window Redis answered in, a rolling share's used units less
    /// those its own pace has given back since.
    fn units(&self, share: Quota, now: Instant) -> u32 {
        if now >= self.whole_at {
            return 0;
        }
        let used = if share.period().is_some() {
            self.used * f64::from(share.limit())
        } else {
            let back = now.duration_since(self.at).as_secs_f64()
                / share
                    .emission_interval()
                    .as_secs_f64()
                    .max(f64::MIN_POSITIVE);
            self.used * f64::from(share.burst()) - back
        };
        // Float error must not cost a whole unit.
        (used - 1e-6).ceil().max(0.0) as u32
    }
}

/// Each key's last answer from Redis, by key, for the fallback to start
/// from. Bounded by the rule's `max_keys`: when full, keys whole again go
/// first; if none is, a new key is not recorded (and would start from the
/// local share).
#[derive(Debug)]
pub(crate) struct Learned {
    map: BoundedMap<Entry>,
}

impl Learned {
    pub(crate) fn new(budget: Arc<Budget>) -> Self {
        Self {
            map: BoundedMap::new(budget),
        }
    }

    /// Records Redis's answer for `key` under `quota` (as Redis counts it):
    /// `remaining` units, the key whole again after `reset`. The smooth
    /// algorithms' usage is read from `reset` (their state's exact
    /// arrival time), the windows' from `remaining`. No allocation for a
    /// key seen before or short enough to be held inline.
    pub(crate) fn put(
        &self,
        key: &Key,
        algorithm: Algorithm,
        quota: &Quota,
        remaining: u32,
        reset: Duration,
    ) {
        let capacity = f64::from(algorithm.capacity(quota).max(1));
        let used = if algorithm.has_burst() && quota.period().is_none() {
            reset.as_secs_f64() / (capacity * quota.emission_interval().as_secs_f64())
        } else {
            1.0 - f64::from(remaining) / capacity
        };
        let now = Instant::now();
        let entry = Entry {
            used: used.clamp(0.0, 1.0),
            at: now,
            whole_at: after(now, reset),
        };
        self.map.put(key, entry, |e| e.whole_at > now);
    }

    /// Takes what was learned of `key` and hands `seed` the units of
    /// `share` it has in use now, under the entry's lock: a request of the
    /// same key arriving meanwhile waits, then finds the fallback seeded.
    pub(crate) fn take(&self, key: &Key, share: Quota, seed: impl FnOnce(u32)) {
        let now = Instant::now();
        self.map.remove_if(key, |e| {
            seed(e.units(share, now));
            true
        });
    }

    /// Redis's state of `key` changed without an answer here (a reset).
    pub(crate) fn forget(&self, key: &Key) {
        self.map.remove(key);
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Forgets keys whole again: the fallback starts them whole anyway.
    pub(crate) fn cleanup(&self) {
        let now = Instant::now();
        self.map.retain(|e| e.whole_at > now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::KeySpaceFull;

    fn learned(max: usize) -> Learned {
        Learned::new(Budget::new(max, KeySpaceFull::Refuse))
    }

    fn units(l: &Learned, key: &'static str, share: Quota) -> Option<u32> {
        let mut out = None;
        l.take(&Key::from(key), share, |u| out = Some(u));
        out
    }

    #[test]
    fn a_smooth_key_keeps_its_fraction_of_the_share() {
        let (l, q) = (learned(10), Quota::per_minute(10));
        // 7 of 10 spent: whole again in 42 s, 3 left.
        l.put(
            &Key::from("k"),
            Algorithm::Gcra,
            &q,
            3,
            Duration::from_secs(42),
        );
        // Half the quota: 3.5 of 5 in use, rounded up.
        assert_eq!(units(&l, "k", q.divided_by(2)), Some(4));
        assert_eq!(units(&l, "k", q.divided_by(2)), None, "taken once");
    }

    #[test]
    fn a_window_key_keeps_its_count_and_a_refusal_the_whole_share() {
        let (l, q) = (learned(10), Quota::per_minute(10));
        let k = Key::from("k");
        l.put(&k, Algorithm::FixedWindow, &q, 6, Duration::from_secs(50));
        assert_eq!(units(&l, "k", q.divided_by(2)), Some(2));
        l.put(&k, Algorithm::SlidingWindow, &q, 0, Duration::from_secs(50));
        assert_eq!(
            units(&l, "k", q.divided_by(2)),
            Some(5),
            "refused: all used"
        );
        let day = Quota::per_calendar_day(10);
        l.put(&k, Algorithm::Gcra, &day, 2, Duration::from_secs(3600));
        assert_eq!(units(&l, "k", day.divided_by(3)), Some(4), "8 of 10 of 4");
    }

    #[test]
    fn a_key_whole_again_holds_nothing_and_the_budget_bounds_the_map() {
        let (l, q) = (learned(1), Quota::per_minute(10));
        l.put(&Key::from("a"), Algorithm::Gcra, &q, 9, Duration::ZERO);
        assert_eq!(units(&l, "a", q), Some(0), "whole at once");
        l.put(
            &Key::from("a"),
            Algorithm::Gcra,
            &q,
            9,
            Duration::from_secs(6),
        );
        l.put(
            &Key::from("b"),
            Algorithm::Gcra,
            &q,
            9,
            Duration::from_secs(6),
        );
        assert_eq!(l.len(), 1, "no room for b");
        assert_eq!(units(&l, "b", q), None);
        l.forget(&Key::from("a"));
        assert_eq!(l.len(), 0);
    }
}

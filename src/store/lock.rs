//! Locked keys in this process: lockouts and blocks of a local rule, and
//! what this gateway learned of a global rule's locks in Redis, so a locked
//! key is denied with no backend call until its lock ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use tokio::time::Instant;

use super::keyspace::Budget;
use crate::key::Key;
use crate::policy::Lockout;
use crate::util::instant::after;
use crate::util::throttle::Throttle;

/// How long a gateway answers from a lock it learned from Redis (or set
/// there) before asking Redis again: an unblock or reset through another
/// gateway's handle reaches this one within it. While Redis cannot answer,
/// the learned lock holds to its end.
pub(crate) const LEARNED_FOR: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Locked until then; `None` while the key is only counting denies.
    until: Option<Instant>,
    /// For a lock learned from Redis: when to ask Redis again.
    recheck: Option<Instant>,
    /// Denies since `since`, toward a lockout.
    denies: u32,
    since: Instant,
}

/// Per key: a lock, or the denies counted toward one.
///
/// Bounded by the rule's `max_keys`: when full, entries whose lock and
/// deny period ended go first; if none has, a new key is neither counted
/// nor locked here (its rate limit still holds).
#[derive(Debug)]
pub(crate) struct Locks {
    map: DashMap<Key, Entry>,
    /// The map's entries, read without touching it: most rules never lock
    /// a key, and their requests pay one atomic load.
    held: AtomicUsize,
    budget: Arc<Budget>,
    sweeps: Throttle,
}

impl Locks {
    pub(crate) fn new(budget: Arc<Budget>) -> Self {
        Self {
            map: DashMap::new(),
            held: AtomicUsize::new(0),
            budget,
            sweeps: Throttle::default(),
        }
    }

    /// Whether any key is held at all: one atomic load.
    #[inline]
    pub(crate) fn any(&self) -> bool {
        self.held.load(Ordering::Relaxed) != 0
    }

    /// How long `key` stays locked, if it is and the lock may answer
    /// without Redis (a learned lock, until its recheck).
    pub(crate) fn locked(&self, key: &Key) -> Option<Duration> {
        self.left(key, false)
    }

    /// How long `key` stays locked, a learned lock included past its
    /// recheck: what holds while Redis cannot answer.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn held(&self, key: &Key) -> Option<Duration> {
        self.left(key, true)
    }

    fn left(&self, key: &Key, past_recheck: bool) -> Option<Duration> {
        if !self.any() {
            return None;
        }
        let e = *self.map.get(key)?;
        let now = Instant::now();
        if !past_recheck && e.recheck.is_some_and(|r| r <= now) {
            return None;
        }
        let left = e.until?.checked_duration_since(now)?;
        (!left.is_zero()).then_some(left)
    }

    /// Counts a deny of `key`; returns the block when it locks the key.
    pub(crate) fn denied(&self, key: &Key, lockout: Lockout) -> Option<Duration> {
        let now = Instant::now();
        let mut lock = None;
        self.upsert(key, now, lockout.within, |e| {
            if e.until.is_some_and(|u| u > now) {
                return;
            }
            if now.duration_since(e.since) >= lockout.within || e.until.is_some() {
                *e = Entry {
                    until: None,
                    recheck: None,
                    denies: 0,
                    since: now,
                };
            }
            e.denies += 1;
            if e.denies >= lockout.after {
                e.until = Some(after(now, lockout.block_for));
                lock = Some(lockout.block_for);
            }
        });
        lock
    }

    /// Locks `key` for `period` (replacing a shorter or longer lock);
    /// `learned`: a copy of a lock kept in Redis, asked again after
    /// [`LEARNED_FOR`]. A full map first forgets what ended, and deny
    /// counts older than `within`. False when no place was left.
    pub(crate) fn block(
        &self,
        key: &Key,
        period: Duration,
        learned: bool,
        within: Duration,
    ) -> bool {
        let now = Instant::now();
        let until = after(now, period);
        let recheck = learned.then(|| after(now, LEARNED_FOR));
        self.upsert(key, now, within, |e| {
            *e = Entry {
                until: Some(until),
                recheck,
                denies: 0,
                since: now,
            };
        })
    }

    /// Ends `key`'s lock and forgets its denies.
    pub(crate) fn unblock(&self, key: &Key) {
        if self.map.remove(key).is_some() {
            self.held.fetch_sub(1, Ordering::Relaxed);
            self.budget.give_back(1);
        }
    }

    /// `f` on `key`'s entry, made if a place is left (a full map first
    /// forgets ended locks and deny counts older than `within`).
    fn upsert(
        &self,
        key: &Key,
        now: Instant,
        within: Duration,
        f: impl FnOnce(&mut Entry),
    ) -> bool {
        if let Some(mut e) = self.map.get_mut(key) {
            f(&mut e);
            return true;
        }
        if !self
            .budget
            .take_or_sweep(&self.sweeps, || self.forget_ended(now, within))
        {
            return false;
        }
        let mut fresh = false;
        let mut e = self.map.entry(key.clone()).or_insert_with(|| {
            fresh = true;
            Entry {
                until: None,
                recheck: None,
                denies: 0,
                since: now,
            }
        });
        if fresh {
            self.held.fetch_add(1, Ordering::Relaxed);
        } else {
            self.budget.give_back(1);
        }
        f(&mut e);
        true
    }

    /// Forgets keys whose lock ended and whose denies are older than `within`.
    fn forget_ended(&self, now: Instant, within: Duration) -> usize {
        let removed = self.budget.retain(&self.map, |e| match e.until {
            Some(until) => until > now,
            None => now.duration_since(e.since) < within,
        });
        self.held.fetch_sub(removed, Ordering::Relaxed);
        removed
    }

    pub(crate) fn len(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Forgets ended locks and deny counts older than `within` (the rule's
    /// lockout period, or zero).
    pub(crate) fn cleanup(&self, within: Duration) {
        self.forget_ended(Instant::now(), within);
        self.map.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::KeySpaceFull;

    fn locks(max: usize) -> Locks {
        Locks::new(Budget::new(max, KeySpaceFull::Refuse))
    }

    #[tokio::test(start_paused = true)]
    async fn the_nth_deny_within_the_period_locks_for_the_block() {
        let l = locks(10);
        let k = Key::from("k");
        let lockout = Lockout::new(3, Duration::from_secs(10), Duration::from_secs(60));
        assert_eq!(l.denied(&k, lockout), None);
        assert_eq!(l.denied(&k, lockout), None);
        assert_eq!(l.locked(&k), None, "counting is not locking");
        assert_eq!(l.denied(&k, lockout), Some(Duration::from_secs(60)));
        assert_eq!(l.locked(&k), Some(Duration::from_secs(60)));
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(l.locked(&k), Some(Duration::from_secs(1)));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(l.locked(&k), None, "the block ended");
        // A new count starts after a lock.
        assert_eq!(l.denied(&k, lockout), None);
        assert_eq!(l.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_learned_lock_answers_until_its_recheck_and_holds_to_its_end() {
        let l = locks(10);
        let k = Key::from("k");
        assert!(l.block(&k, Duration::from_secs(900), true, Duration::ZERO));
        assert_eq!(
            l.locked(&k),
            Some(Duration::from_secs(900)),
            "the true time left"
        );
        tokio::time::advance(LEARNED_FOR).await;
        assert_eq!(l.locked(&k), None, "ask Redis again");
        let held = l.held(&k).unwrap();
        assert_eq!(held, Duration::from_secs(899), "Redis down: the lock holds");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lockout_for_ever_does_not_overflow() {
        let l = locks(10);
        let k = Key::from("k");
        let lockout = Lockout::new(1, Duration::from_secs(10), Duration::MAX);
        assert_eq!(l.denied(&k, lockout), Some(Duration::MAX));
        assert!(l.locked(&k).unwrap() > Duration::from_secs(3_000_000_000));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_map_keeps_deny_counts_within_their_period() {
        let l = locks(1);
        let (a, b) = (Key::from("a"), Key::from("b"));
        let lockout = Lockout::new(2, Duration::from_secs(10), Duration::from_secs(60));
        assert_eq!(l.denied(&a, lockout), None);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(l.denied(&b, lockout), None, "no place: a still counts");
        assert_eq!(l.denied(&a, lockout), Some(Duration::from_secs(60)));
    }

    #[tokio::test(start_paused = true)]
    async fn denies_spread_wider_than_the_period_never_lock() {
        let l = locks(10);
        let k = Key::from("k");
        let lockout = Lockout::new(2, Duration::from_secs(10), Duration::from_secs(60));
        assert_eq!(l.denied(&k, lockout), None);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(l.denied(&k, lockout), None, "the first deny's period ended");
        assert_eq!(l.denied(&k, lockout), Some(Duration::from_secs(60)));
    }

    #[tokio::test(start_paused = true)]
    async fn block_unblock_and_the_bound() {
        let l = locks(1);
        let (a, b) = (Key::from("a"), Key::from("b"));
        let zero = Duration::ZERO;
        assert!(l.block(&a, Duration::from_secs(5), false, zero));
        assert_eq!(l.locked(&a), Some(Duration::from_secs(5)));
        assert!(
            !l.block(&b, Duration::from_secs(5), false, zero),
            "no place left for b"
        );
        assert_eq!(l.locked(&b), None);
        l.unblock(&a);
        assert_eq!((l.locked(&a), l.len()), (None, 0));
        assert!(l.block(&b, Duration::MAX, false, zero));
        assert!(l.locked(&b).is_some(), "a block for ever does not overflow");
        l.cleanup(Duration::ZERO);
        assert_eq!(l.len(), 1, "b is still locked");
    }
}

//! A bounded key space for the in-process stores, so a flood of distinct
//! keys (random API keys, the 2^64 addresses of one IPv6 /64) can't grow
//! memory without limit.
//!
//! A rule's stores share one [`Budget`] of keys. A new key takes a place;
//! when none is left, the store first forgets its full buckets (state a new
//! key would have anyway, so no decision changes), at most once per
//! [`SWEEP_EVERY`]; if that frees nothing, the new key is *diverted*: it
//! counts in one shared overflow bucket, or is refused
//! ([`KeySpaceFull`]). Known keys keep their own limits throughout.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use governor::clock::{Clock, Reference};
use governor::nanos::Nanos;
use governor::state::StateStore;
use governor::state::keyed::ShrinkableKeyedStateStore;

use super::inherit::Inherit;
use crate::key::Key;
pub(crate) use crate::policy::KeySpaceFull;
use crate::util::throttle::Throttle;

/// How often a full store may look for full buckets to forget.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// The places for keys that one rule's stores share.
#[derive(Debug)]
pub(crate) struct Budget {
    max: usize,
    used: AtomicUsize,
    pub(crate) when_full: KeySpaceFull,
}

impl Budget {
    pub(crate) fn new(max: usize, when_full: KeySpaceFull) -> Arc<Self> {
        Arc::new(Self {
            max,
            used: AtomicUsize::new(0),
            when_full,
        })
    }

    /// Takes a place for a new key, if one is left.
    pub(crate) fn take(&self) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .is_ok()
    }

    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// Takes a place, or makes one with `sweep` (which returns how many
    /// entries it forgot), at most once per [`SWEEP_EVERY`] per `sweeps`.
    pub(crate) fn take_or_sweep(&self, sweeps: &Throttle, sweep: impl FnOnce() -> usize) -> bool {
        self.take() || (sweeps.ready(SWEEP_EVERY) && sweep() > 0 && self.take())
    }

    /// Removes the entries of `map` that `keep` refuses and gives their
    /// places back. Counted in the closure: the map's length also moves
    /// with other threads' inserts and removals while `retain` walks it.
    pub(crate) fn retain<K: Eq + std::hash::Hash, V>(
        &self,
        map: &DashMap<K, V>,
        mut keep: impl FnMut(&V) -> bool,
    ) -> usize {
        let mut removed = 0;
        map.retain(|_, v| {
            let kept = keep(v);
            removed += usize::from(!kept);
            kept
        });
        self.give_back(removed);
        removed
    }

    pub(crate) fn give_back(&self, n: usize) {
        if n > 0 {
            // Saturating: a miscount must not wrap into "full forever".
            let _ = self
                .used
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                    Some(u.saturating_sub(n))
                });
        }
    }
}

// Why a thread-local: governor's `StateStore` hands back nothing but the
// decision, so a store that diverts a new key (its key space full) leaves
// a mark here, on the thread that made the check, and `LocalStore::check`
// reads it straight after (the calendar store marks it the same way).
thread_local! {
    /// Set by a store that diverted this thread's last new key.
    static DIVERTED: Cell<Option<KeySpaceFull>> = const { Cell::new(None) };
}

/// Whether the check just made on this thread was diverted, and how;
/// clears the mark.
pub(crate) fn take_diverted() -> Option<KeySpaceFull> {
    DIVERTED.with(Cell::take)
}

pub(crate) fn mark_diverted(how: KeySpaceFull) {
    DIVERTED.with(|d| d.set(Some(how)));
}

/// governor's keyed GCRA state, bounded by a [`Budget`]: one theoretical
/// arrival time per key (0: none yet), as governor's own `DashMap` store
/// keeps it, plus the overflow bucket. Shared with the [`LocalStore`]
/// (crate::store::local::LocalStore), which moves arrival times for
/// refunds and the control handle: governor owns its store by value.
pub(crate) struct GcraStore<C: Clock>(Arc<GcraState<C>>);

pub(crate) struct GcraState<C: Clock> {
    map: DashMap<Key, AtomicU64>,
    overflow: AtomicU64,
    budget: Arc<Budget>,
    sweeps: Throttle,
    clock: C,
    /// Read just before the limiter's own start, so `now` here is never
    /// behind governor's.
    start: C::Instant,
    /// One emission interval: governor keeps a key that long past full.
    t: Nanos,
    /// The units a new key has used already, while a reload carries the
    /// keys of the state this one replaces over.
    pub(crate) inherit: Inherit<f64>,
}

impl<C: Clock> GcraStore<C> {
    pub(crate) fn new(budget: Arc<Budget>, clock: C, t: Duration) -> Self {
        Self(Arc::new(GcraState {
            map: DashMap::new(),
            overflow: AtomicU64::new(0),
            budget,
            sweeps: Throttle::default(),
            start: clock.now(),
            clock,
            t: Nanos::from(t),
            inherit: Inherit::none(),
        }))
    }

    /// The state, for [`GcraState::adjust`] beside governor's checks.
    pub(crate) fn state(&self) -> Arc<GcraState<C>> {
        self.0.clone()
    }
}

/// A key's arrival time and the time it was read at, governor's nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tat {
    pub(crate) tat: Duration,
    pub(crate) now: Duration,
}

impl<C: Clock> GcraState<C> {
    fn now(&self) -> Nanos {
        self.clock.now().duration_since(self.start)
    }

    fn forget_full(&self, drop_below: Nanos) -> usize {
        let drop_below = u64::from(drop_below);
        self.budget
            .retain(&self.map, |tat| tat.load(Ordering::Relaxed) > drop_below)
    }

    /// Room for a new key: a free place, or one freed by forgetting full buckets.
    fn room(&self) -> bool {
        self.budget.take_or_sweep(&self.sweeps, || {
            let now = self.now();
            // As governor's retain_recent: a full bucket, one interval on.
            let margin = self.t + Nanos::from(Duration::from_micros(1));
            self.forget_full(now.saturating_sub(margin))
        })
    }

    /// Spends (`units > 0`) or gives back (`units < 0`) whole emission
    /// intervals of `key`'s bucket without a decision, or reads it (`0`).
    /// Never past an empty bucket of `burst` units, so a huge
    /// charge makes the next unit wait one interval, not forever; never
    /// past a full one. A key not held reads as full; a charge takes a place
    /// for it, and is dropped when the key space is full.
    pub(crate) fn adjust(&self, key: &Key, units: i64, burst: u32) -> Tat {
        let now = self.now();
        let t = u64::from(self.t);
        // governor admits while now >= tat - (burst - 1) t: one interval past
        // that, the last unit was just spent.
        let empty = u64::from(now).saturating_add(t.saturating_mul(u64::from(burst)));
        let step = |tat: u64| -> u64 {
            let moved = t.saturating_mul(units.unsigned_abs());
            if units > 0 {
                tat.max(u64::from(now)).saturating_add(moved).min(empty)
            } else {
                // 0 means "no state": a bucket given back past full is full.
                tat.saturating_sub(moved).max(1)
            }
        };
        let read = |cell: &AtomicU64| {
            let mut prev = cell.load(Ordering::Acquire);
            loop {
                let next = if prev == 0 || units == 0 {
                    if units > 0 {
                        step(u64::from(now))
                    } else {
                        prev
                    }
                } else {
                    step(prev)
                };
                if next == prev {
                    return next;
                }
                match cell.compare_exchange_weak(prev, next, Ordering::Release, Ordering::Relaxed) {
                    Ok(_) => return next,
                    Err(p) => prev = p,
                }
            }
        };
        let tat = match self.map.get(key) {
            Some(cell) => read(&cell),
            None if units > 0 && self.room() => read(&self.insert(key)),
            None => self.start(key, now),
        };
        Tat {
            tat: Duration::from_nanos(tat),
            now: now.into(),
        }
    }

    /// `key`'s cell, made with a place the caller took: another request
    /// may have made it meanwhile.
    fn insert(&self, key: &Key) -> dashmap::mapref::one::RefMut<'_, Key, AtomicU64> {
        let mut fresh = false;
        let cell = self.map.entry(key.clone()).or_insert_with(|| {
            fresh = true;
            AtomicU64::new(self.start(key, self.now()))
        });
        if !fresh {
            self.budget.give_back(1);
        }
        cell
    }

    /// The arrival time a new `key` starts from at `now`: none (0), or
    /// what it inherits.
    fn start(&self, key: &Key, now: Nanos) -> u64 {
        let used = self.inherit.start(key, 0.0);
        if used > 0.0 {
            u64::from(now).saturating_add((used * u64::from(self.t) as f64) as u64)
        } else {
            0
        }
    }

    /// Carries `key` over from the state this one replaces, unless it is
    /// here already or has nothing to carry.
    pub(crate) fn adopt(&self, key: &Key) {
        if !self.map.contains_key(key) && self.start(key, self.now()) != 0 && self.room() {
            drop(self.insert(key));
        }
    }

    /// The units `key` has not got back, in emission intervals.
    pub(crate) fn used_of(&self, key: &Key) -> f64 {
        let now = u64::from(self.now());
        self.map.get(key).map_or(0.0, |tat| {
            let tat = tat.load(Ordering::Acquire);
            tat.saturating_sub(now) as f64 / u64::from(self.t).max(1) as f64
        })
    }

    /// Each held key's units not yet back, in emission intervals: what a
    /// quota change converts and a snapshot saves.
    pub(crate) fn used(&self) -> Vec<(Key, f64)> {
        let now = u64::from(self.now());
        let t = u64::from(self.t).max(1) as f64;
        self.map
            .iter()
            .filter_map(|e| {
                let tat = e.value().load(Ordering::Acquire);
                (tat > now).then(|| (e.key().clone(), (tat - now) as f64 / t))
            })
            .collect()
    }

    /// Sets `key` to `used` intervals not yet back (at most `burst`), when
    /// there is a place for it.
    pub(crate) fn put_used(&self, key: Key, used: f64, burst: u32) {
        let used = used.clamp(0.0, f64::from(burst));
        if used <= 0.0 || (!self.map.contains_key(&key) && !self.room()) {
            return;
        }
        let now = u64::from(self.now());
        let tat = now.saturating_add((used * u64::from(self.t) as f64) as u64);
        if self.map.insert(key, AtomicU64::new(tat)).is_some() {
            self.budget.give_back(1);
        }
    }

    /// Forgets `key`: its bucket is whole again.
    pub(crate) fn remove(&self, key: &Key) {
        if self.map.remove(key).is_some() {
            self.budget.give_back(1);
        }
    }
}

/// governor's CAS loop on one arrival time.
fn measure<T, E>(
    tat: &AtomicU64,
    f: impl Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
) -> Result<T, E> {
    let mut prev = tat.load(Ordering::Acquire);
    loop {
        let (result, next) = f((prev != 0).then(|| Nanos::from(prev)))?;
        match tat.compare_exchange_weak(prev, next.into(), Ordering::Release, Ordering::Relaxed) {
            Ok(_) => return Ok(result),
            Err(p) => prev = p,
        }
    }
}

impl<C: Clock> StateStore for GcraStore<C> {
    type Key = Key;

    fn measure_and_replace<T, F, E>(&self, key: &Key, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        if let Some(tat) = self.0.map.get(key) {
            return measure(&tat, f);
        }
        if self.0.room() {
            return measure(&self.0.insert(key), f);
        }
        mark_diverted(self.0.budget.when_full);
        match self.0.budget.when_full {
            KeySpaceFull::Overflow => measure(&self.0.overflow, f),
            // The caller refuses: measure a fresh bucket, store nothing.
            KeySpaceFull::Refuse => f(None).map(|(result, _)| result),
        }
    }
}

impl<C: Clock> ShrinkableKeyedStateStore<Key> for GcraStore<C> {
    fn retain_recent(&self, drop_below: Nanos) {
        self.0.forget_full(drop_below);
    }

    fn shrink_to_fit(&self) {
        self.0.map.shrink_to_fit();
    }

    fn len(&self) -> usize {
        self.0.map.len()
    }

    fn is_empty(&self) -> bool {
        self.0.map.is_empty()
    }
}

impl<C: Clock> Drop for GcraState<C> {
    fn drop(&mut self) {
        self.budget.give_back(self.map.len());
    }
}

impl<C: Clock> std::fmt::Debug for GcraStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GcraStore")
            .field("keys", &self.0.map.len())
            .field("budget", &self.0.budget)
            .finish_non_exhaustive()
    }
}

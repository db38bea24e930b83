//! The in-process backend: `governor` keyed GCRA limiters.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::middleware::StateInformationMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota as GovernorQuota, RateLimiter};

use super::calendar::CalendarStore;
use crate::{Decision, Key, Quota};

type Keyed<C> = RateLimiter<Key, DefaultKeyedStateStore<Key>, C, StateInformationMiddleware>;

/// Keyed limiters for one rule: one governor limiter per distinct quota, so
/// per-plan quotas don't share cells. The clock is governor's: the system's,
/// or a fake one that tests advance.
pub(crate) struct LocalStore<C: Clock = DefaultClock> {
    /// The static quota's limiter and emission interval: the hot path skips
    /// the map and the division.
    fixed: Option<(Quota, Duration, Arc<Keyed<C>>)>,
    dynamic: RwLock<HashMap<Quota, Arc<Keyed<C>>>>,
    /// Calendar quotas, made on first use; boxed to keep the store small.
    calendar: OnceLock<Box<CalendarStore>>,
    clock: C,
}

impl LocalStore {
    pub(crate) fn new(fixed: Option<Quota>) -> Self {
        Self::with_clock(fixed, DefaultClock::default())
    }
}

impl<C: Clock + Clone> LocalStore<C> {
    fn with_clock(fixed: Option<Quota>, clock: C) -> Self {
        Self {
            fixed: fixed
                .filter(|q| q.period().is_none())
                .map(|q| (q, q.emission_interval(), Arc::new(limiter(q, &clock)))),
            dynamic: RwLock::new(HashMap::new()),
            calendar: OnceLock::new(),
            clock,
        }
    }

    /// Spends `cost` units of `quota` for `key`. `quota` must be valid and
    /// `cost` at least one.
    pub(crate) fn check(&self, key: &Key, quota: Quota, cost: NonZeroU32) -> Decision {
        match &self.fixed {
            // The hot path borrows: no reference count shared across cores.
            Some((q, interval, l)) if *q == quota => {
                self.check_with(l, *interval, key, quota, cost)
            }
            _ if quota.period().is_some() => self
                .calendar
                .get_or_init(Box::default)
                .check(key, quota, cost),
            _ => {
                let interval = quota.emission_interval();
                self.check_with(&self.dynamic_limiter(quota), interval, key, quota, cost)
            }
        }
    }

    fn check_with(
        &self,
        limiter: &Keyed<C>,
        interval: Duration,
        key: &Key,
        quota: Quota,
        cost: NonZeroU32,
    ) -> Decision {
        // governor's single-cell check skips the multiplication of the n-cell one.
        let outcome = if cost == NonZeroU32::MIN {
            Ok(limiter.check_key(key))
        } else {
            limiter.check_key_n(key, cost)
        };
        match outcome {
            Ok(Ok(state)) => {
                let remaining = state.remaining_burst_capacity();
                let missing = quota.burst().saturating_sub(remaining);
                // Upper bounds: governor keeps the arrival time to itself. The
                // next cell is at most one interval away, the whole bucket one
                // interval per missing cell.
                let reset = interval.saturating_mul(missing);
                let next = if missing == 0 {
                    Duration::ZERO
                } else {
                    interval
                };
                Decision::allowed(quota.limit(), quota.window(), remaining, reset)
                    .with_next_unit(next)
            }
            Ok(Err(not_until)) => {
                let wait = not_until.wait_time_from(self.clock.now());
                // GCRA: when `cost` cells fit after `wait`, the rest of the burst is still owed.
                let owed = quota.burst().saturating_sub(cost.get());
                let reset = wait + interval.saturating_mul(owed);
                Decision::denied(quota.limit(), quota.window(), wait, reset)
            }
            Err(_insufficient) => Decision::never(quota.limit(), quota.window()),
        }
    }

    fn dynamic_limiter(&self, quota: Quota) -> Arc<Keyed<C>> {
        if let Some(l) = self.dynamic.read().expect("poisoned").get(&quota) {
            return l.clone();
        }
        self.dynamic
            .write()
            .expect("poisoned")
            .entry(quota)
            .or_insert_with(|| Arc::new(limiter(quota, &self.clock)))
            .clone()
    }

    /// Number of keys held, across all quotas.
    pub(crate) fn len(&self) -> usize {
        let calendar = self.calendar.get().map_or(0, |c| c.len());
        calendar + self.limiters().iter().map(|l| l.len()).sum::<usize>()
    }

    /// Forgets keys whose buckets are full again: they are indistinguishable
    /// from new keys, so dropping them changes no decision.
    pub(crate) fn cleanup(&self) {
        for l in self.limiters() {
            l.retain_recent();
            l.shrink_to_fit();
        }
        if let Some(c) = self.calendar.get() {
            c.cleanup();
        }
    }

    fn limiters(&self) -> Vec<Arc<Keyed<C>>> {
        let mut all: Vec<_> = self.fixed.iter().map(|(_, _, l)| l.clone()).collect();
        all.extend(self.dynamic.read().expect("poisoned").values().cloned());
        all
    }
}

fn limiter<C: Clock + Clone>(q: Quota, clock: &C) -> Keyed<C> {
    // Callers validated the quota: interval and burst are non-zero.
    let burst = NonZeroU32::new(q.burst()).unwrap_or(NonZeroU32::MIN);
    let gq = GovernorQuota::with_period(q.emission_interval())
        .unwrap_or_else(|| GovernorQuota::per_second(NonZeroU32::MIN))
        .allow_burst(burst);
    RateLimiter::<Key, _, _, NoOpMiddleware<C::Instant>>::new(
        gq,
        DefaultKeyedStateStore::default(),
        clock.clone(),
    )
    .with_middleware::<StateInformationMiddleware>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use governor::clock::FakeRelativeClock;
    use std::time::Duration;

    fn one() -> NonZeroU32 {
        NonZeroU32::MIN
    }

    fn store(fixed: Option<Quota>) -> (LocalStore<FakeRelativeClock>, FakeRelativeClock) {
        let clock = FakeRelativeClock::default();
        (LocalStore::with_clock(fixed, clock.clone()), clock)
    }

    #[test]
    fn admits_exactly_the_burst_then_waits_one_interval() {
        let q = Quota::new(5, Duration::from_secs(10));
        let (store, clock) = store(Some(q));
        let key = Key::from("k");
        for left in (0..5).rev() {
            let d = store.check(&key, q, one());
            assert!(d.is_allowed());
            assert_eq!(d.remaining(), left);
        }
        let d = store.check(&key, q, one());
        assert!(!d.is_allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_secs(2)));
        assert_eq!(d.reset(), Duration::from_secs(10));
        clock.advance(Duration::from_millis(500));
        let d = store.check(&key, q, one());
        assert_eq!(d.retry_after(), Some(Duration::from_millis(1500)));
        clock.advance(Duration::from_millis(1500));
        let d = store.check(&key, q, one());
        assert!(d.is_allowed(), "one unit is back after one interval");
        assert_eq!(d.remaining(), 0);
    }

    #[test]
    fn weighted_cost_and_insufficient_capacity() {
        let q = Quota::per_minute(10);
        let (store, _clock) = store(None);
        let key = Key::from("k");
        let three = NonZeroU32::new(3).unwrap();
        assert_eq!(store.check(&key, q, three).remaining(), 7);
        assert_eq!(store.check(&key, q, three).remaining(), 4);
        assert_eq!(store.check(&key, q, three).remaining(), 1);
        let d = store.check(&key, q, three);
        assert!(!d.is_allowed());
        assert_eq!(
            d.retry_after(),
            Some(Duration::from_secs(12)),
            "two more units"
        );
        let never = store.check(&key, q, NonZeroU32::new(11).unwrap());
        assert!(!never.is_allowed());
        assert_eq!(never.retry_after(), None);
    }

    #[test]
    fn quotas_keep_separate_cells() {
        let free = Quota::per_minute(1);
        let pro = Quota::per_minute(2);
        let (store, _clock) = store(Some(free));
        let key = Key::from("k");
        assert!(store.check(&key, free, one()).is_allowed());
        assert!(!store.check(&key, free, one()).is_allowed());
        assert!(store.check(&key, pro, one()).is_allowed());
        assert_eq!(store.len(), 2);
    }

    #[test]
    fn cleanup_forgets_only_full_buckets() {
        let fast = Quota::new(1000, Duration::from_millis(10)); // 10 µs per cell
        let (store, clock) = store(Some(fast));
        for i in 0..100u64 {
            store.check(&Key::from(i), fast, one());
        }
        let slow = Quota::per_hour(1);
        store.check(&Key::from("kept"), slow, one());
        assert_eq!(store.len(), 101);
        clock.advance(Duration::from_millis(30));
        store.cleanup();
        assert_eq!(store.len(), 1, "only the hour-long bucket is still owed");
        // governor keeps a key one emission interval past whole.
        clock.advance(Duration::from_secs(2 * 3600));
        store.cleanup();
        assert_eq!(store.len(), 0, "a whole bucket is forgotten");
    }

    /// The store decides as a reference GCRA would, on the same fake clock:
    /// the same admits, the same waits, for random quotas, costs and gaps.
    mod matches_a_reference_gcra {
        use super::*;
        use proptest::prelude::*;

        /// The textbook GCRA on nanoseconds: a theoretical arrival time per key.
        struct Model {
            t: u128,
            tau: u128,
            tat: Option<u128>,
        }

        impl Model {
            /// `Ok(())` on an admit, `Err(wait)` on a deny.
            fn check(&mut self, now: u128, cost: u128) -> Result<(), u128> {
                let tat = self.tat.unwrap_or(now);
                let earliest = (tat + (cost - 1) * self.t).saturating_sub(self.tau);
                if now < earliest {
                    return Err(earliest - now);
                }
                self.tat = Some(tat.max(now) + cost * self.t);
                Ok(())
            }
        }

        proptest! {
            #[test]
            fn same_admits_and_waits(
                limit in 1u32..20,
                window_s in 1u64..60,
                extra_burst in 0u32..10,
                ops in proptest::collection::vec((0u64..3_000, 1u32..=4), 1..60),
            ) {
                let q = Quota::new(limit, Duration::from_secs(window_s)).with_burst(limit + extra_burst);
                let (store, clock) = store(Some(q));
                let t = q.emission_interval().as_nanos();
                let mut model = Model { t, tau: t * u128::from(q.burst() - 1), tat: None };
                let key = Key::from("k");
                let mut now = 0u128;
                for (gap_ms, cost) in ops {
                    clock.advance(Duration::from_millis(gap_ms));
                    now += u128::from(gap_ms) * 1_000_000;
                    let cost = cost.min(q.burst());
                    let d = store.check(&key, q, NonZeroU32::new(cost).unwrap());
                    match model.check(now, u128::from(cost)) {
                        Ok(()) => prop_assert!(d.is_allowed(), "{now}: model admits, store denied {d:?}"),
                        Err(wait) => {
                            prop_assert!(!d.is_allowed(), "{now}: model denies, store admitted {d:?}");
                            prop_assert_eq!(d.retry_after().map(|w| w.as_nanos()), Some(wait));
                        }
                    }
                }
            }
        }
    }
}

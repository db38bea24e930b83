//! The in-process backend: `governor` keyed GCRA limiters.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, OnceLock, PoisonError, RwLock, Weak};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::middleware::StateInformationMiddleware;
use governor::{Quota as GovernorQuota, RateLimiter};

use super::calendar::CalendarStore;
use super::keyspace::{self, Budget, GcraState, GcraStore, KeySpaceFull, Tat};
use crate::policy::QuotaChange;
use crate::{decision::Decision, key::Key, quota::Quota};

type Governor<C> = RateLimiter<Key, GcraStore<C>, C, StateInformationMiddleware>;

/// governor's limiter for one quota, and its state for adjustments.
pub(super) struct Keyed<C: Clock> {
    gov: Governor<C>,
    pub(super) state: Arc<GcraState<C>>,
}

/// Keyed limiters for one rule: one governor limiter per distinct quota, so
/// per-plan quotas don't share cells. The clock is governor's: the system's,
/// or a fake one that tests advance.
pub(crate) struct LocalStore<C: Clock = DefaultClock> {
    /// The static quota's limiter and emission interval: the hot path skips
    /// the map and the division.
    pub(super) fixed: Option<(Quota, Duration, Arc<Keyed<C>>)>,
    dynamic: RwLock<HashMap<Quota, Arc<Keyed<C>>>>,
    /// Calendar quotas, made on first use; boxed to keep the store small.
    pub(super) calendar: OnceLock<Box<CalendarStore>>,
    /// Set when a reload replaced this store: what its rules still decide
    /// (requests suspended on them at the swap) is decided in its successor.
    pub(super) forward: OnceLock<Forward>,
    /// The places for keys every limiter here shares.
    budget: Arc<Budget>,
    clock: C,
}

impl LocalStore {
    pub(crate) fn new(fixed: Option<Quota>, budget: Arc<Budget>) -> Self {
        Self::with_clock(fixed, budget, DefaultClock::default())
    }
}

impl<C: Clock + Clone> LocalStore<C> {
    fn with_clock(fixed: Option<Quota>, budget: Arc<Budget>, clock: C) -> Self {
        Self {
            fixed: fixed
                .filter(|q| q.period().is_none())
                .map(|q| (q, interval(q), Arc::new(limiter(q, &budget, &clock)))),
            dynamic: RwLock::new(HashMap::new()),
            calendar: OnceLock::new(),
            forward: OnceLock::new(),
            budget,
            clock,
        }
    }

    /// Spends `cost` units of `quota` for `key`. `quota` must be valid and
    /// `cost` at least one. A new key that found the key space full is
    /// counted in the overflow bucket or refused, and says so.
    pub(crate) fn check(
        &self,
        key: &Key,
        quota: Quota,
        cost: NonZeroU32,
    ) -> (Decision, Option<KeySpaceFull>) {
        if let Some(f) = self.forward.get()
            && let Some(d) = f.check(key, quota, cost)
        {
            return d;
        }
        let d = self.check_inner(key, quota, cost);
        match keyspace::take_diverted() {
            None => (d, None),
            Some(KeySpaceFull::Refuse) => {
                let w = d.window();
                let refused = Decision::denied(quota.limit(), w, w, w);
                (refused, Some(KeySpaceFull::Refuse))
            }
            Some(how) => (d, Some(how)),
        }
    }

    fn check_inner(&self, key: &Key, quota: Quota, cost: NonZeroU32) -> Decision {
        match &self.fixed {
            // The hot path borrows: no reference count shared across cores.
            Some((q, interval, l)) if *q == quota => {
                self.check_with(l, *interval, key, quota, cost)
            }
            _ if quota.period().is_some() => self.calendar().check(key, quota, cost),
            _ => {
                let interval = interval(quota);
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
            Ok(limiter.gov.check_key(key))
        } else {
            limiter.gov.check_key_n(key, cost)
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
                let reset = wait.saturating_add(interval.saturating_mul(owed));
                Decision::denied(quota.limit(), quota.window(), wait, reset)
            }
            Err(_insufficient) => Decision::never(quota.limit(), quota.window()),
        }
    }

    fn dynamic_limiter(&self, quota: Quota) -> Arc<Keyed<C>> {
        if let Some(l) = self
            .dynamic
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&quota)
        {
            return l.clone();
        }
        self.dynamic
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(quota)
            .or_insert_with(|| Arc::new(limiter(quota, &self.budget, &self.clock)))
            .clone()
    }

    /// Number of keys held, across all quotas.
    pub(crate) fn len(&self) -> usize {
        let calendar = self.calendar.get().map_or(0, |c| c.len());
        calendar + self.limiters().iter().map(|l| l.gov.len()).sum::<usize>()
    }

    /// Forgets keys whose buckets are full again: they are indistinguishable
    /// from new keys, so dropping them changes no decision.
    pub(crate) fn cleanup(&self) {
        for l in self.limiters() {
            l.gov.retain_recent();
            l.gov.shrink_to_fit();
        }
        if let Some(c) = self.calendar.get() {
            c.cleanup();
        }
    }

    /// Spends (`units > 0`), gives back (`units < 0`) or reads (`0`) `key`'s
    /// units of `quota` without deciding, and tells what a request of one
    /// unit would be told now, without spending it. Bounded by an empty and
    /// a whole bucket: see [`GcraState::adjust`].
    pub(crate) fn adjust(&self, key: &Key, quota: Quota, units: i64) -> Decision {
        if let Some(f) = self.forward.get()
            && let Some(d) = f.adjust(key, quota, units)
        {
            return d;
        }
        if quota.period().is_some() {
            return self.calendar().adjust(key, quota, units);
        }
        let adjust = |l: &Keyed<C>| gcra_state(quota, l.state.adjust(key, units, quota.burst()));
        match &self.fixed {
            Some((q, _, l)) if *q == quota => adjust(l),
            _ => adjust(&self.dynamic_limiter(quota)),
        }
    }

    /// The static rolling quota's keys with the units each has not got back.
    pub(crate) fn used(&self) -> Vec<(Key, f64)> {
        self.fixed
            .as_ref()
            .map_or_else(Vec::new, |(_, _, l)| l.state.used())
    }

    /// The calendar quotas' counts in windows that have not ended, with
    /// each window's end (s since the epoch).
    pub(crate) fn calendar_counts(&self) -> Vec<(Key, u32, i64)> {
        self.calendar.get().map_or_else(Vec::new, |c| c.counts())
    }

    /// Forgets `key` under every quota: whole again.
    pub(crate) fn reset(&self, key: &Key) {
        for l in self.limiters() {
            l.state.remove(key);
        }
        if let Some(c) = self.calendar.get() {
            c.remove(key);
        }
    }

    pub(super) fn calendar(&self) -> &CalendarStore {
        self.calendar
            .get_or_init(|| Box::new(CalendarStore::new(self.budget.clone())))
    }

    fn limiters(&self) -> Vec<Arc<Keyed<C>>> {
        let mut all: Vec<_> = self.fixed.iter().map(|(_, _, l)| l.clone()).collect();
        all.extend(
            self.dynamic
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .values()
                .cloned(),
        );
        all
    }
}

/// Where a store that a reload replaced sends what its rules still decide.
pub(crate) struct Forward {
    to: Weak<LocalStore>,
    from: Quota,
    quota: Quota,
    how: QuotaChange,
}

impl Forward {
    pub(super) fn new(
        to: Weak<LocalStore>,
        (from, quota): (Quota, Quota),
        how: QuotaChange,
    ) -> Self {
        Self {
            to,
            from,
            quota,
            how,
        }
    }

    /// The successor and its quota, for a decision of `quota` here.
    fn to(&self, quota: Quota) -> Option<(Arc<LocalStore>, Quota)> {
        (quota == self.from).then(|| Some((self.to.upgrade()?, self.quota)))?
    }

    /// [`LocalStore::check`] in the successor. Out of line, and cold: the
    /// check it calls stays inlinable, and costs the hot path nothing.
    #[cold]
    #[inline(never)]
    fn check(
        &self,
        key: &Key,
        quota: Quota,
        cost: NonZeroU32,
    ) -> Option<(Decision, Option<KeySpaceFull>)> {
        let (to, quota) = self.to(quota)?;
        Some(to.check(key, quota, self.cost(cost)))
    }

    /// [`LocalStore::adjust`] in the successor.
    #[cold]
    #[inline(never)]
    fn adjust(&self, key: &Key, quota: Quota, units: i64) -> Option<Decision> {
        let (to, quota) = self.to(quota)?;
        Some(to.adjust(key, quota, self.units(units)))
    }

    /// `cost` units here in the successor's, rounded up: never a unit more.
    fn cost(&self, cost: NonZeroU32) -> NonZeroU32 {
        let n = self
            .scaled(f64::from(cost.get()))
            .ceil()
            .min(f64::from(u32::MAX));
        NonZeroU32::new(n as u32).unwrap_or(NonZeroU32::MIN)
    }

    /// Units spent (above 0, rounded up) or given back (below, rounded
    /// down) here, in the successor's.
    fn units(&self, units: i64) -> i64 {
        let n = self.scaled(units.unsigned_abs() as f64);
        if units >= 0 {
            n.ceil() as i64
        } else {
            -(n.floor() as i64)
        }
    }

    fn scaled(&self, n: f64) -> f64 {
        let (from, to) = match self.from.period() {
            Some(_) => (self.from.limit(), self.quota.limit()),
            None => (self.from.burst(), self.quota.burst()),
        };
        match self.how {
            QuotaChange::Proportional => n * f64::from(to) / f64::from(from),
            _ => n,
        }
    }
}

fn limiter<C: Clock + Clone>(q: Quota, budget: &Arc<Budget>, clock: &C) -> Keyed<C> {
    // Callers validated the quota: interval and burst are non-zero.
    let burst = NonZeroU32::new(q.burst()).unwrap_or(NonZeroU32::MIN);
    let gq = GovernorQuota::with_period(interval(q))
        .unwrap_or_else(|| GovernorQuota::per_second(NonZeroU32::MIN))
        .allow_burst(burst);
    let store = GcraStore::new(budget.clone(), clock.clone(), interval(q));
    let state = store.state();
    let gov = RateLimiter::<Key, _, _, NoOpMiddleware<C::Instant>>::new(gq, store, clock.clone())
        .with_middleware::<StateInformationMiddleware>();
    Keyed { gov, state }
}

/// `quota`'s emission interval, as governor's nanosecond counters hold it:
/// a bucket of `burst` intervals, spent twice over (a charge on a full
/// bucket), within a quarter of `u64` nanoseconds (146 years), the rest
/// left to the clock. Only a quota of one unit in decades is shortened
/// (governor panics on a period past 584 years, `Duration::MAX` among them).
fn interval(quota: Quota) -> Duration {
    const ROOM: u64 = u64::MAX / 4;
    let t = quota.emission_interval();
    let cells = 2 * u64::from(quota.burst()) + 2;
    if t.as_nanos() * u128::from(cells) <= u128::from(ROOM) {
        t
    } else {
        Duration::from_nanos(ROOM / cells)
    }
}

/// What a request of one unit would be told of a GCRA bucket read at `t`,
/// without spending it.
fn gcra_state(quota: Quota, t: Tat) -> Decision {
    let interval = interval(quota);
    let (limit, window) = (quota.limit(), quota.window());
    // Time until the bucket is whole again.
    let reset = t.tat.saturating_sub(t.now);
    let tolerance = interval.saturating_mul(quota.burst() - 1);
    let Some(room) = t.now.saturating_add(tolerance).checked_sub(t.tat) else {
        let wait = t.tat - tolerance - t.now;
        return Decision::denied(limit, window, wait, reset);
    };
    let cells = room.as_nanos() / interval.as_nanos().max(1) + 1;
    let remaining = u32::try_from(cells).unwrap_or(u32::MAX).min(quota.burst());
    Decision::allowed(limit, window, remaining, reset)
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
        bounded(fixed, 1000, KeySpaceFull::Overflow)
    }

    fn bounded(
        fixed: Option<Quota>,
        max: usize,
        when_full: KeySpaceFull,
    ) -> (LocalStore<FakeRelativeClock>, FakeRelativeClock) {
        let clock = FakeRelativeClock::default();
        let budget = Budget::new(max, when_full);
        (LocalStore::with_clock(fixed, budget, clock.clone()), clock)
    }

    impl<C: Clock + Clone> LocalStore<C> {
        /// The decision alone, for keys that always find a place.
        fn decide(&self, key: &Key, quota: Quota, cost: NonZeroU32) -> Decision {
            let (d, diverted) = self.check(key, quota, cost);
            assert_eq!(diverted, None);
            d
        }
    }

    #[test]
    fn a_full_key_space_overflows_into_one_shared_bucket() {
        let q = Quota::per_minute(2);
        let (store, _clock) = bounded(Some(q), 10, KeySpaceFull::Overflow);
        for i in 0..10u64 {
            store.decide(&Key::from(i), q, one());
        }
        assert_eq!(store.len(), 10);
        // New keys share one bucket of the rule's quota.
        for (i, allowed) in [(100u64, true), (101, true), (102, false)] {
            let (d, diverted) = store.check(&Key::from(i), q, one());
            assert_eq!(
                (d.is_allowed(), diverted),
                (allowed, Some(KeySpaceFull::Overflow))
            );
        }
        assert_eq!(store.len(), 10, "no place was made");
        // Known keys keep their own limits.
        assert_eq!(store.decide(&Key::from(3u64), q, one()).remaining(), 0);
        assert!(!store.decide(&Key::from(3u64), q, one()).is_allowed());
    }

    /// Sweeps race inserts on other threads; every place comes back once.
    #[test]
    fn the_key_budget_stays_exact_under_concurrent_sweeps() {
        let q = Quota::new(1000, Duration::from_millis(10));
        let (store, clock) = bounded(Some(q), 1_000_000, KeySpaceFull::Overflow);
        std::thread::scope(|s| {
            for t in 0..2u64 {
                let store = &store;
                s.spawn(move || {
                    for i in 0..20_000u64 {
                        store.check(&Key::from(t * 1_000_000 + i), q, one());
                    }
                });
            }
            s.spawn(|| {
                for _ in 0..200 {
                    clock.advance(Duration::from_micros(100));
                    store.cleanup();
                }
            });
        });
        assert_eq!(store.budget.used(), store.len());
        clock.advance(Duration::from_secs(1));
        store.cleanup();
        assert_eq!((store.len(), store.budget.used()), (0, 0));
    }

    #[test]
    fn a_full_key_space_can_refuse_new_keys() {
        let q = Quota::per_minute(2);
        let (store, _clock) = bounded(Some(q), 3, KeySpaceFull::Refuse);
        for i in 0..3u64 {
            store.decide(&Key::from(i), q, one());
        }
        let (d, diverted) = store.check(&Key::from("new"), q, one());
        assert_eq!(diverted, Some(KeySpaceFull::Refuse));
        assert!(!d.is_allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_secs(60)), "a window");
        assert_eq!(store.len(), 3);
    }

    #[test]
    fn full_buckets_make_room_and_a_flood_stays_bounded() {
        let q = Quota::new(10, Duration::from_secs(1));
        let (store, clock) = bounded(Some(q), 100, KeySpaceFull::Overflow);
        let known = Key::from("known");
        for _ in 0..5 {
            store.decide(&known, q, one());
        }
        for i in 0..99u64 {
            store.decide(&Key::from(i), q, one());
        }
        // Every bucket but `known`'s is whole again (one interval on): the
        // first new key sweeps them away and takes a place of its own.
        clock.advance(Duration::from_millis(250));
        store.decide(&known, q, one());
        assert_eq!(store.decide(&Key::from("fresh"), q, one()).remaining(), 9);
        assert_eq!(store.len(), 2, "known and fresh");
        // A flood of distinct keys: never more than 100 held, and `known`
        // keeps its exact count: 7 spent by now, 2.5 back after 250 ms.
        let mut diverted = 0;
        for i in 0..100_000u64 {
            diverted += usize::from(store.check(&Key::from(1_000_000 + i), q, one()).1.is_some());
            assert!(store.len() <= 100);
        }
        assert_eq!(diverted, 100_000 - 98);
        assert_eq!(store.decide(&known, q, one()).remaining(), 5);
    }

    #[test]
    fn admits_exactly_the_burst_then_waits_one_interval() {
        let q = Quota::new(5, Duration::from_secs(10));
        let (store, clock) = store(Some(q));
        let key = Key::from("k");
        for left in (0..5).rev() {
            let d = store.decide(&key, q, one());
            assert!(d.is_allowed());
            assert_eq!(d.remaining(), left);
        }
        let d = store.decide(&key, q, one());
        assert!(!d.is_allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_secs(2)));
        assert_eq!(d.reset(), Duration::from_secs(10));
        clock.advance(Duration::from_millis(500));
        let d = store.decide(&key, q, one());
        assert_eq!(d.retry_after(), Some(Duration::from_millis(1500)));
        clock.advance(Duration::from_millis(1500));
        let d = store.decide(&key, q, one());
        assert!(d.is_allowed(), "one unit is back after one interval");
        assert_eq!(d.remaining(), 0);
    }

    #[test]
    fn weighted_cost_and_insufficient_capacity() {
        let q = Quota::per_minute(10);
        let (store, _clock) = store(None);
        let key = Key::from("k");
        let three = NonZeroU32::new(3).unwrap();
        assert_eq!(store.decide(&key, q, three).remaining(), 7);
        assert_eq!(store.decide(&key, q, three).remaining(), 4);
        assert_eq!(store.decide(&key, q, three).remaining(), 1);
        let d = store.decide(&key, q, three);
        assert!(!d.is_allowed());
        assert_eq!(
            d.retry_after(),
            Some(Duration::from_secs(12)),
            "two more units"
        );
        let never = store.decide(&key, q, NonZeroU32::new(11).unwrap());
        assert!(!never.is_allowed());
        assert_eq!(never.retry_after(), None);
    }

    #[test]
    fn quotas_keep_separate_cells() {
        let free = Quota::per_minute(1);
        let pro = Quota::per_minute(2);
        let (store, _clock) = store(Some(free));
        let key = Key::from("k");
        assert!(store.decide(&key, free, one()).is_allowed());
        assert!(!store.decide(&key, free, one()).is_allowed());
        assert!(store.decide(&key, pro, one()).is_allowed());
        assert_eq!(store.len(), 2);
    }

    #[test]
    fn cleanup_forgets_only_full_buckets() {
        let fast = Quota::new(1000, Duration::from_millis(10)); // 10 µs per cell
        let (store, clock) = store(Some(fast));
        for i in 0..100u64 {
            store.decide(&Key::from(i), fast, one());
        }
        let slow = Quota::per_hour(1);
        store.decide(&Key::from("kept"), slow, one());
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
                    let d = store.decide(&key, q, NonZeroU32::new(cost).unwrap());
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

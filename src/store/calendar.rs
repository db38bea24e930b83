//! Calendar quotas in this process: one count per key for the current
//! calendar window, the same fixed-window sums `lua/calendar_window.lua`
//! does on Redis.

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;

use super::inherit::Inherit;
use super::keyspace::{Budget, KeySpaceFull, mark_diverted};
use crate::util::instant::unix_us;
use crate::util::throttle::Throttle;
use crate::{decision::Decision, key::Key, quota::Quota};

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The window the count belongs to, in seconds since the epoch.
    start: i64,
    end: i64,
    count: u32,
}

/// Counts by key; a key's count starts again with each calendar window.
///
/// The count is per key, not per quota: a key whose plan changes mid-month
/// keeps what it spent, as on Redis.
#[derive(Debug)]
pub(crate) struct CalendarStore {
    map: DashMap<Key, Entry>,
    /// The keys that found the key space full, when they overflow.
    overflow: Mutex<Option<Entry>>,
    budget: Arc<Budget>,
    sweeps: Throttle,
    /// What a new key counted already, while a reload carries the keys of
    /// the store this one replaces over.
    inherit: Inherit<Entry>,
}

/// `quota`'s calendar window at `now` (µs since the epoch): its empty
/// entry, its length, and the time to its end.
fn window_at(quota: Quota, now: i64) -> Option<(Entry, Duration, Duration)> {
    let (start, end) = quota.window_secs(now.div_euclid(1_000_000))?;
    let window = Duration::from_secs(u64::try_from(end - start).unwrap_or(0));
    let reset = Duration::from_micros(u64::try_from(end * 1_000_000 - now).unwrap_or(0));
    let fresh = Entry {
        start,
        end,
        count: 0,
    };
    Some((fresh, window, reset))
}

impl CalendarStore {
    pub(crate) fn new(budget: Arc<Budget>) -> Self {
        Self {
            map: DashMap::new(),
            overflow: Mutex::new(None),
            budget,
            sweeps: Throttle::default(),
            inherit: Inherit::none(),
        }
    }

    /// Until [`settled`](Self::settled), a new key starts from
    /// `count(key, (start, end))`: what it counted in that window before.
    pub(crate) fn inherit(&self, count: impl Fn(&Key, (i64, i64)) -> u32 + Send + Sync + 'static) {
        self.inherit.set(move |key, fresh: Entry| Entry {
            count: count(key, (fresh.start, fresh.end)),
            ..fresh
        });
    }

    /// Every key was carried over: new keys start at zero again.
    pub(crate) fn settled(&self) {
        self.inherit.clear();
    }

    /// Carries `key` over, unless it is here already or counted nothing.
    pub(crate) fn adopt(&self, key: &Key, quota: Quota) {
        let now = unix_us();
        if let Some((fresh, _, _)) = window_at(quota, now)
            && !self.map.contains_key(key)
            && self.inherit.start(key, fresh).count > 0
        {
            self.upsert(now, key, fresh, true, |_| ());
        }
    }

    /// `key`'s count in the window `(start, end)`, if it is the current one.
    pub(crate) fn count_in(&self, key: &Key, window: (i64, i64)) -> u32 {
        self.map
            .get(key)
            .filter(|e| (e.start, e.end) == window)
            .map_or(0, |e| e.count)
    }

    /// Spends `cost` units of the calendar quota `quota` for `key`.
    pub(crate) fn check(&self, key: &Key, quota: Quota, cost: NonZeroU32) -> Decision {
        self.check_at(unix_us(), key, quota, cost)
    }

    pub(crate) fn check_at(&self, now: i64, key: &Key, quota: Quota, cost: NonZeroU32) -> Decision {
        let Some((fresh, window, reset)) = window_at(quota, now) else {
            return Decision::never(quota.limit(), quota.window());
        };
        let limit = quota.limit();
        let spend = |e: &mut Entry| {
            // A day and a month can start together: the end tells them apart.
            if (e.start, e.end) != (fresh.start, fresh.end) {
                *e = fresh;
            }
            match e.count.checked_add(cost.get()).filter(|&c| c <= limit) {
                // Every unit spent comes back together when the window ends.
                Some(count) => {
                    e.count = count;
                    Decision::allowed(limit, window, limit - count, reset)
                }
                None => Decision::denied(limit, window, reset, reset),
            }
        };
        if let Some(d) = self.upsert(now, key, fresh, true, spend) {
            return d;
        }
        mark_diverted(self.budget.when_full);
        match self.budget.when_full {
            KeySpaceFull::Overflow => {
                let mut o = self.overflow.lock().unwrap_or_else(|p| p.into_inner());
                spend(o.get_or_insert(fresh))
            }
            // The caller refuses.
            KeySpaceFull::Refuse => Decision::allowed(limit, window, limit, reset),
        }
    }

    /// `f` on `key`'s entry. A key not held gets one when `create` and a
    /// place is left; `None` otherwise.
    fn upsert<T>(
        &self,
        now: i64,
        key: &Key,
        fresh: Entry,
        create: bool,
        f: impl FnOnce(&mut Entry) -> T,
    ) -> Option<T> {
        if let Some(mut e) = self.map.get_mut(key) {
            return Some(f(&mut e));
        }
        if !create || !self.room(now) {
            return None;
        }
        let mut new = false;
        let mut e = self.map.entry(key.clone()).or_insert_with(|| {
            new = true;
            self.inherit.start(key, fresh)
        });
        if !new {
            self.budget.give_back(1);
        }
        Some(f(&mut e))
    }

    /// Spends (`units > 0`, up to the limit), gives back (`units < 0`, down
    /// to none) or reads (`0`) `key`'s count in the current window, and
    /// tells what a request of one unit would be told now.
    pub(crate) fn adjust(&self, key: &Key, quota: Quota, units: i64) -> Decision {
        self.adjust_at(unix_us(), key, quota, units)
    }

    pub(crate) fn adjust_at(&self, now: i64, key: &Key, quota: Quota, units: i64) -> Decision {
        let Some((fresh, window, reset)) = window_at(quota, now) else {
            return Decision::never(quota.limit(), quota.window());
        };
        let limit = quota.limit();
        let apply = |e: &mut Entry| {
            if (e.start, e.end) != (fresh.start, fresh.end) {
                *e = fresh;
            }
            let moved = u32::try_from(units.unsigned_abs()).unwrap_or(u32::MAX);
            e.count = if units > 0 {
                e.count.saturating_add(moved).min(limit)
            } else {
                e.count.saturating_sub(moved)
            };
            e.count
        };
        let count = self
            .upsert(now, key, fresh, units > 0, apply)
            .unwrap_or_else(|| self.inherit.start(key, fresh).count);
        if count < limit {
            Decision::allowed(limit, window, limit - count, reset)
        } else {
            Decision::denied(limit, window, reset, reset)
        }
    }

    /// Each held key's count, and the end of its window (s since the
    /// epoch), in a window that has not ended.
    pub(crate) fn counts(&self) -> Vec<(Key, u32, i64)> {
        let now = unix_us().div_euclid(1_000_000);
        self.map
            .iter()
            .filter(|e| e.end > now && e.count > 0)
            .map(|e| (e.key().clone(), e.count, e.end))
            .collect()
    }

    /// Forgets `key`'s count.
    pub(crate) fn remove(&self, key: &Key) {
        if self.map.remove(key).is_some() {
            self.budget.give_back(1);
        }
    }

    /// A place for a new key: free, or freed by forgetting ended windows.
    fn room(&self, now: i64) -> bool {
        self.budget
            .take_or_sweep(&self.sweeps, || self.forget_ended(now))
    }

    fn forget_ended(&self, now: i64) -> usize {
        let now = now.div_euclid(1_000_000);
        self.budget.retain(&self.map, |e| e.end > now)
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Forgets keys whose window has ended: a new window starts them at zero.
    pub(crate) fn cleanup(&self) {
        self.cleanup_at(unix_us());
    }

    fn cleanup_at(&self, now: i64) {
        self.forget_ended(now);
        self.map.shrink_to_fit();
    }
}

impl Drop for CalendarStore {
    fn drop(&mut self) {
        self.budget.give_back(self.map.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400;
    /// 2024-02-29T00:00:00Z and the next firsts of the month.
    const LEAP_DAY: i64 = 1_709_164_800;
    const MARCH_1: i64 = LEAP_DAY + DAY;
    const APRIL_1: i64 = MARCH_1 + 31 * DAY;

    fn n(c: u32) -> NonZeroU32 {
        NonZeroU32::new(c).unwrap()
    }

    fn us(secs: i64) -> i64 {
        secs * 1_000_000
    }

    #[test]
    fn a_month_resets_on_the_first_with_its_own_length() {
        let store = CalendarStore::new(Budget::new(100, KeySpaceFull::Overflow));
        let q = Quota::per_calendar_month(3);
        let key = Key::from("k");
        // 23:59:59.5 on 29 February 2024.
        let now = us(MARCH_1) - 500_000;
        let d = store.check_at(now, &key, q, n(2));
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 1);
        assert_eq!(
            d.window(),
            Duration::from_secs(29 * 86_400),
            "February 2024"
        );
        assert_eq!(d.reset(), Duration::from_millis(500));
        assert_eq!(d.next_unit(), Duration::from_millis(500));
        let d = store.check_at(now, &key, q, n(2));
        assert!(!d.is_allowed(), "one unit left");
        assert_eq!(d.retry_after(), Some(Duration::from_millis(500)));
        // Midnight: March, 31 days, whole again.
        let d = store.check_at(us(MARCH_1), &key, q, n(3));
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 0);
        assert_eq!(d.window(), Duration::from_secs(31 * 86_400));
        assert_eq!(d.reset(), Duration::from_secs(31 * 86_400));
        let d = store.check_at(us(APRIL_1) - 1, &key, q, n(1));
        assert_eq!(d.retry_after(), Some(Duration::from_micros(1)));
        assert!(store.check_at(us(APRIL_1), &key, q, n(1)).is_allowed());
    }

    #[test]
    fn a_day_and_a_month_that_start_together_count_apart() {
        let store = CalendarStore::new(Budget::new(100, KeySpaceFull::Overflow));
        let key = Key::from("k");
        let now = us(MARCH_1) + 1;
        assert_eq!(
            store
                .check_at(now, &key, Quota::per_calendar_day(5), n(3))
                .remaining(),
            2
        );
        // The same key under a monthly quota (a plan change): a count of its own.
        assert_eq!(
            store
                .check_at(now, &key, Quota::per_calendar_month(5), n(1))
                .remaining(),
            4
        );
        store.cleanup_at(us(MARCH_1 + DAY));
        assert_eq!(store.len(), 1, "the month's count outlives the day");
    }

    #[test]
    fn days_follow_the_offset_and_cleanup_forgets_ended_windows() {
        let store = CalendarStore::new(Budget::new(100, KeySpaceFull::Overflow));
        // UTC-05:00: the day ends at 05:00 UTC.
        let q = Quota::per_calendar_day(1).with_utc_offset(-5 * 3600);
        let key = Key::from("k");
        let before = us(MARCH_1 + 5 * 3600) - 1;
        assert!(store.check_at(before, &key, q, n(1)).is_allowed());
        let d = store.check_at(before, &key, q, n(1));
        assert_eq!(d.retry_after(), Some(Duration::from_micros(1)));
        assert_eq!(d.window(), Duration::from_secs(86_400));
        assert!(store.check_at(before + 1, &key, q, n(1)).is_allowed());
        store.check_at(
            before + 1,
            &Key::from("other"),
            Quota::per_calendar_month(5),
            n(1),
        );
        assert_eq!(store.len(), 2);
        store.cleanup_at(us(MARCH_1 + DAY + 5 * 3600));
        assert_eq!(store.len(), 1, "the day ended, the month did not");
    }

    /// envoyproxy/ratelimit's minute: spent, the key waits for the next
    /// whole minute since the epoch, told exactly how long.
    #[test]
    fn an_aligned_minute_is_refused_until_its_edge() {
        let store = CalendarStore::new(Budget::new(100, KeySpaceFull::Overflow));
        let q = Quota::aligned(3, Duration::from_secs(60));
        let key = Key::from("k");
        // 12:34:56.25 on 29 February 2024: the minute from 12:34:00.
        let now = us(LEAP_DAY + 12 * 3600 + 34 * 60 + 56) + 250_000;
        let d = store.check_at(now, &key, q, n(3));
        assert_eq!((d.is_allowed(), d.remaining()), (true, 0));
        assert_eq!(d.window(), Duration::from_secs(60));
        assert_eq!(d.reset(), Duration::from_millis(3750));
        let d = store.check_at(now, &key, q, n(1));
        assert_eq!(d.retry_after(), Some(Duration::from_millis(3750)));
        let edge = us(LEAP_DAY + 12 * 3600 + 35 * 60);
        let d = store.check_at(edge - 1, &key, q, n(1));
        assert_eq!(d.retry_after(), Some(Duration::from_micros(1)));
        let d = store.check_at(edge, &key, q, n(3));
        assert_eq!((d.is_allowed(), d.reset()), (true, Duration::from_secs(60)));
        // A plan of another length (a `quota_fn`): its own window, from zero.
        let hour = Quota::aligned(3, Duration::from_secs(3600));
        assert_eq!(store.check_at(edge, &key, hour, n(1)).remaining(), 2);
    }
}

//! A global rule's leases on this gateway: blocks of units taken from Redis
//! and spent here (see [`LeasePolicy`]).
//!
//! One request per key asks Redis at a time (the flight); the others wait
//! for its answer and then take from the new lease. A lease's size follows
//! the rate the key's last lease was spent at.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use tokio::sync::oneshot;

use crate::backend::redis::Grant;
use crate::policy::{LeasePolicy, flow};
use crate::util::instant::after;
use crate::{decision::Decision, key::Key, quota::Quota};

/// The most a lease grows over the last one: a rate measured over a few
/// microseconds says little.
const GROWTH: u32 = 8;

/// The share of the counted quota's capacity one ask needs at least: with
/// less free, the gateway waits until that many units fit instead of asking
/// Redis for every unit of a key over its quota.
const MIN_ASK_DIVISOR: u32 = 32;

pub(crate) struct Leases {
    map: DashMap<Key, Held>,
    max_keys: usize,
    policy: LeasePolicy,
    /// A smooth bucket refills while units are away, so less of them goes
    /// back; a window's go back whole, to the window they were counted in.
    smooth: bool,
}

struct Held {
    /// The quota Redis counted the lease in (request-time quotas differ).
    counted: Quota,
    /// Spent under the map's read lock: a hot key's requests on several
    /// threads don't queue for its shard.
    left: AtomicU32,
    granted: u32,
    asked: Instant,
    until: Instant,
    /// Free units in Redis at the grant, and when the bucket was to be
    /// whole: the headers' estimate.
    free: u32,
    reset_at: Instant,
    /// The next ask's size.
    want: u32,
    /// For a window algorithm, the window the lease is in.
    window: Option<u64>,
    /// No ask before this: too few units were free.
    denied: Option<(Instant, Decision)>,
    /// While one request asks Redis: the requests waiting for it.
    flight: Option<Vec<oneshot::Sender<Woken>>>,
}

/// Why a waiting request was woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woken {
    /// The flight ended (a lease, a deny, or its request went away): take again.
    Retry,
    /// Redis could not answer it.
    Failed,
}

/// What [`Leases::take`] found.
pub(crate) enum Take {
    /// Spent from the lease.
    Spent(Decision),
    /// Too few units are free until the deny's retry-after.
    Denied(Decision),
    /// Another request asks Redis for this key; take again when woken.
    Wait(oneshot::Receiver<Woken>),
    /// Ask Redis for a lease, as the flight says (boxed: the ask's
    /// future is boxed anyway).
    Ask(Box<Flight>),
    /// Not leased: the key space is full, so the rule decides exactly.
    Exact,
}

/// The one request asking Redis for a key's lease. Dropped unanswered (its
/// request went away), it wakes the waiters, one of which asks instead.
pub(crate) struct Flight {
    leases: Arc<Leases>,
    key: Key,
    /// At least this many units, or none.
    pub(crate) need: u32,
    /// Up to this many.
    pub(crate) want: u32,
    /// A lease that ended with units left: given back to Redis.
    pub(crate) unspent: Option<Unspent>,
    done: bool,
}

impl Leases {
    pub(crate) fn new(policy: LeasePolicy, max_keys: usize, smooth: bool) -> Arc<Self> {
        Arc::new(Self {
            map: DashMap::new(),
            max_keys,
            policy,
            smooth,
        })
    }

    pub(crate) fn policy(&self) -> LeasePolicy {
        self.policy
    }

    /// Spends `cost` of `key`'s lease, counted in `counted`; `shown` is
    /// the rule's quota, for the decision.
    pub(crate) fn take(
        self: &Arc<Self>,
        key: &Key,
        counted: Quota,
        shown: Quota,
        cost: u32,
    ) -> Take {
        self.take_at(key, counted, shown, cost, Instant::now)
    }

    /// [`take`](Self::take), reading `clock` once the key's entry is held:
    /// a request that waited for the shard (a sweep) must not spend with
    /// the time from before.
    fn take_at(
        self: &Arc<Self>,
        key: &Key,
        counted: Quota,
        shown: Quota,
        cost: u32,
        clock: impl Fn() -> Instant,
    ) -> Take {
        if let Some(h) = self.map.get(key)
            && h.flight.is_none()
            && h.counted == counted
        {
            let now = clock();
            if now < h.until && h.spend(cost) {
                return Take::Spent(h.decision(shown, now));
            }
        }
        let full = self.map.len() >= self.max_keys;
        let (want, unspent) = match self.map.entry(key.clone()) {
            Entry::Occupied(mut e) => {
                let now = clock();
                let h = e.get_mut();
                if let Some(waiters) = &mut h.flight {
                    let (tx, rx) = oneshot::channel();
                    waiters.push(tx);
                    return Take::Wait(rx);
                }
                if h.counted == counted && now < h.until && h.spend(cost) {
                    return Take::Spent(h.decision(shown, now));
                }
                if let Some((until, d)) = h.denied.filter(|_| h.counted == counted)
                    && now < until
                {
                    // The time left, not the time the deny was first told.
                    let wait = (until - now).max(Duration::from_millis(1));
                    return Take::Denied(Decision::denied(d.limit(), d.window(), wait, d.reset()));
                }
                let want = h.next_want(self.policy, now);
                let left = std::mem::take(h.left.get_mut());
                let unspent = h.unspent(key, left, self.smooth);
                h.flight = Some(Vec::new());
                h.denied = None;
                (want, unspent)
            }
            Entry::Vacant(_) if full => return Take::Exact,
            Entry::Vacant(e) => {
                e.insert(Held::asking(counted, clock()));
                (1, None)
            }
        };
        let need = cost.max(min_ask(want, counted));
        Take::Ask(Box::new(Flight {
            leases: self.clone(),
            key: key.clone(),
            need,
            want: want.max(need),
            unspent,
            done: false,
        }))
    }

    /// Gives back (`units < 0`) or charges a spend to `key`'s current lease
    /// in `counted`. Returns the part of a charge the lease could not take
    /// (it has ended, or holds less), for Redis; a refund to an ended lease
    /// is dropped.
    pub(crate) fn adjust(&self, key: &Key, counted: Quota, units: i64) -> i64 {
        let Some(h) = self
            .map
            .get(key)
            .filter(|h| h.counted == counted && Instant::now() < h.until)
        else {
            return units.max(0);
        };
        let granted = i64::from(h.granted);
        let mut rest = 0;
        let _ = h
            .left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| {
                let after = i64::from(l) - units;
                rest = (-after).max(0);
                u32::try_from(after.clamp(0, granted)).ok()
            });
        rest
    }

    /// The unspent units of `key`'s lease asked for at `asked`, once it has
    /// ended: `None` when another lease or an ask has taken its place.
    pub(crate) fn ended(&self, key: &Key, asked: Instant) -> Option<Unspent> {
        let mut h = self.map.get_mut(key)?;
        if h.flight.is_some() || h.asked != asked || Instant::now() < h.until {
            return None;
        }
        let left = std::mem::take(h.left.get_mut());
        h.unspent(key, left, self.smooth)
    }

    /// Drops `key`'s lease (the control handle changed the key in Redis).
    pub(crate) fn forget(&self, key: &Key) {
        self.map.remove_if(key, |_, h| h.flight.is_none());
    }

    /// Drops ended leases no request asks for, and returns their unspent
    /// units, for Redis.
    pub(crate) fn sweep(&self) -> Vec<Unspent> {
        self.sweep_at(Instant::now())
    }

    fn sweep_at(&self, now: Instant) -> Vec<Unspent> {
        let mut back = Vec::new();
        self.map.retain(|key, h| {
            let ended = now >= h.until && h.denied.is_none_or(|(until, _)| now >= until);
            if h.flight.is_some() || !ended {
                return true;
            }
            let left = *h.left.get_mut();
            back.extend(h.unspent(key, left, self.smooth));
            false
        });
        self.map.shrink_to_fit();
        back
    }

    /// Every lease's unspent units, for Redis (the rule is dropped).
    pub(crate) fn drain(&self) -> Vec<Unspent> {
        let mut back = Vec::new();
        for mut h in self.map.iter_mut() {
            let left = std::mem::take(h.left.get_mut());
            back.extend(h.unspent(h.key(), left, self.smooth));
        }
        back
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

/// The least one ask takes: a share of the capacity Redis counts in, so a
/// key over its quota costs one call per that many units, not per unit.
fn min_ask(want: u32, counted: Quota) -> u32 {
    let capacity = if counted.burst() > 0 {
        counted.burst()
    } else {
        counted.limit()
    };
    (want / 4).min(capacity / MIN_ASK_DIVISOR).max(1)
}

/// Unspent units of a lease, on their way back to Redis. For a smooth
/// bucket, how many may go back is worked out as they are sent: the bucket
/// refills meanwhile, and units it has refilled must not be freed twice. A
/// window's go back whole, to the window they were counted in (Redis drops
/// them once it has ended).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unspent {
    pub(crate) key: Key,
    pub(crate) counted: Quota,
    /// The window the units were counted in; `None` for a smooth bucket.
    pub(crate) window: Option<u64>,
    left: u32,
    asked: Instant,
}

impl Unspent {
    /// What may go back now.
    pub(crate) fn units(&self) -> u32 {
        self.units_at(Instant::now())
    }

    /// `left` less what has flowed into the bucket since the lease was
    /// asked for: that much of it is back already.
    fn units_at(&self, now: Instant) -> u32 {
        if self.window.is_some() {
            return self.left;
        }
        let flowed = flow(&self.counted, now.saturating_duration_since(self.asked));
        u32::try_from(u64::from(self.left).saturating_sub(flowed)).unwrap_or(0)
    }
}

impl Held {
    /// The units left, to go back; none when there are none, or for a
    /// window lease that does not name its window.
    fn unspent(&self, key: &Key, left: u32, smooth: bool) -> Option<Unspent> {
        (left > 0 && (smooth || self.window.is_some())).then(|| Unspent {
            key: key.clone(),
            counted: self.counted,
            window: self.window.filter(|_| !smooth),
            left,
            asked: self.asked,
        })
    }

    fn asking(counted: Quota, now: Instant) -> Self {
        Self {
            counted,
            left: AtomicU32::new(0),
            granted: 0,
            asked: now,
            until: now,
            free: 0,
            reset_at: now,
            want: 1,
            window: None,
            denied: None,
            flight: Some(Vec::new()),
        }
    }

    /// Enough for one `ttl` at the rate the last lease was spent at, from
    /// its ask to this one: a key seen once a second keeps leases of one.
    fn next_want(&self, policy: LeasePolicy, now: Instant) -> u32 {
        if self.granted == 0 {
            return self.want;
        }
        let used = u64::from(
            self.granted
                .saturating_sub(self.left.load(Ordering::Relaxed)),
        );
        let over = now
            .saturating_duration_since(self.asked)
            .max(Duration::from_micros(1));
        let rate_want = u128::from(used) * policy.ttl.as_nanos() / over.as_nanos();
        let cap = self.granted.saturating_mul(GROWTH).min(policy.max_units);
        u32::try_from(rate_want)
            .unwrap_or(u32::MAX)
            .clamp(1, cap.max(1))
    }

    /// Spends `cost` of the lease if it holds that many.
    fn spend(&self, cost: u32) -> bool {
        self.left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| {
                l.checked_sub(cost)
            })
            .is_ok()
    }

    fn decision(&self, shown: Quota, now: Instant) -> Decision {
        let left = self.left.load(Ordering::Relaxed);
        let remaining = left.saturating_add(self.free).min(shown.burst());
        Decision::allowed(
            shown.limit(),
            shown.window(),
            remaining,
            self.reset_at.saturating_duration_since(now),
        )
    }
}

impl Flight {
    /// Installs `grant`, asked at `asked`, spends `cost` of it, and wakes
    /// the waiters.
    pub(crate) fn granted(
        mut self,
        counted: Quota,
        shown: Quota,
        cost: u32,
        asked: Instant,
        grant: &Grant,
    ) -> Decision {
        let Grant {
            granted,
            remaining: free,
            lease,
            window,
            reset,
            ..
        } = *grant;
        self.done = true;
        let now = Instant::now();
        let Some(mut h) = self.leases.map.get_mut(&self.key) else {
            return Decision::allowed(shown.limit(), shown.window(), free, reset);
        };
        h.counted = counted;
        h.granted = granted;
        *h.left.get_mut() = granted.saturating_sub(cost);
        h.asked = asked;
        // Counted on Redis time after `asked`: ending at `asked + lease`
        // ends it no later there.
        h.until = after(asked, lease);
        h.free = free;
        h.reset_at = after(now, reset);
        h.want = self.want;
        h.window = window;
        let d = h.decision(shown, now);
        wake(&mut h, Woken::Retry);
        d
    }

    /// Too few units were free: no ask for this key until the deny's
    /// retry-after.
    pub(crate) fn denied(mut self, counted: Quota, d: Decision) {
        self.done = true;
        if let Some(mut h) = self.leases.map.get_mut(&self.key) {
            let wait = d.retry_after().unwrap_or_default();
            h.counted = counted;
            h.denied = Some((after(Instant::now(), wait), d));
            wake(&mut h, Woken::Retry);
        }
    }

    /// Redis did not answer: the waiters take the failure mode too.
    pub(crate) fn failed(mut self) {
        self.done = true;
        if let Some(mut h) = self.leases.map.get_mut(&self.key) {
            wake(&mut h, Woken::Failed);
        }
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        if !self.done
            && let Some(mut h) = self.leases.map.get_mut(&self.key)
        {
            wake(&mut h, Woken::Retry);
        }
    }
}

fn wake(h: &mut Held, why: Woken) {
    for tx in h.flight.take().unwrap_or_default() {
        let _ = tx.send(why);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A grant of `granted` units with `free` left in Redis, for `TTL`.
    fn grant((granted, free): (u32, u32), reset: Duration) -> Grant {
        Grant {
            granted,
            remaining: free,
            wait: Duration::ZERO,
            reset,
            lease: TTL,
            window: None,
        }
    }

    const TTL: Duration = Duration::from_millis(100);
    const US: Duration = Duration::from_micros(1);

    fn leases() -> Arc<Leases> {
        Leases::new(LeasePolicy::new(TTL).with_max_units(1000), 10, true)
    }

    fn ask(t: Take) -> Flight {
        match t {
            Take::Ask(f) => *f,
            _ => panic!("expected an ask"),
        }
    }

    #[tokio::test]
    async fn one_request_asks_the_others_wait_then_spend_the_lease() {
        let (l, q, k) = (leases(), Quota::per_second(1000), Key::from("k"));
        let t0 = Instant::now();
        let f = ask(l.take_at(&k, q, q, 1, || t0));
        assert_eq!((f.need, f.want), (1, 1), "a first lease is small");
        let Take::Wait(rx) = l.take_at(&k, q, q, 1, || t0) else {
            panic!("a second request waits for the flight")
        };
        let d = f.granted(q, q, 1, t0, &grant((10, 500), Duration::from_millis(400)));
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 509, "lease left plus free in Redis");
        assert_eq!(rx.await.unwrap(), Woken::Retry);
        for _ in 0..9 {
            assert!(matches!(l.take_at(&k, q, q, 1, || t0), Take::Spent(_)));
        }
        // Ten spent a microsecond after the ask: the next lease grows, by at most 8x.
        let f = ask(l.take_at(&k, q, q, 1, || t0 + US));
        assert_eq!(f.want, 80);
        assert_eq!(f.need, 20, "a quarter of the want, as the capacity allows");
        assert!(f.unspent.is_none());
    }

    #[tokio::test]
    async fn an_ended_lease_gives_back_what_has_not_flowed_in_and_sizes_to_its_rate() {
        let (l, q, k) = (leases(), Quota::per_second(100), Key::from("k"));
        let t0 = Instant::now();
        let f = ask(l.take_at(&k, q, q, 1, || t0));
        f.granted(q, q, 1, t0, &grant((100, 0), TTL));
        for _ in 0..19 {
            assert!(matches!(l.take_at(&k, q, q, 1, || t0), Take::Spent(_)));
        }
        let f = ask(l.take_at(&k, q, q, 1, || t0 + TTL));
        // 80 left, but 10 flowed into the bucket meanwhile.
        let back = f.unspent.clone().unwrap();
        assert_eq!((back.counted, back.units_at(t0 + TTL)), (q, 70));
        assert_eq!(f.want, 20, "twenty spent in one ttl");
        drop(f);
        assert!(
            matches!(l.take_at(&k, q, q, 1, || t0 + TTL), Take::Ask(_)),
            "a dropped flight frees the key"
        );
    }

    #[tokio::test]
    async fn a_deny_answers_until_its_retry_after_and_a_failure_wakes_waiters() {
        let (l, q, k) = (leases(), Quota::per_second(1000), Key::from("k"));
        let t0 = Instant::now();
        let f = ask(l.take_at(&k, q, q, 1, || t0));
        let Take::Wait(rx) = l.take_at(&k, q, q, 1, || t0) else {
            panic!("waits")
        };
        f.failed();
        assert_eq!(rx.await.unwrap(), Woken::Failed);
        let f = ask(l.take_at(&k, q, q, 1, || t0));
        let wait = Duration::from_secs(5);
        f.denied(q, Decision::denied(q.limit(), q.window(), wait, TTL));
        let t1 = Instant::now();
        assert!(matches!(l.take_at(&k, q, q, 1, || t1), Take::Denied(_)));
        assert!(matches!(l.take_at(&k, q, q, 1, || t1 + wait), Take::Ask(_)));
    }

    #[tokio::test]
    async fn a_full_key_space_decides_exactly_and_sweeps_return_units() {
        let l = Leases::new(LeasePolicy::new(TTL), 1, true);
        let q = Quota::per_second(10);
        let t0 = Instant::now();
        let f = ask(l.take_at(&Key::from("a"), q, q, 1, || t0));
        assert!(matches!(
            l.take_at(&Key::from("b"), q, q, 1, || t0),
            Take::Exact
        ));
        f.granted(q, q, 1, t0, &grant((5, 0), TTL));
        assert!(l.sweep_at(t0).is_empty(), "a live lease stays");
        // Four left, one flowed in during the ttl.
        let back = l.sweep_at(t0 + TTL);
        assert_eq!(back.len(), 1);
        assert_eq!(
            (&back[0].key, back[0].units_at(t0 + TTL)),
            (&Key::from("a"), 3)
        );
        assert_eq!(l.len(), 0);
    }

    #[test]
    fn refunds_and_charges_stay_within_the_lease() {
        let (l, q, k) = (leases(), Quota::per_second(1000), Key::from("k"));
        let t0 = Instant::now();
        let f = ask(l.take_at(&k, q, q, 1, || t0));
        f.granted(q, q, 1, t0, &grant((10, 0), TTL));
        assert_eq!(l.adjust(&k, q, -100), 0);
        assert_eq!(l.map.get(&k).unwrap().left.load(Ordering::Relaxed), 10);
        assert_eq!(l.adjust(&k, q, 15), 5, "the part the lease cannot take");
        assert_eq!(l.map.get(&k).unwrap().left.load(Ordering::Relaxed), 0);
    }
}

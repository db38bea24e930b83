//! The rate scripts' call: a batch of requests decided in turn over their
//! keys (`batch.lua`), with the previous quotas a conversion reads, and
//! its reply, one decision per request.

use std::time::Duration;

use super::args::{Args, Eval, calendar_args, ms, window_us};
use super::sources;
use crate::policy::Lockout;
use crate::quota::Period;
use crate::{algorithm::Algorithm, decision::Decision, quota::Quota};

/// One request of a batch: the index of its key among the batch's keys,
/// and its cost.
pub(crate) type Item = (usize, u32);

/// A batch's keys for one key of it: its state, its lock when the rule
/// can be locked, and when a reload changed the quota of a rolling rule,
/// its states under the previous quotas.
pub(crate) type BatchKeys = (Vec<u8>, Option<Vec<u8>>, Vec<Vec<u8>>);

/// What a rule decides with in Redis: its name, algorithm and quota, and
/// what its scripts do with a key's lock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target<'a> {
    pub(crate) rule: &'a str,
    pub(crate) algorithm: Algorithm,
    pub(crate) quota: &'a Quota,
    pub(crate) locks: Locking,
}

impl<'a> Target<'a> {
    /// A target whose scripts neither read nor count a key's lock: for
    /// grants, the control handle and units given back.
    pub(crate) fn unlocked(rule: &'a str, algorithm: Algorithm, quota: &'a Quota) -> Self {
        let locks = Locking::default();
        Self {
            rule,
            algorithm,
            quota,
            locks,
        }
    }
}

/// A rule's locks in its rate scripts. A rule that cannot be locked (no
/// lockout, not [blockable](crate::Rule::blockable)) reads no lock key:
/// one Redis read less per decision.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Locking {
    /// Each key's lock is read before its decision.
    pub(crate) read: bool,
    /// Denies counted toward a lock; only with `read`.
    pub(crate) lockout: Option<Lockout>,
}

/// The most previous quotas a conversion converts from: a gateway that
/// reloads again while it converts keeps converting from the older ones.
pub(crate) const MAX_PREVIOUS: usize = 3;

/// How a call treats usage counted under another quota (ADR 21 and 25).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Previous {
    /// The rule's previous quotas, most recent first, as Redis counted them.
    pub(crate) quotas: [Option<Quota>; MAX_PREVIOUS],
    /// What usage under one of them becomes; `None`: a calendar count of
    /// another limit stays as it is (a `quota_fn` rule's plan changed).
    pub(crate) how: Option<crate::policy::QuotaChange>,
    /// The reload's second since the epoch: a calendar count converts by
    /// `how` in a window that began before it.
    pub(crate) at: i64,
}

impl Previous {
    /// Counts of another limit stay as they are.
    pub(crate) const AS_COUNTED: Self = Self {
        quotas: [None; MAX_PREVIOUS],
        how: None,
        at: 0,
    };

    pub(crate) fn quotas(&self) -> impl Iterator<Item = &Quota> {
        self.quotas.iter().flatten()
    }

    fn mode(this: Option<&Self>) -> u8 {
        use crate::policy::QuotaChange;
        match this.map(|p| p.how) {
            // A call that knows no previous quota converts a count of
            // another limit (a gateway on other rules) proportionally.
            None | Some(Some(QuotaChange::Proportional)) => 1,
            Some(None) => 0,
            Some(Some(QuotaChange::AsIs)) => 2,
            Some(Some(QuotaChange::Reset)) => 3,
        }
    }
}

/// The invocation of an algorithm's script (of `calendar_window.lua` for a
/// calendar quota) deciding `items` in turn over `keys` (one reply each,
/// concatenated), and the values in a reply. Every key must hash to one
/// cluster slot when the server is a cluster.
///
/// `batch.lua`'s keys: per key its state, its lock when the rule reads
/// locks, and its states under the previous quotas while a conversion
/// lasts; and `ARGV[4..]`: whether locks are read, the lockout's three,
/// the keys per key, the previous quotas (`changed_from` in
/// quota_change.lua), then a pair (key number, from 1, and cost) per
/// request, or none when each key is decided once for one unit, in order
/// (the script then reads the batch's states in one MGET).
pub(crate) fn rate(
    algorithm: Algorithm,
    keys: Vec<BatchKeys>,
    quota: &Quota,
    items: &[Item],
    locks: Locking,
    previous: Option<Previous>,
) -> (Eval, usize) {
    let scripts = sources::of(algorithm, quota.period().is_some());
    let (declared, stride) = layout(&keys, previous.as_ref(), locks);
    let once = items.len() == keys.len()
        && items
            .iter()
            .enumerate()
            .all(|(i, &(index, cost))| index == i && cost == 1);
    let key_bytes: usize = keys
        .iter()
        .map(|(state, lock, old)| {
            state.len()
                + lock.as_ref().map_or(0, Vec::len)
                + old.iter().map(Vec::len).sum::<usize>()
        })
        .sum();
    let (script, source) = &scripts.rate;
    // The arguments past the keys are a few dozen short numbers.
    let room = (stride * keys.len() + 32, key_bytes + 160);
    let mut eval = Eval::new(script, source, stride * keys.len(), room);
    for keys in &keys {
        write_keys(&mut eval, keys, declared);
    }
    let width = rate_args(
        &mut eval,
        quota,
        locks,
        stride,
        previous,
        (!once).then_some(items),
    );
    (eval, width)
}

/// Whether a rate call over `keys` declares their states under the
/// previous quotas (every key has one per previous quota), and how many
/// keys each of its keys takes.
pub(super) fn layout(
    keys: &[BatchKeys],
    previous: Option<&Previous>,
    locks: Locking,
) -> (bool, usize) {
    let n = previous.map_or(0, |p| p.quotas().count());
    let declared = n > 0 && keys.iter().all(|k| k.2.len() == n);
    (
        declared,
        1 + usize::from(locks.read) + if declared { n } else { 0 },
    )
}

/// A key's keys in a rate call: its state, its lock (`batch_keys` builds
/// one exactly when the rule reads locks) and, when `declared`, its states
/// under the previous quotas.
pub(super) fn write_keys(eval: &mut Eval, (state, lock, old): &BatchKeys, declared: bool) {
    eval.arg(&state[..]);
    if let Some(lock) = lock {
        eval.arg(&lock[..]);
    }
    if declared {
        for old in old {
            eval.arg(&old[..]);
        }
    }
}

/// A rate call's arguments past its keys (see [`rate`]), `items` when not
/// each key once for one unit; and the values in its reply per request.
pub(super) fn rate_args(
    call: &mut impl Args,
    quota: &Quota,
    locks: Locking,
    stride: usize,
    previous: Option<Previous>,
    items: Option<&[Item]>,
) -> usize {
    let width = match quota.period() {
        Some(period) => {
            calendar_args(call, quota, period);
            // A day's length and an aligned window's are the quota's
            // window; only a month's is its own.
            if period == Period::Month {
                WIDE
            } else {
                NARROW
            }
        }
        None => {
            call.push(quota.limit());
            call.push(window_us(quota));
            call.push(quota.burst());
            NARROW
        }
    };
    call.push(u8::from(locks.read));
    match locks.lockout.filter(|_| locks.read) {
        Some(l) => {
            call.push(l.after);
            call.push(ms(l.within));
            call.push(ms(l.block_for));
        }
        None => {
            call.push(0);
            call.push(1);
            call.push(1);
        }
    }
    call.push(stride);
    change_args(call, previous.as_ref());
    for &(index, cost) in items.into_iter().flatten() {
        call.push(index + 1);
        call.push(cost);
    }
    width
}

/// `changed_from`'s arguments (quota_change.lua): how many previous quotas,
/// each one's limit, window_us and burst, the mode and the reload's second.
pub(super) fn change_args(call: &mut impl Args, previous: Option<&Previous>) {
    let quotas = || previous.into_iter().flat_map(Previous::quotas);
    call.push(quotas().count());
    for q in quotas() {
        call.push(q.limit());
        call.push(window_us(q));
        call.push(q.burst());
    }
    call.push(Previous::mode(previous));
    call.push(previous.map_or(0, |p| p.at));
}

/// Values per request in a rate script's reply: code, wait_ms, reset_ms.
const NARROW: usize = 3;
/// Values per request in a calendar month's reply: the window's length in
/// seconds after the others.
const WIDE: usize = 4;

/// A batch's replies, one per cost in order: `width` integers each
/// ([`NARROW`] or [`WIDE`]).
pub(crate) fn batch_decisions<'a>(
    quota: &'a Quota,
    flat: &'a [redis::Value],
    width: usize,
) -> impl Iterator<Item = Decided> + 'a {
    let int = |v: &redis::Value| match v {
        redis::Value::Int(i) => *i,
        _ => 0,
    };
    flat.chunks_exact(width).map(move |r| {
        let wide = (width == WIDE).then(|| int(&r[3]));
        decided(quota, (int(&r[0]), int(&r[1]), int(&r[2])), wide)
    })
}

/// One request's reply: a [`Reply`], and a calendar month's length.
pub(super) fn decided(quota: &Quota, reply: Reply, window_s: Option<i64>) -> Decided {
    let mut decided = decision(quota, reply);
    if let Some(s) = window_s.filter(|_| !decided.locked) {
        let window = Duration::from_secs(u64::try_from(s).unwrap_or(0));
        decided.decision = decided.decision.with_window(window);
    }
    decided
}

/// A rate script's answer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Decided {
    pub(crate) decision: Decision,
    /// For an allow that left nothing: the wait until one more unit fits.
    pub(crate) next: Option<Duration>,
    /// The key is locked; the decision's wait is the lock's time left.
    pub(crate) locked: bool,
    /// This decision's deny is the one that locked it.
    pub(crate) lock_started: bool,
}

/// Every rate script returns `{code, wait_ms, reset_ms}` per request: the
/// code is `remaining` on an allow, -1 on a deny, -2 for a key locked
/// already and -3 for the deny that locked it; wait_ms is on a deny the
/// retry-after, on an allow the wait until one more unit fits.
pub(crate) type Reply = (i64, i64, i64);

/// Turns a script reply into a decision with exact header values.
pub(crate) fn decision(quota: &Quota, reply: Reply) -> Decided {
    let (code, wait_ms, reset_ms) = reply;
    let ms = |v: i64| Duration::from_millis(u64::try_from(v).unwrap_or(0));
    if code >= 0 {
        let remaining = code;
        let remaining = u32::try_from(remaining.max(0)).unwrap_or(u32::MAX);
        let next = (remaining == 0 && wait_ms > 0).then(|| ms(wait_ms));
        let d = Decision::allowed(quota.limit(), quota.window(), remaining, ms(reset_ms))
            .with_next_unit(ms(wait_ms));
        Decided {
            decision: d,
            next,
            locked: false,
            lock_started: false,
        }
    } else {
        let d = Decision::denied(
            quota.limit(),
            quota.window(),
            ms(wait_ms.max(1)),
            ms(reset_ms),
        );
        Decided {
            decision: d,
            next: None,
            locked: code <= -2,
            lock_started: code == -3,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_map_to_decisions() {
        let q = Quota::per_minute(10);
        let Decided {
            decision: d, next, ..
        } = decision(&q, (9, 0, 6000));
        assert!(d.is_allowed());
        assert_eq!(
            (d.remaining(), d.reset(), next),
            (9, Duration::from_secs(6), None)
        );
        let Decided {
            decision: d, next, ..
        } = decision(&q, (0, 700, 6000));
        assert!(d.is_allowed() && d.retry_after().is_none());
        assert_eq!(
            next,
            Some(Duration::from_millis(700)),
            "the wait for the next unit"
        );
        let r = decision(&q, (-1, 1500, 60_000));
        assert_eq!(
            (r.decision.retry_after(), r.next, r.locked),
            (Some(Duration::from_millis(1500)), None, false)
        );
        let r = decision(&q, (-2, 900_000, 900_000));
        assert!(r.locked && !r.lock_started);
        assert!(decision(&q, (-3, 900_000, 900_000)).lock_started);
        assert_eq!(r.decision.retry_after(), Some(Duration::from_secs(900)));
    }
}

//! The Lua scripts and the one reply shape they share.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use crate::quota::Period;
use crate::{Algorithm, Decision, Quota};

const GCRA_LUA: &str = include_str!("lua/gcra.lua");
const TOKEN_BUCKET_LUA: &str = include_str!("lua/token_bucket.lua");
const FIXED_WINDOW_LUA: &str = include_str!("lua/fixed_window.lua");
const SLIDING_WINDOW_LUA: &str = include_str!("lua/sliding_window.lua");
const LEASE_LUA: &str = include_str!("lua/lease.lua");
/// The calendar sums, then the window that uses them: one script.
const CALENDAR_WINDOW_LUA: &str = concat!(
    include_str!("lua/calendar.lua"),
    include_str!("lua/calendar_window.lua")
);

/// Every script's source, for loading them all at start-up.
pub(crate) const SOURCES: [&str; 6] = [
    GCRA_LUA,
    TOKEN_BUCKET_LUA,
    FIXED_WINDOW_LUA,
    SLIDING_WINDOW_LUA,
    LEASE_LUA,
    CALENDAR_WINDOW_LUA,
];

static GCRA: LazyLock<Script> = LazyLock::new(|| Script::new(GCRA_LUA));
static TOKEN_BUCKET: LazyLock<Script> = LazyLock::new(|| Script::new(TOKEN_BUCKET_LUA));
static FIXED_WINDOW: LazyLock<Script> = LazyLock::new(|| Script::new(FIXED_WINDOW_LUA));
static SLIDING_WINDOW: LazyLock<Script> = LazyLock::new(|| Script::new(SLIDING_WINDOW_LUA));
static LEASE: LazyLock<Script> = LazyLock::new(|| Script::new(LEASE_LUA));
static CALENDAR_WINDOW: LazyLock<Script> = LazyLock::new(|| Script::new(CALENDAR_WINDOW_LUA));

/// The script for an algorithm; all take `ARGV = limit, window_us, burst, cost`.
pub(crate) fn script(algorithm: Algorithm) -> &'static Script {
    match algorithm {
        Algorithm::Gcra => &GCRA,
        Algorithm::TokenBucket => &TOKEN_BUCKET,
        Algorithm::FixedWindow => &FIXED_WINDOW,
        Algorithm::SlidingWindow => &SLIDING_WINDOW,
    }
}

/// The invocation of `calendar_window.lua` for a calendar quota on `key`.
pub(crate) fn calendar(
    key: Vec<u8>,
    quota: &Quota,
    period: Period,
    cost: u32,
) -> redis::ScriptInvocation<'static> {
    let mut invocation = CALENDAR_WINDOW.key(key);
    invocation
        .arg(quota.limit())
        .arg(period.as_str())
        .arg(quota.utc_offset())
        .arg(cost);
    invocation
}

/// `calendar_window.lua` replies as the others, plus the window's length
/// in seconds: a month's is its own.
pub(crate) type CalendarReply = (i64, i64, i64, i64, i64);

pub(crate) fn calendar_decision(
    quota: &Quota,
    (allowed, remaining, wait_ms, reset_ms, window_s): CalendarReply,
) -> (Decision, Option<Duration>) {
    let window = Duration::from_secs(u64::try_from(window_s).unwrap_or(0));
    let (d, next) = decision(quota, (allowed, remaining, wait_ms, reset_ms));
    (d.with_window(window), next)
}

/// The window in whole microseconds, the scripts' unit (at least 1).
pub(crate) fn window_us(quota: &Quota) -> u64 {
    u64::try_from(quota.window().as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Every script returns `{allowed, remaining, wait_ms, reset_ms}`: on a deny
/// the retry-after, on an allow the wait until one more unit fits.
pub(crate) type Reply = (i64, i64, i64, i64);

/// Turns a script reply into a decision with exact header values.
/// The decision, and for an allow that left nothing, the wait until one
/// more unit fits.
pub(crate) fn decision(quota: &Quota, reply: Reply) -> (Decision, Option<Duration>) {
    let (allowed, remaining, wait_ms, reset_ms) = reply;
    let ms = |v: i64| Duration::from_millis(u64::try_from(v).unwrap_or(0));
    if allowed == 1 {
        let remaining = u32::try_from(remaining.max(0)).unwrap_or(u32::MAX);
        let next = (remaining == 0 && wait_ms > 0).then(|| ms(wait_ms));
        let d = Decision::allowed(quota.limit(), quota.window(), remaining, ms(reset_ms))
            .with_next_unit(ms(wait_ms));
        (d, next)
    } else {
        let d = Decision::denied(
            quota.limit(),
            quota.window(),
            ms(wait_ms.max(1)),
            ms(reset_ms),
        );
        (d, None)
    }
}

/// One call of `lease.lua`; durations are sent in whole milliseconds (at least 1).
#[derive(Debug, Clone, Copy)]
pub(crate) enum LeaseOp<'a> {
    Acquire {
        id: &'a str,
        max_in_flight: u32,
        ttl: Duration,
        retry_hint: Duration,
    },
    Release {
        id: &'a str,
    },
}

/// `lease.lua` returns `{ok, in_flight, retry_after_ms}` to an acquire or a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseReply {
    /// Acquired, released or renewed: the lease is (or was) held.
    pub(crate) ok: bool,
    pub(crate) in_flight: u32,
    /// When refused: how long until a retry may succeed.
    pub(crate) retry_after: Duration,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The invocation of `lease.lua` for `op` on the lease set `key`.
pub(crate) fn lease(key: Vec<u8>, op: LeaseOp<'_>) -> redis::ScriptInvocation<'static> {
    let mut invocation = LEASE.key(key);
    match op {
        LeaseOp::Acquire {
            id,
            max_in_flight,
            ttl,
            retry_hint,
        } => invocation
            .arg("acquire")
            .arg(id)
            .arg(max_in_flight)
            .arg(ms(ttl))
            .arg(ms(retry_hint)),
        LeaseOp::Release { id } => invocation.arg("release").arg(id),
    };
    invocation
}

/// The invocation of `lease.lua` renewing `ids` on the lease set `key`;
/// it replies with one flag per id, 1 while the lease is held.
pub(crate) fn renew<S: AsRef<str>>(
    key: Vec<u8>,
    ids: &[S],
    ttl: Duration,
) -> redis::ScriptInvocation<'static> {
    let mut invocation = LEASE.key(key);
    invocation.arg("renew").arg(ms(ttl));
    for id in ids {
        invocation.arg(id.as_ref());
    }
    invocation
}

pub(crate) fn lease_reply((ok, in_flight, retry_ms): (i64, i64, i64)) -> LeaseReply {
    LeaseReply {
        ok: ok == 1,
        in_flight: u32::try_from(in_flight.max(0)).unwrap_or(u32::MAX),
        retry_after: Duration::from_millis(u64::try_from(retry_ms).unwrap_or(0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_map_to_decisions() {
        let q = Quota::per_minute(10);
        let (d, next) = decision(&q, (1, 9, 0, 6000));
        assert!(d.is_allowed());
        assert_eq!(
            (d.remaining(), d.reset(), next),
            (9, Duration::from_secs(6), None)
        );
        let (d, next) = decision(&q, (1, 0, 700, 6000));
        assert!(d.is_allowed() && d.retry_after().is_none());
        assert_eq!(
            next,
            Some(Duration::from_millis(700)),
            "the wait for the next unit"
        );
        let (d, next) = decision(&q, (0, 0, 1500, 60_000));
        assert_eq!(
            (d.retry_after(), next),
            (Some(Duration::from_millis(1500)), None)
        );
    }

    #[test]
    fn lease_replies_and_args() {
        let r = lease_reply((0, 2, 250));
        assert_eq!((r.ok, r.in_flight), (false, 2));
        assert_eq!(r.retry_after, Duration::from_millis(250));
        assert!(lease_reply((1, 1, 0)).ok);
        assert_eq!(ms(Duration::from_micros(10)), 1, "never a zero TTL");
    }
}

//! The lease script's call (`grant.lua`) and its reply.

use std::time::Duration;

use super::args::{ms, window_us};
use super::rate::{Previous, change_args};
use super::sources;
use crate::{algorithm::Algorithm, quota::Quota};

/// A gateway's ask for a lease: `need` units or none, up to `want`, for
/// `holder`, lasting at most `lease`, after giving back `back` units of its
/// last lease (for a window, of the window it names).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseAsk<'a> {
    pub(crate) need: u32,
    pub(crate) want: u32,
    pub(crate) holder: &'a str,
    pub(crate) lease: Duration,
    pub(crate) back: (u32, Option<u64>),
}

/// The invocation of an algorithm's lease script for `ask`.
pub(crate) fn grant(
    algorithm: Algorithm,
    key: Vec<u8>,
    quota: &Quota,
    ask: LeaseAsk<'_>,
    previous: Option<(Vec<Vec<u8>>, Previous)>,
) -> redis::ScriptInvocation<'static> {
    let LeaseAsk {
        need,
        want,
        holder,
        lease,
        back: (back, back_window),
    } = ask;
    let script = sources::of(algorithm, false)
        .grant
        .as_ref()
        .expect("every rolling algorithm leases");
    let mut invocation = script.key(key);
    invocation
        .arg(quota.limit())
        .arg(window_us(quota))
        .arg(quota.burst())
        .arg(need)
        .arg(want)
        .arg(holder)
        .arg(ms(lease))
        .arg(back)
        .arg(back_window.unwrap_or(0));
    if let Some((old, p)) = previous.filter(|(old, _)| !old.is_empty()) {
        for old in old {
            invocation.key(old);
        }
        change_args(&mut invocation, Some(&p));
    }
    invocation
}

/// `grant.lua` returns `{granted, remaining, wait_ms, reset_ms, lease_ms,
/// window}`.
pub(crate) type GrantReply = (i64, i64, i64, i64, i64, i64);

/// A lease script's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    /// Units leased; 0 when `need` did not fit.
    pub(crate) granted: u32,
    /// Whole units still free in Redis after the grant.
    pub(crate) remaining: u32,
    /// On a deny, when `need` fits; on a grant, the wait for one more unit.
    pub(crate) wait: Duration,
    pub(crate) reset: Duration,
    /// How long the lease may be spent (to its window's end at most).
    pub(crate) lease: Duration,
    /// For a window algorithm, the window the lease is in: its unspent
    /// units go back to that window only.
    pub(crate) window: Option<u64>,
}

pub(crate) fn grant_reply((granted, remaining, wait, reset, lease, window): GrantReply) -> Grant {
    let n = |v: i64| u32::try_from(v.max(0)).unwrap_or(u32::MAX);
    let ms = |v: i64| Duration::from_millis(u64::try_from(v).unwrap_or(0));
    Grant {
        granted: n(granted),
        remaining: n(remaining),
        wait: ms(wait),
        reset: ms(reset),
        lease: ms(lease),
        window: u64::try_from(window).ok().filter(|w| *w > 0),
    }
}
